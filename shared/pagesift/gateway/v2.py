"""Firecrawl's v2 routes onto JobService.

What it owns
------------
``add_v2_routes(app)``: ``POST /v2/scrape``; ``POST /v2/crawl``, ``GET|DELETE
/v2/crawl/{id}`` (a WebSocket upgrade of the GET: ``watch``), ``GET
/v2/crawl/{id}/errors``; ``POST /v2/batch/scrape``, ``GET|DELETE /v2/batch/scrape/{id}``,
``GET /v2/batch/scrape/{id}/errors``; ``POST /v2/map``. Each
handler parses its body with ``handling.body``, maps it with ``translate`` and calls the
request's ``JobClient``; ``handling.answer`` turns every failure into Firecrawl's error.

Invariants
----------
- Stateless: nothing of a job lives here; any number of gateways can serve one pair.
- A status page's JSON is bounded by the app's page bytes; it holds the app's page
  documents unless ``?limit=`` asks for another number (at most ``MAX_LIMIT``), and
  ``next`` points at the first document left out.
- Firecrawl's ``timeout`` bounds a whole scrape or map (retries included): 408 past it.
- A crawl or batch start's ``x-idempotency-key`` is its AIP-155 key: a retry with the
  same key and body is the same job; with another body, 409 (``errors.TABLE``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from pagesift.gateway import translate
from pagesift.gateway.errors import HttpError
from pagesift.gateway.handling import (
    MAX_LIMIT,
    PAGING,
    Handler,
    answer,
    base_url,
    body,
    client_of,
    idempotency_key,
    int_query,
    job_of,
    json_answer,
)
from pagesift.gateway.models import BatchScrapeRequest, CrawlRequest, MapRequest, ScrapeRequest
from pagesift.gateway.watch import upgrading
from pagesift.v1 import jobs_pb2

__all__ = ["add_v2_routes"]


async def scrape(request: web.Request) -> web.StreamResponse:
    req: ScrapeRequest = await body(request, ScrapeRequest)
    call = client_of(request).scrape(req.url, translate.scrape_request(req))
    try:  # Firecrawl's timeout bounds the whole scrape, retries included
        doc = await asyncio.wait_for(call, req.timeout / 1000 if req.timeout else None)
    except TimeoutError:
        raise HttpError(408, f"Scrape timed out after {req.timeout} ms", "SCRAPE_TIMEOUT") from None
    return await json_answer(lambda: {"success": True, "data": translate.document(doc)})


async def start_crawl(request: web.Request) -> web.StreamResponse:
    req: CrawlRequest = await body(request, CrawlRequest)
    start = translate.crawl_request(req)
    start.idempotency_key = idempotency_key(request)  # a retried start is the same job
    job_id = await client_of(request).start_crawl(start)
    return web.json_response(
        {"success": True, "id": job_id, "url": f"{base_url(request)}/v2/crawl/{job_id}"}
    )


async def start_batch(request: web.Request) -> web.StreamResponse:
    """A new batch, or (``appendToId``) the URLs added to that job of the caller's,
    answered with its id and url as Firecrawl does (``x-idempotency-key``: AIP-155)."""
    req: BatchScrapeRequest = await body(request, BatchScrapeRequest)
    client = client_of(request)
    key = idempotency_key(request)
    if req.append_to_id is not None:
        resp: Any = await client.append_batch(**translate.append_arguments(req, key))
    else:
        start = translate.batch_request(req)
        start.idempotency_key = key
        resp = await client.start_batch(start)
    out: dict[str, Any] = {
        "success": True,
        "id": resp.id,
        "url": f"{base_url(request)}/v2/batch/scrape/{resp.id}",
    }
    if req.ignore_invalid_urls:
        out["invalidURLs"] = list(resp.invalid_urls)
    return web.json_response(out)


def _status(kind: int, route: str) -> Handler:
    async def status(request: web.Request) -> web.StreamResponse:
        documents, max_bytes = request.app[PAGING]
        skip = int_query(request, "skip", 0)
        asked = int_query(request, "limit", 0) or None
        limit = min(asked or documents, MAX_LIMIT)
        resp = await job_of(request, kind, skip=skip, limit=limit)
        url = f"{base_url(request)}/v2/{route}/{request.match_info['id']}"
        return await json_answer(lambda: translate.status_page(resp, skip, url, max_bytes, asked))

    return status


def _cancel(kind: int) -> Handler:
    async def cancel(request: web.Request) -> web.StreamResponse:
        await job_of(request, kind, status_only=True)
        state = await client_of(request).cancel(request.match_info["id"])
        if state != jobs_pb2.JOB_STATE_CANCELLED:
            status = translate.STATES.get(state, "scraping")
            raise HttpError(409, f"The job already finished ({status})", "CONFLICT")
        return web.json_response({"success": True, "status": "cancelled"})

    return cancel


def _errors(kind: int) -> Handler:
    async def errors(request: web.Request) -> web.StreamResponse:
        await job_of(request, kind, status_only=True)
        job_id = request.match_info["id"]
        resp = await client_of(request).errors(job_id)
        return web.json_response(translate.errors_body(resp, job_id))

    return errors


async def map_site(request: web.Request) -> web.StreamResponse:
    req: MapRequest = await body(request, MapRequest)
    call = client_of(request).map(req.url, **translate.map_arguments(req))
    try:
        urls = await asyncio.wait_for(call, req.timeout / 1000 if req.timeout else None)
    except TimeoutError:
        raise HttpError(408, f"Map timed out after {req.timeout} ms", "MAP_TIMEOUT") from None
    return web.json_response({"success": True, "links": [{"url": u} for u in urls]})


def add_v2_routes(app: web.Application) -> None:
    """Register the v2 job routes on ``app`` (made by ``app.make_app``)."""
    crawl, batch = jobs_pb2.JOB_KIND_CRAWL, jobs_pb2.JOB_KIND_BATCH_SCRAPE
    r = app.router
    r.add_post("/v2/scrape", answer(scrape))
    r.add_post("/v2/crawl", answer(start_crawl))
    r.add_get("/v2/crawl/{id}", upgrading(crawl, answer(_status(crawl, "crawl"))))  # + the watch
    r.add_delete("/v2/crawl/{id}", answer(_cancel(crawl)))
    r.add_get("/v2/crawl/{id}/errors", answer(_errors(crawl)))
    r.add_post("/v2/batch/scrape", answer(start_batch))
    r.add_get("/v2/batch/scrape/{id}", answer(_status(batch, "batch/scrape")))
    r.add_delete("/v2/batch/scrape/{id}", answer(_cancel(batch)))
    r.add_get("/v2/batch/scrape/{id}/errors", answer(_errors(batch)))
    r.add_post("/v2/map", answer(map_site))
