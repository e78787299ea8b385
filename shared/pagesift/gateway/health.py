"""``/healthz``: whether the gateway can reach a primary of the pair.

What it owns
------------
``PrimaryProbe``: one channel per ``--server`` address (made on first use, closed with
the app; TLS with the same credentials as the gateway's ``JobClient``s) and
``check()``, which asks every address's ``grpc.health.v1`` for the service
``pagesift.primary`` concurrently (each bounded by ``PROBE_SECONDS``) and returns the
first address that says SERVING, or None. In front of a cluster (``view``), the
addresses are the registered primaries of its pairs, read from the view at each check.

Why the health service and not AdminService.Role: a node with an accounts file keeps
Role for its admin key, while health is open (it is what load balancers ask), so the
probe needs no credential and a gateway never holds an admin key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagesift.client import ClusterUnavailable, ClusterView
from pagesift.core.util.channels import open_channel

__all__ = ["PROBE_SECONDS", "PrimaryProbe"]

PROBE_SECONDS = 2.0
PRIMARY_SERVICE = "pagesift.primary"


class PrimaryProbe:
    def __init__(
        self,
        addresses: Sequence[str],
        credentials: grpc.ChannelCredentials | None = None,
        view: ClusterView | None = None,
    ) -> None:
        self.addresses = list(addresses)
        self.view = view
        self.credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def _serving(self, address: str) -> bool:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self.credentials)
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = await stub.Check(
                health_pb2.HealthCheckRequest(service=PRIMARY_SERVICE), timeout=PROBE_SECONDS
            )
        except grpc.aio.AioRpcError:
            return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    async def check(self) -> str | None:
        """The first address whose node takes writes now, or None."""
        addresses = self.addresses
        if self.view is not None:
            try:
                await self.view.ready()
            except ClusterUnavailable:
                return None
            addresses = [v.primary for v in self.view.pairs.values() if v.primary]
        results = await asyncio.gather(*(self._serving(a) for a in addresses))
        return next((a for a, ok in zip(addresses, results, strict=True) if ok), None)

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            await channel.close(None)
