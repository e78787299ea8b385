"""The demo site's aiohttp application: how each path of the site answers a request.

This module owns the HTTP behaviour: generated pages (with the request's origin
put into absolute links), ``/docs`` -> ``/docs/`` 301s, the redirect chains and
loop (with absolute, root-relative and relative ``Location`` forms), robots.txt
and sitemap.xml bodies, ``/slow.html``, the chunked ``/files/big.html``, the PDF
and JSON resources, the 500 and 404 pages, the endless calendar trap, and the
middleware that counts requests. ``make_app`` is its entry point, called by
``pagesift.demo.site.build_site``.
"""

from __future__ import annotations

import asyncio
import html
import posixpath
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web

from pagesift.demo.layout import (
    BRAND,
    JSON_PATH,
    LOOP_HOPS,
    ORIGIN,
    PDF_PATH,
    REDIRECT_CHAINS,
    SERVER_ERROR_PATH,
    Manifest,
)


def _redirect_hops() -> dict[str, tuple[int, str, str]]:
    """Path -> (status, target, Location form) for every redirecting path."""
    hops: dict[str, tuple[int, str, str]] = {}
    forms = ("absolute", "root", "relative")
    for n, (src, chain) in enumerate(REDIRECT_CHAINS.items()):
        at = src
        for i, (status, target) in enumerate(chain):
            hops[at] = (status, target, forms[(n + i) % len(forms)])
            at = target
    for src, target in LOOP_HOPS.items():
        hops[src] = (302, target, "root")
    return hops


REDIRECT_HOPS = _redirect_hops()
_CALENDAR_RE = re.compile(r"^/calendar/(\d{4})/(\d{2})$")


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _origin_of(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


def _html_response(body: str, request: web.Request, status: int = 200) -> web.Response:
    return web.Response(
        text=body.replace(ORIGIN, _origin_of(request)),
        status=status,
        content_type="text/html",
        charset="utf-8",
    )


def _simple_page(title: str, text: str) -> str:
    t = html.escape(title)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>{t}</title>'
        f"</head>\n<body><main><h1>{t}</h1><p>{html.escape(text)}</p>"
        f'<p><a href="/">Home</a></p></main></body>\n</html>\n'
    )


def _calendar_page(year: int, month: int) -> str:
    prev_y, prev_m = (year, month - 1) if month > 1 else (year - 1, 12)
    next_y, next_m = (year, month + 1) if month < 12 else (year + 1, 1)
    t = f"Events in {year:04d}-{month:02d} · {BRAND}"
    rows = "".join(
        f"<tr><td>{year:04d}-{month:02d}-{d:02d}</td><td>Office hours</td></tr>"
        for d in (3, 10, 17, 24)
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>{t}</title>'
        f'<meta name="description" content="Events calendar"></head>\n<body>'
        f'<header><nav><a href="/">Home</a></nav></header><main><article><h1>{t}</h1>'
        f"<table><tbody>{rows}</tbody></table>"
        f'<p><a rel="prev" href="/calendar/{prev_y:04d}/{prev_m:02d}">Previous month</a> '
        f'<a rel="next" href="../{next_y:04d}/{next_m:02d}">Next month</a></p>'
        "</article></main></body>\n</html>\n"
    )


def make_app(
    site_pages: dict[str, str],
    manifest: Manifest,
    hits: Counter[str],
    requests: list[tuple[float, str]],
) -> web.Application:
    filler = ("pagesift demo filler text for a deliberately oversized page " * 64).encode()

    @web.middleware
    async def count(request: web.Request, handler: _Handler) -> web.StreamResponse:
        hits[request.path] += 1
        requests.append((time.monotonic(), request.path))
        return await handler(request)

    async def robots(request: web.Request) -> web.StreamResponse:
        text = (
            "# Northwind demo site\n"
            "User-agent: *\n"
            "Disallow: /private/\n"
            f"Crawl-delay: {manifest.crawl_delay:g}\n"
            "\n"
            f"Sitemap: {_origin_of(request)}/sitemap.xml\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def sitemap(request: web.Request) -> web.StreamResponse:
        origin = _origin_of(request)
        urls = "".join(
            f"  <url><loc>{html.escape(origin + p)}</loc><lastmod>2026-10-01</lastmod></url>\n"
            for p in manifest.sitemap_paths
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
            f"{urls}</urlset>\n"
        )
        return web.Response(text=body, content_type="application/xml")

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
        await resp.prepare(request)
        await resp.write(b'<!DOCTYPE html>\n<html lang="en">\n<head><title>Slow page')
        await asyncio.sleep(manifest.slow_seconds)
        await resp.write(b"</title></head><body><p>Finally.</p></body></html>\n")
        await resp.write_eof()
        return resp

    async def big(request: web.Request) -> web.StreamResponse:
        head = b'<!DOCTYPE html>\n<html lang="en">\n<head><title>Complete changelog</title>'
        head += b"</head>\n<body><p>"
        tail = b"</p></body>\n</html>\n"
        remaining = manifest.big_bytes - len(head) - len(tail)
        resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            await resp.write(head)
            while remaining > 0:
                chunk = filler[:remaining]
                await resp.write(chunk)
                remaining -= len(chunk)
            await resp.write(tail)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the client stopped reading at its cap
        return resp

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path
        origin = _origin_of(request)
        page = site_pages.get(path)
        if page is not None:
            return _html_response(page, request)
        if path + "/" in site_pages:  # a directory asked for without its slash
            return web.Response(status=301, headers={"Location": origin + path + "/"})
        hop = REDIRECT_HOPS.get(path)
        if hop is not None:
            status, target, form = hop
            if form == "absolute":
                location = origin + target
            elif form == "relative":
                location = posixpath.relpath(target, posixpath.dirname(path) + "/")
            else:
                location = target
            return web.Response(status=status, headers={"Location": location})
        if path == "/robots.txt":
            return await robots(request)
        if path == "/sitemap.xml":
            return await sitemap(request)
        if path == manifest.slow_path:
            return await slow(request)
        if path == manifest.big_path:
            return await big(request)
        if path == PDF_PATH:
            pdf = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n"
            pdf += b"trailer << /Root 1 0 R >>\n%%EOF\n"
            return web.Response(body=pdf, content_type="application/pdf")
        if path == JSON_PATH:
            return web.json_response({"pages": len(manifest.pages), "seed": manifest.seed})
        if path == SERVER_ERROR_PATH:
            oops = _simple_page("Internal Server Error", "Something broke.")
            return _html_response(oops, request, status=500)
        m = _CALENDAR_RE.match(path)
        if m and 1 <= int(m.group(1)) <= 9999 and 1 <= int(m.group(2)) <= 12:
            return _html_response(_calendar_page(int(m.group(1)), int(m.group(2))), request)
        return _html_response(_simple_page("Not Found", f"No page at {path}."), request, 404)

    app = web.Application(middlewares=[count])
    app.router.add_get("/{tail:.*}", handle)
    return app
