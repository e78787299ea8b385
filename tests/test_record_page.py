"""What a job's page writes (``pagesift.primary.jobs.recording``), on a real store.

The functions run inside ``Store.write`` with no event loop and a fixed ``now``: each
test reads back the records (pages, errors, done marks, frontier, quota buckets, page
cache, cookies, webhook outbox, meta and run marker) a broken line would change. The
last tests drive the one-off Scrape (``oneoff.scrape``, on a ``FakeEngine``): it is
charged by the same ``charge_page``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from pagesift.core.jobs import quarantine, quota
from pagesift.core.jobs import records as jr
from pagesift.core.jobs.accounts import Accounts
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.jobs.scope import Entry
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.primary.engine.cookiejar import JobCookies
from pagesift.primary.engine.interface import Page
from pagesift.primary.jobs import oneoff, pagecache, recording
from pagesift.primary.jobs.pagedraws import PageDraws
from pagesift.primary.jobs.recording import NOTHING, PageResult, Recorded
from pagesift.primary.webhooks import outbox
from pagesift.v1 import jobs_pb2
from tests.fakeengine import FakeEngine, page

T = TypeVar("T")
NOW = 1_800_000_000.0  # a fixed unix time: no test reads the clock
JOB = "job-1"
ROOT = "http://site.test/"
NO_LIMIT = Accounts.from_dict({"account": [{"name": "acme", "key_sha256": "a" * 64}]})


def limited(pages_per_day: int) -> Accounts:
    table = {"name": "acme", "key_sha256": "a" * 64, "pages_per_day": pages_per_day}
    return Accounts.from_dict({"account": [table]})


def write(store: Store, fn: Callable[[WriteGroup], T]) -> T:
    return store.write(fn).result


def start_job(store: Store, kind: str = "crawl") -> None:
    """A registered job of ``acme`` with a webhook that wants every event."""
    meta = jr.JobMeta(JOB, kind, "scraping", "acme", 1, 2)

    def group(g: WriteGroup) -> None:
        g.put(jr.JobKeys(JOB).meta, meta.encode())
        outbox.configure(g, JOB, "http://hooks.test/", [], "acme")

    write(store, group)


def doc_page(path: str, **kw: object) -> Page:
    url = ROOT + path
    doc = jobs_pb2.Document(url=url, final_url=url, status_code=200, title=path, markdown="text")
    return Page(document=doc, **kw)  # type: ignore[arg-type]


def record(
    store: Store,
    result: PageResult,
    accounts: Accounts = NO_LIMIT,
    jar: JobCookies | None = None,
    now: float = NOW,
) -> Recorded:
    return write(
        store,
        lambda g: recording.record_page(g, JOB, result, accounts=accounts, jar=jar, now=now),
    )


def pages(store: Store) -> list[jobs_pb2.Document]:
    return [jobs_pb2.Document.FromString(r) for r in store.list_range(jr.JobKeys(JOB).pages)]


def errors(store: Store) -> list[tuple[str, str, str]]:
    raw = store.list_range(jr.JobKeys(JOB).errors)
    items = [jobs_pb2.PageError.FromString(r) for r in raw]
    return [(e.url, e.code, e.message) for e in items]


def events(store: Store) -> list[tuple[str, dict[str, object], str]]:
    items = [json.loads(r) for r in store.list_range(jr.JobKeys(JOB).outbox)]
    return [(e["event"], e["data"], e["created_at"]) for e in items]


def done(store: Store, mark: str) -> bool:
    return store.set_contains(jr.JobKeys(JOB).done, mark.encode())


def frontier_entries(store: Store) -> list[Entry]:
    return [Entry.decode(r) for r in store.list_range(jr.JobKeys(JOB).frontier)]


def test_a_page_writes_its_document_done_mark_links_and_event_in_one_group(store: Store) -> None:
    start_job(store)
    links = [Entry(1, ROOT + "a", ROOT + "a"), Entry(1, ROOT + "b", ROOT + "b/")]
    got = record(store, PageResult(b"/", doc_page(""), admitted=links))
    assert got == Recorded(kind="crawl", seq=0)
    assert [d.url for d in pages(store)] == [ROOT]
    assert done(store, "/") and errors(store) == []
    assert frontier_entries(store) == links
    assert all(store.set_contains(jr.JobKeys(JOB).seen, e.key.encode()) for e in links)
    page_data = {"index": 0, "url": ROOT, "final_url": ROOT, "status_code": 200, "title": ""}
    assert events(store) == [("page", page_data, outbox.rfc3339_ms(NOW))]


def test_a_page_done_already_or_of_an_ended_job_writes_nothing(store: Store) -> None:
    start_job(store)
    record(store, PageResult(b"/", doc_page("")))
    before = (pages(store), events(store))
    commit = store.write(
        lambda g: recording.record_page(
            g, JOB, PageResult(b"/", doc_page("")), accounts=NO_LIMIT, jar=None, now=NOW
        )
    )
    assert commit.result == NOTHING and list(commit.ops) == []
    assert (pages(store), events(store)) == before
    ended = jr.JobMeta(JOB, "crawl", "cancelled", "acme", 1, 2)
    write(store, lambda g: g.put(jr.JobKeys(JOB).meta, ended.encode()))
    assert record(store, PageResult(b"/other", doc_page("other"))) == NOTHING
    assert len(pages(store)) == 1 and not done(store, "/other")


def test_a_page_of_a_gone_job_writes_nothing(store: Store) -> None:
    assert record(store, PageResult(b"/", doc_page(""))) == NOTHING
    assert pages(store) == [] and not done(store, "/")


def test_a_page_whose_alias_is_done_is_a_duplicate_error_naming_it(store: Store) -> None:
    start_job(store)
    write(store, lambda g: g.insert(jr.JobKeys(JOB).done, (ROOT + "first").encode()))
    links = [Entry(1, ROOT + "x", ROOT + "x")]
    result = PageResult(b"/copy", doc_page("copy"), admitted=links, aliases=[ROOT + "first"])
    got = record(store, result)
    assert got == Recorded(kind="crawl", failed="duplicate")
    assert pages(store) == [] and done(store, "/copy")
    assert errors(store) == [(ROOT + "copy", "duplicate", f"same page as {ROOT}first")]
    assert frontier_entries(store) == []  # the original's links are in: none admitted
    assert [e[0] for e in events(store)] == ["page_failed"]


def test_a_skipped_page_is_its_error_and_its_links_are_still_admitted(store: Store) -> None:
    start_job(store)
    links = [Entry(1, ROOT + "x", ROOT + "x")]
    queued = ROOT + "n/"  # an alias waiting in the frontier: a duplicate of the skipped page
    write(store, lambda g: g.insert(jr.JobKeys(JOB).seen, queued.encode()))
    skip = PageError(ErrorCode.ROBOTS_NOINDEX, "meta robots or X-Robots-Tag")
    result = PageResult(b"/n", doc_page("n"), admitted=links, aliases=[queued], skip=skip)
    got = record(store, result)
    assert got == Recorded(kind="crawl", failed=str(ErrorCode.ROBOTS_NOINDEX))
    assert pages(store) == [] and done(store, "/n") and done(store, queued)
    assert errors(store) == [
        (ROOT + "n", str(ErrorCode.ROBOTS_NOINDEX), skip.message),
        (queued, "duplicate", f"same page as {ROOT}n"),
    ]
    assert frontier_entries(store) == links
    failed = {"url": ROOT + "n", "code": str(ErrorCode.ROBOTS_NOINDEX), "message": skip.message}
    assert events(store)[0] == ("page_failed", failed, outbox.rfc3339_ms(NOW))
    assert [e[0] for e in events(store)] == ["page_failed", "page_failed"]


def test_an_alias_still_queued_becomes_a_duplicate_of_the_stored_page(store: Store) -> None:
    start_job(store)
    queued = ROOT + "alias"
    write(store, lambda g: g.insert(jr.JobKeys(JOB).seen, queued.encode()))  # waits queued
    fresh = ROOT + "final"  # an alias never seen: claimed quietly
    got = record(store, PageResult(b"/p", doc_page("p"), aliases=[queued, fresh]))
    assert got.seq == 0 and got.failed == ""
    assert [d.url for d in pages(store)] == [ROOT + "p"]
    assert errors(store) == [(queued, "duplicate", f"same page as {ROOT}p")]
    assert done(store, queued) and done(store, fresh) and done(store, "/p")
    assert store.set_contains(jr.JobKeys(JOB).seen, fresh.encode())
    assert [e[0] for e in events(store)] == ["page_failed", "page"]


def test_each_page_is_charged_and_the_one_past_the_daily_limit_is_not_stored(
    store: Store,
) -> None:
    start_job(store, "batch")
    accounts = limited(2)
    for i in range(2):
        got = record(store, PageResult(str(i).encode(), doc_page(str(i))), accounts)
        assert got.seq == i and got.over_quota is None
        assert quota.used_today(store, "acme", NOW) == i + 1
    got = record(store, PageResult(b"2", doc_page("2")), accounts)
    assert got.over_quota is not None and got.over_quota.limit_name == "pages_per_day"
    assert got.seq is None and got.kind == "batch"
    assert quota.used_today(store, "acme", NOW) == 2
    assert len(pages(store)) == 2 and not done(store, "2")


def test_charge_page_counts_nothing_for_an_account_without_a_daily_limit(store: Store) -> None:
    assert write(store, lambda g: recording.charge_page(g, NO_LIMIT.get("acme"), NOW)) is None
    assert write(store, lambda g: recording.charge_page(g, None, NOW)) is None
    assert store.keys("usage/") == []
    assert write(store, lambda g: recording.charge_page(g, limited(1).get("acme"), NOW)) is None
    assert quota.used_today(store, "acme", NOW) == 1


def test_a_page_asked_with_max_age_and_change_tracking_is_cached_and_compared(
    store: Store,
) -> None:
    start_job(store)
    options = jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_CHANGE_TRACKING])
    options.max_age.seconds = 60
    result = PageResult(b"/", doc_page(""), source=(ROOT, options))
    record(store, result)
    entry = pagecache.lookup(store, pagecache.cache_key("acme", ROOT, options))
    assert entry is not None and entry.stored_ms == int(NOW * 1000)
    assert entry.document.url == ROOT
    assert [d.change_status for d in pages(store)] == [jobs_pb2.CHANGE_STATUS_NEW]


def test_a_page_without_source_leaves_the_cache_alone(store: Store) -> None:
    start_job(store)
    record(store, PageResult(b"/", doc_page("")))
    assert store.keys("cache/") == [] and store.keys("track/") == []


def jar_with_cookie() -> JobCookies:
    async def make() -> JobCookies:  # aiohttp's jar is built inside a loop
        jar = JobCookies()
        jar.absorb(ROOT, ["sid=s3cret; Path=/"])
        return jar

    return asyncio.run(make())


def test_the_jar_changes_are_written_with_the_page(store: Store) -> None:
    start_job(store)
    jar = jar_with_cookie()
    got = record(store, PageResult(b"/", doc_page("")), jar=jar)
    assert got.cookies is not None
    records, slots, legacy = jr.read_cookies(store, JOB)
    assert slots == 1 and legacy is None
    assert [json.loads(raw)["v"] for _, raw in records] == ["s3cret"]


def test_a_page_error_writes_its_error_done_mark_and_event_once(store: Store) -> None:
    start_job(store, "batch")
    err = PageError(ErrorCode.HTTP_STATUS, "HTTP 500", status=500)
    jar = jar_with_cookie()

    def fail(g: WriteGroup) -> Recorded:
        return recording.record_error(g, JOB, b"3", ROOT + "x", err, jar=jar, now=NOW)

    got = write(store, fail)
    assert got.failed == str(ErrorCode.HTTP_STATUS) and got.seq is None
    assert got.cookies is not None and jr.read_cookies(store, JOB)[1] == 1
    assert errors(store) == [(ROOT + "x", str(ErrorCode.HTTP_STATUS), "HTTP 500")]
    stored = jobs_pb2.PageError.FromString(store.list_range(jr.JobKeys(JOB).errors)[0])
    assert stored.http_status == 500  # the gateway answers such a page as Firecrawl does
    assert done(store, "3") and pages(store) == []
    failed = {"url": ROOT + "x", "code": str(ErrorCode.HTTP_STATUS), "message": "HTTP 500"}
    assert events(store) == [("page_failed", failed, outbox.rfc3339_ms(NOW))]
    assert write(store, fail) == NOTHING  # done already
    assert len(errors(store)) == 1


def test_finish_rewrites_the_meta_drops_the_run_marker_and_keeps_the_note(store: Store) -> None:
    start_job(store)
    marker = quarantine.RunMarker("run-1", "node:1", 1, 5, 0)
    write(store, lambda g: g.put(jr.JobKeys(JOB).run, marker.encode()))

    def finish(state: str) -> jr.JobMeta | None:
        return write(
            store,
            lambda g: recording.record_finish(
                g, JOB, state, "it broke", now_ms=9_000, ttl_ms=1_000
            ),
        )

    meta = finish("failed")
    assert meta is not None and (meta.state, meta.note) == ("failed", "it broke")
    assert (meta.finished_ms, meta.expires_ms) == (9_000, 10_000)
    assert jr.load_meta(store, JOB) == meta
    assert store.get(jr.JobKeys(JOB).run) is None
    notes = [jobs_pb2.PageError.FromString(r) for r in store.list_range(jr.JobKeys(JOB).notes)]
    assert [(n.code, n.message) for n in notes] == [("failed", "it broke")]
    data = {"state": "failed", "note": "it broke", "completed": 0, "failed": 0}
    assert events(store) == [("failed", data, outbox.rfc3339_ms(9.0))]
    assert finish("completed") == meta  # a finished job stays as it ended
    assert len(events(store)) == 1


def test_a_cancel_keeps_no_note(store: Store) -> None:
    start_job(store)
    write(
        store,
        lambda g: recording.record_finish(g, JOB, "cancelled", "by you", now_ms=1, ttl_ms=1),
    )
    assert store.list_range(jr.JobKeys(JOB).notes) == []
    meta = jr.load_meta(store, JOB)
    assert meta is not None and meta.state == "cancelled" and meta.note == "by you"


# the one-off Scrape is charged by the same ``charge_page``, with its page ------------


def test_a_scrape_is_charged_one_page_and_refused_once_the_day_is_spent(store: Store) -> None:
    engine = FakeEngine(lambda url: page(url, title="t"))
    accounts = limited(1)
    draws = PageDraws(store, accounts)
    scrape = oneoff.scrape(store, engine, draws, "acme", ROOT, jobs_pb2.ScrapeOptions())
    doc = asyncio.run(scrape)
    assert doc.url == ROOT and quota.used_today(store, "acme", time.time()) == 1
    # spent since the service's check (another call took the last page): refused
    # before its request leaves (drawn first), worded as that check words it, and
    # nothing more is charged
    again = oneoff.scrape(store, engine, draws, "acme", ROOT, jobs_pb2.ScrapeOptions())
    with pytest.raises(quota.LimitExceeded) as refused:
        asyncio.run(again)
    assert refused.value.limit_name == "pages_per_day"
    assert "used 1 of its pages_per_day limit of 1" in refused.value.message
    assert quota.used_today(store, "acme", time.time()) == 1
    assert engine.requests == [ROOT]  # one request: the refused Scrape sent none


def test_a_scrape_of_an_account_without_a_daily_limit_writes_nothing(store: Store) -> None:
    engine = FakeEngine(lambda url: page(url))
    draws = PageDraws(store, NO_LIMIT)
    scrape = oneoff.scrape(store, engine, draws, "acme", ROOT, jobs_pb2.ScrapeOptions())
    assert asyncio.run(scrape).url == ROOT
    assert store.keys("usage/") == [] and store.keys("cache/") == []
