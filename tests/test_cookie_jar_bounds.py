"""Bounded write groups (issue 19, finding 8 and point 6): the cookie jar persisted as
changes under RFC 6265's caps, and a page whose write group passes its bound refused
whole as a ``too_large`` page error.

The jar tests drive ``JobCookies`` with the Set-Cookie lines of ``tests.hostile.cookies``;
the store test uses a real RocksDB store with its replication log; the crawl tests run
a real node (in process, or ``pagesift serve`` SIGKILLed mid-crawl) against the hostile
site on loopback and measure what the replication log grew by.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from aiohttp import web

from pagesift.core.jobs import records as jr
from pagesift.core.replication.log import Log
from pagesift.core.replication.slot import open_slot
from pagesift.core.store.db import Store
from pagesift.core.store.groups import GroupTooLarge, WriteGroup
from pagesift.primary.engine.cookiejar import (
    EMPTY,
    JAR_BURST_BYTES,
    MAX_DOMAIN_COOKIES,
    MAX_JOB_COOKIE_BYTES,
    JobCookies,
)
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import (
    ServeProc,
    all_documents,
    crawl_cookie_site,
    eventually,
    in_process_node,
    wait_terminal,
)
from tests.hostile import Handler, cookies, serve

SITE = "http://127.0.0.1:8000"


def flood(n: int) -> list[str]:
    """The Set-Cookie lines of hostile page ``n`` (``tests.hostile.cookies.chain``)."""
    lines = [f"big{i}={cookies.big_value(i, n)}; Path=/" for i in range(cookies.BIG_COOKIES)]
    return [*lines, "sid=login; Path=/cookies", f"visit={n}; Path=/cookies"]


def names(header: str | None) -> set[str]:
    return set() if header is None else {pair.split("=", 1)[0] for pair in header.split("; ")}


def stored_jar(jar: JobCookies) -> dict[int, bytes]:
    """Commit every change of ``jar`` into a dict of slot -> record (the store's view)."""
    store: dict[int, bytes] = {}
    changes = jar.changes()
    if changes is not None:
        store.update(changes.puts)
        for slot in changes.deletes:
            store.pop(slot, None)
        jar.committed(changes)
    return store


# --- caps ------------------------------------------------------------------------------


async def test_a_set_cookie_line_over_4096_bytes_is_dropped_and_counted() -> None:
    jar = JobCookies()
    jar.absorb(f"{SITE}/", [f"huge={'v' * 4100}; Path=/", f"fits={'v' * 4000}; Path=/"])
    assert names(jar.header(f"{SITE}/")) == {"fits"}
    assert jar.dropped == 1


async def test_sixty_cookies_on_one_domain_keep_the_fifty_newest() -> None:
    jar = JobCookies()
    jar.absorb(f"{SITE}/", [f"c{i}=v; Path=/" for i in range(60)])
    assert len(jar) == MAX_DOMAIN_COOKIES == 50
    assert jar.evicted == 10
    assert names(jar.header(f"{SITE}/")) == {f"c{i}" for i in range(10, 60)}
    jar.absorb("http://other.example/", ["o=1"])  # another domain has its own 50
    assert names(jar.header("http://other.example/")) == {"o"}
    assert len(jar) == 51


async def test_a_job_keeps_at_most_its_byte_budget_of_cookies_the_oldest_evicted() -> None:
    jar = JobCookies()
    value = "v" * 4000
    for host in range(400):  # 400 domains x 4 KB: four times the budget
        jar.absorb(f"http://h{host}.example/", [f"c={value}; Path=/"])
    kept = len(jar)
    assert 200 < kept < 270  # ~1 MiB of 4 KB cookies
    assert jar.evicted == 400 - kept
    assert jar.header("http://h0.example/") is None  # the oldest went first
    assert jar.header("http://h399.example/") is not None
    store = stored_jar(jar)
    assert sum(len(r) for r in store.values()) < MAX_JOB_COOKIE_BYTES * 1.1


# --- persistence as changes ------------------------------------------------------------


async def test_a_flood_of_unchanged_cookies_is_written_once_then_only_what_changed() -> None:
    jar = JobCookies()
    stable = flood(0)[:-1]  # big0..big119 and sid as on page 0; visit set per page
    first = None
    puts: list[int] = []
    for n in range(80):  # the first page's 50 cookies, within the jar's budget
        jar.absorb(f"{SITE}/cookies/chain/{n}", [*stable, f"visit={n}; Path=/cookies"])
        changes = jar.changes()
        first = first or changes
        assert changes is not None  # visit changed: written with its page, every page
        assert changes.cost <= JAR_BURST_BYTES
        puts += [slot for slot, _ in changes.puts]
        jar.committed(changes)
        if not jar.dirty:
            break
    assert first is not None and first.size < JAR_BURST_BYTES
    # each of the 50 kept cookies written once (visit on every page); none since
    assert len(set(puts)) == MAX_DOMAIN_COOKIES and len(puts) == MAX_DOMAIN_COOKIES + n
    for m in range(n + 1, n + 6):
        jar.absorb(f"{SITE}/cookies/chain/{m}", flood(m))
        changes = jar.changes()
        assert changes is not None
        # visit and big119 changed; the other 48 kept cookies were set again as they were
        assert len(changes.puts) <= 2 and not changes.deletes and changes.slots is None
        assert changes.size < 2 * cookies.BIG_BYTES
        jar.committed(changes)


async def test_records_rebuild_the_jar_deletions_delete_and_request_cookies_stay_tombstoned() -> (
    None
):
    jar = JobCookies()
    jar.seed({"pref": "dark", "lang": "en"}, [f"{SITE}/"])
    assert jar.changes() is None  # the request's cookies come back from the request
    jar.absorb(f"{SITE}/a", ["s=1; Path=/", "t=2; Max-Age=3600; Path=/", "pref=; Max-Age=0"])
    store = stored_jar(jar)
    assert len(store) == 3  # s, t and pref's tombstone
    jar.absorb(f"{SITE}/b", ["s=; Max-Age=0; Path=/"])
    changes = jar.changes()
    assert changes is not None and len(changes.deletes) == 1 and not changes.puts
    store.pop(changes.deletes[0])
    jar.committed(changes)

    resumed = JobCookies()
    resumed.seed({"pref": "dark", "lang": "en"}, [f"{SITE}/"])
    resumed.load(sorted(store.items()), len(store) + 1)
    assert resumed.header(f"{SITE}/x") == jar.header(f"{SITE}/x")
    assert names(resumed.header(f"{SITE}/x")) == {"lang", "t"}
    assert resumed.changes() is None
    # a freed slot is reused: the slot count stays bounded by the live cookies
    resumed.absorb(f"{SITE}/c", ["u=3; Path=/"])
    changes = resumed.changes()
    assert changes is not None and changes.slots is None
    assert changes.puts[0][0] not in store


async def test_a_refreshed_max_age_is_not_rewritten_on_every_page() -> None:
    jar = JobCookies()
    jar.absorb(f"{SITE}/", ["session=abc; Max-Age=86400; Path=/"])
    stored_jar(jar)
    await asyncio.sleep(0.01)
    jar.absorb(f"{SITE}/", ["session=abc; Max-Age=86400; Path=/"])
    assert jar.changes() is None
    jar.absorb(f"{SITE}/", ["session=abc; Max-Age=60; Path=/"])  # an expiry that moved
    assert jar.changes() is not None


async def test_an_expired_cookie_deletes_its_record() -> None:
    jar = JobCookies()
    jar.absorb(f"{SITE}/", ["short=1; Max-Age=30; Path=/", "long=2; Path=/"])
    store = stored_jar(jar)
    assert len(store) == 2
    later = jar.changes(now=time.time() + 31)
    assert later is not None and len(later.deletes) == 1 and not later.puts
    jar.committed(later)
    assert len(jar) == 1  # aiohttp's jar drops it by its own clock when the time comes


async def test_more_touched_cookies_than_it_tracks_fall_back_to_a_full_diff() -> None:
    jar = JobCookies()
    jar.absorb(f"{SITE}/", ["keep=1; Path=/", "old=2; Path=/"])
    store = stored_jar(jar)
    jar.absorb(f"{SITE}/", ["old=; Max-Age=0; Path=/"])
    for host in range(150):  # 150 domains x 50 cookies: 7,500 touched, 3,000 kept at most
        jar.absorb(f"http://h{host}.example/", [f"c{i}=v; Path=/" for i in range(50)])
    assert len(jar) == 3000 and jar.evicted > 0
    changes = jar.changes()
    assert changes is not None and changes.full
    slots = 0
    for _ in range(200):  # ~300 KB of records, within the jar's budget of each page
        assert changes.cost <= JAR_BURST_BYTES
        for slot, raw in changes.puts:
            store[slot] = raw
        for slot in changes.deletes:
            del store[slot]
        slots = changes.slots or slots
        jar.committed(changes)
        if not jar.dirty:
            break
        changes = jar.changes() or EMPTY
    assert jar.changes() is None and not jar.dirty
    assert len(store) == 3000  # the live cookies, "old" deleted, "keep" evicted (oldest)
    rebuilt = JobCookies()
    rebuilt.load(sorted(store.items()), slots)
    assert len(rebuilt) == 3000 and rebuilt.changes() is None
    for url in (f"{SITE}/", "http://h149.example/", "http://h90.example/x"):
        assert rebuilt.header(url) == jar.header(url)


async def test_a_changes_set_whose_group_failed_is_offered_again() -> None:
    jar = JobCookies()
    jar.absorb(f"{SITE}/", ["a=1"])
    lost = jar.changes()
    assert lost is not None  # never committed: the group was refused
    again = jar.changes()
    assert again is not None and again.puts == lost.puts


async def test_a_job_stored_with_the_old_snapshot_resumes_and_rewrites_it_as_records() -> None:
    legacy = b'[["http://127.0.0.1:8000/login", "session=s3cret; Path=/"]]'
    jar = JobCookies()
    jar.load([], 0, legacy)
    assert jar.header(f"{SITE}/members") == "session=s3cret"
    changes = jar.changes()
    assert changes is not None and changes.drop_legacy and len(changes.puts) == 1
    jar.committed(changes)
    assert jar.changes() is None


async def test_the_runtime_reads_the_old_snapshot_key_of_a_stored_job(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    try:
        keys = jr.JobKeys("j1")
        store.write(lambda g: g.put(keys.cookies, b'[["http://a.example/", "k=v"]]'))
        records, slots, legacy = jr.read_cookies(store, "j1")
        assert (records, slots, legacy) == ([], 0, b'[["http://a.example/", "k=v"]]')
        jar = JobCookies()
        jar.load(records, slots, legacy)
        changes = jar.changes()
        assert changes is not None

        def write(g: WriteGroup) -> None:
            for slot, raw in changes.puts:
                g.put(keys.cookie(slot), raw)
            assert changes.slots is not None
            g.put(keys.cookie_slots, str(changes.slots).encode())
            g.delete(keys.cookies)

        store.write(write)
        records, slots, legacy = jr.read_cookies(store, "j1")
        assert len(records) == 1 and slots == 1 and legacy is None
        store.write(lambda g: jr.delete_job(g, "j1", None))  # expiry finds every record
        assert store.keys(keys.prefix) == []
    finally:
        store.close()


# --- the store's bound -----------------------------------------------------------------


def test_a_write_group_over_its_bound_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "p", max_group_bytes=4 << 20)
    log = Log(store, max_bytes=64 << 20)
    log.open_for_writes()
    try:
        log.write(lambda g: g.put("small", b"x"))
        offset, backlog = log.last_offset, log.backlog_bytes

        def big(g: WriteGroup) -> None:
            g.put("a", b"y" * (1 << 20))
            g.push("l", b"z" * (1 << 20))

        with pytest.raises(GroupTooLarge) as info:
            store.write(big, max_bytes=1 << 20)
        assert info.value.bound == 1 << 20 and info.value.size > 2 << 20
        with pytest.raises(GroupTooLarge):  # the store's own bound when none is given
            store.write(lambda g: g.put("b", b"w" * (5 << 20)))
        assert store.get("a") is None and store.list_len("l") == 0 and store.get("b") is None
        assert (log.last_offset, log.backlog_bytes) == (offset, backlog)  # nothing logged
        assert store.write(big, max_bytes=3 << 20).offset == offset + 1  # within: written
        assert store.get("a") == b"y" * (1 << 20)
    finally:
        log.close()
        store.close()


# --- a real node -----------------------------------------------------------------------


async def test_a_crawl_of_a_cookie_flood_grows_the_log_by_a_small_multiple_of_the_baseline(
    tmp_path: Path,
) -> None:
    pages = 60
    baseline = (await crawl_cookie_site(tmp_path / "quiet", "quiet", pages - 1, 4)).grown
    flood = await crawl_cookie_site(tmp_path / "flood", "chain", pages - 1, 4)
    flooded, docs = flood.grown, flood.docs
    per_page = baseline / pages
    print(f"log bytes per page: baseline {per_page:.0f}, cookie flood {flooded / pages:.0f}")
    # the jar's first 50 cookies once (~200 KB, spread by its budget), then visit and
    # big119 per page
    first = MAX_DOMAIN_COOKIES * (cookies.BIG_BYTES + 200)
    assert flooded - first < 5 * baseline + pages * 2 * (cookies.BIG_BYTES + 200)
    # the snapshot of every page group was 122 lines of ~3.9 KB: pages x 470 KB
    assert flooded < pages * 60 * cookies.BIG_BYTES
    assert all("sid=login" in d.markdown for d in docs if not d.url.split("?")[0].endswith("/0"))


@pytest.fixture
def long_links_site() -> Callable[[], Handler]:
    """A page of 3,000 relative links under a 2,000-character path: 50 KB of HTML
    whose links are each 2 KB absolute (6 MB of links, stored several times over)."""

    def make() -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            if request.path.endswith("/small"):
                return web.Response(text="<title>small</title><p>ok</p>", content_type="text/html")
            links = "".join(f"<a href=?{i}>.</a>" for i in range(3000))
            return web.Response(text=f"<title>links</title>{links}", content_type="text/html")

        return handle

    return make


async def test_a_page_whose_group_passes_the_bound_is_a_too_large_error_and_nothing_is_stored(
    tmp_path: Path, long_links_site: Callable[[], Handler]
) -> None:
    max_body = 64 * 1024
    bound = jr.page_group_bytes(max_body)
    runner, root = await serve([("/{tail:.*}", long_links_site())])
    try:
        async with in_process_node(tmp_path, extract_processes=0, max_body_bytes=max_body) as node:
            long = f"{root}{'p' * 2000}/links"
            options = jobs_pb2.ScrapeOptions(
                formats=[jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_LINKS]
            )
            log = node.node.slot.log
            before = log.backlog_bytes
            started = await node.stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(urls=[long, f"{root}small"], options=options)
            )
            final = await wait_terminal(node.stub, started.id, timeout=60)
            grown = log.backlog_bytes - before
            errors = await node.stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=started.id))
            docs = await all_documents(node.stub, started.id)
            listed = await asyncio.wait_for(node.stub.ListJobs(jobs_pb2.ListJobsRequest()), 2)
    finally:
        await runner.cleanup()
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert (final.completed, final.failed) == (1, 1)
    assert [d.url for d in docs] == [f"{root}small"]
    (error,) = errors.errors
    assert error.url == long and error.code == "too_large"
    assert f"over the {bound}-byte bound" in error.message
    assert grown < bound  # the refused group never reached the log
    assert len(listed.jobs) == 1


async def serve_counted(served: list[str]) -> tuple[web.AppRunner, str]:
    """The cookie site, each request's path appended to ``served``."""

    def counting(handler: Handler) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            served.append(request.path)
            return await handler(request)

        return handle

    return await serve([(path, counting(h)) for path, h in cookies.ROUTES])


async def start_chain_crawl(
    address: str, root: str, last: int, delay_ms: int
) -> jobs_pb2.StartCrawlResponse:
    """A one-page-at-a-time crawl of the flooding chain ``0..last``."""
    request = jobs_pb2.StartCrawlRequest(
        url=f"{root}cookies/chain/0?last={last}&delay={delay_ms}",
        sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
        crawl_entire_domain=True,
        max_concurrency=1,
    )
    async with grpc.aio.insecure_channel(address) as ch:
        started: jobs_pb2.StartCrawlResponse = await jobs_pb2_grpc.JobServiceStub(ch).StartCrawl(
            request
        )
        return started


@pytest.mark.system
async def test_a_crawl_killed_mid_flood_resumes_sending_the_cookies_it_learnt(
    tmp_path: Path,
) -> None:
    served: list[str] = []
    runner, root = await serve_counted(served)
    server = ServeProc(tmp_path, "server", config={"extract_processes": 0})
    last = 40
    try:
        await server.start()
        job = await start_chain_crawl(server.address, root, last, delay_ms=50)

        async def mid_crawl() -> bool | None:
            return True if len(served) >= 10 else None

        await eventually(mid_crawl, "ten flooded pages", timeout=30)
        server.kill()
        killed_at = len(served)
        await server.start()
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            final = await wait_terminal(stub, job.id, timeout=60)
            docs = await all_documents(stub, job.id)
    finally:
        server.stop()
        await runner.cleanup()
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert len(served) > killed_at  # pages were fetched by the restarted node
    assert len(docs) == last + 1
    for doc in docs:
        n = int(re.search(r"/chain/(\d+)", doc.url).group(1))  # type: ignore[union-attr]
        if n == 0:
            continue
        # every page, before the kill and after it, got the session and the visit of
        # the page before it, and some of the big cookies (as many as a header holds)
        assert "sid=login" in doc.markdown, (n, doc.markdown[-300:])
        assert f"visit={n - 1}" in doc.markdown, (n, doc.markdown[-300:])
        assert "big" in doc.markdown


@pytest.mark.system
async def test_a_job_stored_with_the_old_jar_snapshot_resumes_with_it_and_rewrites_it(
    tmp_path: Path,
) -> None:
    served: list[str] = []
    runner, root = await serve_counted(served)
    server = ServeProc(tmp_path, "server", config={"extract_processes": 0})
    last = 20
    try:
        await server.start()
        job = await start_chain_crawl(server.address, root, last, delay_ms=100)

        async def started() -> bool | None:
            return True if len(served) >= 4 else None

        await eventually(started, "four flooded pages", timeout=30)
        server.kill()
        # the job as the previous version stored it: its jar as one snapshot of lines
        slot = open_slot(server.data)
        slot.log.open_for_writes()
        keys = jr.JobKeys(job.id)
        records, slots, _ = jr.read_cookies(slot.store, job.id)
        assert records  # the new layout, before the rewrite (what the jar's budget let in)
        legacy = json.dumps([
            [f"{root}cookies/chain/0", "sid=legacy; Path=/cookies"],
            [f"{root}cookies/chain/0", "visit=999; Path=/cookies"],
        ]).encode()  # fmt: skip

        def downgrade(g: WriteGroup) -> None:
            for slot_no in range(slots):
                g.delete(keys.cookie(slot_no))
            g.delete(keys.cookie_slots)
            g.put(keys.cookies, legacy)

        slot.log.write(downgrade)
        slot.close()
        killed_at = len(served)
        await server.start()
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            final = await wait_terminal(stub, job.id, timeout=60)
            docs = await all_documents(stub, job.id)
    finally:
        server.stop()
        await runner.cleanup()
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert len(served) > killed_at
    resumed = [d for d in docs if "sid=legacy" in d.markdown]
    assert len(resumed) == 1 and "visit=999" in resumed[0].markdown  # the first page after
    slot = open_slot(server.data)
    try:
        records, slots, legacy_left = jr.read_cookies(slot.store, job.id)
    finally:
        slot.close()
    assert legacy_left is None and records and slots >= len(records)
    stored = {r["n"]: r["v"] for r in (json.loads(raw) for _, raw in records)}
    assert stored["sid"] == "login" and stored["visit"] == str(last)  # small ones first
