"""Tracing (pagesift.core.util.tracing): off by default and free when off; on, a real
in-process node makes an RPC server span continuing the caller's trace, a child fetch
span per page, store commit spans, and JSON log lines carry the trace and span ids."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from aiohttp import web
from google.protobuf.duration_pb2 import Duration
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.core.util import tracing
from pagesift.node.logs import JsonLogFormatter
from pagesift.v1 import jobs_pb2
from tests.helpers import eventually, in_process_node, serve_handler, until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.shutdown()


def test_the_environment_decides_and_the_default_is_off() -> None:
    assert tracing.wanted({}) is None
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}) == "otlp"
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console"}) == "console"
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp"}) == "otlp"
    off = {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}
    assert tracing.wanted(off) is None
    assert not tracing.configure_from_env({})
    assert not tracing.enabled()
    with tracing.span("anything") as s:
        assert s is None
    assert tracing.current_ids() is None


def test_store_commits_are_spans_with_their_offset(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    store = Store(tmp_path / "s")
    try:

        def put(g: WriteGroup) -> None:
            g.put("k", b"v")

        store.write(put)
        store.write(lambda g: None)  # writes nothing: no span
    finally:
        store.close()
    (commit,) = spans.get_finished_spans()
    assert commit.name == "store.commit"
    assert commit.attributes is not None
    assert commit.attributes["pagesift.store.ops"] == 1
    assert commit.attributes["pagesift.log.offset"] == 0  # no replication log here


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def test_a_scrape_is_an_rpc_span_with_fetch_and_commit_children(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async def handle(request: web.Request) -> web.Response:
        if request.path == "/missing":
            return web.Response(status=404, text="no")
        return web.Response(text="<html><head><title>T</title></head><body>hi</body></html>",
                            content_type="text/html")  # fmt: skip

    async with serve_handler(handle) as port, in_process_node(tmp_path / "n") as n:
        cached = jobs_pb2.ScrapeOptions(max_age=Duration(seconds=60))  # commits the copy
        md = (("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01"),)
        url = f"http://127.0.0.1:{port}/page"
        got = await n.stub.Scrape(jobs_pb2.ScrapeRequest(url=url, options=cached), metadata=md)
        assert got.document.status_code == 200
        missing = jobs_pb2.ScrapeRequest(url=f"http://127.0.0.1:{port}/missing")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await n.stub.Scrape(missing)
        refused_code = info.value.code()  # a page error's code (jobservice decides which)
        assert refused_code.name not in tracing.GRPC_SERVER_ERRORS
    finished = spans.get_finished_spans()
    rpcs = by_name(finished, "pagesift.v1.JobService/Scrape")
    assert len(rpcs) == 2
    rpc = next(s for s in rpcs if s.context is not None and s.context.trace_id == int(TRACE_ID, 16))
    assert rpc.kind == SpanKind.SERVER
    assert rpc.parent is not None and rpc.parent.span_id == int(PARENT_ID, 16)
    assert rpc.attributes is not None
    assert rpc.attributes["rpc.method"] == "Scrape"
    assert rpc.attributes["rpc.grpc.status_code"] == 0
    assert rpc.context is not None

    def children(name: str) -> list[ReadableSpan]:
        assert rpc.context is not None
        return [
            s
            for s in by_name(finished, name)
            if s.parent is not None and s.parent.span_id == rpc.context.span_id
        ]

    (fetch,) = children("fetch")
    assert fetch.attributes is not None
    assert fetch.attributes["server.address"] == "127.0.0.1"
    assert fetch.attributes["http.response.status_code"] == 200
    assert children("store.commit"), "the cached copy is committed inside the RPC"
    failed = [s for s in by_name(finished, "fetch") if s is not fetch]
    assert len(failed) == 1
    assert failed[0].attributes is not None
    assert failed[0].attributes["error.type"] == "http_status"
    assert failed[0].attributes["http.response.status_code"] == 404
    assert failed[0].status.status_code == StatusCode.ERROR
    refused = next(s for s in rpcs if s is not rpc)
    assert refused.attributes is not None
    assert refused.attributes["rpc.grpc.status_code"] == refused_code.value[0]
    assert refused.status.status_code == StatusCode.UNSET  # a caller's error, not the server's


def test_json_log_lines_carry_the_current_trace_and_span(spans: InMemorySpanExporter) -> None:
    record = logging.LogRecord("pagesift.jobs", logging.INFO, __file__, 1, "m", (), None)
    with tracing.span("work") as s:
        assert s is not None
        line = json.loads(JsonLogFormatter().format(record))
        ctx = s.get_span_context()
    assert line["trace_id"] == format(ctx.trace_id, "032x")
    assert line["span_id"] == format(ctx.span_id, "016x")
    outside = json.loads(JsonLogFormatter().format(record))
    assert "trace_id" not in outside


async def page(request: web.Request) -> web.Response:
    return web.Response(text="<html><title>A</title><p>a</p></html>", content_type="text/html")


async def test_a_standby_applies_the_primarys_commits_in_spans_matched_by_offset(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with (
        serve_handler(page) as port,
        in_process_node(tmp_path / "p", respect_robots=False) as p,
        in_process_node(tmp_path / "s", role="standby", primary=p.address) as s,
    ):
        # streaming before the first commit: what a standby copies by a full resync
        # (it joined after the commit) is applied by no span
        await until(
            lambda: s.node.follower is not None and s.node.follower.status().connected,
            "the standby to stream",
        )
        started = await p.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=[f"http://127.0.0.1:{port}/a"])
        )

        async def finished() -> bool | None:  # the job writes nothing more after this
            job = await p.stub.GetJob(jobs_pb2.GetJobRequest(id=started.id, limit=1))
            return True if job.state == jobs_pb2.JOB_STATE_COMPLETED else None

        await eventually(finished, "the job to complete")

        # the primary's log, not the span list: spans of any other node in this process
        # (another test's, still closing) carry offsets of their own
        last = p.node.slot.log.last_offset

        async def applied() -> list[ReadableSpan] | None:
            applies = by_name(spans.get_finished_spans(), "replication.apply")
            reached = any(last_offset(a) >= last for a in applies)
            return applies if reached else None

        applies = await eventually(applied, "the standby to apply the primary's commits")
        resyncs = s.node.follower.full_resyncs if s.node.follower is not None else -1
    committed = {offset_of(c) for c in by_name(spans.get_finished_spans(), "store.commit")}
    assert set(range(1, last + 1)) <= committed  # each primary commit has its span
    ranges = [(first_offset(a), last_offset(a)) for a in applies]
    for offset in range(1, last + 1):  # every primary commit lies inside one apply span
        assert any(lo <= offset <= hi for lo, hi in ranges), (offset, ranges, resyncs)
    for apply in applies:
        assert _attr(apply, "pagesift.log.entries") >= 1


def _attr(span: ReadableSpan, key: str) -> int:
    value = (span.attributes or {}).get(key, 0)
    assert isinstance(value, int), (key, value)
    return value


def offset_of(span: ReadableSpan) -> int:
    return _attr(span, "pagesift.log.offset")


def first_offset(span: ReadableSpan) -> int:
    return _attr(span, "pagesift.log.first_offset")


def last_offset(span: ReadableSpan) -> int:
    return _attr(span, "pagesift.log.last_offset")
