"""Section ``map``: ``JobService.Map`` (list a site's URLs) on two loopback sites.

Both sites are static directories served by ``bench.nginx.Nginx`` (one worker, on
127.0.0.1) with its access log on (``Nginx(log_requests=True)``), so the requests a Map
call made are counted by nginx itself; one real ``pagesift serve`` child (fresh data
directory, the crawl section's config, default Map settings: link depth 2, at most 500
pages fetched, 16 at once, 60 s) answers every call, through the raw sync stub
(``Map`` is server-streaming: the URLs of every batch are collected).

- ``django``: Django's HTML documentation (Debian's ``python-django-doc``), mapped from
  its index. The package ships no ``sitemap.xml`` and no ``robots.txt`` (checked at
  run time and reported), so with the default ``sitemap: include`` Map finds no sitemap
  and the URLs come from the link walk alone.
- ``generated``: a site generated into a temp dir: 1,000 HTML pages (the home page, 20
  section pages, 979 articles), ``/sitemap.xml`` listing all 1,000 and a ``robots.txt``
  naming it. The home page links to the sections, each section to its articles, each
  article to its neighbours, so the link walk alone reaches every page at depth 2.
  Mapped with ``sitemap`` ``only`` (no page fetched), ``include`` and ``skip`` (the link
  walk only).

Per case (``--map-runs`` calls each, the median call by wall time reported, every call
kept in the JSON): URLs returned, wall s (Map sent -> stream finished), URLs/s, and what
nginx saw during the call: requests, pages fetched (HTML requests, i.e. not robots.txt
nor sitemap files) by status; and, against the files nginx serves, how many of the
site's HTML files were listed and how many listed URLs have no file behind them (Map
lists the links of the last depth without fetching them). ``--map-limit`` is the
request's ``limit`` (0 = the server's default, 5,000). Results: ``bench/out/map.json``
and ``bench/out/map.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from bench.common import MB, OUT_DIR, machine_facts, markdown_table, say, write_json
from bench.crawl import Server, pagesift_missing, pagesift_server, warm_page_cache
from bench.nginx import LoggedRequest, Nginx
from bench.tools import DJANGO_DOC_PACKAGE, django_docs_root, ensure_apt

if TYPE_CHECKING:
    from pagesift.v1 import jobs_pb2

GENERATED_PAGES = 1000
SECTIONS_ON_SITE = 20
MAP_TIMEOUT = 300.0  # per call, client side (the server stops walking after map_timeout)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("map section")
    g.add_argument("--map-runs", type=int, default=3, help="Map calls per case; median reported")
    g.add_argument("--map-limit", type=int, default=0, help="Map limit (0 = server default)")


def run(args: argparse.Namespace) -> None:
    runs = int(args.map_runs)
    limit = int(args.map_limit)
    if not 1 <= runs <= 20 or limit < 0:
        raise SystemExit("need 1 <= --map-runs <= 20 and --map-limit >= 0")
    missing = pagesift_missing()
    if missing:
        raise SystemExit(f"map: cannot start pagesift: {missing}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    from pagesift.v1 import jobs_pb2

    say("map: ensuring tools")
    ensure_apt(["nginx", DJANGO_DOC_PACKAGE])
    docs = django_docs_root()
    warm_page_cache(docs)
    django_files = {
        name: (docs / name).exists() for name in ("sitemap.xml", "sitemap.xml.gz", "robots.txt")
    }
    say(f"map: files in the Django docs root: {django_files}")
    load_before = os.getloadavg()[0]
    cases: list[dict[str, Any]] = []
    concurrency = int(getattr(args, "concurrency", 16))
    with pagesift_server(concurrency, OUT_DIR / "map-server.log") as server:
        with Nginx(docs, log_requests=True) as site:
            cases.append(
                map_case(server, site, "django", jobs_pb2.SITEMAP_MODE_INCLUDE, limit, runs)
            )
        with tempfile.TemporaryDirectory(prefix="bench-mapsite-") as tmpname:
            root = Path(tmpname)
            paths = generate_site(root, GENERATED_PAGES)
            with Nginx(root, log_requests=True) as site:
                # written once nginx has its port: sitemap URLs are absolute
                (root / "sitemap.xml").write_text(sitemap_xml(site.url, paths))
                (root / "robots.txt").write_text(
                    f"User-agent: *\nAllow: /\nSitemap: {site.url}sitemap.xml\n"
                )
                for mode in (
                    jobs_pb2.SITEMAP_MODE_ONLY,
                    jobs_pb2.SITEMAP_MODE_INCLUDE,
                    jobs_pb2.SITEMAP_MODE_SKIP,
                ):
                    cases.append(map_case(server, site, "generated", mode, limit, runs))
        server_command = server.command
    report = {
        "section": "map",
        "machine": machine_facts(),
        "load_before": round(load_before, 2),
        "django_docs": str(docs),
        "django_docs_files": django_files,
        "generated_pages": GENERATED_PAGES,
        "limit": limit,
        "runs_per_case": runs,
        "server_command": server_command,
        "cases": cases,
    }
    md = build_markdown(report)
    write_json(OUT_DIR / "map.json", report)
    (OUT_DIR / "map.md").write_text(md + "\n")
    print(md, flush=True)
    say(f"map: wrote {OUT_DIR / 'map.md'} and {OUT_DIR / 'map.json'}")


def generate_site(root: Path, pages: int) -> list[str]:
    """``pages`` HTML pages: ``/`` -> 20 sections -> articles (each linking to its
    neighbours); returns their paths (for ``sitemap_xml``). Deterministic."""
    articles = pages - 1 - SECTIONS_ON_SITE
    per_section = -(-articles // SECTIONS_ON_SITE)
    paths: list[str] = ["/"]
    sections: list[list[str]] = []
    for s in range(SECTIONS_ON_SITE):
        first = s * per_section
        sections.append(
            [f"/s{s}/a{i}.html" for i in range(first, min(articles, first + per_section))]
        )
    filler = "<p>" + "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20 + "</p>"

    def page(title: str, links: list[str]) -> str:
        items = "".join(f'<li><a href="{h}">{h}</a></li>' for h in links)
        return (
            f"<!doctype html><html lang=en><head><title>{title}</title></head><body>"
            f"<h1>{title}</h1>{filler}<ul>{items}</ul></body></html>\n"
        )

    (root / "index.html").write_text(page("Home", [f"/s{s}/" for s in range(SECTIONS_ON_SITE)]))
    for s, arts in enumerate(sections):
        (root / f"s{s}").mkdir()
        (root / f"s{s}" / "index.html").write_text(page(f"Section {s}", ["/", *arts]))
        paths.append(f"/s{s}/")
        for j, path in enumerate(arts):
            near = [arts[k] for k in (j - 1, j + 1) if 0 <= k < len(arts)]
            (root / path.lstrip("/")).write_text(page(path, ["/", f"/s{s}/", *near]))
            paths.append(path)
    if len(paths) != pages:
        raise RuntimeError(f"generated {len(paths)} pages, not {pages}")
    return paths


def sitemap_xml(base_url: str, paths: list[str]) -> str:
    """A sitemap listing ``base_url`` + each path (``base_url`` ends with ``/``)."""
    urls = "".join(f"<url><loc>{base_url}{p.lstrip('/')}</loc></url>" for p in paths)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>\n'
    )


def map_case(
    server: Server,
    site: Nginx,
    name: str,
    mode: jobs_pb2.SitemapMode.ValueType,
    limit: int,
    runs: int,
) -> dict[str, Any]:
    from pagesift.v1 import jobs_pb2

    mode_name = jobs_pb2.SitemapMode.Name(mode).removeprefix("SITEMAP_MODE_").lower()
    calls: list[dict[str, Any]] = []
    for i in range(runs):
        offset = site.log_offset()
        t0 = time.monotonic()
        stream = server.stub.Map(
            jobs_pb2.MapRequest(url=site.url, limit=limit, sitemap=mode), timeout=MAP_TIMEOUT
        )
        urls = [u for batch in stream for u in batch.urls]
        wall = time.monotonic() - t0
        time.sleep(0.2)  # nginx logs a request when its response is done: let the last land
        reqs = site.requests(offset)
        call = {
            "call": i + 1,
            "urls": len(urls),
            "unique_urls": len(set(urls)),
            "wall_s": wall,
            "urls_per_s": len(urls) / wall if wall > 0 else 0.0,
            **_requests(reqs),
            "first_urls": urls[:5],
            **_coverage(site, urls),
        }
        say(
            f"map: {name} sitemap={mode_name} call {i + 1}/{runs}: {len(urls)} URLs in "
            f"{wall:.3f}s, {call['pages_fetched']} pages fetched {call['page_status']}, "
            f"{call['requests']} requests"
        )
        calls.append(call)
    median_wall = statistics.median_low(c["wall_s"] for c in calls)
    median = next(c for c in calls if c["wall_s"] == median_wall)
    return {"site": name, "url": site.url, "sitemap": mode_name, "median": median, "calls": calls}


def _coverage(site: Nginx, urls: list[str]) -> dict[str, Any]:
    """How the listed URLs match the files nginx serves: listed URLs with no file behind
    them (never checked by the walk: links seen at the last depth), and HTML files of the
    site that were not listed."""
    root = site.root.resolve()
    served: set[Path] = set()
    missing: list[str] = []
    for url in urls:
        parts = urlsplit(url)
        rel = unquote(parts.path).lstrip("/")
        candidates = [root / rel / "index.html"] if not rel or rel.endswith("/") else []
        candidates += [root / rel, root / rel / "index.html"]
        hit = next((c for c in candidates if c.is_file()), None)
        if hit is None:
            missing.append(parts.path)
        else:
            served.add(hit.resolve())
    html = {f.resolve() for f in root.rglob("*.html")}
    unlisted = sorted(str(f.relative_to(root)) for f in html - served)
    return {
        "listed_without_file": len(missing),
        "listed_without_file_examples": missing[:10],
        "html_files": len(html),
        "html_files_listed": len(html & served),
        "html_files_not_listed_examples": unlisted[:10],
    }


def _requests(reqs: list[LoggedRequest]) -> dict[str, Any]:
    pages = [r for r in reqs if r.path.endswith(".html") or r.path.endswith("/")]
    return {
        "requests": len(reqs),
        "pages_fetched": len(pages),
        "page_status": {str(k): v for k, v in sorted(Counter(r.status for r in pages).items())},
        "other_requests": sorted({f"{r.status} {r.path}" for r in reqs if r not in pages})[:10],
        "bytes_sent": sum(r.bytes_sent for r in reqs),
    }


def build_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    files = report["django_docs_files"]
    lines = [
        "# Map: listing a site's URLs",
        "",
        f"{m['date']}, {m['nproc']} CPUs ({m['cpu_model']}), load {report['load_before']} "
        f"before the runs; median of {report['runs_per_case']} calls by wall time; "
        f"limit {report['limit'] or 'server default (5,000)'}; server Map defaults (link "
        "depth 2, at most 500 pages fetched, 16 at once). Django docs "
        f"({report['django_docs']}): sitemap.xml "
        f"{'present' if files['sitemap.xml'] else 'absent'}, robots.txt "
        f"{'present' if files['robots.txt'] else 'absent'}. Generated site: "
        f"{report['generated_pages']} pages, all in /sitemap.xml (named by robots.txt).",
        "",
    ]
    rows = []
    for c in report["cases"]:
        med = c["median"]
        status = ", ".join(f"{k}: {n}" for k, n in med["page_status"].items()) or "-"
        rows.append(
            [
                c["site"],
                c["sitemap"],
                med["urls"],
                f"{med['html_files_listed']} / {med['html_files']}",
                med["listed_without_file"],
                f"{med['wall_s']:.3f}",
                f"{med['urls_per_s']:.0f}",
                med["pages_fetched"],
                status,
                med["requests"],
                f"{med['bytes_sent'] / MB:.2f}",
            ]
        )
    lines.append(
        markdown_table(
            [
                "site",
                "sitemap mode",
                "URLs",
                "HTML files listed",
                "listed, no file",
                "wall s",
                "URLs/s",
                "pages fetched",
                "page status",
                "nginx requests",
                "sent MB",
            ],
            rows,
        )
    )
    return "\n".join(lines)
