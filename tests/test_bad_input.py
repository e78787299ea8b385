"""Bad input gets a clear status naming the field, and leaves nothing in the store."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from pagesift.client.errors import details_of
from pagesift.core.api import rpcerrors
from pagesift.core.api.rpcerrors import Reason
from pagesift.v1 import jobs_pb2
from tests.helpers import RunningNode, in_process_node

OK = "http://127.0.0.1:9/"
C = grpc.StatusCode

CASES: list[tuple[str, object, C, str]] = [
    ("batch: empty", jobs_pb2.StartBatchScrapeRequest(), C.INVALID_ARGUMENT, "urls"),
    (
        "batch: over the cap",
        jobs_pb2.StartBatchScrapeRequest(urls=[OK] * 11),
        C.INVALID_ARGUMENT,
        "cap of 10",
    ),
    (
        "batch: bad scheme and unparsable URL named by index",
        jobs_pb2.StartBatchScrapeRequest(urls=[OK, "ftp://x/", "http://[::1"]),
        C.INVALID_ARGUMENT,
        "indices [1, 2]",
    ),
    (
        "crawl: credentials in the URL",
        jobs_pb2.StartCrawlRequest(url="http://user:s3cret@127.0.0.1:9/"),
        C.INVALID_ARGUMENT,
        "credentials in the URL are not accepted",
    ),
    (
        "scrape: credentials in the URL",
        jobs_pb2.ScrapeRequest(url="http://user@127.0.0.1:9/"),
        C.INVALID_ARGUMENT,
        "credentials in the URL are not accepted",
    ),
    (
        "batch: credentials in a URL, named by index",
        jobs_pb2.StartBatchScrapeRequest(urls=[OK, "http://u:p@127.0.0.1:9/"]),
        C.INVALID_ARGUMENT,
        "urls[1]: credentials in the URL are not accepted",
    ),
    (
        "batch: an unparsable host",
        jobs_pb2.StartBatchScrapeRequest(urls=["http://1.2.3.4.5/"]),
        C.INVALID_ARGUMENT,
        "invalid host",
    ),
    (
        "batch: negative concurrency",
        jobs_pb2.StartBatchScrapeRequest(urls=[OK], max_concurrency=-1),
        C.INVALID_ARGUMENT,
        "max_concurrency",
    ),
    (
        "batch: unknown format",
        jobs_pb2.StartBatchScrapeRequest(
            urls=[OK],
            options=jobs_pb2.ScrapeOptions(formats=[77]),  # type: ignore[list-item]
        ),
        C.INVALID_ARGUMENT,
        "options.formats[0]",
    ),
    ("crawl: no URL", jobs_pb2.StartCrawlRequest(), C.INVALID_ARGUMENT, "url"),
    (
        "crawl: bad scheme",
        jobs_pb2.StartCrawlRequest(url="javascript:alert(1)"),
        C.INVALID_ARGUMENT,
        "url",
    ),
    (
        "crawl: negative limit",
        jobs_pb2.StartCrawlRequest(url=OK, limit=-5),
        C.INVALID_ARGUMENT,
        "limit",
    ),
    (
        "crawl: absurd limit",
        jobs_pb2.StartCrawlRequest(url=OK, limit=10**9),
        C.INVALID_ARGUMENT,
        "limit",
    ),
    (
        "crawl: negative depth",
        jobs_pb2.StartCrawlRequest(url=OK, max_depth=-1),
        C.INVALID_ARGUMENT,
        "max_depth",
    ),
    (
        "crawl: invalid regex",
        jobs_pb2.StartCrawlRequest(url=OK, include_paths=["ok", "(unclosed"]),
        C.INVALID_ARGUMENT,
        "include_paths[1]",
    ),
    (
        "crawl: absurd delay",
        jobs_pb2.StartCrawlRequest(url=OK, delay=3600),
        C.INVALID_ARGUMENT,
        "delay",
    ),
    (
        "crawl: oversized URL",
        jobs_pb2.StartCrawlRequest(url=OK + "a" * 9000),
        C.INVALID_ARGUMENT,
        "url",
    ),
    ("get: not an id", jobs_pb2.GetJobRequest(id="nope"), C.INVALID_ARGUMENT, "id"),
    ("get: unknown id", jobs_pb2.GetJobRequest(id=str(uuid.uuid4())), C.NOT_FOUND, "id"),
    (
        "get: negative skip",
        jobs_pb2.GetJobRequest(id=str(uuid.uuid4()), skip=-1),
        C.INVALID_ARGUMENT,
        "skip",
    ),
    (
        "get: page too large",
        jobs_pb2.GetJobRequest(id=str(uuid.uuid4()), limit=100_000),
        C.INVALID_ARGUMENT,
        "limit",
    ),
    ("cancel: unknown id", jobs_pb2.CancelJobRequest(id=str(uuid.uuid4())), C.NOT_FOUND, "id"),
    ("errors: unknown id", jobs_pb2.GetJobErrorsRequest(id=str(uuid.uuid4())), C.NOT_FOUND, "id"),
    ("scrape: bad URL", jobs_pb2.ScrapeRequest(url="not a url"), C.INVALID_ARGUMENT, "url"),
]

METHOD = {
    jobs_pb2.StartBatchScrapeRequest: "StartBatchScrape",
    jobs_pb2.StartCrawlRequest: "StartCrawl",
    jobs_pb2.GetJobRequest: "GetJob",
    jobs_pb2.CancelJobRequest: "CancelJob",
    jobs_pb2.GetJobErrorsRequest: "GetJobErrors",
    jobs_pb2.ScrapeRequest: "Scrape",
}


async def call(node: RunningNode, request: object) -> None:
    await getattr(node.stub, METHOD[type(request)])(request)


def detail_fields(err: grpc.aio.AioRpcError) -> tuple[str, list[str]]:
    """The ErrorInfo reason and, for INVALID_ARGUMENT, the BadRequest's field paths (each
    named in the message too); from_call also checks the details match the status."""
    status = rpc_status.from_call(cast(Any, err))
    assert status is not None, err.details()
    (info,) = details_of(status, error_details_pb2.ErrorInfo)
    assert info.domain == rpcerrors.DOMAIN
    bad = details_of(status, error_details_pb2.BadRequest)
    if err.code() != C.INVALID_ARGUMENT:
        return info.reason, []
    (request,) = bad
    fields = [v.field for v in request.field_violations]
    assert fields and all(f in (err.details() or "") for f in fields), (fields, err.details())
    assert info.metadata["field"] == fields[0]
    return info.reason, fields


async def test_every_bad_request_gets_its_status_and_names_its_field(tmp_path: Path) -> None:
    async with in_process_node(tmp_path, max_batch_urls=10) as node:
        for label, request, code, words in CASES:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call(node, request)
            assert e.value.code() == code, label
            assert words in (e.value.details() or ""), (label, e.value.details())
            reason, fields = detail_fields(e.value)
            if code == C.NOT_FOUND:
                assert reason == Reason.JOB_NOT_FOUND, label
            else:
                assert reason == Reason.INVALID_FIELD, label
            if words == "indices [1, 2]":
                assert fields == ["urls[1]", "urls[2]"]  # each bad URL its own violation
            if words == "include_paths[1]":
                assert fields == ["include_paths[1]"]
        assert list(node.node.store().replicated_items()) == [], "a rejected call wrote"


async def test_invalid_urls_are_skipped_and_listed_back_when_asked(tmp_path: Path) -> None:
    async with in_process_node(tmp_path) as node:
        resp = await node.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(
                urls=[OK, "ftp://x/", "mailto:a@b"], ignore_invalid_urls=True
            )
        )
        assert list(resp.invalid_urls) == ["ftp://x/", "mailto:a@b"]
        job = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=resp.id))
        assert job.total == 1


async def test_an_oversized_request_is_refused_by_the_transport(tmp_path: Path) -> None:
    async with in_process_node(tmp_path) as node:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await node.stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(urls=[OK + "x" * 8000] * 2500)
            )
        assert e.value.code() == C.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/",
        "http://localhost/",
        "http://10.1.2.3/",
        "http://192.168.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/",
        "http://\u2460\u2461\u2466.\u24ea.\u24ea.\u2460/",
        "http://127\u30020\u30020\u30021/",
        "http://0x7f.1/",
        "http://2130706433/",
        "http://[64:ff9b::a01:203]/",
    ],
)
async def test_the_address_guard_refuses_private_targets_by_default(
    tmp_path: Path, url: str
) -> None:
    async with in_process_node(tmp_path, allow_private_networks=False) as node:
        for request in (
            jobs_pb2.StartCrawlRequest(url=url),
            jobs_pb2.StartBatchScrapeRequest(urls=[url]),
            jobs_pb2.ScrapeRequest(url=url),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call(node, request)
            assert e.value.code() == C.INVALID_ARGUMENT, url
            assert "url" in (e.value.details() or "")
            assert detail_fields(e.value)[1] in (["url"], ["urls"], ["urls[0]"])
        assert list(node.node.store().replicated_items()) == []
