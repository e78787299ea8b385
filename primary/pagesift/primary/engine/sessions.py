"""Sessions: the engine's aiohttp sessions and how each hop of a request is sent.

Owns the two ``aiohttp.ClientSession``s of a node (created on first use, closed by
``close``) and ``Sessions.hop``, which turns a URL and a ``RequestProfile`` into the
session and keyword arguments of one GET. The invariants:

- every connection of both sessions goes through ``netguard.guarded_connector``: the
  resolver judges every address of a name and the socket factory the exact address
  each socket connects to, so no DNS answer or redirect reaches a blocked address;
- the direct session serves direct requests and a job's own ``proxy_url`` (the full
  guard: that proxy must be a public address); the pool session serves requests
  through the server's ``[server.proxies]``. Its guard also lets the pool's
  literal-address endpoints through (an operator's proxy on a private network), and
  it never sends a request without a pool proxy, so no page reaches them directly;
- behind any proxy the target's name is resolved and judged here too, since the proxy
  resolves it out of the connector's reach (a name that changes its answer between
  the two lookups is the residual risk, as for DNS rebinding without a proxy);
- the job's Authorization header goes only to ``home``, the origin the request was
  made for: a redirect elsewhere drops it, as browsers and curl do;
- cookies are the profile's jar alone (``cookiejar``): the sessions keep none, so no
  cookie crosses from one job to another;
- a hop verifies the site's TLS certificate unless its caller says not to
  (``verify_tls``: the profile's ``skip_tls_verification``, for the page, its sitemaps
  and the robots.txt it is judged by); no other check is loosened by it;
- ``page_error`` maps every aiohttp/OS failure of a hop to one ``PageError`` code.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import urls
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.netguard import (
    AddressGuard,
    BlockedAddressError,
    GuardedResolver,
    guarded_connector,
)
from pagesift.primary.engine.reqprofile import ProxyPool, RequestProfile
from pagesift.primary.engine.robots import origin_of

__all__ = ["Hop", "Sessions", "page_error"]

_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@dataclass(slots=True)
class Hop:
    """How one hop is sent: the session (direct, or the pool's), the keyword arguments
    for ``ClientSession.get`` and the timeout they apply (named in error messages)."""

    session: aiohttp.ClientSession
    kwargs: dict[str, Any]
    profile: RequestProfile | None
    proxied: bool
    timeout: aiohttp.ClientTimeout
    conditional: bool = False  # sent If-None-Match / If-Modified-Since
    verify_tls: bool = True  # the site's certificate is verified


class Sessions:
    """The node's direct and pool sessions under ``guard`` (None: no address guard)."""

    def __init__(
        self,
        config: ServerConfig,
        guard: AddressGuard | None,
        resolver: AbstractResolver | None = None,
    ) -> None:
        self.config = config
        self.guard = guard
        self._resolver = resolver
        self.pool = ProxyPool.from_config(config)
        self._direct: aiohttp.ClientSession | None = None
        self._pooled: aiohttp.ClientSession | None = None
        self._turns = itertools.count()  # per_request proxy rotation
        # Judges a target's name before it is handed to a proxy (which resolves it).
        self._target_names = (
            None if guard is None else GuardedResolver(resolver or DefaultResolver(), guard)
        )
        self.timeout = aiohttp.ClientTimeout(
            total=config.connect_timeout + 4 * config.read_timeout,
            sock_connect=config.connect_timeout,
            sock_read=config.read_timeout,
        )

    def direct(self) -> aiohttp.ClientSession:
        """The session of direct connections (and of a job's own ``proxy_url``)."""
        if self._direct is None or self._direct.closed:
            self._direct = self._new(self.guard)
        return self._direct

    def pooled(self) -> aiohttp.ClientSession:
        """The session of requests through the server's proxy pool (module docstring)."""
        if self._pooled is None or self._pooled.closed:
            guard = self.guard
            if guard is not None:
                guard = AddressGuard(exempt=guard.exempt | _literal_endpoints(self.pool))
            self._pooled = self._new(guard)
        return self._pooled

    async def close(self) -> None:
        for session in (self._direct, self._pooled):
            if session is not None:
                await session.close()
        self._direct = self._pooled = None

    def _new(self, guard: AddressGuard | None) -> aiohttp.ClientSession:
        connector = guarded_connector(
            guard,
            self._resolver,
            limit=256,
            limit_per_host=self.config.per_host_concurrency,
            ttl_dns_cache=300,
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self.timeout,
            headers={
                "User-Agent": self.config.user_agent,
                "Accept": _ACCEPT,
                "Accept-Encoding": "gzip, deflate, br",
            },
            cookie_jar=aiohttp.DummyCookieJar(),  # cookies are per job (cookiejar)
            auto_decompress=True,
            trust_env=False,
            max_line_size=16384,  # real sites send long status lines and cookies
            max_field_size=32768,
        )

    async def hop(
        self,
        url: str,
        host: str,
        profile: RequestProfile | None,
        home: str,
        validators: tuple[str, str] | None = None,
        *,
        verify_tls: bool = True,
    ) -> Hop:
        """How to send one hop to ``url`` under ``profile`` (None: the server's own
        request, e.g. robots.txt: default headers, the default proxy). Credentials
        go only to ``home`` (module docstring). ``validators`` (a cached copy's ETag,
        Last-Modified) make it conditional; ``verify_tls`` False accepts any certificate."""
        kwargs: dict[str, Any] = {"allow_redirects": False}
        if not verify_tls:
            kwargs["ssl"] = False
        timeout = self.timeout
        proxy: str | None
        session: aiohttp.ClientSession | None = None
        if profile is not None and profile.proxy_url:
            proxy = profile.proxy_url
        else:
            proxy = self.pool.choose(profile.proxy if profile else "", host, next(self._turns))
            if proxy is not None:
                session = self.pooled()
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
            if profile.timeout is not None:
                t = profile.timeout
                timeout = aiohttp.ClientTimeout(
                    total=t, sock_connect=min(t, self.config.connect_timeout), sock_read=t
                )
                kwargs["timeout"] = timeout
        conditional = False
        if validators is not None and any(validators):
            headers = kwargs.setdefault("headers", {})
            etag, last_modified = validators
            if etag:
                headers["If-None-Match"] = etag
            if last_modified:
                headers["If-Modified-Since"] = last_modified
            conditional = True
        return Hop(
            session or self.direct(), kwargs, profile, proxy is not None, timeout, conditional,
            verify_tls,
        )  # fmt: skip

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


def _literal_endpoints(pool: ProxyPool) -> frozenset[tuple[str, int]]:
    """The (address, port) of every pool proxy named by a literal address."""
    out: set[tuple[str, int]] = set()
    for proxy in pool.endpoints():
        host = urls.host_of(proxy)
        if host and (host[0].isdigit() or ":" in host):
            parts = urlsplit(proxy)
            out.add((host, parts.port or (443 if parts.scheme == "https" else 80)))
    return frozenset(out)


def page_error(
    exc: BaseException, timeout: aiohttp.ClientTimeout, proxied: bool, verified: bool = True
) -> PageError:
    """The PageError for an aiohttp/OS failure of one hop (``verified``: the hop checked
    the site's certificate; only then does a certificate error name the option that
    skips the check)."""
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
        exc.os_error, BlockedAddressError
    ):  # refused by the resolver or by the socket factory: nothing was sent
        return PageError(ErrorCode.BLOCKED_ADDRESS, str(exc.os_error))
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        hint = ""
        if verified and isinstance(exc, aiohttp.ClientConnectorCertificateError):
            hint = " (options.skip_tls_verification accepts any certificate)"
        return PageError(ErrorCode.TLS, f"TLS with {exc.host}:{exc.port} failed: {exc}{hint}")
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
