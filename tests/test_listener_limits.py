"""Connection discipline of the HTTP listeners (issue 28, finding 1), on loopback.

The pure parts first: the log throttle's rule (``logthrottle.Throttle``), the gate's
counts and who a peer counts as, the descriptor arithmetic. Then real aiohttp sites
(``listeners.start_site``) and a real stream server with short limits: an idle
connection and a slowloris head are reset within the header timeout (bounds generous:
a multiple of the timeout, far below what the old listeners held: forever); an idle
keep-alive connection is closed after the idle timeout; a trickled body is a 408 in
Firecrawl's shape; the caps reset the connection past them at once while the admitted
ones are still served; the last allowed request says ``Connection: close``; a TLS port
times out a missing handshake and serves a real one. The lines an outsider triggers
(refusals, timeouts, bad requests, the loop's EMFILE accept errors) are one per reason.
The gateway, ``/metrics`` and the demo site each run under the listener
(``listener_of`` their runner), and an app served again keeps it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from pagesift.core.api.metrics import Metrics
from pagesift.core.api.metricshttp import METRICS_LIMITS, start_http
from pagesift.core.config.schema import ServerConfig
from pagesift.core.store.db import MAX_OPEN_FILES
from pagesift.core.util import listeners, quietlog
from pagesift.core.util.connlimits import BACKLOG, ConnectionGate, ListenerLimits, client_key
from pagesift.core.util.descriptors import plan
from pagesift.core.util.listeners import OUTSIDER_LOG, listener_of, start_site
from pagesift.core.util.logthrottle import OVERFLOW, Throttle
from pagesift.demo.site import build_site, serve_site
from pagesift.gateway.server import Options
from pagesift.gateway.server import start as start_gateway
from pagesift.node import fdreserve
from tests.helpers import make_ca, make_leaf

SHORT = ListenerLimits(
    header_timeout=0.5,
    idle_timeout=1.0,
    body_timeout=0.5,
    max_requests=3,
    max_connections=6,
    max_per_client=3,
)
BOUND = 5.0  # seconds: a timeout of 0.5-1 s must have acted well within this
REQUEST = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"


# ---------------------------------------------------------------- pure parts


def test_the_throttle_writes_one_line_per_reason_per_interval_and_counts_the_rest() -> None:
    t = Throttle(10.0)
    assert t.allow("a", 0.0) == (True, 0)
    assert [t.allow("a", 0.1 * i) for i in range(1, 50)] == [(False, 0)] * 49
    assert t.allow("b", 5.0) == (True, 0)  # reasons are apart
    assert t.allow("a", 10.0) == (True, 49)  # the next window tells the count
    assert t.allow("a", 15.0) == (False, 0)
    assert t.pending(19.9) == []
    assert t.pending(20.0) == [("a", 1)]  # nothing written since: handed out once
    assert t.pending(40.0) == []
    assert t.allow("a", 41.0) == (True, 0)


def test_the_throttle_table_is_bounded() -> None:
    t = Throttle(10.0, max_reasons=3)
    assert [t.allow(r, 0.0)[0] for r in ("a", "b", "c")] == [True] * 3
    assert t.allow("d", 1.0) == (True, 0)  # the table is full: "d" is OVERFLOW
    assert t.allow("e", 2.0) == (False, 0)  # and so is "e"
    assert t.allow(OVERFLOW, 11.0) == (True, 1)
    assert t.allow("f", 12.0) == (True, 0)  # the ended windows were dropped for it
    with pytest.raises(ValueError):
        Throttle(-1.0)


def test_the_gate_counts_in_all_and_per_client() -> None:
    gate = ConnectionGate(3, 2)
    assert [gate.admit("a"), gate.admit("a"), gate.admit("a")] == [None, None, "per_client"]
    assert gate.admit("b") is None
    assert gate.admit("c") == "total"
    gate.release("a")
    assert (gate.open, gate.of("a")) == (2, 1)
    assert gate.admit("c") is None
    unbounded = ConnectionGate(2, 0)
    assert [unbounded.admit("x"), unbounded.admit("x"), unbounded.admit("x")] == [
        None,
        None,
        "total",
    ]


def test_a_client_is_its_ipv4_address_or_its_ipv6_slash_64() -> None:
    assert client_key(("127.0.0.7", 5000)) == "127.0.0.7"
    assert client_key(("2001:db8:1:2:aaaa::1", 1, 0, 0)) == "2001:db8:1:2::/64"
    assert client_key(("2001:db8:1:2:ffff::9", 1, 0, 0)) == "2001:db8:1:2::/64"
    assert client_key(("::ffff:10.1.2.3", 1, 0, 0)) == "10.1.2.3"
    assert client_key(None) == ""


def test_the_limits_name_a_bad_field() -> None:
    with pytest.raises(ValueError, match="header_timeout"):
        ListenerLimits(header_timeout=0)
    with pytest.raises(ValueError, match="max_connections"):
        ListenerLimits(max_connections=0)


def test_the_descriptor_budget_keeps_the_reserve_and_the_slack() -> None:
    budget = plan(10_000, {"store": 1_000, "grpc": 500}, listeners=2)
    assert budget.reserve == 1_500 and budget.slack == 2 * 2 * BACKLOG
    assert budget.http == 10_000 - 1_500 - budget.slack
    assert "limit 10000 - reserve 1500 (store 1000 + grpc 500)" in budget.line()
    assert budget.split({"gateway": 4_096, "metrics": 64}) == {"gateway": 4_096, "metrics": 64}
    tight = plan(3_000, {"store": 1_000}, listeners=2)
    caps = tight.split({"gateway": 4_096, "metrics": 64})
    assert caps["metrics"] == 64 and sum(caps.values()) <= tight.http
    assert plan(100, {"store": 1_000}, 1).http == 0


def test_a_nodes_http_caps_fit_clear_of_its_reserve() -> None:
    config = ServerConfig(
        http_listen="127.0.0.1:1", metrics_listen="127.0.0.1:2", extract_processes=2
    )
    roomy = fdreserve.node_budget(config, 1 << 20)
    parts = dict(roomy.parts)
    assert parts["store"] == 2 * (MAX_OPEN_FILES + 24) and parts["workers"] == 16
    assert parts["gateway channels"] > 0 and parts["browser"] > 0
    gateway, metrics = fdreserve.http_limits(config, roomy)
    assert gateway.max_connections == config.http_max_connections
    assert metrics.max_connections == METRICS_LIMITS.max_connections
    assert gateway.header_timeout == config.http_header_timeout == metrics.header_timeout
    tight = fdreserve.node_budget(config, roomy.reserve + roomy.slack + 500)
    gateway, metrics = fdreserve.http_limits(config, tight)
    assert gateway.max_connections + metrics.max_connections <= tight.http == 500
    assert gateway.max_per_client == config.http_max_connections_per_client
    smaller = fdreserve.node_budget(config, roomy.reserve + roomy.slack + 200)
    gateway, _ = fdreserve.http_limits(config, smaller)
    assert gateway.max_per_client <= gateway.max_connections < 200
    alone = fdreserve.node_budget(ServerConfig(browser_executable=""), 1 << 20)
    assert "browser" not in dict(alone.parts) and "gateway channels" not in dict(alone.parts)


# ---------------------------------------------------------------- a real site


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _echo(request: web.Request) -> web.Response:
    return web.Response(body=await request.read())


def _app() -> web.Application:
    app = web.Application()
    app.router.add_get("/", _ok)
    app.router.add_post("/", _echo)
    return app


@pytest.fixture
async def port() -> AsyncIterator[int]:
    runner = await start_site(_app(), "127.0.0.1", 0, SHORT, name="test")
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


async def _closed_after(reader: asyncio.StreamReader) -> tuple[bytes, float]:
    """What the server sent until it closed (or reset) the connection, and when."""
    start = time.monotonic()
    data = b""
    try:
        async with asyncio.timeout(BOUND * 4):
            while chunk := await reader.read(65536):
                data += chunk
    except ConnectionResetError:
        pass
    return data, time.monotonic() - start


async def _connect(
    port: int, source: str = "127.0.0.1"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def test_an_idle_connection_is_reset_within_the_header_timeout(port: int) -> None:
    reader, writer = await _connect(port)
    data, took = await _closed_after(reader)
    writer.close()
    assert data == b"" and took < BOUND


async def test_a_slowloris_head_is_reset_within_the_header_timeout(port: int) -> None:
    reader, writer = await _connect(port)
    start = time.monotonic()

    async def trickle() -> None:
        for byte in b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 200:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    feeder = asyncio.create_task(trickle())
    data, _ = await _closed_after(reader)
    feeder.cancel()
    writer.close()
    assert data == b"" and time.monotonic() - start < BOUND


async def test_an_idle_keep_alive_is_closed_after_the_idle_timeout(port: int) -> None:
    reader, writer = await _connect(port)
    writer.write(REQUEST)
    head = await reader.readuntil(b"ok")
    assert head.startswith(b"HTTP/1.1 200")
    data, took = await _closed_after(reader)
    writer.close()
    assert data == b"" and took < BOUND


async def test_a_trickled_body_is_a_408_in_firecrawls_shape(port: int) -> None:
    reader, writer = await _connect(port)
    writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nab")
    start = time.monotonic()
    data, _ = await _closed_after(reader)
    writer.close()
    assert data.startswith(b"HTTP/1.1 408"), data
    assert b'"code": "REQUEST_TIMEOUT"' in data and b'"success": false' in data
    assert time.monotonic() - start < BOUND


async def test_a_whole_body_is_read_for_the_handler(port: int) -> None:
    reader, writer = await _connect(port)
    writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
    answer = await reader.readuntil(b"hello")
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200")


async def test_the_last_request_a_connection_may_carry_closes_it(port: int) -> None:
    reader, writer = await _connect(port)
    heads = []
    for _ in range(SHORT.max_requests):
        writer.write(REQUEST)
        heads.append(await reader.readuntil(b"ok"))
    data, took = await _closed_after(reader)
    writer.close()
    assert b"Connection: close" not in heads[0]
    assert b"Connection: close" in heads[-1]
    assert data == b"" and took < 1.0 < BOUND  # closed at once, not after the idle timeout


async def test_connections_past_the_caps_are_reset_at_once_and_the_held_ones_served(
    port: int,
) -> None:
    held = [await _connect(port, "127.0.0.2") for _ in range(SHORT.max_per_client)]
    over_client = await _connect(port, "127.0.0.2")
    data, took = await _closed_after(over_client[0])
    assert data == b"" and took < SHORT.header_timeout  # before any timeout could act
    held += [await _connect(port, "127.0.0.3") for _ in range(SHORT.max_per_client)]
    over_total = await _connect(port, "127.0.0.4")
    data, took = await _closed_after(over_total[0])
    assert data == b"" and took < SHORT.header_timeout
    for reader, writer in held:  # every held one is still served
        writer.write(REQUEST)
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    for _, writer in [*held, over_client, over_total]:
        writer.close()


async def test_the_runner_reports_the_sites_address_and_cleanup_stops_it() -> None:
    """Pins the one private name ``ListenerSite`` sets (``BaseSite._server``): the
    runner's ``addresses`` and ``cleanup()`` read it."""
    app = _app()
    runner = await start_site(app, "127.0.0.1", 0, SHORT)
    (address,) = runner.addresses
    assert address[0] == "127.0.0.1" and address[1] > 0
    assert listener_of(runner).limits == SHORT
    await runner.cleanup()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", address[1])


async def test_an_app_served_again_keeps_the_discipline() -> None:
    site = build_site(8)
    first, _ = await serve_site(site)
    await first.cleanup()
    again, _ = await serve_site(site)  # the demo's Site is served more than once in tests
    try:
        reader, writer = await _connect(int(again.addresses[0][1]))
        writer.write(REQUEST)
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        await again.cleanup()


async def test_a_tls_port_times_out_a_missing_handshake_and_serves_a_real_one(
    tmp_path: Path,
) -> None:
    make_ca(tmp_path, "ca")
    make_leaf(tmp_path, "srv", "localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "srv.pem", tmp_path / "srv.key")
    runner = await start_site(_app(), "127.0.0.1", 0, SHORT, ssl_context=server_ctx)
    try:
        tls_port = int(runner.addresses[0][1])
        reader, writer = await _connect(tls_port)
        data, took = await _closed_after(reader)  # no ClientHello ever
        writer.close()
        assert data == b"" and took < BOUND
        client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", tls_port, ssl=client_ctx, server_hostname="127.0.0.1"
        )
        writer.write(REQUEST)
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        await runner.cleanup()


async def test_a_stream_server_answers_its_refusal_past_the_cap() -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await listeners.start_stream_server(
        hold, "127.0.0.1", 0, max_connections=2, refusal=b"BUSY\r\n"
    )
    sport = int(server.sockets[0].getsockname()[1])
    held = [await _connect(sport) for _ in range(2)]
    reader, writer = await _connect(sport)
    data, took = await _closed_after(reader)
    assert data == b"BUSY\r\n" and took < BOUND
    for _, w in [*held, (reader, writer)]:
        w.close()
    server.close()
    await server.wait_closed()


# ---------------------------------------------------------------- the log lines


async def test_outsider_lines_are_one_per_reason(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    OUTSIDER_LOG.throttle = Throttle(3600.0)  # a fresh table: this test's lines alone
    caplog.set_level(logging.WARNING)
    held = [await _connect(port, "127.0.0.5") for _ in range(SHORT.max_per_client)]
    refused = [await _connect(port, "127.0.0.5") for _ in range(30)]
    bad = []
    for _ in range(30):  # bad requests after a good one: aiohttp logs each with a traceback
        reader, writer = await _connect(port, "127.0.0.6")
        writer.write(REQUEST + b"GET / HTTP/1.1\r\nBad Header\r\n\r\n")
        bad.append((reader, writer))
    for reader, _ in [*refused, *bad]:
        await _closed_after(reader)
    loop = asyncio.get_running_loop()
    listeners.quiet_accept_errors(loop)
    for _ in range(500):  # what asyncio does for each failed accept() of a listening socket
        loop.call_exception_handler(
            {
                "message": "socket.accept() out of system resource",
                "exception": OSError(errno.EMFILE, "Too many open files"),
            }
        )
    for reader, _ in held:
        await _closed_after(reader)
    for _, w in [*held, *refused, *bad]:
        w.close()
    text = caplog.text
    assert text.count("refused a connection") == 1, text
    assert text.count("Too many open files") == 1, text
    assert text.count("Error handling request") == 1, text
    assert "Traceback" not in text
    assert len(caplog.records) <= 6, text
    OUTSIDER_LOG.throttle = Throttle(listeners.LOG_INTERVAL)


async def test_lines_held_back_are_told_even_when_none_follows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = listeners.ThrottledLog(logging.getLogger("tests.throttled"), interval=0.3)
    caplog.set_level(logging.WARNING, "tests.throttled")
    assert [log.log(logging.WARNING, "r", "line %d", i) for i in range(5)] == [True] + [False] * 4
    for _ in range(50):  # the flush, interval after the first held line
        if len(caplog.records) > 1:
            break
        await asyncio.sleep(0.1)
    assert [r.getMessage() for r in caplog.records] == [
        "line 0",
        "r: 4 more like it in the last 0.3 s, not logged",
    ]


async def test_other_loop_errors_still_reach_the_handler_there_was() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(str(ctx["message"])))
    quietlog._QUIETED.discard(loop)
    listeners.quiet_accept_errors(loop)
    loop.call_exception_handler({"message": "something else", "exception": ValueError()})
    loop.call_exception_handler(
        {
            "message": "socket.accept() out of system resource",
            "exception": OSError(errno.EMFILE, "x"),
        }
    )
    assert seen == ["something else"]


# ---------------------------------------------------------------- the users


async def test_the_gateway_metrics_and_demo_listeners_keep_the_discipline() -> None:
    gateway, bound = await start_gateway(
        "127.0.0.1:0", ["127.0.0.1:1"], options=Options(limits=SHORT)
    )
    metrics = await start_http(Metrics(), "127.0.0.1", 0)
    demo, _ = await serve_site(build_site(8))
    try:
        assert listener_of(gateway).limits == SHORT
        assert listener_of(metrics).limits == METRICS_LIMITS
        assert listener_of(demo).limits.max_per_client == 0
        reader, writer = await _connect(int(bound.rpartition(":")[2]))
        data, took = await _closed_after(reader)
        writer.close()
        assert data == b"" and took < BOUND
    finally:
        for runner in (gateway, metrics, demo):
            await runner.cleanup()
