"""The gateway's structured formats, extract and token usage, as Firecrawl's clients see them.

Fast tier (no model): the pure mappings (``gateway.structured``, ``gateway.extractroutes``)
and, against a real in-process node and gateway, the attributes and selectors formats
through firecrawl-py and plain HTTP, a crawl's status page carrying ``attributes``, and a
node without a model endpoint refusing json and extract by field. Model tier
(``@pytest.mark.model``, the real llama.cpp server of ``tests.modelserver``): a scrape's
json valid under its schema with a summary, markdown left out when not asked; extract
end to end through firecrawl-py; token usage after them; a crawl with a prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import jsonschema
import pytest
from aiohttp import web
from firecrawl import Firecrawl

from pagesift.gateway import extractroutes, structured, translate, v1translate
from pagesift.gateway.extractroutes import ExtractRequest
from pagesift.gateway.httperrors import HttpError
from pagesift.gateway.models import CrawlRequest, ScrapeRequest
from pagesift.gateway.team import UNLIMITED
from pagesift.gateway.v1models import ScrapeRequestV1
from pagesift.v1 import jobs_pb2
from tests.helpers import gateway_before, in_process_node, serve_handler
from tests.modelserver import MODEL, PRODUCT_SCHEMA, ModelServer

T = TypeVar("T")
SHOP = (
    "<html><head><title>{name}</title></head><body><main><h1 id='top'>{name}</h1>"
    "<p>The {name} costs 12.50 dollars.</p>"
    "<ul><li class='item' data-sku='A1'><a href='/a'>Alpha</a></li>"
    "<li class='item' data-sku='B2'><a href='/b'>Beta</a></li></ul></main></body></html>"
)
NAMES = {"/": "Widget Shop", "/a": "Blue Widget", "/b": "Red Gadget"}
ATTRIBUTES = {
    "type": "attributes",
    "selectors": [
        {"selector": "li.item", "attribute": "data-sku"},
        {"selector": "h1", "attribute": "id"},
    ],
}


async def _shop(request: web.Request) -> web.Response:
    name = NAMES.get(request.path)
    if name is None:
        return web.Response(status=404)
    return web.Response(text=SHOP.format(name=name), content_type="text/html")


def _scrape(body: dict[str, Any]) -> jobs_pb2.ScrapeOptions:
    return translate.scrape_request(ScrapeRequest.model_validate({"url": "http://x.test", **body}))


def _refused(call: Callable[[], Any]) -> str:
    with pytest.raises(HttpError) as err:
        call()
    assert err.value.status == 400
    return err.value.error


# ---------------------------------------------------------------- pure mappings


def test_json_summary_and_selector_formats_map_onto_the_model_and_selector_formats() -> None:
    opts = _scrape(
        {
            "formats": [
                {"type": "json", "schema": PRODUCT_SCHEMA, "prompt": "the product"},
                "summary",
            ]
        }
    )
    assert list(opts.formats) == [jobs_pb2.FORMAT_JSON, jobs_pb2.FORMAT_SUMMARY]
    assert json.loads(opts.json.schema) == PRODUCT_SCHEMA and opts.json.prompt == "the product"
    opts = _scrape({"formats": ["markdown", ATTRIBUTES]})
    assert list(opts.formats) == [jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_SELECTORS]
    fields = opts.selectors.fields
    assert [(f.selector, f.attribute, f.all) for f in fields] == [
        ("li.item", "data-sku", True),
        ("h1", "id", True),
    ]
    assert {f.source for f in fields} == {jobs_pb2.SELECTOR_SOURCE_ATTRIBUTE}
    schema = {"baseSelector": "li.item", "fields": [{"name": "name", "selector": "a"}]}
    opts = _scrape({"formats": [{"type": "selectors", "schema": schema}]})
    assert opts.selectors.base_selector == "li.item" and opts.selectors.fields[0].name == "name"


@pytest.mark.parametrize(
    ("formats", "field"),
    [
        (["json"], "formats[0]"),
        ([{"type": "json"}], "formats[0]"),
        ([{"type": "json", "prompt": "a"}, {"type": "json", "prompt": "b"}], "formats[1]"),
        ([{"type": "summary", "prompt": "x"}], "formats[0].prompt"),
        ([{"type": "json", "schema": [1]}], "formats[0].schema"),
        ([{"type": "attributes", "selectors": [{"selector": "a"}]}], "formats[0].selectors[0]"),
        ([{"type": "attributes", "selectors": [{"selector": "a" * 90, "attribute": "x"}]}],
         "formats[0].selectors[0]"),
        ([{"type": "selectors", "schema": {"fields": [{"nom": "x"}]}}], "formats[0].schema"),
        ([ATTRIBUTES, {"type": "selectors", "schema": {"fields": []}}], "formats[1]"),
        ([{"type": "markdown", "selectors": []}], "formats[0]"),
    ],
)  # fmt: skip
def test_a_structured_format_it_cannot_take_is_a_400_naming_its_path(
    formats: list[Any], field: str
) -> None:
    assert _refused(lambda: _scrape({"formats": formats})).startswith(field + ":")


def test_v1_json_and_extract_formats_take_their_options_and_a_crawl_its_prompt() -> None:
    def v1(body: dict[str, Any]) -> jobs_pb2.ScrapeOptions:
        request = ScrapeRequestV1.model_validate({"url": "http://x.test", **body})
        return v1translate.scrape_request(request)[1]

    opts = v1({"formats": ["json"], "jsonOptions": {"schema": PRODUCT_SCHEMA, "systemPrompt": "s"}})
    assert list(opts.formats) == [jobs_pb2.FORMAT_JSON] and opts.json.system_prompt == "s"
    opts = v1({"formats": ["markdown", "extract"], "extract": {"prompt": "the price"}})
    assert opts.json.prompt == "the price" and jobs_pb2.FORMAT_MARKDOWN in opts.formats
    assert _refused(lambda: v1({"formats": ["json"]})).startswith("jsonOptions:")
    assert _refused(lambda: v1({"jsonOptions": {"prompt": "x"}})).startswith("jsonOptions:")
    temperature = {"formats": ["json"], "jsonOptions": {"prompt": "x", "temperature": 0.1}}
    assert _refused(lambda: v1(temperature)).startswith("jsonOptions.temperature:")
    crawl = CrawlRequest.model_validate({"url": "http://x.test", "prompt": "the blog only"})
    assert translate.crawl_request(crawl).prompt == "the blog only"


def test_a_document_answers_attributes_selectors_json_and_drops_unasked_markdown() -> None:
    opts = _scrape({"formats": [ATTRIBUTES]})
    names = [f.name for f in opts.selectors.fields]
    selected = {names[0]: ["A1", "B2"], names[1]: ["top"]}
    doc = jobs_pb2.Document(url="http://x.test/", markdown="# m", selected=json.dumps(selected))
    out = structured.document(doc, opts)
    assert "markdown" not in out and list(out)[-1] == "metadata"
    assert out["attributes"] == [
        {"selector": "li.item", "attribute": "data-sku", "values": ["A1", "B2"]},
        {"selector": "h1", "attribute": "id", "values": ["top"]},
    ]
    assert structured.document(doc)["markdown"] == "# m"  # no request at hand: kept
    mine = jobs_pb2.Document(url="http://x.test/", selected='[{"name": "Alpha"}]', json='{"a": 1}')
    out = structured.document(mine, None, "extract")
    assert out["selectors"] == [{"name": "Alpha"}] and out["extract"] == {"a": 1}
    assert "json" not in out and "attributes" not in out


def test_extract_bodies_map_onto_start_extract_and_refuse_what_pagesift_cannot() -> None:
    def start(body: dict[str, Any]) -> jobs_pb2.StartExtractRequest:
        return extractroutes.extract_request(ExtractRequest.model_validate(body), "k1")

    req = start({"urls": ["http://x.test/*"], "schema": PRODUCT_SCHEMA, "prompt": "p", "limit": 5,
                 "showSources": True, "scrapeOptions": {"onlyMainContent": False}})  # fmt: skip
    assert list(req.urls) == ["http://x.test/*"] and req.limit == 5 and req.idempotency_key == "k1"
    assert json.loads(req.json.schema) == PRODUCT_SCHEMA and not req.options.only_main_content
    for body, field in [
        ({"enableWebSearch": True, "prompt": "p"}, "enableWebSearch"),
        ({"agent": {"model": "FIRE-1"}, "prompt": "p"}, "agent"),
        ({"allowExternalLinks": True, "prompt": "p"}, "allowExternalLinks"),
        ({"includeSubdomains": True, "prompt": "p"}, "includeSubdomains"),
        ({}, "schema"),
        ({"prompt": "p", "scrapeOptions": {"formats": ["markdown"]}}, "scrapeOptions.formats"),
    ]:
        error = _refused(lambda b=body: start({"urls": ["http://x.test/"], **b}))  # type: ignore[misc]
        assert error.startswith(field + ":"), (body, error)


def test_extract_status_and_token_usage_are_firecrawls_shapes() -> None:
    resp = jobs_pb2.GetExtractResponse(
        id="j1",
        state=jobs_pb2.JOB_STATE_COMPLETED,
        data='{"product": "Blue Widget"}',
        sources=[jobs_pb2.ExtractSource(key="product", urls=["http://x.test/a"])],
        total=2,
        completed=1,
        failed=1,
        model_usage=jobs_pb2.ModelUsage(input_tokens=30, output_tokens=7),
    )
    out = extractroutes.extract_status(resp)
    assert out["status"] == "completed" and out["data"] == {"product": "Blue Widget"}
    assert out["sources"] == {"product": ["http://x.test/a"]} and out["tokensUsed"] == 37
    assert "1 of 2" in out["warning"]
    running = extractroutes.extract_status(
        jobs_pb2.GetExtractResponse(id="j2", state=jobs_pb2.JOB_STATE_SCRAPING, data="{}")
    )
    assert running["status"] == "processing" and running["data"] is None
    failed = jobs_pb2.GetExtractResponse(state=jobs_pb2.JOB_STATE_FAILED, note="no pages")
    assert extractroutes.extract_status(failed)["error"] == "no pages"
    usage = jobs_pb2.GetAccountUsageResponse(
        model_allowed=True, model_tokens_used=40, model_tokens_per_day=100
    )
    data = extractroutes.token_usage(usage)["data"]
    assert (data["remainingTokens"], data["planTokens"]) == (60, 100)
    v1 = extractroutes.token_usage(jobs_pb2.GetAccountUsageResponse(model_allowed=True), v1=True)
    assert v1["data"]["remaining_tokens"] == UNLIMITED
    assert (
        extractroutes.token_usage(jobs_pb2.GetAccountUsageResponse())["data"]["remainingTokens"]
        == 0
    )


# ---------------------------------------------------------------- a real node, no model


async def sdk(call: Callable[..., T], *args: Any, **kw: Any) -> T:
    """One blocking SDK call off the loop, bounded (extract's deprecation warning muted)."""

    def run() -> T:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return call(*args, **kw)

    return await asyncio.wait_for(asyncio.to_thread(run), 240)


async def post(base: str, path: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(base + path, json=body) as resp:
        return resp.status, await resp.json()


async def get(base: str, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(base + path) as resp:
        return resp.status, await resp.json()


@contextlib.asynccontextmanager
async def node_gateway(tmp: Path, **node_kw: Any) -> AsyncIterator[str]:
    async with (
        in_process_node(
            tmp / "node", browser_executable="", respect_robots=False, **node_kw
        ) as node,
        gateway_before([node.address]) as base,
    ):
        yield base


async def test_attributes_and_selectors_formats_through_firecrawl_py_and_a_crawl(
    tmp_path: Path,
) -> None:
    async with serve_handler(_shop) as port, node_gateway(tmp_path) as base:
        root = f"http://127.0.0.1:{port}/"
        fc = Firecrawl(api_key="anonymous", api_url=base)
        doc = await sdk(fc.scrape, root, formats=[ATTRIBUTES])  # the SDK sends the format...
        assert doc.markdown is None and doc.metadata and doc.metadata.title == "Widget Shop"
        status, body = await post(base, "/v2/scrape", {"url": root, "formats": [ATTRIBUTES]})
        assert status == 200, body  # ...and keeps no Document field for the answer: HTTP
        assert body["data"]["attributes"] == [
            {"selector": "li.item", "attribute": "data-sku", "values": ["A1", "B2"]},
            {"selector": "h1", "attribute": "id", "values": ["top"]},
        ]
        assert "markdown" not in body["data"]  # not asked for
        schema = {
            "baseSelector": "li.item",
            "fields": [
                {"name": "name", "selector": "a"},
                {"name": "url", "selector": "a", "source": "SELECTOR_SOURCE_ATTRIBUTE",
                 "attribute": "href"},
            ],
        }  # fmt: skip
        status, body = await post(
            base, "/v2/scrape", {"url": root, "formats": ["markdown", {"type": "selectors",
                                                                       "schema": schema}]}
        )  # fmt: skip
        assert status == 200, body
        assert body["data"]["selectors"] == [
            {"name": "Alpha", "url": f"{root}a"},
            {"name": "Beta", "url": f"{root}b"},
        ]
        assert "Widget Shop" in body["data"]["markdown"]
        # a crawl's status page, read without the request (firecrawl-py's crawl keeps
        # only the Document fields it knows, so its pages are read over HTTP here)
        status, started = await post(
            base, "/v2/crawl", {"url": root, "limit": 3, "scrapeOptions": {"formats": [ATTRIBUTES]}}
        )
        assert status == 200, started
        for _ in range(120):
            status, page = await get(base, f"/v2/crawl/{started['id']}")
            if page.get("status") != "scraping":
                break
            await asyncio.sleep(0.5)
        assert page["status"] == "completed" and len(page["data"]) == 3, page
        for d in page["data"]:
            assert d["attributes"][0]["values"] == ["A1", "B2"], d


async def test_without_a_model_endpoint_json_and_extract_are_400_naming_the_field(
    tmp_path: Path,
) -> None:
    async with serve_handler(_shop) as port, node_gateway(tmp_path) as base:
        root = f"http://127.0.0.1:{port}/"
        status, body = await post(
            base, "/v2/scrape", {"url": root, "formats": [{"type": "json", "prompt": "x"}]}
        )
        assert status == 400 and body["code"] == "BAD_REQUEST", body
        assert "model endpoint" in body["error"] and body["details"][0]["path"][0] == "options"
        status, body = await post(base, "/v2/extract", {"urls": [root], "prompt": "x"})
        assert status == 400 and "model" in body["error"], body
        status, body = await post(
            base, "/v2/extract", {"urls": [root], "prompt": "x", "enableWebSearch": True}
        )
        assert status == 400 and body["details"][0]["path"] == ["enableWebSearch"], body
        status, body = await get(base, "/v2/team/token-usage")
        assert status == 200 and body["data"]["remainingTokens"] == 0, body


# ---------------------------------------------------------------- the real model


@contextlib.asynccontextmanager
async def model_gateway(tmp: Path, server: ModelServer) -> AsyncIterator[str]:
    accounts = tmp / "accounts.toml"
    accounts.write_text("[anonymous]\nallow_model = true\n")
    async with node_gateway(
        tmp,
        accounts_file=str(accounts),
        model_url=server.base_url,
        model_name=MODEL,
        model_response_format="json_object",
        model_bypass_address_guard=True,
        model_timeout=120.0,
    ) as base:
        yield base


@pytest.mark.model
async def test_a_scrape_gets_json_valid_under_its_schema_and_a_summary_then_tokens(
    tmp_path: Path, model_server: ModelServer
) -> None:
    async with serve_handler(_shop) as port, model_gateway(tmp_path, model_server) as base:
        fc = Firecrawl(api_key="anonymous", api_url=base)
        before = await sdk(fc.get_token_usage)
        doc = await sdk(
            fc.scrape,
            f"http://127.0.0.1:{port}/a",
            formats=[
                {"type": "json", "schema": PRODUCT_SCHEMA, "prompt": "The product and its price."},
                "summary",
            ],
        )
        assert doc.warning is None, doc.warning
        jsonschema.validate(doc.json, PRODUCT_SCHEMA)
        assert doc.summary and doc.summary.strip()
        assert doc.markdown is None  # the node keeps it; not asked for here
        after = await sdk(fc.get_token_usage)
        assert before.remaining_tokens == after.remaining_tokens == UNLIMITED
        status, body = await get(base, "/v1/team/token-usage")
        assert status == 200 and body["data"]["remaining_tokens"] == UNLIMITED


@pytest.mark.model
async def test_firecrawl_py_extract_runs_end_to_end_with_sources(
    tmp_path: Path, model_server: ModelServer
) -> None:
    async with serve_handler(_shop) as port, model_gateway(tmp_path, model_server) as base:
        fc = Firecrawl(api_key="anonymous", api_url=base)
        url = f"http://127.0.0.1:{port}/b"
        out = await sdk(
            fc.extract, urls=[url], schema=PRODUCT_SCHEMA, prompt="The product and its price.",
            show_sources=True, poll_interval=1, timeout=200,
        )  # fmt: skip
        assert out.status == "completed", out
        jsonschema.validate(out.data, PRODUCT_SCHEMA)
        assert out.sources and all(urls == [url] for urls in out.sources.values())
        assert out.tokens_used and out.tokens_used > 0


@pytest.mark.model
async def test_a_crawl_with_a_prompt_starts_and_completes(
    tmp_path: Path, model_server: ModelServer
) -> None:
    async with serve_handler(_shop) as port, model_gateway(tmp_path, model_server) as base:
        fc = Firecrawl(api_key="anonymous", api_url=base)
        root = f"http://127.0.0.1:{port}/"
        job = await sdk(fc.crawl, root, prompt="every product page", limit=2,
                        poll_interval=1, timeout=200)  # fmt: skip
        assert job.status == "completed" and 1 <= len(job.data) <= 2
