"""Every error status carries ``google.rpc`` details (``pagesift.core.api.rpcerrors``), and
the client fails over on the ErrorInfo reason, not on the status code."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from aiohttp import web
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from pagesift.client import JobClient
from pagesift.client.errors import details_of, reason_of
from pagesift.core.api import rpcerrors
from pagesift.core.api.rpcerrors import DOMAIN, Reason
from pagesift.core.jobs import quota
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import (
    DAILY,
    SOLO,
    Acct,
    free_port,
    in_process_node,
    serve_handler,
    write_accounts,
)

C = grpc.StatusCode
OK = "http://127.0.0.1:9/"


def status_of(err: grpc.aio.AioRpcError) -> Any:
    """The rich status, through grpc_status itself (it checks code and message match)."""
    status = rpc_status.from_call(cast(Any, err))  # its stubs say grpc.Call; an AioRpcError works
    assert status is not None, f"no details on {err.code()}: {err.details()}"
    assert isinstance(status, status_pb2.Status)
    return status


def unpack(status: Any, kind: Any) -> list[Any]:
    return details_of(status, kind)


def info_of(err: grpc.aio.AioRpcError) -> Any:
    (info,) = unpack(status_of(err), error_details_pb2.ErrorInfo)
    assert info.domain == DOMAIN
    return info


def fields_of(err: grpc.aio.AioRpcError) -> list[str]:
    (bad,) = unpack(status_of(err), error_details_pb2.BadRequest)
    return [v.field for v in bad.field_violations]


async def refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value


# ---------------------------------------------------------------- the server's statuses


async def test_every_invalid_argument_names_its_fields_in_a_bad_request(tmp_path: Path) -> None:
    async with in_process_node(tmp_path, max_batch_urls=10) as node:
        stub = node.stub
        cases: list[tuple[Any, list[str]]] = [
            (
                stub.StartBatchScrape(
                    jobs_pb2.StartBatchScrapeRequest(urls=[OK, "ftp://x/", "http://[::1"])
                ),
                ["urls[1]", "urls[2]"],
            ),
            (
                stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=OK, include_paths=["a", "("])),
                ["include_paths[1]"],
            ),
            (
                stub.Scrape(
                    jobs_pb2.ScrapeRequest(
                        url=OK, options=jobs_pb2.ScrapeOptions(headers={"Host": "x"})
                    )
                ),
                ["options.headers['Host']"],
            ),
            (stub.GetJob(jobs_pb2.GetJobRequest(id="nope")), ["id"]),
            (stub.WatchJob(jobs_pb2.WatchJobRequest(id=str(uuid.uuid4()), from_index=-1)), []),
            (stub.StartBatchScrape(jobs_pb2.StartBatchScrapeRequest()), ["urls"]),
        ]
        for call, fields in cases:
            if hasattr(call, "__aiter__"):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    async for _ in call:  # type: ignore[attr-defined]
                        pass
                err = e.value
                fields = ["from_index"]
            else:
                err = await refused(call)
            assert err.code() == C.INVALID_ARGUMENT
            assert fields_of(err) == fields, err.details()
            info = info_of(err)
            assert info.reason == Reason.INVALID_FIELD
            assert info.metadata["field"] == fields[0]


async def test_an_unknown_job_is_job_not_found_naming_the_id(tmp_path: Path) -> None:
    job = str(uuid.uuid4())
    async with in_process_node(tmp_path) as node:
        for call in (
            node.stub.GetJob(jobs_pb2.GetJobRequest(id=job)),
            node.stub.CancelJob(jobs_pb2.CancelJobRequest(id=job)),
            node.stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=job)),
        ):
            err = await refused(call)
            assert err.code() == C.NOT_FOUND
            info = info_of(err)
            assert (info.reason, info.metadata["id"]) == (Reason.JOB_NOT_FOUND, job)


async def test_a_standby_refuses_writes_as_not_primary_naming_the_primary(tmp_path: Path) -> None:
    primary = f"127.0.0.1:{free_port()}"  # nobody there: the standby keeps trying
    async with in_process_node(tmp_path, role="standby", primary=primary) as node:
        for call in (
            node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=OK)),
            node.stub.Scrape(jobs_pb2.ScrapeRequest(url=OK)),
        ):
            err = await refused(call)
            assert err.code() == C.FAILED_PRECONDITION  # clients that read no details move on
            assert primary in (err.details() or "")
            info = info_of(err)
            assert info.reason == Reason.NOT_PRIMARY
            assert info.metadata["primary"] == primary


async def test_limits_carry_quota_failure_retry_info_and_the_old_metadata(tmp_path: Path) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", [DAILY, SOLO])
    async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
        now = time.time()
        node.node.store().write(lambda g: quota.charge(g, DAILY.name, 10, now))
        err = await refused(node.stub.Scrape(jobs_pb2.ScrapeRequest(url=OK), metadata=DAILY.md))
        assert err.code() == C.RESOURCE_EXHAUSTED
        status = status_of(err)
        info = info_of(err)
        assert (info.reason, info.metadata["limit"]) == (Reason.QUOTA_EXCEEDED, "pages_per_day")
        (failure,) = unpack(status, error_details_pb2.QuotaFailure)
        (violation,) = failure.violations
        assert (violation.subject, violation.quota_id) == ("account:daily", "pages_per_day")
        (retry,) = unpack(status, error_details_pb2.RetryInfo)
        assert 0 < retry.retry_delay.seconds <= 24 * 3600
        md = dict(cast(Any, err.trailing_metadata()) or ())
        assert md["pagesift-limit"] == "pages_per_day"  # the same facts, alongside the details
        assert md["pagesift-limit-resets-at"] == info.metadata["resets_at"]

        # a concurrency limit has no known reset time: QuotaFailure, no RetryInfo
        await node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=OK), metadata=SOLO.md)
        err = await refused(
            node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=OK), metadata=SOLO.md)
        )
        assert err.code() == C.RESOURCE_EXHAUSTED
        assert info_of(err).metadata["limit"] == "max_concurrent_jobs"
        assert unpack(status_of(err), error_details_pb2.QuotaFailure)
        assert not unpack(status_of(err), error_details_pb2.RetryInfo)


async def test_permission_and_authentication_refusals_carry_their_reasons(
    tmp_path: Path,
) -> None:
    plain = Acct("plain")
    accounts = write_accounts(tmp_path / "accounts.toml", [plain], admin_key=None)
    async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
        options = jobs_pb2.ScrapeOptions(ignore_robots_txt=True)
        err = await refused(
            node.stub.Scrape(jobs_pb2.ScrapeRequest(url=OK, options=options), metadata=plain.md)
        )
        assert err.code() == C.PERMISSION_DENIED
        info = info_of(err)
        assert info.reason == Reason.PERMISSION_DENIED_FIELD
        assert dict(info.metadata) == {"field": "options.ignore_robots_txt", "account": "plain"}

        err = await refused(node.stub.ListJobs(jobs_pb2.ListJobsRequest()))  # no key
        assert err.code() == C.UNAUTHENTICATED
        assert info_of(err).reason == Reason.UNAUTHENTICATED


async def _slow(request: web.Request) -> web.StreamResponse:
    if request.path == "/missing":
        return web.Response(status=404, text="no")
    if request.path == "/busy":
        return web.Response(status=503, text="later", headers={"Retry-After": "1"})
    if request.path == "/slow":
        await asyncio.sleep(5)
    return web.Response(text="<html><body>hi</body></html>", content_type="text/html")


async def test_a_page_that_cannot_be_scraped_is_page_fetch_failed_by_its_code(
    tmp_path: Path,
) -> None:
    async with (
        serve_handler(_slow) as port,
        in_process_node(tmp_path, max_retries=0, read_timeout=0.5) as node,
    ):
        root = f"http://127.0.0.1:{port}"
        expected = [
            ("/missing", C.NOT_FOUND, "http_status", "404"),
            ("/busy", C.UNAVAILABLE, "http_status", "503"),
            # an upstream timeout is not the caller's deadline: UNAVAILABLE, not
            # DEADLINE_EXCEEDED, and never FAILED_PRECONDITION
            ("/slow", C.UNAVAILABLE, "timeout", None),
        ]
        for path, code, page_code, http_status in expected:
            err = await refused(node.stub.Scrape(jobs_pb2.ScrapeRequest(url=root + path)))
            assert err.code() == code, (path, err.details())
            info = info_of(err)
            assert info.reason == Reason.PAGE_FETCH_FAILED
            assert info.metadata["code"] == page_code
            assert info.metadata.get("http_status") == http_status
            assert info.metadata["url"] == root + path
            md = dict(cast(Any, err.trailing_metadata()) or ())
            assert md["pagesift-error-code"] == page_code


def test_page_statuses_follow_the_table() -> None:
    ps = rpcerrors.page_status
    assert ps("timeout") == ps("connect") == ps("dns") == C.UNAVAILABLE
    assert ps("http_status", 429) == ps("http_status", 502) == C.UNAVAILABLE
    assert ps("http_status", 404) == ps("http_status", 410) == C.NOT_FOUND
    assert ps("http_status", 403) == ps("parse_failed") == ps("action_failed") == C.ABORTED
    assert ps("too_large") == C.RESOURCE_EXHAUSTED and ps("render_failed") == C.UNAVAILABLE
    assert ps("robots_disallowed") == C.PERMISSION_DENIED
    assert ps("invalid_url") == ps("blocked_address") == C.INVALID_ARGUMENT
    for code in rpcerrors.PAGE_STATUS:  # never the caller's deadline, never "go elsewhere"
        assert ps(code) not in (C.DEADLINE_EXCEEDED, C.FAILED_PRECONDITION, C.UNKNOWN)


def test_reasons_are_stable_upper_snake() -> None:
    for reason in Reason:
        assert reason.value == reason.name and reason.value.isupper()


class Fake(jobs_pb2_grpc.JobServiceServicer):
    """Answers StartCrawl and Scrape with ``answer`` (an abort through rpcerrors, or a
    response)."""

    def __init__(self, answer: Callable[[Any], Awaitable[Any]]) -> None:
        self.answer = answer
        self.calls = 0

    async def StartCrawl(self, request: Any, context: Any) -> jobs_pb2.StartCrawlResponse:
        self.calls += 1
        await self.answer(context)
        return jobs_pb2.StartCrawlResponse(id="job-1")

    async def Scrape(self, request: Any, context: Any) -> jobs_pb2.ScrapeResponse:
        self.calls += 1
        await self.answer(context)
        return jobs_pb2.ScrapeResponse(document=jobs_pb2.Document(url=request.url))


@contextlib.asynccontextmanager
async def _serve(fake: Fake) -> AsyncIterator[str]:
    server = grpc.aio.server()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def fake(answer: Callable[[Any], Awaitable[Any]]) -> Fake:
    return Fake(answer)  # type: ignore[abstract]  # the other methods: UNIMPLEMENTED


async def _ok(context: Any) -> None:
    return None


def _refuse(
    status: C, reason: str, metadata: dict[str, str] | None = None
) -> Callable[[Any], Awaitable[None]]:
    async def answer(context: Any) -> None:
        await rpcerrors.abort(context, status, f"refused: {reason}", reason, metadata)

    return answer


async def test_the_client_follows_the_primary_a_not_primary_refusal_names() -> None:
    primary = fake(_ok)
    async with _serve(primary) as p_addr:
        standby = fake(_refuse(C.FAILED_PRECONDITION, Reason.NOT_PRIMARY, {"primary": p_addr}))
        # the client knows only the standby: the refusal's metadata leads it on
        async with _serve(standby) as s_addr, JobClient([s_addr], retry_budget=0.5) as client:
            assert await client.start_crawl(jobs_pb2.StartCrawlRequest(url=OK)) == "job-1"
            assert (standby.calls, primary.calls) == (1, 1)
            assert client.failover.preferred == p_addr
            await client.scrape(OK)
            assert (standby.calls, primary.calls) == (1, 2)  # straight to the primary


async def test_the_client_does_not_fail_over_on_an_answer_whatever_its_code() -> None:
    second = fake(_ok)
    async with _serve(second) as b_addr:
        answers = [
            _refuse(C.FAILED_PRECONDITION, Reason.WEBHOOK_SECRET_MISSING, {"account": "a"}),
            _refuse(C.UNAVAILABLE, Reason.PAGE_FETCH_FAILED, {"code": "timeout"}),
        ]
        for answer in answers:
            first = fake(answer)
            async with (
                _serve(first) as a_addr,
                JobClient([a_addr, b_addr], retry_budget=0.5) as client,
            ):
                client._located = True  # no Role lookups: the fakes have no AdminService
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await client.scrape(OK)
                assert reason_of(e.value) in (
                    Reason.WEBHOOK_SECRET_MISSING,
                    Reason.PAGE_FETCH_FAILED,
                )
                assert first.calls == 1 and second.calls == 0  # not sent elsewhere


@pytest.mark.parametrize("reason", [Reason.NOT_PRIMARY, Reason.FENCED])
async def test_a_refusal_to_send_elsewhere_moves_on_whatever_its_code(reason: Reason) -> None:
    second = fake(_ok)
    async with _serve(second) as b_addr:
        first = fake(_refuse(C.UNAVAILABLE, reason))  # no primary named, not the usual code
        async with (
            _serve(first) as a_addr,
            JobClient([a_addr, b_addr], retry_budget=0.5) as client,
        ):
            client._located = True
            assert await client.start_crawl(jobs_pb2.StartCrawlRequest(url=OK)) == "job-1"
            assert (first.calls, second.calls) == (1, 1)
