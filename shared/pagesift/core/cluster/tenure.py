"""A node's tenure of its hosts: whether its pair may send a request to a host now.

What it owns
------------
``Tenure``, the pure rule between a clustered node's ownership view
(``ownership.Owners``, which host is whose) and the request that is about to leave: a
state machine fed with events and ``now`` (monotonic seconds), asked ``wait(host, now)``
-- 0 when the request may go, else the seconds to wait before asking again. The shells
are ``pagesift.coord.registry.Registrar`` (the node's registry lease: ``round_began``,
``kept``, ``granted``, ``failed``), ``pagesift.coord.owners.RegistryOwners`` (each good
read: ``read``; becoming primary: ``joined``) and the host gate it serves the engine
(``pagesift.primary.engine.politeness.HostSlots``: asked inside the host's slot, the
last step before the request is sent).

The invariant it serves
-----------------------
At no instant do the requests in flight to one host, across the cluster, exceed
``per_host_concurrency``: only one pair fetches a host at a time. Ownership moves when
the registry's pairs change (a pair joins, leaves, lapses, comes back); two rules make
the old owner stop before the new one starts:

- **The lease fence (the old owner).** A node's record lives under its registry lease
  of ``ttl`` seconds; other pairs stop counting it once etcd lets the lease lapse,
  which happens no earlier than ``ttl`` after the keepalive that last reached etcd was
  *sent*. So the node holds its hosts until ``sent + ttl * (1 - MARGIN)`` of its last
  confirmed keepalive (``held_until``; the margin absorbs the clock rates' difference).
  Past it, a node that kept trying without a gap (every round ended within ``stall``
  of the last) holds on (failsafe: an etcd that answers nobody lets no lease lapse and
  moves no host); a node that went silent for longer -- frozen by SIGSTOP, a stalled
  event loop, a host suspended -- holds nothing until etcd answers it again: a
  keepalive that finds its lease alive (nobody took over), or a new lease (it lapsed:
  the pair is back and waits the handover like a joining pair). Before its first
  lease a node holds nothing.
- **The handover (the new owner).** A host that came to this pair from another waits
  ``settle`` seconds from the moment this node learned it (``read`` replaced a view in
  which another pair owned it, or the node ``joined``/was ``granted`` a lease after a
  lapse: every host another pair would own without it): enough for the old owner to
  read the same registry (one ``READ_SECONDS`` interval and its bounded call) and
  abandon its requests in flight to that host (``HostSlots.abandon``).

Its limit, stated where it is used: a pair cut off from etcd while etcd still serves the
other pairs cannot tell that from an etcd that serves nobody; it holds on (failsafe)
while its lease lapses for the others, who then take its hosts after the handover. For
the length of such a partition one host can see two pairs' requests. Telling the two
apart would take the other pairs' word (Patroni's failsafe asks every member); the
pair's own standby cannot give it. And no check can be atomic with the socket write: a
node frozen between the gate and the write of a request sends it when it wakes, before
it can learn anything -- at most the requests it had admitted, once.

Why it is safe: no clock read, no I/O; every figure is a monotonic instant the shells
pass in, and ``wait`` is bounded (at most ``max(settle, RECHECK)``), so a caller that
loops on it re-asks at a bounded pace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pagesift.core.cluster import placement

__all__ = ["MARGIN", "RECHECK", "Tenure"]

MARGIN = 0.1  # the share of the lease ttl given up for clock-rate differences
RECHECK = 0.25  # seconds a fenced request waits before it asks again


@dataclass(slots=True)
class _Past:
    """A view of the placeable pairs that stopped being this node's at ``ended``."""

    pairs: tuple[str, ...]
    ended: float


@dataclass(slots=True)
class Tenure:
    """Pair ``here``'s tenure of its hosts (module docstring). ``ttl``: its registry
    lease's; ``settle``: the handover; ``stall``: the longest gap between two registrar
    rounds of a node that kept running."""

    here: str
    ttl: float
    settle: float
    stall: float
    held_until: float = float("-inf")
    _sent: float = float("-inf")
    _last_round: float = float("-inf")
    _stalled: bool = False
    _current: tuple[str, ...] | None = None
    _past: list[_Past] = field(default_factory=list)

    # --- the registrar's events ------------------------------------------------------------
    def round_began(self, now: float) -> None:
        """A keepalive (or a first grant) is about to be sent."""
        self._sent = now

    def kept(self, now: float) -> None:
        """etcd confirmed the lease: held until ttl after the round was sent."""
        self._confirm(now)

    def granted(self, now: float, *, lapsed: bool) -> None:
        """A new lease; ``lapsed``: the previous one ran out, so other pairs may have
        taken this pair's hosts meanwhile (they wait the handover)."""
        self._confirm(now)
        if lapsed:
            self.joined(now)

    def failed(self, now: float) -> None:
        """A round got no answer from etcd. A gap since the last round past ``stall``
        means the node did not run meanwhile: it holds nothing until etcd answers."""
        if now - self._last_round > self.stall:
            self._stalled = True
        self._last_round = now

    # --- the ownership view's events -------------------------------------------------------
    def read(self, pairs: Sequence[str], now: float) -> None:
        """A good registry read: the placeable pairs this node now decides by (its own
        pair included)."""
        new = tuple(sorted(set(pairs)))
        if self._current is not None and new != self._current:
            self._past.append(_Past(self._current, now))
        self._current = new
        self._forget(now)

    def joined(self, now: float) -> None:
        """This pair (re)enters the cluster now (a node became its primary, its lease
        lapsed): every host another pair would own without it waits the handover."""
        others = tuple(p for p in self._current or () if p != self.here)
        self._past.append(_Past(others, now))

    # --- the decision ----------------------------------------------------------------------
    def holds(self, now: float) -> bool:
        """Whether the node holds its hosts at all (the lease fence)."""
        if self._stalled:
            return False
        if now < self.held_until:
            return True
        # past the deadline: held only while the registrar keeps trying (failsafe)
        return self.held_until > float("-inf") and now - self._last_round <= self.stall

    def wait(self, host: str, now: float) -> float:
        """Seconds before a request to ``host`` may be sent (0: now). A host another
        pair owns is ``Owners``' refusal, not asked here."""
        if not self.holds(now):
            return RECHECK
        until = 0.0
        for past in self._past:
            end = past.ended + self.settle
            if end <= max(now, until) or not past.pairs:
                continue
            if placement.owner(placement.site_key(host), past.pairs) != self.here:
                until = end
        return max(0.0, until - now)

    # --- internals -------------------------------------------------------------------------
    def _confirm(self, now: float) -> None:
        self.held_until = self._sent + self.ttl * (1 - MARGIN)
        self._stalled = False
        self._last_round = now

    def _forget(self, now: float) -> None:
        self._past = [p for p in self._past if p.ended + self.settle > now]
