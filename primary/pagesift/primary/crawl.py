"""Crawl scope: which discovered links a crawl admits to its frontier.

Pure functions over a ``StartCrawlRequest``: same site (or subdomains, or
anywhere), include/exclude regexes over the path and query, depth. The frontier
itself lives in the store (``job/{id}/frontier`` of ``Entry`` + ``job/{id}/seen`` of keys, see
``pagesift.shared.jobrecords``); admitting a link is one ``seen`` insert and one
frontier push in the same write group as the page that found it, so a crash can
neither lose a discovered link nor queue it twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesift.shared import urls
from pagesift.v1 import jobs_pb2


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
    paths: urls.PathFilter
    allow_subdomains: bool
    allow_external: bool
    ignore_query: bool

    @classmethod
    def of(cls, req: jobs_pb2.StartCrawlRequest, limit: int) -> Scope:
        return cls(
            root=urls.normalize(req.url, ignore_query=req.ignore_query_parameters),
            limit=limit,
            max_depth=req.max_depth,
            paths=urls.PathFilter(req.include_paths, req.exclude_paths),
            allow_subdomains=req.allow_subdomains,
            allow_external=req.allow_external_links,
            ignore_query=req.ignore_query_parameters,
        )

    def key(self, url: str) -> str:
        """The crawl's identity for a URL (normalized, query dropped if asked)."""
        return urls.normalize(url, ignore_query=self.ignore_query)

    def admits(self, url: str, depth: int) -> bool:
        """Whether a link found at ``depth - 1`` may be queued at ``depth``."""
        if self.max_depth and depth > self.max_depth:
            return False
        if not self.allow_external and not urls.same_site(
            url, self.root, allow_subdomains=self.allow_subdomains
        ):
            return False
        return self.paths.allows(url)
