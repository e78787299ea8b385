"""What a node refuses before any model call: the model formats, an extract and a crawl
prompt on a server without a model endpoint or for an account without ``allow_model``
(each naming the field), a bad schema, and a model endpoint on a loopback address that
the operator did not exempt from the address guard. No model server is needed."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from pagesift.core.jobs.accounts import hash_key
from pagesift.primary.models.endpoint import ModelEndpoint, ModelUnavailable
from pagesift.primary.models.settings import ModelSettings
from pagesift.v1 import jobs_pb2
from tests.helpers import in_process_node

KEY = "psk_test_plain_0123456789"
MD = (("authorization", f"Bearer {KEY}"),)


def _json_options(schema: str = '{"type": "object"}') -> jobs_pb2.ScrapeOptions:
    opts = jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_JSON])
    opts.json.schema = schema
    return opts


async def _refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call  # type: ignore[misc]
    return e.value


async def test_a_server_without_a_model_endpoint_refuses_every_model_request(
    tmp_path: Path,
) -> None:
    async with in_process_node(tmp_path / "data") as node:
        e = await _refused(
            node.stub.Scrape(
                jobs_pb2.ScrapeRequest(url="http://127.0.0.1:9/", options=_json_options())
            )
        )
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "options.formats[1]" in (e.details() or "") and "model_url" in (e.details() or "")
        extract = jobs_pb2.StartExtractRequest(urls=["http://127.0.0.1:9/*"])
        extract.json.prompt = "anything"
        e = await _refused(node.stub.StartExtract(extract))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "model_url" in (e.details() or "")
        e = await _refused(
            node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url="http://127.0.0.1:9/", prompt="x"))
        )
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt" in (e.details() or "")
        e = await _refused(
            node.stub.PreviewCrawlParams(
                jobs_pb2.PreviewCrawlParamsRequest(url="http://127.0.0.1:9/", prompt="x")
            )
        )
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        usage = await node.stub.GetAccountUsage(jobs_pb2.GetAccountUsageRequest())
        assert not usage.model_allowed


async def test_an_account_without_allow_model_is_denied_before_any_fetch(tmp_path: Path) -> None:
    accounts = tmp_path / "accounts.toml"
    accounts.write_text(f'[[account]]\nname = "plain"\nkey_sha256 = "{hash_key(KEY)}"\n')
    async with in_process_node(
        tmp_path / "data",
        accounts_file=str(accounts),
        model_url="http://127.0.0.1:9/v1",
        model_name="m",
    ) as node:
        extract = jobs_pb2.StartExtractRequest(urls=["http://127.0.0.1:9/*"])
        extract.json.prompt = "anything"
        e = await _refused(node.stub.StartExtract(extract, metadata=MD))
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED
        e = await _refused(
            node.stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(
                    urls=["http://127.0.0.1:9/"], options=_json_options()
                ),
                metadata=MD,
            )
        )
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "options.formats[1]" in (e.details() or "")


async def test_a_bad_schema_is_invalid_argument_naming_it(tmp_path: Path) -> None:
    async with in_process_node(
        tmp_path / "data", model_url="http://127.0.0.1:9/v1", model_name="m"
    ) as node:
        bad = _json_options(json.dumps({"type": "object", "properties": {"a": {"type": 5}}}))
        e = await _refused(
            node.stub.Scrape(jobs_pb2.ScrapeRequest(url="http://127.0.0.1:9/", options=bad))
        )
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "options.json.schema" in (e.details() or "")


async def test_a_loopback_model_endpoint_is_refused_by_the_address_guard_unless_exempted() -> None:
    guarded = ModelSettings(base_url="http://127.0.0.1:9/v1", model="m", timeout=5)
    endpoint = ModelEndpoint(guarded)
    try:
        with pytest.raises(ModelUnavailable, match="address guard"):
            await endpoint.complete("acme", [{"role": "user", "content": "hi"}])
    finally:
        await endpoint.close()
    exempt = ModelEndpoint(
        ModelSettings(base_url="http://127.0.0.1:9/v1", model="m", guarded=False)
    )
    try:
        with pytest.raises(ModelUnavailable) as e:  # port 9 refuses: a connection error
            await exempt.complete("acme", [{"role": "user", "content": "hi"}])
        assert "address guard" not in e.value.reason
    finally:
        await exempt.close()
