"""A site whose pages wait at a gate: pages in flight that stay in flight until released.

``/`` links to ``/p0`` ... ``/p{n-1}``; each ``/pN`` answers only once ``open()`` was
called (bounded by ``HOLD_SECONDS``, so a test that forgets cannot hang the suite), and
counts the requests waiting at the gate, so a test sees exactly how many pages a job
has in flight. Everything else (robots.txt, sitemaps) is 404.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from tests.helpers import serve_handler, until

__all__ = ["GatedSite", "gated_site"]

HOLD_SECONDS = 20.0


class GatedSite:
    def __init__(self, pages: int) -> None:
        self.pages = pages
        self.gate = asyncio.Event()
        self.waiting = 0  # requests held at the gate now
        self.root = ""

    def open(self) -> None:
        self.gate.set()

    async def held(self, n: int) -> None:
        """Wait until ``n`` requests wait at the gate (bounded)."""
        await until(lambda: self.waiting >= n, f"{n} requests at the gate")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/":
            links = "".join(f'<a href="/p{i}">page {i}</a>' for i in range(self.pages))
            return _html(f"<h1>Home</h1>{links}")
        if path.startswith("/p") and path[2:].isdigit():
            self.waiting += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.gate.wait(), HOLD_SECONDS)
            finally:
                self.waiting -= 1
            return _html(f"<h1>Page {path[2:]}</h1><p>text</p>")
        return web.Response(status=404)


def _html(body: str) -> web.Response:
    return web.Response(
        text=f"<html><head><title>t</title></head><body>{body}</body></html>",
        content_type="text/html",
    )


@contextlib.asynccontextmanager
async def gated_site(pages: int) -> AsyncIterator[GatedSite]:
    """A ``GatedSite`` served on 127.0.0.1 (``root`` set); its gate opens at the end."""
    site = GatedSite(pages)
    async with serve_handler(site.handle) as port:
        site.root = f"http://127.0.0.1:{port}/"
        try:
            yield site
        finally:
            site.open()
