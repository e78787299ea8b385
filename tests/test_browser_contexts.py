"""A job's pages share one browser context; two jobs never do (``BrowserPool`` with
``scope``), on a real chromium-headless-shell against the local JavaScript site.

Each test uses fresh scope objects (stand-ins for a job's ``RequestProfile``) and reads
what a page can see (localStorage, ``document.cookie``) through an executed script, so a
context shared across jobs, or one not reused within a job, fails an assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from google.protobuf.duration_pb2 import Duration

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.browser import pool as poolmod
from pagesift.primary.engine.browser.pool import BrowserPool
from pagesift.v1 import jobs_pb2 as pb
from tests.helpers import until
from tests.jssite import MARKERS, PAGES, serve_js_site

EXE = "/usr/lib/chromium/chromium-headless-shell"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not os.access(EXE, os.X_OK), reason="chromium-headless-shell missing"),
]
CONFIG = ServerConfig(max_browser_pages=4, max_render_wait=2.0, render_timeout=20.0)
# sets a value in localStorage and a cookie (once), answers what this context had before
REMEMBER = """
const before = {storage: localStorage.getItem('k'), cookie: document.cookie};
if (before.storage === null) {
  localStorage.setItem('k', '%s');
  document.cookie = 'job=%s; path=/';
}
return before;"""


class Job:
    """A stand-in for a job's profile: any object alive as long as the job."""


class Releases:
    """Counts the release of each page's proxy credentials."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def of(self, name: str) -> Callable[[], object]:
        return lambda: self.calls.update([name])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def site() -> AsyncIterator[tuple[str, Counter[str]]]:
    hits: Counter[str] = Counter()
    async with serve_js_site(hits) as root:
        yield root, hits


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool() -> AsyncIterator[BrowserPool]:
    p = BrowserPool(CONFIG)
    try:
        yield p
    finally:
        await p.close()


def script(value: str) -> pb.ScrapeOptions:
    action = pb.Action(
        execute_javascript=pb.ExecuteJavascriptAction(script=REMEMBER % (value, value))
    )
    return pb.ScrapeOptions(actions=[action])


async def remember(pool: BrowserPool, url: str, value: str, **kw: object) -> dict[str, object]:
    got = await pool.render(url, script(value), owner="acct", **kw)  # type: ignore[arg-type]
    answer: dict[str, object] = json.loads(got.action_results[0].javascript_return)
    return answer


async def test_a_jobs_pages_share_its_context_and_another_job_sees_none_of_it(
    pool: BrowserPool, site: tuple[str, Counter[str]]
) -> None:
    url = site[0] + PAGES["probe"]
    jobs, rel = {"a": Job(), "b": Job()}, Releases()
    first = await remember(pool, url, "a", scope=jobs["a"], release=rel.of("a1"))
    assert first == {"storage": None, "cookie": ""}
    assert rel.calls["a1"] == 0  # its context holds the credentials it was made with
    again = await remember(pool, url, "x", scope=jobs["a"], release=rel.of("a2"))
    assert again == {"storage": "a", "cookie": "job=a"}
    assert rel.calls["a2"] == 1  # not needed: the job's context already had its own
    # another job, same account and options, at once with the first job's next page
    other, third = await asyncio.gather(
        remember(pool, url, "b", scope=jobs["b"], release=rel.of("b1")),
        remember(pool, url, "y", scope=jobs["a"], release=rel.of("a3")),
    )
    assert other == {"storage": None, "cookie": ""}
    assert third == {"storage": "a", "cookie": "job=a"}
    # no scope: a fresh context for the page alone, its credentials released after it
    alone = await remember(pool, url, "z", release=rel.of("none"))
    assert alone == {"storage": None, "cookie": ""} and rel.calls["none"] == 1
    assert pool.stats()["contexts"] == 2
    # a job gone (its profile collected): its context closes, its credentials freed
    del jobs["a"]  # (held in a dict: a frame's locals snapshot may outlive ``del``)
    gc.collect()
    cur = pool._current
    assert cur is not None
    pool._sweep(cur)
    await asyncio.gather(*pool._old)
    assert rel.calls["a1"] == 1 and rel.calls["b1"] == 0
    assert pool.stats()["contexts"] == 1
    # an idle context closes after CONTEXT_IDLE
    pool._sweep(cur, now=cur.contexts[next(iter(cur.contexts))].idle_since + 1e6)
    await asyncio.gather(*pool._old)
    assert rel.calls["b1"] == 1 and pool.stats()["contexts"] == 0
    assert all(n == 1 for n in rel.calls.values())  # each released exactly once


async def test_a_failed_page_retires_its_jobs_context(
    pool: BrowserPool, site: tuple[str, Counter[str]]
) -> None:
    url = site[0] + PAGES["probe"]
    job, rel = Job(), Releases()
    assert (await remember(pool, url, "f", scope=job, release=rel.of("1")))["storage"] is None
    missing = pb.ScrapeOptions()
    missing.wait_for.selector = "#never-there"
    with pytest.raises(PageError) as err:
        await pool.render(url, missing, owner="acct", scope=job, release=rel.of("2"))
    assert err.value.code == ErrorCode.TIMEOUT  # the wait_for never showed
    await asyncio.gather(*pool._old)
    assert rel.calls["1"] == 1 and rel.calls["2"] == 1  # the broken context is closed
    # the job's next page gets a new context: nothing of the old one
    assert (await remember(pool, url, "g", scope=job, release=rel.of("3")))["storage"] is None
    assert rel.calls["3"] == 0


async def test_a_jobs_reused_context_still_refuses_images_and_a_screenshot_gets_its_own(
    pool: BrowserPool, site: tuple[str, Counter[str]]
) -> None:
    root, hits = site
    job, rel = Job(), Releases()
    before = hits["img.png"]
    for n in range(3):
        await pool.render(
            root + PAGES["image"],
            pb.ScrapeOptions(),
            owner="acct",
            scope=job,
            release=rel.of(str(n)),
        )
    assert hits["img.png"] == before and hits["font.woff2"] == 0
    assert sum(rel.calls.values()) == 2  # one context for the three pages
    shot = pb.ScrapeOptions(formats=[pb.FORMAT_SCREENSHOT])
    got = await pool.render(root + PAGES["image"], shot, owner="acct", scope=job)
    assert got.screenshot is not None and got.screenshot.data and hits["img.png"] == before + 1
    cur = pool._current
    assert cur is not None
    assert sum(1 for e in cur.contexts.values() if e.scope() is job) == 2


async def test_a_browser_that_dies_frees_every_jobs_credentials(
    site: tuple[str, Counter[str]],
) -> None:
    url = site[0] + PAGES["probe"]
    p = BrowserPool(CONFIG)
    try:
        jobs, rel = [Job(), Job()], Releases()
        for n, job in enumerate(jobs):
            await remember(p, url, str(n), scope=job, release=rel.of(str(n)))
        assert rel.calls == Counter() and p.stats()["contexts"] == 2
        pid = p.browser_pid()
        assert pid is not None
        os.kill(pid, 9)
        for _ in range(200):
            if rel.calls["0"] and rel.calls["1"]:
                break
            await asyncio.sleep(0.05)
        assert rel.calls == Counter({"0": 1, "1": 1})
        # and the job renders again, in a new browser and a new context
        again = await remember(p, url, "x", scope=jobs[0], release=rel.of("new"))
        assert again["storage"] is None and p.launches == 2
    finally:
        await p.close()
    assert poolmod.CONTEXT_IDLE > 0


async def test_a_popup_the_page_asks_for_is_refused_and_nothing_lingers_in_a_jobs_context(
    pool: BrowserPool, site: tuple[str, Counter[str]]
) -> None:
    url = site[0] + PAGES["probe"]
    job = Job()
    opener = pb.Action(
        execute_javascript=pb.ExecuteJavascriptAction(
            script=f"return window.open({json.dumps(url)}) !== null"
        )
    )
    pause = pb.Action(wait=pb.WaitAction(duration=Duration(nanos=400_000_000)))
    got = await pool.render(url, pb.ScrapeOptions(actions=[opener, pause]), owner="acct", scope=job)
    # no window opens (pool.BOUND_LAUNCH_ARGS: window.open answers null)
    assert json.loads(got.action_results[0].javascript_return) is False
    cur = pool._current
    assert cur is not None
    entry = next(e for e in cur.contexts.values() if e.scope() is job)
    assert entry.context.pages == []  # neither the page nor its popup lingers


def kept_page(pool: BrowserPool, job: Job) -> list[object]:
    """The pages the job's context keeps between renders."""
    cur = pool._current
    assert cur is not None
    entry = next(e for e in cur.contexts.values() if e.scope() is job)
    return [k.page for k in entry.pages._kept]


def job_entry(pool: BrowserPool, job: Job) -> poolmod._Context:
    cur = pool._current
    assert cur is not None
    return next(e for e in cur.contexts.values() if e.scope() is job)


async def test_a_jobs_next_page_navigates_the_page_its_last_one_left(
    pool: BrowserPool, site: tuple[str, Counter[str]]
) -> None:
    root = site[0]
    job = Job()
    first = await pool.render(root + PAGES["app"], pb.ScrapeOptions(), owner="acct", scope=job)
    assert MARKERS["app"] in first.html.decode()
    [page] = kept_page(pool, job)
    # the job's next page is rendered in that very page: its own document, nothing left
    # of the one before
    late = pb.ScrapeOptions()
    late.wait_for.selector = "#late"
    second = await pool.render(root + PAGES["timer"], late, owner="acct", scope=job)
    html = second.html.decode()
    assert MARKERS["timer"] in html and MARKERS["app"] not in html
    assert second.final_url == root + PAGES["timer"]
    assert kept_page(pool, job) == [page]
    # another job never gets it: its context has its own
    other = Job()
    await pool.render(root + PAGES["static"], pb.ScrapeOptions(), owner="acct", scope=other)
    assert kept_page(pool, other) != [page] and kept_page(pool, job) == [page]
    # a render with actions opens its own page and closes it; the kept one stays
    await remember(pool, root + PAGES["probe"], "k", scope=job)
    assert kept_page(pool, job) == [page]
    # a failed render closes its page (and retires the context)
    missing = pb.ScrapeOptions()
    missing.wait_for.selector = "#never-there"
    entry = job_entry(pool, job)
    with pytest.raises(PageError):
        await pool.render(root + PAGES["static"], missing, owner="acct", scope=job)
    assert entry.broken and page.is_closed()  # type: ignore[attr-defined]


async def test_a_kept_page_closes_when_idle_after_its_last_use_or_once_crashed(
    pool: BrowserPool, site: tuple[str, Counter[str]]
) -> None:
    url = site[0] + PAGES["static"]
    job = Job()
    await pool.render(url, pb.ScrapeOptions(), owner="acct", scope=job)
    entry = job_entry(pool, job)
    [page] = kept_page(pool, job)
    entry.pages.idle = 60.0  # (the default is short for a busy machine's test)
    # at most ``uses`` renders a page
    entry.pages.uses = 3
    for _ in range(2):
        await pool.render(url, pb.ScrapeOptions(), owner="acct", scope=job)
    await until(lambda: page.is_closed(), "the page closed after its last use")  # type: ignore[attr-defined]
    assert kept_page(pool, job) == []
    # a page whose renderer died while it waited is never handed out
    await pool.render(url, pb.ScrapeOptions(), owner="acct", scope=job)
    [crashing] = kept_page(pool, job)
    cdp = await entry.context.new_cdp_session(crashing)
    crash = asyncio.ensure_future(cdp.send("Page.crash"))  # answers nothing: it crashed
    await until(lambda: entry.pages._kept[0].crashed, "the kept page's crash event")
    crash.cancel()
    with contextlib.suppress(BaseException):
        await crash
    again = await pool.render(url, pb.ScrapeOptions(), owner="acct", scope=job)
    assert b"<html" in again.html and not entry.broken
    [fresh] = kept_page(pool, job)
    assert fresh is not crashing
    # a kept page waits ``idle`` seconds for the job's next render, then closes
    entry.pages.idle = 0.2
    await pool.render(url, pb.ScrapeOptions(), owner="acct", scope=job)
    [idle] = kept_page(pool, job)
    await until(lambda: idle.is_closed(), "the idle page closed")  # type: ignore[attr-defined]
    assert kept_page(pool, job) == [] and len(entry.context.pages) == 0
