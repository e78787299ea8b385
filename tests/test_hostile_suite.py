"""The whole hostile site at once against one real node (issue 19's acceptance).

Bob sends every hostile input the families of ``tests.hostile`` serve: the finding-4
documents and the finding-5 pages in one batch, a crawl of the cookie flood, a crawl
behind the unclosed sitemap, Maps behind the 20,000-rule robots.txt and the slow
sitemap index. Meanwhile alice crawls an ordinary site and asks ListJobs every 100 ms.

What must hold (liveness bounds, not speed claims): alice's every ListJobs answers
within the liveness bound; alice's crawl completes with no page charged for bob's
inputs; each of bob's hostile pages ends as a document or as a page error naming the
cap that refused it; both Maps answer within ``map_timeout`` and slack (well before the
slow sitemaps' 20 s); no worker's peak passes its memory cap (the node's own
``pagesift_worker_peak_memory_bytes``), and the event loop never lagged past
``tests.liveness.LAG_BOUND`` (``pagesift_event_loop_lag_max_seconds``).

The bounds hold on a loaded machine (issue 28, finding 8: a fixed 2 s failed at 2.40 s
under load 5-9): alice's ListJobs is timed first with nothing hostile running (the
control), and the bound is ``tests.liveness.bound`` of it, 20 times the control and at
least 8 s; a loop stalled for many seconds (the regressions here took 39 s to 531 s)
still fails both. The tight figures live in ``make bench`` (``bench/hostile.py``).

The families' own modules test each input alone; this one
shows they do not add up to an outage when they arrive together.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from pagesift.demo.site import Site
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests import hostile, liveness
from tests.helpers import (
    ALICE,
    BOB,
    UNLIMITED,
    NodeFactory,
    crawl,
    documents,
    free_port,
    metric,
    scrape_metrics,
    wait_done,
    write_accounts,
)
from tests.hostile import robots as hostile_robots
from tests.hostile import sitemaps as hostile_sitemaps

pytestmark = pytest.mark.system

MAP_TIMEOUT = 4.0
SLACK = 10.0  # past map_timeout, for a loaded box; a Map that ignores it takes 20 s more
MEMORY_CAP = 1 << 30  # worker_memory_limit: RLIMIT_AS of every extraction worker

HOSTILE_PAGES = (
    "documents/utf16-entity.docx",
    "documents/sparse.xlsx",
    "documents/empty-elements.docx",
    "documents/slide-ids.pptx",
    "documents/inflating.pdf",
    "html/deep",
    "html/many-elements",
    "html/deep-and-wide",
)
# what each may end as: a document, or a page error whose message names the cap
MAY_PASS = {"documents/sparse.xlsx", "html/deep-and-wide"}  # legal, merely large
NAMES_A_CAP = ("MAX_", "DTD", "memory cap", "took over")


@contextlib.asynccontextmanager
async def _hostile_sites() -> AsyncIterator[tuple[str, str, str]]:
    """Three hostile sites (one robots.txt each): unclosed sitemap, 20,000 rules, slow index."""
    routes = hostile.all_routes()
    runners = []
    roots = []
    try:
        for robots_txt in (
            hostile_sitemaps.robots_route("unclosed.xml.gz"),
            hostile_robots.robots_route(),
            hostile_sitemaps.robots_route("slow-index.xml"),
        ):
            runner, root = await hostile.serve([*routes, robots_txt])
            runners.append(runner)
            roots.append(root)
        yield roots[0], roots[1], roots[2]
    finally:
        for runner in runners:
            await runner.cleanup()


async def _probe(stub: jobs_pb2_grpc.JobServiceAsyncStub, stop: asyncio.Event) -> float:
    """Alice's ListJobs every 0.1 s until ``stop``: the slowest (a failure counts 30 s)."""
    worst = 0.0
    for _ in range(100_000):  # bounded: stop comes long before
        if stop.is_set():
            break
        sent = time.monotonic()
        try:
            await stub.ListJobs(
                jobs_pb2.ListJobsRequest(page_size=1), metadata=ALICE.md, timeout=30
            )
            worst = max(worst, time.monotonic() - sent)
        except grpc.aio.AioRpcError:
            worst = 30.0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)
    return worst


async def _map_seconds(stub: jobs_pb2_grpc.JobServiceAsyncStub, root: str) -> tuple[int, float]:
    sent = time.monotonic()
    stream = stub.Map(jobs_pb2.MapRequest(url=root), metadata=BOB.md, timeout=MAP_TIMEOUT + 60)
    urls = [u async for batch in stream for u in batch.urls]
    return len(urls), time.monotonic() - sent


@pytest.mark.timeout(240)
async def test_the_whole_hostile_site_at_once_leaves_another_account_served(
    nodes: NodeFactory, tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, victim_root = site
    metrics_at = f"127.0.0.1:{free_port()}"
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    node = nodes(
        "n",
        config={
            "accounts_file": str(accounts),
            "metrics_listen": metrics_at,
            "map_timeout": MAP_TIMEOUT,
            "crawl_seed_timeout": MAP_TIMEOUT,
            "worker_memory_limit": MEMORY_CAP,
            "max_body_bytes": 10 << 20,  # the server's default: the hostile files fit
            "read_timeout": 30.0,
        },
    )
    await node.start()
    async with (
        _hostile_sites() as (unclosed, many_rules, slow_index),
        grpc.aio.insecure_channel(node.address, options=UNLIMITED) as channel,
    ):
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        control = await liveness.control(  # alice's ListJobs with nothing hostile running
            lambda: stub.ListJobs(
                jobs_pb2.ListJobsRequest(page_size=1), metadata=ALICE.md, timeout=30
            )
        )
        limit = liveness.bound(control)
        stop = asyncio.Event()
        probe = asyncio.create_task(_probe(stub, stop))
        try:
            batch = await stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(
                    urls=[unclosed + p for p in HOSTILE_PAGES], max_concurrency=4
                ),
                metadata=BOB.md,
            )
            cookies = await stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(
                    url=unclosed + "cookies/chain/0?last=30", limit=31, crawl_entire_domain=True
                ),
                metadata=BOB.md,
            )
            sitemap_crawl = await stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url=unclosed + "sitemaps/page/start", limit=5),
                metadata=BOB.md,
            )
            victim = await stub.StartCrawl(crawl(victim_root, limit=40), metadata=ALICE.md)
            (rules_urls, rules_s), (slow_urls, slow_s) = await asyncio.gather(
                _map_seconds(stub, many_rules), _map_seconds(stub, slow_index)
            )
            alice_job = await wait_done(stub, victim.id, ALICE.md, timeout=120)
            bob_batch = await wait_done(stub, batch.id, BOB.md, timeout=120)
            bob_crawls = [
                await wait_done(stub, job.id, BOB.md, timeout=120)
                for job in (cookies, sitemap_crawl)
            ]
        finally:
            stop.set()
            worst = await probe
        alice_errors = await stub.GetJobErrors(
            jobs_pb2.GetJobErrorsRequest(id=victim.id), metadata=ALICE.md
        )
        bob_docs = await documents(stub, batch.id, BOB.md)
        bob_errors = await stub.GetJobErrors(
            jobs_pb2.GetJobErrorsRequest(id=batch.id), metadata=BOB.md
        )
        samples = await scrape_metrics(metrics_at)

    lag = metric(samples, "pagesift_event_loop_lag_max_seconds")
    print(  # the figures for the record (pytest -s shows them)
        f"alice's ListJobs: control {control:.3f} s, worst {worst:.3f} s, bound {limit:.1f} s;"
        f" loop lag max {lag:.3f} s; Maps {rules_s:.2f} s and {slow_s:.2f} s"
    )
    assert worst < limit, f"alice's ListJobs took {worst:.2f} s (control {control:.3f} s)"
    assert alice_job.state == jobs_pb2.JOB_STATE_COMPLETED, alice_job
    # the demo site's own big.html is over the body cap by design; nothing of bob's counts
    charged = [
        e for e in alice_errors.errors if any(c in e.message for c in (*NAMES_A_CAP, "crash"))
    ]
    assert not charged and alice_job.completed >= 30, (alice_job, charged)

    assert bob_batch.state == jobs_pb2.JOB_STATE_COMPLETED, bob_batch
    ended = {d.url.removeprefix(unclosed) for d in bob_docs}
    ended |= {e.url.removeprefix(unclosed) for e in bob_errors.errors}
    assert ended == set(HOSTILE_PAGES)
    for err in bob_errors.errors:
        assert err.code in ("too_large", "parse_failed"), err
        assert any(cap in err.message for cap in NAMES_A_CAP), err.message
    refused = {e.url.removeprefix(unclosed) for e in bob_errors.errors}
    assert set(HOSTILE_PAGES) - MAY_PASS <= refused
    for job in bob_crawls:
        assert job.state in (jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED), job
    assert bob_crawls[0].completed == 31  # the cookie flood is crawled, not refused

    assert rules_s < MAP_TIMEOUT + SLACK and rules_urls > 0, (rules_s, rules_urls)
    assert slow_s < MAP_TIMEOUT + SLACK, slow_s
    assert slow_urls < hostile_sitemaps.SLOW_CHILDREN  # cut at map_timeout

    peaks = metric(samples, "pagesift_worker_peak_memory_bytes_count")
    within = next(  # the bucket of the cap: le="1.073741824e+09"
        value
        for (name, labels), value in samples.items()
        if name == "pagesift_worker_peak_memory_bytes_bucket"
        and float(dict(labels)["le"]) == MEMORY_CAP
    )
    assert peaks >= len(HOSTILE_PAGES) and within == peaks, (within, peaks)
    assert lag < liveness.LAG_BOUND, f"the event loop lagged {lag:.2f} s"
