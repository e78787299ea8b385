"""An in-process ``Engine`` for tests about job logic, the way httpx's ``MockTransport``
serves httpx's own tests: no socket, no resolver, no extraction worker.

``FakeEngine(site)`` answers ``scrape(url, ...)`` with ``site(url)``: a ``Page`` (build
one with ``page``) or a raised ``PageError``, exactly the two outcomes the ``Engine``
contract (``pagesift.primary.engine.interface``) allows. ``sitemap_urls`` (and
``sitemap_batches``, in one batch) returns what ``sitemaps`` holds for the URL's origin,
else nothing (the contract: never raises). The URLs in ``disallowed`` are the fake's
robots.txt: ``robots_allowed`` says False for them and ``scrape`` raises
``ROBOTS_DISALLOWED`` for them, as the contract ties the two together.
Every scrape is recorded in ``requests``, in call order, so a test can state what the
job runtime asked for (each page once, nothing after a cancel, ...).

Use it where the test is about what the runtime does with pages: the frontier,
dedupe, recording, quotas, retries of a ``PageError``. A test about fetching itself
(headers, cookies, proxies, redirects, robots, the address guard, timeouts) runs the
real ``HttpEngine`` against an aiohttp server on 127.0.0.1: that is what it tests.

``page`` builds the ``Page`` an ``HttpEngine`` would return for a small HTML page:
``links`` resolved against ``final_url`` and normalized (``urls.normalize``), one per
page key, in order; ``document.url`` and ``final_url`` set.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from urllib.parse import urljoin, urlsplit

from pagesift.core.api.metricsources import BrowserFigures
from pagesift.core.jobs import urls
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.interface import FetchPolicy, Page
from pagesift.primary.engine.politeness import HostSlots
from pagesift.v1 import jobs_pb2

Site = Callable[[str], Page]


def page(
    url: str,
    *links: str,
    final_url: str = "",
    title: str = "",
    canonical: str = "",
    noindex: bool = False,
    nofollow: bool = False,
) -> Page:
    """The page at ``url`` (redirected to ``final_url`` when given) linking to ``links``
    (relative or absolute), with the identity signals an ``HttpEngine`` reports."""
    final = final_url or url
    keys: list[str] = []
    for link in links:
        key = urls.normalize(urljoin(final, link).split("#", 1)[0])
        if key not in keys:
            keys.append(key)
    doc = jobs_pb2.Document(url=url, final_url=final, title=title, markdown=f"# {title or final}")
    return Page(document=doc, links=keys, canonical=canonical, noindex=noindex, nofollow=nofollow)


class FakeEngine:
    """Answers every scrape from ``site``; records each call in ``requests``."""

    def __init__(
        self,
        site: Site,
        sitemaps: dict[str, list[str]] | None = None,
        disallowed: frozenset[str] = frozenset(),
    ) -> None:
        self.site = site
        self.sitemaps = sitemaps or {}
        self.disallowed = disallowed
        self.slots = HostSlots(1)  # a clustered runtime sets its gate; nothing enters
        self.requests: list[str] = []
        self.closed = False
        self.render_limit: Callable[[str], int | None] | None = None  # the node's, once wired

    async def scrape(
        self,
        url: str,
        options: jobs_pb2.ScrapeOptions,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> Page:
        self.requests.append(url)
        if url in self.disallowed:
            raise PageError(ErrorCode.ROBOTS_DISALLOWED, f"robots.txt disallows {url}")
        return self.site(url)

    async def sitemap_urls(
        self,
        url: str,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> list[str]:
        parts = urlsplit(url)
        return list(self.sitemaps.get(f"{parts.scheme}://{parts.netloc}", []))

    async def sitemap_batches(
        self,
        url: str,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> AsyncGenerator[list[str], None]:
        found = await self.sitemap_urls(url, policy)
        if found:
            yield found

    async def robots_allowed(
        self,
        targets: Sequence[str],
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> list[bool]:
        return [target not in self.disallowed for target in targets]

    def host_delays(self) -> dict[str, float]:
        return {}  # no politeness: no host is ever slowed

    def host_slots(self) -> HostSlots:
        return self.slots  # never entered: no request leaves a fake engine

    def browser_figures(self) -> BrowserFigures | None:
        return None  # no browser

    def limit_renders(self, per_owner: Callable[[str], int | None]) -> None:
        self.render_limit = per_owner  # kept for a test of the node's wiring; nothing renders

    async def close(self) -> None:
        self.closed = True
