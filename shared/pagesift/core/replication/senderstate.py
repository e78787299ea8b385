"""The primary's steady state as a pure state machine: sync mode, linger, heartbeats.

What it owns
------------
``SenderState`` is everything one primary knows about replicating, past the session
start (which ``protocol.decide`` settles): each session's acknowledged offset and
the last time it was caught up, the writers waiting for an ack in sync mode, whether
sync mode is degraded, and each session's tail clock (when its last batch went out,
when its next heartbeat is due). It is a frozen value (its sessions a read-only
mapping of frozen ``Session`` values, its waiters a tuple): ``step(state, event,
now)`` applies one event at the time ``now`` and returns the new state and the
actions it calls for, leaving ``state`` as it was. Like ``protocol`` it does no I/O,
reads no clock and never waits: ``pagesift.primary.replication`` is the asyncio shell
that holds the current state, turns gRPC and asyncio happenings into events (``now``
is ``time.monotonic()``), keeps the state each step returns and carries every action
out: resolve a writer's future, sleep until a time, send a batch or a heartbeat, log,
count. The events and actions are declared by ``pagesift.core.util.machine``'s
convention (``EVENTS``, ``ACTIONS``). The tests drive it with a fake clock
(``tests/test_replstate.py``).

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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

from pagesift.core.replication import protocol
from pagesift.core.util.machine import Kinds, declare

Mode = Literal["async", "sync"]
NEVER = float("-inf")  # "long ago": no batch sent yet, a heartbeat due at once
#: The grant requests a session keeps unanswered (older ones no longer count).
MAX_GRANTS_ASKED = 16

EVENTS = Kinds("a sender event")
ACTIONS = Kinds("a sender action")


@dataclass(frozen=True, slots=True)
class SenderConfig:
    mode: Mode = "async"
    sync_timeout: float = 2.0  # seconds a sync writer waits before sync mode degrades
    linger: float = 0.015  # async mode: at most one non-full batch per linger
    heartbeat_interval: float = 0.5
    batch_bytes: int = 1 << 20  # a batch of this size is full
    failsafe_ttl: float = 0.0  # the grant asked with every heartbeat; 0 = none asked


# --- events ---------------------------------------------------------------------------


@declare(EVENTS)
class SessionOpened:
    """A hello was answered; ``acked``: the offset the two sides share already (the
    standby's applied offset for a continue, 0 for a full resync)."""

    session: int
    node_id: str
    peer: str
    acked: int


@declare(EVENTS)
class SessionTailing:
    """The decision (and the snapshot) went out; the tail starts."""

    session: int


@declare(EVENTS)
class SessionClosed:
    session: int


@declare(EVENTS)
class AckReceived:
    """The standby of ``session`` applied everything up to ``offset``, durably;
    ``last_offset``: the log's last offset now."""

    session: int
    offset: int
    last_offset: int
    grant: int = 0  # the failsafe request this ack answers (0: none)


@declare(EVENTS)
class WaitStarted:
    """A writer waits for ``offset`` to be replicated; ``waiter``: the shell's id."""

    waiter: int
    offset: int


@declare(EVENTS)
class WaitAbandoned:
    """The writer stopped waiting (cancelled) before its waiter was released."""

    waiter: int


@declare(EVENTS)
class Tick:
    """Time passed (a waiter's ``AwaitAck.until`` came): check the deadlines."""


@declare(EVENTS)
class SteppedDown:
    """This node was fenced: nothing written here will replicate any more."""


@declare(EVENTS)
class EntriesReady:
    """The tail of ``session`` read a batch of ``nbytes`` (at least one entry)."""

    session: int
    nbytes: int


@declare(EVENTS)
class EntriesSent:
    session: int


@declare(EVENTS)
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
EVENTS.seal(Event)


# --- actions --------------------------------------------------------------------------


@declare(ACTIONS)
class Release:
    """Resolve the writer's wait: ``replicated`` True (acked) or False (not)."""

    waiter: int
    replicated: bool


@declare(ACTIONS)
class AwaitAck:
    """The waiter is pending: wait for its release, and send ``Tick`` at ``until``."""

    waiter: int
    until: float


@declare(ACTIONS)
class Degraded:
    """Sync mode degraded to async: warn once and count once. ``offset``: the waiter
    whose deadline passed first; ``acked``: the best acked offset then."""

    offset: int
    acked: int


@declare(ACTIONS)
class Restored:
    """A standby acked the last offset: sync mode is back."""

    acked: int


@declare(ACTIONS)
class SendEntries:
    """Send the batch now."""


@declare(ACTIONS)
class Linger:
    """Do not send before ``until``: then read again and send what there is."""

    until: float


@declare(ACTIONS)
class SendHeartbeat:
    """Send a heartbeat (the primary's offset, clock and epoch), asking for the
    failsafe grant ``failsafe_request`` (0: none)."""

    failsafe_request: int = 0


@declare(ACTIONS)
class GrantConfirmed:
    """Standby ``node_id`` answered the grant request this primary sent at ``sent_at``."""

    node_id: str
    sent_at: float


@declare(ACTIONS)
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
ACTIONS.seal(Action)


# --- state ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Session:
    node_id: str
    peer: str
    acked: int
    caught_up_at: float  # the last time ``acked`` reached the log's last offset
    tailing: bool = False
    sent_at: float = NEVER  # when the last entry batch went out
    beat_due: float = NEVER  # when the next heartbeat is due
    asked: tuple[tuple[int, float], ...] = ()  # grant requests (number, sent_at), rising


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


def _no_sessions() -> Mapping[int, Session]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SenderState:
    """One primary's replication state, a value: ``step`` returns the next one."""

    config: SenderConfig = field(default_factory=SenderConfig)
    sessions: Mapping[int, Session] = field(default_factory=_no_sessions)  # read-only
    pending: tuple[Waiter, ...] = ()  # in offset order
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


# --- the transition --------------------------------------------------------------------
Step = tuple[SenderState, list[Action]]


def step(state: SenderState, event: Event, now: float) -> Step:
    """Apply ``event`` at ``now``: the new state and the actions the shell must carry
    out, in order (``state`` itself is left as it was)."""
    match event:
        case AckReceived(session, offset, last_offset, grant):
            state, granted = _granted(state, session, grant)
            state, released = _ack(state, session, offset, last_offset, now)
            return state, [*granted, *released]
        case EntriesReady(session, nbytes):
            return state, _entries_ready(state, session, nbytes, now)
        case EntriesSent(session):
            sent = _moved(state.sessions[session], sent_at=now)
            return _changed(state, _put(state.sessions, session, sent)), []
        case TailTurnEnded(session, sent):
            return _turn_ended(state, session, sent, now)
        case WaitStarted(waiter, offset):
            return _wait(state, waiter, offset, now)
        case Tick():
            return _tick(state, now)
        case WaitAbandoned(waiter):
            return replace(state, pending=tuple(w for w in state.pending if w.waiter != waiter)), []
        case SessionOpened(session, node_id, peer, acked):
            opened = Session(node_id, peer, acked, caught_up_at=now)
            return replace(state, sessions=_put(state.sessions, session, opened)), []
        case SessionTailing(session):
            tailing = replace(state.sessions[session], tailing=True)
            return replace(state, sessions=_put(state.sessions, session, tailing)), []
        case SessionClosed(session):
            left = {sid: s for sid, s in state.sessions.items() if sid != session}
            return replace(state, sessions=MappingProxyType(left)), []
        case SteppedDown():
            return _release_all(state, False)
    raise EVENTS.unknown(event)


# The tail's every batch, every ack and every sync wait change the state: ``_moved`` and
# ``_changed`` make the next value by its constructor (``dataclasses.replace`` costs about
# twice as much).
def _moved(
    s: Session,
    *,
    acked: int | None = None,
    caught_up_at: float | None = None,
    sent_at: float | None = None,
) -> Session:
    """``s`` with a new ack (and catch-up time) or a new batch sent."""
    return Session(
        node_id=s.node_id,
        peer=s.peer,
        acked=s.acked if acked is None else acked,
        caught_up_at=s.caught_up_at if caught_up_at is None else caught_up_at,
        tailing=s.tailing,
        sent_at=s.sent_at if sent_at is None else sent_at,
        beat_due=s.beat_due,
        asked=s.asked,
    )


def _changed(
    state: SenderState,
    sessions: Mapping[int, Session],
    pending: tuple[Waiter, ...] | None = None,
    degraded: bool | None = None,
) -> SenderState:
    """``state`` with new sessions (and waiters, and degradation)."""
    return SenderState(
        config=state.config,
        sessions=sessions,
        pending=state.pending if pending is None else pending,
        degraded=state.degraded if degraded is None else degraded,
        degradations=state.degradations,
        grant_requests=state.grant_requests,
        grants_confirmed=state.grants_confirmed,
    )


def _put(sessions: Mapping[int, Session], sid: int, session: Session) -> Mapping[int, Session]:
    """``sessions`` with ``sid`` now ``session``: a new read-only mapping."""
    changed = dict(sessions)
    changed[sid] = session
    return MappingProxyType(changed)


def _wait(state: SenderState, waiter: int, offset: int, now: float) -> Step:
    if state.acked_offset >= offset:
        return state, [Release(waiter, True)]
    if state.config.mode != "sync" or state.degraded:
        return state, [Release(waiter, False)]
    w = Waiter(offset, waiter, now + state.config.sync_timeout)
    at = bisect.bisect_right(state.pending, w)  # (where ``insort`` puts it)
    pending = (*state.pending[:at], w, *state.pending[at:])
    return _changed(state, state.sessions, pending), [AwaitAck(waiter, w.deadline)]


def _ack(state: SenderState, sid: int, offset: int, last_offset: int, now: float) -> Step:
    session = state.sessions.get(sid)
    if session is None:
        return state, []
    acked = max(session.acked, offset)
    caught_up = acked >= last_offset
    actions: list[Action] = []
    if caught_up and state.degraded:
        actions.append(Restored(acked))
    # ``pending`` is in offset order: the covered waiters are a prefix.
    n = bisect.bisect_right(state.pending, acked, key=_offset)
    actions += [Release(w.waiter, True) for w in state.pending[:n]]
    at = now if caught_up else session.caught_up_at
    session = _moved(session, acked=acked, caught_up_at=at)
    sessions = _put(state.sessions, sid, session)
    return _changed(state, sessions, state.pending[n:], state.degraded and not caught_up), actions


def _granted(state: SenderState, sid: int, grant: int) -> Step:
    session = state.sessions.get(sid)
    sent_at = dict(session.asked).get(grant) if session is not None and grant else None
    if session is None or sent_at is None:
        return state, []
    session = replace(session, asked=tuple(a for a in session.asked if a[0] > grant))
    granted = replace(
        state,
        sessions=_put(state.sessions, sid, session),
        grants_confirmed=state.grants_confirmed + 1,
    )
    return granted, [GrantConfirmed(session.node_id, sent_at)]


def _tick(state: SenderState, now: float) -> Step:
    if not state.pending:
        return state, []
    first = min(state.pending, key=lambda w: w.deadline)
    if now < first.deadline:
        return state, []
    degraded = replace(state, degraded=True, degradations=state.degradations + 1)
    released, actions = _release_all(degraded, False)
    return released, [Degraded(first.offset, state.acked_offset), *actions]


def _release_all(state: SenderState, replicated: bool) -> Step:
    actions: list[Action] = [Release(w.waiter, replicated) for w in state.pending]
    return (replace(state, pending=()) if state.pending else state), actions


def _entries_ready(state: SenderState, sid: int, nbytes: int, now: float) -> list[Action]:
    cfg = state.config
    until = state.sessions[sid].sent_at + cfg.linger
    if cfg.mode != "sync" and nbytes < cfg.batch_bytes and until > now:
        return [Linger(until)]
    return [SendEntries()]


def _turn_ended(state: SenderState, sid: int, sent: bool, now: float) -> Step:
    session = state.sessions[sid]
    actions: list[Action] = []
    if now >= session.beat_due:
        session = replace(session, beat_due=now + state.config.heartbeat_interval)
        state, session, request = _ask_grant(state, session, now)
        state = replace(state, sessions=_put(state.sessions, sid, session))
        actions.append(SendHeartbeat(request))
    if not sent:
        actions.append(WaitForEntries(session.beat_due))
    return state, actions


def _ask_grant(
    state: SenderState, session: Session, now: float
) -> tuple[SenderState, Session, int]:
    """A heartbeat's grant request (0: none asked), kept in ``session``."""
    if state.config.failsafe_ttl <= 0:
        return state, session, 0
    request = state.grant_requests + 1
    asked = (*session.asked, (request, now))[-MAX_GRANTS_ASKED:]  # the oldest go first
    return replace(state, grant_requests=request), replace(session, asked=asked), request


def _offset(w: Waiter) -> int:
    return w.offset
