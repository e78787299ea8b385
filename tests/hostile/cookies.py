"""Hostile cookies: a site whose every response sets 120 cookies of ~3.9 KB (finding 8).

Routes (``ROUTES``, all under ``/cookies/``):

- ``/cookies/chain/{n}?last=L&delay=MS``: page ``n`` of a chain of ``L + 1`` pages
  (``L`` at most ``MAX_LAST``), each linking to the next. Every response sets, in
  this order, ``big0`` .. ``big119`` (``BIG_COOKIES`` cookies of ``BIG_BYTES`` value
  bytes, Path=/; each keeps its value from page to page but ``big119``, which
  changes on every page), then ``sid=login`` and ``visit={n}`` (Path=/cookies, so a
  client sends them first). A jar that keeps the last 50 cookies of each response
  (RFC 6265's per-domain minimum) ends every page holding the same 48 big cookies,
  ``sid`` and ``visit``: only ``big119`` and ``visit`` changed. The page echoes the
  Cookie header it got (``<pre id="got">``: every name, and the small cookies'
  values), so what a job sent is in its stored documents. ``delay`` (at most
  ``MAX_DELAY_MS``) holds the answer, so a test can kill a node mid-crawl.
- ``/cookies/rotate/{n}?last=L&sets=S&delay=MS``: the same chain, each response setting
  ``BIG_COOKIES`` cookies of ``BIG_BYTES`` (Path=/) whose names rotate over ``S``
  sets (``ROTATE_SETS`` by default, at most ``MAX_SETS``): page ``n`` sets
  ``r{n % S}x0`` .. ``r{n % S}x119``, each value stable per name, then ``sid=login``
  and ``visit={n}``. The 50 a jar keeps of a response are never the 50 it kept of
  the page before, so the per-domain cap evicts and replaces them on every page
  (issue 28, finding 5: 135 KB of log per page, 355x a plain page's).
- ``/cookies/quiet/{n}?last=L``: the same chain without any Set-Cookie (the baseline
  a test measures the others against).

Every handler answers at once (or after its bounded delay) with at most
``BIG_COOKIES + 2`` Set-Cookie lines of under 4 KB: bounded in size and time.
"""

from __future__ import annotations

import asyncio
import hashlib

from aiohttp import web

from tests.hostile import Routes

BIG_COOKIES = 120
BIG_BYTES = 3_900
ROTATE_SETS = 7
MAX_SETS = 64
MAX_LAST = 1_000
MAX_DELAY_MS = 2_000
SMALL = ("sid", "visit")


def big_value(i: int, n: int) -> str:
    """The value of ``big{i}`` on page ``n``: stable but for the last cookie."""
    seed = f"{i}-{n}" if i == BIG_COOKIES - 1 else str(i)
    return _filled(seed)


def _filled(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).hexdigest()
    return (digest * (BIG_BYTES // len(digest) + 1))[:BIG_BYTES]


def rotating(n: int, sets: int = ROTATE_SETS) -> list[str]:
    """The Set-Cookie lines of page ``n`` of ``/cookies/rotate/`` (``sets`` name sets)."""
    s = n % max(1, min(sets, MAX_SETS))
    lines = [f"r{s}x{i}={_filled(f'r{s}x{i}')}; Path=/" for i in range(BIG_COOKIES)]
    return [*lines, "sid=login; Path=/cookies", f"visit={n}; Path=/cookies"]


def _int(request: web.Request, name: str, default: int, top: int) -> int:
    try:
        return max(0, min(int(request.query.get(name, default)), top))
    except ValueError:
        return default


def _page(request: web.Request, kind: str) -> tuple[int, int, str]:
    try:
        n = max(0, min(int(request.match_info["n"]), MAX_LAST))
    except ValueError:
        n = 0
    last = _int(request, "last", 50, MAX_LAST)
    kept = "".join(f"&{k}={request.query[k]}" for k in ("sets", "delay") if k in request.query)
    link = f'<a href="/cookies/{kind}/{n + 1}?last={last}{kept}">next</a>' if n < last else ""
    got = sorted(request.cookies.items())
    echo = " ".join(f"{name}={value}" if name in SMALL else name for name, value in got)
    body = (
        f"<html><head><title>{kind} {n}</title></head><body><p>page {n}</p>"
        f'<pre id="got">{echo}</pre>{link}</body></html>'
    )
    return n, last, body


async def chain(request: web.Request) -> web.StreamResponse:
    n, _, body = _page(request, "chain")
    delay = _int(request, "delay", 0, MAX_DELAY_MS)
    if delay:
        await asyncio.sleep(delay / 1000)
    response = web.Response(text=body, content_type="text/html")
    for i in range(BIG_COOKIES):
        response.headers.add("Set-Cookie", f"big{i}={big_value(i, n)}; Path=/")
    response.headers.add("Set-Cookie", "sid=login; Path=/cookies")
    response.headers.add("Set-Cookie", f"visit={n}; Path=/cookies")
    return response


async def rotate(request: web.Request) -> web.StreamResponse:
    n, _, body = _page(request, "rotate")
    delay = _int(request, "delay", 0, MAX_DELAY_MS)
    if delay:
        await asyncio.sleep(delay / 1000)
    response = web.Response(text=body, content_type="text/html")
    for line in rotating(n, _int(request, "sets", ROTATE_SETS, MAX_SETS)):
        response.headers.add("Set-Cookie", line)
    return response


async def quiet(request: web.Request) -> web.StreamResponse:
    _, _, body = _page(request, "quiet")
    return web.Response(text=body, content_type="text/html")


ROUTES: Routes = [
    ("/cookies/chain/{n}", chain),
    ("/cookies/rotate/{n}", rotate),
    ("/cookies/quiet/{n}", quiet),
]
