"""RenderingEngine: the ``Engine`` every job sees, choosing HTTP or the browser per page.

Owns the per-request engine choice (``choose``: ``ScrapeOptions.engine``; UNSPECIFIED
is AUTO on a node that can render, else HTTP) and the render path around a
``browser.pool.BrowserPool``; the HTTP path is ``http.HttpEngine``'s, untouched. AUTO
fetches over HTTP and renders when ``autorender.needs_render`` names a reason (decided in
the extraction worker, with the page's extraction: ``pages.RenderNeeded``), when the
request sets an option only a browser honours (``browser_asked``: waits, actions, a
screenshot, the viewport, phone emulation, locale, time zone), or when
``autorender.HostMemory`` says the host's pages need it (no fetch first); without a
``wait_until`` of its own, an AUTO render waits for ``networkidle``.
The invariants, for a rendered page as for a fetched one:

- the start URL passes the HTTP engine's admission step before the browser is asked
  (``admission.Admission``, the one object both engines' requests pass: the address
  guard, robots.txt with the profile's agent, the same delay as a fetch, the host's
  politeness slot held for the whole render, the cluster's host gate); a 429/503
  render pauses and slows the host as a fetch's would, before the slot is left. The
  final URL after the browser's redirects is checked against robots.txt too, and
  every request the browser makes goes through the node's guard proxy
  (``browser.guardproxy``). What it uses of the HTTP engine is its public interface
  (``admission``, ``pages``, ``guard``, ``proxies``, ``fetch_response``), nothing of
  its parts (``tests/test_admission.py`` checks it);
- the request profile's headers, user agent and cookies go into the render, and the
  context's cookies come back into the job's jar (``cookiejar.JobCookies.absorb``), so
  the page's write group stores them like a fetch's Set-Cookie lines; a job's pages
  share one context (scope: its profile), a one-off scrape's page gets its own;
- the rendered HTML becomes a ``Page`` through the same ``pages.PageMaker`` (worker
  processes, bounded), with ``Document.engine``, ``screenshot``, ``action_results``
  and ``metadata["engine"]`` set; one attempt per call (retries are the job's: a
  browser that crashed mid-render is a retryable ``RENDER_FAILED`` from the pool, a
  page whose renderer passed ``browser_page_memory_limit`` a ``TOO_LARGE``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from email.utils import formatdate
from typing import Any

from aiohttp.abc import AbstractResolver
from multidict import CIMultiDict

from pagesift.core.api.metricsources import BrowserFigures
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import urls
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.jobs.renderoptions import browser_fields
from pagesift.core.util import tracing
from pagesift.primary.engine import autorender, retrypolicy
from pagesift.primary.engine.browser.guardproxy import ERROR_HEADER, GuardProxy, launch_proxy
from pagesift.primary.engine.browser.pool import BrowserPool
from pagesift.primary.engine.hops import Response
from pagesift.primary.engine.http import HttpEngine
from pagesift.primary.engine.interface import FetchPolicy, Page
from pagesift.primary.engine.pages import RenderNeeded
from pagesift.primary.engine.politeness import HostSlots
from pagesift.primary.engine.reqprofile import RequestProfile
from pagesift.primary.extract.metadata import response_metadata
from pagesift.v1 import jobs_pb2

__all__ = ["RenderingEngine", "browser_asked", "choose", "render_status"]

HTTP = jobs_pb2.FETCH_ENGINE_HTTP
BROWSER = jobs_pb2.FETCH_ENGINE_BROWSER
AUTO = jobs_pb2.FETCH_ENGINE_AUTO
ENGINE_NAMES: dict[int, str] = {HTTP: "http", BROWSER: "browser"}


def choose(options: jobs_pb2.ScrapeOptions, can_render: bool) -> int:
    """The engine a request runs with: its own, UNSPECIFIED as AUTO when the node can
    render, else HTTP (AUTO without a browser is HTTP too)."""
    engine = options.engine
    if engine == jobs_pb2.FETCH_ENGINE_UNSPECIFIED:
        return AUTO if can_render else HTTP
    if engine == AUTO and not can_render:
        return HTTP
    return int(engine)


def browser_asked(options: jobs_pb2.ScrapeOptions) -> str | None:
    """What in a request only a browser honours (AUTO renders it at once), or None: the
    same list validation refuses on a node that cannot render (``rendering.browser_fields``),
    so no option is accepted and then silently ignored by an HTTP fetch."""
    fields = browser_fields(options, "")
    if not fields:
        return None
    name = fields[0].lstrip(".").split("[", 1)[0]
    return "screenshot" if name == "formats" else name


def render_status(config: ServerConfig) -> str:
    """ "" when a node with ``config`` can render, else why not (no I/O but a stat)."""
    if not config.browser_executable:
        return "browser_executable is empty: rendering is off"
    return BrowserPool(config).available().reason


class RenderingEngine:
    """The node's Engine: ``http`` for fetches and, with ``render``, a browser pool
    behind the guard proxy, both started at the first render (nothing launched before)."""

    def __init__(
        self,
        http: HttpEngine,
        *,
        render: bool = True,
        resolver: AbstractResolver | None = None,
        memory: autorender.HostMemory | None = None,
    ) -> None:
        """``render``: use the browser when ``config.browser_executable`` is there;
        ``resolver``: the names under the guard proxy (default: aiohttp's, as
        ``HttpEngine``'s)."""
        self.http = http
        self.config = http.config
        self.metrics = http.metrics
        self.memory = memory or autorender.HostMemory()
        self.pool: BrowserPool | None = None
        self.proxy: GuardProxy | None = None
        if render:
            self.pool = BrowserPool(self.config)  # launches nothing until a page comes
            self.proxy = GuardProxy(http.guard, resolver, pool=http.proxies)
        self._started = asyncio.Lock()
        #: an account's own cap on its pages rendering at once (None: the pool's only);
        #: the node sets it from the accounts file (``Account.max_browser_pages``)
        self.owner_limit: Callable[[str], int | None] = lambda _owner: None

    def can_render(self) -> bool:
        """Whether this node renders (a browser is configured and installed)."""
        return self.pool is not None and bool(self.pool.available())

    def render_status(self) -> str:
        """ "" when this node can render, else why not (health and status say it)."""
        if self.pool is None:
            return "rendering is off on this node"
        return self.pool.available().reason

    async def _pool(self) -> tuple[BrowserPool, GuardProxy]:
        """The pool, its browser to be launched with the started guard proxy."""
        pool, proxy = self.pool, self.proxy
        if pool is None or proxy is None or not pool.available():
            raise PageError(ErrorCode.RENDER_FAILED, f"cannot render: {self.render_status()}")
        async with self._started:
            if pool.proxy is None:
                await proxy.start()
                pool.proxy = launch_proxy(proxy.server)
        return pool, proxy

    # --- Engine ----------------------------------------------------------------------------

    async def scrape(
        self,
        url: str,
        options: jobs_pb2.ScrapeOptions,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> Page:
        engine = choose(options, self.can_render())
        if engine == HTTP:
            started = time.monotonic()
            page = await self.http.scrape(url, options, policy)
            return self._mark(page, HTTP, started)
        if engine == BROWSER:
            return await self._render(url, options, policy, "")
        return await self._auto(url, options, policy)

    async def _auto(self, url: str, options: jobs_pb2.ScrapeOptions, policy: FetchPolicy) -> Page:
        url = urls.strip_userinfo(url)
        host = urls.host_of(url) if urls.validate(url, self.config.max_url_length) is None else ""
        asked = browser_asked(options)
        if asked is not None:
            return await self._render(url, options, policy, "requested " + asked)
        if host and self.memory.render_first(policy.owner, host):
            return await self._render(url, options, policy, "host needs rendering")
        if not tracing.enabled():
            page, reason = await self._fetch_first(url, host, options, policy)
        else:  # the same "fetch" span as HttpEngine.scrape's
            with tracing.span("fetch", {"server.address": host}) as span:
                try:
                    page, reason = await self._fetch_first(url, host, options, policy)
                except PageError as e:
                    if span is not None:
                        span.set_attribute("error.type", e.code.value)
                        if e.status is not None:
                            span.set_attribute("http.response.status_code", e.status)
                    raise
                if span is not None and page is not None:
                    span.set_attribute("http.response.status_code", page.document.status_code)
        if page is not None:
            return page
        return await self._render(url, options, policy, reason)

    async def _fetch_first(
        self, url: str, host: str, options: jobs_pb2.ScrapeOptions, policy: FetchPolicy
    ) -> tuple[Page | None, str]:
        """AUTO's fetch: (the page, "") when it needs no browser, else (None, why)."""
        started = time.monotonic()
        resp, kind, agent = await self.http.fetch_response(url, options, policy)
        if kind == "not_modified":
            unchanged = jobs_pb2.Document(url=url, final_url=resp.url, status_code=resp.status)
            return Page(document=unchanged, validators=resp.validators, not_modified=True), ""
        # the extraction worker decides first (``autorender.judge_and_extract``): a page
        # that needs a browser comes back as RenderNeeded, not extracted
        needed = False
        try:
            page = await self.http.pages.page(
                url, resp, kind, options, agent, policy.owner, judge_render=kind == "html"
            )
        except RenderNeeded as need:
            needed = True
            return None, need.reason
        finally:
            if host:
                self.memory.record(policy.owner, host, needed)
        return self._mark(page, HTTP, started), ""

    async def _render(
        self, url: str, options: jobs_pb2.ScrapeOptions, policy: FetchPolicy, reason: str
    ) -> Page:
        if reason and options.wait_until == jobs_pb2.WAIT_UNTIL_UNSPECIFIED:
            # AUTO rendering a page for what it is (not for a wait the caller chose):
            # its content likely comes from fetch() after load, so wait for the network
            settled = jobs_pb2.ScrapeOptions()
            settled.CopyFrom(options)
            settled.wait_until = jobs_pb2.WAIT_UNTIL_NETWORKIDLE
            options = settled
        if not tracing.enabled():
            return await self._render_page(url, options, policy, reason)
        attrs = {"server.address": urls.host_of(url), "pagesift.render_reason": reason}
        with tracing.span("render", attrs) as span:
            try:
                page = await self._render_page(url, options, policy, reason)
            except PageError as e:
                if span is not None:
                    span.set_attribute("error.type", e.code.value)
                raise
            if span is not None:
                span.set_attribute("http.response.status_code", page.document.status_code)
            return page

    async def _render_page(
        self, url: str, options: jobs_pb2.ScrapeOptions, policy: FetchPolicy, reason: str
    ) -> Page:
        url = urls.strip_userinfo(url)
        problem = urls.validate(url, self.config.max_url_length)
        if problem is not None:
            raise PageError(ErrorCode.INVALID_URL, problem)
        profile = policy.request
        if profile is None:  # a one-off scrape: validation checked its permissions
            profile = RequestProfile.build(
                options, [url], may_ignore_robots=True, may_use_proxy_url=True
            )
        try:
            current = urls.fetch_url(url)
        except ValueError as exc:
            raise PageError(ErrorCode.INVALID_URL, f"invalid URL: {exc}") from None
        if not self.can_render():  # before any check or turn: nothing would be sent
            raise PageError(ErrorCode.RENDER_FAILED, f"cannot render: {self.render_status()}")
        agent = profile.robots_agent(self.config.user_agent)
        robots = self.config.respect_robots and profile.respect_robots
        # the page's navigation passes the HTTP engine's admission step: the same guard,
        # robots.txt, delay and host slot (the page's own host: its owner was checked
        # before the engine was asked); the browser's redirects and subrequests go
        # through the guard proxy
        started = time.monotonic()
        async with self.http.admission.admit(
            current,
            robots=robots,
            agent=agent,
            job_delay=policy.delay,
            verify_tls=profile.verify_tls,
        ) as ticket:
            pool, proxy = await self._pool()
            creds = proxy.register(proxy=profile.proxy, proxy_url=profile.proxy_url)
            # from here the pool has the credentials: it releases them when no context
            # uses them (a job's pages share its context: the profile lives as the job)
            rendered = await pool.render(
                current,
                options,
                owner=policy.owner,
                owner_limit=self.owner_limit(policy.owner),
                headers=dict(profile.headers),
                user_agent=profile.user_agent or None,
                cookies=_browser_cookies(profile, current),
                proxy=creds.playwright(),
                timeout=profile.timeout,
                scope=policy.request,
                release=lambda: proxy.release(creds),
            )
            proxy_failed = _proxy_error(rendered.headers)
            if proxy_failed is None:  # the host answered: its politeness, as a fetch's
                if rendered.status in retrypolicy.SLOW_DOWN_STATUSES:
                    ticket.failed(_status_error(rendered.status, rendered.headers))
                elif rendered.status < 400:
                    ticket.answered(0.0)  # a render's time is the browser's: decay only
        if proxy_failed is not None:
            raise proxy_failed
        _absorb_cookies(profile, rendered.cookies)
        final = rendered.final_url or current
        if robots and final != current:
            await self.http.admission.robots_check(final, agent, profile.verify_tls)
        if rendered.status >= 400:
            raise _status_error(rendered.status, rendered.headers)
        resp = _response(final, rendered.status, rendered.headers, rendered.html)
        page = await self.http.pages.page(url, resp, "html", options, agent, policy.owner)
        doc = page.document
        if rendered.screenshot is not None:
            doc.screenshot.CopyFrom(rendered.screenshot)
        doc.action_results.extend(rendered.action_results)
        if reason:
            doc.metadata["render_reason"] = reason
            if self.metrics is not None:
                self.metrics.auto_rendered(reason)
        return self._mark(page, BROWSER, started)

    def _mark(self, page: Page, engine: int, started: float) -> Page:
        """Record which engine produced ``page`` (document, metadata, metrics)."""
        if page.not_modified:
            return page
        page.document.engine = engine  # type: ignore[assignment]
        page.document.metadata["engine"] = ENGINE_NAMES[engine]
        if self.metrics is not None:
            self.metrics.page_produced(ENGINE_NAMES[engine], time.monotonic() - started)
        return page

    async def sitemap_urls(
        self,
        url: str,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> list[str]:
        return await self.http.sitemap_urls(url, policy)

    def sitemap_batches(
        self,
        url: str,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> AsyncGenerator[list[str], None]:
        return self.http.sitemap_batches(url, policy)

    async def robots_allowed(
        self,
        targets: Sequence[str],
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> list[bool]:
        return await self.http.robots_allowed(targets, policy)

    def host_delays(self) -> dict[str, float]:
        return self.http.host_delays()

    def host_slots(self) -> HostSlots:
        return self.http.host_slots()

    def limit_renders(self, per_owner: Callable[[str], int | None]) -> None:
        self.owner_limit = per_owner

    def browser_figures(self) -> BrowserFigures:
        """What the browser series show (``metricsources.BrowserFigures``)."""
        stats = self.pool.stats() if self.pool is not None else {}
        blocked = self.proxy.stats() if self.proxy is not None else None
        return BrowserFigures(
            can_render=self.can_render(),
            pages_in_use=stats.get("in_use", 0),
            pages_max=stats.get("capacity", 0),
            restarts=stats.get("restarts", 0),
            blocked_requests=blocked.blocked if blocked is not None else 0,
            blocked_bytes=blocked.blocked_bytes if blocked is not None else 0,
        )

    async def close(self) -> None:
        try:
            if self.pool is not None:
                await self.pool.close()
        finally:
            try:
                if self.proxy is not None:
                    await self.proxy.close()
            finally:
                await self.http.close()


def _proxy_error(headers: Mapping[str, str]) -> PageError | None:
    """The page's error when the guard proxy itself answered the main request (its
    ``ERROR_HEADER`` names the code: a blocked address, DNS, connect, timeout)."""
    value = CIMultiDict(headers).get(ERROR_HEADER)
    if not value:
        return None
    try:
        code = ErrorCode(value.strip())
    except ValueError:
        code = ErrorCode.RENDER_FAILED
    return PageError(code, f"the guard proxy refused the page: {value.strip()}")


def _response(url: str, status: int, headers: Mapping[str, str], html: bytes) -> Response:
    """The ``hops.Response`` of a rendered page (HTML, UTF-8: what ``content()`` gave)."""
    h = CIMultiDict(headers)
    robots_tag = tuple(v for k, v in headers.items() if k.lower() == "x-robots-tag")
    return Response(
        url=url,
        status=status,
        content_type="text/html; charset=utf-8",
        mimetype="text/html",
        charset="utf-8",
        kind="html",
        body=html,
        robots_tag=robots_tag,
        validators=(h.get("ETag", ""), h.get("Last-Modified", "")),
        meta_headers=response_metadata(h),
    )


def _status_error(status: int, headers: Mapping[str, str]) -> PageError:
    """The HTTP engine's HTTP_STATUS error for a rendered page's error status."""
    retry_after = None
    if status in retrypolicy.SLOW_DOWN_STATUSES:
        value = CIMultiDict(headers).get("Retry-After")
        retry_after = retrypolicy.parse_retry_after(value, time.time())
    return PageError(
        ErrorCode.HTTP_STATUS, f"HTTP {status}", status=status, retry_after=retry_after
    )


def _browser_cookies(profile: RequestProfile, url: str) -> list[dict[str, Any]]:
    """The job's cookies for ``url`` in Playwright's form (bound to that URL)."""
    header = profile.cookies.header(url)
    if not header:
        return []
    out = []
    for pair in header.split("; "):
        name, sep, value = pair.partition("=")
        if sep and name:
            out.append({"name": name, "value": value, "url": url})
    return out


def _absorb_cookies(profile: RequestProfile, cookies: Sequence[Mapping[str, Any]]) -> None:
    """The context's cookies at the end of a render into the job's jar, as the
    Set-Cookie lines that would have set them (expired ones skipped)."""
    now = time.time()
    for c in cookies:
        name, domain = str(c.get("name", "")), str(c.get("domain", ""))
        if not name or not domain:
            continue
        path = str(c.get("path") or "/")
        secure = bool(c.get("secure"))
        parts = [f"{name}={c.get('value', '')}", f"Path={path}"]
        if domain.startswith("."):
            parts.append(f"Domain={domain[1:]}")
        expires = c.get("expires", -1)
        if isinstance(expires, int | float) and expires > 0:
            if expires <= now:
                continue
            parts.append(f"Expires={formatdate(expires, usegmt=True)}")
        if secure:
            parts.append("Secure")
        if c.get("httpOnly"):
            parts.append("HttpOnly")
        scheme = "https" if secure else "http"
        profile.cookies.absorb(f"{scheme}://{domain.lstrip('.')}{path}", ["; ".join(parts)])
