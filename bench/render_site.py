"""The render benchmark's JavaScript site: pages whose content only a browser sees, each
loading sub-resources as a real page does.

``/p/N`` (0 <= N < PAGES) is an empty ``<div id="root">`` and an empty ``<nav>``, with a
stylesheet (``/s/N/site.css``) and a deferred external script (``/s/N/app.js``) in its
head. After the page's ``load`` event the script ``fetch()``es ``/api/N`` (JSON), then adds
the page's three links and an ``<article id="content">`` whose first paragraph holds
``marker(N)``. So every page is the HTML plus three requests (stylesheet, script, JSON),
all on 127.0.0.1. The marker is in no HTML the server sends (only in the JSON), so an
HTTP fetch misses it and a render that waited for ``#content`` has it.

Every crawler does the same work: the sub-resources have per-page paths and every answer
is ``Cache-Control: no-store``, so no browser cache (pagesift's per-job context,
scrapy-playwright's shared context, Crawlee's persistent one) saves a request.
Deterministic: the same N gives the same bytes.

The server counts what it serves (``GET /_counts``, itself not counted): requests by kind
(``html``, ``css``, ``js``, ``api``, ``robots``, ``other``) and ``connections``, the TCP
connections that carried them (distinct peer address, port and connection handler), so
the bench can show what each crawler asked for and how it connected (a proxy with one
request per connection shows up here). ``js_site(PAGES)`` runs it in a child process
(``python -m bench.render_site PORT PAGES``) on 127.0.0.1 so its CPU is not the measuring
process's; it is stopped on exit; ``counts(base)`` reads the counters.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from bench.common import LOOPBACK, REPO_DIR, free_port, say, stop_process, wait_for_port

KINDS = ("html", "css", "js", "api", "robots", "other")
SUBRESOURCES = ("css", "js", "api")  # what a page loads beyond its HTML
NO_STORE = {"Cache-Control": "no-store"}
_MAX_PEERS = 1_000_000  # distinct connections remembered (a bound, far past any run)


def marker(n: int) -> str:
    """The text only the script of page ``n`` puts in the page."""
    return f"rendered-marker-{n:04d}-{hashlib.sha1(str(n).encode()).hexdigest()[:10]}"


_WORDS = ("alpha", "beta", "gamma", "delta", "render", "fetch", "script", "node", "browser")
_PAGE = (
    '<!doctype html><html><head><meta charset="utf-8"><title>JS page {n}</title>'
    '<link rel="stylesheet" href="/s/{n}/site.css">'
    '<script src="/s/{n}/app.js" defer></script></head>'
    '<body><nav id="links"></nav><div id="root"></div></body></html>'
)
_CSS = """
body { font-family: sans-serif; margin: 0 auto; max-width: 48em; }
nav#links a { margin-right: 1em; }
article#content h1 { font-size: 1.6em; }
article#content p { line-height: 1.4; }
"""
_APP_JS = """
async function fill() {
  const id = location.pathname.split('/').pop();
  const data = await (await fetch('/api/' + id)).json();
  const nav = document.getElementById('links');
  for (const href of data.links) {
    const a = document.createElement('a'); a.href = href; a.textContent = href;
    nav.appendChild(a);
  }
  const art = document.createElement('article'); art.id = 'content';
  const h = document.createElement('h1'); h.textContent = data.title; art.appendChild(h);
  for (const text of data.paragraphs) {
    const p = document.createElement('p'); p.textContent = text; art.appendChild(p);
  }
  document.getElementById('root').appendChild(art);
}
if (document.readyState === 'complete') fill();
else window.addEventListener('load', fill, { once: true });
"""


def page_html(n: int) -> str:
    return _PAGE.format(n=n)


def api_body(n: int, pages: int) -> dict[str, Any]:
    """``/api/N``: a title, six paragraphs (the first holds the marker), three links."""
    paras = [
        " ".join(_WORDS[(n * 7 + i * 3 + j) % len(_WORDS)] for j in range(60)) for i in range(6)
    ]
    paras[0] = f"{marker(n)} {paras[0]}"
    return {
        "title": f"Rendered page {n}",
        "paragraphs": paras,
        "links": [f"/p/{(n + k) % pages}" for k in (1, 2, 3)],
    }


def kind_of(path: str) -> str:
    """Which counter a request path goes to."""
    if path.startswith("/p/"):
        return "html"
    if path.startswith("/s/") and path.endswith(".css"):
        return "css"
    if path.startswith("/s/") and path.endswith(".js"):
        return "js"
    if path.startswith("/api/"):
        return "api"
    return "robots" if path == "/robots.txt" else "other"


def _serve_site(port: int, pages: int) -> None:
    from aiohttp import web

    served = dict.fromkeys(KINDS, 0)
    peers: set[tuple[str, int, int]] = set()
    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != "/_counts":
            served[kind_of(request.path)] += 1
            peer = request.transport.get_extra_info("peername") if request.transport else None
            if peer is not None and len(peers) < _MAX_PEERS:
                # with the handler's identity: a port reused by a later connection of
                # another run is a new key (one handler object serves one connection)
                peers.add((str(peer[0]), int(peer[1]), id(request.protocol)))
        return await handler(request)

    def number(request: web.Request) -> int:
        n = int(request.match_info["n"])
        if not 0 <= n < pages:
            raise web.HTTPNotFound()
        return n

    async def page(request: web.Request) -> web.Response:
        html = page_html(number(request))
        return web.Response(text=html, content_type="text/html", headers=NO_STORE)

    async def css(request: web.Request) -> web.Response:
        number(request)
        return web.Response(text=_CSS, content_type="text/css", headers=NO_STORE)

    async def app_js(request: web.Request) -> web.Response:
        number(request)
        return web.Response(text=_APP_JS, content_type="application/javascript", headers=NO_STORE)

    async def api(request: web.Request) -> web.Response:
        return web.json_response(api_body(number(request), pages), headers=NO_STORE)

    async def robots(request: web.Request) -> web.Response:
        return web.Response(text="User-agent: *\nAllow: /\n")

    async def counts_view(request: web.Request) -> web.Response:
        return web.json_response({**served, "connections": len(peers)}, headers=NO_STORE)

    app = web.Application(middlewares=[count])
    app.router.add_get("/p/{n:\\d+}", page)
    app.router.add_get("/s/{n:\\d+}/site.css", css)
    app.router.add_get("/s/{n:\\d+}/app.js", app_js)
    app.router.add_get("/api/{n:\\d+}", api)
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/_counts", counts_view)
    web.run_app(app, host=LOOPBACK, port=port, access_log=None, print=None)


def counts(base: str) -> dict[str, int]:
    """The site's counters now (``/_counts``, direct, never through a proxy)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{base}/_counts", timeout=30) as resp:
        return {str(k): int(v) for k, v in json.loads(resp.read()).items()}


def served_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What the site served between two ``counts`` readings."""
    return {k: after.get(k, 0) - before.get(k, 0) for k in (*KINDS, "connections")}


@contextlib.contextmanager
def js_site(pages: int) -> Iterator[str]:
    """The JS site in a child process; yields its base URL; stopped on exit."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.render_site", str(port), str(pages)]
    say("$ " + shlex.join(cmd))
    proc = subprocess.Popen(cmd, cwd=REPO_DIR)
    try:
        wait_for_port(LOOPBACK, port, 30, proc)
        yield f"http://{LOOPBACK}:{port}"
    finally:
        stop_process(proc)


if __name__ == "__main__":
    _serve_site(int(sys.argv[1]), int(sys.argv[2]))
