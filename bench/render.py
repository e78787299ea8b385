"""Render benchmark: pagesift's browser engine against scrapy-playwright on a JavaScript site,
and AUTO against HTTP on a static docs site.

1. A generated JS site (``bench/render_site.py``: aiohttp on 127.0.0.1 in a child process):
   ``/p/N`` is an empty root filled by a script after ``fetch()``, with script-added links
   and a marker text known in advance (``marker(N)``) that is in no HTML the server sends.
   Both crawlers render the same ``--render-pages`` URLs at each ``--render-concurrency``
   (pagesift: a batch scrape with ``engine=BROWSER``, ``wait_for #content``,
   ``max_concurrency`` and ``max_browser_pages`` = the concurrency; scrapy-playwright:
   ``bench/render_peer.py``, CONCURRENT_REQUESTS = the concurrency, ``wait_for_selector
   #content``, the same Debian headless shell). A page is correct when its marker is in
   the document (pagesift: markdown; peer: rendered HTML).
   An ``engine=HTTP`` pagesift run is the control: it must miss every marker.
2. AUTO vs HTTP: crawls of the Django docs (bench/crawl.py's nginx) with ``--render-static-
   limit`` pages, ``--render-runs`` each, alternating; median pages/s, ratio, and how many
   documents AUTO produced with the browser (``Document.engine``).

Memory: the process tree (crawler, Playwright driver, browser and renderers) sampled every
0.25 s: peak of the summed PSS (``smaps_rollup``, shared pages counted once) and of the
summed RSS. CPU: ``utime+stime+cutime+cstime`` over the live tree, so reaped renderers count.
Wall: pagesift StartBatchScrape -> terminal state; peer spider_opened -> spider_closed. Both
include the lazy browser launch. Every wait is bounded by ``--render-timeout``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH_DIR,
    MB,
    OUT_DIR,
    REPO_DIR,
    machine_facts,
    markdown_table,
    say,
    stop_process,
    wait_rusage,
    write_json,
)
from bench.proctree import TreeSampler, tree_cpu_seconds
from bench.render_site import js_site, marker

SELECTOR = "#content"
CONTROL = "http-control"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("render section")
    g.add_argument("--render-pages", type=int, default=120, help="JS pages per run (default 120)")
    g.add_argument(
        "--render-concurrency", default="1,4,8", help="concurrent pages, comma-separated"
    )
    g.add_argument(
        "--render-only", choices=("pagesift", "peer", "static"), help="one part only (default all)"
    )
    g.add_argument("--render-static-limit", type=int, default=700, help="docs pages per crawl")
    g.add_argument("--render-runs", type=int, default=5, help="AUTO and HTTP crawls each")
    g.add_argument("--render-js-runs", type=int, default=1, help="JS runs per side and level")
    g.add_argument("--render-timeout", type=float, default=300.0, help="seconds per run")


# ---------------------------------------------------------------------------- pagesift


def _documents(stub: Any, job_id: str) -> list[Any]:
    """Every document of the job, 100 at a time (bounded)."""
    from pagesift.v1 import jobs_pb2

    docs: list[Any] = []
    skip = 0
    for _ in range(10_000):
        resp = stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=100), timeout=60)
        docs += list(resp.documents)
        if not resp.HasField("next_skip") or not resp.documents:
            break
        skip = resp.next_skip
    return docs


def run_pagesift(
    urls: dict[str, str],
    engine: str,
    concurrency: int,
    timeout: float,
    *,
    crawl_url: str = "",
    crawl_limit: int = 0,
) -> dict[str, Any]:
    """One pagesift job on a fresh node: a batch scrape of ``urls`` (``{url: marker}``) or,
    with ``crawl_url``, a crawl of at most ``crawl_limit`` pages; figures and marker count."""
    from bench.crawl import _all_errors, _poll_job, pagesift_server
    from pagesift.v1 import jobs_pb2

    terminal = {
        jobs_pb2.JOB_STATE_COMPLETED,
        jobs_pb2.JOB_STATE_FAILED,
        jobs_pb2.JOB_STATE_CANCELLED,
    }
    code = jobs_pb2.FetchEngine.Value(f"FETCH_ENGINE_{engine.upper()}")
    options = jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_MARKDOWN], engine=code)
    if engine == "browser":
        options.wait_for.selector = SELECTOR
    extra = [f"max_browser_pages = {concurrency}"]
    log = OUT_DIR / "render-server.log"
    with pagesift_server(concurrency, log, extra) as server:
        sampler = TreeSampler(server.proc.pid).start()
        cpu0 = tree_cpu_seconds(server.proc.pid)
        t0 = time.monotonic()
        if crawl_url:
            req: Any = jobs_pb2.StartCrawlRequest(
                url=crawl_url, limit=crawl_limit, max_concurrency=concurrency, options=options
            )
            started = server.stub.StartCrawl(req, timeout=30)
        else:
            batch = jobs_pb2.StartBatchScrapeRequest(
                urls=list(urls), max_concurrency=concurrency, options=options
            )
            started = server.stub.StartBatchScrape(batch, timeout=30)
        job = _poll_job(server.stub, started.id, terminal, [0], timeout)
        wall = time.monotonic() - t0
        cpu = tree_cpu_seconds(server.proc.pid) - cpu0
        sampler.stop()
        docs = _documents(server.stub, started.id)
        errors = _all_errors(server.stub, started.id)
    engines = Counter(jobs_pb2.FetchEngine.Name(d.engine) for d in docs)
    correct = sum(1 for d in docs if urls.get(d.url) and urls[d.url] in d.markdown)
    pages = int(job.completed)
    return {
        "crawler": "pagesift",
        "engine": engine,
        "concurrency": concurrency,
        "pages": pages,
        "failed": int(job.failed),
        "correct": correct,
        "state": jobs_pb2.JobState.Name(job.state),
        "document_engines": dict(engines),
        "error_codes": dict(Counter(e.code for e in errors.errors)),
        "error_examples": [f"{e.url} {e.code} {e.message}" for e in errors.errors[:5]],
        "wall_s": wall,
        "pages_per_s": pages / wall if wall > 0 else 0.0,
        "cpu_s_per_page": cpu / pages if pages else 0.0,
        "peak_pss_mb": sampler.peak_pss / MB,
        "peak_rss_mb": sampler.peak_rss / MB,
        "peak_processes": sampler.peak_procs,
        "command": server.command,
        "log": str(log),
    }


# ---------------------------------------------------------------------------- peer


def run_peer(
    python: Path, urls: dict[str, str], concurrency: int, timeout: float
) -> dict[str, Any]:
    """scrapy-playwright (``bench/render_peer.py``) on the same URLs, same concurrency."""
    pages_file = OUT_DIR / "render-peer-pages.json"
    stats_path = OUT_DIR / "render-peer-stats.json"
    log_path = OUT_DIR / "render-peer.log"
    pages_file.write_text(json.dumps(urls))
    stats_path.unlink(missing_ok=True)
    cmd = [
        str(python),
        str(BENCH_DIR / "render_peer.py"),
        "--pages",
        str(pages_file),
        "--concurrency",
        str(concurrency),
        "--selector",
        SELECTOR,
        "--stats",
        str(stats_path),
        "--timeout",
        str(timeout),
    ]
    say("$ " + shlex.join(cmd))
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_DIR)
        sampler = TreeSampler(proc.pid).start()
        try:
            usage = wait_rusage(proc, timeout=timeout + 60)
        finally:
            sampler.stop()
            if proc.poll() is None:
                stop_process(proc)
    if usage.returncode != 0 or not stats_path.exists():
        raise RuntimeError(f"scrapy-playwright failed (exit {usage.returncode}); see {log_path}")
    stats = json.loads(stats_path.read_text())
    pages, wall, cpu = (
        int(stats["pages"]),
        float(stats["crawl_wall_s"]),
        float(stats["crawl_cpu_s"]),
    )
    return {
        "crawler": "scrapy-playwright",
        "engine": "browser",
        "concurrency": concurrency,
        "pages": pages,
        "failed": len(urls) - pages,
        "correct": int(stats["correct"]),
        "finish_reason": stats["reason"],
        "wall_s": wall,
        "pages_per_s": pages / wall if wall > 0 else 0.0,
        "cpu_s_per_page": cpu / pages if pages else 0.0,
        "peak_pss_mb": sampler.peak_pss / MB,
        "peak_rss_mb": sampler.peak_rss / MB,
        "peak_processes": sampler.peak_procs,
        "command": shlex.join(cmd),
        "log": str(log_path),
    }


# ---------------------------------------------------------------------------- section


def _say_result(r: dict[str, Any]) -> None:
    say(
        f"render: {r['crawler']} {r['engine']} c={r['concurrency']}: {r['pages']} pages "
        f"({r['correct']} with marker) in {r['wall_s']:.2f}s = {r['pages_per_s']:.1f}/s, "
        f"peak PSS {r['peak_pss_mb']:.0f} MB, RSS {r['peak_rss_mb']:.0f} MB"
    )


def _js_level(
    python: Path | None,
    with_pagesift: bool,
    urls: dict[str, str],
    c: int,
    timeout: float,
    peer_first: bool,
    notes: list[str],
) -> list[dict[str, Any]]:
    """One run of each side at concurrency ``c`` (the peer if ``python``, pagesift if
    ``with_pagesift``); a failed pagesift run becomes a note, so the peer's figures stay."""
    out: list[dict[str, Any]] = []
    for side in ("peer", "pagesift") if peer_first else ("pagesift", "peer"):
        if side == "peer":
            if python is None:
                continue
            r = run_peer(python, urls, c, timeout)
        else:
            if not with_pagesift:
                continue
            try:
                r = run_pagesift(urls, "browser", c, timeout)
            except Exception as exc:  # the peer's figures still count
                notes.append(f"pagesift browser c={c} failed: {type(exc).__name__}: {exc}")
                say(notes[-1])
                continue
        _say_result(r)
        out.append(r)
    return out


def run(args: argparse.Namespace) -> None:
    from bench.crawl import pagesift_missing
    from bench.tools import DJANGO_DOC_PACKAGE, django_docs_root, ensure_apt, ensure_render_peer

    levels = [int(x) for x in str(args.render_concurrency).split(",") if x.strip()]
    if not levels or min(levels) < 1 or args.render_pages < 1 or not 1 <= args.render_runs <= 9:
        raise SystemExit("need --render-concurrency >= 1, --render-pages >= 1, 1..9 runs")
    if not 1 <= args.render_js_runs <= 9:
        raise SystemExit("need --render-concurrency >= 1, --render-pages >= 1, 1..9 runs")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    only = args.render_only
    missing = pagesift_missing()
    if missing:
        raise RuntimeError(f"pagesift cannot run: {missing}")
    load_before = os.getloadavg()[0]
    js: list[dict[str, Any]] = []
    notes: list[str] = []
    if only in (None, "pagesift", "peer"):
        python = ensure_render_peer() if only in (None, "peer") else None
        with js_site(args.render_pages) as base:
            urls = {f"{base}/p/{n}": marker(n) for n in range(args.render_pages)}
            if only in (None, "pagesift"):
                control = run_pagesift(urls, "http", max(levels), args.render_timeout)
                control["crawler"] = CONTROL
                _say_result(control)
                js.append(control)
            for i in range(args.render_js_runs):
                for c in levels:
                    js += _js_level(
                        python, only != "peer", urls, c, args.render_timeout, i % 2 == 1, notes
                    )
    static: list[dict[str, Any]] = []
    detect: dict[str, Any] = {}
    if only in (None, "static"):
        from bench.crawl import warm_page_cache
        from bench.nginx import Nginx

        ensure_apt(["nginx", DJANGO_DOC_PACKAGE])
        docs = django_docs_root()
        warm_page_cache(docs)
        detect = detection_cost(docs)
        say(f"render: needs_render {detect['ms_per_page']:.3f} ms/page, {detect['flagged']}")
        with Nginx(docs) as site:
            for i in range(args.render_runs):
                for engine in ("http", "auto") if i % 2 == 0 else ("auto", "http"):
                    r = run_pagesift(
                        {},
                        engine,
                        16,
                        args.render_timeout,
                        crawl_url=site.url,
                        crawl_limit=args.render_static_limit,
                    )
                    r["crawler"] = "pagesift-static"
                    say(
                        f"render: static {engine} run {i + 1}: {r['pages']} pages in "
                        f"{r['wall_s']:.2f}s = {r['pages_per_s']:.1f}/s {r['document_engines']}"
                    )
                    static.append(r)
    report(args, js, static, detect, notes, load_before)


def detection_cost(root: Path) -> dict[str, Any]:
    """CPU of AUTO's decision (``autorender.needs_render``) over every .html file under
    ``root``, in this process: the cost AUTO adds to a static page, without the noise of
    a crawl's wall time. Also the pages it would render."""
    from pagesift.primary.engine.autorender import needs_render

    bodies = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.html"))}
    t0 = time.process_time()
    reasons = {name: needs_render(body, "text/html") for name, body in bodies.items()}
    cpu = time.process_time() - t0
    return {
        "pages": len(bodies),
        "ms_per_page": 1000 * cpu / max(1, len(bodies)),
        "flagged": {name: why for name, why in reasons.items() if why is not None},
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: float(r["pages_per_s"]))
    return ordered[(len(ordered) - 1) // 2]


def _tree_state() -> str:
    """The commit measured, and whether the work tree differed from it (bounded)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_DIR, capture_output=True, text=True, timeout=30, check=False,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "primary", "shared"],
            cwd=REPO_DIR, capture_output=True, text=True, timeout=30, check=False,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' + uncommitted changes' if dirty else ''}"


def _mid(xs: list[float]) -> float:
    return xs[(len(xs) - 1) // 2]


def report(
    args: argparse.Namespace,
    js: list[dict[str, Any]],
    static: list[dict[str, Any]],
    detect: dict[str, Any],
    notes: list[str],
    load_before: float,
) -> None:
    facts = {**machine_facts(), "loadavg_1m_before": load_before, "tree": _tree_state()}
    command = shlex.join([".venv/bin/python", "-m", "bench.run", *sys.argv[1:]])
    md = ["## Render: browser engine vs scrapy-playwright; AUTO vs HTTP", ""]
    ratio: float | None = None
    cpu_ratio = float("nan")
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in js:
        groups.setdefault((r["crawler"], r["engine"], r["concurrency"]), []).append(r)
    js_median = [(_median(g), g) for g in groups.values()]
    if js:
        md += [
            f"JS site: {args.render_pages} pages on 127.0.0.1 (aiohttp, child process), each an "
            f"empty root filled after `fetch()` with a marker text and script-added links; "
            f"wait for `{SELECTOR}`. Correct = marker in the document. "
            f"{args.render_js_runs} run(s) per side and level (median by pages/s).",
            "",
            markdown_table(
                [
                    "crawler",
                    "engine",
                    "conc.",
                    "pages",
                    "correct",
                    "wall s",
                    "pages/s",
                    "CPU ms/page",
                    "peak PSS MB",
                    "peak RSS MB",
                    "runs pages/s",
                ],
                [
                    [
                        r["crawler"],
                        r["engine"],
                        r["concurrency"],
                        r["pages"],
                        r["correct"],
                        f"{r['wall_s']:.2f}",
                        f"{r['pages_per_s']:.1f}",
                        f"{r['cpu_s_per_page'] * 1000:.0f}",
                        f"{r['peak_pss_mb']:.0f}",
                        f"{r['peak_rss_mb']:.0f}",
                        " ".join(f"{x['pages_per_s']:.1f}" for x in group),
                    ]
                    for r, group in js_median
                ],
            ),
            "",
        ]
        for r in js:
            if r.get("error_codes"):
                md.append(
                    f"{r['crawler']} {r['engine']} c={r['concurrency']}: errors "
                    f"{r['error_codes']}; e.g. {r['error_examples'][:2]}"
                )
        md += [f"Note: {n}" for n in notes]
        md.append("")
    if static:
        by = {e: [r for r in static if r["engine"] == e] for e in ("http", "auto")}
        med = {e: _median(rs) for e, rs in by.items() if rs}
        if "http" in med and "auto" in med and med["http"]["pages_per_s"] > 0:
            ratio = med["auto"]["pages_per_s"] / med["http"]["pages_per_s"]
        cpu = {e: sorted(r["cpu_s_per_page"] for r in rs) for e, rs in by.items() if rs}
        if cpu.get("http") and cpu.get("auto") and _mid(cpu["http"]) > 0:
            cpu_ratio = _mid(cpu["auto"]) / _mid(cpu["http"])
        detect_ms = float(detect.get("ms_per_page", 0.0))
        http_ms = 1000 * _mid(cpu["http"]) if cpu.get("http") else 0.0
        share = 100 * detect_ms / http_ms if http_ms > 0 else float("nan")
        rendered = [r["document_engines"].get("FETCH_ENGINE_BROWSER", 0) for r in by["auto"]]
        md += [
            f"Static docs (Django docs, nginx on 127.0.0.1), crawl limit "
            f"{args.render_static_limit}, concurrency 16, {args.render_runs} runs each "
            "alternating; the run of median pages/s:",
            "",
            markdown_table(
                [
                    "engine",
                    "pages",
                    "wall s",
                    "pages/s",
                    "CPU ms/page (median)",
                    "peak PSS MB",
                    "all runs pages/s",
                    "all runs CPU ms/page",
                ],
                [
                    [
                        e,
                        r["pages"],
                        f"{r['wall_s']:.2f}",
                        f"{r['pages_per_s']:.1f}",
                        f"{_mid(cpu[e]) * 1000:.2f}",
                        f"{r['peak_pss_mb']:.0f}",
                        " ".join(f"{x['pages_per_s']:.0f}" for x in by[e]),
                        " ".join(f"{x['cpu_s_per_page'] * 1000:.1f}" for x in by[e]),
                    ]
                    for e, r in med.items()
                ],
            ),
            "",
            (f"AUTO/HTTP pages/s: **{ratio:.3f}**" if ratio is not None else "AUTO/HTTP: n/a")
            + f"; CPU per page AUTO/HTTP (medians): **{cpu_ratio:.3f}**; pages AUTO rendered "
            f"with the browser per run: {rendered}. On a shared machine the CPU per page is the "
            "steadier figure: wall time moves with the other processes' load.",
            "",
            f"AUTO's decision alone (`autorender.needs_render`, in-process over the "
            f"{detect.get('pages', 0)} .html files): {detect_ms:.3f} ms CPU per page "
            f"({share:.1f}% of HTTP's median CPU per page); it would render "
            f"{detect.get('flagged') or 'none'}.",
            "",
        ]
    md += [
        "Wall: pagesift StartBatchScrape/StartCrawl -> terminal state (node already up, "
        "browser launched lazily inside the window); scrapy-playwright spider_opened -> "
        "spider_closed (browser launch inside too). Memory: peak over 0.25 s samples of the "
        "whole process tree (node or Scrapy, Playwright driver, browser, renderers; "
        "pagesift's extraction workers too): PSS summed (shared pages once) and RSS summed.",
        "",
        f"Machine: {facts['nproc']} CPUs ({facts['cpu_model']}), {facts['mem_total_gb']} GB, "
        f"Linux {facts['kernel']}, Python {facts['python']}; {facts['date']}; load average "
        f"{load_before:.2f} before the runs, {facts['loadavg_1m']:.2f} after (2 cores shared). "
        f"Code: {facts['tree']}.",
        "",
        f"Command: `{command}`",
    ]
    from bench.tools import PLAYWRIGHT_VERSION, SCRAPY_PLAYWRIGHT_VERSION, SCRAPY_VERSION

    data = {
        "section": "render",
        "command": command,
        "machine": facts,
        "peer": {
            "scrapy": SCRAPY_VERSION,
            "scrapy-playwright": SCRAPY_PLAYWRIGHT_VERSION,
            "playwright": PLAYWRIGHT_VERSION,
        },
        "js_pages": args.render_pages,
        "js_results": [r for r, _ in js_median],
        "js_all_runs": js,
        "static_results": static,
        "auto_over_http_pages_per_s": ratio,
        "needs_render_cost": detect,
        "auto_over_http_cpu_per_page": None if cpu_ratio != cpu_ratio else cpu_ratio,
        "notes": notes,
    }
    text = "\n".join(md)
    write_json(OUT_DIR / "render.json", data)
    (OUT_DIR / "render.md").write_text(text + "\n")
    print(text, flush=True)
    say(f"render: wrote {OUT_DIR / 'render.md'} and {OUT_DIR / 'render.json'}")
