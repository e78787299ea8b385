"""The gateway's aiohttp application: one app, the route modules registered on it.

What it owns
------------
``make_app(clients)``: the application (body size bound, the app keys of
``pagesift.gateway.handling``, the clients and the health probe closed with it), the
routes of each API module (``v2.add_v2_routes``, ``extractroutes.add_extract_routes``),
``GET /healthz``, self-hosted
Firecrawl's probes ``GET /v0|v1/health/liveness`` and ``.../readiness``, ``GET
/metrics`` (``pagesift.gateway.metrics``, whose middleware times every request) and
``GET /v2/openapi.json`` (``pagesift.gateway.openapi``).

Invariants
----------
- Stateless: nothing of a job lives here; any number of gateways can serve one pair.
- ``/healthz`` needs no key and answers 200 only while a node of the pair says it takes
  writes (``health.PrimaryProbe``), else 503.
- The Firecrawl probes need no key: liveness is 200 ``{status: "ok"}`` whenever the
  gateway's process answers at all; readiness is ``/healthz``'s verdict (200 ``{status:
  "ok"}``, else 503 ``{status: "unavailable", error}``).
"""

from __future__ import annotations

from aiohttp import web

from pagesift.gateway.clients import Clients
from pagesift.gateway.extractroutes import add_extract_routes
from pagesift.gateway.handling import (
    CLIENTS,
    MAX_BODY_BYTES,
    PAGE_BYTES,
    PAGE_DOCUMENTS,
    PAGING,
    PROBE,
    TRUST_FORWARDED,
    unrouted,
)
from pagesift.gateway.health import PrimaryProbe
from pagesift.gateway.metrics import METRICS, GatewayMetrics, metrics, middleware
from pagesift.gateway.openapi import add_openapi_route
from pagesift.gateway.team import add_team_routes
from pagesift.gateway.v1 import add_v1_routes
from pagesift.gateway.v2 import add_v2_routes
from pagesift.gateway.watch import add_watch

__all__ = ["make_app"]


async def healthz(request: web.Request) -> web.StreamResponse:
    """200 while a node of the pair says it takes writes, else 503."""
    primary = await request.app[PROBE].check()
    status = 200 if primary else 503
    return web.json_response({"ok": primary is not None, "primary": primary}, status=status)


#: self-hosted Firecrawl's probe routes (its Kubernetes manifests ask /v0/...)
PROBE_VERSIONS = ("v0", "v1")


async def liveness(request: web.Request) -> web.StreamResponse:
    """200 while the gateway's process serves requests (it asks nothing of the pair)."""
    return web.json_response({"status": "ok"})


async def readiness(request: web.Request) -> web.StreamResponse:
    """``/healthz``'s verdict in Firecrawl's probe shape: ready while a node takes writes."""
    if await request.app[PROBE].check() is not None:
        return web.json_response({"status": "ok"})
    out = {"status": "unavailable", "error": "no node of the pair takes writes"}
    return web.json_response(out, status=503)


def make_app(
    clients: Clients,
    *,
    page_documents: int = PAGE_DOCUMENTS,
    page_bytes: int = PAGE_BYTES,
    trust_forwarded: bool = False,
) -> web.Application:
    """The gateway application over ``clients`` (closed with the app); a status page
    holds at most ``page_documents`` documents and ``page_bytes`` of JSON;
    ``trust_forwarded``: a proxy's ``Forwarded`` headers make the absolute URLs."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[middleware, unrouted])
    app[CLIENTS] = clients
    app[PAGING] = (page_documents, page_bytes)
    app[TRUST_FORWARDED] = trust_forwarded
    app[METRICS] = gateway_metrics = GatewayMetrics()
    if clients.view is not None:
        view = clients.view
        gateway_metrics.watch_rejected(lambda: view.rejected)
    credentials = clients.client_kw.get("credentials")
    app[PROBE] = probe = PrimaryProbe(clients.addresses, credentials, clients.view)

    async def close(_app: web.Application) -> None:
        await clients.close()
        await probe.close()

    app.on_cleanup.append(close)
    add_watch(app)  # the WebSocket watch of /v2/crawl/{id} (pagesift.gateway.watch)
    add_team_routes(app)  # before v2: /v2/crawl/active is not a crawl id (gateway.team)
    add_v2_routes(app)
    add_v1_routes(app)  # Firecrawl v1, for older SDKs (pagesift.gateway.v1)
    add_extract_routes(app)  # extract and token usage, v2 and v1 (gateway.extractroutes)
    app.router.add_get("/healthz", healthz)
    for version in PROBE_VERSIONS:
        app.router.add_get(f"/{version}/health/liveness", liveness)
        app.router.add_get(f"/{version}/health/readiness", readiness)
    app.router.add_get("/metrics", metrics)
    add_openapi_route(app)  # last: it documents every route above
    return app
