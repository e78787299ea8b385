"""Who owns a host, as a node sees it: the rule a node enforces before it fetches.

What it owns
------------
``Owners``: a node's pair and the placeable pairs of its last good registry read, and
the one question a node asks of them: which pair owns this host (``owner``), the same
rendezvous hashing over the same set the cluster clients place by
(``placement.owner`` over ``registry.placeable``), so a node and a client that read the
same registry agree on every host. ``HostOwnedElsewhere``: the refusal a node answers
for work on a host it does not own (FAILED_PRECONDITION, reason HOST_OWNED_ELSEWHERE,
ErrorInfo metadata ``owner``, ``host``, ``field``): the cluster client re-reads its view
and sends the work to ``owner`` (bounded), a caller that went straight to a node is
told where to go.

The invariant it serves
-----------------------
At no instant do the requests in flight to one host, across the cluster, exceed
``per_host_concurrency``. A node's per-host slots bound its own requests; a host's work
reaches only its owner because each node refuses new work on hosts it does not own
(direct starts included) and a crawl leaves links to foreign hosts to their owners
(``pagesift.primary.jobs``, its own site included). When ownership moves (a pair
joins, leaves, lapses, comes back) the old owner abandons its requests in flight to the
hosts that left and the new owner waits a handover first: ``tenure.Tenure``, which also
states the limit (a pair cut off from etcd alone).

Why these rules
---------------
- The node's own pair always counts as placeable: the node takes writes, so it is; a
  registry read that does not show it yet (its first record not written, a read that
  lags) must not make it refuse every host.
- Before any good read (``Owners.unknown``) a node refuses nothing: it cannot know,
  and a cluster whose registry is away must not stop its pairs (the clients, which
  place new work, wait for the registry instead).
- ``check`` refuses the whole request on its first URL that is not this pair's,
  naming its request field (``url``, ``urls``) and that host's owner: a batch split by
  another view is refused whole, and the client splits it again after a re-read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from pagesift.core.cluster import placement

__all__ = ["HostOwnedElsewhere", "NoOwners", "Owners", "OwnersSource", "left_to_owner"]


def left_to_owner(host: str, owner: str) -> str:
    """The page error's words for a request a node leaves to ``host``'s owner."""
    return (
        f"host {host} belongs to pair {owner} of the cluster, which keeps its "
        "politeness: left to that pair, not fetched here"
    )


class HostOwnedElsewhere(Exception):
    """Work on ``host`` (request field ``field``) belongs to pair ``owner``."""

    def __init__(self, host: str, owner: str, field: str, here: str) -> None:
        super().__init__(
            f"{field}: host {host} belongs to pair {owner} of this cluster, not to pair "
            f"{here}: send the work to {owner} (a cluster client does)"
        )
        self.host = host
        self.owner = owner
        self.field = field


@dataclass(frozen=True, slots=True)
class Owners:
    """The owners of hosts as pair ``here`` sees them (``pairs``: the placeable pairs
    of its last good registry read; None before any)."""

    here: str
    pairs: tuple[str, ...] | None = None

    @classmethod
    def read(cls, here: str, placeable: Iterable[str]) -> Owners:
        return cls(here, tuple(sorted({here, *placeable})))

    @property
    def unknown(self) -> bool:
        return self.pairs is None

    def owner(self, host: str) -> str:
        """The pair that owns ``host``, an engine slot key (``here`` before any read)."""
        if self.pairs is None:
            return self.here
        return placement.owner(placement.site_key(host), self.pairs)

    def elsewhere(self, host: str) -> str | None:
        """The pair that owns ``host`` when it is not this one (None: this pair's, or
        no read yet)."""
        owner = self.owner(host)
        return None if owner == self.here else owner

    def check(self, urls: Iterable[str], field: str, host_of: Callable[[str], str]) -> None:
        """Raise ``HostOwnedElsewhere`` (naming ``field``, the request field) for the
        first of ``urls`` another pair owns; ``host_of`` is the engine's slot key of a
        URL ("" when it has none: the request's own checks refuse it). Each host is
        hashed once."""
        if self.pairs is None:
            return
        seen: set[str] = set()
        for url in urls:
            host = host_of(url)
            if not host or host in seen:
                continue
            seen.add(host)
            owner = self.elsewhere(host)
            if owner is not None:
                raise HostOwnedElsewhere(host, owner, field, self.here)


class OwnersSource(Protocol):
    """Where a node's ``Owners`` come from (the registry, read by ``pagesift.coord``):
    ``current`` is the last good read's, never a call to etcd; ``fence`` the seconds a
    request to a host this pair owns must still wait (``tenure.Tenure.wait``); ``moved``
    is called with the new ``Owners`` after a read that changed them; ``joined`` says
    this node has just become its pair's primary."""

    moved: Callable[[Owners], object] | None

    def current(self) -> Owners: ...

    def fence(self, host: str, now: float) -> float: ...

    def joined(self, now: float) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class NoOwners:
    """A node that reads no registry: it owns every host (``Owners.unknown``)."""

    def __init__(self, here: str = "") -> None:
        self._owners = Owners(here)
        self.moved: Callable[[Owners], object] | None = None

    def current(self) -> Owners:
        return self._owners

    def fence(self, host: str, now: float) -> float:
        return 0.0

    def joined(self, now: float) -> None:
        return None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
