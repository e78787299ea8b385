"""A crawl mixing engines survives a failover: the promoted standby renders (issue 21, point 6).

A primary + standby pair of ``pagesift serve`` children, rendering on (the default
browser). The site is the JavaScript site (``tests/jssite.py``) behind a front that
serves its own index and ``DOCS`` server-rendered pages and passes every other path
to the JS site. The index links ``app.html`` (script-rendered: the primary renders it
before the kill), then the docs and ``static.html``, then ``links.html``, whose links
to ``spa/1.html``..``spa/4.html`` exist only once its script runs. The front holds
its answer to ``links.html`` until the primary is killed (``gate``), so however slow the
machine, the primary renders nothing but ``app.html``: the spa pages in the results
prove the promoted node rendered. The
static pages come before any script-only page on either node, so AUTO's host memory
(which sends a host's next pages straight to the browser once most needed rendering)
never applies to them: they are fetched (engine HTTP), the script pages rendered.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagesift.core.config.schema import ServerConfig
from pagesift.demo.site import normalize_url
from pagesift.primary.engine.browser import pool as poolmod
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import (
    NodeFactory,
    all_documents,
    assert_every_page_once,
    eventually,
    finished,
    serve_handler,
    until,
)
from tests.jssite import MARKERS, SPA_PAGES, serve_js_site
from tests.test_failover import promote, start_pair

pytestmark = pytest.mark.system

AUTO = jobs_pb2.FETCH_ENGINE_AUTO
BROWSER = jobs_pb2.FETCH_ENGINE_BROWSER
HTTP = jobs_pb2.FETCH_ENGINE_HTTP
DOCS = 20
PACE = 0.15  # seconds between two request starts: the docs take ~3 s after app.html
GATE_TIMEOUT = 300.0  # seconds links.html waits for the kill at most
BROWSER_EXE = os.path.realpath(ServerConfig().browser_executable)
_PROSE = " ".join(["Each chapter of the guide is server-rendered text with no script."] * 30)


def _html(title: str, body: str) -> str:
    return f"<!doctype html><html><head><title>{title}</title></head><body>{body}</body></html>"


@asynccontextmanager
async def serve_mixed_site(gate: asyncio.Event) -> AsyncIterator[str]:
    """The front on 127.0.0.1; yields its root URL. ``/`` and ``/doc/N.html`` are its
    own (static); any other path is the JS site's answer, passed through, ``links.html``
    once ``gate`` is set (at most ``GATE_TIMEOUT`` s later)."""
    async with serve_js_site() as js_root, aiohttp.ClientSession() as session:
        index = "".join(
            f"<a href='{p}'>{p}</a> "
            for p in ["app.html", *(f"doc/{n}.html" for n in range(1, DOCS + 1)),
                      "static.html", "links.html"]
        )  # fmt: skip

        async def handle(request: web.Request) -> web.StreamResponse:
            path = request.path.lstrip("/")
            if path == "":
                return web.Response(text=_html("Index", index), content_type="text/html")
            if path.startswith("doc/"):
                body = f"<h1>Chapter {path}</h1><p>{_PROSE}</p>"
                return web.Response(text=_html(path, body), content_type="text/html")
            if path == "links.html":
                await asyncio.wait_for(gate.wait(), GATE_TIMEOUT)
            async with session.get(js_root + path) as resp:
                return web.Response(
                    status=resp.status,
                    body=await resp.read(),
                    content_type=resp.content_type,
                )

        async with serve_handler(handle) as port:
            yield f"http://127.0.0.1:{port}/"


def _browsers_under(root_pid: int) -> set[int]:
    table = poolmod._proc_table()
    return {p for p in poolmod.descendants(root_pid, table) if table[p][1] == BROWSER_EXE}


def _alive(pids: set[int]) -> set[int]:
    table = poolmod._proc_table()
    return {p for p in pids if table.get(p, (0, ""))[1] == BROWSER_EXE}


async def _documents(address: str, job_id: str) -> list[jobs_pb2.Document]:
    async with grpc.aio.insecure_channel(address) as ch:
        return await all_documents(jobs_pb2_grpc.JobServiceStub(ch), job_id)


async def _render_health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        got = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="pagesift.render"), timeout=5
        )
        return int(got.status)


async def test_a_crawl_mixing_engines_fails_over_and_the_promoted_standby_renders_every_page_once(
    nodes: NodeFactory,
) -> None:
    gate = asyncio.Event()
    async with serve_mixed_site(gate) as root:
        config = {"max_browser_pages": 2}
        primary, standby = await start_pair(nodes, primary_config=config, standby_config=config)
        proc = primary.proc
        assert proc is not None
        async with grpc.aio.insecure_channel(primary.address) as ch:
            job = await jobs_pb2_grpc.JobServiceStub(ch).StartCrawl(
                jobs_pb2.StartCrawlRequest(
                    url=root,
                    max_concurrency=2,
                    delay=PACE,
                    options=jobs_pb2.ScrapeOptions(engine=AUTO),
                ),
                timeout=10,
            )
        app, links = normalize_url(f"{root}app.html"), normalize_url(f"{root}links.html")
        seen: set[int] = set()

        async def standby_has_a_render() -> list[jobs_pb2.Document] | None:
            """The standby's documents once it holds app.html (rendered by the primary)
            and a few more, having seen the primary's browser meanwhile."""
            seen.update(_browsers_under(proc.pid))
            try:
                docs = await _documents(standby.address, job.id)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    return None  # the job is not replicated yet
                raise
            urls = {normalize_url(d.url) for d in docs}
            return docs if seen and app in urls and len(urls) >= 4 else None

        await eventually(standby_has_a_render, "app.html rendered and on the standby", 90)
        primary.kill()
        killed_at = time.monotonic()
        gate.set()  # links.html for whoever asks from now on: the promoted standby
        before = await _documents(standby.address, job.id)
        rendered_before = {normalize_url(d.url) for d in before if d.engine == BROWSER}
        assert rendered_before == {app}, "the primary rendered past app.html before the kill"
        assert links not in {normalize_url(d.url) for d in before}
        await until(lambda: not _alive(seen), "every browser of the killed primary gone", 60)

        promoted = await promote(standby.address)
        assert promoted.epoch == 2 and not promoted.already_primary
        serving = health_pb2.HealthCheckResponse.SERVING
        assert await _render_health(standby.address) == serving
        final = await finished(standby.address, job.id, timeout=180)
        assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
        docs = await _documents(standby.address, job.id)

        spa = {normalize_url(f"{root}spa/{n}.html") for n in range(1, SPA_PAGES + 1)}
        static = {normalize_url(root), normalize_url(f"{root}static.html")}
        static |= {normalize_url(f"{root}doc/{n}.html") for n in range(1, DOCS + 1)}
        assert_every_page_once(docs, static | {app, links} | spa)
        engines = {normalize_url(d.url): d.engine for d in docs}
        assert {u for u, e in engines.items() if e == BROWSER} == {app, links} | spa
        assert {u for u, e in engines.items() if e == HTTP} == static
        markdown = {normalize_url(d.url): d.markdown for d in docs}
        assert all(MARKERS["spa"] in markdown[u] for u in spa)
        assert await _render_health(standby.address) == serving
        print(f"failover to completion: {time.monotonic() - killed_at:.1f} s")
