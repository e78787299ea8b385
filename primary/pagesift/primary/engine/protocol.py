"""The Engine: everything the job runtime needs from the web, behind one interface.

The job code (``jobs``, ``crawl``) never touches HTTP: it asks an ``Engine`` for a
page, a site's sitemap URLs, and nothing else. ``HttpEngine`` (module ``fetch``)
is the real one; any other engine obeys the same contract:

- ``scrape(url, options)`` returns a ``Page`` (the document plus the absolute,
  normalized links found on it) or raises ``PageError`` with one of the codes in
  ``ErrorCode`` (both in ``pagesift.shared.jobs.pageerrors``: ``JobService`` catches them
  too). Robots.txt, per-host politeness (concurrency and delay, shared by every
  job) and the address guard are the engine's business, applied inside ``scrape``:
  a caller that awaits ``scrape`` has already waited its turn.
- the ``Page`` also says what the page says about its identity, for the job runtime
  to judge: ``document.final_url`` (after HTTP redirects and short meta refreshes,
  followed like redirects), ``canonical`` (its rel=canonical, absolute, or ""),
  and ``noindex``/``nofollow`` (meta robots and X-Robots-Tag, see
  ``robots.page_directives``). The engine itself never drops a page for them.
- a conditional request (``FetchPolicy.validators``) answered ``304 Not Modified``
  returns a ``Page`` with ``not_modified`` set and an empty document: the caller
  holds the copy it revalidated.
- ``sitemap_urls(url, policy)`` returns the page URLs the site's sitemap(s) list,
  or an empty list; it never raises for a missing or broken sitemap.
- every request of a scrape, its redirects and its sitemaps sends what the policy's
  ``RequestProfile`` says (``reqprofile``); robots.txt is fetched with the server's
  own user agent and read for the profile's.
"""

from __future__ import annotations

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
    conditional (``pagecache``): a 304 comes back as ``Page.not_modified``.
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

    async def close(self) -> None: ...
