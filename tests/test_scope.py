"""Crawl scope by origin and by path, regexes over the path or the whole URL, and a
crawl whose caller regex would backtrack forever.

Real aiohttp sites on loopback ports (or, where the test is about which links the job
runtime follows, ``FakeEngine``), a real in-process node; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagesift.core.jobs.scope import Scope, in_scope, path_prefix
from pagesift.demo.site import CALENDAR_EXCLUDE, Site, normalize_url
from pagesift.primary.engine.interface import Page
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.fakeengine import FakeEngine, page
from tests.helpers import TERMINAL, all_documents, in_process_node, serve_handler, wait_terminal


@pytest.mark.parametrize(
    ("url", "root", "subdomains", "inside"),
    [
        ("http://example.com/a", "http://example.com/", False, True),
        ("http://EXAMPLE.com:80/a", "http://example.com/", False, True),  # default port
        ("https://example.com:443/a", "https://example.com/", False, True),
        ("https://example.com/a", "http://example.com/", False, True),  # upgrade to 443
        ("http://example.com/a", "https://example.com/", False, False),  # no downgrade
        ("https://example.com:8443/a", "https://example.com/", False, False),  # other port
        ("http://example.com:8080/a", "http://example.com/", False, False),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8083/", False, False),  # the leak
        ("https://127.0.0.1:8083/", "http://127.0.0.1:8083/", False, False),  # no upgrade
        ("https://127.0.0.1:443/", "http://127.0.0.1:8083/", False, False),
        ("http://127.0.0.1:8083/x", "http://127.0.0.1:8083/", True, True),
        ("https://www.example.com/a", "https://example.com/", False, True),  # www tolerated
        ("https://example.com/a", "https://www.example.com/", False, True),
        ("https://www.example.com:444/a", "https://example.com/", False, False),
        ("https://docs.example.com/a", "https://example.com/", False, False),
        ("https://docs.example.com/a", "https://example.com/", True, True),
        ("https://docs.example.com/a", "https://www.example.com/", True, True),
        ("https://docs.example.com:8443/a", "https://example.com/", True, False),
        ("http://docs.example.com/a", "https://example.com/", True, False),
        ("https://badexample.com/a", "https://example.com/", True, False),
        ("https://other.org/", "https://example.com/", True, False),
        ("http://1.127.0.0.1/", "http://127.0.0.1/", True, False),  # no subdomains of an IP
        ("http://[::1]:8083/", "http://[::1]:8083/", False, True),
        ("ftp://example.com/", "http://example.com/", True, False),
        ("http://example.com:99999/", "http://example.com/", True, False),  # bad port
        ("http:///nohost", "http://example.com/", True, False),
    ],
)
def test_scope_is_the_origin_with_www_upgrade_and_subdomains(
    url: str, root: str, subdomains: bool, inside: bool
) -> None:
    assert in_scope(url, root, allow_subdomains=subdomains) is inside


# --- path scope: a crawl stays under its start URL's directory -------------------------


@pytest.mark.parametrize(
    ("start", "prefix"),
    [
        ("https://h/docs/intro", "/docs/intro/"),  # a page: itself and its subpages
        ("https://h/docs/", "/docs/"),
        ("https://h/docs", "/docs/"),  # a section, with or without its slash
        ("https://h/", "/"),
        ("https://h", "/"),
        ("https://h/docs/index.html", "/docs/"),  # a file stands for its directory
        ("https://h/guide/page.php?x=1", "/guide/"),
        ("https://h/docs/api/v2/intro?lang=en#top", "/docs/api/v2/intro/"),
        ("https://h/docs/?page=2", "/docs/"),
        ("https://h/a/./b/../docs/x", "/a/docs/x/"),
        ("https://h/a/b/..", "/a/"),
        ("https://h/%7euser/x", "/~user/x/"),  # normalized like page keys
    ],
)
def test_the_path_prefix_is_the_start_path_as_a_directory(start: str, prefix: str) -> None:
    assert path_prefix(start) == prefix


async def _scope(url: str, **kw: object) -> Scope:
    return await Scope.build(jobs_pb2.StartCrawlRequest(url=url, **kw), 100)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "inside"),
    [
        ("https://h/docs/intro", True),  # the start URL itself
        ("https://h/docs/intro?x=1", True),
        ("https://h/docs", True),  # the directory itself, either spelling
        ("https://h/docs/", True),
        ("https://h/docs/index.html", True),
        ("https://h/docs?tab=2", True),
        ("https://h/docs/a/b/c/d/e.html", True),  # any path depth below it
        ("https://www.h/docs/x", True),  # the origin rule's tolerances still hold
        ("https://h/docs/../blog/x", False),  # dot segments resolved first
        ("https://h/docsX", False),
        ("https://h/docsX/a", False),
        ("https://h/doc", False),
        ("https://h/", False),
        ("https://h/blog/docs/x", False),
        ("https://h/?next=/docs/", False),  # the query is not the path
        ("https://h/DOCS/x", False),  # paths are case-sensitive
        ("https://other.example/docs/x", False),  # and the origin rule first
    ],
)
async def test_the_default_scope_is_the_start_section(url: str, inside: bool) -> None:
    scope = await _scope("https://h/docs/")
    assert scope.prefix == "/docs/"
    assert scope.reaches(url, 1) is inside
    assert scope.admits(url, 1) is inside
    entire = await _scope("https://h/docs/", crawl_entire_domain=True)
    assert entire.prefix == "/"
    assert entire.reaches(url, 1) is (url != "https://other.example/docs/x")


async def test_a_start_page_scopes_itself_and_its_subpages_with_or_without_a_slash() -> None:
    for start in ("https://h/docs", "https://h/docs/"):
        scope = await _scope(start)
        assert scope.reaches("https://h/docs/x", 1) and scope.reaches("https://h/docs", 1)
        assert not scope.reaches("https://h/blog/x", 1)
        assert not scope.reaches("https://h/docsX", 1)
    page = await _scope("https://h/docs/intro")
    assert page.reaches("https://h/docs/intro", 1) and page.reaches("https://h/docs/intro/2", 1)
    assert not page.reaches("https://h/docs/other", 1)
    file = await _scope("https://h/docs/index.html")  # a file: its directory
    assert file.reaches("https://h/docs/other", 1) and not file.reaches("https://h/blog", 1)


async def test_other_hosts_admitted_by_subdomains_or_external_links_are_not_path_limited() -> None:
    sub = await _scope("https://h.test/docs/intro", allow_subdomains=True)
    assert sub.reaches("https://blog.h.test/anything", 1)
    assert not sub.reaches("https://h.test/anything", 1)
    ext = await _scope("https://h.test/docs/intro", allow_external_links=True)
    assert ext.reaches("https://other.example/x", 1)
    assert not ext.reaches("https://h.test/x", 1)


async def test_sitemap_urls_outside_the_path_are_dropped_like_links() -> None:
    scope = await _scope("https://h/docs/")
    sitemap = [
        "https://h/",
        "https://h/docs/",
        "https://h/docs/a.html",
        "https://h/docsX.html",
        "https://h/blog/b.html",
        "https://h/docs/deep/c.html?v=1",
    ]
    entries = await scope.admit({scope.key(u): u for u in sitemap}, 1)  # as frontier.seed
    assert [e.url for e in entries] == [
        "https://h/docs/",
        "https://h/docs/a.html",
        "https://h/docs/deep/c.html?v=1",
    ]


async def test_link_depth_is_clicks_not_path_segments() -> None:
    scope = await _scope("https://h/docs/", max_depth=1)
    deep_path = "https://h/docs/a/b/c/d/e/f.html"
    assert scope.reaches(deep_path, 1)  # one click away, six segments deep
    assert not scope.reaches("https://h/docs/x", 2)  # two clicks away, two segments


@pytest.mark.parametrize(
    ("include", "exclude", "full", "url", "allowed"),
    [
        ([r"^/docs/"], [], False, "https://h/docs/a", True),
        ([r"^https://h/docs/"], [], False, "https://h/docs/a", False),  # path only
        ([r"^https://h/docs/"], [], True, "https://h/docs/a", True),
        ([r"^/docs/"], [], True, "https://h/docs/a", False),  # anchored at the scheme
        ([], [r"^https://blog\."], True, "https://blog.h/x", False),
        ([], [r"^https://blog\."], True, "https://h/x", True),
        ([r"lang=en$"], [], True, "https://h/docs/a?lang=en", True),
        ([r"^https://h/docs/a$"], [], True, "HTTPS://H:443/docs/./a#x", True),  # normalized
    ],
)
async def test_regexes_match_the_path_or_the_whole_normalized_url(
    include: list[str], exclude: list[str], full: bool, url: str, allowed: bool
) -> None:
    scope = await _scope(
        "https://h/",
        include_paths=include,
        exclude_paths=exclude,
        regex_on_full_url=full,
        allow_subdomains=True,
    )
    key = scope.key(url)
    assert [e.key for e in await scope.admit({key: url}, 1)] == ([key] if allowed else [])


async def test_a_crawl_from_a_section_stays_in_it_unless_the_whole_domain_is_asked(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    start = root + "docs/"  # the sitemap lists every section: its others are dropped too

    def under_docs(url: str) -> bool:
        path = normalize_url(url)[len(root) - 1 :]
        return path == "/docs" or path.startswith("/docs/")

    async with in_process_node(tmp_path) as node:
        scoped = await node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=start))
        assert (await wait_terminal(node.stub, scoped.id)).state == jobs_pb2.JOB_STATE_COMPLETED
        inside = {normalize_url(d.url) for d in await all_documents(node.stub, scoped.id)}
        fetched = [p for p in s.hits if p not in ("/robots.txt", "/sitemap.xml")]
        assert fetched and all(p.startswith("/docs/") for p in fetched), fetched
        entire = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(
                url=start, crawl_entire_domain=True, exclude_paths=[CALENDAR_EXCLUDE]
            )
        )
        assert (await wait_terminal(node.stub, entire.id)).state == jobs_pb2.JOB_STATE_COMPLETED
        everything = {normalize_url(d.url) for d in await all_documents(node.stub, entire.id)}
    assert len(inside) > 3 and all(under_docs(u) for u in inside), inside
    assert inside == {u for u in everything if under_docs(u)}
    assert normalize_url(root) in everything
    assert {u for u in everything if not under_docs(u)}, "crawl_entire_domain should leave /docs/"


# --- two services on two ports of one host ----------------------------------------------


def html(body: str) -> web.Response:
    return web.Response(text=f"<html><body>{body}</body></html>", content_type="text/html")


@pytest.mark.parametrize("external", [False, True])
async def test_a_crawl_stays_on_its_origin_unless_external_links_are_allowed(
    tmp_path: Path, external: bool
) -> None:
    """Which links and sitemap URLs the job runtime follows (the web is ``FakeEngine``):
    another port of the same host, or https on this port, is another origin."""
    root, other = "http://127.0.0.1:8001/", "http://127.0.0.1:8002/"

    def site(url: str) -> Page:
        if url == root:
            return page(url, other, other + "deep", "https://127.0.0.1:8001/secure", "/local")
        return page(url)

    engine = FakeEngine(site, sitemaps={root[:-1]: [other + "from-sitemap", root + "local"]})
    async with in_process_node(tmp_path, engine=engine, respect_robots=False) as node:
        start = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(url=root, allow_external_links=external, limit=20)
        )
        job = await wait_terminal(node.stub, start.id, timeout=30)
        assert job.state == jobs_pb2.JOB_STATE_COMPLETED
        docs = {d.url for d in await all_documents(node.stub, start.id)}
    other_hits = [u for u in engine.requests if u.startswith(other)]
    other_docs = {u for u in docs if u.startswith(other)}
    assert root + "local" in docs
    if external:
        assert other_hits, "allow_external_links should reach the other port"
        assert other_docs
    else:
        assert other_hits == [], "the crawl reached another service on the host"
        assert other_docs == set()
        assert docs == {root, root + "local"}


# --- a caller's regex never stalls the node ----------------------------------------------

EVIL = "/" + "a" * 32 + "b"  # ^/(a+)+$ backtracks ~2**32 times on it in Python's re


def _probe_until_done(
    address: str, job_id: str, deadline: float, answered: Callable[[], object]
) -> tuple[int, list[str]]:
    """From another thread, with its own channel: a health check and a GetJob every
    50 ms, each with a ``deadline`` s gRPC deadline, until the job ends. Calls
    ``answered`` after the first answer. Returns the last state and what went wrong:
    a failed call, or more than ``deadline`` s between two answers (a node that holds
    the GIL in a C regex stalls this thread too, so the gap is what shows it)."""
    problems: list[str] = []
    state = jobs_pb2.JOB_STATE_UNSPECIFIED
    last = time.monotonic()
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        jobs = jobs_pb2_grpc.JobServiceStub(channel)
        for _ in range(1_000):  # >= 50 s
            try:
                health.Check(health_pb2.HealthCheckRequest(), timeout=deadline)
                resp = jobs.GetJob(jobs_pb2.GetJobRequest(id=job_id, limit=1), timeout=deadline)
            except grpc.RpcError as e:
                problems.append(f"{e.code()}: {e.details()}")  # type: ignore[attr-defined]
                break
            now = time.monotonic()
            if now - last > deadline:
                problems.append(f"no answer for {now - last:.1f} s")
            last = now
            answered()
            state = resp.state
            if state in TERMINAL:
                break
            time.sleep(0.05)
    return int(state), problems


async def test_a_backtracking_pattern_neither_stalls_the_node_nor_the_crawl(
    tmp_path: Path,
) -> None:
    probing = asyncio.Event()  # the probe thread got its first answer

    async def evil_site(request: web.Request) -> web.Response:
        if request.path == "/":
            # The trap link is served only once the probe runs, so it overlaps the
            # moment the crawler matches ^/(a+)+$ against the link.
            await asyncio.wait_for(probing.wait(), 10)
            return html(f'<a href="{EVIL}">trap</a><a href="/aaaa">fine</a>')
        return html(f"<p>{request.path}</p>")

    async with (
        serve_handler(evil_site) as port,
        in_process_node(tmp_path, respect_robots=False) as node,
    ):
        start = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(
                url=f"http://127.0.0.1:{port}/",
                include_paths=["^/(a+)+$"],
                sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
            )
        )
        loop = asyncio.get_running_loop()
        state, problems = await asyncio.to_thread(
            _probe_until_done,
            node.address,
            start.id,
            15.0,  # generous for a loaded box; a node held by backtracking misses it by minutes
            lambda: loop.call_soon_threadsafe(probing.set),
        )
        assert problems == [], "the node stopped answering while the crawl ran"
        assert state == jobs_pb2.JOB_STATE_COMPLETED
        docs = {d.url for d in await all_documents(node.stub, start.id)}
        assert docs == {f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{port}/aaaa"}


async def test_a_sitemap_named_by_robots_on_another_origin_is_not_fetched(
    tmp_path: Path,
) -> None:
    other_hits: list[str] = []

    async def other(request: web.Request) -> web.Response:
        other_hits.append(request.path)
        return web.Response(
            text='<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            "<url><loc>/elsewhere</loc></url></urlset>",
            content_type="application/xml",
        )

    async with serve_handler(other) as other_port:

        async def first(request: web.Request) -> web.Response:
            if request.path == "/robots.txt":
                sitemap = f"http://127.0.0.1:{other_port}/sitemap.xml"
                return web.Response(text=f"User-agent: *\nAllow: /\nSitemap: {sitemap}\n")
            return html(f"<p>{request.path}</p>")

        async with serve_handler(first) as first_port, in_process_node(tmp_path) as node:
            root = f"http://127.0.0.1:{first_port}/"
            start = await node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=root, limit=5))
            job = await wait_terminal(node.stub, start.id, timeout=30)
            assert job.state == jobs_pb2.JOB_STATE_COMPLETED
            assert other_hits == [], "a sitemap on another service of the host was fetched"
