"""Map: a site's URLs from its sitemaps and a shallow link walk, with nothing stored.

Owns the work of the ``Map`` call (``JobService.Map`` -> ``Jobs.map`` ->
``oneoff.map_site`` -> ``map_site``): which URLs of a site are listed, in which order,
and which pages are fetched to find them. The guarantees:

- nothing is written to the store: a Map call is a read of the web, not a job (no
  meta, no frontier, no quota charge); what it holds lives in this call's memory and
  is bounded by ``Bounds`` (URLs, pages fetched, link depth, seconds);
- every page fetched goes through ``Engine.scrape``, i.e. exactly what a crawl's
  pages go through: robots.txt, the address guard at every hop and connection, the
  per-host politeness slots shared with every job of the node. Sitemaps go through
  ``Engine.sitemap_urls`` (nested indexes, gzip, only files on the site's origin);
- the site is the start URL's origin (``crawl.in_scope``; subdomains with
  ``allow_subdomains``), the WHOLE origin: ``crawl_entire_domain`` semantics, no
  path rule. ``exclude_paths`` keep URLs from being listed or fetched;
  ``include_paths`` only narrow what is listed (the walk may pass through other
  pages of the site to reach matching ones);
- the link walk is breadth-first from the start URL: links are listed to link depth
  ``Bounds.max_depth`` (2 by default) and only pages above that depth are fetched
  (a depth-2 page's links would be depth 3), at most ``Bounds.max_pages`` of them,
  ``Bounds.concurrency`` at once; a ``nofollow`` page's links are not followed;
- the whole call takes at most ``Bounds.timeout`` seconds (``map_timeout``), its
  sitemaps included (issue 19, finding 10): the sitemap phase takes the URLs as they
  are parsed (``frontier.sitemap_stream``) and stops at its own deadline, half the
  budget when a link walk follows (all of it with ``SITEMAP_MODE_ONLY``), the link
  walk stops at the call's deadline, and the URLs found until then are returned;
- a listed URL is allowed by robots.txt for the server's agent (the engine's cached
  rules, ``Engine.robots_allowed``, checked without fetching it); a fetched page that
  fails for good (robots, blocked address, 4xx..., anything but a transient failure)
  is not listed, and one that redirects is listed under its final URL (when that is
  on the site);
- each page is listed once, under its page key (``Scope.key``: normalized, the query
  dropped with ``ignore_query_parameters``), in discovery order: the start URL, the
  sitemaps' order, then the link walk's; ``rank`` then moves the URLs that contain
  ``search`` (case-insensitive) ahead, ties keeping that order, and the list is cut
  at the limit. With ``search`` the walk collects up to ``max_map_urls`` before the
  cut, so the matches among them all come first.

Why it is safe to serve on the primary beside running jobs: the fetches are the
engine's, so a Map call cannot exceed a host's politeness budget nor reach an
address a crawl could not; it holds no store lock and writes nothing, so it cannot
disturb a job or replication; and every loop in it is bounded. No step holds the
event loop for long, whatever the site sends (issue 19, findings 1 and 3): the
sitemaps are parsed in slices (``sitemaps``), the per-URL work on sitemap URLs and
page links (page keys, scope) runs in slices of at most ``SLICE_SECONDS`` with a
turn of the loop between them (``_sliced``), the regexes and ranking run in threads,
and robots.txt checks are compiled and bounded per URL and sliced the same way
(``robots``, ``Engine.robots_allowed``).

The pure parts (``rank``, ``Listing`` for the dedupe by page key, ``Bounds``) are
separate from the I/O (``map_site``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import patterns
from pagesift.core.jobs.pageerrors import PageError
from pagesift.core.jobs.scope import Scope, accepted_limits
from pagesift.primary.engine import retrypolicy
from pagesift.primary.engine.interface import Engine, FetchPolicy, Page
from pagesift.primary.jobs import frontier
from pagesift.v1 import jobs_pb2

__all__ = ["Bounds", "Listing", "map_site", "rank"]

# What the walk fetches pages as: links only (no markdown conversion).
_LINKS_ONLY = jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_LINKS])
SLICE_SECONDS = 0.01  # per-URL work on the loop between two yields at most

T = TypeVar("T")
R = TypeVar("R")


async def _sliced(items: Iterable[T], fn: Callable[[T], R | None]) -> list[R]:
    """``fn`` over ``items`` (None results dropped), yielding to the event loop every
    ``SLICE_SECONDS``: a long list never holds the loop for longer than one slice
    plus one item (each ``fn`` here is linear in one URL)."""
    loop = asyncio.get_running_loop()
    turn = loop.time() + SLICE_SECONDS
    out: list[R] = []
    for item in items:
        got = fn(item)
        if got is not None:
            out.append(got)
        if loop.time() > turn:
            await asyncio.sleep(0)
            turn = loop.time() + SLICE_SECONDS
    return out


# ---------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class Bounds:
    """The bounds of one Map call."""

    limit: int  # URLs returned at most
    collect: int  # URLs gathered before ranking (limit, or max_map_urls with a search)
    max_depth: int  # link depth listed; pages above it are fetched
    max_pages: int  # pages fetched at most
    concurrency: int  # pages fetched at once
    timeout: float  # seconds of link walk at most

    @classmethod
    def of(cls, req: jobs_pb2.MapRequest, config: ServerConfig) -> Bounds:
        cap = max(1, config.max_map_urls)
        limit = min(req.limit or config.default_map_limit, cap)
        return cls(
            limit=limit,
            collect=cap if req.search else limit,
            max_depth=max(0, config.map_max_depth),
            max_pages=max(0, config.map_max_pages),
            concurrency=max(1, config.map_concurrency),
            timeout=max(0.0, config.map_timeout),
        )


def rank(found: Sequence[str], search: str) -> list[str]:
    """``found`` with the URLs containing ``search`` (case-insensitive) first; each
    group keeps its order (a stable ranking: ties sort by discovery). No search:
    ``found`` as it is."""
    if not search:
        return list(found)
    needle = search.casefold()
    hits = [u for u in found if needle in u.casefold()]
    if not hits:
        return list(found)
    rest = [u for u in found if needle not in u.casefold()]
    return hits + rest


@dataclass
class Listing:
    """The URLs to list, once each by page key, in discovery order; a URL removed
    (its page failed) is never listed again."""

    key: Callable[[str], str]
    urls: dict[str, None] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)

    def key_of(self, url: str) -> str | None:
        """The page key of ``url``; None when it cannot be one."""
        try:
            return self.key(url)
        except ValueError:
            return None

    def add(self, keys: Iterable[str]) -> None:
        for key in keys:
            if key not in self.dropped:
                self.urls.setdefault(key, None)

    def drop(self, key: str) -> None:
        self.dropped.add(key)
        self.urls.pop(key, None)

    def __len__(self) -> int:
        return len(self.urls)

    def __contains__(self, key: object) -> bool:
        return key in self.urls


# ---------------------------------------------------------------- I/O


@dataclass
class _Walk:
    """One Map call's state: its scope, filters, engine and what it found."""

    engine: Engine
    policy: FetchPolicy
    scope: Scope
    walkable: patterns.PathFilter  # exclude_paths only: what the walk may fetch
    bounds: Bounds
    listing: Listing
    queued: set[str] = field(default_factory=set)  # keys the walk took up
    fetched: int = 0

    async def listable(self, keys: list[str]) -> list[str]:
        """The keys (not listed yet) that may be listed: include/exclude regexes (off
        the event loop) and robots.txt (the engine's cached rules)."""
        fresh = [k for k in dict.fromkeys(keys) if k not in self.listing]
        if not fresh:
            return []
        allowed = await self.scope.paths.allowed(fresh)
        fresh = [k for k, ok in zip(fresh, allowed, strict=True) if ok]
        if fresh:
            robots = await self.engine.robots_allowed(fresh, self.policy)
            fresh = [k for k, ok in zip(fresh, robots, strict=True) if ok]
        return fresh

    def full(self) -> bool:
        return len(self.listing) >= self.bounds.collect

    async def sitemap(self) -> None:
        """List the sitemaps' URLs as they are parsed (stop it when time is up: what
        was listed stays)."""

        def key(url: str) -> str | None:
            k = self.listing.key_of(url)
            return k if k is not None and self.scope.reaches(url, 0) else None

        stream = frontier.sitemap_stream(self.engine, self.scope.root, self.policy)
        async with contextlib.aclosing(stream) as batches:
            async for batch in batches:
                self.listing.add(await self.listable(await _sliced(batch, key)))
                if self.full():
                    return

    async def links(self, start: str) -> None:
        """Breadth-first from ``start``, level by level, within the bounds."""
        key = self.listing.key_of(start)
        if key is None:
            return
        self.queued.add(key)
        self.listing.add(await self.listable([key]))
        level = [(key, start)]
        for depth in range(self.bounds.max_depth):
            if not level or self.full():
                return
            level = await self._level(level, depth + 1)

    async def _level(self, level: list[tuple[str, str]], depth: int) -> list[tuple[str, str]]:
        """Fetch the pages of one level (as many as the page budget leaves),
        ``concurrency`` at once; their new links at ``depth``, in page order."""
        budget = max(0, self.bounds.max_pages - self.fetched)
        work = iter(list(enumerate(level[:budget])))
        self.fetched += min(budget, len(level))
        found: list[list[tuple[str, str]]] = [[] for _ in level]

        async def worker() -> None:
            for i, (page_key, url) in work:
                if self.full():
                    return
                found[i] = await self._page(page_key, url, depth)

        await asyncio.gather(*(worker() for _ in range(self.bounds.concurrency)))
        return [link for links in found for link in links]

    async def _page(self, key: str, url: str, depth: int) -> list[tuple[str, str]]:
        """Fetch one page; list its in-scope links (``depth``) and return the ones the
        walk may take up, as (key, url)."""
        try:
            page: Page = await self.engine.scrape(url, _LINKS_ONLY, self.policy)
        except PageError as err:
            if not retrypolicy.is_transient(err):
                self.listing.drop(key)
            return []
        final = self.listing.key_of(page.document.final_url or url)
        if final is not None and final != key:
            self.listing.drop(key)  # a redirect: the page is its final URL
            if self.scope.reaches(page.document.final_url, 0):
                self.listing.add(await self.listable([final]))
        links: dict[str, str] = {}

        def take(link: str) -> None:
            link_key = self.listing.key_of(link)
            if (
                link_key is not None
                and link_key not in links
                and link_key not in self.queued
                and self.scope.reaches(link, depth)
            ):
                links[link_key] = link

        await _sliced([] if page.nofollow else page.links, take)
        if not links:
            return []
        walk = await self.walkable.allowed(list(links))
        taken = [(k, u) for (k, u), ok in zip(links.items(), walk, strict=True) if ok]
        self.queued.update(k for k, _ in taken)
        self.listing.add(await self.listable([k for k, _ in taken]))
        return taken


async def map_site(
    engine: Engine,
    req: jobs_pb2.MapRequest,
    config: ServerConfig,
    policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
) -> list[str]:
    """The URLs of the site of ``req.url`` (module docstring), ranked and cut at the
    limit. ``req`` was validated (``specs.map_spec``, its regexes bounded there), so
    they are compiled as accepted (``scope.accepted_limits``), not checked again."""
    bounds = Bounds.of(req, config)
    limits = accepted_limits(req.include_paths, req.exclude_paths, config.max_regex_memory)
    crawl_req = jobs_pb2.StartCrawlRequest(
        url=req.url,
        include_paths=req.include_paths,
        exclude_paths=req.exclude_paths,
        allow_subdomains=req.allow_subdomains,
        ignore_query_parameters=req.ignore_query_parameters,
        crawl_entire_domain=True,
        max_depth=bounds.max_depth,
    )
    scope = await Scope.build(crawl_req, bounds.collect, limits)  # Scope.trusted's bounds
    walkable = await patterns.compile_filter([], req.exclude_paths, limits)
    walk = _Walk(engine, policy, scope, walkable, bounds, Listing(scope.key))
    mode = req.sitemap
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bounds.timeout  # the whole call, sitemaps included
    start = req.url.partition("#")[0]
    start_key = walk.listing.key_of(start)
    with contextlib.suppress(TimeoutError):  # at the deadline: the URLs found so far
        async with asyncio.timeout_at(deadline):  # robots.txt's fetch included
            if mode != jobs_pb2.SITEMAP_MODE_ONLY and start_key is not None:
                walk.listing.add(await walk.listable([start_key]))  # the start URL leads
            if mode != jobs_pb2.SITEMAP_MODE_SKIP:
                share = 1.0 if mode == jobs_pb2.SITEMAP_MODE_ONLY else 0.5  # rest: links
                ends = min(deadline, loop.time() + share * bounds.timeout)
                with contextlib.suppress(TimeoutError):  # the URLs listed so far stay
                    async with asyncio.timeout_at(ends):
                        await walk.sitemap()
            if mode != jobs_pb2.SITEMAP_MODE_ONLY and not walk.full():
                await walk.links(start)
    found = list(walk.listing.urls)
    ranked = await asyncio.to_thread(rank, found, req.search) if req.search else found
    return ranked[: bounds.limit]
