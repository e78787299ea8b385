"""Hops: one request's chain of redirects, each hop admitted, then sent and read.

Owns ``Fetcher.fetch`` (a GET that follows redirects by hand), the node's admission
step it builds and passes every hop through (``admission.Admission``: the address
guard, cluster ownership, robots.txt, the politeness delay and the host's slot, shared
with the render path), and the reading of one response. The invariants, per hop (the
first and each redirect), in this order:

- the URL is rewritten to ``urls.fetch_url`` form (canonical host, no userinfo: the
  HTTP client never sees a credential, so never sends Basic auth);
- it is admitted (``Admission.admit``): the address guard judges it (``netguard``:
  loopback names and literal IPs here; the sessions' connector judges every address
  at connect time, ``sessions``); in a cluster, its host is this pair's
  (``foreign_host``: a redirect to a host another pair owns is
  ``HOST_OWNED_ELSEWHERE``, never sent: that pair keeps its politeness); robots.txt
  allows it (when the caller asks: the server and the job respect it); it waits for
  the host's politeness slot (``politeness.HostSlots``; in a cluster the slot asks
  last whether the pair holds the host: ``HostSlots.gate``): the larger of the
  configured, the job's, the Crawl-delay and the adaptive delay;
- inside the slot it is prepared (``Sessions.hop``: headers, cookies, proxy) and sent;
  a 429/503 with ``Retry-After`` pauses the host before the slot is left
  (``Pass.failed``), so no later request to it starts before the time passes; one
  beyond ``max_retry_after`` is ``RETRY_AFTER_TOO_LONG``;
- the response's Set-Cookie lines join the profile's jar before anything else;
- at most ``max_redirects`` hops; a revisited URL or one hop too many is
  ``REDIRECT_LOOP`` (``next_hop``, also used for meta refreshes);
- no body is read past ``max_bytes`` (declared or streamed, after decompression), and
  none at all for error statuses or types the caller's ``Accept`` refuses.

Every failure is a ``PageError``; ``fetch`` makes one attempt (retries are callers').
robots.txt itself is fetched through ``fetch`` with the server's user agent.

TLS: every hop of a fetch verifies the site's certificate unless the fetch says not to
(``verify_tls``; by default the profile's ``skip_tls_verification``), and the
robots.txt its hops are judged by is read the same way (``admission``), so a request
that skips verification is not refused by a robots.txt fetch that did not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urljoin

import aiohttp

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import urls
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine import retrypolicy
from pagesift.primary.engine.admission import Admission
from pagesift.primary.engine.reqprofile import RequestProfile
from pagesift.primary.engine.robots import MAX_ROBOTS_BYTES
from pagesift.primary.engine.sessions import Hop, Sessions, page_error
from pagesift.primary.extract.metadata import response_metadata

__all__ = ["Accept", "Fetcher", "Response", "accept_any", "next_hop", "status_error"]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
ROBOTS_MAX_REDIRECTS = 5  # RFC 9309 2.3.1.2


@dataclass(slots=True)
class Response:
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
    text: str | None = None  # the body decoded as HTML, once someone did (decoded once a page)


# Called on the final (non-redirect) response before its body is read; raises PageError
# to refuse it, else returns a kind that is passed back in Response.kind.
Accept = Callable[[aiohttp.ClientResponse], str]


def accept_any(resp: aiohttp.ClientResponse) -> str:
    return "any"


def status_error(resp: aiohttp.ClientResponse) -> PageError:
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


class _Redirect(Exception):  # control flow inside Fetcher.fetch, never escapes
    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


class Fetcher:
    """GETs through ``sessions`` under the node's politeness and robots.txt rules."""

    def __init__(self, config: ServerConfig, sessions: Sessions) -> None:
        self.config = config
        self.sessions = sessions
        #: the node's admission step: this fetcher's hops and the render path's pages
        self.admission = Admission(config, sessions.guard, self._fetch_robots)

    async def fetch(
        self,
        url: str,
        *,
        accept: Accept,
        robots: bool,
        job_delay: float | None,
        max_redirects: int,
        max_bytes: int,
        truncate: bool = False,
        profile: RequestProfile | None = None,
        home: str = "",
        validators: tuple[str, str] | None = None,
        foreign_host: Callable[[str], str | None] | None = None,
        verify_tls: bool | None = None,
    ) -> Response:
        """GET ``url`` following redirects by hand; every hop admitted (guarded,
        robots-checked when ``robots``, for the profile's agent, and run in the host's
        politeness slot: ``admission.Admission.admit``; ``job_delay`` None: no delay of
        its own, the host's pauses; none to a host ``foreign_host`` names a reason
        for), sent as ``profile`` says (``Sessions.hop``); ``verify_tls`` (None: the
        profile's choice, verification without one) for every hop and the robots.txt
        they are judged by. Returns the final response with its body (cut at
        ``max_bytes`` with ``truncate``); raises PageError."""
        admit = self.admission.admit
        agent = None if profile is None else profile.robots_agent(self.config.user_agent)
        if verify_tls is None:
            verify_tls = profile.verify_tls if profile is not None else True
        try:
            current = urls.fetch_url(url)
        except ValueError as exc:
            raise PageError(ErrorCode.INVALID_URL, f"invalid URL: {exc}") from None
        seen = {current}
        hops = 0
        while True:
            location: str | None = None
            try:
                # robots.txt and sitemaps (no job delay) are admitted too: they are
                # requests to the host, and count against its concurrency
                async with admit(
                    current,
                    robots=robots,
                    agent=agent,
                    job_delay=job_delay,
                    foreign_host=foreign_host,
                    verify_tls=verify_tls,
                ) as ticket:
                    hop = await self.sessions.hop(
                        current,
                        ticket.host,
                        profile,
                        home,
                        validators if hops == 0 else None,
                        verify_tls=verify_tls,
                    )
                    sent = time.monotonic()
                    try:
                        resp = await self._get(hop, current, accept, max_bytes, truncate)
                    except PageError as err:
                        ticket.failed(err)  # inside the slot: before anyone else
                        raise
                    ticket.answered(time.monotonic() - sent)
            except _Redirect as redirect:
                location = redirect.location
            else:
                resp.hops = hops
                return resp
            hops += 1
            current = next_hop(current, location, seen, hops, max_redirects, "redirect")

    async def _get(
        self, hop: Hop, url: str, accept: Accept, max_bytes: int, truncate: bool
    ) -> Response:
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
                    return Response(
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
                return Response(
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
            raise page_error(exc, hop.timeout, hop.proxied, hop.verify_tls) from exc

    async def _fetch_robots(self, robots_url: str, verify_tls: bool) -> tuple[int, bytes]:
        try:
            resp = await self.fetch(
                robots_url,
                accept=accept_any,
                robots=False,
                job_delay=None,
                max_redirects=ROBOTS_MAX_REDIRECTS,
                max_bytes=MAX_ROBOTS_BYTES,
                truncate=True,
                verify_tls=verify_tls,
            )
        except PageError as exc:
            if exc.code in (ErrorCode.REDIRECT_LOOP, ErrorCode.INVALID_URL):
                return 404, b""  # RFC 9309: too many redirects = unavailable
            raise
        return resp.status, resp.body

    async def close(self) -> None:
        await self.admission.close()
        await self.sessions.close()


def next_hop(current: str, location: str, seen: set[str], hops: int, limit: int, what: str) -> str:
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


async def _drain(resp: aiohttp.ClientResponse) -> None:
    """Read a small body so the connection goes back to the pool (else it is closed)."""
    length = resp.content_length
    if length is not None and length <= 65536:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            await resp.read()


async def _read_capped(resp: aiohttp.ClientResponse, max_bytes: int, truncate: bool) -> bytes:
    """The body, at most ``max_bytes`` of it after decompression: cut there with
    ``truncate``, else ``TOO_LARGE`` the moment the stream passes it."""
    chunks: list[bytes] = []
    size = 0
    stream = resp.content
    while True:
        chunk = await stream.readany()
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
