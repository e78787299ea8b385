"""Sanity tests of the demo site: what it serves agrees with the manifest it publishes.

The central check crawls the site with a plain aiohttp client (breadth-first,
robots-aware, calendar excluded) and asserts that the documents and errors found
are exactly ``expected_documents`` / ``expected_errors``, and that every page's
links are the ones the manifest lists. Everything is bounded and runs in seconds.
"""

from __future__ import annotations

import asyncio
import re
import time
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import aiohttp
import protego
import pytest

from pagesift.demo.site import (
    BIG_PATH,
    CALENDAR_ENTRY,
    CALENDAR_EXCLUDE,
    SLOW_PATH,
    Site,
    build_site,
    normalize_url,
    serve_site,
)

PAGES = 120
SLOW = 1.0
READ_TIMEOUT = 0.3
BIG = 256 * 1024
CAP = 64 * 1024
DELAY = 0.25


@pytest.fixture
async def served() -> AsyncIterator[tuple[Site, str]]:
    site = build_site(PAGES, seed=7, crawl_delay=DELAY, slow_seconds=SLOW, big_bytes=BIG)
    runner, root = await serve_site(site)
    try:
        yield site, root
    finally:
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.tags: set[str] = set()
        self.title = ""
        self.lang = ""
        self.description = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "a" and a.get("href") is not None:
            self.hrefs.append(a["href"] or "")
        elif tag == "title":
            self._in_title = True
        elif tag == "html":
            self.lang = a.get("lang") or ""
        elif tag == "meta" and a.get("name") == "description":
            self.description = a.get("content") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data


def _parse(text: str) -> _Parser:
    p = _Parser()
    p.feed(text)
    p.close()
    return p


@dataclass
class _Result:
    outcome: str  # "document" or an error code
    final_url: str = ""
    title: str = ""
    links: set[str] = field(default_factory=set)  # normalized same-origin URLs


async def _fetch(session: aiohttp.ClientSession, url: str, origin: str) -> _Result:
    timeout = aiohttp.ClientTimeout(sock_read=READ_TIMEOUT)
    try:
        async with session.get(url, max_redirects=5, timeout=timeout) as resp:
            if resp.status >= 400:
                return _Result("http_status")
            if resp.content_type == "application/pdf":  # the demo's PDF has no pages
                return _Result("parse_failed")
            if resp.content_type != "text/html":
                return _Result("unsupported_content")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(16 * 1024):
                body += chunk
                if len(body) > CAP:
                    return _Result("too_large")
            page = _parse(body.decode(resp.charset or "utf-8"))
            base = str(resp.url)
            links = set()
            for href in page.hrefs:
                absolute = normalize_url(urljoin(base, href))
                if absolute.startswith(origin + "/"):
                    links.add(absolute)
            return _Result("document", normalize_url(base), page.title, links)
    except aiohttp.TooManyRedirects:
        return _Result("redirect_loop")
    except TimeoutError:
        return _Result("timeout")


async def _crawl(
    session: aiohttp.ClientSession, root: str, seeds: list[str]
) -> tuple[dict[str, _Result], dict[str, int]]:
    """BFS from ``seeds``: robots-aware, /calendar/ excluded; returns results and depths."""
    origin = root.rstrip("/")
    async with session.get(origin + "/robots.txt") as resp:
        robots = protego.Protego.parse(await resp.text())
    results: dict[str, _Result] = {}
    depth = dict.fromkeys(seeds, 0)
    queue = deque(seeds)
    while queue:
        url = queue.popleft()
        path = urlsplit(url).path
        if re.search(CALENDAR_EXCLUDE, path):
            continue
        if not robots.can_fetch(url, "pagesift-test"):
            results[url] = _Result("robots_disallowed")
            continue
        res = results[url] = await _fetch(session, url, origin)
        for link in sorted(res.links):
            if link not in depth:
                depth[link] = depth[url] + 1
                queue.append(link)
        assert len(results) < 1000, "crawl does not terminate"
    return results, depth


async def _sitemap_urls(session: aiohttp.ClientSession, root: str) -> list[str]:
    async with session.get(urljoin(root, "/sitemap.xml")) as resp:
        assert resp.status == 200
        assert resp.content_type == "application/xml"
        tree = ET.fromstring(await resp.text())
    ns = {"sm": "http://www.sitemaps.org/schemas/sitemap/0.9"}
    return [loc.text or "" for loc in tree.findall("sm:url/sm:loc", ns)]


async def test_bfs_from_root_finds_exactly_the_manifest(
    served: tuple[Site, str], session: aiohttp.ClientSession
) -> None:
    site, root = served
    start = normalize_url(root)
    results, depth = await _crawl(session, root, [start])

    docs = {u for u, r in results.items() if r.outcome == "document"}
    errors = {u: r.outcome for u, r in results.items() if r.outcome != "document"}
    assert docs == site.expected_documents(root, sitemap="skip")
    assert errors == site.expected_errors(root, sitemap="skip")
    assert len(docs) == PAGES + 1 + 4 + 1 + 3  # articles, home, sections, about, redirects
    assert not docs & site.sitemap_only_urls(root)
    archive = {site.url(root, t) for t in site.manifest.redirects.values()}
    assert not archive & set(results)  # a redirect target's own URL is never met

    # redirect sources end at their targets; titles and links are the manifest's
    for url, final in site.redirect_sources(root).items():
        assert results[url].final_url == final
    for url in docs:
        res = results[url]
        assert res.title == site.title_of(url)
        listed = {site.url(root, p) for p in site.page_of(res.final_url).links}
        assert res.links == listed, url

    # robots-disallowed pages were never requested; others once each
    for path in site.manifest.private_paths:
        assert site.hits[path] == 0
    for url in docs - set(site.redirect_sources(root)):
        assert site.hits[urlsplit(url).path] == 1, url

    # link depth (max_depth semantics) agrees with the manifest's
    for d in (1, 2, 3):
        within = {u for u, r in results.items() if depth[u] <= d}
        found_docs = {u for u in within if results[u].outcome == "document"}
        assert found_docs == site.expected_documents(root, sitemap="skip", max_depth=d)
        found_errors = {u: results[u].outcome for u in within if u not in found_docs}
        assert found_errors == site.expected_errors(root, sitemap="skip", max_depth=d)


async def test_bfs_with_sitemap_adds_the_sitemap_only_pages(
    served: tuple[Site, str], session: aiohttp.ClientSession
) -> None:
    site, root = served
    locs = [normalize_url(u) for u in await _sitemap_urls(session, root)]
    results, _ = await _crawl(session, root, list(dict.fromkeys([normalize_url(root), *locs])))
    docs = {u for u, r in results.items() if r.outcome == "document"}
    errors = {u: r.outcome for u, r in results.items() if r.outcome != "document"}
    assert docs == site.expected_documents(root)
    assert errors == site.expected_errors(root)
    assert site.sitemap_only_urls(root) <= docs
    assert len(site.sitemap_only_urls(root)) == 3
    assert site.expected_documents(root, sitemap="only") == set(locs)


async def test_robots_txt(served: tuple[Site, str], session: aiohttp.ClientSession) -> None:
    site, root = served
    async with session.get(urljoin(root, "/robots.txt")) as resp:
        assert resp.status == 200
        assert resp.content_type == "text/plain"
        text = await resp.text()
    assert "Disallow: /private/" in text
    assert f"Sitemap: {root}sitemap.xml" in text
    rp = protego.Protego.parse(text)
    assert rp.crawl_delay("pagesift") == pytest.approx(DELAY)
    assert not rp.can_fetch(urljoin(root, "/private/admin.html"), "pagesift")
    assert rp.can_fetch(urljoin(root, "/docs/"), "pagesift")
    assert list(rp.sitemaps) == [f"{root}sitemap.xml"]
    # the private pages exist: only robots.txt keeps a crawler out
    for path in site.manifest.private_paths:
        async with session.get(urljoin(root, path)) as resp:
            assert resp.status == 200


async def test_sitemap_lists_manifest_urls(
    served: tuple[Site, str], session: aiohttp.ClientSession
) -> None:
    site, root = served
    locs = await _sitemap_urls(session, root)
    assert {normalize_url(u) for u in locs} == site.sitemap_urls(root)
    assert any(u.endswith("/index.html") for u in locs)  # needs normalizing
    assert site.sitemap_only_urls(root) <= site.sitemap_urls(root)
    for url in locs:
        async with session.get(url) as resp:
            assert resp.status == 200 and resp.content_type == "text/html", url


async def test_redirect_chains(served: tuple[Site, str], session: aiohttp.ClientSession) -> None:
    site, root = served
    for source, chain in site.manifest.redirect_chains.items():
        url = urljoin(root, source)
        for status, target in chain:
            async with session.get(url, allow_redirects=False) as resp:
                assert resp.status == status
                url = urljoin(url, resp.headers["Location"])
                assert urlsplit(url).path == target
        async with session.get(url, allow_redirects=False) as resp:
            assert resp.status == 200
        async with session.get(urljoin(root, source)) as resp:
            assert (
                normalize_url(str(resp.url)) == site.redirect_sources(root)[site.url(root, source)]
            )
            assert len(resp.history) == len(chain)
    assert any(len(chain) == 2 for chain in site.manifest.redirect_chains.values())
    assert {s for s, c in site.manifest.redirect_chains.items() if c[0][0] == 301}
    assert {s for s, c in site.manifest.redirect_chains.items() if c[0][0] == 302}


async def test_redirect_loop(served: tuple[Site, str], session: aiohttp.ClientSession) -> None:
    _, root = served
    url = urljoin(root, "/loop/a")
    seen = []
    for _ in range(4):
        async with session.get(url, allow_redirects=False) as resp:
            assert resp.status == 302
            url = urljoin(url, resp.headers["Location"])
            seen.append(urlsplit(url).path)
    assert seen == ["/loop/b", "/loop/a", "/loop/b", "/loop/a"]
    with pytest.raises(aiohttp.TooManyRedirects):
        async with session.get(urljoin(root, "/loop/a"), max_redirects=6):
            pass


async def test_calendar_is_endless_both_ways(
    served: tuple[Site, str], session: aiohttp.ClientSession
) -> None:
    _, root = served
    for rel, steps in (("next", 30), ("prev", 30)):
        url = urljoin(root, CALENDAR_ENTRY)
        seen = {url}
        for _ in range(steps):
            async with session.get(url) as resp:
                assert resp.status == 200
                text = await resp.text()
            m = re.search(rf'<a rel="{rel}" href="([^"]+)"', text)
            assert m, text
            url = urljoin(url, m.group(1))
            assert url not in seen
            seen.add(url)
        assert len(seen) == steps + 1
    async with session.get(urljoin(root, "/calendar/2026/12")) as resp:
        assert "2027/01" in await resp.text()


async def test_failing_pages(served: tuple[Site, str], session: aiohttp.ClientSession) -> None:
    site, root = served
    async with session.get(urljoin(root, "/missing.html")) as resp:
        assert resp.status == 404
    async with session.get(urljoin(root, "/server-error.html")) as resp:
        assert resp.status == 500
    async with session.get(urljoin(root, "/files/report.pdf")) as resp:
        assert resp.content_type == "application/pdf"
        assert (await resp.read()).startswith(b"%PDF")
    async with session.get(urljoin(root, "/data.json")) as resp:
        assert resp.content_type == "application/json"
        assert (await resp.json())["seed"] == 7
    async with session.get(urljoin(root, BIG_PATH)) as resp:
        assert resp.status == 200 and resp.content_type == "text/html"
        assert "Content-Length" not in resp.headers
        assert len(await resp.read()) == site.manifest.big_bytes == BIG

    t0 = time.monotonic()
    async with session.get(urljoin(root, SLOW_PATH)) as resp:
        assert resp.status == 200
        assert time.monotonic() - t0 < SLOW  # headers come at once
        with pytest.raises(asyncio.TimeoutError):
            async with asyncio.timeout(READ_TIMEOUT):
                await resp.read()
    assert site.manifest.slow_seconds == SLOW


async def test_slow_page_finishes_eventually(session: aiohttp.ClientSession) -> None:
    site = build_site(8, slow_seconds=0.2)
    runner, root = await serve_site(site)
    try:
        t0 = time.monotonic()
        async with session.get(urljoin(root, SLOW_PATH)) as resp:
            assert "Finally" in await resp.text()
        assert time.monotonic() - t0 >= 0.2
    finally:
        await runner.cleanup()


async def test_pages_look_real_and_aliases_match(
    served: tuple[Site, str], session: aiohttp.ClientSession
) -> None:
    site, root = served
    article = next(i for i in site.manifest.pages.values() if i.kind == "article")
    async with session.get(urljoin(root, article.path)) as resp:
        text = await resp.text()
    page = _parse(text)
    assert page.title == article.title
    assert page.lang == article.lang
    assert page.description == article.description
    for tag in ("header", "nav", "main", "article", "footer", "p", "ul", "pre", "code", "table"):
        assert tag in page.tags, tag
    hrefs = page.hrefs
    assert any(h.startswith("http://") for h in hrefs)  # absolute
    assert any(h.startswith("#") for h in hrefs)  # pure fragment
    assert any(h.startswith("mailto:") for h in hrefs)
    assert any("https://example.invalid" in h for h in hrefs)  # external

    all_hrefs: list[str] = []
    for path in list(site.manifest.pages)[:40]:
        async with session.get(urljoin(root, path)) as resp:
            all_hrefs += _parse(await resp.text()).hrefs
    assert any(h.startswith("../") for h in all_hrefs)
    assert any(h.endswith("index.html") for h in all_hrefs)
    assert any("#" in h and not h.startswith("#") for h in all_hrefs)

    for alias, canonical in site.manifest.aliases.items():
        async with (
            session.get(urljoin(root, alias)) as a,
            session.get(urljoin(root, canonical)) as b,
        ):
            assert a.status == b.status == 200
            assert await a.text() == await b.text()
    assert site.hits["/index.html"] == 1
    site.hits.clear()
    async with session.get(root) as resp:
        await resp.read()
    assert site.hits == {"/": 1}
    assert site.requests[-1][1] == "/"


async def test_deterministic_for_a_seed(session: aiohttp.ClientSession) -> None:
    a, b, c = build_site(40, seed=3), build_site(40, seed=3), build_site(40, seed=4)
    assert a.manifest == b.manifest
    assert a.manifest.pages != c.manifest.pages
    ra, root_a = await serve_site(a)
    rb, root_b = await serve_site(b)
    try:
        for path in list(a.manifest.pages)[:20]:
            async with session.get(urljoin(root_a, path)) as x:
                ta = (await x.text()).replace(root_a.rstrip("/"), "ORIGIN")
            async with session.get(urljoin(root_b, path)) as y:
                tb = (await y.text()).replace(root_b.rstrip("/"), "ORIGIN")
            assert ta == tb
    finally:
        await ra.cleanup()
        await rb.cleanup()


def test_contract_arguments() -> None:
    site = build_site(16)
    root = "HTTP://127.0.0.1:8080"
    docs = site.expected_documents(root)
    assert "http://127.0.0.1:8080/" in docs
    assert all(u.startswith("http://127.0.0.1:8080/") for u in docs)
    with pytest.raises(ValueError, match="unbounded"):
        site.expected_documents(root, exclude_calendar=False)
    assert site.expected_documents(root, max_depth=0) == docs  # 0: unlimited
    depth1 = site.expected_documents(root, max_depth=1)
    assert site.sitemap_urls(root) <= depth1  # sitemap URLs are depth 1
    assert site.expected_documents(root, sitemap="skip", max_depth=1) < depth1
    loose = site.expected_documents(root, allow_non_html=True, slow_times_out=False)
    assert loose - docs == {site.url(root, p) for p in ("/data.json", SLOW_PATH)}
    errors = site.expected_errors(root, big_too_large=False)
    assert site.url(root, BIG_PATH) not in errors
    assert set(site.expected_errors(root).values()) == {
        "robots_disallowed",
        "http_status",
        "timeout",
        "too_large",
        "unsupported_content",
        "parse_failed",
        "redirect_loop",
    }
    with pytest.raises(ValueError):
        build_site(3)


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("HTTP://Example.COM:80/a/index.html#x", "http://example.com/a"),
        ("http://h/docs/", "http://h/docs"),
        ("https://example.com:443", "https://example.com/"),
        (
            "http://127.0.0.1:8080/docs/x.html?b=1&a=2#f",
            "http://127.0.0.1:8080/docs/x.html?b=1&a=2",
        ),
        ("http://h/index.html", "http://h/"),
        ("http://h/index.htmlx", "http://h/index.htmlx"),
    ],
)
def test_normalize_url(url: str, want: str) -> None:
    assert normalize_url(url) == want
