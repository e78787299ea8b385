"""Crawl benchmark: pagesift against Scrapy on the same local static site, same concurrency.

The sites (``--site``, a comma list runs several, each with its own nginx, runs and
table): Django's HTML documentation (Debian's ``python-django-doc``, the default), the
PostgreSQL 15 docs (``postgresql-doc-15``) and the Python 3.11 docs (``python3.11-doc``),
each served from the package's HTML root (``tools.doc_root``: the shallowest
``index.html`` ``dpkg -L`` lists) by a private nginx on 127.0.0.1 (one worker, no access
log); both crawlers start at ``/``, that root's ``index.html``. From it every page is
reachable by ``<a href>`` but for the few no page links to (as shipped: django's
``search.html``, four of python's, none of postgres's); python's ``_static/jquery.js``
and ``underscore.js`` are symlinks into ``/usr/share/javascript``, which nginx follows
(no crawler fetches scripts); python's ``search.html`` (linked from every page) asks for
JavaScript in its ``<noscript>``, so AUTO renders that one page in a browser, whose CPU is
the pagesift split's ``other``. What it measures, per crawler and site:

- pages: HTML pages crawled (Scrapy: lines of its JSON-lines feed; pagesift: ``GetJob.completed``)
- wall s: the crawl window only. Scrapy: spider_opened -> spider_closed, timed inside its
  process (interpreter start-up and imports excluded). pagesift: StartCrawl sent -> terminal
  state seen by ``GetJob`` polled every 50 ms (server start-up excluded).
- CPU s/page: crawler CPU (user + sys) over the same window / pages. Scrapy: its own
  ``getrusage(RUSAGE_SELF)`` delta; pagesift: ``/proc/<pid>/stat`` delta of the server
  and its descendants, split by process (``cpu_split``): the main process (fetch, AUTO,
  record, store) and its extraction workers (the forkserver and its children, reaped
  workers included through the forkserver's ``cutime``/``cstime``).
- peak RSS MB: the crawler process's high-water mark (``VmHWM``, cross-checked with the
  ``wait4`` rusage of the Scrapy child), start-up included for both.
- RSS at 25/50/75/100 % of the pages, from a 10 Hz sampler, to show whether memory grows with
  the crawl.

Both crawlers get ``--concurrency`` in flight (Scrapy: CONCURRENT_REQUESTS and _PER_DOMAIN;
pagesift: ``max_concurrency`` of the job and ``per_host_concurrency`` of the server) and the
same page limit (``--limit``; 0 = the whole site). Scrapy only extracts url/title/length per
page; pagesift converts each page to Markdown and stores it durably, so it does more work
per page. With ``--runs N`` each crawler runs N times (alternating) and the median run by
pages/s is reported, with the ratio pagesift/Scrapy; every run is kept in
``bench/out/crawl-<site>.json`` (and ``crawl.json``/``crawl.md`` for django, the names other
readers know). After the runs ``bench.crawlstages`` adds the site's CPU-per-stage table
(``--stage-passes``; 0 = none) beside the reported pagesift run's main/worker split.
``--profile`` adds one unreported pagesift run under ``py-spy record`` and summarizes where
the server's time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from bench.common import (
    BENCH_DIR,
    LOOPBACK,
    MB,
    OUT_DIR,
    REPO_DIR,
    ProcessSampler,
    descendant_pids,
    free_port,
    machine_facts,
    markdown_table,
    memory_bytes,
    say,
    start_serve,
    stop_process,
    stop_serve,
    subtree_peak_rss,
    wait_for_grpc,
    wait_rusage,
    write_json,
)
from bench.nginx import Nginx
from bench.tools import (
    DOC_SITES,
    SCRAPY_VERSION,
    doc_root,
    ensure_apt,
    ensure_scrapy_venv,
    py_spy_path,
)

CRAWLERS = ("scrapy", "pagesift")
PROGRESS_POINTS = (0.25, 0.5, 0.75, 1.0)
POLL_INTERVAL = 0.05
SERVER_READY_TIMEOUT = 60.0
SKIP_ALL = 2**31 - 1  # GetJob skip past the end: status only, no documents
GRPC_OPTIONS = [("grpc.max_receive_message_length", 256 * MB)]
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Site:
    """A crawl site: its ``--site`` name, what it is, its Debian package and HTML root."""

    name: str
    title: str
    package: str
    root: Path

    def out(self, stem: str, suffix: str) -> Path:
        """``bench/out/<stem>-<site><suffix>``: one file per site."""
        return OUT_DIR / f"{stem}-{self.name}{suffix}"


def parse_sites(value: str) -> list[str]:
    """``--site``'s comma list: known names, in order, each once."""
    names: list[str] = []
    for raw in value.split(","):
        name = raw.strip()
        if name not in DOC_SITES:
            raise SystemExit(f"--site: {name!r} is not one of {', '.join(DOC_SITES)}")
        if name not in names:
            names.append(name)
    return names


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("crawl section")
    g.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    g.add_argument("--limit", type=int, default=0, help="most pages per crawl; 0 = whole site")
    g.add_argument("--only", choices=CRAWLERS, help="run one crawler only (default both)")
    g.add_argument("--runs", type=int, default=1, help="runs per crawler; median reported")
    g.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per crawl")
    g.add_argument(
        "--profile", action="store_true", help="extra pagesift run under py-spy (not reported)"
    )
    g.add_argument(
        "--site",
        default="django",
        help=f"site(s) to crawl, comma-separated: {', '.join(DOC_SITES)} (default django)",
    )
    g.add_argument(
        "--stage-passes",
        type=int,
        default=3,
        help="passes of the CPU-per-stage table (bench.crawlstages), best reported; 0 = none",
    )


def run(args: argparse.Namespace) -> None:
    crawlers = [args.only] if args.only else list(CRAWLERS)
    if args.concurrency < 1 or args.limit < 0 or not 1 <= args.runs <= 20:
        raise SystemExit("need --concurrency >= 1, --limit >= 0, 1 <= --runs <= 20")
    if not 0 <= args.stage_passes <= 20:
        raise SystemExit("need 0 <= --stage-passes <= 20")
    names = parse_sites(args.site)
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    say("crawl: ensuring tools")
    ensure_apt(["nginx", *(DOC_SITES[n][1] for n in names)])
    sites = [Site(n, DOC_SITES[n][0], DOC_SITES[n][1], doc_root(DOC_SITES[n][1])) for n in names]
    scrapy_python: Path | None = None
    if "scrapy" in crawlers or args.profile:
        scrapy_python = ensure_scrapy_venv(with_py_spy=args.profile)
    skipped: dict[str, str] = {}
    if "pagesift" in crawlers:
        missing = pagesift_missing()
        if missing:
            say(f"crawl: skipping pagesift: {missing}")
            skipped["pagesift"] = missing
            crawlers.remove("pagesift")
    for site in sites:
        run_site(site, args, crawlers, scrapy_python, skipped)


def run_site(
    site: Site,
    args: argparse.Namespace,
    crawlers: list[str],
    scrapy_python: Path | None,
    skipped: dict[str, str],
) -> None:
    """The runs on one site, its stage table, its report (``crawl-<site>.md``/``.json``)."""
    warm_page_cache(site.root)
    load_before = os.getloadavg()[0]
    if load_before > 0.5:
        say(f"crawl: note: 1-min load average is {load_before:.2f}; figures may be noisy")
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in crawlers}
    profile: dict[str, Any] | None = None
    with Nginx(site.root) as web:
        for i in range(args.runs):
            order = crawlers if i % 2 == 0 else crawlers[::-1]
            for name in order:
                say(f"crawl: {site.name}: {name} run {i + 1}/{args.runs} of {web.url}")
                if name == "scrapy":
                    assert scrapy_python is not None
                    result = run_scrapy(scrapy_python, web, args, site)
                else:
                    result = run_pagesift(web, args, site)
                say(
                    f"crawl: {site.name}: {name}: {result['pages']} pages in "
                    f"{result['wall_s']:.2f}s ({result['pages_per_s']:.1f}/s, "
                    f"{result['cpu_s']:.2f} CPU s, peak RSS {result['peak_rss_mb']:.0f} MB)"
                )
                runs[name].append(result)
        if args.profile and "pagesift" in crawlers:
            profile = run_pagesift(web, args, site, profile_out=site.out("pagesift-profile", ""))

    stages: dict[str, Any] | None = None
    if args.stage_passes:
        from bench.crawlstages import measure

        reported = _median_run(runs["pagesift"]) if runs.get("pagesift") else None
        stages = measure(site.name, site.root, args.stage_passes, reported)
    report = build_report(args, site, runs, skipped, profile, load_before, stages)
    outs = [site.out("crawl", ".md")]
    write_json(site.out("crawl", ".json"), report["json"])
    if site.name == "django":  # the names the other sections and readers know
        write_json(OUT_DIR / "crawl.json", report["json"])
        outs.append(OUT_DIR / "crawl.md")
    for path in outs:
        path.write_text(report["markdown"] + "\n")
    print(report["markdown"], flush=True)
    say(f"crawl: {site.name}: wrote {', '.join(str(p) for p in outs)} and the .json")


def warm_page_cache(root: Path, max_bytes: int = 1 << 30) -> None:
    """Read the site once so no crawler pays for cold disk reads (at most ``max_bytes``)."""
    total = files = 0
    for path in root.rglob("*"):
        if total >= max_bytes:
            break
        with contextlib.suppress(OSError):
            if path.is_file():
                total += len(path.read_bytes())
                files += 1
    say(f"crawl: page cache warmed ({files} files, {total / MB:.0f} MB)")


def pagesift_missing() -> str:
    """Why the pagesift server cannot be started yet, or '' if it can."""
    for mod in ("pagesift.cli", "pagesift.node.grpcserver"):
        try:
            if importlib.util.find_spec(mod) is None:
                return f"module {mod} does not exist yet"
        except ImportError as exc:
            return f"cannot import {mod}: {exc}"
    return ""


# ---------------------------------------------------------------------------- scrapy


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 16), b""))
    except OSError:
        return 0


def run_scrapy(python: Path, web: Nginx, args: argparse.Namespace, site: Site) -> dict[str, Any]:
    feed = site.out("scrapy-items", ".jsonl")
    stats_path = site.out("scrapy-stats", ".json")
    log_path = site.out("scrapy", ".log")
    for p in (feed, stats_path):
        p.unlink(missing_ok=True)
    cmd = [
        str(python),
        str(BENCH_DIR / "scrapy_spider.py"),
        "--url",
        web.url,
        "--concurrency",
        str(args.concurrency),
        "--limit",
        str(args.limit),
        "--timeout",
        str(args.timeout),
        "--feed",
        str(feed),
        "--stats",
        str(stats_path),
    ]
    say("$ " + shlex.join(cmd))
    nginx_cpu0 = web.cpu_seconds()
    t0 = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_DIR)
        sampler = ProcessSampler(proc.pid, progress=lambda: _count_lines(feed)).start()
        try:
            usage = wait_rusage(proc, timeout=args.timeout + 120)
        finally:
            sampler.stop()
            if proc.poll() is None:
                stop_process(proc)
    process_wall = time.monotonic() - t0
    nginx_cpu = web.cpu_seconds() - nginx_cpu0
    if usage.returncode != 0 or not stats_path.exists():
        raise RuntimeError(f"scrapy failed (exit {usage.returncode}); see {log_path}")
    stats = json.loads(stats_path.read_text())
    scrapy_stats: dict[str, Any] = stats["scrapy_stats"]
    pages = _count_lines(feed)
    unique = set()
    for line in feed.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):
            unique.add(json.loads(line)["url"])
    wall = float(stats["crawl_wall_s"])
    cpu = float(stats["crawl_cpu_s"])
    peak = max(usage.maxrss_bytes, sampler.peak_rss_bytes)
    return {
        "crawler": "scrapy",
        "version": SCRAPY_VERSION,
        "pages": pages,
        "failed": int(scrapy_stats.get("httperror/response_ignored_count", 0))
        + int(scrapy_stats.get("downloader/exception_count", 0)),
        "unique_urls": len(unique),
        "non_html": int(scrapy_stats.get("bench/non_html", 0)),
        "responses": int(scrapy_stats.get("response_received_count", 0)),
        "finish_reason": stats["reason"],
        "wall_s": wall,
        "pages_per_s": pages / wall if wall > 0 else 0.0,
        "cpu_s": cpu,
        "cpu_s_per_page": cpu / pages if pages else 0.0,
        "process_wall_s": process_wall,
        "process_cpu_s": usage.cpu_s,
        "peak_rss_mb": peak / MB,
        "rss_at_progress": sampler.at_progress(PROGRESS_POINTS),
        "nginx_cpu_s": nginx_cpu,
        "command": shlex.join(cmd),
        "log": str(log_path),
    }


# ---------------------------------------------------------------------------- pagesift


def _server_config(tmp: Path, concurrency: int, extra: Sequence[str] = ()) -> Path:
    conf = tmp / "server.toml"
    lines = ["[server]", f"per_host_concurrency = {concurrency}", *extra]
    if concurrency > 64:  # ServerConfig.max_concurrency default
        lines.append(f"max_concurrency = {concurrency}")
    conf.write_text("\n".join(lines) + "\n")
    return conf


@dataclass
class Server:
    """A running ``pagesift serve`` child and a sync stub on it."""

    proc: subprocess.Popen[bytes]
    stub: Any  # jobs_pb2_grpc.JobServiceStub
    target: str
    command: str
    ready_s: float
    exit_code: int | None = None  # set once the server has stopped


@contextlib.contextmanager
def pagesift_server(
    concurrency: int, log_path: Path, extra_config: Sequence[str] = ()
) -> Iterator[Server]:
    """``pagesift serve --role primary`` on a free loopback port with a fresh data
    directory and the crawl section's config (``per_host_concurrency`` = ``concurrency``,
    plus ``extra_config``: TOML lines of the ``[server]`` table), stopped (SIGTERM, then
    SIGKILL after 20 s) on exit."""
    from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

    with tempfile.TemporaryDirectory(prefix="bench-pagesift-") as tmpname:
        tmp = Path(tmpname)
        target = f"{LOOPBACK}:{free_port()}"
        args = [
            "--role",
            "primary",
            "--listen",
            target,
            "--data",
            str(tmp / "data"),
            "--allow-private-networks",
            "--config",
            str(_server_config(tmp, concurrency, extra_config)),
        ]
        child = start_serve("pagesift server", args, log_path)
        assert child.proc is not None
        proc = child.proc
        channel = grpc.insecure_channel(target, options=GRPC_OPTIONS)
        server: Server | None = None
        try:
            stub = jobs_pb2_grpc.JobServiceStub(channel)
            ready_s = wait_for_grpc(
                channel,
                lambda: stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=2),
                SERVER_READY_TIMEOUT,
                proc,
            )
            server = Server(proc, stub, target, shlex.join(child.argv), ready_s)
            yield server
        finally:
            channel.close()
            code = stop_serve(child, grace=20)
            if server is not None:
                server.exit_code = code
            say(f"pagesift server stopped (exit {code})")


def cpu_split(pid: int, others: dict[str, float] | None = None) -> dict[str, float]:
    """CPU seconds so far of the server ``pid`` by process: ``main`` (its own utime +
    stime), ``workers`` (the forkserver and every descendant of it: the extraction
    workers, with the CPU of those already reaped through their parent's cutime +
    cstime) and ``other`` (any other descendant, e.g. a browser AUTO started, likewise;
    ``others``, when given, gets that CPU by program name: ``argv[0]``'s basename)."""
    out = {"main": 0.0, "workers": 0.0, "other": 0.0}
    with contextlib.suppress(OSError, ValueError, IndexError):
        out["main"] = _stat_cpu(pid, children=False)
    for p in descendant_pids(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            cpu = _stat_cpu(p, children=True)
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes()
            if b"forkserver" in cmdline:
                out["workers"] += cpu
                continue
            out["other"] += cpu
            if others is not None:
                # argv[0]'s basename (a program that rewrote its title: its first word)
                first = cmdline.split(b"\0", 1)[0].split(b" ", 1)[0]
                name = os.path.basename(first.decode(errors="replace"))
                others[name or "?"] = others.get(name or "?", 0.0) + cpu
    return out


def _stat_cpu(pid: int, *, children: bool) -> float:
    """utime + stime of ``pid`` (+ cutime + cstime: its reaped children's, with
    ``children``) from ``/proc/<pid>/stat``."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    rest = raw[raw.rindex(")") + 2 :].split()  # comm may hold spaces and parens
    fields = rest[11:15] if children else rest[11:13]  # stat(5) fields 14-17
    return sum(int(f) for f in fields) / _CLK_TCK


def run_pagesift(
    web: Nginx, args: argparse.Namespace, site: Site, profile_out: Path | None = None
) -> dict[str, Any]:
    from pagesift.v1 import jobs_pb2

    terminal = {
        jobs_pb2.JOB_STATE_COMPLETED,
        jobs_pb2.JOB_STATE_FAILED,
        jobs_pb2.JOB_STATE_CANCELLED,
    }
    log_path = site.out("pagesift-profile-server" if profile_out else "pagesift-server", ".log")
    with pagesift_server(args.concurrency, log_path) as server:
        proc, stub = server.proc, server.stub
        spy: subprocess.Popen[bytes] | None = None
        try:
            if profile_out is not None:
                spy = _start_py_spy(proc.pid, profile_out)
            progress = [0]
            sampler = ProcessSampler(proc.pid, progress=lambda: progress[0])
            _, idle_hwm = memory_bytes(proc.pid)
            nginx_cpu0 = web.cpu_seconds()
            others0: dict[str, float] = {}
            cpu0 = cpu_split(proc.pid, others0)  # + extraction workers
            sampler.start()
            t0 = time.monotonic()
            started = stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(
                    url=web.url,
                    limit=args.limit,
                    max_concurrency=args.concurrency,
                    options=jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_MARKDOWN]),
                ),
                timeout=30,
            )
            job = _poll_job(stub, started.id, terminal, progress, args.timeout)
            wall = time.monotonic() - t0
            others1: dict[str, float] = {}
            cpu1 = cpu_split(proc.pid, others1)
            split = {k: cpu1[k] - cpu0[k] for k in cpu1}
            others = {k: v - others0.get(k, 0.0) for k, v in others1.items()}
            cpu = sum(split.values())
            nginx_cpu = web.cpu_seconds() - nginx_cpu0
            sampler.stop()
            hwm = subtree_peak_rss(proc.pid)  # + extraction workers
            if spy is not None and profile_out is not None:
                profile = _stop_py_spy(spy, profile_out)
                spy = None
                return {"crawler": "pagesift", "profile": profile, "pages": job.completed}
            errors = _all_errors(stub, started.id)
            urls, markdown_bytes, empty_markdown = _job_documents(stub, started.id)
        finally:
            if spy is not None:
                stop_process(spy)
    pages = int(job.completed)
    codes = Counter(e.code for e in errors.errors)
    result: dict[str, Any] = {
        "crawler": "pagesift",
        "pages": pages,
        "failed": int(job.failed),
        "state": jobs_pb2.JobState.Name(job.state),
        "note": job.note,
        "error_codes": dict(codes),
        "error_examples": _error_examples(errors.errors),
        "robots_blocked": len(errors.robots_blocked),
        "wall_s": wall,
        "pages_per_s": pages / wall if wall > 0 else 0.0,
        "cpu_s": cpu,
        "cpu_s_per_page": cpu / pages if pages else 0.0,
        "main_cpu_s": split["main"],
        "workers_cpu_s": split["workers"],
        "other_cpu_s": split["other"],
        "other_cpu_s_by_program": {k: round(v, 3) for k, v in others.items() if v > 0},
        "server_ready_s": server.ready_s,
        "idle_rss_mb": idle_hwm / MB,
        "peak_rss_mb": max(hwm, sampler.peak_rss_bytes) / MB,
        "rss_at_progress": sampler.at_progress(PROGRESS_POINTS),
        "nginx_cpu_s": nginx_cpu,
        "server_exit_code": server.exit_code,
        "command": server.command,
        "log": str(log_path),
        "document_urls": len(urls),
        "markdown_mb": markdown_bytes / MB,
        "empty_markdown": empty_markdown,
        "other_origin_documents": sorted(u for u in urls if not u.startswith(web.url))[:20],
    }
    _compare_with_scrapy(urls, result, site.out("scrapy-items", ".jsonl"))
    return result


def _poll_job(
    stub: Any,
    job_id: str,
    terminal: Collection[int],
    progress: list[int],
    timeout: float,
) -> Any:
    """GetJob every POLL_INTERVAL s (status only) until a terminal state; bounded."""
    from pagesift.v1 import jobs_pb2

    deadline = time.monotonic() + timeout
    while True:
        try:
            # skip past the end: status only, no document to serialize while running
            job = stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=SKIP_ALL, limit=1), timeout=30)
        except grpc.RpcError as exc:
            # a terminal job refuses a skip past its end (OUT_OF_RANGE): ask from the start
            if exc.code() not in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT):
                raise
            job = stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=0, limit=1), timeout=30)
        progress[0] = int(job.completed)
        if job.state in terminal:
            return job
        if time.monotonic() > deadline:
            stub.CancelJob(jobs_pb2.CancelJobRequest(id=job_id), timeout=30)
            raise TimeoutError(f"pagesift crawl {job_id} not done after {timeout:.0f}s")
        time.sleep(POLL_INTERVAL)


def _job_documents(stub: Any, job_id: str) -> tuple[list[str], int, int]:
    """Every document URL of the job, total Markdown bytes and how many documents have no
    Markdown; paged 200 at a time after the timed window (bounded)."""
    from pagesift.v1 import jobs_pb2

    urls: list[str] = []
    md_bytes = empty = 0
    skip = 0
    for _ in range(10_000):
        resp = stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=200), timeout=60)
        for d in resp.documents:
            urls.append(d.url)
            md_bytes += len(d.markdown.encode())
            empty += not d.markdown.strip()
        if not resp.HasField("next_skip") or not resp.documents:
            break
        skip = resp.next_skip
    return urls, md_bytes, empty


def _all_errors(stub: Any, job_id: str) -> Any:
    """Every page of the job's errors (GetJobErrors pages them, AIP-158)."""
    from pagesift.v1 import jobs_pb2

    out = jobs_pb2.GetJobErrorsResponse()
    token = ""
    while True:
        req = jobs_pb2.GetJobErrorsRequest(id=job_id, page_size=1000, page_token=token)
        page = stub.GetJobErrors(req, timeout=60)
        out.errors.extend(page.errors)
        out.robots_blocked.extend(page.robots_blocked)
        if not page.next_page_token:
            return out
        token = page.next_page_token


def _error_examples(errors: Any, per_code: int = 5) -> list[str]:
    """Up to ``per_code`` ``url code message`` lines for each error code."""
    seen: Counter[str] = Counter()
    out: list[str] = []
    for e in errors:
        seen[e.code] += 1
        if seen[e.code] <= per_code:
            out.append(f"{e.url} {e.code} {e.message}")
    return out


def _page_key(url: str) -> str:
    """Path + query with pagesift's page-key rule (``/a/``, ``/a/index.html`` -> ``/a``), so
    the two crawlers' URL sets compare page by page; the port is dropped because each bench
    invocation has its own nginx."""
    parts = urlsplit(url)
    path = parts.path
    for suffix in ("index.html", "index.htm"):
        if path.endswith("/" + suffix):
            path = path[: -len(suffix)]
    if len(path) > 1:
        path = path.rstrip("/")
    return path + (f"?{parts.query}" if parts.query else "")


def _compare_with_scrapy(urls: list[str], result: dict[str, Any], feed: Path) -> None:
    """Diff pagesift's document URLs against the site's last Scrapy feed, if there is one."""
    if not feed.exists():
        return
    # Each bench invocation has its own nginx port: compare path + query.
    scrapy_urls = set()
    for line in feed.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):
            scrapy_urls.add(_page_key(json.loads(line)["url"]))
    mine = {_page_key(u) for u in urls}
    result["duplicate_document_urls"] = len(urls) - len(set(urls))
    result["only_in_pagesift"] = sorted(mine - scrapy_urls)[:20]
    result["only_in_scrapy"] = sorted(scrapy_urls - mine)[:20]
    result["only_in_pagesift_count"] = len(mine - scrapy_urls)
    result["only_in_scrapy_count"] = len(scrapy_urls - mine)


# ---------------------------------------------------------------------------- profiling


def _start_py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    cmd = [
        str(py_spy_path()),
        "record",
        "--pid",
        str(pid),
        "--rate",
        "250",
        "--format",
        "raw",
        "--output",
        str(out.with_suffix(".txt")),
        "--nonblocking",
    ]
    say("$ " + shlex.join(cmd))
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # let it attach
    if spy.poll() is not None:
        err = spy.stderr.read().decode() if spy.stderr else ""
        raise RuntimeError(f"py-spy exited {spy.returncode}: {err}")
    return spy


def _stop_py_spy(spy: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    spy.send_signal(signal.SIGINT)
    try:
        _, err = spy.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        spy.kill()
        _, err = spy.communicate(timeout=10)
    raw = out.with_suffix(".txt")
    if not raw.exists():
        return {"error": err.decode(errors="replace")[-2000:]}
    summary = summarize_collapsed(raw.read_text().splitlines())
    md = ["# pagesift server profile (py-spy, one crawl)", ""]
    for title, key in (("self time", "self"), ("inclusive time", "inclusive")):
        md += [f"## Top frames by {title}", ""]
        md.append(
            markdown_table(
                ["%", "samples", "frame"],
                [[f"{pct:.1f}", n, frame] for frame, n, pct in summary[key]],
            )
        )
        md.append("")
    out.with_suffix(".md").write_text("\n".join(md))
    say(f"crawl: profile in {out.with_suffix('.md')} (raw stacks {raw})")
    return {
        "raw": str(raw),
        "summary": str(out.with_suffix(".md")),
        "samples": summary["total"],
        "top_self": [f"{pct:.0f}% {frame}" for frame, _, pct in summary["self"][:8]],
    }


def summarize_collapsed(lines: list[str], top: int = 30) -> dict[str, Any]:
    """Self and inclusive sample counts per frame (``func (file)``) from collapsed stacks."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_key(f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n

    def rows(c: Counter[str]) -> list[tuple[str, int, float]]:
        return [(f, n, 100.0 * n / total) for f, n in c.most_common(top)] if total else []

    return {"total": total, "self": rows(own), "inclusive": rows(incl)}


def _frame_key(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``; thread/process headers kept."""
    name, _, where = frame.partition(" (")
    if not where:
        return frame
    path = where.rstrip(")").rsplit(":", 1)[0]
    short = "/".join(Path(path).parts[-2:])
    return f"{name} ({short})"


# ---------------------------------------------------------------------------- report


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: float(r["pages_per_s"]))
    return ordered[(len(ordered) - 1) // 2]  # lower median: always a real run


def build_report(
    args: argparse.Namespace,
    site: Site,
    runs: dict[str, list[dict[str, Any]]],
    skipped: dict[str, str],
    profile: dict[str, Any] | None,
    load_before: float,
    stages: dict[str, Any] | None = None,
) -> dict[str, Any]:
    facts = {**machine_facts(), "loadavg_1m_before": load_before}
    command = shlex.join([".venv/bin/python", "-m", "bench.run", *sys.argv[1:]])
    html_files = sum(1 for _ in site.root.rglob("*.html"))
    chosen = {name: _median_run(rs) for name, rs in runs.items() if rs}
    how = f"median of {args.runs} runs by pages/s" if args.runs > 1 else "single run"
    rows = [
        [
            name,
            r["pages"],
            f"{r['wall_s']:.2f}",
            f"{r['pages_per_s']:.1f}",
            f"{r['cpu_s_per_page'] * 1000:.2f}",
            f"{r['peak_rss_mb']:.0f}",
        ]
        for name, r in chosen.items()
    ]
    md = [
        f"## Crawl: pagesift vs Scrapy ({site.name})",
        "",
        f"Site: {site.title} ({site.package}, {html_files} .html files under {site.root}) "
        f"from nginx on 127.0.0.1, 1 worker. Concurrency {args.concurrency}, limit "
        f"{args.limit or 'none (whole site)'}; {how}.",
        "",
        markdown_table(
            ["crawler", "pages", "wall s", "pages/s", "CPU ms/page", "peak RSS MB"], rows
        ),
        "",
    ]
    ratio = cpu_ratio = None
    if "scrapy" in chosen and "pagesift" in chosen and chosen["scrapy"]["pages_per_s"] > 0:
        ratio = chosen["pagesift"]["pages_per_s"] / chosen["scrapy"]["pages_per_s"]
        line = f"pagesift/scrapy pages/s: **{ratio:.2f}x**"
        if chosen["scrapy"]["cpu_s_per_page"] > 0:
            cpu_ratio = chosen["pagesift"]["cpu_s_per_page"] / chosen["scrapy"]["cpu_s_per_page"]
            line += f"; CPU ms/page: {cpu_ratio:.2f}x"
        md.append(line)
        md.append("")
    rss_rows = []
    for name, r in chosen.items():
        pts = {p["fraction"]: p["rss_mb"] for p in r.get("rss_at_progress", [])}
        rss_rows.append([name, *(f"{pts.get(f, float('nan')):.0f}" for f in PROGRESS_POINTS)])
    if rss_rows:
        md += [
            "RSS (MB) as the crawl progresses (share of final pages):",
            "",
            markdown_table(["crawler", "25%", "50%", "75%", "100%"], rss_rows),
            "",
        ]
    for name, why in skipped.items():
        md += [f"{name}: not run ({why}).", ""]
    if "pagesift" in chosen:
        p = chosen["pagesift"]
        md.append(
            f"pagesift job: state {p['state']}, {p['failed']} failed "
            f"{p['error_codes'] or ''}, server ready in {p['server_ready_s']:.2f}s, "
            f"idle RSS {p['idle_rss_mb']:.0f} MB."
        )
        if p["pages"]:
            per = {k: p[f"{k}_cpu_s"] * 1000 / p["pages"] for k in ("main", "workers", "other")}
            other = ""
            if per["other"]:
                programs = ", ".join(sorted(p.get("other_cpu_s_by_program", {})))
                other = f", other {per['other']:.2f} ({programs or 'exited'})"
            md.append(
                f"pagesift CPU ms/page by process: main {per['main']:.2f}, extraction "
                f"workers {per['workers']:.2f}{other}."
            )
        if "only_in_scrapy_count" in p:
            md.append(
                f"URL sets vs Scrapy: {p['only_in_pagesift_count']} only in pagesift, "
                f"{p['only_in_scrapy_count']} only in Scrapy (as page keys), "
                f"{p['duplicate_document_urls']} duplicate documents; "
                f"{p['markdown_mb']:.1f} MB of Markdown, {p['empty_markdown']} pages without any."
            )
        md.append("")
    if "scrapy" in chosen:
        s = chosen["scrapy"]
        md.append(
            f"Scrapy {s['version']}: finish reason {s['finish_reason']}, {s['responses']} "
            f"responses, {s['unique_urls']} distinct item URLs, {s['non_html']} non-HTML, "
            f"{s['failed']} failed; whole process "
            f"{s['process_wall_s']:.2f}s wall, {s['process_cpu_s']:.2f} CPU s."
        )
        md.append("")
    if profile and "top_self" in profile.get("profile", {}):
        prof = profile["profile"]
        md += [
            f"pagesift server profile (py-spy, extra unreported run, {prof['samples']} samples; "
            f"{prof['summary']}): " + "; ".join(prof["top_self"]) + ".",
            "",
        ]
    if stages is not None:
        md += [stages["markdown"], ""]
    md += [
        "Wall = crawl window (Scrapy: spider open->close inside its process; pagesift: "
        "StartCrawl->terminal state). CPU and peak RSS = the crawler process plus its "
        "extraction workers (nginx excluded; the RSS-over-time row is the main process). "
        "Scrapy extracts title+length; pagesift renders Markdown and stores each page.",
        "",
        f"Machine: {facts['nproc']} CPUs ({facts['cpu_model']}), {facts['mem_total_gb']} GB, "
        f"Linux {facts['kernel']}, Python {facts['python']}; {facts['date']}; load average "
        f"{load_before:.2f} before the runs.",
        "",
        f"Command: `{command}`",
    ]
    data = {
        "section": "crawl",
        "command": command,
        "machine": facts,
        "site": {
            "name": site.name,
            "title": site.title,
            "package": site.package,
            "root": str(site.root),
            "html_files": html_files,
        },
        "concurrency": args.concurrency,
        "limit": args.limit,
        "runs_per_crawler": args.runs,
        "reported": how,
        "results": chosen,
        "pagesift_over_scrapy_pages_per_s": ratio,
        "pagesift_over_scrapy_cpu_per_page": cpu_ratio,
        "stages": stages["json"] if stages is not None else None,
        "all_runs": runs,
        "skipped": skipped,
        "profile": profile,
    }
    return {"json": data, "markdown": "\n".join(md)}
