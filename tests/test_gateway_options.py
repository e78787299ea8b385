"""Firecrawl's scrape options the gateway maps, driven by Firecrawl's own SDK (firecrawl-py):
actions in a real headless browser, location as the languages a page is asked in, change
tracking across scrapes, refusals naming the field; and the node's structured key for a
URL its address guard refuses, read over gRPC.

A real gateway (``pagesift.gateway.server.run`` on a free loopback port) in front of a
real in-process node, scraping a small aiohttp site on 127.0.0.1 whose pages echo what
they were asked with. The SDK is synchronous, so its calls run in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from aiohttp import web
from firecrawl import Firecrawl
from firecrawl.v2.types import (
    ClickAction,
    ExecuteJavascriptAction,
    Location,
    ScreenshotAction,
    WaitAction,
    WriteAction,
)
from firecrawl.v2.utils.error_handler import BadRequestError
from google.rpc import error_details_pb2

from pagesift.client.aio import JobClient
from pagesift.client.errors import BLOCKED_ADDRESS, details_of, status_of
from pagesift.v1 import jobs_pb2
from tests.helpers import gateway_before, in_process_node, serve_handler

T = TypeVar("T")

FORM = """<html><head><title>Form</title></head><body>
<input id="q"><button id="go" onclick="var o = document.getElementById('out');
o.textContent = 'Searched for ' + document.getElementById('q').value; o.className = 'done'">
Go</button><p id="out">nothing yet</p></body></html>"""


class Site:
    """Pages that say what they were asked with: ``/lang`` the Accept-Language,
    ``/news`` whatever ``news`` holds now, ``/form`` a form a script fills in."""

    def __init__(self) -> None:
        self.news = "First headline"
        self.languages: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        if request.path == "/form":
            return web.Response(text=FORM, content_type="text/html")
        if request.path == "/lang":
            self.languages.append(request.headers.get("Accept-Language", ""))
            body = f"<p>Asked in {request.headers.get('Accept-Language', 'no language')}</p>"
        elif request.path == "/news":
            body = f"<h1>News</h1><p>{self.news}</p><p>Unchanged footer line</p>"
        else:
            raise web.HTTPNotFound()
        html = f"<html><head><title>Page</title></head><body>{body}</body></html>"
        return web.Response(text=html, content_type="text/html")


@contextlib.asynccontextmanager
async def rig(data: Path, **node_kw: Any) -> AsyncIterator[tuple[Firecrawl, Site, str]]:
    """The site, a node and a gateway in front of it: (SDK client, site, site root)."""
    site = Site()
    async with (
        serve_handler(site.handle) as port,
        in_process_node(data, **node_kw) as node,
        gateway_before([node.address]) as base,
    ):
        yield Firecrawl(api_key="anonymous", api_url=base), site, f"http://127.0.0.1:{port}"


async def sdk(call: Callable[..., T], *args: Any, **kw: Any) -> T:
    """Run one blocking SDK call off the loop, bounded."""
    return await asyncio.wait_for(asyncio.to_thread(call, *args, **kw), 60)


@pytest.mark.browser
async def test_sdk_actions_fill_a_form_run_javascript_and_screenshot_in_a_browser(
    tmp_path: Path,
) -> None:
    accounts = tmp_path / "accounts.toml"
    accounts.write_text("[anonymous]\nallow_execute_javascript = true\n")
    async with rig(tmp_path / "data", accounts_file=str(accounts)) as (fc, _, root):
        doc = await sdk(
            fc.scrape,
            root + "/form",
            formats=["markdown"],
            actions=[
                ClickAction(selector="#q"),
                WriteAction(text="pagesift"),
                ClickAction(selector="#go"),
                WaitAction(selector="#out.done"),
                ExecuteJavascriptAction(script="return document.getElementById('out').textContent"),
                ScreenshotAction(quality=50),
            ],
        )
        with pytest.raises(BadRequestError) as err:  # no pdf step in pagesift: by index
            await sdk(fc.scrape, root + "/form", actions=[WaitAction(milliseconds=10),
                                                           {"type": "pdf"}])  # fmt: skip
    assert doc.markdown and "Searched for pagesift" in doc.markdown  # read after the actions
    assert doc.actions is not None
    assert doc.actions["javascriptReturns"] == [
        {"type": "string", "value": "Searched for pagesift"}
    ]
    (shot,) = doc.actions["screenshots"]
    assert shot.startswith("data:image/jpeg;base64,")
    assert doc.actions["scrapes"] == [] and doc.actions["pdfs"] == []
    assert err.value.status_code == 400 and "actions[1]" in str(err.value)


@pytest.mark.browser
async def test_actions_need_the_accounts_javascript_permission_as_over_grpc(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as (fc, _, root):  # anonymous, allow_execute_javascript false
        with pytest.raises(Exception) as err:
            await sdk(fc.scrape, root + "/form", actions=[ExecuteJavascriptAction(script="1")])
    assert getattr(err.value, "status_code", None) == 403
    assert "execute_javascript" in str(err.value)


async def test_sdk_location_languages_are_the_accept_language_the_site_sees(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as (fc, site, root):
        doc = await sdk(fc.scrape, root + "/lang", location=Location(languages=["fr-CH", "fr"]))
        with pytest.raises(BadRequestError) as err:
            await sdk(fc.scrape, root + "/lang", location=Location(country="DE"))
    assert site.languages == ["fr-CH, fr;q=0.9"]
    assert doc.markdown and "Asked in fr-CH, fr;q=0.9" in doc.markdown
    assert err.value.status_code == 400 and "location.country" in str(err.value)


async def test_sdk_change_tracking_says_new_changed_then_same_with_a_git_diff(
    tmp_path: Path,
) -> None:
    tracking = ["markdown", {"type": "changeTracking", "modes": ["git-diff"]}]
    fresh = {"formats": tracking, "max_age": 0}  # the SDK's default maxAge is 4 h: a cache hit
    async with rig(tmp_path) as (fc, site, root):
        first = await sdk(fc.scrape, root + "/news", **fresh)
        site.news = "Second headline"
        second = await sdk(fc.scrape, root + "/news", **fresh)
        third = await sdk(fc.scrape, root + "/news", **fresh)
        with pytest.raises(BadRequestError) as err:  # an LLM's comparison: refused
            json_mode = {"type": "changeTracking", "modes": ["json"]}
            await sdk(fc.scrape, root + "/news", formats=["markdown", json_mode])
    assert first.change_tracking == {
        "previousScrapeAt": None, "changeStatus": "new", "visibility": "visible"
    }  # fmt: skip
    changed = second.change_tracking
    assert changed is not None and changed["changeStatus"] == "changed"
    assert changed["previousScrapeAt"] and changed["previousScrapeAt"].endswith("Z")
    text = changed["diff"]["text"]
    assert "-First headline" in text and "+Second headline" in text
    (file,) = changed["diff"]["json"]["files"]
    kinds = {c["type"] for chunk in file["chunks"] for c in chunk["changes"]}
    assert kinds == {"add", "del", "normal"}
    same = third.change_tracking
    assert same is not None and same["changeStatus"] == "same" and "diff" not in same
    assert same["previousScrapeAt"] >= changed["previousScrapeAt"]
    assert err.value.status_code == 400 and "modes[0]" in str(err.value)


async def test_the_node_says_a_guarded_url_is_blocked_as_a_violation_reason_over_grpc(
    tmp_path: Path,
) -> None:
    async with in_process_node(tmp_path, allow_private_networks=False) as node:
        client = JobClient([node.address])
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                urls = ["not a url", "http://127.0.0.1:9/"]
                await client.start_batch(jobs_pb2.StartBatchScrapeRequest(urls=urls))
        finally:
            await client.close()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (bad,) = details_of(status_of(err.value), error_details_pb2.BadRequest)
    reasons = [(v.field, v.reason) for v in bad.field_violations]
    assert reasons == [("urls[0]", ""), ("urls[1]", BLOCKED_ADDRESS)]
