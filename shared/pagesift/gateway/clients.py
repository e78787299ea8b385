"""The gateway's gRPC clients: one ``JobClient`` per API key, the least recently used closed.

What it owns
------------
``Clients``: a bounded cache (``MAX_CLIENTS``) of ``JobClient`` over the pair's
addresses, keyed by the caller's API key, so every call follows the pair's failovers
with the client's own rules and one caller's key never serves another's request. With
``cluster`` (``etcd://…/NAME``) the clients are a cluster's, sharing one
``ClusterView`` of its registry (one etcd reader for the gateway, closed with it).

Invariants
----------
- A client evicted while requests use it is closed only once its last request is done.
- ``close`` closes every client, cached or evicted, and waits for the pending closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pagesift.client import ClusterView, JobClient

__all__ = ["MAX_CLIENTS", "Clients"]

MAX_CLIENTS = 256  # API keys with an open client (least recently used closed first)


class Clients:
    """One ``JobClient`` per API key over the same addresses, the least recently used
    closed past ``limit``."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        limit: int = MAX_CLIENTS,
        cluster: str = "",
        view_kw: dict[str, Any] | None = None,
        **client_kw: Any,
    ) -> None:
        self.addresses = list(addresses)
        # view_kw: the view's members file and etcd user (``ClusterView``'s keywords)
        self.view = ClusterView(cluster, **(view_kw or {})) if cluster else None
        self.limit = limit
        self.client_kw = client_kw
        self._clients: OrderedDict[str, JobClient] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self._busy: dict[JobClient, int] = {}  # requests in flight per client
        self._evicted: set[JobClient] = set()  # out of the cache, closed when idle

    @contextlib.asynccontextmanager
    async def use(self, api_key: str) -> AsyncIterator[JobClient]:
        """The client of ``api_key`` for one request; a client evicted meanwhile is
        closed only once its last request is done."""
        client = self._clients.get(api_key)
        if client is None:
            client = self._clients[api_key] = (
                JobClient(None, cluster=self.view, api_key=api_key, **self.client_kw)
                if self.view is not None
                else JobClient(self.addresses, api_key=api_key, **self.client_kw)
            )
            while len(self._clients) > self.limit:
                _, old = self._clients.popitem(last=False)
                if self._busy.get(old):
                    self._evicted.add(old)
                else:
                    self._close_later(old)
        self._clients.move_to_end(api_key)
        self._busy[client] = self._busy.get(client, 0) + 1
        try:
            yield client
        finally:
            self._busy[client] -= 1
            if not self._busy[client]:
                del self._busy[client]
                if client in self._evicted:
                    self._evicted.discard(client)
                    self._close_later(client)

    def _close_later(self, client: JobClient) -> None:
        task = asyncio.ensure_future(client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        clients = [*self._clients.values(), *self._evicted]
        self._clients.clear()
        self._evicted.clear()
        for c in clients:
            await c.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        if self.view is not None:
            await self.view.close()

    def __len__(self) -> int:
        """Open clients (the cached ones and those evicted but still in use)."""
        return len(self._clients) + len(self._evicted)
