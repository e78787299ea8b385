"""Sitemap walking and parsing: from sitemap roots to the page URLs they list.

Owns the bounds and the format handling of sitemaps (sitemaps.org XML, indexes, gzip,
plain-text one-URL-a-line); the HTTP side is the caller's ``fetch`` callable
(``fetch.HttpEngine`` passes one that goes through its guarded session), so every
request still passes the engine's address guard. The guarantees of ``walk``:

- only sitemap files on ``site`` (``crawl.in_scope``, no subdomains) are fetched, each
  at most once; indexes are followed to depth ``SITEMAP_MAX_DEPTH``, at most
  ``SITEMAP_MAX_FILES`` files are fetched, and no body is read or inflated past
  ``SITEMAP_MAX_BYTES``;
- ``found`` gains only normalized http(s) URLs and stops at ``SITEMAP_MAX_URLS``;
- a file that fails (``PageError`` from ``fetch``, an error status, a broken body) is
  skipped; anything else ``fetch`` raises propagates, and ``found`` keeps what was read.
"""

from __future__ import annotations

import gzip
import html
import re
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from urllib.parse import urljoin

from pagesift.primary import crawl
from pagesift.shared import urls
from pagesift.shared.errors import PageError

__all__ = [
    "SITEMAP_MAX_BYTES",
    "SITEMAP_MAX_DEPTH",
    "SITEMAP_MAX_FILES",
    "SITEMAP_MAX_URLS",
    "SitemapFetch",
    "gunzip",
    "parse_sitemap",
    "walk",
]

SITEMAP_MAX_URLS = 50_000
SITEMAP_MAX_DEPTH = 3
SITEMAP_MAX_FILES = 1_000
SITEMAP_MAX_BYTES = 50 * 1024 * 1024  # the sitemaps.org limit, uncompressed

# GET one sitemap file (body capped at SITEMAP_MAX_BYTES): (final URL, status, body);
# raises PageError when it cannot be fetched.
SitemapFetch = Callable[[str], Awaitable[tuple[str, int, bytes]]]


async def walk(
    roots: list[str], found: dict[str, None], site: crawl.Origin | None, fetch: SitemapFetch
) -> None:
    """Fetch the sitemaps from ``roots`` breadth-first, adding their page URLs to ``found``."""
    queue: deque[tuple[str, int]] = deque((u, 0) for u in roots)
    fetched: set[str] = set()
    while queue and len(found) < SITEMAP_MAX_URLS and len(fetched) < SITEMAP_MAX_FILES:
        sitemap_url, depth = queue.popleft()
        if sitemap_url in fetched or not crawl.in_scope(sitemap_url, site, allow_subdomains=False):
            continue
        fetched.add(sitemap_url)
        try:
            final_url, status, body = await fetch(sitemap_url)
        except PageError:
            continue
        if status >= 400:
            continue
        is_index, locs = parse_sitemap(gunzip(body, SITEMAP_MAX_BYTES))
        if is_index:
            if depth < SITEMAP_MAX_DEPTH:
                queue.extend((urljoin(final_url, loc), depth + 1) for loc in locs)
            continue
        for loc in locs:
            absolute = urljoin(final_url, loc)
            if not absolute.startswith(("http://", "https://")):
                continue
            try:
                found[urls.normalize(absolute)] = None
            except ValueError:
                continue
            if len(found) >= SITEMAP_MAX_URLS:
                return


def gunzip(body: bytes, cap: int) -> bytes:
    """Decompress a gzipped body (capped at ``cap`` bytes); other bodies unchanged."""
    if body[:2] != b"\x1f\x8b":
        return body
    try:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        return d.decompress(body, cap)
    except (zlib.error, gzip.BadGzipFile):
        return b""


_SITEMAP_INDEX = re.compile(rb"<(?:\w+:)?sitemapindex[\s>]", re.I)
_LOC = re.compile(rb"<loc>\s*(?:<!\[CDATA\[)?\s*(.*?)\s*(?:\]\]>)?\s*</loc>", re.S | re.I)


def parse_sitemap(body: bytes) -> tuple[bool, list[str]]:
    """(is an index, the <loc> values) of a sitemap; a text sitemap is one URL a line."""
    start = body[:2048].lstrip()
    if not start.startswith(b"<"):
        lines = (line.strip() for line in body.decode("utf-8", errors="replace").splitlines())
        return False, [line for line in lines if line.startswith(("http://", "https://"))]
    is_index = _SITEMAP_INDEX.search(body, 0, 65536) is not None
    locs = [
        html.unescape(m.group(1).decode("utf-8", errors="replace")) for m in _LOC.finditer(body)
    ]
    return is_index, [loc for loc in locs if loc]
