"""The gateway answered as Firecrawl answers: the gaps firecrawl-py found, each closed.

Real parts throughout: a real in-process node and a real gateway in front of it
(``gateway_before``), driven by Firecrawl's own Python SDK where it has the call and by
plain HTTP where it does not; the TLS site is a real loopback HTTPS server with a
self-signed certificate (``tests.tlssite``). ``PreviewCrawlParams`` is asked of a real
gRPC server: one that lacks the RPC (UNIMPLEMENTED, what a node without it answers)
and one answering a fixed request, so the gateway's mapping is what is tested, not a
model's answer. Each test fails on the gateway before these fixes:

- skipTlsVerification: Firecrawl's default (true) reaches a self-signed site, false and
  Firecrawl's headers rule do not (the SDK's TLSError, 500 SCRAPE_SSL_ERROR);
- a page that answers 404 or 500 with a body is a document with its statusCode;
- search, and every Firecrawl route pagesift lacks, is a 501 saying why, never a 404;
  POST /v2/crawl/params-preview is routed (it was a 405);
- map's filterByPath is honoured, its other v2 keys and scrape's __experimental_omce
  are no unknown keys, a map limit past 30,000 is a 400 naming limit;
- details are zod-like issues; a 401 speaks HTTP; Firecrawl's probes answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import grpc.aio
import pytest
from aiohttp import web
from firecrawl import Firecrawl
from firecrawl.v2.utils.error_handler import BadRequestError, FirecrawlError, TLSError

from pagesift.demo.site import Site
from pagesift.gateway import translate, v1translate
from pagesift.gateway.models import ScrapeRequest
from pagesift.gateway.v1models import ScrapeRequestV1
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import (
    gateway_before,
    gateway_with_accounts,
    in_process_node,
    serve_handler,
)
from tests.tlssite import tls_site

T = TypeVar("T")
PAGE = "<html><head><title>Behind TLS</title></head><body><p>secret garden</p></body></html>"


@contextlib.asynccontextmanager
async def node_gateway(tmp: Path, **node_kw: Any) -> AsyncIterator[str]:
    """A node (no browser: these pages need none) and a gateway; the gateway's base URL."""
    async with (
        in_process_node(tmp / "node", browser_executable="", **node_kw) as node,
        gateway_before([node.address]) as base,
    ):
        yield base


async def sdk(call: Callable[..., T], *args: Any, **kw: Any) -> T:
    """One blocking SDK call off the loop, bounded."""
    return await asyncio.wait_for(asyncio.to_thread(call, *args, **kw), 60)


def client(base: str, key: str = "anonymous") -> Firecrawl:
    return Firecrawl(api_key=key, api_url=base)


async def post(base: str, path: str, body: Any, key: str = "") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as http,
        http.post(base + path, json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


async def call(base: str, method: str, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, base + path) as resp:
        return resp.status, await resp.json(content_type=None)


# ---------------------------------------------------------------- skipTlsVerification


async def test_skip_tls_verification_is_firecrawls_default_and_false_verifies(
    tmp_path: Path,
) -> None:
    routes = {"/robots.txt": (200, "text/plain", ""), "/page": (200, "text/html", PAGE)}
    async with tls_site(tmp_path, routes) as site, node_gateway(tmp_path) as base:
        doc = await sdk(client(base).scrape, site.root + "page")
        assert doc.markdown and "secret garden" in doc.markdown  # the default: true
        assert doc.metadata is not None and doc.metadata.status_code == 200
        with pytest.raises(TLSError) as refused:
            await sdk(client(base).scrape, site.root + "page", skip_tls_verification=False)
        # Firecrawl's rule: a request with headers verifies unless it says otherwise
        with pytest.raises(TLSError):
            await sdk(client(base).scrape, site.root + "page", headers={"X-Test": "1"})
        forced = await sdk(
            client(base).scrape,
            site.root + "page",
            headers={"X-Test": "1"},
            skip_tls_verification=True,
        )
    assert refused.value.status_code == 500 and refused.value.code == "SCRAPE_SSL_ERROR"
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    assert forced.markdown and "secret garden" in forced.markdown


def test_v1_keeps_its_own_tls_default_and_v2_follows_firecrawls_rule() -> None:
    v1 = v1translate.scrape_request(ScrapeRequestV1.model_validate({"url": "https://a.b/"}))[1]
    plain = translate.scrape_request(ScrapeRequest.model_validate({"url": "https://a.b/"}))
    headed = translate.scrape_request(
        ScrapeRequest.model_validate({"url": "https://a.b/", "headers": {"X-A": "b"}})
    )
    assert not v1.skip_tls_verification  # Firecrawl v1: false
    assert plain.skip_tls_verification and not headed.skip_tls_verification


# ---------------------------------------------------------------- an HTTP error status


async def error_page(request: web.Request) -> web.StreamResponse:
    status = 500 if request.path == "/broken" else 404
    html = f"<html><body><h1>{status}</h1><p>nothing here</p></body></html>"
    return web.Response(status=status, text=html, content_type="text/html")


async def test_a_page_that_answers_an_error_status_is_a_document_with_its_status(
    tmp_path: Path,
) -> None:
    async with (
        serve_handler(error_page) as port,
        node_gateway(tmp_path, respect_robots=False) as base,
    ):
        root = f"http://127.0.0.1:{port}/"
        missing = await sdk(client(base).scrape, root + "missing", formats=["markdown", "links"])
        broken = await sdk(client(base).scrape, root + "broken")
        status, v1 = await post(base, "/v1/scrape", {"url": root + "missing"})
    assert missing.metadata is not None and missing.metadata.status_code == 404
    assert missing.metadata.source_url == root + "missing"
    assert missing.markdown == "" and missing.links == []  # no body kept: said in error
    assert "404" in (missing.metadata.error or "")
    assert broken.metadata is not None and broken.metadata.status_code == 500
    assert status == 200 and v1["success"] is True
    assert v1["data"]["metadata"]["statusCode"] == 404


# ---------------------------------------------------------------- routes pagesift lacks

#: Firecrawl routes the SDKs (firecrawl-py 4.55, the JS SDK) call that pagesift lacks
UNSERVED = [
    ("POST", "/v2/search"), ("POST", "/v2/search/developer"), ("POST", "/v2/search/gov"),
    ("GET", "/v2/search/research?query=x"), ("POST", "/v1/search"),
    ("POST", "/v0/extract"), ("GET", "/v0/extract/abc"),
    ("POST", "/v2/agent"), ("GET", "/v2/agent/abc"), ("DELETE", "/v2/agent/abc"),
    ("POST", "/v1/deep-research"), ("POST", "/v1/llmstxt"), ("GET", "/v1/llmstxt/abc"),
    ("POST", "/v2/browser"), ("POST", "/v2/browser/abc/execute"), ("GET", "/v2/browser"),
    ("POST", "/v2/scrape/abc/interact"), ("DELETE", "/v2/scrape/abc/interact"),
    ("GET", "/v2/scrape/abc"), ("POST", "/v2/monitor"), ("PATCH", "/v2/monitor/abc"),
    ("GET", "/v2/monitor/abc/checks"), ("POST", "/v2/parse"), ("GET", "/v2/parse/formats"),
]  # fmt: skip


async def test_search_and_every_route_pagesift_lacks_is_a_501_saying_why(
    tmp_path: Path,
) -> None:
    async with node_gateway(tmp_path) as base:
        with pytest.raises(FirecrawlError) as searched:
            await sdk(client(base).search, "pagesift")
        answers = [(m, p, *await call(base, m, p)) for m, p in UNSERVED]
        unknown = await call(base, "GET", "/v2/no-such-route")
    assert searched.value.status_code == 501
    assert "search" in str(searched.value) and "not offered" in str(searched.value)
    for method, path, status, body in answers:
        assert status == 501, (method, path, status, body)
        assert body["success"] is False and body["code"] == "NOT_IMPLEMENTED", body
        assert "not offered by pagesift" in body["error"], body
    assert unknown[0] == 404 and unknown[1]["code"] == "NOT_FOUND"  # no Firecrawl route


class Unimplemented(jobs_pb2_grpc.JobServiceServicer):
    """A JobService without PreviewCrawlParams (every call UNIMPLEMENTED)."""


class FixedPreview(jobs_pb2_grpc.JobServiceServicer):
    """A JobService whose PreviewCrawlParams answers one fixed request."""

    def __init__(self) -> None:
        self.asked: list[jobs_pb2.PreviewCrawlParamsRequest] = []

    async def PreviewCrawlParams(
        self, request: jobs_pb2.PreviewCrawlParamsRequest, context: Any
    ) -> jobs_pb2.PreviewCrawlParamsResponse:
        self.asked.append(request)
        chosen = jobs_pb2.StartCrawlRequest(
            url=request.url,
            include_paths=["^/docs/"],
            exclude_paths=["^/docs/old/"],
            max_depth=3,
            limit=40,
            sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
            allow_subdomains=True,
            crawl_entire_domain=True,
            dedupe_similar_urls=True,
        )
        return jobs_pb2.PreviewCrawlParamsResponse(request=chosen)


@contextlib.asynccontextmanager
async def job_service(servicer: jobs_pb2_grpc.JobServiceServicer) -> AsyncIterator[str]:
    server = grpc.aio.server()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_crawl_params_preview_is_routed_and_answered_in_firecrawls_names() -> None:
    fixed = FixedPreview()  # type: ignore[abstract]  # the other calls: UNIMPLEMENTED
    body = {"url": "https://docs.example/", "prompt": "only the docs", "origin": "js-sdk@1"}
    async with job_service(fixed) as address, gateway_before([address]) as base:
        preview = await sdk(client(base).crawl_params_preview, body["url"], body["prompt"])
        status, raw = await post(base, "/v2/crawl/params-preview", body)
    assert [(a.url, a.prompt) for a in fixed.asked] == [(body["url"], body["prompt"])] * 2
    assert status == 200 and raw["success"] is True
    assert raw["data"] == {
        "url": "https://docs.example/", "includePaths": ["^/docs/"],
        "excludePaths": ["^/docs/old/"], "maxDiscoveryDepth": 3, "limit": 40,
        "sitemap": "skip", "crawlEntireDomain": True, "allowExternalLinks": False,
        "allowSubdomains": True, "ignoreQueryParameters": False,
        "deduplicateSimilarURLs": True, "regexOnFullURL": False,
    }  # fmt: skip
    assert preview.include_paths == ["^/docs/"] and preview.max_discovery_depth == 3
    assert preview.limit == 40 and preview.sitemap == "skip" and preview.crawl_entire_domain


async def test_crawl_params_preview_of_a_node_without_the_rpc_is_a_501() -> None:
    body = {"url": "https://docs.example/", "prompt": "only the docs"}
    bare = Unimplemented()  # type: ignore[abstract]  # every call: UNIMPLEMENTED
    async with job_service(bare) as address, gateway_before([address]) as base:
        status, raw = await post(base, "/v2/crawl/params-preview", body)
        with pytest.raises(FirecrawlError) as err:
            await sdk(client(base).crawl_params_preview, body["url"], body["prompt"])
    assert status == 501 and raw["code"] == "NOT_IMPLEMENTED", raw
    assert "PreviewCrawlParams" in raw["error"]
    assert err.value.status_code == 501


# ---------------------------------------------------------------- v2 keys


async def test_map_honours_filter_by_path_and_takes_firecrawls_other_map_keys(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with node_gateway(tmp_path) as base:
        below = await sdk(client(base).map, root + "docs/", limit=50)
        keys = {
            "url": root + "docs/", "filterByPath": False, "limit": 50, "useMock": "none",
            "maxDiscoveryDepth": 1, "crawlEntireDomain": True, "ignoreCache": True,
        }  # fmt: skip
        status, every = await post(base, "/v2/map", keys)
        past, too_many = await post(base, "/v2/map", {"url": root, "limit": 30_001})
        omce = {"url": root + "about.html", "__experimental_omce": False}
        scraped, doc = await post(base, "/v2/scrape", omce)
    urls = [link.url for link in below.links]
    assert urls and all(u.startswith(root + "docs") for u in urls), urls
    assert status == 200, every
    assert any(not link["url"].startswith(root + "docs") for link in every["links"])
    assert past == 400 and too_many["details"][0]["path"] == ["limit"], too_many
    assert too_many["details"][0]["code"] == "too_big" and "limit" in too_many["error"]
    assert scraped == 200 and doc["success"] is True, doc


# ---------------------------------------------------------------- error shapes, 401, probes


async def test_details_are_zod_like_issues_and_a_401_speaks_http(tmp_path: Path) -> None:
    async with gateway_with_accounts(tmp_path) as base:
        unknown = await post(base, "/v2/scrape", {"url": "https://a.example/", "formats": [
            {"type": "html", "bogus": 1}]})  # fmt: skip
        bad = await post(base, "/v2/crawl", {"url": "https://a.example/", "limit": "many"})
        refused = await post(base, "/v2/scrape", {"url": "https://a.example/", "fastMode": True})
        no_key = await post(base, "/v2/scrape", {"url": "https://a.example/"})
        wrong = await post(base, "/v2/scrape", {"url": "https://a.example/"}, "psk_test_wrong_1")
        with pytest.raises(BadRequestError):
            await sdk(client(base, "psk_test_wrong_1").map, "https://a.example/", limit=30_001)
    status, body = unknown
    assert status == 400 and body["details"][0] == {
        "code": "unrecognized_keys", "path": ["formats", 0], "keys": ["bogus"],
        "message": "Unrecognized key in body: 'formats[0].bogus'",
    }  # fmt: skip
    status, body = bad
    assert status == 400 and body["details"][0]["path"] == ["limit"]
    assert body["details"][0]["code"] == "invalid_type"
    status, body = refused
    assert status == 400 and body["details"][0]["path"] == ["fastMode"]
    assert body["details"][0]["code"] == "custom"
    for (status, body), words in ((no_key, "no API key"), (wrong, "not valid")):
        assert status == 401 and body["code"] == "UNAUTHORIZED", body
        assert "Authorization: Bearer" in body["error"] and words in body["error"], body
        assert "metadata" not in body["error"], body


async def test_firecrawls_liveness_and_readiness_probes_answer(tmp_path: Path) -> None:
    async with node_gateway(tmp_path) as base:
        probes = [await call(base, "GET", f"/{v}/health/{p}")
                  for v in ("v0", "v1") for p in ("liveness", "readiness")]  # fmt: skip
    async with gateway_before(["127.0.0.1:1"]) as lonely:  # no node answers there
        alive = await call(lonely, "GET", "/v1/health/liveness")
        ready = await call(lonely, "GET", "/v1/health/readiness")
    assert probes == [(200, {"status": "ok"})] * 4
    assert alive == (200, {"status": "ok"})
    assert ready[0] == 503 and ready[1]["status"] == "unavailable"
