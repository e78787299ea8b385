"""A generated demo website on loopback, with a manifest that says what a crawl must return.

This module owns the site the test suite crawls (crawl correctness, crash and
replication tests) and that ``make run`` serves as a demo. ``build_site`` makes
an ``aiohttp`` application and, from the same generator, a manifest; the site is
deterministic for a given ``seed`` (only absolute links carry the ``Host`` the
client used). ``serve_site`` binds it to a free loopback port, under the listeners'
discipline (``pagesift.core.util.listeners``; ``DEMO_LIMITS``: every client is local,
so no per-client cap).

What the site contains (paths are fixed; only article slugs depend on the seed):

- ``/`` (also served at ``/index.html``), four sections ``/docs/``, ``/guides/``,
  ``/blog/``, ``/reference/`` (also at ``/<section>/index.html``; ``/docs``
  answers 301 -> ``/docs/`` like a real server), ``pages`` articles
  ``/<section>/<slug>.html`` and ``/about.html``. Every page has a head (title,
  meta description, ``html lang``), header/nav, a main article with paragraphs,
  a list, a code block and a table, an aside and a footer. Links come
  root-relative, relative (``../x/y.html``, ``./y.html``), absolute, with
  ``#fragments``, pure ``#fragment``, ``index.html`` variants, and to things a
  crawler must ignore (``mailto:``, an external ``https://example.invalid`` host).
  A section index lists its first articles; articles chain with prev/next, so
  link depths vary.
- ``/robots.txt``: ``Disallow: /private/``, ``Crawl-delay: <crawl_delay>`` and a
  ``Sitemap:`` line. ``/private/admin.html`` and ``/private/reports/2025.html``
  exist (200) and are linked from articles.
- ``/sitemap.xml``: the home page, the section indexes (one in its
  ``index.html`` form), the about page, about half the articles and the
  ``/landing/*.html`` pages, which nothing links to (``sitemap_only_urls``).
- Redirects: ``/old/launch.html`` 301 -> ``/archive/launch-2019.html``;
  ``/go/roadmap`` 302 -> ``/old/roadmap.html`` 301 -> ``/archive/roadmap-2020.html``;
  ``/news/latest`` 302 -> ``/archive/news-2021.html``. The targets and the middle
  hop are linked from nowhere and absent from the sitemap, so a crawl meets each
  target only through its redirect.
- Failures, each linked from two articles: ``/missing.html`` (404),
  ``/server-error.html`` (500), ``/slow.html`` (headers at once, then the body
  only after ``slow_seconds``), ``/files/big.html`` (``big_bytes`` of HTML,
  chunked, no Content-Length), ``/files/report.pdf`` (application/pdf),
  ``/data.json`` (application/json), ``/loop/a`` (302 -> ``/loop/b`` 302 ->
  ``/loop/a``).
- A calendar trap linked from every footer: ``/calendar/2026/11`` links to the
  previous and next month, forever (years 1..9999).

The crawl contract (``Site.expected_documents`` / ``Site.expected_errors``):

- URLs are page keys: ``normalize_url`` is the crawler's own
  ``pagesift.core.jobs.urls.normalize`` (lower-case scheme and host, no default
  port, no fragment, no ``index.html``, no trailing slash but on ``/``: so
  ``/docs/``, ``/docs/index.html`` and ``/docs`` are one key ``.../docs``). A
  crawl returns each key at most once. Manifest paths are as served (``/docs/``);
  ``Site.url(root, path)`` gives the key.
- They describe a crawl from ``/`` with default request settings (same host
  only, query kept, sitemap ``include``, no limit) plus an exclude pattern for
  the calendar (``CALENDAR_EXCLUDE``); without it the crawl is unbounded and
  only ``limit``/``max_depth`` stop it (``exclude_calendar=False`` raises).
  Arguments state the other settings: ``sitemap`` (include | skip | only: only
  the sitemap's URLs, no link following), ``max_depth`` (link hops; the start
  URL is depth 0 and sitemap URLs depth 1, as the crawler seeds them; 0 or None
  is unlimited, as in the request), ``allow_non_html``.
- They assume the crawler's read timeout is below ``slow_seconds`` and its body
  cap below ``big_bytes`` (``slow_times_out``/``big_too_large`` say otherwise:
  the page is then a document), that it fetches links whatever their extension
  (so ``.json`` fails as ``unsupported_content`` and the page-less ``.pdf`` as
  ``parse_failed``, whatever ``allow_non_html`` says), and that it respects
  robots.txt: each linked ``/private/`` URL is an error ``robots_disallowed``
  (``robots_disallowed_urls`` lists them, the ``robots_blocked`` of
  GetJobErrors). A 404/500 is ``http_status``, the loop ``redirect_loop``.
- A redirect source is a document whose ``url`` is the source and whose
  ``final_url`` is the target (``redirect_sources``); the target's own URL is
  never a document.

``Site.hits`` counts requests per path and ``Site.requests`` logs
``(time.monotonic(), path)``, so tests can check that a page was fetched once or
that Crawl-delay was honoured.

The public surface lives here (``build_site``, ``serve_site``, ``Site`` with the
crawl contract, ``CrawlSettings``, ``normalize_url`` and the path constants tests
use); the parts are split by concern: ``demolayout`` (fixed paths, redirect chains,
error codes, ``PageInfo``/``Manifest``), ``demopages`` (page text, link graph and
HTML rendering) and ``demoapp`` (the aiohttp handlers: pages, redirects, robots.txt,
sitemap.xml, the slow/big/failing resources and the calendar trap).
"""

from __future__ import annotations

import random
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Literal, TypedDict, Unpack
from urllib.parse import urlsplit

from aiohttp import web

from pagesift.core.jobs import urls
from pagesift.core.util.listeners import ListenerLimits, start_site
from pagesift.demo.app import make_app
from pagesift.demo.layout import (
    BIG_PATH,
    CALENDAR_ENTRY,
    CALENDAR_EXCLUDE,
    PRIVATE_PATHS,
    REDIRECT_CHAINS,
    SECTIONS,
    SLOW_PATH,
    SPECIAL_ERRORS,
    Manifest,
    PageInfo,
)
from pagesift.demo.pages import generate_pages

__all__ = [
    "BIG_PATH",
    "CALENDAR_ENTRY",
    "CALENDAR_EXCLUDE",
    "SECTIONS",
    "SLOW_PATH",
    "Manifest",
    "PageInfo",
    "Site",
    "build_site",
    "normalize_url",
    "serve_site",
]

MiB = 1024 * 1024
SitemapMode = Literal["include", "skip", "only"]


def normalize_url(url: str) -> str:
    """The crawl's page key of ``url``: ``pagesift.core.jobs.urls.normalize`` (no trailing
    slash but on ``/``, no ``index.html``, no fragment, no default port)."""
    return urls.normalize(url)


def _origin(root_url: str) -> str:
    parts = urlsplit(normalize_url(root_url))
    return f"{parts.scheme}://{parts.netloc}"


def _served_path(path: str) -> str:
    """A manifest path in its served form: ``/docs/index.html`` -> ``/docs/``."""
    return path.removesuffix("index.html") if path.endswith("/index.html") else path


def _key_path(path: str) -> str:
    """The path part of a manifest path's page key: ``/docs/`` -> ``/docs``."""
    return urlsplit(normalize_url("http://h" + path)).path


# ---------------------------------------------------------------- the site


class CrawlSettings(TypedDict, total=False):
    """The crawl settings ``Site.outcomes`` takes (see its defaults)."""

    sitemap: SitemapMode
    max_depth: int | None
    allow_non_html: bool
    slow_times_out: bool
    big_too_large: bool
    exclude_calendar: bool


@dataclass
class Site:
    """The application, its manifest, and request counters; see the module docstring."""

    app: web.Application
    manifest: Manifest
    hits: Counter[str] = field(default_factory=Counter)
    requests: list[tuple[float, str]] = field(default_factory=list)
    _by_key: dict[str, str] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------ URL helpers

    def url(self, root_url: str, path: str) -> str:
        """The normalized URL of ``path`` on the site served at ``root_url``."""
        return normalize_url(_origin(root_url) + path)

    def sitemap_only_urls(self, root_url: str) -> set[str]:
        return {self.url(root_url, p) for p in self.manifest.sitemap_only_paths}

    def sitemap_urls(self, root_url: str) -> set[str]:
        """Normalized URLs /sitemap.xml lists."""
        return {self.url(root_url, p) for p in self.manifest.sitemap_paths}

    def redirect_sources(self, root_url: str) -> dict[str, str]:
        """Redirect source URL -> the final URL its document must carry."""
        m = self.manifest
        return {self.url(root_url, s): self.url(root_url, t) for s, t in m.redirects.items()}

    def robots_disallowed_urls(self, root_url: str) -> set[str]:
        """Linked URLs under /private/ (a robots-respecting crawl never fetches them)."""
        return {self.url(root_url, p) for p in self.manifest.private_paths}

    def page_of(self, url: str) -> PageInfo:
        """The page a document URL (any spelling) ends at, following redirects."""
        m = self.manifest
        if not self._by_key:
            self._by_key.update({_key_path(p): p for p in m.pages})
            self._by_key.update({_key_path(s): t for s, t in m.redirects.items()})
        return m.pages[self._by_key[urlsplit(normalize_url(url)).path]]

    def title_of(self, url: str) -> str:
        """The ``<title>`` of the page a document URL ends at (follows redirects)."""
        return self.page_of(url).title

    # ------------------------------------------------------ the contract

    def outcomes(
        self,
        root_url: str,
        *,
        sitemap: SitemapMode = "include",
        max_depth: int | None = None,
        allow_non_html: bool = False,
        slow_times_out: bool = True,
        big_too_large: bool = True,
        exclude_calendar: bool = True,
    ) -> dict[str, str]:
        """Every URL the crawl must report -> ``"document"`` or its error code."""
        if not exclude_calendar:
            raise ValueError(
                "a crawl that does not exclude /calendar/ is unbounded; "
                f"pass exclude_paths=[{CALENDAR_EXCLUDE!r}] to the crawl"
            )
        m = self.manifest
        errors = dict(m.special_errors)
        if allow_non_html:
            errors = {p: c for p, c in errors.items() if c != "unsupported_content"}
        if not slow_times_out:
            errors.pop(m.slow_path, None)
        if not big_too_large:
            errors.pop(m.big_path, None)
        errors.update({p: "robots_disallowed" for p in m.private_paths})

        result: dict[str, str] = {}
        depth: dict[str, int] = {}
        if sitemap != "only":
            depth["/"] = 0  # the start URL, then the sitemap's URLs at depth 1
        if sitemap != "skip":
            for p in m.sitemap_paths:
                depth.setdefault(_served_path(p), 1)
        queue = deque(depth)
        while queue:
            path = queue.popleft()
            if re.search(CALENDAR_EXCLUDE, path):
                continue
            if path in errors:
                result[path] = errors[path]
                continue
            final = m.redirects.get(path, path)
            if final not in m.pages and path not in m.special_errors:
                raise AssertionError(f"demosite links to an unknown path {path}")
            result[path] = "document"
            if sitemap == "only" or final not in m.pages:
                continue
            if max_depth and depth[path] >= max_depth:
                continue
            for nxt in m.pages[final].links:
                if nxt not in depth:
                    depth[nxt] = depth[path] + 1
                    queue.append(nxt)
        return {self.url(root_url, p): v for p, v in result.items()}

    def expected_documents(self, root_url: str, **settings: Unpack[CrawlSettings]) -> set[str]:
        """Normalized URLs a crawl from ``/`` returns as documents (see the module docstring)."""
        out = self.outcomes(root_url, **settings)
        return {u for u, v in out.items() if v == "document"}

    def expected_errors(self, root_url: str, **settings: Unpack[CrawlSettings]) -> dict[str, str]:
        """Normalized URL -> error code for every page that crawl reports as failed."""
        out = self.outcomes(root_url, **settings)
        return {u: v for u, v in out.items() if v != "document"}


def build_site(
    pages: int = 300,
    *,
    seed: int = 1,
    crawl_delay: float = 0.0,
    slow_seconds: float = 3.0,
    big_bytes: int = 3 * MiB,
) -> Site:
    """Generate the site: ``pages`` articles (at least 8) spread over the four sections.

    ``crawl_delay`` goes to robots.txt's Crawl-delay; ``/slow.html`` holds its body
    back ``slow_seconds``; ``/files/big.html`` is exactly ``big_bytes`` long.
    """
    if big_bytes < 1024:
        raise ValueError("big_bytes must be at least 1024")
    rendered, infos = generate_pages(pages, seed)
    aliases = {p + "index.html": p for p in infos if p.endswith("/")}
    served = dict(rendered)
    served.update({alias: rendered[p] for alias, p in aliases.items()})

    rng = random.Random(seed ^ 0x5EED)
    articles = [p for p, i in infos.items() if i.kind == "article"]
    listed = sorted(rng.sample(articles, len(articles) // 2))
    landing = [p for p, i in infos.items() if i.kind == "landing"]
    sections = [f"/{s}/" for s in SECTIONS]
    sections[1] += "index.html"  # the sitemap needs normalizing too
    sitemap_paths = ("/", *sections, "/about.html", *listed, *landing)

    manifest = Manifest(
        seed=seed,
        pages=infos,
        sitemap_paths=sitemap_paths,
        sitemap_only_paths=frozenset(landing),
        redirects={src: chain[-1][1] for src, chain in REDIRECT_CHAINS.items()},
        redirect_chains=dict(REDIRECT_CHAINS),
        private_paths=frozenset(PRIVATE_PATHS),
        special_errors=dict(SPECIAL_ERRORS),
        aliases=aliases,
        calendar_entry=CALENDAR_ENTRY,
        slow_path=SLOW_PATH,
        slow_seconds=slow_seconds,
        big_path=BIG_PATH,
        big_bytes=big_bytes,
        crawl_delay=crawl_delay,
    )
    hits: Counter[str] = Counter()
    requests: list[tuple[float, str]] = []
    app = make_app(served, manifest, hits, requests)
    return Site(app=app, manifest=manifest, hits=hits, requests=requests)


#: the demo's listener: the listeners' timeouts; crawls of many jobs at once from one
#: loopback address, so a total cap alone
DEMO_LIMITS = ListenerLimits(max_connections=4_096, max_per_client=0, max_requests=0)


async def serve_site(
    site: Site, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve ``site`` on ``host:port`` (0: a free port); returns the runner and root URL.

    The root URL ends in ``/``. Call ``await runner.cleanup()`` to stop; handlers
    are cancelled when their client goes away, so cleanup never waits on
    ``/slow.html``.
    """
    runner = await start_site(
        site.app, host, port, DEMO_LIMITS, name="demo", handler_cancellation=True,
        shutdown_timeout=1.0,
    )  # fmt: skip
    bound = runner.addresses[0]
    actual_port = int(bound[1])
    shown = f"[{host}]" if ":" in host else host
    return runner, f"http://{shown}:{actual_port}/"
