"""AppendBatchScrape across a SIGKILL: a real primary killed while URLs are appended.

A ``pagesift serve`` primary with a standby following it runs a batch over a loopback
site while the test appends to it, each append under its own idempotency key. The
primary is SIGKILLed as one append is on the wire; restarted on its data, it is sent
every append again with the same keys (what a client does after an error it cannot
read): the appends that committed add nothing, the others add their URLs. The job ends
with every URL's page exactly once, in index order of its batch (the start's URLs, then
each append's), and the standby, following the restarted primary, holds the same pages.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import grpc
import pytest
from aiohttp import web

from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import (
    NodeFactory,
    all_documents,
    eventually,
    finished,
    get_job,
    serve_handler,
)

pytestmark = pytest.mark.system

CONFIG = {"poison_threshold": 100}  # the kills are the test's, not the job's
BASE = 24  # URLs the batch starts with
APPENDS = 8  # appends of STEP URLs each; the primary dies during append KILL_AT
STEP = 4
KILL_AT = 3


def batch(root: str) -> list[list[str]]:
    """The start's URLs, then each append's."""
    first = [f"{root}p/{i}" for i in range(BASE)]
    return [first, *([f"{root}a{k}/{j}" for j in range(STEP)] for k in range(APPENDS))]


async def append(address: str, job_id: str, k: int, urls: list[str]) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        req = jobs_pb2.AppendBatchScrapeRequest(id=job_id, urls=urls, idempotency_key=f"k{k}")
        await jobs_pb2_grpc.JobServiceStub(ch).AppendBatchScrape(req, timeout=5)


@pytest.mark.parametrize("kill_after", [0.0, 0.004])
async def test_a_primary_killed_during_appends_ends_with_every_url_once_on_both_nodes(
    nodes: NodeFactory, kill_after: float
) -> None:
    hits: Counter[str] = Counter()

    async def page(request: web.Request) -> web.StreamResponse:
        hits[request.path] += 1
        await asyncio.sleep(0.03)
        title = request.path.strip("/")
        return web.Response(
            text=f"<html><head><title>{title}</title></head><body><p>{title}</p></body></html>",
            content_type="text/html",
        )

    async with serve_handler(page) as port:
        root = f"http://127.0.0.1:{port}/"
        parts = batch(root)
        primary = nodes("primary", config=CONFIG)
        await primary.start()
        standby = nodes("standby", role="standby", primary=primary.address, config=CONFIG)
        await standby.start()
        async with grpc.aio.insecure_channel(primary.address) as ch:
            start = jobs_pb2.StartBatchScrapeRequest(urls=parts[0], max_concurrency=2)
            job_id = (await jobs_pb2_grpc.JobServiceStub(ch).StartBatchScrape(start)).id
        for k in range(KILL_AT):
            await append(primary.address, job_id, k, parts[1 + k])

        async def kill() -> None:
            await asyncio.sleep(kill_after)
            primary.kill()

        with contextlib.suppress(grpc.aio.AioRpcError):  # it may or may not have committed
            await asyncio.gather(
                append(primary.address, job_id, KILL_AT, parts[1 + KILL_AT]), kill()
            )
        await primary.start()
        for k in range(APPENDS):  # every append again, under its key: each adds once
            await append(primary.address, job_id, k, parts[1 + k])

        final = await finished(primary.address, job_id, timeout=60)
        assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
        expected = [u for part in parts for u in part]
        assert (final.total, final.completed) == (len(expected), len(expected))
        async with grpc.aio.insecure_channel(primary.address) as ch:
            docs = [d.url for d in await all_documents(jobs_pb2_grpc.JobServiceStub(ch), job_id)]
        assert sorted(docs) == sorted(expected), "a page missing or twice"
        # in batch order: no page ahead of its index by more than the pages in flight
        # (each append's URLs after the start's and the earlier appends')
        early = [u for i, u in enumerate(docs) if i + 2 * 2 < expected.index(u)]
        assert not early, early[:5]

        async def standby_has_it() -> list[str] | None:
            try:
                job = await get_job(standby.address, job_id)
            except grpc.aio.AioRpcError as e:  # not there yet (it may be resyncing)
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return None
            if job.state != jobs_pb2.JOB_STATE_COMPLETED or job.completed < len(expected):
                return None
            async with grpc.aio.insecure_channel(standby.address) as ch:
                got = await all_documents(jobs_pb2_grpc.JobServiceStub(ch), job_id)
            return [d.url for d in got]

        assert await eventually(standby_has_it, "the standby to hold every page", 60) == docs
        assert (await get_job(standby.address, job_id)).total == len(expected)
    refetched = sum(n - 1 for n in hits.values())
    assert refetched <= 2 * 2, hits.most_common(4)  # only pages in flight at the kill
