"""Scrape-time series: the gauges computed from the node's state when Prometheus scrapes.

What it owns
------------
``ScrapeSources``: the callbacks a node hands to ``Metrics`` when it builds it
(``pagesift.node.node.Node`` wires them all in one place), and ``ScrapeTime``, the
collector that calls them at each scrape. The gauges that describe durable state (jobs
by kind and state, the webhook queue, the replication position) are read from the
store and the replication log here, never counted, so they cannot drift from them.

Guarantees
----------
- A source left None has its series left out (a node without a witness shows no
  ``pagesift_witness_*``); so does a source that returns None (the host delays while
  the node runs no engine).
- A failing source never breaks a scrape: its series are left out of that scrape and
  ``pagesift_scrape_errors_total{source}`` is incremented.
- Label cardinality stays bounded: kinds and states are closed sets, roles are the
  ``Role`` values, hosts are the engine's most recently slowed few.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pagesift.core.ha.roles import Role
from pagesift.core.jobs import records
from pagesift.core.store.db import Store

logger = logging.getLogger("pagesift.metrics")

KINDS = ("batch", "crawl")
STATES = ("scraping", "completed", "failed", "cancelled")
ROLES = tuple(r.value for r in Role)


@dataclass(frozen=True)
class ReplicationFigures:
    """What the replication series show, read at scrape time (``ScrapeSources.replication``).

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
    failsafe: bool = False  # writing on the standbys' failsafe grants alone
    grant_requests: int = 0  # failsafe grants asked (a primary's heartbeats)
    grants_confirmed: int = 0  # failsafe grants standbys answered
    promises: int = 0  # failsafe promises this node gave as a standby


@dataclass(frozen=True)
class StorageFigures:
    """What the store series show (``pagesift.core.api.storagewatch`` reads them)."""

    free_bytes: int
    volume_bytes: int
    reserve_bytes: int
    refusing: bool


@dataclass(frozen=True)
class BrowserFigures:
    """What the browser series show (``rendering.RenderingEngine.browser_figures``)."""

    can_render: bool
    pages_in_use: int
    pages_max: int
    restarts: int
    blocked_requests: int
    blocked_bytes: int


@dataclass(frozen=True)
class ScrapeSources:
    """Where the scrape-time series come from; each is called at every scrape, on the
    scraping thread (``metricshttp`` renders in a worker thread). None (or a call
    that returns None): the series are left out."""

    jobs_store: Callable[[], Store | None] | None = None
    webhook_queue_depth: Callable[[], int] | None = None
    replication: Callable[[], ReplicationFigures | None] | None = None
    witness: Callable[[], WitnessGauges | None] | None = None
    storage: Callable[[], StorageFigures | None] | None = None
    host_delays: Callable[[], dict[str, float] | None] | None = None
    browser: Callable[[], BrowserFigures | None] | None = None


class ScrapeTime(Collector):
    """The series computed from the node's state when Prometheus scrapes."""

    def __init__(self, sources: ScrapeSources) -> None:
        self._sources = sources
        self.errors: dict[str, int] = {}  # source -> failures (pagesift_scrape_errors)

    def collect(self) -> Iterable[Metric]:
        for source, fn in (
            ("jobs", self._jobs),
            ("webhooks", self._webhooks),
            ("replication", self._replication),
            ("witness", self._witness),
            ("storage", self._storage),
            ("hosts", self._hosts),
            ("browser", self._browser),
        ):
            try:
                families = list(fn())
            except Exception as e:
                logger.warning("metrics: the %s source failed: %r", source, e)
                self.errors[source] = self.errors.get(source, 0) + 1
                continue
            yield from families
        failed = CounterMetricFamily(
            "pagesift_scrape_errors",
            "Scrape-time sources that failed (their series were left out of that scrape).",
            labels=["source"],
        )
        for source, n in sorted(self.errors.items()):
            failed.add_metric([source], n)
        yield failed

    def _jobs(self) -> Iterable[Metric]:
        getter = self._sources.jobs_store
        store = getter() if getter is not None else None
        if store is None:
            return
        counts = {(k, s): 0 for k in KINDS for s in STATES}
        for job_id in records.all_job_ids(store):
            meta = records.load_meta(store, job_id)
            if meta is not None:
                counts[(meta.kind, meta.state)] = counts.get((meta.kind, meta.state), 0) + 1
        fam = GaugeMetricFamily(
            "pagesift_jobs", "Stored jobs by kind and state.", labels=["kind", "state"]
        )
        for (kind, state), n in sorted(counts.items()):
            fam.add_metric([kind, state], n)
        yield fam

    def _webhooks(self) -> Iterable[Metric]:
        fn = self._sources.webhook_queue_depth
        if fn is None:
            return
        yield GaugeMetricFamily(
            "pagesift_webhook_queue_depth",
            "Webhook events enqueued and not yet acknowledged (or given up), all jobs.",
            value=fn(),
        )

    def _hosts(self) -> Iterable[Metric]:
        fn = self._sources.host_delays
        delays = fn() if fn is not None else None
        if delays is None:
            return
        fam = GaugeMetricFamily(
            "pagesift_host_delay_seconds",
            "Current per-host delay: adaptive (429/503, latency) or a Retry-After pause "
            "left; the most recently slowed hosts only.",
            labels=["host"],
        )
        for host, seconds in sorted(delays.items()):
            fam.add_metric([host], seconds)
        yield fam

    def _browser(self) -> Iterable[Metric]:
        fn = self._sources.browser
        figures = fn() if fn is not None else None
        if figures is None:
            return
        for name, doc, value in (
            ("pagesift_browser_can_render", "1 when this node can render pages.",
             float(figures.can_render)),
            ("pagesift_browser_pages_in_use", "Pages the browser pool renders now.",
             figures.pages_in_use),
            ("pagesift_browser_pages_max", "Pages the browser pool renders at once at most.",
             figures.pages_max),
        ):  # fmt: skip
            yield GaugeMetricFamily(name, doc, value=value)
        for name, doc, value in (
            ("pagesift_browser_restarts", "Browsers relaunched (crash or recycle).",
             figures.restarts),
            ("pagesift_guard_proxy_blocked_requests",
             "Browser requests the guard proxy refused by the address rules.",
             figures.blocked_requests),
            ("pagesift_guard_proxy_blocked_bytes",
             "Bytes of browser requests the guard proxy refused, not relayed.",
             figures.blocked_bytes),
        ):  # fmt: skip
            yield CounterMetricFamily(name, doc, value=value)

    def _witness(self) -> Iterable[Metric]:
        fn = self._sources.witness
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
        yield GaugeMetricFamily(
            "pagesift_witness_failsafe",
            "1 while this primary writes past its witness lease on its standbys' grants.",
            w.failsafe,
        )
        for name, doc, value in (
            ("pagesift_witness_failsafe_requests",
             "Failsafe grants this node asked its standbys for (one per heartbeat).",
             w.grant_requests),
            ("pagesift_witness_failsafe_grants",
             "Failsafe grants its standbys answered.", w.grants_confirmed),
            ("pagesift_witness_failsafe_promises",
             "Promises not to campaign this node gave a primary as its standby.", w.promises),
        ):  # fmt: skip
            yield CounterMetricFamily(name, doc, value=value)

    def _storage(self) -> Iterable[Metric]:
        fn = self._sources.storage
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
        fn = self._sources.replication
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
