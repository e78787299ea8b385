"""The /metrics endpoint: an aiohttp server that renders a node's ``Metrics``.

What it owns
------------
``start_http`` serves ``GET /metrics`` (the text exposition format) and ``GET /`` (a
pointer to it) on the node's ``metrics_listen`` address; ``bound_port`` says which
port it took when asked for port 0 (tests). Nothing else listens for Prometheus.

Why it is safe: the exposition is rendered in a worker thread, because the jobs gauge
reads every job's record from the store (``metricsources``); a large store slows a
scrape, never the event loop.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from pagesift.shared.api.metrics import Metrics


async def start_http(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    """Serve ``GET /metrics`` on ``host:port`` (port 0: any free port, see ``bound_port``).

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
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port ``start_http`` actually listens on."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("the metrics endpoint is not listening")
