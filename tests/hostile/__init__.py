"""The hostile site: every untrusted input issue 19 found, served on loopback.

Each module of this package owns one family of hostile inputs (sitemaps, robots
rules, documents, HTML, cookies, slow discovery, big documents for watchers) and
exports ``ROUTES``: a list of ``(path, handler)`` pairs, every path under a prefix
of its own (``/sitemap/...``, ``/robots/...``, ...). Tests serve one family with
``serve(module.ROUTES)``; ``make bench`` (``bench.hostile``) serves them all at
once with ``serve(all_routes())`` and measures the node while it digests them.

Payloads are built on request (or cached per process) so importing costs nothing;
every handler answers in bounded time and size, and the site listens on 127.0.0.1.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

__all__ = ["Handler", "Routes", "all_routes", "serve"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Routes = list[tuple[str, Handler]]


def all_routes() -> Routes:
    """The ``ROUTES`` of every module of this package, in module-name order."""
    out: Routes = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        out.extend(getattr(module, "ROUTES", []))
    return out


async def serve(routes: Iterable[tuple[str, Handler]]) -> tuple[web.AppRunner, str]:
    """Serve ``routes`` (GET) on 127.0.0.1 at a free port: (runner, root URL ending in
    ``/``). Stop it with ``await runner.cleanup()``."""
    app = web.Application()
    for path, handler in routes:
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/"
