"""Hostile inputs for watchers: a site of big HTML pages, so that a crawl stores big
documents and WatchJob streams that never read would hold them (issue 19, finding 11).

Routes (all GET, under ``/watchers/``):

- ``/watchers/?n=N&kb=K``: an index page linking to ``N`` big pages (N <= 64,
  default 20), each of about ``K`` KiB (K <= 8192, default 4096).
- ``/watchers/big/{i}?kb=K``: page ``i``, about ``K`` KiB of plain paragraphs (words
  from a fixed pseudo-random stream), so its markdown is about as big as its HTML:
  the crawl's documents are ~4 MB each.

Every page is built once per (size) and cached (the body differs only in its title),
so a crawl costs one build; sizes are capped, so each handler is bounded.
"""

from __future__ import annotations

import functools
import random

from aiohttp import web

from tests.hostile import Routes

__all__ = ["DEFAULT_KB", "DEFAULT_PAGES", "MAX_KB", "MAX_PAGES", "ROUTES", "body"]

DEFAULT_PAGES = 20
MAX_PAGES = 64
DEFAULT_KB = 4096
MAX_KB = 8192

_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]


def _int(request: web.Request, name: str, default: int, cap: int) -> int:
    try:
        value = int(request.query.get(name, default))
    except ValueError:
        value = default
    return max(1, min(cap, value))


@functools.lru_cache(maxsize=4)
def _paragraphs(kb: int) -> str:
    """About ``kb`` KiB of ``<p>`` paragraphs of words (seeded: the same every time)."""
    rng = random.Random(kb)
    out: list[str] = []
    size = 0
    target = kb * 1024
    while size < target:
        para = "<p>" + " ".join(rng.choice(_WORDS) for _ in range(120)) + "</p>\n"
        out.append(para)
        size += len(para)
    return "".join(out)


def body(i: int, kb: int = DEFAULT_KB) -> bytes:
    """Big page ``i``: about ``kb`` KiB of HTML."""
    return (
        f"<!doctype html><html><head><title>big page {i}</title></head><body>"
        f"<h1>big page {i}</h1>\n{_paragraphs(kb)}</body></html>"
    ).encode()


async def index(request: web.Request) -> web.Response:
    n = _int(request, "n", DEFAULT_PAGES, MAX_PAGES)
    kb = _int(request, "kb", DEFAULT_KB, MAX_KB)
    links = "".join(f'<li><a href="big/{i}?kb={kb}">big {i}</a></li>' for i in range(n))
    html = f"<!doctype html><html><head><title>big pages</title></head><body><ul>{links}</ul>"
    return web.Response(text=html + "</body></html>", content_type="text/html")


async def big(request: web.Request) -> web.Response:
    try:
        i = int(request.match_info["i"])
    except ValueError:
        raise web.HTTPNotFound() from None
    kb = _int(request, "kb", DEFAULT_KB, MAX_KB)
    return web.Response(body=body(i, kb), content_type="text/html")


ROUTES: Routes = [
    ("/watchers/", index),
    ("/watchers/big/{i}", big),
]
