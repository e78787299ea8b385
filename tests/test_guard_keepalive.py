"""Persistent connections through the guard proxy: ``guardproxy``, ``proxybody``, ``upstream``.

Every test talks to a real ``GuardProxy`` on 127.0.0.1 over raw sockets: a test-side
client writes request bytes and reads the proxy's answers with its own small HTTP/1.1
reader (not the proxy's code), and the origins are raw asyncio servers that answer
exact bytes and count their connections, or aiohttp where the bytes do not matter.
What is checked: requests on one browser connection share one origin connection;
chunked (extensions, trailers), length-framed, bodiless and interim responses arrive
byte-exact with the connection still in step; close-delimited and HTTP/1.0 responses
close it; request framing that could smuggle is a 400 with no origin connection, and
response framing that could desync a 502; each request on a kept connection is judged
alone (a blocked address, DNS rebinding, other credentials, none); the idle pool is a
registration's own, bounded, closed by ``release``/``close``, and a pooled connection
the origin dropped is retried once for a GET only. One real chromium-headless-shell
test renders a page with sub-resources in pagesift's own render context and counts
fewer origin and proxy connections than requests, with no 407 past the prime's.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from playwright.async_api import async_playwright

from pagesift.primary.engine.browser import render
from pagesift.primary.engine.browser.guardproxy import (
    ERROR_HEADER,
    GUARD_LAUNCH_ARGS,
    PRIME_URL,
    GuardProxy,
    ProxyCredentials,
    launch_proxy,
)
from pagesift.primary.engine.browser.proxybody import Framing, request_length, response_framing
from pagesift.primary.engine.browser.proxyhead import (
    Head,
    browser_head,
    parse_head,
    parse_response,
)
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.v1 import jobs_pb2 as pb
from tests.helpers import MapResolver, serve_handler, until
from tests.test_browser_guard import CHROMIUM, Counting, FlipResolver, Upstream

pytestmark = pytest.mark.asyncio(loop_scope="module")

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


# ---------------------------------------------------------------- origins and client


@dataclass
class Origin:
    """A raw HTTP/1.1 origin: reads requests (bodies by Content-Length, a 100 first when
    asked to continue) and writes ``answer(connection, n-th request on it, head)``'s
    bytes; None closes without an answer. Records every request and each connection
    whose peer closed it."""

    answer: Callable[[int, int, bytes], bytes | None] = lambda c, i, h: OK
    host: str = "127.0.0.1"
    close_after: bool = False  # close each connection after its first answer
    accepts: int = 0
    seen: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    ended: set[int] = field(default_factory=set)
    server: asyncio.Server | None = None
    port: int = 0

    async def start(self, port: int = 0) -> Origin:
        self.server = await asyncio.start_server(self._conn, self.host, port)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self

    def url(self, path: str = "/", host: str = "") -> str:
        return f"http://{host or self.host}:{self.port}{path}"

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepts += 1
        n = self.accepts
        try:
            for i in range(1, 100):
                try:
                    async with asyncio.timeout(20):
                        head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.ended.add(n)
                    return
                low = head.lower()
                if b"\r\nexpect: 100-continue\r\n" in low:
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                length = 0
                if b"\r\ncontent-length:" in low:
                    length = int(low.split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                self.seen.append((n, head, body))
                out = self.answer(n, i, head)
                if out is None:
                    return
                writer.write(out)
                await writer.drain()
                if self.close_after:
                    return
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def paths(self) -> list[str]:
        return [h.split(b" ")[1].decode() for _, h, _ in self.seen]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


@dataclass
class Reply:
    status: int
    head: bytes
    headers: dict[str, str]
    body: bytes  # as framed on the wire (chunk lines and trailers included)


class Client:
    """The browser's side of one proxy connection, read by this test's own parser."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def to(cls, proxy: GuardProxy) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", proxy.port))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def reply(self, method: str = "GET") -> Reply:
        async with asyncio.timeout(10):
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")[1:-2]
            headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines)}
            status = int(head.split(b" ")[1])
            if method == "HEAD" or status < 200 or status in (204, 304):
                return Reply(status, head, headers, b"")
            if headers.get("transfer-encoding", "").endswith("chunked"):
                body = b""
                while True:
                    line = await self.reader.readuntil(b"\r\n")
                    body += line
                    size = int(line.split(b";")[0], 16)
                    if size == 0:
                        break
                    body += await self.reader.readexactly(size + 2)
                while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
                    body += line
                return Reply(status, head, headers, body + line)
            if "content-length" in headers:
                body = await self.reader.readexactly(int(headers["content-length"]))
                return Reply(status, head, headers, body)
            return Reply(status, head, headers, await self.reader.read())

    async def get(self, url: str, creds: ProxyCredentials | None, extra: str = "") -> Reply:
        await self.send(_req("GET", url, creds, extra))
        return await self.reply()

    async def closed(self) -> bool:
        """Whether the proxy closed this connection (EOF within a bound)."""
        async with asyncio.timeout(10):
            return await self.reader.read(1) == b""

    def close(self) -> None:
        self.writer.close()


def _auth(creds: ProxyCredentials | None) -> str:
    if creds is None:
        return ""
    token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
    return f"Proxy-Authorization: Basic {token}\r\n"


def _req(
    method: str, url: str, creds: ProxyCredentials | None, extra: str = "", body: bytes = b""
) -> bytes:
    host = url.split("/")[2]
    head = f"{method} {url} HTTP/1.1\r\nHost: {host}\r\nProxy-Connection: keep-alive\r\n"
    return (head + extra + _auth(creds) + "\r\n").encode("latin-1") + body


# ---------------------------------------------------------------- fixtures


@pytest_asyncio.fixture(loop_scope="module")
async def origins() -> AsyncIterator[list[Origin]]:
    made: list[Origin] = []
    yield made
    for o in made:
        await o.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def proxies() -> AsyncIterator[list[GuardProxy]]:
    made: list[GuardProxy] = []
    yield made
    for p in made:
        await p.close()
        assert p.stats().active == 0 and p.stats().upstream_idle == 0


@pytest_asyncio.fixture(loop_scope="module")
async def clients() -> AsyncIterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        c.close()


async def _origin(made: list[Origin], **kw: Any) -> Origin:
    o = await Origin(**kw).start()
    made.append(o)
    return o


async def _proxy(made: list[GuardProxy], *exempt: tuple[str, int], **kw: Any) -> GuardProxy:
    kw.setdefault("resolver", MapResolver({}))
    proxy = GuardProxy(AddressGuard(exempt=frozenset(exempt)), **kw)
    await proxy.start()
    made.append(proxy)
    return proxy


async def _client(made: list[Client], proxy: GuardProxy) -> Client:
    c = await Client.to(proxy)
    made.append(c)
    return c


async def _setup(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client], **origin_kw: Any
) -> tuple[Origin, GuardProxy, ProxyCredentials, Client]:
    origin = await _origin(origins, **origin_kw)
    proxy = await _proxy(proxies, ("127.0.0.1", origin.port))
    return origin, proxy, proxy.register(), await _client(clients, proxy)


# ---------------------------------------------------------------- reuse


async def test_two_requests_on_one_browser_connection_share_one_origin_connection(
    proxies: list[GuardProxy], clients: list[Client]
) -> None:
    peers: set[Any] = set()

    async def page(request: web.Request) -> web.Response:
        peers.add(request.transport)
        return web.Response(text=f"page {request.path}")

    async with serve_handler(page) as port:
        proxy = await _proxy(proxies, ("127.0.0.1", port))
        creds = proxy.register()
        client = await _client(clients, proxy)
        for name in ("a", "b", "c"):
            got = await client.get(f"http://127.0.0.1:{port}/{name}", creds)
            assert got.status == 200 and got.body == f"page /{name}".encode()
            assert "connection" not in got.headers  # kept: HTTP/1.1's default
        assert len(peers) == 1
        stats = proxy.stats()
        assert (stats.connections, stats.requests) == (1, 3)
        assert (stats.upstream_opened, stats.upstream_reused, stats.upstream_idle) == (1, 2, 1)
        assert proxy.usage(creds).requests == 3


_CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n"
    b'5;name=val;q="a b"\r\nhello\r\n0007 \t;x\r\n\r\nworld\r\n'
    b"0;last\r\nX-Trailer: t1\r\nX-Other: t2\r\n\r\n"
)
_LENGTH = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nX-Kind: length\r\n\r\n\x00\r\n\r\nab\xff\n"


async def test_chunked_and_length_responses_are_relayed_byte_exact_on_one_connection(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    answers = {1: _CHUNKED, 2: _LENGTH, 3: _CHUNKED}
    origin, proxy, creds, client = await _setup(
        origins, proxies, clients, answer=lambda c, i, h: answers[i]
    )
    for i in (1, 2, 3):
        got = await client.get(origin.url(f"/{i}"), creds)
        sent = answers[i]
        assert got.status == 200 and got.body == sent.partition(b"\r\n\r\n")[2]
        assert sent.partition(b"\r\n\r\n")[0].split(b"\r\n")[1] in got.head
    assert origin.accepts == 1 and origin.paths() == ["/1", "/2", "/3"]
    down = sum(len(a) for a in answers.values())
    assert proxy.usage(creds).bytes_down == down  # heads relayed unchanged here


async def test_a_close_delimited_or_http10_response_closes_the_browser_connection(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    cases = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nnot chunked at the end",
        b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nold!",
    ]
    origin, proxy, creds, _ = await _setup(
        origins, proxies, clients, answer=lambda c, i, h: cases[c - 1], close_after=True
    )
    for n, sent in enumerate(cases, 1):
        client = await _client(clients, proxy)
        got = await client.get(origin.url(f"/{n}"), creds)
        assert got.status == 200 and got.body == sent.partition(b"\r\n\r\n")[2]
        assert got.headers["connection"] == "close" and await client.closed()
    assert origin.accepts == 3 and proxy.stats().upstream_idle == 0


async def test_head_204_and_304_carry_no_body_and_the_connection_stays_in_step(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    answers = {
        1: b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",  # to HEAD: no body follows
        2: b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
        3: b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\nETag: x\r\n\r\n",
        4: b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlast",
    }
    origin, proxy, creds, client = await _setup(
        origins, proxies, clients, answer=lambda c, i, h: answers[i]
    )
    await client.send(_req("HEAD", origin.url("/h"), creds))
    got = await client.reply("HEAD")
    assert got.status == 200 and got.headers["content-length"] == "1000"
    assert (await client.get(origin.url("/n"), creds)).status == 204
    got = await client.get(origin.url("/m"), creds, "If-None-Match: x\r\n")
    assert got.status == 304 and got.body == b""
    got = await client.get(origin.url("/l"), creds)
    assert got.body == b"last" and origin.accepts == 1 and proxy.stats().upstream_reused == 3


async def test_interim_responses_are_relayed_and_a_101_is_refused(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
    answers = {
        1: early + b"HTTP/1.1 100 Continue\r\n\r\n" + OK,
        2: b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
    }
    origin, _, creds, client = await _setup(
        origins, proxies, clients, answer=lambda c, i, h: answers[i]
    )
    await client.send(_req("GET", origin.url("/1"), creds))
    hint = await client.reply()
    assert hint.status == 103 and hint.headers["link"] == "</s.css>; rel=preload"
    assert (await client.reply()).status == 100
    assert (await client.reply()).body == b"ok"
    got = await client.get(origin.url("/2"), creds, "Upgrade: websocket\r\n")
    assert got.status == 502 and await client.closed()
    assert b"upgrade" not in origin.seen[1][1].lower()  # never asked of the origin


async def test_a_post_body_by_content_length_is_relayed_and_100_continue_waits_for_it(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    def echo(c: int, i: int, head: bytes) -> bytes:
        body = origin.seen[-1][2]
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    origin, proxy, creds, client = await _setup(origins, proxies, clients, answer=echo)
    big = bytes(range(256)) * 300  # past one read, CRLFs inside
    await client.send(_req("POST", origin.url("/p"), creds, f"Content-Length: {len(big)}\r\n"))
    await client.send(big)
    assert (await client.reply()).body == big
    # Expect: 100-continue: the body is sent only after the origin's 100 was relayed
    await client.send(
        _req("PUT", origin.url("/q"), creds, "Content-Length: 4\r\nExpect: 100-continue\r\n")
    )
    assert (await client.reply()).status == 100
    await client.send(b"body")
    assert (await client.reply()).body == b"body"
    assert (await client.get(origin.url("/after"), creds)).body == b""
    assert origin.accepts == 1 and proxy.usage(creds).bytes_up == len(big) + 4


@pytest.mark.parametrize(
    "extra",
    [
        "Transfer-Encoding: chunked\r\n",
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        "Content-Length: 4\r\nContent-Length: 4\r\n",
        "Content-Length: 4, 4\r\n",
        "Content-Length: +4\r\n",
        "Content-Length: 0x4\r\n",
        "X-A: 1\nTransfer-Encoding: chunked\r\n",  # a bare LF some parsers split on
        "X-A: 1\r\n folded: yes\r\n",
        "Content-Length : 4\r\n",
    ],
)
async def test_request_framing_that_could_smuggle_is_a_400_with_no_origin_connection(
    extra: str, origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    origin, proxy, creds, client = await _setup(origins, proxies, clients)
    await client.send(_req("POST", origin.url("/s"), creds, extra, b"0\r\n\r\nGET /x HTTP/1.1"))
    got = await client.reply()
    assert got.status == 400 and got.headers["connection"] == "close"
    assert await client.closed()
    assert origin.accepts == 0 and proxy.stats().upstream_opened == 0


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!", 502),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok", 502),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nok", 502),
        (b"HTTP/1.1 200 OK\r\nX-A: 1\nContent-Length: 0\r\nContent-Length: 2\r\n\r\nok", 502),
        (b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 2\r\n\r\nok", 502),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n", 200),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX0\r\n\r\n", 200),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nbad trailer\r\n\r\n", 200),
    ],
)
async def test_response_framing_that_could_desync_ends_both_connections(
    answer: bytes,
    status: int,
    origins: list[Origin],
    proxies: list[GuardProxy],
    clients: list[Client],
) -> None:
    origin, proxy, creds, client = await _setup(
        origins, proxies, clients, answer=lambda c, i, h: answer
    )
    await client.send(_req("GET", origin.url("/d"), creds))
    async with asyncio.timeout(10):
        head = await client.reader.readuntil(b"\r\n\r\n")
        rest = await client.reader.read()  # then closed, whatever was relayed
    assert head.startswith(b"HTTP/1.1 %d " % status)
    if status == 502:
        assert b"Connection: close" in head and b"ok" not in rest
    await until(lambda: 1 in origin.ended, "the origin's connection closed")
    assert proxy.stats().upstream_idle == 0


async def test_a_browser_that_says_close_gets_close_and_the_origin_connection_is_kept(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    origin, proxy, creds, client = await _setup(origins, proxies, clients)
    got = await client.get(origin.url("/1"), creds, "Connection: close\r\n")
    assert got.status == 200 and got.headers["connection"] == "close" and await client.closed()
    old = await _client(clients, proxy)
    await old.send(f"GET {origin.url('/2')} HTTP/1.0\r\n{_auth(creds)}\r\n".encode())
    got = await old.reply()
    assert got.body == b"ok" and got.headers["connection"] == "close" and await old.closed()
    assert origin.accepts == 1 and proxy.stats().upstream_reused == 1  # the origin's kept


async def test_connection_naming_a_framing_header_drops_nothing_the_body_is_framed_by(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    answers = {
        1: b"HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 2\r\n\r\nok",
        2: b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        3: OK,
    }
    origin, proxy, creds, client = await _setup(
        origins, proxies, clients, answer=lambda c, i, h: answers[i if c == 1 else 3]
    )
    extra = "Connection: content-length, x-drop\r\nX-Drop: 1\r\nContent-Length: 4\r\n"
    await client.send(_req("POST", origin.url("/1"), creds, extra, b"GET "))
    got = await client.reply()
    assert got.headers["content-length"] == "2" and got.body == b"ok"
    _, head, body = origin.seen[0]
    assert b"\r\nContent-Length: 4\r\n" in head and b"X-Drop" not in head and body == b"GET "
    # the origin's close ends its connection only: the browser's is kept
    got = await client.get(origin.url("/2"), creds)
    assert got.body == b"ok" and "connection" not in got.headers
    assert (await client.get(origin.url("/3"), creds)).body == b"ok"
    assert [n for n, _, _ in origin.seen] == [1, 1, 2] and proxy.stats().connections == 1


# ---------------------------------------------------------------- each request judged alone


async def test_a_kept_connection_asking_a_blocked_address_is_refused_with_no_connection(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    inside = await Counting().start()
    try:
        origin, proxy, creds, client = await _setup(origins, proxies, clients)
        assert (await client.get(origin.url("/ok"), creds)).status == 200
        got = await client.get(f"http://127.0.0.1:{inside.port}/secret", creds)
        assert got.status == 403 and got.headers[ERROR_HEADER.lower()] == "blocked_address"
        assert await client.closed()
        await asyncio.sleep(0.2)
        assert inside.accepts == 0 and proxy.usage(creds).blocked == 1
        assert origin.paths() == ["/ok"]
    finally:
        await inside.stop()


async def test_dns_rebinding_between_two_requests_on_a_kept_connection_is_judged_each_time(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    origin = await _origin(origins)
    # rebind.test: the origin once, then 127.0.0.2 (an internal listener, same port)
    inside = await Counting(host="127.0.0.2").start(origin.port)
    try:
        names = FlipResolver("rebind.test", "127.0.0.1", "127.0.0.2")
        proxy = await _proxy(proxies, ("127.0.0.1", origin.port), resolver=names)
        creds, client = proxy.register(), await _client(clients, proxy)
        assert (await client.get(origin.url("/a", "rebind.test"), creds)).status == 200
        assert proxy.stats().upstream_idle == 1  # a connection to 127.0.0.1 waits
        got = await client.get(origin.url("/b", "rebind.test"), creds)
        assert got.status == 403 and "127.0.0.2" in proxy.usage(creds).last_refusal
        await asyncio.sleep(0.2)
        assert inside.accepts == 0 and origin.paths() == ["/a"] and names.asked == 2
    finally:
        await inside.stop()


async def test_the_pool_is_looked_up_with_the_address_this_requests_check_returned(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    first = await _origin(origins)
    second = await Origin(host="127.0.0.3").start(first.port)  # the same port elsewhere
    origins.append(second)
    names = FlipResolver("moves.test", "127.0.0.1", "127.0.0.3")  # both exempt
    proxy = await _proxy(
        proxies, ("127.0.0.1", first.port), ("127.0.0.3", first.port), resolver=names
    )
    creds, client = proxy.register(), await _client(clients, proxy)
    assert (await client.get(first.url("/a", "moves.test"), creds)).status == 200
    assert (await client.get(first.url("/b", "moves.test"), creds)).status == 200
    assert first.paths() == ["/a"] and second.paths() == ["/b"]  # not the idle one
    assert proxy.stats().upstream_opened == 2 and proxy.stats().upstream_reused == 0


async def test_a_pooled_connection_never_serves_another_registration(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    origin, proxy, alice, client = await _setup(origins, proxies, clients)
    bob = proxy.register()
    assert (await client.get(origin.url("/alice/1"), alice)).status == 200
    # bob's credentials on the same browser connection: judged as bob's, bob's pool
    assert (await client.get(origin.url("/bob/1"), bob)).status == 200
    assert (await client.get(origin.url("/alice/2"), alice)).status == 200
    other = await _client(clients, proxy)
    assert (await other.get(origin.url("/bob/2"), bob)).status == 200
    by_conn: dict[int, set[str]] = {}
    for n, head, _ in origin.seen:
        by_conn.setdefault(n, set()).add(head.split(b" ")[1].split(b"/")[1].decode())
    assert sorted(by_conn.values(), key=sorted) == [{"alice"}, {"bob"}]
    assert proxy.usage(alice).requests == 2 and proxy.usage(bob).requests == 2


async def test_a_request_without_credentials_on_an_authorized_connection_gets_407(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    origin, proxy, creds, client = await _setup(origins, proxies, clients)
    assert (await client.get(origin.url("/1"), creds)).status == 200
    got = await client.get(origin.url("/2"), None)
    assert got.status == 407 and await client.closed()
    assert origin.paths() == ["/1"] and proxy.stats().unauthorized == 1


async def test_the_prime_keeps_its_connection_for_the_next_request(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    origin, proxy, creds, client = await _setup(origins, proxies, clients)
    got = await client.get(PRIME_URL, creds)
    assert got.status == 204 and "connection" not in got.headers
    assert (await client.get(origin.url("/x"), creds)).status == 200
    got = await client.get(PRIME_URL, creds, "Connection: close\r\n")
    assert got.headers["connection"] == "close" and await client.closed()
    assert proxy.stats().connections == 1


# ---------------------------------------------------------------- the idle pool


async def test_release_and_close_close_the_idle_origin_connections(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    origin, proxy, alice, client = await _setup(origins, proxies, clients)
    bob = proxy.register()
    assert (await client.get(origin.url("/a"), alice)).status == 200
    assert (await (await _client(clients, proxy)).get(origin.url("/b"), bob)).status == 200
    assert proxy.stats().upstream_idle == 2 and not origin.ended
    proxy.release(alice)
    await until(lambda: origin.ended == {1}, "alice's idle connection closed")
    assert proxy.stats().upstream_idle == 1 and await client.closed()  # and her browser's
    await proxy.close()
    await until(lambda: origin.ended == {1, 2}, "bob's idle connection closed")


async def test_idle_bounds_a_key_and_in_time(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    origin = await _origin(origins)
    proxy = await _proxy(
        proxies, ("127.0.0.1", origin.port), idle_per_key=1, idle_upstream=0.3,
        keepalive_timeout=0.3,
    )  # fmt: skip
    creds = proxy.register()
    a, b = await _client(clients, proxy), await _client(clients, proxy)
    got = await asyncio.gather(a.get(origin.url("/1"), creds), b.get(origin.url("/2"), creds))
    assert [g.status for g in got] == [200, 200]
    assert origin.accepts in (1, 2) and proxy.stats().upstream_idle == 1
    await until(lambda: proxy.stats().upstream_idle == 0, "the idle one expired")
    await until(lambda: origin.ended == set(range(1, origin.accepts + 1)), "closed")
    assert await a.closed() and await b.closed()  # the browser side's idle bound


async def test_an_idle_connection_the_origin_closed_is_not_reused(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    # answered framed and persistent, then the origin closes while the proxy keeps it
    origin, proxy, creds, client = await _setup(origins, proxies, clients, close_after=True)
    assert (await client.get(origin.url("/1"), creds)).status == 200
    await until(lambda: proxy.stats().upstream_idle == 0, "the watcher saw the close")
    assert (await client.get(origin.url("/2"), creds)).status == 200
    stats = proxy.stats()
    assert (stats.upstream_opened, stats.upstream_reused, stats.upstream_retried) == (2, 0, 0)


async def test_a_pooled_connection_dropped_at_reuse_is_retried_once_for_a_get_only(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    # each origin connection answers its first request, then drops the next unanswered
    origin, proxy, creds, client = await _setup(
        origins, proxies, clients, answer=lambda c, i, h: OK if i == 1 else None
    )
    assert (await client.get(origin.url("/1"), creds)).status == 200
    assert (await client.get(origin.url("/2"), creds)).status == 200  # retried
    stats = proxy.stats()
    assert (stats.upstream_opened, stats.upstream_reused, stats.upstream_retried) == (2, 1, 1)
    assert origin.paths() == ["/1", "/2", "/2"]
    # a POST is not sent twice: the dropped one is a 502
    await client.send(_req("POST", origin.url("/3"), creds, "Content-Length: 1\r\n", b"x"))
    got = await client.reply()
    assert got.status == 502 and got.headers[ERROR_HEADER.lower()] == "connect"
    assert origin.paths() == ["/1", "/2", "/2", "/3"] and proxy.stats().upstream_retried == 1


async def test_retried_at_most_once(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    # the first connection answers once; every later request on any connection is dropped
    origin, proxy, creds, client = await _setup(
        origins, proxies, clients, answer=lambda c, i, h: OK if (c, i) == (1, 1) else None
    )
    assert (await client.get(origin.url("/1"), creds)).status == 200
    assert (await client.get(origin.url("/2"), creds)).status == 502
    assert origin.accepts == 2 and proxy.stats().upstream_retried == 1


async def test_a_tunnel_through_a_jobs_proxy_is_reused_for_its_key_only(
    origins: list[Origin], proxies: list[GuardProxy], clients: list[Client]
) -> None:
    origin = await _origin(origins)
    chain = await Upstream().start()
    try:
        proxy = await _proxy(proxies, ("127.0.0.1", origin.port), ("127.0.0.1", chain.port))
        via = proxy.register(proxy_url=f"http://127.0.0.1:{chain.port}")
        direct = proxy.register()
        client = await _client(clients, proxy)
        for path in ("/1", "/2"):
            assert (await client.get(origin.url(path), via)).status == 200
        assert [t for t, _ in chain.seen] == [f"127.0.0.1:{origin.port}"]  # one, two requests
        assert (await client.get(origin.url("/3"), direct)).status == 200
        assert len(chain.seen) == 1 and origin.accepts == 2
    finally:
        await chain.stop()


# ---------------------------------------------------------------- the pure parts


async def test_request_length_takes_one_content_length_of_digits_only() -> None:
    def head(*headers: tuple[str, str]) -> Head:
        return Head("POST", "http://a.test/", headers)

    assert request_length(head()) == 0
    assert request_length(head(("Content-Length", "12"))) == 12
    for bad in (
        (("Transfer-Encoding", "identity"),),
        (("Content-Length", "1"), ("content-length", "1")),
        (("Content-Length", ""),),
        (("Content-Length", "1" * 19),),
        (("Content-Length", "\u0661"),),  # a digit, but not ASCII
    ):
        with pytest.raises(ValueError):
            request_length(head(*bad))


async def test_response_framing_by_method_status_and_headers() -> None:
    def framing(method: str, raw: bytes) -> Framing:
        return response_framing(method, parse_response(raw + b"\r\n\r\n"))

    assert framing("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 9").kind == "none"
    for status in (b"100 Continue", b"204 No Content", b"304 Not Modified"):
        assert framing("GET", b"HTTP/1.1 " + status + b"\r\nContent-Length: 9").kind == "none"
    assert framing("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 9") == Framing("length", 9)
    chunked = framing("GET", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked")
    assert chunked == Framing("chunked")
    both = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9"
    assert framing("GET", both) == Framing("chunked", reusable=False)
    for close in (b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip"):
        assert framing("GET", close) == Framing("close", reusable=False)
    with pytest.raises(ValueError):
        framing("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1")
    for bad in (
        b"HTTP/2 200 OK",
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 200OK",
        b"HTTP/1.1 200 OK\r\nA\0: b",
    ):
        with pytest.raises(ValueError):
            parse_response(bad + b"\r\n\r\n")


async def test_request_heads_with_a_bare_cr_lf_or_nul_or_another_version_are_refused() -> None:
    assert parse_head(b"GET http://a/ HTTP/1.0\r\nA: b\r\n\r\n").version == "HTTP/1.0"
    for bad in (
        b"GET http://a/ HTTP/1.1\r\nA: b\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET http://a/ HTTP/1.1\r\nA: b\rC: d\r\n\r\n",
        b"GET http://a/ HTTP/1.1\r\nA: b\0\r\n\r\n",
        b"GET http://a/ HTTP/1.2\r\n\r\n",
    ):
        with pytest.raises(ValueError):
            parse_head(bad)


async def test_browser_head_drops_hop_by_hop_and_connection_named_headers() -> None:
    resp = parse_response(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: t=5\r\n"
        b"Content-Length: 2\r\nX-End: 1\r\n\r\n"
    )
    kept = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-End: 1\r\n\r\n"
    assert browser_head(resp, keep=True) == kept
    closing = kept[:-2] + b"Connection: close\r\nProxy-Connection: close\r\n\r\n"
    assert browser_head(resp, keep=False) == closing


# ---------------------------------------------------------------- a real browser


_PAGE = "<html><body>{}<p id=done>done</p></body></html>".format(
    "".join(f'<script src="/s{i}.js"></script>' for i in range(8))
)


@pytest.mark.browser
async def test_a_rendered_page_makes_fewer_origin_and_proxy_connections_than_requests(
    proxies: list[GuardProxy],
) -> None:
    peers: set[Any] = set()
    requests: list[str] = []

    async def serve(request: web.Request) -> web.Response:
        peers.add(request.transport)
        requests.append(request.path)
        if request.path == "/":
            return web.Response(text=_PAGE, content_type="text/html")
        script = "window.ran = (window.ran || 0) + 1;"
        return web.Response(
            text=script, content_type="text/javascript", headers={"Cache-Control": "no-store"}
        )

    async with serve_handler(serve) as port:
        proxy = await _proxy(proxies, ("127.0.0.1", port))
        creds = proxy.register()
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=CHROMIUM,
                args=list(GUARD_LAUNCH_ARGS),
                proxy={"server": launch_proxy(proxy.server)["server"]},
            )
            try:
                ctx = await render.new_context(
                    browser, pb.ScrapeOptions(), block_heavy=False, proxy=creds.playwright()
                )
                for _ in range(2):
                    page = await ctx.new_page()
                    await page.goto(f"http://127.0.0.1:{port}/")
                    assert await page.evaluate("window.ran") == 8
                    await page.close()
                await ctx.close()
            finally:
                await browser.close()
        stats = proxy.stats()
        assert len(requests) == 18 and stats.requests == 18
        assert len(peers) < len(requests) and stats.upstream_opened == len(peers)
        assert stats.upstream_reused == len(requests) - len(peers)
        assert stats.connections < stats.requests
        # Chromium sent its credentials on every request of a kept connection: the
        # only 407 is the prime's (the proxy answers 407 to any request without them)
        assert stats.unauthorized == 1 and stats.blocked == 0
