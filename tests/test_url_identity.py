"""URL identity: every URL that leads to one page yields one document.

The pure key functions (``urls.page_key``, ``strip_tracking``, ``similar_key``) are
checked with examples and hypothesis; the crawl rules (redirects, meta refresh,
rel=canonical, tracking parameters, similar URLs, meta robots / X-Robots-Tag) with
real aiohttp sites on 127.0.0.1 and a real in-process node; the UTS 46 host with a
real ``HttpEngine`` whose resolver maps a test name to loopback; the www/bare dedupe
of the job runtime with ``tests.fakeengine`` (no fetching). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from pagesift.core.jobs import records, specs, urls, views
from pagesift.core.jobs.scope import in_scope
from pagesift.core.store.db import Store
from pagesift.primary.engine.interface import Page
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.primary.engine.robots import page_directives
from pagesift.primary.jobs.runtime import Jobs
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.fakeengine import FakeEngine, page
from tests.helpers import (
    EngineMaker,
    MapResolver,
    ServeProc,
    all_documents,
    eventually,
    in_process_node,
    node_config,
    serve_handler,
    wait_terminal,
)

# --- the pure key functions ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("http://faß.de/x", "http://xn--fa-hia.de/x"),  # non-transitional: not fass.de
        ("http://BÜCHER.test:8080/a/", "http://xn--bcher-kva.test:8080/a"),
        ("http://bücher.test/", "http://xn--bcher-kva.test/"),
        ("http://xn--bcher-kva.test/", "http://xn--bcher-kva.test/"),
        ("http://\uff45\uff58ample\u3002com/", "http://example.com/"),  # full-width, ideographic .
    ],
)
def test_every_host_spelling_normalizes_to_its_uts46_a_label(url: str, key: str) -> None:
    assert urls.normalize(url) == key
    assert urls.page_key(url) == key


def test_scope_compares_hosts_in_their_uts46_form() -> None:
    assert in_scope("http://BÜCHER.test/a", "http://xn--bcher-kva.test/", allow_subdomains=False)
    assert in_scope("http://xn--bcher-kva.test/a", "http://bücher.test/", allow_subdomains=False)
    assert not in_scope("http://fass.de/", "http://faß.de/", allow_subdomains=False)


@pytest.mark.parametrize(
    ("url", "stripped"),
    [
        ("http://h/p?utm_source=a&b=1&gclid=x#f", "http://h/p?b=1#f"),
        ("http://h/p?UTM_Medium=a", "http://h/p"),
        ("http://h/p?fbclid=1&msclkid=2&utm_campaign=3", "http://h/p"),
        ("http://h/p?b=1&c=2", "http://h/p?b=1&c=2"),
        ("http://h/p?utm%5Fsource=a&x", "http://h/p?x"),
        ("http://h/p", "http://h/p"),
    ],
)
def test_strip_tracking_drops_only_tracking_parameters(url: str, stripped: str) -> None:
    assert urls.strip_tracking(url) == stripped


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/docs",
        "https://example.com/docs/",
        "http://www.example.com/docs/index.html",
        "https://www.example.com/docs/index.php",
        "http://WWW.Example.COM:80/docs/index.asp",
        "https://example.com:443/docs/./",
    ],
)
def test_similar_urls_share_one_key_when_asked(url: str) -> None:
    assert urls.page_key(url, similar=True) == "https://example.com/docs"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("http://example.com/docs", "https://example.com/docs"),
        ("http://example.com/docs", "http://www.example.com/docs"),
        ("http://example.com/docs", "http://example.com/docs/index.php"),
    ],
)
def test_similar_urls_stay_apart_by_default(a: str, b: str) -> None:
    assert urls.page_key(a) != urls.page_key(b)
    assert urls.page_key(a, similar=True) == urls.page_key(b, similar=True)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("http://example.com:8080/", "https://example.com:8080/"),  # explicit port: kept
        ("http://www.com/", "http://com/"),  # www is the name itself there
        ("https://example.com/a", "https://example.com/b"),
        ("https://example.com/?a=1", "https://example.com/?a=2"),
    ],
)
def test_similar_key_keeps_distinct_pages_apart(a: str, b: str) -> None:
    assert urls.page_key(a, similar=True) != urls.page_key(b, similar=True)


_label = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-ßüé", min_size=1, max_size=8)
_host = st.lists(_label, min_size=1, max_size=3).map(".".join).map(lambda h: h + ".test")
_segment = st.text(alphabet="abcdefgh.-_%/ü", max_size=10)
_param = st.sampled_from(["utm_source=x", "gclid=1", "a=1", "b=", "fbclid=z", "UTM_x=2", ""])


@st.composite
def _urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http", "https", "HTTP"]))
    www = draw(st.sampled_from(["", "www.", "WWW."]))
    port = draw(st.sampled_from(["", ":80", ":443", ":8080"]))
    path = "/".join(draw(st.lists(_segment, max_size=4)))
    index = draw(st.sampled_from(["", "/", "/index.html", "/index.php", "/index.htm"]))
    query = "&".join(draw(st.lists(_param, max_size=4)))
    return f"{scheme}://{www}{draw(_host)}{port}/{path}{index}" + (f"?{query}" if query else "")


@given(_urls(), st.booleans(), st.booleans(), st.booleans())
def test_page_keys_are_idempotent_fixed_points_of_normalize(
    url: str, ignore_query: bool, strip: bool, similar: bool
) -> None:
    try:
        key = urls.page_key(
            url, ignore_query=ignore_query, strip_tracking_params=strip, similar=similar
        )
    except ValueError:
        return  # a host idna refuses: refused everywhere
    again = urls.page_key(
        key, ignore_query=ignore_query, strip_tracking_params=strip, similar=similar
    )
    assert again == key
    assert urls.normalize(key) == key
    if strip:
        assert "utm_" not in key.lower() and "gclid" not in key and "fbclid" not in key
    if similar:
        assert "://www." not in key and not key.endswith(("/index.php", "/index.html"))


@given(_urls())
def test_strip_tracking_is_idempotent(url: str) -> None:
    once = urls.strip_tracking(url)
    assert urls.strip_tracking(once) == once


@pytest.mark.parametrize(
    ("meta", "headers", "expected"),
    [
        (["noindex, nofollow"], [], (True, True)),
        (["NONE"], [], (True, True)),
        ([], ["noindex"], (True, False)),
        ([], ["pagesift: nofollow"], (False, True)),
        ([], ["googlebot: noindex"], (False, False)),  # another agent's rule
        ([], ["unavailable_after: 25 Jun 2010 15:00:00 PST"], (False, False)),
        (["index, follow"], [], (False, False)),
    ],
)
def test_page_directives_read_meta_robots_and_x_robots_tag(
    meta: list[str], headers: list[str], expected: tuple[bool, bool]
) -> None:
    assert page_directives(meta, headers, "pagesift") == expected


# --- live sites ---------------------------------------------------------------------------


def html(body: str, head: str = "", **headers: str) -> web.Response:
    return web.Response(
        text=f"<html><head>{head}</head><body>{body}</body></html>",
        content_type="text/html",
        headers=headers,
    )


def refresh(target: str, delay: int = 0) -> web.Response:
    return html("moved", f'<meta http-equiv="refresh" content="{delay}; url={target}">')


def links(*paths: str) -> str:
    return "".join(f'<a href="{p}">{p}</a>' for p in paths)


async def run_crawl(
    tmp_path: Path, handler: Callable[[web.Request], Awaitable[web.StreamResponse]], **kw: Any
) -> tuple[list[jobs_pb2.Document], list[jobs_pb2.PageError], list[str]]:
    """Crawl the handler's site to the end: (documents, page errors, robots_blocked)."""
    async with (
        serve_handler(handler) as port,
        in_process_node(tmp_path, respect_robots=False) as node,
    ):
        kw.setdefault("sitemap", jobs_pb2.SITEMAP_MODE_SKIP)
        start = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(url=f"http://127.0.0.1:{port}/", limit=100, **kw)
        )
        job = await wait_terminal(node.stub, start.id, timeout=60)
        assert job.state == jobs_pb2.JOB_STATE_COMPLETED, job.note
        docs = await all_documents(node.stub, start.id)
        errors = await node.stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=start.id))
        assert job.completed + job.failed == job.total  # every entry: one doc or one error
        return docs, list(errors.errors), list(errors.robots_blocked)


def paths(items: list[str]) -> list[str]:
    return sorted(u.split("/", 3)[3] if u.count("/") >= 3 else "" for u in items)


REDIRECTS = {"301": 301, "302": 302, "307": 307, "308": 308}
MAZE = [f"/r{i}" for i in range(1, 10)]  # nine ways in, plus /final itself


async def maze(request: web.Request) -> web.StreamResponse:
    p = request.path
    if p == "/":
        return html(links(*MAZE, "/final", "/final/", "/final/index.html"))
    if p in ("/final", "/final/"):
        return html("<h1>the one page</h1>")
    chain = {
        "/r1": ("301", "/final"),
        "/r2": ("302", "/r1"),  # 302 -> 301 -> page
        "/r3": ("meta", "/final"),
        "/r4": ("meta", "/r2"),  # refresh -> 302 -> 301 -> page
        "/r5": ("307", "/hop5"),
        "/hop5": ("meta", "/final/"),
        "/r6": ("308", "/final?"),
        "/r7": ("meta", "http://127.0.0.1:{port}/final#top"),
        "/r8": ("301", "/r3"),  # 301 -> refresh -> page
        "/r9": ("302", "/FINAL/../final"),
    }
    kind, target = chain[p]
    target = target.replace("{port}", str(request.url.port))
    if kind == "meta":
        return refresh(target)
    return web.Response(status=REDIRECTS[kind], headers={"Location": target})


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_a_redirect_maze_yields_one_document_and_records_the_rest_as_duplicates(
    tmp_path: Path, concurrency: int
) -> None:
    docs, errors, _ = await run_crawl(tmp_path, maze, max_concurrency=concurrency)
    finals = [d for d in docs if urls.normalize(d.final_url).endswith("/final")]
    assert len(finals) == 1, [d.url for d in finals]
    assert len(docs) == 2  # the root and the one page
    dups = [e for e in errors if e.code == "duplicate"]
    assert len(dups) == len(errors) == 9  # ten URLs lead to /final: one doc, nine notes
    names = {urls.normalize(finals[0].url), urls.normalize(finals[0].final_url)}
    for e in dups:  # each names the stored page, by its URL or its final URL
        assert e.message.startswith("same page as ")
        assert urls.normalize(e.message.removeprefix("same page as ")) in names
    named = {urls.normalize(e.url) for e in dups} | {urls.normalize(finals[0].url)}
    assert {urls.normalize(u).rsplit("/", 1)[1] for u in named} == {
        *(m[1:] for m in MAZE),
        "final",
    }


async def test_a_slow_meta_refresh_is_a_page_of_its_own(tmp_path: Path) -> None:
    async def site(request: web.Request) -> web.StreamResponse:
        if request.path == "/":
            return html(links("/slow", "/target"))
        if request.path == "/slow":
            return refresh("/target", delay=30)
        return html("target")

    docs, errors, _ = await run_crawl(tmp_path, site)
    assert paths([d.final_url for d in docs]) == ["", "slow", "target"]
    assert errors == []


async def test_a_meta_refresh_loop_is_a_redirect_loop(tmp_path: Path) -> None:
    async def site(request: web.Request) -> web.StreamResponse:
        if request.path == "/":
            return html(links("/a"))
        return refresh("/b" if request.path == "/a" else "/a")

    docs, errors, _ = await run_crawl(tmp_path, site)
    assert len(docs) == 1
    assert [e.code for e in errors] == ["redirect_loop"]


def canonical_site(other_port: list[int]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def site(request: web.Request) -> web.Response:
        p = request.path
        if p == "/":
            return html(links("/a", "/b?sort=1", "/c", "/d", "/e", "/h"))
        if p == "/h":  # the header form (what a PDF would send)
            return html("h", Link='</c>; rel="canonical"')
        if p in ("/a", "/b"):
            return html(p, '<link rel="canonical" href="/c#x">')
        if p == "/d":  # off-site canonical: ignored
            return html(p, f'<link rel="canonical" href="http://127.0.0.1:{other_port[0]}/c">')
        return html(p, '<link rel="canonical" href="/c">' if p == "/c" else "")

    return site


@pytest.mark.parametrize("follow", [True, False])
async def test_rel_canonical_names_one_page_only_when_asked(tmp_path: Path, follow: bool) -> None:
    async def other(request: web.Request) -> web.Response:
        return html("other")

    async with serve_handler(other) as other_port:
        docs, errors, _ = await run_crawl(
            tmp_path, canonical_site([other_port]), follow_canonical=follow, max_concurrency=1
        )
    got = paths([d.url for d in docs])
    if follow:
        # /a is stored first and claims /c; /b, /h (by its Link header) and the queued
        # /c are its duplicates
        assert got == ["", "a", "d", "e"]
        assert sorted(paths([e.url for e in errors])) == ["b?sort=1", "c", "h"]
        assert {e.code for e in errors} == {"duplicate"}
    else:
        assert got == ["", "a", "b?sort=1", "c", "d", "e", "h"]
        assert errors == []


@pytest.mark.parametrize("strip", [True, False])
async def test_tracking_parameters_are_one_page_when_stripped(tmp_path: Path, strip: bool) -> None:
    hits: list[str] = []

    async def site(request: web.Request) -> web.Response:
        hits.append(request.path_qs)
        if request.path == "/":
            return html(
                links("/p?utm_source=a", "/p?utm_medium=b&gclid=1", "/p", "/q?id=3&fbclid=z")
            )
        return html(request.path_qs)

    docs, errors, _ = await run_crawl(tmp_path, site, strip_tracking_parameters=strip)
    got = paths([d.url for d in docs])
    if strip:
        assert got == ["", "p", "q?id=3"]
        assert not any("utm_" in h or "clid" in h for h in hits)  # never even fetched
    else:
        assert len(got) == 5
    assert errors == []


PERMUTATIONS = ["/docs", "/docs/", "/docs/index.html", "/docs/index.php", "/docs/index.asp"]


@pytest.mark.parametrize("dedupe", [True, False])
async def test_similar_urls_are_one_page_only_with_dedupe_similar_urls(
    tmp_path: Path, dedupe: bool
) -> None:
    async def site(request: web.Request) -> web.Response:
        if request.path == "/":
            return html(links(*PERMUTATIONS))
        return html("docs")

    docs, errors, _ = await run_crawl(tmp_path, site, dedupe_similar_urls=dedupe)
    got = paths([d.url for d in docs])
    if dedupe:
        assert len(got) == 2  # the root and one of the five spellings
    else:  # normalize folds the slash and index.html; index.php/.asp stay apart
        assert sorted(got) == ["", "docs", "docs/index.asp", "docs/index.php"]
    assert errors == []


async def robots_site(request: web.Request) -> web.Response:
    p = request.path
    if p == "/":
        return html(links("/ni-meta", "/ni-header", "/nf-meta", "/nf-header", "/not-us"))
    if p == "/ni-meta":
        return html(links("/behind-noindex"), '<meta name="robots" content="noindex">')
    if p == "/ni-header":
        return html("x", **{"X-Robots-Tag": "noindex"})
    if p == "/nf-meta":
        return html(links("/behind-nofollow"), '<meta name="ROBOTS" content="nofollow">')
    if p == "/nf-header":
        return html(links("/behind-nofollow-2"), **{"X-Robots-Tag": "pagesift: none"})
    if p == "/not-us":
        return html("x", **{"X-Robots-Tag": "otherbot: noindex, nofollow"})
    return html(p)


@pytest.mark.parametrize("ignore", [False, True])
async def test_noindex_and_nofollow_are_honoured_unless_ignored(
    tmp_path: Path, ignore: bool
) -> None:
    docs, errors, blocked = await run_crawl(tmp_path, robots_site, ignore_robots_meta=ignore)
    got = paths([d.url for d in docs])
    if ignore:
        assert got == sorted(
            ["", "ni-meta", "ni-header", "nf-meta", "nf-header", "not-us", "behind-noindex",
             "behind-nofollow", "behind-nofollow-2"]
        )  # fmt: skip
        assert errors == [] and blocked == []
    else:
        # noindex: not stored but its links followed; nofollow: stored, links not
        assert got == sorted(["", "nf-meta", "not-us", "behind-noindex"])
        assert sorted(paths([e.url for e in errors])) == ["nf-header", "ni-header", "ni-meta"]
        assert {e.code for e in errors} == {"robots_noindex"}
        assert sorted(paths(blocked)) == ["nf-header", "ni-header", "ni-meta"]


# --- a non-ASCII host, resolved by a test resolver ------------------------------------------


async def test_a_non_ascii_host_is_fetched_by_its_uts46_a_label(
    tmp_path: Path, make_engine: EngineMaker
) -> None:
    seen_hosts: list[str] = []

    async def site(request: web.Request) -> web.Response:
        seen_hosts.append(request.headers.get("Host", ""))
        if request.path == "/":
            return html(
                links("http://BÜCHER.test:{port}/b".replace("{port}", str(request.url.port)))
            )
        return html("b")

    async with serve_handler(site) as port:
        resolver = MapResolver({"xn--bcher-kva.test": "127.0.0.1"})
        config = node_config(tmp_path, allow_private_networks=False, respect_robots=False)
        engine = await make_engine(
            config,
            guard=AddressGuard(exempt=frozenset({("127.0.0.1", port)})),
            resolver=resolver,
        )
        page = await engine.scrape(f"http://bücher.test:{port}/", jobs_pb2.ScrapeOptions())
        linked = await engine.scrape(page.links[0], jobs_pb2.ScrapeOptions())
    assert seen_hosts == [f"xn--bcher-kva.test:{port}"] * 2
    assert set(resolver.asked) == {"xn--bcher-kva.test"}
    assert page.document.final_url == f"http://xn--bcher-kva.test:{port}/"
    assert urls.normalize(page.links[0]) == f"http://xn--bcher-kva.test:{port}/b"
    assert linked.document.final_url == f"http://xn--bcher-kva.test:{port}/b"


async def test_www_and_bare_host_links_are_one_page_in_a_live_crawl_with_dedupe(
    tmp_path: Path, store: Store
) -> None:
    """The job runtime's dedupe, with the web faked (``FakeEngine``): the fetching of
    these host spellings is what ``test_a_non_ascii_host_is_fetched...`` tests."""

    def site(url: str) -> Page:
        if urlsplit(url).path == "/":
            return page(
                url,
                *("http://www.site.test/a", "http://site.test/a", "/b"),
                *("http://WWW.Site.Test/b/", "http://www.site.test/"),
            )
        return page(url)

    engine = FakeEngine(site)
    config = node_config(tmp_path, allow_private_networks=False, respect_robots=False)
    jobs = Jobs(store, engine, config)
    try:
        await jobs.start()
        request = jobs_pb2.StartCrawlRequest(
            url="http://site.test/",
            dedupe_similar_urls=True,
            sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
        )
        reg = await jobs.register(specs.CrawlSpec(request, 50, None), "anonymous")

        async def finished() -> records.JobMeta | None:
            meta = records.load_meta(store, reg.id)
            return meta if meta is not None and meta.terminal else None

        meta = await eventually(finished, "the crawl's end", timeout=30)
        docs = views.read_documents(store, reg.id, 0, 100)
    finally:
        await jobs.close()
    assert meta.state == "completed", meta.note
    assert sorted(p.rstrip("/") for p in paths([d.url for d in docs])) == ["", "a", "b"]
    assert len(engine.requests) == 3  # one request per page, whichever spelling came first
    assert {urlsplit(u).hostname for u in engine.requests} <= {"site.test", "www.site.test"}


@pytest.mark.system
async def test_a_sigkill_mid_maze_keeps_one_document_per_page_and_one_entry_per_url(
    tmp_path: Path,
) -> None:
    requests: list[str] = []

    async def site(request: web.Request) -> web.StreamResponse:
        requests.append(request.path)
        p = request.path
        if p == "/robots.txt":
            raise web.HTTPNotFound()
        await asyncio.sleep(0.02)
        if p == "/":
            return html(links(*(f"/r{i}" for i in range(60)), *(f"/f{i}" for i in range(10))))
        if p.startswith("/r"):  # sixty ways into ten pages
            return web.Response(status=301, headers={"Location": f"/f{int(p[2:]) % 10}"})
        return html(p)

    async with serve_handler(site) as port:
        server = ServeProc(tmp_path, "server", config={"extract_processes": 0})
        try:
            await server.start()
            async with grpc.aio.insecure_channel(server.address) as ch:
                job = await jobs_pb2_grpc.JobServiceStub(ch).StartCrawl(
                    jobs_pb2.StartCrawlRequest(
                        url=f"http://127.0.0.1:{port}/",
                        max_concurrency=4,
                        sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
                    )
                )

            async def mid_maze() -> bool | None:
                return True if len(requests) >= 40 else None

            await eventually(mid_maze, "forty requests", timeout=30)
            server.kill()
            await server.start()
            async with grpc.aio.insecure_channel(server.address) as ch:
                stub = jobs_pb2_grpc.JobServiceStub(ch)
                final = await wait_terminal(stub, job.id, timeout=60)
                docs = await all_documents(stub, job.id)
                errors = (await stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=job.id))).errors
        finally:
            server.stop()
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert final.completed + final.failed == final.total == 71
    finals = [urls.normalize(d.final_url) for d in docs]
    assert len(finals) == len(set(finals)) == 11  # the root and ten pages, once each
    assert {e.code for e in errors} == {"duplicate"}
    entries = [urls.normalize(d.url) for d in docs] + [urls.normalize(e.url) for e in errors]
    assert len(entries) == len(set(entries)) == 71  # every URL: one document or one note
