"""What both API versions' job routes share: status, cancel, errors, and the start answers.

What it owns
------------
``status_route(kind, prefix)``, ``cancel_route(kind)`` and ``errors_route(kind)``: the
handlers of ``GET|DELETE {prefix}/{id}`` and ``GET {prefix}/{id}/errors`` for a job of
``kind`` (crawl or batch scrape). v1 and v2 answer these in the same shape, so ``v1``
and ``v2`` register these same handlers under their own paths. For the handlers each
version keeps (its bodies differ): ``within`` (Firecrawl's ``timeout`` over a whole
scrape or map, 408 past it), ``scraped`` (a Scrape answered with its document, also
for a page that answered an HTTP error status), ``crawl_started`` and
``batch_started`` (a start, keyed by ``x-idempotency-key``, answered with the job's id
and its absolute URL).

Invariants
----------
- A job of the other kind is unknown here (404, ``handling.job_of``).
- A status page holds the app's page documents unless ``?limit=`` asks for another
  number (at most ``MAX_LIMIT``), its JSON is bounded by the app's page bytes, and
  ``next`` is an absolute URL under ``prefix`` pointing at the first document left out.
- A cancel of a job that already finished is 409, naming its state.
- A scrape whose page answered an HTTP error status (a 404, a 500 with a body) is a
  document with that ``metadata.statusCode``, as Firecrawl answers it, never an error:
  the node's structured page error (reason ``PAGE_FETCH_FAILED``, ``code`` http_status,
  ``http_status``) says so, never its message's words.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc.aio
from aiohttp import web

from pagesift.client.errors import error_info_of
from pagesift.gateway import structured, translate
from pagesift.gateway.handling import (
    MAX_LIMIT,
    PAGING,
    Handler,
    base_url,
    client_of,
    idempotency_key,
    int_query,
    job_of,
    json_answer,
)
from pagesift.gateway.httperrors import HttpError
from pagesift.v1 import jobs_pb2

__all__ = [
    "STATUS_QUERY", "batch_started", "cancel_route", "crawl_started", "errors_route",
    "scraped", "status_route", "within",
]  # fmt: skip

T = TypeVar("T")
#: a status page's query integers -> the proto field each lands in (its bound; the
#: OpenAPI document's parameters, pagesift.gateway.openapi)
STATUS_QUERY = {"skip": "GetJobRequest.skip", "limit": "GetJobRequest.limit"}


async def within(call: Awaitable[T], timeout_ms: int | None, what: str, code: str) -> T:
    """``call``'s result, or 408 ``code`` past ``timeout_ms`` (None: no bound)."""
    try:  # Firecrawl's timeout bounds the whole call, retries included
        return await asyncio.wait_for(call, timeout_ms / 1000 if timeout_ms else None)
    except TimeoutError:
        raise HttpError(408, f"{what} timed out after {timeout_ms} ms", code) from None


def _error_status(
    err: grpc.aio.AioRpcError, url: str, options: jobs_pb2.ScrapeOptions
) -> dict[str, Any] | None:
    """The document of a Scrape that failed because the page answered an HTTP error
    status (the node's ErrorInfo: PAGE_FETCH_FAILED, code http_status), else None."""
    info = error_info_of(err)
    if info is None or info.reason != "PAGE_FETCH_FAILED":
        return None
    status = info.metadata.get("http_status", "")
    if info.metadata.get("code") != "http_status" or not status.isdigit():
        return None
    final = info.metadata.get("url") or url
    return translate.error_status_document(url, final, int(status), err.details() or "", options)


async def scraped(
    request: web.Request,
    url: str,
    options: jobs_pb2.ScrapeOptions,
    timeout_ms: int | None,
    json_key: str = "json",
) -> web.StreamResponse:
    """A Scrape of ``url`` answered ``{success, data: document}``: the page's
    (``structured.document``: markdown only when asked, the json format under
    ``json_key``), or, for a page that answered an HTTP error status,
    ``translate.error_status_document``'s."""
    call = client_of(request).scrape(url, options)
    try:
        doc = await within(call, timeout_ms, "Scrape", "SCRAPE_TIMEOUT")
    except grpc.aio.AioRpcError as err:
        page = _error_status(err, url, options)
        if page is None:
            raise
        return web.json_response({"success": True, "data": page})
    page = structured.document(doc, options, json_key)
    return await json_answer(lambda: {"success": True, "data": page})


async def crawl_started(
    request: web.Request, start: jobs_pb2.StartCrawlRequest, prefix: str
) -> web.Response:
    """Start ``start`` (a retried start with the same ``x-idempotency-key`` is the same
    job) and answer its id and ``{prefix}/{id}``."""
    start.idempotency_key = idempotency_key(request)
    job_id = await client_of(request).start_crawl(start)
    return web.json_response(
        {"success": True, "id": job_id, "url": f"{base_url(request)}{prefix}/{job_id}"}
    )


def batch_started(request: web.Request, resp: Any, prefix: str, invalid: bool) -> web.Response:
    """The answer to a batch start (or append) ``resp``; ``invalid``: with the URLs the
    node left out (``ignoreInvalidURLs``)."""
    out: dict[str, Any] = {
        "success": True,
        "id": resp.id,
        "url": f"{base_url(request)}{prefix}/{resp.id}",
    }
    if invalid:
        out["invalidURLs"] = list(resp.invalid_urls)
    return web.json_response(out)


def status_route(kind: int, prefix: str) -> Handler:
    """``GET {prefix}/{id}``: one status page (``prefix`` as ``/v2/crawl``)."""

    async def status(request: web.Request) -> web.StreamResponse:
        documents, max_bytes = request.app[PAGING]
        skip = int_query(request, "skip", 0, STATUS_QUERY["skip"])
        asked = int_query(request, "limit", 0, STATUS_QUERY["limit"]) or None
        limit = min(asked or documents, MAX_LIMIT)
        resp = await job_of(request, kind, skip=skip, limit=limit)
        url = f"{base_url(request)}{prefix}/{request.match_info['id']}"
        return await json_answer(lambda: translate.status_page(resp, skip, url, max_bytes, asked))

    return status


def cancel_route(kind: int) -> Handler:
    """``DELETE {prefix}/{id}``."""

    async def cancel(request: web.Request) -> web.StreamResponse:
        await job_of(request, kind, status_only=True)
        state = await client_of(request).cancel(request.match_info["id"])
        if state != jobs_pb2.JOB_STATE_CANCELLED:
            status = translate.STATES.get(state, "scraping")
            raise HttpError(409, f"The job already finished ({status})", "CONFLICT")
        return web.json_response({"success": True, "status": "cancelled"})

    return cancel


def errors_route(kind: int) -> Handler:
    """``GET {prefix}/{id}/errors``."""

    async def errors(request: web.Request) -> web.StreamResponse:
        await job_of(request, kind, status_only=True)
        job_id = request.match_info["id"]
        resp = await client_of(request).errors(job_id)
        return web.json_response(translate.errors_body(resp, job_id))

    return errors
