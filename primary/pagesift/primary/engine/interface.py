"""The Engine: everything the job runtime needs from the web, behind one interface.

``Engine`` is the only surface the job code (``pagesift.primary.jobs``) sees: a page
(``scrape``), a site's sitemap URLs (``sitemap_urls``, or ``sitemap_batches`` as they
are parsed), robots.txt verdicts on URLs listed without fetching (``robots_allowed``),
and nothing else. The node reads and wires the rest through it, whatever the engine:
its metrics read ``host_delays()`` (per-host politeness delays, empty for an engine
without politeness) and ``browser_figures()`` (None for an engine without a browser);
a cluster's node sets the gate of ``host_slots()``; ``limit_renders`` hands it each
account's cap on its pages rendering at once (ignored by an engine that renders
nothing). ``rendering.RenderingEngine`` is the node's (HTTP through ``http.HttpEngine``
or a render, both through one admission step: ``admission``), ``tests/fakeengine.py``
an in-process one. Every engine obeys the same contract:

- ``scrape`` returns a ``Page`` (the document plus its absolute, normalized links) or
  raises ``PageError`` with an ``ErrorCode`` (``pagesift.core.jobs.pageerrors``).
  Robots.txt, per-host politeness (shared by every job) and the address guard are
  applied inside it: a caller that awaits ``scrape`` has already waited its turn;
- the ``Page`` says what the page says about its identity, for the job runtime to
  judge: ``document.final_url`` (after redirects and short meta refreshes),
  ``canonical`` and ``noindex``/``nofollow``; the engine never drops a page for them;
- a conditional request (``FetchPolicy.validators``) answered ``304 Not Modified``
  returns a ``Page`` with ``not_modified`` set and an empty document;
- ``sitemap_urls``/``sitemap_batches`` never raise (but ``CancelledError``): a missing
  or broken sitemap yields what was read, possibly nothing;
- ``robots_allowed`` says, per URL, whether ``scrape`` would pass robots.txt for the
  policy's agent (all True when robots are not obeyed);
- every request sends what the policy's ``RequestProfile`` says (``reqprofile``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pagesift.core.api.metricsources import BrowserFigures
from pagesift.primary.engine.politeness import HostSlots
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
    ``foreign_host`` (a node of a cluster): for a host a redirect or meta refresh leads
    to, why it is not fetched here (another pair owns it), or None; the page's own
    host is never asked (its owner was checked before the fetch).
    """

    delay: float = 0.0
    request: RequestProfile | None = None
    validators: tuple[str, str] | None = None
    owner: str = ""
    foreign_host: Callable[[str], str | None] | None = None


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
    # the model formats' fresh answers (digest, record), for the page cache to keep
    # in the page's group (``pagecache.remember``; ``pagesift.primary.models.formats``)
    model_answers: list[tuple[str, bytes]] = field(default_factory=list)


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

    def host_slots(self) -> HostSlots:
        """The per-host slots every request of this engine passes (a cluster's node
        sets their ``gate`` and calls their ``abandon``)."""
        ...

    def browser_figures(self) -> BrowserFigures | None:
        """What the browser series show (None: this engine has no browser)."""
        ...

    def limit_renders(self, per_owner: Callable[[str], int | None]) -> None:
        """Each account's cap on its pages rendering at once (None: the pool's only)."""
        ...

    async def close(self) -> None: ...
