"""Firecrawl's v1 routes onto JobService, for older SDKs and integrations.

What it owns
------------
``add_v1_routes(app)``: ``POST /v1/scrape``; ``POST /v1/crawl``, ``GET|DELETE
/v1/crawl/{id}``, ``GET /v1/crawl/{id}/errors``; ``POST /v1/batch/scrape``, ``GET|DELETE
/v1/batch/scrape/{id}``, ``GET /v1/batch/scrape/{id}/errors``; ``POST /v1/map``; the
WebSocket watch of ``/v1/crawl/{id}`` (``watch.upgrading``, v1's messages are v2's). Each
handler parses its body with a v1 model (``v1models``), maps it through v2's meaning
(``v1translate`` -> ``translate``) and calls the request's ``JobClient``; status, cancel
and errors are ``jobroutes``' (v2's own handlers, under ``/v1/``); ``handling.answer``
turns every failure into Firecrawl's error.

Invariants
----------
- The semantics are v2's: the same job, status, paging (``next`` under ``/v1/``),
  errors and refusals; a job started over v1 is readable over v2 and gRPC, and the reverse.
- Only the shapes v1 spells differently differ: map's ``links`` are strings; a
  cancel answers ``{success, status: "cancelled"}`` (409 for a finished job, as v2).
- Stateless, as every route module: nothing of a job lives here.
- ``x-idempotency-key`` on a crawl or batch start is its AIP-155 key, as on v2.
"""

from __future__ import annotations

from aiohttp import web

from pagesift.gateway import v1translate
from pagesift.gateway.handling import (
    answer,
    body,
    client_of,
    idempotency_key,
)
from pagesift.gateway.jobroutes import (
    batch_started,
    cancel_route,
    crawl_started,
    errors_route,
    scraped,
    status_route,
    within,
)
from pagesift.gateway.v1models import (
    BatchScrapeRequestV1,
    CrawlRequestV1,
    MapRequestV1,
    ScrapeRequestV1,
)
from pagesift.gateway.watch import upgrading
from pagesift.v1 import jobs_pb2

__all__ = ["add_v1_routes"]


async def scrape(request: web.Request) -> web.StreamResponse:
    req: ScrapeRequestV1 = await body(request, ScrapeRequestV1)
    v2, options = v1translate.scrape_request(req)
    key = "extract" if "extract" in (req.formats or ()) else "json"  # v1's name of it
    return await scraped(request, req.url, options, v2.timeout, key)


async def start_crawl(request: web.Request) -> web.StreamResponse:
    req: CrawlRequestV1 = await body(request, CrawlRequestV1)
    return await crawl_started(request, v1translate.crawl_request(req), "/v1/crawl")


async def start_batch(request: web.Request) -> web.StreamResponse:
    req: BatchScrapeRequestV1 = await body(request, BatchScrapeRequestV1)
    start = v1translate.batch_request(req)
    start.idempotency_key = idempotency_key(request)
    resp = await client_of(request).start_batch(start)
    return batch_started(request, resp, "/v1/batch/scrape", req.ignore_invalid_urls)


async def map_site(request: web.Request) -> web.StreamResponse:
    req: MapRequestV1 = await body(request, MapRequestV1)
    v2, args = v1translate.map_arguments(req)
    call = client_of(request).map(v2.url, **args)
    urls = await within(call, v2.timeout, "Map", "MAP_TIMEOUT")
    return web.json_response({"success": True, "links": list(urls)})  # v1: plain strings


def add_v1_routes(app: web.Application) -> None:
    """Register the v1 job routes on ``app`` (made by ``app.make_app``)."""
    crawl, batch = jobs_pb2.JOB_KIND_CRAWL, jobs_pb2.JOB_KIND_BATCH_SCRAPE
    r = app.router
    r.add_post("/v1/scrape", answer(scrape))
    r.add_post("/v1/crawl", answer(start_crawl))
    r.add_get(
        "/v1/crawl/{id}", upgrading(crawl, answer(status_route(crawl, "/v1/crawl")))
    )  # + watch
    r.add_delete("/v1/crawl/{id}", answer(cancel_route(crawl)))
    r.add_get("/v1/crawl/{id}/errors", answer(errors_route(crawl)))
    r.add_post("/v1/batch/scrape", answer(start_batch))
    r.add_get("/v1/batch/scrape/{id}", answer(status_route(batch, "/v1/batch/scrape")))
    r.add_delete("/v1/batch/scrape/{id}", answer(cancel_route(batch)))
    r.add_get("/v1/batch/scrape/{id}/errors", answer(errors_route(batch)))
    r.add_post("/v1/map", answer(map_site))
