"""Firecrawl-shaped webhooks: Firecrawl's ``webhook`` option through the gateway, delivered
from pagesift's durable outbox in Firecrawl's body, signed with X-Firecrawl-Signature.

The pure parts by tables (the body of each event, the headers, the config, the gateway's
mapping of the option); then Firecrawl's own SDK (firecrawl-py) starts jobs with
``webhook=`` through a real gateway in front of a real node, and a real aiohttp receiver
on 127.0.0.1 checks every delivery's shape and its HMAC over the raw body (firecrawl-py
has no signature helper, so the test computes the HMAC itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pydantic
import pytest
from aiohttp import web
from firecrawl import Firecrawl
from firecrawl.v2.types import WebhookConfig as SdkWebhook
from firecrawl.v2.utils.error_handler import BadRequestError

from pagesift.core.jobs import records
from pagesift.core.jobs.firecrawlshape import document
from pagesift.core.store.db import Store
from pagesift.demo.site import CALENDAR_EXCLUDE, Site
from pagesift.gateway import translate
from pagesift.gateway.models import BatchScrapeRequest, CrawlRequest
from pagesift.gateway.server import run
from pagesift.primary.webhooks import firecrawl as fw
from pagesift.primary.webhooks import outbox
from pagesift.v1 import jobs_pb2
from tests.helpers import (
    ALICE,
    NOSECRET,
    RunningNode,
    SiteSpec,
    in_process_node,
    until,
    write_accounts,
)

T = TypeVar("T")
EVENT_ID = "0123456789abcdef0123456789abcdef"
HEADERS = {"X-Receiver-Token": "tok-0123456789"}
METADATA = {"customer": "acme", "run": "7"}


def hmac_sha256(secret: str, raw: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


# ---------------------------------------------------------------- pure: bodies, headers, config


def item(event: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"event_id": EVENT_ID, "event": event, "data": data or {}, "created_at": "x"}


@pytest.mark.parametrize(
    ("kind", "event", "data", "want"),
    [
        ("crawl", "started", {}, {"success": True, "type": "crawl.started"}),
        ("crawl", "completed", {"note": ""}, {"success": True, "type": "crawl.completed"}),
        ("crawl", "failed", {"note": "boom"},
         {"success": False, "type": "crawl.failed", "error": "boom"}),
        ("crawl", "cancelled", {"note": "cancelled by the caller"},
         {"success": False, "type": "crawl.failed", "error": "cancelled: cancelled by the caller"}),
        ("batch", "started", {}, {"success": True, "type": "batch_scrape.started"}),
        ("batch", "completed", {}, {"success": True, "type": "batch_scrape.completed"}),
        ("batch", "failed", {}, {"success": False, "type": "batch_scrape.failed",
                                "error": "failed"}),
        ("batch", "cancelled", {}, {"success": False, "type": "batch_scrape.failed",
                                   "error": "cancelled"}),
    ],
)  # fmt: skip
def test_each_event_has_firecrawls_type_success_and_error_by_the_jobs_kind(
    kind: str, event: str, data: dict[str, Any], want: dict[str, Any]
) -> None:
    body = json.loads(fw.body("job-1", kind, item(event, data), METADATA))
    expect = {
        **want,
        "id": "job-1",
        "webhookId": str(uuid.UUID(hex=EVENT_ID)),
        "data": [],
        "metadata": METADATA,
    }
    assert body == expect
    assert list(body) == [k for k in ("success", "type", "id", "webhookId", "data", "error",
                                      "metadata") if k in body]  # fmt: skip


def a_page() -> jobs_pb2.Document:
    return jobs_pb2.Document(
        url="https://x.example/a", final_url="https://x.example/a", status_code=200,
        title="A", markdown="# A\n" + "word " * 200, content_type="text/html",
    )  # fmt: skip


def test_a_page_event_carries_the_document_in_firecrawls_shape_and_only_metadata_past_the_cap() -> (
    None
):
    doc = a_page()
    raw = doc.SerializeToString()
    body = json.loads(fw.body("j", "batch", item("page", {"index": 4}), {}, raw, 1 << 20))
    assert body["type"] == "batch_scrape.page" and body["success"] is True
    assert body["data"] == [document(doc)] and body["metadata"] == {}
    small = json.loads(fw.body("j", "crawl", item("page", {"index": 4}), {}, raw, 100))
    [only] = small["data"]
    assert "markdown" not in only
    assert only["metadata"]["sourceURL"] == doc.url
    assert only["metadata"]["documentOmitted"] == "too_large"
    assert only["metadata"]["documentBytes"] > 100 and only["metadata"]["pageIndex"] == 4


def test_firecrawl_headers_sign_the_raw_body_and_keep_the_jobs_own() -> None:
    cfg = outbox.WebhookConfig(
        "http://h", ("started",), "alice", tuple(HEADERS.items()), format=outbox.FIRECRAWL,
        kind="crawl",
    )  # fmt: skip
    raw = fw.body("j", "crawl", item("started"), {})
    headers = outbox.delivery_headers(cfg, "j", 0, "started", raw, "s3cret", "1767225600")
    assert headers == {
        **HEADERS,
        "content-type": "application/json",
        "X-Firecrawl-Signature": hmac_sha256("s3cret", raw),
    }
    assert fw.verify_signature("s3cret", raw, headers["X-Firecrawl-Signature"])
    assert not fw.verify_signature("other", raw, headers["X-Firecrawl-Signature"])
    assert not fw.verify_signature("s3cret", raw + b" ", headers["X-Firecrawl-Signature"])


def test_the_docs_verification_accepts_what_the_server_signs() -> None:
    """docs/webhooks.md's Firecrawl receiver code, run as written, against ``fw.sign``."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "webhooks.md").read_text()
    start = text.index("def firecrawl_signature_ok")
    start = text.rindex("```python\n", 0, start) + len("```python\n")
    code = text[start : text.index("```", start)]
    space: dict[str, Any] = {}
    exec(compile(code, "docs/webhooks.md", "exec"), space)
    ok = space["firecrawl_signature_ok"]
    raw = fw.body("j", "crawl", item("started"), {})
    assert ok("s3cret", raw, fw.sign("s3cret", raw)) is True
    assert ok("s3cret", raw + b" ", fw.sign("s3cret", raw)) is False
    assert ok("another", raw, fw.sign("s3cret", raw)) is False


def test_a_firecrawl_config_keeps_firecrawls_events_and_documents_and_pagesifts_is_unchanged(
    store: Store,
) -> None:
    def configure(fmt: str, events: tuple[str, ...] = ()) -> outbox.WebhookConfig:
        store.write(
            lambda g: outbox.configure(g, "j", "http://h", events, "alice", format=fmt,
                                       kind="crawl", max_document_bytes=999)
        )  # fmt: skip
        cfg = outbox.load_config(store, "j")
        assert cfg is not None
        return cfg

    cfg = configure(outbox.FIRECRAWL)
    assert cfg.events == ("started", "page", "completed", "failed", "cancelled")
    assert cfg.include_document and cfg.max_document_bytes == 999
    assert (cfg.format, cfg.kind) == (outbox.FIRECRAWL, "crawl")
    plain = configure(outbox.PAGESIFT)
    assert plain.events == records.WEBHOOK_EVENTS and not plain.include_document
    # a pagesift config names no format: its bytes are those of a config without one
    assert store.get(records.JobKeys("j").webhook) == (
        b'{"url":"http://h","events":["started","page","page_failed","completed","failed",'
        b'"cancelled"],"account":"alice"}'
    )


@pytest.mark.parametrize(
    ("option", "events"),
    [
        ("https://h.example/x", ["STARTED", "PAGE", "COMPLETED", "FAILED", "CANCELLED"]),
        ({"url": "https://h.example/x", "events": ["page"]}, ["PAGE"]),
        ({"url": "https://h.example/x", "events": ["failed", "started"]},
         ["FAILED", "CANCELLED", "STARTED"]),
        ({"url": "https://h.example/x", "events": []},
         ["STARTED", "PAGE", "COMPLETED", "FAILED", "CANCELLED"]),
    ],
)  # fmt: skip
def test_the_webhook_option_maps_onto_a_firecrawl_shaped_webhook(
    option: Any, events: list[str]
) -> None:
    crawl = translate.crawl_request(
        CrawlRequest.model_validate({"url": "https://x", "webhook": option})
    )
    batch = translate.batch_request(
        BatchScrapeRequest.model_validate({"urls": ["https://x"], "webhook": option})
    )
    for hook in (crawl.webhook, batch.webhook):
        assert hook.url == "https://h.example/x"
        assert hook.format == jobs_pb2.WEBHOOK_FORMAT_FIRECRAWL
        assert [
            jobs_pb2.WebhookEvent.Name(e)[len("WEBHOOK_EVENT_") :] for e in hook.event_types
        ] == events
    full = CrawlRequest.model_validate(
        {"url": "u", "webhook": {"url": "https://h", "headers": HEADERS, "metadata": METADATA}}
    )
    assert full.webhook is not None
    hook = translate.webhook(full.webhook)
    assert dict(hook.headers) == HEADERS and dict(hook.metadata) == METADATA
    assert not translate.crawl_request(CrawlRequest.model_validate({"url": "u"})).HasField(
        "webhook"
    )


def test_the_json_schema_of_the_option_says_a_url_or_the_object() -> None:
    for model in (CrawlRequest, BatchScrapeRequest):
        schema = model.model_json_schema(by_alias=True)
        kinds = schema["properties"]["webhook"]["anyOf"]
        assert kinds[0]["type"] == "string" and kinds[1] == {"$ref": "#/$defs/WebhookOptions"}
        options = schema["$defs"]["WebhookOptions"]
        assert options["additionalProperties"] is False
        assert set(options["properties"]) == {"url", "headers", "metadata", "events"}


@pytest.mark.parametrize(
    ("option", "path"),
    [
        ({"url": "https://h", "secret": "x"}, ("webhook", "secret")),
        ({"url": "https://h", "events": ["page_failed"]}, ("webhook", "events", 0)),
        ({"headers": {}}, ("webhook", "url")),
        (7, ("webhook",)),
    ],
)
def test_a_bad_webhook_option_is_a_validation_error_naming_it(
    option: Any, path: tuple[Any, ...]
) -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        CrawlRequest.model_validate({"url": "https://x", "webhook": option})
    assert err.value.errors()[0]["loc"] == path


# ---------------------------------------------------------------- end to end


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=8, slow_seconds=0.1, big_bytes=16 * 1024)


@dataclass
class Delivery:
    body: dict[str, Any]
    raw: bytes
    headers: dict[str, str]


class FirecrawlReceiver:
    """A webhook endpoint on 127.0.0.1 recording every POST (raw body and headers)."""

    def __init__(self, status: Callable[[Delivery], int] = lambda d: 200) -> None:
        self.status = status  # the answer to each delivery
        self.got: list[Delivery] = []
        self.runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        d = Delivery(json.loads(raw), raw, dict(request.headers))
        self.got.append(d)
        return web.Response(status=self.status(d))

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}/hook"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def of(self, job_id: str) -> list[Delivery]:
        return [d for d in self.got if d.body["id"] == job_id]

    async def until_type(self, job_id: str, suffix: str) -> list[Delivery]:
        await until(
            lambda: any(d.body["type"].endswith(suffix) for d in self.of(job_id)),
            f"a {suffix} delivery of {job_id}",
            30,
        )
        return self.of(job_id)


@contextlib.asynccontextmanager
async def stack(
    tmp: Path, receiver: FirecrawlReceiver | None = None, **node_kw: Any
) -> AsyncIterator[tuple[RunningNode, str, FirecrawlReceiver, str]]:
    """A node with accounts, a gateway in front of it and a receiver: (node, gateway
    base URL, receiver, hook URL)."""
    receiver = receiver or FirecrawlReceiver()
    hook = await receiver.start()
    accounts = write_accounts(tmp / "accounts.toml")
    try:
        async with in_process_node(
            tmp / "n", accounts_file=str(accounts), extract_processes=0, **node_kw
        ) as node:
            stop = asyncio.Event()
            started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(run("127.0.0.1:0", [node.address], stop, started))
            try:
                base = f"http://{await asyncio.wait_for(started, 10)}"
                yield node, base, receiver, hook
            finally:
                stop.set()
                await asyncio.wait_for(task, 15)
    finally:
        await receiver.stop()


async def sdk(call: Callable[..., T], *args: Any, **kw: Any) -> T:
    """One blocking SDK call off the loop, bounded."""
    return await asyncio.wait_for(asyncio.to_thread(call, *args, **kw), 60)


def check_signed(deliveries: list[Delivery], secret: str = ALICE.secret) -> None:
    for d in deliveries:
        assert d.headers["X-Firecrawl-Signature"] == hmac_sha256(secret, d.raw), d.body["type"]
        assert d.headers["Content-Type"] == "application/json"
        assert not [h for h in d.headers if h.lower().startswith("pagesift-")]


async def status_documents(base: str, route: str, job_id: str) -> list[dict[str, Any]]:
    """The job's documents as the gateway answers them (raw JSON, one page)."""
    headers = {"Authorization": f"Bearer {ALICE.key}"}
    url = f"{base}/v2/{route}/{job_id}?limit=100"
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        assert r.status == 200
        out: list[dict[str, Any]] = (await r.json())["data"]
        return out


async def test_a_crawl_started_with_the_sdks_webhook_delivers_started_pages_completed_signed(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with stack(tmp_path) as (_node, base, receiver, hook):
        fc = Firecrawl(api_key=ALICE.key, api_url=base)
        options = SdkWebhook(url=hook, headers=HEADERS, metadata=METADATA)
        job = await sdk(fc.start_crawl, root, limit=5, exclude_paths=[CALENDAR_EXCLUDE],
                        webhook=options)  # fmt: skip
        got = await receiver.until_type(job.id, ".completed")
        docs = await status_documents(base, "crawl", job.id)
    check_signed(got)
    types = [d.body["type"] for d in got]
    assert types == ["crawl.started"] + ["crawl.page"] * len(docs) + ["crawl.completed"]
    assert len(docs) >= 3
    for d in got:
        assert d.body["id"] == job.id and d.body["metadata"] == METADATA
        assert d.headers["X-Receiver-Token"] == HEADERS["X-Receiver-Token"]
        assert d.body["success"] is True and "error" not in d.body
        uuid.UUID(d.body["webhookId"])
    assert len({d.body["webhookId"] for d in got}) == len(got)
    pages = [d.body["data"] for d in got[1:-1]]
    assert all(len(p) == 1 for p in pages)
    by_url = {p[0]["metadata"]["sourceURL"]: p[0] for p in pages}
    # each page event carries the document exactly as the gateway's status answers it
    assert by_url == {doc["metadata"]["sourceURL"]: doc for doc in docs}
    assert all(p[0]["markdown"] for p in pages)
    assert got[0].body["data"] == [] and got[-1].body["data"] == []


async def test_a_refused_delivery_is_retried_with_the_same_bytes_and_the_next_waits_for_it(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    seen: set[str] = set()

    def first_refused(d: Delivery) -> int:
        webhook_id = str(d.body["webhookId"])
        if webhook_id in seen:
            return 200
        seen.add(webhook_id)
        return 503

    receiver = FirecrawlReceiver(first_refused)
    async with stack(tmp_path, receiver, webhook_base_delay=0.05, webhook_max_delay=0.1) as (
        _node,
        base,
        _receiver,
        hook,
    ):
        fc = Firecrawl(api_key=ALICE.key, api_url=base)
        job = await sdk(fc.start_batch_scrape, [root, root + "about.html"], webhook=hook)
        got = await receiver.until_type(job.id, ".completed")
        await until(lambda: len(receiver.of(job.id)) == 8, "the completed event's retry", 10)
        got = receiver.of(job.id)
    check_signed(got)
    # each event twice in a row (refused, then accepted), byte for byte the same
    assert [g.raw for g in got[0::2]] == [g.raw for g in got[1::2]]
    assert [g.headers["X-Firecrawl-Signature"] for g in got[0::2]] == [
        g.headers["X-Firecrawl-Signature"] for g in got[1::2]
    ]
    assert [g.body["type"] for g in got[0::2]] == (
        ["batch_scrape.started"] + ["batch_scrape.page"] * 2 + ["batch_scrape.completed"]
    )


async def test_the_events_filter_and_a_bare_url_on_batch_scrapes(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    urls = [root + "about.html", root]
    async with stack(tmp_path) as (_node, base, receiver, hook):
        fc = Firecrawl(api_key=ALICE.key, api_url=base)
        only_done = await sdk(
            fc.start_batch_scrape, urls, webhook=SdkWebhook(url=hook, events=["completed"])
        )
        pages = await sdk(
            fc.start_batch_scrape, urls, webhook=SdkWebhook(url=hook, events=["page"])
        )
        bare = await sdk(fc.start_batch_scrape, urls, webhook=hook)
        done = await receiver.until_type(only_done.id, ".completed")
        every = await receiver.until_type(bare.id, ".completed")
        await until(lambda: len(receiver.of(pages.id)) == 2, "both page events", 30)
        await asyncio.sleep(0.3)  # a stray event would have arrived by now
    assert [d.body["type"] for d in done] == ["batch_scrape.completed"]
    assert [d.body["type"] for d in receiver.of(pages.id)] == ["batch_scrape.page"] * 2
    assert [d.body["type"] for d in every] == (
        ["batch_scrape.started"] + ["batch_scrape.page"] * 2 + ["batch_scrape.completed"]
    )
    assert all(d.body["metadata"] == {} for d in every)
    check_signed(receiver.got)


async def test_a_cancelled_crawl_is_firecrawls_failed_event_with_its_error(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with stack(tmp_path) as (_node, base, receiver, hook):
        fc = Firecrawl(api_key=ALICE.key, api_url=base)
        options = SdkWebhook(url=hook, events=["started", "failed"])
        job = await sdk(fc.start_crawl, root, limit=5000, delay=1, max_concurrency=1,
                        webhook=options)  # fmt: skip
        assert await sdk(fc.cancel_crawl, job.id) is True
        got = await receiver.until_type(job.id, ".failed")
    check_signed(got)
    assert [d.body["type"] for d in got] == ["crawl.started", "crawl.failed"]
    failed = got[-1].body
    assert failed["success"] is False and failed["data"] == []
    assert failed["error"].startswith("cancelled")


async def test_webhook_refusals_are_400s_naming_the_field(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with stack(tmp_path) as (_node, base, _receiver, hook):
        nosecret = Firecrawl(api_key=NOSECRET.key, api_url=base)
        with pytest.raises(BadRequestError) as err:
            await sdk(nosecret.start_crawl, root, limit=1, webhook=hook)
        assert "webhook_secret" in str(err.value)
        alice = Firecrawl(api_key=ALICE.key, api_url=base)
        own = SdkWebhook(url=hook, headers={"X-Firecrawl-Signature": "forged"})
        with pytest.raises(BadRequestError) as err:
            await sdk(alice.start_batch_scrape, [root], webhook=own)
        assert "X-Firecrawl-Signature" in str(err.value)
        headers = {"Authorization": f"Bearer {ALICE.key}"}
        body = {"url": root, "webhook": {"url": hook, "events": ["page_failed"]}}
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{base}/v2/crawl", json=body, headers=headers) as r,
        ):
            answer = await r.json()
        assert r.status == 400 and answer["details"][0]["path"] == ["webhook", "events", 0]


async def test_a_grpc_firecrawl_webhook_may_not_ask_for_page_failed(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with stack(tmp_path) as (node, _base, _receiver, hook):
        bad = jobs_pb2.Webhook(
            url=hook, events=["page", "page_failed"], format=jobs_pb2.WEBHOOK_FORMAT_FIRECRAWL
        )
        req = jobs_pb2.StartCrawlRequest(url=root, limit=1, webhook=bad)
        with pytest.raises(Exception) as err:
            await node.stub.StartCrawl(req, metadata=ALICE.md)
        assert "webhook.events[1]" in str(err.value)
        unknown = jobs_pb2.Webhook(url=hook, format=9)  # type: ignore[arg-type]
        with pytest.raises(Exception) as err:
            await node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=root, webhook=unknown),
                                       metadata=ALICE.md)  # fmt: skip
        assert "webhook.format" in str(err.value)
