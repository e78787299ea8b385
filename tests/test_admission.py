"""One admission step for both engines (``engine.admission``): what the render path and
the HTTP engine send passes the same guard, robots.txt, delay, host slot and host gate,
and a host one engine paused holds the other back.

The layering first (static: the render path knows the HTTP engine only through its
public interface, the node wires engines through the ``Engine`` protocol), then real
refusals and pauses: aiohttp sites on 127.0.0.1, the real ``HttpEngine`` under a
``RenderingEngine`` with a real chromium-headless-shell, the real cluster gate
(``clustered.OwnedHosts``) over real ``Owners``; then a real node's wiring.
"""

from __future__ import annotations

import ast
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from pagesift.core.cluster import placement
from pagesift.core.cluster.ownership import NoOwners, Owners
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.node import node as node_module
from pagesift.primary.engine import rendering
from pagesift.primary.engine.http import HttpEngine
from pagesift.primary.engine.rendering import RenderingEngine
from pagesift.primary.jobs.clustered import OwnedHosts
from pagesift.v1 import jobs_pb2
from tests.fakeengine import FakeEngine, page
from tests.helpers import Acct, in_process_node, serve_handler, until, write_accounts

HTTP = jobs_pb2.FETCH_ENGINE_HTTP
BROWSER = jobs_pb2.FETCH_ENGINE_BROWSER
OPEN = dict(allow_private_networks=True, extract_processes=0, max_browser_pages=2)
PAGE = "<html><body><h1>Hello</h1><p>A page with some words in it.</p></body></html>"

#: what the render path may use of the HTTP engine (its public interface)
HTTP_INTERFACE = {
    "admission", "close", "config", "fetch_response", "guard", "host_delays", "host_slots",
    "metrics", "pages", "proxies", "robots_allowed", "scrape", "sitemap_batches",
    "sitemap_urls",
}  # fmt: skip
#: the admission's parts the render path must not take a turn or a verdict from itself
PARTS = {"fetcher", "sessions", "slots", "slot", "throttle", "robots"}


# ---------------------------------------------------------------- layering


def _tree(module: object) -> ast.Module:
    path = getattr(module, "__file__", None)
    assert isinstance(path, str)
    return ast.parse(Path(path).read_text())


def test_the_render_path_uses_the_http_engine_through_its_public_interface_only() -> None:
    found: list[str] = []
    for node in ast.walk(_tree(rendering)):
        if not isinstance(node, ast.Attribute):
            continue
        name, owner = node.attr, node.value
        mine = isinstance(owner, ast.Name) and owner.id == "self"
        if name.startswith("_") and not name.startswith("__") and not mine:
            found.append(f"line {node.lineno}: private attribute .{name} of another object")
        if name in PARTS:
            found.append(f"line {node.lineno}: .{name}, a part of the fetch layer")
        http = (isinstance(owner, ast.Name) and owner.id == "http") or (
            isinstance(owner, ast.Attribute)
            and owner.attr == "http"
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
        )
        if http and name not in HTTP_INTERFACE:
            found.append(f"line {node.lineno}: http.{name} is not the HTTP engine's interface")
    assert found == []


def test_the_node_wires_engines_without_asking_their_concrete_class() -> None:
    engines = {"HttpEngine", "RenderingEngine", "FakeEngine"}
    found: list[int] = []
    for node in ast.walk(_tree(node_module)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id in ("isinstance", "type") and any(
            isinstance(n, ast.Name) and n.id in engines for arg in node.args for n in ast.walk(arg)
        ):
            found.append(node.lineno)
    assert found == []


# ---------------------------------------------------------------- refusals


class Origin:
    """A catch-all site: robots.txt from ``robots``, ``/busy`` a 503 with ``retry``'s
    Retry-After, every other path a page; each page request's path and time kept."""

    def __init__(self, robots: str = "User-agent: *\nAllow: /\n", retry: str = "2") -> None:
        self.robots, self.retry = robots, retry
        self.seen: list[tuple[str, float]] = []
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        if request.path == "/robots.txt":
            return web.Response(text=self.robots)
        if request.path == "/favicon.ico":
            return web.Response(status=404)
        self.seen.append((request.path, time.monotonic()))
        if request.path.startswith("/busy"):
            return web.Response(
                text=PAGE, status=503, content_type="text/html", headers={"Retry-After": self.retry}
            )
        return web.Response(text=PAGE, content_type="text/html")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def first(self, path: str) -> float:
        return next(t for p, t in self.seen if p == path)


@asynccontextmanager
async def served(origin: Origin) -> AsyncIterator[Origin]:
    async with serve_handler(origin.handle) as port:
        origin.port = port
        yield origin


@asynccontextmanager
async def engine_of(config: ServerConfig) -> AsyncIterator[RenderingEngine]:
    engine = RenderingEngine(HttpEngine(config))
    try:
        yield engine
    finally:
        await engine.close()


async def _refusal(engine: RenderingEngine, url: str, choice: int) -> tuple[ErrorCode, str]:
    with pytest.raises(PageError) as info:
        await engine.scrape(url, jobs_pb2.ScrapeOptions(engine=choice))  # type: ignore[arg-type]
    return info.value.code, info.value.message


async def _both_refuse(engine: RenderingEngine, url: str) -> tuple[ErrorCode, str]:
    """The HTTP engine's and the render path's refusal of ``url``: one and the same."""
    fetched = await _refusal(engine, url, HTTP)
    rendered = await _refusal(engine, url, BROWSER)
    assert rendered == fetched
    assert engine.pool is not None and engine.pool.stats()["pages_rendered"] == 0
    return fetched


class ElsewhereSource(NoOwners):
    """The owners after a registry read in which another pair owns 127.0.0.1."""

    def __init__(self) -> None:
        super().__init__("alpha")
        pairs = next(
            ("alpha", f"beta{k}")
            for k in range(1000)
            if placement.owner("127.0.0.1", ("alpha", f"beta{k}")) != "alpha"
        )
        self._owners = Owners.read("alpha", pairs)


@pytest.mark.browser
async def test_an_address_robots_and_the_cluster_gate_refuse_a_render_as_a_fetch() -> None:
    async with served(Origin(robots="User-agent: *\nDisallow: /private/\n")) as origin:
        async with engine_of(ServerConfig(extract_processes=0)) as guarded:  # loopback blocked
            code, message = await _both_refuse(guarded, origin.url("/page"))
            assert code == ErrorCode.BLOCKED_ADDRESS
        async with engine_of(ServerConfig(**OPEN)) as engine:  # type: ignore[arg-type]
            code, message = await _both_refuse(engine, origin.url("/private/a"))
            assert code == ErrorCode.ROBOTS_DISALLOWED and "/private/a" in message
        unrobotic = ServerConfig(**OPEN, respect_robots=False)  # type: ignore[arg-type]
        async with engine_of(unrobotic) as engine:
            engine.host_slots().gate = OwnedHosts(ElsewhereSource())
            code, message = await _both_refuse(engine, origin.url("/page"))
            assert code == ErrorCode.HOST_OWNED_ELSEWHERE and "127.0.0.1" in message
        assert origin.seen == []  # not one page request reached the origin


@pytest.mark.browser
async def test_a_host_a_fetch_paused_holds_the_render_back_for_its_retry_after() -> None:
    async with served(Origin(retry="2")) as origin, engine_of(ServerConfig(**OPEN)) as engine:  # type: ignore[arg-type]
        code, _ = await _refusal(engine, origin.url("/busy"), HTTP)
        assert code == ErrorCode.HTTP_STATUS
        page_ = await engine.scrape(origin.url("/page"), jobs_pb2.ScrapeOptions(engine=BROWSER))
        assert page_.document.engine == BROWSER
        # the pause began when the 503 came back, after the origin saw the request
        assert origin.first("/page") - origin.first("/busy") >= 1.5


@pytest.mark.browser
async def test_a_render_answered_503_pauses_and_slows_the_host_for_a_fetch() -> None:
    async with served(Origin(retry="2")) as origin, engine_of(ServerConfig(**OPEN)) as engine:  # type: ignore[arg-type]
        code, _ = await _refusal(engine, origin.url("/busy"), BROWSER)
        assert code == ErrorCode.HTTP_STATUS
        assert engine.pool is not None and engine.pool.stats()["pages_rendered"] == 1
        assert engine.host_delays().get("127.0.0.1", 0.0) > 0.0  # paused, and slowed
        page_ = await engine.scrape(origin.url("/page"), jobs_pb2.ScrapeOptions(engine=HTTP))
        assert page_.document.engine == HTTP
        assert origin.first("/page") - origin.first("/busy") >= 1.5


@pytest.mark.browser
async def test_a_rendered_retry_after_over_the_limit_is_the_fetch_s_error() -> None:
    config = ServerConfig(**OPEN, max_retry_after=0.2)  # type: ignore[arg-type]
    async with served(Origin(retry="3600")) as origin, engine_of(config) as engine:
        fetched = await _refusal(engine, origin.url("/busy/1"), HTTP)
        rendered = await _refusal(engine, origin.url("/busy/2"), BROWSER)
    assert fetched[0] == rendered[0] == ErrorCode.RETRY_AFTER_TOO_LONG
    assert fetched[1] == rendered[1]


# ---------------------------------------------------------------- the node's wiring


async def test_the_node_hands_any_engine_its_accounts_render_caps(tmp_path: Path) -> None:
    accounts = write_accounts(
        tmp_path / "accounts.toml",
        (Acct("capped", {"max_browser_pages": 1}), Acct("free")),
    )
    engine = FakeEngine(lambda url: page(url))
    async with in_process_node(tmp_path / "d", engine=engine, accounts_file=str(accounts)) as node:
        await until(lambda: engine.render_limit is not None, "the engine wired", 10)
        limit = engine.render_limit
        assert limit is not None
        assert (limit("capped"), limit("free"), limit("nobody")) == (1, None, None)
        figures = node.node.metrics.exposition().decode()
        assert "pagesift_browser_pages_max 0.0" in figures  # an engine without a browser
