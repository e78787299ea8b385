"""Replication benchmark: raw limits, replicated throughput, lag, crawl cost, resync, promote.

Everything runs on 127.0.0.1 in one invocation (``python -m bench.run --section replication``)
and is written to ``bench/out/replication.{md,json}``. Parts, in order (``--repl-parts``
picks a subset of ``raw,throughput,crawl,resync``):

1. **Raw limits** (``limits``): ``rocksdict`` ``WriteBatch`` commits of page-shaped groups
   (``workload``) straight on an ``Rdict``, with and without a log-entry-sized value; a
   ``grpc.aio`` bidi stream on loopback between two processes, ~1 MB batches of payloads
   sized like serialized page-group ``LogEntry`` messages.
2. **Replicated throughput** (``throughput``): a primary *driver* process (``driver``: the
   real write path, ``ReplicationServicer`` and ``AdminServicer``) writes as fast as it can
   for ``--seconds`` to a real ``pagesift serve --role standby``; then a catch-up by
   continue with no writer competing.
3. **Lag during a crawl** and 4. **crawl throughput with/without a standby** (``crawl``):
   the crawl bench's site (Django docs on nginx), ``pagesift serve`` primary (+ standby).
5. **Full resync** (``resync``): ``--resync-mb`` of replicated data to a fresh standby while
   a paced writer (``--writer-rate``) records its latency.
6. **Promote** (``promote``): on a caught-up standby after the resync and after a crawl.

Nodes are spawned, stopped, talked to and sampled by ``procs``; the lag and percentile
figures are computed by ``stats``; ``report`` writes the tables. This module is the section
entry (``add_arguments``, ``run``); ``__main__`` is the entry of the helper processes
(``python -m bench.replication primary|raw-server ...``, started by the section itself).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import OUT_DIR, say, write_json
from bench.replication.crawl import part_crawl
from bench.replication.limits import raw_rocksdb, raw_stream
from bench.replication.report import build_report
from bench.replication.resync import part_resync
from bench.replication.throughput import part_throughput
from bench.replication.workload import PageGen

PARTS = ("raw", "throughput", "crawl", "resync")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("replication section")
    g.add_argument(
        "--seconds", type=float, default=8.0, help="writer burst for the throughput part (8)"
    )
    g.add_argument(
        "--resync-mb", type=int, default=256, help="replicated MB in the resynced store (256)"
    )
    g.add_argument("--raw-seconds", type=float, default=3.0, help="each raw-limit run (3)")
    g.add_argument(
        "--writer-rate",
        type=float,
        default=240.0,
        help="paced writer groups/s during the idle/resync latency runs (240 = crawl peak)",
    )
    g.add_argument("--idle-seconds", type=float, default=5.0, help="paced writer idle baseline (5)")
    g.add_argument("--crawl-runs", type=int, default=3, help="crawls per configuration (median; 3)")
    g.add_argument(
        "--repl-parts",
        default=",".join(PARTS),
        help=f"comma-separated subset of {','.join(PARTS)} (default all)",
    )


def run(args: argparse.Namespace) -> None:
    parts = _parts(args)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    if load_before > 0.5:
        say(f"replication: note: 1-min load average is {load_before:.2f}; figures may be noisy")
    results: dict[str, Any] = {}
    t_start = time.monotonic()
    if "raw" in parts:
        results.update(_run_raw(args, PageGen()))
    with tempfile.TemporaryDirectory(prefix="bench-repl-") as tmpname:
        tmp = Path(tmpname)
        for part in PARTS:
            (tmp / part).mkdir()
        if "throughput" in parts:
            results["throughput"] = asyncio.run(part_throughput(args, tmp / "throughput"))
        if "crawl" in parts or "resync" in parts:
            results.update(_run_on_site(args, parts, tmp))
    results["total_seconds"] = time.monotonic() - t_start
    report = build_report(args, results, load_before)
    write_json(OUT_DIR / "replication.json", report["json"])
    (OUT_DIR / "replication.md").write_text(report["markdown"] + "\n")
    print(report["markdown"], flush=True)
    say(f"replication: wrote {OUT_DIR / 'replication.md'} and {OUT_DIR / 'replication.json'}")


def _parts(args: argparse.Namespace) -> list[str]:
    """The parts ``--repl-parts`` asks for, after checking the section's flags."""
    parts = [x.strip() for x in args.repl_parts.split(",") if x.strip()]
    bad = sorted(set(parts) - set(PARTS))
    if bad or not parts:
        raise SystemExit(f"--repl-parts: unknown {bad}; choose from {','.join(PARTS)}")
    if args.seconds <= 0 or args.seconds > 120 or not 1 <= args.resync_mb <= 4096:
        raise SystemExit("need 0 < --seconds <= 120 and 1 <= --resync-mb <= 4096")
    return parts


def _run_raw(args: argparse.Namespace, gen: PageGen) -> dict[str, Any]:
    """Part 1: ``raw_rocksdb`` (data keys, then with the log entry) and ``raw_stream``."""
    out: dict[str, Any] = {}
    say(f"replication: raw rocksdict WriteBatch, page-shaped groups, {args.raw_seconds}s each")
    out["raw_rocksdb"] = [
        raw_rocksdb(args.raw_seconds, with_entry, gen) for with_entry in (False, True)
    ]
    for r in out["raw_rocksdb"]:
        say(
            f"replication: rocksdict ({r['variant']}): {r['commits_per_s']:.0f} commits/s, "
            f"{r['ops_per_s']:.0f} ops/s, {r['mb_per_s']:.0f} MB/s"
        )
    say(f"replication: raw grpc.aio bidi stream on loopback, {args.raw_seconds}s")
    out["raw_stream"] = r = asyncio.run(raw_stream(args.raw_seconds, gen))
    say(
        f"replication: raw stream: {r['messages_per_s']:.0f} msg/s, "
        f"{r['entries_per_s']:.0f} entries/s, {r['mb_per_s']:.0f} MB/s"
    )
    return out


def _run_on_site(args: argparse.Namespace, parts: list[str], tmp: Path) -> dict[str, Any]:
    """Parts 3-6, which crawl the crawl bench's site: Django docs served by nginx."""
    from bench.crawl import warm_page_cache
    from bench.nginx import Nginx
    from bench.tools import DJANGO_DOC_PACKAGE, django_docs_root, ensure_apt

    out: dict[str, Any] = {}
    ensure_apt(["nginx", DJANGO_DOC_PACKAGE])
    docs = django_docs_root()
    warm_page_cache(docs)
    with Nginx(docs) as site:
        if "crawl" in parts:
            nginx_pid = site.proc.pid if site.proc else 0
            out["crawl"] = asyncio.run(part_crawl(args, site.url, tmp / "crawl", nginx_pid))
        if "resync" in parts:
            out["resync"] = asyncio.run(part_resync(args, site.url, tmp / "resync"))
    return out
