"""The gateway's own Prometheus metrics, served at ``GET /metrics`` of its port.

What it owns
------------
``GatewayMetrics``: a private ``prometheus_client.CollectorRegistry`` (never the global
one, so a test or a node may run several gateways) with

- ``pagesift_gateway_request_seconds`` (histogram; ``route``, ``method``, ``status``):
  one HTTP request, labelled by its route TEMPLATE (``/v2/crawl/{id}``), never the raw
  path, so a job id never becomes a label; a request no route matched is ``unmatched``;
- ``pagesift_gateway_requests_in_flight`` (gauge);
- ``pagesift_gateway_grpc_errors_total`` (counter; ``code``): the gRPC errors of the
  pair a route turned into an HTTP error (``note_grpc_error``, called by
  ``handling.answer``);
- ``pagesift_cluster_records_rejected_total`` (counter; ``reason``): in front of a
  cluster, the registry records its view refused (``watch_rejected``: a record that does
  not verify against the members file, an unknown pair, a foreign address...), read from
  the view at scrape time.

``middleware`` (the aiohttp middleware that times every request) and ``metrics``
(the ``/metrics`` handler; the exposition rendered off the event loop).

Invariants: label values come from bounded sets (route templates, methods, status
codes, gRPC code names, the registry's refusal reasons); the module imports no pagesift
code but ``prometheus_client``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping

import grpc
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

__all__ = ["METRICS", "GatewayMetrics", "metrics", "middleware", "note_grpc_error", "route_of"]

#: seconds; a scrape may take a minute, a status page milliseconds
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
UNMATCHED = "unmatched"


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Histogram(
            "pagesift_gateway_request_seconds",
            "HTTP requests of the gateway by route template, method and status",
            ("route", "method", "status"),
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "pagesift_gateway_requests_in_flight",
            "HTTP requests the gateway is answering now",
            registry=self.registry,
        )
        self.grpc_errors = Counter(
            "pagesift_gateway_grpc_errors_total",
            "gRPC errors of the pair the gateway answered as HTTP errors, by code",
            ("code",),
            registry=self.registry,
        )

    def watch_rejected(self, rejected: Callable[[], Mapping[str, int]]) -> None:
        """Export ``rejected()`` (the cluster view's refused records, by reason)."""
        self.registry.register(_Rejected(rejected))

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))


class _Rejected(Collector):
    def __init__(self, rejected: Callable[[], Mapping[str, int]]) -> None:
        self.rejected = rejected

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "pagesift_cluster_records_rejected",
            "registry records the cluster view refused (not verified against the members "
            "file), by reason",
            labels=("reason",),
        )
        for reason, count in sorted(self.rejected().items()):
            family.add_metric((reason,), count)
        yield family


METRICS: web.AppKey[GatewayMetrics] = web.AppKey("metrics", GatewayMetrics)


def route_of(request: web.Request) -> str:
    """The template of the route that matched ``request`` (``/v2/crawl/{id}``), or
    ``unmatched``."""
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    if resource is None or getattr(info, "http_exception", None) is not None:
        return UNMATCHED
    return str(resource.canonical)


def note_grpc_error(request: web.Request, code: grpc.StatusCode | None) -> None:
    """Count a gRPC error of the pair that ``request``'s route answered."""
    gm = request.app.get(METRICS)
    if gm is not None:
        gm.grpc_errors.labels(code.name if code is not None else "UNKNOWN").inc()


@web.middleware
async def middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Time ``request``; count it by route template, method and status."""
    gm = request.app[METRICS]
    start = time.perf_counter()
    status = 500  # an exception no route turned into an answer
    gm.in_flight.inc()
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        gm.in_flight.dec()
        elapsed = time.perf_counter() - start
        gm.requests.labels(route_of(request), request.method, str(status)).observe(elapsed)


async def metrics(request: web.Request) -> web.StreamResponse:
    """``GET /metrics``: the Prometheus text exposition."""
    body = await asyncio.to_thread(request.app[METRICS].exposition)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
