"""HttpEngine: the real ``Engine`` -- HTTP fetching with robots, politeness and the guard.

Owns the server's one aiohttp session and everything between a URL and a ``Page``.
The guarantees (see ``engine.py`` for the contract):

- every hop of a request (the first and each redirect) is first rewritten to
  ``urls.fetch_url`` form (canonical host, no userinfo: the HTTP client never sees a
  credential, so never sends Basic auth, and never re-reads a host spelling), then
  passes, in order: the address guard (``netguard``: loopback names and literal IPs
  here; and at connect time, for every connection of the session -- robots.txt and
  sitemaps included -- the resolver judges every address of a name and the socket
  factory the exact address each socket connects to, so no spelling, redirect or
  DNS answer reaches loopback/private space), robots.txt (when
  both the server and the job respect it), and the per-host politeness slot (shared
  by all jobs); redirects are followed by hand, at most ``max_redirects`` hops, and a
  revisited URL or one hop too many is ``REDIRECT_LOOP``; a page's
  ``<meta http-equiv="refresh">`` with a delay of at most 10 s
  (``content.meta_refresh``) is one more hop of the same budget, through the same
  checks, so ``document.final_url`` is the page a refresh chain ends on;
- ``Page.canonical``/``noindex``/``nofollow`` report rel=canonical (the page's
  ``<link>``, else a ``Link:`` response header, the form PDFs use), meta robots and
  X-Robots-Tag (``robots.page_directives``); the job runtime applies them;
- no body is read past ``max_body_bytes`` (declared or streamed, after decompression),
  and no body is read at all for error statuses or unsupported content types;
- every failure is a ``PageError`` with one ``ErrorCode``; nothing else escapes
  ``scrape`` (but ``CancelledError``), and ``sitemap_urls`` never raises;
- rate limits and adaptive politeness (decisions in ``retrypolicy``): a 429 or 503
  with ``Retry-After`` pauses the host in the shared slots (every job of the node)
  before the slot is released, so no later request to it starts before the time
  passes; one beyond ``max_retry_after`` is ``RETRY_AFTER_TOO_LONG`` (the host is
  still paused for ``max_retry_after``). Every 429/503 slows the host's adaptive
  delay (``HostThrottle``), every success feeds it the latency; the delay used is
  the larger of the configured one and the adaptive one. ``scrape`` itself makes
  ONE attempt: retrying a page is the job runtime's (``jobs``: durable attempt
  counts); sitemap files are retried here (``max_retries``, full jitter), since
  seeding is redone whole after a crash anyway.

- request control (``reqprofile``): each hop of a page or sitemap request sends the
  profile's headers (Authorization only to the origin the request was made for),
  its user agent, its cookie jar's Cookie header, timeout and TLS choice, and every
  response's Set-Cookie joins the jar before anything else happens to it. Proxies:
  a job's own ``proxy_url`` goes through the direct session (the full guard: it
  must be a public address); the server's pool goes through a second session whose
  guard also lets the pool's literal-address endpoints through, and which never
  sends a request without a pool proxy, so no page reaches them directly. Behind
  any proxy the target's name is resolved and judged here too (the proxy resolves
  it again: a name that changes its answer in between is the residual risk, as for
  DNS rebinding without a proxy). robots.txt is fetched with the server's user
  agent and default proxy, and read for the job's agent token.

Documents (PDF, DOCX, PPTX, XLSX, ODT, EPUB: ``documents.kind_of`` by content type,
magic bytes, or a generic type plus the URL's extension) are converted in a worker
process bounded by ``document_timeout`` (``_convert``), and every HTML page is
extracted in one bounded by ``extract_timeout`` (``_extract``), both under the
workers' memory cap (``workers``): a worker that crashes, runs out of memory or is
killed on its deadline fails that page alone (``parse_failed``, or ``too_large`` for
memory and the parsers' own caps, with ``PageError.worker_lost``), and the page is
never parsed on the event loop. What stays on the loop is linear and bounded:
``content.decode``, ``content.sniff`` (the first KiB) and ``content.meta_refresh``
(the first 64 KiB, each ``<meta`` tag at most 1,000 characters).

Body classification and decoding live in ``content``; sitemap walking and parsing in
``sitemaps``, whose every file is fetched through this engine's ``_fetch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from pagesift.primary.engine import content, retrypolicy, sitemaps, workers
from pagesift.primary.engine.netguard import (
    AddressGuard,
    BlockedAddressError,
    GuardedResolver,
    guarded_connector,
)
from pagesift.primary.engine.politeness import HostSlots, effective_delay
from pagesift.primary.engine.protocol import FetchPolicy, Page
from pagesift.primary.engine.reqprofile import ProxyPool, RequestProfile
from pagesift.primary.engine.robots import (
    MAX_ROBOTS_BYTES,
    SLICE_SECONDS,
    RobotsCache,
    origin_of,
    page_directives,
)
from pagesift.primary.extract import documents
from pagesift.primary.extract import html as extract
from pagesift.primary.extract.converted import DocumentError, DocumentTooLarge
from pagesift.primary.extract.htmlshape import TooLarge
from pagesift.primary.extract.metadata import add_metadata, response_metadata
from pagesift.shared.api.metrics import Metrics
from pagesift.shared.config.schema import ServerConfig
from pagesift.shared.jobs import scope as crawl
from pagesift.shared.jobs import urls
from pagesift.shared.jobs.pageerrors import ErrorCode, PageError
from pagesift.shared.util import tracing
from pagesift.v1 import jobs_pb2

__all__ = ["HttpEngine"]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
# Hosts whose delay ``pagesift_host_delay_seconds`` shows at most (the most recent).
HOST_DELAY_SERIES = 50
# Imported once in the workers' forkserver, so a fresh worker starts without imports.
_WORKER_PRELOAD = ("pagesift.primary.extract.html", "pagesift.primary.extract.documents")

ROBOTS_MAX_REDIRECTS = 5  # RFC 9309 2.3.1.2


@dataclass(slots=True)
class _Response:
    url: str  # the final URL, after redirects
    status: int
    content_type: str  # the header as sent ("" when absent)
    mimetype: str
    charset: str | None
    kind: str  # what the accept callback said ("html", "text", "any", ...)
    body: bytes
    robots_tag: tuple[str, ...] = ()  # X-Robots-Tag header values
    canonical: str = ""  # a Link: <...>; rel="canonical" header, absolute
    validators: tuple[str, str] = ("", "")  # its ETag and Last-Modified headers
    meta_headers: tuple[tuple[str, str], ...] = ()  # metadata.response_metadata(headers)
    hops: int = 0  # redirects followed to get here


@dataclass(slots=True)
class _Hop:
    """How one hop is sent: the session (direct, or the pool's) and the request's
    keyword arguments for ``ClientSession.get``."""

    session: aiohttp.ClientSession
    kwargs: dict[str, Any]
    profile: RequestProfile | None
    proxied: bool
    conditional: bool = False  # sent If-None-Match / If-Modified-Since


# Called on the final (non-redirect) response before its body is read; raises PageError
# to refuse it, else returns a kind that is passed back in _Response.kind.
_Accept = Callable[[aiohttp.ClientResponse], str]


def _accept_any(resp: aiohttp.ClientResponse) -> str:
    return "any"


def _accept_sitemap(resp: aiohttp.ClientResponse) -> str:
    if resp.status >= 400:
        raise _status_error(resp)  # so that 429/503 pause the host and are retried
    return "any"


def _status_error(resp: aiohttp.ClientResponse) -> PageError:
    """The HTTP_STATUS error of a response, with its status and (429/503) Retry-After."""
    retry_after = None
    if resp.status in retrypolicy.SLOW_DOWN_STATUSES:
        retry_after = retrypolicy.parse_retry_after(resp.headers.get("Retry-After"), time.time())
    return PageError(
        ErrorCode.HTTP_STATUS,
        f"HTTP {resp.status} {resp.reason or ''}".rstrip(),
        status=resp.status,
        retry_after=retry_after,
    )


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


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
        (default: block every address ``urls.block_class`` names, exempt nothing);
        ``resolver`` the name resolver under it (default: aiohttp's)."""
        self._resolver = resolver
        self.config = config
        self.metrics = metrics
        self._guard = None if config.allow_private_networks else (guard or AddressGuard())
        self._session: aiohttp.ClientSession | None = None
        self._pool = ProxyPool.from_config(config)
        self._pool_session: aiohttp.ClientSession | None = None
        self._turns = itertools.count()  # per_request proxy rotation
        # Judges a target's name before it is handed to a proxy (which resolves it).
        self._target_names = (
            None
            if self._guard is None
            else GuardedResolver(resolver or DefaultResolver(), self._guard)
        )
        count = workers.worker_count(config.extract_processes)
        limits = workers.Limits(
            memory_bytes=config.worker_memory_limit, recycle_rss_bytes=config.worker_recycle_rss
        )
        self._workers = (
            workers.WorkerPool(count, limits, preload=_WORKER_PRELOAD) if count > 0 else None
        )
        self._slots = HostSlots(config.per_host_concurrency, config.per_host_delay)
        self._throttle = retrypolicy.HostThrottle(
            concurrency=config.per_host_concurrency, max_delay=config.throttle_max_delay
        )
        self._random = random.Random()
        if metrics is not None:
            metrics.host_delays = self.host_delays
        self._robots = RobotsCache(self._fetch_robots, config.user_agent)
        self._timeout = aiohttp.ClientTimeout(
            total=config.connect_timeout + 4 * config.read_timeout,
            sock_connect=config.connect_timeout,
            sock_read=config.read_timeout,
        )

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

        def accept(resp: aiohttp.ClientResponse) -> str:
            if resp.status >= 400:
                raise _status_error(resp)
            if "Content-Type" not in resp.headers:
                return "sniff"
            mimetype = resp.content_type
            if mimetype in content.HTML_TYPES:
                return "html"
            if documents.kind_of(mimetype, str(resp.url), b"") is not None:
                return "document"  # by its type, or a generic type and its extension
            if content.is_text(mimetype):
                if allow_non_html:
                    return "text"
                raise PageError(
                    ErrorCode.UNSUPPORTED_CONTENT,
                    f"content type {mimetype} is not HTML (allow_non_html keeps it)",
                )
            raise PageError(ErrorCode.UNSUPPORTED_CONTENT, f"content type {mimetype} is binary")

        async def get(target: str, budget: int, validators: tuple[str, str] | None) -> _Response:
            return await self._fetch(
                target,
                accept=accept,
                robots=self.config.respect_robots and profile.respect_robots,
                job_delay=policy.delay,
                max_redirects=budget,
                max_bytes=self.config.max_body_bytes,
                profile=profile,
                home=home,
                validators=validators,
            )

        started = time.monotonic()
        max_hops = self.config.max_redirects
        resp = await get(url, max_hops, policy.validators)
        if resp.kind == "not_modified":
            unchanged = jobs_pb2.Document(url=url, final_url=resp.url, status_code=resp.status)
            return Page(document=unchanged, validators=resp.validators, not_modified=True)
        hops, visited = resp.hops, {resp.url}
        while True:  # meta refresh: one more redirect hop each, same budget (bounded)
            kind = resp.kind
            if kind == "sniff":
                head = resp.body[:4096]
                is_document = documents.kind_of("", resp.url, head) is not None
                kind = "document" if is_document else content.sniff(resp.body, allow_non_html)
            if kind != "html":
                break
            target = content.meta_refresh(content.decode(resp.body, resp.charset, html=True))
            if target is None:
                break
            hops += 1
            nxt = _next_hop(resp.url, target, visited, hops, max_hops, "refresh")
            resp = await get(nxt, max_hops - hops, None)
            hops += resp.hops
        if self.metrics is not None:
            self.metrics.fetched(time.monotonic() - started, len(resp.body))
        doc = jobs_pb2.Document(
            url=url,
            final_url=resp.url,
            status_code=resp.status,
            content_type=resp.content_type or resp.mimetype,
        )
        doc.fetched_at.FromNanoseconds(time.time_ns())
        agent = profile.robots_agent(self.config.user_agent)
        if kind == "document":
            await self._convert(doc, resp, options, policy.owner)
            noindex, nofollow = page_directives([], list(resp.robots_tag), agent)
            return Page(document=doc, canonical=resp.canonical, noindex=noindex,
                        nofollow=nofollow, validators=resp.validators)  # fmt: skip
        text = content.decode(resp.body, resp.charset, html=kind == "html")
        if kind == "html":
            try:
                got = await self._extract(
                    doc, text, resp.url, options, resp.meta_headers, policy.owner
                )
            except PageError:
                raise
            except Exception as exc:  # the parsers are lenient; keep the contract anyway
                raise PageError(ErrorCode.UNSUPPORTED_CONTENT, f"cannot extract: {exc}") from exc
            noindex, nofollow = page_directives(got.robots_meta, list(resp.robots_tag), agent)
            return Page(document=doc, links=got.links, canonical=got.canonical or resp.canonical,
                        noindex=noindex, nofollow=nofollow, validators=resp.validators)  # fmt: skip
        noindex, nofollow = page_directives([], list(resp.robots_tag), agent)
        want = extract.wanted(options)
        if want.markdown:
            doc.markdown = text
        if want.raw_html:
            doc.raw_html = text
        return Page(
            document=doc,
            canonical=resp.canonical,
            noindex=noindex,
            nofollow=nofollow,
            validators=resp.validators,
        )

    async def _convert(
        self,
        doc: jobs_pb2.Document,
        resp: _Response,
        options: jobs_pb2.ScrapeOptions,
        owner: str = "",
    ) -> None:
        """A PDF or office document into ``doc`` (``documents``), in a worker process
        bounded by ``document_timeout`` and the worker memory cap (in a thread, without
        workers: ``extract_processes = 0``). A file that cannot be read, a conversion
        that times out and a worker that dies on it (a crash in the parser) are
        ``parse_failed``, one past the memory cap ``too_large``: never redone inline,
        where a crash would take the node down."""
        cap = self.config.max_document_pages
        max_pages = min(options.max_pages or cap, cap)
        args = (resp.body, resp.mimetype, resp.url, max_pages, documents.MAX_MARKDOWN_CHARS)
        timeout = self.config.document_timeout
        try:
            if self._workers is None:
                conv = await asyncio.to_thread(documents.convert_compact, *args)
            else:
                out = await self._workers.call(
                    documents.convert_compact, *args, timeout=timeout, owner=owner
                )
                self._worker_done(out)
                conv = out.value
        except DocumentTooLarge as exc:  # past a cap of a document reader: named
            raise PageError(ErrorCode.TOO_LARGE, exc.reason) from None
        except DocumentError as exc:
            raise PageError(ErrorCode.PARSE_FAILED, exc.reason) from None
        except workers.WorkerLost as exc:
            raise self._worker_error(exc, "the conversion", timeout) from None
        want = extract.wanted(options)
        if want.markdown:
            doc.markdown = conv.markdown
        doc.title = conv.title
        doc.num_pages = conv.num_pages
        meta = {**conv.metadata, "source": conv.kind}
        for key, value in (("author", conv.author), ("created", conv.created)):
            if value:
                meta[key] = value
        if conv.modified:
            meta["modified"] = conv.modified
        add_metadata(doc.metadata, resp.meta_headers)  # bounded, headers first
        add_metadata(doc.metadata, meta.items())

    async def _extract(
        self,
        doc: jobs_pb2.Document,
        text: str,
        base_url: str,
        options: jobs_pb2.ScrapeOptions,
        headers: tuple[tuple[str, str], ...] = (),
        owner: str = "",
    ) -> extract.Extracted:
        """Extract the page in a worker process, whatever its size, bounded by
        ``extract_timeout`` and the worker memory cap; ``headers`` (the response's
        ``metadata.response_metadata``) join ``doc.metadata``.

        Every parse of a page's HTML is off the event loop: lexbor's time grows
        faster than linearly on hostile nesting, and parsing, cleaning and link
        extraction hold the GIL, so a page parsed on the loop (or in a thread of the
        node) stalls every other call. A worker that dies or is killed on the page
        fails this page alone (``parse_failed``/``too_large``, ``worker_lost``); the
        page is never redone inline. Without workers (``extract_processes = 0``, for
        tests and tiny deployments) the extraction runs in a thread: the loop keeps
        running between the extractor's Python steps, but a thread has no deadline
        and no memory cap, so that mode is not for untrusted sites.
        """
        want = extract.wanted(options)
        only_main = options.only_main_content
        args = (text, base_url, want, only_main)
        timeout = self.config.extract_timeout
        try:
            if self._workers is None:
                got = await asyncio.to_thread(extract.extract_compact, *args)
            else:
                out = await self._workers.call(
                    extract.extract_compact, *args, timeout=timeout, owner=owner
                )
                self._worker_done(out)
                got = out.value
        except TooLarge as exc:  # past a cap of ``htmlshape``: named
            raise PageError(ErrorCode.TOO_LARGE, exc.reason) from None
        except workers.WorkerLost as exc:
            raise self._worker_error(exc, "the extraction", timeout) from None
        extract.apply(doc, got, want, text, headers)
        return got

    def _worker_done(self, out: workers.Outcome[Any]) -> None:
        if self.metrics is not None:
            self.metrics.worker_call(out.peak_rss_bytes)

    def _worker_error(self, exc: workers.WorkerLost, what: str, timeout: float) -> PageError:
        """The page error for a call whose worker was lost, naming the cause."""
        if self.metrics is not None:
            self.metrics.worker_lost(exc.cause)
        if isinstance(exc, workers.WorkerTimeout):
            msg = f"{what} took over {timeout:g}s (its worker was killed)"
            return PageError(ErrorCode.PARSE_FAILED, msg, worker_lost=True)
        if isinstance(exc, workers.WorkerOutOfMemory):
            cap = workers.describe_bytes(self.config.worker_memory_limit)
            msg = f"{what} needed more than the worker memory cap ({cap})"
            return PageError(ErrorCode.TOO_LARGE, msg, worker_lost=True)
        if isinstance(exc, workers.PoolClosed):  # the node is stopping: a transient failure
            return PageError(ErrorCode.TIMEOUT, f"{what} was cut short: the node is stopping")
        if exc.charged:
            return PageError(ErrorCode.PARSE_FAILED, f"{what} crashed: {exc}", worker_lost=True)
        return PageError(ErrorCode.PARSE_FAILED, f"no extraction worker could run it: {exc}")

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
            try:
                roots = list((await self._robots.rules(origin + "/")).sitemaps)
            except Exception:
                roots = []
            if not roots:
                roots = [origin + "/sitemap.xml"]
            site = crawl.origin_of(origin + "/")

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
        loop = asyncio.get_running_loop()
        turn = loop.time() + SLICE_SECONDS
        out: list[bool] = []
        for target in targets:
            if loop.time() > turn:
                await asyncio.sleep(0)
                turn = loop.time() + SLICE_SECONDS
            try:
                current = urls.fetch_url(target)
                rules = await self._robots.rules(current, agent)
            except asyncio.CancelledError:
                raise
            except Exception:
                out.append(False)
                continue
            out.append(rules.allowed(current))
        return out

    def host_delays(self) -> dict[str, float]:
        """The current delay of the ``HOST_DELAY_SERIES`` most recently slowed hosts:
        the adaptive delay, or what is left of a Retry-After pause when longer."""
        now = asyncio.get_running_loop().time() if _loop_running() else None
        out = dict(list(self._throttle.delays().items())[-HOST_DELAY_SERIES:])
        if now is not None:
            for host, left in self._slots.paused_hosts(now).items():
                out[host] = max(out.get(host, 0.0), left)
        if len(out) > HOST_DELAY_SERIES:
            out = dict(sorted(out.items(), key=lambda kv: kv[1])[-HOST_DELAY_SERIES:])
        return out

    async def close(self) -> None:
        await self._robots.close()
        for session in (self._session, self._pool_session):
            if session is not None:
                await session.close()
        self._session = self._pool_session = None
        if self._workers is not None:
            self._workers.close()

    # --- HTTP ------------------------------------------------------------------------------

    def _session_now(self) -> aiohttp.ClientSession:
        """The session of direct connections (and of a job's own ``proxy_url``)."""
        if self._session is None or self._session.closed:
            self._session = self._new_session(self._guard)
        return self._session

    def _pool_session_now(self) -> aiohttp.ClientSession:
        """The session of requests through the server's proxy pool. Every request it
        sends goes through a pool proxy, so its guard may let exactly the pool's
        literal-address endpoints through (an operator's proxy on a private network)
        without letting any page reach them directly."""
        if self._pool_session is None or self._pool_session.closed:
            guard = self._guard
            if guard is not None:
                guard = AddressGuard(exempt=guard.exempt | _literal_endpoints(self._pool))
            self._pool_session = self._new_session(guard)
        return self._pool_session

    def _new_session(self, guard: AddressGuard | None) -> aiohttp.ClientSession:
        connector = guarded_connector(
            guard,
            self._resolver,
            limit=256,
            limit_per_host=self.config.per_host_concurrency,
            ttl_dns_cache=300,
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            headers={
                "User-Agent": self.config.user_agent,
                "Accept": _ACCEPT,
                "Accept-Encoding": "gzip, deflate, br",
            },
            cookie_jar=aiohttp.DummyCookieJar(),  # cookies are per job (reqprofile)
            auto_decompress=True,
            trust_env=False,
            max_line_size=16384,  # real sites send long status lines and cookies
            max_field_size=32768,
        )

    async def _hop(
        self,
        url: str,
        host: str,
        profile: RequestProfile | None,
        home: str,
        validators: tuple[str, str] | None = None,
    ) -> _Hop:
        """How to send one hop to ``url`` under ``profile`` (None: the server's own
        request, e.g. robots.txt: default headers, the default proxy). Credentials
        (the job's Authorization header) go only to ``home``, the origin the request
        was made for: a redirect elsewhere drops them, as browsers and curl do.
        ``validators`` (a cached copy's ETag, Last-Modified) make it conditional."""
        kwargs: dict[str, Any] = {"allow_redirects": False}
        proxy: str | None
        session: aiohttp.ClientSession | None = None
        if profile is not None and profile.proxy_url:
            proxy = profile.proxy_url
        else:
            proxy = self._pool.choose(profile.proxy if profile else "", host, next(self._turns))
            if proxy is not None:
                session = self._pool_session_now()
        if proxy is not None:
            kwargs["proxy"] = proxy
            await self._check_target_name(url, host)
        if profile is not None:
            headers = dict(profile.headers)
            if home and origin_of(url) != home:
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            if profile.user_agent:
                headers["User-Agent"] = profile.user_agent
            cookie = profile.cookies.header(url)
            if cookie is not None:
                headers["Cookie"] = cookie
            kwargs["headers"] = headers
            if not profile.verify_tls:
                kwargs["ssl"] = False
            if profile.timeout is not None:
                t = profile.timeout
                kwargs["timeout"] = aiohttp.ClientTimeout(
                    total=t, sock_connect=min(t, self.config.connect_timeout), sock_read=t
                )
        conditional = False
        if validators is not None and any(validators):
            headers = kwargs.setdefault("headers", {})
            etag, last_modified = validators
            if etag:
                headers["If-None-Match"] = etag
            if last_modified:
                headers["If-Modified-Since"] = last_modified
            conditional = True
        return _Hop(session or self._session_now(), kwargs, profile, proxy is not None, conditional)

    async def _check_target_name(self, url: str, host: str) -> None:
        """A proxy resolves the target's name itself, out of the connector's reach:
        resolve it here too and refuse it when the guard would (``refusal_for_url``
        has judged literal addresses and loopback names already)."""
        if self._target_names is None or host[:1].isdigit() or ":" in host:
            return
        port = urlsplit(url).port or (443 if url.startswith("https:") else 80)
        try:
            await self._target_names.resolve(host, port)
        except BlockedAddressError as exc:
            raise PageError(ErrorCode.BLOCKED_ADDRESS, str(exc)) from None
        except OSError as exc:
            raise PageError(ErrorCode.DNS, f"cannot resolve {host}: {exc}") from None

    async def _fetch(
        self,
        url: str,
        *,
        accept: _Accept,
        robots: bool,
        job_delay: float | None,
        max_redirects: int,
        max_bytes: int,
        truncate: bool = False,
        profile: RequestProfile | None = None,
        home: str = "",
        validators: tuple[str, str] | None = None,
    ) -> _Response:
        """GET ``url`` following redirects by hand; every hop guarded, robots-checked
        (when ``robots``, for the profile's agent) and run in the host's politeness
        slot (unless ``job_delay`` is None), sent as ``profile`` says (``_hop``).
        Returns the final response with its body; raises PageError."""
        guard = self._guard
        agent = None if profile is None else profile.robots_agent(self.config.user_agent)
        try:
            current = urls.fetch_url(url)
        except ValueError as exc:
            raise PageError(ErrorCode.INVALID_URL, f"invalid URL: {exc}") from None
        seen = {current}
        hops = 0
        while True:
            host = urls.host_of(current)
            if guard is not None:
                reason = guard.refusal_for_url(current)
                if reason is not None:
                    raise PageError(ErrorCode.BLOCKED_ADDRESS, reason)
            crawl_delay: float | None = None
            if robots:
                rules = await self._robots.rules(current, agent)
                if not rules.allowed(current):
                    if isinstance(rules.error, PageError):
                        raise PageError(
                            rules.error.code, f"{rules.error.message} (fetching robots.txt)"
                        )
                    raise PageError(ErrorCode.ROBOTS_DISALLOWED, f"robots.txt disallows {current}")
                crawl_delay = rules.crawl_delay
            location: str | None = None
            hop = await self._hop(current, host, profile, home, validators if hops == 0 else None)
            try:
                if job_delay is None:
                    await self._slots.unpaused(host)  # robots.txt honours Retry-After too
                    resp = await self._get(hop, current, accept, max_bytes, truncate)
                else:
                    delay = effective_delay(self.config.per_host_delay, job_delay, crawl_delay)
                    if self.config.adaptive_throttle:
                        delay = max(delay, self._throttle.delay(host))
                    async with self._slots.slot(host, delay):
                        sent = time.monotonic()
                        try:
                            resp = await self._get(hop, current, accept, max_bytes, truncate)
                        except PageError as err:
                            self._slowed(host, err)  # inside the slot: before anyone else
                            raise
                        if self.config.adaptive_throttle:
                            self._throttle.success(host, time.monotonic() - sent)
            except _Redirect as redirect:
                location = redirect.location
            else:
                resp.hops = hops
                return resp
            hops += 1
            current = _next_hop(current, location, seen, hops, max_redirects, "redirect")

    def _slowed(self, host: str, err: PageError) -> None:
        """A failed hop: pause the host for its Retry-After, slow its adaptive delay on
        429/503; a Retry-After beyond ``max_retry_after`` becomes the page's error."""
        if err.code != ErrorCode.HTTP_STATUS or err.status not in retrypolicy.SLOW_DOWN_STATUSES:
            return
        if self.config.adaptive_throttle:
            self._throttle.slow_down(host, time.monotonic())
        wait = err.retry_after
        if wait is None or wait <= 0:
            return
        limit = self.config.max_retry_after
        self._slots.pause(host, asyncio.get_running_loop().time() + min(wait, limit))
        if wait > limit:
            raise PageError(
                ErrorCode.RETRY_AFTER_TOO_LONG,
                f"HTTP {err.status} asks to retry after {wait:g} s, over the server's "
                f"max_retry_after of {limit:g} s",
                status=err.status,
                retry_after=wait,
            ) from err

    async def _get(
        self, hop: _Hop, url: str, accept: _Accept, max_bytes: int, truncate: bool
    ) -> _Response:
        """One hop. Raises _Redirect for a redirect, PageError for any failure. The
        response's Set-Cookie lines join the profile's jar first, whatever follows."""
        try:
            async with hop.session.get(url, **hop.kwargs) as resp:
                if hop.profile is not None:
                    hop.profile.cookies.absorb(url, resp.headers.getall("Set-Cookie", ()))
                status = resp.status
                validators = (resp.headers.get("ETag", ""), resp.headers.get("Last-Modified", ""))
                if status == 304 and hop.conditional:
                    await _drain(resp)
                    return _Response(
                        url=url, status=status, content_type="", mimetype="", charset=None,
                        kind="not_modified", body=b"", validators=validators,
                    )  # fmt: skip
                if status in _REDIRECTS:
                    location = resp.headers.get("Location")
                    if location:
                        await _drain(resp)
                        raise _Redirect(location)
                kind = accept(resp)
                length = resp.content_length
                if length is not None and length > max_bytes and not truncate:
                    raise PageError(
                        ErrorCode.TOO_LARGE,
                        f"Content-Length {length} is over the {max_bytes}-byte limit",
                    )
                body = await _read_capped(resp, max_bytes, truncate)
                return _Response(
                    url=url,
                    status=status,
                    content_type=resp.headers.get("Content-Type", ""),
                    mimetype=resp.content_type,
                    charset=resp.charset,
                    kind=kind,
                    body=body,
                    robots_tag=tuple(resp.headers.getall("X-Robots-Tag", ())),
                    canonical=_link_canonical(resp, url),
                    validators=validators,
                    meta_headers=response_metadata(resp.headers),
                )
        except (PageError, _Redirect):
            raise
        except Exception as exc:
            timeout = hop.kwargs.get("timeout", self._timeout)
            raise _page_error(exc, timeout, hop.proxied) from exc

    async def _fetch_robots(self, robots_url: str) -> tuple[int, bytes]:
        try:
            resp = await self._fetch(
                robots_url,
                accept=_accept_any,
                robots=False,
                job_delay=None,
                max_redirects=ROBOTS_MAX_REDIRECTS,
                max_bytes=MAX_ROBOTS_BYTES,
                truncate=True,
            )
        except PageError as exc:
            if exc.code in (ErrorCode.REDIRECT_LOOP, ErrorCode.INVALID_URL):
                return 404, b""  # RFC 9309: too many redirects = unavailable
            raise
        return resp.status, resp.body

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
                        resp = await self._fetch(
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


class _Redirect(Exception):  # control flow inside _fetch, never escapes
    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


# --- helpers -----------------------------------------------------------------------------------


async def _drain(resp: aiohttp.ClientResponse) -> None:
    """Read a small body so the connection goes back to the pool (else it is closed)."""
    length = resp.content_length
    if length is not None and length <= 65536:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            await resp.read()


async def _read_capped(resp: aiohttp.ClientResponse, max_bytes: int, truncate: bool) -> bytes:
    chunks: list[bytes] = []
    size = 0
    content = resp.content
    while True:
        chunk = await content.readany()
        if not chunk:
            break
        size += len(chunk)
        if size > max_bytes:
            if truncate:
                chunks.append(chunk[: max_bytes - (size - len(chunk))])
                break
            raise PageError(
                ErrorCode.TOO_LARGE, f"body is over the {max_bytes}-byte limit (still streaming)"
            )
        chunks.append(chunk)
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


def _link_canonical(resp: aiohttp.ClientResponse, url: str) -> str:
    """The ``Link: <...>; rel="canonical"`` of a response (RFC 6596 5), absolute, or ""."""
    try:
        link = resp.links.get("canonical")
    except ValueError:
        return ""
    target = link.get("url") if link is not None else None
    if target is None:
        return ""
    return urljoin(url, str(target)).split("#", 1)[0]


def _literal_endpoints(pool: ProxyPool) -> frozenset[tuple[str, int]]:
    """The (address, port) of every pool proxy named by a literal address."""
    out: set[tuple[str, int]] = set()
    for proxy in pool.endpoints():
        host = urls.host_of(proxy)
        if host and (host[0].isdigit() or ":" in host):
            parts = urlsplit(proxy)
            out.add((host, parts.port or (443 if parts.scheme == "https" else 80)))
    return frozenset(out)


def _page_error(exc: BaseException, timeout: aiohttp.ClientTimeout, proxied: bool) -> PageError:
    """The PageError for an aiohttp/OS failure of one hop."""
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
        exc.os_error, BlockedAddressError
    ):  # refused by the resolver or by the socket factory: nothing was sent
        return PageError(ErrorCode.BLOCKED_ADDRESS, str(exc.os_error))
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return PageError(
            ErrorCode.TLS,
            f"TLS with {exc.host}:{exc.port} failed: {exc} "
            "(options.skip_tls_verification accepts any certificate)",
        )
    if proxied and isinstance(
        exc, aiohttp.ClientProxyConnectionError | aiohttp.ClientHttpProxyError
    ):
        return PageError(ErrorCode.CONNECT, f"the proxy failed: {exc}")
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        reason = exc.os_error.strerror or str(exc.os_error)
        return PageError(ErrorCode.DNS, f"cannot resolve {exc.host}: {reason}")
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return PageError(ErrorCode.TIMEOUT, f"connect timed out after {timeout.sock_connect:g}s")
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return PageError(ErrorCode.TIMEOUT, f"no data for {timeout.sock_read:g}s")
    if isinstance(exc, TimeoutError):
        return PageError(ErrorCode.TIMEOUT, f"response took longer than {timeout.total:g}s")
    if isinstance(exc, aiohttp.ClientConnectorError):
        where = f"{exc.host}:{exc.port}"
        return PageError(ErrorCode.CONNECT, f"cannot connect to {where}: {exc.strerror}")
    if isinstance(exc, aiohttp.InvalidURL | ValueError | UnicodeError):
        return PageError(ErrorCode.INVALID_URL, f"invalid URL: {exc}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return PageError(ErrorCode.CONNECT, f"broken response body: {exc}")
    if isinstance(exc, aiohttp.ClientResponseError):
        return PageError(ErrorCode.CONNECT, f"bad HTTP response: {exc.message}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return PageError(ErrorCode.CONNECT, f"{type(exc).__name__}: {exc}")
    return PageError(ErrorCode.CONNECT, f"unexpected {type(exc).__name__}: {exc}")


def _next_hop(current: str, location: str, seen: set[str], hops: int, limit: int, what: str) -> str:
    """Where a hop (``what``: "redirect" or "refresh") from ``current`` to ``location``
    leads, once it passed every hop's checks: an http(s) URL in the form the address
    guard reads, new on this chain, and hop number ``hops`` within ``limit``. Adds it
    to ``seen``."""
    nxt = urljoin(current, location).split("#", 1)[0]
    if not nxt.startswith(("http://", "https://")):
        raise PageError(ErrorCode.INVALID_URL, f"{what} to a non-http URL: {nxt}")
    try:
        nxt = urls.fetch_url(nxt)
    except ValueError as exc:
        raise PageError(ErrorCode.INVALID_URL, f"{what} to an invalid URL: {exc}") from None
    if nxt in seen:
        raise PageError(ErrorCode.REDIRECT_LOOP, f"{what} loop: {current} -> {nxt}")
    if hops > limit:
        raise PageError(ErrorCode.REDIRECT_LOOP, f"more than {limit} redirects")
    seen.add(nxt)
    return nxt
