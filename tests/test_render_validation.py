"""The rendering options' validation (``pagesift.core.jobs.renderoptions``, run by
``pagesift.core.jobs.specs``): every bound of engine, waits, actions, emulation and
screenshots refused naming its field path; HTTP with a browser-only option is
INVALID_ARGUMENT; a node that cannot render answers FAILED_PRECONDITION
(RENDERING_UNAVAILABLE); execute_javascript only for accounts allowed to.

Pure tables first, then the spec calls (ordering of refusals), then a few over gRPC on
an in-process node with no browser (validation runs before any fetch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2

from pagesift.client.errors import details_of, status_of
from pagesift.core.api.rpcerrors import Reason
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import renderoptions
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.renderoptions import RenderingUnavailable
from pagesift.core.jobs.specs import Permissions, batch, crawl, scrape
from pagesift.core.jobs.validate import InvalidArgument, PermissionDenied
from pagesift.v1 import jobs_pb2
from tests.helpers import in_process_node

CONFIG = ServerConfig(allow_private_networks=True, max_render_wait=10.0)
NO_BROWSER = ServerConfig(allow_private_networks=True, browser_executable="")
PLAIN = Permissions(Account("plain"), can_sign_webhooks=True)
SCRIPTER = Permissions(Account("scripter", allow_execute_javascript=True), can_sign_webhooks=True)
URL = "http://127.0.0.1:9/"
Opts = jobs_pb2.ScrapeOptions
A = jobs_pb2.Action


def ms(n: int) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(n)
    return d


def fields(opts: jobs_pb2.ScrapeOptions, config: ServerConfig = CONFIG) -> list[str]:
    """The field paths ``rendering.check`` refuses in ``opts`` ([] when it accepts)."""
    try:
        renderoptions.check(opts, config)
    except InvalidArgument as e:
        return [f for f, _ in e.violations]
    return []


def shot(**kw: Any) -> jobs_pb2.ScreenshotOptions:
    return jobs_pb2.ScreenshotOptions(**kw)


SCREENSHOT = [jobs_pb2.FORMAT_SCREENSHOT]
JPEG = jobs_pb2.IMAGE_FORMAT_JPEG

# (options, the fields refused) — every row one rule
TABLE: list[tuple[str, jobs_pb2.ScrapeOptions, list[str]]] = [
    ("defaults", Opts(), []),
    ("every browser option, valid", Opts(
        engine=jobs_pb2.FETCH_ENGINE_BROWSER,
        wait_for=jobs_pb2.WaitFor(selector="#app > li"),
        wait_until=jobs_pb2.WAIT_UNTIL_NETWORKIDLE,
        actions=[
            A(wait=jobs_pb2.WaitAction(duration=ms(500))),
            A(click=jobs_pb2.ClickAction(selector="button.more")),
            A(write=jobs_pb2.WriteAction(text="hello\nworld")),
            A(press=jobs_pb2.PressAction(key="Control+A")),
            A(scroll=jobs_pb2.ScrollAction(until_end=True, max_steps=100)),
            A(execute_javascript=jobs_pb2.ExecuteJavascriptAction(script="return 1")),
            A(screenshot=shot(full_page=True, format=JPEG, quality=100, max_height=16384)),
        ],
        viewport=jobs_pb2.Viewport(width=100, height=4096), mobile=True,
        locale="zh-Hant-TW", timezone="Europe/Paris", formats=SCREENSHOT,
        screenshot=shot(format=JPEG, quality=1),
    ), []),
    ("unknown engine", Opts(engine=cast(Any, 9)), ["options.engine"]),
    ("unknown wait_until", Opts(wait_until=cast(Any, 7)), ["options.wait_until"]),
    ("HTTP and every browser option", Opts(
        engine=jobs_pb2.FETCH_ENGINE_HTTP, wait_for=jobs_pb2.WaitFor(duration=ms(1)),
        wait_until=jobs_pb2.WAIT_UNTIL_LOAD, actions=[A(press=jobs_pb2.PressAction(key="a"))],
        formats=[jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_SCREENSHOT],
        viewport=jobs_pb2.Viewport(), mobile=True, locale="fr", timezone="UTC",
        screenshot=shot(),
    ), ["options.wait_for", "options.wait_until", "options.actions", "options.formats[1]",
        "options.viewport", "options.mobile", "options.locale", "options.timezone",
        "options.screenshot"]),
    ("HTTP alone", Opts(engine=jobs_pb2.FETCH_ENGINE_HTTP), []),
    ("wait_for empty", Opts(wait_for=jobs_pb2.WaitFor()), ["options.wait_for"]),
    ("wait_for past max_render_wait", Opts(wait_for=jobs_pb2.WaitFor(duration=ms(10_001))),
     ["options.wait_for.duration"]),
    ("wait_for at max_render_wait", Opts(wait_for=jobs_pb2.WaitFor(duration=ms(10_000))), []),
    ("wait_for zero", Opts(wait_for=jobs_pb2.WaitFor(duration=ms(0))),
     ["options.wait_for.duration"]),
    ("wait_for blank selector", Opts(wait_for=jobs_pb2.WaitFor(selector="  ")),
     ["options.wait_for.selector"]),
    ("wait_for long selector", Opts(wait_for=jobs_pb2.WaitFor(selector="a" * 1025)),
     ["options.wait_for.selector"]),
    ("wait_for selector of 1024", Opts(wait_for=jobs_pb2.WaitFor(selector="a" * 1024)), []),
    ("wait_for NUL", Opts(wait_for=jobs_pb2.WaitFor(selector="a\x00")),
     ["options.wait_for.selector"]),
    ("51 actions", Opts(actions=[A(press=jobs_pb2.PressAction(key="a"))] * 51),
     ["options.actions"]),
    ("50 actions", Opts(actions=[A(press=jobs_pb2.PressAction(key="a"))] * 50), []),
    ("an empty action", Opts(actions=[A()]), ["options.actions[0]"]),
    ("a wait with nothing", Opts(actions=[A(wait=jobs_pb2.WaitAction())]),
     ["options.actions[0].wait"]),
    ("a wait too long", Opts(actions=[A(wait=jobs_pb2.WaitAction(duration=ms(60_000)))]),
     ["options.actions[0].wait.duration"]),
    ("a bad click at index 3", Opts(actions=[
        A(press=jobs_pb2.PressAction(key="a")), A(press=jobs_pb2.PressAction(key="b")),
        A(click=jobs_pb2.ClickAction(selector="ok")), A(click=jobs_pb2.ClickAction()),
    ]), ["options.actions[3].click.selector"]),
    ("write of 10,001", Opts(actions=[A(write=jobs_pb2.WriteAction(text="x" * 10_001))]),
     ["options.actions[0].write.text"]),
    ("write of 10,000", Opts(actions=[A(write=jobs_pb2.WriteAction(text="x" * 10_000))]), []),
    ("write nothing", Opts(actions=[A(write=jobs_pb2.WriteAction())]),
     ["options.actions[0].write.text"]),
    ("press nothing", Opts(actions=[A(press=jobs_pb2.PressAction())]),
     ["options.actions[0].press.key"]),
    ("press 65", Opts(actions=[A(press=jobs_pb2.PressAction(key="k" * 65))]),
     ["options.actions[0].press.key"]),
    ("press a control", Opts(actions=[A(press=jobs_pb2.PressAction(key="\n"))]),
     ["options.actions[0].press.key"]),
    ("scroll 101 steps",
     Opts(actions=[A(scroll=jobs_pb2.ScrollAction(until_end=True, max_steps=101))]),
     ["options.actions[0].scroll.max_steps"]),
    ("scroll -1 steps",
     Opts(actions=[A(scroll=jobs_pb2.ScrollAction(until_end=True, max_steps=-1))]),
     ["options.actions[0].scroll.max_steps"]),
    ("steps without until_end", Opts(actions=[A(scroll=jobs_pb2.ScrollAction(max_steps=3))]),
     ["options.actions[0].scroll.max_steps"]),
    ("until_end up", Opts(actions=[A(scroll=jobs_pb2.ScrollAction(
        direction=jobs_pb2.SCROLL_DIRECTION_UP, until_end=True))]),
     ["options.actions[0].scroll.until_end"]),
    ("scroll unknown direction",
     Opts(actions=[A(scroll=jobs_pb2.ScrollAction(direction=cast(Any, 5)))]),
     ["options.actions[0].scroll.direction"]),
    ("script of 64 KiB + 1", Opts(actions=[A(execute_javascript=jobs_pb2.ExecuteJavascriptAction(
        script="x" * (64 * 1024 + 1)))]), ["options.actions[0].execute_javascript.script"]),
    ("script of 64 KiB", Opts(actions=[A(execute_javascript=jobs_pb2.ExecuteJavascriptAction(
        script="é" * (32 * 1024)))]), []),
    ("empty script", Opts(actions=[A(execute_javascript=jobs_pb2.ExecuteJavascriptAction())]),
     ["options.actions[0].execute_javascript.script"]),
    ("PNG with a quality", Opts(formats=SCREENSHOT, screenshot=shot(quality=80)),
     ["options.screenshot.quality"]),
    ("JPEG quality 101", Opts(formats=SCREENSHOT, screenshot=shot(format=JPEG, quality=101)),
     ["options.screenshot.quality"]),
    ("an action's screenshot quality with PNG", Opts(actions=[A(screenshot=shot(quality=5))]),
     ["options.actions[0].screenshot.quality"]),
    ("unknown image format", Opts(formats=SCREENSHOT, screenshot=shot(format=3)),
     ["options.screenshot.format"]),
    ("max_height past the server's", Opts(formats=SCREENSHOT, screenshot=shot(
        full_page=True, max_height=16385)), ["options.screenshot.max_height"]),
    ("max_height without full_page", Opts(formats=SCREENSHOT, screenshot=shot(max_height=500)),
     ["options.screenshot.max_height"]),
    ("screenshot options without the format", Opts(screenshot=shot(full_page=True)),
     ["options.screenshot"]),
    ("viewport 99 wide", Opts(viewport=jobs_pb2.Viewport(width=99)), ["options.viewport.width"]),
    ("viewport 4097 high", Opts(viewport=jobs_pb2.Viewport(width=0, height=4097)),
     ["options.viewport.height"]),
    ("locale not a tag", Opts(locale="fr_FR"), ["options.locale"]),
    ("locale too long", Opts(locale="en-" + "-".join(["abcdefgh"] * 4)), ["options.locale"]),
    ("timezone unknown", Opts(timezone="Mars/Olympus"), ["options.timezone"]),
    ("several at once, in order", Opts(
        wait_for=jobs_pb2.WaitFor(selector=""), actions=[A()], locale="!", timezone="x",
    ), ["options.wait_for.selector", "options.actions[0]", "options.locale", "options.timezone"]),
]  # fmt: skip


@pytest.mark.parametrize(("opts", "refused"), [r[1:] for r in TABLE], ids=[r[0] for r in TABLE])
def test_each_rendering_rule_names_the_field_it_refuses(
    opts: jobs_pb2.ScrapeOptions, refused: list[str]
) -> None:
    assert fields(opts) == refused


def test_max_height_follows_the_servers_max_screenshot_height() -> None:
    opts = Opts(formats=SCREENSHOT, screenshot=shot(full_page=True, max_height=2000))
    assert fields(opts) == []
    small = ServerConfig(max_screenshot_height=1000)
    assert fields(opts, small) == ["options.screenshot.max_height"]


def test_the_time_zone_list_is_read_once() -> None:
    assert renderoptions.time_zones() is renderoptions.time_zones()
    assert "Asia/Tokyo" in renderoptions.time_zones()


def test_browser_fields_list_what_only_a_browser_honours() -> None:
    assert renderoptions.browser_fields(Opts(formats=[jobs_pb2.FORMAT_MARKDOWN])) == []
    assert renderoptions.browser_fields(Opts(mobile=True, formats=SCREENSHOT), "x") == [
        "x.formats[0]",
        "x.mobile",
    ]


def test_a_node_that_cannot_render_refuses_what_needs_a_browser_only() -> None:
    def refused(opts: jobs_pb2.ScrapeOptions, renders: bool) -> str | None:
        r = renderoptions.unavailable(opts, renders)
        return None if r is None else r.field

    browser = Opts(engine=jobs_pb2.FETCH_ENGINE_BROWSER)
    assert refused(browser, False) == "options.engine"
    assert refused(browser, True) is None
    assert refused(Opts(engine=jobs_pb2.FETCH_ENGINE_AUTO), False) is None  # AUTO falls to HTTP
    assert refused(Opts(), False) is None
    assert refused(Opts(locale="fr", mobile=True), False) == "options.mobile"
    assert refused(Opts(engine=jobs_pb2.FETCH_ENGINE_AUTO, formats=SCREENSHOT), False) == (
        "options.formats[0]"
    )
    # HTTP with a browser option is the request's own contradiction (check's, not this)
    assert refused(Opts(engine=jobs_pb2.FETCH_ENGINE_HTTP, mobile=True), False) is None


# ---------------------------------------------------------------- the spec calls


JS = Opts(actions=[A(execute_javascript=jobs_pb2.ExecuteJavascriptAction(script="return 1"))])


async def test_execute_javascript_needs_the_accounts_permission() -> None:
    req = jobs_pb2.ScrapeRequest(url=URL, options=JS)
    with pytest.raises(PermissionDenied) as info:
        await scrape(req, PLAIN, CONFIG)
    assert info.value.field == "options.actions[0].execute_javascript"
    assert "allow_execute_javascript" in info.value.reason
    spec = await scrape(req, SCRIPTER, CONFIG)
    assert spec.options.actions[0].execute_javascript.script == "return 1"


async def test_a_bad_field_outranks_the_permission_and_the_missing_browser() -> None:
    opts = Opts()
    opts.CopyFrom(JS)
    opts.actions.add(click=jobs_pb2.ClickAction())
    req = jobs_pb2.StartBatchScrapeRequest(urls=[URL], options=opts)
    with pytest.raises(InvalidArgument) as info:
        await batch(req, PLAIN, NO_BROWSER)
    assert [f for f, _ in info.value.violations] == ["options.actions[1].click.selector"]
    del opts.actions[1]
    with pytest.raises(PermissionDenied):  # the permission outranks the missing browser
        await batch(jobs_pb2.StartBatchScrapeRequest(urls=[URL], options=opts), PLAIN, NO_BROWSER)
    with pytest.raises(RenderingUnavailable) as unavailable:
        await batch(
            jobs_pb2.StartBatchScrapeRequest(urls=[URL], options=opts), SCRIPTER, NO_BROWSER
        )
    assert unavailable.value.field == "options.actions"


async def test_every_request_kind_checks_its_rendering_options_with_the_others() -> None:
    opts = Opts(engine=jobs_pb2.FETCH_ENGINE_HTTP, mobile=True)
    with pytest.raises(InvalidArgument) as info:
        await crawl(jobs_pb2.StartCrawlRequest(url=URL, delay=61, options=opts), PLAIN, CONFIG)
    assert [f for f, _ in info.value.violations] == ["delay", "options.mobile"]
    assert "needs a browser engine" in info.value.violations[1][1]
    with pytest.raises(InvalidArgument):
        await scrape(jobs_pb2.ScrapeRequest(url=URL, options=opts), PLAIN, CONFIG)


async def test_whether_the_node_renders_is_the_callers_flag_or_the_config() -> None:
    req = jobs_pb2.ScrapeRequest(url=URL, options=Opts(engine=jobs_pb2.FETCH_ENGINE_BROWSER))
    await scrape(req, PLAIN, CONFIG)  # browser_executable is set
    with pytest.raises(RenderingUnavailable):
        await scrape(req, PLAIN, NO_BROWSER)
    with pytest.raises(RenderingUnavailable):  # e.g. the node found no browser at start
        await scrape(req, PLAIN, CONFIG, renders=False)
    await scrape(req, PLAIN, NO_BROWSER, renders=True)
    crawl_req = jobs_pb2.StartCrawlRequest(
        url=URL, options=Opts(wait_until=jobs_pb2.WAIT_UNTIL_LOAD)
    )
    with pytest.raises(RenderingUnavailable) as info:
        await crawl(crawl_req, PLAIN, NO_BROWSER)
    assert info.value.field == "options.wait_until"


# ---------------------------------------------------------------- over gRPC


async def test_the_api_names_each_bad_action_and_refuses_rendering_on_a_node_without_a_browser(
    tmp_path: Path,
) -> None:
    async with in_process_node(tmp_path, browser_executable="") as node:
        bad = Opts(
            engine=jobs_pb2.FETCH_ENGINE_BROWSER,
            actions=[A(press=jobs_pb2.PressAction(key="a"))] * 3
            + [A(click=jobs_pb2.ClickAction(selector="x" * 2000))],
            timezone="Nowhere/Land",
        )
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.Scrape(jobs_pb2.ScrapeRequest(url=URL, options=bad))
        err: Any = e.value
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        status = status_of(err)
        (info,) = details_of(status, error_details_pb2.ErrorInfo)
        assert (info.reason, info.metadata["field"]) == (
            Reason.INVALID_FIELD,
            "options.actions[3].click.selector",
        )
        (request,) = details_of(status, error_details_pb2.BadRequest)
        assert [v.field for v in request.field_violations] == [
            "options.actions[3].click.selector",
            "options.timezone",
        ]

        good = Opts(engine=jobs_pb2.FETCH_ENGINE_BROWSER, wait_for=jobs_pb2.WaitFor(selector="#a"))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=URL, options=good))
        err = e.value
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.details().startswith("options.engine: needs a browser engine")
        (info,) = details_of(status_of(err), error_details_pb2.ErrorInfo)
        assert (info.reason, info.metadata["field"]) == (
            Reason.RENDERING_UNAVAILABLE,
            "options.engine",
        )

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(urls=[URL], options=JS)
            )
        err = e.value
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        (info,) = details_of(status_of(err), error_details_pb2.ErrorInfo)
        assert info.metadata["field"] == "options.actions[0].execute_javascript"
        assert list(node.node.store().replicated_items()) == []  # nothing was written


async def test_a_node_whose_configured_browser_is_missing_refuses_what_needs_one(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "no-such-browser")
    async with in_process_node(tmp_path, browser_executable=missing) as node:
        assert not node.node.can_render
        opts = Opts(engine=jobs_pb2.FETCH_ENGINE_BROWSER)
        for call in (
            node.stub.Scrape(jobs_pb2.ScrapeRequest(url=URL, options=opts)),
            node.stub.StartBatchScrape(jobs_pb2.StartBatchScrapeRequest(urls=[URL], options=opts)),
            node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=URL, options=opts)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            err: Any = e.value
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            (info,) = details_of(status_of(err), error_details_pb2.ErrorInfo)
            assert info.reason == Reason.RENDERING_UNAVAILABLE
        assert list(node.node.store().replicated_items()) == []
