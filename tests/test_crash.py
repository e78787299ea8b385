"""Crash safety: SIGKILL a real server process mid-job, restart it on the same data.

Whatever instant the kill lands on, the restarted server finishes the job with
every page exactly once in its results (a page and its done mark are one atomic
group; only fetches in flight at the kill are redone).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from pagesift.demo.site import CALENDAR_EXCLUDE, Site, normalize_url
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import QUICK_RETRIES, ServeProc, SiteSpec, all_documents, wait_terminal

pytestmark = pytest.mark.system

CONCURRENCY = 8
# the whole [server] table (base={}: extract_processes stays at its default); one quick
# retry of the slow and the failing page, as everywhere in the suite (the default three,
# 0.5 s apart and doubling, would add seconds to every crawl's tail, after each restart)
CONFIG = {
    "read_timeout": 1.0,
    "connect_timeout": 1.0,
    "max_body_bytes": 1024 * 1024,
    **QUICK_RETRIES,
    # kills 1 page apart are this test's, not the job's: no quarantine (test_quarantine)
    "poison_threshold": 100,
}


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=200, slow_seconds=1.5, big_bytes=2 * 1024 * 1024)


async def completed(stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str) -> int:
    resp = await stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, limit=1))
    return resp.completed + resp.failed


async def kill_when(server: ServeProc, job_id: str, at: int, timeout: float = 30.0) -> None:
    """SIGKILL the server once the job has at least ``at`` finished pages."""
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        while time.monotonic() < deadline and await completed(stub, job_id) < at:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    server.kill()


async def run_with_kills(
    tmp_path: Path,
    start: jobs_pb2.StartCrawlRequest | jobs_pb2.StartBatchScrapeRequest,
    kill_points: list[int],
) -> list[jobs_pb2.Document]:
    server = ServeProc(tmp_path, "server", config=CONFIG, base={})
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            if isinstance(start, jobs_pb2.StartCrawlRequest):
                job_id = (await stub.StartCrawl(start)).id
            else:
                job_id = (await stub.StartBatchScrape(start)).id
        for point in kill_points:
            await kill_when(server, job_id, point)
            await server.start()
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            final = await wait_terminal(stub, job_id, timeout=120)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
            return await all_documents(stub, job_id)
    finally:
        server.stop()


@pytest.mark.parametrize("kill_points", [[0], [5, 60], [30, 31, 150]])
async def test_a_crawl_killed_with_sigkill_finishes_with_every_page_exactly_once(
    tmp_path: Path, site: tuple[Site, str], kill_points: list[int]
) -> None:
    s, root = site
    req = jobs_pb2.StartCrawlRequest(
        url=root, exclude_paths=[CALENDAR_EXCLUDE], max_concurrency=CONCURRENCY
    )
    docs = await run_with_kills(tmp_path, req, kill_points)
    urls = [normalize_url(d.url) for d in docs]
    assert len(urls) == len(set(urls)), "a page is in the results twice"
    assert set(urls) == s.expected_documents(root)
    # only fetches in flight at each kill may have been redone
    expected_paths = {u.split("/", 3)[3] for u in s.expected_documents(root)}
    refetched = sum(max(0, s.hits["/" + p] - 1) for p in expected_paths)
    assert refetched <= len(kill_points) * CONCURRENCY


@pytest.mark.parametrize("kill_points", [[1], [20, 90]])
async def test_a_batch_killed_with_sigkill_finishes_with_every_url_exactly_once(
    tmp_path: Path, site: tuple[Site, str], kill_points: list[int]
) -> None:
    s, root = site
    urls = sorted(s.expected_documents(root))[:150]
    req = jobs_pb2.StartBatchScrapeRequest(urls=urls, max_concurrency=CONCURRENCY)
    docs = await run_with_kills(tmp_path, req, kill_points)
    got = [normalize_url(d.url) for d in docs]
    assert sorted(got) == urls
