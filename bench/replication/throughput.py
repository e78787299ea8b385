"""Part 2 of the replication bench: replicated throughput, live and by catch-up.

A primary driver (``driver``) writes page groups through the real write path as fast as it
can for ``--seconds`` with a real ``pagesift serve --role standby`` attached; both nodes'
Role is sampled every 20 ms: entries/s the standby applied while the writer ran, the lag,
and how long it took to drain. Then the standby is stopped, a backlog written with nobody
attached (the writer alone), and the standby restarted: entries/s of the catch-up by
continue, with no writer competing. CPU per entry on both sides throughout.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, say, subtree_cpu_seconds
from bench.replication.procs import (
    READY_TIMEOUT,
    Node,
    Proc,
    Sampler,
    applied,
    attach,
    connected,
    server_config,
    start_driver,
    start_standby,
    stop,
    until,
)
from bench.replication.stats import Samples, lag_stats, reach_times


async def part_throughput(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Live: writer burst with the standby attached. Catch-up: standby stopped, a backlog
    written, standby restarted (continue): entries/s with no writer competing."""
    conf = server_config(tmp, 16)
    driver = standby = None
    nodes: list[Node] = []
    out: dict[str, Any] = {}
    try:
        driver = start_driver(tmp)
        p = await attach(driver, nodes)
        standby = start_standby("standby-throughput", tmp / "s-throughput", conf, driver.addr)
        s = await attach(standby, nodes)
        # empty store: the first session is a full resync of nothing, then the tail
        await until(lambda: connected(s), "the standby to connect", READY_TIMEOUT)
        out.update(await _live(args, p, s))

        # catch-up: the standby away, a backlog written (fits the 512 MiB backlog), back
        await nodes.pop().close()
        stop(standby)
        standby = None
        groups = min(int(out["writer"]["groups"]), 15_000)
        alone = await _writer_alone(args, p, groups)
        t_launch = time.monotonic()
        standby = start_standby("standby-catchup", tmp / "s-throughput", conf, driver.addr)
        s = await attach(standby, nodes)
        out.update(await _catchup(p, s, alone, int(out["writer"]["last_offset"]), t_launch))
    finally:
        for node in nodes:
            await node.close()
        stop(standby)
        stop(driver)
    return out


async def _live(args: argparse.Namespace, p: Node, s: Node) -> dict[str, Any]:
    """A writer burst of ``--seconds`` with the standby attached, then until it drained."""
    say(f"replication: writer burst for {args.seconds:.0f}s through the primary's write path")
    sampler = Sampler([p, s]).start()
    cpu0 = _pair_cpu(p.proc, s.proc)
    burst = await p.control("burst", seconds=args.seconds, timeout=args.seconds + 120)
    last = int(burst["last_offset"])
    say(
        f"replication: primary wrote {burst['groups']} groups "
        f"({burst['groups'] / burst['seconds']:.0f}/s); standby at {sampler.last(1)}"
    )
    drain_timeout = max(120.0, 10 * args.seconds)
    try:
        await until(lambda: applied(s, last), f"the standby to apply {last}", drain_timeout)
        t_done = time.monotonic()
        cpu1 = _pair_cpu(p.proc, s.proc)
    finally:
        samples = await sampler.stop()
    out = _live_figures(burst, samples, t_done)
    out["cpu_us_per_entry_live"] = {
        k: (cpu1[k] - cpu0[k]) / max(1, int(burst["groups"])) * 1e6 for k in cpu0
    }
    say(
        f"replication: standby applied {out['replicated_entries_per_s_live']:.0f} entries/s "
        f"while the writer ran, lag {out['lag_at_burst_end']} at its end, "
        f"drained in {out['drain_seconds']:.2f}s"
    )
    return out


def _live_figures(burst: dict[str, Any], samples: Samples, t_done: float) -> dict[str, Any]:
    t0, t1 = float(burst["t0"]), float(burst["t1"])
    first, last = int(burst["first_offset"]) - 1, int(burst["last_offset"])
    s_t0, s_t1 = samples.at(1, t0), samples.at(1, t1)
    caught = reach_times(samples.series(1), last - 1, last)
    t_caught = min(caught[0], t_done) if caught else t_done
    live = (s_t1 - s_t0) / (t1 - t0)
    drained = last - s_t1
    drain_s = t_caught - t1
    return {
        "writer": burst,
        "writer_groups_per_s": burst["groups"] / burst["seconds"],
        "writer_ops_per_s": burst["ops"] / burst["seconds"],
        "standby_applied_during_burst": s_t1 - s_t0,
        "replicated_entries_per_s_live": live,
        "lag_at_burst_end": drained,
        "drain_seconds": drain_s,
        "drain_entries_per_s": drained / drain_s if drained > 0 and drain_s > 0 else None,
        "overall_entries_per_s": (last - first) / (t_caught - t0),
        "ops_per_entry": burst["ops"] / max(1, burst["groups"]),
        "lag_during_burst": lag_stats(samples, t0, t1),
    }


async def _writer_alone(args: argparse.Namespace, p: Node, groups: int) -> dict[str, Any]:
    """``groups`` page groups written with no standby attached (the backlog to catch up)."""
    say(f"replication: standby stopped; writing {groups} groups with nobody attached")
    c0 = cpu_seconds(p.proc.popen.pid)
    alone = await p.control(
        "burst", seconds=4 * args.seconds, max_groups=groups, timeout=4 * args.seconds + 120
    )
    alone["cpu_us_per_group"] = (cpu_seconds(p.proc.popen.pid) - c0) / alone["groups"] * 1e6
    return alone


async def _catchup(
    p: Node, s: Node, alone: dict[str, Any], last: int, t_launch: float
) -> dict[str, Any]:
    """The restarted standby (launched at ``t_launch``) applies from ``last`` to the end of
    the writer-alone backlog: from the primary's Continue decision to caught up."""
    target = int(alone["last_offset"])
    cpu0 = _pair_cpu(p.proc, s.proc)  # standby start-up excluded (apply may have begun)
    sampler = Sampler([p, s]).start()
    try:
        await until(lambda: applied(s, target), f"the standby to apply {target}", 300)
        t_done = time.monotonic()
        cpu1 = _pair_cpu(p.proc, s.proc)
    finally:
        samples = await sampler.stop()
    st = await p.control("status")
    cont = [t for t, msg in st["hellos"] if "Continue" in msg and t >= t_launch]
    caught = reach_times(samples.series(1), target - 1, target)
    t_hello = cont[0] if cont else float("nan")
    t_caught = min(caught[0], t_done) if caught else t_done
    n = target - last
    out: dict[str, Any] = {
        "catchup": {
            "entries": n,
            "standby_launch_to_hello_s": t_hello - t_launch,
            "hello_to_caught_up_s": t_caught - t_hello,
            "entries_per_s": n / (t_caught - t_hello),
            "continues": st["continues"],
            "cpu_us_per_entry": {k: (cpu1[k] - cpu0[k]) / n * 1e6 for k in cpu0},
        },
        "writer_alone": alone,
        "writer_alone_groups_per_s": alone["groups"] / alone["seconds"],
        "primary_status": st,
    }
    say(
        f"replication: writer alone {out['writer_alone_groups_per_s']:.0f} groups/s; "
        f"standby caught up {n} entries by continue in {t_caught - t_hello:.2f}s "
        f"({out['catchup']['entries_per_s']:.0f} entries/s)"
    )
    return out


def _pair_cpu(primary: Proc, standby: Proc) -> dict[str, float]:
    return {
        "primary": cpu_seconds(primary.popen.pid),
        "standby": subtree_cpu_seconds(standby.popen.pid),
    }
