"""Running the gateway: an aiohttp site on ``--listen`` in front of ``--server`` addresses.

What it owns
------------
``run(listen, addresses, stop, started)``: the site's life in an event loop (tests run
it in-process; ``pagesift gateway`` runs it under ``serve_forever`` until SIGINT or
SIGTERM). ``started`` resolves to the bound ``host:port`` (port 0 picks a free one).

Invariants
----------
- Stateless: the gateway keeps no job state, so stopping it loses nothing; its
  ``JobClient``s (one per API key) are closed with the app.
- ``/healthz`` answers 200 only while a primary of the pair answers its Role.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from pagesift.gateway.app import make_app
from pagesift.gateway.clients import Clients

__all__ = ["run", "serve_forever"]

SHUTDOWN_SECONDS = 5.0


async def run(
    listen: str,
    addresses: Sequence[str],
    stop: asyncio.Event,
    started: asyncio.Future[str] | None = None,
    **app_kw: Any,
) -> None:
    """Serve the gateway on ``listen`` until ``stop`` is set (``app_kw``: ``make_app``'s
    paging bounds)."""
    host, _, port = listen.rpartition(":")
    app = make_app(Clients(addresses), **app_kw)
    runner = web.AppRunner(app, shutdown_timeout=SHUTDOWN_SECONDS, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host.strip("[]"), int(port))
        await site.start()
        bound = runner.addresses[0]
        if started is not None and not started.done():
            started.set_result(f"{host.strip('[]')}:{bound[1]}")
        await stop.wait()
    finally:
        await runner.cleanup()


def serve_forever(listen: str, addresses: Sequence[str]) -> None:
    """``run`` in a new event loop until SIGINT or SIGTERM."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run(listen, addresses, stop)

    asyncio.run(main())
