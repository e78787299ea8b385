"""The cluster registry's etcd shell: a node's record under its lease, and the reading of all.

What it owns
------------
``EtcdRegistry`` (put a ``NodeRecord`` under a lease, refresh it, withdraw it, list every
node of the cluster) and ``Registrar``, the loop a node runs with ``--cluster``: every
``REFRESH_SECONDS`` it asks its node for a fresh record (``make_record``) and writes it
under its lease, granting a new lease when etcd says the old one lapsed. The key layout
and the records are ``pagesift.shared.cluster.registry``'s (pure).

Failure model
-------------
Every call is bounded by ``timeout``; on any error the next call tries the next
endpoint. While etcd is down the node keeps serving: its record lapses with its lease
(clients then stop placing new work on it, running work carries on) and the registrar
re-registers when etcd answers again. A node that dies stops refreshing, and etcd
deletes its record ``ttl`` seconds later: nobody has to clean up after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aetcd

from pagesift.shared.cluster.registry import (
    REFRESH_SECONDS,
    NodeRecord,
    decode_record,
    encode_record,
    node_key,
    nodes_prefix,
    parse_cluster_url,
)
from pagesift.shared.config.schema import ServerConfig

__all__ = ["EtcdRegistry", "Registrar", "RegistryUnavailable", "cluster_access"]

log = logging.getLogger(__name__)


def cluster_access(config: ServerConfig) -> tuple[str, str, str]:
    """(url, user, password): the cluster (``etcd://…/NAME``, the witness's etcd and
    ``cluster``) and the etcd credentials a node of ``config`` reaches it with."""
    password = ""
    if config.witness_password_file:
        password = Path(config.witness_password_file).read_text().strip()
    endpoints = config.witness.split("://", 1)[-1].rstrip("/")
    return f"etcd://{endpoints}/{config.cluster}", config.witness_user, password


class RegistryUnavailable(RuntimeError):
    """etcd did not answer in time (or answered with an error)."""


class EtcdRegistry:
    """The registry of cluster ``etcd://…/NAME`` (see the module docstring)."""

    def __init__(self, url: str, *, timeout: float = 1.0, user: str = "", password: str = ""):
        self.endpoints, self.cluster = parse_cluster_url(url)
        self._timeout = timeout
        self._auth = {"username": user, "password": password} if user else {}
        self._next = 0
        self._client: aetcd.Client | None = None

    async def _call(self, make: Any) -> Any:
        if self._client is None:
            host, port = self.endpoints[self._next % len(self.endpoints)]
            self._client = aetcd.Client(host=host, port=port, timeout=self._timeout, **self._auth)
        client = self._client
        try:
            return await asyncio.wait_for(make(client), self._timeout)
        except (aetcd.ClientError, TimeoutError, OSError) as e:
            self._client = None
            self._next += 1
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 1.0)
            raise RegistryUnavailable(f"registry: {type(e).__name__}: {e}") from e

    async def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; its id."""
        lease = await self._call(lambda c: c.lease(ttl))
        return int(lease.id)

    async def put(self, record: NodeRecord, lease: int) -> None:
        key = node_key(self.cluster, record.pair, record.node).encode()
        value = encode_record(record)
        await self._call(lambda c: c.put(key, value, lease=lease))

    async def refresh(self, lease: int) -> bool:
        """Keep ``lease`` alive; False when etcd says it has lapsed."""
        reply = await self._call(lambda c: c.refresh_lease(lease))
        return reply is not None and int(reply.TTL) > 0

    async def withdraw(self, lease: int) -> None:
        """Revoke ``lease`` (its record goes at once)."""
        await self._call(lambda c: c.revoke_lease(lease))

    async def nodes(self) -> list[NodeRecord]:
        """Every node record of the cluster (a malformed one is logged and skipped)."""
        prefix = nodes_prefix(self.cluster).encode()

        async def scan(c: aetcd.Client) -> list[bytes]:
            return [bytes(kv.value) for kv in (await c.get_prefix(prefix)).kvs]

        out: list[NodeRecord] = []
        for raw in await self._call(scan):
            try:
                out.append(decode_record(raw))
            except ValueError as e:
                log.warning("cluster %s: a node record is refused: %s", self.cluster, e)
        return out

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 1.0)


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
    ) -> None:
        self.registry = registry
        self.make_record = make_record
        self.ttl = ttl
        self.interval = min(interval, ttl / 3)
        self.lease: int | None = None
        self.registered = asyncio.Event()  # set after the first successful write

    async def step(self) -> None:
        """One round: a lease if none is alive, then the fresh record under it."""
        if self.lease is not None and not await self.registry.refresh(self.lease):
            log.warning("cluster %s: the registration lease lapsed", self.registry.cluster)
            self.lease = None
        if self.lease is None:
            self.lease = await self.registry.grant(self.ttl)
        await self.registry.put(self.make_record(), self.lease)
        self.registered.set()

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except RegistryUnavailable as e:
                log.info("cluster %s: %s (retrying)", self.registry.cluster, e)
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            with contextlib.suppress(RegistryUnavailable):
                await self.registry.withdraw(lease)
        await self.registry.close()
