"""The render benchmark's JavaScript site: pages whose content only a browser sees.

``/p/N`` (0 <= N < PAGES) is an empty ``<div id="root">``, an empty ``<nav>`` and a deferred
script (``/static/app.js``) that ``fetch()``es ``/api/N`` after load, then adds the page's
three links and an ``<article id="content">`` whose first paragraph holds ``marker(N)``. The
marker is in no HTML the server sends (only in the JSON), so an HTTP fetch misses it and a
render that waited for ``#content`` has it. Deterministic: the same N gives the same bytes.
``js_site(PAGES)`` runs it in a child process (``python -m bench.render_site PORT PAGES``) on
127.0.0.1 so its CPU is not the measuring process's; it is stopped on exit.
"""

from __future__ import annotations

import contextlib
import hashlib
import shlex
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from bench.common import LOOPBACK, REPO_DIR, free_port, say, stop_process, wait_for_port


def marker(n: int) -> str:
    """The text only the script of page ``n`` puts in the page."""
    return f"rendered-marker-{n:04d}-{hashlib.sha1(str(n).encode()).hexdigest()[:10]}"


_WORDS = ("alpha", "beta", "gamma", "delta", "render", "fetch", "script", "node", "browser")
_PAGE = (
    '<!doctype html><html><head><meta charset="utf-8"><title>JS page {n}</title>'
    '<script src="/static/app.js" defer></script></head>'
    '<body><nav id="links"></nav><div id="root"></div></body></html>'
)
_APP_JS = """
(async () => {
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
})();
"""


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


def _serve_site(port: int, pages: int) -> None:
    from aiohttp import web

    async def page(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        if not 0 <= n < pages:
            raise web.HTTPNotFound()
        return web.Response(text=_PAGE.format(n=n), content_type="text/html")

    async def api(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        if not 0 <= n < pages:
            raise web.HTTPNotFound()
        return web.json_response(api_body(n, pages))

    async def app_js(request: web.Request) -> web.Response:
        return web.Response(text=_APP_JS, content_type="application/javascript")

    async def robots(request: web.Request) -> web.Response:
        return web.Response(text="User-agent: *\nAllow: /\n")

    app = web.Application()
    app.router.add_get("/p/{n:\\d+}", page)
    app.router.add_get("/api/{n:\\d+}", api)
    app.router.add_get("/static/app.js", app_js)
    app.router.add_get("/robots.txt", robots)
    web.run_app(app, host=LOOPBACK, port=port, access_log=None, print=None)


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
