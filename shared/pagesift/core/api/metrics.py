"""Prometheus metrics: one registry per node and every series family in it.

What it owns
------------
``Metrics`` owns a private ``prometheus_client.CollectorRegistry`` (never the global
one, so tests and in-process pairs can create several) holding every pagesift
series, and the recording helpers the job, fetch and watch code call. It stores
nothing durable: counters start at zero with the process. The gauges that describe
durable state are computed at scrape time from the ``ScrapeSources`` the node passes
to the constructor (``metricsources``); the gRPC families are written by
``metricsgrpc.MetricsInterceptor``; ``metricshttp`` serves the exposition.

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
pagesift_page_seconds                       histogram  engine: one page from request to
                                                       Page (http, browser: a render)
pagesift_auto_renders_total                 counter    reason: pages AUTO rendered (a
                                                       needs_render reason, "requested",
                                                       "host needs rendering")
pagesift_browser_pages_in_use               gauge      pages the browser pool renders now
pagesift_browser_pages_max                  gauge      the pool's page slots
pagesift_browser_restarts_total             counter    browsers relaunched (crash, recycle)
pagesift_browser_can_render                 gauge      1 when this node has a browser
pagesift_guard_proxy_blocked_requests_total counter    browser requests the guard proxy
                                                       refused (address rules)
pagesift_guard_proxy_blocked_bytes_total    counter    ... bytes of them not relayed
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
pagesift_witness_failsafe                   gauge      1 while a primary writes past its lease
                                                       on its standbys' failsafe grants
pagesift_witness_failsafe_requests_total    counter    grants asked (primary heartbeats)
pagesift_witness_failsafe_grants_total      counter    grants the standbys answered
pagesift_witness_failsafe_promises_total    counter    promises given as a standby
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
                                                       pagesift.core.api.storagewatch)
pagesift_store_refusing_writes              gauge      1 while the store refuses writes
                                                       (disk full, I/O error): jobs paused
pagesift_build_info                         gauge      version, python, grpc: always 1
pagesift_scrape_errors_total                counter    source: scrape-time sources that
                                                       failed (their series left out)
==========================================  =========  ===================================

The registry also carries prometheus-client's process (``process_*``: CPU, resident
memory, open fds, start time), platform (``python_info``) and garbage collector
(``python_gc_*``) series.
"""

from __future__ import annotations

import platform
from importlib import metadata

import grpc
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from pagesift.core.api.metricsources import ScrapeSources, ScrapeTime

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


class Metrics:
    """Every pagesift series, in a registry of its own."""

    def __init__(self, sources: ScrapeSources | None = None) -> None:
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
        self.page_seconds = Histogram(
            "pagesift_page_seconds",
            "Time to produce one page, by the engine that produced it (browser: a render).",
            ["engine"],
            buckets=FETCH_BUCKETS,
            registry=r,
        )
        self.model_calls = Counter(
            "pagesift_model_calls",
            "Calls to the model endpoint, by outcome (ok, invalid_answer, failed, timeout).",
            ["outcome"],
            registry=r,
        )
        self.model_seconds = Histogram(
            "pagesift_model_seconds",
            "Time one model call takes, its slot wait left out.",
            buckets=FETCH_BUCKETS,
            registry=r,
        )
        self.model_tokens = Counter(
            "pagesift_model_tokens",
            "Model tokens as the endpoint reports them, by direction (input, output).",
            ["direction"],
            registry=r,
        )
        self.auto_renders = Counter(
            "pagesift_auto_renders",
            "Pages the AUTO engine rendered with the browser, by reason.",
            ["reason"],
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
        # the gauges read from the node's state at each scrape (``metricsources``)
        self.scrape_time = ScrapeTime(sources or ScrapeSources())
        r.register(self.scrape_time)

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

    def page_produced(self, engine: str, seconds: float) -> None:
        self.page_seconds.labels(engine).observe(seconds)

    def model_called(self, outcome: str, seconds: float, tokens_in: int, tokens_out: int) -> None:
        self.model_calls.labels(outcome).inc()
        self.model_seconds.observe(seconds)
        if tokens_in:
            self.model_tokens.labels("input").inc(tokens_in)
        if tokens_out:
            self.model_tokens.labels("output").inc(tokens_out)

    def auto_rendered(self, reason: str) -> None:
        self.auto_renders.labels(reason).inc()

    def fetch_retry(self, cause: str) -> None:
        self.fetch_retries.labels(cause).inc()

    def limit_hit(self, limit_name: str) -> None:
        self.limit_rejections.labels(limit_name).inc()

    def worker_call(self, peak_rss_bytes: int) -> None:
        self.worker_peak_memory.observe(peak_rss_bytes)

    def worker_lost(self, cause: str) -> None:
        self.worker_losses.labels(cause).inc()

    def exposition(self) -> bytes:
        """The text exposition format of every series (what /metrics serves)."""
        return generate_latest(self.registry)


def _version() -> str:
    try:
        return metadata.version("pagesift")
    except metadata.PackageNotFoundError:
        return "unknown"
