"""Section ``freshness``: the page cache (``ScrapeOptions.max_age``) on a re-crawl.

On Django's HTML documentation (Debian's ``python-django-doc``) served by the private
nginx of ``bench/crawl.py`` (``bench.nginx.Nginx``, one worker, on 127.0.0.1), with one
real ``pagesift serve`` child (fresh data directory, the crawl section's server config)
running, after an unreported warm-up crawl of 20 pages without ``max_age`` (so the
extraction workers and connections are up before the first reported run), four crawls
from the index, one after the other, on the unchanged site:

- ``cold``: ``max_age`` = ``--freshness-max-age`` (default 1 day); the cache is empty, so
  every page is fetched and stored in the page cache with its ETag/Last-Modified;
- ``cached``: the same crawl again: every page is younger than ``max_age``, so it should
  come from the cache with no request to the site;
- ``revalidate``: the same crawl with ``max_age`` = 1 ms: every copy is too old, so each
  page is asked for with ``If-None-Match`` / ``If-Modified-Since`` and nginx, serving
  static files, answers ``304 Not Modified`` with no body;
- ``nocache``: the reference, the same crawl without ``max_age`` (the cache is neither
  read nor written, every page fetched), i.e. what the crawl section measures.

What the site saw is counted by nginx itself: for this section it writes an access log
(``Nginx(log_requests=True)``: ``$status $body_bytes_sent $bytes_sent``, the request's
``If-None-Match`` and ``If-Modified-Since`` and the request line, one line per request, to
a file in its temp dir); the lines a crawl added are its requests ("conditional": those
that carried either validator).
That log is the only change from the crawl section's nginx (logging costs nginx a write
per request, the same in every run here). Before the crawls, one plain GET and one
conditional GET of ``/index.html`` check that nginx sends ETag and Last-Modified and
answers 304 (those two requests are not counted in any run).

Per run: pages (``GetJob.completed``), failed, documents with ``cache_hit``, wall s
(StartCrawl sent -> terminal state seen by ``GetJob`` polled every 50 ms, as in the crawl
section), pages/s, server CPU ms/page (the server and its extraction workers), requests
nginx logged (by status), body bytes and bytes sent (headers included), and ratios against
the cold run. ``--limit``, ``--concurrency`` and ``--timeout`` are the crawl section's
flags. Results: ``bench/out/freshness.json`` and ``bench/out/freshness.md``.
"""

from __future__ import annotations

import argparse
import http.client
import os
import time
from collections import Counter
from typing import Any

from bench.common import (
    LOOPBACK,
    MB,
    OUT_DIR,
    machine_facts,
    markdown_table,
    say,
    subtree_cpu_seconds,
    write_json,
)
from bench.crawl import (
    Server,
    _poll_job,
    pagesift_missing,
    pagesift_server,
    warm_page_cache,
)
from bench.nginx import LoggedRequest, Nginx
from bench.tools import DJANGO_DOC_PACKAGE, django_docs_root, ensure_apt

# "nocache" (no max_age) is the reference: the cache neither read nor written
RUNS = ("cold", "cached", "revalidate", "nocache")
WARMUP_PAGES = 20  # an unreported crawl without max_age first: extraction workers started
REVALIDATE_MAX_AGE_MS = 1
DOC_PAGE = 200  # documents per GetJob page when counting cache hits (after the timed window)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("freshness section (also uses --limit, --concurrency, --timeout)")
    g.add_argument(
        "--freshness-max-age",
        type=float,
        default=86400.0,
        help="max_age in seconds of the cold and cached crawls (default 1 day)",
    )


# ---------------------------------------------------------------------------- the server


def request_summary(reqs: list[LoggedRequest]) -> dict[str, Any]:
    """Counts and bytes of nginx access-log lines."""
    return {
        "requests": len(reqs),
        "by_status": {str(k): v for k, v in sorted(Counter(r.status for r in reqs).items())},
        "body_bytes": sum(r.body_bytes for r in reqs),
        "bytes_sent": sum(r.bytes_sent for r in reqs),
        "robots_requests": sum(r.path.startswith("/robots.txt") for r in reqs),
        "conditional_requests": sum(r.conditional for r in reqs),
        "with_if_none_match": sum(bool(r.if_none_match) for r in reqs),
        "with_if_modified_since": sum(bool(r.if_modified_since) for r in reqs),
        "examples_by_status": _examples(reqs),
    }


def _examples(reqs: list[LoggedRequest], per_status: int = 5) -> dict[str, list[str]]:
    """The first ``per_status`` request lines of each status."""
    out: dict[str, list[str]] = {}
    for r in reqs:
        lines = out.setdefault(str(r.status), [])
        if len(lines) < per_status:
            lines.append(r.request)
    return out


# ---------------------------------------------------------------------------- the section


def run(args: argparse.Namespace) -> None:
    limit = int(getattr(args, "limit", 0))
    concurrency = int(getattr(args, "concurrency", 16))
    timeout = float(getattr(args, "timeout", 900.0))
    max_age_s = float(args.freshness_max_age)
    if concurrency < 1 or limit < 0 or not 0.001 < max_age_s <= 7 * 86400:
        raise SystemExit("need --concurrency >= 1, --limit >= 0, 0.001 < --freshness-max-age <= 7d")
    missing = pagesift_missing()
    if missing:
        raise SystemExit(f"freshness: cannot start pagesift: {missing}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    say("freshness: ensuring tools")
    ensure_apt(["nginx", DJANGO_DOC_PACKAGE])
    docs = django_docs_root()
    warm_page_cache(docs)
    load_before = os.getloadavg()[0]
    results: list[dict[str, Any]] = []
    with Nginx(docs, log_requests=True) as site:
        validators = check_validators(site)
        say(f"freshness: nginx validators: {validators}")
        with pagesift_server(concurrency, OUT_DIR / "freshness-server.log") as server:
            say(f"freshness: warm-up crawl ({WARMUP_PAGES} pages, no max_age, not reported)")
            crawl_once(server, site, "warmup", 0, WARMUP_PAGES, concurrency, timeout)
            for name in RUNS:
                max_age_ms = {"revalidate": REVALIDATE_MAX_AGE_MS, "nocache": 0}.get(
                    name, int(max_age_s * 1000)
                )
                say(f"freshness: {name} crawl of {site.url} (max_age {max_age_ms} ms)")
                result = crawl_once(server, site, name, max_age_ms, limit, concurrency, timeout)
                say(
                    f"freshness: {name}: {result['pages']} pages in {result['wall_s']:.2f}s "
                    f"({result['pages_per_s']:.1f}/s), {result['cache_hits']} cache hits, "
                    f"nginx saw {result['requests']} requests {result['by_status']}, "
                    f"sent {result['bytes_sent'] / MB:.2f} MB"
                )
                results.append(result)
            command_server = server.command
    cold = results[0]
    for r in results:
        for key in ("wall_s", "pages_per_s", "requests", "body_bytes", "bytes_sent"):
            r[f"{key}_vs_cold"] = r[key] / cold[key] if cold[key] else None

    report = {
        "section": "freshness",
        "machine": machine_facts(),
        "load_before": round(load_before, 2),
        "site": str(docs),
        "limit": limit,
        "concurrency": concurrency,
        "max_age_s": max_age_s,
        "revalidate_max_age_ms": REVALIDATE_MAX_AGE_MS,
        "validators": validators,
        "server_command": command_server,
        "runs": results,
    }
    md = build_markdown(report)
    write_json(OUT_DIR / "freshness.json", report)
    (OUT_DIR / "freshness.md").write_text(md + "\n")
    print(md, flush=True)
    say(f"freshness: wrote {OUT_DIR / 'freshness.md'} and {OUT_DIR / 'freshness.json'}")


def check_validators(site: Nginx) -> dict[str, Any]:
    """GET /index.html, then the same with its validators: does nginx send ETag and
    Last-Modified, and answer 304? (Not counted in any run: done before the first.)"""
    conn = http.client.HTTPConnection(LOOPBACK, site.port, timeout=10)
    try:
        conn.request("GET", "/index.html")
        resp = conn.getresponse()
        resp.read()
        etag = resp.getheader("ETag") or ""
        last_modified = resp.getheader("Last-Modified") or ""
        conn.request(
            "GET",
            "/index.html",
            headers={"If-None-Match": etag, "If-Modified-Since": last_modified},
        )
        cond = conn.getresponse()
        body = cond.read()
    finally:
        conn.close()
    return {
        "etag": etag,
        "last_modified": last_modified,
        "conditional_status": cond.status,
        "conditional_body_bytes": len(body),
    }


def crawl_once(
    server: Server,
    site: Nginx,
    name: str,
    max_age_ms: int,
    limit: int,
    concurrency: int,
    timeout: float,
) -> dict[str, Any]:
    from google.protobuf.duration_pb2 import Duration

    from pagesift.v1 import jobs_pb2

    terminal = {
        jobs_pb2.JOB_STATE_COMPLETED,
        jobs_pb2.JOB_STATE_FAILED,
        jobs_pb2.JOB_STATE_CANCELLED,
    }
    stub = server.stub
    options = jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_MARKDOWN])
    if max_age_ms > 0:  # 0: no max_age (the cache is neither read nor written)
        options.max_age.CopyFrom(
            Duration(seconds=max_age_ms // 1000, nanos=(max_age_ms % 1000) * 1_000_000)
        )
    progress = [0]
    offset = site.log_offset()
    nginx_cpu0 = site.cpu_seconds()
    cpu0 = subtree_cpu_seconds(server.proc.pid)
    t0 = time.monotonic()
    started = stub.StartCrawl(
        jobs_pb2.StartCrawlRequest(
            url=site.url,
            limit=limit,
            max_concurrency=concurrency,
            options=options,
        ),
        timeout=30,
    )
    job = _poll_job(stub, started.id, terminal, progress, timeout)
    wall = time.monotonic() - t0
    cpu = subtree_cpu_seconds(server.proc.pid) - cpu0
    nginx_cpu = site.cpu_seconds() - nginx_cpu0
    time.sleep(0.2)  # nginx logs a request when its response is done: let the last land
    reqs = site.requests(offset)
    hits, docs = _cache_hits(stub, started.id)
    pages = int(job.completed)
    return {
        "run": name,
        "max_age_ms": max_age_ms,
        "job": started.id,
        "state": jobs_pb2.JobState.Name(job.state),
        "pages": pages,
        "failed": int(job.failed),
        "documents": docs,
        "cache_hits": hits,
        "wall_s": wall,
        "pages_per_s": pages / wall if wall > 0 else 0.0,
        "cpu_s": cpu,
        "cpu_ms_per_page": 1000 * cpu / pages if pages else 0.0,
        "nginx_cpu_s": nginx_cpu,
        **request_summary(reqs),
    }


def _cache_hits(stub: Any, job_id: str) -> tuple[int, int]:
    """(documents with ``cache_hit``, documents) of a finished job; paged, bounded."""
    from pagesift.v1 import jobs_pb2

    hits = docs = skip = 0
    for _ in range(10_000):
        resp = stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=DOC_PAGE), timeout=60)
        docs += len(resp.documents)
        hits += sum(d.cache_hit for d in resp.documents)
        if not resp.HasField("next_skip") or not resp.documents:
            break
        skip = resp.next_skip
    return hits, docs


def _ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def build_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    v = report["validators"]
    lim = report["limit"] or "none (whole site)"
    lines = [
        "# Freshness: re-crawling with the page cache (max_age)",
        "",
        f"{m['date']}, {m['nproc']} CPUs ({m['cpu_model']}), load {report['load_before']} "
        f"before the runs. Site: {report['site']} via nginx on loopback; concurrency "
        f"{report['concurrency']}, page limit {lim}; one `pagesift serve` for all "
        f"crawls (so the cache is shared; an unreported {WARMUP_PAGES}-page warm-up crawl "
        "first). nginx validators on /index.html: ETag "
        f"`{v['etag']}`, Last-Modified `{v['last_modified']}`; a conditional GET got "
        f"{v['conditional_status']} with {v['conditional_body_bytes']} body bytes.",
        "",
    ]
    rows = []
    for r in report["runs"]:
        status = ", ".join(f"{k}: {n}" for k, n in r["by_status"].items()) or "-"
        rows.append(
            [
                r["run"],
                r["max_age_ms"] or "none",
                r["pages"],
                r["cache_hits"],
                f"{r['wall_s']:.3f}",
                f"{r['pages_per_s']:.1f}",
                f"{r['cpu_ms_per_page']:.2f}",
                r["requests"],
                r["conditional_requests"],
                status,
                f"{r['body_bytes'] / MB:.2f}",
                f"{r['bytes_sent'] / MB:.2f}",
                _ratio(r["pages_per_s_vs_cold"]),
                _ratio(r["requests_vs_cold"]),
                _ratio(r["bytes_sent_vs_cold"]),
            ]
        )
    lines.append(
        markdown_table(
            [
                "run",
                "max_age ms",
                "pages",
                "cache hits",
                "wall s",
                "pages/s",
                "CPU ms/page",
                "nginx requests",
                "conditional",
                "by status",
                "body MB",
                "sent MB",
                "pages/s vs cold",
                "requests vs cold",
                "sent vs cold",
            ],
            rows,
        )
    )
    return "\n".join(lines)
