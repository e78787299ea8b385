"""Hostile sitemaps (issue 19, findings 1 and 10), under ``/sitemaps/``.

- ``/sitemaps/unclosed.xml``: ``<urlset>`` and 16,000 ``<loc>`` never closed (80 KB):
  the regex the node used before (``<loc>...</loc>`` with ``re.S``) rescanned to the
  end of the file for each open tag, 39 s for this file, on the event loop.
- ``/sitemaps/unclosed.xml.gz``: the same, gzipped (165 bytes).
- ``/sitemaps/slow-index.xml``: a sitemap index of ``SLOW_CHILDREN`` children,
  ``/sitemaps/slow/{i}.xml``, each answering after ``SLOW_SECONDS`` (one page URL
  each, ``/sitemaps/page/slow-{i}``): discovery without a time bound waited for all.
- ``/sitemaps/page/{name}``: a small HTML page without links (what a crawl fetches).

A sitemap is only read when the site's ``/robots.txt`` names it (or it is
``/sitemap.xml``): ``robots_route(path)`` is a ``/robots.txt`` route naming
``/sitemaps/<path>``, for a test (or the bench) to serve beside ``ROUTES`` on a site
of its own. Every handler answers in bounded time (at most ``SLOW_SECONDS``) and
size (the payloads are built once per process).
"""

from __future__ import annotations

import asyncio
import functools
import gzip

from aiohttp import web

from tests.hostile import Handler, Routes

__all__ = [
    "ROUTES",
    "SLOW_CHILDREN",
    "SLOW_SECONDS",
    "UNCLOSED_LOCS",
    "robots_route",
    "unclosed",
]

UNCLOSED_LOCS = 16_000
SLOW_CHILDREN = 1_000
SLOW_SECONDS = 20.0


@functools.cache
def unclosed(gzipped: bool = False) -> bytes:
    """``<urlset>`` followed by ``UNCLOSED_LOCS`` unclosed ``<loc>`` tags."""
    body = b'<?xml version="1.0"?><urlset>' + b"<loc>" * UNCLOSED_LOCS
    return gzip.compress(body, 9) if gzipped else body


def _root(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


async def _unclosed(request: web.Request) -> web.StreamResponse:
    return web.Response(body=unclosed(), content_type="application/xml")


async def _unclosed_gz(request: web.Request) -> web.StreamResponse:
    return web.Response(body=unclosed(gzipped=True), content_type="application/gzip")


async def _slow_index(request: web.Request) -> web.StreamResponse:
    root = _root(request)
    items = "".join(
        f"<sitemap><loc>{root}/sitemaps/slow/{i}.xml</loc></sitemap>" for i in range(SLOW_CHILDREN)
    )
    body = f'<?xml version="1.0"?><sitemapindex>{items}</sitemapindex>'
    return web.Response(text=body, content_type="application/xml")


async def _slow_child(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(SLOW_SECONDS)
    i = request.match_info["i"]
    loc = f"{_root(request)}/sitemaps/page/slow-{i}"
    body = f'<?xml version="1.0"?><urlset><url><loc>{loc}</loc></url></urlset>'
    return web.Response(text=body, content_type="application/xml")


async def _page(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    body = f"<html><head><title>{name}</title></head><body><p>{name}</p></body></html>"
    return web.Response(text=body, content_type="text/html")


def robots_route(path: str) -> tuple[str, Handler]:
    """A ``/robots.txt`` route allowing everything and naming ``/sitemaps/<path>``."""

    async def robots(request: web.Request) -> web.StreamResponse:
        text = f"User-agent: *\nAllow: /\nSitemap: {_root(request)}/sitemaps/{path}\n"
        return web.Response(text=text)

    return "/robots.txt", robots


ROUTES: Routes = [
    ("/sitemaps/unclosed.xml", _unclosed),
    ("/sitemaps/unclosed.xml.gz", _unclosed_gz),
    ("/sitemaps/slow-index.xml", _slow_index),
    ("/sitemaps/slow/{i:[0-9]+}.xml", _slow_child),
    ("/sitemaps/page/{name}", _page),
]
