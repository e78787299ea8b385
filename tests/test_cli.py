"""The CLI and JobClient without a pagesift server: parsing, JSON shapes, failover.

Pure parts (argument parsing, request builders, JSON shapes) are tested directly;
the client's pure failover and retry rules are tests/test_client_failover.py's and
tests/test_client_retry.py's. The client's failover, paging, watch resumption
and the CLI's end-to-end output run against small in-process fake JobService
servers, so no real node is needed. Everything is bounded and fast.
"""

from __future__ import annotations

import functools
import json
import sys
import time
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import timestamp_pb2

from pagesift import cli
from pagesift.cli import amain, build_parser, main
from pagesift.cli.args import server_addresses
from pagesift.cli.common import format_rpc_error
from pagesift.cli.jobs import batch_request, crawl_request
from pagesift.cli.jobview import document_json, errors_json, job_json, jobs_json
from pagesift.cli.progress import JobProgress
from pagesift.cli.serve import serve_overrides
from pagesift.client import (
    DEFAULT_ADDRESS,
    ClientError,
    JobClient,
)
from pagesift.core.config.schema import ServerConfig
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import free_port

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
NEW_YEAR_2026 = 1_767_225_600  # 2026-01-01T00:00:00Z


def _ts(seconds: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds)


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    empty = grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, empty, empty, details, None)


def _dead_address() -> str:
    return f"127.0.0.1:{free_port()}"


# ---------------------------------------------------------------- parsing


def test_crawl_flags_build_the_request() -> None:
    args = build_parser().parse_args(
        [
            "crawl", "http://example.com/", "--limit", "50", "--max-depth", "3",
            "--include", "^/docs/", "--include", "^/blog/", "--exclude", "^/calendar/",
            "--allow-subdomains", "--allow-external", "--ignore-query", "--sitemap", "skip",
            "--concurrency", "4", "--delay", "0.5", "--format", "markdown,links",
            "--format", "html", "--only-main-content", "--wait", "--json",
            "--crawl-entire-domain", "--regex-on-full-url",
        ]
    )  # fmt: skip
    req = crawl_request(args)
    assert req.crawl_entire_domain and req.regex_on_full_url
    assert req.url == "http://example.com/"
    assert (req.limit, req.max_depth, req.max_concurrency, req.delay) == (50, 3, 4, 0.5)
    assert list(req.include_paths) == ["^/docs/", "^/blog/"]
    assert list(req.exclude_paths) == ["^/calendar/"]
    assert req.allow_subdomains and req.allow_external_links and req.ignore_query_parameters
    assert req.sitemap == jobs_pb2.SITEMAP_MODE_SKIP
    assert list(req.options.formats) == [
        jobs_pb2.FORMAT_MARKDOWN,
        jobs_pb2.FORMAT_LINKS,
        jobs_pb2.FORMAT_HTML,
    ]
    assert req.options.only_main_content and not req.options.allow_non_html
    assert req.idempotency_key == ""  # the client fills one in
    assert args.wait and args.json


def test_request_control_flags_build_the_options() -> None:
    args = build_parser().parse_args(
        [
            "batch", "http://example.com/a", "--header", "X-Team: data", "--header",
            "Authorization: Bearer t", "--cookie", "sid=1", "--user-agent", "acme/1.0",
            "--timeout", "2.5", "--skip-tls-verification", "--proxy", "pool",
            "--proxy-url", "http://u:p@proxy.example:3128", "--ignore-robots-txt",
            "--max-age", "600", "--format", "markdown,change_tracking", "--diff",
        ]
    )  # fmt: skip
    options = batch_request(args).options
    assert options.max_age.seconds == 600 and options.change_tracking_diff
    assert jobs_pb2.FORMAT_CHANGE_TRACKING in options.formats
    assert dict(options.headers) == {"X-Team": "data", "Authorization": "Bearer t"}
    assert dict(options.cookies) == {"sid": "1"}
    assert options.user_agent == "acme/1.0"
    assert options.timeout.ToNanoseconds() == 2_500_000_000
    assert options.skip_tls_verification and options.ignore_robots_txt
    assert (options.proxy, options.proxy_url) == ("pool", "http://u:p@proxy.example:3128")
    assert not crawl_request(build_parser().parse_args(["crawl", "http://x/"])).options.headers
    with pytest.raises(SystemExit):
        build_parser().parse_args(["scrape", "http://x/", "--header", "no-colon"])


def test_crawl_defaults() -> None:
    req = crawl_request(build_parser().parse_args(["crawl", "http://x/"]))
    assert req.sitemap == jobs_pb2.SITEMAP_MODE_INCLUDE
    assert (req.limit, req.max_depth, req.max_concurrency, req.delay) == (0, 0, 0, 0.0)
    assert not req.include_paths and not req.exclude_paths
    assert not req.crawl_entire_domain and not req.regex_on_full_url
    assert list(req.options.formats) == []


def test_batch_flags_build_the_request() -> None:
    args = build_parser().parse_args(
        ["batch", "http://a/", "http://b/", "--concurrency", "3", "--ignore-invalid",
         "--idempotency-key", "k1", "--wait"]
    )  # fmt: skip
    req = batch_request(args)
    assert list(req.urls) == ["http://a/", "http://b/"]
    assert req.max_concurrency == 3 and req.ignore_invalid_urls
    assert req.idempotency_key == "k1"
    assert args.wait and not args.json


def test_server_flags_repeat_and_split() -> None:
    parser = build_parser()
    args = parser.parse_args(["jobs", "--server", "a:1,b:2", "--server", "c:3", "--server", "a:1"])
    assert server_addresses(args) == ["a:1", "b:2", "c:3"]
    assert server_addresses(parser.parse_args(["jobs"])) == [DEFAULT_ADDRESS]
    args = parser.parse_args(["status", "j1", "--all", "--json", "--server", "[::1]:50051"])
    assert args.job == "j1" and args.all and args.json
    assert server_addresses(args) == ["[::1]:50051"]
    args = parser.parse_args(["watch", "j1", "--from", "7"])
    assert args.from_index == 7


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["jobs", "--server", "nohost"],
        ["jobs", "--server", "h:99999"],
        ["crawl", "http://x/", "--limit", "-1"],
        ["crawl", "http://x/", "--delay", "soon"],
        ["crawl", "http://x/", "--sitemap", "sometimes"],
        ["scrape", "http://x/", "--format", "pdf"],
        ["serve", "--role", "leader"],
        ["serve", "--listen", "nowhere"],
        ["batch"],
    ],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("scrape", "batch", "crawl", "status", "watch", "errors", "cancel", "jobs"):
        assert command in out
    assert main(["crawl", "--help"]) == 0
    assert "--exclude" in capsys.readouterr().out


# ---------------------------------------------------------------- serve


@pytest.fixture
def fake_server_module(monkeypatch: pytest.MonkeyPatch) -> list[ServerConfig]:
    """Replace ``pagesift.node.grpcserver`` by a module whose ``serve`` records its config."""
    seen: list[ServerConfig] = []

    def serve(config: ServerConfig) -> int:
        seen.append(config)
        return 0

    module = types.ModuleType("pagesift.node.grpcserver")
    module.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pagesift.node.grpcserver", module)
    return seen


def test_serve_flags_become_the_config(
    fake_server_module: list[ServerConfig], tmp_path: Path
) -> None:
    argv = [
        "serve", "--role", "standby", "--listen", "127.0.0.1:6000", "--data", str(tmp_path),
        "--primary", "127.0.0.1:5000", "--allow-private-networks", "--replication-mode", "sync",
        "--log-format", "json", "--job-ttl", "60", "--fsync",
    ]  # fmt: skip
    assert main(argv) == 0
    (cfg,) = fake_server_module
    assert (cfg.role, cfg.listen, cfg.primary) == ("standby", "127.0.0.1:6000", "127.0.0.1:5000")
    assert cfg.data == tmp_path
    assert cfg.allow_private_networks and cfg.fsync
    assert (cfg.replication_mode, cfg.log_format, cfg.job_ttl_seconds) == ("sync", "json", 60.0)


def test_serve_file_then_flags(fake_server_module: list[ServerConfig], tmp_path: Path) -> None:
    conf = tmp_path / "pagesift.toml"
    conf.write_text('[server]\nread_timeout = 1.5\nfsync = true\nlisten = "127.0.0.1:7000"\n')
    assert main(["serve", "--config", str(conf), "--listen", "127.0.0.1:7001"]) == 0
    (cfg,) = fake_server_module
    assert cfg.read_timeout == 1.5
    assert cfg.fsync  # from the file: an absent flag does not reset it
    assert cfg.listen == "127.0.0.1:7001"  # the flag wins
    assert cfg.role == "primary" and not cfg.allow_private_networks  # defaults


def test_serve_overrides_are_none_when_not_given() -> None:
    args = build_parser().parse_args(["serve"])
    over = serve_overrides(args)
    assert set(over) <= {f for f in ServerConfig.__dataclass_fields__}
    assert all(v is None for v in over.values())


@pytest.mark.parametrize(
    ("toml", "argv", "message"),
    [
        ("[server]\nno_such_key = 1\n", [], "config: no_such_key (file "),
        ("[server\n", [], "error: config:"),
        ("", ["--role", "standby"], "needs --primary"),
        ('[server]\ndefault_proxy = "eu"\n', [], "config: default_proxy: 'eu' is not a proxy"),
        ('[server.proxies]\neu = "ftp://p.example"\n', [], "proxies.eu: scheme must be"),
    ],
)
def test_serve_bad_config_exits_2(
    fake_server_module: list[ServerConfig],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    toml: str,
    argv: list[str],
    message: str,
) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(toml)
    assert main(["serve", "--config", str(conf), *argv]) == 2
    assert message in capsys.readouterr().err
    assert fake_server_module == []


def test_serve_missing_config_file_exits_2(
    fake_server_module: list[ServerConfig], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--config", str(tmp_path / "absent.toml")]) == 2
    assert capsys.readouterr().err.startswith("error: config:")


# ---------------------------------------------------------------- JSON shapes


def _job(**kw: Any) -> jobs_pb2.GetJobResponse:
    base: dict[str, Any] = {
        "id": "j1",
        "kind": jobs_pb2.JOB_KIND_CRAWL,
        "state": jobs_pb2.JOB_STATE_COMPLETED,
        "total": 12,
        "completed": 10,
        "failed": 2,
        "created_at": _ts(NEW_YEAR_2026),
        "expires_at": _ts(NEW_YEAR_2026 + 86400),
        "note": "",
    }
    base.update(kw)
    return jobs_pb2.GetJobResponse(**base)


def test_job_json_shape() -> None:
    docs = [
        jobs_pb2.Document(url="http://s/a", final_url="http://s/a", title="A", markdown="# A"),
        jobs_pb2.Document(url="http://s/old", final_url="http://s/new", title="New"),
    ]
    got = job_json(_job(), docs)
    assert got == {
        "id": "j1",
        "kind": "crawl",
        "state": "completed",
        "total": 12,
        "completed": 10,
        "failed": 2,
        "created_at": "2026-01-01T00:00:00Z",
        "expires_at": "2026-01-02T00:00:00Z",
        "note": "",
        "documents": [
            {"url": "http://s/a", "final_url": "http://s/a", "title": "A"},
            {"url": "http://s/old", "final_url": "http://s/new", "title": "New"},
        ],
        "next_skip": None,
    }
    json.dumps(got)  # serializable as is
    bare = job_json(jobs_pb2.GetJobResponse(id="x"), [], next_skip=100)
    assert bare["created_at"] is None and bare["expires_at"] is None
    assert bare["kind"] == "unspecified" and bare["state"] == "unspecified"
    assert bare["next_skip"] == 100


def test_wait_json_shape() -> None:
    p = JobProgress("j9")
    p.update(
        jobs_pb2.WatchJobResponse(
            state=jobs_pb2.StateChange(
                state=jobs_pb2.JOB_STATE_FAILED, total=5, completed=3, failed=2
            )
        )
    )
    assert p.as_json() == {"id": "j9", "state": "failed", "completed": 3, "total": 5, "failed": 2}
    assert list(p.as_json()) == ["id", "state", "completed", "total", "failed"]
    assert p.terminal and p.exit_code() == 1


def test_progress_counts_documents_between_state_changes() -> None:
    p = JobProgress("j", started=100.0)
    for i in range(4):
        doc = jobs_pb2.IndexedDocument(index=i, document=jobs_pb2.Document(url=f"u{i}"))
        p.update(jobs_pb2.WatchJobResponse(document=doc))
    assert (p.completed, p.total, p.done, p.documents_seen) == (4, 4, 4, 4)
    assert not p.terminal
    assert p.rate(now=102.0) == pytest.approx(2.0)
    p.update(
        jobs_pb2.WatchJobResponse(
            state=jobs_pb2.StateChange(
                state=jobs_pb2.JOB_STATE_SCRAPING, total=20, completed=5, failed=1
            )
        )
    )
    assert (p.completed, p.failed, p.total, p.done) == (5, 1, 20, 6)
    p.update(
        jobs_pb2.WatchJobResponse(
            state=jobs_pb2.StateChange(
                state=jobs_pb2.JOB_STATE_COMPLETED, total=20, completed=19, failed=1
            )
        )
    )
    assert p.terminal and p.exit_code() == 0
    assert p.summary() == "j: completed, 19 documents, 1 failed, 20 total"


def test_errors_and_jobs_json_shapes() -> None:
    resp = jobs_pb2.GetJobErrorsResponse(
        errors=[
            jobs_pb2.PageError(
                url="http://s/x", code="http_status", message="404", time=_ts(NEW_YEAR_2026)
            ),
            jobs_pb2.PageError(url="", code="note", message="stopped at limit"),
        ],
        robots_blocked=["http://s/private/a"],
    )
    assert errors_json("j1", resp) == {
        "id": "j1",
        "errors": [
            {
                "url": "http://s/x",
                "code": "http_status",
                "message": "404",
                "time": "2026-01-01T00:00:00Z",
            },
            {"url": "", "code": "note", "message": "stopped at limit", "time": None},
        ],
        "robots_blocked": ["http://s/private/a"],
    }
    summary = jobs_pb2.JobSummary(
        id="j2",
        kind=jobs_pb2.JOB_KIND_BATCH_SCRAPE,
        state=jobs_pb2.JOB_STATE_SCRAPING,
        total=3,
        completed=1,
        created_at=_ts(NEW_YEAR_2026),
    )
    assert jobs_json([summary]) == {
        "jobs": [
            {
                "id": "j2",
                "kind": "batch_scrape",
                "state": "scraping",
                "total": 3,
                "completed": 1,
                "created_at": "2026-01-01T00:00:00Z",
            }
        ]
    }


def test_document_json_full_is_every_field_of_the_message() -> None:
    doc = jobs_pb2.Document(
        url="http://s/a",
        final_url="http://s/a",
        status_code=200,
        content_type="text/html",
        title="A",
        language="en",
        markdown="# A",
        links=["http://s/b"],
    )
    got = document_json(doc, full=True)
    assert got["markdown"] == "# A" and got["links"] == ["http://s/b"]
    # every field, empty ones too (before: only the non-empty formats, and no cache_hit,
    # change_status or change_diff at all)
    assert (got["html"], got["raw_html"], got["change_diff"]) == ("", "", "")
    assert got["cache_hit"] is False and got["change_status"] == "CHANGE_STATUS_UNSPECIFIED"
    assert list(got) == [f.name for f in jobs_pb2.Document.DESCRIPTOR.fields]
    assert got["status_code"] == 200 and got["fetched_at"] is None
    assert document_json(doc) == {"url": "http://s/a", "final_url": "http://s/a", "title": "A"}


def test_format_rpc_error() -> None:
    err = _rpc_error(grpc.StatusCode.NOT_FOUND, "no job abc")
    assert format_rpc_error(err) == "error: NOT_FOUND: no job abc"
    assert format_rpc_error(_rpc_error(UNAVAILABLE, "")) == "error: UNAVAILABLE:"


# ---------------------------------------------------------------- a fake JobService


DOCS = [
    jobs_pb2.Document(
        url=f"http://site/p{i}", final_url=f"http://site/p{i}", title=f"Page {i}", status_code=200
    )
    for i in range(23)
]
FINAL = jobs_pb2.StateChange(state=jobs_pb2.JOB_STATE_COMPLETED, total=25, completed=23, failed=2)


class FakeJobs(jobs_pb2_grpc.JobServiceServicer):
    """A JobService with one finished job ``job-1``; a standby refuses writes."""

    def __init__(self, *, standby: bool = False, break_watch_at: int | None = None) -> None:
        self.standby = standby
        self.break_watch_at = break_watch_at
        self.calls: list[str] = []
        self.crawls: list[jobs_pb2.StartCrawlRequest] = []
        self.appends: list[jobs_pb2.AppendBatchScrapeRequest] = []
        self.watch_from: list[int] = []

    async def _write(self, name: str, context: grpc.aio.ServicerContext[object, object]) -> None:
        self.calls.append(name)
        if self.standby:
            await context.abort(FAILED_PRECONDITION, "standby: the primary is elsewhere")

    async def _job(self, job_id: str, context: grpc.aio.ServicerContext[object, object]) -> None:
        if job_id != "job-1":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id}")

    async def Scrape(
        self,
        request: jobs_pb2.ScrapeRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.ScrapeResponse:
        await self._write("Scrape", context)
        doc = jobs_pb2.Document(
            url=request.url,
            final_url=request.url,
            status_code=200,
            title="Scraped",
            markdown="# Scraped" if request.options.only_main_content else "# Scraped\n\nnav",
            links=["http://site/a", "http://site/b"],
        )
        return jobs_pb2.ScrapeResponse(document=doc)

    async def StartCrawl(
        self,
        request: jobs_pb2.StartCrawlRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.StartCrawlResponse:
        await self._write("StartCrawl", context)
        self.crawls.append(request)
        return jobs_pb2.StartCrawlResponse(id="job-1")

    async def StartBatchScrape(
        self,
        request: jobs_pb2.StartBatchScrapeRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.StartBatchScrapeResponse:
        await self._write("StartBatchScrape", context)
        return jobs_pb2.StartBatchScrapeResponse(id="job-1", invalid_urls=["nope"])

    async def AppendBatchScrape(
        self,
        request: jobs_pb2.AppendBatchScrapeRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.AppendBatchScrapeResponse:
        await self._write("AppendBatchScrape", context)
        await self._job(request.id, context)
        self.appends.append(request)
        added = len(request.urls)
        return jobs_pb2.AppendBatchScrapeResponse(
            id=request.id, first_index=25, added=added, total=25 + added
        )

    async def GetJob(
        self,
        request: jobs_pb2.GetJobRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.GetJobResponse:
        self.calls.append("GetJob")
        await self._job(request.id, context)
        limit = request.limit or 10
        end = request.skip + limit
        resp = _job(
            id="job-1", total=25, completed=23, failed=2, documents=DOCS[request.skip : end]
        )
        if end < len(DOCS):
            resp.next_skip = end
        return resp

    async def WatchJob(
        self,
        request: jobs_pb2.WatchJobRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        self.calls.append("WatchJob")
        self.watch_from.append(request.from_index)
        await self._job(request.id, context)
        for i in range(request.from_index, len(DOCS)):
            if i == self.break_watch_at and len(self.watch_from) == 1:
                await context.abort(UNAVAILABLE, "going away")
            doc = jobs_pb2.IndexedDocument(index=i, document=DOCS[i])
            yield jobs_pb2.WatchJobResponse(document=doc)
        yield jobs_pb2.WatchJobResponse(state=FINAL)

    async def GetJobErrors(
        self,
        request: jobs_pb2.GetJobErrorsRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.GetJobErrorsResponse:
        self.calls.append("GetJobErrors")
        await self._job(request.id, context)
        return jobs_pb2.GetJobErrorsResponse(
            errors=[jobs_pb2.PageError(url="http://site/x", code="http_status", message="404")]
        )

    async def Map(
        self,
        request: jobs_pb2.MapRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[jobs_pb2.MapResponse]:
        await self._write("Map", context)
        yield jobs_pb2.MapResponse(urls=[request.url, request.url + "a"])
        yield jobs_pb2.MapResponse(urls=[request.url + "b"])

    async def ListJobs(
        self,
        request: jobs_pb2.ListJobsRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.ListJobsResponse:
        self.calls.append("ListJobs")
        return jobs_pb2.ListJobsResponse(jobs=[jobs_pb2.JobSummary(id="job-1", total=25)])

    async def GetAccountUsage(
        self,
        request: jobs_pb2.GetAccountUsageRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.GetAccountUsageResponse:
        self.calls.append("GetAccountUsage")  # a read: a standby answers it too
        return jobs_pb2.GetAccountUsageResponse(account="anonymous", running_jobs=0)

    async def CancelJob(
        self,
        request: jobs_pb2.CancelJobRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.CancelJobResponse:
        await self._write("CancelJob", context)
        await self._job(request.id, context)
        return jobs_pb2.CancelJobResponse(state=jobs_pb2.JOB_STATE_CANCELLED)

    async def ResumeJob(
        self,
        request: jobs_pb2.ResumeJobRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.ResumeJobResponse:
        await self._write("ResumeJob", context)
        await self._job(request.id, context)
        return jobs_pb2.ResumeJobResponse(state=jobs_pb2.JOB_STATE_COMPLETED)  # finished: its own


async def _serve(service: FakeJobs) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def pair() -> AsyncIterator[tuple[FakeJobs, str, FakeJobs, str]]:
    """A fake standby and a fake primary."""
    standby = FakeJobs(standby=True)  # type: ignore[abstract]  # the extract calls: UNIMPLEMENTED
    primary = FakeJobs()  # type: ignore[abstract]
    s_server, s_addr = await _serve(standby)
    p_server, p_addr = await _serve(primary)
    try:
        yield standby, s_addr, primary, p_addr
    finally:
        await s_server.stop(None)
        await p_server.stop(None)


async def test_writes_fail_over_to_the_primary_and_reads_stick_to_it(
    pair: tuple[FakeJobs, str, FakeJobs, str],
) -> None:
    standby, s_addr, primary, p_addr = pair
    async with JobClient([s_addr, p_addr]) as client:
        assert await client.list_jobs()  # a standby answers reads
        assert standby.calls == ["ListJobs"]
        job_id = await client.start_crawl(jobs_pb2.StartCrawlRequest(url="http://site/"))
        assert job_id == "job-1"
        assert standby.calls == ["ListJobs", "StartCrawl"]  # refused: FAILED_PRECONDITION
        (sent,) = primary.crawls
        assert len(sent.idempotency_key) == 36  # set by the client, so a retry is safe
        assert client.failover.preferred == p_addr
        await client.get_job("job-1")
        assert primary.calls[-1] == "GetJob"
        assert "GetJob" not in standby.calls


async def test_an_append_is_a_keyed_write_that_fails_over_to_the_primary(
    pair: tuple[FakeJobs, str, FakeJobs, str],
) -> None:
    standby, s_addr, primary, p_addr = pair
    async with JobClient([s_addr, p_addr]) as client:
        resp = await client.append_batch("job-1", ["http://site/c", "http://site/d"])
    assert (resp.id, resp.first_index, resp.added, resp.total) == ("job-1", 25, 2, 27)
    assert standby.calls == primary.calls == ["AppendBatchScrape"]  # the standby refused
    (sent,) = primary.appends
    assert len(sent.idempotency_key) == 36  # set by the client, so a retry adds nothing twice


async def test_a_dead_address_is_skipped(pair: tuple[FakeJobs, str, FakeJobs, str]) -> None:
    _, _, primary, p_addr = pair
    async with JobClient([_dead_address(), p_addr], retry_budget=0.5) as client:
        t0 = time.monotonic()
        assert (await client.get_job("job-1")).id == "job-1"
        assert await client.cancel("job-1") == jobs_pb2.JOB_STATE_CANCELLED
        assert time.monotonic() - t0 < 15  # its 0.5 s budget, with room for a loaded box
        assert primary.calls == ["GetJob", "CancelJob"]


async def test_other_errors_are_raised_at_once(pair: tuple[FakeJobs, str, FakeJobs, str]) -> None:
    _, s_addr, primary, p_addr = pair
    async with JobClient([p_addr, s_addr]) as client:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client.get_job("nope")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert primary.calls == ["GetJob"]


async def test_only_standbys_reports_their_refusal(
    pair: tuple[FakeJobs, str, FakeJobs, str],
) -> None:
    _, s_addr, _, _ = pair
    async with JobClient([_dead_address(), s_addr], retry_budget=0.2) as client:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client.start_batch(jobs_pb2.StartBatchScrapeRequest(urls=["http://x/"]))
        assert e.value.code() == FAILED_PRECONDITION
        assert "primary" in (e.value.details() or "")


async def test_unavailable_everywhere_gives_up_within_the_budget() -> None:
    async with JobClient([_dead_address(), _dead_address()], retry_budget=0.4) as client:
        t0 = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client.list_jobs()
        assert e.value.code() == UNAVAILABLE
        assert 0.4 <= time.monotonic() - t0 < 15  # generous for a loaded box


async def test_iter_documents_follows_next_skip(pair: tuple[FakeJobs, str, FakeJobs, str]) -> None:
    _, _, primary, p_addr = pair
    async with JobClient(p_addr) as client:
        docs = [d.url async for d in client.iter_documents("job-1", page_size=7)]
        assert docs == [d.url for d in DOCS]
        assert primary.calls == ["GetJob"] * 4  # 7 + 7 + 7 + 2


async def test_iter_pages_rejects_a_stuck_next_skip(
    pair: tuple[FakeJobs, str, FakeJobs, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, _, p_addr = pair
    async with JobClient(p_addr) as client:

        async def stuck(job_id: str, *, skip: int = 0, limit: int = 0) -> jobs_pb2.GetJobResponse:
            return _job(next_skip=0)

        monkeypatch.setattr(client, "get_job", stuck)
        with pytest.raises(ClientError):
            async for _ in client.iter_pages("job-1"):
                pass


async def test_watch_resumes_after_the_server_goes_away() -> None:
    service = FakeJobs(break_watch_at=9)  # type: ignore[abstract]
    server, addr = await _serve(service)
    try:
        async with JobClient(addr) as client:
            indexes: list[int] = []
            states: list[int] = []
            async for event in client.watch("job-1", from_index=2):
                if event.HasField("document"):
                    indexes.append(event.document.index)
                else:
                    states.append(event.state.state)
        assert indexes == list(range(2, 23))
        assert states == [jobs_pb2.JOB_STATE_COMPLETED]
        assert service.watch_from == [2, 9]
    finally:
        await server.stop(None)


# ---------------------------------------------------------------- the CLI against a fake


async def test_crawl_wait_json_prints_one_object(
    pair: tuple[FakeJobs, str, FakeJobs, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, s_addr, primary, p_addr = pair
    code = await amain(
        [
            "crawl",
            "http://site/",
            "--wait",
            "--json",
            "--limit",
            "5",
            "--server",
            f"{s_addr},{p_addr}",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert json.loads(out) == {
        "id": "job-1",
        "state": "completed",
        "completed": 23,
        "total": 25,
        "failed": 2,
    }
    assert out.count("\n") == 1
    assert primary.crawls[0].limit == 5


async def test_status_all_json_follows_every_page(
    pair: tuple[FakeJobs, str, FakeJobs, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, s_addr, _, _ = pair
    assert await amain(["status", "job-1", "--all", "--json", "--server", s_addr]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [d["url"] for d in got["documents"]] == [d.url for d in DOCS]
    assert got["documents"][0] == {
        "url": "http://site/p0",
        "final_url": "http://site/p0",
        "title": "Page 0",
    }
    assert (got["id"], got["state"], got["completed"], got["failed"]) == (
        "job-1",
        "completed",
        23,
        2,
    )
    assert got["next_skip"] is None

    assert await amain(["status", "job-1", "--json", "--server", s_addr]) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(first["documents"]) == 10 and first["next_skip"] == 10


async def test_text_outputs(
    pair: tuple[FakeJobs, str, FakeJobs, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, s_addr, _, p_addr = pair
    assert await amain(["jobs", "--server", s_addr]) == 0
    assert "job-1" in capsys.readouterr().out
    assert await amain(["errors", "job-1", "--server", s_addr]) == 0
    assert "http://site/x\thttp_status\t404" in capsys.readouterr().out
    assert await amain(["cancel", "job-1", "--server", f"{s_addr},{p_addr}"]) == 0
    assert capsys.readouterr().out == "job-1: cancelled\n"
    assert await amain(["watch", "job-1", "--from", "20", "--server", s_addr]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[20] 200 http://site/p20")
    assert lines[-1] == "state: completed (23/25 done, 2 failed)"
    assert await amain(["batch", "http://a/", "--json", "--server", p_addr]) == 0
    assert json.loads(capsys.readouterr().out) == {"id": "job-1", "invalid_urls": ["nope"]}
    assert await amain(["status", "job-1", "--server", s_addr]) == 0
    out = capsys.readouterr().out
    assert "state:     completed" in out and "(more: use --all)" in out


async def test_scrape_prints_the_asked_formats(
    pair: tuple[FakeJobs, str, FakeJobs, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, s_addr, _, p_addr = pair
    servers = f"{s_addr},{p_addr}"
    assert await amain(["scrape", "http://site/a", "--only-main-content", "--server", servers]) == 0
    captured = capsys.readouterr()
    assert captured.out == "# Scraped\n"
    assert "200 http://site/a  Scraped" in captured.err
    argv = ["scrape", "http://site/a", "--format", "markdown,links", "--server", servers]
    assert await amain(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("==> markdown <==\n# Scraped\n\nnav\n==> links <==\n")
    assert out.endswith("http://site/a\nhttp://site/b\n")
    assert await amain(["scrape", "http://site/a", "--json", "--server", servers]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["title"] == "Scraped" and doc["links"] == ["http://site/a", "http://site/b"]


async def test_grpc_errors_print_code_and_details(
    pair: tuple[FakeJobs, str, FakeJobs, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, s_addr, _, _ = pair
    assert await amain(["status", "missing", "--server", s_addr]) == 3  # refused
    captured = capsys.readouterr()
    assert captured.err == "error: NOT_FOUND: no job missing\n"
    assert captured.out == ""
    assert await amain(["serve"]) == 2  # not from inside an event loop


def test_main_reports_unavailable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # --connect-timeout 0: no wait for a ready channel, the client's retries decide
    monkeypatch.setattr(cli, "JobClient", functools.partial(JobClient, retry_budget=0.2))
    assert main(["jobs", "--server", _dead_address(), "--connect-timeout", "0"]) == 4
    captured = capsys.readouterr()
    assert captured.err.startswith("error: UNAVAILABLE: ")
    assert captured.out == ""


async def test_crawl_wait_shows_progress_then_a_summary(
    pair: tuple[FakeJobs, str, FakeJobs, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, _, p_addr = pair
    assert await amain(["crawl", "http://site/", "--wait", "--server", p_addr]) == 0
    captured = capsys.readouterr()
    assert captured.out == "job-1\njob-1: completed, 23 documents, 2 failed, 25 total\n"
    assert "errors" in captured.err  # the progress bar went to stderr
    assert await amain(["batch", "http://a/", "--wait", "--json", "--server", p_addr]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == {
        "id": "job-1",
        "state": "completed",
        "completed": 23,
        "total": 25,
        "failed": 2,
        "invalid_urls": ["nope"],
    }


async def test_map_goes_to_the_primary_and_joins_every_batch(
    pair: tuple[FakeJobs, str, FakeJobs, str],
) -> None:
    standby, s_addr, primary, p_addr = pair
    async with JobClient([s_addr, p_addr], retry_budget=0) as client:
        got = await client.map("http://h/", search="x")
    assert got == ["http://h/", "http://h/a", "http://h/b"]
    assert standby.calls == ["Map"] and primary.calls == ["Map"]
