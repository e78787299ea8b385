"""The model formats end to end against a real llama.cpp server (SmolLM2-135M): Scrape,
batch and extract pages with FORMAT_JSON and FORMAT_SUMMARY, their answers valid under the
schema, counted per page, per job and per account, cached by content, refused without
permission, and failures (invalid answers, a failing endpoint) charged to the page only.
The checks are of validity, plumbing and accounting, not of the model's wisdom."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
from aiohttp import web

from pagesift.core.jobs.accounts import hash_key
from pagesift.core.util.children import free_port
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import (
    NodeFactory,
    RunningNode,
    documents,
    eventually,
    in_process_node,
    metric,
    scrape_metrics,
    serve_handler,
    wait_done,
)
from tests.modelserver import MODEL, PRODUCT_SCHEMA, CountingProxy, ModelServer

pytestmark = pytest.mark.model

PAGE = (
    "<html><head><title>{name}</title></head><body><main><h1>{name}</h1>"
    "<p>The {name} costs {price} dollars. Free shipping.</p></main></body></html>"
)
KEYS = {"allowed": "psk_test_allowed_0123456789", "plain": "psk_test_plain_0123456789"}


def _md(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {KEYS[name]}"),)


def _accounts(path: Path, tokens_per_day: int | None = None) -> Path:
    limit = "" if tokens_per_day is None else f"model_tokens_per_day = {tokens_per_day}\n"
    path.write_text(
        f'[[account]]\nname = "allowed"\nkey_sha256 = "{hash_key(KEYS["allowed"])}"\n'
        f"allow_model = true\n{limit}\n"
        f'[[account]]\nname = "plain"\nkey_sha256 = "{hash_key(KEYS["plain"])}"\n'
    )
    return path


async def _shop(request: web.Request) -> web.Response:
    name = {"/a": "Blue Widget", "/b": "Red Gadget", "/c": "Green Gizmo"}.get(request.path)
    if name is None:
        return web.Response(status=404)
    return web.Response(text=PAGE.format(name=name, price="12.50"), content_type="text/html")


def _json_options() -> jobs_pb2.ScrapeOptions:
    opts = jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_JSON])
    opts.json.schema = json.dumps(PRODUCT_SCHEMA)
    opts.json.prompt = "The product's name and its price."
    return opts


async def _node(
    tmp_path: Path, model_url: str, tokens_per_day: int | None = None, **kw: Any
) -> AsyncIterator[RunningNode]:
    accounts = _accounts(tmp_path / "accounts.toml", tokens_per_day)
    async with in_process_node(
        tmp_path / "data",
        accounts_file=str(accounts),
        model_url=model_url,
        model_name=MODEL,
        model_response_format="json_object",
        model_bypass_address_guard=True,
        model_timeout=120.0,
        respect_robots=False,
        **kw,
    ) as node:
        yield node


_node_cm = contextlib.asynccontextmanager(_node)


@pytest.fixture
def model_url(model_server: ModelServer) -> str:
    return model_server.base_url


async def test_a_scraped_page_gets_a_json_object_valid_under_its_schema_and_a_summary(
    tmp_path: Path, model_url: str
) -> None:
    async with serve_handler(_shop) as port, _node_cm(tmp_path, model_url) as node:
        opts = _json_options()
        opts.formats.append(jobs_pb2.FORMAT_SUMMARY)
        resp = await node.stub.Scrape(
            jobs_pb2.ScrapeRequest(url=f"http://127.0.0.1:{port}/a", options=opts),
            metadata=_md("allowed"),
        )
        doc = resp.document
        assert not doc.format_errors, doc.format_errors
        jsonschema.validate(json.loads(doc.json), PRODUCT_SCHEMA)
        assert doc.summary.strip()
        assert "Blue Widget" in doc.markdown
        assert doc.model_usage.calls >= 2
        assert doc.model_usage.input_tokens > 0 and doc.model_usage.output_tokens > 0
        usage = await node.stub.GetAccountUsage(
            jobs_pb2.GetAccountUsageRequest(), metadata=_md("allowed")
        )
        assert usage.model_allowed


async def test_an_account_without_allow_model_is_refused_naming_the_format(
    tmp_path: Path, model_url: str
) -> None:
    async with serve_handler(_shop) as port, _node_cm(tmp_path, model_url) as node:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.Scrape(
                jobs_pb2.ScrapeRequest(url=f"http://127.0.0.1:{port}/a", options=_json_options()),
                metadata=_md("plain"),
            )
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "options.formats[1]" in (e.value.details() or "")


async def test_a_batch_records_each_pages_answer_and_counts_tokens_per_job_and_account(
    tmp_path: Path, model_url: str
) -> None:
    async with (
        serve_handler(_shop) as port,
        _node_cm(tmp_path, model_url, tokens_per_day=1_000_000) as node,
    ):
        urls = [f"http://127.0.0.1:{port}/{p}" for p in "abc"]
        started = await node.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=urls, options=_json_options()),
            metadata=_md("allowed"),
        )
        job = await wait_done(node.stub, started.id, _md("allowed"), timeout=300)
        got = await node.stub.GetJob(
            jobs_pb2.GetJobRequest(id=started.id, limit=10), metadata=_md("allowed")
        )
        assert job.state == jobs_pb2.JOB_STATE_COMPLETED and len(got.documents) == 3
        for doc in got.documents:
            jsonschema.validate(json.loads(doc.json), PRODUCT_SCHEMA)
        per_page = sum(
            d.model_usage.input_tokens + d.model_usage.output_tokens for d in got.documents
        )
        assert got.model_usage.calls == sum(d.model_usage.calls for d in got.documents) >= 3
        assert got.model_usage.input_tokens + got.model_usage.output_tokens == per_page
        usage = await node.stub.GetAccountUsage(
            jobs_pb2.GetAccountUsageRequest(), metadata=_md("allowed")
        )
        assert usage.model_tokens_used == per_page
        assert usage.model_tokens_per_day == 1_000_000


async def test_a_spent_token_day_refuses_new_model_work(tmp_path: Path, model_url: str) -> None:
    async with (
        serve_handler(_shop) as port,
        _node_cm(tmp_path, model_url, tokens_per_day=1) as node,
    ):
        url = f"http://127.0.0.1:{port}/a"
        first = await node.stub.Scrape(
            jobs_pb2.ScrapeRequest(url=url, options=_json_options()), metadata=_md("allowed")
        )
        assert first.document.json  # the first call was under the limit; it is charged whole
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.Scrape(
                jobs_pb2.ScrapeRequest(url=url, options=_json_options()), metadata=_md("allowed")
            )
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "model_tokens_per_day" in (e.value.details() or "")
        plain = await node.stub.Scrape(  # a scrape without the model still runs
            jobs_pb2.ScrapeRequest(url=url), metadata=_md("allowed")
        )
        assert plain.document.markdown


async def test_the_same_content_asked_the_same_question_is_answered_from_the_cache(
    tmp_path: Path, model_url: str
) -> None:
    async with serve_handler(_shop) as port, _node_cm(tmp_path, model_url) as node:
        opts = _json_options()
        opts.max_age.seconds = 600
        url = f"http://127.0.0.1:{port}/a"
        first = await node.stub.Scrape(
            jobs_pb2.ScrapeRequest(url=url, options=opts), metadata=_md("allowed")
        )
        assert first.document.model_usage.calls >= 1
        # another URL with the same page: the page cache misses, the model cache answers
        second = await node.stub.Scrape(
            jobs_pb2.ScrapeRequest(url=url + "?again=1", options=opts), metadata=_md("allowed")
        )
        assert second.document.model_usage.calls == 0
        assert second.document.model_usage.cached == 1
        assert second.document.json == first.document.json


async def test_extract_merges_its_pages_under_the_schema_with_their_sources(
    tmp_path: Path, model_url: str
) -> None:
    async with serve_handler(_shop) as port, _node_cm(tmp_path, model_url) as node:
        req = jobs_pb2.StartExtractRequest(
            urls=[f"http://127.0.0.1:{port}/a", f"http://127.0.0.1:{port}/b"]
        )
        req.json.schema = json.dumps(PRODUCT_SCHEMA)
        req.json.prompt = "The product's name and its price."
        started = await node.stub.StartExtract(req, metadata=_md("allowed"))
        assert list(started.urls) == list(req.urls)
        await wait_done(node.stub, started.id, _md("allowed"), timeout=300)
        got = await node.stub.GetExtract(
            jobs_pb2.GetExtractRequest(id=started.id), metadata=_md("allowed")
        )
        assert got.state == jobs_pb2.JOB_STATE_COMPLETED and got.completed == 2
        jsonschema.validate(json.loads(got.data), PRODUCT_SCHEMA)
        assert {s.key for s in got.sources} == {"product", "price"}
        assert got.model_usage.calls >= 2


async def test_a_crawl_prompt_is_previewed_and_stored_as_options(
    tmp_path: Path, model_url: str
) -> None:
    async with serve_handler(_shop) as port, _node_cm(tmp_path, model_url) as node:
        url = f"http://127.0.0.1:{port}/a"
        preview = await node.stub.PreviewCrawlParams(
            jobs_pb2.PreviewCrawlParamsRequest(url=url, prompt="Only the product pages, 2 deep"),
            metadata=_md("allowed"),
        )
        assert preview.request.url == url and preview.model_usage.calls >= 1
        started = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(url=url, prompt="Only the product pages", limit=3),
            metadata=_md("allowed"),
        )
        await wait_done(node.stub, started.id, _md("allowed"), timeout=120)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.PreviewCrawlParams(
                jobs_pb2.PreviewCrawlParamsRequest(url=url, prompt="x"), metadata=_md("plain")
            )
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_an_answer_never_valid_is_asked_again_then_the_page_keeps_its_markdown(
    tmp_path: Path, model_proxy: CountingProxy
) -> None:
    metrics_at = f"127.0.0.1:{free_port()}"
    async with (
        serve_handler(_shop) as port,
        _node_cm(
            tmp_path, model_proxy.base_url, model_retries=2, metrics_listen=metrics_at
        ) as node,
    ):
        model_proxy.violate(3)  # every call of the page: the first and both retries
        resp = await node.stub.Scrape(
            jobs_pb2.ScrapeRequest(url=f"http://127.0.0.1:{port}/a", options=_json_options()),
            metadata=_md("allowed"),
        )
        doc = resp.document
        assert doc.json == "" and "Blue Widget" in doc.markdown
        assert [(e.format, e.code) for e in doc.format_errors] == [
            (jobs_pb2.FORMAT_JSON, "invalid_answer")
        ]
        assert doc.model_usage.calls == 3 == len(model_proxy.bodies())
        retried = model_proxy.bodies()[1]["messages"]
        assert "That answer is invalid" in retried[-1]["content"]
        samples = await scrape_metrics(metrics_at)
        assert metric(samples, "pagesift_model_calls_total", outcome="ok") == 3
        assert metric(samples, "pagesift_model_calls_total", outcome="invalid_answer") == 3
        assert metric(samples, "pagesift_model_tokens_total", direction="input") > 0
        assert metric(samples, "pagesift_model_seconds_count") == 3


async def test_a_failing_endpoint_is_a_format_error_of_the_page_alone(
    tmp_path: Path, model_proxy: CountingProxy
) -> None:
    async with serve_handler(_shop) as port, _node_cm(tmp_path, model_proxy.base_url) as node:
        model_proxy.fail(1, status=503)
        urls = [f"http://127.0.0.1:{port}/{p}" for p in "ab"]
        started = await node.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=urls, options=_json_options(), max_concurrency=1),
            metadata=_md("allowed"),
        )
        await wait_done(node.stub, started.id, _md("allowed"), timeout=300)
        got = await node.stub.GetJob(
            jobs_pb2.GetJobRequest(id=started.id, limit=10), metadata=_md("allowed")
        )
        assert got.completed == 2 and got.failed == 0  # both pages stored
        codes = sorted(e.code for d in got.documents for e in d.format_errors)
        assert codes == ["model_unavailable"]
        assert sum(1 for d in got.documents if d.json) == 1


@pytest.mark.system
async def test_a_sigkill_mid_batch_asks_the_model_again_only_for_pages_in_flight(
    tmp_path: Path, nodes: NodeFactory, model_proxy: CountingProxy
) -> None:
    """Each page is asked once (no invalid answers here), but the pages in flight at the
    kill: after the restart, every page has its answer and the calls at the model
    server number at most the pages plus the job's concurrency."""
    pages = 12
    concurrency = 2

    async def shop(request: web.Request) -> web.Response:
        n = request.path.strip("/")
        return web.Response(
            text=PAGE.format(name=f"Widget {n}", price=f"{n}.50"), content_type="text/html"
        )

    accounts = _accounts(tmp_path / "accounts.toml")
    async with serve_handler(shop) as port:
        node = nodes(
            "p",
            config={
                "accounts_file": str(accounts),
                "model_url": model_proxy.base_url,
                "model_name": MODEL,
                "model_response_format": "json_object",
                "model_bypass_address_guard": True,
                "model_timeout": 120.0,
                "model_concurrency": concurrency,
                "respect_robots": False,
            },
        )
        await node.start()
        urls = [f"http://127.0.0.1:{port}/{i}" for i in range(pages)]
        channel = grpc.aio.insecure_channel(node.address)
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        started = await stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(
                urls=urls, options=_json_options(), max_concurrency=concurrency
            ),
            metadata=_md("allowed"),
        )
        await until_calls(model_proxy, 4)
        node.kill()
        await channel.close(None)
        await node.start()
        channel = grpc.aio.insecure_channel(node.address)
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        await wait_done(stub, started.id, _md("allowed"), timeout=600)
        docs = await documents(stub, started.id, _md("allowed"))
        await channel.close(None)
    assert sorted(d.url for d in docs) == sorted(urls)
    assert all(d.json or d.format_errors for d in docs)
    calls = len(model_proxy.bodies())
    assert pages <= calls <= pages + concurrency, calls


async def until_calls(proxy: CountingProxy, n: int) -> None:
    async def enough() -> bool | None:
        return True if len(proxy.bodies()) >= n else None

    await eventually(enough, f"{n} model calls", 300)
