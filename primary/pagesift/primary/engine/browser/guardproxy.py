"""The address guard on every browser request: an in-node forward proxy on 127.0.0.1.

Owns ``GuardProxy`` (asyncio server), the registrations that give each browser context
its own credentials, and the launch and context options that keep the browser's traffic
on it (``GUARD_LAUNCH_ARGS``, ``launch_proxy``, ``guarded_context_options``); the heads it
relays are ``proxyhead``'s, their bodies ``proxybody``'s, its origin connections
``upstream``'s. Why nothing the page does reaches a blocked address:

- **Every request is the proxy's to make.** A context's ``proxy=`` (``guarded_context_options``)
  sends http as absolute-URI requests and https/ws/wss as ``CONNECT``; Playwright adds
  ``<-loopback>`` so loopback is proxied too (never pass ``bypass``). The browser's
  launch proxy has no credentials, so a context without its own gets 407: nothing
  uses the proxy, or goes around it, without a registration.
- **Credentials taught once.** ``PRIME_URL`` (a name under ``.invalid``) asked with a
  registration's credentials is answered 204 by the proxy itself: no name resolved, no
  upstream socket. ``render`` has each context's first page ask it, answering the 407
  with the context's credentials, so the browser then sends them on every connection
  of that context unasked (its own per-context auth cache) and Playwright need not
  intercept every request to answer 407s. Asked without them it is a 407 like any.
- **The proxy connects to exactly the address it checked.** It resolves the name
  itself (``proxyroute.Router``) through ``netguard.GuardedResolver`` (``localhost``
  refused without DNS; a name refused when ANY address is blocked), re-checks the
  address, and connects to that literal address, so a DNS answer that changes
  (rebinding) is judged where it is used. A refusal is a 403 naming the reason; no
  upstream socket exists.
- **A job's upstream proxy** (``proxy_url``, else the pool's choice, as ``sessions``)
  is reached under the same guard (the pool's literal endpoints exempt, only for the
  proxy itself) and asked to ``CONNECT`` to the checked address, never the name.
- **Persistent connections, each request judged alone.** A browser connection carries
  plain-http requests one after another (``keepalive_timeout`` idle between them, the
  same head bounds); each is authorized by its own ``Proxy-Authorization`` (a request
  without it is a 407 even on a connection an earlier one authorized: Chromium sends
  them on every request of a kept connection, tested; another registration's are
  judged as its own) and resolved and checked as above. A ``CONNECT`` ends the
  connection's requests: it becomes the tunnel. Whatever the proxy answers itself but
  the prime's 204 (400, 403, 407, 431, 502, 504) closes the connection, as does a
  response read to the origin's close, an HTTP/1.0 request or ``Connection: close``.
  Bodies are framed strictly (``proxybody``: a request with ``Transfer-Encoding`` or an
  unclear ``Content-Length`` is a 400, never relayed).
- **Origin connections reused, never re-aimed.** A connection goes back to its
  registration's idle pool (``upstream.IdlePool``: bounded a key, in all and in time)
  only after an HTTP/1.1 response framed by length or chunks (or none), read to its
  end, with no ``close`` from the origin and the request body sent whole. It is keyed
  by (registration, checked address, port, upstream proxy and its checked address) and
  looked up only with the addresses the current request's own check returned: a
  request is sent only over a connection to an address the guard passed for that very
  request, and only for the registration that owns it. A pooled connection that turns
  out closed before any byte of the response is retried once on a new one (GET or
  HEAD without a body only).
- Heads are bounded; connections (past ``max_connections`` a 503 at accept, from the
  listeners' gate: ``pagesift.core.util.listeners.start_stream_server``), idle time
  per tunnel, per read and between requests, and connect time are bounded; ``close`` and
  ``release`` cancel every connection task they own (a browser connection is owned by
  each registration it served) and close their idle origin connections.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import secrets
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from pagesift.core.util.listeners import start_stream_server
from pagesift.primary.engine.browser.proxybody import (
    Aborted,
    Limits,
    Outcome,
    Stale,
    exchange,
    request_length,
)
from pagesift.primary.engine.browser.proxyhead import (
    Head,
    Refusal,
    Target,
    authority,
    parse_head,
    parse_target,
    request_keeps,
    upstream_request,
)
from pagesift.primary.engine.browser.proxyroute import Route, Router
from pagesift.primary.engine.browser.upstream import IdlePool, Upstream, dial, open_tunnel
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.primary.engine.reqprofile import ProxyPool

__all__ = [
    "ERROR_HEADER", "GUARD_LAUNCH_ARGS", "PRIME_HOST", "PRIME_URL", "GuardProxy",
    "ProxyCredentials", "ProxyStats", "Usage", "guarded_context_options", "launch_proxy",
]  # fmt: skip

# The launch flags the guard needs: WebRTC sends UDP (STUN/TURN) around any HTTP proxy
# unless told not to; QUIC is UDP too. ``pool.LAUNCH_ARGS`` must include both.
GUARD_LAUNCH_ARGS: tuple[str, ...] = (
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--disable-quic",
)
# On every response the proxy itself makes: the ``ErrorCode`` value of what failed
# ("blocked_address", "dns", "connect", "timeout"), so a render can name it.
ERROR_HEADER = "X-Pagesift-Proxy-Error"
# the proxy's own URL (module docstring): answered 204 to an authorized request
PRIME_HOST = "pagesift-guard.invalid"
PRIME_URL = f"http://{PRIME_HOST}/"
_REALM = b'Proxy-Authenticate: Basic realm="pagesift"\r\n'
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass(frozen=True, slots=True)
class ProxyCredentials:
    """What one registration authenticates with; ``server`` is the proxy's URL."""

    username: str
    password: str
    server: str

    def playwright(self) -> dict[str, str]:
        """The Playwright ``proxy=`` dict (no ``bypass``: loopback stays proxied)."""
        return {"server": self.server, "username": self.username, "password": self.password}


def launch_proxy(server: str) -> dict[str, str]:
    """The browser's launch ``proxy=``: the guard proxy without credentials (a context
    that names no proxy of its own gets 407 for every request)."""
    return {"server": server}


def guarded_context_options(
    creds: ProxyCredentials, options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``browser.new_context`` keyword arguments: ``options`` (e.g. the render's) with
    the guard's own set over them: the registration's proxy (no ``bypass``), service
    workers blocked, downloads refused."""
    return {
        **(options or {}),
        "proxy": creds.playwright(),
        "service_workers": "block",
        "accept_downloads": False,
    }


@dataclass
class Usage:
    """One registration's counters (the render reads ``blocked``/``last_refusal``)."""

    requests: int = 0
    blocked: int = 0
    bytes_up: int = 0  # browser -> web
    bytes_down: int = 0  # web -> browser
    last_refusal: str = ""


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """The proxy's counters since start (``blocked_bytes``: request heads refused)."""

    connections: int  # accepted (those past max_connections never reach the proxy)
    active: int  # open now
    requests: int  # authorized
    tunnels: int  # CONNECT relayed
    blocked: int  # refused by the address guard
    blocked_bytes: int
    unauthorized: int  # 407 answers (a browser's first try per context is one)
    bytes_up: int
    bytes_down: int
    registrations: int
    upstream_opened: int  # origin connections made (tunnels and upstream-proxy hops too)
    upstream_reused: int  # requests sent on an idle origin connection of the pool
    upstream_retried: int  # of those, sent again on a new one (the idle one had closed)
    upstream_idle: int  # idle origin connections now


def _response(status: int, reason: str, body: str, *extra: bytes) -> bytes:
    data = body.encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\nProxy-Connection: close\r\n"
    ).encode()
    return head + b"".join(extra) + b"\r\n" + data


def _refusal(status: int, reason: str, code: str, message: str) -> bytes:
    return _response(status, reason, message[:300] + "\n", f"{ERROR_HEADER}: {code}\r\n".encode())


_BUSY = _response(503, "Service Unavailable", "too many connections\n")
# the answer to PRIME_URL: readable by the page that asked (about:blank, any origin);
# the connection is kept unless the request said otherwise
_PRIMED = (
    b"HTTP/1.1 204 No Content\r\nAccess-Control-Allow-Origin: *\r\nCache-Control: no-store\r\n"
)
_CLOSING = b"Connection: close\r\nProxy-Connection: close\r\n"
_UNANSWERED = "the server closed the connection without a response"


@dataclass
class _Registration:
    creds: ProxyCredentials
    proxy: str  # "", "pool" or a pool name (ProxyPool.choose)
    proxy_url: str  # the account's own proxy (wins)
    usage: Usage = field(default_factory=Usage)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class GuardProxy:
    """The forward proxy (module docstring). ``guard=None`` checks nothing (private
    networks allowed) but still connects to the address it resolved."""

    def __init__(
        self,
        guard: AddressGuard | None,
        resolver: AbstractResolver | None = None,
        *,
        pool: ProxyPool | None = None,
        max_head: int = 32768,
        max_response_head: int = 262144,
        max_connections: int = 256,
        idle_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        keepalive_timeout: float = 15.0,
        idle_per_key: int = 8,
        idle_total: int = 128,
        idle_upstream: float = 15.0,
    ) -> None:
        self.guard = guard
        self.pool = pool or ProxyPool()
        self._resolver, self._own_resolver = resolver, resolver is None  # made in start
        self._router = Router(guard, self.pool, resolver, connect_timeout)
        self.max_head, self.max_response_head = max_head, max_response_head
        self.max_connections = max_connections
        self.idle_timeout, self.connect_timeout = idle_timeout, connect_timeout
        self.keepalive_timeout = keepalive_timeout
        self._idle_bounds = (idle_per_key, idle_total, idle_upstream)
        self._idle = IdlePool(*self._idle_bounds)
        self._server: asyncio.Server | None = None
        self.port = 0
        self._registrations: dict[str, _Registration] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._c = dict.fromkeys(
            ("connections", "requests", "tunnels", "blocked", "blocked_bytes",
             "unauthorized", "bytes_up", "bytes_down", "upstream_opened",
             "upstream_reused", "upstream_retried"), 0,
        )  # fmt: skip

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> int:
        """Listen on 127.0.0.1 (an ephemeral port); returns the port."""
        if self._server is None:
            self._resolver = self._resolver or DefaultResolver()  # binds to this loop
            self._router.resolver = self._resolver
            # past max_connections: the 503 at once, before any task or read (the
            # listeners' gate, pagesift.core.util.listeners)
            self._server = await start_stream_server(
                self._accept, "127.0.0.1", 0, max_connections=self.max_connections,
                limit=self.max_head, refusal=_BUSY, name="guard proxy",
            )  # fmt: skip
            self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def register(self, *, proxy: str = "", proxy_url: str = "") -> ProxyCredentials:
        """New credentials for one browser context, whose requests go through
        ``proxy_url`` (an account's own proxy) or else the pool's choice for ``proxy``
        ("" = the server's default, "pool" or a name), as the HTTP engine's do."""
        if not self.port:
            raise RuntimeError("register before start")
        creds = ProxyCredentials(
            f"ctx-{secrets.token_hex(8)}", secrets.token_urlsafe(24), self.server
        )
        self._registrations[creds.username] = _Registration(creds, proxy, proxy_url)
        return creds

    def usage(self, creds: ProxyCredentials) -> Usage:
        """The counters of a live registration (``KeyError`` once released)."""
        return self._registrations[creds.username].usage

    def release(self, creds: ProxyCredentials) -> Usage | None:
        """Forget ``creds`` (later requests get 407), cancel the browser connections
        that served it and close its idle origin connections; returns its final
        counters (None if unknown)."""
        reg = self._registrations.pop(creds.username, None)
        if reg is None:
            return None
        for task in reg.tasks:
            task.cancel()
        self._idle.drop(creds.username)
        return reg.usage

    def stats(self) -> ProxyStats:
        return ProxyStats(
            active=len(self._tasks), registrations=len(self._registrations),
            upstream_idle=len(self._idle), **self._c,
        )  # fmt: skip

    async def close(self) -> None:
        """Stop listening, cancel every connection task (waits for them to end) and
        close every idle origin connection."""
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._idle.close()
        self._idle = IdlePool(*self._idle_bounds)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._own_resolver and self._resolver is not None:
            await self._resolver.close()
            self._resolver = None
        self._registrations.clear()

    # ------------------------------------------------------------ one connection

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._c["connections"] += 1
        self._tasks.add(task)
        served: list[_Registration] = []  # each owns this connection (release ends it)
        try:
            wait = self.idle_timeout
            while await self._request((reader, writer), task, served, wait):
                wait = self.keepalive_timeout
        except (OSError, asyncio.IncompleteReadError, TimeoutError, asyncio.CancelledError):
            pass  # a side went away, or release/close (asyncio would log the cancel)
        finally:
            for reg in served:
                reg.tasks.discard(task)
            self._tasks.discard(task)
            writer.close()

    async def _request(
        self, client: _Conn, task: asyncio.Task[Any], served: list[_Registration], wait: float
    ) -> bool:
        """Read one request on ``client`` and answer it; whether another may follow."""
        reader, writer = client
        try:
            async with asyncio.timeout(wait):
                raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            await _send_close(writer, _response(431, "Header Too Large", "header too large\n"))
            return False
        except asyncio.IncompleteReadError:
            return False  # the browser closed it, between requests or within a head
        try:
            head = parse_head(raw)
            reg = self._authorize(head)  # this request's own credentials, every time
            length = request_length(head) if reg is not None else 0
        except ValueError as exc:
            await _send_close(writer, _response(400, "Bad Request", f"{exc}\n"))
            return False
        if reg is None:
            self._c["unauthorized"] += 1
            await _send_close(writer, _response(407, "Proxy Authentication Required", "", _REALM))
            return False
        if head.method == "GET" and head.target == PRIME_URL:
            keep = request_keeps(head) and length == 0  # an unread body ends the connection
            writer.write(_PRIMED + (b"" if keep else _CLOSING) + b"\r\n")
            await writer.drain()
            return keep
        if not any(r is reg for r in served):
            served.append(reg)
            reg.tasks.add(task)
        self._c["requests"] += 1
        reg.usage.requests += 1
        try:
            target = parse_target(head)
        except ValueError as exc:
            await _send_close(writer, _response(400, "Bad Request", f"{exc}\n"))
            return False
        try:
            route = await self._router.route(target, reg.proxy, reg.proxy_url)
            if target.tunnel:
                await self._tunnel(client, route, reg)
                return False
            return await self._exchange(client, head, target, route, reg, length)
        except Refusal as f:
            if f.code == "blocked_address":
                self._c["blocked"] += 1
                self._c["blocked_bytes"] += len(raw)
                reg.usage.blocked += 1
                reg.usage.last_refusal = f.message[:300]
            await _send_close(writer, _refusal(f.status, f.reason, f.code, f.message))
            return False

    def _authorize(self, head: Head) -> _Registration | None:
        scheme, _, token = (head.get("proxy-authorization") or "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            pair = base64.b64decode(token.strip(), validate=True).decode()
            user, _, password = pair.partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        reg = self._registrations.get(user)
        if reg is None or not hmac.compare_digest(reg.creds.password, password):
            return None
        return reg

    async def _exchange(
        self, client: _Conn, head: Head, target: Target, route: Route, reg: _Registration,
        length: int,
    ) -> bool:  # fmt: skip
        """One plain-http request on an idle origin connection of ``route`` or a new
        one (module docstring); whether the browser's connection may carry another."""
        wire = upstream_request(head, target)
        limits = Limits(self.idle_timeout, max_head=self.max_response_head)

        def count(way: str, n: int) -> None:
            self._count(reg, "bytes_up" if way == "up" else "bytes_down", n)

        conn = await self._take(route, reg)
        retry = conn is not None and head.method in ("GET", "HEAD") and length == 0
        if conn is None:
            conn = await self._dial(route, reg)
        else:
            self._c["upstream_reused"] += 1
        outcome = Outcome(False, False)
        try:
            try:
                outcome = await exchange(client, (conn.reader, conn.writer), head, wire, length,
                                         limits, count)  # fmt: skip
            except Stale:
                conn.close()
                if not retry:
                    raise Refusal(502, "Bad Gateway", "connect", _UNANSWERED) from None
                self._c["upstream_retried"] += 1
                conn = await self._dial(route, reg)  # once, on a new connection
                try:
                    outcome = await exchange(client, (conn.reader, conn.writer), head, wire,
                                             length, limits, count)  # fmt: skip
                except Stale:
                    raise Refusal(502, "Bad Gateway", "connect", _UNANSWERED) from None
        except Aborted:
            return False
        finally:
            conn.requests += 1
            if outcome.upstream_keep and self._registrations.get(reg.creds.username) is reg:
                self._idle.put(conn)
            else:
                conn.close()
        return outcome.browser_keep

    async def _tunnel(self, client: _Conn, route: Route, reg: _Registration) -> None:
        up = await self._dial(route, reg)
        try:
            self._c["tunnels"] += 1
            client[1].write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await client[1].drain()
            await self._splice(client, (up.reader, up.writer), reg)
        finally:
            up.close()

    async def _take(self, route: Route, reg: _Registration) -> Upstream | None:
        """An idle connection of ``reg`` to one of ``route``'s checked addresses."""
        for key in route.keys(reg.creds.username):
            conn = await self._idle.take(key)
            if conn is not None:
                return conn
        return None

    async def _dial(self, route: Route, reg: _Registration) -> Upstream:
        """A new connection to ``route``'s checked address: direct, or a tunnel through
        its upstream proxy; ``Refusal`` says why not."""
        owner, wait, limit = reg.creds.username, self.connect_timeout, self.max_response_head
        if not route.via:
            r, w, ip = await dial(list(route.addresses), route.port, timeout=wait, limit=limit)
            self._c["upstream_opened"] += 1
            return Upstream(r, w, (owner, ip, route.port, "", ""))
        tls = ssl.create_default_context() if route.via_tls else None
        r, w, ip = await dial(list(route.via_ips), route.via_port, timeout=wait, limit=limit,
                              tls=tls, name=route.via_tls)  # fmt: skip
        self._c["upstream_opened"] += 1
        where = authority(route.addresses[0], route.port)
        try:
            await open_tunnel(r, w, where, route.via_auth, self.connect_timeout)
        except BaseException:
            w.close()
            raise
        return Upstream(r, w, (owner, route.addresses[0], route.port, route.via, ip))

    async def _splice(self, client: _Conn, up: _Conn, reg: _Registration) -> None:
        """Relay both ways until either side ends or both are idle ``idle_timeout``."""
        (reader, writer), (up_reader, up_writer) = client, up
        last = [time.monotonic()]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, key: str) -> None:
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout):
                        data = await src.read(65536)
                except TimeoutError:
                    if time.monotonic() - last[0] < self.idle_timeout:
                        continue  # the other direction is busy
                    return
                if not data:
                    return
                dst.write(data)
                await dst.drain()
                last[0] = time.monotonic()
                self._count(reg, key, len(data))

        pumps = [
            asyncio.ensure_future(pump(reader, up_writer, "bytes_up")),
            asyncio.ensure_future(pump(up_reader, writer, "bytes_down")),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    def _count(self, reg: _Registration, key: str, n: int) -> None:
        self._c[key] += n
        setattr(reg.usage, key, getattr(reg.usage, key) + n)


async def _send_close(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(OSError):
        writer.write(data)
        await writer.drain()
    writer.close()
