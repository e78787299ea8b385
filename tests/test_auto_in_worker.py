"""The HTML page path does its work once. AUTO's decision runs in the extraction
worker, fused with the page's extraction (``pages.PageMaker.page(judge_render=True)``,
``autorender.judge_and_extract``): one worker call per page, nothing judged on the
event loop, and a page that needs a browser is not extracted. The body is decoded once
on the loop (the meta-refresh check's text is the page's)."""

from __future__ import annotations

import asyncio

import pytest

from pagesift.core.config.schema import ServerConfig
from pagesift.primary.engine import autorender
from pagesift.primary.engine.hops import Response
from pagesift.primary.engine.pages import PageMaker, RenderNeeded
from pagesift.v1 import jobs_pb2

APP_SHELL = (
    b"<!doctype html><html><head><title>App</title><script src='/main.js'></script></head>"
    b"<body><noscript>You need to enable JavaScript to run this app.</noscript>"
    b"<div id='root'></div></body></html>"
)
ARTICLE = (
    b"<html><head><title>Guide</title><script src='/nav.js'></script></head><body><h1>Guide</h1>"
    + b"<p>Every option of the tool is explained here in plain words.</p>" * 40
    + b"<a href='/next'>Next</a></body></html>"
)


def _response(body: bytes) -> Response:
    return Response(
        url="http://127.0.0.1:9/page",
        status=200,
        content_type="text/html; charset=utf-8",
        mimetype="text/html",
        charset="utf-8",
        kind="html",
        body=body,
    )


async def _page(maker: PageMaker, body: bytes, judge: bool) -> jobs_pb2.Document:
    page = await maker.page(
        "http://127.0.0.1:9/page",
        _response(body),
        "html",
        jobs_pb2.ScrapeOptions(),
        "pagesift",
        judge_render=judge,
    )
    return page.document


def _no_decision_here(body: bytes | str, content_type: str = "") -> str | None:
    raise AssertionError("AUTO's decision ran in the node's process")


@pytest.mark.parametrize("processes", [1, 0])
def test_a_page_that_needs_a_browser_is_judged_in_the_worker_and_not_extracted(
    monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    maker = PageMaker(ServerConfig(extract_processes=processes))
    if processes:  # the decision must not run here: the worker has its own import of it
        monkeypatch.setattr(autorender, "needs_render", _no_decision_here)

    async def go() -> None:
        try:
            with pytest.raises(RenderNeeded) as need:
                await _page(maker, APP_SHELL, judge=True)
            assert need.value.reason == "empty app root #root"
            doc = await _page(maker, ARTICLE, judge=True)
            assert doc.title == "Guide" and "plain words" in doc.markdown
            # without judge_render the shell is extracted like any page
            shell = await _page(maker, APP_SHELL, judge=False)
            assert shell.title == "App"
            if maker.workers is not None:
                assert maker.workers.started == 1  # one worker, one call per page
        finally:
            maker.close()

    asyncio.run(go())


def test_an_html_page_is_decoded_once_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The meta-refresh check's decode is the page's: the body is not decoded twice."""
    from aiohttp import web

    from pagesift.primary.engine import content
    from pagesift.primary.engine.http import HttpEngine
    from tests.helpers import serve_handler

    decoded: list[int] = []
    real = content.decode

    def counting(body: bytes, charset: str | None, *, html: bool) -> str:
        decoded.append(len(body))
        return real(body, charset, html=html)

    monkeypatch.setattr(content, "decode", counting)

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=ARTICLE, content_type="text/html")

    async def go() -> None:
        async with serve_handler(page) as port:
            engine = HttpEngine(
                ServerConfig(allow_private_networks=True, respect_robots=False, extract_processes=0)
            )
            try:
                url = f"http://127.0.0.1:{port}/guide"
                got = await engine.scrape(url, jobs_pb2.ScrapeOptions())
            finally:
                await engine.close()
        assert got.document.title == "Guide"
        assert decoded == [len(ARTICLE)]

    asyncio.run(go())
