"""pagesift.primary.engine.http.HttpEngine against a real aiohttp server on 127.0.0.1.

No HTTP is mocked: every test talks to ``Site``, a small aiohttp app on a random port
that records when each request arrived.
"""

from __future__ import annotations

import asyncio
import gzip
import inspect
import itertools
import socket
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import brotli  # type: ignore[import-untyped]
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import TestServer

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import urls
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.http import HttpEngine
from pagesift.primary.engine.interface import Engine, FetchPolicy
from pagesift.primary.engine.netguard import BlockedAddressError, GuardedResolver
from pagesift.primary.engine.politeness import HostSlots, effective_delay
from pagesift.primary.engine.reqprofile import RequestProfile
from pagesift.v1 import jobs_pb2
from tests.helpers import EngineMaker, free_port

HTML = """<!doctype html><html lang="en"><head><title>Hello</title>
<meta name="description" content="A page"></head>
<body><h1>Hello page</h1><p>Text <a href="/a">A</a> <a href="b/">B</a>
<a href="https://elsewhere.example/x">X</a></p></body></html>"""

CAP = 4096
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Site:
    """The test web site; ``robots`` (body or None for 404) and ``robots_status`` are mutable."""

    def __init__(self) -> None:
        self.robots: str | None = None
        self.robots_status = 200
        self.arrivals: defaultdict[str, list[float]] = defaultdict(list)
        self.server: TestServer | None = None
        app = web.Application(middlewares=[self._record])
        r = app.router
        r.add_get("/robots.txt", self._robots)
        r.add_get("/page", self._html)
        r.add_get("/spaced/{n}", self._html)
        r.add_get("/private/{n}", self._html)
        r.add_get("/r/1", self._redirect("/r/2", 302))
        r.add_get("/r/2", self._redirect("/r/3", 301))
        r.add_get("/r/3", self._redirect("/page", 307))
        r.add_get("/loop/a", self._redirect("/loop/b", 302))
        r.add_get("/loop/b", self._redirect("/loop/a", 302))
        r.add_get("/chain/{n}", self._chain)
        r.add_get("/to-private", self._redirect("/private/1", 302))
        r.add_get("/to-ftp", self._redirect("ftp://files.example/x", 302))
        r.add_get("/status/{code}", self._status)
        r.add_get("/slow", self._slow)
        r.add_get("/big-declared", self._big_declared)
        r.add_get("/big-streamed", self._big_streamed)
        r.add_get("/json", self._json)
        r.add_get("/image", self._image)
        r.add_get("/gzip", self._gzip)
        r.add_get("/br", self._br)
        r.add_get("/large", self._large)
        r.add_get("/latin1", self._latin1)
        r.add_get("/meta-charset", self._meta_charset)
        r.add_get("/sitemap_index.xml", self._sitemap_index)
        r.add_get("/sitemaps/a.xml", self._sitemap_a)
        r.add_get("/sitemaps/b.xml.gz", self._sitemap_b)
        r.add_get("/sitemap.xml", self._sitemap_fallback)
        self.app = app

    def url(self, path: str) -> str:
        assert self.server is not None
        return str(self.server.make_url(path))

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.arrivals[request.path].append(time.monotonic())
        return await handler(request)

    async def _robots(self, request: web.Request) -> web.StreamResponse:
        if self.robots is None:
            raise web.HTTPNotFound()
        return web.Response(text=self.robots, status=self.robots_status)

    async def _html(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=HTML, content_type="text/html")

    @staticmethod
    def _redirect(target: str, status: int) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.Response(status=status, headers={"Location": target})

        return handler

    async def _chain(self, request: web.Request) -> web.StreamResponse:
        n = int(request.match_info["n"])
        return web.Response(status=302, headers={"Location": f"/chain/{n + 1}"})

    async def _status(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=int(request.match_info["code"]), text="nope")

    async def _slow(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(3.0)  # ten times the 0.3 s read timeout: room for a loaded box
        return web.Response(text=HTML, content_type="text/html")

    async def _big_declared(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"x" * (CAP + 1), content_type="text/html")

    async def _big_streamed(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/html"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(4):
            await resp.write(b"<p>" + b"y" * 2000 + b"</p>")
        await resp.write_eof()
        return resp

    async def _json(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"answer": 42})

    async def _image(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"\x89PNG\r\n\x1a\n" + bytes(100), content_type="image/png")

    async def _gzip(self, request: web.Request) -> web.StreamResponse:
        body = gzip.compress(HTML.replace("Hello page", "Gzipped page").encode())
        return web.Response(
            body=body, headers={"Content-Type": "text/html", "Content-Encoding": "gzip"}
        )

    async def _br(self, request: web.Request) -> web.StreamResponse:
        body = brotli.compress(HTML.replace("Hello page", "Brotli page").encode())
        return web.Response(
            body=body, headers={"Content-Type": "text/html", "Content-Encoding": "br"}
        )

    async def _large(self, request: web.Request) -> web.StreamResponse:
        paras = "".join(f"<p>Paragraph {i} <a href='/p/{i}'>link {i}</a></p>" for i in range(800))
        body = f"<html><body><h1>Large</h1>{paras}<p>THE END</p></body></html>"
        return web.Response(text=body, content_type="text/html")

    async def _latin1(self, request: web.Request) -> web.StreamResponse:
        body = "<html><body><p>caf\u00e9 \u2013 na\u00efve</p></body></html>".encode("cp1252")
        return web.Response(body=body, headers={"Content-Type": "text/html; charset=iso-8859-1"})

    async def _meta_charset(self, request: web.Request) -> web.StreamResponse:
        page = '<html><head><meta charset="windows-1252"></head><body><p>\u00e9t\u00e9</p></body>'
        return web.Response(body=page.encode("cp1252"), headers={"Content-Type": "text/html"})

    def _urlset(self, paths: list[str]) -> bytes:
        entries = "".join(f"<url><loc>{self.url(p)}</loc></url>" for p in paths)
        return (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</urlset>'
        ).encode()

    async def _sitemap_index(self, request: web.Request) -> web.StreamResponse:
        entries = "".join(
            f"<sitemap><loc>{self.url(p)}</loc></sitemap>"
            for p in ("/sitemaps/a.xml", "/sitemaps/b.xml.gz", "/sitemaps/missing.xml")
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><sitemapindex '
            f'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</sitemapindex>'
        )
        return web.Response(text=body, content_type="application/xml")

    async def _sitemap_a(self, request: web.Request) -> web.StreamResponse:
        body = self._urlset(["/docs/", "/docs/one?x=1&amp;y=2", "/page"])
        return web.Response(body=body, content_type="application/xml")

    async def _sitemap_b(self, request: web.Request) -> web.StreamResponse:
        body = gzip.compress(self._urlset(["/blog/1", "/blog/2", "/page"]))
        return web.Response(body=body, content_type="application/gzip")

    async def _sitemap_fallback(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self._urlset(["/only"]), content_type="application/xml")


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    s = Site()
    server = TestServer(s.app, host="127.0.0.1")
    await server.start_server()
    s.server = server
    yield s
    await server.close()


CONFIG = ServerConfig(
    allow_private_networks=True,
    read_timeout=0.3,
    connect_timeout=1.0,
    max_body_bytes=CAP,
    max_redirects=4,
    per_host_concurrency=4,
)


@pytest.fixture
async def engine(make_engine: EngineMaker) -> HttpEngine:
    return await make_engine(CONFIG)


OPTS = jobs_pb2.ScrapeOptions()


async def _error(engine: HttpEngine, url: str, **kw: object) -> PageError:
    options = jobs_pb2.ScrapeOptions(**kw)  # type: ignore[arg-type]
    with pytest.raises(PageError) as info:
        await engine.scrape(url, options)
    return info.value


# --- pages -------------------------------------------------------------------------------------


async def test_http_engine_has_every_engine_method_with_the_protocol_s_signature(
    make_engine: EngineMaker,
) -> None:
    engine: Engine = await make_engine(CONFIG)  # mypy checks HttpEngine's signatures statically
    kinds: dict[str, Callable[[object], bool]] = {
        "browser_figures": inspect.isfunction,
        "close": inspect.iscoroutinefunction,
        "host_delays": inspect.isfunction,
        "limit_renders": inspect.isfunction,
        "host_slots": inspect.isfunction,
        "robots_allowed": inspect.iscoroutinefunction,
        "scrape": inspect.iscoroutinefunction,
        "sitemap_batches": inspect.isasyncgenfunction,
        "sitemap_urls": inspect.iscoroutinefunction,
    }
    members = [n for n in vars(Engine) if not n.startswith("_")]
    assert sorted(members) == sorted(kinds)
    for name in members:
        want, got = getattr(Engine, name), getattr(type(engine), name)
        assert kinds[name](got), name
        assert inspect.signature(got) == inspect.signature(want), name


async def test_a_page_becomes_a_document_with_absolute_links(
    site: Site, engine: HttpEngine
) -> None:
    page = await engine.scrape(site.url("/page"), OPTS)
    doc = page.document
    assert doc.url == site.url("/page") == doc.final_url
    assert doc.status_code == 200
    assert doc.content_type.startswith("text/html")
    assert doc.title == "Hello" and doc.description == "A page" and doc.language == "en"
    assert "# Hello page" in doc.markdown
    assert not doc.html and not doc.raw_html and not doc.links
    assert [urls.normalize(u) for u in page.links] == [
        site.url("/a"),
        site.url("/b"),
        "https://elsewhere.example/x",
    ]
    assert abs(doc.fetched_at.ToSeconds() - time.time()) < 5


async def test_requested_formats_are_filled(site: Site, engine: HttpEngine) -> None:
    formats = [jobs_pb2.FORMAT_HTML, jobs_pb2.FORMAT_RAW_HTML, jobs_pb2.FORMAT_LINKS]
    doc = (await engine.scrape(site.url("/page"), jobs_pb2.ScrapeOptions(formats=formats))).document
    assert doc.raw_html == HTML
    assert "<h1>Hello page</h1>" in doc.html
    assert not doc.markdown
    assert len(doc.links) == 3


async def test_a_redirect_chain_is_followed_and_the_final_url_recorded(
    site: Site, engine: HttpEngine
) -> None:
    doc = (await engine.scrape(site.url("/r/1"), OPTS)).document
    assert doc.url == site.url("/r/1")
    assert doc.final_url == site.url("/page")
    assert doc.title == "Hello"
    assert [len(site.arrivals[p]) for p in ("/r/1", "/r/2", "/r/3", "/page")] == [1, 1, 1, 1]


async def test_a_redirect_loop_is_reported_as_redirect_loop(site: Site, engine: HttpEngine) -> None:
    err = await _error(engine, site.url("/loop/a"))
    assert err.code == ErrorCode.REDIRECT_LOOP
    assert len(site.arrivals["/loop/a"]) == 1 and len(site.arrivals["/loop/b"]) == 1


async def test_more_redirects_than_the_limit_is_reported_as_redirect_loop(
    site: Site, engine: HttpEngine
) -> None:
    err = await _error(engine, site.url("/chain/0"))
    assert err.code == ErrorCode.REDIRECT_LOOP
    assert "more than 4 redirects" in err.message
    hops = sum(len(v) for k, v in site.arrivals.items() if k.startswith("/chain/"))
    assert hops == CONFIG.max_redirects + 1


async def test_a_redirect_to_a_non_http_url_is_invalid(site: Site, engine: HttpEngine) -> None:
    assert (await _error(engine, site.url("/to-ftp"))).code == ErrorCode.INVALID_URL


@pytest.mark.parametrize("code", [404, 410, 500, 503])
async def test_error_statuses_are_http_status_with_the_code(
    site: Site, engine: HttpEngine, code: int
) -> None:
    err = await _error(engine, site.url(f"/status/{code}"))
    assert err.code == ErrorCode.HTTP_STATUS
    assert str(code) in err.message


async def test_an_unknown_path_is_http_status_404(site: Site, engine: HttpEngine) -> None:
    err = await _error(engine, site.url("/no/such/page"))
    assert err.code == ErrorCode.HTTP_STATUS and "404" in err.message


async def test_a_slow_page_times_out(site: Site, engine: HttpEngine) -> None:
    started = time.monotonic()
    err = await _error(engine, site.url("/slow"))
    assert err.code == ErrorCode.TIMEOUT
    assert time.monotonic() - started < 2.0  # cut at read_timeout, not after the page's 3 s


async def test_a_body_over_the_declared_cap_is_too_large(site: Site, engine: HttpEngine) -> None:
    err = await _error(engine, site.url("/big-declared"))
    assert err.code == ErrorCode.TOO_LARGE and "Content-Length" in err.message


async def test_a_streamed_body_over_the_cap_is_too_large(site: Site, engine: HttpEngine) -> None:
    err = await _error(engine, site.url("/big-streamed"))
    assert err.code == ErrorCode.TOO_LARGE and "streaming" in err.message


async def test_json_is_unsupported_content_unless_non_html_is_allowed(
    site: Site, engine: HttpEngine
) -> None:
    err = await _error(engine, site.url("/json"))
    assert err.code == ErrorCode.UNSUPPORTED_CONTENT
    page = await engine.scrape(site.url("/json"), jobs_pb2.ScrapeOptions(allow_non_html=True))
    assert page.document.markdown == '{"answer": 42}'
    assert page.document.content_type.startswith("application/json")
    assert page.links == []


async def test_binary_content_is_unsupported_even_with_allow_non_html(
    site: Site, engine: HttpEngine
) -> None:
    err = await _error(engine, site.url("/image"), allow_non_html=True)
    assert err.code == ErrorCode.UNSUPPORTED_CONTENT and "image/png" in err.message


@pytest.mark.parametrize(("path", "heading"), [("/gzip", "Gzipped page"), ("/br", "Brotli page")])
async def test_compressed_bodies_are_decoded(
    site: Site, engine: HttpEngine, path: str, heading: str
) -> None:
    doc = (await engine.scrape(site.url(path), OPTS)).document
    assert f"# {heading}" in doc.markdown


async def test_a_large_page_is_rendered_completely(site: Site, make_engine: EngineMaker) -> None:
    # three at once, extracted in workers: a loaded machine must not hit the 0.3 s read
    # timeout that the slow-page test relies on
    engine = await make_engine(replace(CONFIG, max_body_bytes=1 << 20, read_timeout=5.0))
    pages = await asyncio.gather(*(engine.scrape(site.url("/large"), OPTS) for _ in range(3)))
    for page in pages:
        assert page.document.markdown.startswith("# Large")
        assert "THE END" in page.document.markdown
        assert "[link 799](" + site.url("/p/799") + ")" in page.document.markdown
        assert len(page.links) == 800


async def test_the_charset_comes_from_the_header(site: Site, engine: HttpEngine) -> None:
    doc = (await engine.scrape(site.url("/latin1"), OPTS)).document
    assert "caf\u00e9 \u2013 na\u00efve" in doc.markdown


async def test_the_charset_comes_from_meta_when_the_header_has_none(
    site: Site, engine: HttpEngine
) -> None:
    doc = (await engine.scrape(site.url("/meta-charset"), OPTS)).document
    assert "\u00e9t\u00e9" in doc.markdown


async def test_an_invalid_url_is_rejected_without_a_request(engine: HttpEngine) -> None:
    assert (await _error(engine, "ftp://example.com/")).code == ErrorCode.INVALID_URL


# --- robots.txt and politeness ---------------------------------------------------------------


async def test_a_path_disallowed_by_robots_is_robots_disallowed(
    site: Site, engine: HttpEngine
) -> None:
    site.robots = "User-agent: *\nDisallow: /private/\n"
    err = await _error(engine, site.url("/private/1"))
    assert err.code == ErrorCode.ROBOTS_DISALLOWED
    assert site.arrivals["/private/1"] == []
    await engine.scrape(site.url("/page"), OPTS)  # other paths are fine


async def test_robots_groups_match_our_agent_token(site: Site, engine: HttpEngine) -> None:
    site.robots = "User-agent: pagesift\nDisallow: /page\n\nUser-agent: *\nDisallow:\n"
    assert (await _error(engine, site.url("/page"))).code == ErrorCode.ROBOTS_DISALLOWED
    await engine.scrape(site.url("/spaced/1"), OPTS)


async def test_robots_applies_to_every_redirect_hop(site: Site, engine: HttpEngine) -> None:
    site.robots = "User-agent: *\nDisallow: /private/\n"
    err = await _error(engine, site.url("/to-private"))
    assert err.code == ErrorCode.ROBOTS_DISALLOWED
    assert site.arrivals["/private/1"] == []


async def test_robots_can_be_ignored_by_the_job_or_the_server(
    site: Site, make_engine: EngineMaker
) -> None:
    site.robots = "User-agent: *\nDisallow: /\n"
    engine = await make_engine(CONFIG)
    policy = FetchPolicy(request=RequestProfile(respect_robots=False))
    page = await engine.scrape(site.url("/page"), OPTS, policy)
    assert page.document.title == "Hello"
    engine = await make_engine(replace(CONFIG, respect_robots=False))
    assert (await engine.scrape(site.url("/page"), OPTS)).document.title == "Hello"
    assert site.arrivals["/robots.txt"] == []


async def test_a_robots_server_error_disallows_everything(site: Site, engine: HttpEngine) -> None:
    site.robots, site.robots_status = "oops", 503
    assert (await _error(engine, site.url("/page"))).code == ErrorCode.ROBOTS_DISALLOWED


async def test_a_missing_robots_txt_allows_everything(site: Site, engine: HttpEngine) -> None:
    site.robots = None
    assert (await engine.scrape(site.url("/page"), OPTS)).document.title == "Hello"


async def test_concurrent_requests_share_one_robots_fetch(site: Site, engine: HttpEngine) -> None:
    site.robots = "User-agent: *\nAllow: /\n"
    await asyncio.gather(*(engine.scrape(site.url(f"/spaced/{i}"), OPTS) for i in range(6)))
    assert len(site.arrivals["/robots.txt"]) == 1


def _gaps(times: list[float]) -> list[float]:
    times = sorted(times)
    return [b - a for a, b in itertools.pairwise(times)]


async def test_crawl_delay_spaces_requests_to_one_host(site: Site, engine: HttpEngine) -> None:
    site.robots = "User-agent: *\nCrawl-delay: 0.5\n"
    urls = [site.url(f"/spaced/{i}") for i in range(4)]
    await asyncio.gather(*(engine.scrape(u, OPTS) for u in urls))
    times = [t for i in range(4) for t in site.arrivals[f"/spaced/{i}"]]
    gaps = _gaps(times)
    assert len(gaps) == 3
    assert min(gaps) >= 0.5 - 0.02, gaps
    # no more than the delay asks, with room for a loaded box's late timers (a delay
    # applied twice would be 1.0 s)
    assert max(gaps) < 0.5 + 0.4, gaps


async def test_the_job_delay_spaces_requests_to_one_host(site: Site, engine: HttpEngine) -> None:
    policy = FetchPolicy(delay=0.15)
    await asyncio.gather(*(engine.scrape(site.url(f"/spaced/{i}"), OPTS, policy) for i in range(3)))
    times = [t for i in range(3) for t in site.arrivals[f"/spaced/{i}"]]
    assert min(_gaps(times)) >= 0.15 - 0.02


def test_the_effective_delay_is_the_largest_with_crawl_delay_capped() -> None:
    assert effective_delay(0.0, 0.0, None) == 0.0
    assert effective_delay(0.5, 0.1, None) == 0.5
    assert effective_delay(0.1, 2.0, 1.0) == 2.0
    assert effective_delay(0.0, 1.0, 5.0) == 5.0
    assert effective_delay(0.0, 1.0, 3600.0) == 60.0


async def test_host_slots_cap_concurrency_and_forget_idle_hosts() -> None:
    slots = HostSlots(concurrency=2)
    inside = peak = 0

    async def one() -> None:
        nonlocal inside, peak
        async with slots.slot("h.example"):
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(7))), 5)
    assert peak == 2
    assert len(slots) == 0


async def test_host_slots_keep_a_host_only_for_its_delay_window() -> None:
    slots = HostSlots(concurrency=1)
    async with slots.slot("h.example", 0.05):
        pass
    assert len(slots) == 1
    await asyncio.sleep(0.1)
    assert len(slots) == 0


async def test_a_cancelled_waiter_gives_its_slot_back() -> None:
    slots = HostSlots(concurrency=1)
    release = asyncio.Event()

    async def holder() -> None:
        async with slots.slot("h"):
            await release.wait()

    first = asyncio.create_task(holder())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    waiter.cancel()
    release.set()
    await asyncio.wait_for(first, 1)
    async with asyncio.timeout(1):
        async with slots.slot("h"):
            pass
    assert waiter.cancelled()
    assert len(slots) == 0


# --- network failures and the address guard ---------------------------------------------------


async def test_a_refused_connection_is_connect(engine: HttpEngine) -> None:
    port = free_port()
    err = await _error(engine, f"http://127.0.0.1:{port}/page")
    assert err.code == ErrorCode.CONNECT


async def test_an_unresolvable_host_is_dns(engine: HttpEngine) -> None:
    err = await _error(engine, "http://no-such-host.invalid/page")
    assert err.code == ErrorCode.DNS


@pytest.mark.parametrize("host", ["127.0.0.1", "[::ffff:127.0.0.1]", "localhost", "0.0.0.0"])
async def test_loopback_targets_are_blocked_without_allow_private_networks(
    site: Site, make_engine: EngineMaker, host: str
) -> None:
    assert site.server is not None
    engine = await make_engine(replace(CONFIG, allow_private_networks=False))
    err = await _error(engine, f"http://{host}:{site.server.port}/page")
    assert err.code == ErrorCode.BLOCKED_ADDRESS
    assert sum(len(v) for v in site.arrivals.values()) == 0


class _StubResolver(AbstractResolver):
    """Answers every name with fixed addresses (the DNS side of the guard, no HTTP)."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(hostname=host, host=a, port=port, family=family, proto=0, flags=0)
            for a in self.addresses
        ]

    async def close(self) -> None:
        pass


async def test_the_guarded_resolver_refuses_a_name_with_any_private_address() -> None:
    with pytest.raises(BlockedAddressError, match=r"10\.1\.2\.3"):
        await GuardedResolver(_StubResolver("93.184.216.34", "10.1.2.3")).resolve("evil.example")
    with pytest.raises(BlockedAddressError):
        await GuardedResolver(_StubResolver("::ffff:169.254.169.254")).resolve("meta.example")
    ok = await GuardedResolver(_StubResolver("93.184.216.34")).resolve("good.example", 80)
    assert ok[0]["host"] == "93.184.216.34"


# --- sitemaps -------------------------------------------------------------------------------------


async def test_sitemap_indexes_and_gzipped_sitemaps_are_followed(
    site: Site, engine: HttpEngine
) -> None:
    site.robots = f"User-agent: *\nAllow: /\nSitemap: {site.url('/sitemap_index.xml')}\n"
    found = await engine.sitemap_urls(site.url("/"))
    assert found == [
        site.url("/docs"),
        site.url("/docs/one?x=1&y=2"),
        site.url("/page"),
        site.url("/blog/1"),
        site.url("/blog/2"),
    ]
    assert site.arrivals["/sitemap.xml"] == []


async def test_without_a_sitemap_line_sitemap_xml_is_read(site: Site, engine: HttpEngine) -> None:
    assert await engine.sitemap_urls(site.url("/page")) == [site.url("/only")]


async def test_an_unreachable_sitemap_yields_no_urls(engine: HttpEngine) -> None:
    port = free_port()
    assert await engine.sitemap_urls(f"http://127.0.0.1:{port}/") == []
