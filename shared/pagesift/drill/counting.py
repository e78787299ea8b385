"""A site that counts its concurrent requests: what proves politeness from the outside.

Owns ``Counter`` (an aiohttp middleware for one site, i.e. one host: requests inside
now, the peak, every arrival's time and path, an optional delay before each answer, an
optional Retry-After pause answered to the first page request) and ``CountedSite`` (a
demo site served on a given host with a ``Counter`` in front of it).

Why it proves anything: the count is taken by the server, on the request's way in and
out of the handler, so it sees every request any node sends to that host, whichever
pair sent it; a cluster that placed one host's work on two pairs shows a peak above
the per-host limit here. The delay makes each answer slow (so requests overlap and the
peak is reached, and so a crawl's throughput is bound by its concurrency, not by this
machine's CPU). The Retry-After pause: the first request for a page (robots.txt is
never paused) is answered 429 with ``Retry-After: S``; ``inside_pause`` lists the later
arrivals inside that window, but for requests already on their way when it was
answered (it must stay empty for a cluster that honours the pause on every node that
fetches the host). Counting runs in the site's own event loop: no locks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from pagesift.demo.site import BIG_PATH, SLOW_PATH, Site, build_site, serve_site

__all__ = ["CountedSite", "Counter"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Counter:
    """Concurrent requests to one site (see the module docstring)."""

    delay: float = 0.0  # seconds every answer waits before the handler runs
    retry_after: float = 0.0  # > 0: the first request is answered 429, Retry-After this
    inside: int = 0
    peak: int = 0
    arrivals: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, path)
    pause: tuple[float, float] | None = None  # the Retry-After window (monotonic)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        now = time.monotonic()
        self.arrivals.append((now, request.path_qs))
        if self.retry_after > 0 and self.pause is None and request.path != "/robots.txt":
            self.pause = (now, now + self.retry_after)
            return web.Response(status=429, headers={"Retry-After": f"{self.retry_after:g}"})
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        try:
            if self.delay > 0:
                await asyncio.sleep(self.delay)
            return await handler(request)
        finally:
            self.inside -= 1

    def inside_pause(self, grace: float = 0.05) -> list[tuple[float, str]]:
        """Arrivals inside the Retry-After window, but for its first ``grace`` seconds:
        a request the node had already sent (its slot taken before the 429 came back,
        at most ``per_host_concurrency - 1`` of them) is on its way, not a breach."""
        if self.pause is None:
            return []
        start, end = self.pause
        return [(t, p) for t, p in self.arrivals if start + grace < t < end]

    @property
    def requests(self) -> int:
        return len(self.arrivals)


class CountedSite:
    """The demo site (``build_site(pages)``) on ``host``, counted by a ``Counter``."""

    def __init__(
        self,
        pages: int,
        *,
        host: str = "127.0.0.1",
        delay: float = 0.0,
        retry_after: float = 0.0,
        seed: int = 1,
        slow_seconds: float = 0.2,
        big_bytes: int = 64 * 1024,
    ) -> None:
        self.site: Site = build_site(
            pages, seed=seed, slow_seconds=slow_seconds, big_bytes=big_bytes
        )
        self.counter = Counter(delay=delay, retry_after=retry_after)
        self.site.app.middlewares.append(self.counter.middleware)
        self.host = host
        self.root = ""
        self._runner: web.AppRunner | None = None

    async def start(self, port: int = 0) -> str:
        self._runner, self.root = await serve_site(self.site, host=self.host, port=port)
        return self.root

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def expected(self) -> frozenset[str]:
        """Page keys a crawl of the root must return as documents."""
        return frozenset(self.site.expected_documents(self.root))

    def optional(self) -> frozenset[str]:
        """Page keys that are documents or errors depending on the nodes' read timeout
        and body cap (``/slow.html``, ``/files/big.html``)."""
        return frozenset(self.site.url(self.root, p) for p in (SLOW_PATH, BIG_PATH))

    def page_urls(self) -> list[str]:
        """Every page of the site by URL (for a batch)."""
        return [self.root.rstrip("/") + p for p in sorted(self.site.manifest.pages)]
