"""The standby's steady state as a pure state machine: when to ack, and the lag.

What it owns
------------
``FollowerState`` is what a standby knows past the session start (which
``protocol`` settles): the primary's offset as last heard (from its entries and
heartbeats), the last time this standby held all of it, the primary's clock skew,
and whether an ack is owed and when the last one went out. It is a frozen value:
``step(state, event, now)`` applies one event at the time ``now`` and returns the new
state and the actions it calls for, leaving ``state`` as it was. No I/O, no clock, no
waiting: ``pagesift.standby.follower`` is the asyncio shell that holds the current
state, feeds it (``now`` is ``time.monotonic()``), keeps the state each step returns
and carries every action out (send an ack, wait for the next message until a time).
The events and actions are declared by ``pagesift.core.util.machine``'s convention
(``EVENTS``, ``ACTIONS``). The tests drive it with a fake clock
(``tests/test_replstate.py``).

The protocol
------------
``SessionSynced``: the session's decision was carried out (a continue adopted, or a
snapshot installed): ``SendAck`` at once, so the primary counts the session from its
first moment. ``EntriesApplied`` and ``HeartbeatReceived`` record the primary's
offset (and, for a heartbeat, its clock) and owe the primary an ack.
``SnapshotInstalled`` records the primary's offset only (the session-start ack
follows). Before taking each message the shell says ``NextMessage(buffered)``;
while an ack is owed the answer is:

- the next message has not arrived (the stream is idle: nothing more to apply):
  ``SendAck``, but no sooner than ``ack_min_gap`` after the previous ack: until
  then ``WaitForMessage(until)``, after which the shell asks again;
- the next message is already buffered: ``SendAck`` only when ``ack_max_delay``
  has passed since the previous ack, else nothing (apply first, ack later).

A heartbeat's failsafe request the standby promised to honour
(``HeartbeatReceived.grant``, after ``pagesift.core.ha.failsafe.StandbyPromise.grant``)
rides on the next ack: ``SendAck(grant)``; a later request replaces an earlier one
not yet sent (the primary counts the latest).

``lag(applied, now)``: offsets and seconds behind, by ``protocol.lag``: the one
place the standby computes it.

The guarantee, and why it holds
-------------------------------
- A lone entry (the sync-mode case: a writer waits for it) is acked as soon as it is
  durable, give or take ``ack_min_gap``: with nothing buffered the only wait is the
  gap, and the shell acks the applied offset, which is durable (written in the same
  batch as the data).
- While messages are buffered (a busy stream) an ack goes out only once
  ``ack_max_delay`` has passed since the previous one, so acks cost little and the
  primary still hears of progress within ``ack_max_delay`` plus one message; each
  idle moment adds at most one ack per ``ack_min_gap``.
- Every owed ack is eventually sent: once the stream goes idle the first answer is
  ``SendAck`` or a ``WaitForMessage`` that ends in one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pagesift.core.replication import protocol
from pagesift.core.util.machine import Kinds, declare

#: An idle stream (no message waiting) acks no sooner than this after the previous ack.
ACK_MIN_GAP = 0.002
#: A busy stream (the next message already buffered) acks once this has passed since
#: the previous ack, and not before.
ACK_MAX_DELAY = 0.01

EVENTS = Kinds("a follower event")
ACTIONS = Kinds("a follower action")


# --- events ---------------------------------------------------------------------------


@declare(EVENTS)
class SnapshotInstalled:
    """A full resync installed the primary's cut at ``offset``; ``applied``: ours now."""

    offset: int
    applied: int


@declare(EVENTS)
class SessionSynced:
    """The decision was carried out; the tail follows."""


@declare(EVENTS)
class EntriesApplied:
    """Entries up to ``last_offset`` are applied (durably); ``applied``: ours now."""

    last_offset: int
    applied: int


@declare(EVENTS)
class HeartbeatReceived:
    """The primary was at ``primary_offset`` at its clock ``primary_time_ms``;
    ``wall_time``: our wall clock (``time.time()``) on receipt; ``applied``: ours."""

    primary_offset: int
    primary_time_ms: int
    wall_time: float
    applied: int
    grant: int = 0  # the failsafe request this standby promised on (0: none)


@declare(EVENTS)
class NextMessage:
    """The shell is about to take the next message; ``buffered``: it has arrived."""

    buffered: bool


Event = SnapshotInstalled | SessionSynced | EntriesApplied | HeartbeatReceived | NextMessage
EVENTS.seal(Event)


# --- actions --------------------------------------------------------------------------


@declare(ACTIONS)
class SendAck:
    """Ack the applied offset now, answering failsafe request ``grant`` (0: none)."""

    grant: int = 0


@declare(ACTIONS)
class WaitForMessage:
    """Wait for the next message until ``until``, then say ``NextMessage`` again."""

    until: float


Action = SendAck | WaitForMessage
ACTIONS.seal(Action)


# --- state ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FollowerState:
    """One standby's replication state, a value: ``step`` returns the next one."""

    caught_up_at: float  # the last time our applied offset reached the primary's
    primary_offset: int = 0  # the highest offset the primary told us of
    clock_skew: float = 0.0  # the primary's clock minus ours, at the last heartbeat
    owed: bool = False  # applied (or heard) something the primary was not told yet
    last_ack: float = float("-inf")
    grant: int = 0  # a failsafe request promised on, not yet answered
    ack_min_gap: float = ACK_MIN_GAP
    ack_max_delay: float = ACK_MAX_DELAY

    def lag(self, applied: int, now: float) -> protocol.Lag:
        return protocol.lag(
            leader=self.primary_offset, follower=applied, caught_up_at=self.caught_up_at, now=now
        )


def step(state: FollowerState, event: Event, now: float) -> tuple[FollowerState, list[Action]]:
    """Apply ``event`` at ``now``: the new state and the actions the shell must carry
    out, in order (``state`` itself is left as it was)."""
    match event:
        case NextMessage(buffered):
            return _next_message(state, buffered, now)
        case EntriesApplied(last_offset, applied):
            return _heard(state, last_offset, applied, now, owed=True), []
        case HeartbeatReceived(primary_offset, primary_time_ms, wall_time, applied, grant):
            beat = replace(
                state, clock_skew=primary_time_ms / 1000.0 - wall_time, grant=grant or state.grant
            )
            return _heard(beat, primary_offset, applied, now, owed=True), []
        case SessionSynced():
            # a request of an earlier session is not this one's
            return _ack(replace(state, grant=0), now)
        case SnapshotInstalled(offset, applied):
            return _heard(state, offset, applied, now, owed=state.owed), []
    raise EVENTS.unknown(event)


def _heard(
    state: FollowerState, offset: int, applied: int, now: float, *, owed: bool
) -> FollowerState:
    """The primary was at ``offset`` (never lowered) and we at ``applied``. Every
    message takes this path: the constructor, not ``dataclasses.replace`` (about twice
    its cost)."""
    primary = max(state.primary_offset, offset)
    return FollowerState(
        caught_up_at=now if applied >= primary else state.caught_up_at,
        primary_offset=primary,
        clock_skew=state.clock_skew,
        owed=owed,
        last_ack=state.last_ack,
        grant=state.grant,
        ack_min_gap=state.ack_min_gap,
        ack_max_delay=state.ack_max_delay,
    )


def _next_message(
    state: FollowerState, buffered: bool, now: float
) -> tuple[FollowerState, list[Action]]:
    if not state.owed:
        return state, []
    if buffered:
        return _ack(state, now) if now - state.last_ack >= state.ack_max_delay else (state, [])
    earliest = state.last_ack + state.ack_min_gap
    if now < earliest:
        return state, [WaitForMessage(earliest)]
    return _ack(state, now)


def _ack(state: FollowerState, now: float) -> tuple[FollowerState, list[Action]]:
    return replace(state, owed=False, last_ack=now, grant=0), [SendAck(state.grant)]
