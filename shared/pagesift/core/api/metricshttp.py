"""The /metrics endpoint: an aiohttp server that renders a node's ``Metrics``.

What it owns
------------
``start_http`` serves ``GET /metrics`` (the text exposition format) and ``GET /`` (a
pointer to it) on the node's ``metrics_listen`` address; ``bound_port`` says which
port it took when asked for port 0 (tests). Nothing else listens for Prometheus.

Its port keeps the listeners' discipline (``pagesift.core.util.listeners``:
timeouts, and ``METRICS_LIMITS``' small connection caps, refused at once).

Why it is safe: the exposition is rendered in a worker thread, because the jobs gauge
reads every job's record from the store (``metricsources``); a large store slows a
scrape, never the event loop.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from pagesift.core.api.metrics import Metrics
from pagesift.core.util.listeners import ListenerLimits, start_site

#: /metrics is for a few Prometheus servers: a small cap, in all and per address
METRICS_LIMITS = ListenerLimits(max_connections=64, max_per_client=16)


async def start_http(
    metrics: Metrics, host: str, port: int, limits: ListenerLimits = METRICS_LIMITS
) -> web.AppRunner:
    """Serve ``GET /metrics`` on ``host:port`` (port 0: any free port, see ``bound_port``)
    under ``limits`` (``pagesift.core.util.listeners``).

    The exposition is rendered in a worker thread (the jobs gauge reads the store),
    so a large store never stalls the event loop. Stop it with ``await runner.cleanup()``.
    """

    async def handle_metrics(request: web.Request) -> web.Response:
        body = await asyncio.to_thread(metrics.exposition)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_root(request: web.Request) -> web.Response:
        return web.Response(text="pagesift metrics: see /metrics\n")

    app = web.Application()
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/", handle_root)
    return await start_site(app, host, port, limits, name="metrics")


def bound_port(runner: web.AppRunner) -> int:
    """The port ``start_http`` actually listens on."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("the metrics endpoint is not listening")
