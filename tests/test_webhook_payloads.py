"""Webhook payloads: a job's own delivery headers, its metadata echoed in every event,
and page events carrying the document (capped; over the cap the event says so and the
document is fetched by index) -- on real crawls of a loopback site, delivered to a real
receiver, signatures verified as docs/webhooks.md shows."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web

from pagesift.core.jobs import records
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.demo.site import Site
from pagesift.primary.webhooks import delivery, outbox
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import (
    ALICE,
    Hit,
    Receiver,
    SiteSpec,
    crawl,
    documents,
    in_process_node,
    until,
    wait_done,
    write_accounts,
)

HEADERS = {"X-Receiver-Token": "tok-0123456789", "X-Tenant": "acme"}
METADATA = {"customer": "acme", "run": "7", "note": "día 1"}


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=12, slow_seconds=0.2, big_bytes=4096)


def readme_verify(secret: str, ts: str, body: bytes, header: str, tolerance: int = 300) -> bool:
    """docs/webhooks.md's verification, verbatim (tests/test_docs.py runs the doc's own)."""
    if not ts.isdigit() or abs(time.time() - int(ts)) > tolerance:
        return False
    want = "v1=" + hmac.new(secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(p.strip(), want) for p in header.split(","))


class HeaderReceiver(Receiver):
    """The test receiver, also keeping each delivery's request headers (by body)."""

    def __init__(self, secret: str) -> None:
        super().__init__(secret)
        self.headers_by_body: dict[bytes, dict[str, str]] = {}

    async def _handle(self, request: web.Request) -> web.Response:
        self.headers_by_body[await request.read()] = dict(request.headers)  # read is cached
        return await super()._handle(request)

    def headers_of(self, hit: Hit) -> dict[str, str]:
        return self.headers_by_body[hit.body]


def body_of(hit: Hit) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(hit.body)
    return doc


async def delivered(node: Any, job_id: str) -> None:
    await until(lambda: outbox.pending(node.node.store(), job_id) == 0, "the outbox drains", 20)


async def test_every_delivery_carries_the_job_headers_and_metadata_and_page_events_the_document(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    root = site[1]
    receiver = HeaderReceiver(ALICE.secret)
    url = await receiver.start()
    accounts = write_accounts(tmp_path / "accounts.toml")
    try:
        async with in_process_node(
            tmp_path / "n", accounts_file=str(accounts), extract_processes=0
        ) as node:
            md = ALICE.md
            hook = jobs_pb2.Webhook(
                url=url, headers=HEADERS, metadata=METADATA, include_document=True
            )
            job = await node.stub.StartCrawl(crawl(root, limit=5, webhook=hook), metadata=md)
            plain = await node.stub.StartCrawl(  # no headers, metadata or documents
                crawl(root, limit=3, webhook=jobs_pb2.Webhook(url=url)), metadata=md
            )
            final = await wait_done(node.stub, job.id, md)
            await wait_done(node.stub, plain.id, md)
            await delivered(node, job.id)
            await delivered(node, plain.id)
            docs = await documents(node.stub, job.id, md)
        hits = receiver.of(job.id)
        assert len(hits) == 2 + final.completed + final.failed  # started, pages, completed
        for x in hits:
            sent = receiver.headers_of(x)
            for name, value in HEADERS.items():
                assert sent[name] == value, (x.event, name)
            assert sent["Content-Type"] == "application/json"  # the scheme's, not replaced
            assert body_of(x)["metadata"] == METADATA
            assert x.signed and x.headers_ok
            assert readme_verify(ALICE.secret, x.timestamp, x.body, x.signature)
        pages = [x for x in hits if x.event == "page"]
        assert [x.data["index"] for x in pages] == list(range(len(docs)))
        assert len(pages) >= 1
        for x in pages:
            doc = docs[x.data["index"]]
            assert doc.markdown
            assert x.data["document"] == outbox.document_json(doc)
            assert x.data["document"]["final_url"] == doc.final_url  # proto field names
            assert "document_omitted" not in x.data
        assert all("document" not in x.data for x in hits if x.event != "page")

        others = receiver.of(plain.id)
        assert len(others) >= 3 and others[0].event == "started"
        for x in others:
            assert "metadata" not in body_of(x)
            assert "document" not in x.data and "document_omitted" not in x.data
            assert "X-Receiver-Token" not in receiver.headers_of(x)
            assert readme_verify(ALICE.secret, x.timestamp, x.body, x.signature)
    finally:
        await receiver.stop()


async def test_a_document_over_the_cap_is_omitted_with_its_size_and_fetched_by_index(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    root = site[1]
    receiver = HeaderReceiver(ALICE.secret)
    url = await receiver.start()
    accounts = write_accounts(tmp_path / "accounts.toml")
    try:
        async with in_process_node(
            tmp_path / "n",
            accounts_file=str(accounts),
            extract_processes=0,
            webhook_max_document_bytes=64,
        ) as node:
            md = ALICE.md
            hook = jobs_pb2.Webhook(url=url, metadata=METADATA, include_document=True)
            job = await node.stub.StartCrawl(crawl(root, limit=3, webhook=hook), metadata=md)
            await wait_done(node.stub, job.id, md)
            await delivered(node, job.id)
            pages = [x for x in receiver.of(job.id) if x.event == "page"]
            assert pages
            for x in pages:
                assert "document" not in x.data
                assert x.data["document_omitted"] == "too_large"
                got = await node.stub.GetJob(
                    jobs_pb2.GetJobRequest(id=job.id, skip=x.data["index"], limit=1), metadata=md
                )
                (doc,) = got.documents
                assert doc.url == x.data["url"]
                size = len(json.dumps(outbox.document_json(doc), separators=(",", ":")))
                assert x.data["document_bytes"] == size > 64
                assert x.signed
                assert readme_verify(ALICE.secret, x.timestamp, x.body, x.signature)
    finally:
        await receiver.stop()


REFUSED: list[tuple[jobs_pb2.Webhook, str]] = [
    (jobs_pb2.Webhook(headers={"Content-Type": "text/plain"}), "webhook.headers['Content-Type']"),
    (jobs_pb2.Webhook(headers={"pagesift-signature": "v1=0"}), "webhook.headers['pagesift-"),
    (jobs_pb2.Webhook(headers={"Pagesift-Timestamp": "1"}), "webhook.headers['Pagesift-Timestamp"),
    (jobs_pb2.Webhook(headers={"PageSift-Event": "page"}), "webhook.headers['PageSift-Event']"),
    (jobs_pb2.Webhook(headers={"Host": "evil.example"}), "webhook.headers['Host']"),
    (jobs_pb2.Webhook(headers={"Transfer-Encoding": "chunked"}), "webhook.headers['Transfer-"),
    (jobs_pb2.Webhook(headers={"Cookie": "a=b"}), "webhook.headers['Cookie']"),
    (jobs_pb2.Webhook(headers={"X Bad": "v"}), "webhook.headers['X Bad']"),
    (jobs_pb2.Webhook(headers={"X-Split": "a\r\nX-Evil: 1"}), "webhook.headers['X-Split']"),
    (jobs_pb2.Webhook(headers={f"X-{i}": "v" for i in range(51)}), "webhook.headers:"),
    (jobs_pb2.Webhook(metadata={f"k{i}": "v" for i in range(51)}), "webhook.metadata:"),
    (jobs_pb2.Webhook(metadata={"": "v"}), "webhook.metadata['']"),
    (jobs_pb2.Webhook(metadata={"k\n": "v"}), "webhook.metadata['k\\n']"),
    (jobs_pb2.Webhook(metadata={"k" * 129: "v"}), "webhook.metadata['kkkk"),
    (jobs_pb2.Webhook(metadata={"big": "v" * 2049}), "webhook.metadata['big']"),
    (jobs_pb2.Webhook(metadata={f"k{i}": "v" * 2000 for i in range(9)}), "webhook.metadata:"),
]


async def test_bad_webhook_headers_or_metadata_are_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with in_process_node(
        tmp_path / "n", accounts_file=str(accounts), extract_processes=0
    ) as node:
        stub: jobs_pb2_grpc.JobServiceAsyncStub = node.stub
        target = "http://127.0.0.1:9/hook"
        for hook, field in REFUSED:
            hook.url = target
            for request in (
                crawl("http://127.0.0.1:9/", webhook=hook),
                jobs_pb2.StartBatchScrapeRequest(urls=["http://127.0.0.1:9/a"], webhook=hook),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    if isinstance(request, jobs_pb2.StartCrawlRequest):
                        await stub.StartCrawl(request, metadata=ALICE.md)
                    else:
                        await stub.StartBatchScrape(request, metadata=ALICE.md)
                err = info.value
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, field
                assert (err.details() or "").startswith(field), (field, err.details())
        # a payload without a URL to send it to
        bare = jobs_pb2.Webhook(metadata={"k": "v"})
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.StartCrawl(crawl("http://127.0.0.1:9/", webhook=bare), metadata=ALICE.md)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith("webhook.url")
        listing = await stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=ALICE.md)
        assert not listing.jobs, "a refused request left a job behind"


# ---------------------------------------------------------------- resumed delivery


async def test_a_resumed_delivery_sends_the_same_body_and_the_store_keeps_one_copy(
    store: Store,
) -> None:
    """The body is built from stored data only (the outbox item, the job's webhook
    config, the page): a new Deliverer (a restart) sends the very same bytes, each
    POST signed afresh; the outbox item never holds the document."""
    down = {"on": True}

    async def respond(hit: Hit) -> int:
        return 503 if down["on"] else 200

    receiver = Receiver(ALICE.secret, respond)
    url = await receiver.start()
    job_id = "job-1"
    page = jobs_pb2.Document(
        url="http://s/a", final_url="http://s/a", title="A", markdown="# A\n" + "text " * 200
    )
    meta = records.JobMeta(
        id=job_id, kind="crawl", state="scraping", owner="alice", created_ms=0, expires_ms=2**62
    )

    def register(g: WriteGroup) -> None:
        g.put(records.JobKeys(job_id).meta, meta.encode())
        g.insert(records.JOBS_SET, job_id.encode())
        outbox.configure(
            g, job_id, url, ("page",), "alice",
            headers=HEADERS, metadata=METADATA, include_document=True, max_document_bytes=1 << 20,
        )  # fmt: skip

    def record(g: WriteGroup) -> None:
        index = g.push(records.JobKeys(job_id).pages, page.SerializeToString())
        outbox.enqueue(g, job_id, "page", {"index": index, "url": page.url})

    store.write(register)
    store.write(record)
    (item,) = store.list_range(records.JobKeys(job_id).outbox)
    assert b"text text" not in item  # the event names the page; it holds no copy of it

    def deliverer() -> delivery.Deliverer:
        return delivery.Deliverer(
            lambda: store,
            None,
            secret_for=lambda account: ALICE.secret if account == "alice" else None,
            allow_private_networks=True,
            max_attempts=1000,
            base_delay=0.01,
            max_delay=0.02,
            poll_interval=0,
        )

    first = deliverer()
    try:
        await first.start()
        await until(lambda: len(receiver.hits) >= 2, "two refused attempts")
    finally:
        await first.close()
    down["on"] = False
    await asyncio.sleep(1.1)  # a later second: a fresh timestamp and signature
    second = deliverer()
    try:
        await second.start()
        await until(lambda: receiver.acked(job_id) == [0], "the event acknowledged")
    finally:
        await second.close()
        await receiver.stop()
    hits = receiver.of(job_id)
    assert len({x.body for x in hits}) == 1, "a resumed delivery sent another body"
    assert len({x.timestamp for x in hits}) >= 2
    for x in hits:
        assert x.signed and readme_verify(ALICE.secret, x.timestamp, x.body, x.signature)
    assert hits[-1].data["document"] == outbox.document_json(page)
    assert body_of(hits[-1])["metadata"] == METADATA
    assert store.list_len(records.JobKeys(job_id).outbox) == 0  # delivered: dropped
    assert store.list_len(records.JobKeys(job_id).pages) == 1
