"""GetJob pages by size as well as count, and WatchJob's catch-up delivers big documents.

A real in-process node runs a batch job over pages with big bodies (markdown and
raw_html both kept, so a document is about twice its page), served by the in-process
``FakeEngine``: what is under test is the paging of stored documents, not fetching.
``max_response_bytes`` is set low so a handful of documents fill a response. Every wait
is bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from pagesift.core.api import service as jobservice
from pagesift.primary.engine.interface import Page
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.fakeengine import FakeEngine
from tests.helpers import RunningNode, in_process_node, wait_terminal

CAP = 512 * 1024  # max_response_bytes in these tests
# Page body sizes in KiB; document 9's (900 KiB: ~1.8 MB as a document) is over CAP.
SIZES = [40, 300, 120, 200, 10, 260, 90, 250, 5, 900, 30, 150, 220, 60, 180, 75]
BIG = 9
WORDS = "lorem ipsum dolor sit amet "
ROOT = "http://127.0.0.1:8001"


def page(url: str) -> Page:
    """``/p{i}/{kib}``: a page of ``kib`` KiB of words, as markdown and as raw HTML."""
    kib = int(url.rpartition("/")[2])
    text = (WORDS * (kib * 1024 // len(WORDS) + 1))[: kib * 1024]
    doc = jobs_pb2.Document(
        url=url,
        final_url=url,
        markdown=text,
        raw_html=f"<html><body><p>{text}</p></body></html>",
    )
    return Page(document=doc, links=[])


@pytest.fixture
async def job(tmp_path: Path) -> AsyncIterator[tuple[RunningNode, str, list[str]]]:
    """A finished batch job of len(SIZES) big documents, stored in URL order."""
    async with in_process_node(tmp_path, engine=FakeEngine(page), max_response_bytes=CAP) as node:
        urls = [f"{ROOT}/p{i}/{kib}" for i, kib in enumerate(SIZES)]
        options = jobs_pb2.ScrapeOptions(
            formats=[jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_RAW_HTML]
        )
        started = await node.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=urls, options=options, max_concurrency=1)
        )
        final = await wait_terminal(node.stub, started.id)
        assert (final.state, final.completed) == (jobs_pb2.JOB_STATE_COMPLETED, len(SIZES))
        yield node, started.id, urls


async def walk(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str, limit: int
) -> list[jobs_pb2.GetJobResponse]:
    """Every GetJob page from skip 0, following next_skip."""
    pages: list[jobs_pb2.GetJobResponse] = []
    skip = 0
    for _ in range(100):
        resp = await stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=limit))
        pages.append(resp)
        if not resp.HasField("next_skip"):
            return pages
        assert resp.next_skip == skip + len(resp.documents)  # follows the last document
        assert resp.next_skip > skip
        skip = resp.next_skip
    raise AssertionError("next_skip never ended")


async def test_responses_stay_under_the_cap_and_next_skip_walks_every_document_once(
    job: tuple[RunningNode, str, list[str]],
) -> None:
    node, job_id, urls = job
    pages = await walk(node.stub, job_id, limit=100)
    for resp in pages:
        assert resp.documents, "a page of a finished job is never empty"
        assert resp.ByteSize() <= CAP or len(resp.documents) == 1, [d.url for d in resp.documents]
    got = [d.url for resp in pages for d in resp.documents]
    assert got == urls  # every document exactly once, in index order
    assert any(len(r.documents) > 1 for r in pages)  # several small ones share a response
    assert len(pages) > len(SIZES) // 4  # ... and the byte cap, not the count, cut them
    one_by_one = [d.url for resp in await walk(node.stub, job_id, limit=1) for d in resp.documents]
    assert one_by_one == urls
    # the count cap still holds under the byte cap
    two = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=10, limit=2))
    assert len(two.documents) == 2 and two.next_skip == 12  # 30 + 150 KiB pages fit


async def test_a_document_over_the_cap_comes_alone(
    job: tuple[RunningNode, str, list[str]],
) -> None:
    node, job_id, urls = job
    big = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=BIG, limit=100))
    assert [d.url for d in big.documents] == [urls[BIG]]
    assert big.ByteSize() > CAP and big.next_skip == BIG + 1
    assert len(big.documents[0].raw_html) >= SIZES[BIG] * 1024
    before = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=BIG - 1, limit=100))
    assert [d.url for d in before.documents] == [urls[BIG - 1]]  # the big one waits its turn
    status = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, status_only=True))
    assert not status.documents and not status.HasField("next_skip")


async def test_watch_catch_up_delivers_every_document_in_order(
    job: tuple[RunningNode, str, list[str]],
) -> None:
    node, job_id, urls = job
    seen: list[tuple[int, str]] = []
    async for event in node.stub.WatchJob(jobs_pb2.WatchJobRequest(id=job_id), timeout=30):
        if event.HasField("document"):
            seen.append((event.document.index, event.document.document.url))
            assert event.ByteSize() < jobservice.MAX_SEND_MESSAGE_BYTES
    assert seen == list(enumerate(urls))


async def test_a_document_over_the_message_limit_is_refused_by_index(
    job: tuple[RunningNode, str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the send limit the call fails with RESOURCE_EXHAUSTED naming the document
    (not a transport error), and the caller can skip past it."""
    node, job_id, urls = job
    monkeypatch.setattr(jobservice, "MAX_SEND_MESSAGE_BYTES", 1 << 20)  # under document 9
    first = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, limit=100))
    assert first.documents and first.next_skip <= BIG
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=BIG, limit=100))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = refused.value.details() or ""
    assert f"document {BIG} is" in details and f"skip={BIG + 1}" in details, details
    after = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=BIG + 1, limit=100))
    assert after.documents[0].url == urls[BIG + 1]

    seen: list[int] = []
    call = node.stub.WatchJob(jobs_pb2.WatchJobRequest(id=job_id), timeout=30)
    with pytest.raises(grpc.aio.AioRpcError) as stopped:
        async for event in call:
            if event.HasField("document"):
                seen.append(event.document.index)
    assert seen == list(range(BIG))
    assert stopped.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"document {BIG} is" in (stopped.value.details() or "")
    assert f"from_index={BIG + 1}" in (stopped.value.details() or "")
    rest: list[int] = []
    watch = jobs_pb2.WatchJobRequest(id=job_id, from_index=BIG + 1)
    async for event in node.stub.WatchJob(watch, timeout=30):
        if event.HasField("document"):
            rest.append(event.document.index)
    assert rest == list(range(BIG + 1, len(SIZES)))
