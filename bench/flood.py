"""Bench section ``flood``: 20,000 idle and slowloris connections against ``--http-listen``.

Issue 28, finding 1: a caller without a key used to take a node down through its HTTP
gateway (19,990 idle connections: the 20,000 descriptors gone, other accounts' RPCs
DEADLINE_EXCEEDED, 224,766 "Too many open files" log lines). This section starts
``pagesift serve --http-listen`` at the production defaults (header timeout 10 s, the
gateway's caps fitted to the descriptor budget its start-up line states; the node raises
its soft RLIMIT_NOFILE to the hard one, this process's) and floods the gateway's port
with ``--flood-attempts`` connections (default 20,000; ``--flood-slow-share`` of them
slowloris, a head byte a second) from ``--flood-sources`` loopback addresses
(``tests.hostile.connections.Flood``). Meanwhile, in threads of their own:

- another account (bob) calls ``ListJobs`` on a fresh channel every 0.5 s and
  ``Scrape``s a demo page every 1 s: the worst and median latencies, and any failure,
  beside the same probes run for ``QUIET_SECONDS`` before the flood (the control);
- the node's open descriptors (``/proc/PID/fd``) are sampled every 50 ms: the peak,
  against the baseline and the budget line.

Also: how many attempts the caps ended at once (within 1 s), the longest an admitted
connection lasted, how many are still open at the end on the server's side (its
established sockets; the client's side also counts connections the kernel completed
while the accept queue was full, which the server never held) and the node's log
growth over the flood. Writes
``bench/out/flood.json`` and ``bench/out/flood.md``; everything listens on 127.0.0.1 and
every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from bench.common import (
    LOOPBACK,
    OUT_DIR,
    machine_facts,
    markdown_table,
    say,
    start_serve,
    stop_serve,
    wait_for_port,
    write_json,
)
from pagesift.core.util.children import free_port
from tests.hostile.connections import Flood, fd_count, raise_own_limit, server_established

BUDGET = re.compile(r"descriptors: .*")
PROBE_SECONDS = (0.5, 1.0)  # ListJobs, Scrape
QUIET_SECONDS = 10.0  # the control phase: the same probes before the flood


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--flood-attempts", type=int, default=20_000, help="flood: connections")
    ap.add_argument(
        "--flood-slow-share", type=float, default=0.2, help="flood: share of slowloris (0.2)"
    )
    ap.add_argument(
        "--flood-sources", type=int, default=100, help="flood: loopback source addresses (100)"
    )


@contextmanager
def _demo_site() -> Iterator[str]:
    """The demo site in a thread of its own (the flood's loop is busy)."""
    from pagesift.demo.site import build_site, serve_site

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def start() -> None:
        box["runner"], box["root"] = await serve_site(build_site(16))

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=main, name="flood-site", daemon=True)
    thread.start()
    if not ready.wait(60):
        raise RuntimeError("the demo site did not start in 60 s")
    try:
        yield str(box["root"])
    finally:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


class _Prober(threading.Thread):
    """Calls ``call`` every ``every`` seconds until stopped; latencies and failures."""

    def __init__(self, name: str, every: float, call: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.every, self.call = every, call
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        for _ in range(100_000):
            if self.stop_event.is_set():
                return
            start = time.monotonic()
            try:
                self.call()
                self.latencies.append(time.monotonic() - start)
            except grpc.RpcError as err:
                self.failures.append(f"{err.code().name} after {time.monotonic() - start:.1f} s")
            self.stop_event.wait(max(0.0, self.every - (time.monotonic() - start)))

    def figures(self) -> dict[str, Any]:
        lat = self.latencies
        return {
            "calls": len(lat) + len(self.failures),
            "failures": self.failures[:10],
            "failed": len(self.failures),
            "p50_s": round(statistics.median(lat), 3) if lat else None,
            "max_s": round(max(lat), 3) if lat else None,
        }


def _probers(address: str, url: str, md: tuple[tuple[str, str], ...]) -> list[_Prober]:
    from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

    def list_jobs() -> None:
        with grpc.insecure_channel(address) as channel:  # fresh: a new TCP connection
            jobs_pb2_grpc.JobServiceStub(channel).ListJobs(
                jobs_pb2.ListJobsRequest(), metadata=md, timeout=20
            )

    channel = grpc.insecure_channel(address)
    stub = jobs_pb2_grpc.JobServiceStub(channel)

    def scrape() -> None:
        stub.Scrape(jobs_pb2.ScrapeRequest(url=url), metadata=md, timeout=30)

    return [
        _Prober("listjobs", PROBE_SECONDS[0], list_jobs),
        _Prober("scrape", PROBE_SECONDS[1], scrape),
    ]


class _FdSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(name="fds", daemon=True)
        self.pid, self.peak = pid, 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.05):
            self.peak = max(self.peak, fd_count(self.pid))


async def _flood(port: int, args: argparse.Namespace) -> tuple[Flood, float, int]:
    flood = Flood(
        LOOPBACK,
        port,
        attempts=args.flood_attempts,
        slow_share=args.flood_slow_share,
        sources=args.flood_sources,
        in_flight=512,
    )
    start = time.monotonic()
    try:
        await flood.start()
        for _ in range(120):  # every admitted one ends within the header timeout and slack
            if not server_established(port):
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)  # the client reads the last resets
        held = server_established(port)
    finally:
        await flood.close()
    return flood, time.monotonic() - start, held


def run(args: argparse.Namespace) -> None:
    from tests.helpers import ALICE, BOB, write_accounts

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    own = raise_own_limit()
    say(f"flood: this process may open {own} descriptors")
    log = OUT_DIR / "flood-server.log"
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmpname, _demo_site() as root:
        tmp = Path(tmpname)
        accounts = write_accounts(tmp / "accounts.toml", (ALICE, BOB))
        http, grpc_port = free_port(), free_port()
        address = f"{LOOPBACK}:{grpc_port}"
        config = tmp / "server.toml"
        config.write_text(f'[server]\naccounts_file = "{accounts}"\nextract_processes = 1\n')
        child = start_serve(
            "pagesift flood node",
            [
                "--role", "primary", "--listen", address, "--data", str(tmp / "data"),
                "--allow-private-networks", "--http-listen", f"{LOOPBACK}:{http}",
                "--config", str(config),
            ],
            log,
        )  # fmt: skip
        try:
            assert child.proc is not None
            pid = child.proc.pid
            wait_for_port(LOOPBACK, http, 60)
            probers = _probers(address, root, BOB.md)
            probers[1].call()  # warm: the engine's sessions and the worker
            quiet = _probers(address, root, BOB.md)  # the control: same calls, no flood
            for p in quiet:
                p.start()
            time.sleep(QUIET_SECONDS)
            for p in quiet:
                p.stop_event.set()
            for p in quiet:
                p.join(40)
            time.sleep(1.0)
            baseline = fd_count(pid)
            log_before = log.stat().st_size
            sampler = _FdSampler(pid)
            sampler.start()
            for p in probers:
                p.start()
            say(f"flood: {args.flood_attempts} connections at the gateway, bob probed")
            flood, wall, held = asyncio.run(_flood(http, args))
            sampler.stop_event.set()
            for p in probers:
                p.stop_event.set()
            for thread in (*probers, sampler):
                thread.join(40)
            log_after = log.stat().st_size
        finally:
            stop_serve(child, grace=20)
    text = log.read_text(errors="replace")
    line = BUDGET.search(text)
    lasted = [d for c in flood.opened() if (d := c.lasted()) is not None]
    hows: dict[str, int] = {}
    for c in flood.conns:
        hows[c.how or "open"] = hows.get(c.how or "open", 0) + 1
    figures = {
        "machine": machine_facts(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "attempts": flood.attempts,
        "slow_share": args.flood_slow_share,
        "sources": args.flood_sources,
        "budget_line": line.group(0) if line else "",
        "flood_wall_s": round(wall, 1),
        "ended_within_1s": flood.ended_within(1.0),
        "admitted": len(flood.opened()),
        "longest_admitted_s": round(max(lasted), 1) if lasted else None,
        "still_open_at_end_client_side": flood.open_now(),
        "still_open_at_end_server_side": held,
        "how_ended": hows,
        "fd_baseline": baseline,
        "fd_peak": sampler.peak,
        "log_growth_bytes": log_after - log_before,
        "listjobs_fresh_channel": probers[0].figures(),
        "scrape": probers[1].figures(),
        "quiet_listjobs_fresh_channel": quiet[0].figures(),
        "quiet_scrape": quiet[1].figures(),
    }
    write_json(OUT_DIR / "flood.json", figures)
    rows = [
        ["connection attempts (slowloris share)", f"{flood.attempts} ({args.flood_slow_share})"],
        ["descriptor budget (node log)", figures["budget_line"]],
        ["ended at once (<= 1 s)", figures["ended_within_1s"]],
        ["admitted; longest held", f"{figures['admitted']}; {figures['longest_admitted_s']} s"],
        ["still open at the end: server side (client side)", f"{held} ({flood.open_now()})"],
        ["node descriptors: baseline, peak", f"{baseline}, {sampler.peak}"],
        ["node log growth", f"{figures['log_growth_bytes']} B"],
        ["bob ListJobs (fresh channel) p50 / max", _lat(figures["listjobs_fresh_channel"])],
        ["  the same, no flood (control)", _lat(figures["quiet_listjobs_fresh_channel"])],
        ["bob Scrape p50 / max", _lat(figures["scrape"])],
        ["  the same, no flood (control)", _lat(figures["quiet_scrape"])],
        ["flood wall time", f"{figures['flood_wall_s']} s"],
    ]
    (OUT_DIR / "flood.md").write_text(markdown_table(["figure", "value"], rows) + "\n")
    for name, value in rows:
        say(f"  {name}: {value}")


def _lat(f: dict[str, Any]) -> str:
    return f"{f['p50_s']} s / {f['max_s']} s ({f['calls']} calls, {f['failed']} failed)"
