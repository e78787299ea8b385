"""Part 5 of the replication bench: a full resync while the primary keeps writing.

The driver's store is filled to ``--resync-mb`` of replicated data; a paced writer
(``--writer-rate`` groups/s) records per-group latency idle (no standby, ``--idle-seconds``);
then a fresh standby joins while the paced writer runs: time from the primary's decision
(its log line, same monotonic clock) to the standby's applied offset reaching the snapshot
offset, then to the live tail, and the writer's latency meanwhile. Ends with a promotion of
the resynced standby (``promote``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from bench.common import MB, say
from bench.replication.procs import (
    Node,
    Sampler,
    applied,
    attach,
    du,
    server_config,
    start_driver,
    start_standby,
    stop,
    until,
)
from bench.replication.promote import measure_promote
from bench.replication.stats import lag_stats


async def part_resync(args: argparse.Namespace, site_url: str, tmp: Path) -> dict[str, Any]:
    conf = server_config(tmp, 16)
    driver = standby = None
    nodes: list[Node] = []
    out: dict[str, Any] = {}
    try:
        driver = start_driver(tmp)
        p = await attach(driver, nodes)
        out.update(await _fill(args, p, tmp))
        out["writer_idle"] = idle = await _writer_idle(args, p)

        say("replication: a fresh standby joins (full resync) while the paced writer runs")
        await p.control("paced_start", rate=args.writer_rate, max_s=600)
        o_launch = int((await p.control("status"))["offset"])
        t_launch = time.monotonic()
        standby = start_standby("standby-resync", tmp / "s-resync", conf, driver.addr)
        s = Node(standby)  # not awaited ready: the sampler sees it come up
        nodes.append(s)
        sampler = Sampler([p, s]).start()
        try:
            t_installed, t_caught = await _until_caught_up(p, s, o_launch)
        finally:
            during = await p.control("paced_stop", timeout=60)
            samples = await sampler.stop()
        st = await p.control("status")
        final = int(st["offset"])
        await until(lambda: applied(s, final), f"standby to apply {final}", 60)
        hello = [t for t, msg in st["hellos"] if "Full" in msg and t >= t_launch]
        t_hello = hello[0] if hello else float("nan")
        resync_s = t_installed - t_hello
        mb = out["store"]["mb"]
        out.update(
            offset_at_launch=o_launch,
            standby_start_to_hello_s=t_hello - t_launch,
            hello_to_installed_s=resync_s,
            launch_to_installed_s=t_installed - t_launch,
            launch_to_caught_up_s=t_caught - t_launch,
            resync_mb_per_s=mb / resync_s,
            writer_during_resync=during,
            full_resyncs=st["full_resyncs"],
            standby_dir_mb=du(tmp / "s-resync") / MB,
            lag_during=lag_stats(samples, t_installed, t_caught),
        )
        say(
            f"replication: resync of {mb:.0f} MB in {resync_s:.2f}s "
            f"({out['resync_mb_per_s']:.1f} MB/s); caught up {t_caught - t_installed:.2f}s later; "
            f"writer p99 {during['tick_to_commit_ms']['p99']:.1f} ms vs idle "
            f"{idle['tick_to_commit_ms']['p99']:.1f} ms"
        )
        out["promote"] = await measure_promote(s, site_url, conf)
    finally:
        for n in nodes:
            await n.close()
        stop(standby)
        stop(driver)
    return out


async def _fill(args: argparse.Namespace, p: Node, tmp: Path) -> dict[str, Any]:
    """Fill the driver's store to ``--resync-mb``; what it holds, and its size on disk."""
    say(f"replication: filling the primary to {args.resync_mb} MB of page groups")
    fill = await p.control("fill", mb=args.resync_mb, max_s=600, timeout=660)
    scan = await p.control("scan", timeout=300)
    out = {"fill": fill, "store": scan, "primary_dir_mb": du(tmp / "primary") / MB}
    say(
        f"replication: {fill['groups']} groups in {fill['seconds']:.1f}s "
        f"({fill['groups'] / fill['seconds']:.0f}/s); replicated data {scan['mb']:.0f} MB in "
        f"{scan['keys']} keys, {out['primary_dir_mb']:.0f} MB on disk with the backlog"
    )
    return out


async def _writer_idle(args: argparse.Namespace, p: Node) -> dict[str, Any]:
    """The paced writer's latency with no standby attached (the baseline)."""
    rate = args.writer_rate
    say(f"replication: idle baseline, paced writer {rate:.0f} groups/s for {args.idle_seconds}s")
    await p.control("paced_start", rate=rate, max_s=args.idle_seconds + 60)
    await asyncio.sleep(args.idle_seconds)
    idle: dict[str, Any] = await p.control("paced_stop", timeout=60)
    return idle


async def _until_caught_up(p: Node, s: Node, o_launch: int) -> tuple[float, float]:
    """When the standby had installed the snapshot (applied ``o_launch``), then when it was
    within one entry of the primary."""
    await until(lambda: applied(s, o_launch), "the snapshot to be installed", 300)
    t_installed = time.monotonic()

    async def caught_up() -> bool:
        a, b = await asyncio.gather(p.role(), s.role())
        return int(b.applied_offset) >= int(a.applied_offset) - 1

    await until(caught_up, "the standby to catch up", 120)
    return t_installed, time.monotonic()
