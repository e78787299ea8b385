"""Every failure of a render has its status (issue 28, finding 4): never gRPC UNKNOWN,
never an HTTP 500 from the gateway.

``test_every_page_error_code_*`` walks every ``ErrorCode`` (so a new code without a
status cannot slip through as UNKNOWN) and every code the engine's sources raise.
The browser test drives each failure a caller can cause through a real node's gRPC
Scrape and through the gateway's ``/v2/scrape`` in front of it, on a real
chromium-headless-shell and the pages of ``tests.heavypages``: a ``wait_for`` that
never shows, an action that fails, a navigation that cannot connect, a page past
``browser_page_memory_limit``, a renderer that crashes mid-page, and (the guard on) a
page that sends the browser to an internal address.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from google.protobuf.duration_pb2 import Duration

from pagesift.client.errors import error_info_of
from pagesift.core.api import errortable, rpcerrors
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.gateway import httperrors
from pagesift.gateway.app import make_app
from pagesift.gateway.clients import Clients
from pagesift.primary.engine.browser.procs import children, process_type
from pagesift.primary.engine.http import HttpEngine
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.primary.engine.rendering import RenderingEngine
from pagesift.v1 import jobs_pb2 as pb
from tests.heavypages import serve_heavy
from tests.helpers import MapResolver, free_port, in_process_node, node_config

EXE = "/usr/lib/chromium/chromium-headless-shell"
ENGINE = Path(__file__).resolve().parent.parent / "primary" / "pagesift" / "primary" / "engine"
C = grpc.StatusCode
NEVER = (C.UNKNOWN, C.INTERNAL)
#: the render failures' page error codes: none may be a gateway 500
RENDER_CODES = ("timeout", "action_failed", "too_large", "connect", "render_failed",
                "blocked_address")  # fmt: skip


def test_every_page_error_code_has_a_status_that_is_not_unknown() -> None:
    facts = errortable.CallFacts()
    for code in ErrorCode:
        assert code in rpcerrors.PAGE_STATUS, f"page error {code} has no status"
        statuses = {rpcerrors.page_status(code)}
        if code == ErrorCode.HTTP_STATUS:
            statuses |= {rpcerrors.page_status(code, s) for s in (400, 401, 403, 404, 418, 503)}
        assert not statuses & set(NEVER), (code, statuses)
        # the error table sends that status for a Scrape of it (reason PAGE_FETCH_FAILED)
        failed = errortable.PageFailed(PageError(code, "why"), "http://example.com/")
        status, reason, _ = errortable.refusal_of(failed, facts)
        assert status == rpcerrors.page_status(code) and reason == "PAGE_FETCH_FAILED"
        assert status in errortable.row_for(failed).codes  # type: ignore[union-attr]


def test_every_code_the_engine_raises_is_a_page_error_code_with_its_status() -> None:
    raised = set()
    for path in ENGINE.rglob("*.py"):
        raised |= set(re.findall(r"ErrorCode\.([A-Z_]+)", path.read_text()))
    assert {"ACTION_FAILED", "RENDER_FAILED", "TOO_LARGE", "TIMEOUT"} <= raised  # the walk sees
    for name in raised:
        assert rpcerrors.page_status(ErrorCode[name]) not in NEVER, name


def test_the_gateway_answers_each_render_failure_with_its_own_code_never_500() -> None:
    for code in RENDER_CODES:
        status = rpcerrors.page_status(code)
        err = httperrors.from_rpc(status, "PAGE_FETCH_FAILED", {"code": code}, "why")
        assert err.status != 500 and err.code != "SCRAPE_FAILED", (code, err)
        assert err.body()["details"][0]["code"] == code


# ---------------------------------------------------------------- through a real node

CAP = 384 << 20
NODE: dict[str, Any] = {
    "browser_page_memory_limit": CAP,
    "max_render_wait": 3.0,
    "max_actions_time": 4.0,
    "render_timeout": 40.0,
    "max_retries": 0,  # one attempt: the failure itself comes back
    "max_body_bytes": 4 << 20,
}


def browser(**fields: Any) -> pb.ScrapeOptions:
    return pb.ScrapeOptions(engine=pb.FETCH_ENGINE_BROWSER, **fields)


def waiting_for(selector: str) -> pb.ScrapeOptions:
    options = browser()
    options.wait_for.selector = selector
    return options


@contextlib.asynccontextmanager
async def gateway(address: str) -> AsyncIterator[str]:
    runner = web.AppRunner(make_app(Clients([address])), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def kill_renderers_soon(after: float) -> int:
    """SIGKILL every renderer below this process once one exists ``after`` s on (a
    crash, not the memory watch); how many."""
    await asyncio.sleep(after)
    found: set[int] = set()
    for _ in range(200):
        todo, seen = list(children(os.getpid())), set[int]()
        while todo and len(seen) < 10_000:
            pid = todo.pop()
            if pid not in seen:
                seen.add(pid)
                todo.extend(children(pid))
        found = {p for p in seen if process_type(p) == b"renderer"}
        if found:
            break
        await asyncio.sleep(0.05)
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(found)


async def scrape_fails(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value


@pytest.mark.browser
@pytest.mark.skipif(not os.access(EXE, os.X_OK), reason="chromium-headless-shell missing")
async def test_each_render_failure_has_its_status_through_grpc_and_the_gateway(
    tmp_path: Path,
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/"
    async with (
        serve_heavy() as root,
        in_process_node(tmp_path, **NODE) as node,
        gateway(node.address) as base,
        aiohttp.ClientSession() as http,
    ):
        calm = root + "calm.html"
        hog = root + "hog.html?mb=2048"
        click = [{"type": "click", "selector": "#missing"}]
        clicking = browser(actions=[pb.Action(click=pb.ClickAction(selector="#missing"))])
        render = [{"type": "wait", "milliseconds": 10}]  # a browser is needed
        cases: list[tuple[str, str, pb.ScrapeOptions, C, str, dict[str, Any], int, str]] = [
            ("wait_for", calm, waiting_for("#never"), C.UNAVAILABLE, "timeout",
             {"actions": [{"type": "wait", "selector": "#never"}]}, 422, "SCRAPE_ACTION_ERROR"),
            ("action", calm, clicking, C.ABORTED, "action_failed",
             {"actions": click}, 422, "SCRAPE_ACTION_ERROR"),
            ("navigation", closed, browser(), C.UNAVAILABLE, "connect",
             {"actions": render}, 502, "SCRAPE_SITE_ERROR"),
            ("memory cap", hog, browser(), C.RESOURCE_EXHAUSTED, "too_large",
             {"actions": render}, 422, "SCRAPE_TOO_LARGE"),
        ]  # fmt: skip
        for what, url, options, status, code, body, http_status, fc_code in cases:
            err = await scrape_fails(node.stub.Scrape(pb.ScrapeRequest(url=url, options=options)))
            assert err.code() == status, (what, err.code(), err.details())
            info = error_info_of(err)
            assert info is not None and info.reason == "PAGE_FETCH_FAILED", what
            assert info.metadata["code"] == code, (what, dict(info.metadata))
            if code == "too_large":
                assert "browser_page_memory_limit" in (err.details() or ""), err.details()
            async with http.post(base + "/v2/scrape", json={"url": url, **body}) as r:
                answer = await r.json()
                assert (r.status, answer.get("code")) == (http_status, fc_code), (what, answer)
                assert answer["success"] is False and answer["details"][0]["code"]

        # a renderer that crashes mid-page (killed from outside: not the memory cap)
        hold = browser(actions=[pb.Action(wait=pb.WaitAction(duration=Duration(seconds=3)))])
        killer = asyncio.create_task(kill_renderers_soon(0.5))
        err = await scrape_fails(node.stub.Scrape(pb.ScrapeRequest(url=calm, options=hold)))
        assert await killer >= 1
        assert err.code() == C.UNAVAILABLE, (err.code(), err.details())
        info = error_info_of(err)
        assert info is not None and info.metadata["code"] == "render_failed"
        killer = asyncio.create_task(kill_renderers_soon(0.5))
        wait3 = {"actions": [{"type": "wait", "milliseconds": 3000}]}
        async with http.post(base + "/v2/scrape", json={"url": calm, **wait3}) as r:
            answer = await r.json()
            assert (r.status, answer.get("code")) == (502, "SCRAPE_SITE_ERROR"), answer
        assert await killer >= 1

        # and the node renders on
        done = await node.stub.Scrape(pb.ScrapeRequest(url=calm, options=browser()))
        assert "Calm page" in done.document.markdown


@pytest.mark.browser
@pytest.mark.skipif(not os.access(EXE, os.X_OK), reason="chromium-headless-shell missing")
async def test_a_page_the_browser_is_sent_to_an_internal_address_from_is_blocked_address(
    tmp_path: Path,
) -> None:
    # the guard on: a "public" name for the test site (its endpoint exempt), whose page
    # redirects the browser to an internal port
    async with serve_heavy() as root:
        port = int(root.rsplit(":", 1)[1].strip("/"))
        names = MapResolver({"public.test": "127.0.0.1"})
        settings = {**NODE, "allow_private_networks": False}
        config = node_config(tmp_path / "engine", **settings)
        guard = AddressGuard(exempt=frozenset({("127.0.0.1", port)}))
        engine = RenderingEngine(HttpEngine(config, guard=guard, resolver=names), resolver=names)
        url = f"http://public.test:{port}/to.html?port={free_port()}"
        async with (
            in_process_node(tmp_path / "node", engine=engine, **settings) as node,
            gateway(node.address) as base,
            aiohttp.ClientSession() as http,
        ):
            page = await node.stub.Scrape(
                pb.ScrapeRequest(url=f"http://public.test:{port}/calm.html", options=browser())
            )
            assert "Calm page" in page.document.markdown  # the control: the name renders
            err = await scrape_fails(node.stub.Scrape(pb.ScrapeRequest(url=url, options=browser())))
            assert err.code() == C.INVALID_ARGUMENT, (err.code(), err.details())
            info = error_info_of(err)
            assert info is not None and info.metadata["code"] == "blocked_address"
            body = {"url": url, "actions": [{"type": "wait", "milliseconds": 10}]}
            async with http.post(base + "/v2/scrape", json=body) as r:
                answer = await r.json()
                assert (r.status, answer.get("code")) == (403, "URL_BLOCKED"), answer
