"""The address guard on every browser request: an in-node forward proxy on 127.0.0.1.

Owns ``GuardProxy`` (asyncio server), the registrations that give each browser context
its own credentials, the pure request-head functions it relays with, and the launch and
context options that keep the browser's traffic on it (``GUARD_LAUNCH_ARGS``,
``launch_proxy``, ``guarded_context_options``). Why nothing the page does reaches a blocked
address:

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
  itself through ``netguard.GuardedResolver`` (``localhost`` refused without DNS; a
  name refused when ANY address is blocked), re-checks the address, and connects to
  that literal address, so a DNS answer that changes (rebinding) is judged where it is
  used. A refusal is a 403 naming the reason; no upstream socket exists.
- **A job's upstream proxy** (``proxy_url``, else the pool's choice, as ``sessions``)
  is reached under the same guard (the pool's literal endpoints exempt, only for the
  proxy itself) and asked to ``CONNECT`` to the checked address, never the name.
- One request per upstream connection (``Connection: close`` both ways); heads are
  bounded; connections (past ``max_connections`` a 503 at accept, from the listeners'
  gate: ``pagesift.shared.util.listeners.start_stream_server``), idle time per tunnel
  and connect time are bounded; ``close`` and ``release`` cancel every connection task
  they own.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import ipaddress
import secrets
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from pagesift.primary.engine.browser.proxyhead import (
    Head,
    Target,
    authority,
    closing_response_head,
    parse_head,
    parse_target,
    upstream_request,
)
from pagesift.primary.engine.netguard import AddressGuard, BlockedAddressError, GuardedResolver
from pagesift.primary.engine.reqprofile import ProxyPool
from pagesift.shared.jobs import urls
from pagesift.shared.util.listeners import start_stream_server

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


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
# the answer to PRIME_URL: readable by the page that asked (about:blank, any origin)
_PRIMED = (
    b"HTTP/1.1 204 No Content\r\nAccess-Control-Allow-Origin: *\r\n"
    b"Cache-Control: no-store\r\nConnection: close\r\nProxy-Connection: close\r\n\r\n"
)


class _Failure(Exception):
    """A request the proxy answers itself: status, reason phrase, error code, message."""

    def __init__(self, status: int, reason: str, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.code, self.message = status, reason, code, message


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
    ) -> None:
        self.guard = guard
        self.pool = pool or ProxyPool()
        self._resolver, self._own_resolver = resolver, resolver is None  # made in start
        self._proxy_guard = guard
        if guard is not None:  # the pool's literal endpoints, for proxy connections only
            self._proxy_guard = AddressGuard(exempt=guard.exempt | _pool_endpoints(self.pool))
        self.max_head, self.max_response_head = max_head, max_response_head
        self.max_connections, self._turns = max_connections, 0
        self.idle_timeout, self.connect_timeout = idle_timeout, connect_timeout
        self._server: asyncio.Server | None = None
        self.port = 0
        self._registrations: dict[str, _Registration] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._c = dict.fromkeys(
            ("connections", "requests", "tunnels", "blocked", "blocked_bytes",
             "unauthorized", "bytes_up", "bytes_down"), 0,
        )  # fmt: skip

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> int:
        """Listen on 127.0.0.1 (an ephemeral port); returns the port."""
        if self._server is None:
            self._resolver = self._resolver or DefaultResolver()  # binds to this loop
            # past max_connections: the 503 at once, before any task or read (the
            # listeners' gate, pagesift.shared.util.listeners)
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
        """Forget ``creds`` (later requests get 407) and cancel its open connections;
        returns its final counters (None if unknown)."""
        reg = self._registrations.pop(creds.username, None)
        if reg is None:
            return None
        for task in reg.tasks:
            task.cancel()
        return reg.usage

    def stats(self) -> ProxyStats:
        return ProxyStats(
            active=len(self._tasks), registrations=len(self._registrations), **self._c
        )

    async def close(self) -> None:
        """Stop listening and cancel every connection task; waits for them to end."""
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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
        try:
            await self._serve(reader, writer, task)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, asyncio.CancelledError):
            pass  # a side went away, or release/close (asyncio would log the cancel)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, task: asyncio.Task[Any]
    ) -> None:
        try:
            async with asyncio.timeout(self.idle_timeout):
                raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            await _send_close(writer, _response(431, "Header Too Large", "header too large\n"))
            return
        try:
            head = parse_head(raw)
        except ValueError as exc:
            await _send_close(writer, _response(400, "Bad Request", f"{exc}\n"))
            return
        reg = self._authorize(head)
        if reg is None:
            self._c["unauthorized"] += 1
            await _send_close(writer, _response(407, "Proxy Authentication Required", "", _REALM))
            return
        if head.method == "GET" and head.target == PRIME_URL:
            await _send_close(writer, _PRIMED)  # authorized: the context's credentials work
            return
        reg.tasks.add(task)
        try:
            await self._relay((reader, writer), head, raw, reg)
        finally:
            reg.tasks.discard(task)

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

    async def _relay(self, client: _Conn, head: Head, raw: bytes, reg: _Registration) -> None:
        writer = client[1]
        self._c["requests"] += 1
        reg.usage.requests += 1
        try:
            target = parse_target(head)
        except ValueError as exc:
            await _send_close(writer, _response(400, "Bad Request", f"{exc}\n"))
            return
        try:
            up_reader, up_writer = await self._open(target, reg)
        except _Failure as f:
            if f.code == "blocked_address":
                self._c["blocked"] += 1
                self._c["blocked_bytes"] += len(raw)
                reg.usage.blocked += 1
                reg.usage.last_refusal = f.message[:300]
            await _send_close(writer, _refusal(f.status, f.reason, f.code, f.message))
            return
        try:
            if target.tunnel:
                self._c["tunnels"] += 1
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                first = b""
            else:
                up_writer.write(upstream_request(head, target))
                try:
                    async with asyncio.timeout(self.idle_timeout):
                        first = closing_response_head(await up_reader.readuntil(b"\r\n\r\n"))
                except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, TimeoutError):
                    msg = "the server sent no complete response head"
                    await _send_close(writer, _refusal(502, "Bad Gateway", "connect", msg))
                    return
            await self._splice(client, (up_reader, up_writer), reg, first)
        finally:
            up_writer.close()

    async def _open(self, target: Target, reg: _Registration) -> _Conn:
        """A connection to ``target``'s checked address: direct, or a tunnel through
        the registration's upstream proxy. ``_Failure`` says why not."""
        addresses = await self._checked(self.guard, target.host, target.port)
        self._turns += 1
        upstream = reg.proxy_url or self.pool.choose(reg.proxy, target.host, self._turns)
        if upstream is None:
            return await self._connect(addresses, target.port)
        parts = urlsplit(upstream)
        host = urls.host_of(upstream)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not host:
            raise _Failure(502, "Bad Gateway", "connect", "the proxy URL is not http(s)://")
        port = parts.port or (443 if scheme == "https" else 80)
        # an account's own proxy is judged by the full guard (as ``sessions``)
        guard = self.guard if reg.proxy_url else self._proxy_guard
        proxy_ips = await self._checked(guard, host, port)
        tls = ssl.create_default_context() if scheme == "https" else None
        r, w = await self._connect(proxy_ips, port, tls, host if tls else "")
        auth = ""
        if parts.username is not None:
            pair = f"{parts.username}:{parts.password or ''}".encode()
            auth = f"Proxy-Authorization: Basic {base64.b64encode(pair).decode()}\r\n"
        where = authority(addresses[0], target.port)
        w.write(f"CONNECT {where} HTTP/1.1\r\nHost: {where}\r\n{auth}\r\n".encode())
        try:
            async with asyncio.timeout(self.connect_timeout):
                answer = await r.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.LimitOverrunError, asyncio.IncompleteReadError) as exc:
            w.close()
            raise _Failure(502, "Bad Gateway", "connect", f"the proxy failed: {exc}") from None
        except TimeoutError:
            w.close()
            raise _Failure(504, "Gateway Timeout", "timeout", "the proxy did not answer") from None
        status = answer.split(b" ", 2)[1:2]
        if not status or not status[0].startswith(b"2"):
            w.close()
            line = answer.split(b"\r\n", 1)[0].decode("latin-1")[:100]
            raise _Failure(502, "Bad Gateway", "connect", f"the proxy refused: {line}")
        return r, w

    async def _checked(self, guard: AddressGuard | None, host: str, port: int) -> list[str]:
        """The addresses ``host`` may be connected to, each judged by ``guard``: a
        literal as is; a name resolved here (refused when ANY address is blocked)."""
        addresses = [host]
        if not _is_literal(host):
            assert self._resolver is not None
            names = self._resolver if guard is None else GuardedResolver(self._resolver, guard)
            try:
                async with asyncio.timeout(self.connect_timeout):
                    results = await names.resolve(host, port, socket.AF_UNSPEC)
            except BlockedAddressError as exc:
                raise _Failure(403, "Forbidden", "blocked_address", f"{exc}") from None
            except TimeoutError:
                msg = f"resolving {host} timed out"
                raise _Failure(504, "Gateway Timeout", "dns", msg) from None
            except OSError as exc:
                raise _Failure(502, "Bad Gateway", "dns", f"cannot resolve {host}: {exc}") from None
            addresses = list(dict.fromkeys(str(r["host"]) for r in results))[:4]
            if not addresses:
                raise _Failure(502, "Bad Gateway", "dns", f"{host} has no address")
        for address in addresses:  # again, on the very text connected to
            reason = None if guard is None else guard.refusal(address, port)
            if reason is not None:
                msg = f"blocked by the address guard: {host}:{port}: {reason}"
                raise _Failure(403, "Forbidden", "blocked_address", msg)
        return addresses

    async def _connect(
        self, ips: list[str], port: int, tls: ssl.SSLContext | None = None, name: str = ""
    ) -> _Conn:
        """A connection to the first of ``ips`` (checked addresses) that answers."""
        failure = _Failure(502, "Bad Gateway", "connect", "no address")
        for ip in ips:
            try:
                async with asyncio.timeout(self.connect_timeout):
                    return await asyncio.open_connection(
                        ip, port, ssl=tls, server_hostname=name or None,
                        limit=self.max_response_head,
                    )  # fmt: skip
            except OSError as exc:  # TimeoutError included
                code = "timeout" if isinstance(exc, TimeoutError) else "connect"
                why = "timed out" if code == "timeout" else exc.strerror or str(exc)
                msg = f"cannot connect to {authority(ip, port)}: {why}"
                failure = _Failure(502, "Bad Gateway", code, msg)
        raise failure

    async def _splice(self, client: _Conn, up: _Conn, reg: _Registration, first: bytes) -> None:
        """Relay both ways until either side ends or both are idle ``idle_timeout``."""
        (reader, writer), (up_reader, up_writer) = client, up
        last = [time.monotonic()]
        if first:
            writer.write(first)
            self._count(reg, "bytes_down", len(first))

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


def _pool_endpoints(pool: ProxyPool) -> frozenset[tuple[str, int]]:
    """The (address, port) of every pool proxy named by a literal address."""
    named = ((urls.host_of(url), urlsplit(url)) for url in pool.endpoints())
    return frozenset(
        (host, parts.port or (443 if parts.scheme == "https" else 80))
        for host, parts in named
        if host and _is_literal(host)
    )
