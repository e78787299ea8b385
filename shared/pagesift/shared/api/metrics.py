"""Prometheus metrics: one registry per node, a gRPC interceptor, and the /metrics endpoint.

What it owns
------------
``Metrics`` owns a private ``prometheus_client.CollectorRegistry`` (never the global
one, so tests and in-process pairs can create several) holding every pagesift
series. It stores nothing durable: counters start at zero with the process, and the
gauges that describe durable state (jobs by kind and state, the webhook queue, the
replication position) are computed AT SCRAPE TIME from callbacks the server sets
(``jobs_store``, ``webhook_queue_depth``, ``replication``), so they can never drift
from the store or the replication log.

Series (all prefixed ``pagesift_``):

==========================================  =========  ===================================
name                                        type       labels / meaning
==========================================  =========  ===================================
pagesift_jobs                               gauge      kind, state (read from the store)
pagesift_pages_total                        counter    kind: pages recorded
pagesift_page_errors_total                  counter    code: page errors recorded
pagesift_fetch_seconds                      histogram  one HTTP fetch (all hops)
pagesift_fetched_bytes_total                counter    body bytes fetched
pagesift_robots_blocked_total               counter    URLs refused by robots.txt
pagesift_fetch_retries_total                counter    cause: transient failures retried
                                                       (http_429, http_503, ..., connect,
                                                       timeout: a bounded set)
pagesift_host_delay_seconds                 gauge      host: the current adaptive delay or
                                                       Retry-After pause left, for at most
                                                       the 50 most recently slowed hosts
                                                       (bounded label cardinality)
pagesift_limit_rejections_total             counter    limit: RESOURCE_EXHAUSTED by limit
pagesift_worker_peak_memory_bytes           histogram  an extraction worker's peak resident
                                                       memory during one page (VmHWM),
                                                       WORKER_MEMORY_BUCKETS
pagesift_worker_losses_total                counter    cause: pages whose worker was lost
                                                       (crashed, memory, deadline, closed)
pagesift_watch_streams                      gauge      WatchJob streams open now
pagesift_watch_documents_read_total         counter    documents WatchJob read from the store
pagesift_watch_documents_buffered           gauge      of those, read but not yet taken by
                                                       the transport (the streams' windows)
pagesift_watch_bytes_in_flight              gauge      bytes of documents the streams read
                                                       that the transport has not taken yet
                                                       (bounded by watch_total_bytes)
pagesift_watch_stream_bytes_max             gauge      the most bytes one open stream holds
pagesift_watch_streams_waiting              gauge      streams waiting for the node's budget
pagesift_event_loop_lag_seconds             histogram  how late the event loop woke a
                                                       periodic timer (pagesift.node.looplag),
                                                       LAG_BUCKETS
pagesift_event_loop_lag_max_seconds         gauge      the largest of those since start
pagesift_webhook_deliveries_total           counter    result: ok | error | blocked (attempts),
                                                       undeliverable (events given up)
pagesift_webhook_queue_depth                gauge      events enqueued, not yet acknowledged
pagesift_replication_role                   gauge      role: 1 for this node's role, else 0
pagesift_replication_epoch                  gauge
pagesift_replication_applied_offset         gauge      last offset in this node's log
pagesift_replication_primary_offset         gauge      the primary's last offset (as known)
pagesift_replication_acked_offset           gauge      primary: best standby ack
pagesift_replication_lag_seconds            gauge
pagesift_replication_connected              gauge      1 when a peer is connected
pagesift_replication_backlog_bytes          gauge
pagesift_replication_full_resyncs_total     counter
pagesift_replication_sync_degraded_total    counter
pagesift_witness_up                         gauge      with a witness: 1 when its last call
                                                       succeeded
pagesift_witness_lease_remaining_seconds    gauge      until the write deadline (0: no lease)
pagesift_witness_takeover_behind_entries    gauge      entries behind at the last takeover
pagesift_grpc_requests_total                counter    method, code: finished RPCs (handled)
pagesift_grpc_server_started_total          counter    method: RPCs started (started minus
                                                       handled: in flight)
pagesift_grpc_server_handling_seconds       histogram  method, code: from the handler's start
                                                       to its end (a streaming RPC: to the
                                                       stream's end), GRPC_BUCKETS
pagesift_store_free_bytes                   gauge      free bytes on the data volume
                                                       (os.statvfs, read at scrape time)
pagesift_store_volume_bytes                 gauge      the data volume's size
pagesift_store_reserve_bytes                gauge      the reserve file present (released
                                                       when the volume fills;
                                                       pagesift.node.storage)
pagesift_store_refusing_writes              gauge      1 while the store refuses writes
                                                       (disk full, I/O error): jobs paused
pagesift_build_info                         gauge      version, python, grpc: always 1
==========================================  =========  ===================================

The registry also carries prometheus-client's process (``process_*``: CPU, resident
memory, open fds, start time), platform (``python_info``) and garbage collector
(``python_gc_*``) series.

Guarantees
----------
- ``MetricsInterceptor`` counts (and times) every RPC exactly once, when it finishes, with its
  final status code: OK, the code given to ``context.abort`` / ``context.set_code``,
  CANCELLED when the call is cancelled, UNKNOWN for an escaping exception, and
  UNIMPLEMENTED (method label ``unknown``, so label cardinality stays bounded) for a
  method no service has. It works for unary and streaming handlers alike. With
  tracing on (``pagesift.shared.util.tracing``) it also opens each RPC's server span.
- A failing scrape-time callback never breaks a scrape: its series are left out and
  ``pagesift_scrape_errors_total{source}`` is incremented.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import platform
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pagesift.shared.api.interceptors import Behavior, rewrap
from pagesift.shared.api.tls import Handler, ServerInterceptor
from pagesift.shared.ha.roles import Role
from pagesift.shared.jobs import records as jr
from pagesift.shared.store.db import Store
from pagesift.shared.util import tracing

__all__ = [
    "FETCH_BUCKETS",
    "GRPC_BUCKETS",
    "LAG_BUCKETS",
    "WORKER_MEMORY_BUCKETS",
    "Metrics",
    "MetricsInterceptor",
    "ReplicationFigures",
    "StorageFigures",
    "bound_port",
    "start_http",
]

logger = logging.getLogger("pagesift.metrics")

FETCH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# An extraction worker's peak memory in one page: 32 MiB (an idle worker) to 2 GiB.
WORKER_MEMORY_BUCKETS = tuple(
    float(mib << 20) for mib in (32, 64, 128, 256, 384, 512, 768, 1024, 2048)
)
# gRPC handling time: store reads (GetJob, ListJobs) take a millisecond or less, a
# Scrape as long as its fetch (FETCH_BUCKETS' range, up to a minute), streams
# (WatchJob, the replication stream) minutes to days: 1 ms .. 5 min, the longest in +Inf.
GRPC_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
# event-loop lag: a healthy loop wakes within a millisecond; a parse on the loop shows
# as 0.1 .. 60 s (issue 19 measured stalls of 46 s and more: those land in +Inf)
LAG_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
KINDS = ("batch", "crawl")
STATES = ("scraping", "completed", "failed", "cancelled")
ROLES = tuple(r.value for r in Role)


@dataclass(frozen=True)
class ReplicationFigures:
    """What the replication series show, read at scrape time (see ``Metrics.replication``).

    The node fills it from the same figures the AdminService Role call reports
    (``pagesift.node.status.role_status``): the replication log (role, epoch, last
    offset, backlog bytes) and the primary's sender or the standby's follower.
    """

    role: str  # a Role: primary | standby | fenced
    epoch: int
    applied_offset: int
    primary_offset: int
    acked_offset: int
    lag_seconds: float
    connected: bool
    backlog_bytes: int
    full_resyncs: int
    sync_degraded: int


@dataclass(frozen=True)
class WitnessGauges:
    """What the witness series show (nodes with a witness only)."""

    up: bool
    lease_remaining: float
    takeover_behind: int


@dataclass(frozen=True)
class StorageFigures:
    """What the store series show (``pagesift.node.storage`` reads them)."""

    free_bytes: int
    volume_bytes: int
    reserve_bytes: int
    refusing: bool


class Metrics:
    """Every pagesift series, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.pages = Counter("pagesift_pages", "Pages recorded, by job kind.", ["kind"], registry=r)
        self.page_errors = Counter(
            "pagesift_page_errors", "Page errors recorded, by error code.", ["code"], registry=r
        )
        self.fetch_seconds = Histogram(
            "pagesift_fetch_seconds",
            "Time to fetch one page (every redirect hop included).",
            buckets=FETCH_BUCKETS,
            registry=r,
        )
        self.fetched_bytes = Counter(
            "pagesift_fetched_bytes", "Response body bytes fetched.", registry=r
        )
        self.robots_blocked = Counter(
            "pagesift_robots_blocked",
            "URLs not fetched because robots.txt disallows them.",
            registry=r,
        )
        self.fetch_retries = Counter(
            "pagesift_fetch_retries",
            "Transient fetch failures retried, by cause (http_<status>, connect, timeout).",
            ["cause"],
            registry=r,
        )
        self.worker_peak_memory = Histogram(
            "pagesift_worker_peak_memory_bytes",
            "Peak resident memory of an extraction worker during one page (VmHWM).",
            buckets=WORKER_MEMORY_BUCKETS,
            registry=r,
        )
        self.worker_losses = Counter(
            "pagesift_worker_losses",
            "Extraction calls whose worker was lost, by cause (crashed, memory, deadline, "
            "closed, lost).",
            ["cause"],
            registry=r,
        )
        self.limit_rejections = Counter(
            "pagesift_limit_rejections",
            "Requests refused or jobs stopped by an account limit, by limit.",
            ["limit"],
            registry=r,
        )
        self.watch_streams = Gauge(
            "pagesift_watch_streams", "WatchJob streams open now.", registry=r
        )
        self.watch_documents_read = Counter(
            "pagesift_watch_documents_read",
            "Documents WatchJob streams read from the store.",
            registry=r,
        )
        self.watch_documents_buffered = Gauge(
            "pagesift_watch_documents_buffered",
            "Documents WatchJob streams read from the store that the transport has not "
            "taken yet (the sum of the streams' windows).",
            registry=r,
        )
        self.watch_bytes = Gauge(
            "pagesift_watch_bytes_in_flight",
            "Bytes of documents WatchJob streams read from the store that the transport "
            "has not taken yet (bounded by watch_total_bytes).",
            registry=r,
        )
        self.watch_stream_bytes_max = Gauge(
            "pagesift_watch_stream_bytes_max",
            "The most bytes in flight one open WatchJob stream holds now "
            "(bounded by watch_stream_bytes, or one bigger document alone).",
            registry=r,
        )
        self.watch_streams_waiting = Gauge(
            "pagesift_watch_streams_waiting",
            "WatchJob streams waiting for the node's watch_total_bytes budget.",
            registry=r,
        )
        self.event_loop_lag = Histogram(
            "pagesift_event_loop_lag_seconds",
            "How late the node's event loop woke a periodic timer (pagesift.node.looplag).",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.event_loop_lag_max = Gauge(
            "pagesift_event_loop_lag_max_seconds",
            "The largest event-loop lag measured since the process started.",
            registry=r,
        )
        self.webhook_deliveries = Counter(
            "pagesift_webhook_deliveries",
            "Webhook delivery attempts by result (ok: 2xx, error: failed attempt, blocked: "
            "refused by the address guard) and events given up (undeliverable: job note).",
            ["result"],
            registry=r,
        )
        self.grpc_requests = Counter(
            "pagesift_grpc_requests",
            "Finished gRPC requests by method and status code.",
            ["method", "code"],
            registry=r,
        )
        self.grpc_started = Counter(
            "pagesift_grpc_server_started",
            "gRPC requests started by method (started minus handled: in flight).",
            ["method"],
            registry=r,
        )
        self.grpc_handling_seconds = Histogram(
            "pagesift_grpc_server_handling_seconds",
            "gRPC request handling time by method and status code (streaming RPCs: to "
            "the stream's end).",
            ["method", "code"],
            buckets=GRPC_BUCKETS,
            registry=r,
        )
        self.build_info = Gauge(
            "pagesift_build_info",
            "Always 1: the pagesift, Python and gRPC versions of this process.",
            ["version", "python", "grpc"],
            registry=r,
        )
        self.build_info.labels(_version(), platform.python_version(), grpc.__version__).set(1)
        # process_*, python_info, python_gc_*: the same collectors as prometheus-client's
        # global registry, registered here (they read the process when scraped)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)
        self.scrape_errors: dict[str, int] = {}  # source -> failures (reported by _ScrapeTime)
        # scrape-time sources, set by the server (None: the series are left out)
        self.jobs_store: Callable[[], Store | None] | None = None
        self.webhook_queue_depth: Callable[[], int] | None = None
        self.replication: Callable[[], ReplicationFigures | None] | None = None
        self.witness: Callable[[], WitnessGauges | None] | None = None
        self.storage: Callable[[], StorageFigures | None] | None = None
        self.host_delays: Callable[[], dict[str, float]] | None = None  # set by the engine
        r.register(_ScrapeTime(self))

    # recording helpers -------------------------------------------------------------------
    def page_recorded(self, kind: str) -> None:
        self.pages.labels(kind).inc()

    def page_failed(self, code: str) -> None:
        self.page_errors.labels(code).inc()
        if code == "robots_disallowed":
            self.robots_blocked.inc()

    def fetched(self, seconds: float, nbytes: int) -> None:
        self.fetch_seconds.observe(seconds)
        if nbytes > 0:
            self.fetched_bytes.inc(nbytes)

    def fetch_retry(self, cause: str) -> None:
        self.fetch_retries.labels(cause).inc()

    def limit_hit(self, limit_name: str) -> None:
        self.limit_rejections.labels(limit_name).inc()

    def worker_call(self, peak_rss_bytes: int) -> None:
        self.worker_peak_memory.observe(peak_rss_bytes)

    def worker_lost(self, cause: str) -> None:
        self.worker_losses.labels(cause).inc()

    def interceptor(self) -> MetricsInterceptor:
        return MetricsInterceptor(self)

    def exposition(self) -> bytes:
        """The text exposition format of every series (what /metrics serves)."""
        return generate_latest(self.registry)


def _version() -> str:
    try:
        return metadata.version("pagesift")
    except metadata.PackageNotFoundError:
        return "unknown"


class _ScrapeTime(Collector):
    """The series computed from the node's state when Prometheus scrapes."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def collect(self) -> Iterable[Metric]:
        for source, fn in (
            ("jobs", self._jobs),
            ("webhooks", self._webhooks),
            ("replication", self._replication),
            ("witness", self._witness),
            ("storage", self._storage),
            ("hosts", self._hosts),
        ):
            try:
                families = list(fn())
            except Exception as e:
                logger.warning("metrics: the %s source failed: %r", source, e)
                errors = self._m.scrape_errors
                errors[source] = errors.get(source, 0) + 1
                continue
            yield from families
        failed = CounterMetricFamily(
            "pagesift_scrape_errors",
            "Scrape-time sources that failed (their series were left out of that scrape).",
            labels=["source"],
        )
        for source, n in sorted(self._m.scrape_errors.items()):
            failed.add_metric([source], n)
        yield failed

    def _jobs(self) -> Iterable[Metric]:
        getter = self._m.jobs_store
        store = getter() if getter is not None else None
        if store is None:
            return
        counts = {(k, s): 0 for k in KINDS for s in STATES}
        for job_id in jr.all_job_ids(store):
            meta = jr.load_meta(store, job_id)
            if meta is not None:
                counts[(meta.kind, meta.state)] = counts.get((meta.kind, meta.state), 0) + 1
        fam = GaugeMetricFamily(
            "pagesift_jobs", "Stored jobs by kind and state.", labels=["kind", "state"]
        )
        for (kind, state), n in sorted(counts.items()):
            fam.add_metric([kind, state], n)
        yield fam

    def _webhooks(self) -> Iterable[Metric]:
        fn = self._m.webhook_queue_depth
        if fn is None:
            return
        yield GaugeMetricFamily(
            "pagesift_webhook_queue_depth",
            "Webhook events enqueued and not yet acknowledged (or given up), all jobs.",
            value=fn(),
        )

    def _hosts(self) -> Iterable[Metric]:
        fn = self._m.host_delays
        if fn is None:
            return
        fam = GaugeMetricFamily(
            "pagesift_host_delay_seconds",
            "Current per-host delay: adaptive (429/503, latency) or a Retry-After pause "
            "left; the most recently slowed hosts only.",
            labels=["host"],
        )
        for host, seconds in sorted(fn().items()):
            fam.add_metric([host], seconds)
        yield fam

    def _witness(self) -> Iterable[Metric]:
        fn = self._m.witness
        w = fn() if fn is not None else None
        if w is None:
            return
        yield GaugeMetricFamily(
            "pagesift_witness_up", "1 when the last call to the witness succeeded.", w.up
        )
        yield GaugeMetricFamily(
            "pagesift_witness_lease_remaining_seconds",
            "Seconds until this node's write deadline (0 without the lease).",
            w.lease_remaining,
        )
        yield GaugeMetricFamily(
            "pagesift_witness_takeover_behind_entries",
            "Log entries this node was behind the pair state when it last took over.",
            w.takeover_behind,
        )

    def _storage(self) -> Iterable[Metric]:
        fn = self._m.storage
        f = fn() if fn is not None else None
        if f is None:
            return
        yield GaugeMetricFamily(
            "pagesift_store_free_bytes",
            "Free bytes on the data volume (statvfs: what the node may still write).",
            value=f.free_bytes,
        )
        yield GaugeMetricFamily(
            "pagesift_store_volume_bytes", "Size of the data volume in bytes.", value=f.volume_bytes
        )
        yield GaugeMetricFamily(
            "pagesift_store_reserve_bytes",
            "Bytes of the reserve file present (released when the volume fills).",
            value=f.reserve_bytes,
        )
        yield GaugeMetricFamily(
            "pagesift_store_refusing_writes",
            "1 while the store refuses writes (volume full or an I/O error): jobs paused.",
            value=1.0 if f.refusing else 0.0,
        )

    def _replication(self) -> Iterable[Metric]:
        fn = self._m.replication
        f = fn() if fn is not None else None
        if f is None:
            return
        role = GaugeMetricFamily(
            "pagesift_replication_role", "1 for this node's current role.", labels=["role"]
        )
        for name in sorted({*ROLES, f.role}):
            role.add_metric([name], 1.0 if name == f.role else 0.0)
        yield role

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"pagesift_replication_{name}", doc, value=value)

        yield gauge("epoch", "The replication epoch this node is in.", f.epoch)
        yield gauge("applied_offset", "Last log offset applied on this node.", f.applied_offset)
        yield gauge(
            "primary_offset", "The primary's last log offset, as known here.", f.primary_offset
        )
        yield gauge(
            "acked_offset", "Highest offset a standby acknowledged (primary).", f.acked_offset
        )
        yield gauge(
            "lag_seconds", "How long the follower has been behind the primary.", f.lag_seconds
        )
        yield gauge(
            "connected", "1 when the replication stream is up.", 1.0 if f.connected else 0.0
        )
        yield gauge(
            "backlog_bytes", "Bytes of log entries kept for reconnecting standbys.", f.backlog_bytes
        )
        yield CounterMetricFamily(
            "pagesift_replication_full_resyncs",
            "Full resyncs (snapshot transfers).",
            value=f.full_resyncs,
        )
        yield CounterMetricFamily(
            "pagesift_replication_sync_degraded",
            "Times sync replication degraded to async.",
            value=f.sync_degraded,
        )


# gRPC ------------------------------------------------------------------------------------


def _code_name(code: object) -> str:
    if isinstance(code, grpc.StatusCode):
        return code.name
    return "OK" if code is None else "UNKNOWN"


class MetricsInterceptor(ServerInterceptor):
    """Counts ``pagesift_grpc_requests_total{method,code}`` for every finished RPC, and
    ``pagesift_grpc_server_started_total`` and ``pagesift_grpc_server_handling_seconds``.

    grpc.aio gives an interceptor the handler, not the outcome, so the handler's
    behavior is wrapped: after it returns, ``context.code()`` is None (OK) or what
    ``set_code`` set; ``context.abort`` raises ``grpc.aio.AbortError`` after setting
    the code, so ``context.code()`` is read then too; any other exception reaches
    the client as UNKNOWN, and cancellation as CANCELLED. Streaming responses wrap the
    async generator and count (and time) when it ends.

    Our own rather than a library's: py-grpc-prometheus serves sync servers only (and
    the global registry), grpc-interceptor has no metrics; this wrapper is where the
    final code is known anyway. With tracing on, the wrapped behavior runs inside the
    RPC's server span (``tracing.server_span``), which continues the caller's trace.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def _count(self, method: str, code: str) -> None:
        self._m.grpc_requests.labels(method, code).inc()

    def _finish(self, method: str, code: str, started: float) -> None:
        self._m.grpc_requests.labels(method, code).inc()
        self._m.grpc_handling_seconds.labels(method, code).observe(time.perf_counter() - started)

    def _outcome(self, context: Any, exc: BaseException | None) -> str:
        if exc is None or isinstance(exc, grpc.aio.AbortError):
            return _code_name(context.code())
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            return "CANCELLED"
        return "UNKNOWN"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None:
            self._count("unknown", "UNIMPLEMENTED")
            return handler
        method = handler_call_details.method.lstrip("/")
        md = handler_call_details.invocation_metadata
        return rewrap(handler, lambda behavior: self._wrap(method, md, behavior))

    def _wrap(self, method: str, md: Any, behavior: Behavior) -> Behavior:
        started_total = self._m.grpc_started.labels(method)
        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                started_total.inc()
                started = time.perf_counter()
                exc: BaseException | None = None
                with tracing.server_span(method, md) as span:
                    try:
                        async for item in behavior(request, context):
                            yield item
                    except BaseException as e:
                        exc = e
                        raise
                    finally:
                        code = self._outcome(context, exc)
                        self._finish(method, code, started)
                        tracing.end_rpc(span, code, _code_value(code))

            return stream

        async def unary(request: Any, context: Any) -> Any:
            started_total.inc()
            started = time.perf_counter()
            exc: BaseException | None = None
            with tracing.server_span(method, md) as span:
                try:
                    result = behavior(request, context)
                    if inspect.isawaitable(result):
                        result = await result
                    return result
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    code = self._outcome(context, exc)
                    self._finish(method, code, started)
                    tracing.end_rpc(span, code, _code_value(code))

        return unary


def _code_value(name: str) -> int:
    code = getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN)
    value: int = code.value[0]
    return value


# HTTP ------------------------------------------------------------------------------------


async def start_http(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    """Serve ``GET /metrics`` on ``host:port`` (port 0: any free port, see ``bound_port``).

    The exposition is rendered in a worker thread (the jobs gauge reads the store),
    so a large store never stalls the event loop. Stop it with ``await runner.cleanup()``.
    """

    async def handle_metrics(request: web.Request) -> web.Response:
        body = await asyncio.to_thread(metrics.exposition)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_root(request: web.Request) -> web.Response:
        return web.Response(text="pagesift metrics: see /metrics\n")

    app = web.Application()
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/", handle_root)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port ``start_http`` actually listens on."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("the metrics endpoint is not listening")
