"""Parts 3 and 4 of the replication bench: lag during a crawl, crawl cost of a standby.

The crawl bench's site (Django docs on nginx, set up by the section), a ``pagesift serve``
primary alone or with a standby, the same concurrency as the crawl bench (``--concurrency``,
``--limit``). ``--crawl-runs`` crawls per configuration, alternating which goes first; the
median run (by pages/s) of each is reported. Role is sampled every 20 ms on every node in
both configurations (same observer load on the primary). The last run with a standby ends
with a promotion (``promote``). Not the crawl section (``bench.crawl``): only its site and
its concurrency are reused.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.common import cpu_seconds, say, subtree_cpu_seconds
from bench.replication.procs import (
    READY_TIMEOUT,
    Node,
    Sampler,
    applied,
    attach,
    connected,
    server_config,
    start_primary,
    start_standby,
    stop,
    until,
)
from bench.replication.promote import measure_promote
from bench.replication.stats import Samples, lag_stats, reach_times


async def part_crawl(
    args: argparse.Namespace, site_url: str, tmp: Path, nginx_pid: int
) -> dict[str, Any]:
    concurrency = int(getattr(args, "concurrency", 16))
    limit = int(getattr(args, "limit", 0))
    runs: dict[str, list[dict[str, Any]]] = {"alone": [], "with_standby": []}
    n = max(1, min(10, args.crawl_runs))
    for i in range(n):
        order = [False, True] if i % 2 == 0 else [True, False]
        for with_standby in order:
            key = "with_standby" if with_standby else "alone"
            say(f"replication: crawl {i + 1}/{n} {key.replace('_', ' ')} of {site_url}")
            promote = with_standby and i == n - 1
            r = await crawl_once(
                site_url, tmp, with_standby, concurrency, limit, promote, nginx_pid
            )
            _say_run(r)
            runs[key].append(r)
    med = {k: _median(v) for k, v in runs.items()}
    ratio = med["with_standby"]["pages_per_s"] / med["alone"]["pages_per_s"]
    # lag over every run with a standby: pool the per-offset figures by taking the worst run
    lag_runs = [r["lag"] for r in runs["with_standby"]]
    promote = next((r["promote"] for r in runs["with_standby"] if "promote" in r), None)
    return {
        "concurrency": concurrency,
        "limit": limit,
        "runs": runs,
        "median": med,
        "with_over_alone": ratio,
        "lag_runs": lag_runs,
        "lag_median_run": med["with_standby"]["lag"],
        "lag_worst_p99_ms": max(r["lag_ms"]["p99"] for r in lag_runs),
        "promote": promote,
    }


def _say_run(r: dict[str, Any]) -> None:
    cpu = r["cpu_s"]
    msg = (
        f"replication: {r['pages']} pages in {r['wall_s']:.2f}s "
        f"({r['pages_per_s']:.1f}/s); "
        f"CPU s: primary {cpu['primary']:.2f} + workers {cpu['primary_workers']:.2f}, "
        f"standby {cpu['standby']:.2f}, nginx {cpu['nginx']:.2f}"
    )
    if r["with_standby"]:
        lag = r["lag"]
        msg += (
            f", lag p50/p99 {lag['lag_ms']['p50']:.0f}/{lag['lag_ms']['p99']:.0f} ms, "
            f"{lag['lag_offsets']['p50']:.0f}/{lag['lag_offsets']['p99']:.0f} offsets"
        )
    say(msg)


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: float(r["pages_per_s"]))
    return ordered[(len(ordered) - 1) // 2]


async def crawl_once(
    site_url: str,
    tmp: Path,
    with_standby: bool,
    concurrency: int,
    limit: int,
    promote: bool,
    nginx_pid: int = 0,
) -> dict[str, Any]:
    """One crawl of the whole site on a fresh primary (+ standby); removes its data after."""
    run_dir = Path(tempfile.mkdtemp(prefix="crawl-", dir=tmp))
    conf = server_config(run_dir, concurrency)
    tag = "with-standby" if with_standby else "alone"
    prim = stby = None
    nodes: list[Node] = []
    out: dict[str, Any] = {"with_standby": with_standby}
    try:
        prim = start_primary(f"crawl-primary-{tag}", run_dir / "p", conf)
        p = await attach(prim, nodes)
        if with_standby:
            stby = start_standby(f"crawl-standby-{tag}", run_dir / "s", conf, prim.addr)
            s = await attach(stby, nodes)
            await until(lambda: connected(s), "the standby to connect", READY_TIMEOUT)
        await asyncio.sleep(0.5)  # let start-up work settle
        sampler = Sampler(nodes).start()
        cpu0 = _crawl_cpu(nodes, nginx_pid)
        t0 = time.monotonic()
        job = await _crawl_to_end(p, site_url, concurrency, limit, t0)
        t1 = time.monotonic()
        cpu1 = _crawl_cpu(nodes, nginx_pid)
        final = int((await p.role()).applied_offset)
        if with_standby:
            await until(lambda: applied(nodes[1], final), f"standby to apply {final}", 120)
        samples = await sampler.stop()
        out.update(_crawl_figures(job, t1 - t0, final, cpu0, cpu1))
        if with_standby:
            out.update(_standby_figures(samples, final, t0, t1))
            if promote:
                out["promote"] = await measure_promote(nodes[1], site_url, conf)
    finally:
        for n in nodes:
            await n.close()
        stop(stby)
        stop(prim)
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


async def _crawl_to_end(p: Node, site_url: str, concurrency: int, limit: int, t0: float) -> Any:
    """StartCrawl, then GetJob every 50 ms until the job is terminal (or 900 s after t0)."""
    from pagesift.v1 import jobs_pb2

    terminal = {
        jobs_pb2.JOB_STATE_COMPLETED,
        jobs_pb2.JOB_STATE_FAILED,
        jobs_pb2.JOB_STATE_CANCELLED,
    }
    started = await p.jobs.StartCrawl(
        jobs_pb2.StartCrawlRequest(
            url=site_url,
            limit=limit,
            max_concurrency=concurrency,
            options=jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_MARKDOWN]),
        ),
        timeout=30,
    )
    job = None
    for _ in range(20_000):  # 50 ms polls: bounded by ~1000 s
        job = await _get_job(p, started.id)
        if job.state in terminal or time.monotonic() - t0 > 900:
            break
        await asyncio.sleep(0.05)
    assert job is not None
    return job


async def _get_job(n: Node, job_id: str) -> Any:
    from pagesift.v1 import jobs_pb2

    try:
        return await n.jobs.GetJob(
            jobs_pb2.GetJobRequest(id=job_id, skip=2**31 - 1, limit=1), timeout=30
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() not in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT):
            raise
        return await n.jobs.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=0, limit=1), timeout=30)


def _crawl_cpu(nodes: Sequence[Node], nginx_pid: int) -> dict[str, float]:
    """CPU seconds so far: primary main process, its extraction workers, standby, nginx."""
    main = cpu_seconds(nodes[0].proc.popen.pid)
    out = {
        "primary": main,
        "primary_workers": subtree_cpu_seconds(nodes[0].proc.popen.pid) - main,
        "standby": subtree_cpu_seconds(nodes[1].proc.popen.pid) if len(nodes) > 1 else 0.0,
        "nginx": subtree_cpu_seconds(nginx_pid) if nginx_pid else 0.0,
    }
    return out


def _crawl_figures(
    job: Any, wall_s: float, final: int, cpu0: dict[str, float], cpu1: dict[str, float]
) -> dict[str, Any]:
    from pagesift.v1 import jobs_pb2

    pages = int(job.completed)
    return {
        "pages": pages,
        "failed": int(job.failed),
        "state": jobs_pb2.JobState.Name(job.state),
        "wall_s": wall_s,
        "pages_per_s": pages / wall_s,
        "final_offset": final,
        "cpu_s": {k: cpu1[k] - cpu0[k] for k in cpu0},
    }


def _standby_figures(samples: Samples, final: int, t0: float, t1: float) -> dict[str, Any]:
    caught = reach_times(samples.series(1), final - 1, final)
    return {
        "standby_caught_up_after_s": caught[0] - t1 if caught else None,
        "lag": lag_stats(samples, t0, t1),
        "sample_rounds": len(samples.t),
    }
