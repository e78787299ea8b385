"""The Engine: everything the job runtime needs from the web, behind one interface.

``Engine`` is the only surface the job code (``pagesift.primary.jobs``) sees: it asks
for a page (``scrape``), a site's sitemap URLs (``sitemap_urls``, or
``sitemap_batches`` as they are parsed) and robots.txt verdicts on URLs it lists
without fetching them (``robots_allowed``), and for nothing else. ``HttpEngine``
(``engine.http``) is the real one; ``tests/fakeengine.py`` answers in process. Every
engine obeys the same contract:

- ``scrape(url, options)`` returns a ``Page`` (the document plus the absolute,
  normalized links found on it) or raises ``PageError`` with one of the codes in
  ``ErrorCode`` (both in ``pagesift.shared.jobs.pageerrors``: ``JobService`` catches them
  too). Robots.txt, per-host politeness (concurrency and delay, shared by every
  job) and the address guard are the engine's business, applied inside ``scrape``:
  a caller that awaits ``scrape`` has already waited its turn.
- the ``Page`` also says what the page says about its identity, for the job runtime
  to judge: ``document.final_url`` (after HTTP redirects and short meta refreshes,
  followed like redirects), ``canonical`` (its rel=canonical, absolute, or ""),
  and ``noindex``/``nofollow`` (meta robots and X-Robots-Tag). The engine itself
  never drops a page for them.
- a conditional request (``FetchPolicy.validators``) answered ``304 Not Modified``
  returns a ``Page`` with ``not_modified`` set and an empty document.
- ``sitemap_urls``/``sitemap_batches`` never raise (but ``CancelledError``) for a
  missing or broken sitemap: they yield what was read, possibly nothing.
- ``robots_allowed(targets, policy)`` says, per URL, whether ``scrape`` would let
  robots.txt through for the policy's agent (all True when robots are not obeyed).
- every request sends what the policy's ``RequestProfile`` says (``reqprofile``).

The node itself reads one more thing, for its metrics: ``host_delays()``, the current
per-host politeness delays (empty for an engine without politeness).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pagesift.primary.engine.reqprofile import RequestProfile
from pagesift.v1 import jobs_pb2


@dataclass(frozen=True)
class FetchPolicy:
    """Per-job knobs the job runtime passes down to the engine.

    ``delay`` is the job's minimum seconds between two requests to one host
    (robots.txt Crawl-delay raises it); ``request`` is what each request sends
    (headers, cookie jar, user agent, timeout, TLS, proxy, robots: ``reqprofile``),
    None for a one-off scrape whose options say it all (the engine builds one).
    ``validators`` (ETag, Last-Modified) of a cached copy make the request
    conditional (``jobs.pagecache``): a 304 comes back as ``Page.not_modified``.
    ``owner`` is the account the work is for: extraction workers are shared fairly
    between owners (``workers.WorkerPool``); "" for work of no account.
    """

    delay: float = 0.0
    request: RequestProfile | None = None
    validators: tuple[str, str] | None = None
    owner: str = ""


@dataclass
class Page:
    """A scraped page: its document (formats as requested), its outgoing links, and
    what it says about its identity (rel=canonical, robots meta directives)."""

    document: jobs_pb2.Document
    links: list[str] = field(default_factory=list)
    canonical: str = ""  # the page's rel=canonical URL, absolute ("" when none)
    noindex: bool = False  # meta robots / X-Robots-Tag said noindex (or none)
    nofollow: bool = False  # ... said nofollow (or none)
    validators: tuple[str, str] = ("", "")  # the response's ETag and Last-Modified
    not_modified: bool = False  # a conditional request got 304: no document
    cache: str = ""  # "hit" / "revalidated" when it came from the page cache


class Engine(Protocol):
    async def scrape(
        self,
        url: str,
        options: jobs_pb2.ScrapeOptions,
        policy: FetchPolicy = FetchPolicy(),
    ) -> Page: ...

    async def sitemap_urls(self, url: str, policy: FetchPolicy = FetchPolicy()) -> list[str]: ...

    def sitemap_batches(
        self, url: str, policy: FetchPolicy = FetchPolicy()
    ) -> AsyncGenerator[list[str], None]: ...

    async def robots_allowed(
        self, targets: Sequence[str], policy: FetchPolicy = FetchPolicy()
    ) -> list[bool]: ...

    def host_delays(self) -> dict[str, float]: ...

    async def close(self) -> None: ...
