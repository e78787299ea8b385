"""A local JavaScript site: pages whose content exists only after their scripts run.

``async with serve_js_site() as root:`` serves it on 127.0.0.1 (``root`` ends with
"/"); ``PAGES`` names each page's path and ``MARKERS`` the text that only a browser
sees there (a plain GET of the page does not contain it: the tests' positive control).

- ``/fetch.html``: content inserted after a ``fetch()`` of ``/api/items.json``;
- ``/links.html``: links to ``/spa/1.html`` .. ``/spa/4.html`` added by script (each
  of those pages renders its own text by script and links the next one);
- ``/timer.html``: content inserted by a 1 s ``setTimeout``;
- ``/scroll.html``: infinite scroll, 20 items per batch, 5 batches (100 items) then
  "the end"; a batch is appended when the window nears the bottom;
- ``/click.html``: the content appears after a click on ``#more``;
- ``/app.html``: an empty ``<div id="root"></div>`` a script renders into;
- ``/static.html``: plenty of server-rendered text, no script (AUTO must not render);
- ``/noscript.html``: ``<noscript>Please enable JavaScript</noscript>`` and a script;
- ``/setstate.html`` sets a cookie and localStorage; ``/readstate.html`` shows what
  it reads back (``#state``: "cookie=...;storage=...");
- ``/probe.html``: an empty page for ``execute_javascript``/viewport probes; ``/form.html``
  an input whose typed value and pressed keys are echoed; ``/tall.html`` a 5000 px
  page; ``/slow.html`` answers after ``?delay=`` seconds (for kills mid-render);
  ``/image.html`` shows ``/img.png`` and uses the font ``/font.woff2``.

``serve_js_site(hits)`` counts the requests of each path in ``hits`` (a Counter).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator

from aiohttp import web

__all__ = ["MARKERS", "PAGES", "SPA_PAGES", "serve_js_site"]

SPA_PAGES = 4
BATCH, BATCHES = 20, 5

PAGES = {
    "fetch": "fetch.html",
    "links": "links.html",
    "timer": "timer.html",
    "scroll": "scroll.html",
    "click": "click.html",
    "app": "app.html",
    "static": "static.html",
    "noscript": "noscript.html",
    "setstate": "setstate.html",
    "readstate": "readstate.html",
    "probe": "probe.html",
    "form": "form.html",
    "tall": "tall.html",
    "image": "image.html",
}
MARKERS = {
    "fetch": "Fetched catalogue item gamma",
    "links": "spa/1.html",
    "timer": "Inserted after the timer fired",
    "scroll": "Scrolled item 100",
    "click": "Revealed after the click",
    "app": "Rendered by the app into root",
    "noscript": "Hydrated noscript page content",
    "spa": "Script-rendered chapter",
}

_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
_PROSE = " ".join(
    ["The reference manual describes every option of the command line tool in detail."] * 60
)


def _page(title: str, body: str, script: str = "") -> str:
    tag = f"<script>{script}</script>" if script else ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{title}</title></head>"
        f"<body>{body}{tag}</body></html>"
    )


def _hidden(text: str) -> str:
    """A JS expression for ``text`` that does not contain it (the source stays free
    of what only a browser sees)."""
    return f"atob('{base64.b64encode(text.encode()).decode()}')"


def _append(target: str, text: str) -> str:
    return (
        f"(() => {{ const p = document.createElement('p'); p.className = 'added';"
        f" p.textContent = {_hidden(text)}; document.getElementById({json.dumps(target)})"
        f".appendChild(p); }})()"
    )


_SCROLL = f"""
let batch = 0;
function more() {{
  if (batch >= {BATCHES}) return;
  const list = document.getElementById('list');
  for (let i = 1; i <= {BATCH}; i++) {{
    const li = document.createElement('li');
    li.style.height = '60px';
    li.textContent = 'Scrolled item ' + (batch * {BATCH} + i);
    list.appendChild(li);
  }}
  batch++;
  if (batch === {BATCHES}) {{
    const end = document.createElement('p'); end.id = 'end'; end.textContent = 'the end';
    document.body.appendChild(end);
  }}
}}
more();
window.addEventListener('scroll', () => {{
  if (window.innerHeight + window.scrollY >= document.body.scrollHeight - 200)
    setTimeout(more, 50);
}});
"""

_LINKS = f"""
const nav = document.getElementById('nav');
for (let i = 1; i <= {SPA_PAGES}; i++) {{
  const a = document.createElement('a'); a.href = 'spa/' + i + '.html';
  a.textContent = 'Chapter ' + i; nav.appendChild(a);
}}
"""


def _spa(n: int) -> str:
    nxt = f"<a href='{n + 1}.html'>next</a>" if n < SPA_PAGES else ""
    text = _hidden(f"{MARKERS['spa']} {n}")
    script = (
        f"document.getElementById('root').innerHTML = {json.dumps(f'<h1>Chapter {n}</h1>')}"
        f" + '<p>' + {text} + '</p>' + {json.dumps(nxt)};"
    )
    return _page(f"Chapter {n}", "<div id='root'></div>", script)


def _pages() -> dict[str, str]:
    click = (
        "document.getElementById('more').addEventListener('click', () => {"
        + _append("box", MARKERS["click"])
        + "});"
    )
    form = (
        "const i = document.getElementById('q'), out = document.getElementById('out');"
        "i.addEventListener('input', () => { out.textContent = 'typed:' + i.value; });"
        "i.addEventListener('keydown', (e) => { if (e.key === 'Enter')"
        " document.getElementById('keys').textContent = 'pressed:Enter'; });"
    )
    return {
        "fetch.html": _page(
            "Catalogue",
            "<h1>Catalogue</h1><ul id='items'></ul>",
            "fetch('/api/items.json').then(r => r.json()).then(items => {"
            " const ul = document.getElementById('items');"
            " for (const t of items) { const li = document.createElement('li');"
            " li.textContent = t; ul.appendChild(li); } });",
        ),
        "links.html": _page("Chapters", "<h1>Chapters</h1><nav id='nav'></nav>", _LINKS),
        "timer.html": _page(
            "Timer",
            "<h1>Timer</h1><div id='box'></div>",
            f"setTimeout(() => {{ {_append('box', MARKERS['timer'])}; "
            "document.getElementById('box').id = 'box'; "
            "const d = document.createElement('div'); d.id = 'late'; d.textContent = 'late';"
            " document.body.appendChild(d); }, 1000);",
        ),
        "scroll.html": _page("Feed", "<h1>Feed</h1><ul id='list'></ul>", _SCROLL),
        "click.html": _page(
            "Click", "<h1>Click</h1><button id='more'>More</button><div id='box'></div>", click
        ),
        "app.html": _page(
            "App",
            "<div id='root'></div>",
            f"document.getElementById('root').innerHTML = '<main><h1>' + {_hidden(MARKERS['app'])}"
            " + '</h1><p>' + 'Dashboard '.repeat(3) + '</p></main>';",
        ),
        "static.html": _page("Manual", f"<h1>Manual</h1><p>{_PROSE}</p>"),
        "noscript.html": _page(
            "Needs JS",
            "<noscript>Please enable JavaScript</noscript><div id='main'></div>",
            _append("main", MARKERS["noscript"]),
        ),
        "setstate.html": _page(
            "Set",
            "<p id='done'></p>",
            "document.cookie = 'session=abc123; path=/'; localStorage.setItem('k', 'v1');"
            "document.getElementById('done').textContent = 'set';",
        ),
        "readstate.html": _page(
            "Read",
            "<p id='state'></p>",
            "document.getElementById('state').textContent = 'cookie=' + document.cookie"
            " + ';storage=' + (localStorage.getItem('k') || '');",
        ),
        "probe.html": _page("Probe", "<p>probe</p>"),
        "form.html": _page("Form", "<input id='q'><p id='out'></p><p id='keys'></p>", form),
        "image.html": _page(
            "Image",
            "<style>@font-face { font-family: F; src: url('/font.woff2'); }"
            " p { font-family: F; }</style><p>pictured</p><img src='/img.png' alt='x'>",
        ),
        "tall.html": _page(
            "Tall", "<div style='height:5000px;background:linear-gradient(red,blue)'>tall</div>"
        ),
    }


@contextlib.asynccontextmanager
async def serve_js_site(hits: Counter[str] | None = None) -> AsyncIterator[str]:
    """The site on 127.0.0.1:<free port>; yields its root URL ("http://127.0.0.1:N/").
    ``hits`` counts the requests of each path (without the leading "/")."""
    pages = _pages()

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path.lstrip("/")
        if hits is not None:
            hits[path] += 1
        if path in ("img.png", "font.woff2"):
            return web.Response(
                body=_PNG if path == "img.png" else b"wOF2", content_type="image/png"
            )
        if path == "api/items.json":
            items = ["Fetched catalogue item alpha", "Fetched catalogue item beta",
                     MARKERS["fetch"]]  # fmt: skip
            return web.json_response(items)
        if path == "slow.html":
            await asyncio.sleep(min(float(request.query.get("delay", "5")), 30.0))
            return web.Response(text=_page("Slow", "<p>slow</p>"), content_type="text/html")
        if path.startswith("spa/") and path.endswith(".html"):
            with contextlib.suppress(ValueError):
                n = int(path[4:-5])
                if 1 <= n <= SPA_PAGES:
                    return web.Response(text=_spa(n), content_type="text/html")
        if path in ("", "index.html"):
            links = "".join(f"<a href='{p}'>{k}</a> " for k, p in PAGES.items())
            return web.Response(text=_page("Index", links), content_type="text/html")
        if path in pages:
            return web.Response(text=pages[path], content_type="text/html")
        return web.Response(status=404, text="not found")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{int(runner.addresses[0][1])}/"
    finally:
        await runner.cleanup()
