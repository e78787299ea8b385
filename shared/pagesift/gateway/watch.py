"""The crawl watch: ``GET /v2/crawl/{id}`` (and ``/v1/crawl/{id}``) upgraded to a WebSocket.

What it owns
------------
``upgrading(kind, status)``: the handler of a status path that sends an ``Upgrade:
websocket`` request to the watch and any other GET to ``status``; ``add_watch(app)``:
the watch's app state (``WATCH`` limits, open watches closed with 1001 at shutdown).
Messages as Firecrawl's ``crawl-status-ws``: ``catchup`` (``data``: status, total,
completed, creditsUsed, expiresAt, data), ``document``, ``done``, ``error``; ``done`` and
``error`` are sent as a text message and again as the close frame's reason.

Invariants
----------
- Key: ``Authorization: Bearer KEY`` (Python SDK), else the first
  ``Sec-WebSocket-Protocol`` (JS SDK), which is answered so a browser's handshake holds.
- Bounded catchup: it holds the first documents of the job, at most the app's page
  documents and page bytes (``PAGING``; none if the first alone is over), read by one
  GetJob; every later one is a ``document`` message from WatchJob at the next index,
  one at a time. Its status is the job's only when it holds every document of a
  finished job (else ``scraping``: the SDKs stop at a finished catchup).
- Every wait is bounded: a send the client does not take in ``send_seconds`` drops it;
  a stream quiet ``stall_seconds`` while a node shows more is resumed there.
- Resumable: a reconnect gets a new catchup; failovers are ``JobClient.watch``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc.aio
from aiohttp import WSMsgType, web

from pagesift.client import JobClient
from pagesift.core.jobs.firecrawlshape import STATES, document
from pagesift.gateway.handling import CLIENTS, OFF_LOOP_BYTES, PAGING, Handler, checked_key
from pagesift.gateway.httperrors import HttpError, from_aio_error, unauthorized
from pagesift.v1 import jobs_pb2

__all__ = [
    "WATCH", "WatchLimits", "add_watch", "catchup", "close_code", "close_reason",
    "done_message", "is_upgrade", "key_of", "resume_at", "stalled", "upgrading",
]  # fmt: skip

log = logging.getLogger(__name__)

MAX_REASON_BYTES = 123  # RFC 6455: a close frame's reason
TERMINAL = frozenset(
    {jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED}
)
DONE = {"type": "done"}
MAX_SILENT_PROBES = 4  # probes of a quiet stream in a row that no node answers: 503

T = TypeVar("T")
Document = Callable[[jobs_pb2.Document], dict[str, Any]]


@dataclass(frozen=True)
class WatchLimits:
    """The watch's bounds (seconds)."""

    send_seconds: float = 60.0  # a message the client does not take by then: dropped
    stall_seconds: float = 30.0  # a stream quiet this long is checked with GetJob
    close_seconds: float = 10.0  # the closing handshake at most
    heartbeat_seconds: float = 30.0  # ping; a client without pong is gone


WATCH: web.AppKey[WatchLimits] = web.AppKey("watch")
_OPEN: web.AppKey[set[asyncio.Event]] = web.AppKey("watch_open")  # one per open watch


# ---------------------------------------------------------------- pure decisions


def is_upgrade(headers: Mapping[str, str]) -> bool:
    """Whether the request asks for a WebSocket (``Upgrade: websocket``)."""
    return headers.get("Upgrade", "").strip().lower() == "websocket"


def key_of(headers: Mapping[str, str]) -> tuple[str, str | None]:
    """The caller's API key and the subprotocol to answer: ``Authorization: Bearer
    KEY`` wins (the Python SDK), else the first offered subprotocol is the key (the JS
    SDK); the first offered one is answered either way. 401 for another scheme, or a
    key gRPC metadata cannot carry (``handling.checked_key``)."""
    offered = [p.strip() for p in headers.get("Sec-WebSocket-Protocol", "").split(",")]
    protocol = next((p for p in offered if p), None)
    header = headers.get("Authorization", "")
    if not header:
        return checked_key(protocol or ""), protocol
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        raise HttpError(401, "Authorization must be 'Bearer KEY'", "UNAUTHORIZED")
    return checked_key(token.strip()), protocol


def close_code(status: int) -> int:
    """The close code of an error answered with HTTP ``status``, as Firecrawl's
    (3000 key, 3003 forbidden, 1008 unknown job; 1013 try again later; 1011 else)."""
    return {401: 3000, 402: 3003, 403: 3003, 404: 1008, 429: 1013, 503: 1013}.get(status, 1011)


def close_reason(message: Mapping[str, Any]) -> bytes:
    """``message`` as JSON within a close frame's 123 bytes (an error's text cut)."""
    raw = json.dumps(message, ensure_ascii=False).encode()
    if len(raw) <= MAX_REASON_BYTES:
        return raw
    text = str(message.get("error", ""))
    while text:
        text = text[: max(0, len(text) - max(1, (len(raw) - MAX_REASON_BYTES)))]
        raw = json.dumps({**message, "error": text}, ensure_ascii=False).encode()
        if len(raw) <= MAX_REASON_BYTES:
            return raw
    return json.dumps({"type": message.get("type", "error")}).encode()


def catchup(
    page: jobs_pb2.GetJobResponse, max_documents: int, max_bytes: int, convert: Document
) -> tuple[str, int, bool]:
    """The catchup message of GetJob's first page (see the module docstring): its JSON,
    how many documents it holds, and whether it is the job's last word (finished, every
    document in it: ``done`` follows, no stream)."""
    data: list[dict[str, Any]] = []
    size = 0
    for doc in page.documents[:max_documents]:
        d = convert(doc)
        n = len(json.dumps(d, ensure_ascii=False).encode()) + 1
        if size + n > max_bytes:
            break
        data.append(d)
        size += n
    whole = len(data) == len(page.documents) and not page.HasField("next_skip")
    final = page.state in TERMINAL and whole and len(data) >= page.completed
    body = {
        "success": True,
        "status": STATES.get(page.state, "scraping") if final else "scraping",
        "total": page.total,
        "completed": page.completed,
        "creditsUsed": page.completed,
        "expiresAt": page.expires_at.ToJsonString(),
        "data": data,
    }
    return json.dumps({"type": "catchup", "data": body}, ensure_ascii=False), len(data), final


def done_message(state: jobs_pb2.StateChange | None, page: jobs_pb2.GetJobResponse) -> str:
    """``done``, with the job's final counters (the last state the stream sent, else the
    catchup's page) so an SDK's final snapshot is right."""
    src: Any = state if state is not None else page
    body = {
        "status": STATES.get(src.state, "completed"),
        "total": src.total,
        "completed": src.completed,
        "creditsUsed": src.completed,
        "expiresAt": page.expires_at.ToJsonString(),
    }
    return json.dumps({**DONE, "data": body})


def stalled(next_index: int, probe: jobs_pb2.GetJobResponse) -> bool:
    """A stream quiet for ``stall_seconds`` is stuck (a frozen node holds it) when the
    job has documents past what it sent, or has ended: resume it at ``next_index``."""
    return probe.completed > next_index or probe.state in TERMINAL


def resume_at(
    next_index: int, answers: Sequence[tuple[str, jobs_pb2.GetJobResponse | None]]
) -> str | None:
    """Where a quiet stream resumes: of the nodes that answered the probe (``answers``
    in the client's failover order, None: no answer), the first with the most progress
    among those by which it is stuck (``stalled``); None: it is not stuck, keep waiting."""
    best: tuple[str, jobs_pb2.GetJobResponse] | None = None
    for address, page in answers:
        if page is None or not stalled(next_index, page):
            continue
        if best is None or page.completed > best[1].completed:
            best = (address, page)
    return best[0] if best else None


# ---------------------------------------------------------------- the I/O shell


def add_watch(app: web.Application, limits: WatchLimits | None = None) -> None:
    """The watch's state on ``app``: its limits, and the open watches, closed with 1001
    (going away) when the app shuts down so clients reconnect elsewhere."""
    app[WATCH] = limits or WatchLimits()
    opened: set[asyncio.Event] = set()
    app[_OPEN] = opened

    async def going_away(_app: web.Application) -> None:
        for stop in list(opened):
            stop.set()

    app.on_shutdown.append(going_away)


def upgrading(kind: int, status: Handler, convert: Document = document) -> Handler:
    """The handler of ``GET /vN/crawl/{id}``: a WebSocket upgrade watches the job (of
    ``kind``; documents shaped by ``convert``), any other GET is ``status``."""
    watch = _watch_handler(kind, convert)

    async def route(request: web.Request) -> web.StreamResponse:
        return await (watch if is_upgrade(request.headers) else status)(request)

    return route


def _watch_handler(kind: int, convert: Document) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        limits = request.app.get(WATCH) or WatchLimits()
        refused: HttpError | None = None
        try:
            key, protocol = key_of(request.headers)
        except HttpError as err:
            key, protocol, refused = "", None, err
        ws = web.WebSocketResponse(
            protocols=(protocol,) if protocol else (),
            heartbeat=limits.heartbeat_seconds,
            timeout=limits.close_seconds,
            max_msg_size=64 * 1024,  # the client sends nothing the watch reads
        )
        await ws.prepare(request)
        stop = asyncio.Event()
        opened = request.app.get(_OPEN)
        if opened is not None:
            opened.add(stop)
        try:
            await _serve(request, ws, key, refused, kind, convert, limits, stop)
        finally:
            if opened is not None:
                opened.discard(stop)
        return ws

    return handle


async def _serve(
    request: web.Request,
    ws: web.WebSocketResponse,
    key: str,
    refused: HttpError | None,
    kind: int,
    convert: Document,
    limits: WatchLimits,
    stop: asyncio.Event,
) -> None:
    """Pump the job into ``ws`` until it ends, the client goes, or the app stops."""
    job_id = request.match_info["id"]
    ending: tuple[int, bytes] = (1001, b"")  # the app stopped
    async with request.app[CLIENTS].use(key) as client:
        pump = asyncio.ensure_future(
            _pump(
                ws, client, job_id, kind, convert, limits, request.app[PAGING], refused, bool(key)
            )
        )
        reader = asyncio.ensure_future(_read_until_closed(ws))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({pump, reader, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, reader, stopped):
                task.cancel()
            results = await asyncio.gather(pump, reader, stopped, return_exceptions=True)
    if isinstance(results[0], tuple):
        ending = results[0]
    elif isinstance(results[0], BaseException) and not isinstance(
        results[0], asyncio.CancelledError
    ):
        log.warning("gateway: the watch of %s ended: %r", job_id, results[0])
        ending = (1011, close_reason({"type": "error", "error": "internal error"}))
    if ws.closed:  # the client closed first (its close frame was answered)
        return
    try:
        await asyncio.wait_for(ws.close(code=ending[0], message=ending[1]), limits.close_seconds)
    except (TimeoutError, ConnectionError):
        transport = request.transport  # a client that reads nothing: drop what it holds
        if transport is not None:
            transport.abort()


async def _read_until_closed(ws: web.WebSocketResponse) -> None:
    """Read (and drop) what the client sends, so its close and pongs are seen."""
    async for msg in ws:
        if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.ERROR):
            return


async def _send(ws: web.WebSocketResponse, text: str, limits: WatchLimits) -> None:
    """One message, waiting for the transport to drain (backpressure), bounded."""
    await asyncio.wait_for(ws.send_str(text), limits.send_seconds)


def _document_message(doc: jobs_pb2.Document, convert: Document) -> str:
    return json.dumps({"type": "document", "data": convert(doc)}, ensure_ascii=False)


async def _text(make: Callable[[], T], weight: int) -> T:
    """``make()``, off the event loop when its input weighs over ``OFF_LOOP_BYTES``."""
    return await asyncio.to_thread(make) if weight > OFF_LOOP_BYTES else make()


async def _pump(
    ws: web.WebSocketResponse,
    client: JobClient,
    job_id: str,
    kind: int,
    convert: Document,
    limits: WatchLimits,
    paging: tuple[int, int],
    refused: HttpError | None,
    had_key: bool = False,
) -> tuple[int, bytes]:
    """catchup, documents, done; an error as Firecrawl's ``error``. Returns the close
    code and reason."""
    try:
        if refused is not None:
            raise refused
        page = await client.get_job(job_id, limit=paging[0])
        if page.kind != kind:
            raise HttpError(404, f"Job not found: {job_id}", "NOT_FOUND")
        size = page.ByteSize()
        text, index, final = await _text(lambda: catchup(page, *paging, convert), size)
        page.ClearField("documents")  # what the catchup holds is sent: hold it no longer
        await _send(ws, text, limits)
        del text
        last: jobs_pb2.StateChange | None = None
        if not final:
            async with contextlib.aclosing(_events(client, job_id, index, limits)) as events:
                async for event in events:
                    if event.WhichOneof("event") != "document":
                        last = event.state
                        continue
                    doc = event.document.document
                    make = functools.partial(_document_message, doc, convert)
                    message = await _text(make, doc.ByteSize())
                    await _send(ws, message, limits)
                    del message, make, doc
        await _send(ws, done_message(last, page), limits)
        return 1000, close_reason(DONE)
    except TimeoutError:  # a send the client did not take in time: it is dropped
        error = {"type": "error", "error": f"not read for {limits.send_seconds:g} s"}
        return 1008, close_reason(error)
    except ConnectionError:  # the client went away mid-send
        return 1001, b""
    except (HttpError, grpc.aio.AioRpcError) as exc:
        err = exc if isinstance(exc, HttpError) else unauthorized(from_aio_error(exc), had_key)
        error = {"type": "error", "error": err.error}
        with contextlib.suppress(Exception):
            await _send(ws, json.dumps(error, ensure_ascii=False), limits)
        return close_code(err.status), close_reason(error)


_END = object()


async def _events(
    client: JobClient, job_id: str, index: int, limits: WatchLimits
) -> AsyncGenerator[jobs_pb2.WatchJobResponse, None]:
    """WatchJob's events from ``index`` (one held at a time: the stream is read only as
    fast as they are taken). A stream quiet ``stall_seconds`` is checked by asking every
    node (``_probe``): one stuck behind the job (``resume_at``) is dropped and resumed at
    the next index on the node that showed the most; ``MAX_SILENT_PROBES`` probes in a
    row that no node answers end the watch (503)."""
    silent = 0
    while True:
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
        producer = asyncio.ensure_future(_produce(client.watch(job_id, index), queue))
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), limits.stall_seconds)
                except TimeoutError:
                    if not queue.empty():
                        continue
                    answers = await _probe(client, job_id, limits.stall_seconds)
                    heard = any(page is not None for _, page in answers)
                    silent = 0 if heard else silent + 1
                    if silent >= MAX_SILENT_PROBES:
                        error = HttpError(503, "no node of the pair answers", "UNAVAILABLE")
                        raise error from None
                    address = resume_at(index, answers)
                    if address is None:
                        continue
                    client.failover.prefer(address)
                    break
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                if item.WhichOneof("event") == "document":
                    index = item.document.index + 1
                yield item
        finally:
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
        # the stuck stream is dropped; what it had queued is older than the next index
        while not queue.empty():
            item = queue.get_nowait()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            if item.WhichOneof("event") == "document":
                index = item.document.index + 1
            yield item
        log.info("gateway: the watch of %s was stuck behind its job; resumed", job_id)


async def _probe(
    client: JobClient, job_id: str, bound: float
) -> list[tuple[str, jobs_pb2.GetJobResponse | None]]:
    """GetJob (status only) of every node at once, each bounded by ``bound``: the
    client's own reads stay on its preferred node, which is the one that may be frozen."""
    req = jobs_pb2.GetJobRequest(id=job_id, status_only=True)
    order = client.failover.order()
    results = await asyncio.gather(
        *(client.stub(a).GetJob(req, timeout=bound) for a in order), return_exceptions=True
    )
    out: list[tuple[str, jobs_pb2.GetJobResponse | None]] = []
    for address, r in zip(order, results, strict=True):
        if isinstance(r, BaseException) and not isinstance(r, grpc.aio.AioRpcError):
            raise r  # a cancellation or a bug, not a node that could not answer
        out.append((address, r if isinstance(r, jobs_pb2.GetJobResponse) else None))
    return out


async def _produce(
    events: AsyncIterator[jobs_pb2.WatchJobResponse], queue: asyncio.Queue[Any]
) -> None:
    try:
        async for event in events:
            await queue.put(event)
        await queue.put(_END)
    except grpc.aio.AioRpcError as err:
        await queue.put(err)
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
