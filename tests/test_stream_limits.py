"""WatchJob streams are bounded: per-account and node-wide caps on open streams
(RESOURCE_EXHAUSTED naming the limit, slots freed when a stream ends or is cancelled),
and a slow reader makes the server read only a small window of the job ahead."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import grpc
import pytest
from google.rpc import error_details_pb2

from pagesift.client.errors import details_of, status_of
from pagesift.core.api import rpcerrors
from pagesift.core.api.streams import WINDOW_DOCS
from pagesift.core.jobs import records
from pagesift.core.jobs.accounts import hash_key
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import RunningNode, in_process_node, until

ACME_KEY = "acme-key-0123456789"
BETA_KEY = "beta-key-0123456789"


def md(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def accounts(tmp_path: Path) -> str:
    path = tmp_path / "accounts.toml"
    path.write_text(
        f"""
[[account]]
name = "acme"
key_sha256 = "{hash_key(ACME_KEY)}"
max_concurrent_streams = 2

[[account]]
name = "beta"
key_sha256 = "{hash_key(BETA_KEY)}"
"""
    )
    return str(path)


def put_job(store: Store, owner: str, docs: int, doc_bytes: int, *, state: str) -> str:
    """A job written straight into the node's store: ``docs`` documents of about
    ``doc_bytes`` each (incompressible text), in ``state``."""
    job_id = str(uuid.uuid4())
    now = records.now_ms()
    meta = records.JobMeta(
        id=job_id,
        kind="batch",
        state=state,
        owner=owner,
        created_ms=now,
        expires_ms=now + 3_600_000,
        total=docs,
        finished_ms=now if state in records.TERMINAL else 0,
    )

    def group(g: WriteGroup) -> None:
        g.put(records.JobKeys(job_id).meta, meta.encode())
        g.insert(records.JOBS_SET, job_id.encode())
        for i in range(docs):
            doc = jobs_pb2.Document(
                url=f"http://127.0.0.1/{i}", status_code=200, markdown=os.urandom(doc_bytes).hex()
            )
            g.push(records.JobKeys(job_id).pages, doc.SerializeToString())
            g.insert(records.JobKeys(job_id).done, str(i).encode())

    store.write(group)
    return job_id


def sample(node: RunningNode, name: str, labels: dict[str, str] | None = None) -> float:
    value = node.node.metrics.registry.get_sample_value(name, labels or {})
    assert value is not None, f"no series {name} {labels or ''}"
    return value


async def open_stream(
    node: RunningNode, job_id: str, key: str | None = None
) -> grpc.aio.UnaryStreamCall[jobs_pb2.WatchJobRequest, jobs_pb2.WatchJobResponse]:
    """A WatchJob stream whose first message has arrived (the server holds its slot)."""
    call = node.stub.WatchJob(
        jobs_pb2.WatchJobRequest(id=job_id), metadata=md(key) if key else None
    )
    first = await asyncio.wait_for(call.read(), 10)
    assert isinstance(first, jobs_pb2.WatchJobResponse)
    return call


def limit_of(err: grpc.aio.AioRpcError) -> str | None:
    """The ``pagesift-limit`` trailing metadata of a refusal, checked against its
    details (ErrorInfo QUOTA_EXCEEDED and a QuotaFailure naming the same limit)."""
    pairs = cast(Iterable[tuple[str, str | bytes]], err.trailing_metadata() or ())
    limit = next((str(v) for k, v in pairs if k == "pagesift-limit"), None)
    status = status_of(err)
    (info,) = details_of(status, error_details_pb2.ErrorInfo)
    assert (info.reason, info.metadata["limit"]) == (rpcerrors.Reason.QUOTA_EXCEEDED, limit)
    (failure,) = details_of(status, error_details_pb2.QuotaFailure)
    (violation,) = failure.violations
    assert violation.quota_id == limit
    assert violation.subject == ("node" if limit == "max_total_streams" else "account:acme")
    return limit


async def refused(node: RunningNode, job_id: str, key: str | None = None) -> grpc.aio.AioRpcError:
    call = node.stub.WatchJob(
        jobs_pb2.WatchJobRequest(id=job_id), metadata=md(key) if key else None
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(call.read(), 10)
    return info.value


async def test_an_account_over_its_stream_cap_is_refused_naming_the_limit(tmp_path: Path) -> None:
    async with in_process_node(
        tmp_path / "node", accounts_file=accounts(tmp_path), max_concurrent_streams=3
    ) as node:
        store = node.node.store()
        acme_job = put_job(store, "acme", 1, 10, state="scraping")  # streams stay open
        beta_job = put_job(store, "beta", 1, 10, state="scraping")
        acme = [await open_stream(node, acme_job, ACME_KEY) for _ in range(2)]

        err = await refused(node, acme_job, ACME_KEY)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_concurrent_streams" in (err.details() or "")
        assert "acme" in (err.details() or "")
        assert limit_of(err) == "max_concurrent_streams"
        assert (
            sample(node, "pagesift_limit_rejections_total", {"limit": "max_concurrent_streams"})
            == 1
        )

        # another account is not affected; its cap is the server default (3)
        beta = [await open_stream(node, beta_job, BETA_KEY) for _ in range(3)]
        err = await refused(node, beta_job, BETA_KEY)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "beta" in (err.details() or "")
        assert sample(node, "pagesift_watch_streams") == 5

        # a cancelled stream gives its slot back
        acme.pop().cancel()
        await until(lambda: sample(node, "pagesift_watch_streams") == 4, "the slot to free")
        acme.append(await open_stream(node, acme_job, ACME_KEY))
        for call in acme + beta:
            call.cancel()
        await until(lambda: sample(node, "pagesift_watch_streams") == 0, "every slot to free")


async def test_streams_that_end_or_fail_give_their_slot_back(tmp_path: Path) -> None:
    async with in_process_node(tmp_path / "node", max_concurrent_streams=1) as node:
        done = put_job(node.node.store(), "anonymous", 3, 10, state="completed")
        for _ in range(3):  # each ends normally; the next one finds its slot free
            events = [ev async for ev in node.stub.WatchJob(jobs_pb2.WatchJobRequest(id=done))]
            assert [e.document.index for e in events if e.HasField("document")] == [0, 1, 2]
        for _ in range(3):  # refused by validation: no slot taken
            err = await refused(node, str(uuid.uuid4()))
            assert err.code() == grpc.StatusCode.NOT_FOUND
        assert sample(node, "pagesift_watch_streams") == 0
        stream = await open_stream(node, done)
        stream.cancel()


async def test_the_node_wide_stream_cap_holds_across_accounts(tmp_path: Path) -> None:
    async with in_process_node(
        tmp_path / "node", accounts_file=accounts(tmp_path), max_total_streams=2
    ) as node:
        store = node.node.store()
        acme_job = put_job(store, "acme", 1, 10, state="scraping")
        beta_job = put_job(store, "beta", 1, 10, state="scraping")
        calls = [await open_stream(node, acme_job, ACME_KEY)]
        calls.append(await open_stream(node, beta_job, BETA_KEY))
        err = await refused(node, beta_job, BETA_KEY)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert limit_of(err) == "max_total_streams"
        assert sample(node, "pagesift_limit_rejections_total", {"limit": "max_total_streams"}) == 1
        calls.pop(0).cancel()
        await until(lambda: sample(node, "pagesift_watch_streams") == 1, "the slot to free")
        calls.append(await open_stream(node, beta_job, BETA_KEY))
        for call in calls:
            call.cancel()


async def test_a_slow_reader_makes_the_server_read_only_a_window_ahead(tmp_path: Path) -> None:
    """The client keeps a fixed 64 KB receive window (no BDP probing, which would let
    ITS OWN buffers take megabytes): the server then reads about that window plus one
    batch of the 6.4 MB job, and holds at most one batch itself."""
    docs = 400  # ~16 KB each: 6.4 MB in all, far beyond the flow-control window
    async with in_process_node(tmp_path / "node") as node:
        job = put_job(node.node.store(), "anonymous", docs, 8 * 1024, state="completed")
        async with grpc.aio.insecure_channel(
            node.address, options=[("grpc.http2.bdp_probe", 0)]
        ) as channel:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            call = stub.WatchJob(jobs_pb2.WatchJobRequest(id=job))
            first = await asyncio.wait_for(call.read(), 10)  # then nothing for a while
            assert isinstance(first, jobs_pb2.WatchJobResponse)
            assert first.document.index == 0

            def read() -> float:
                return sample(node, "pagesift_watch_documents_read_total")

            # wait until the server stops reading: the count is unchanged for 40 polls
            last, still = -1.0, 0
            for _ in range(2000):
                now = read()
                still = still + 1 if now == last else 0
                last = now
                if still >= 40:
                    break
                await asyncio.sleep(0.025)
            assert still >= 40, "the server kept reading"
            assert 1 <= last <= 32, f"the server read {last:.0f} of {docs} documents ahead"
            assert sample(node, "pagesift_watch_documents_buffered") <= WINDOW_DOCS

            # once the client reads, every document arrives, in order, exactly once
            got = [0]
            for _ in range(docs + 10):
                ev = await asyncio.wait_for(call.read(), 10)
                if not isinstance(ev, jobs_pb2.WatchJobResponse):  # end of the stream
                    break
                if ev.HasField("document"):
                    got.append(ev.document.index)
            assert got == list(range(docs))
            assert read() == docs
            assert sample(node, "pagesift_watch_documents_buffered") == 0


async def test_a_client_that_buffers_freely_still_costs_the_server_one_window(
    tmp_path: Path,
) -> None:
    """With default channel options the client's window grows (BDP), so the server
    hands it most of the job, but never holds more than one batch itself."""
    async with in_process_node(tmp_path / "node") as node:
        job = put_job(node.node.store(), "anonymous", 200, 8 * 1024, state="completed")
        calls = [await open_stream(node, job) for _ in range(4)]
        await until(
            lambda: sample(node, "pagesift_watch_streams") == 4, "the streams to be counted"
        )
        assert sample(node, "pagesift_watch_documents_buffered") <= 4 * WINDOW_DOCS
        for call in calls:
            call.cancel()
        await until(lambda: sample(node, "pagesift_watch_streams") == 0, "every slot to free")
        await until(
            lambda: sample(node, "pagesift_watch_documents_buffered") == 0,
            "cancelled streams to drop their windows",
        )


async def test_a_batch_stores_its_valid_urls_and_every_other_field(tmp_path: Path) -> None:
    """The stored request (what resume re-reads) is the request minus its invalid URLs."""
    req = jobs_pb2.StartBatchScrapeRequest(
        urls=["http://127.0.0.1:9/a", "not a url", "http://127.0.0.1:9/b", "ftp://x/"],
        options=jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_HTML]),
        max_concurrency=2,
        idempotency_key="k-1",
        ignore_invalid_urls=True,
    )
    async with in_process_node(tmp_path / "node") as node:
        for request in (req, jobs_pb2.StartBatchScrapeRequest(urls=req.urls[:1])):
            resp = await node.stub.StartBatchScrape(request)
            raw = node.node.store().get(records.JobKeys(resp.id).request)
            assert raw is not None
            want = jobs_pb2.StartBatchScrapeRequest()
            want.CopyFrom(request)
            del want.urls[:]
            want.urls.extend(u for u in request.urls if u not in resp.invalid_urls)
            assert jobs_pb2.StartBatchScrapeRequest.FromString(raw) == want
            await node.stub.CancelJob(jobs_pb2.CancelJobRequest(id=resp.id))
