"""Section ``failsafe``: pairs writing through an etcd outage, and the write checker's rounds.

What it runs (``python -m bench.run --section failsafe``), all on loopback, with the
fault harness of the tests (``tests/faultpair.py``: every node's etcd link and its
replication stream through a ``tests/cutproxy.CutProxy``, every committed write traced
with ``PAGESIFT_WRITE_TRACE``, a client ``Watcher`` recording the pages it saw):

1. **Throughput through an outage.** One etcd member (Debian's ``/usr/bin/etcd``, as the
   deploy kit ships it), ``--failsafe-pairs`` witness pairs (default 3: six nodes), each
   crawling its own demo site with a paced crawl (``faultpair.paced``: the rate is set
   by the crawl's delay, not by the two cores). Pages/s of all pairs together over
   ``--failsafe-phase`` seconds before, the ``--failsafe-outage`` seconds of the outage
   (default 60: etcd SIGSTOPped, every member) and the phase after (goal: during >= 0.9
   of before). Then the checker over each pair (overlapping writers, lost pages).
   etcd writes per 1,000 pages: raft proposals etcd committed (its own ``/metrics``,
   ``etcd_server_proposals_committed_total``: every put, transaction, lease grant and
   revoke) over the phase before, per page the pairs wrote meanwhile; with failsafe the
   grants travel on the replication stream, so this is the lease and the pair state
   alone.
2. **Randomized fault rounds.** One pair in sync replication (``faultpair.SYNC``: a
   page is visible once the standby applied it, so a page the client saw is a page
   acknowledged, and none may be missing at the end); ``--failsafe-rounds`` rounds (default 20)
   drawn with ``--failsafe-seed`` from ``faultpair.FAULTS`` (etcd stopped or killed,
   the primary's etcd link cut, the stream cut during an outage, either node
   SIGKILLed), each held 2-4 ttls, then the checker over the whole run: overlapping
   writers, stale writers and lost acknowledged pages (goal 0, 0, 0, with N), the
   writes a successor wrote over (async replication's tail: a figure), and in how
   many of the rounds that failsafe must write through the trace shows writes after
   the lease ran out.

Results: ``bench/out/failsafe.json`` and ``bench/out/failsafe.md``. Every wait is
bounded (``tests.helpers.eventually``, RPC deadlines); every process is stopped at the
end (``tests.helpers.serve_procs``, ``EtcdCluster``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import OUT_DIR, machine_facts, markdown_table, say
from pagesift.demo.site import build_site, serve_site
from tests.etcdcluster import EtcdCluster
from tests.faultpair import (
    SYNC,
    TTL,
    FaultPair,
    Watcher,
    crawling,
    inject,
    keep_crawling,
    rounds,
    verdict,
    watching,
)
from tests.helpers import serve_procs

GOAL_RATIO = 0.9
SITE_PAGES = 1500


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("failsafe")
    g.add_argument("--failsafe-pairs", type=int, default=3, help="pairs in the outage run")
    g.add_argument("--failsafe-outage", type=float, default=60.0, help="etcd outage, s")
    g.add_argument("--failsafe-phase", type=float, default=20.0, help="before/after, s")
    g.add_argument("--failsafe-rounds", type=int, default=20, help="randomized fault rounds")
    g.add_argument("--failsafe-seed", type=int, default=20261202, help="their seed")
    g.add_argument("--failsafe-ttl", type=int, default=TTL, help="witness ttl, s")


def _rate(watchers: list[Watcher], start: float, end: float) -> float | None:
    """Pages/s of all pairs together in [start, end] (None when a pair had no samples)."""
    rates = []
    for w in watchers:
        got = w.pages_between(start, end)
        if got is None or got[1] <= 0:
            return None
        rates.append(got[0] / got[1])
    return sum(rates)


def _pages(watchers: list[Watcher], start: float, end: float) -> int:
    return sum(got[0] for w in watchers if (got := w.pages_between(start, end)) is not None)


async def _outage_run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    sites = [
        build_site(SITE_PAGES, seed=i + 1, slow_seconds=1.5) for i in range(args.failsafe_pairs)
    ]
    served = [await serve_site(s) for s in sites]
    try:
        async with EtcdCluster(work / "etcd", members=1) as etcd:
            with serve_procs(work) as make:
                pairs = [
                    FaultPair(
                        make, etcd, work / f"fs{i}.trace", name=f"fs{i}", ttl=args.failsafe_ttl
                    )
                    for i in range(args.failsafe_pairs)
                ]
                try:
                    for p in pairs:
                        await p.start()
                    watchers = [Watcher(p) for p in pairs]
                    async with contextlib.AsyncExitStack() as stack:
                        for w in watchers:
                            await stack.enter_async_context(watching(w))
                        for p, w, (_, root) in zip(pairs, watchers, served, strict=True):
                            await crawling(p, root, w)
                        t0 = time.monotonic()
                        writes0 = await etcd.writes()
                        await asyncio.sleep(args.failsafe_phase)
                        t1 = time.monotonic()
                        writes1 = await etcd.writes()
                        say(f"failsafe: etcd stopped for {args.failsafe_outage:g} s")
                        async with etcd.outage():
                            await asyncio.sleep(args.failsafe_outage)
                            t2 = time.monotonic()
                        t3 = time.monotonic()
                        await asyncio.sleep(args.failsafe_phase)
                        t4 = time.monotonic()
                    verdicts = []
                    for p, w in zip(pairs, watchers, strict=True):
                        primary, _ = await p.elected(timeout=60)
                        verdicts.append(await verdict(p, w, primary))
                finally:
                    for p in pairs:
                        await p.close()
    finally:
        for runner, _ in served:
            await runner.cleanup()
    before, during, after = (
        _rate(watchers, t0, t1),
        _rate(watchers, t1, t2),
        _rate(watchers, t3, t4),
    )
    pages_before = _pages(watchers, t0, t1)
    return {
        "pairs": args.failsafe_pairs,
        "outage_s": args.failsafe_outage,
        "pages_per_s_before": before,
        "pages_per_s_during": during,
        "pages_per_s_after": after,
        "during_over_before": during / before if before and during is not None else None,
        "etcd_writes": writes1 - writes0,
        "pages_before": pages_before,
        "etcd_writes_per_1000_pages": 1000 * (writes1 - writes0) / pages_before
        if pages_before
        else None,
        "overlapping_writers": sum(len(v.overlaps) for v in verdicts),
        "stale_writers": sum(len(v.stale) for v in verdicts),
        "lost_pages": sum(v.lost_pages for v in verdicts),
        "violations": [v.explain() for v in verdicts if not v.ok],
    }


async def _rounds_run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    site = build_site(SITE_PAGES, seed=7, slow_seconds=1.5)
    runner, root = await serve_site(site)
    plan = rounds(args.failsafe_seed, args.failsafe_rounds, args.failsafe_ttl)
    try:
        async with EtcdCluster(work / "etcd-rounds", members=1) as etcd:
            with serve_procs(work) as make:
                pair = FaultPair(
                    make, etcd, work / "rounds.trace", name="rounds", ttl=args.failsafe_ttl,
                    config=SYNC,
                )  # fmt: skip
                try:
                    await pair.start()
                    watcher = Watcher(pair)
                    held: list[tuple[int, int]] = []
                    async with watching(watcher):
                        await crawling(pair, root, watcher)
                        for i, r in enumerate(plan):
                            await keep_crawling(pair, root, watcher)
                            say(f"failsafe round {i + 1}/{len(plan)}: {r.fault}, {r.hold:g} s")
                            held.append(await inject(pair, watcher, r))
                    primary, _ = await pair.elected(timeout=60)
                    found = await verdict(pair, watcher, primary)
                    writes = pair.writes()
                finally:
                    await pair.close()
    finally:
        await runner.cleanup()
    through = [(r, span) for r, span in zip(plan, held, strict=True) if r.writes_through]
    lease_ns = int((args.failsafe_ttl + 1) * 1e9)
    wrote_through = sum(
        any(start + lease_ns <= w.ns <= end for w in writes) for _, (start, end) in through
    )
    return {
        "rounds": len(plan),
        "seed": args.failsafe_seed,
        "faults": {
            name: sum(r.fault == name for r in plan) for name in sorted({r.fault for r in plan})
        },
        "tenures": len(found.tenures),
        "overlapping_writers": len(found.overlaps),
        "stale_writers": len(found.stale),
        "lost_pages": found.lost_pages,
        "acknowledged_pages": sum(len(v) for v in watcher.acknowledged.values()),
        "discarded_writes": found.discarded,
        "rounds_to_write_through": len(through),
        "rounds_written_through": wrote_through,
        "violations": found.explain(),
    }


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


OUTAGE_HEADERS = [
    "pairs", "outage s", "pages/s before", "during", "after", "during/before (goal >= 0.9)",
    "etcd writes / 1,000 pages", "overlapping writers", "lost pages",
]  # fmt: skip
ROUND_HEADERS = [
    "rounds", "seed", "overlapping writers (goal 0)", "stale writers", "lost pages (goal 0)",
    "pages acknowledged", "writes discarded (async tail)", "wrote through the outage",
]  # fmt: skip


def _markdown(outage: dict[str, Any], faults: dict[str, Any]) -> str:
    outage_row = [
        outage["pairs"], _fmt(outage["outage_s"], 0), _fmt(outage["pages_per_s_before"]),
        _fmt(outage["pages_per_s_during"]), _fmt(outage["pages_per_s_after"]),
        _fmt(outage["during_over_before"]), _fmt(outage["etcd_writes_per_1000_pages"], 1),
        outage["overlapping_writers"], outage["lost_pages"],
    ]  # fmt: skip
    round_row = [
        faults["rounds"], faults["seed"], faults["overlapping_writers"], faults["stale_writers"],
        faults["lost_pages"], faults["acknowledged_pages"], faults["discarded_writes"],
        f"{faults['rounds_written_through']}/{faults['rounds_to_write_through']}",
    ]  # fmt: skip
    drawn = ", ".join(f"{k} x{v}" for k, v in faults["faults"].items())
    lines = [
        "### Failsafe: pages through an etcd outage",
        "",
        markdown_table(OUTAGE_HEADERS, [outage_row]),
        "",
        "### Failsafe: randomized fault rounds (write checker)",
        "",
        markdown_table(ROUND_HEADERS, [round_row]),
        "",
        f"Faults drawn: {drawn}",
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pagesift-bench-failsafe-"))
    try:
        outage = asyncio.run(_outage_run(work, args))
        say(f"failsafe outage: {json.dumps(outage)}")
        faults = asyncio.run(_rounds_run(work, args))
        say(f"failsafe rounds: {json.dumps(faults)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"machine": machine_facts(), "outage": outage, "rounds": faults}
    (OUT_DIR / "failsafe.json").write_text(json.dumps(doc, indent=2) + "\n")
    (OUT_DIR / "failsafe.md").write_text(_markdown(outage, faults))
    bad = outage["overlapping_writers"] + outage["lost_pages"] + faults["overlapping_writers"]
    bad += faults["lost_pages"] + faults["stale_writers"] + outage["stale_writers"]
    if bad:
        raise RuntimeError(
            f"failsafe: the checker found violations: {outage['violations']} {faults['violations']}"
        )
