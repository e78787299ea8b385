"""Jobs end to end: a real node (gRPC + RocksDB + HTTP engine) crawling a real site."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from pagesift.client.errors import error_info_of
from pagesift.core.api import rpcerrors
from pagesift.core.jobs import records
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.demo.site import CALENDAR_EXCLUDE, Site, normalize_url
from pagesift.v1 import jobs_pb2
from tests.helpers import SiteSpec, all_documents, in_process_node, wait_terminal

PAGES = 240


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=PAGES, slow_seconds=2.0, big_bytes=2 * 1024 * 1024)


def crawl_request(root: str, **kw: object) -> jobs_pb2.StartCrawlRequest:
    req = jobs_pb2.StartCrawlRequest(
        url=root,
        exclude_paths=[CALENDAR_EXCLUDE],
        max_concurrency=16,
        **kw,  # type: ignore[arg-type]
    )
    return req


async def test_a_full_crawl_returns_every_page_once_with_the_right_error_codes(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    async with in_process_node(tmp_path) as node:
        started = await node.stub.StartCrawl(crawl_request(root))
        final = await wait_terminal(node.stub, started.id)
        assert final.state == jobs_pb2.JOB_STATE_COMPLETED
        docs = await all_documents(node.stub, started.id)
        urls = [normalize_url(d.url) for d in docs]
        assert len(urls) == len(set(urls)), "a page appears twice"
        assert set(urls) == s.expected_documents(root)
        assert final.completed == len(docs)
        for d in docs:
            if normalize_url(d.url) in s.redirect_sources(root):
                assert normalize_url(d.final_url) == s.redirect_sources(root)[normalize_url(d.url)]
            assert d.markdown, d.url
            assert d.status_code == 200
            assert d.title == s.title_of(d.url)
        errs = await node.stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=started.id))
        got = {normalize_url(e.url): e.code for e in errs.errors if e.url}
        assert got == s.expected_errors(root)
        assert {normalize_url(u) for u in errs.robots_blocked} == s.robots_disallowed_urls(root)
        assert final.failed == len(got)
        # robots.txt was obeyed: nothing under /private/ was ever fetched
        assert not [p for p in s.hits if p.startswith("/private/")]


async def test_a_crawl_stops_at_its_limit_and_depth_even_in_a_calendar_trap(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    async with in_process_node(tmp_path) as node:
        limited = await node.stub.StartCrawl(  # the trap spans years: not just /calendar/2026/
            jobs_pb2.StartCrawlRequest(
                url=root + "calendar/2026/11", limit=25, crawl_entire_domain=True
            )
        )
        final = await wait_terminal(node.stub, limited.id)
        assert final.total == 25
        assert final.completed + final.failed == 25
        deep = await node.stub.StartCrawl(
            crawl_request(root, max_depth=1, sitemap=jobs_pb2.SITEMAP_MODE_SKIP)
        )
        await wait_terminal(node.stub, deep.id)
        docs = await all_documents(node.stub, deep.id)
        assert {normalize_url(d.url) for d in docs} == s.expected_documents(
            root, sitemap="skip", max_depth=1
        )


async def test_a_batch_scrape_returns_each_url_and_reports_failures(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    good = sorted(s.expected_documents(root))[:30]
    urls = [*good, root + "missing.html", root + "files/report.pdf"]
    async with in_process_node(tmp_path) as node:
        started = await node.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=urls, max_concurrency=8)
        )
        final = await wait_terminal(node.stub, started.id)
        assert final.kind == jobs_pb2.JOB_KIND_BATCH_SCRAPE
        assert (final.total, final.completed, final.failed) == (32, 30, 2)
        docs = await all_documents(node.stub, started.id)
        assert sorted(normalize_url(d.url) for d in docs) == good
        errs = await node.stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=started.id))
        assert sorted(e.code for e in errs.errors) == ["http_status", "parse_failed"]


async def test_paging_walks_every_document_and_next_skip_is_absent_at_the_end(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with in_process_node(tmp_path) as node:
        started = await node.stub.StartCrawl(crawl_request(root, limit=30))
        final = await wait_terminal(node.stub, started.id)
        seen: list[str] = []
        skip = 0
        for _ in range(100):
            page = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id, skip=skip, limit=7))
            seen += [d.url for d in page.documents]
            if not page.HasField("next_skip"):
                break
            skip = page.next_skip
        assert len(seen) == final.completed
        assert len(seen) == len(set(seen))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id, skip=final.completed + 5))
        assert e.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "skip" in (e.value.details() or "")
        status = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id, status_only=True))
        assert not status.documents and not status.HasField("next_skip")
        assert (status.state, status.completed, status.total) == (
            final.state,
            final.completed,
            final.total,
        )


async def test_a_watcher_gets_every_document_in_order_and_resumes_without_gaps(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with in_process_node(tmp_path) as node:
        started = await node.stub.StartCrawl(crawl_request(root, limit=60))
        first: list[int] = []
        stream = node.stub.WatchJob(jobs_pb2.WatchJobRequest(id=started.id))
        async for event in stream:
            if event.HasField("document"):
                first.append(event.document.index)
                if len(first) == 10:
                    break
        stream.cancel()
        resumed: list[int] = []
        states: list[int] = []
        async for event in node.stub.WatchJob(
            jobs_pb2.WatchJobRequest(id=started.id, from_index=10)
        ):
            if event.HasField("document"):
                resumed.append(event.document.index)
            else:
                states.append(event.state.state)
        final = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id, limit=1))
        assert first + resumed == list(range(final.completed))
        assert states[-1] == jobs_pb2.JOB_STATE_COMPLETED


async def test_cancel_stops_a_job_and_keeps_its_pages(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with in_process_node(tmp_path) as node:
        started = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(url=root, delay=0.05, max_concurrency=1)
        )
        for _ in range(200):
            got = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id))
            if got.completed >= 3:
                break
            await asyncio.sleep(0.05)
        cancelled = await node.stub.CancelJob(jobs_pb2.CancelJobRequest(id=started.id))
        assert cancelled.state == jobs_pb2.JOB_STATE_CANCELLED
        before = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id))
        # A marker crawl on the same node, paced like the cancelled one: once it recorded
        # its pages, a cancelled crawl still running would have recorded some as well.
        marker = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(url=root, delay=0.05, max_concurrency=1, limit=5)
        )
        done = await wait_terminal(node.stub, marker.id)
        assert done.completed >= 3
        after = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id))
        assert after.state == jobs_pb2.JOB_STATE_CANCELLED
        assert after.completed == before.completed >= 3
        listed = await node.stub.ListJobs(jobs_pb2.ListJobsRequest(active_only=True))
        assert started.id not in [j.id for j in listed.jobs]


async def test_an_expired_job_is_gone_with_every_one_of_its_keys(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with in_process_node(tmp_path, job_ttl_seconds=1.0) as node:
        started = await node.stub.StartCrawl(
            crawl_request(root, limit=10, idempotency_key="expire-me")
        )
        await wait_terminal(node.stub, started.id)
        for _ in range(100):
            listed = await node.stub.ListJobs(jobs_pb2.ListJobsRequest())
            if not listed.jobs:
                break
            await asyncio.sleep(0.1)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        # the sweeper deletes, not just hides: no replicated key is left at all
        for _ in range(100):
            if not list(node.node.store().replicated_items()):
                break
            await asyncio.sleep(0.05)
        assert list(node.node.store().replicated_items()) == []


def test_job_keys_name_every_key_a_job_owns_and_expiry_deletes_them(tmp_path: Path) -> None:
    keys = records.JobKeys("j1")
    meta = records.JobMeta("j1", "crawl", "completed", "acme", 0, 0, idempotency_key="k")
    assert keys.meta == "job/j1" and keys.pages == "job/j1/pages"  # the on-disk names
    assert keys.webhook_ack == "job/j1/webhook_ack" and keys.outbox == "job/j1/outbox"

    def fill(g: WriteGroup) -> None:
        g.insert(records.JOBS_SET, b"j1")
        g.put(records.idem_key("acme", "k"), b"j1")
        for kind, name in keys.all():
            assert records.job_of(name) == "j1"
            if kind == "list":
                g.push(name, b"x")
            elif kind == "set":
                g.insert(name, b"x")
            else:
                g.put(name, meta.encode())

    store = Store(tmp_path / "db")
    try:
        store.write(fill)
        assert records.job_of("jobs") is None and records.job_of("idem/acme/x") is None
        store.write(lambda g: records.delete_job(g, "j1", meta))
        assert list(store.replicated_items()) == []
    finally:
        store.close()


async def test_the_same_idempotency_key_returns_the_same_job(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with in_process_node(tmp_path) as node:
        a = await node.stub.StartCrawl(crawl_request(root, limit=5, idempotency_key="k1"))
        b = await node.stub.StartCrawl(crawl_request(root, limit=5, idempotency_key="k1"))
        c = await node.stub.StartCrawl(crawl_request(root, limit=5, idempotency_key="k2"))
        assert a.id == b.id != c.id
        listed = await node.stub.ListJobs(jobs_pb2.ListJobsRequest())
        assert sorted(j.id for j in listed.jobs) == sorted({a.id, c.id})


async def test_scrape_returns_one_document_with_the_asked_formats(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    page = sorted(s.expected_documents(root))[5]
    async with in_process_node(tmp_path) as node:
        resp = await node.stub.Scrape(
            jobs_pb2.ScrapeRequest(
                url=page,
                options=jobs_pb2.ScrapeOptions(
                    formats=[jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_LINKS, jobs_pb2.FORMAT_HTML],
                    only_main_content=True,
                ),
            )
        )
        doc = resp.document
        assert doc.title == s.title_of(page)
        assert doc.markdown and doc.html and doc.links
        assert not doc.raw_html
        assert doc.language
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.Scrape(jobs_pb2.ScrapeRequest(url=root + "missing.html"))
        # the page said 404: NOT_FOUND (never FAILED_PRECONDITION, which means "send it
        # to the primary"), reason PAGE_FETCH_FAILED with the page's code and HTTP status
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "http_status" in (e.value.details() or "")
        info = error_info_of(e.value)
        assert info.reason == rpcerrors.Reason.PAGE_FETCH_FAILED
        assert (info.metadata["code"], info.metadata["http_status"]) == ("http_status", "404")


class _GroupRecorder:
    """A store observer that keeps the op kinds and names of every committed group."""

    def __init__(self) -> None:
        self.groups: list[list[tuple[str, str]]] = []

    def stage(self, group: WriteGroup) -> None:
        pass

    def committed(self, group: WriteGroup) -> None:
        ops: list[tuple[str, str]] = []
        for op in group.ops:
            kind: str = op.WhichOneof("op") or ""
            msg = getattr(op, kind)
            ops.append((kind, getattr(msg, "list", "") or getattr(msg, "set", "")))
        self.groups.append(ops)


async def test_each_page_is_one_group_with_its_document_and_its_done_mark(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    recorder = _GroupRecorder()
    async with in_process_node(tmp_path) as node:
        node.node.store().add_observer(recorder)
        started = await node.stub.StartCrawl(crawl_request(root, limit=40))
        final = await wait_terminal(node.stub, started.id)
    keys = records.JobKeys(started.id)
    page_groups = [g for g in recorder.groups if ("list_push", keys.pages) in g]
    done_groups = [g for g in recorder.groups if ("set_insert", keys.done) in g]
    assert len(page_groups) == final.completed
    for g in page_groups:  # the document and its done mark travel together, once
        assert g.count(("list_push", keys.pages)) == 1
        assert g.count(("set_insert", keys.done)) == 1
    # and a done mark never comes without the page or the page error it stands for
    for g in done_groups:
        assert ("list_push", keys.pages) in g or ("list_push", keys.errors) in g
