"""The SDK crawling through the gateway does not notice a SIGKILL of the pair's primary.

A real pair of ``pagesift serve`` children under the etcd witness (as
``tests/test_witness.py``: same command line, no role, the lease decides, nobody calls
Promote), the gateway in front of BOTH addresses (in-process, small status pages so
the SDK's final read follows ``next`` over many pages) and Firecrawl's own Python SDK
running ``crawl(...)`` with its own waiter (``poll_interval=1``) in a thread. Once the
standby holds part of the crawl, the primary is SIGKILLed; the standby takes over,
finishes the crawl, and the SDK returns: status ``completed``, every page of the site
exactly once (the multiset of ``sourceURL`` against the site's pages, since the
SDK's pager drops a failed page silently), and the gateway's own ``/metrics`` show
that the SDK polled across the takeover and that no request of it was answered with
anything but 200. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
from firecrawl import Firecrawl
from prometheus_client.parser import text_string_to_metric_families

from pagesift.client import JobClient
from pagesift.demo.site import CALENDAR_EXCLUDE, Site, build_site, normalize_url, serve_site
from pagesift.drill.fixture import Etcd
from pagesift.gateway.server import run
from tests.helpers import NodeFactory, eventually, pages_done
from tests.test_witness import elected, is_primary, witness_pair

pytestmark = pytest.mark.system

PAGE_DOCS = 7  # documents per status page: the SDK's last read follows next ~10 times
STATUS_ROUTES = ("/v2/crawl", "/v2/crawl/{id}")


@pytest.fixture
async def paced_site() -> AsyncIterator[tuple[Site, str]]:
    """The demo site whose robots.txt asks for 0.1 s between requests (the SDK sends
    ``delay`` in whole seconds): the crawl outlives the takeover by seconds."""
    s = build_site(60, crawl_delay=0.1)
    runner, root = await serve_site(s)
    try:
        yield s, root
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def gateway(addresses: list[str]) -> AsyncIterator[str]:
    stop = asyncio.Event()
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        run("127.0.0.1:0", addresses, stop, started, page_documents=PAGE_DOCS)
    )
    try:
        yield f"http://{await asyncio.wait_for(started, 10)}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def requests_by_status(base: str) -> Counter[tuple[str, str, str]]:
    """The gateway's answered requests so far: (route, method, status) -> count."""
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as resp:
        text = await resp.text()
    out: Counter[tuple[str, str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "pagesift_gateway_request_seconds_count":
                key = (s.labels["route"], s.labels["method"], s.labels["status"])
                out[key] += int(s.value)
    return out


async def the_job(address: str, crawl: asyncio.Future[object]) -> str | None:
    """The id of the one job on the node (the SDK's crawl), once it exists."""
    if crawl.done():
        raise AssertionError(f"the SDK's crawl ended early: {crawl.result()!r}")
    async with JobClient(address, retry_budget=0) as client:
        jobs = await client.list_jobs()
    return jobs[0].id if jobs else None


async def test_the_sdk_crawl_sees_no_error_across_a_sigkill_of_the_primary_and_gets_every_page_once(
    nodes: NodeFactory, etcd: Etcd, paced_site: tuple[Site, str]
) -> None:
    s, root = paced_site
    expected = s.expected_documents(root)
    primary, standby = await elected(*await witness_pair(nodes, etcd))
    async with gateway([primary.address, standby.address]) as base:
        fc = Firecrawl(api_key="anonymous", api_url=base)
        crawl = asyncio.create_task(
            asyncio.to_thread(
                fc.crawl,
                root,
                exclude_paths=[CALENDAR_EXCLUDE],
                max_concurrency=4,
                poll_interval=1,
                timeout=150,
            )
        )
        job_id = await eventually(lambda: the_job(primary.address, crawl), "the SDK's crawl", 20)
        await eventually(lambda: pages_done(standby.address, job_id, 15), "15 pages replicated")
        polled = await requests_by_status(base)
        assert polled[("/v2/crawl/{id}", "GET", "200")] >= 1  # the SDK is polling
        assert not crawl.done()
        before = await pages_done(standby.address, job_id, 0)
        primary.kill()
        killed_at = time.monotonic()
        await eventually(lambda: is_primary(standby), "the standby to take over", 30)
        result = await asyncio.wait_for(crawl, 150)
        answered = await requests_by_status(base)
    assert result.status == "completed", result
    sources = Counter(normalize_url(d.metadata.source_url) for d in result.data if d.metadata)
    assert len(result.data) == result.completed == len(expected)
    repeated = sorted(u for u, n in sources.items() if n > 1)
    assert not repeated, f"pages the SDK got twice: {repeated[:5]}"
    assert set(sources) == expected
    # the SDK kept polling across the takeover, and no request of it failed
    assert answered[("/v2/crawl/{id}", "GET", "200")] > polled[("/v2/crawl/{id}", "GET", "200")]
    failed = {k: n for k, n in answered.items() if k[0] in STATUS_ROUTES and k[2] != "200"}
    assert not failed, failed
    assert time.monotonic() - killed_at > 1  # the crawl was not over at the kill
    polls = answered[("/v2/crawl/{id}", "GET", "200")] - polled[("/v2/crawl/{id}", "GET", "200")]
    took = time.monotonic() - killed_at
    print(f"killed at {before} pages replicated; kill to the SDK's answer {took:.1f} s")
    print(f"{polls} status requests after the kill; {len(sources)} pages")
