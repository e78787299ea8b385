"""Section ``misbehaving``: crawling a site whose first answer to every page fails.

Against a real ``pagesift serve`` child (loopback only) and a small generated site
served by this process: ``--misbehaving-pages`` pages, each linking to the next eight.
For each mode the FIRST request to each page misbehaves and the second answers it:

- ``ok``: no misbehaviour (the baseline);
- ``500`` / ``503``: that status without Retry-After (503 also slows the host's
  adaptive delay);
- ``reset``: the connection is aborted (no response);
- ``429-ra1``: 429 with ``Retry-After: 1`` -- the whole host pauses a second each
  time, so this mode crawls ``--misbehaving-ra-pages`` pages only.

Reported per mode: pages crawled, failed, wall seconds (StartCrawl sent -> terminal
state seen by GetJob polled every 50 ms), pages/s, and requests per page counted at the
site (2.0 is the floor: one failure and one answer). The server runs with the default
retry settings (base 0.5 s, full jitter) and a fresh data directory per mode. Results go
to ``bench/out/misbehaving.json`` and ``bench/out/misbehaving.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from bench.common import (
    LOOPBACK,
    OUT_DIR,
    free_port,
    markdown_table,
    say,
    start_serve,
    stop_serve,
    write_json,
)

MODES = ("ok", "500", "503", "reset", "429-ra1")
JOB_TIMEOUT = 600.0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--misbehaving-pages", type=int, default=500)
    ap.add_argument("--misbehaving-ra-pages", type=int, default=20)


class _Site:
    def __init__(self, pages: int, mode: str) -> None:
        self.pages = pages
        self.mode = mode
        self.hits: Counter[str] = Counter()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path in ("/robots.txt", "/sitemap.xml"):
            return web.Response(status=404)
        self.hits[path] += 1
        if self.hits[path] == 1 and self.mode != "ok":
            if self.mode == "reset":
                assert request.transport is not None
                request.transport.abort()
                return web.Response()
            if self.mode == "429-ra1":
                return web.Response(status=429, headers={"Retry-After": "1"})
            return web.Response(status=int(self.mode))
        i = -1 if path == "/" else int(path.rsplit("/", 1)[1].split(".")[0])
        links = "".join(
            f'<a href="/p/{j}.html">{j}</a> ' for j in range(i + 1, min(self.pages, i + 9))
        )
        return web.Response(
            text=f"<html><head><title>{path}</title></head><body>{links}</body></html>",
            content_type="text/html",
        )


async def _one(mode: str, pages: int, tmp: Path) -> dict[str, Any]:
    from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

    site = _Site(pages, mode)
    app = web.Application()
    app.router.add_get("/{tail:.*}", site.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, LOOPBACK, port).start()
    target = f"{LOOPBACK}:{free_port()}"
    conf = tmp / f"{mode}.toml"
    conf.write_text("[server]\nextract_processes = 1\n")
    serve_args = [
        "--role", "primary", "--listen", target, "--data", str(tmp / mode),
        "--allow-private-networks", "--config", str(conf),
    ]  # fmt: skip
    log = OUT_DIR / "misbehaving-server.log"
    child = await asyncio.to_thread(start_serve, "pagesift server", serve_args, log, append=True)
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            await asyncio.wait_for(ch.channel_ready(), 30)
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            t0 = time.monotonic()
            job = await stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url=f"http://{LOOPBACK}:{port}/", max_concurrency=8)
            )
            while True:
                got = await stub.GetJob(jobs_pb2.GetJobRequest(id=job.id, status_only=True))
                if got.state not in (jobs_pb2.JOB_STATE_SCRAPING, jobs_pb2.JOB_STATE_UNSPECIFIED):
                    break
                if time.monotonic() - t0 > JOB_TIMEOUT:
                    raise TimeoutError(f"{mode}: the crawl did not finish")
                await asyncio.sleep(0.05)
            wall = time.monotonic() - t0
    finally:
        await asyncio.to_thread(stop_serve, child, 30.0)
        await runner.cleanup()
    requests = sum(site.hits.values())
    return {
        "mode": mode,
        "pages": got.completed,
        "failed": got.failed,
        "wall_s": round(wall, 2),
        "pages_per_s": round(got.completed / wall, 1) if wall > 0 else 0.0,
        "requests_per_page": round(requests / max(1, got.completed), 2),
    }


def run(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-misbehaving-") as tmpname:
        for mode in MODES:
            pages = args.misbehaving_ra_pages if mode == "429-ra1" else args.misbehaving_pages
            row = asyncio.run(_one(mode, pages, Path(tmpname)))
            say(f"{mode}: {row}")
            rows.append(row)
    write_json(OUT_DIR / "misbehaving.json", rows)
    table = markdown_table(
        ["first answer", "pages", "failed", "wall s", "pages/s", "requests/page"],
        [
            [
                r["mode"],
                r["pages"],
                r["failed"],
                r["wall_s"],
                r["pages_per_s"],
                r["requests_per_page"],
            ]
            for r in rows
        ],
    )
    (OUT_DIR / "misbehaving.md").write_text(table + "\n")
    say("\n" + table)
