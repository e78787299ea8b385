"""The engine every job sees (``engine.rendering.RenderingEngine``): HTTP, BROWSER and
AUTO on the local JavaScript site (``tests/jssite.py``) with a real
chromium-headless-shell, one engine (one browser) for the module's engine tests; then a
real node: a crawl that renders a JS host without fetching twice per page once AUTO's
host memory kicks in, a screenshot over gRPC, health saying whether a node renders."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pagesift.core.api.metrics import Metrics
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.util import tracing
from pagesift.primary.engine.autorender import HostMemory
from pagesift.primary.engine.browser import pool as poolmod
from pagesift.primary.engine.http import HttpEngine
from pagesift.primary.engine.interface import FetchPolicy
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.primary.engine.rendering import RenderingEngine, choose
from pagesift.primary.engine.reqprofile import RequestProfile
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import (
    NodeFactory,
    all_documents,
    in_process_node,
    serve_handler,
    until,
    wait_terminal,
)
from tests.jssite import MARKERS, PAGES, SPA_PAGES, serve_js_site

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

BROWSER = jobs_pb2.FETCH_ENGINE_BROWSER
HTTP = jobs_pb2.FETCH_ENGINE_HTTP
AUTO = jobs_pb2.FETCH_ENGINE_AUTO
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CONFIG = ServerConfig(allow_private_networks=True, extract_processes=0, max_browser_pages=4)


class Rig:
    def __init__(self, root: str, engine: RenderingEngine, hits: Counter[str]) -> None:
        self.root, self.engine, self.hits = root, engine, hits

    def rendered(self) -> int:
        assert self.engine.pool is not None
        return self.engine.pool.stats()["pages_rendered"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig() -> AsyncIterator[Rig]:
    hits: Counter[str] = Counter()
    async with serve_js_site(hits) as root:
        engine = RenderingEngine(HttpEngine(CONFIG, metrics=Metrics()))
        try:
            yield Rig(root, engine, hits)
        finally:
            await engine.close()


def opts(engine: int, **kw: object) -> jobs_pb2.ScrapeOptions:
    return jobs_pb2.ScrapeOptions(engine=engine, **kw)  # type: ignore[arg-type]


async def test_unspecified_is_auto_on_a_node_that_renders_and_http_on_one_that_cannot() -> None:
    unspecified = jobs_pb2.ScrapeOptions()
    assert choose(unspecified, can_render=True) == AUTO
    assert choose(unspecified, can_render=False) == HTTP
    assert choose(opts(AUTO), can_render=False) == HTTP
    assert choose(opts(BROWSER), can_render=False) == BROWSER  # fails: cannot render
    assert choose(opts(HTTP), can_render=True) == HTTP


async def test_http_misses_the_script_content_the_browser_renders(rig: Rig) -> None:
    for page, marker in (("fetch", MARKERS["fetch"]), ("app", MARKERS["app"])):
        url = f"{rig.root}{page}.html"
        fetched = await rig.engine.scrape(url, opts(HTTP))
        assert marker not in fetched.document.markdown
        assert fetched.document.engine == HTTP
        assert fetched.document.metadata["engine"] == "http"
        idle = opts(BROWSER, wait_until=jobs_pb2.WAIT_UNTIL_NETWORKIDLE)  # after fetch()
        rendered = await rig.engine.scrape(url, idle)
        assert marker in rendered.document.markdown, page
        assert rendered.document.engine == BROWSER
        assert rendered.document.metadata["engine"] == "browser"
        assert rendered.document.final_url == url


async def test_a_wait_for_selector_catches_content_a_timer_inserts(rig: Rig) -> None:
    url = f"{rig.root}timer.html"
    waited = opts(AUTO, wait_for=jobs_pb2.WaitFor(selector="#late"))
    page = await rig.engine.scrape(url, waited)
    assert MARKERS["timer"] in page.document.markdown
    assert page.document.engine == BROWSER
    assert page.document.metadata["render_reason"] == "requested wait_for"


async def test_auto_renders_the_pages_that_need_it_and_fetches_the_static_one(rig: Rig) -> None:
    rig.engine.memory = HostMemory(threshold=1000)  # judge every page on its own
    before = rig.rendered()
    static = await rig.engine.scrape(f"{rig.root}static.html", opts(AUTO))
    assert rig.rendered() == before  # the browser was not asked
    assert static.document.engine == HTTP
    assert "reference manual" in static.document.markdown
    expect = {
        "fetch": ("scripts and little text", MARKERS["fetch"]),
        "app": ("empty app root #root", MARKERS["app"]),
        "noscript": ("noscript asks for JavaScript", MARKERS["noscript"]),
        "timer": ("scripts and little text", "Timer"),
    }
    for name, (reason, marker) in expect.items():
        page = await rig.engine.scrape(f"{rig.root}{name}.html", opts(AUTO))
        assert page.document.engine == BROWSER, name
        assert page.document.metadata["render_reason"] == reason
        assert marker in page.document.markdown, name
    assert rig.rendered() == before + len(expect)


async def test_auto_takes_the_links_a_script_adds(rig: Rig) -> None:
    page = await rig.engine.scrape(f"{rig.root}links.html", opts(AUTO))
    assert page.document.engine == BROWSER
    for n in range(1, SPA_PAGES + 1):
        assert f"{rig.root}spa/{n}.html" in page.links


async def test_auto_goes_straight_to_the_browser_once_a_host_needed_it(rig: Rig) -> None:
    rig.engine.memory = HostMemory(threshold=2)
    policy = FetchPolicy(owner="acct-memory")
    for n in range(1, SPA_PAGES + 1):
        page = await rig.engine.scrape(f"{rig.root}spa/{n}.html", opts(AUTO), policy)
        assert f"{MARKERS['spa']} {n}" in page.document.markdown
        assert page.document.engine == BROWSER
    # the first two were fetched, then rendered; from then on rendered at once
    assert [rig.hits[f"spa/{n}.html"] for n in range(1, SPA_PAGES + 1)] == [2, 2, 1, 1]
    third = await rig.engine.scrape(f"{rig.root}static.html", opts(AUTO), policy)
    assert third.document.metadata["render_reason"] == "host needs rendering"


async def test_the_jobs_cookies_go_into_the_render_and_its_cookies_come_back(rig: Rig) -> None:
    url = f"{rig.root}setstate.html"

    def job(cookies: dict[str, str]) -> FetchPolicy:
        profile = RequestProfile.build(
            jobs_pb2.ScrapeOptions(cookies=cookies),
            [url],
            may_ignore_robots=False,
            may_use_proxy_url=False,
        )
        return FetchPolicy(request=profile, owner="acct-cookies")

    policy = job({"seed": "s1"})
    profile = policy.request
    assert profile is not None
    await rig.engine.scrape(url, opts(BROWSER), policy)
    assert "session=abc123" in (profile.cookies.header(f"{rig.root}readstate.html") or "")
    assert profile.cookies.dirty  # the page's write group stores the change
    read = await rig.engine.scrape(f"{rig.root}readstate.html", opts(BROWSER), policy)
    assert "seed=s1" in read.document.markdown
    assert "session=abc123" in read.document.markdown
    assert "storage=v1" in read.document.markdown  # the job's own context: its storage
    # another job of the same account (even with the same options) sees neither
    other = job({"other": "o1"})
    alone = await rig.engine.scrape(f"{rig.root}readstate.html", opts(BROWSER), other)
    assert "other=o1" in alone.document.markdown
    for leak in ("seed=s1", "session=abc123", "storage=v1"):
        assert leak not in alone.document.markdown
    # a one-off scrape (no job profile) gets a context of its own
    once = await rig.engine.scrape(f"{rig.root}readstate.html", opts(BROWSER))
    for leak in ("seed=s1", "session=abc123", "storage=v1", "other=o1"):
        assert leak not in once.document.markdown


async def test_a_rendered_error_status_is_the_http_engines_error(rig: Rig) -> None:
    with pytest.raises(PageError) as err:
        await rig.engine.scrape(f"{rig.root}missing.html", opts(BROWSER))
    assert err.value.code == ErrorCode.HTTP_STATUS
    assert err.value.status == 404


async def test_renders_show_in_the_metrics_by_engine_and_reason(rig: Rig) -> None:
    metrics = rig.engine.metrics
    assert metrics is not None
    text = metrics.exposition().decode()
    assert 'pagesift_page_seconds_count{engine="browser"}' in text
    assert 'pagesift_page_seconds_count{engine="http"}' in text
    assert 'pagesift_auto_renders_total{reason="empty app root #root"}' in text
    figures = rig.engine.browser_figures()
    assert figures.can_render and figures.pages_max == 4 and figures.pages_in_use == 0


async def test_the_guard_refuses_an_internal_address_before_the_browser_is_asked() -> None:
    guarded = ServerConfig(extract_processes=0)
    engine = RenderingEngine(HttpEngine(guarded))
    try:
        for choice in (BROWSER, AUTO):
            with pytest.raises(PageError) as err:
                await engine.scrape("http://127.0.0.1:9/app.html", opts(choice))
            assert err.value.code == ErrorCode.BLOCKED_ADDRESS
        assert engine.pool is not None and engine.pool.stats()["launches"] == 0
    finally:
        await engine.close()


async def test_robots_txt_refuses_a_render_before_the_browser_is_asked(rig: Rig) -> None:
    async def handle(request: web.Request) -> web.Response:
        if request.path == "/robots.txt":
            return web.Response(text="User-agent: *\nDisallow: /private/\n")
        return web.Response(text="<div id='root'></div><script></script>", content_type="text/html")

    async with serve_handler(handle) as port:
        before = rig.rendered()
        for choice in (BROWSER, AUTO):
            with pytest.raises(PageError) as err:
                await rig.engine.scrape(f"http://127.0.0.1:{port}/private/a", opts(choice))
            assert err.value.code == ErrorCode.ROBOTS_DISALLOWED
        assert rig.rendered() == before
        await rig.engine.scrape(f"http://127.0.0.1:{port}/open", opts(BROWSER))
        assert rig.rendered() == before + 1


async def test_renders_of_one_host_wait_their_turn_like_fetches() -> None:
    starts: list[float] = []

    async def handle(request: web.Request) -> web.Response:
        if request.path != "/robots.txt":
            starts.append(time.monotonic())
        return web.Response(text="<div id='root'></div><script></script>", content_type="text/html")

    config = ServerConfig(allow_private_networks=True, extract_processes=0, per_host_delay=0.4)
    engine = RenderingEngine(HttpEngine(config))
    try:
        async with serve_handler(handle) as port:
            await engine.scrape(f"http://127.0.0.1:{port}/warm", opts(BROWSER))  # launched
            await asyncio.sleep(0.5)
            starts.clear()
            pages = [f"http://127.0.0.1:{port}/p{n}" for n in range(3)]
            await asyncio.gather(*(engine.scrape(u, opts(BROWSER)) for u in pages))
    finally:
        await engine.close()
    assert len(starts) == 3
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # the slots start 0.4 s apart; a new context's set-up varies by some milliseconds
    assert min(gaps) >= 0.3, gaps


async def test_a_node_without_a_browser_fetches_over_http_and_browser_fails_clearly() -> None:
    config = ServerConfig(allow_private_networks=True, extract_processes=0,
                          browser_executable="/nonexistent/chromium")  # fmt: skip
    engine = RenderingEngine(HttpEngine(config))
    try:
        assert not engine.can_render() and "missing" in engine.render_status()
        async with serve_js_site() as root:
            page = await engine.scrape(f"{root}app.html", jobs_pb2.ScrapeOptions())
            assert page.document.engine == HTTP
            with pytest.raises(PageError) as err:
                await engine.scrape(f"{root}app.html", opts(BROWSER))
        assert err.value.code == ErrorCode.RENDER_FAILED
        assert "cannot render" in err.value.message
    finally:
        await engine.close()


async def test_a_render_is_a_span_when_tracing_is_on(rig: Rig) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        await rig.engine.scrape(f"{rig.root}app.html", opts(BROWSER))
    finally:
        tracing.shutdown()
    (render,) = [s for s in exporter.get_finished_spans() if s.name == "render"]
    assert render.attributes is not None
    assert render.attributes["server.address"] == "127.0.0.1"
    assert render.attributes["http.response.status_code"] == 200


async def test_an_accounts_own_cap_holds_its_renders_to_one_at_a_time(rig: Rig) -> None:
    assert rig.engine.pool is not None
    pool = rig.engine.pool
    rig.engine.owner_limit = lambda owner: 1 if owner == "solo" else None
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, pool.stats()["in_use"])
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        slow = [f"{rig.root}slow.html?delay=0.{n}" for n in (6, 7, 8)]
        await asyncio.gather(
            *(rig.engine.scrape(u, opts(BROWSER), FetchPolicy(owner="solo")) for u in slow)
        )
    finally:
        sampler.cancel()
        rig.engine.owner_limit = lambda _owner: None
    assert peak == 1


async def test_requests_the_guard_proxy_refuses_show_in_the_browser_figures() -> None:
    async def handle(request: web.Request) -> web.Response:
        body = (
            "<html><body><div id='root'></div><script>"
            f"fetch('http://127.0.0.1:{request.url.port}/x').catch(() => 0);"
            "fetch('http://169.254.169.254/y', {mode: 'no-cors'}).catch(() => 0);"
            "fetch('http://localhost:9/z', {mode: 'no-cors'}).catch(() => 0);"
            "document.getElementById('root').textContent = 'mounted';</script></body></html>"
        )
        return web.Response(text=body, content_type="text/html")

    async with serve_handler(handle) as port:
        url = f"http://127.0.0.1:{port}/"
        guard = AddressGuard(exempt=frozenset({("127.0.0.1", port)}))
        http = HttpEngine(ServerConfig(extract_processes=0), guard=guard)
        engine = RenderingEngine(http)
        try:
            page = await engine.scrape(
                url, opts(BROWSER, wait_until=jobs_pb2.WAIT_UNTIL_NETWORKIDLE)
            )
            assert "mounted" in page.document.markdown
            await until(
                lambda: engine.browser_figures().blocked_requests >= 1, "a refusal counted", 5
            )
            assert engine.browser_figures().blocked_bytes > 0
        finally:
            await engine.close()


# ---------------------------------------------------------------- a real node


async def _check(channel: grpc.aio.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    got = await stub.Check(health_pb2.HealthCheckRequest(service=service))
    return int(got.status)


async def test_a_crawl_renders_a_js_host_without_fetching_each_page_twice(tmp_path: Path) -> None:
    hits: Counter[str] = Counter()
    async with serve_js_site(hits) as root, in_process_node(tmp_path) as node:
        assert (
            await _check(node.channel, "pagesift.render") == health_pb2.HealthCheckResponse.SERVING
        )
        started = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(
                url=f"{root}spa/1.html", limit=10, crawl_entire_domain=True, max_concurrency=1
            )
        )
        done = await wait_terminal(node.stub, started.id, timeout=60)
        assert done.state == jobs_pb2.JOB_STATE_COMPLETED
        got = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id, limit=50))
        by_url = {d.url: d for d in got.documents}
        for n in range(1, SPA_PAGES + 1):
            doc = by_url[f"{root}spa/{n}.html"]
            assert doc.engine == BROWSER
            assert f"{MARKERS['spa']} {n}" in doc.markdown
        text = node.node.metrics.exposition().decode()
        assert "pagesift_browser_can_render 1.0" in text
        assert "pagesift_browser_pages_max" in text and "pagesift_browser_restarts_total" in text
        assert 'pagesift_auto_renders_total{reason="host needs rendering"} 2.0' in text
        chain = [hits[f"spa/{n}.html"] for n in range(1, SPA_PAGES + 1)]
        assert chain[2:] == [1] * (SPA_PAGES - 2), chain  # rendered at once
        assert sum(chain) <= SPA_PAGES + 2


async def test_a_browser_scrape_over_grpc_returns_a_png_screenshot_scrape_and_job(
    tmp_path: Path,
) -> None:
    shot = opts(BROWSER, formats=[jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_SCREENSHOT])
    async with serve_js_site() as root, in_process_node(tmp_path) as node:
        url = f"{root}app.html"
        resp = await node.stub.Scrape(jobs_pb2.ScrapeRequest(url=url, options=shot))
        assert resp.document.engine == BROWSER
        assert resp.document.screenshot.data.startswith(PNG_MAGIC)
        assert resp.document.screenshot.content_type == "image/png"
        assert MARKERS["app"] in resp.document.markdown
        started = await node.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=[url], options=shot)
        )
        done = await wait_terminal(node.stub, started.id, timeout=60)
        assert done.state == jobs_pb2.JOB_STATE_COMPLETED
        got = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id, limit=5))
        (doc,) = got.documents
        assert doc.screenshot.data.startswith(PNG_MAGIC)
        assert doc.engine == BROWSER


async def test_a_node_without_a_browser_is_healthy_and_says_it_cannot_render(
    tmp_path: Path,
) -> None:
    async with in_process_node(tmp_path, browser_executable="/nonexistent/chromium") as node:
        assert not node.node.can_render
        serving = health_pb2.HealthCheckResponse.SERVING
        assert await _check(node.channel, "") == serving
        assert await _check(node.channel, "pagesift.v1.JobService") == serving
        assert await _check(node.channel, "pagesift.render") == (
            health_pb2.HealthCheckResponse.NOT_SERVING
        )
        assert "pagesift_browser_can_render 0.0" in node.node.metrics.exposition().decode()


# ---------------------------------------------------------------- crashes


async def test_a_browser_killed_mid_render_is_retried_and_the_job_completes(
    tmp_path: Path,
) -> None:
    async with serve_js_site() as root, in_process_node(tmp_path) as node:
        url = f"{root}slow.html?delay=2"
        started = await node.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=[url], options=opts(BROWSER), max_retries=2)
        )
        engine = node.node.engine
        assert isinstance(engine, RenderingEngine) and engine.pool is not None
        pool = engine.pool
        await until(lambda: pool.stats()["in_use"] > 0 and pool.browser_pid() is not None,
                    "a render in flight", 30)  # fmt: skip
        pid = pool.browser_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        done = await wait_terminal(node.stub, started.id, timeout=60)
        assert done.state == jobs_pb2.JOB_STATE_COMPLETED, done.note
        assert done.completed == 1 and done.failed == 0
        assert pool.stats()["restarts"] == 1


def _browsers_under(root_pid: int) -> set[int]:
    table = poolmod._proc_table()
    real = os.path.realpath(CONFIG.browser_executable)
    return {pid for pid in poolmod.descendants(root_pid, table) if table[pid][1] == real}


def _alive(pids: set[int]) -> set[int]:
    table = poolmod._proc_table()
    real = os.path.realpath(CONFIG.browser_executable)
    return {pid for pid in pids if table.get(pid, (0, ""))[1] == real}


@pytest.mark.system
async def test_a_crawl_mixing_engines_survives_sigkill_with_every_page_once_and_no_browser_left(
    nodes: NodeFactory,
) -> None:
    hits: Counter[str] = Counter()
    async with serve_js_site(hits) as root:
        server = nodes("server", config={"max_browser_pages": 2})
        await server.start()
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            job = await stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url=root, limit=40, max_concurrency=2)
            )
            proc = server.proc
            assert proc is not None
            seen: set[int] = set()

            async def rendering() -> bool:
                seen.update(_browsers_under(proc.pid))
                got = await stub.GetJob(jobs_pb2.GetJobRequest(id=job.id, limit=1))
                return bool(seen) and got.completed >= 3

            deadline = time.monotonic() + 60
            while not await rendering():
                assert time.monotonic() < deadline, "no render in flight after 60 s"
                await asyncio.sleep(0.05)
        server.kill()
        await until(lambda: not _alive(seen), "every browser of the killed node gone", 15)
        await server.start()
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            final = await wait_terminal(stub, job.id, timeout=120)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
            docs = await all_documents(stub, job.id)
        got = [d.url for d in docs]
        assert len(got) == len(set(got)), "a page is in the results twice"
        expected = {root} | {f"{root}{p}" for p in PAGES.values()}
        expected |= {f"{root}spa/{n}.html" for n in range(1, SPA_PAGES + 1)}
        assert set(got) == expected
        engines = {d.url: d.engine for d in docs}
        assert engines[root] == HTTP  # the first page: fetched, judged static
        assert engines[f"{root}app.html"] == BROWSER
        assert MARKERS["app"] in next(d.markdown for d in docs if d.url == f"{root}app.html")
        server.stop()
