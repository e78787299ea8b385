"""A node's descriptor reserve, and the HTTP caps that can never reach into it.

What it owns
------------
``node_budget(config, limit)``: the reserve parts of a node as configured, each the
bound of what that part may hold open (``pagesift.core.util.descriptors.plan``), and
``http_limits(config, budget)``: the connection discipline of the node's HTTP listeners
(the in-node gateway: the ``http_*`` keys; ``/metrics``: ``METRICS_LIMITS``) with their
total caps cut so that together they fit ``budget.http``. ``pagesift.node.grpcserver``
raises the soft RLIMIT_NOFILE, logs ``Budget.line()`` and starts the listeners with these.

The parts (the arithmetic; every number is a bound, not a measurement):

- ``process`` 64: stdio, the log, epoll, the loop's self-pipe, signals, /dev/urandom,
  the data directory's lock and reserve files.
- ``store`` 2 x (``MAX_OPEN_FILES`` + 24): RocksDB keeps at most ``MAX_OPEN_FILES``
  table files open, plus its WAL, MANIFEST, LOG, LOCK, CURRENT, OPTIONS; two stores can
  be open at once (a standby's fresh snapshot beside the live one, a backup's copy).
- ``grpc`` ports + 512: the public port, the gateway's loopback port and the mTLS
  replication port, and up to 512 callers' connections (gRPC caps none itself).
- ``gateway channels`` 2 x ``MAX_CLIENTS`` (with ``http_listen``): the in-node gateway's
  clients (one per API key) reach this node over loopback: both ends are here.
- ``replication`` 16: the log stream, a standby's channel, the witness's etcd channel.
- ``engine`` 2 x 256 + 64 + 32: the fetch sessions' connection limit (two sessions,
  ``primary.engine.sessions``), webhook deliveries (64) and resolver sockets.
- ``workers`` 8 per extraction worker (socket pairs and the process's pipes).
- ``browser`` 16 + 2 x the guard proxy's connections + 1 (with a browser): the browser's
  pipe, and each proxied request's two sockets (``GuardProxy.max_connections``).
"""

from __future__ import annotations

import inspect
from dataclasses import replace

from pagesift.core.api.metricshttp import METRICS_LIMITS
from pagesift.core.config.schema import ServerConfig
from pagesift.core.store.db import MAX_OPEN_FILES
from pagesift.core.util.connlimits import ListenerLimits
from pagesift.core.util.descriptors import Budget, plan
from pagesift.gateway.clients import MAX_CLIENTS
from pagesift.primary.engine.browser.guardproxy import GuardProxy
from pagesift.primary.engine.workers import worker_count

__all__ = ["GRPC_CONNECTIONS", "http_limits", "node_budget"]

GRPC_CONNECTIONS = 512
ENGINE_CONNECTIONS = 2 * 256 + 64 + 32
_GUARD_CONNECTIONS: int = inspect.signature(GuardProxy).parameters["max_connections"].default


def node_budget(config: ServerConfig, limit: int) -> Budget:
    """The descriptor budget of a node run with ``config`` under ``limit`` descriptors."""
    ports = 1 + bool(config.http_listen) + bool(config.replication_listen)
    parts = {
        "process": 64,
        "store": 2 * (MAX_OPEN_FILES + 24),
        "grpc": ports + GRPC_CONNECTIONS,
        "gateway channels": 2 * MAX_CLIENTS if config.http_listen else 0,
        "replication": 16,
        "engine": ENGINE_CONNECTIONS,
        "workers": 8 * worker_count(config.extract_processes),
        "browser": 16 + 2 * _GUARD_CONNECTIONS + 1 if config.browser_executable else 0,
    }
    listeners = bool(config.http_listen) + bool(config.metrics_listen)
    return plan(limit, {k: v for k, v in parts.items() if v}, listeners)


def http_limits(config: ServerConfig, budget: Budget) -> tuple[ListenerLimits, ListenerLimits]:
    """The in-node gateway's and ``/metrics``' limits, their total caps fitted to
    ``budget.http`` (a per-client cap never above its listener's total)."""
    gateway = ListenerLimits(
        header_timeout=config.http_header_timeout,
        idle_timeout=config.http_idle_timeout,
        body_timeout=config.http_body_timeout,
        max_requests=config.http_max_requests_per_connection,
        max_connections=config.http_max_connections,
        max_per_client=config.http_max_connections_per_client,
    )
    metrics = replace(
        METRICS_LIMITS,
        header_timeout=config.http_header_timeout,
        idle_timeout=config.http_idle_timeout,
        body_timeout=config.http_body_timeout,
    )
    wanted = {}
    if config.http_listen:
        wanted["gateway"] = gateway.max_connections
    if config.metrics_listen:
        wanted["metrics"] = metrics.max_connections
    caps = budget.split(wanted)
    return _capped(gateway, caps.get("gateway")), _capped(metrics, caps.get("metrics"))


def _capped(limits: ListenerLimits, cap: int | None) -> ListenerLimits:
    if cap is None or cap >= limits.max_connections:
        return limits
    per_client = min(limits.max_per_client, cap) if limits.max_per_client else 0
    return replace(limits, max_connections=cap, max_per_client=per_client)
