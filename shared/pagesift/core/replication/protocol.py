"""The replication protocol as pure functions: no sockets, no disk, no clock.

Like etcd's raft library, every decision the replication stream makes lives here as
a deterministic function of plain values; ``pagesift.primary.replication`` (the
sender), ``pagesift.standby.follower`` (the receiver) and ``pagesift.core.replication.log``
(the disk) are shells that gather the values, call these functions and carry out
the verdict. Tests drive this module directly (``tests/test_replproto.py``).

Vocabulary
----------
*offset*: the number of write groups a history has committed; entry N is the N-th
group (1-based, 0 = nothing). *epoch*: rises by one at every promotion and is
persisted before the promoted node takes writes. *history id*: names one unbroken
line of offsets; a promotion starts a new one and remembers the previous id and the
*switch offset* (the last offset it took over from the old history).

What this module decides
------------------------
``decide(hello, primary)``: continue or full resync (Redis PSYNC with our offsets):

- a node that is not a writable primary (a standby, or fenced) ``Refuse``\\ s, whatever
  the peer's epoch: it takes no writes, so there is nothing to fence.
- a peer with a HIGHER epoch than the primary means the primary is stale (a standby
  was promoted behind its back): ``StepDown``. The primary must stop taking writes;
  streaming to that peer would replicate writes of a dead history.
- same history and the backlog still holds ``applied + 1``: ``Continue``. A standby
  that claims an offset beyond ours in our own history (the primary lost an unsynced
  tail in a crash) gets ``Full``: its extra entries are not ours.
- the previous history (the one we were promoted from) and ``applied <= switch``:
  the standby's prefix is a prefix of ours too (we applied exactly those entries
  before switching), so ``Continue`` if the backlog still holds ``applied + 1``.
  ``applied > switch``: the standby (typically the old primary) holds writes that
  never reached us; they must go, and a full resync is the simple honest way to drop
  them: ``Full(discarded=applied - switch)``.
- anything else (a new standby, an unknown history): ``Full``.

``check_batch``: the entries a standby receives must continue its log exactly
(offsets contiguous from ``applied + 1``; a leading overlap is skipped, never
re-applied), their epochs must never decrease and never exceed the primary's epoch
that the session announced.

``check_primary_epoch``: a standby never follows a primary of a LOWER epoch than
its own: that primary is a stale one that lost a promotion.

``plan_promotion``: epoch + 1, a fresh history id, the previous id and the switch
offset, all written durably (by ``Log.promote``, ``pagesift.core.replication.log``)
before writes are taken.

Fencing's rules (``must_fence``, ``may_accept_writes``, ``fencing_verdict``) are
``pagesift.core.ha.fencingrules``': they decide who may take writes, below this module.

``lag``: how far a follower is behind, in offsets and in seconds since it last held
everything its leader held. One definition for both ends: the primary's view of a
standby (``pagesift.core.replication.senderstate``) and the standby's own
(``pagesift.core.replication.followerstate``).

The steady state of a session (sync mode, linger, heartbeats on the primary; ack
pacing on the standby) is decided by the state machines in ``sender`` and
``follower`` (this package), pure like this module but with state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class ProtocolError(Exception):
    """The peer broke the protocol (gap, epoch regression...): drop the session."""


class StalePrimary(ProtocolError):
    """The primary's epoch is lower than ours: it lost a promotion; never follow it."""


# --- session start ------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """What a standby says when it connects."""

    node_id: str
    history_id: str
    applied_offset: int
    epoch: int


@dataclass(frozen=True)
class PrimaryState:
    """What the primary knows when it answers a hello."""

    writable: bool
    epoch: int
    history_id: str
    prev_history_id: str  # the history this node was promoted from ("" if none)
    switch_offset: int  # last offset of prev_history_id on this node
    first_offset: int  # oldest entry still in the backlog (last + 1 when empty)
    last_offset: int  # newest entry


@dataclass(frozen=True)
class Continue:
    """Send the tail from ``from_offset``; the standby keeps its store."""

    from_offset: int
    reason: str


@dataclass(frozen=True)
class Full:
    """Send a snapshot, then the tail; ``discarded`` of the standby's entries go."""

    reason: str
    discarded: int = 0


@dataclass(frozen=True)
class StepDown:
    """The peer has a higher epoch: the primary is stale and must stop taking writes."""

    peer_epoch: int
    reason: str


@dataclass(frozen=True)
class Refuse:
    """This node cannot serve the stream (it is not a writable primary)."""

    reason: str


Decision = Continue | Full | StepDown | Refuse


def backlog_holds(state: PrimaryState, offset: int) -> bool:
    """Can the tail start at ``offset``? ``last + 1`` is fine: nothing to send yet."""
    return state.first_offset <= offset <= state.last_offset + 1


def decide(hello: Hello, state: PrimaryState) -> Decision:
    """Continue or full resync for ``hello`` (see the module docstring)."""
    if not state.writable:
        return Refuse("this node is not a writable primary")
    if hello.epoch > state.epoch:
        return StepDown(
            hello.epoch,
            f"peer {hello.node_id!r} has epoch {hello.epoch} > ours {state.epoch}",
        )
    nxt = hello.applied_offset + 1
    if not hello.history_id:
        return Full("the standby has no history yet")
    if hello.history_id == state.history_id:
        if hello.applied_offset > state.last_offset:
            return Full(f"standby offset {hello.applied_offset} is beyond ours {state.last_offset}")
        if backlog_holds(state, nxt):
            return Continue(nxt, "same history")
        return Full(f"backlog starts at {state.first_offset}, standby needs {nxt}")
    if state.prev_history_id and hello.history_id == state.prev_history_id:
        if hello.applied_offset > state.switch_offset:
            discarded = hello.applied_offset - state.switch_offset
            return Full(
                f"standby wrote {discarded} entries past the switch offset "
                f"{state.switch_offset} of the previous history",
                discarded=discarded,
            )
        if backlog_holds(state, nxt):
            return Continue(nxt, "previous history, within the switch offset")
        return Full(f"backlog starts at {state.first_offset}, standby needs {nxt}")
    return Full(f"unknown history {hello.history_id!r}")


def check_primary_epoch(our_epoch: int, primary_epoch: int) -> None:
    """Raise ``StalePrimary`` when a primary's epoch is below ours."""
    if primary_epoch < our_epoch:
        raise StalePrimary(f"primary epoch {primary_epoch} is below ours {our_epoch}")


# --- entries ------------------------------------------------------------------------


@dataclass(frozen=True)
class EntryMeta:
    """The parts of an entry the checks look at."""

    offset: int
    epoch: int


def check_batch(
    entries: Sequence[EntryMeta], *, applied: int, tail_epoch: int, primary_epoch: int
) -> int:
    """Validate a received batch against the standby's log; returns how many leading
    entries are already applied (to be skipped: applying twice is harmless, but the
    log must hold each offset once).

    Raises ``ProtocolError`` on a gap, an offset going backwards inside the batch, an
    epoch lower than the one before it, or an epoch above the primary's.
    """
    skip = 0
    expected = applied + 1
    last_epoch = tail_epoch
    for i, entry in enumerate(entries):
        if entry.offset <= applied and i == skip:
            skip += 1
            continue
        if entry.offset != expected:
            raise ProtocolError(f"expected offset {expected}, got {entry.offset}")
        if entry.epoch < last_epoch:
            raise ProtocolError(f"entry {entry.offset} has epoch {entry.epoch} below {last_epoch}")
        if entry.epoch > primary_epoch:
            raise ProtocolError(
                f"entry {entry.offset} has epoch {entry.epoch} above the primary's {primary_epoch}"
            )
        expected += 1
        last_epoch = entry.epoch
    return skip


# --- fencing and promotion ----------------------------------------------------------


@dataclass(frozen=True)
class Promotion:
    """The durable facts a promotion records before the node takes writes."""

    epoch: int
    history_id: str
    prev_history_id: str
    switch_offset: int


def plan_promotion(
    *, epoch: int, history_id: str, applied_offset: int, new_history_id: str
) -> Promotion:
    """Epoch + 1, a new history that remembers where the old one ends."""
    if not new_history_id or new_history_id == history_id:
        raise ValueError("a promotion needs a fresh history id")
    return Promotion(
        epoch=epoch + 1,
        history_id=new_history_id,
        prev_history_id=history_id,
        switch_offset=applied_offset,
    )


# --- timing -------------------------------------------------------------------------


@dataclass(frozen=True)
class Lag:
    """How far a follower is behind its leader."""

    offsets: int  # entries the leader has and the follower has not (never negative)
    seconds: float  # since the follower last held everything; 0.0 while it does


def lag(*, leader: int, follower: int, caught_up_at: float, now: float) -> Lag:
    """The lag of a follower at offset ``follower`` behind a leader at ``leader``;
    ``caught_up_at``: the last time the follower's offset reached the leader's (as
    the follower's side knew it then)."""
    offsets = max(0, leader - follower)
    return Lag(offsets, now - caught_up_at if offsets else 0.0)
