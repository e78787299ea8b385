"""The address guard on every browser request: ``engine.browser.guardproxy``.

A real chromium-headless-shell (one per module, launched by Playwright with the
guard's flags and a launch proxy without credentials) renders pages of a loopback
"public" site whose (IP, port) is exempt. Each hostile page aims one kind of request
(redirect, img, script, css, iframe, fetch, XHR, sendBeacon, WebSocket, a
``localhost`` name, DNS rebinding) at an internal listener on another loopback
endpoint: a raw asyncio server that counts TCP accepts, so "0" means no connection,
not only no request. Each row also checks the proxy counted the refusal (the request
was made and stopped, not merely never sent), and ``test_control_*`` runs the same
pages through a proxy that exempts the listener: every kind then reaches it, so the
rows cannot pass by the pages being inert. The positive controls (the public page,
its subresources, a ws echo) pass through. Bounds, credentials and upstream-proxy
chaining are exercised with raw sockets against the same proxy.
"""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from playwright.async_api import Browser, BrowserContext, Page, ProxySettings, async_playwright

from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.browser import actions, idlepages, render
from pagesift.primary.engine.browser.guardproxy import (
    ERROR_HEADER,
    GUARD_LAUNCH_ARGS,
    PRIME_URL,
    GuardProxy,
    ProxyCredentials,
    guarded_context_options,
    launch_proxy,
)
from pagesift.primary.engine.browser.proxyhead import (
    Head,
    Target,
    parse_head,
    parse_target,
    upstream_request,
)
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.primary.engine.reqprofile import ProxyPool
from pagesift.v1 import jobs_pb2 as pb
from tests.helpers import MapResolver, until

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

CHROMIUM = "/usr/lib/chromium/chromium-headless-shell"
SETTLE = 0.3  # seconds a refused request is given to (wrongly) reach the listener
BOUNDS = actions.Bounds(5.0, 5.0, 2000, 1 << 20)


# ---------------------------------------------------------------- listeners and sites


@dataclass
class Counting:
    """A raw TCP listener: counts accepts, records each request line, answers 200."""

    host: str = "127.0.0.1"
    port: int = 0
    accepts: int = 0
    lines: list[str] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def start(self, port: int = 0) -> Counting:
        self.server = await asyncio.start_server(self._conn, self.host, port)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepts += 1
        try:
            async with asyncio.timeout(2):
                head = await reader.readuntil(b"\r\n\r\n")
            self.lines.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def paths(self) -> set[str]:
        return {line.split(" ")[1] for line in self.lines if line.count(" ") >= 2}

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


_DONE = "window.done=true"
# One request of each kind to {base}/{kind}; ``window.done`` once it has failed or ended.
_HOSTILE = {
    "img": f'<img src="{{base}}/img" onerror="{_DONE}" onload="{_DONE}">',
    "script": f'<script src="{{base}}/script" onerror="{_DONE}" onload="{_DONE}"></script>',
    "css": f'<link rel="stylesheet" href="{{base}}/css" onerror="{_DONE}" onload="{_DONE}">',
    "iframe": f'<iframe src="{{base}}/iframe" onload="{_DONE}"></iframe>',
    "fetch": f"<script>fetch('{{base}}/fetch', {{{{mode: 'no-cors'}}}})"
    f".then(() => {{{{{_DONE}}}}}, () => {{{{{_DONE}}}}})</script>",
    "xhr": "<script>const x = new XMLHttpRequest(); x.open('GET', '{base}/xhr');"
    f" x.onloadend = () => {{{{{_DONE}}}}}; x.send()</script>",
    "beacon": f"<script>navigator.sendBeacon('{{base}}/beacon', 'x'); {_DONE}</script>",
    "ws": "<script>const w = new WebSocket('{wsbase}/ws');"
    f" w.onerror = w.onclose = w.onopen = () => {{{{{_DONE}}}}}</script>",
}
KINDS = sorted(_HOSTILE)

_HOME = """<html><head><link rel="stylesheet" href="/style.css"></head><body>
<p id="text">public page</p><img id="pixel" src="/pixel.gif">
<script src="/app.js"></script>
<script>
const w = new WebSocket('ws://' + location.host + '/echo');
w.onopen = () => w.send('ping');
w.onmessage = (e) => { window.echo = e.data };
</script></body></html>"""
_GIF = base64.b64decode("R0lGODlhAQABAIAAAP///wAAACH5BAEAAAAALAAAAAABAAEAAAICRAEAOw==")


class PublicSite:
    """The allowed site on 127.0.0.1 (its endpoint exempt from the guard)."""

    def __init__(self) -> None:
        self.port = 0
        self.runner: web.AppRunner | None = None
        self.hits: list[str] = []

    async def start(self) -> PublicSite:
        app = web.Application()
        app.router.add_get("/", self.home)
        app.router.add_get("/hostile", self.hostile)
        app.router.add_get("/redirect", self.redirect)
        app.router.add_get("/echo", self.echo)
        app.router.add_get("/{name}", self.asset)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.port = int(self.runner.addresses[0][1])
        return self

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    async def home(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        return web.Response(text=_HOME, content_type="text/html")

    async def hostile(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        base = request.query["base"]
        body = _HOSTILE[request.query["kind"]].format(
            base=base, wsbase=base.replace("http://", "ws://", 1)
        )
        return web.Response(text=f"<html><body>{body}</body></html>", content_type="text/html")

    async def redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def echo(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            await ws.send_str(f"echo:{msg.data}")
        return ws

    async def asset(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        name = request.match_info["name"]
        if name == "pixel.gif":
            return web.Response(body=_GIF, content_type="image/gif")
        if name == "app.js":
            return web.Response(text="window.scriptRan = true;", content_type="text/javascript")
        if name == "style.css":
            return web.Response(text="#text { color: rgb(1, 2, 3) }", content_type="text/css")
        if name == "sw.js":
            return web.Response(text="self.onfetch = () => {};", content_type="text/javascript")
        if name == "sw":
            return web.Response(text=_SW_PAGE, content_type="text/html")
        if name == "cached":  # a page whose script the browser may keep for 10 minutes
            page = "<html><body><p>cached page</p><script src='/cached.js'></script></body></html>"
            return web.Response(text=page, content_type="text/html")
        if name == "cached.js":
            headers = {"Cache-Control": "max-age=600"}
            return web.Response(text="1;", content_type="text/javascript", headers=headers)
        return web.Response(text="page", content_type="text/html")


_SW_PAGE = """<html><body><script>
navigator.serviceWorker.register('/sw.js')
  .then(async (reg) => { window.sw = String(reg) + ':' +
          (await navigator.serviceWorker.getRegistrations()).length })
  .catch((e) => { window.sw = 'refused' });
</script></body></html>"""


class FlipResolver(AbstractResolver):
    """DNS rebinding: ``name`` answers ``first`` once, then ``then`` for ever."""

    def __init__(self, name: str, first: str, then: str) -> None:
        self.name, self.answers, self.asked = name, [first], 0
        self.then = then

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host != self.name:
            raise OSError(f"{host} is not a test name")
        self.asked += 1
        ip = self.answers.pop() if self.answers else self.then
        return [
            ResolveResult(
                hostname=host, host=ip, port=port, family=socket.AF_INET, proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]  # fmt: skip

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------- fixtures


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def site() -> AsyncIterator[PublicSite]:
    s = await PublicSite().start()
    yield s
    assert s.runner is not None
    await s.runner.cleanup()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def door() -> AsyncIterator[GuardProxy]:
    """The browser's launch proxy: a GuardProxy with no registration (all 407)."""
    proxy = GuardProxy(AddressGuard())
    await proxy.start()
    yield proxy
    await proxy.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser(door: GuardProxy) -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        b = await pw.chromium.launch(
            executable_path=CHROMIUM,
            args=list(GUARD_LAUNCH_ARGS),
            proxy=_settings(launch_proxy(door.server)),
        )
        yield b
        await b.close()


@pytest_asyncio.fixture(loop_scope="module")
async def internal() -> AsyncIterator[Counting]:
    c = await Counting().start()
    yield c
    await c.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def proxies() -> AsyncIterator[list[GuardProxy]]:
    """Proxies a test builds (append after ``start``); each closed at the end."""
    made: list[GuardProxy] = []
    yield made
    for p in made:
        await p.close()
        assert p.stats().active == 0


@pytest_asyncio.fixture(loop_scope="module")
async def contexts(browser: Browser) -> AsyncIterator[list[BrowserContext]]:
    made: list[BrowserContext] = []
    yield made
    for ctx in made:
        await ctx.close()


async def _proxy(made: list[GuardProxy], *exempt: tuple[str, int], **kw: Any) -> GuardProxy:
    kw.setdefault("resolver", MapResolver({}))
    proxy = GuardProxy(AddressGuard(exempt=frozenset(exempt)), **kw)
    await proxy.start()
    made.append(proxy)
    return proxy


async def _page(
    browser: Browser, contexts: list[BrowserContext], creds: ProxyCredentials | None
) -> Page:
    ctx = await browser.new_context(**(guarded_context_options(creds) if creds else {}))
    contexts.append(ctx)
    return await ctx.new_page()


async def _hostile(
    page: Page, site: PublicSite, kind: str, base: str, host: str = "127.0.0.1"
) -> None:
    """Open the public page that aims ``kind`` at ``base``; wait for the attempt."""
    url = site.url("/hostile", host) + "?" + urlencode({"kind": kind, "base": base})
    response = await page.goto(url)
    assert response is not None and response.status == 200  # the allowed page itself
    await page.wait_for_function("window.done === true", timeout=10_000)


# ---------------------------------------------------------------- positive controls


async def test_the_public_page_its_subresources_and_a_ws_echo_go_through(
    browser: Browser, contexts: list[BrowserContext], site: PublicSite, proxies: list[GuardProxy]
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port))
    creds = proxy.register()
    page = await _page(browser, contexts, creds)
    response = await page.goto(site.url())
    assert response is not None and response.status == 200
    await page.wait_for_function("window.echo === 'echo:ping'", timeout=10_000)
    assert await page.evaluate("window.scriptRan") is True
    color = "getComputedStyle(document.getElementById('text')).color"
    assert await page.evaluate(color) == "rgb(1, 2, 3)"
    assert await page.evaluate("document.getElementById('pixel').naturalWidth") == 1
    usage = proxy.usage(creds)
    assert usage.blocked == 0 and usage.requests >= 4 and usage.bytes_down > len(_HOME)
    assert proxy.stats().tunnels >= 1  # ws:// went through CONNECT


async def test_control_the_hostile_pages_reach_the_listener_when_it_is_exempt(
    browser: Browser,
    contexts: list[BrowserContext],
    site: PublicSite,
    internal: Counting,
    proxies: list[GuardProxy],
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port), ("127.0.0.1", internal.port))
    page = await _page(browser, contexts, proxy.register())
    base = f"http://127.0.0.1:{internal.port}"
    for kind in KINDS:
        await _hostile(page, site, kind, base)
    response = await page.goto(site.url("/redirect") + f"?to={base}/secret")
    assert response is not None and response.status == 200
    want = {f"/{kind}" for kind in KINDS} | {"/secret"}
    await until(lambda: want <= internal.paths(), f"{want} reached the listener")
    assert internal.accepts >= len(want)


# ---------------------------------------------------------------- the guard table


@pytest.mark.parametrize("kind", KINDS)
async def test_a_request_of_each_kind_to_an_internal_port_makes_no_connection(
    kind: str,
    browser: Browser,
    contexts: list[BrowserContext],
    site: PublicSite,
    internal: Counting,
    proxies: list[GuardProxy],
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port))
    creds = proxy.register()
    page = await _page(browser, contexts, creds)
    await _hostile(page, site, kind, f"http://127.0.0.1:{internal.port}")
    await until(lambda: proxy.usage(creds).blocked >= 1, "the proxy refused the request")
    await asyncio.sleep(SETTLE)
    assert internal.accepts == 0
    assert "loopback address" in proxy.usage(creds).last_refusal
    assert proxy.stats().blocked_bytes > 0


async def test_a_redirect_from_the_public_site_to_an_internal_port_is_refused(
    browser: Browser,
    contexts: list[BrowserContext],
    site: PublicSite,
    internal: Counting,
    proxies: list[GuardProxy],
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port))
    creds = proxy.register()
    page = await _page(browser, contexts, creds)
    to = f"http://127.0.0.1:{internal.port}/secret"
    response = await page.goto(site.url("/redirect") + f"?to={to}")
    assert response is not None and response.status == 403
    assert response.headers[ERROR_HEADER.lower()] == "blocked_address"
    assert "address guard" in await response.text()
    await asyncio.sleep(SETTLE)
    assert internal.accepts == 0 and proxy.usage(creds).blocked == 1


@pytest.mark.parametrize("name", ["localhost", "app.localhost", "LOCALHOST."])
async def test_localhost_names_are_refused_without_asking_dns(
    name: str,
    browser: Browser,
    contexts: list[BrowserContext],
    site: PublicSite,
    internal: Counting,
    proxies: list[GuardProxy],
) -> None:
    names = MapResolver({})
    proxy = await _proxy(proxies, ("127.0.0.1", site.port), resolver=names)
    creds = proxy.register()
    page = await _page(browser, contexts, creds)
    await _hostile(page, site, "fetch", f"http://{name}:{internal.port}")
    response = await page.goto(f"http://{name}:{internal.port}/nav")
    assert response is not None and response.status == 403
    await asyncio.sleep(SETTLE)
    assert internal.accepts == 0 and proxy.usage(creds).blocked == 2
    assert "loopback name" in proxy.usage(creds).last_refusal
    assert names.asked == []


async def test_dns_rebinding_is_judged_on_the_address_the_proxy_connects_to(
    browser: Browser, contexts: list[BrowserContext], site: PublicSite, proxies: list[GuardProxy]
) -> None:
    # rebind.test answers the public site's address once, then 127.0.0.2, where the
    # internal listener waits on the same port (same origin for the page)
    inside = await Counting(host="127.0.0.2").start(site.port)
    try:
        names = FlipResolver("rebind.test", "127.0.0.1", "127.0.0.2")
        proxy = await _proxy(proxies, ("127.0.0.1", site.port), resolver=names)
        creds = proxy.register()
        page = await _page(browser, contexts, creds)
        base = f"http://rebind.test:{site.port}"
        await _hostile(page, site, "fetch", base, "rebind.test")  # the page: first answer
        response = await page.goto(f"{base}/again")  # the same name, now rebound
        assert response is not None and response.status == 403
        await asyncio.sleep(SETTLE)
        assert inside.accepts == 0
        assert names.asked >= 3 and proxy.usage(creds).blocked >= 2
        assert "127.0.0.2" in proxy.usage(creds).last_refusal
    finally:
        await inside.stop()


async def test_a_name_with_any_blocked_address_is_refused(
    site: PublicSite, internal: Counting, proxies: list[GuardProxy]
) -> None:
    class Both(MapResolver):
        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[ResolveResult]:
            first = await super().resolve(host, port, family)
            return [*first, dict(first[0], host="127.0.0.1")]  # type: ignore[list-item]

    names = Both({"mixed.test": "93.184.216.34"})
    proxy = await _proxy(proxies, ("127.0.0.1", site.port), resolver=names)
    creds = proxy.register()
    status, headers, _ = await _get(proxy, creds, f"http://mixed.test:{internal.port}/")
    assert status == 403 and headers[ERROR_HEADER] == "blocked_address"
    assert internal.accepts == 0 and proxy.usage(creds).blocked == 1


async def test_every_checked_address_of_a_name_is_tried_in_order(
    site: PublicSite, proxies: list[GuardProxy]
) -> None:
    class Two(MapResolver):
        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[ResolveResult]:
            first = await super().resolve(host, port, family)
            return [*first, dict(first[0], host="127.0.0.1")]  # type: ignore[list-item]

    # 127.0.0.3 (exempt, nothing listens) refuses; the second address is the site
    names = Two({"two.test": "127.0.0.3"})
    proxy = await _proxy(
        proxies, ("127.0.0.1", site.port), ("127.0.0.3", site.port), resolver=names
    )
    creds = proxy.register()
    status, _, body = await _get(proxy, creds, site.url(host="two.test"))
    assert status == 200 and b"public page" in body
    status, headers, _ = await _get(proxy, creds, site.url(host="nowhere.test"))
    assert status == 502 and headers[ERROR_HEADER] == "dns"


async def test_webrtc_sends_no_udp_with_the_guard_flag_and_does_without_it(
    browser: Browser,
    contexts: list[BrowserContext],
    site: PublicSite,
    proxies: list[GuardProxy],
    door: GuardProxy,
) -> None:
    class Udp(asyncio.DatagramProtocol):
        packets = 0

        def datagram_received(self, data: bytes, addr: Any) -> None:
            self.packets += 1

    loop = asyncio.get_running_loop()
    transport, udp = await loop.create_datagram_endpoint(Udp, local_addr=("127.0.0.1", 0))
    port = transport.get_extra_info("sockname")[1]
    script = (
        "async (port) => { const pc = new RTCPeerConnection("
        "{iceServers: [{urls: 'stun:127.0.0.1:' + port}]}); pc.createDataChannel('x');"
        " await pc.setLocalDescription(await pc.createOffer());"
        " await new Promise((ok) => { pc.onicegatheringstatechange = () =>"
        " { if (pc.iceGatheringState === 'complete') ok() }; setTimeout(ok, 3000) }) }"
    )
    try:
        proxy = await _proxy(proxies, ("127.0.0.1", site.port))
        page = await _page(browser, contexts, proxy.register())
        await page.goto(site.url("/blank"))
        await page.evaluate(script, port)
        await asyncio.sleep(SETTLE)
        assert udp.packets == 0
        # control: the same page in a browser launched without the flag sends STUN
        async with async_playwright() as pw:
            bare = await pw.chromium.launch(
                executable_path=CHROMIUM, proxy=_settings(launch_proxy(door.server))
            )
            try:
                ctx = await bare.new_context(**guarded_context_options(proxy.register()))
                page = await ctx.new_page()
                await page.goto(site.url("/blank"))
                await page.evaluate(script, port)
                await until(lambda: udp.packets > 0, "STUN packets without the flag")
            finally:
                await bare.close()
    finally:
        transport.close()


async def test_service_workers_do_not_register_in_a_guarded_context(
    browser: Browser, contexts: list[BrowserContext], site: PublicSite, proxies: list[GuardProxy]
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port))
    page = await _page(browser, contexts, proxy.register())
    await page.goto(site.url("/sw"))
    await page.wait_for_function("window.sw !== undefined", timeout=10_000)
    assert await page.evaluate("window.sw") in ("undefined:0", "refused")


async def test_guarded_context_options_override_what_the_guard_owns() -> None:
    creds = ProxyCredentials("u", "p", "http://127.0.0.1:9")
    base = {
        "proxy": {"server": "http://elsewhere:1", "bypass": "<loopback>"},
        "service_workers": "allow",
        "accept_downloads": True,
        "locale": "de-DE",
    }
    got = guarded_context_options(creds, base)
    assert got == {
        "proxy": {"server": "http://127.0.0.1:9", "username": "u", "password": "p"},
        "service_workers": "block",
        "accept_downloads": False,
        "locale": "de-DE",
    }
    assert "--force-webrtc-ip-handling-policy=disable_non_proxied_udp" in GUARD_LAUNCH_ARGS
    assert launch_proxy(creds.server) == {"server": creds.server}  # no credentials


# ---------------------------------------------------------------- credentials


async def test_without_a_registration_the_browser_gets_407_and_makes_no_connection(
    browser: Browser,
    contexts: list[BrowserContext],
    site: PublicSite,
    internal: Counting,
    door: GuardProxy,
) -> None:
    before, hits = door.stats().unauthorized, len(site.hits)
    page = await _page(browser, contexts, None)  # the launch proxy, no credentials
    for url in (f"http://127.0.0.1:{internal.port}/x", site.url()):
        response = await page.goto(url)
        assert response is not None and response.status == 407
    await asyncio.sleep(SETTLE)
    assert internal.accepts == 0 and len(site.hits) == hits
    assert door.stats().unauthorized > before and door.stats().requests == 0


async def test_unknown_wrong_and_released_credentials_get_407(
    site: PublicSite, proxies: list[GuardProxy]
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port))
    creds = proxy.register()
    hits = len(site.hits)
    assert (await _get(proxy, creds, site.url()))[0] == 200
    wrong = ProxyCredentials(creds.username, creds.password + "x", creds.server)
    stranger = ProxyCredentials("ctx-nobody", creds.password, creds.server)
    for bad in (wrong, stranger, None):
        status, headers, _ = await _get(proxy, bad, site.url())
        assert status == 407 and headers["Proxy-Authenticate"].startswith("Basic")
    final = proxy.release(creds)
    assert final is not None and final.requests == 1
    assert (await _get(proxy, creds, site.url()))[0] == 407
    assert len(site.hits) == hits + 1 and proxy.stats().registrations == 0


async def test_the_prime_url_is_answered_by_the_proxy_itself_and_only_with_credentials(
    site: PublicSite, proxies: list[GuardProxy]
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port))  # MapResolver({}): no DNS
    creds = proxy.register()
    status, headers, body = await _get(proxy, creds, PRIME_URL)
    assert status == 204 and headers["Access-Control-Allow-Origin"] == "*" and body == b""
    assert (await _get(proxy, None, PRIME_URL))[0] == 407
    proxy.release(creds)
    assert (await _get(proxy, creds, PRIME_URL))[0] == 407
    assert proxy.stats().requests == 0  # nothing was asked of any host


async def test_a_render_context_teaches_its_credentials_once_and_every_connection_has_them(
    browser: Browser, site: PublicSite, internal: Counting, proxies: list[GuardProxy]
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port))
    creds = proxy.register()
    ctx = await render.new_context(
        browser, pb.ScrapeOptions(), block_heavy=False, proxy=creds.playwright()
    )
    idle = idlepages.IdlePages()
    limits: dict[str, Any] = {"bounds": BOUNDS, "timeout": 20.0, "max_html_bytes": 1 << 20}
    try:
        # the context was given the proxy's server only, and a page that taught it the
        # credentials (one 407, the prime's): Playwright intercepts no request
        assert proxy.stats().unauthorized == 1
        for _ in range(2):  # the kept page, then a new one beside it
            pages = await asyncio.gather(
                *(render.render_in(browser, ctx, site.url(), pb.ScrapeOptions(), idle=idle,
                                   **limits) for _ in range(2))
            )  # fmt: skip
            assert all(b"public page" in got.html for got in pages)
        await until(lambda: proxy.stats().tunnels >= 1, "the pages' ws:// went by CONNECT")
        assert proxy.stats().unauthorized == 1  # every later connection carried them
        # no interception: the context's HTTP cache is on (Playwright turns it off when
        # it answers the proxy's 407s itself), so a cacheable script is asked once
        for _ in range(2):
            await render.render_in(browser, ctx, site.url("/cached"), pb.ScrapeOptions(), **limits)
        assert site.hits.count("/cached.js") == 1
        assert proxy.usage(creds).requests >= 4 * 4 and proxy.usage(creds).blocked == 0
        # and the guard holds on them: a hostile page's fetch makes no connection
        got = await render.render_in(
            browser, ctx, site.url("/hostile") + "?" + urlencode(
                {"kind": "fetch", "base": f"http://127.0.0.1:{internal.port}"}
            ), pb.ScrapeOptions(), **limits,
        )  # fmt: skip
        assert got.status == 200
        await until(lambda: proxy.usage(creds).blocked >= 1, "the proxy refused the fetch")
        await asyncio.sleep(SETTLE)
        assert internal.accepts == 0
    finally:
        idle.close()
        await ctx.close()


async def test_a_render_context_whose_credentials_are_refused_fails_and_reaches_nothing(
    browser: Browser, site: PublicSite, proxies: list[GuardProxy]
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port))
    creds = proxy.register()
    proxy.release(creds)
    hits = len(site.hits)
    with pytest.raises(PageError) as err:
        await render.new_context(
            browser, pb.ScrapeOptions(), block_heavy=True, proxy=creds.playwright()
        )
    assert err.value.code == ErrorCode.RENDER_FAILED and "refused" in err.value.message
    assert len(site.hits) == hits and proxy.stats().requests == 0


# ---------------------------------------------------------------- upstream proxies


@dataclass
class Upstream:
    """A minimal CONNECT proxy: records each (target, Proxy-Authorization), splices."""

    seen: list[tuple[str, str]] = field(default_factory=list)
    counter: Counting = field(default_factory=Counting)
    server: asyncio.Server | None = None
    port: int = 0

    async def start(self) -> Upstream:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = parse_head(await reader.readuntil(b"\r\n\r\n"))
            self.seen.append((head.target, head.get("proxy-authorization") or ""))
            host, _, port = head.target.rpartition(":")
            up_r, up_w = await asyncio.open_connection(host.strip("[]"), int(port))
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n")

            async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
                w.close()

            async with asyncio.timeout(10):
                await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest_asyncio.fixture(loop_scope="module")
async def upstream() -> AsyncIterator[Upstream]:
    u = await Upstream().start()
    yield u
    await u.stop()


async def test_a_jobs_own_proxy_url_is_chained_by_connect_to_the_checked_address(
    browser: Browser,
    contexts: list[BrowserContext],
    site: PublicSite,
    upstream: Upstream,
    proxies: list[GuardProxy],
) -> None:
    proxy = await _proxy(
        proxies,
        ("127.0.0.1", site.port),
        ("127.0.0.1", upstream.port),
        resolver=MapResolver({"site.test": "127.0.0.1"}),
    )
    creds = proxy.register(proxy_url=f"http://joe:s3cret@127.0.0.1:{upstream.port}")
    page = await _page(browser, contexts, creds)
    response = await page.goto(site.url(host="site.test"))
    assert response is not None and response.status == 200
    auth = "Basic " + base64.b64encode(b"joe:s3cret").decode()
    assert (f"127.0.0.1:{site.port}", auth) in upstream.seen  # the address, not the name


async def test_a_pool_proxy_is_exempt_only_as_a_proxy_and_a_jobs_own_is_not(
    site: PublicSite, upstream: Upstream, internal: Counting, proxies: list[GuardProxy]
) -> None:
    pool = ProxyPool(proxies=(("near", f"http://127.0.0.1:{upstream.port}"),))
    proxy = await _proxy(proxies, ("127.0.0.1", site.port), pool=pool)
    via_pool = proxy.register(proxy="near")
    assert (await _get(proxy, via_pool, site.url()))[0] == 200
    assert upstream.seen == [(f"127.0.0.1:{site.port}", "")]
    # the pool's endpoint is no target: directly, or through the pool proxy
    direct = proxy.register()
    assert (await _get(proxy, direct, f"http://127.0.0.1:{upstream.port}/"))[0] == 403
    assert (await _get(proxy, via_pool, f"http://127.0.0.1:{internal.port}/"))[0] == 403
    # an account's own proxy on a private address is refused before any connection
    own = proxy.register(proxy_url=f"http://127.0.0.1:{internal.port}")
    status, headers, _ = await _get(proxy, own, site.url())
    assert status == 403 and headers[ERROR_HEADER] == "blocked_address"
    own = proxy.register(proxy_url=f"http://127.0.0.1:{upstream.port}")  # the pool's, too
    assert (await _get(proxy, own, site.url()))[0] == 403
    assert internal.accepts == 0 and len(upstream.seen) == 1


# ---------------------------------------------------------------- bounds


async def test_an_oversized_or_malformed_head_is_answered_without_a_connection(
    site: PublicSite, proxies: list[GuardProxy]
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port), max_head=1024)
    creds = proxy.register()
    big = f"GET {site.url()} HTTP/1.1\r\nX-Big: {'a' * 2000}\r\n\r\n".encode()
    assert (await _raw(proxy, big)).startswith(b"HTTP/1.1 431 ")
    assert (await _raw(proxy, b"NONSENSE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
    ftp = f"GET ftp://127.0.0.1:{site.port}/ HTTP/1.1\r\n{_auth(creds)}\r\n".encode()
    assert (await _raw(proxy, ftp)).startswith(b"HTTP/1.1 400 ")
    assert proxy.usage(creds).blocked == 0


async def test_connections_over_the_bound_get_503(
    site: PublicSite, proxies: list[GuardProxy]
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port), max_connections=2)
    held = [await asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(2)]
    await until(lambda: proxy.stats().active == 2, "two connections held")
    assert (await _raw(proxy, b"")).startswith(b"HTTP/1.1 503 ")
    for _, w in held:
        w.close()
    await until(lambda: proxy.stats().active == 0, "held connections ended")
    assert (await _get(proxy, proxy.register(), site.url()))[0] == 200


async def test_an_idle_tunnel_is_closed_and_release_and_close_end_every_connection(
    site: PublicSite, proxies: list[GuardProxy]
) -> None:
    proxy = await _proxy(proxies, ("127.0.0.1", site.port), idle_timeout=0.3)
    creds = proxy.register()
    reader, writer = await _tunnel(proxy, creds, site.port)
    async with asyncio.timeout(3):
        assert await reader.read() == b""  # idle: closed by the proxy
    writer.close()
    slow = await _proxy(proxies, ("127.0.0.1", site.port), idle_timeout=60)
    creds = slow.register()
    r1, w1 = await _tunnel(slow, creds, site.port)
    other = slow.register()
    r2, w2 = await _tunnel(slow, other, site.port)
    slow.release(creds)
    async with asyncio.timeout(3):
        assert await r1.read() == b""  # released: its tunnel ends
    assert slow.stats().active == 1
    await slow.close()
    async with asyncio.timeout(3):
        assert await r2.read() == b""
    assert slow.stats().active == 0
    w1.close()
    w2.close()


# ---------------------------------------------------------------- pure parts


async def test_parse_head_and_target_forms() -> None:
    head = parse_head(b"CONNECT [::1]:443 HTTP/1.1\r\nHost: [::1]:443\r\n\r\n")
    assert parse_target(head) == Target(True, "::1", 443)
    head = parse_head(b"GET http://Example.COM./a?b=1#f HTTP/1.1\r\nHost: example.com\r\n\r\n")
    assert parse_target(head) == Target(False, "example.com", 80, "/a?b=1")
    assert parse_target(parse_head(b"GET http://2130706433:8/ HTTP/1.1\r\n\r\n")).host == (
        "127.0.0.1"
    )
    for bad in (b"GET / HTTP/1.1\r\n\r\n", b"CONNECT host HTTP/1.1\r\n\r\n"):
        with pytest.raises(ValueError):
            parse_target(parse_head(bad))
    for bad in (b"GET http://a/ HTTP/2\r\n\r\n", b"GET http://a/ HTTP/1.1\r\n folded\r\n\r\n"):
        with pytest.raises(ValueError):
            parse_head(bad)


async def test_upstream_request_is_origin_form_with_hop_by_hop_headers_dropped() -> None:
    head = Head(
        "POST",
        "http://a.test/x?y",
        (
            ("Host", "a.test"),
            ("Proxy-Authorization", "Basic c2VjcmV0"),
            ("Proxy-Connection", "keep-alive"),
            ("Connection", "keep-alive, X-Drop, content-length"),  # framing: kept
            ("X-Drop", "1"),
            ("Content-Length", "2"),
        ),
    )
    out = upstream_request(head, Target(False, "a.test", 80, "/x?y")).decode()
    assert out == ("POST /x?y HTTP/1.1\r\nHost: a.test\r\nContent-Length: 2\r\n\r\n")


# ---------------------------------------------------------------- helpers


def _settings(proxy: dict[str, str]) -> ProxySettings:
    return {"server": proxy["server"]}


def _auth(creds: ProxyCredentials | None) -> str:
    if creds is None:
        return ""
    token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
    return f"Proxy-Authorization: Basic {token}\r\n"


async def _raw(proxy: GuardProxy, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(data)
        async with asyncio.timeout(5):
            return await reader.read()
    finally:
        writer.close()


async def _get(
    proxy: GuardProxy, creds: ProxyCredentials | None, url: str
) -> tuple[int, dict[str, str], bytes]:
    """One GET through the proxy on a connection of its own: status, headers, body."""
    wire = f"GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{_auth(creds)}\r\n"
    answer = await _raw(proxy, wire.encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


async def _tunnel(
    proxy: GuardProxy, creds: ProxyCredentials, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n{_auth(creds)}\r\n".encode())
    async with asyncio.timeout(5):
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
    return reader, writer
