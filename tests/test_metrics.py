"""Metrics: the /metrics endpoint scraped over HTTP and parsed, scrape-time gauges from a
real store, and the gRPC interceptor on a real grpc.aio server (unary and streaming)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from pagesift.core.api.metrics import Metrics
from pagesift.core.api.metricsgrpc import MetricsInterceptor
from pagesift.core.api.metricshttp import bound_port, start_http
from pagesift.core.api.metricsources import ReplicationFigures, ScrapeSources
from pagesift.core.jobs import records
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def scrape(port: int) -> tuple[str, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as resp,
    ):
        assert resp.status == 200
        return resp.headers["Content-Type"], await resp.text()


def add_job(store: Store, job_id: str, kind: str, state: str) -> None:
    meta = records.JobMeta(id=job_id, kind=kind, state=state, owner="a", created_ms=0, expires_ms=0)

    def group(g: WriteGroup) -> None:
        g.put(records.JobKeys(job_id).meta, meta.encode())
        g.insert(records.JOBS_SET, job_id.encode())

    store.write(group)


async def test_the_endpoint_serves_every_series(store: Store) -> None:
    figures = ReplicationFigures(
        role="standby",
        epoch=3,
        applied_offset=120,
        primary_offset=125,
        acked_offset=0,
        lag_seconds=0.5,
        connected=True,
        backlog_bytes=4096,
        full_resyncs=2,
        sync_degraded=1,
    )
    m = Metrics(
        ScrapeSources(
            jobs_store=lambda: store,
            webhook_queue_depth=lambda: 7,
            replication=lambda: figures,
            host_delays=lambda: None,  # no engine running: no host series
        )
    )
    other = Metrics()  # a second registry in the same process: no clash
    add_job(store, "1", "crawl", "scraping")
    add_job(store, "2", "crawl", "scraping")
    add_job(store, "3", "batch", "completed")
    m.page_recorded("crawl")
    m.page_recorded("crawl")
    m.page_recorded("batch")
    m.page_failed("timeout")
    m.page_failed("robots_disallowed")
    m.fetched(0.2, 1000)
    m.fetched(3.0, 24)
    m.limit_hit("pages_per_day")
    m.webhook_deliveries.labels("ok").inc(4)
    other.page_recorded("crawl")
    runner = await start_http(m, "127.0.0.1", 0)
    try:
        ctype, text = await scrape(bound_port(runner))
    finally:
        await runner.cleanup()
    assert ctype.startswith("text/plain")
    s = parse(text)
    assert s[("pagesift_jobs", (("kind", "crawl"), ("state", "scraping")))] == 2
    assert s[("pagesift_jobs", (("kind", "batch"), ("state", "completed")))] == 1
    assert s[("pagesift_jobs", (("kind", "batch"), ("state", "failed")))] == 0
    assert s[("pagesift_pages_total", (("kind", "crawl"),))] == 2
    assert s[("pagesift_pages_total", (("kind", "batch"),))] == 1
    assert s[("pagesift_page_errors_total", (("code", "timeout"),))] == 1
    assert s[("pagesift_robots_blocked_total", ())] == 1
    assert s[("pagesift_fetch_seconds_count", ())] == 2
    assert s[("pagesift_fetch_seconds_bucket", (("le", "0.25"),))] == 1
    assert s[("pagesift_fetch_seconds_sum", ())] == pytest.approx(3.2)
    assert s[("pagesift_fetched_bytes_total", ())] == 1024
    assert s[("pagesift_limit_rejections_total", (("limit", "pages_per_day"),))] == 1
    assert s[("pagesift_webhook_deliveries_total", (("result", "ok"),))] == 4
    assert s[("pagesift_webhook_queue_depth", ())] == 7
    assert s[("pagesift_replication_role", (("role", "standby"),))] == 1
    assert s[("pagesift_replication_role", (("role", "primary"),))] == 0
    assert s[("pagesift_replication_epoch", ())] == 3
    assert s[("pagesift_replication_applied_offset", ())] == 120
    assert s[("pagesift_replication_primary_offset", ())] == 125
    assert s[("pagesift_replication_lag_seconds", ())] == 0.5
    assert s[("pagesift_replication_connected", ())] == 1
    assert s[("pagesift_replication_backlog_bytes", ())] == 4096
    assert s[("pagesift_replication_full_resyncs_total", ())] == 2
    assert s[("pagesift_replication_sync_degraded_total", ())] == 1
    assert not any(name == "pagesift_host_delay_seconds" for name, _ in s)
    assert parse(other.exposition().decode())[("pagesift_pages_total", (("kind", "crawl"),))] == 1


async def test_a_failing_source_does_not_break_the_scrape() -> None:
    def broken() -> int:
        raise RuntimeError("store closed")

    m = Metrics(ScrapeSources(webhook_queue_depth=broken))
    m.page_recorded("batch")
    s = parse(m.exposition().decode())
    assert ("pagesift_webhook_queue_depth", ()) not in s
    assert s[("pagesift_scrape_errors_total", (("source", "webhooks"),))] == 1
    assert s[("pagesift_pages_total", (("kind", "batch"),))] == 1
    assert not any(name.startswith("pagesift_jobs") for name, _ in s)  # no store set


class Health(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    async def Check(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> health_pb2.HealthCheckResponse:
        if request.service == "abort":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such service")
        if request.service == "set_code":
            context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
            context.set_details("not now")
            return health_pb2.HealthCheckResponse()
        if request.service == "crash":
            raise RuntimeError("bug")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Watch(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        for _ in range(3):
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        if request.service == "abort":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too much")
        if request.service == "forever":
            for _ in range(1000):
                await asyncio.sleep(0.01)
                yield health_pb2.HealthCheckResponse()


async def test_the_interceptor_counts_requests_by_method_and_final_code() -> None:
    m = Metrics()
    server = grpc.aio.server(interceptors=[MetricsInterceptor(m)])
    health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await stub.Check(health_pb2.HealthCheckRequest())
            await stub.Check(health_pb2.HealthCheckRequest())
            for service, code in [
                ("abort", grpc.StatusCode.NOT_FOUND),
                ("set_code", grpc.StatusCode.FAILED_PRECONDITION),
                ("crash", grpc.StatusCode.UNKNOWN),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert info.value.code() == code
            assert len([r async for r in stub.Watch(health_pb2.HealthCheckRequest())]) == 3
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.Watch(health_pb2.HealthCheckRequest(service="abort")):
                    pass
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            call = stub.Watch(health_pb2.HealthCheckRequest(service="forever"))
            await call.read()
            call.cancel()
            unknown = channel.unary_unary("/no.Such/Method", None, None)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await unknown(b"")
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(None)

    def count(method: str, code: str) -> float:
        s = parse(m.exposition().decode())
        return s.get(("pagesift_grpc_requests_total", (("code", code), ("method", method))), 0.0)

    check, watch = "grpc.health.v1.Health/Check", "grpc.health.v1.Health/Watch"
    assert count(check, "OK") == 2
    assert count(check, "NOT_FOUND") == 1
    assert count(check, "FAILED_PRECONDITION") == 1
    assert count(check, "UNKNOWN") == 1
    assert count(watch, "OK") == 1
    assert count(watch, "RESOURCE_EXHAUSTED") == 1
    assert count(watch, "CANCELLED") == 1
    assert count("unknown", "UNIMPLEMENTED") == 1


async def test_handling_time_by_method_and_code_build_info_and_process_series() -> None:
    m = Metrics()
    server = grpc.aio.server(interceptors=[MetricsInterceptor(m)])
    health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await stub.Check(health_pb2.HealthCheckRequest())
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Check(health_pb2.HealthCheckRequest(service="abort"))
            assert len([r async for r in stub.Watch(health_pb2.HealthCheckRequest())]) == 3
    finally:
        await server.stop(None)
    runner = await start_http(m, "127.0.0.1", 0)
    try:
        _, text = await scrape(bound_port(runner))
    finally:
        await runner.cleanup()
    s = parse(text)
    check, watch = "grpc.health.v1.Health/Check", "grpc.health.v1.Health/Watch"

    def hist(suffix: str, method: str, code: str, **more: str) -> float:
        labels = tuple(sorted({"method": method, "code": code, **more}.items()))
        return s[(f"pagesift_grpc_server_handling_seconds_{suffix}", labels)]

    assert hist("count", check, "OK") == 1
    assert hist("count", check, "NOT_FOUND") == 1
    assert hist("count", watch, "OK") == 1
    assert hist("bucket", check, "OK", le="+Inf") == 1
    assert hist("bucket", check, "OK", le="0.001") <= 1  # the stated buckets
    assert 0 < hist("sum", check, "OK") < 5
    assert s[("pagesift_grpc_server_started_total", (("method", check),))] == 2
    assert s[("pagesift_grpc_server_started_total", (("method", watch),))] == 1
    (build,) = [labels for name, labels in s if name == "pagesift_build_info"]
    assert s[("pagesift_build_info", build)] == 1
    assert {k for k, _ in build} == {"version", "python", "grpc"}
    assert dict(build)["grpc"] == grpc.__version__
    names = {name for name, _ in s}
    assert {"process_resident_memory_bytes", "process_start_time_seconds", "python_info"} <= names
    assert "python_gc_objects_collected_total" in names
