"""Hostile inputs for the extraction workers: pages that hold a worker for long.

- ``/workers/heavy.html``: a legal page (no cap of ``extract`` refuses it) that keeps
  an extraction worker busy for seconds: ``?links=N`` paragraphs of one link each
  (default 200,000: 11 MB, about 5 s of lexbor, link resolution and Markdown on one
  core, 0.75 GiB resident at its peak). Nothing in it is superlinear: it is simply a
  lot of work, which is what a deadline and isolation must cope with.
- ``/workers/page/<n>``: a small ordinary page (an article and a few links).
- ``/workers/doc/<n>.pdf``: a small ordinary PDF of two pages.
- ``/workers/late.pdf``: the same kind of PDF, answered after ``?delay=`` seconds
  (at most 10): a document whose conversion starts while another page is already
  being extracted.

Payloads are built on first request and cached per process; every handler answers
in bounded time and size. The module also holds the callables the worker-pool tests
run in a worker (``echo``, ``crash``, ``hang``, ``spin``, ``hog``): a worker imports them by name.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from collections.abc import Mapping

from aiohttp import web

from tests.hostile import Routes
from tests.pdfmaker import text_pdf

__all__ = [
    "HEAVY_BYTES",
    "ROUTES",
    "crash",
    "echo",
    "hang",
    "heavy_html",
    "hog",
    "small_page",
    "small_pdf",
    "spin",
    "worker_pid",
]

HEAVY_LINKS = 200_000
MAX_LINKS = 400_000
MAX_DELAY = 10.0
HEAVY_BYTES = 16 * 1024 * 1024  # a body cap that lets the heavy page through


@functools.cache
def heavy_html(links: int = HEAVY_LINKS) -> bytes:
    body = "".join(f"<p><a href='/workers/page/{i}'>link {i}</a> text</p>" for i in range(links))
    return f"<html><head><title>heavy</title></head><body>{body}</body></html>".encode()


def small_page(n: int) -> bytes:
    return (
        f"<html><head><title>page {n}</title></head><body><article><h1>Page {n}</h1>"
        f"<p>Ordinary text of page {n}.</p><a href='/workers/page/{n + 1}'>next</a>"
        "</article></body></html>"
    ).encode()


@functools.cache
def small_pdf(n: int) -> bytes:
    return text_pdf([[f"Document {n}", "first page"], [f"Document {n}", "second page"]])


def _int(params: Mapping[str, str], name: str, default: int, top: int) -> int:
    try:
        return max(0, min(int(params.get(name, default)), top))
    except ValueError:
        return default


async def heavy(request: web.Request) -> web.StreamResponse:
    body = heavy_html(max(1, _int(request.query, "links", HEAVY_LINKS, MAX_LINKS)))
    return web.Response(body=body, content_type="text/html")


async def page(request: web.Request) -> web.StreamResponse:
    return web.Response(body=small_page(_int(request.match_info, "n", 0, 1 << 30)),
                        content_type="text/html")  # fmt: skip


async def doc(request: web.Request) -> web.StreamResponse:
    n = _int(request.match_info, "n", 0, 1 << 30)
    return web.Response(body=small_pdf(n), content_type="application/pdf")


async def late(request: web.Request) -> web.StreamResponse:
    try:
        delay = min(max(float(request.query.get("delay", "1")), 0.0), MAX_DELAY)
    except ValueError:
        delay = 1.0
    await asyncio.sleep(delay)
    return web.Response(body=small_pdf(0), content_type="application/pdf")


ROUTES: Routes = [
    ("/workers/heavy.html", heavy),
    ("/workers/page/{n}", page),
    ("/workers/doc/{n}.pdf", doc),
    ("/workers/late.pdf", late),
]


# --- callables a worker runs (tests of ``pagesift.primary.engine.workers``, ``workerproc``) -----
# Module-level (a worker imports them by name), and light to import.


def echo(value: object, pause: float = 0.0) -> object:
    """``value`` after ``pause`` seconds (an ordinary call that takes a while)."""
    time.sleep(pause)
    return value


def worker_pid() -> int:
    return os.getpid()


def crash(how: str) -> None:
    """Die the way a broken C parser does: ``exit`` (a hard exit) or ``segv``."""
    if how == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    os._exit(3)


def hang(seconds: float) -> None:
    """Stay inside one C call (a sleep) for ``seconds``."""
    time.sleep(seconds)


def spin(seconds: float) -> int:
    """Burn CPU in Python for ``seconds`` of wall time; the iterations done."""
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        n += 1
    return n


def hog(nbytes: int) -> int:
    """Hold ``nbytes`` of touched memory for a moment; the worker's pid."""
    block = bytearray(nbytes)
    for i in range(0, nbytes, 4096):
        block[i] = 1
    return os.getpid()
