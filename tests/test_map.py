"""Map: a site's URLs from its sitemaps and a shallow link walk, nothing stored.

Real loopback aiohttp sites and a real in-process node (gRPC server, store, engine);
the address-guard test runs ``mapper.map_site`` over a real ``HttpEngine`` whose guard
exempts only the site's own endpoint, with a counting listener behind the blocked
address. The pure parts (ranking, dedupe, batching) are tested directly.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from aiohttp import web

from pagesift.cli import amain
from pagesift.core.api.paging import MAP_BATCH_URLS, url_batches
from pagesift.core.jobs import records
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.primary.jobs import mapper
from pagesift.v1 import jobs_pb2
from tests.fakeengine import FakeEngine, page
from tests.helpers import (
    EngineMaker,
    MapResolver,
    RunningNode,
    in_process_node,
    node_config,
    serve_handler,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _html(*links: str) -> web.Response:
    body = "".join(f'<a href="{href}">{href}</a> ' for href in links)
    return web.Response(text=f"<html><body>{body}</body></html>", content_type="text/html")


def _urlset(*locs: str) -> bytes:
    items = "".join(f"<url><loc>{loc}</loc></url>" for loc in locs)
    return f'<?xml version="1.0"?><urlset>{items}</urlset>'.encode()


def _index(*locs: str) -> bytes:
    items = "".join(f"<sitemap><loc>{loc}</loc></sitemap>" for loc in locs)
    return f'<?xml version="1.0"?><sitemapindex>{items}</sitemapindex>'.encode()


class SmallSite:
    """/ -> /l1 -> /l2 -> /l3 (links), /private/* disallowed by robots.txt, and a
    sitemap index (robots.txt Sitemap:) nesting a gzipped sitemap and another index."""

    def __init__(self) -> None:
        self.fetched: list[str] = []
        self.port = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.fetched.append(path)
        if path == "/robots.txt":
            text = f"User-agent: *\nDisallow: /private\nSitemap: {self.url('/smi.xml')}\n"
            return web.Response(text=text)
        if path == "/smi.xml":
            return web.Response(body=_index(self.url("/sm/a.xml.gz"), self.url("/sm/inner.xml")))
        if path == "/sm/a.xml.gz":
            body = gzip.compress(_urlset(self.url("/s1"), self.url("/s2"), self.url("/private/x")))
            return web.Response(body=body, content_type="application/x-gzip")
        if path == "/sm/inner.xml":
            return web.Response(body=_index(self.url("/sm/b.xml")))
        if path == "/sm/b.xml":
            return web.Response(body=_urlset(self.url("/s3"), self.url("/s1")))
        if path == "/":
            return _html("/l1", "/private/y", "http://elsewhere.invalid/x", "/s2")
        if path == "/l1":
            return _html("/l2", "/")
        if path == "/l2":
            return _html("/l3")
        return _html()


async def _map(node: RunningNode, req: jobs_pb2.MapRequest) -> list[str]:
    return [u async for batch in node.stub.Map(req) for u in batch.urls]


async def test_nested_gzipped_sitemap_index_is_read_without_fetching_a_page(
    tmp_path: Path,
) -> None:
    site = SmallSite()
    async with serve_handler(site.handle) as port, in_process_node(tmp_path) as node:
        site.port = port
        got = await _map(
            node, jobs_pb2.MapRequest(url=site.url("/"), sitemap=jobs_pb2.SITEMAP_MODE_ONLY)
        )
    assert got == [site.url("/s1"), site.url("/s2"), site.url("/s3")]  # sitemap order, once
    pages = [p for p in site.fetched if not p.startswith("/sm") and p != "/robots.txt"]
    assert pages == []  # only robots.txt and the sitemap files were fetched


async def test_link_walk_finds_pages_not_in_the_sitemap_to_link_depth_two(
    tmp_path: Path,
) -> None:
    site = SmallSite()
    async with serve_handler(site.handle) as port, in_process_node(tmp_path) as node:
        site.port = port
        got = await _map(
            node, jobs_pb2.MapRequest(url=site.url("/"), sitemap=jobs_pb2.SITEMAP_MODE_SKIP)
        )
    assert got == [site.url("/"), site.url("/l1"), site.url("/s2"), site.url("/l2")]
    assert site.url("/l3") not in got  # link depth 3
    assert "/l2" not in site.fetched  # a depth-2 page is listed, not fetched
    assert not any(p.startswith("/sm") for p in site.fetched)  # sitemap skipped


async def test_include_mode_lists_start_url_then_sitemap_then_walk_and_stores_nothing(
    tmp_path: Path,
) -> None:
    site = SmallSite()
    async with serve_handler(site.handle) as port, in_process_node(tmp_path) as node:
        site.port = port
        got = await _map(node, jobs_pb2.MapRequest(url=site.url("/")))
        assert records.all_job_ids(node.node.store()) == []
    expected = ["/", "/s1", "/s2", "/s3", "/l1", "/l2"]
    assert got == [site.url(p) for p in expected]


async def test_robots_disallowed_urls_are_neither_fetched_nor_listed(tmp_path: Path) -> None:
    site = SmallSite()
    async with serve_handler(site.handle) as port, in_process_node(tmp_path) as node:
        site.port = port
        got = await _map(node, jobs_pb2.MapRequest(url=site.url("/")))
    assert not [u for u in got if "/private" in u]  # /private/x (sitemap), /private/y (link)
    assert not [p for p in site.fetched if p.startswith("/private")]


async def test_search_ranks_matches_first_case_insensitively_ties_in_discovery_order(
    tmp_path: Path,
) -> None:
    site = SmallSite()
    async with serve_handler(site.handle) as port, in_process_node(tmp_path) as node:
        site.port = port
        got = await _map(node, jobs_pb2.MapRequest(url=site.url("/"), search="L"))
    # "http://127.0.0.1:PORT" has no "l": only /l1 and /l2 match
    assert got == [site.url(p) for p in ["/l1", "/l2", "/", "/s1", "/s2", "/s3"]]


async def test_limit_cuts_the_list_after_the_ranking(tmp_path: Path) -> None:
    site = SmallSite()
    async with serve_handler(site.handle) as port, in_process_node(tmp_path) as node:
        site.port = port
        first = await _map(node, jobs_pb2.MapRequest(url=site.url("/"), limit=2))
        searched = await _map(node, jobs_pb2.MapRequest(url=site.url("/"), limit=1, search="/l2"))
    assert first == [site.url("/"), site.url("/s1")]
    assert searched == [site.url("/l2")]  # found by the walk, after the sitemap's URLs


async def test_a_thousand_page_site_is_mapped_whole_by_the_link_walk(tmp_path: Path) -> None:
    # / -> 27 sections -> 36 pages each: 1 + 27 + 972 = 1,000 pages, link depth <= 2
    async def handle(request: web.Request) -> web.StreamResponse:
        parts = request.path.strip("/").split("/")
        if request.path == "/":
            return _html(*(f"/sec{i}" for i in range(27)))
        if len(parts) == 1 and parts[0].startswith("sec"):
            return _html("/", *(f"/{parts[0]}/p{j}" for j in range(36)))
        if request.path == "/robots.txt":
            return web.Response(status=404)
        return _html("/")

    async with serve_handler(handle) as port, in_process_node(tmp_path) as node:
        got = await _map(
            node,
            jobs_pb2.MapRequest(
                url=f"http://127.0.0.1:{port}/", sitemap=jobs_pb2.SITEMAP_MODE_SKIP
            ),
        )
    assert len(got) == len(set(got)) == 1_000


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (jobs_pb2.MapRequest(url="ftp://example.com/"), "url"),
        (jobs_pb2.MapRequest(url="http://example.com/", limit=-1), "limit"),
        (jobs_pb2.MapRequest(url="http://example.com/", limit=100_001), "limit"),
        (jobs_pb2.MapRequest(url="http://example.com/", search="a\nb"), "search"),
        (jobs_pb2.MapRequest(url="http://example.com/", search="x" * 1_001), "search"),
        (jobs_pb2.MapRequest(url="http://example.com/", include_paths=["("]), "include_paths[0]"),
        (
            jobs_pb2.MapRequest(url="http://example.com/", exclude_paths=["a", "["]),
            "exclude_paths[1]",
        ),
        (jobs_pb2.MapRequest(url="http://example.com/", sitemap=99), "sitemap"),  # type: ignore[arg-type]
    ],
)
async def test_bad_map_input_is_invalid_argument_naming_the_field(
    tmp_path: Path, request_: jobs_pb2.MapRequest, field: str
) -> None:
    async with in_process_node(tmp_path) as node:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _map(node, request_)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(f"{field}:")


async def test_the_cli_prints_one_url_a_line_or_one_json_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = SmallSite()
    async with serve_handler(site.handle) as port, in_process_node(tmp_path) as node:
        site.port = port
        root = site.url("/")
        assert await amain(["map", root, "--sitemap", "skip", "--server", node.address]) == 0
        lines = capsys.readouterr().out.splitlines()
        args = ["map", root, "--search", "s", "--limit", "2", "--json", "--server", node.address]
        assert await amain(args) == 0
        obj = json.loads(capsys.readouterr().out)
    assert lines == [site.url(p) for p in ["/", "/l1", "/s2", "/l2"]]
    assert obj == {"url": root, "count": 2, "urls": [site.url("/s1"), site.url("/s2")]}


# ---------------------------------------------------------------- the address guard


async def test_a_link_to_a_blocked_address_is_never_fetched_nor_listed(
    tmp_path: Path, make_engine: EngineMaker
) -> None:
    secret_hits: list[str] = []

    async def secret(request: web.Request) -> web.StreamResponse:
        secret_hits.append(request.path)
        return _html()

    async def handle(request: web.Request) -> web.StreamResponse:
        port = request.url.port
        if request.path == "/":
            return _html("/ok", f"http://inner.site.test:{port}/secret")
        return _html()

    async with serve_handler(handle) as port:
        # the same port on 127.0.0.2: what inner.site.test resolves to (not exempt)
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", secret)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.2", port).start()
        config = node_config(tmp_path, allow_private_networks=False, respect_robots=False)
        engine = await make_engine(
            config,
            guard=AddressGuard(exempt=frozenset({("127.0.0.1", port)})),
            resolver=MapResolver({"site.test": "127.0.0.1", "inner.site.test": "127.0.0.2"}),
        )
        try:
            req = jobs_pb2.MapRequest(
                url=f"http://site.test:{port}/",
                allow_subdomains=True,
                sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
            )
            got = await mapper.map_site(engine, req, config)
        finally:
            await runner.cleanup()
    assert got == [f"http://site.test:{port}/", f"http://site.test:{port}/ok"]
    assert secret_hits == []


async def test_map_lists_no_url_the_engines_robots_verdict_refuses(tmp_path: Path) -> None:
    """The walk asks the Engine protocol (``robots_allowed``) before listing a sitemap URL
    or a link, whatever the engine: a URL robots.txt refuses is never listed."""
    root = "http://site.test/"
    engine = FakeEngine(
        lambda url: page(url, "/l1", "/no-link"),
        sitemaps={"http://site.test": [root + "s1", root + "no-sm", root + "s2"]},
        disallowed=frozenset({root + "no-sm", root + "no-link"}),
    )
    config = node_config(tmp_path)
    req = jobs_pb2.MapRequest(url=root)
    got = await mapper.map_site(engine, req, config)
    assert got == [root, root + "s1", root + "s2", root + "l1"]


# ---------------------------------------------------------------- pure parts


def test_rank_puts_matches_first_and_keeps_discovery_order_within_each_group() -> None:
    found = ["http://h/a", "http://h/Blog/1", "http://h/b", "http://h/blog/2"]
    assert mapper.rank(found, "BLOG") == [
        "http://h/Blog/1", "http://h/blog/2", "http://h/a", "http://h/b",
    ]  # fmt: skip
    assert mapper.rank(found, "") == found
    assert mapper.rank(found, "nothing") == found


def test_listing_dedupes_by_page_key_and_never_lists_a_dropped_url_again() -> None:
    listing = mapper.Listing(lambda u: u.rstrip("/").lower())
    listing.add(["http://h/a", "http://h/b", "http://h/a"])
    listing.drop("http://h/b")
    listing.add(["http://h/b", "http://h/c"])
    assert list(listing.urls) == ["http://h/a", "http://h/c"]
    assert listing.key_of("HTTP://H/A/") == "http://h/a"


def test_map_batches_hold_every_url_in_order_and_stay_small() -> None:
    found = [f"http://h/{i}" for i in range(2_500)] + ["http://h/" + "x" * 900_000] * 2
    batches = url_batches(found)
    assert [u for b in batches for u in b] == found
    assert max(len(b) for b in batches) == MAP_BATCH_URLS
    assert batches[-1] == ["http://h/" + "x" * 900_000]  # a long URL comes alone
    assert url_batches([]) == []
