"""A hostile robots.txt (issue 19, finding 3), under ``/robots/``.

- ``/robots/many-rules.txt``: a ``Sitemap:`` line naming the sitemap below (first:
  the node reads the first 512 KiB of the file), ``User-agent: *`` and ``RULES``
  wildcard rules ``Disallow: /*q{i}*z{i}*`` (about 20,000 of them within 512 KiB).
  Protego's ``can_fetch``, which the node ran once per URL on the event loop, tries
  every rule in turn: about 40 ms for one of the URLs below, 531 s for all of them
  (one Map of this site froze a node for 711 s).
- ``/robots/long-urls.xml``: a sitemap of ``URLS`` page URLs of ``URL_CHARS``
  characters each (``/robots/page/{i}-aaaa...``), gzipped (the node inflates at most
  50 MiB of it, about 12,990 URLs).
- ``/robots/page/{name}``: a small HTML page without links.

robots.txt is only read at ``/robots.txt``: ``robots_route()`` serves the file there,
for a test (or the bench) to add beside ``ROUTES`` on a site of its own. Payloads are
built once per process; every handler answers at once.
"""

from __future__ import annotations

import functools
import gzip

from aiohttp import web

from tests.hostile import Handler, Routes

__all__ = [
    "ROUTES",
    "RULES",
    "URLS",
    "URL_CHARS",
    "long_url_paths",
    "robots_route",
    "rules",
    "sitemap_body",
]

RULES = 22_000
URLS = 13_000
URL_CHARS = 4_000


@functools.cache
def rules() -> str:
    """The rules of ``/robots/many-rules.txt`` (without its Sitemap: line)."""
    return "User-agent: *\n" + "".join(f"Disallow: /*q{i}*z{i}*\n" for i in range(RULES))


def long_url_paths(count: int = URLS) -> list[str]:
    """The paths the sitemap lists: ``/robots/page/{i}-`` then filler up to ``URL_CHARS``
    characters with the origin (counted as ``http://127.0.0.1:PPPPP``, 22 characters)."""
    out: list[str] = []
    for i in range(count):
        head = f"/robots/page/{i:05d}-"
        out.append(head + "a" * (URL_CHARS - 22 - len(head)))
    return out


@functools.cache
def sitemap_body(root: str) -> bytes:
    """``/robots/long-urls.xml`` for the site at ``root`` (no trailing slash), gzipped."""
    items = "".join(f"<url><loc>{root}{path}</loc></url>" for path in long_url_paths())
    body = f'<?xml version="1.0"?><urlset>{items}</urlset>'.encode()
    return gzip.compress(body, 1)


def _root(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


async def _robots(request: web.Request) -> web.StreamResponse:
    # the Sitemap: line first: the node reads the first 512 KiB of the file only
    return web.Response(text=f"Sitemap: {_root(request)}/robots/long-urls.xml\n{rules()}")


async def _long_urls(request: web.Request) -> web.StreamResponse:
    return web.Response(body=sitemap_body(_root(request)), content_type="application/gzip")


async def _page(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"][:40]
    body = f"<html><head><title>{name}</title></head><body><p>{name}</p></body></html>"
    return web.Response(text=body, content_type="text/html")


def robots_route() -> tuple[str, Handler]:
    """``/robots.txt`` serving ``/robots/many-rules.txt``."""
    return "/robots.txt", _robots


ROUTES: Routes = [
    ("/robots/many-rules.txt", _robots),
    ("/robots/long-urls.xml", _long_urls),
    ("/robots/page/{name}", _page),
]
