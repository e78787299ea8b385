"""The guard proxy's message bodies: where each ends, and one exchange relayed by them.

Owns the framing ``guardproxy`` relays plain http with, strictly (request smuggling and
response desync are the risk of a connection that carries more than one message):

- **Request bodies** (``request_length``): none, or a single ``Content-Length`` of
  digits only. A request with ``Transfer-Encoding``, or with several, listed or invalid
  ``Content-Length`` values, is a ``ValueError`` (the proxy answers 400 and closes): it
  is never relayed, so no body the proxy and an origin would frame differently is sent.
- **Response bodies** (``response_framing``, RFC 9112 6.3): none for ``HEAD``, 1xx, 204
  and 304; ``Transfer-Encoding`` ending in ``chunked`` parsed chunk by chunk (hex sizes
  of at most 16 digits, extensions of visible text, trailers as strict as header lines,
  every line at most ``max_line`` and the trailers ``max_head``) and relayed verbatim,
  its ``Content-Length`` dropped; one valid ``Content-Length``; anything else (another
  final coding, no length) is read until the origin closes, and the browser's
  connection is closed after it. Several or invalid ``Content-Length`` values are a
  502: nothing of such a response is relayed.
- **Interim responses** (100, 103, ...) are relayed and the final one read after them
  (at most ``MAX_INTERIM``); a 101 is a 502 (``Upgrade`` is never sent upstream here).

``exchange`` sends one request on an origin connection and relays its response; its
``Outcome`` says whether the browser's connection may carry another request (HTTP/1.1
both ways, the response framed and relayed to its end) and whether the origin's may
(also no ``close`` from the origin, no ``Transfer-Encoding`` beside a length, the
request's body sent whole). A request body is sent while the response is awaited, so
an origin that answers early (or a ``100 Continue``) is relayed. Failures are typed by
how far they got: ``Stale`` (the origin's connection ended before any byte of a
response: a reused one may be retried), ``Refusal`` (the browser got nothing yet: the
proxy answers), ``Aborted`` (the browser got part of a response: close both).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pagesift.primary.engine.browser.proxyhead import (
    Head,
    Refusal,
    Response,
    browser_head,
    parse_response,
    request_keeps,
    tokens,
)

__all__ = [
    "MAX_INTERIM", "Aborted", "Framing", "Limits", "Outcome", "Stale", "copy_chunked",
    "copy_exact", "copy_until_close", "exchange", "request_length", "response_framing",
]  # fmt: skip

MAX_INTERIM = 8  # 1xx responses relayed before the final one
_HEX = frozenset(b"0123456789abcdefABCDEF")
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_EXT_BAD = frozenset(range(0, 32)) - {9} | {127}  # control characters (HTAB allowed)
Count = Callable[[int], None]
T = TypeVar("T")


class Stale(Exception):
    """The origin's connection ended (or was reset) before any byte of a response."""


class Aborted(Exception):
    """The exchange cannot go on (the browser got part of a response, or stopped
    sending its body): both connections are closed, the browser answered nothing more."""


@dataclass(frozen=True, slots=True)
class Framing:
    """How a response body ends: ``none``, ``length`` (``length`` bytes), ``chunked``
    or ``close`` (the origin's close); ``reusable``: the framing lets the origin's
    connection carry another request."""

    kind: str
    length: int = 0
    reusable: bool = True


@dataclass(frozen=True, slots=True)
class Limits:
    """Seconds a read may wait, and the longest chunk line and head (trailers)."""

    idle: float
    max_line: int = 4096
    max_head: int = 262144


@dataclass(frozen=True, slots=True)
class Outcome:
    """Whether the browser's and the origin's connections may carry another request."""

    browser_keep: bool
    upstream_keep: bool


def _length(text: str) -> int:
    if not (0 < len(text) <= 18 and text.isascii() and text.isdigit()):
        raise ValueError(f"bad Content-Length {text[:20]!r}")
    return int(text)


def request_length(head: Head) -> int:
    """The length of ``head``'s body (0: none); ``ValueError`` for a request framed by
    ``Transfer-Encoding`` or by anything but one valid ``Content-Length``."""
    if head.all("transfer-encoding"):
        raise ValueError("a request with Transfer-Encoding is not relayed")
    values = head.all("content-length")
    if len(values) > 1:
        raise ValueError("more than one Content-Length")
    return _length(values[0]) if values else 0


def response_framing(method: str, resp: Response) -> Framing:
    """How the body of ``resp`` (the answer to ``method``) ends (module docstring);
    ``ValueError`` for several or invalid ``Content-Length`` values."""
    if method == "HEAD" or resp.status < 200 or resp.status in (204, 304):
        return Framing("none")
    codings, lengths = tokens(resp.all("transfer-encoding")), resp.all("content-length")
    if codings:
        if codings[-1] == "chunked":  # a length beside it is dropped, and not trusted
            return Framing("chunked", reusable=not lengths)
        return Framing("close", reusable=False)
    if not lengths:
        return Framing("close", reusable=False)
    if len(lengths) > 1:
        raise ValueError("more than one Content-Length")
    return Framing("length", _length(lengths[0]))


async def _read(src: asyncio.StreamReader, n: int, idle: float) -> bytes:
    async with asyncio.timeout(idle):
        return await src.read(n)


async def copy_exact(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, n: int, idle: float, count: Count
) -> None:
    """Relay exactly ``n`` bytes; ``asyncio.IncompleteReadError`` when ``src`` ends first."""
    while n > 0:
        data = await _read(src, min(n, 65536), idle)
        if not data:
            raise asyncio.IncompleteReadError(b"", n)
        dst.write(data)
        await dst.drain()
        count(len(data))
        n -= len(data)


async def copy_until_close(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, idle: float, count: Count
) -> None:
    """Relay until ``src`` ends (each read waits at most ``idle``)."""
    while data := await _read(src, 65536, idle):
        dst.write(data)
        await dst.drain()
        count(len(data))


async def _line(src: asyncio.StreamReader, limits: Limits) -> bytes:
    """One CRLF-ended line of at most ``limits.max_line`` bytes, no bare CR, LF or NUL."""
    async with asyncio.timeout(limits.idle):
        line = await src.readuntil(b"\r\n")
    inner = line[:-2]
    if len(line) > limits.max_line or b"\r" in inner or b"\n" in inner or b"\0" in inner:
        raise ValueError("a bad chunk or trailer line")
    return line


def _chunk_size(line: bytes) -> int:
    """The size of a chunk line ``1*HEXDIG [BWS ";" chunk-ext] CRLF``."""
    size, sep, ext = line[:-2].partition(b";")
    if sep:
        size = size.rstrip(b" \t")
        if _EXT_BAD.intersection(ext):
            raise ValueError("a control character in a chunk extension")
    if not 0 < len(size) <= 16 or not _HEX.issuperset(size):
        raise ValueError(f"bad chunk size {size[:20]!r}")
    return int(size, 16)


async def copy_chunked(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, limits: Limits, count: Count
) -> None:
    """Relay a chunked body verbatim, checking each chunk and trailer line on the way;
    ``ValueError`` for one out of form (the bytes before it are relayed)."""
    while True:
        line = await _line(src, limits)
        size = _chunk_size(line)
        dst.write(line)
        count(len(line))
        if size == 0:
            break
        await copy_exact(src, dst, size, limits.idle, count)
        async with asyncio.timeout(limits.idle):
            end = await src.readexactly(2)
        if end != b"\r\n":
            raise ValueError("a chunk not ended by CRLF")
        dst.write(end)
        count(2)
    total = 0
    while (line := await _line(src, limits)) != b"\r\n":
        total += len(line)
        name, sep, _ = line.partition(b":")
        if total > limits.max_head or not sep or not name or not _TOKEN.issuperset(name):
            raise ValueError("a bad trailer line")  # a folded one's name starts with a space
        dst.write(line)
        count(len(line))
    dst.write(line)
    count(len(line))
    await dst.drain()


async def _racing(work: Awaitable[T], upload: asyncio.Future[None] | None) -> T:
    """``work``'s result, unless the request body being sent fails first (``Aborted``:
    the browser stopped sending it, and no answer can follow)."""
    if upload is None:
        return await work
    task = asyncio.ensure_future(work)
    both: set[asyncio.Future[Any]] = {task, upload}
    try:
        while not task.done():
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
            if upload.done() and not task.done() and upload.exception() is not None:
                raise Aborted("the request body ended early")
            if upload.done():
                return await task
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})


@dataclass(slots=True)
class _Progress:
    received: bool = False  # a byte of a response came from the origin
    sent: bool = False  # a byte of one went to the browser


async def exchange(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    up: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    head: Head,
    wire: bytes,
    length: int,
    limits: Limits,
    count: Callable[[str, int], None],
) -> Outcome:
    """Send ``wire`` (``head`` as the origin gets it) and ``length`` body bytes from the
    browser on ``up``; relay the response to the browser (module docstring)."""
    reader, up_writer = client[0], up[1]
    upload: asyncio.Future[None] | None = None
    got = _Progress()
    try:
        try:
            up_writer.write(wire)
            if length:
                body = copy_exact(reader, up_writer, length, limits.idle, lambda n: count("up", n))
                upload = asyncio.ensure_future(body)
            else:
                await up_writer.drain()
            resp = await _racing(_final_head(up[0], client[1], limits, count, got), upload)
            framing = response_framing(head.method, resp)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            why = str(exc) or type(exc).__name__
            if got.sent:
                raise Aborted(why) from None
            if got.received or isinstance(exc, ValueError):
                raise Refusal(
                    502, "Bad Gateway", "connect", f"the server's response: {why}"
                ) from None
            raise Stale(why) from None
        try:
            return await _body(client, up, head, resp, framing, upload, limits, count)
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError) as exc:  # fmt: skip
            raise Aborted(str(exc) or type(exc).__name__) from None
    finally:
        if upload is not None and not upload.done():
            upload.cancel()
            await asyncio.wait({upload})
        elif upload is not None and not upload.cancelled():
            upload.exception()  # retrieved: a failed upload is answered by the outcome


async def _final_head(
    up_reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    limits: Limits,
    count: Callable[[str, int], None],
    got: _Progress,
) -> Response:
    """The final response head, the interim ones relayed before it. ``Refusal`` for a
    head out of form, too many interim ones, a 101 or a wait past ``limits.idle``."""
    for _ in range(MAX_INTERIM + 1):
        try:
            async with asyncio.timeout(limits.idle):
                raw = await up_reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise Refusal(502, "Bad Gateway", "connect", "the response head is too large") from None
        except TimeoutError:
            raise Refusal(504, "Gateway Timeout", "timeout", "the server did not answer") from None
        got.received = True
        try:
            resp = parse_response(raw)
        except ValueError as exc:
            raise Refusal(502, "Bad Gateway", "connect", f"the server's head: {exc}") from None
        if resp.status == 101:
            raise Refusal(502, "Bad Gateway", "connect", "the server switched protocols")
        if resp.status >= 200:
            return resp
        data = browser_head(resp, keep=True)
        got.sent = True
        writer.write(data)
        count("down", len(data))
        await writer.drain()
    raise Refusal(502, "Bad Gateway", "connect", "too many interim responses")


async def _body(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    up: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    head: Head,
    resp: Response,
    framing: Framing,
    upload: asyncio.Future[None] | None,
    limits: Limits,
    count: Callable[[str, int], None],
) -> Outcome:
    """Relay ``resp``'s head and body to the browser by ``framing``; the ``Outcome``."""
    writer, up_reader = client[1], up[0]
    closed = "close" in tokens(resp.all("connection"))
    framed = framing.kind != "close" and resp.version == "HTTP/1.1"
    browser_keep = framed and request_keeps(head)
    upstream_keep = framed and framing.reusable and not closed
    drop = frozenset({"content-length"}) if framing.kind == "chunked" else frozenset()
    data = browser_head(resp, keep=browser_keep, drop=drop)
    writer.write(data)
    count("down", len(data))

    def down(n: int) -> None:
        count("down", n)

    if framing.kind == "length":
        await copy_exact(up_reader, writer, framing.length, limits.idle, down)
    elif framing.kind == "chunked":
        await copy_chunked(up_reader, writer, limits, down)
    elif framing.kind == "close":
        await copy_until_close(up_reader, writer, limits.idle, down)
    await writer.drain()
    if upload is not None and (not upload.done() or upload.exception() is not None):
        return Outcome(False, False)  # the body was not sent whole: neither is in step
    return Outcome(browser_keep, upstream_keep)
