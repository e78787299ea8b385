"""Render benchmark: pagesift's browser engine against two rendering peers,
scrapy-playwright and Crawlee's PlaywrightCrawler, on a JavaScript site with sub-resources;
the guard proxy's cost per sub-resource; and AUTO against HTTP on a static docs site.

1. A generated JS site (``bench/render_site.py``: aiohttp on 127.0.0.1 in a child process):
   ``/p/N`` is an empty root with a stylesheet and an external script; after ``load`` the
   script ``fetch()``es its JSON and fills the page with script-added links and a marker
   text known in advance (``marker(N)``) that is in no HTML the server sends: the HTML and
   three requests a page (no-store, per-page paths: no cache saves one; the site counts
   them, and the connections). Every crawler renders the same ``--render-pages`` URLs once
   each (no link followed) at each ``--render-concurrency``, on the same Debian
   chromium-headless-shell (``BROWSER``: pagesift's default ``browser_executable``),
   waiting for ``#content``:
   pagesift: a batch scrape with ``engine=BROWSER``, ``wait_for #content``,
   ``max_concurrency`` and ``max_browser_pages`` = the level;
   scrapy-playwright (``bench/render_peer.py``): CONCURRENT_REQUESTS = the level;
   Crawlee (``bench/crawlee/crawl.mjs``): PlaywrightCrawler, min = max concurrency = the
   level, memory storage only, otherwise its defaults.
   A page is correct when its marker is in the document (pagesift: markdown; peers:
   rendered HTML). An ``engine=HTTP`` pagesift run is the control: it must miss every marker.
2. Sub-resource latency (``--render-latency-pages``): the same headless shell with
   pagesift's launch flags renders pages one at a time, and each page's Resource Timing
   entries (``performance.getEntriesByType``) for its stylesheet, script and JSON are read:
   direct (no proxy); through pagesift's guard proxy (``GuardProxy`` in this process, the
   browser launched with ``launch_proxy`` and the context with ``guarded_context_options``,
   the address guard on with the site's endpoint exempt); and through the guard proxy in
   the context pagesift itself makes (``browser.render.new_context``: the guard proxy's
   server only, its credentials taught once by a first page, so no request waits on the
   Playwright client; the pages here are the bench's own, without the render path's
   per-page refusal of images, media and fonts).
   The sides alternate in rounds; median and p90 per side.
3. AUTO vs HTTP: crawls of the Django docs (bench/crawl.py's nginx) with ``--render-static-
   limit`` pages, ``--render-runs`` each, alternating; median pages/s, ratio, and how many
   documents AUTO produced with the browser (``Document.engine``).

Measured the same way for every crawler, over its crawl window: pagesift StartBatchScrape
-> terminal state (the bench's own calls); a peer's window is opened and closed by the
peer itself (scrapy-playwright spider_opened -> spider_closed, Crawlee around
``crawler.run()``) over a ``proctree.WindowPipe``, the peer waiting while the bench takes
its snapshots. All include the lazy browser launch. CPU: user+sys of the whole process
tree (``proctree.CpuByKind``, reaped renderers included, and processes orphaned by a
closed browser: the bench is their child subreaper), split by process kind: the
chromium browser process, its renderers, its other processes (zygote, gpu, utility), the
Playwright driver (node), the crawler's own process, the crawler's other children
(pagesift's extraction workers). Memory: the tree sampled every 0.25 s, peak of the summed
PSS (``smaps_rollup``, shared pages counted once) and of the summed RSS. Every wait is
bounded by ``--render-timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.common import (
    BENCH_DIR,
    MB,
    OUT_DIR,
    REPO_DIR,
    machine_facts,
    markdown_table,
    say,
    stop_process,
    write_json,
)
from bench.proctree import (
    KIND_LABELS,
    KINDS,
    CpuSplit,
    TreeSampler,
    WindowPipe,
    become_subreaper,
)
from bench.render_site import SUBRESOURCES, counts, js_site, kind_of, marker, served_between

SELECTOR = "#content"
CONTROL = "http-control"
PEERS = ("scrapy-playwright", "crawlee")
SIDES = ("pagesift", *PEERS)
# --render-only: a side, "peer" (scrapy-playwright, its name before Crawlee came), "js"
# (the three sides and the latency), the latency measurement alone, or the static part
ONLY = ("pagesift", "scrapy-playwright", "peer", "crawlee", "js", "latency", "static")
OPEN_TIMEOUT = 120.0  # a peer's start (imports, no browser yet) until it opens its window


def browser_path() -> str:
    """The headless shell every side drives: pagesift's default ``browser_executable``
    (Debian's chromium-headless-shell)."""
    from pagesift.core.config.schema import ServerConfig

    return ServerConfig().browser_executable


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("render section")
    g.add_argument("--render-pages", type=int, default=120, help="JS pages per run (default 120)")
    g.add_argument(
        "--render-concurrency", default="1,4,8", help="concurrent pages, comma-separated"
    )
    g.add_argument(
        "--render-only",
        choices=ONLY,
        help="one part only (default all; peer = scrapy-playwright; js = the three "
        "crawlers and the latency, no static part)",
    )
    g.add_argument("--render-static-limit", type=int, default=700, help="docs pages per crawl")
    g.add_argument("--render-runs", type=int, default=5, help="AUTO and HTTP crawls each")
    g.add_argument("--render-js-runs", type=int, default=1, help="JS runs per side and level")
    g.add_argument(
        "--render-latency-pages",
        type=int,
        default=60,
        help="pages per side for the sub-resource latency (0: skip it)",
    )
    g.add_argument("--render-timeout", type=float, default=300.0, help="seconds per run")


# ---------------------------------------------------------------------------- figures


def _figures(
    crawler: str,
    engine: str,
    concurrency: int,
    pages: int,
    correct: int,
    wall: float,
    split: CpuSplit,
    sampler: TreeSampler,
    served: dict[str, int],
) -> dict[str, Any]:
    """The figures every run reports, whatever the crawler."""
    cpu = split.total
    per_page = 1000 / pages if pages else 0.0
    return {
        "crawler": crawler,
        "engine": engine,
        "concurrency": concurrency,
        "pages": pages,
        "correct": correct,
        "wall_s": wall,
        "pages_per_s": pages / wall if wall > 0 else 0.0,
        "cpu_s": cpu,
        "cpu_s_per_page": cpu / pages if pages else 0.0,
        "cpu_ms_per_page_by_kind": {k: split.seconds[k] * per_page for k in KINDS},
        "cpu_s_by_kind": dict(split.seconds),
        "cpu_s_via_parent": split.via_parent,
        "cpu_s_unreaped": split.unreaped,
        "processes_by_kind": split.by_kind_processes,
        "peak_pss_mb": sampler.peak_pss / MB,
        "peak_rss_mb": sampler.peak_rss / MB,
        "peak_processes": sampler.peak_procs,
        "served": served,
        "subrequests_per_page": sum(served[k] for k in SUBRESOURCES) / pages if pages else 0.0,
        "connections_per_page": served["connections"] / pages if pages else 0.0,
    }


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
    site: str = "",
) -> dict[str, Any]:
    """One pagesift job on a fresh node: a batch scrape of ``urls`` (``{url: marker}``) or,
    with ``crawl_url``, a crawl of at most ``crawl_limit`` pages; figures and marker count
    (``site``: the JS site's base URL, whose counters are read around the window)."""
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
        sampler = TreeSampler(server.proc.pid, browser=browser_path(), adopt=True).start()
        try:
            before = counts(site) if site else {}
            sampler.open_window()
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
            split = sampler.close_window()
            served = served_between(before, counts(site)) if site else served_between({}, {})
        finally:
            sampler.stop()
        docs = _documents(server.stub, started.id)
        errors = _all_errors(server.stub, started.id)
    engines = Counter(jobs_pb2.FetchEngine.Name(d.engine) for d in docs)
    correct = sum(1 for d in docs if urls.get(d.url) and urls[d.url] in d.markdown)
    pages = int(job.completed)
    return {
        **_figures("pagesift", engine, concurrency, pages, correct, wall, split, sampler, served),
        "failed": int(job.failed),
        "state": jobs_pb2.JobState.Name(job.state),
        "document_engines": dict(engines),
        "error_codes": dict(Counter(e.code for e in errors.errors)),
        "error_examples": [f"{e.url} {e.code} {e.message}" for e in errors.errors[:5]],
        "command": server.command,
        "log": str(log),
    }


# ---------------------------------------------------------------------------- peers


def peer_command(
    name: str, program: Path, stats: Path, pages_file: Path, concurrency: int, timeout: float
) -> list[str]:
    """The command of peer ``name`` (``program``: its python or node) on ``pages_file``."""
    script = BENCH_DIR / ("render_peer.py" if name == "scrapy-playwright" else "crawlee/crawl.mjs")
    return [
        str(program),
        str(script),
        "--pages",
        str(pages_file),
        "--concurrency",
        str(concurrency),
        "--selector",
        SELECTOR,
        "--browser",
        browser_path(),
        "--stats",
        str(stats),
        "--timeout",
        str(timeout),
    ]


def run_peer(
    name: str, program: Path, urls: dict[str, str], concurrency: int, timeout: float, site: str
) -> dict[str, Any]:
    """Peer ``name`` (``PEERS``) on the same URLs and concurrency; its window told over a
    ``WindowPipe``, the bench's tree snapshots taken at its edges."""
    pages_file = OUT_DIR / f"render-{name}-pages.json"
    stats_path = OUT_DIR / f"render-{name}-stats.json"
    log_path = OUT_DIR / f"render-{name}.log"
    pages_file.write_text(json.dumps(urls))
    stats_path.unlink(missing_ok=True)
    pipe = WindowPipe()
    cmd = peer_command(name, program, stats_path, pages_file, concurrency, timeout)
    say("$ " + shlex.join(cmd))
    edges: dict[str, float] = {}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*cmd, *pipe.child_args()],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_DIR,
            pass_fds=pipe.child_fds,
        )
        pipe.started()
        sampler = TreeSampler(proc.pid, browser=browser_path(), adopt=True).start()
        split: list[CpuSplit] = []
        try:
            before = counts(site)

            def opened() -> None:
                sampler.open_window()
                edges["open"] = time.monotonic()

            def closed() -> None:
                edges["close"] = time.monotonic()
                split.append(sampler.close_window())

            pipe.expect("open", OPEN_TIMEOUT, opened)
            pipe.expect("close", timeout + 60, closed)
            served = served_between(before, counts(site))
            code = proc.wait(timeout=120)
        finally:
            sampler.stop()
            pipe.close()
            if proc.poll() is None:
                stop_process(proc)
    if code != 0 or not stats_path.exists() or not split:
        raise RuntimeError(f"{name} failed (exit {code}); see {log_path}")
    stats = json.loads(stats_path.read_text())
    pages = int(stats["pages"])
    wall = edges["close"] - edges["open"]
    result = _figures(
        name, "browser", concurrency, pages, int(stats["correct"]), wall, split[0], sampler, served
    )
    result.update(
        failed=len(urls) - pages,
        wall_s_inside=float(stats["crawl_wall_s"]),
        command=shlex.join(cmd),
        log=str(log_path),
    )
    if name == "scrapy-playwright":
        result["finish_reason"] = stats["reason"]
        result["cpu_s_inside"] = float(stats["crawl_cpu_s"])
    else:
        result["failures"] = stats.get("failures", [])
        result["crawlee_stats"] = stats.get("crawlee_stats", {})
    left = [p for p in (REPO_DIR / "storage", BENCH_DIR / "crawlee" / "storage") if p.exists()]
    if left:
        result["left_behind"] = [str(p) for p in left]
    return result


# ---------------------------------------------------------------------------- latency

# every resource entry of the page, and its navigation's response end
_TIMINGS = """() => ({
  nav: performance.getEntriesByType('navigation').map(e => e.responseEnd - e.startTime),
  res: performance.getEntriesByType('resource').map(e => [e.name, e.duration]),
})"""
LATENCY_SIDES = ("direct", "guard proxy", "guard proxy + pagesift's context")
LATENCY_ROUNDS = 4


async def _latency_round(
    browser: Any, context_kw: dict[str, Any], route: bool, pages: Sequence[str]
) -> dict[str, list[float]]:
    """Render ``pages`` one at a time in one context; milliseconds by resource kind."""
    from pagesift.primary.engine.browser.render import new_context
    from pagesift.v1 import jobs_pb2

    got: dict[str, list[float]] = {k: [] for k in ("html", *SUBRESOURCES)}
    if route:
        proxy = context_kw.get("proxy")
        context = await new_context(
            browser, jobs_pb2.ScrapeOptions(), block_heavy=True, proxy=proxy
        )
    else:
        context = await browser.new_context(**context_kw)
    try:
        for url in pages:
            page = await context.new_page()
            try:
                await page.goto(url, timeout=30_000)
                await page.wait_for_selector(SELECTOR, timeout=30_000)
                timing = await page.evaluate(_TIMINGS)
            finally:
                await page.close()
            got["html"] += [float(x) for x in timing["nav"]]
            for name, duration in timing["res"]:
                kind = kind_of(urlsplit(str(name)).path)
                if kind in got:
                    got[kind].append(float(duration))
    finally:
        await context.close()
    return got


async def _latency(
    base: str, pages: int, site_pages: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, int]]]:
    """Milliseconds by side and resource kind, and the guard proxy's counters by side
    (connections accepted, requests authorized, 407 answers)."""
    from playwright.async_api import async_playwright

    from pagesift.primary.engine.browser.guardproxy import (
        GuardProxy,
        guarded_context_options,
        launch_proxy,
    )
    from pagesift.primary.engine.browser.pool import LAUNCH_ARGS
    from pagesift.primary.engine.netguard import AddressGuard

    site = urlsplit(base)
    guard = AddressGuard(exempt=frozenset({(str(site.hostname), int(site.port or 80))}))
    proxy = GuardProxy(guard)
    await proxy.start()
    out: dict[str, dict[str, list[float]]] = {
        s: {k: [] for k in ("html", *SUBRESOURCES)} for s in LATENCY_SIDES
    }
    counters = {s: dict.fromkeys(("connections", "requests", "unauthorized"), 0) for s in out}
    exe = browser_path()
    try:
        async with async_playwright() as pw:
            direct = await pw.chromium.launch(executable_path=exe, args=list(LAUNCH_ARGS))
            launch: Any = launch_proxy(proxy.server)  # Playwright's ProxySettings
            guarded = await pw.chromium.launch(
                executable_path=exe, args=list(LAUNCH_ARGS), proxy=launch
            )
            try:
                per_round = max(1, pages // LATENCY_ROUNDS)
                n = 0
                for r in range(LATENCY_ROUNDS):
                    order = LATENCY_SIDES[r % 3 :] + LATENCY_SIDES[: r % 3]
                    for side in order:
                        urls = [f"{base}/p/{(n + i) % site_pages}" for i in range(per_round)]
                        n += per_round
                        if side == "direct":
                            got = await _latency_round(direct, {}, False, urls)
                        else:
                            creds = proxy.register()
                            seen = proxy.stats()
                            try:
                                kw = guarded_context_options(creds)
                                got = await _latency_round(guarded, kw, side != "guard proxy", urls)
                            finally:
                                proxy.release(creds)
                            after = proxy.stats()
                            for key in ("connections", "requests", "unauthorized"):
                                counters[side][key] += getattr(after, key) - getattr(seen, key)
                        for kind, values in got.items():
                            out[side][kind] += values
            finally:
                await direct.close()
                await guarded.close()
    finally:
        await proxy.close()
    return out, counters


def _pct(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def subresource_latency(base: str, pages: int, site_pages: int, timeout: float) -> dict[str, Any]:
    """Sub-resource latency per side (module docstring, 2), ``pages`` per side of the
    site's ``site_pages``: per kind and pooled, in milliseconds; within ``timeout`` s."""

    async def bounded() -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, int]]]:
        async with asyncio.timeout(timeout):
            return await _latency(base, pages, site_pages)

    raw, proxy_counters = asyncio.run(bounded())
    sides: dict[str, Any] = {}
    for side, kinds in raw.items():
        pooled = [v for k in SUBRESOURCES for v in kinds[k]]
        sides[side] = {
            "requests": len(pooled),
            "median_ms": _pct(pooled, 0.5),
            "p90_ms": _pct(pooled, 0.9),
            "by_kind": {
                k: {"n": len(v), "median_ms": _pct(v, 0.5), "p90_ms": _pct(v, 0.9)}
                for k, v in kinds.items()
            },
            "guard_proxy": proxy_counters[side],
        }
    return {"pages_per_side": max(1, pages // LATENCY_ROUNDS) * LATENCY_ROUNDS, "sides": sides}


# ---------------------------------------------------------------------------- section


def _say_result(r: dict[str, Any]) -> None:
    by_kind = r.get("cpu_ms_per_page_by_kind", {})
    split = " ".join(f"{k} {by_kind[k]:.0f}" for k in KINDS if by_kind.get(k))
    say(
        f"render: {r['crawler']} {r['engine']} c={r['concurrency']}: {r['pages']} pages "
        f"({r['correct']} with marker) in {r['wall_s']:.2f}s = {r['pages_per_s']:.1f}/s, "
        f"CPU {r['cpu_s_per_page'] * 1000:.0f} ms/page ({split}), "
        f"peak PSS {r['peak_pss_mb']:.0f} MB, {r['subrequests_per_page']:.2f} sub-requests "
        f"and {r['connections_per_page']:.2f} connections a page"
    )


def _js_level(
    sides: Sequence[str],
    programs: dict[str, Path],
    urls: dict[str, str],
    c: int,
    timeout: float,
    site: str,
    notes: list[str],
) -> list[dict[str, Any]]:
    """One run of each of ``sides``, in that order, at concurrency ``c``; a failed run
    becomes a note, so the other sides' figures stay."""
    out: list[dict[str, Any]] = []
    for side in sides:
        try:
            if side == "pagesift":
                r = run_pagesift(urls, "browser", c, timeout, site=site)
            else:
                r = run_peer(side, programs[side], urls, c, timeout, site)
        except Exception as exc:  # the other sides' figures still count
            notes.append(f"{side} c={c} failed: {type(exc).__name__}: {exc}")
            say(notes[-1])
            continue
        _say_result(r)
        out.append(r)
    return out


def _wanted(only: str | None) -> list[str]:
    """The JS sides ``--render-only`` asks for (``peer``: scrapy-playwright)."""
    if only in (None, "js"):
        return list(SIDES)
    if only == "peer":
        return ["scrapy-playwright"]
    return [only] if only in SIDES else []


def run(args: argparse.Namespace) -> None:
    from bench.crawl import pagesift_missing
    from bench.tools import (
        DJANGO_DOC_PACKAGE,
        django_docs_root,
        ensure_apt,
        ensure_crawlee,
        ensure_render_peer,
    )

    levels = [int(x) for x in str(args.render_concurrency).split(",") if x.strip()]
    if not levels or min(levels) < 1 or args.render_pages < 1 or not 1 <= args.render_runs <= 9:
        raise SystemExit("need --render-concurrency >= 1, --render-pages >= 1, 1..9 runs")
    if not 1 <= args.render_js_runs <= 9 or args.render_latency_pages < 0:
        raise SystemExit("need 1..9 --render-js-runs and --render-latency-pages >= 0")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    become_subreaper()  # a crawler's orphaned browser processes count (bench.proctree)
    only = args.render_only
    missing = pagesift_missing()
    if missing:
        raise RuntimeError(f"pagesift cannot run: {missing}")
    load_before = os.getloadavg()[0]
    js: list[dict[str, Any]] = []
    notes: list[str] = []
    latency: dict[str, Any] = {}
    sides = _wanted(only)
    with_latency = only in (None, "js", "latency") and args.render_latency_pages > 0
    if sides or with_latency:
        programs: dict[str, Path] = {}
        if "scrapy-playwright" in sides:
            programs["scrapy-playwright"] = ensure_render_peer()
        if "crawlee" in sides:
            programs["crawlee"] = ensure_crawlee()
        with js_site(args.render_pages) as base:
            urls = {f"{base}/p/{n}": marker(n) for n in range(args.render_pages)}
            if "pagesift" in sides:
                control = run_pagesift(urls, "http", max(levels), args.render_timeout, site=base)
                control["crawler"] = CONTROL
                _say_result(control)
                js.append(control)
            for i in range(args.render_js_runs if sides else 0):
                for c in levels:
                    k = i % len(sides)  # each run starts with the next side
                    order = sides[k:] + sides[:k]
                    js += _js_level(order, programs, urls, c, args.render_timeout, base, notes)
            if with_latency:
                latency = subresource_latency(
                    base, args.render_latency_pages, args.render_pages, args.render_timeout
                )
                for side, fig in latency["sides"].items():
                    say(
                        f"render: sub-resource latency {side}: median {fig['median_ms']:.2f} ms, "
                        f"p90 {fig['p90_ms']:.2f} ms over {fig['requests']} requests"
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
    report(args, js, static, detect, latency, notes, load_before)


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


def _browser_version() -> str:
    try:
        return subprocess.run(
            [browser_path(), "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _mid(xs: list[float]) -> float:
    return xs[(len(xs) - 1) // 2]


def _kind_cells(r: dict[str, Any]) -> list[str]:
    by_kind = r.get("cpu_ms_per_page_by_kind", {})
    return [f"{float(by_kind.get(k, 0.0)):.0f}" for k in KINDS]


def _ratios(js_median: list[dict[str, Any]]) -> tuple[list[list[object]], dict[str, Any]]:
    """Per level: pagesift against the best peer (highest pages/s; lowest CPU per page
    and peak PSS), as table rows and as data."""
    rows: list[list[object]] = []
    data: dict[str, Any] = {}
    levels = sorted({int(r["concurrency"]) for r in js_median if r["crawler"] in SIDES})
    for c in levels:
        mine = [r for r in js_median if r["crawler"] == "pagesift" and r["concurrency"] == c]
        peers = [r for r in js_median if r["crawler"] in PEERS and r["concurrency"] == c]
        if not mine or not peers:
            continue
        p = mine[0]
        fast = max(peers, key=lambda r: float(r["pages_per_s"]))
        lean = min(peers, key=lambda r: float(r["cpu_s_per_page"]))
        small = min(peers, key=lambda r: float(r["peak_pss_mb"]))

        def over(a: float, b: float) -> float:
            return a / b if b > 0 else float("nan")

        got = {
            "pages_per_s": over(p["pages_per_s"], fast["pages_per_s"]),
            "pages_per_s_peer": fast["crawler"],
            "cpu_per_page": over(p["cpu_s_per_page"], lean["cpu_s_per_page"]),
            "cpu_per_page_peer": lean["crawler"],
            "peak_pss": over(p["peak_pss_mb"], small["peak_pss_mb"]),
            "peak_pss_peer": small["crawler"],
        }
        data[str(c)] = got
        rows.append(
            [
                c,
                f"{p['pages_per_s']:.1f} / {fast['pages_per_s']:.1f} ({fast['crawler']})",
                f"**{got['pages_per_s']:.2f}**",
                f"{p['cpu_s_per_page'] * 1000:.0f} / {lean['cpu_s_per_page'] * 1000:.0f} "
                f"({lean['crawler']})",
                f"**{got['cpu_per_page']:.2f}**",
                f"{p['peak_pss_mb']:.0f} / {small['peak_pss_mb']:.0f} ({small['crawler']})",
                f"**{got['peak_pss']:.2f}**",
            ]
        )
    return rows, data


def _latency_lines(latency: dict[str, Any]) -> list[str]:
    if not latency:
        return []
    rows = []
    for side, fig in latency["sides"].items():
        kinds = fig["by_kind"]
        rows.append(
            [
                side,
                fig["requests"],
                f"{fig['median_ms']:.2f}",
                f"{fig['p90_ms']:.2f}",
                *(f"{kinds[k]['median_ms']:.2f} / {kinds[k]['p90_ms']:.2f}" for k in SUBRESOURCES),
                f"{kinds['html']['median_ms']:.2f}",
                "-"
                if side == "direct"
                else "{connections} / {requests} / {unauthorized}".format(**fig["guard_proxy"]),
            ]
        )
    return [
        f"Sub-resource latency: {latency['pages_per_side']} pages per side, one at a time, in "
        f"{LATENCY_ROUNDS} alternating rounds (one context per side and round); Resource "
        "Timing `duration` of each page's stylesheet, script and JSON as chromium reports it.",
        "",
        markdown_table(
            [
                "side",
                "requests",
                "median ms",
                "p90 ms",
                "css median / p90",
                "js median / p90",
                "JSON median / p90",
                "HTML (navigation) median",
                "proxy conn. / req. / 407",
            ],
            rows,
        ),
        "",
    ]


def report(
    args: argparse.Namespace,
    js: list[dict[str, Any]],
    static: list[dict[str, Any]],
    detect: dict[str, Any],
    latency: dict[str, Any],
    notes: list[str],
    load_before: float,
) -> None:
    from bench.tools import (
        PLAYWRIGHT_VERSION,
        SCRAPY_PLAYWRIGHT_VERSION,
        SCRAPY_VERSION,
        crawlee_versions,
    )

    facts = {**machine_facts(), "loadavg_1m_before": load_before, "tree": _tree_state()}
    command = shlex.join([".venv/bin/python", "-m", "bench.run", *sys.argv[1:]])
    md = ["## Render: browser engine vs scrapy-playwright and Crawlee; AUTO vs HTTP", ""]
    ratio: float | None = None
    cpu_ratio = float("nan")
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in js:
        groups.setdefault((r["crawler"], r["engine"], r["concurrency"]), []).append(r)
    js_median = [(_median(g), g) for g in groups.values()]
    ratio_rows, ratio_data = _ratios([r for r, _ in js_median])
    if js:
        md += [
            f"JS site: {args.render_pages} pages on 127.0.0.1 (aiohttp, child process), each "
            "an empty root with a stylesheet and an external script that, after `load`, "
            "`fetch()`es the page's JSON and fills it with a marker text and script-added "
            f"links (three no-store sub-resources a page); every crawler waits for "
            f"`{SELECTOR}` on Debian's chromium-headless-shell. Correct = marker in the "
            f"document. {args.render_js_runs} run(s) per side and level (median by pages/s). "
            "CPU: user+sys of the whole process tree over the crawl window, in ms per page, "
            "then split by process kind (" + "; ".join(KIND_LABELS[k] for k in KINDS) + ").",
            "",
            markdown_table(
                [
                    "crawler",
                    "engine",
                    "conc.",
                    "pages",
                    "correct",
                    "pages/s",
                    "CPU ms/page",
                    "browser",
                    "renderers",
                    "other chromium",
                    "driver",
                    "crawler",
                    "crawler's children",
                    "peak PSS MB",
                    "sub-req./page",
                    "conn./page",
                    "runs pages/s",
                ],
                [
                    [
                        r["crawler"],
                        r["engine"],
                        r["concurrency"],
                        r["pages"],
                        r["correct"],
                        f"{r['pages_per_s']:.1f}",
                        f"{r['cpu_s_per_page'] * 1000:.0f}",
                        *_kind_cells(r),
                        f"{r['peak_pss_mb']:.0f}",
                        f"{r['subrequests_per_page']:.2f}",
                        f"{r['connections_per_page']:.2f}",
                        " ".join(f"{x['pages_per_s']:.1f}" for x in group),
                    ]
                    for r, group in js_median
                ],
            ),
            "",
        ]
        if ratio_rows:
            md += [
                "pagesift against the best peer at each level (pages/s: the fastest; CPU and "
                "memory: the leanest):",
                "",
                markdown_table(
                    [
                        "conc.",
                        "pages/s pagesift / peer",
                        "ratio",
                        "CPU ms/page pagesift / peer",
                        "ratio",
                        "peak PSS MB pagesift / peer",
                        "ratio",
                    ],
                    ratio_rows,
                ),
                "",
            ]
        for r in js:
            if r.get("error_codes"):
                md.append(
                    f"{r['crawler']} {r['engine']} c={r['concurrency']}: errors "
                    f"{r['error_codes']}; e.g. {r['error_examples'][:2]}"
                )
            if r.get("failures"):
                md.append(f"{r['crawler']} c={r['concurrency']}: failed {r['failures'][:2]}")
            if r.get("left_behind"):
                md.append(f"{r['crawler']} c={r['concurrency']}: left {r['left_behind']}")
        md += [f"Note: {n}" for n in notes]
        md.append("")
    md += _latency_lines(latency)
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
        "Window: pagesift StartBatchScrape/StartCrawl -> terminal state (node already up, "
        "browser launched lazily inside the window); scrapy-playwright spider_opened -> "
        "spider_closed; Crawlee around `crawler.run()` (browser launch inside both), each "
        "peer holding at its window's edges while the bench snapshots its tree. Crawlee runs "
        "with its defaults otherwise (fingerprint injection, a browser retired after 100 "
        "pages, a persistent context, its local proxy-chain server as the browser's launch "
        "proxy). Memory: peak over 0.25 s samples of the whole process tree (node, Scrapy or "
        "Crawlee, Playwright driver, browser, renderers; pagesift's extraction workers too): "
        "PSS summed (shared pages once).",
        "",
        f"Machine: {facts['nproc']} CPUs ({facts['cpu_model']}), {facts['mem_total_gb']} GB, "
        f"Linux {facts['kernel']}, Python {facts['python']}; {facts['date']}; load average "
        f"{load_before:.2f} before the runs, {facts['loadavg_1m']:.2f} after (2 cores shared). "
        f"Code: {facts['tree']}.",
        "",
        f"Command: `{command}`",
    ]
    data = {
        "section": "render",
        "command": command,
        "machine": facts,
        "peer": {
            "scrapy": SCRAPY_VERSION,
            "scrapy-playwright": SCRAPY_PLAYWRIGHT_VERSION,
            "playwright": PLAYWRIGHT_VERSION,
        },
        "crawlee": crawlee_versions(),
        "browser": _browser_version(),
        "cpu_kinds": KIND_LABELS,
        "js_pages": args.render_pages,
        "js_results": [r for r, _ in js_median],
        "js_all_runs": js,
        "pagesift_over_best_peer": ratio_data,
        "subresource_latency": latency,
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
