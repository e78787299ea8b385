"""The witness: the outside party that decides which node of a pair is the primary.

What it owns
------------
``Witness`` is the one small interface the elector (``pagesift.node.elector``) needs:
read the leader key and the pair state, campaign for the key under a new lease, keep
the lease alive, publish the pair state as the holder, resign. ``EtcdWitness`` is
its etcd v3 backend over ``coord.etcd.Etcd``; the keys are ``coord.keys``'
(``leader_key``, ``state_key``), the records and the rules over them
``pagesift.core.ha.election``'s.

Why etcd
--------
etcd is the witness Kubernetes itself trusts (linearizable, leases with TTLs,
compare-and-swap transactions), and Debian ships it, so the tests run a real one.

Authentication
--------------
etcd decides who is primary, so it must know who asks: with ``witness_user`` the
client authenticates as that etcd user (etcd's RBAC; grant it read-write on
``/pagesift/<pair>/`` only, ``/pagesift/<cluster>/<pair>/`` in a cluster) and
re-authenticates on its next call after any error, an expired token included
(``coord.etcd``, which also says why there is no TLS yet).

Failure model
-------------
Every call is bounded by ``timeout`` and raises ``EtcdUnavailable`` on any error or
timeout; the next call then tries the next endpoint of ``etcd://A,B,C``. A call that
timed out may still have been applied: ``campaign`` therefore reads the key back and
recognises its own lease, and a lease granted but not attached simply lapses after
its ttl.

Another backend
---------------
A Kubernetes ``coordination.k8s.io/v1`` Lease fits the same interface: the leader
key is the Lease object (``holderIdentity`` = the node id, an annotation carries the
addresses, ``leaseDurationSeconds`` = ttl); ``campaign`` is a create, or an update
guarded by ``resourceVersion`` when the lease has expired by ``renewTime``;
``keepalive`` updates ``renewTime`` under ``resourceVersion``; the epoch is a counter
kept in an annotation and raised by every successful takeover (``leaseTransitions``
does exactly that); the pair state is a ConfigMap updated under the Lease's
``resourceVersion`` check. The write deadline rule is the same.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import aetcd
import aetcd.transactions as txn

from pagesift.coord import keys
from pagesift.coord.etcd import Etcd, EtcdUnavailable
from pagesift.core.ha.election import MIN_TTL, Holder, PairState, parse_witness

__all__ = ["EtcdWitness", "Lease", "Witness", "lease_ttl"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease this node holds: its id, and the epoch of the key it is attached to."""

    id: int
    epoch: int


class Witness(Protocol):
    async def holder(self) -> Holder | None: ...

    async def pair_state(self) -> PairState | None: ...

    async def campaign(self, holder: Holder, ttl: int) -> Lease | None: ...

    async def keepalive(self, lease: Lease) -> bool: ...

    async def publish(self, lease: Lease, state: PairState) -> bool: ...

    async def resign(self, lease: Lease) -> None: ...

    async def close(self) -> None: ...


def lease_ttl(seconds: float) -> int:
    """etcd grants whole seconds: the configured ttl, rounded, at least ``MIN_TTL``."""
    return max(MIN_TTL, round(seconds))


class EtcdWitness:
    """``Witness`` over etcd v3 (see the module docstring). ``pair`` is the pair's path
    under the witness root (``keys.witness_pair``)."""

    def __init__(
        self,
        url: str,
        pair: str,
        *,
        timeout: float = 1.0,
        user: str = "",
        password: str = "",
    ) -> None:
        self._etcd = Etcd(
            parse_witness(url), timeout=timeout, user=user, password=password, label="witness"
        )
        self.leader_key = keys.leader_key(pair).encode()
        self.state_key = keys.state_key(pair).encode()

    async def holder(self) -> Holder | None:
        got = await self._etcd.call(lambda c: c.get(self.leader_key))
        if got is None:
            return None
        return Holder.parse(got.value, got.create_revision)

    async def pair_state(self) -> PairState | None:
        got = await self._etcd.call(lambda c: c.get(self.state_key))
        return None if got is None else PairState.parse(got.value)

    async def campaign(self, holder: Holder, ttl: int) -> Lease | None:
        """Take the leader key if nobody holds it: a new lease of ``ttl`` seconds, then
        put-if-absent under it. None when another node holds the key."""
        granted = await self._etcd.call(lambda c: c.lease(ttl))
        key = self.leader_key

        async def put_if_absent(c: aetcd.Client) -> tuple[bool, list[Any]]:
            put = txn.Put(key, holder.value(), lease=granted.id)
            done: tuple[bool, list[Any]] = await c.transaction(
                compare=[txn.Create(key) == 0], success=[put], failure=[]
            )
            return done

        with contextlib.suppress(EtcdUnavailable):  # it may have been applied:
            await self._etcd.call(put_if_absent)  # the read below tells
        got = await self._etcd.call(lambda c: c.get(key))
        if got is None or got.lease != granted.id:
            await self._revoke(granted.id)
            return None
        return Lease(granted.id, got.create_revision)

    async def keepalive(self, lease: Lease) -> bool:
        """Refresh ``lease``; False when etcd says it has lapsed."""
        reply = await self._etcd.call(lambda c: c.refresh_lease(lease.id))
        return reply is not None and int(reply.TTL) > 0

    async def publish(self, lease: Lease, state: PairState) -> bool:
        """Write the pair state, only while ``lease``'s key is still the leader key."""

        async def guarded_put(c: aetcd.Client) -> tuple[bool, list[Any]]:
            still_ours = txn.Create(self.leader_key) == lease.epoch
            put = txn.Put(self.state_key, state.value())
            done: tuple[bool, list[Any]] = await c.transaction(
                compare=[still_ours], success=[put], failure=[]
            )
            return done

        succeeded, _ = await self._etcd.call(guarded_put)
        return bool(succeeded)

    async def resign(self, lease: Lease) -> None:
        """Give the key up at once (a clean shutdown of the holder)."""
        await self._revoke(lease.id)

    async def _revoke(self, lease_id: int) -> None:
        try:
            await self._etcd.call(lambda c: c.revoke_lease(lease_id))
        except EtcdUnavailable as e:
            logger.info("could not revoke lease %x (it lapses by itself): %s", lease_id, e)

    async def close(self) -> None:
        await self._etcd.close()
