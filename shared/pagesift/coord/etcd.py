"""The one etcd client: every call bounded, rotated across endpoints, authenticated.

What it owns
------------
``Etcd`` is what the witness, the registry, the budgets and a cluster client's view call
etcd through: ``call(make)`` runs ``make(client)`` (one aetcd request, or a few in a row)
on the current endpoint's connection, within ``timeout`` seconds; ``health`` asks every
endpoint for its own status (member id, raft leader and term, db size, version, etcd's
alarms) for ``pagesift cluster status``; ``close`` drops the connection.

Failure model
-------------
Any error or timeout of a call raises ``EtcdUnavailable`` (``label`` first in its
message: "witness", "registry") and drops the connection; the next call opens one to
the next endpoint of the list, so a dead member costs one failed call, not all of them.
Each connection has a subchannel of its own (``CHANNEL_OPTIONS``): gRPC otherwise shares
one per address across channels, with its reconnect backoff, so after an outage a new
connection inherited a backoff of seconds and failed "connection refused" while etcd
was answering again (a start right after etcd returned was refused at once).
A call that timed out may still have been applied by etcd: the callers' writes are
idempotent or read back (``coord.witness.campaign``), never blindly repeated.

Authentication and TLS
----------------------
With ``user`` the connection authenticates as that etcd user (etcd's RBAC) when it
opens; a call refused after the token expired drops the connection like any error, so
the next call authenticates again. aetcd 1.0 opens plaintext gRPC channels only
(``rpc.insecure_channel`` in ``aetcd.Client.connect``): there is no TLS here. Keep
etcd's client port on a private network (the deploy kit's NetworkPolicy); a TLS-capable
client would replace aetcd behind this class and nothing else.

Why aetcd
---------
An asyncio etcd v3 client over grpc.aio and etcd's own v3 protos: it works with our
grpcio and protobuf, needs no generated stubs of ours and no thread pool. Only this
package imports it (tests/test_layers.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd
import grpc
from aetcd import rpc

__all__ = ["Endpoint", "EndpointHealth", "Etcd", "EtcdUnavailable", "describe"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Endpoint = tuple[str, int]
CLOSE_SECONDS = 1.0
#: a connection's own subchannel (no backoff inherited from an earlier, failed one), and
#: reconnects within one connection at most a second apart
CHANNEL_OPTIONS = {
    "grpc.use_local_subchannel_pool": 1,
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.min_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 1000,
}


class EtcdUnavailable(RuntimeError):
    """etcd did not answer in time (or answered with an error)."""


def describe(endpoints: Sequence[Endpoint]) -> str:
    """``host:port,host:port`` (IPv6 hosts in brackets), as an operator writes them."""
    return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in endpoints)


@dataclass(frozen=True, slots=True)
class EndpointHealth:
    """One endpoint's answer to a status request (``ok`` False: ``error`` says why)."""

    endpoint: str
    ok: bool
    error: str = ""
    member_id: int = 0
    leader_id: int = 0  # the raft leader this member follows (0: none)
    raft_term: int = 0
    version: str = ""
    db_size: int = 0  # bytes of the backend database
    alarms: tuple[str, ...] = ()  # etcd's own errors (e.g. "NOSPACE" after the quota)

    @property
    def is_leader(self) -> bool:
        return self.ok and self.member_id != 0 and self.member_id == self.leader_id


class Etcd:
    """A bounded, rotating, authenticated connection to one etcd cluster (see the module
    docstring)."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        timeout: float = 1.0,
        user: str = "",
        password: str = "",
        label: str = "etcd",
    ) -> None:
        if not endpoints:
            raise ValueError("etcd: no endpoint")
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.label = label
        self._auth = {"username": user, "password": password} if user else {}
        self._next = 0
        self._client: aetcd.Client | None = None

    def describe(self) -> str:
        return describe(self.endpoints)

    def _open(self, endpoint: Endpoint) -> aetcd.Client:
        host, port = endpoint
        return aetcd.Client(
            host=host, port=port, timeout=self.timeout, options=CHANNEL_OPTIONS, **self._auth
        )

    async def call(self, make: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        """``make(client)`` within ``timeout``; on failure the connection is dropped and
        the next call tries the next endpoint."""
        if self._client is None:
            self._client = self._open(self.endpoints[self._next % len(self.endpoints)])
        client = self._client
        try:
            return await asyncio.wait_for(make(client), self.timeout)
        except (aetcd.ClientError, grpc.RpcError, TimeoutError, OSError) as e:
            if self._client is client:
                self._client = None
                self._next += 1
            await _close_quietly(client)
            raise EtcdUnavailable(f"{self.label}: {type(e).__name__}: {e}") from e

    async def health(self) -> list[EndpointHealth]:
        """Every endpoint's own status, each asked on a connection of its own."""
        return list(await asyncio.gather(*(self._status_of(e) for e in self.endpoints)))

    async def _status_of(self, endpoint: Endpoint) -> EndpointHealth:
        name = describe([endpoint])
        client = self._open(endpoint)

        async def status() -> Any:
            await client.connect()
            return await client.maintenancestub.Status(
                rpc.StatusRequest(), timeout=self.timeout, metadata=client.metadata
            )

        try:
            got = await asyncio.wait_for(status(), self.timeout)
        except (aetcd.ClientError, grpc.RpcError, TimeoutError, OSError) as e:
            return EndpointHealth(name, ok=False, error=f"{type(e).__name__}: {e}".strip())
        finally:
            await _close_quietly(client)
        return EndpointHealth(
            name,
            ok=True,
            member_id=int(got.header.member_id),
            leader_id=int(got.leader),
            raft_term=int(got.raftTerm),
            version=str(got.version),
            db_size=int(got.dbSize),
            alarms=tuple(str(e) for e in got.errors),
        )

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await _close_quietly(client)


async def _close_quietly(client: aetcd.Client) -> None:
    try:
        await asyncio.wait_for(client.close(), CLOSE_SECONDS)
    except Exception as e:  # closing a broken channel: nothing left to save
        log.debug("closing the etcd client: %s", e)
