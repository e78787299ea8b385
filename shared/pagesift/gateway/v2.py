"""Firecrawl's v2 routes onto JobService.

What it owns
------------
``add_v2_routes(app)``: ``POST /v2/scrape``; ``POST /v2/crawl``, ``GET|DELETE
/v2/crawl/{id}`` (a WebSocket upgrade of the GET: ``watch``), ``GET
/v2/crawl/{id}/errors``; ``POST /v2/batch/scrape``, ``GET|DELETE /v2/batch/scrape/{id}``,
``GET /v2/batch/scrape/{id}/errors``; ``POST /v2/map``; ``POST
/v2/crawl/params-preview`` (``JobService.PreviewCrawlParams``, its request answered in
Firecrawl's crawl option names, ``translate.crawl_options``; a node without the RPC is
a 501 saying so). Each start handler parses its body with ``handling.body``, maps it
with ``translate`` and calls the request's ``JobClient``; status, cancel and errors are
``jobroutes``' (v1 shares them); ``handling.answer`` turns every failure into
Firecrawl's error.

Invariants
----------
- Stateless: nothing of a job lives here; any number of gateways can serve one pair.
- Status pages are bounded and paged as ``jobroutes`` says.
- Firecrawl's ``timeout`` bounds a whole scrape or map (retries included): 408 past it.
- A crawl or batch start's ``x-idempotency-key`` is its AIP-155 key: a retry with the
  same key and body is the same job; with another body, 409 (``errors.TABLE``).
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio
from aiohttp import web

from pagesift.gateway import translate
from pagesift.gateway.handling import answer, body, client_of, idempotency_key
from pagesift.gateway.httperrors import HttpError
from pagesift.gateway.jobroutes import (
    batch_started,
    cancel_route,
    crawl_started,
    errors_route,
    scraped,
    status_route,
    within,
)
from pagesift.gateway.models import (
    BatchScrapeRequest,
    CrawlParamsPreviewRequest,
    CrawlRequest,
    MapRequest,
    ScrapeRequest,
)
from pagesift.gateway.watch import upgrading
from pagesift.v1 import jobs_pb2

__all__ = ["add_v2_routes"]


async def scrape(request: web.Request) -> web.StreamResponse:
    req: ScrapeRequest = await body(request, ScrapeRequest)
    return await scraped(request, req.url, translate.scrape_request(req), req.timeout)


async def start_crawl(request: web.Request) -> web.StreamResponse:
    req: CrawlRequest = await body(request, CrawlRequest)
    return await crawl_started(request, translate.crawl_request(req), "/v2/crawl")


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
    return batch_started(request, resp, "/v2/batch/scrape", req.ignore_invalid_urls)


async def map_site(request: web.Request) -> web.StreamResponse:
    req: MapRequest = await body(request, MapRequest)
    call = client_of(request).map(req.url, **translate.map_arguments(req))
    urls = await within(call, req.timeout, "Map", "MAP_TIMEOUT")
    return web.json_response({"success": True, "links": [{"url": u} for u in urls]})


_NO_PREVIEW = (
    "crawl params preview: the node does not offer PreviewCrawlParams (a pagesift "
    "without it, or a cluster client, which routes no such call)"
)


async def preview_crawl(request: web.Request) -> web.StreamResponse:
    """Firecrawl's crawl options for ``prompt`` (``JobService.PreviewCrawlParams``):
    ``{success, data: {url, includePaths, ...}}``; nothing starts."""
    req: CrawlParamsPreviewRequest = await body(request, CrawlParamsPreviewRequest)
    client = client_of(request)
    ask = jobs_pb2.PreviewCrawlParamsRequest(url=req.url, prompt=req.prompt)

    def invoke(stub: Any) -> Any:
        rpc = getattr(stub, "PreviewCrawlParams", None)
        if rpc is None:  # the cluster router: no such call to route
            raise HttpError(501, _NO_PREVIEW, "NOT_IMPLEMENTED")
        return rpc(ask, timeout=client.scrape_timeout)

    try:  # nothing is stored: a retry through a failover only asks again
        resp = await client.call(invoke, retryable=True)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise HttpError(501, _NO_PREVIEW, "NOT_IMPLEMENTED") from None
        raise
    return web.json_response({"success": True, "data": translate.crawl_options(resp.request)})


def add_v2_routes(app: web.Application) -> None:
    """Register the v2 job routes on ``app`` (made by ``app.make_app``)."""
    crawl, batch = jobs_pb2.JOB_KIND_CRAWL, jobs_pb2.JOB_KIND_BATCH_SCRAPE
    r = app.router
    r.add_post("/v2/scrape", answer(scrape))
    r.add_post("/v2/crawl", answer(start_crawl))
    r.add_post("/v2/crawl/params-preview", answer(preview_crawl))
    r.add_get(
        "/v2/crawl/{id}", upgrading(crawl, answer(status_route(crawl, "/v2/crawl")))
    )  # + the watch
    r.add_delete("/v2/crawl/{id}", answer(cancel_route(crawl)))
    r.add_get("/v2/crawl/{id}/errors", answer(errors_route(crawl)))
    r.add_post("/v2/batch/scrape", answer(start_batch))
    r.add_get("/v2/batch/scrape/{id}", answer(status_route(batch, "/v2/batch/scrape")))
    r.add_delete("/v2/batch/scrape/{id}", answer(cancel_route(batch)))
    r.add_get("/v2/batch/scrape/{id}/errors", answer(errors_route(batch)))
    r.add_post("/v2/map", answer(map_site))
