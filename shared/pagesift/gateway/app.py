"""The gateway's aiohttp application: Firecrawl's v2 routes onto JobService.

What it owns
------------
``make_app(clients)``: the routes (``POST /v2/scrape``, ``/v2/crawl`` and its status,
cancel and errors, ``/v2/batch/scrape`` and its status, cancel and errors, ``POST /v2/map``,
``GET /healthz``), request parsing (a JSON object, validated by the strict models of
``pagesift.gateway.models``), and the one place errors become answers (``_answer``).
``Clients`` keeps one ``JobClient`` per API key (bounded), so every call follows the
pair's failovers with the client's own rules.

Invariants
----------
- Stateless: nothing of a job lives here; any number of gateways can serve one pair.
- ``Authorization: Bearer KEY`` is passed through as the client's API key (no header:
  anonymous, which a node with an accounts file refuses with 401); every account limit
  and the address guard apply on the node exactly as over gRPC.
- Request bodies are bounded (``MAX_BODY_BYTES``) and past ``OFF_LOOP_BYTES`` parsed
  in a thread; every document answer is built and serialized in one. A status page's
  JSON is bounded by ``PAGE_BYTES``; it holds ``PAGE_DOCUMENTS`` documents unless
  ``?limit=`` asks for another number (at most ``MAX_LIMIT``).
- Every failure is ``{success: false, error, code?, details?}`` (``errors.HttpError``);
  an unexpected exception is a 500 that names no internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import grpc.aio
import pydantic
from aiohttp import web

from pagesift.client import JobClient
from pagesift.gateway import translate
from pagesift.gateway.errors import HttpError, bad_request, from_aio_error
from pagesift.gateway.health import PrimaryProbe
from pagesift.gateway.models import BatchScrapeRequest, CrawlRequest, MapRequest, ScrapeRequest
from pagesift.v1 import jobs_pb2

__all__ = ["MAX_BODY_BYTES", "PAGE_BYTES", "PAGE_DOCUMENTS", "Clients", "make_app"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
PAGE_BYTES = 10 * 1024 * 1024  # Firecrawl's cap on one status page
PAGE_DOCUMENTS = 100
OFF_LOOP_BYTES = 64 * 1024  # a larger request body is parsed in a thread
MAX_LIMIT = 1000  # the most documents a ?limit= may ask for (the node's max_page_size)
MAX_CLIENTS = 256  # API keys with an open client (least recently used closed first)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CLIENTS: web.AppKey[Clients] = web.AppKey("clients")
PROBE: web.AppKey[PrimaryProbe] = web.AppKey("probe")
REQUEST_CLIENT: web.RequestKey[JobClient] = web.RequestKey("client")  # chosen by _answer
PAGING: web.AppKey[tuple[int, int]] = web.AppKey("paging")  # (documents, bytes) per page


class Clients:
    """One ``JobClient`` per API key over the same addresses, the least recently used
    closed past ``limit``."""

    def __init__(
        self, addresses: Sequence[str], *, limit: int = MAX_CLIENTS, **client_kw: Any
    ) -> None:
        self.addresses = list(addresses)
        self.limit = limit
        self.client_kw = client_kw
        self._clients: OrderedDict[str, JobClient] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self._busy: dict[JobClient, int] = {}  # requests in flight per client
        self._evicted: set[JobClient] = set()  # out of the cache, closed when idle

    @contextlib.asynccontextmanager
    async def use(self, api_key: str) -> AsyncIterator[JobClient]:
        """The client of ``api_key`` for one request; a client evicted meanwhile is
        closed only once its last request is done."""
        client = self._clients.get(api_key)
        if client is None:
            client = self._clients[api_key] = JobClient(
                self.addresses, api_key=api_key, **self.client_kw
            )
            while len(self._clients) > self.limit:
                _, old = self._clients.popitem(last=False)
                if self._busy.get(old):
                    self._evicted.add(old)
                else:
                    self._close_later(old)
        self._clients.move_to_end(api_key)
        self._busy[client] = self._busy.get(client, 0) + 1
        try:
            yield client
        finally:
            self._busy[client] -= 1
            if not self._busy[client]:
                del self._busy[client]
                if client in self._evicted:
                    self._evicted.discard(client)
                    self._close_later(client)

    def _close_later(self, client: JobClient) -> None:
        task = asyncio.ensure_future(client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        clients = [*self._clients.values(), *self._evicted]
        self._clients.clear()
        self._evicted.clear()
        for c in clients:
            await c.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def __len__(self) -> int:
        """Open clients (the cached ones and those evicted but still in use)."""
        return len(self._clients) + len(self._evicted)


def _key(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if header and scheme.lower() != "bearer":
        raise HttpError(401, "Authorization must be 'Bearer KEY'", "UNAUTHORIZED")
    return token.strip()


def _client(request: web.Request) -> JobClient:
    """The request's client (``_answer`` chose it by the request's key)."""
    return request[REQUEST_CLIENT]


def _validation(err: pydantic.ValidationError) -> HttpError:
    details = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            details.append({"path": path, "message": f"Unrecognized key in body: '{path}'"})
        else:
            details.append({"path": path, "message": e["msg"]})
    return bad_request(f"Bad Request: {details[0]['message']} ({details[0]['path']})", details)


def _parse(raw: bytes, model: type[pydantic.BaseModel]) -> Any:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request("Bad Request: the body is not JSON") from exc
    if not isinstance(value, dict):
        raise bad_request("Bad Request: the body must be a JSON object")
    try:
        return model.model_validate(value)
    except pydantic.ValidationError as err:
        raise _validation(err) from None


async def _body(request: web.Request, model: type[pydantic.BaseModel]) -> Any:
    """The request's body as ``model`` (a large one parsed off the event loop)."""
    raw = await request.read()
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(_parse, raw, model)
    return _parse(raw, model)


async def _json(make: Callable[[], Any]) -> web.Response:
    """``make()``'s value as a JSON answer, built and serialized off the event loop (a
    status page or a document may be megabytes)."""
    text = await asyncio.to_thread(lambda: json.dumps(make(), ensure_ascii=False))
    return web.Response(text=text, content_type="application/json")


def _answer(handler: Handler) -> Handler:
    """Run ``handler``; any failure becomes Firecrawl's error body."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            async with request.app[CLIENTS].use(_key(request)) as client:
                request[REQUEST_CLIENT] = client
                return await handler(request)
        except HttpError as err:
            return web.json_response(err.body(), status=err.status, headers=err.headers)
        except grpc.aio.AioRpcError as err:
            e = from_aio_error(err)
            return web.json_response(e.body(), status=e.status, headers=e.headers)
        except web.HTTPRequestEntityTooLarge:
            e = HttpError(
                413, f"the body is larger than {MAX_BODY_BYTES} bytes", "PAYLOAD_TOO_LARGE"
            )
            return web.json_response(e.body(), status=e.status)
        except Exception:
            log.exception("gateway: %s %s failed", request.method, request.path)
            body = {"success": False, "error": "internal error", "code": "INTERNAL_SERVER_ERROR"}
            return web.json_response(body, status=500)

    return wrapped


def _base(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


def _int_query(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"Bad Request: {name} must be an integer") from None
    if value < 0:
        raise bad_request(f"Bad Request: {name} must not be negative")
    return value


# ---------------------------------------------------------------- routes


async def scrape(request: web.Request) -> web.StreamResponse:
    body: ScrapeRequest = await _body(request, ScrapeRequest)
    call = _client(request).scrape(body.url, translate.scrape_request(body))
    try:  # Firecrawl's timeout bounds the whole scrape, retries included
        doc = await asyncio.wait_for(call, body.timeout / 1000 if body.timeout else None)
    except TimeoutError:
        raise HttpError(
            408, f"Scrape timed out after {body.timeout} ms", "SCRAPE_TIMEOUT"
        ) from None
    return await _json(lambda: {"success": True, "data": translate.document(doc)})


async def start_crawl(request: web.Request) -> web.StreamResponse:
    body: CrawlRequest = await _body(request, CrawlRequest)
    job_id = await _client(request).start_crawl(translate.crawl_request(body))
    return web.json_response(
        {"success": True, "id": job_id, "url": f"{_base(request)}/v2/crawl/{job_id}"}
    )


async def start_batch(request: web.Request) -> web.StreamResponse:
    body: BatchScrapeRequest = await _body(request, BatchScrapeRequest)
    resp = await _client(request).start_batch(translate.batch_request(body))
    out: dict[str, Any] = {
        "success": True,
        "id": resp.id,
        "url": f"{_base(request)}/v2/batch/scrape/{resp.id}",
    }
    if body.ignore_invalid_urls:
        out["invalidURLs"] = list(resp.invalid_urls)
    return web.json_response(out)


async def _job(request: web.Request, kind: int, **kw: Any) -> jobs_pb2.GetJobResponse:
    """GetJob of the route's job; a job of the other kind is unknown here (404)."""
    job_id = request.match_info["id"]
    resp = await _client(request).get_job(job_id, **kw)
    if resp.kind != kind:
        raise HttpError(404, f"Job not found: {job_id}", "NOT_FOUND")
    return resp


def _status(kind: int, route: str) -> Handler:
    async def status(request: web.Request) -> web.StreamResponse:
        documents, max_bytes = request.app[PAGING]
        skip = _int_query(request, "skip", 0)
        asked = _int_query(request, "limit", 0) or None
        limit = min(asked or documents, MAX_LIMIT)
        resp = await _job(request, kind, skip=skip, limit=limit)
        url = f"{_base(request)}/v2/{route}/{request.match_info['id']}"
        return await _json(lambda: translate.status_page(resp, skip, url, max_bytes, asked))

    return status


def _cancel(kind: int) -> Handler:
    async def cancel(request: web.Request) -> web.StreamResponse:
        await _job(request, kind, status_only=True)
        state = await _client(request).cancel(request.match_info["id"])
        if state != jobs_pb2.JOB_STATE_CANCELLED:
            status = translate.STATES.get(state, "scraping")
            raise HttpError(409, f"The job already finished ({status})", "CONFLICT")
        return web.json_response({"success": True, "status": "cancelled"})

    return cancel


def _errors(kind: int) -> Handler:
    async def errors(request: web.Request) -> web.StreamResponse:
        await _job(request, kind, status_only=True)
        job_id = request.match_info["id"]
        resp = await _client(request).errors(job_id)
        return web.json_response(translate.errors_body(resp, job_id))

    return errors


async def map_site(request: web.Request) -> web.StreamResponse:
    body: MapRequest = await _body(request, MapRequest)
    kw = translate.map_arguments(body)
    call = _client(request).map(body.url, **kw)
    try:
        urls = await asyncio.wait_for(call, body.timeout / 1000 if body.timeout else None)
    except TimeoutError:
        raise HttpError(408, f"Map timed out after {body.timeout} ms", "MAP_TIMEOUT") from None
    return web.json_response({"success": True, "links": [{"url": u} for u in urls]})


async def healthz(request: web.Request) -> web.StreamResponse:
    """200 while a node of the pair says it takes writes (``health.PrimaryProbe``), else 503."""
    primary = await request.app[PROBE].check()
    status = 200 if primary else 503
    return web.json_response({"ok": primary is not None, "primary": primary}, status=status)


def make_app(
    clients: Clients, *, page_documents: int = PAGE_DOCUMENTS, page_bytes: int = PAGE_BYTES
) -> web.Application:
    """The gateway application over ``clients`` (closed with the app); a status page
    holds at most ``page_documents`` documents and ``page_bytes`` of JSON."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[CLIENTS] = clients
    app[PAGING] = (page_documents, page_bytes)
    app[PROBE] = probe = PrimaryProbe(clients.addresses)

    async def close(_app: web.Application) -> None:
        await clients.close()
        await probe.close()

    app.on_cleanup.append(close)
    crawl, batch = jobs_pb2.JOB_KIND_CRAWL, jobs_pb2.JOB_KIND_BATCH_SCRAPE
    r = app.router
    r.add_post("/v2/scrape", _answer(scrape))
    r.add_post("/v2/crawl", _answer(start_crawl))
    r.add_get("/v2/crawl/{id}", _answer(_status(crawl, "crawl")))
    r.add_delete("/v2/crawl/{id}", _answer(_cancel(crawl)))
    r.add_get("/v2/crawl/{id}/errors", _answer(_errors(crawl)))
    r.add_post("/v2/batch/scrape", _answer(start_batch))
    r.add_get("/v2/batch/scrape/{id}", _answer(_status(batch, "batch/scrape")))
    r.add_delete("/v2/batch/scrape/{id}", _answer(_cancel(batch)))
    r.add_get("/v2/batch/scrape/{id}/errors", _answer(_errors(batch)))
    r.add_post("/v2/map", _answer(map_site))
    r.add_get("/healthz", healthz)
    return app
