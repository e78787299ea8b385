"""A cluster client's view of the registry: every pair's addresses, read from etcd.

What it owns
------------
``ClusterView``: the pairs of cluster ``etcd://HOST:PORT[,...]/NAME`` as their nodes
registered them (``pagesift.core.cluster.registryrules``: ``NodeRecord`` -> ``PairView``),
read at the first call (``ready``), then every ``refresh`` seconds by one background
task, and at once when a caller asks (``reread``: a pair failed to answer). One view may
serve many clients (the gateway's, one per API key): ``close`` belongs to its maker.
The reads go through ``pagesift.coord.registry.EtcdRegistry`` (the one etcd client).

Failure model
-------------
- ``pagesift.coord`` (and with it aetcd) is imported only here, only when a view is made:
  an install without aetcd gets ``ClusterUnavailable`` naming the extra
  (``pagesift[cluster]``).
- Every etcd call is bounded (``timeout``); on an error the next read tries the next
  endpoint. While etcd does not answer, the last view stays (a job's id still reaches
  its pair) and ``age`` grows: the client places no new job on a view older than
  ``stale_after`` (``STALE_SECONDS``; new placements wait for etcd, as the witness's rule).
- A start waits for the view (``fresh``): a view older than ``stale_after`` is read
  again at once, retried for up to ``place_wait`` seconds, so a start right after etcd
  returns finds it answering instead of failing on the outage's age; past the bound it
  is ``ClusterUnavailable`` naming etcd (the router's UNAVAILABLE, reason
  ``CLUSTER_UNAVAILABLE``). Reads by id never wait for etcd.
- With ``members`` (the members file, ``pagesift.core.cluster.members``: the pairs that
  should exist and their nodes' addresses, kept outside etcd), a view that is empty or
  stale also holds every listed pair the registry does not show, at its listed
  addresses, with no primary (``members_fallback``): a job's id still reaches its pair
  when the client was made while etcd was down; nothing is placed on such a pair.
- A record that does not decode is skipped; with ``members`` so is every record that
  does not verify against it (``registry.open_record``: unknown pair, bad signature,
  an address the pair does not list), counted in ``rejected`` by reason, so no call
  and no key go to an address the members file does not list for that pair.
  ``user``/``password``: the etcd user the registry is read as (the kit's ``reader``).
- ``tls_name(pair)``: the server name the members file pins for the pair's certificates
  ("" without members or without the field: each address's host is checked).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pagesift.core.cluster.members import Members
from pagesift.core.cluster.registryrules import Load, PairView, pair_views, parse_cluster_url

if TYPE_CHECKING:
    from pagesift.coord.registry import EtcdRegistry

__all__ = [
    "PLACE_WAIT_SECONDS", "REFRESH_SECONDS", "STALE_SECONDS", "ClusterUnavailable",
    "ClusterView", "members_fallback",
]  # fmt: skip

log = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0
STALE_SECONDS = 10.0
PLACE_WAIT_SECONDS = 5.0  # how long a start waits for a stale view to be read again
RETRY_SECONDS = 0.25  # between two reads while a start waits
EXTRA_HINT = "pip install 'pagesift[cluster]' (or the server extra)"


class ClusterUnavailable(RuntimeError):
    """The registry cannot be read (etcd does not answer, or aetcd is not installed)."""


def members_fallback(views: dict[str, PairView], members: Members | None) -> dict[str, PairView]:
    """``views`` with every pair of ``members`` they lack, at its listed addresses and with
    no primary (its client finds the primary, or reads from any node; placement skips it)."""
    if members is None:
        return views
    out = dict(views)
    for name in members.names:
        member = members.get(name)
        if name not in out and member is not None:
            out[name] = PairView(name, "", member.nodes, 0, 0, 0, False, Load(), 0.0)
    return dict(sorted(out.items()))


def _registry(
    url: str, timeout: float, members: Members | None, user: str, password: str
) -> EtcdRegistry:
    try:
        from pagesift.coord.registry import EtcdRegistry
    except ModuleNotFoundError as e:
        if e.name is None or e.name.partition(".")[0] != "aetcd":
            raise
        raise ClusterUnavailable(
            f"a cluster client reads the registry in etcd with aetcd, not installed: {EXTRA_HINT}"
        ) from None
    return EtcdRegistry(url, timeout=timeout, members=members, user=user, password=password)


class ClusterView:
    """The pairs of one cluster (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        refresh: float = REFRESH_SECONDS,
        timeout: float = 2.0,
        stale_after: float = STALE_SECONDS,
        place_wait: float = PLACE_WAIT_SECONDS,
        members: Members | None = None,
        user: str = "",
        password: str = "",
    ):
        self.url = url
        self.stale_after = stale_after
        self.place_wait = place_wait
        self.members = members
        self.endpoints, self.name = parse_cluster_url(url)
        self.refresh = refresh
        self.timeout = timeout
        # refused at once, not at the first call; with members, its records are verified
        self._registry = _registry(url, timeout, members, user, password)
        self._pairs: dict[str, PairView] = {}
        self._read_at: float | None = None  # monotonic time of the last good read
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def pairs(self) -> dict[str, PairView]:
        """The pairs as last read (empty before the first read), with the members file's
        pairs the registry lacks while the view is stale (``members_fallback``)."""
        if self.age() > self.stale_after:
            return members_fallback(self._pairs, self.members)
        return self._pairs

    @property
    def rejected(self) -> Mapping[str, int]:
        """Registry records refused so far, by reason (``registry.REJECT_REASONS``)."""
        return self._registry.rejected

    def tls_name(self, pair: str) -> str:
        """The server name ``pair``'s certificates must carry ("": the address's host)."""
        member = self.members.get(pair) if self.members is not None else None
        return member.tls_name if member is not None else ""

    def age(self) -> float:
        """Seconds since the last good read (infinite before it)."""
        if self._read_at is None:
            return float("inf")
        return time.monotonic() - self._read_at

    async def _read_once(self) -> None:
        from pagesift.coord.etcd import EtcdUnavailable

        try:
            records = await self._registry.nodes()
        except EtcdUnavailable as e:
            raise ClusterUnavailable(
                f"cluster {self.name}: the registry at {self.url} did not answer "
                f"({type(e.__cause__ or e).__name__})"
            ) from e
        self._pairs = pair_views(records)
        self._read_at = time.monotonic()

    async def reread(self) -> None:
        """Read the registry now (concurrent callers share one read)."""
        async with self._lock:
            await self._read_once()

    async def ready(self) -> None:
        """The first read tried, and the refresh task running. ``ClusterUnavailable`` if
        etcd does not answer and there is no members file to fall back on."""
        try:
            if self._read_at is None:
                await self.reread()
        except ClusterUnavailable:
            if self.members is None:
                raise
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"cluster-view-{self.name}")

    async def fresh(self) -> None:
        """A view no older than ``stale_after`` (what a start places on): read again now
        if it is older, and retried for up to ``place_wait`` seconds;
        ``ClusterUnavailable`` naming etcd when it still has not answered."""
        if self.age() <= self.stale_after:
            return
        deadline = time.monotonic() + self.place_wait
        while True:
            try:
                async with self._lock:
                    if self.age() > self.stale_after:  # else a concurrent caller read it
                        await self._read_once()
                return
            except ClusterUnavailable as e:
                if time.monotonic() + RETRY_SECONDS > deadline:
                    since = "yet" if self._read_at is None else f"for {self.age():.0f} s"
                    etcd = ",".join(f"{host}:{port}" for host, port in self.endpoints)
                    raise ClusterUnavailable(
                        f"cluster {self.name}: its registry (etcd at {etcd}) has not answered "
                        f"{since}, waited {self.place_wait:g} s; new jobs wait for it, jobs "
                        f"already placed answer by id ({e})"
                    ) from e
                await asyncio.sleep(RETRY_SECONDS)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh)
            try:
                await self.reread()
            except ClusterUnavailable as e:
                log.info("%s (keeping the view of %.0f s ago)", e, self.age())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._registry.close()
