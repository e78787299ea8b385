"""Section ``gateway``: what the Firecrawl HTTP gateway costs over gRPC, and its memory.

Against real processes on 127.0.0.1: a generated static site (``bench.map.generate_site``)
served by nginx, one ``pagesift serve`` node, and one ``pagesift gateway`` in front of it.

1. Throughput. The same crawl (``--gateway-pages`` pages, ``limit`` = that) run three
   ways, alternating, ``--gateway-runs`` times each:
   - ``grpc``: ``JobClient.start_crawl``, ``GetJob(status_only)`` every 0.2 s until the
     job is finished, then every document with ``iter_documents`` (100 per page);
   - ``http``: the same over the gateway with plain aiohttp: ``POST /v2/crawl``,
     ``GET /v2/crawl/ID?limit=1`` every 0.2 s, then every page following ``next``;
   - ``sdk``: firecrawl-py's own ``crawl(..., poll_interval=1)`` (whole seconds: its
     least), whose waiter re-reads every page done so far at each poll.
   An untimed gRPC crawl warms the node first; each mode leads a run in turn.
   Reported per mode: median pages/s (documents / wall from start to the last document
   read), the read phase alone (documents/s once finished), the gateway's CPU per
   document and as a share of the node's; and the ratios to ``grpc``. The crawl itself
   is the node's work in every mode, so its wall varies with the machine's load more
   than with the mode; the read phase and the CPU ratio are the gateway's own cost.
2. Memory. A batch scrape of ``--gateway-docs`` URLs (the site's pages with ``?copy=N``,
   made over gRPC: cheap, not measured) finishes; then a client pages the whole job
   through the gateway twice (100 documents a page, the default; then ``?limit=1000``),
   reading each page fully. The gateway process is sampled every 0.1 s: peak PSS and RSS
   (``smaps_rollup``), and RSS at 10/50/100% of the documents read (flat = it streams).

Results: ``bench/out/gateway.json`` and ``bench/out/gateway.md``. Every wait is bounded
by ``--gateway-timeout``; the node, the gateway and nginx are stopped whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import (
    LOOPBACK,
    MB,
    OUT_DIR,
    REPO_DIR,
    ProcessSampler,
    cpu_seconds,
    free_port,
    machine_facts,
    markdown_table,
    say,
    start_serve,
    stop_serve,
    write_json,
)
from bench.map import generate_site
from bench.nginx import Nginx
from bench.proctree import TreeSampler, tree_cpu_seconds, tree_memory
from pagesift.core.util.children import Child

POLL = 0.2  # seconds between two status reads (grpc and http modes)
MODES = ("grpc", "http", "sdk")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("gateway section")
    g.add_argument("--gateway-pages", type=int, default=1000, help="pages per crawl")
    g.add_argument("--gateway-runs", type=int, default=3, help="crawls per mode (alternating)")
    g.add_argument("--gateway-docs", type=int, default=50_000, help="documents of the big job")
    g.add_argument("--gateway-timeout", type=float, default=600.0, help="seconds per wait")
    g.add_argument("--gateway-only", choices=("throughput", "memory"), help="one part only")


def run(args: argparse.Namespace) -> None:
    report = asyncio.run(_run(args))
    write_json(OUT_DIR / "gateway.json", report)
    md = build_markdown(report)
    (OUT_DIR / "gateway.md").write_text(md)
    print(md, flush=True)
    say(f"gateway: wrote {OUT_DIR / 'gateway.md'} and {OUT_DIR / 'gateway.json'}")


# ---------------------------------------------------------------------------- processes


def _commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_DIR, capture_output=True, text=True
    )
    return out.stdout.strip()


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(0.1)


def _start_gateway(listen: str, server: str, log: Path) -> Child:
    argv = [sys.executable, "-m", "pagesift.cli", "gateway"]
    child = Child("gateway", [*argv, "--listen", listen, "--server", server], log, cwd=REPO_DIR)
    log.unlink(missing_ok=True)
    child.start()
    return child


# ---------------------------------------------------------------------------- throughput


async def _crawl_grpc(address: str, root: str, pages: int, timeout: float) -> dict[str, Any]:
    from pagesift.client import JobClient
    from pagesift.v1 import jobs_pb2

    async with JobClient(address) as client:
        t0 = time.monotonic()
        job_id = await client.start_crawl(jobs_pb2.StartCrawlRequest(url=root, limit=pages))

        async def done() -> bool:
            job = await client.get_job(job_id, status_only=True)
            return job.state not in (jobs_pb2.JOB_STATE_SCRAPING, jobs_pb2.JOB_STATE_PAUSED)

        await _until(done, f"crawl {job_id}", timeout)
        t1 = time.monotonic()
        docs = 0
        async for _ in client.iter_documents(job_id, page_size=100):
            docs += 1
        t2 = time.monotonic()
    return {"docs": docs, "crawl_s": t1 - t0, "read_s": t2 - t1, "total_s": t2 - t0}


async def _crawl_http(base: str, root: str, pages: int, timeout: float) -> dict[str, Any]:
    import aiohttp

    limit = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=limit) as http:
        t0 = time.monotonic()
        async with http.post(f"{base}/v2/crawl", json={"url": root, "limit": pages}) as r:
            started = await r.json()
        url = started["url"]

        async def done() -> bool:
            async with http.get(f"{url}?limit=1") as r:
                return bool((await r.json())["status"] != "scraping")

        await _until(done, f"crawl {started['id']}", timeout)
        t1 = time.monotonic()
        docs, page = 0, url
        while page:
            async with http.get(page) as r:
                body = await r.json()
            docs += len(body["data"])
            page = body.get("next")
        t2 = time.monotonic()
    return {"docs": docs, "crawl_s": t1 - t0, "read_s": t2 - t1, "total_s": t2 - t0}


async def _crawl_sdk(base: str, root: str, pages: int, timeout: float) -> dict[str, Any]:
    from firecrawl import Firecrawl

    fc = Firecrawl(api_key="anonymous", api_url=base)
    t0 = time.monotonic()
    job = await asyncio.to_thread(fc.crawl, root, limit=pages, poll_interval=1, timeout=timeout)
    t1 = time.monotonic()
    if job.status != "completed":
        raise RuntimeError(f"the SDK's crawl ended {job.status}")
    return {"docs": len(job.data), "crawl_s": t1 - t0, "read_s": 0.0, "total_s": t1 - t0}


async def throughput(
    node: str, node_pid: int, gw: str, gw_pid: int, root: str, args: argparse.Namespace
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    warm = await _crawl_grpc(node, root, max(50, args.gateway_pages // 10), args.gateway_timeout)
    say(f"warm-up crawl (not counted): {warm['docs']} docs")
    for i in range(args.gateway_runs):
        for mode in MODES[i % len(MODES) :] + MODES[: i % len(MODES)]:  # each first in turn
            gw_cpu, node_cpu = cpu_seconds(gw_pid), tree_cpu_seconds(node_pid)
            if mode == "grpc":
                got = await _crawl_grpc(node, root, args.gateway_pages, args.gateway_timeout)
            elif mode == "http":
                got = await _crawl_http(gw, root, args.gateway_pages, args.gateway_timeout)
            else:
                got = await _crawl_sdk(gw, root, args.gateway_pages, args.gateway_timeout)
            got["gateway_cpu_s"] = cpu_seconds(gw_pid) - gw_cpu
            got["node_cpu_s"] = tree_cpu_seconds(node_pid) - node_cpu
            got["pages_per_s"] = got["docs"] / got["total_s"]
            got["read_docs_per_s"] = got["docs"] / got["read_s"] if got["read_s"] else None
            runs[mode].append(got)
            say(
                f"run {i + 1} {mode}: {got['docs']} docs, {got['pages_per_s']:.1f} pages/s, "
                f"read {got['read_s']:.2f} s, gateway CPU {got['gateway_cpu_s']:.2f} s"
            )
    summary: dict[str, Any] = {}
    for mode, rs in runs.items():
        reads = [r["read_docs_per_s"] for r in rs if r["read_docs_per_s"]]
        summary[mode] = {
            "docs": [r["docs"] for r in rs],
            "pages_per_s": statistics.median(r["pages_per_s"] for r in rs),
            "pages_per_s_runs": [round(r["pages_per_s"], 1) for r in rs],
            "read_docs_per_s": statistics.median(reads) if reads else None,
            "gateway_cpu_ms_per_doc": statistics.median(
                1000 * r["gateway_cpu_s"] / r["docs"] for r in rs
            ),
            "node_cpu_ms_per_doc": statistics.median(
                1000 * r["node_cpu_s"] / r["docs"] for r in rs
            ),
        }
    base = summary["grpc"]
    for mode in ("http", "sdk"):
        s = summary[mode]
        s["ratio_pages_per_s"] = s["pages_per_s"] / base["pages_per_s"]
        if s["read_docs_per_s"] and base["read_docs_per_s"]:
            s["ratio_read"] = s["read_docs_per_s"] / base["read_docs_per_s"]
    return {"runs": runs, "summary": summary}


# ---------------------------------------------------------------------------- memory


async def _make_big_job(address: str, urls: list[str], timeout: float) -> dict[str, Any]:
    from pagesift.client import JobClient
    from pagesift.v1 import jobs_pb2

    async with JobClient(address, timeout=120) as client:
        t0 = time.monotonic()
        resp = await client.start_batch(jobs_pb2.StartBatchScrapeRequest(urls=urls))
        state: list[Any] = []

        async def done() -> bool:
            job = await client.get_job(resp.id, status_only=True)
            state[:] = [job]
            return job.state not in (jobs_pb2.JOB_STATE_SCRAPING, jobs_pb2.JOB_STATE_PAUSED)

        await _until(done, f"batch {resp.id}", timeout)
        job = state[0]
    took = time.monotonic() - t0
    say(f"batch {resp.id}: {job.completed} documents, {job.failed} failed in {took:.0f} s")
    return {"id": resp.id, "completed": job.completed, "failed": job.failed, "make_s": took}


async def _page_through(gw: str, gw_pid: int, url: str, timeout: float) -> dict[str, Any]:
    """Read every page of ``url`` following ``next``, sampling the gateway."""
    import aiohttp

    read = [0]
    tree = TreeSampler(gw_pid, interval=0.1).start()
    rss = ProcessSampler(gw_pid, interval=0.1, progress=lambda: read[0]).start()
    cpu0 = cpu_seconds(gw_pid)
    t0 = time.monotonic()
    nbytes = pages = biggest = 0
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            page: str | None = url
            while page:
                async with http.get(page) as r:
                    raw = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"GET {page}: {r.status} {raw[:200]!r}")
                body = json.loads(raw)
                read[0] += len(body["data"])
                nbytes += len(raw)
                biggest = max(biggest, len(raw))
                pages += 1
                page = body.get("next")
    finally:
        took = time.monotonic() - t0
        tree.stop()
        rss.stop()
    return {
        "docs": read[0],
        "pages": pages,
        "seconds": took,
        "docs_per_s": read[0] / took,
        "mb": nbytes / MB,
        "mb_per_s": nbytes / MB / took,
        "largest_page_mb": biggest / MB,
        "gateway_cpu_s": cpu_seconds(gw_pid) - cpu0,
        "peak_pss_mb": tree.peak_pss / MB,
        "peak_rss_mb": max(tree.peak_rss, rss.peak_rss_bytes) / MB,
        "rss_at": rss.at_progress([0.1, 0.5, 1.0]),
    }


async def memory(
    node: str, gw: str, gw_pid: int, root: str, paths: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    n = args.gateway_docs
    urls = [f"{root}{paths[i % len(paths)].lstrip('/')}?copy={i}" for i in range(n)]
    job = await _make_big_job(node, urls, args.gateway_timeout)
    pss, rss, _ = tree_memory(gw_pid)
    idle = {"pss_mb": pss / MB, "rss_mb": rss / MB}
    say(f"gateway before paging: PSS {idle['pss_mb']:.1f} MB, RSS {idle['rss_mb']:.1f} MB")
    passes: dict[str, Any] = {}
    for name, query in (("100 a page (default)", ""), ("1000 a page (?limit=1000)", "?limit=1000")):
        url = f"{gw}/v2/batch/scrape/{job['id']}{query}"
        got = await _page_through(gw, gw_pid, url, args.gateway_timeout)
        passes[name] = got
        say(
            f"{name}: {got['docs']} docs in {got['seconds']:.1f} s ({got['mb']:.0f} MB), "
            f"peak PSS {got['peak_pss_mb']:.1f} MB, RSS {got['peak_rss_mb']:.1f} MB"
        )
    return {"job": job, "idle": idle, "passes": passes}


# ---------------------------------------------------------------------------- the run


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    facts = machine_facts()
    report: dict[str, Any] = {"machine": facts, "commit": _commit(), "args": vars(args)}
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmpname:
        tmp = Path(tmpname)
        (tmp / "site").mkdir()
        paths = generate_site(tmp / "site", args.gateway_pages)
        conf = tmp / "server.toml"
        conf.write_text("[server]\nmax_batch_urls = 100000\n")
        node = f"{LOOPBACK}:{free_port()}"
        gw_listen = f"{LOOPBACK}:{free_port()}"
        gw = f"http://{gw_listen}"
        serve_args = [
            "--role", "primary", "--listen", node, "--data", str(tmp / "data"),
            "--allow-private-networks", "--config", str(conf),
        ]  # fmt: skip
        with Nginx(tmp / "site") as site:
            server = start_serve("pagesift server", serve_args, OUT_DIR / "gateway-server.log")
            gateway = _start_gateway(gw_listen, node, OUT_DIR / "gateway-gateway.log")
            try:
                assert server.proc is not None and gateway.proc is not None
                say(f"$ pagesift gateway --listen {gw_listen} --server {node}")
                await _until(lambda: _healthy(gw), "the gateway's /healthz", 60)
                if args.gateway_only != "memory":
                    report["throughput"] = await throughput(
                        node, server.proc.pid, gw, gateway.proc.pid, site.url, args
                    )
                if args.gateway_only != "throughput":
                    report["memory"] = await memory(
                        node, gw, gateway.proc.pid, site.url, paths, args
                    )
            finally:
                gateway.stop(10.0)
                stop_serve(server)
    report["loadavg_1m_after"] = machine_facts()["loadavg_1m"]
    return report


async def _healthy(base: str) -> bool:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as http, http.get(base + "/healthz") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


def build_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    out = [
        "## Gateway: Firecrawl HTTP over gRPC (issue 22)",
        "",
        f"{m['date']}, commit `{report['commit']}`, {m['nproc']} CPUs ({m['cpu_model']}), "
        f"load average {m['loadavg_1m']} before, {report['loadavg_1m_after']} after.",
        "",
    ]
    t = report.get("throughput")
    if t:
        rows = []
        for mode in MODES:
            s = t["summary"][mode]
            read = s["read_docs_per_s"]
            rows.append(
                [
                    mode,
                    "/".join(str(d) for d in s["docs"]),
                    f"{s['pages_per_s']:.1f} ({' '.join(str(x) for x in s['pages_per_s_runs'])})",
                    f"{s.get('ratio_pages_per_s', 1.0):.3f}",
                    f"{read:.0f}" if read else "-",
                    f"{s['ratio_read']:.3f}" if "ratio_read" in s else "-",
                    f"{s['gateway_cpu_ms_per_doc']:.3f}",
                    f"{s['node_cpu_ms_per_doc']:.2f}",
                    f"{s['gateway_cpu_ms_per_doc'] / s['node_cpu_ms_per_doc']:.3f}",
                ]
            )
        headers = [
            "mode", "documents", "pages/s (runs)", "vs grpc", "read docs/s", "read vs grpc",
            "gateway CPU ms/doc", "node CPU ms/doc", "gateway/node CPU",
        ]  # fmt: skip
        out += [markdown_table(headers, rows), ""]
    mem = report.get("memory")
    if mem:
        idle = mem["idle"]
        out.append(
            f"Memory: a batch job of {mem['job']['completed']} documents "
            f"({mem['job']['failed']} failed; made in {mem['job']['make_s']:.0f} s); the "
            f"gateway idle before paging: PSS {idle['pss_mb']:.1f} MB, RSS {idle['rss_mb']:.1f} MB."
        )
        out.append("")
        rows = []
        for name, p in mem["passes"].items():
            at = " / ".join(f"{x['rss_mb']:.0f}" for x in p["rss_at"])
            rows.append(
                [
                    name, p["docs"], p["pages"], f"{p['mb']:.0f}", f"{p['largest_page_mb']:.2f}",
                    f"{p['docs_per_s']:.0f}", f"{p['peak_pss_mb']:.1f}", f"{p['peak_rss_mb']:.1f}",
                    at, f"{p['gateway_cpu_s']:.1f}",
                ]
            )  # fmt: skip
        headers = [
            "paging", "documents", "pages", "MB sent", "largest page MB", "docs/s",
            "peak PSS MB", "peak RSS MB", "RSS MB at 10/50/100%", "gateway CPU s",
        ]  # fmt: skip
        out += [markdown_table(headers, rows), ""]
    return "\n".join(out)
