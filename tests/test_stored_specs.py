"""A job's spec as validated is what its runs use (``specs.stored``), on any node.

``specs.crawl``/``specs.batch`` return the spec the handler registers; the runtime
stores it (the request key's bytes unchanged, the limit in the meta) and every run
recovers it with ``specs.stored``, trusted: a crawl accepted under one node's
``regex_limits`` still runs, its patterns honoured, on a node restarted with
stricter ones (a run that re-checked them under the new bounds would fail it).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pagesift.core.jobs import records, specs
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.specs import Permissions
from pagesift.core.jobs.validate import InvalidArgument
from pagesift.core.store.db import Store
from pagesift.primary.engine.interface import Page
from pagesift.primary.jobs.runtime import Jobs
from pagesift.v1 import jobs_pb2
from tests.fakeengine import FakeEngine, page
from tests.helpers import eventually, node_config

CALLER = Permissions(Account("anonymous", max_crawl_limit=40), can_sign_webhooks=True)


def _site(url: str) -> Page:
    path = urlsplit(url).path
    if path in ("", "/"):
        return page(url, "/docs/a", "/guide/b", "/docs/private/x", "/blog/c")
    return page(url)


async def _finished(store: Store, job_id: str) -> records.JobMeta:
    async def ended() -> records.JobMeta | None:
        meta = records.load_meta(store, job_id)
        return meta if meta is not None and meta.terminal else None

    return await eventually(ended, "the job's end", timeout=30)


async def test_a_stored_crawl_runs_as_accepted_after_a_restart_with_stricter_regex_limits(
    tmp_path: Path, store: Store
) -> None:
    wide = node_config(tmp_path, respect_robots=False)
    strict = node_config(tmp_path, respect_robots=False, max_regexes=1, max_regex_length=8)
    request = jobs_pb2.StartCrawlRequest(
        url="http://site.test/",
        include_paths=["^/docs/.*", "^/guide/.*"],  # two, each longer than 8 characters
        exclude_paths=["^/docs/private/"],
        sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
        crawl_entire_domain=True,
    )
    spec = await specs.crawl(request, CALLER, wide)
    with pytest.raises(InvalidArgument):  # the restarted node would refuse it now
        await specs.crawl(request, CALLER, strict)

    first = FakeEngine(_site)
    before = Jobs(store, first, wide)
    await before.start()
    reg = await before.register(spec, CALLER.account.name)
    await before.close()  # its run cancelled before its first step: the job is stored
    assert first.requests == []
    meta = records.load_meta(store, reg.id)
    assert meta is not None and meta.state == "scraping" and meta.limit == 40

    engine = FakeEngine(_site)
    after = Jobs(store, engine, strict)  # the node restarted, its regex limits stricter
    try:
        await after.start()  # resumes the stored job
        meta = await _finished(store, reg.id)
    finally:
        await after.close()
    assert meta.state == "completed", meta.note
    fetched = {urlsplit(u).path for u in engine.requests}
    assert {"/docs/a", "/guide/b"} <= fetched  # its include patterns, as accepted
    assert not fetched & {"/docs/private/x", "/blog/c"}  # its exclude, and not included


async def test_the_stored_spec_is_the_registered_one_and_the_request_bytes_are_unchanged(
    tmp_path: Path, store: Store
) -> None:
    config = node_config(tmp_path, respect_robots=False)
    hook = jobs_pb2.Webhook(
        url="http://127.0.0.1:9/hook", event_types=[jobs_pb2.WEBHOOK_EVENT_COMPLETED]
    )
    crawl_req = jobs_pb2.StartCrawlRequest(
        url="http://site.test/", webhook=hook, idempotency_key="k1"
    )
    batch_req = jobs_pb2.StartBatchScrapeRequest(
        urls=["http://site.test/a", "not a url", "http://site.test/b"],
        ignore_invalid_urls=True,
        max_concurrency=3,
    )
    crawl = await specs.crawl(crawl_req, CALLER, config)
    batch = await specs.batch(batch_req, CALLER, config)
    assert batch.invalid == ["not a url"] and batch.total == 2
    assert crawl.webhook is not None and list(crawl.webhook.events) == ["completed"]

    jobs = Jobs(store, FakeEngine(_site), config)
    try:
        await jobs.start()
        crawl_id = (await jobs.register(crawl, CALLER.account.name)).id
        batch_id = (await jobs.register(batch, CALLER.account.name)).id
        await _finished(store, crawl_id)
        await _finished(store, batch_id)
    finally:
        await jobs.close()

    crawl_raw = store.get(records.JobKeys(crawl_id).request)
    assert crawl_raw == crawl_req.SerializeToString(deterministic=True)  # the wire bytes
    kept = jobs_pb2.StartBatchScrapeRequest()
    kept.CopyFrom(batch_req)
    kept.urls[:] = ["http://site.test/a", "http://site.test/b"]
    batch_raw = store.get(records.JobKeys(batch_id).request) or b""
    assert jobs_pb2.StartBatchScrapeRequest.FromString(batch_raw) == kept

    crawl_meta = records.load_meta(store, crawl_id)
    batch_meta = records.load_meta(store, batch_id)
    assert crawl_meta is not None and batch_meta is not None
    again = specs.stored(store, crawl_meta)
    assert isinstance(again, specs.CrawlSpec)
    assert again.request == crawl_req and again.limit == crawl.limit == crawl_meta.limit == 40
    assert again.webhook == crawl.webhook  # event_types merged, as registered
    stored_batch = specs.stored(store, batch_meta)
    assert isinstance(stored_batch, specs.BatchSpec)
    assert stored_batch.urls == batch.urls == ["http://site.test/a", "http://site.test/b"]
    assert stored_batch.invalid == [] and stored_batch.options == batch.options
    assert batch_meta.total == 2
