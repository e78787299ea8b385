"""The gateway's input bounded before anything runs (issue 28, finding 2): a bad request
is a 400 (or, for a key no account can have, a 401) naming the field or the limit, in
Firecrawl's error shape, never a 500 with a traceback in the log.

Real parts: a real in-process node behind a real gateway on a loopback port
(``pagesift.gateway.server.run``), aiohttp as the client. The HTTP tests import nothing
of the fix, so they ran (and failed) against the code before it; the model walk reads
the bounds the fix introduced (``pagesift.gateway.bounds``) and the proto descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pydantic
import pytest
from aiohttp import web

from pagesift.gateway.clients import Clients
from tests.firecrawlerrors import names
from tests.helpers import ALICE, gateway_with_accounts

DEEP = 100_000
HUGE = 10**12


async def send(
    http: aiohttp.ClientSession, method: str, url: str, data: bytes = b"", key: str = ALICE.key
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with http.request(method, url, data=data, headers=headers) as r:
        return r.status, await r.json(content_type=None)


def firecrawl_error(status: int, body: Any, expected: int) -> dict[str, Any]:
    """``body`` is Firecrawl's error shape with status ``expected``."""
    assert status == expected, (status, body)
    assert isinstance(body, dict) and body["success"] is False, body
    assert isinstance(body["error"], str) and body["error"], body
    assert set(body) <= {"success", "error", "code", "details"}, body
    return body


def named(body: dict[str, Any], name: str) -> None:
    """The error names ``name``: in its message and in a detail's path or field."""
    assert name in body["error"], body
    places = names(body)
    assert name in places, body


@contextlib.contextmanager
def no_traceback(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        yield
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert not tracebacks, tracebacks


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# ---------------------------------------------------------------- through the gateway


async def test_json_nested_100000_deep_is_a_400_naming_the_depth_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Was a 500: json.loads raised RecursionError and the log took its traceback."""
    deep = nested(DEEP)
    bodies = {
        "/v2/scrape": b'{"url": "http://127.0.0.1/", "formats": ' + deep + b"}",
        "/v2/crawl": b'{"url": "http://127.0.0.1/", "scrapeOptions": {"headers": ' + deep + b"}}",
        "/v1/map": deep,
    }
    async with gateway_with_accounts(tmp_path) as base, aiohttp.ClientSession() as http:
        with no_traceback(caplog):
            for path, data in bodies.items():
                body = firecrawl_error(*await send(http, "POST", base + path, data), 400)
                assert "deeper than 64 levels" in body["error"], (path, body)
            # the bound is the limit, not a guess: 64 deep is read (and refused as a
            # value of the wrong type), 65 is the limit's 400
            at = b'{"url": "http://127.0.0.1/", "formats": ' + nested(63) + b"}"
            body = firecrawl_error(*await send(http, "POST", base + "/v2/scrape", at), 400)
            assert "levels" not in body["error"] and "formats" in body["error"], body
            past = b'{"url": "http://127.0.0.1/", "formats": ' + nested(64) + b"}"
            body = firecrawl_error(*await send(http, "POST", base + "/v2/scrape", past), 400)
            assert "deeper than 64 levels" in body["error"], body


#: (path, body field, body) with an integer of 10^12, which no int32 proto field holds
HUGE_FIELDS: list[tuple[str, str, dict[str, Any]]] = [
    ("/v2/crawl", "limit", {"limit": HUGE}),
    ("/v2/crawl", "maxDiscoveryDepth", {"maxDiscoveryDepth": HUGE}),
    ("/v2/crawl", "maxConcurrency", {"maxConcurrency": HUGE}),
    ("/v2/map", "limit", {"limit": HUGE}),
    ("/v2/batch/scrape", "maxConcurrency", {"urls": ["http://127.0.0.1/"], "maxConcurrency": HUGE}),
    ("/v1/crawl", "limit", {"limit": HUGE}),
    ("/v1/crawl", "maxDiscoveryDepth", {"maxDiscoveryDepth": HUGE}),
    ("/v1/batch/scrape", "maxConcurrency", {"urls": ["http://127.0.0.1/"], "maxConcurrency": HUGE}),
]


async def test_an_integer_past_its_proto_field_is_a_400_naming_the_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Was a 500: protobuf's int32 setter raised ValueError (limit, maxDiscoveryDepth of
    10^12); the same for every count a request carries, and for a time too long for a
    Duration (10^30 ms)."""
    cases = [*HUGE_FIELDS, ("/v2/scrape", "timeout", {"timeout": 10**30})]
    async with gateway_with_accounts(tmp_path) as base, aiohttp.ClientSession() as http:
        with no_traceback(caplog):
            for path, field, extra in cases:
                start = {} if "urls" in extra else {"url": "http://127.0.0.1/"}
                data = json.dumps({**start, **extra}).encode()
                body = firecrawl_error(*await send(http, "POST", base + path, data), 400)
                named(body, field)


async def test_query_integers_past_their_proto_field_are_400s_naming_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``?skip=`` of 10^12 on a real job's status page was a 500 (GetJobRequest.skip is
    an int32)."""
    async with gateway_with_accounts(tmp_path) as base, aiohttp.ClientSession() as http:
        start = json.dumps({"urls": ["http://127.0.0.1:9/"]}).encode()
        status, started = await send(http, "POST", base + "/v2/batch/scrape", start)
        assert status == 200, started
        with no_traceback(caplog):
            for name in ("skip", "limit"):
                url = f"{started['url']}?{name}={HUGE}"
                body = firecrawl_error(*await send(http, "GET", url), 400)
                named(body, name)
            status, page = await send(http, "GET", f"{started['url']}?skip=0&limit=5")
            assert status == 200 and page["success"] is True, page


async def test_an_api_key_grpc_cannot_carry_is_a_401_not_a_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A key with a control character was a 500 ("Invalid metadata", gRPC's own refusal
    of the header the key became)."""
    async with gateway_with_accounts(tmp_path) as base, aiohttp.ClientSession() as http:
        with no_traceback(caplog):
            for key in ("psk_\u00fc", "psk\tx", "k" * 5000):
                for method, path in (("GET", "/v2/team/credit-usage"), ("POST", "/v2/map")):
                    data = b'{"url": "http://127.0.0.1/"}'
                    body = firecrawl_error(*await send(http, method, base + path, data, key), 401)
                    assert body["code"] == "UNAUTHORIZED", body


async def test_a_v1_url_that_cannot_be_split_is_a_400_naming_url(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """v1's map and maxDepth split the URL themselves: ``http://[x/`` (an unclosed IPv6
    bracket) raised urlsplit's ValueError, a 500."""
    async with gateway_with_accounts(tmp_path) as base, aiohttp.ClientSession() as http:
        with no_traceback(caplog):
            for path, extra in (("/v1/map", {}), ("/v1/crawl", {"maxDepth": 2})):
                data = json.dumps({"url": "http://[x/a", **extra}).encode()
                named(firecrawl_error(*await send(http, "POST", base + path, data), 400), "url")


async def test_the_body_limits_are_400s_naming_each(tmp_path: Path) -> None:
    bodies = {
        b'{"url": "x", "delay": NaN}': "numbers must be finite",
        b'{"url": "x", "delay": 1e999}': "numbers must be finite",
        b'{"url": "http://127.0.0.1/\\ud800"}': "lone surrogate",
        '{"url": "http://127.0.0.1/"}'.encode("utf-16"): "not UTF-8",
        b'{"url": "x", "a": [' + b"{}," * 100_000 + b"{}]}": "more than 100000 arrays and objects",
        b'{"url": "x", "a": [' + b"0," * 1_000_000 + b"0]}": "more than 1000000 values",
    }
    async with gateway_with_accounts(tmp_path) as base, aiohttp.ClientSession() as http:
        for data, said in bodies.items():
            body = firecrawl_error(*await send(http, "POST", base + "/v2/crawl", data), 400)
            assert said in body["error"], (said, body)


# ---------------------------------------------------------------- the models, every integer


def _models() -> list[type[pydantic.BaseModel]]:
    """Every model a request body is validated with, nested ones included."""
    from pagesift.gateway.openapi import REQUEST_MODELS

    seen: list[type[pydantic.BaseModel]] = []
    todo: list[Any] = list(REQUEST_MODELS.values())
    while todo:
        t = todo.pop()
        if isinstance(t, type) and issubclass(t, pydantic.BaseModel):
            if t in seen:
                continue
            seen.append(t)
            todo += [f.annotation for f in t.model_fields.values()]
        else:
            todo += typing.get_args(t)
    return seen


def _ints(annotation: Any, metadata: list[Any]) -> Iterator[list[Any]]:
    """The metadata of each ``int`` inside ``annotation`` (a union, a list, Annotated)."""
    if annotation is int:
        yield metadata
    elif typing.get_origin(annotation) is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        yield from _ints(inner, [*metadata, *extra])
    elif isinstance(annotation, types.UnionType) or typing.get_origin(annotation) in (
        typing.Union,
        list,
        dict,
        tuple,
    ):
        for arg in typing.get_args(annotation):
            yield from _ints(arg, [])


def test_every_integer_of_every_request_model_is_bounded_by_its_proto_field() -> None:
    """A new integer field cannot slip through: each is ``Annotated[int, Bound]``, its
    bound fits every proto field it names (read off the generated descriptors), an
    integer of the gateway's own says why, and pydantic enforces the bound."""
    from pagesift.gateway.bounds import Bound, int_range

    found = []
    for model in _models():
        for name, info in model.model_fields.items():
            for metadata in _ints(info.annotation, list(info.metadata)):
                where = f"{model.__name__}.{name}"
                bounds = [m for m in metadata if isinstance(m, Bound)]
                assert len(bounds) == 1, (
                    f"{where}: an int without a Bound (pagesift.gateway.bounds)"
                )
                b = bounds[0]
                assert b.fields or b.why, where
                for f in b.fields:
                    lo, hi = int_range(f)
                    assert lo <= b.low <= b.high <= hi, (where, f)
                found.append((model, name, info, b))
    names = {f"{m.__name__}.{n}" for m, n, _, _ in found}
    assert {"CrawlRequest.limit", "CrawlRequest.max_discovery_depth", "MapRequest.limit"} <= names
    assert {"CrawlRequestV1.limit", "Viewport.width", "WaitAction.milliseconds"} <= names
    for model, name, info, b in found:  # the bound is what validation does, at both ends
        probe = pydantic.create_model("Probe", value=(info.annotation, info))
        key = info.alias or "value"
        for ok in (b.low, b.high):
            assert probe.model_validate({key: ok}).value == ok, (model, name)  # type: ignore[attr-defined]
        for bad in (b.low - 1, b.high + 1):
            with pytest.raises(pydantic.ValidationError):
                probe.model_validate({key: bad})


# ---------------------------------------------------------------- the shape check itself


def test_the_shape_check_is_linear_on_a_body_of_escapes_and_an_open_string() -> None:
    """A string pattern that failed on an unterminated string would retry at every
    escaped quote: quadratic. Against a control of the same size (one plain string),
    the adversarial body costs the same order of time."""
    from pagesift.gateway.bounds import parse_json
    from pagesift.gateway.httperrors import HttpError

    n = 200_000
    control = b'"' + b"a" * (3 * n) + b'"'
    hostile = b'"' + b'\\"' * n + b"a" * n  # never closed

    def took(data: bytes) -> float:
        t = time.perf_counter()
        with contextlib.suppress(HttpError):
            parse_json(data)
        return time.perf_counter() - t

    base = min(took(control) for _ in range(3))
    worst = min(took(hostile) for _ in range(3))
    assert worst < 50 * base + 0.5, (worst, base)


async def test_the_catch_all_is_a_500_in_firecrawls_shape_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler that raises (a defect) answers 500 without internals; 200 of them leave
    one traceback in the log."""
    from pagesift.gateway.handling import CLIENTS, answer

    async def broken(request: web.Request) -> web.StreamResponse:
        raise RuntimeError("a defect")

    app = web.Application()
    app[CLIENTS] = Clients(["127.0.0.1:1"])
    app.router.add_post("/v2/defect", answer(broken))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="pagesift.gateway.handling"):
            async with aiohttp.ClientSession() as http:
                for _ in range(200):
                    status, body = await send(http, "POST", f"http://127.0.0.1:{port}/v2/defect")
                    assert firecrawl_error(status, body, 500)["code"] == "INTERNAL_SERVER_ERROR"
                    assert "defect" not in body["error"]
        lines = [r for r in caplog.records if r.name == "pagesift.gateway.handling"]
        assert len(lines) == 1 and lines[0].exc_info is not None, lines
    finally:
        await runner.cleanup()
        await app[CLIENTS].close()


async def test_a_watch_with_a_key_grpc_cannot_carry_is_refused_as_a_bad_key(
    tmp_path: Path,
) -> None:
    """The WebSocket watch reads its key itself: one gRPC metadata cannot carry closed
    the socket as an internal error (1011), not as a refused key (3000, Firecrawl's)."""
    async with gateway_with_accounts(tmp_path) as base, aiohttp.ClientSession() as http:
        start = json.dumps({"url": "http://127.0.0.1:9/", "limit": 1}).encode()
        status, started = await send(http, "POST", base + "/v2/crawl", start)
        assert status == 200, started
        url = base.replace("http://", "ws://") + f"/v2/crawl/{started['id']}"
        for headers in ({"Authorization": "Bearer psk_\u00fc"}, {"Authorization": "Bearer a\tb"}):
            async with http.ws_connect(url, headers=headers) as ws:
                message = await ws.receive_json(timeout=30)
                closing = await ws.receive(timeout=30)
            assert message["type"] == "error" and message["error"], message
            assert closing.type == aiohttp.WSMsgType.CLOSE and ws.close_code == 3000, headers


async def raw_request(base: str, head: bytes, body: bytes = b"") -> tuple[int, Any]:
    """One request written byte for byte (a header no client library sends), its status
    and JSON body."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        length = f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        writer.write(head + length + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


async def test_an_idempotency_key_that_is_not_text_is_a_400_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Latin-1 byte in ``x-idempotency-key`` reached the proto as a lone surrogate
    (aiohttp's surrogateescape): UnicodeEncodeError, a 500."""
    async with gateway_with_accounts(tmp_path) as base:
        with no_traceback(caplog):
            for path, data in (
                ("/v2/crawl", b'{"url": "http://127.0.0.1:9/", "limit": 1}'),
                ("/v2/batch/scrape", b'{"urls": ["http://127.0.0.1:9/"]}'),
                ("/v1/crawl", b'{"url": "http://127.0.0.1:9/", "limit": 1}'),
            ):
                head = (
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {ALICE.key}\r\nContent-Type: application/json\r\n"
                ).encode() + b"x-idempotency-key: k\xfc\r\n"
                body = firecrawl_error(*await raw_request(base, head, data), 400)
                named(body, "x-idempotency-key")
