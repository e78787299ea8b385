"""Connection discipline of every HTTP listener: timeouts, caps and quiet logs.

What it owns
------------
``start_site`` (an aiohttp application served under the limits: the gateway,
``pagesift serve --http-listen``'s gateway, ``/metrics`` and the demo site use it),
``start_stream_server`` (an asyncio stream server under the caps: the browser's guard
proxy) and the rate-limited lines of what an outsider can trigger (``OUTSIDER_LOG``;
the loop's accept errors, ``quiet_accept_errors``: ``pagesift.core.util.quietlog``'s).
The bounds and the pure count of open connections are ``pagesift.core.util.connlimits``'
(``ListenerLimits``, ``ConnectionGate``), re-exported here.

The bounds, per connection
--------------------------
- **Caps, checked at accept.** A connection past ``max_connections`` open ones, or past
  ``max_per_client`` from one client address (an IPv6 client is its /64), is reset at
  once (``SO_LINGER`` 0 and abort: an RST, its descriptor freed in the same loop turn),
  never queued; a stream server may answer a fixed ``refusal`` (the guard proxy's 503)
  before closing. TLS is started *after* the gate (``loop.start_tls``), so a handshake
  that never comes holds a counted slot for ``header_timeout`` at most.
- **Header timeout.** From the connect, and from the first byte after an idle
  keep-alive, a request line and headers (and the TLS handshake) must arrive within
  ``header_timeout``; else the connection is reset (slowloris, idle floods).
- **Idle timeout.** aiohttp's ``keepalive_timeout``: an idle keep-alive connection is
  closed ``idle_timeout`` after its last answer.
- **Body deadline.** The body (at most the app's ``client_max_size``) is read before the
  handler runs and must arrive within ``body_timeout`` of the head: else 408, in
  Firecrawl's error shape (as is 413), and the connection closed.
- **Requests per connection.** The ``max_requests``-th answer on a connection says
  ``Connection: close``.

Why it is built this way
------------------------
aiohttp 3.14 has ``keepalive_timeout`` but no header timeout, body deadline or
connection cap. Each accepted socket gets a ``_Connection`` (an ``asyncio.Protocol``)
that admits or resets it and forwards every protocol call to aiohttp's own protocol
(``runner.server`` is aiohttp's documented protocol factory); one middleware, added
once per app (an app served again keeps it), marks requests in and out of their
connection. ``listener_of(runner)`` hands a listener's limits and counters to tests.
``ListenerSite`` is a ``web.BaseSite``, so the runner's ``addresses`` and ``cleanup()``
keep working; it sets ``BaseSite._server``, the one private name used (what aiohttp's
own sites set; ``tests/test_listener_limits.py`` pins it).

Logs: an outsider controls how often refusals, timeouts, bad requests and the loop's
accept errors (EMFILE) happen, so each is a line at most once per reason per
``LOG_INTERVAL`` with the count of those not written (``pagesift.core.util.quietlog``,
re-exported here).
This module is server code in ``util`` because the gateway, the demo, the node and the
primary's engine all use it; the client never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from pagesift.core.util.connlimits import BACKLOG, ConnectionGate, ListenerLimits, client_key
from pagesift.core.util.quietlog import (
    LOG_INTERVAL,
    OUTSIDER_LOG,
    SERVER_LOG,
    ThrottledLog,
    quiet_accept_errors,
)

__all__ = [
    "LOG_INTERVAL",
    "OUTSIDER_LOG",
    "ConnectionGate",
    "HttpListener",
    "ListenerLimits",
    "ListenerSite",
    "ThrottledLog",
    "client_key",
    "listener_of",
    "quiet_accept_errors",
    "start_site",
    "start_stream_server",
]

LINGER_SECONDS = 2.0  # aiohttp's lingering read of an unread body after an answer
_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST


def _reset(transport: asyncio.BaseTransport) -> None:
    """Close with an RST at once (nothing flushed, no TIME_WAIT kept here)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
    cast(asyncio.Transport, transport).abort()


#: every admitted connection of every listener, by the transport its requests carry
_CONNECTIONS: weakref.WeakKeyDictionary[asyncio.BaseTransport, _Connection] = (
    weakref.WeakKeyDictionary()
)


class _Listener:
    """What the connections of one listener share: limits, gate, counters, registry."""

    def __init__(
        self,
        name: str,
        limits: ListenerLimits,
        make_inner: Callable[[], asyncio.BaseProtocol],
        *,
        ssl_context: ssl.SSLContext | None = None,
        header_timeout: bool = True,
        refusal: bytes | None = None,
    ) -> None:
        self.name, self.limits, self.make_inner = name, limits, make_inner
        self.ssl_context, self.header_timeout, self.refusal = ssl_context, header_timeout, refusal
        self.gate = ConnectionGate(limits.max_connections, limits.max_per_client)
        self.stats: Counter[str] = Counter()
        self.live: set[_Connection] = set()

    def note(self, reason: str, msg: str, *args: object) -> None:
        self.stats[reason] += 1
        OUTSIDER_LOG.log(logging.WARNING, f"{self.name}:{reason}", msg, *args)

    def protocol(self) -> _Connection:
        return _Connection(self)

    def close_pending(self) -> None:
        """Reset the connections not yet handed to the inner protocol (TLS handshakes)."""
        for conn in list(self.live):
            if conn.inner is None:
                conn.abort()


class _Connection(asyncio.Protocol):
    """One accepted socket: admitted or reset, its header timer, then every protocol
    call forwarded to the inner protocol (aiohttp's, or a stream protocol)."""

    def __init__(self, listener: _Listener) -> None:
        self.listener = listener
        self.inner: asyncio.Protocol | None = None
        self.in_request = False
        self.requests = 0
        self._raw: asyncio.Transport | None = None
        self._app: asyncio.BaseTransport | None = None
        self._client = ""
        self._admitted = self._lost = False
        self._timer: asyncio.TimerHandle | None = None
        self._early: list[bytes] = []
        self._tls: asyncio.Task[None] | None = None

    # -------------------------------------------------------------- admission

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = self._raw = cast(asyncio.Transport, transport)
        lst = self.listener
        self._client = client_key(raw.get_extra_info("peername"))
        why = lst.gate.admit(self._client)
        if why is not None:
            cap = lst.gate.max_connections if why == "total" else lst.gate.max_per_client
            lst.note(
                f"refused_{why}",
                "%s: refused a connection (the %s cap of %d open connections is reached)",
                lst.name,
                why.replace("_", "-"),
                cap,
            )
            if lst.refusal is not None:
                raw.write(lst.refusal)
                raw.close()
            else:
                _reset(raw)
            self._lost = True
            return
        self._admitted = True
        lst.stats["accepted"] += 1
        lst.live.add(self)
        if lst.header_timeout:
            self._arm()
        if lst.ssl_context is None:
            self._start(raw)
        else:
            raw.pause_reading()  # start_tls resumes it under its own protocol
            self._tls = asyncio.get_running_loop().create_task(self._handshake(raw))

    async def _handshake(self, raw: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        ctx = self.listener.ssl_context
        assert ctx is not None
        try:
            tls = await loop.start_tls(
                raw,
                self,
                ctx,
                server_side=True,
                ssl_handshake_timeout=self.listener.limits.header_timeout,
            )
        except asyncio.CancelledError:
            raw.abort()
            raise
        except Exception:  # a bad or missing handshake: the peer's problem
            self.listener.stats["tls_failed"] += 1
            raw.abort()
            return
        if tls is None or self._lost:
            return
        self._start(tls)

    def _start(self, transport: asyncio.BaseTransport) -> None:
        self._app = transport
        _CONNECTIONS[transport] = self
        inner = self.inner = cast(asyncio.Protocol, self.listener.make_inner())
        inner.connection_made(transport)
        early, self._early = self._early, []
        for data in early:
            inner.data_received(data)

    # -------------------------------------------------------------- the header timer

    def _arm(self) -> None:
        if self._timer is None and not self._lost:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.listener.limits.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.in_request or self._lost:
            return
        lst = self.listener
        lst.note(
            "header_timeout",
            "%s: closed a connection that sent no complete request head in %g s",
            lst.name,
            lst.limits.header_timeout,
        )
        self.abort()

    def abort(self) -> None:
        if self._raw is not None and not self._lost:
            _reset(self._raw)

    def request_started(self) -> int:
        """A request head has arrived (the middleware): the timer stops; its number."""
        self._disarm()
        self.in_request = True
        self.requests += 1
        return self.requests

    def request_ended(self) -> None:
        self.in_request = False

    # -------------------------------------------------------------- forwarded calls

    def data_received(self, data: bytes) -> None:
        if self._lost:
            return
        if not self.in_request and self.listener.header_timeout:
            self._arm()
        if self.inner is None:
            self._early.append(data)
        else:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted, self._lost = False, True
        self._disarm()
        lst = self.listener
        lst.gate.release(self._client)
        lst.live.discard(self)
        if self._app is not None:
            _CONNECTIONS.pop(self._app, None)
        if self._tls is not None and not self._tls.done():
            self._tls.cancel()
        if self.inner is not None:
            self.inner.connection_lost(exc)


# ------------------------------------------------------------------ aiohttp sites


@dataclass
class HttpListener:
    """One ``start_site`` listener (``listener_of``): its limits, counters (``stats``)
    and open count."""

    listener: _Listener

    @property
    def limits(self) -> ListenerLimits:
        return self.listener.limits

    @property
    def stats(self) -> Counter[str]:
        return self.listener.stats

    @property
    def open(self) -> int:
        return self.listener.gate.open


def listener_of(runner: web.BaseRunner) -> HttpListener:
    """The listener of a ``start_site`` runner."""
    for site in runner.sites:
        if isinstance(site, ListenerSite):
            return HttpListener(site.listener)
    raise LookupError("the runner has no listener site")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, code: str, message: str) -> web.Response:
    """An answer of the listener itself, in Firecrawl's error shape, closing."""
    body = {"success": False, "error": message, "code": code}
    resp = web.json_response(body, status=status)
    resp.force_close()
    return resp


@web.middleware
async def _discipline(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Marks a request in and out of its connection (the header timer stops), reads
    the body under the deadline, closes the connection's last allowed request."""
    transport = request.transport
    conn = _CONNECTIONS.get(transport) if transport is not None else None
    if conn is None:  # a site of the app not started by ``start_site``: not ours
        return await handler(request)
    lst = conn.listener
    n = conn.request_started()
    last = bool(lst.limits.max_requests) and n >= lst.limits.max_requests
    try:
        if request.body_exists and request.can_read_body:
            try:
                async with asyncio.timeout(lst.limits.body_timeout):
                    await request.read()  # cached: the handler's read() gets it
            except TimeoutError:
                lst.note(
                    "body_timeout",
                    "%s: a request body did not arrive in %g s (408)",
                    lst.name,
                    lst.limits.body_timeout,
                )
                msg = f"Request Timeout: the body took more than {lst.limits.body_timeout:g} s"
                return _error(408, "REQUEST_TIMEOUT", msg)
            except web.HTTPRequestEntityTooLarge:
                msg = f"the body is larger than {request.client_max_size} bytes"
                return _error(413, "PAYLOAD_TOO_LARGE", msg)
            except ConnectionError:  # the client left mid-body: nobody to answer
                return _error(400, "BAD_REQUEST", "the connection was lost")
        resp = await handler(request)
    except web.HTTPException as exc:
        if last:
            exc.force_close()
        raise
    finally:
        conn.request_ended()
    if last:
        lst.stats["max_requests"] += 1
        resp.force_close()
    return resp


class ListenerSite(web.BaseSite):
    """A TCP site whose sockets go through a ``_Listener`` (admission, header timer)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, listener: _Listener) -> None:
        super().__init__(runner, backlog=BACKLOG)
        self._host, self._port, self.listener = host, port, listener

    @property
    def name(self) -> str:
        scheme = "https" if self.listener.ssl_context else "http"
        host = f"[{self._host}]" if ":" in self._host else self._host or "0.0.0.0"
        return f"{scheme}://{host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        quiet_accept_errors(loop)
        # BaseSite.stop() closes, and BaseRunner.addresses reads, ``_server``
        self._server = await loop.create_server(
            self.listener.protocol, self._host or None, self._port, backlog=BACKLOG
        )

    async def stop(self) -> None:
        self.listener.close_pending()
        await super().stop()


async def start_site(
    app: web.Application,
    host: str,
    port: int,
    limits: ListenerLimits,
    *,
    name: str = "http",
    ssl_context: ssl.SSLContext | None = None,
    **runner_kw: Any,
) -> web.AppRunner:
    """Serve ``app`` on ``host:port`` (0: a free port) under ``limits``; stop it with
    ``cleanup()``. ``name`` heads the listener's log lines; ``runner_kw`` go to
    ``web.AppRunner`` (``shutdown_timeout``, ``handler_cancellation``...)."""
    runner = web.AppRunner(
        app,
        keepalive_timeout=limits.idle_timeout,
        lingering_time=min(LINGER_SECONDS, limits.body_timeout),
        logger=SERVER_LOG,
        **{"access_log": None, **runner_kw},
    )

    def inner() -> asyncio.BaseProtocol:
        server = runner.server  # aiohttp's protocol factory (its low-level server)
        assert server is not None
        return server()

    lst = _Listener(name, limits, inner, ssl_context=ssl_context)
    if _discipline not in app.middlewares:
        if app.frozen:  # its requests could not stop the header timer
            raise RuntimeError("start_site needs an app not yet served by another runner")
        app.middlewares.append(_discipline)
    await runner.setup()
    try:
        await ListenerSite(runner, host, port, lst).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


async def start_stream_server(
    client_connected: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    host: str,
    port: int,
    *,
    max_connections: int,
    max_per_client: int = 0,
    limit: int = 2**16,
    refusal: bytes | None = None,
    name: str = "stream",
) -> asyncio.Server:
    """``asyncio.start_server`` under the caps: a connection past them gets ``refusal``
    (or an RST) at once and never reaches ``client_connected``; the head and idle
    timeouts are the protocol's own (it knows where its heads end)."""
    loop = asyncio.get_running_loop()
    quiet_accept_errors(loop)
    limits = ListenerLimits(max_connections=max_connections, max_per_client=max_per_client)

    def inner() -> asyncio.BaseProtocol:
        reader = asyncio.StreamReader(limit=limit, loop=loop)
        return asyncio.StreamReaderProtocol(reader, client_connected, loop=loop)

    lst = _Listener(name, limits, inner, header_timeout=False, refusal=refusal)
    return await loop.create_server(lst.protocol, host, port, backlog=BACKLOG)
