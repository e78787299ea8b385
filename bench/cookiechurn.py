"""Bench section ``cookiechurn``: replication bytes per page under cookie churn (issue 28).

Serves the hostile cookie family (``tests.hostile.cookies``) on loopback, starts
``pagesift serve`` with ``/metrics`` on, and crawls three chains of the same pages one
after another on that node:

- ``quiet``: no Set-Cookie (the plain page: the baseline);
- ``chain``: 120 cookies of 3.9 KB on every response, the same names (one value
  changes per page): the flood the jar's change records absorb;
- ``rotate``: 120 cookies of 3.9 KB whose names rotate over 7 sets, so the
  50-per-domain cap evicts and replaces the jar on every page (finding 5).

For each, the figure is what the node's replication backlog grew by during the crawl
(``pagesift_replication_backlog_bytes`` before and after; the backlog keeps 512 MiB,
far above what a crawl here writes, so nothing is trimmed), divided by the pages
stored, and its ratio to the quiet crawl's. Beside it: the crawl's wall time and the
job's notes (the jar's ``cookie_budget`` note). The stated bound the rotating crawl is
checked against: ``cookierecords.JAR_BURST_BYTES + pages * JAR_PAGE_BYTES`` above the
quiet crawl (plus the page's own echo of the names it was sent).

Writes ``bench/out/cookiechurn.json`` and ``bench/out/cookiechurn.md``. Every wait is
bounded; everything listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import (
    LOOPBACK,
    OUT_DIR,
    free_port,
    machine_facts,
    markdown_table,
    say,
    write_json,
)
from bench.crawl import pagesift_server

KINDS = ("quiet", "chain", "rotate")
CRAWL_TIMEOUT = 600.0
SETTLE_S = 0.5  # after the job ends: its finish group is in the log


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--cookiechurn-pages",
        type=int,
        default=200,
        help="cookiechurn: pages per crawl (default 200, at most 1001)",
    )
    ap.add_argument(
        "--cookiechurn-concurrency",
        type=int,
        default=4,
        help="cookiechurn: the crawls' max_concurrency (default 4)",
    )


@contextmanager
def cookie_site() -> Iterator[str]:
    """The hostile cookie family on a loopback port, served by a loop in a thread."""
    from tests.hostile import cookies, serve

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    found: list[Any] = []

    def main() -> None:
        asyncio.set_event_loop(loop)
        found.append(loop.run_until_complete(serve(cookies.ROUTES)))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=main, name="cookie-site", daemon=True)
    thread.start()
    if not ready.wait(60):
        raise RuntimeError("the cookie site did not start in 60 s")
    runner, root = found[0]
    try:
        yield str(root)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def backlog_bytes(metrics_url: str) -> float:
    """The node's ``pagesift_replication_backlog_bytes`` gauge."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "pagesift_replication_backlog_bytes":
                return float(s.value)
    raise RuntimeError("the node's /metrics has no pagesift_replication_backlog_bytes")


def crawl(stub: Any, metrics_url: str, url: str, pages: int, concurrency: int) -> dict[str, Any]:
    """One crawl of ``pages`` pages from ``url``: log bytes it wrote, and its notes."""
    from pagesift.v1 import jobs_pb2

    before = backlog_bytes(metrics_url)
    t0 = time.monotonic()
    req = jobs_pb2.StartCrawlRequest(
        url=url,
        limit=pages,
        sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
        crawl_entire_domain=True,
        max_concurrency=concurrency,
    )
    job_id = stub.StartCrawl(req, timeout=60).id
    deadline = t0 + CRAWL_TIMEOUT
    while True:
        job = stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, limit=1), timeout=30)
        if job.state != jobs_pb2.JOB_STATE_SCRAPING or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    wall = time.monotonic() - t0
    time.sleep(SETTLE_S)
    grown = backlog_bytes(metrics_url) - before
    errors = stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=job_id), timeout=30).errors
    return {
        "state": jobs_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_").lower(),
        "pages": job.completed,
        "failed": job.failed,
        "wall_s": round(wall, 2),
        "log_bytes": int(grown),
        "log_bytes_per_page": round(grown / max(1, job.completed)),
        "notes": sorted({e.code for e in errors if not e.url}),
    }


def run(args: argparse.Namespace) -> None:
    from pagesift.primary.engine import cookierecords

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    pages = max(2, min(args.cookiechurn_pages, 1001))
    metrics_addr = f"{LOOPBACK}:{free_port()}"
    metrics_url = f"http://{metrics_addr}/metrics"
    results: dict[str, dict[str, Any]] = {}
    with (
        cookie_site() as root,
        pagesift_server(
            args.cookiechurn_concurrency,
            OUT_DIR / "cookiechurn-server.log",
            [f'metrics_listen = "{metrics_addr}"'],
        ) as server,
    ):
        for kind in KINDS:
            url = f"{root}cookies/{kind}/0?last={pages - 1}"
            results[kind] = crawl(
                server.stub, metrics_url, url, pages, args.cookiechurn_concurrency
            )
            r = results[kind]
            say(f"  {kind}: {r['pages']} pages, {r['log_bytes_per_page']:,} log bytes a page")
    quiet = max(1, results["quiet"]["log_bytes_per_page"])
    for r in results.values():
        r["ratio_to_quiet"] = round(r["log_bytes_per_page"] / quiet, 1)
    burst, per_page = cookierecords.JAR_BURST_BYTES, cookierecords.JAR_PAGE_BYTES
    above = results["rotate"]["log_bytes"] - results["quiet"]["log_bytes"]
    bound = burst + pages * per_page
    figures = {
        "machine": machine_facts(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "pages": pages,
        "concurrency": args.cookiechurn_concurrency,
        "crawls": results,
        "jar_budget": {"burst_bytes": burst, "page_bytes": per_page},
        "rotate_above_quiet_bytes": above,
        "stated_bound_bytes": bound,
    }
    write_json(OUT_DIR / "cookiechurn.json", figures)
    rows = [
        [kind, r["state"], r["pages"], f"{r['log_bytes_per_page']:,}", f"{r['ratio_to_quiet']}x",
         r["wall_s"], ", ".join(r["notes"]) or "-"]
        for kind, r in results.items()
    ]  # fmt: skip
    md = [
        f"### Replication bytes per page under cookie churn ({pages} pages a crawl)",
        markdown_table(
            ["site", "state", "pages", "log bytes / page", "vs quiet", "wall s", "job notes"], rows
        ),
        "",
        f"rotate above quiet: {above:,} bytes for {pages} pages "
        f"({above / pages:,.0f} a page); the stated bound: {burst:,} + {pages} x {per_page:,} "
        f"= {bound:,} bytes ({'within' if above <= bound else 'PAST'} it)",
    ]
    (OUT_DIR / "cookiechurn.md").write_text("\n".join(md) + "\n")
    say("\n".join(md))
