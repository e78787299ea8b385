"""Crawl scope: which discovered links a crawl admits to its frontier.

Functions over a ``StartCrawlRequest``: origin, path scope, include/exclude regexes over
the path and query (or the whole URL), depth. The origin rule (``in_scope``): a link is
on the crawl's site when it has the root's scheme, host and port (default ports made
explicit, so ``http://h`` is ``http://h:80``), with two tolerances: a leading ``www.``
on either host, and the upgrade of a default-port ``http://h`` root to ``https://h``
(port 443), which is how most sites redirect. Nothing else crosses: not another port of
the same host (another service), not ``https`` on an ``http`` root's explicit port,
never a downgrade to ``http``. ``allow_subdomains`` widens the host to its subdomains
under the same scheme and port rules; ``allow_external_links`` lifts the origin rule
entirely. Sitemap URLs go through the same ``admit`` as links found on pages. Hosts are
compared in their ``urls.canonical_host`` form (UTS 46, A-labels), the one spelling the
fetcher connects to, so ``bücher.test`` and ``xn--bcher-kva.test`` are one host.

The path rule (``path_prefix``, ``under_prefix``): unless the request sets
``crawl_entire_domain``, a URL on the start URL's own site (the origin rule without
``allow_subdomains``) must lie under the start URL's path, Firecrawl's rule: the
start page and its subpages. The prefix is the start path as a directory (start
``/docs`` or ``/docs/``: prefix ``/docs/``; ``/docs/intro``: ``/docs/intro/``),
except that a last segment naming a file (it has a dot: ``/docs/index.html``,
``/guide/page.php``) stands for its directory (``/docs/``, ``/guide/``). Under it
means the normalized path is the prefix's page itself (``/docs``, ``/docs/``,
``/docs/index.html``) or starts with the prefix (``/docs/a``); ``/docsX`` is not.
Hosts reached through ``allow_subdomains`` or ``allow_external_links`` are not
path-limited: the start path says nothing of their layout. This is path depth, not
link depth: ``max_depth`` counts clicks from the start URL, whatever the paths.

Regexes (``include_paths``/``exclude_paths``) match a URL's path and query, or, with
``regex_on_full_url``, its whole page key (``scheme://host[:port]/path?query``).

URL identity (``Scope.key``): a page's key is ``urls.page_key`` under the job's
options (``ignore_query_parameters``, ``strip_tracking_parameters``,
``dedupe_similar_urls``); a queued entry's URL loses its tracking parameters too
when they are stripped. ``Scope.aliases`` names the other keys a fetched page is
known by (its final URL after redirects and meta refreshes; its rel=canonical
with ``follow_canonical``, when in scope); the job runtime marks them seen and done
in the page's write group, so a page reached by many URLs is stored once.

Regex matching (``pagesift.core.jobs.patterns``) is linear-time RE2 and runs on a
dedicated thread pool (``admit``), so a caller's pattern never holds the event loop.
A stored crawl's scope is ``Scope.trusted``: its regexes were bounded when the crawl
was accepted (``validate.path_filters``, under that node's ``regex_limits``), so a run
compiles them under bounds that take the lists as they are (``accepted_limits``), not
under the bounds of the node that runs it now (stricter ones would fail a job the
service accepted).

The frontier itself lives in the store (``job/{id}/frontier`` of ``Entry`` +
``job/{id}/seen`` of keys, see ``pagesift.core.jobs.records``); admitting a link is
one ``seen`` insert and one frontier push in the same write group as the page that
found it, so a crash can neither lose a discovered link nor queue it twice.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

from pagesift.core.jobs import patterns, urls
from pagesift.v1 import jobs_pb2

_DEFAULT_PORTS = {"http": 80, "https": 443}


class Origin(NamedTuple):
    scheme: str  # "http" | "https"
    host: str  # lowercase, no trailing dot, IPv6 without brackets
    port: int  # explicit, defaults filled in


def origin_of(url: str) -> Origin | None:
    """The (scheme, host, port) of an http(s) URL, or None when it has none."""
    try:
        parts = urlsplit(url)
        return _origin(parts.scheme, parts.netloc)
    except ValueError:
        return None


@functools.lru_cache(maxsize=4096)
def _origin(scheme: str, netloc: str) -> Origin | None:
    scheme = scheme.lower()
    default = _DEFAULT_PORTS.get(scheme)
    if default is None:
        return None
    parts = urlsplit(f"{scheme}://{netloc}/")
    host = urls.host_of(f"{scheme}://{netloc}/")  # canonical: UTS 46, A-labels, IPv4
    if not host:
        return None
    port = parts.port  # ValueError for a bad port, caught by origin_of
    return Origin(scheme, host, default if port is None else port)


def _site_host(host: str) -> str:
    return host[4:] if host.startswith("www.") else host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _same_door(link: Origin, root: Origin) -> bool:
    """Same scheme and port, or a default-port http root upgraded to https:443."""
    if link.scheme == root.scheme:
        return link.port == root.port
    return (root.scheme, root.port, link.scheme, link.port) == ("http", 80, "https", 443)


def in_scope(url: str, root: str | Origin | None, *, allow_subdomains: bool) -> bool:
    """True when ``url`` is on the site of ``root`` by the origin rule (module docstring)."""
    link = origin_of(url)
    base = origin_of(root) if isinstance(root, str) else root
    if link is None or base is None or not _same_door(link, base):
        return False
    host, site = _site_host(link.host), _site_host(base.host)
    if host == site:
        return True
    return allow_subdomains and not _is_ip(site) and host.endswith("." + site)


def path_prefix(url: str) -> str:
    """The path scope of a crawl starting at ``url``, normalized, ending in ``/``
    (module docstring): ``/docs/`` for ``http://h/docs``, ``http://h/docs/`` and
    ``http://h/docs/index.html``; ``/docs/intro/`` for ``http://h/docs/intro``.
    ``ValueError`` as ``urls.normalize``."""
    parts = urlsplit(url.strip())
    path = parts.path or "/"
    last = path.rsplit("/", 1)[-1]
    if last in (".", "..") or (last and "." not in last):
        path += "/"  # a section (or "/a/b/..", the directory "/a/"): its subpages
    directory = path[: path.rfind("/") + 1] or "/"
    key = urls.normalize(urlunsplit((parts.scheme, parts.netloc, directory, "", "")))
    norm = urlsplit(key).path or "/"
    return norm if norm.endswith("/") else norm + "/"


def under_prefix(url: str, prefix: str) -> bool:
    """Whether ``url``'s normalized path is the directory ``prefix`` (which ends in
    ``/``) itself or lies under it; unparsable URLs are not."""
    if prefix == "/":
        return True
    try:
        path = urlsplit(urls.normalize(url)).path or "/"
    except ValueError:
        return False
    return path == prefix[:-1] or path.startswith(prefix)


def accepted_limits(
    include: Sequence[str], exclude: Sequence[str], memory: int = 0
) -> patterns.Limits:
    """Bounds that let accepted pattern lists through as they are: their own count and
    longest pattern (the submission's bounds were checked when they were accepted)
    and an RE2 budget per pattern of ``memory`` (the run's), at least the default's."""
    both = [*include, *exclude]
    return patterns.Limits(
        count=max(len(include), len(exclude)),
        length=max((len(p) for p in both), default=0),
        memory=max(memory, patterns.DEFAULT_LIMITS.memory),
    )


@dataclass(frozen=True)
class Entry:
    """A frontier entry: link depth, page key (dedup, done marks) and the URL to fetch.

    The URL keeps the form the linking page wrote (``/docs/``), so fetching it costs
    no redirect, while the key (``/docs``) makes every variant one page.
    """

    depth: int
    key: str
    url: str

    def encode(self) -> bytes:
        if self.url == self.key:
            return f"{self.depth} {self.key}".encode()
        return f"{self.depth} {self.key} {self.url}".encode()

    @classmethod
    def decode(cls, raw: bytes) -> Entry:
        depth, key, *url = raw.decode().split(" ", 2)
        return cls(int(depth), key, url[0] if url else key)


@dataclass
class Scope:
    root: str
    limit: int
    max_depth: int  # 0 = unlimited
    paths: patterns.PathFilter
    allow_subdomains: bool
    allow_external: bool
    ignore_query: bool
    strip_tracking: bool = False
    similar: bool = False
    follow_canonical: bool = False
    # The start URL's directory (``path_prefix``); "/" = the whole site
    # (``crawl_entire_domain``).
    prefix: str = "/"
    origin: Origin | None = field(init=False)

    def __post_init__(self) -> None:
        self.origin = origin_of(self.root)

    @classmethod
    async def build(
        cls,
        req: jobs_pb2.StartCrawlRequest,
        limit: int,
        limits: patterns.Limits = patterns.DEFAULT_LIMITS,
    ) -> Scope:
        """The scope of a crawl; its regexes are compiled on the pattern pool.

        Raises ``patterns.PatternError`` for patterns ``specs.crawl`` would refuse.
        """
        return cls(
            root=urls.normalize(req.url, ignore_query=req.ignore_query_parameters),
            limit=limit,
            max_depth=req.max_depth,
            paths=await patterns.compile_filter(
                req.include_paths, req.exclude_paths, limits, full_url=req.regex_on_full_url
            ),
            allow_subdomains=req.allow_subdomains,
            allow_external=req.allow_external_links,
            ignore_query=req.ignore_query_parameters,
            strip_tracking=req.strip_tracking_parameters,
            similar=req.dedupe_similar_urls,
            follow_canonical=req.follow_canonical,
            prefix="/" if req.crawl_entire_domain else path_prefix(req.url),
        )

    @classmethod
    async def trusted(cls, req: jobs_pb2.StartCrawlRequest, limit: int, memory: int = 0) -> Scope:
        """The scope of an accepted crawl (its patterns were bounded then): ``build``
        under ``accepted_limits``, so no bound of today's configuration refuses it."""
        limits = accepted_limits(req.include_paths, req.exclude_paths, memory)
        return await cls.build(req, limit, limits)

    def key(self, url: str) -> str:
        """The crawl's identity for a URL (``urls.page_key`` under the job's options)."""
        return urls.page_key(
            url,
            ignore_query=self.ignore_query,
            strip_tracking_params=self.strip_tracking,
            similar=self.similar,
        )

    def fetch_form(self, url: str) -> str:
        """The URL a queued entry fetches: as written, tracking parameters stripped
        when the job asks."""
        return urls.strip_tracking(url) if self.strip_tracking else url

    async def aliases(self, key: str, final_url: str, canonical: str) -> list[str]:
        """The other keys of a page fetched for ``key``: its final URL's, and (with
        ``follow_canonical``) its rel=canonical's when that is in scope (origin and
        path rules, any depth; regexes on the pattern pool); unparsable ones are
        skipped. Never ``key`` itself."""
        out: list[str] = []
        for url, check in ((final_url, False), (canonical, True)):
            if not url or (check and not self.follow_canonical):
                continue
            try:
                alias = self.key(url)
            except ValueError:
                continue
            if alias == key or alias in out:
                continue
            if check and not (self.reaches(url, 0) and (await self.paths.allowed([alias]))[0]):
                continue
            out.append(alias)
        return out

    def reaches(self, url: str, depth: int) -> bool:
        """Depth, origin and path rules only (cheap, no regex)."""
        if self.max_depth and depth > self.max_depth:
            return False
        if self.prefix != "/" and in_scope(url, self.origin, allow_subdomains=False):
            return under_prefix(url, self.prefix)  # the start URL's own site
        return self.allow_external or in_scope(
            url, self.origin, allow_subdomains=self.allow_subdomains
        )

    def admits(self, url: str, depth: int) -> bool:
        """Whether a link found at ``depth - 1`` may be queued at ``depth`` (blocking:
        runs the regexes here; async code uses ``admit``)."""
        return self.reaches(url, depth) and self.paths.allows(url)

    async def admit(self, found: dict[str, str], depth: int) -> list[Entry]:
        """Entries for the ``{key: url}`` links admitted at ``depth``, in order; the
        regexes run on the pattern pool, off the event loop."""
        near = [(key, url) for key, url in found.items() if self.reaches(url, depth)]
        allowed = await self.paths.allowed([key for key, _ in near])
        return [
            Entry(depth, key, self.fetch_form(url))
            for (key, url), ok in zip(near, allowed, strict=True)
            if ok
        ]
