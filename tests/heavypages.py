"""Pages that make a browser heavy or fail, served on loopback (issue 28's findings 3, 4).

``async with serve_heavy() as root:`` serves them on 127.0.0.1 (and, with ``hosts``,
on more loopback addresses at the same port: other sites for cross-site frames);
``root`` ends with "/". The paths:

- ``hog.html?mb=N``: an inline script allocates N MiB in 32 MiB ``Uint8Array``\\ s, each
  filled (so resident), and keeps them; then shows ``#done``;
- ``frames.html?mb=N&hosts=H1,H2``: one iframe per host, each a ``hog.html?mb=N`` of
  that host (another site: its own renderer under site-per-process);
- ``popups.html?n=N``: calls ``window.open`` N times and shows in ``#opened`` how many
  windows it got (a non-null answer), each a ``calm.html`` of its own;
- ``calm.html?delay=S``: a plain page whose ``#late`` a timer adds after S seconds
  (default 0);
- ``to.html?port=P``: a 302 to ``http://127.0.0.1:P/`` (an internal address).

Every answer is bounded (no handler waits); the pages' own scripts are the load.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence

from aiohttp import web

__all__ = ["serve_heavy"]

CHUNK_MB = 32


def _html(title: str, body: str, script: str = "") -> str:
    tag = f"<script>{script}</script>" if script else ""
    return (
        f"<!doctype html><html><head><title>{title}</title></head><body>{body}{tag}</body></html>"
    )


def _hog(mb: int) -> str:
    script = (
        f"const keep = []; for (let i = 0; i < {mb // CHUNK_MB}; i++) {{"
        f" const a = new Uint8Array({CHUNK_MB} << 20); a.fill(i % 250 + 1); keep.push(a); }}"
        " window.keep = keep; const p = document.createElement('p'); p.id = 'done';"
        " p.textContent = 'allocated ' + keep.length * 32 + ' MiB'; document.body.appendChild(p);"
    )
    return _html("Hog", "<h1>Hog</h1>", script)


def _popups(n: int) -> str:
    script = (
        f"let got = 0; for (let i = 0; i < {n}; i++) {{"
        " if (window.open('calm.html?w=' + i, 'w' + i)) got++; }"
        " const p = document.createElement('p'); p.id = 'opened'; p.textContent = String(got);"
        " document.body.appendChild(p);"
    )
    return _html("Popups", "<h1>Popups</h1>", script)


def _calm(delay: float) -> str:
    script = (
        "setTimeout(() => { const p = document.createElement('p'); p.id = 'late';"
        f" p.textContent = 'calm and late'; document.body.appendChild(p); }}, {delay * 1000:.0f});"
    )
    return _html("Calm", "<h1>Calm page</h1><p>Nothing heavy here.</p>", script)


def _int(request: web.Request, name: str, default: int, top: int) -> int:
    try:
        return max(0, min(int(request.query.get(name, default)), top))
    except ValueError:
        return default


async def _handle(request: web.Request) -> web.StreamResponse:
    path = request.path.lstrip("/")
    port = request.url.port
    if path == "hog.html":
        return web.Response(text=_hog(_int(request, "mb", 64, 4096)), content_type="text/html")
    if path == "frames.html":
        mb = _int(request, "mb", 64, 4096)
        hosts = [h for h in request.query.get("hosts", "").split(",") if h][:8]
        frames = "".join(
            f"<iframe src={json.dumps(f'http://{h}:{port}/hog.html?mb={mb}')}></iframe>"
            for h in hosts
        )
        return web.Response(text=_html("Frames", frames), content_type="text/html")
    if path == "popups.html":
        return web.Response(text=_popups(_int(request, "n", 100, 1000)), content_type="text/html")
    if path == "calm.html":
        delay = min(max(float(request.query.get("delay", "0") or 0), 0.0), 30.0)
        return web.Response(text=_calm(delay), content_type="text/html")
    if path == "to.html":
        raise web.HTTPFound(f"http://127.0.0.1:{_int(request, 'port', 9, 65535)}/")
    return web.Response(status=404, text="not found")


@contextlib.asynccontextmanager
async def serve_heavy(hosts: Sequence[str] = ()) -> AsyncIterator[str]:
    """The pages on 127.0.0.1:<free port> (and on each of ``hosts``, loopback addresses,
    at the same port); yields ``http://127.0.0.1:PORT/``."""
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", _handle)
    runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = int(runner.addresses[0][1])
        for host in hosts:
            await web.TCPSite(runner, host, port).start()
        yield f"http://127.0.0.1:{port}/"
    finally:
        await runner.cleanup()
