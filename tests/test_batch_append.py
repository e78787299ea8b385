"""AppendBatchScrape on a real node: URLs added to a batch-scrape job (Firecrawl's appendToId).

The node runs in process with an engine that answers from memory (``GateEngine``: a
``FakeEngine`` whose ``/hold`` pages wait for the test), so a job is held running while
URLs are appended, and the address guard can be on while nothing is fetched: the batch
URLs are public IP literals the fake answers. What is checked is what the runtime does
with an append: the order of pages, reopening a completed job, refusing a finished one
that cannot be reopened, AIP-155 replays, ownership, the guard and the account's limits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from pagesift.client import JobClient
from pagesift.client.errors import error_info_of, reason_of
from pagesift.primary.engine.interface import FetchPolicy, Page
from pagesift.v1 import jobs_pb2
from tests.fakeengine import FakeEngine, page
from tests.helpers import ALICE, BOB, Acct, RunningNode, in_process_node, wait_done, write_accounts

HOST = "http://93.184.215.14"  # a public literal: the guard allows it; the fake answers it
TINY = Acct("tiny", {"pages_per_day": 2})
SMALL = Acct("small", {"max_batch_urls": 3})


def urls(*paths: str) -> list[str]:
    return [f"{HOST}/{p}" for p in paths]


class GateEngine(FakeEngine):
    """A ``FakeEngine`` whose ``/hold`` pages answer once ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(lambda url: page(url, title=url.rsplit("/", 1)[-1]))
        self.gate = asyncio.Event()

    async def scrape(
        self,
        url: str,
        options: jobs_pb2.ScrapeOptions,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> Page:
        if "/hold" in url:
            await asyncio.wait_for(self.gate.wait(), 30)
        return await super().scrape(url, options, policy)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[RunningNode, GateEngine, JobClient]]:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB, TINY, SMALL))
    engine = GateEngine()
    async with (
        in_process_node(
            tmp_path / "data",
            engine=engine,
            allow_private_networks=False,
            accounts_file=str(accounts),
            max_batch_urls=8,
        ) as n,
        JobClient([n.address], api_key=ALICE.key, timeout=10) as c,
    ):
        yield n, engine, c


async def start(c: JobClient, paths: Sequence[str], **kw: Any) -> str:
    resp = await c.start_batch(jobs_pb2.StartBatchScrapeRequest(urls=urls(*paths), **kw))
    return resp.id


async def finished(n: RunningNode, job_id: str, acct: Acct = ALICE) -> jobs_pb2.GetJobResponse:
    await wait_done(n.stub, job_id, acct.md)
    return await n.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, limit=100), metadata=acct.md)


def refusal(err: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str | None, dict[str, str]]:
    info = error_info_of(err)
    return err.code(), reason_of(err), dict(info.metadata) if info is not None else {}


async def test_urls_appended_to_a_running_batch_are_scraped_after_its_own_in_order(
    node: tuple[RunningNode, GateEngine, JobClient],
) -> None:
    n, engine, c = node
    job = await start(c, ["hold", "p1", "p2"], max_concurrency=1)
    added = await c.append_batch(job, urls("p3", "p4"))
    assert (added.id, added.first_index, added.added, added.total) == (job, 3, 2, 5)
    assert not added.reopened
    running = await c.get_job(job, status_only=True)
    assert (running.state, running.total) == (jobs_pb2.JOB_STATE_SCRAPING, 5)
    engine.gate.set()
    final = await finished(n, job)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED
    assert (final.total, final.completed) == (5, 5)
    assert [d.url for d in final.documents] == urls("hold", "p1", "p2", "p3", "p4")
    assert engine.requests == urls("hold", "p1", "p2", "p3", "p4")  # each page once


async def test_an_append_runs_a_completed_batch_again_and_refuses_a_cancelled_one(
    node: tuple[RunningNode, GateEngine, JobClient],
) -> None:
    n, engine, c = node
    engine.gate.set()
    job = await start(c, ["p1"])
    first = await finished(n, job)
    assert first.state == jobs_pb2.JOB_STATE_COMPLETED
    added = await c.append_batch(job, urls("p2", "p3"))
    assert added.reopened and (added.first_index, added.total) == (1, 3)
    final = await finished(n, job)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED and final.note == ""
    assert [d.url for d in final.documents] == urls("p1", "p2", "p3")
    assert final.expires_at.ToMilliseconds() >= first.expires_at.ToMilliseconds()

    engine.gate.clear()
    held = await start(c, ["hold"])
    assert await c.cancel(held) == jobs_pb2.JOB_STATE_CANCELLED
    crawl = await c.start_crawl(jobs_pb2.StartCrawlRequest(url=f"{HOST}/hold"))
    for job_id, kind, state in ((held, "batch", "cancelled"), (crawl, "crawl", "scraping")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.append_batch(job_id, urls("p9"))
        code, reason, md = refusal(err.value)
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_NOT_APPENDABLE")
        assert (md["id"], md["kind"], md["state"]) == (job_id, kind, state)
    assert (await c.get_job(held, status_only=True)).total == 1  # nothing added
    await c.cancel(crawl)


async def test_a_retried_append_adds_nothing_twice_and_a_reused_key_is_refused(
    node: tuple[RunningNode, GateEngine, JobClient],
) -> None:
    n, engine, c = node
    job = await start(c, ["hold"], max_concurrency=1)
    once = await c.append_batch(job, urls("p1", "p2"), idempotency_key="k-1")
    again = await c.append_batch(job, urls("p1", "p2"), idempotency_key="k-1")
    assert once == again  # AIP-155: the first call's answer
    other = await c.append_batch(job, urls("p3"), idempotency_key="k-2")
    assert (other.first_index, other.total) == (3, 4)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.append_batch(job, urls("p4"), idempotency_key="k-1")
    code, reason, md = refusal(err.value)
    assert (code, reason, md["id"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "IDEMPOTENCY_KEY_REUSED",
        job,
    )
    engine.gate.set()
    final = await finished(n, job)
    assert [d.url for d in final.documents] == urls("hold", "p1", "p2", "p3")
    # a replay after the job finished still answers, and reopens nothing
    assert await c.append_batch(job, urls("p1", "p2"), idempotency_key="k-1") == once
    assert (await c.get_job(job, status_only=True)).state == jobs_pb2.JOB_STATE_COMPLETED


async def test_another_accounts_batch_is_not_found_and_its_options_stay_the_jobs(
    node: tuple[RunningNode, GateEngine, JobClient],
) -> None:
    n, _, c = node
    job = await start(c, ["hold"], max_concurrency=1)
    async with JobClient([n.address], api_key=BOB.key, timeout=10) as bob:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bob.append_batch(job, urls("p1"))
    assert refusal(err.value)[:2] == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    other = jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_HTML])
    for kw, field in (({"options": other}, "options"), ({"max_concurrency": 4}, "max_concurrency")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.append_batch(job, urls("p1"), **kw)
        assert refusal(err.value)[2]["field"] == field
    same = await c.append_batch(
        job, urls("p1"), options=jobs_pb2.ScrapeOptions(), max_concurrency=1
    )
    assert same.total == 2
    assert (await c.get_job(job, status_only=True)).total == 2
    await c.cancel(job)


async def test_the_address_guard_refuses_an_appended_url_or_skips_it_when_asked(
    node: tuple[RunningNode, GateEngine, JobClient],
) -> None:
    _, _, c = node
    job = await start(c, ["hold"])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.append_batch(job, ["http://127.0.0.1/admin", *urls("p1")])
    code, reason, md = refusal(err.value)
    assert (code, reason, md["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
        "urls[0]",
    )
    assert "127.0.0.1 is a loopback address" in (err.value.details() or "")
    assert (await c.get_job(job, status_only=True)).total == 1
    kept = await c.append_batch(
        job, ["http://127.0.0.1/admin", *urls("p1")], ignore_invalid_urls=True
    )
    assert (list(kept.invalid_urls), kept.added, kept.total) == (["http://127.0.0.1/admin"], 1, 2)
    await c.cancel(job)


async def test_an_append_meets_the_limits_of_a_start_of_the_job_as_it_will_be(
    node: tuple[RunningNode, GateEngine, JobClient],
) -> None:
    n, engine, c = node
    engine.gate.set()
    job = await start(c, ["p1", "p2", "p3", "p4", "p5", "p6"])
    with pytest.raises(grpc.aio.AioRpcError) as err:  # the node's max_batch_urls = 8
        await c.append_batch(job, urls("a", "b", "c"))
    assert refusal(err.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    async with JobClient([n.address], api_key=SMALL.key, timeout=10) as small:
        job = await start(small, ["p1", "p2"])
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the account's max_batch_urls = 3
            await small.append_batch(job, urls("p3", "p4"))
        code, reason, md = refusal(err.value)
        assert (code, reason, md["limit"]) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUOTA_EXCEEDED",
            "max_batch_urls",
        )
        assert (await small.append_batch(job, urls("p3"))).total == 3
    async with JobClient([n.address], api_key=TINY.key, timeout=10) as tiny:
        job = await start(tiny, ["p1", "p2"])
        await finished(n, job, TINY)  # the account's 2 pages of the day are spent
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tiny.append_batch(job, urls("p3"))
        code, reason, md = refusal(err.value)
        assert (code, reason, md["limit"]) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUOTA_EXCEEDED",
            "pages_per_day",
        )
        assert (await tiny.get_job(job, status_only=True)).state == jobs_pb2.JOB_STATE_COMPLETED


async def test_an_expired_batch_takes_its_appended_urls_and_keys_with_it(tmp_path: Path) -> None:
    engine = GateEngine()
    engine.gate.set()
    async with (
        in_process_node(tmp_path, engine=engine, job_ttl_seconds=1.0) as n,
        JobClient([n.address], timeout=10) as c,
    ):
        job = await start(c, ["p1"])
        await c.append_batch(job, urls("p2"), idempotency_key="k")
        await wait_done(n.stub, job)
        store = n.node.store()
        assert store.list_len(f"job/{job}/added") == 1 and store.get(f"job/{job}/appends")
        for _ in range(100):  # the sweeper deletes every replicated key of the job
            if not list(store.replicated_items()):
                break
            await asyncio.sleep(0.05)
        assert list(store.replicated_items()) == []
