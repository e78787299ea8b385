"""The sender's and the follower's steady state, driven by a fake clock.

``senderstate.step`` and ``followerstate.step`` take a frozen state (``SenderState``,
``FollowerState``), an event and ``now``, and return the next state and the actions;
each test threads the state through, as the shells do. Nothing here sleeps, opens a
socket or reads a clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from pagesift.core.replication import followerstate, protocol, senderstate
from pagesift.core.replication.followerstate import (
    EntriesApplied,
    FollowerState,
    HeartbeatReceived,
    NextMessage,
    SendAck,
    SessionSynced,
    SnapshotInstalled,
    WaitForMessage,
)
from pagesift.core.replication.senderstate import (
    AckReceived,
    AwaitAck,
    Degraded,
    EntriesReady,
    EntriesSent,
    Linger,
    Release,
    Restored,
    SendEntries,
    SenderConfig,
    SenderState,
    SendHeartbeat,
    SessionClosed,
    SessionOpened,
    SessionTailing,
    SteppedDown,
    TailTurnEnded,
    Tick,
    WaitAbandoned,
    WaitForEntries,
    WaitStarted,
)

EPS = 1e-9
SYNC = SenderConfig(mode="sync", sync_timeout=2.0, linger=0.015, heartbeat_interval=0.5)


def sender(config: SenderConfig = SYNC, *, acked: int = 0, now: float = 0.0) -> SenderState:
    """A sender with one tailing session (id 1) that acked ``acked``."""
    s = SenderState(config)
    s, _ = senderstate.step(s, SessionOpened(1, "b", "peer-b", acked), now)
    s, _ = senderstate.step(s, SessionTailing(1), now)
    return s


# --- sync mode ------------------------------------------------------------------------


def test_sync_mode_degrades_exactly_when_the_timeout_has_passed_not_before() -> None:
    s = sender()
    s, actions = senderstate.step(s, WaitStarted(10, 5), 100.0)
    assert actions == [AwaitAck(10, 102.0)]
    s, actions = senderstate.step(s, Tick(), 101.0)
    assert actions == []
    s, actions = senderstate.step(s, Tick(), 102.0 - EPS)
    assert actions == []
    assert not s.degraded and s.degradations == 0
    s, actions = senderstate.step(s, Tick(), 102.0)
    assert actions == [Degraded(5, 0), Release(10, False)]
    assert s.degraded and s.degradations == 1 and not s.pending


def test_a_degraded_sender_never_waits_and_degrades_once() -> None:
    s = sender()
    s, _ = senderstate.step(s, WaitStarted(1, 5), 0.0)
    s, _ = senderstate.step(s, WaitStarted(2, 6), 0.5)
    # the first deadline releases every waiter, the later one included
    s, actions = senderstate.step(s, Tick(), 2.0)
    assert actions == [Degraded(5, 0), Release(1, False), Release(2, False)]
    s, actions = senderstate.step(s, WaitStarted(3, 7), 2.1)
    assert actions == [Release(3, False)]
    s, actions = senderstate.step(s, Tick(), 10.0)
    assert actions == []
    assert s.degradations == 1
    # already acked: True at once, degraded or not
    s, _ = senderstate.step(s, AckReceived(1, 4, last_offset=7), 10.0)
    s, actions = senderstate.step(s, WaitStarted(4, 4), 10.0)
    assert actions == [Release(4, True)]


def test_sync_mode_is_restored_only_by_an_ack_of_the_last_offset() -> None:
    s = sender()
    s, _ = senderstate.step(s, WaitStarted(1, 5), 0.0)
    s, _ = senderstate.step(s, Tick(), 2.0)
    s, actions = senderstate.step(s, AckReceived(1, 5, last_offset=9), 3.0)
    assert actions == []
    assert s.degraded
    s, actions = senderstate.step(s, AckReceived(1, 9, last_offset=9), 4.0)
    assert actions == [Restored(9)]
    assert not s.degraded
    s, actions = senderstate.step(s, WaitStarted(2, 10), 4.0)
    assert actions == [AwaitAck(2, 6.0)]
    s, actions = senderstate.step(s, AckReceived(1, 10, last_offset=10), 4.1)
    assert actions == [Release(2, True)]


def test_an_ack_releases_the_waiters_it_covers_in_offset_order() -> None:
    s = sender()
    for waiter, offset in ((1, 7), (2, 5), (3, 9), (4, 6), (5, 5)):
        s, _ = senderstate.step(s, WaitStarted(waiter, offset), 0.0)
    s, actions = senderstate.step(s, AckReceived(1, 7, last_offset=9), 0.1)
    assert actions == [
        Release(2, True),
        Release(5, True),
        Release(4, True),
        Release(1, True),
    ]
    assert [w.waiter for w in s.pending] == [3]
    s, actions = senderstate.step(s, AckReceived(1, 8, last_offset=9), 0.15)
    assert actions == []  # 9 is not covered by 8
    # acked offsets never go down: a late, older ack releases nothing and lowers nothing
    s, actions = senderstate.step(s, AckReceived(1, 3, last_offset=9), 0.2)
    assert actions == []
    assert s.acked_offset == 8


def test_async_mode_never_waits() -> None:
    s = sender(SenderConfig(mode="async"), acked=3)
    s, actions = senderstate.step(s, WaitStarted(1, 3), 0.0)
    assert actions == [Release(1, True)]
    s, actions = senderstate.step(s, WaitStarted(2, 4), 0.0)
    assert actions == [Release(2, False)]
    assert not s.pending


def test_a_session_counts_for_acked_offset_once_it_tails_but_its_acks_release_at_once() -> None:
    s = SenderState(SYNC)
    s, _ = senderstate.step(s, SessionOpened(7, "b", "peer", 4), 0.0)
    assert s.acked_offset == 0  # still sending the decision / the snapshot
    s, actions = senderstate.step(s, WaitStarted(1, 4), 0.0)
    assert actions == [AwaitAck(1, 2.0)]
    s, actions = senderstate.step(s, AckReceived(7, 4, last_offset=4), 0.1)
    assert actions == [Release(1, True)]
    s, _ = senderstate.step(s, SessionTailing(7), 0.2)
    assert s.acked_offset == 4
    s, _ = senderstate.step(s, SessionClosed(7), 0.3)
    assert s.acked_offset == 0
    s, actions = senderstate.step(s, AckReceived(7, 9, last_offset=9), 0.4)
    assert actions == []


def test_stepping_down_and_abandoning_release_without_degrading() -> None:
    s = sender()
    s, _ = senderstate.step(s, WaitStarted(1, 5), 0.0)
    s, _ = senderstate.step(s, WaitStarted(2, 6), 0.0)
    s, actions = senderstate.step(s, WaitAbandoned(1), 0.1)
    assert actions == []
    s, actions = senderstate.step(s, SteppedDown(), 0.2)
    assert actions == [Release(2, False)]
    assert not s.degraded and not s.pending
    s, actions = senderstate.step(s, Tick(), 5.0)
    assert actions == []


# --- linger and heartbeats ------------------------------------------------------------


def test_a_batch_that_is_not_full_waits_at_most_linger_after_the_previous_one() -> None:
    s = sender(SenderConfig(mode="async", linger=0.015, batch_bytes=1000))
    s, actions = senderstate.step(s, EntriesReady(1, 10), 5.0)
    assert actions == [SendEntries()]  # nothing sent yet
    s, _ = senderstate.step(s, EntriesSent(1), 5.0)
    s, actions = senderstate.step(s, EntriesReady(1, 10), 5.0)
    assert actions == [Linger(5.015)]
    s, actions = senderstate.step(s, EntriesReady(1, 999), 5.01)
    assert actions == [Linger(5.015)]
    s, actions = senderstate.step(s, EntriesReady(1, 10), 5.015)
    assert actions == [SendEntries()]
    s, actions = senderstate.step(s, EntriesReady(1, 1000), 5.001)
    assert actions == [SendEntries()]  # a full batch: never


def test_sync_mode_never_lingers() -> None:
    s = sender()
    s, _ = senderstate.step(s, EntriesSent(1), 5.0)
    s, actions = senderstate.step(s, EntriesReady(1, 1), 5.0)
    assert actions == [SendEntries()]


@given(
    sent_at=st.floats(0, 1e6),
    dt=st.floats(0, 1.0),
    nbytes=st.integers(1, 4096),
    linger=st.floats(0, 0.1),
    sync=st.booleans(),
)
def test_linger_bounds(sent_at: float, dt: float, nbytes: int, linger: float, sync: bool) -> None:
    s = sender(SenderConfig(mode="sync" if sync else "async", linger=linger, batch_bytes=2048))
    s, _ = senderstate.step(s, EntriesSent(1), sent_at)
    now = sent_at + dt
    s, (action,) = senderstate.step(s, EntriesReady(1, nbytes), now)
    if isinstance(action, Linger):
        assert not sync and nbytes < 2048
        assert now < action.until <= now + linger
        assert action.until == sent_at + linger
    else:
        assert action == SendEntries()
        assert sync or nbytes >= 2048 or now >= sent_at + linger


def test_heartbeats_are_due_every_interval_and_an_idle_tail_waits_for_the_next() -> None:
    s = sender()
    s, actions = senderstate.step(s, TailTurnEnded(1, sent=False), 10.0)
    assert actions == [SendHeartbeat(), WaitForEntries(10.5)]
    s, actions = senderstate.step(s, TailTurnEnded(1, sent=True), 10.2)
    assert actions == []
    s, actions = senderstate.step(s, TailTurnEnded(1, sent=False), 10.3)
    assert actions == [WaitForEntries(10.5)]
    s, actions = senderstate.step(s, TailTurnEnded(1, sent=True), 10.5)
    assert actions == [SendHeartbeat()]
    s, actions = senderstate.step(s, TailTurnEnded(1, sent=False), 10.6)
    assert actions == [WaitForEntries(11.0)]


# --- lag ------------------------------------------------------------------------------


def test_the_primary_measures_lag_since_the_standby_was_last_caught_up() -> None:
    s = sender(now=0.0)
    s, _ = senderstate.step(s, AckReceived(1, 5, last_offset=5), 1.0)  # caught up at 1.0
    s, _ = senderstate.step(s, AckReceived(1, 7, last_offset=8), 2.0)  # not caught up
    st_ = s.status(last_offset=8, now=4.0)
    assert (st_.connected, st_.peer, st_.acked_offset, st_.last_offset) == (True, "b", 7, 8)
    assert st_.lag == protocol.Lag(1, 3.0)
    assert s.status(last_offset=7, now=4.0).lag == protocol.Lag(0, 0.0)
    alone = SenderState(SYNC).status(last_offset=8, now=4.0)
    assert not alone.connected and alone.lag == protocol.Lag(8, 0.0)


def test_the_best_session_is_the_one_that_acked_most() -> None:
    s = sender()
    s, _ = senderstate.step(s, SessionOpened(2, "c", "peer-c", 0), 0.0)
    s, _ = senderstate.step(s, SessionTailing(2), 0.0)
    s, _ = senderstate.step(s, AckReceived(2, 6, last_offset=6), 1.0)
    assert s.status(last_offset=6, now=2.0).peer == "c" and s.acked_offset == 6


def test_lag_is_zero_while_caught_up_and_never_negative() -> None:
    assert protocol.lag(leader=5, follower=5, caught_up_at=1.0, now=9.0) == protocol.Lag(0, 0.0)
    assert protocol.lag(leader=5, follower=7, caught_up_at=1.0, now=9.0) == protocol.Lag(0, 0.0)
    assert protocol.lag(leader=9, follower=7, caught_up_at=1.0, now=9.0) == protocol.Lag(2, 8.0)


# --- the follower: ack pacing ---------------------------------------------------------

GAP, DELAY = 0.002, 0.01


def follower(now: float = 0.0) -> FollowerState:
    """A follower whose session-start ack went out at ``now``."""
    f = FollowerState(caught_up_at=now, ack_min_gap=GAP, ack_max_delay=DELAY)
    f, actions = followerstate.step(f, SessionSynced(), now)
    assert actions == [SendAck()]
    return f


def test_the_session_start_is_acked_at_once_and_nothing_is_owed_after() -> None:
    f = follower()
    f, actions = followerstate.step(f, NextMessage(buffered=False), 5.0)
    assert actions == []
    f, actions = followerstate.step(f, NextMessage(buffered=True), 5.0)
    assert actions == []


def test_an_idle_stream_acks_at_once_but_not_sooner_than_the_gap() -> None:
    f = follower(1.0)
    f, _ = followerstate.step(f, EntriesApplied(1, applied=1), 1.0005)
    f, actions = followerstate.step(f, NextMessage(buffered=False), 1.0005)
    assert actions == [WaitForMessage(1.0 + GAP)]
    f, actions = followerstate.step(f, NextMessage(buffered=False), 1.0 + GAP - EPS)
    assert actions == [WaitForMessage(1.0 + GAP)]
    f, actions = followerstate.step(f, NextMessage(buffered=False), 1.0 + GAP)
    assert actions == [SendAck()]
    f, _ = followerstate.step(f, EntriesApplied(2, applied=2), 2.0)
    f, actions = followerstate.step(f, NextMessage(buffered=False), 2.0)
    assert actions == [SendAck()]  # long since the last


def test_a_busy_stream_acks_at_most_every_max_delay() -> None:
    f = follower(1.0)
    f, _ = followerstate.step(f, EntriesApplied(1, applied=1), 1.001)
    f, actions = followerstate.step(f, NextMessage(buffered=True), 1.005)
    assert actions == []
    f, _ = followerstate.step(f, EntriesApplied(2, applied=2), 1.006)
    f, actions = followerstate.step(f, NextMessage(buffered=True), 1.0 + DELAY - EPS)
    assert actions == []
    f, actions = followerstate.step(f, NextMessage(buffered=True), 1.0 + DELAY)
    assert actions == [SendAck()]
    f, actions = followerstate.step(f, NextMessage(buffered=True), 1.0 + 3 * DELAY)
    assert actions == []  # nothing owed


def test_a_heartbeat_is_acked_like_entries() -> None:
    f = follower(1.0)
    f, _ = followerstate.step(f, HeartbeatReceived(0, 0, 0.0, applied=0), 1.5)
    f, actions = followerstate.step(f, NextMessage(buffered=False), 1.5)
    assert actions == [SendAck()]


@given(
    steps=st.lists(
        st.tuples(st.floats(0, 0.02), st.booleans(), st.booleans()), min_size=1, max_size=60
    )
)
def test_ack_pacing_bounds(steps: list[tuple[float, bool, bool]]) -> None:
    """Random messages (applied or not) and arrivals; the shell's loop is simulated."""
    now = 0.0
    f = follower(now)
    acks = [now]
    for dt, progress, buffered in steps:
        now += dt
        if progress:
            f, _ = followerstate.step(f, EntriesApplied(1, applied=1), now)
        owed = f.owed
        f, actions = followerstate.step(f, NextMessage(buffered), now)
        while actions and isinstance(wait := actions[0], WaitForMessage):
            assert not buffered and wait.until == acks[-1] + GAP and wait.until > now
            now = wait.until  # the message did not come meanwhile
            f, actions = followerstate.step(f, NextMessage(buffered), now)
        if actions == [SendAck()]:
            assert owed
            assert now - acks[-1] >= (DELAY if buffered else GAP) - EPS  # (float rounding)
            acks.append(now)
        else:
            assert actions == []
            # owed and idle: always acked (after the gap); owed and busy: within DELAY
            assert not owed or (buffered and now - acks[-1] < DELAY)
        assert all(b - a >= GAP - EPS for a, b in itertools.pairwise(acks))


# --- the follower: lag ----------------------------------------------------------------


def test_the_standby_measures_lag_from_the_primarys_heartbeats_and_entries() -> None:
    f = follower(0.0)
    f, _ = followerstate.step(f, SnapshotInstalled(10, applied=10), 1.0)
    assert f.lag(10, 3.0) == protocol.Lag(0, 0.0)
    f, _ = followerstate.step(
        f, HeartbeatReceived(14, 1_000_500, 1000.0, applied=10), 2.0
    )  # behind since 1.0
    assert f.primary_offset == 14 and f.clock_skew == pytest.approx(0.5)
    assert f.lag(10, 5.0) == protocol.Lag(4, 4.0)
    f, _ = followerstate.step(f, EntriesApplied(12, applied=12), 5.5)
    assert f.lag(12, 6.0) == protocol.Lag(2, 5.0)
    f, _ = followerstate.step(f, EntriesApplied(14, applied=14), 6.0)  # caught up
    assert f.lag(14, 7.0) == protocol.Lag(0, 0.0)
    f, _ = followerstate.step(
        f, HeartbeatReceived(13, 0, 0.0, applied=14), 7.0
    )  # an older offset: ignored
    assert f.primary_offset == 14


# --- the sender, stateful -------------------------------------------------------------


class SenderMachine(RuleBasedStateMachine):
    """Random sessions, writes, waits, acks, abandons and time; every action checked."""

    sessions = Bundle("sessions")
    waiters = Bundle("waiters")

    def __init__(self) -> None:
        super().__init__()
        self.s = SenderState(SYNC)
        self.now = 0.0
        self.last = 0  # the log's last offset
        self.next_id = 0
        self.offset_of: dict[int, int] = {}  # every waiter ever started
        self.released: dict[int, bool] = {}
        self.acked_ever = 0  # the highest offset any session ever acked
        self.acked_by: dict[int, int] = {}  # each open session's acked offset, as seen

    @initialize(
        mode=st.sampled_from(["sync", "sync", "sync", "async"]),  # sync mode is the interest
        timeout=st.sampled_from([1.0, 5.0, 0.0]),
    )
    def configure(self, mode: str, timeout: float) -> None:
        self.s = replace(
            self.s,
            config=SenderConfig(mode="sync" if mode == "sync" else "async", sync_timeout=timeout),
        )

    def step(self, event: senderstate.Event) -> list[senderstate.Action]:
        """Step at ``self.now``, keeping the state returned (as the shell does)."""
        self.s, actions = senderstate.step(self.s, event, self.now)
        return actions

    def carry_out(self, actions: Sequence[object]) -> None:
        degraded = [a for a in actions if isinstance(a, Degraded)]
        assert len(degraded) <= 1
        for action in actions:
            if isinstance(action, Release):
                assert action.waiter in self.offset_of, "released a waiter never started"
                assert action.waiter not in self.released, "released twice"
                if action.replicated:
                    assert self.acked_ever >= self.offset_of[action.waiter]
                self.released[action.waiter] = action.replicated
        offsets = [self.offset_of[a.waiter] for a in actions if isinstance(a, Release)]
        assert offsets == sorted(offsets), "released out of offset order"

    @rule(target=sessions, tailing=st.booleans(), shared=st.integers(0, 5))
    def open_session(self, tailing: bool, shared: int) -> int:
        sid = self.next_id
        self.next_id += 1
        acked = min(shared, self.last)
        self.carry_out(self.step(SessionOpened(sid, f"n{sid}", "peer", acked)))
        self.acked_ever = max(self.acked_ever, acked)
        self.acked_by[sid] = acked
        if tailing:
            self.carry_out(self.step(SessionTailing(sid)))
        return sid

    @rule(sid=consumes(sessions))
    def close_session(self, sid: int) -> None:
        self.carry_out(self.step(SessionClosed(sid)))
        self.acked_by.pop(sid, None)

    @rule(n=st.integers(1, 3))
    def write(self, n: int) -> None:
        self.last += n

    @rule(target=waiters)
    def write_and_wait(self) -> int:
        """The job runtime's pattern: each write waits for its own offset."""
        self.last += 1
        return self.start_wait(self.last)

    @precondition(lambda self: self.last > 0)
    @rule(target=waiters, data=st.data())
    def wait(self, data: st.DataObject) -> int:
        # mostly writes not acked yet (those that are return at once)
        return self.start_wait(data.draw(st.integers(max(1, self.s.acked_offset - 1), self.last)))

    def start_wait(self, offset: int) -> int:
        waiter = self.next_id
        self.next_id += 1
        self.offset_of[waiter] = offset
        was_degraded = self.s.degraded
        actions = self.step(WaitStarted(waiter, offset))
        if was_degraded or self.s.config.mode == "async":
            assert actions == [Release(waiter, self.s.acked_offset >= offset)]  # no wait
        self.carry_out(actions)
        if actions and isinstance(actions[0], AwaitAck):
            assert actions[0].until == self.now + self.s.config.sync_timeout
        return waiter

    @rule(sid=sessions, data=st.data())
    def ack(self, sid: int, data: st.DataObject) -> None:
        # anywhere in the log, or the last offset (restores sync mode), or right at or
        # just below a pending waiter's offset
        near = sorted({self.last} | {w.offset + d for w in self.s.pending for d in (-1, 0)})
        pick_near = data.draw(st.booleans())
        if pick_near:
            offset = data.draw(st.sampled_from(near))
        else:
            offset = data.draw(st.integers(0, self.last))
        if sid in self.acked_by:
            self.acked_ever = max(self.acked_ever, offset)
        before = self.s.sessions[sid].acked if sid in self.s.sessions else None
        self.carry_out(self.step(AckReceived(sid, offset, self.last)))
        if before is not None:
            assert self.s.sessions[sid].acked == max(before, offset)  # never goes down
            self.acked_by[sid] = self.s.sessions[sid].acked

    @rule(waiter=consumes(waiters))
    def abandon(self, waiter: int) -> None:
        if waiter not in self.released:
            self.carry_out(self.step(WaitAbandoned(waiter)))
            self.released[waiter] = False  # gone: it must never be released now

    @rule(dt=st.sampled_from([0.0, 0.001, 0.01, 0.1, 0.3, 0.999, 1.0, 5.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.carry_out(self.step(Tick()))
        assert all(w.deadline > self.now for w in self.s.pending), "a deadline went by"

    @invariant()
    def degraded_means_no_waiter_pending(self) -> None:
        if self.s.degraded:
            assert not self.s.pending

    @invariant()
    def pending_waiters_are_unreleased_and_in_offset_order(self) -> None:
        offsets = [w.offset for w in self.s.pending]
        assert offsets == sorted(offsets)
        assert not {w.waiter for w in self.s.pending} & set(self.released)

    @invariant()
    def acked_offset_is_the_best_tailing_session(self) -> None:
        tailing = [s.acked for s in self.s.sessions.values() if s.tailing]
        assert self.s.acked_offset == max(tailing, default=0)


SenderMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40)
test_sender_state_machine = SenderMachine.TestCase
