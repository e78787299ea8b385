"""The primary's steady state as a pure state machine: sync mode, linger, heartbeats.

What it owns
------------
``SenderState`` is everything one primary knows about replicating, past the session
start (which ``protocol.decide`` settles): each session's acknowledged offset and
the last time it was caught up, the writers waiting for an ack in sync mode, whether
sync mode is degraded, and each session's tail clock (when its last batch went out,
when its next heartbeat is due). ``SenderState.step(event, now)`` applies one event
at the time ``now`` and returns the actions it calls for. Like ``replproto`` it does
no I/O, reads no clock and never waits: ``pagesift.primary.replication`` is the
asyncio shell that turns gRPC and asyncio happenings into events (``now`` is
``time.monotonic()``) and carries the actions out: resolve a writer's future, sleep
until a time, send a batch or a heartbeat, log, count. The tests drive it with a fake
clock (``tests/test_replstate.py``).

The protocol
------------
**Sessions.** ``SessionOpened`` once a hello is answered (acks may come from then
on), ``SessionTailing`` once the snapshot, if any, went out and the tail starts (from
then on the session counts for ``acked_offset`` and the figures), ``SessionClosed``.

**Sync mode.** A writer waits on the offset of its write (``WaitStarted``):

- ``Release(True)`` at once when a tailing session has acked that offset;
- ``Release(False)`` at once in async mode or while degraded;
- otherwise the waiter is pending: ``AwaitAck(until=now + sync_timeout)``.

``AckReceived(session, offset, last_offset)`` raises the session's acked offset (it
never goes down) and releases, True and in offset order, the pending waiters it
covers. An ack of ``last_offset`` (the log's last offset when the ack arrived) marks
the session caught up and, when sync mode was degraded, restores it (``Restored``).
``Tick`` lets time pass: once the deadline of a pending waiter has come (``now >=
deadline``, not an instant before), sync mode degrades: ``Degraded`` (log once,
count once) and every pending waiter is released False. While degraded, waits return
at once, so at most one ``sync_timeout`` is paid per degradation. ``SteppedDown``
(this node was fenced) releases every pending waiter False and degrades nothing.
``WaitAbandoned``: the writer went away (cancelled); its waiter is forgotten.

**Tail** (per session). ``EntriesReady(session, nbytes)`` answers ``SendEntries``,
or ``Linger(until=sent_at + linger)`` for a batch that is not full, in async mode,
while the previous batch went out less than ``linger`` ago; the shell then sleeps
until ``until``, reads again and sends what there is. ``EntriesSent`` restarts the
linger clock. ``TailTurnEnded(session, sent)`` answers ``SendHeartbeat`` when one is
due (every ``heartbeat_interval``) and, when the turn sent no entries,
``WaitForEntries(until=<the next heartbeat>)``.

**Failsafe grants** (``failsafe_ttl > 0``; the rule is ``pagesift.core.ha.failsafe``).
Every heartbeat asks for a grant: ``SendHeartbeat(failsafe_request=N)``, N rising
across sessions, its send time ``now`` kept in the session (the last
``MAX_GRANTS_ASKED`` only). An ``AckReceived(grant=N)`` of a request still kept
answers ``GrantConfirmed(node_id, sent_at)`` (the requests up to N are forgotten): a
grant never counts for a request the session did not send, nor from a time later
than its request left.

**Figures.** ``acked_offset`` (the best tailing session's) and ``status(last_offset,
now)``, its lag by ``protocol.lag``: the one place the primary computes it.

The guarantee, and why it holds
-------------------------------
- A waiter is released True only once a session acked an offset at or above its own.
  An ack means applied AND durable on the standby (it writes its applied offset in
  the same batch as the data), so True means the write survives losing the primary.
- Each waiter is released exactly once (its release removes it), and none is pending
  while degraded: ``Degraded`` releases all of them and no new one is kept.
- A degraded primary never stalls a writer and is restored only by an ack of the
  log's last offset, i.e. by a standby that holds everything.
- Linger delays an entry by at most ``linger``, never in sync mode (its writers wait
  for the ack) and never a full batch (waiting would not make it larger).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Literal

from pagesift.core.replication import protocol

Mode = Literal["async", "sync"]
NEVER = float("-inf")  # "long ago": no batch sent yet, a heartbeat due at once
#: The grant requests a session keeps unanswered (older ones no longer count).
MAX_GRANTS_ASKED = 16


@dataclass(frozen=True, slots=True)
class SenderConfig:
    mode: Mode = "async"
    sync_timeout: float = 2.0  # seconds a sync writer waits before sync mode degrades
    linger: float = 0.015  # async mode: at most one non-full batch per linger
    heartbeat_interval: float = 0.5
    batch_bytes: int = 1 << 20  # a batch of this size is full
    failsafe_ttl: float = 0.0  # the grant asked with every heartbeat; 0 = none asked


# --- events ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionOpened:
    """A hello was answered; ``acked``: the offset the two sides share already (the
    standby's applied offset for a continue, 0 for a full resync)."""

    session: int
    node_id: str
    peer: str
    acked: int


@dataclass(frozen=True, slots=True)
class SessionTailing:
    """The decision (and the snapshot) went out; the tail starts."""

    session: int


@dataclass(frozen=True, slots=True)
class SessionClosed:
    session: int


@dataclass(frozen=True, slots=True)
class AckReceived:
    """The standby of ``session`` applied everything up to ``offset``, durably;
    ``last_offset``: the log's last offset now."""

    session: int
    offset: int
    last_offset: int
    grant: int = 0  # the failsafe request this ack answers (0: none)


@dataclass(frozen=True, slots=True)
class WaitStarted:
    """A writer waits for ``offset`` to be replicated; ``waiter``: the shell's id."""

    waiter: int
    offset: int


@dataclass(frozen=True, slots=True)
class WaitAbandoned:
    """The writer stopped waiting (cancelled) before its waiter was released."""

    waiter: int


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (a waiter's ``AwaitAck.until`` came): check the deadlines."""


@dataclass(frozen=True, slots=True)
class SteppedDown:
    """This node was fenced: nothing written here will replicate any more."""


@dataclass(frozen=True, slots=True)
class EntriesReady:
    """The tail of ``session`` read a batch of ``nbytes`` (at least one entry)."""

    session: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class EntriesSent:
    session: int


@dataclass(frozen=True, slots=True)
class TailTurnEnded:
    """The tail of ``session`` is done with its entries (``sent``: it sent some)."""

    session: int
    sent: bool


Event = (
    SessionOpened
    | SessionTailing
    | SessionClosed
    | AckReceived
    | WaitStarted
    | WaitAbandoned
    | Tick
    | SteppedDown
    | EntriesReady
    | EntriesSent
    | TailTurnEnded
)


# --- actions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Release:
    """Resolve the writer's wait: ``replicated`` True (acked) or False (not)."""

    waiter: int
    replicated: bool


@dataclass(frozen=True, slots=True)
class AwaitAck:
    """The waiter is pending: wait for its release, and send ``Tick`` at ``until``."""

    waiter: int
    until: float


@dataclass(frozen=True, slots=True)
class Degraded:
    """Sync mode degraded to async: warn once and count once. ``offset``: the waiter
    whose deadline passed first; ``acked``: the best acked offset then."""

    offset: int
    acked: int


@dataclass(frozen=True, slots=True)
class Restored:
    """A standby acked the last offset: sync mode is back."""

    acked: int


@dataclass(frozen=True, slots=True)
class SendEntries:
    """Send the batch now."""


@dataclass(frozen=True, slots=True)
class Linger:
    """Do not send before ``until``: then read again and send what there is."""

    until: float


@dataclass(frozen=True, slots=True)
class SendHeartbeat:
    """Send a heartbeat (the primary's offset, clock and epoch), asking for the
    failsafe grant ``failsafe_request`` (0: none)."""

    failsafe_request: int = 0


@dataclass(frozen=True, slots=True)
class GrantConfirmed:
    """Standby ``node_id`` answered the grant request this primary sent at ``sent_at``."""

    node_id: str
    sent_at: float


@dataclass(frozen=True, slots=True)
class WaitForEntries:
    """Nothing to send: wait for a new entry, but no later than ``until``."""

    until: float


Action = (
    Release
    | AwaitAck
    | Degraded
    | Restored
    | SendEntries
    | Linger
    | SendHeartbeat
    | GrantConfirmed
    | WaitForEntries
)


# --- state ----------------------------------------------------------------------------


@dataclass(slots=True)
class Session:
    node_id: str
    peer: str
    acked: int
    caught_up_at: float  # the last time ``acked`` reached the log's last offset
    tailing: bool = False
    sent_at: float = NEVER  # when the last entry batch went out
    beat_due: float = NEVER  # when the next heartbeat is due
    asked: dict[int, float] = field(default_factory=dict)  # grant requests: sent_at


@dataclass(frozen=True, slots=True, order=True)
class Waiter:
    offset: int
    waiter: int
    deadline: float


@dataclass(frozen=True, slots=True)
class SenderStatus:
    """The figures of the best session (the one that acked most)."""

    connected: bool
    peer: str  # its node id
    acked_offset: int
    last_offset: int
    lag: protocol.Lag


@dataclass(slots=True)
class SenderState:
    """One primary's replication state; ``step`` is the only way it changes."""

    config: SenderConfig = field(default_factory=SenderConfig)
    sessions: dict[int, Session] = field(default_factory=dict)
    pending: list[Waiter] = field(default_factory=list)  # in offset order
    degraded: bool = False
    degradations: int = 0
    grant_requests: int = 0  # failsafe grant requests sent (the last one's number)
    grants_confirmed: int = 0

    # --- figures -----------------------------------------------------------------------
    def best(self) -> Session | None:
        """The tailing session that acked most (the first of equals)."""
        return max(
            (s for s in self.sessions.values() if s.tailing), key=lambda s: s.acked, default=None
        )

    def standbys(self) -> tuple[str, ...]:
        """The node ids of the tailing sessions (the failsafe's members)."""
        return tuple(sorted({s.node_id for s in self.sessions.values() if s.tailing}))

    @property
    def acked_offset(self) -> int:
        return max((s.acked for s in self.sessions.values() if s.tailing), default=0)

    def status(self, last_offset: int, now: float) -> SenderStatus:
        best = self.best()
        acked = best.acked if best else 0
        # No standby: everything is unreplicated, but no clock runs for nobody.
        caught_up_at = best.caught_up_at if best else now
        return SenderStatus(
            connected=best is not None,
            peer=best.node_id if best else "",
            acked_offset=acked,
            last_offset=last_offset,
            lag=protocol.lag(
                leader=last_offset, follower=acked, caught_up_at=caught_up_at, now=now
            ),
        )

    # --- the transition ----------------------------------------------------------------
    def step(self, event: Event, now: float) -> list[Action]:
        """Apply ``event`` at ``now``; the actions the shell must carry out, in order."""
        match event:
            case AckReceived(session, offset, last_offset, grant):
                return [
                    *self._granted(session, grant),
                    *self._ack(session, offset, last_offset, now),
                ]
            case EntriesReady(session, nbytes):
                return self._entries_ready(session, nbytes, now)
            case EntriesSent(session):
                self.sessions[session].sent_at = now
                return []
            case TailTurnEnded(session, sent):
                return self._turn_ended(session, sent, now)
            case WaitStarted(waiter, offset):
                return self._wait(waiter, offset, now)
            case Tick():
                return self._tick(now)
            case WaitAbandoned(waiter):
                self.pending = [w for w in self.pending if w.waiter != waiter]
                return []
            case SessionOpened(session, node_id, peer, acked):
                self.sessions[session] = Session(node_id, peer, acked, caught_up_at=now)
                return []
            case SessionTailing(session):
                self.sessions[session].tailing = True
                return []
            case SessionClosed(session):
                self.sessions.pop(session, None)
                return []
            case SteppedDown():
                return self._release_all(False)
        raise TypeError(f"not a sender event: {event!r}")

    def _wait(self, waiter: int, offset: int, now: float) -> list[Action]:
        if self.acked_offset >= offset:
            return [Release(waiter, True)]
        if self.config.mode != "sync" or self.degraded:
            return [Release(waiter, False)]
        w = Waiter(offset, waiter, now + self.config.sync_timeout)
        bisect.insort(self.pending, w)
        return [AwaitAck(waiter, w.deadline)]

    def _ack(self, sid: int, offset: int, last_offset: int, now: float) -> list[Action]:
        session = self.sessions.get(sid)
        if session is None:
            return []
        session.acked = acked = max(session.acked, offset)
        actions: list[Action] = []
        if acked >= last_offset:
            session.caught_up_at = now
            if self.degraded:
                self.degraded = False
                actions.append(Restored(acked))
        # ``pending`` is in offset order: the covered waiters are a prefix.
        n = bisect.bisect_right(self.pending, acked, key=_offset)
        if n:
            actions += [Release(w.waiter, True) for w in self.pending[:n]]
            del self.pending[:n]
        return actions

    def _granted(self, sid: int, grant: int) -> list[Action]:
        session = self.sessions.get(sid)
        if session is None or grant not in session.asked:
            return []
        sent_at = session.asked[grant]
        session.asked = {n: t for n, t in session.asked.items() if n > grant}
        self.grants_confirmed += 1
        return [GrantConfirmed(session.node_id, sent_at)]

    def _tick(self, now: float) -> list[Action]:
        if not self.pending:
            return []
        first = min(self.pending, key=lambda w: w.deadline)
        if now < first.deadline:
            return []
        self.degraded = True
        self.degradations += 1
        return [Degraded(first.offset, self.acked_offset), *self._release_all(False)]

    def _release_all(self, replicated: bool) -> list[Action]:
        actions: list[Action] = [Release(w.waiter, replicated) for w in self.pending]
        self.pending.clear()
        return actions

    def _entries_ready(self, sid: int, nbytes: int, now: float) -> list[Action]:
        cfg = self.config
        until = self.sessions[sid].sent_at + cfg.linger
        if cfg.mode != "sync" and nbytes < cfg.batch_bytes and until > now:
            return [Linger(until)]
        return [SendEntries()]

    def _turn_ended(self, sid: int, sent: bool, now: float) -> list[Action]:
        session = self.sessions[sid]
        actions: list[Action] = []
        if now >= session.beat_due:
            session.beat_due = now + self.config.heartbeat_interval
            actions.append(SendHeartbeat(self._ask_grant(session, now)))
        if not sent:
            actions.append(WaitForEntries(session.beat_due))
        return actions

    def _ask_grant(self, session: Session, now: float) -> int:
        if self.config.failsafe_ttl <= 0:
            return 0
        self.grant_requests += 1
        session.asked[self.grant_requests] = now
        if len(session.asked) > MAX_GRANTS_ASKED:
            del session.asked[min(session.asked)]
        return self.grant_requests


def _offset(w: Waiter) -> int:
    return w.offset
