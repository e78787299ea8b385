"""``ScrapeOptions.skip_tls_verification`` on every request a page needs.

A real in-process node against a real loopback HTTPS site whose certificate is
self-signed (``tests.tlssite``): with the option, robots.txt, the sitemaps a crawl reads
(named by robots.txt), the page itself and a browser render are all fetched; without
it, each is a clear page error (``tls``, gRPC ABORTED with reason PAGE_FETCH_FAILED),
never UNKNOWN. A copy of robots.txt read without verification never decides a request
that verifies (``robots.RobotsCache``: one copy per TLS choice).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web

from pagesift.client.errors import error_info_of
from pagesift.v1 import jobs_pb2
from tests.helpers import (
    RunningNode,
    all_documents,
    in_process_node,
    serve_handler,
    wait_terminal,
)
from tests.tlssite import Route, tls_site

PAGE = "<html><head><title>Behind TLS</title></head><body><p>secret garden</p></body></html>"
HTML = "text/html"


def routes(robots: str) -> dict[str, Route]:
    return {
        "/robots.txt": (200, "text/plain", robots),
        "/page": (200, HTML, PAGE),
        "/private": (200, HTML, PAGE),
    }


async def scrape(node: RunningNode, url: str, **options: Any) -> jobs_pb2.ScrapeResponse:
    opts = jobs_pb2.ScrapeOptions(engine=jobs_pb2.FETCH_ENGINE_HTTP, **options)
    resp: jobs_pb2.ScrapeResponse = await node.stub.Scrape(
        jobs_pb2.ScrapeRequest(url=url, options=opts), timeout=30
    )
    return resp


async def refused(node: RunningNode, url: str, **options: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await scrape(node, url, **options)
    return err.value


def assert_tls_error(err: grpc.aio.AioRpcError) -> None:
    """A TLS failure is the page's own error: ABORTED, PAGE_FETCH_FAILED, code tls."""
    info = error_info_of(err)
    assert err.code() == grpc.StatusCode.ABORTED, (err.code(), err.details())
    assert info is not None and info.reason == "PAGE_FETCH_FAILED", err.details()
    assert info.metadata["code"] == "tls"
    assert "CERTIFICATE_VERIFY_FAILED" in (err.details() or "")


async def test_robots_txt_is_read_without_verification_when_the_request_skips_it(
    tmp_path: Path,
) -> None:
    async with (
        tls_site(tmp_path, routes("User-agent: *\nDisallow: /private\n")) as site,
        in_process_node(tmp_path / "node", browser_executable="") as node,
    ):
        doc = (await scrape(node, site.root + "page", skip_tls_verification=True)).document
        assert doc.status_code == 200 and "secret garden" in doc.markdown
        assert "/robots.txt" in site.asked  # it was fetched and read, not skipped
        kept_out = await refused(node, site.root + "private", skip_tls_verification=True)
        assert kept_out.code() == grpc.StatusCode.PERMISSION_DENIED  # its Disallow decided
        # a request that verifies never reads the copy fetched without verification
        verifying = await refused(node, site.root + "page")
        assert_tls_error(verifying)
        assert "(fetching robots.txt)" in (verifying.details() or "")


async def plain_http(request: web.Request) -> web.StreamResponse:
    return web.Response(text="no TLS here")


async def test_the_page_itself_is_fetched_without_verification_only_when_asked(
    tmp_path: Path,
) -> None:
    async with (
        tls_site(tmp_path, routes("")) as site,
        serve_handler(plain_http) as plain_port,
        in_process_node(tmp_path / "node", browser_executable="", respect_robots=False) as node,
    ):
        doc = (await scrape(node, site.root + "page", skip_tls_verification=True)).document
        assert doc.status_code == 200 and "secret garden" in doc.markdown
        err = await refused(node, site.root + "page")
        # TLS that fails for another reason than the certificate (a plain HTTP port) is
        # a tls page error too, and does not send the caller to an option it already set
        no_tls = await refused(node, f"https://127.0.0.1:{plain_port}/", skip_tls_verification=True)
    assert_tls_error(err)
    assert "skip_tls_verification" in (err.details() or "")  # the way out, named
    info = error_info_of(no_tls)
    assert no_tls.code() == grpc.StatusCode.ABORTED and info is not None
    assert info.metadata["code"] == "tls", no_tls.details()
    assert "skip_tls_verification" not in (no_tls.details() or ""), no_tls.details()


async def test_a_crawl_reads_the_sitemap_robots_txt_names_without_verification(
    tmp_path: Path,
) -> None:
    """robots.txt names the sitemap (not at /sitemap.xml) and the sitemap lists a page
    no link reaches: the crawl finds it only if both were read without verification.
    (The node does not judge pages by robots.txt here: the sitemap path alone is tested.)"""
    site_routes: dict[str, Route] = {
        "/": (200, HTML, "<html><body><a href='/page'>page</a></body></html>"),
        "/page": (200, HTML, PAGE),
        "/orphan": (200, HTML, "<html><body><p>only in the sitemap</p></body></html>"),
    }
    async with tls_site(tmp_path, site_routes) as site:
        sitemap = (
            '<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"<url><loc>{site.root}orphan</loc></url></urlset>"
        )
        site_routes["/maps/pages.xml"] = (200, "application/xml", sitemap)
        site_routes["/robots.txt"] = (200, "text/plain", f"Sitemap: {site.root}maps/pages.xml\n")
        async with in_process_node(
            tmp_path / "node", browser_executable="", respect_robots=False
        ) as node:
            options = jobs_pb2.ScrapeOptions(
                engine=jobs_pb2.FETCH_ENGINE_HTTP, skip_tls_verification=True
            )
            started = await node.stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url=site.root, limit=10, options=options)
            )
            final = await wait_terminal(node.stub, started.id)
            docs = await all_documents(node.stub, started.id)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert "/maps/pages.xml" in site.asked
    assert {d.url.removeprefix(site.root.rstrip("/")) for d in docs} >= {"/", "/page", "/orphan"}


@pytest.mark.browser
async def test_a_render_accepts_the_certificate_only_when_the_request_skips_verification(
    tmp_path: Path,
) -> None:
    async with (
        tls_site(tmp_path, routes("")) as site,
        in_process_node(tmp_path / "node") as node,  # robots.txt read over the same TLS
    ):
        browser = jobs_pb2.FETCH_ENGINE_BROWSER
        opts = jobs_pb2.ScrapeOptions(engine=browser, skip_tls_verification=True)
        req = jobs_pb2.ScrapeRequest(url=site.root + "page", options=opts)
        doc = (await node.stub.Scrape(req, timeout=60)).document
        assert doc.status_code == 200 and "secret garden" in doc.markdown
        assert doc.engine == browser
        with pytest.raises(grpc.aio.AioRpcError) as err:
            verifying = jobs_pb2.ScrapeOptions(engine=browser)
            await node.stub.Scrape(
                jobs_pb2.ScrapeRequest(url=site.root + "page", options=verifying), timeout=60
            )
    info = error_info_of(err.value)
    assert err.value.code() == grpc.StatusCode.ABORTED, err.value.details()
    assert info is not None and info.metadata["code"] == "tls"
