"""HttpEngine: the real ``Engine`` (``protocol``), fetching over HTTP(S).

Owns the engine's facade: one scrape from URL to ``Page``, the sitemap walk, the
robots.txt checks of a Map call, and the parts' lifetimes. Its parts, each with its
own invariants: ``sessions`` (the aiohttp sessions, proxies, the connector's address
guard), ``hops`` (redirects, reading a response) and the admission step it passes
every hop through (``admission``: the address guard, robots.txt, per-host politeness),
``pages`` (what a response is, extraction in worker processes). What the render path
(``rendering``) uses of it is public and named: ``admission``, ``pages``, ``guard``,
``proxies``, ``fetch_response``; the rest is this engine's own. The guarantees:

- ``scrape`` makes ONE attempt: retrying a page is the job runtime's (durable
  attempt counts), so a page is never fetched twice behind its back;
- a page's ``<meta http-equiv="refresh">`` with a delay of at most 10 s
  (``content.meta_refresh``) is one more hop of the same ``max_redirects`` budget,
  through the same checks, so ``document.final_url`` is where a refresh chain ends;
- every failure is a ``PageError`` with one ``ErrorCode``; nothing else escapes
  ``scrape`` (but ``CancelledError``), and ``sitemap_urls`` never raises;
- sitemap files are retried here (``max_retries``, full jitter, at least the
  Retry-After), since seeding is redone whole after a crash anyway; only files on
  the crawl's own origin are fetched;
- the request profile (``reqprofile``) a policy carries is what every hop of its
  pages and sitemaps sends; robots.txt is fetched with the server's user agent and
  default proxy, and read for the profile's agent token, with the profile's TLS
  choice (``skip_tls_verification``: the page, its sitemaps, the robots.txt that
  names them and the one that judges it are all fetched without verification).

Body classification and decoding live in ``content``; sitemap parsing in
``sitemaps``, whose every file is fetched through ``hops.Fetcher.fetch``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver

from pagesift.core.api.metrics import Metrics
from pagesift.core.api.metricsources import BrowserFigures
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import scope, urls
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.util import tracing
from pagesift.primary.engine import content, retrypolicy, sitemaps
from pagesift.primary.engine.admission import Admission
from pagesift.primary.engine.hops import Fetcher, Response, next_hop, status_error
from pagesift.primary.engine.interface import FetchPolicy, Page
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.primary.engine.pages import PageMaker, kind_of, page_accept
from pagesift.primary.engine.politeness import HostSlots
from pagesift.primary.engine.reqprofile import ProxyPool, RequestProfile
from pagesift.primary.engine.robots import SLICE_SECONDS, origin_of
from pagesift.primary.engine.sessions import Sessions
from pagesift.v1 import jobs_pb2

__all__ = ["HttpEngine"]


def _accept_sitemap(resp: aiohttp.ClientResponse) -> str:
    if resp.status >= 400:
        raise status_error(resp)  # so that 429/503 pause the host and are retried
    return "any"


def _loop_time() -> float | None:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return None


def _host_of(url: str) -> str:
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


class HttpEngine:
    """The Engine over HTTP(S). Construct with the server config; call ``close()`` at exit."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        metrics: Metrics | None = None,
        guard: AddressGuard | None = None,
        resolver: AbstractResolver | None = None,
    ) -> None:
        """``guard`` is the address policy when ``config.allow_private_networks`` is off
        (default: block every address ``blockedaddresses.block_class`` names, exempt nothing);
        ``resolver`` the name resolver under it (default: aiohttp's)."""
        self.config = config
        self.metrics = metrics
        self.sessions = Sessions(
            config, None if config.allow_private_networks else (guard or AddressGuard()), resolver
        )
        self.fetcher = Fetcher(config, self.sessions)
        #: the admission step every request of the node passes (this engine's hops, and
        #: the render path's pages: ``rendering.RenderingEngine``)
        self.admission: Admission = self.fetcher.admission
        #: what a response becomes (worker processes), for a fetched or a rendered page
        self.pages = PageMaker(config, metrics)
        self._random = random.Random()

    @property
    def guard(self) -> AddressGuard | None:
        """The address guard of this engine's requests (None: private networks allowed):
        the admission's, the connector's, and the one a guard proxy should apply."""
        return self.admission.guard

    @property
    def proxies(self) -> ProxyPool:
        """The upstream proxies requests may go through (``reqprofile.ProxyPool``)."""
        return self.sessions.pool

    # --- Engine ----------------------------------------------------------------------------

    async def scrape(
        self,
        url: str,
        options: jobs_pb2.ScrapeOptions,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> Page:
        if not tracing.enabled():
            return await self._scrape(url, options, policy)
        with tracing.span("fetch", {"server.address": _host_of(url)}) as span:
            try:
                page = await self._scrape(url, options, policy)
            except PageError as e:
                if span is not None:
                    span.set_attribute("error.type", e.code.value)
                    if e.status is not None:
                        span.set_attribute("http.response.status_code", e.status)
                raise
            if span is not None:
                span.set_attribute("http.response.status_code", page.document.status_code)
            return page

    async def _scrape(self, url: str, options: jobs_pb2.ScrapeOptions, policy: FetchPolicy) -> Page:
        url = urls.strip_userinfo(url)  # the stored url goes without credentials
        resp, kind, agent = await self.fetch_response(url, options, policy)
        if kind == "not_modified":
            unchanged = jobs_pb2.Document(url=url, final_url=resp.url, status_code=resp.status)
            return Page(document=unchanged, validators=resp.validators, not_modified=True)
        return await self.pages.page(url, resp, kind, options, agent, policy.owner)

    async def fetch_response(
        self, url: str, options: jobs_pb2.ScrapeOptions, policy: FetchPolicy
    ) -> tuple[Response, str, str]:
        """``scrape`` up to the final response, before extraction: (the response after
        redirects and meta refreshes, its kind (``pages.kind_of``; "not_modified" for
        a 304), the robots agent its directives are read for). ``rendering`` reads
        the body to decide whether to render it; raises PageError."""
        # Requests with credentials are refused at validation; a crawled link has them
        # stripped here, so the stored url and every request go without them.
        url = urls.strip_userinfo(url)
        problem = urls.validate(url, self.config.max_url_length)
        if problem is not None:
            raise PageError(ErrorCode.INVALID_URL, problem)
        allow_non_html = options.allow_non_html
        profile = policy.request
        if profile is None:  # a one-off scrape: validation checked its permissions
            profile = RequestProfile.build(
                options, [url], may_ignore_robots=True, may_use_proxy_url=True
            )
        home = origin_of(urls.fetch_url(url))
        accept = page_accept(allow_non_html)
        page_host, foreign = urls.host_of(url), policy.foreign_host

        def foreign_hop(host: str) -> str | None:
            return None if foreign is None or host == page_host else foreign(host)

        async def get(target: str, budget: int, validators: tuple[str, str] | None) -> Response:
            return await self.fetcher.fetch(
                target,
                accept=accept,
                robots=self.config.respect_robots and profile.respect_robots,
                job_delay=policy.delay,
                max_redirects=budget,
                max_bytes=self.config.max_body_bytes,
                profile=profile,
                home=home,
                validators=validators,
                foreign_host=foreign_hop,
            )

        started = time.monotonic()
        max_hops = self.config.max_redirects
        agent = profile.robots_agent(self.config.user_agent)
        resp = await get(url, max_hops, policy.validators)
        if resp.kind == "not_modified":
            return resp, "not_modified", agent
        hops, visited = resp.hops, {resp.url}
        while True:  # meta refresh: one more redirect hop each, same budget (bounded)
            kind = kind_of(resp, allow_non_html)
            if kind != "html":
                break
            resp.text = content.decode(resp.body, resp.charset, html=True)  # kept for the page
            target = content.meta_refresh(resp.text)
            if target is None:
                break
            hops += 1
            nxt = next_hop(resp.url, target, visited, hops, max_hops, "refresh")
            resp = await get(nxt, max_hops - hops, None)
            hops += resp.hops
        if self.metrics is not None:
            self.metrics.fetched(time.monotonic() - started, len(resp.body))
        return resp, kind, agent

    async def sitemap_urls(
        self,
        url: str,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> list[str]:
        """Page URLs from the origin's sitemaps (robots.txt Sitemap: lines, else
        /sitemap.xml): indexes followed to depth 3, gzip accepted, at most 50,000
        normalized unique URLs. Never raises (a broken sitemap yields what was read).
        ``sitemap_batches`` gives them as they are read (callers with a deadline).

        Only sitemap files on the crawl's own site (``crawl.in_scope``: its origin) are
        fetched: a Sitemap: line or an index entry naming another port or host is
        skipped, so robots.txt cannot send the crawl to another service. The URLs a
        sitemap lists are the caller's to scope. Every file is fetched with the
        policy's request profile (its headers, cookies and proxy), each attempt within
        ``sitemap_file_timeout``."""
        found: list[str] = []
        async for batch in self.sitemap_batches(url, policy):
            found.extend(batch)
        return found[: sitemaps.SITEMAP_MAX_URLS]

    async def sitemap_batches(
        self,
        url: str,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> AsyncGenerator[list[str], None]:
        """``sitemap_urls``, in batches as the files are parsed (``sitemaps.batches``:
        parsing in slices, the loop running in between), so a caller can stop at its
        deadline and keep what it has. Never raises but ``CancelledError``."""
        try:
            parts = urlsplit(urls.fetch_url(url))
            origin = f"{parts.scheme}://{parts.netloc}"
            verify = policy.request is None or policy.request.verify_tls
            try:
                rules = await self.admission.robots.rules(origin + "/", verify_tls=verify)
                roots = list(rules.sitemaps)
            except Exception:
                roots = []
            if not roots:
                roots = [origin + "/sitemap.xml"]
            site = scope.origin_of(origin + "/")

            async def fetch(sitemap_url: str) -> tuple[str, int, bytes]:
                return await self._fetch_sitemap(sitemap_url, policy.request, origin)

            async for batch in sitemaps.batches(roots, site, fetch):
                yield batch
        except asyncio.CancelledError:
            raise
        except Exception:
            return

    async def robots_allowed(
        self,
        targets: Sequence[str],
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> list[bool]:
        """Whether robots.txt lets ``policy``'s agent fetch each of ``targets``, without
        fetching them (the Map call lists only such URLs): the rules ``scrape`` obeys,
        from the same cache (one robots.txt per origin); all True when the server or
        the profile does not respect robots. An unparsable URL is False.

        Each check is bounded (``robots.Matcher``); the batch runs in slices of at
        most ``robots.SLICE_SECONDS``, yielding to the event loop between slices."""
        profile = policy.request
        if not self.config.respect_robots or (profile is not None and not profile.respect_robots):
            return [True] * len(targets)
        agent = (profile or RequestProfile()).robots_agent(self.config.user_agent)
        verify = profile is None or profile.verify_tls
        loop = asyncio.get_running_loop()
        turn = loop.time() + SLICE_SECONDS
        out: list[bool] = []
        for target in targets:
            if loop.time() > turn:
                await asyncio.sleep(0)
                turn = loop.time() + SLICE_SECONDS
            try:
                current = urls.fetch_url(target)
                rules = await self.admission.robots.rules(current, agent, verify_tls=verify)
            except asyncio.CancelledError:
                raise
            except Exception:
                out.append(False)
                continue
            out.append(rules.allowed(current))
        return out

    async def close(self) -> None:
        await self.fetcher.close()
        self.pages.close()

    # --- for metrics -----------------------------------------------------------------------

    def host_delays(self) -> dict[str, float]:
        """The current delay of the most recently slowed hosts (``Admission.host_delays``)."""
        return self.admission.host_delays(_loop_time())

    def host_slots(self) -> HostSlots:
        return self.admission.slots

    def browser_figures(self) -> BrowserFigures | None:
        return None  # no browser: an HTTP engine renders nothing

    def limit_renders(self, per_owner: Callable[[str], int | None]) -> None:
        return None  # no browser: no render to cap

    # --- sitemaps --------------------------------------------------------------------------

    async def _fetch_sitemap(
        self, sitemap_url: str, profile: RequestProfile | None, home: str
    ) -> tuple[str, int, bytes]:
        """One sitemap file for ``sitemaps.batches``: no robots check, no politeness
        delay (but the host's pauses and adaptive delay), the body truncated at
        ``SITEMAP_MAX_BYTES``, each attempt within ``sitemap_file_timeout`` (a
        ``timeout``); transient failures retried up to ``max_retries``
        times with full jitter (at least the Retry-After); raises PageError."""
        retries = max(0, self.config.max_retries)
        limit = self.config.sitemap_file_timeout
        for retry in range(retries + 1):
            try:
                try:
                    async with asyncio.timeout(limit):
                        resp = await self.fetcher.fetch(
                            sitemap_url,
                            accept=_accept_sitemap,
                            robots=False,
                            job_delay=0.0,
                            max_redirects=self.config.max_redirects,
                            max_bytes=sitemaps.SITEMAP_MAX_BYTES,
                            truncate=True,
                            profile=profile,
                            home=home,
                        )
                except TimeoutError:
                    raise PageError(
                        ErrorCode.TIMEOUT, f"sitemap took over sitemap_file_timeout ({limit:g}s)"
                    ) from None
            except PageError as err:
                if retry >= retries or not retrypolicy.is_transient(err):
                    if err.code == ErrorCode.HTTP_STATUS and err.status is not None:
                        return sitemap_url, err.status, b""  # walk() skips error statuses
                    raise
                if self.metrics is not None:
                    self.metrics.fetch_retry(retrypolicy.cause_of(err))
                await asyncio.sleep(self.retry_wait(retry, err))
                continue
            return resp.url, resp.status, resp.body
        raise AssertionError("unreachable")  # pragma: no cover

    def retry_wait(self, retry: int, err: PageError) -> float:
        """Seconds before retry ``retry`` (0-based) after ``err``: full jitter, at
        least the Retry-After the server asked for."""
        cfg = self.config
        wait = retrypolicy.retry_delay(
            retry, base=cfg.retry_base_delay, cap=cfg.retry_max_delay, draw=self._random.random()
        )
        if err.retry_after is not None and err.retry_after > wait:
            wait = err.retry_after
        return wait
