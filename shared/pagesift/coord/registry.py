"""The cluster registry's etcd shell: a node's record under its lease, and the reading of all.

What it owns
------------
``EtcdRegistry`` (put a ``NodeRecord`` under a lease, refresh it, withdraw it, list every
node of the cluster) and ``Registrar``, the loop a node runs with ``--cluster``: every
``REFRESH_SECONDS`` it asks its node for a fresh record (``make_record``) and writes it
under its lease, granting a new lease when etcd says the old one lapsed. The keys are
``coord.keys``' (``node_key``, ``nodes_prefix``), the records
``pagesift.core.cluster.registryrules``'s (pure). A cluster client's view
(``pagesift.client.registryview``) reads through ``EtcdRegistry.nodes``, so this module
imports nothing a client-only install lacks but aetcd.

Trust
-----
With ``signer`` (the pair's ``cluster_signing_key_file``) a node stores its record
sealed (``registry.seal_record``); with ``members`` (``cluster_members``) ``nodes``
returns only the records ``registry.open_record`` believes: signed by their pair's
listed key, stored under their own pair, at an address the pair lists. Every other one
is skipped, logged and counted by its reason in ``rejected`` (the gateway exports it as
``pagesift_cluster_records_rejected_total{reason}``).

Failure model
-------------
Every call is bounded by ``timeout`` and raises ``EtcdUnavailable`` on an error
(``coord.etcd``); the next call tries the next endpoint. While etcd is down the node
keeps serving: its record lapses with its lease (clients then stop placing new work on
it, running work carries on) and the registrar re-registers when etcd answers again.
A node that dies stops refreshing, and etcd deletes its record ``ttl`` seconds later:
nobody has to clean up after it.

With a ``tenure`` (``pagesift.core.cluster.tenure``) the registrar tells it each
round's fate: ``round_began`` before the first call of a round (the instant the lease's
deadline counts from), then ``kept`` (the lease was alive), ``granted`` (a new one;
``lapsed`` when the old ran out) or ``failed`` (etcd did not answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable

import aetcd

from pagesift.coord.etcd import Etcd, EtcdUnavailable
from pagesift.coord.keys import node_key, nodes_prefix
from pagesift.core.cluster.members import Members
from pagesift.core.cluster.registryrules import (
    REFRESH_SECONDS,
    NodeRecord,
    RecordRejected,
    encode_record,
    open_record,
    parse_cluster_url,
    seal_record,
)
from pagesift.core.cluster.signing import RecordSigner, verify_signature
from pagesift.core.cluster.tenure import Tenure

__all__ = ["EtcdRegistry", "Registrar"]

log = logging.getLogger(__name__)


class EtcdRegistry:
    """The registry of cluster ``etcd://…/NAME`` (see the module docstring); ``etcd`` is
    its connection (the budgets' calls share it)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 1.0,
        user: str = "",
        password: str = "",
        signer: RecordSigner | None = None,
        members: Members | None = None,
    ):
        self.endpoints, self.cluster = parse_cluster_url(url)
        self.etcd = Etcd(
            self.endpoints, timeout=timeout, user=user, password=password, label="registry"
        )
        self.signer = signer
        self.members = members
        self.rejected: Counter[str] = Counter()  # records refused, by reason

    async def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; its id."""
        lease = await self.etcd.call(lambda c: c.lease(ttl))
        return int(lease.id)

    async def put(self, record: NodeRecord, lease: int) -> None:
        key = node_key(self.cluster, record.pair, record.node).encode()
        signer = self.signer
        value = (
            encode_record(record)
            if signer is None
            else seal_record(record, cluster=self.cluster, key_id=signer.key_id, sign=signer.sign)
        )
        await self.etcd.call(lambda c: c.put(key, value, lease=lease))

    async def refresh(self, lease: int) -> bool:
        """Keep ``lease`` alive; False when etcd says it has lapsed."""
        reply = await self.etcd.call(lambda c: c.refresh_lease(lease))
        return reply is not None and int(reply.TTL) > 0

    async def withdraw(self, lease: int) -> None:
        """Revoke ``lease`` (its record goes at once)."""
        await self.etcd.call(lambda c: c.revoke_lease(lease))

    async def nodes(self) -> list[NodeRecord]:
        """Every node record of the cluster that is to be believed (see Trust); any
        other is logged, counted in ``rejected`` and skipped."""
        prefix = nodes_prefix(self.cluster).encode()

        async def scan(c: aetcd.Client) -> list[tuple[bytes, bytes]]:
            reply = await c.get_prefix(prefix)
            return [(bytes(kv.key), bytes(kv.value)) for kv in reply.kvs]

        out: list[NodeRecord] = []
        for key, raw in await self.etcd.call(scan):
            pair = key[len(prefix) :].split(b"/", 1)[0].decode(errors="replace")
            try:
                out.append(
                    open_record(
                        raw,
                        cluster=self.cluster,
                        key_pair=pair,
                        members=self.members,
                        verify=verify_signature,
                    )
                )
            except RecordRejected as e:
                self.rejected[e.reason] += 1
                log.warning("cluster %s: a node record is refused: %s", self.cluster, e)
        return out

    async def close(self) -> None:
        await self.etcd.close()


class Registrar:
    """Keeps one node's record in the registry while it runs (``run``), withdraws it on
    a clean stop (``close``)."""

    def __init__(
        self,
        registry: EtcdRegistry,
        make_record: Callable[[], NodeRecord],
        *,
        ttl: int,
        interval: float = REFRESH_SECONDS,
        tenure: Tenure | None = None,
    ) -> None:
        self.registry = registry
        self.make_record = make_record
        self.ttl = ttl
        self.interval = min(interval, ttl / 3)
        self.tenure = tenure
        self.lease: int | None = None
        self.lapsed = False  # a lease ran out and no new one is granted yet
        self.registered = asyncio.Event()  # set after the first successful write

    async def step(self) -> None:
        """One round: a lease if none is alive, then the fresh record under it."""
        tenure = self.tenure
        if tenure is not None:
            tenure.round_began(time.monotonic())
        if self.lease is not None:
            if await self.registry.refresh(self.lease):
                if tenure is not None:
                    tenure.kept(time.monotonic())
            else:
                log.warning("cluster %s: the registration lease lapsed", self.registry.cluster)
                self.lease, self.lapsed = None, True
        if self.lease is None:
            self.lease = await self.registry.grant(self.ttl)
            if tenure is not None:
                tenure.granted(time.monotonic(), lapsed=self.lapsed)
            self.lapsed = False
        await self.registry.put(self.make_record(), self.lease)
        self.registered.set()

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except EtcdUnavailable as e:
                if self.tenure is not None:
                    self.tenure.failed(time.monotonic())
                log.info("cluster %s: %s (retrying)", self.registry.cluster, e)
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            with contextlib.suppress(EtcdUnavailable):
                await self.registry.withdraw(lease)
        await self.registry.close()
