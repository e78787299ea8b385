"""Browser bounds benchmark (issue 28, finding 3): peak chromium memory under hostile pages.

A ``BrowserPool`` in this process (the node's own pool, real chromium-headless-shell)
renders the pages of ``tests.heavypages`` on 127.0.0.1, one scenario per fresh browser:

- ``plain``: a calm page (the control: the browser's own level);
- ``alloc``: a page whose script allocates ``--bounds-alloc-mb`` (2048) MiB in filled
  32 MiB arrays, with ``browser_page_memory_limit`` at ``--bounds-cap-mb`` (the default
  1024), and once more with the cap off (0: the code before the cap);
- ``popups``: a page that calls ``window.open`` ``--bounds-popups`` (100) times.

Figures per scenario: the outcome (``ok`` or the page error code), the seconds the page
took, the peak summed PSS and RSS of the browser's process tree (``bench.proctree``,
sampled every 0.05 s from /proc: the browser, its zygotes, GPU/utility processes and
renderers; the Playwright driver is not in it), the largest renderer RSS the memory
watch read and the renderers it killed. ``bench/out/browserbounds.json`` keeps them.
Every render is bounded by ``render_timeout`` (60 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from bench.common import MB, OUT_DIR, machine_facts, markdown_table, say, write_json
from bench.proctree import TreeSampler

EXE = "/usr/lib/chromium/chromium-headless-shell"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("browserbounds section")
    g.add_argument("--bounds-alloc-mb", type=int, default=2048, help="MiB the page allocates")
    g.add_argument("--bounds-cap-mb", type=int, default=1024, help="browser_page_memory_limit")
    g.add_argument("--bounds-popups", type=int, default=100, help="window.open calls")


async def _scenario(name: str, root: str, path: str, cap: int) -> dict[str, Any]:
    from pagesift.core.config.schema import ServerConfig
    from pagesift.core.jobs.pageerrors import PageError
    from pagesift.primary.engine.browser.pool import BrowserPool
    from pagesift.v1 import jobs_pb2

    config = ServerConfig(max_browser_pages=2, render_timeout=60.0, browser_page_memory_limit=cap)
    pool = BrowserPool(config)
    try:
        await pool.render(root + "calm.html", jobs_pb2.ScrapeOptions(), owner="warm")
        pid = pool.browser_pid()
        if pid is None:
            raise RuntimeError("the browser's pid is unknown")
        await asyncio.sleep(0.5)
        sampler = TreeSampler(pid, interval=0.05).start()
        started = time.monotonic()
        outcome, message = "ok", ""
        try:
            await pool.render(root + path, jobs_pb2.ScrapeOptions(), owner="bench")
        except PageError as e:
            outcome, message = str(e.code), e.message
        took = time.monotonic() - started
        await asyncio.sleep(0.3)
        sampler.stop()
        stats = pool.stats()
    finally:
        await pool.close()
    row = {
        "scenario": name,
        "cap_bytes": cap,
        "outcome": outcome,
        "message": message,
        "seconds": round(took, 2),
        "peak_pss_mb": round(sampler.peak_pss / MB),
        "peak_rss_mb": round(sampler.peak_rss / MB),
        "peak_processes": sampler.peak_procs,
        "renderer_peak_rss_mb": round(stats["renderer_peak_rss"] / MB),
        "renderers_killed": stats["renderers_killed"],
    }
    say(
        f"browserbounds {name}: {outcome} in {took:.1f}s, peak PSS {row['peak_pss_mb']} MB, "
        f"RSS {row['peak_rss_mb']} MB, renderer {row['renderer_peak_rss_mb']} MB"
    )
    return row


async def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from tests.heavypages import serve_heavy

    cap = args.bounds_cap_mb * MB
    alloc = f"hog.html?mb={args.bounds_alloc_mb}"
    rows = []
    async with serve_heavy() as root:
        rows.append(await _scenario("plain", root, "calm.html", cap))
        rows.append(await _scenario(f"alloc {args.bounds_alloc_mb} MiB", root, alloc, cap))
        rows.append(await _scenario(f"alloc {args.bounds_alloc_mb} MiB, no cap", root, alloc, 0))
        popups = f"popups.html?n={args.bounds_popups}"
        rows.append(await _scenario(f"{args.bounds_popups} window.open", root, popups, cap))
    return rows


def run(args: argparse.Namespace) -> None:
    if not os.access(EXE, os.X_OK):
        raise RuntimeError(f"{EXE} is missing: the browser bounds need it")
    if not 64 <= args.bounds_cap_mb <= 1 << 16 or not 0 < args.bounds_alloc_mb <= 4096:
        raise SystemExit("need --bounds-cap-mb in 64..65536 and --bounds-alloc-mb in 1..4096")
    if not 0 < args.bounds_popups <= 1000:
        raise SystemExit("need --bounds-popups in 1..1000")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    rows = asyncio.run(_run(args))
    write_json(OUT_DIR / "browserbounds.json", {"machine": facts, "scenarios": rows})
    headers = ["scenario", "cap MiB", "outcome", "s", "peak PSS MB", "peak RSS MB",
               "renderer peak MB", "killed"]  # fmt: skip
    table = [
        [r["scenario"], r["cap_bytes"] // MB, r["outcome"], r["seconds"], r["peak_pss_mb"],
         r["peak_rss_mb"], r["renderer_peak_rss_mb"], r["renderers_killed"]]
        for r in rows
    ]  # fmt: skip
    say("browserbounds:\n" + markdown_table(headers, table))
