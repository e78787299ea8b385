"""The browser engine's rendering side (``engine.browser``: pool, render, actions) on a
real chromium-headless-shell against the local JavaScript site (``tests.jssite``).

One browser serves the module (``pool``); tests that need another configuration
(recycling, a kill) start their own. Every JS-only marker is first shown absent from a
plain HTTP GET of the same page, so a render that returned the raw HTML would fail.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import struct
import sys
import textwrap
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from google.protobuf.duration_pb2 import Duration

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.browser import actions
from pagesift.primary.engine.browser import pool as poolmod
from pagesift.primary.engine.browser.pool import BrowserPool, FairSlots, sweep_profiles
from pagesift.v1 import jobs_pb2 as pb
from tests.helpers import free_port, until
from tests.jssite import MARKERS, PAGES, SPA_PAGES, serve_js_site

EXE = "/usr/lib/chromium/chromium-headless-shell"
REPO = str(Path(__file__).resolve().parent.parent)
pytestmark = [
    pytest.mark.browser,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not os.access(EXE, os.X_OK), reason="chromium-headless-shell missing"),
]
CONFIG = ServerConfig(
    max_browser_pages=2,
    max_render_wait=5.0,
    max_actions_time=8.0,
    render_timeout=20.0,
    max_screenshot_height=2000,
)


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


@pytest.fixture
def root(site: tuple[str, Counter[str]]) -> str:
    return site[0]


def acts(*items: pb.Action) -> pb.ScrapeOptions:
    return pb.ScrapeOptions(actions=list(items))


def js(script: str) -> pb.Action:
    return pb.Action(execute_javascript=pb.ExecuteJavascriptAction(script=script))


def ms(n: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(n)
    return d


async def plain_get(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()


async def probe(pool: BrowserPool, url: str, script: str, **opts: object) -> object:
    got = await pool.render(url, acts(js(script)), owner="t", **opts)  # type: ignore[arg-type]
    return json.loads(got.action_results[0].javascript_return)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


# ------------------------------------------------------------------ what only a browser sees


async def test_js_inserted_content_is_in_the_render_and_absent_from_a_plain_get(
    pool: BrowserPool, root: str
) -> None:
    cases = {
        "fetch": pb.ScrapeOptions(wait_until=pb.WAIT_UNTIL_NETWORKIDLE),
        "timer": pb.ScrapeOptions(wait_for=pb.WaitFor(selector="#late")),
        "click": acts(pb.Action(click=pb.ClickAction(selector="#more"))),
        "app": pb.ScrapeOptions(),
        "noscript": pb.ScrapeOptions(),
        "links": pb.ScrapeOptions(),
    }
    for name, options in cases.items():
        url = root + PAGES[name]
        assert MARKERS[name] not in await plain_get(url), name
        got = await pool.render(url, options, owner="t")
        assert got.status == 200 and got.final_url == url
        assert MARKERS[name] in got.html.decode(), name
    assert "text/html" in got.headers["content-type"]


async def test_script_linked_pages_render_their_own_text(pool: BrowserPool, root: str) -> None:
    got = await pool.render(root + PAGES["links"], pb.ScrapeOptions(), owner="t")
    html = got.html.decode()
    for n in range(1, SPA_PAGES + 1):
        assert f'href="spa/{n}.html"' in html
        page = await pool.render(f"{root}spa/{n}.html", pb.ScrapeOptions(), owner="t")
        assert f"{MARKERS['spa']} {n}" in page.html.decode()
        assert f"{MARKERS['spa']} {n}" not in await plain_get(f"{root}spa/{n}.html")


async def test_timer_content_needs_a_selector_wait_not_networkidle(
    pool: BrowserPool, root: str
) -> None:
    idle = await pool.render(
        root + PAGES["timer"], pb.ScrapeOptions(wait_until=pb.WAIT_UNTIL_NETWORKIDLE), owner="t"
    )
    assert MARKERS["timer"] not in idle.html.decode()
    waited = await pool.render(
        root + PAGES["timer"], pb.ScrapeOptions(wait_for=pb.WaitFor(duration=ms(1500))), owner="t"
    )
    assert MARKERS["timer"] in waited.html.decode()


async def test_a_wait_for_leaves_no_element_handle_behind(pool: BrowserPool, root: str) -> None:
    # the wait goes through a locator that returns nothing: ``wait_for_selector`` would
    # hand back an element adopted into the page (DevTools calls, a handle the page
    # holds: about a quarter more CPU a render, issue 30)
    class Job:
        """A job's page is kept after its render: a handle would stay with it."""

    job = Job()
    late = pb.ScrapeOptions()
    late.wait_for.selector = "#late"
    got = await pool.render(root + PAGES["timer"], late, owner="t", scope=job)
    assert MARKERS["timer"] in got.html.decode()
    assert pool._playwright is not None
    objects = pool._playwright._impl_obj._connection._objects.values()
    assert [o for o in objects if type(o).__name__ == "ElementHandle"] == []


async def test_infinite_scroll_until_end_loads_every_batch(pool: BrowserPool, root: str) -> None:
    url = root + PAGES["scroll"]
    assert "Scrolled item 21" not in await plain_get(url)
    once = await pool.render(url, pb.ScrapeOptions(), owner="t")
    assert "Scrolled item 20" in once.html.decode()
    assert MARKERS["scroll"] not in once.html.decode()
    scroll = pb.Action(scroll=pb.ScrollAction(until_end=True, max_steps=20))
    got = await pool.render(url, acts(scroll), owner="t")
    assert MARKERS["scroll"] in got.html.decode() and 'id="end"' in got.html.decode()
    two = pb.Action(scroll=pb.ScrollAction(until_end=True, max_steps=2))
    bounded = (await pool.render(url, acts(two), owner="t")).html.decode()
    assert "Scrolled item 60" in bounded and "Scrolled item 61" not in bounded


async def test_images_media_and_fonts_are_not_downloaded_unless_a_screenshot_needs_them(
    pool: BrowserPool, site: tuple[str, Counter[str]]
) -> None:
    root, hits = site
    await pool.render(root + PAGES["image"], pb.ScrapeOptions(), owner="t")
    assert hits["image.html"] >= 1 and hits["img.png"] == 0 and hits["font.woff2"] == 0
    shot = pb.ScrapeOptions(formats=[pb.FORMAT_SCREENSHOT])
    await pool.render(root + PAGES["image"], shot, owner="t")
    assert hits["img.png"] == 1


# ------------------------------------------------------------------ actions


async def test_each_action_kind_acts_on_the_page(pool: BrowserPool, root: str) -> None:
    options = acts(
        pb.Action(wait=pb.WaitAction(duration=ms(50))),
        pb.Action(wait=pb.WaitAction(selector="#q")),
        pb.Action(click=pb.ClickAction(selector="#q")),
        pb.Action(write=pb.WriteAction(text="hello world")),
        pb.Action(press=pb.PressAction(key="Enter")),
        js(
            "return [document.getElementById('out').textContent,"
            " document.getElementById('keys').textContent]"
        ),
        pb.Action(screenshot=pb.ScreenshotOptions()),
    )
    got = await pool.render(root + PAGES["form"], options, owner="t")
    assert json.loads(got.action_results[0].javascript_return) == [
        "typed:hello world",
        "pressed:Enter",
    ]
    assert got.action_results[0].index == 5
    assert got.action_results[1].index == 6
    assert png_size(got.action_results[1].screenshot.data) == (1280, 800)
    down = pb.Action(scroll=pb.ScrollAction())
    up = pb.Action(scroll=pb.ScrollAction(direction=pb.SCROLL_DIRECTION_UP))
    y = "return window.scrollY"
    got = await pool.render(root + PAGES["tall"], acts(down, js(y), down, up, js(y)), owner="t")
    assert [json.loads(r.javascript_return) for r in got.action_results] == [800, 800]


async def test_a_failing_action_names_its_index_and_step(pool: BrowserPool, root: str) -> None:
    options = acts(
        pb.Action(wait=pb.WaitAction(duration=ms(10))),
        pb.Action(press=pb.PressAction(key="Tab")),
        pb.Action(click=pb.ClickAction(selector="#missing")),
    )
    bounds = pool.bounds
    pool.bounds = dataclasses.replace(bounds, max_actions_time=1.5)
    try:
        with pytest.raises(PageError) as err:
            await pool.render(root + PAGES["probe"], options, owner="t")
    finally:
        pool.bounds = bounds
    assert err.value.code == ErrorCode.ACTION_FAILED
    assert err.value.message.startswith("action 2 (click '#missing')")
    for script, why in (
        ("return () => 1", "not JSON"),
        ("return 10n", "BigInt"),
        ("return 'x'.repeat(70000)", "64 KiB"),
        ("throw new Error('boom')", "boom"),
    ):
        with pytest.raises(PageError) as err:
            await pool.render(root + PAGES["probe"], acts(js("return 1"), js(script)), owner="t")
        assert err.value.code == ErrorCode.ACTION_FAILED
        assert err.value.message.startswith("action 1 (execute_javascript)"), script
        assert why in err.value.message, (script, err.value.message)
    assert await probe(pool, root + PAGES["probe"], "return {a: [1, 'b', null, 7 % 4]}") == {
        "a": [1, "b", None, 3]
    }
    fake = "JSON.stringify = () => '{broken'; return 1"
    with pytest.raises(PageError, match=r"action 0 \(execute_javascript\)"):
        await pool.render(root + PAGES["probe"], acts(js(fake)), owner="t")


async def test_the_actions_share_one_time_budget(pool: BrowserPool, root: str) -> None:
    pause = pb.Action(wait=pb.WaitAction(duration=ms(600)))
    bounds = pool.bounds
    pool.bounds = dataclasses.replace(bounds, max_actions_time=1.0)
    started = time.monotonic()
    try:
        with pytest.raises(PageError) as err:
            await pool.render(root + PAGES["probe"], acts(pause, pause, pause), owner="t")
    finally:
        pool.bounds = bounds
    assert err.value.code == ErrorCode.ACTION_FAILED
    assert err.value.message.startswith("action 1 (wait 0.6 s)")
    assert "max_actions_time" in err.value.message
    assert time.monotonic() - started < 8  # a generous bound: a loaded box renders slowly


async def test_plan_refuses_waits_and_actions_beyond_the_servers_bounds() -> None:
    bounds = actions.Bounds.of(CONFIG)
    long = pb.Action(wait=pb.WaitAction(duration=ms(6000)))
    ok = pb.Action(wait=pb.WaitAction(duration=ms(10)))
    with pytest.raises(PageError, match=r"action 1 \(wait\): 6 s outside"):
        actions.plan(acts(ok, long), bounds)
    with pytest.raises(PageError, match="wait_for"):
        actions.plan(pb.ScrapeOptions(wait_for=pb.WaitFor(duration=ms(9000))), bounds)
    with pytest.raises(PageError, match="51 actions"):
        actions.plan(acts(*[ok] * 51), bounds)
    png_quality = pb.ScrapeOptions(
        formats=[pb.FORMAT_SCREENSHOT], screenshot=pb.ScreenshotOptions(quality=50)
    )
    with pytest.raises(PageError, match="JPEG only"):
        actions.plan(png_quality, bounds)
    plan = actions.plan(
        pb.ScrapeOptions(
            formats=[pb.FORMAT_SCREENSHOT],
            screenshot=pb.ScreenshotOptions(full_page=True, format=pb.IMAGE_FORMAT_JPEG),
        ),
        bounds,
    )
    assert plan.shot == actions.Shot(True, True, 80, CONFIG.max_screenshot_height)


# ------------------------------------------------------------------ screenshots


async def test_screenshots_png_and_jpeg_viewport_and_full_page_cut(
    pool: BrowserPool, root: str
) -> None:
    def shot(**kw: object) -> pb.ScrapeOptions:
        return pb.ScrapeOptions(
            formats=[pb.FORMAT_SCREENSHOT],
            screenshot=pb.ScreenshotOptions(**kw),  # type: ignore[arg-type]
        )

    got = await pool.render(root + PAGES["tall"], shot(), owner="t")
    assert got.screenshot is not None and got.screenshot.content_type == "image/png"
    assert (
        png_size(got.screenshot.data)
        == (1280, 800)
        == (got.screenshot.width, got.screenshot.height)
    )
    jpeg = await pool.render(
        root + PAGES["tall"], shot(format=pb.IMAGE_FORMAT_JPEG, quality=30), owner="t"
    )
    assert jpeg.screenshot is not None and jpeg.screenshot.data[:3] == b"\xff\xd8\xff"
    assert actions.image_size(jpeg.screenshot.data) == (1280, 800)
    assert (jpeg.screenshot.width, jpeg.screenshot.height) == (1280, 800)
    assert jpeg.screenshot.content_type == "image/jpeg"
    assert len(jpeg.screenshot.data) < len(got.screenshot.data)
    full = await pool.render(root + PAGES["tall"], shot(full_page=True, max_height=1500), owner="t")
    assert full.screenshot is not None and png_size(full.screenshot.data) == (1280, 1500)
    capped = await pool.render(root + PAGES["tall"], shot(full_page=True), owner="t")
    assert capped.screenshot is not None
    assert png_size(capped.screenshot.data)[1] == CONFIG.max_screenshot_height


async def test_a_screenshot_over_max_bytes_is_refused_too_large(
    pool: BrowserPool, root: str
) -> None:
    bounds = pool.bounds
    pool.bounds = dataclasses.replace(bounds, max_screenshot_bytes=2000)
    try:
        with pytest.raises(PageError) as err:
            await pool.render(
                root + PAGES["tall"], pb.ScrapeOptions(formats=[pb.FORMAT_SCREENSHOT]), owner="t"
            )
    finally:
        pool.bounds = bounds
    assert err.value.code == ErrorCode.TOO_LARGE and "at most 2000" in err.value.message


# ------------------------------------------------------------------ emulation and isolation


async def test_mobile_viewport_locale_and_timezone_are_what_the_page_sees(
    pool: BrowserPool, root: str
) -> None:
    script = (
        "return [window.innerWidth, window.innerHeight, window.devicePixelRatio,"
        " navigator.maxTouchPoints > 0, /Mobile/.test(navigator.userAgent)]"
    )
    url = root + PAGES["probe"]
    mobile = await pool.render(url, pb.ScrapeOptions(mobile=True, actions=[js(script)]), owner="t")
    assert json.loads(mobile.action_results[0].javascript_return) == [390, 844, 3, True, True]
    phone = pb.ScrapeOptions(mobile=True, formats=[pb.FORMAT_SCREENSHOT])
    shot = (await pool.render(url, phone, owner="t")).screenshot
    assert shot is not None and png_size(shot.data) == (1170, 2532) == (shot.width, shot.height)
    desk = await probe(pool, url, script)
    assert desk == [1280, 800, 1, False, False]
    sized = pb.ScrapeOptions(viewport=pb.Viewport(width=600, height=400), actions=[js(script)])
    got = await pool.render(url, sized, owner="t", user_agent="pagesift-test/1")
    assert json.loads(got.action_results[0].javascript_return)[:2] == [600, 400]
    where = pb.ScrapeOptions(
        locale="fr-FR",
        timezone="Europe/Paris",
        actions=[js("return [navigator.language,"
                    " Intl.DateTimeFormat().resolvedOptions().timeZone, navigator.userAgent]")],
    )  # fmt: skip
    got = await pool.render(url, where, owner="t", user_agent="pagesift-test/1")
    assert json.loads(got.action_results[0].javascript_return) == [
        "fr-FR",
        "Europe/Paris",
        "pagesift-test/1",
    ]


async def test_two_renders_never_share_cookies_or_storage_and_cookies_flow_both_ways(
    pool: BrowserPool, root: str
) -> None:
    wrote = await pool.render(root + PAGES["setstate"], pb.ScrapeOptions(), owner="a")
    assert {(c["name"], c["value"]) for c in wrote.cookies} == {("session", "abc123")}
    read = await pool.render(root + PAGES["readstate"], pb.ScrapeOptions(), owner="a")
    assert '<p id="state">cookie=;storage=</p>' in read.html.decode()
    both = await asyncio.gather(
        pool.render(root + PAGES["setstate"], pb.ScrapeOptions(), owner="a"),
        pool.render(root + PAGES["readstate"], pb.ScrapeOptions(), owner="b"),
    )
    assert '<p id="state">cookie=;storage=</p>' in both[1].html.decode()
    jar = [{"name": "session", "value": "fromjar", "url": root}]
    seeded = await pool.render(
        root + PAGES["readstate"], pb.ScrapeOptions(), owner="a", cookies=jar
    )
    assert '<p id="state">cookie=session=fromjar;storage=</p>' in seeded.html.decode()


# ------------------------------------------------------------------ the pool's life


async def test_sigkill_of_the_browser_mid_render_fails_fast_and_the_next_render_relaunches(
    pool: BrowserPool, root: str
) -> None:
    await pool.render(root + PAGES["probe"], pb.ScrapeOptions(), owner="t")
    pid = pool.browser_pid()
    assert pid is not None
    restarts = pool.stats()["restarts"]
    task = asyncio.create_task(
        pool.render(root + "slow.html?delay=10", pb.ScrapeOptions(), owner="t")
    )
    await until(lambda: pool.stats()["in_use"] == 1, "the slow render in flight")
    await asyncio.sleep(0.3)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(PageError) as err:
        await asyncio.wait_for(task, 10)
    assert time.monotonic() - killed < 8  # at the kill, not after the page's 10 s
    assert err.value.code == ErrorCode.RENDER_FAILED and err.value.worker_lost
    got = await pool.render(root + PAGES["app"], pb.ScrapeOptions(), owner="t")
    assert MARKERS["app"] in got.html.decode()
    assert pool.stats()["restarts"] == restarts + 1
    assert pool.browser_pid() not in (None, pid)


def renderers(browser: int) -> list[int]:
    found = []
    for pid in poolmod.descendants(browser, poolmod._proc_table()):
        try:
            if b"--type=renderer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


async def test_a_renderer_killed_mid_render_fails_the_page_retryably_and_the_browser_lives(
    pool: BrowserPool, root: str
) -> None:
    await pool.render(root + PAGES["probe"], pb.ScrapeOptions(), owner="t")
    browser, restarts = pool.browser_pid(), pool.stats()["restarts"]
    assert browser is not None
    pause = acts(pb.Action(wait=pb.WaitAction(duration=ms(3000))))
    for url, options in (
        (root + "slow.html?delay=5", pb.ScrapeOptions()),
        (root + PAGES["probe"], pause),
    ):
        task = asyncio.create_task(pool.render(url, options, owner="t"))
        await until(lambda: pool.stats()["in_use"] == 1, "a render in flight")
        await asyncio.sleep(0.8)
        for pid in renderers(browser):
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(PageError) as err:
            await asyncio.wait_for(task, 10)
        assert err.value.code == ErrorCode.RENDER_FAILED and err.value.worker_lost, url
        assert "renderer crashed" in err.value.message
    assert pool.browser_pid() == browser and pool.stats()["restarts"] == restarts
    got = await pool.render(root + PAGES["app"], pb.ScrapeOptions(), owner="t")
    assert MARKERS["app"] in got.html.decode()


async def test_a_render_past_its_timeout_fails_timeout_and_frees_its_slot(
    pool: BrowserPool, root: str
) -> None:
    started = time.monotonic()
    with pytest.raises(PageError) as err:
        await pool.render(root + "slow.html?delay=10", pb.ScrapeOptions(), owner="t", timeout=1.0)
    assert err.value.code == ErrorCode.TIMEOUT
    assert time.monotonic() - started < 8  # at its 1 s timeout, not after the page's 10 s
    assert pool.stats()["in_use"] == 0
    got = await pool.render(root + PAGES["app"], pb.ScrapeOptions(), owner="t")
    assert MARKERS["app"] in got.html.decode()


async def test_navigation_failures_map_to_the_http_engines_codes(
    pool: BrowserPool, root: str
) -> None:
    closed = free_port()
    with pytest.raises(PageError) as err:
        await pool.render(f"http://127.0.0.1:{closed}/", pb.ScrapeOptions(), owner="t")
    assert err.value.code == ErrorCode.CONNECT and "ERR_CONNECTION_REFUSED" in err.value.message
    missing = await pool.render(root + "nowhere.html", pb.ScrapeOptions(), owner="t")
    assert missing.status == 404 and b"not found" in missing.html


async def test_rendered_html_over_max_body_bytes_is_refused_in_the_page(
    pool: BrowserPool, root: str
) -> None:
    grow = js("document.body.append('x'.repeat(300000)); return 1")
    config = pool.config
    pool.config = dataclasses.replace(config, max_body_bytes=200_000)
    try:
        small = await pool.render(root + PAGES["probe"], pb.ScrapeOptions(), owner="t")
        assert small.html.startswith(b"<!DOCTYPE html><html>")
        with pytest.raises(PageError) as err:
            await pool.render(root + PAGES["probe"], acts(grow), owner="t")
    finally:
        pool.config = config
    assert err.value.code == ErrorCode.TOO_LARGE and "at most 200000 bytes" in err.value.message


async def test_the_browser_is_replaced_after_browser_recycle_pages(root: str) -> None:
    p = BrowserPool(dataclasses.replace(CONFIG, browser_recycle_pages=2))
    try:
        pids = []
        for _ in range(3):
            await p.render(root + PAGES["probe"], pb.ScrapeOptions(), owner="t")
            pids.append(p.browser_pid())
        assert p.stats()["launches"] == 2 and p.stats()["restarts"] == 0
        first = next(pid for pid in pids if pid is not None)
        await until(lambda: not Path(f"/proc/{first}").exists(), "the first browser gone", 10)
    finally:
        await p.close()


async def test_the_browser_is_replaced_past_its_memory_limit(root: str) -> None:
    p = BrowserPool(dataclasses.replace(CONFIG, browser_memory_limit=1 << 20))
    try:
        for _ in range(2):
            await p.render(root + PAGES["probe"], pb.ScrapeOptions(), owner="t")
        assert p.stats()["launches"] == 2 and p.stats()["restarts"] == 0
    finally:
        await p.close()


async def test_a_browsers_pss_counts_its_whole_process_tree(pool: BrowserPool, root: str) -> None:
    await pool.render(root + PAGES["probe"], pb.ScrapeOptions(), owner="t")
    pid = pool.browser_pid()
    assert pid is not None
    table = poolmod._proc_table()
    tree = poolmod.descendants(pid, table)
    assert len(tree) >= 2  # the browser and its renderers
    one = poolmod.tree_pss(max(tree - {pid}))
    whole = poolmod.tree_pss(pid)
    assert 20 << 20 < whole < CONFIG.browser_memory_limit and 0 < one < whole


async def test_one_accounts_queue_does_not_hold_another_accounts_page_beyond_one_slot(
    pool: BrowserPool, root: str
) -> None:
    order: list[str] = []

    async def one(owner: str, delay: float) -> None:
        await pool.render(f"{root}slow.html?delay={delay}", pb.ScrapeOptions(), owner=owner)
        order.append(owner)

    heavy = [asyncio.create_task(one("a", 0.6)) for _ in range(6)]
    await until(lambda: pool.slots.waiting == 4, "account a's queue")
    light = asyncio.create_task(one("b", 0.1))
    await asyncio.wait_for(asyncio.gather(light, *heavy), 20)
    assert order.index("b") <= 2, order  # after at most one of a's slots frees
    most = 0

    async def sample() -> None:
        nonlocal most
        while True:
            most = max(most, pool.slots.in_use.get("c", 0))
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    limited = [
        pool.render(f"{root}slow.html?delay=0.3", pb.ScrapeOptions(), owner="c", owner_limit=1)
        for _ in range(3)
    ]
    await asyncio.wait_for(asyncio.gather(*limited), 20)
    sampler.cancel()
    assert most == 1


async def test_fair_slots_grant_the_least_served_owner_and_hold_owner_limits() -> None:
    slots = FairSlots(2)
    await slots.acquire("a")
    await slots.acquire("a")
    waits = [asyncio.create_task(slots.acquire("a")) for _ in range(3)]
    b = asyncio.create_task(slots.acquire("b"))
    await asyncio.sleep(0)
    slots.release("a")
    await asyncio.sleep(0)
    assert b.done() and not any(w.done() for w in waits)
    assert slots.in_use == {"a": 1, "b": 1}
    limited = FairSlots(3)
    await limited.acquire("c", 1)
    second = asyncio.create_task(limited.acquire("c", 1))
    await asyncio.sleep(0)
    assert not second.done() and limited.used == 1
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    assert limited.waiting == 0
    limited.release("c")
    await asyncio.wait_for(limited.acquire("c", 1), 1)
    for w in waits:
        w.cancel()
    await asyncio.gather(*waits, return_exceptions=True)


async def test_availability_names_why_rendering_is_off() -> None:
    off = BrowserPool(dataclasses.replace(CONFIG, browser_executable="")).available()
    assert not off and "empty" in off.reason
    gone = BrowserPool(dataclasses.replace(CONFIG, browser_executable="/nonexistent/chrome"))
    assert not gone.available() and "/nonexistent/chrome" in gone.available().reason
    assert BrowserPool(CONFIG).available()
    assert poolmod.default_pages(2, 24 << 30) == 4
    assert poolmod.default_pages(8, 1 << 30) == 4
    assert poolmod.default_pages(1, 100 << 20) == 1


async def test_leftover_profile_folders_are_swept_but_not_a_running_browsers(
    pool: BrowserPool, root: str, tmp_path: Path
) -> None:
    await pool.render(root + PAGES["probe"], pb.ScrapeOptions(), owner="t")
    live = poolmod._live_profiles()
    assert live
    for name in [*live, "playwright_chromiumdev_profile-stale1", "other-dir"]:
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (time.time() - 600, time.time() - 600))
    (tmp_path / "playwright_chromiumdev_profile-young").mkdir()
    removed = sweep_profiles(str(tmp_path))
    assert removed == [str(tmp_path / "playwright_chromiumdev_profile-stale1")]
    assert set(os.listdir(tmp_path)) == {
        *live,
        "other-dir",
        "playwright_chromiumdev_profile-young",
    }


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pagesift.primary.engine.browser.pool import BrowserPool
    from pagesift.core.config.schema import ServerConfig
    from pagesift.v1 import jobs_pb2

    async def main():
        pool = BrowserPool(ServerConfig(max_browser_pages=1))
        task = asyncio.create_task(
            pool.render(sys.argv[1], jobs_pb2.ScrapeOptions(), owner="t"))
        while pool.stats()["in_use"] == 0 or pool.browser_pid() is None:
            await asyncio.sleep(0.05)
        print(pool.browser_pid(), flush=True)
        await task

    asyncio.run(main())
    """
)


@pytest.mark.system
async def test_sigkill_of_a_process_running_a_pool_leaves_no_browser_process(root: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        root + "slow.html?delay=30",
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    real = os.path.realpath(EXE)  # noqa: ASYNC240 (a symlink read)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        table = poolmod._proc_table()
        tree = poolmod.descendants(proc.pid, table)
        browsers = {pid for pid in tree if table.get(pid, (0, ""))[1] == real}
        assert int(line) in browsers
        below = {pid: table[pid][1] for pid in tree - {proc.pid}}  # the driver too
    finally:
        proc.kill()
        await asyncio.wait_for(proc.wait(), 10)

    def survivors() -> set[int]:
        table = poolmod._proc_table()
        return {pid for pid, exe in below.items() if table.get(pid, (0, ""))[1] == exe}

    await until(lambda: not survivors(), "every process below the killed node gone", 10)
