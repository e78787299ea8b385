"""A node in a cluster: its wiring to ``pagesift.coord``, and its record built from what it does.

What it owns
------------
``start_registrar(node)``: with ``cluster`` set (and a witness, whose etcd holds the
cluster), a ``pagesift.coord.registry.Registrar`` that keeps this node's ``NodeRecord``
under its own lease (ttl = ``witness_ttl``), so ``pagesift cluster status`` and cluster
clients see the pair, and tells the node's ``Tenure`` (``tenure_for``: its hold on its
pair's hosts, ``pagesift.core.cluster.tenure``) how each round went; None without a
cluster. ``jobs_factory(config, accounts)``: what
the node builds its job runtime with (``Jobs``, or with ``cluster`` set ``ClusteredJobs``
over one ``pagesift.coord.budgets.ClusterBudgets``, kept for every time it is primary):
it lives here, not in ``pagesift.coord``, because it imports the primary role.
``cluster_access``: the cluster URL and etcd credentials of a node's config;
``registry_for``: the registry it writes (records signed with ``cluster_signing_key_file``)
and reads (verified against ``cluster_members``).
``LoadMeter`` turns the node's counters into rates between two records: pages/s from
``pagesift_pages_total`` and the CPU of the node's process (and its extraction workers)
from ``os.times``.

What a record says (``node_record``)
------------------------------------
role "primary" while the node takes writes, else "standby"; the log's epoch; a
standby's lag in log entries; ``max_concurrency`` as capacity; ``per_host_concurrency``
as it is (capped at ``registry.MAX_PER_HOST_CONCURRENCY``, which a reader accepts), the
limit ``pagesift drill --cluster`` judges this node's politeness by; and, on the primary,
its running jobs and the pages they still have to fetch (``views.progress`` of each
running job: bounded by the running jobs, no scan of the store).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from pagesift.coord.budgets import ClusterBudgets, EtcdBudgets
from pagesift.coord.owners import RegistryOwners
from pagesift.coord.registry import EtcdRegistry, Registrar
from pagesift.core.api.metrics import Metrics
from pagesift.core.cluster.members import load_members
from pagesift.core.cluster.registryrules import MAX_PER_HOST_CONCURRENCY, Load, NodeRecord
from pagesift.core.cluster.signing import RecordSigner
from pagesift.core.cluster.tenure import Tenure
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import records, views
from pagesift.core.jobs.accounts import Accounts
from pagesift.core.replication.slot import StoreSlot
from pagesift.node.startup import StartRefused, advertised
from pagesift.node.status import RoleStatus
from pagesift.primary.jobs.clustered import ClusteredJobs
from pagesift.primary.jobs.runtime import Jobs


class Node(Protocol):
    """What a record reads of the node (``pagesift.node.node.Node``)."""

    config: ServerConfig
    node_id: str
    metrics: Metrics
    slot: StoreSlot
    jobs: Jobs | None
    tenure: Tenure | None

    @property
    def takes_writes(self) -> bool: ...

    def role_status(self) -> RoleStatus: ...


__all__ = [
    "LoadMeter", "budgets_for", "cluster_access", "jobs_factory", "node_record",
    "registration_ttl", "registry_for", "start_registrar", "tenure_for",
]  # fmt: skip

log = logging.getLogger(__name__)


def cluster_access(config: ServerConfig) -> tuple[str, str, str]:
    """(url, user, password): the cluster (``etcd://…/NAME``, the witness's etcd and
    ``cluster``) and the etcd credentials a node of ``config`` reaches it with."""
    password = ""
    if config.witness_password_file:
        password = Path(config.witness_password_file).read_text().strip()
    endpoints = config.witness.split("://", 1)[-1].rstrip("/")
    return f"etcd://{endpoints}/{config.cluster}", config.witness_user, password


def jobs_factory(
    config: ServerConfig, accounts: Accounts, *, tenure: Tenure | None = None, **kwargs: Any
) -> Callable[..., Jobs]:
    """What a node builds its job runtime with: ``Jobs``, or with ``cluster`` set
    ``ClusteredJobs`` over one ``ClusterBudgets`` and one ``RegistryOwners`` (the hosts
    its pair owns, held by ``tenure``: the node's, which its registrar feeds; a new one
    when none is given), both kept for every time it is primary."""
    budgets = budgets_for(config, accounts, **kwargs)
    if budgets is None:
        return Jobs
    tenure = tenure or tenure_for(config)
    owners = RegistryOwners(registry_for(config), config.pair, tenure=tenure)
    return partial(ClusteredJobs, budgets=budgets, owners=owners)


def registration_ttl(config: ServerConfig) -> int:
    """Seconds a node's registry lease lives: ``witness_ttl``, at least 2."""
    return max(2, round(config.witness_ttl))


def tenure_for(config: ServerConfig) -> Tenure | None:
    """The node's hold on its pair's hosts (None without ``cluster``): its registry
    lease's ttl, the handover ``cluster_handover``, a stall past one ttl."""
    if not config.cluster:
        return None
    ttl = registration_ttl(config)
    return Tenure(config.pair, ttl=ttl, settle=config.cluster_handover, stall=ttl)


def registry_for(config: ServerConfig) -> EtcdRegistry:
    """The node's registry: its etcd user, its pair's signing key (``cluster_signing_key_file``:
    its records are sealed) and the members file (``cluster_members``: the records it
    believes); ``StartRefused`` naming the file that cannot be used."""
    url, user, password = cluster_access(config)
    try:
        signer = (
            RecordSigner.from_file(config.cluster_signing_key_file)
            if config.cluster_signing_key_file
            else None
        )
        members = load_members(config.cluster_members) if config.cluster_members else None
    except ValueError as e:
        raise StartRefused(str(e)) from None
    return EtcdRegistry(url, user=user, password=password, signer=signer, members=members)


def budgets_for(config: ServerConfig, accounts: Accounts, **kwargs: Any) -> ClusterBudgets | None:
    """The node's cluster budgets (None without ``cluster``): the witness's etcd, the
    lease ttl ``witness_ttl``; ``kwargs`` go to ``ClusterBudgets`` (``wait``, ``linger``)."""
    if not config.cluster:
        return None
    url, user, password = cluster_access(config)
    etcd = EtcdBudgets(url, user=user, password=password)
    return ClusterBudgets(etcd, accounts, ttl=registration_ttl(config), **kwargs)


def _pages_total(node: Node) -> float:
    return sum(
        s.value
        for family in node.metrics.pages.collect()
        for s in family.samples
        if s.name.endswith("_total")
    )


class LoadMeter:
    """Rates since the previous ``read``: pages stored per second, CPU cores used."""

    def __init__(self, pages: float, now: float) -> None:
        self._pages, self._cpu, self._at = pages, self._cpu_seconds(), now

    @staticmethod
    def _cpu_seconds() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def read(self, pages: float, now: float) -> tuple[float, float]:
        cpu = self._cpu_seconds()
        span = max(now - self._at, 1e-3)
        rates = (max(0.0, pages - self._pages) / span, max(0.0, cpu - self._cpu) / span)
        self._pages, self._cpu, self._at = pages, cpu, now
        return rates


def node_record(node: Node, meter: LoadMeter, now_wall: float, now: float) -> NodeRecord:
    """This node's record now (see the module docstring)."""
    cfg = node.config
    status = node.role_status()
    primary = node.takes_writes
    running, queued = 0, 0
    if primary and node.jobs is not None:
        store = node.slot.store
        for job_id in node.jobs.running():
            meta = records.load_meta(store, job_id)
            if meta is None or meta.terminal:
                continue
            running += 1
            p = views.progress(store, meta)
            queued += max(0, p.total - p.completed - p.failed)
    pages_per_s, cpu = meter.read(_pages_total(node), now)
    return NodeRecord(
        pair=cfg.pair,
        node=node.node_id,
        address=cfg.advertise or advertised(cfg.listen),
        role="primary" if primary else "standby",
        epoch=node.slot.log.epoch,
        lag=0 if primary else status.lag_offsets,
        capacity=cfg.max_concurrency,
        per_host_concurrency=min(cfg.per_host_concurrency, MAX_PER_HOST_CONCURRENCY),
        load=Load(running_jobs=running, queued_pages=queued, pages_per_s=pages_per_s, cpu=cpu),
        updated=now_wall,
    )


def start_registrar(node: Node) -> tuple[Registrar, asyncio.Task[None]] | None:
    """The node's registrar, running (None without ``cluster``)."""
    cfg = node.config
    if not cfg.cluster:
        return None
    registry = registry_for(cfg)
    meter = LoadMeter(_pages_total(node), time.monotonic())
    registrar = Registrar(
        registry,
        lambda: node_record(node, meter, time.time(), time.monotonic()),
        ttl=registration_ttl(cfg),
        tenure=node.tenure,
    )
    task = asyncio.create_task(registrar.run())
    log.info("registering in cluster %s as pair %s", cfg.cluster, cfg.pair)
    return registrar, task
