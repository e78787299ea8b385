"""Freshness and change tracking (``pagesift.primary.jobs.pagecache``).

The pure rules (cache keys, freshness, comparison) directly; the cache, conditional
requests and change tracking through a real in-process node against real loopback
sites that count and record every request; the warm cache across a failover with a
real pair of ``pagesift serve`` processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from aiohttp import web
from google.protobuf.duration_pb2 import Duration

from pagesift.core.jobs import records
from pagesift.primary.jobs import pagecache
from pagesift.primary.jobs.runtime import Jobs
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2, store_pb2
from tests.helpers import (
    ALICE,
    BOB,
    Acct,
    NodeFactory,
    all_documents,
    eventually,
    in_process_node,
    role,
    serve_handler,
    wait_terminal,
    write_accounts,
)
from tests.test_failover import _caught_up, promote, start_pair

CT = jobs_pb2.FORMAT_CHANGE_TRACKING
MD = jobs_pb2.FORMAT_MARKDOWN


def opts(**kw: object) -> jobs_pb2.ScrapeOptions:
    return jobs_pb2.ScrapeOptions(**kw)  # type: ignore[arg-type]


# --- the pure rules ---------------------------------------------------------------------------


def test_the_cache_key_is_per_account_url_and_shaping_options_but_not_max_age() -> None:
    base = pagecache.cache_key("acme", "http://h/a", opts())
    assert base.startswith("cache/acme/")
    assert (
        pagecache.cache_key("acme", "HTTP://H:80/a#top", opts(max_age=Duration(seconds=60))) == base
    )
    assert (
        pagecache.cache_key("acme", "http://h/a", opts(formats=[CT], change_tracking_diff=True))
        == base
    )
    assert pagecache.cache_key("other", "http://h/a", opts()) != base
    assert pagecache.cache_key("acme", "http://h/b", opts()) != base
    for shaping in (
        opts(only_main_content=True),
        opts(formats=[jobs_pb2.FORMAT_HTML]),
        opts(headers={"X-A": "1"}),
        opts(user_agent="other/1"),
        opts(cookies={"c": "1"}),
    ):
        assert pagecache.cache_key("acme", "http://h/a", shaping) != base


def test_an_entry_is_fresh_only_while_younger_than_max_age() -> None:
    entry = store_pb2.CachedPage(stored_ms=10_000)
    assert pagecache.fresh(entry, 5_000, 14_999)
    assert not pagecache.fresh(entry, 5_000, 15_000)
    assert not pagecache.fresh(entry, 0, 10_001)  # no max_age: never from the cache
    assert not pagecache.fresh(entry, 5_000, 9_000)  # a clock behind the stamp: refetch


def test_a_page_is_new_then_same_then_changed_with_a_bounded_unified_diff() -> None:
    assert pagecache.compare(None, "a", True) == (jobs_pb2.CHANGE_STATUS_NEW, "")
    prev = store_pb2.TrackedPage(
        markdown="line 1\nline 2\n", markdown_sha256=hashlib.sha256(b"line 1\nline 2\n").digest()
    )
    assert pagecache.compare(prev, "line 1\nline 2\n", True) == (jobs_pb2.CHANGE_STATUS_SAME, "")
    status, diff = pagecache.compare(prev, "line 1\nline two\n", True)
    assert status == jobs_pb2.CHANGE_STATUS_CHANGED
    assert diff.splitlines()[:2] == ["--- previous", "+++ current"]
    assert "-line 2" in diff and "+line two" in diff
    assert pagecache.compare(prev, "other", False) == (jobs_pb2.CHANGE_STATUS_CHANGED, "")


# --- through a node ---------------------------------------------------------------------------


@dataclass
class Site:
    """Pages by path (HTML bodies); counts requests and answers conditionals."""

    pages: dict[str, str] = field(default_factory=dict)
    etag: bool = True
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # path, INM, IMS

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        inm = request.headers.get("If-None-Match", "")
        ims = request.headers.get("If-Modified-Since", "")
        self.requests.append((path, inm, ims))
        if path not in self.pages:
            raise web.HTTPNotFound()
        body = self.pages[path]
        tag = f'"{abs(hash(body))}"'
        headers = {"Last-Modified": "Mon, 30 Nov 2026 10:00:00 GMT"}
        if self.etag:
            headers["ETag"] = tag
        if (self.etag and inm == tag) or (not self.etag and ims == headers["Last-Modified"]):
            return web.Response(status=304, headers=headers)
        return web.Response(text=body, content_type="text/html", headers=headers)

    def fetched(self, path: str) -> list[tuple[str, str]]:
        return [(inm, ims) for p, inm, ims in self.requests if p == path]


@contextlib.asynccontextmanager
async def site_at(site: Site) -> AsyncIterator[str]:
    async with serve_handler(site.handle) as port:
        yield f"http://127.0.0.1:{port}"


def page(title: str, *links: str, text: str = "") -> str:
    anchors = "".join(f'<a href="{href}">{href}</a>' for href in links)
    head = f"<head><title>{title}</title></head>"
    return f"<html>{head}<body><p>{text or title}</p>{anchors}</body></html>"


async def scrape(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, url: str, options: jobs_pb2.ScrapeOptions, acct: Acct
) -> jobs_pb2.Document:
    return (
        await stub.Scrape(jobs_pb2.ScrapeRequest(url=url, options=options), metadata=acct.md)
    ).document


async def test_a_fresh_copy_answers_without_a_fetch_and_only_for_its_own_account(
    tmp_path: Path,
) -> None:
    site = Site({"/a": page("A")})
    accounts = write_accounts(tmp_path / "accounts.toml", [ALICE, BOB], admin_key=None)
    async with (
        site_at(site) as root,
        in_process_node(tmp_path / "n", accounts_file=str(accounts), respect_robots=False) as node,
    ):
        cached = opts(max_age=Duration(seconds=3600))
        first = await scrape(node.stub, root + "/a", cached, ALICE)
        second = await scrape(node.stub, root + "/a", cached, ALICE)
        assert (first.cache_hit, second.cache_hit) == (False, True)
        assert second.markdown == first.markdown and second.title == "A"
        assert len(site.fetched("/a")) == 1  # the second came from the cache
        other = await scrape(node.stub, root + "/a", cached, BOB)
        assert not other.cache_hit and len(site.fetched("/a")) == 2  # never shared
        plain = await scrape(node.stub, root + "/a", opts(), ALICE)
        assert not plain.cache_hit and len(site.fetched("/a")) == 3  # no max_age: fetched
        shaped = await scrape(
            node.stub,
            root + "/a",
            opts(max_age=Duration(seconds=3600), only_main_content=True),
            ALICE,
        )
        assert not shaped.cache_hit  # other options: another entry


# sleep this long between two scrapes of a 1 ms max_age: a loopback round trip can take
# less than 1 ms, and the copy must be older than max_age when the next scrape reads it
OLDER = 0.01


@pytest.mark.parametrize("etag", [True, False])
async def test_an_older_copy_is_revalidated_and_a_304_returns_it_as_fresh(
    tmp_path: Path, etag: bool
) -> None:
    site = Site({"/a": page("A")}, etag=etag)
    async with site_at(site) as root, in_process_node(tmp_path, respect_robots=False) as node:
        stale = opts(max_age=Duration(nanos=1_000_000))  # 1 ms: older at once
        anon = Acct("anonymous")
        first = await scrape(node.stub, root + "/a", stale, anon)
        await asyncio.sleep(OLDER)
        again = await scrape(node.stub, root + "/a", stale, anon)
        assert not first.cache_hit and again.cache_hit
        assert again.markdown == first.markdown
        (_, _), (inm, ims) = site.fetched("/a")
        assert (bool(inm), ims) == (etag, "Mon, 30 Nov 2026 10:00:00 GMT")
        site.pages["/a"] = page("A2")  # changed: the validator no longer matches
        if etag:
            await asyncio.sleep(OLDER)
            changed = await scrape(node.stub, root + "/a", stale, anon)
            assert not changed.cache_hit and changed.title == "A2"


async def test_max_age_is_bounded_by_the_cache_ttl_and_a_diff_needs_change_tracking(
    tmp_path: Path,
) -> None:
    async with in_process_node(tmp_path, page_cache_ttl=60.0) as node:
        for options, field_name in (
            (opts(max_age=Duration(seconds=61)), "options.max_age"),
            (opts(change_tracking_diff=True), "options.change_tracking_diff"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await node.stub.Scrape(
                    jobs_pb2.ScrapeRequest(url="http://127.0.0.1:1/", options=options)
                )
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (info.value.details() or "").startswith(field_name)


async def crawl(
    node_stub: jobs_pb2_grpc.JobServiceAsyncStub, root: str
) -> tuple[jobs_pb2.GetJobResponse, dict[str, jobs_pb2.Document]]:
    start = await node_stub.StartCrawl(
        jobs_pb2.StartCrawlRequest(
            url=root + "/",
            sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
            options=opts(formats=[MD, CT], change_tracking_diff=True),
        )
    )
    job = await wait_terminal(node_stub, start.id, timeout=60)
    assert job.state == jobs_pb2.JOB_STATE_COMPLETED, job.note
    docs = {d.url.removeprefix(root): d for d in await all_documents(node_stub, start.id)}
    return job, docs


async def test_a_second_crawl_says_new_same_changed_and_lists_removed_pages(tmp_path: Path) -> None:
    site = Site({
        "/": page("Home", "/a", "/b", "/gone"),
        "/a": page("A", text="first text"),
        "/b": page("B"),
        "/gone": page("Gone"),
    })  # fmt: skip
    async with site_at(site) as root, in_process_node(tmp_path, respect_robots=False) as node:
        first, docs = await crawl(node.stub, root)
        assert {p: d.change_status for p, d in docs.items()} == dict.fromkeys(
            ["/", "/a", "/b", "/gone"], jobs_pb2.CHANGE_STATUS_NEW
        )
        assert list(first.removed_urls) == []
        site.pages["/"] = page("Home", "/a", "/b", "/new")
        site.pages["/a"] = page("A", text="second text")
        site.pages["/new"] = page("New")
        second, docs = await crawl(node.stub, root)
        # a crash between the removed list's write and the job's end replays it: no change
        runtime = node.node.runtime()
        meta = records.load_meta(node.node.store(), second.id)
        assert isinstance(runtime, Jobs) and meta is not None
        await runtime.runner.record_removed(meta, root + "/")
        replayed = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=second.id, status_only=True))
        assert list(replayed.removed_urls) == [root + "/gone"]
    status = {p: d.change_status for p, d in docs.items()}
    assert status == {
        "/": jobs_pb2.CHANGE_STATUS_CHANGED,
        "/a": jobs_pb2.CHANGE_STATUS_CHANGED,
        "/b": jobs_pb2.CHANGE_STATUS_SAME,
        "/new": jobs_pb2.CHANGE_STATUS_NEW,
    }
    assert "-first text" in docs["/a"].change_diff and "+second text" in docs["/a"].change_diff
    assert docs["/b"].change_diff == ""
    assert list(second.removed_urls) == [root + "/gone"]


@pytest.mark.system
async def test_a_failover_keeps_the_page_cache_warm(nodes: NodeFactory, tmp_path: Path) -> None:
    site = Site({"/a": page("A")})
    async with site_at(site) as root:
        primary, standby = await start_pair(nodes)
        cached = opts(max_age=Duration(seconds=3600))
        async with grpc.aio.insecure_channel(primary.address) as ch:
            first = await jobs_pb2_grpc.JobServiceStub(ch).Scrape(
                jobs_pb2.ScrapeRequest(url=root + "/a", options=cached)
            )
        assert not first.document.cache_hit
        await eventually(lambda: _caught_up(primary.address, standby.address), "the standby")
        primary.kill()
        await promote(standby.address)
        assert (await role(standby.address)).role == replication_pb2.NODE_ROLE_PRIMARY
        async with grpc.aio.insecure_channel(standby.address) as ch:
            again = await jobs_pb2_grpc.JobServiceStub(ch).Scrape(
                jobs_pb2.ScrapeRequest(url=root + "/a", options=cached)
            )
    assert again.document.cache_hit and again.document.title == "A"
    assert len(site.fetched("/a")) == 1
