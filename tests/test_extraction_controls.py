"""Extraction controls and metadata end to end: a real ``HttpEngine`` against an aiohttp
site on 127.0.0.1 (response-header metadata, the images format, include/exclude tags in
the worker processes), and the API refusing a selector selectolax cannot parse."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from aiohttp import web

from pagesift.core.config.schema import ServerConfig
from pagesift.v1 import jobs_pb2
from tests.helpers import EngineMaker, in_process_node, serve_handler
from tests.pdfmaker import text_pdf

HEADERS = {
    "ETag": '"v1-abc"',
    "Last-Modified": "Wed, 21 Oct 2015 07:28:00 GMT",
    "Content-Language": "en-GB",
    "Cache-Control": "public, max-age=300",
}
PAGE = """<html><head><title>Shop</title>
<meta property="og:title" content="The shop"><link rel="icon" href="/fav.svg">
</head><body><nav><a href="/nav">Nav link</a></nav>
<main><h1>Products</h1><p class="ad">ADVERT</p>
<img src="/img/one.png" srcset="/img/one-2x.png 2x"><img src="data:image/png;base64,AAAA">
<picture><source srcset="hero.webp"><img src="hero.jpg"></picture>
<a href="/item/1">First item</a>
{filler}</main><footer>FOOTER</footer></body></html>"""


async def _site(request: web.Request) -> web.StreamResponse:
    if request.path == "/doc.pdf":
        body = text_pdf([["PDF text"]], title="A PDF")
        return web.Response(body=body, content_type="application/pdf", headers=HEADERS)
    # /big is over the engine's inline threshold: extracted in a worker process
    filler = "<p>" + "filler words " * 2000 + "</p>" if request.path == "/big" else ""
    return web.Response(text=PAGE.format(filler=filler), content_type="text/html", headers=HEADERS)


async def test_headers_images_and_tag_controls_reach_the_document_inline_and_in_workers(
    make_engine: EngineMaker,
) -> None:
    engine = await make_engine(
        ServerConfig(allow_private_networks=True, respect_robots=False, extract_processes=1)
    )
    options = jobs_pb2.ScrapeOptions(
        formats=[jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_IMAGES, jobs_pb2.FORMAT_LINKS],
        include_tags=["main"],
        exclude_tags=[".ad"],
        remove_base64_images=True,
    )
    async with serve_handler(_site) as port:
        origin = f"http://127.0.0.1:{port}"
        for path in ("/shop/page", "/big"):
            doc = (await engine.scrape(origin + path, options)).document
            assert doc.metadata["etag"] == '"v1-abc"', path
            assert doc.metadata["last-modified"] == HEADERS["Last-Modified"]
            assert doc.metadata["content-language"] == "en-GB"
            assert doc.metadata["cache-control"] == "public, max-age=300"
            assert doc.metadata["og:title"] == "The shop"
            assert doc.metadata["favicon"] == origin + "/fav.svg"
            base = origin + path.rsplit("/", 1)[0] + "/"
            assert list(doc.images) == [
                origin + "/img/one.png",
                origin + "/img/one-2x.png",
                base + "hero.webp",
                base + "hero.jpg",
            ]
            assert "# Products" in doc.markdown
            for gone in ("ADVERT", "FOOTER", "Nav link", "data:image"):
                assert gone not in doc.markdown, (path, gone)
            # links (and their texts) are the whole page's, whatever the tags keep
            details = {d.url: d.text for d in doc.link_details}
            assert details == {origin + "/nav": "Nav link", origin + "/item/1": "First item"}
        doc = (await engine.scrape(origin + "/doc.pdf", jobs_pb2.ScrapeOptions())).document
        assert doc.metadata["source"] == "pdf"
        assert doc.metadata["etag"] == '"v1-abc"'
        assert doc.metadata["cache-control"] == "public, max-age=300"


async def test_the_api_refuses_a_selector_selectolax_cannot_parse_naming_it(
    tmp_path: Path,
) -> None:
    async with in_process_node(tmp_path) as node:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await node.stub.Scrape(
                jobs_pb2.ScrapeRequest(
                    url="http://127.0.0.1:9/",
                    options=jobs_pb2.ScrapeOptions(include_tags=["main", "div["]),
                )
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith("options.include_tags[1]")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await node.stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(
                    url="http://127.0.0.1:9/",
                    options=jobs_pb2.ScrapeOptions(exclude_tags=["p" * 300]),
                )
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith("options.exclude_tags[0]")
        listed = await node.stub.ListJobs(jobs_pb2.ListJobsRequest())
        assert not listed.jobs
