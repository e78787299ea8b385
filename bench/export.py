"""Section ``export``: ``pagesift export``'s memory against the number of pages it writes.

One real ``pagesift serve`` child (``bench.crawl.pagesift_server``) scrapes a batch job
of ``--export-pages`` URLs (default 5,000) from a generated site on 127.0.0.1 (an
aiohttp app in a thread of this process: ``/page/N`` is about ``--export-page-kb`` KB
of text, default 32, distinct per page). Then the job is exported by ``pagesift
export`` children, each measured by the kernel (``wait4``: its peak RSS, its CPU):

- ``--dir`` (one markdown file per page, and ``index.jsonl``) and ``--jsonl --out``,
  each exporting the job's last n documents (``--from-index total-n``) for n = 1/8,
  1/4, 1/2 and all of it: peak RSS against n. Streaming holds one GetJob page (at most
  ``max_response_bytes``, 4 MiB) at a time, so RSS levels off: it rises over the
  first pages while the allocator's heap settles (glibc raises its mmap threshold as
  big blocks are freed) and then stays (an in-process probe exporting 3,000 and 9,000
  documents of 32 KB from a fake JobService peaked at 89 and 88 MB).
- the reference: a child that holds the whole job (``SyncJobClient.iter_documents``
  into a list, what ``status --all`` did before issue 18) for the same n.

Reported per run: pages, peak RSS MB, CPU s, wall s; the whole export's size (MB of
markdown files and of JSON Lines); and the RSS growth from the smallest n to the
largest. The largest n runs first (a fresh export); each smaller n resumes it with
``--from-index total-n``, which keeps the first documents and writes the last n again.
Results: ``bench/out/export.json`` and ``bench/out/export.md``. Nothing here is timed
against a bound; the figure is the shape of RSS against n.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import (
    LOOPBACK,
    MB,
    OUT_DIR,
    free_port,
    machine_facts,
    markdown_table,
    memory_bytes,
    say,
    write_json,
)
from bench.crawl import pagesift_server

EXPORT_TIMEOUT = 1800.0
HOLD_ALL = """\
import sys
from pagesift.client import SyncJobClient
with SyncJobClient([sys.argv[1]]) as client:
    docs = []
    for i, doc in enumerate(client.iter_documents(sys.argv[2])):
        if i >= int(sys.argv[3]):
            docs.append(doc)
    print(len(docs), sum(len(d.markdown) for d in docs))
"""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("export section")
    g.add_argument(
        "--export-pages", type=int, default=5000, help="pages in the exported job (max 10,000)"
    )
    g.add_argument("--export-page-kb", type=int, default=32, help="text per page, KB")


def _page_text(n: int, kb: int) -> str:
    words = ("export", "stream", "page", "memory", "flat", "index", "resume", "path")
    para = " ".join(words[(n + i) % len(words)] for i in range(120))
    body = "".join(f"<p>{n}: {para}</p>\n" for _ in range(max(1, kb * 1024 // (len(para) + 12))))
    return f"<html><head><title>Page {n}</title></head><body><h1>Page {n}</h1>{body}</body></html>"


@contextlib.contextmanager
def generated_site(kb: int) -> Iterator[str]:
    """``http://127.0.0.1:PORT/``: ``/page/N`` answers a page of about ``kb`` KB."""
    from aiohttp import web

    async def page(request: web.Request) -> web.Response:
        return web.Response(
            text=_page_text(int(request.match_info["n"]), kb), content_type="text/html"
        )

    async def robots(request: web.Request) -> web.Response:
        return web.Response(text="User-agent: *\nAllow: /\n")

    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/page/{n}", page)
        app.router.add_get("/robots.txt", robots)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, LOOPBACK, port).start()
        started.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the generated site did not start")
    try:
        yield f"http://{LOOPBACK}:{port}/"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


def _measure(cmd: list[str], what: str) -> dict[str, Any]:
    """Run ``cmd``; its wall and CPU time, and its peak RSS: the child's own ``VmHWM``
    (``/proc/PID/status``), read every 10 ms until it exits. (``wait4``'s maxrss would
    not do: a child forked from this process inherits this process's peak.)"""
    say("$ " + " ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else ""))
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
        hwm = 0
        deadline = t0 + EXPORT_TIMEOUT
        while True:
            with contextlib.suppress(OSError):
                hwm = max(hwm, memory_bytes(proc.pid)[1])
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait(10)
                raise TimeoutError(f"{what}: still running after {EXPORT_TIMEOUT:.0f}s")
            time.sleep(0.01)
        code = os.waitstatus_to_exitcode(status)
        proc.returncode = code  # reaped here
        out.seek(0)
        text = out.read().decode(errors="replace")
    if code != 0:
        raise RuntimeError(f"{what}: exit {code}: {text[-500:]}")
    return {
        "wall_s": round(time.monotonic() - t0, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(hwm / MB, 1),
        "stdout": text.strip()[-300:],
    }


def run(args: argparse.Namespace) -> None:
    from pagesift.v1 import jobs_pb2

    pages = min(max(args.export_pages, 8), 10_000)
    cli = [sys.executable, "-m", "pagesift.cli"]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine_facts(), "pages": pages, "runs": []}
    with (
        generated_site(args.export_page_kb) as root,
        pagesift_server(32, OUT_DIR / "export-server.log") as server,
        tempfile.TemporaryDirectory(prefix="bench-export-") as tmpname,
    ):
        tmp = Path(tmpname)
        urls = [f"{root}page/{n}" for n in range(pages)]
        job_id = server.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=urls, max_concurrency=32), timeout=60
        ).id
        say(f"batch job {job_id}: {pages} pages of ~{args.export_page_kb} KB")
        t0 = time.monotonic()
        while True:
            job = server.stub.GetJob(
                jobs_pb2.GetJobRequest(id=job_id, status_only=True), timeout=30
            )
            if job.state in (jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED):
                break
            if time.monotonic() - t0 > EXPORT_TIMEOUT:
                raise TimeoutError(f"job {job_id} still {job.state} after {EXPORT_TIMEOUT:.0f}s")
            time.sleep(1)
        total = int(job.completed)
        results["scrape_s"] = round(time.monotonic() - t0, 1)
        results["documents"] = total
        say(f"job done: {total} documents in {results['scrape_s']} s")
        # the whole job first; then the last n documents again (--from-index total-n
        # resumes that export: it keeps the first total-n and writes n)
        counts = sorted({max(1, total // 8), max(1, total // 4), max(1, total // 2), total})
        folder, jsonl = tmp / "pages", tmp / "job.jsonl"
        for n in reversed(counts):
            start = str(total - n)
            runs = {
                "dir": [*cli, "export", job_id, "--dir", str(folder), "--from-index", start],
                "jsonl": [
                    *cli, "export", job_id, "--jsonl", "--out", str(jsonl), "--from-index", start,
                ],
                "hold_all": [sys.executable, "-c", HOLD_ALL, server.target, job_id, start],
            }  # fmt: skip
            for mode, cmd in runs.items():
                if mode != "hold_all":
                    cmd += ["--server", server.target, "--json"]
                figures = _measure(cmd, f"{mode} n={n}")
                results["runs"].append({"mode": mode, "pages": n, **figures})
                say(f"  {mode:8} n={n:6}: peak RSS {figures['peak_rss_mb']} MB")
            if n == total:
                md = sum(p.stat().st_size for p in folder.rglob("*.md"))
                results["markdown_mb"] = round(md / MB, 1)
                results["jsonl_mb"] = round(jsonl.stat().st_size / MB, 1)
        results["runs"].sort(key=lambda r: (r["mode"], r["pages"]))
    growth: dict[str, float] = {}
    for mode in ("dir", "jsonl", "hold_all"):
        rss = [r["peak_rss_mb"] for r in results["runs"] if r["mode"] == mode]
        growth[mode] = round(rss[-1] - rss[0], 1)
    results["rss_growth_mb_smallest_to_largest"] = growth
    write_json(OUT_DIR / "export.json", results)
    rows = [
        (r["mode"], r["pages"], r["peak_rss_mb"], r["cpu_s"], r["wall_s"]) for r in results["runs"]
    ]
    table = markdown_table(["mode", "pages", "peak RSS MB", "CPU s", "wall s"], rows)
    (OUT_DIR / "export.md").write_text(
        f"# export: peak RSS against pages exported\n\n{pages} pages of "
        f"~{args.export_page_kb} KB (scraped in {results['scrape_s']} s; the whole export: "
        f"{results['markdown_mb']} MB of markdown files, {results['jsonl_mb']} MB of JSON "
        f"Lines)\n\n{table}\n\n"
        f"RSS growth, smallest to largest n: {growth}\n"
    )
    say(f"export: RSS growth smallest -> largest n: {growth}")
