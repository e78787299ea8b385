"""A node's role machine (``rolestate``), driven by a fake clock.

``step`` takes events and ``now`` and returns actions; nothing here sleeps, opens a
socket or reads a clock.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pagesift.core.ha.fencingrules import FencingVerdict
from pagesift.core.ha.roles import Role
from pagesift.core.ha.rolestate import (
    Action,
    Event,
    FencerDone,
    HigherEpochSeen,
    LeaderIs,
    LeaseHeld,
    LeaseLost,
    LeaseWon,
    LogLine,
    OpenForWrites,
    PrimaryHeard,
    PrimarySilent,
    Promote,
    Promoted,
    PromoteRequested,
    RefuseStart,
    RoleConfig,
    RoleState,
    Started,
    StartElection,
    StartFencer,
    StartFollower,
    StartJobs,
    StartWatchdog,
    StepDown,
    StopElection,
    StopFencer,
    StopFollower,
    StopJobs,
    Stopping,
    StopWatchdog,
    Tick,
    step,
    takes_writes,
)

AFTER = 10.0
PRIMARY = RoleConfig(requested=Role.PRIMARY)
STANDBY = RoleConfig(
    requested=Role.STANDBY,
    auto_promote_after=AFTER,
    former_primary="old:1",
    unsafe_auto_promote=True,
)
WITNESS = RoleConfig(requested=Role.PRIMARY, witness=True)


def run(state: RoleState, *events: tuple[Event, float]) -> tuple[RoleState, list[list[Action]]]:
    out = []
    for event, now in events:
        state, actions = step(state, event, now)
        out.append(actions)
    return state, out


def started(config: RoleConfig, *, epoch: int = 1, synced: bool = True) -> RoleState:
    persisted = Role.PRIMARY if config.requested == Role.PRIMARY else Role.STANDBY
    state, _ = step(RoleState.initial(config), Started(persisted, epoch, 0, synced), 0.0)
    return state


def kinds(actions: list[Action]) -> list[type]:
    return [type(a) for a in actions]


# --- start ------------------------------------------------------------------------------
def test_a_primary_opens_its_log_then_starts_jobs() -> None:
    state, actions = step(RoleState.initial(PRIMARY), Started(None, 0, 0, False), 0.0)
    assert actions == [OpenForWrites(), StartJobs()]
    assert (state.role, state.epoch, state.jobs_running) == (Role.PRIMARY, 1, True)


def test_a_standbys_data_directory_refuses_to_start_as_a_primary() -> None:
    state0 = RoleState.initial(PRIMARY)
    state, actions = step(state0, Started(Role.STANDBY, 1, 0, True), 0.0)
    assert state == state0
    assert len(actions) == 1 and isinstance(actions[0], RefuseStart)
    assert "belongs to a standby" in actions[0].reason


def test_a_fenced_data_directory_refuses_to_start_as_a_primary() -> None:
    state0 = RoleState.initial(PRIMARY)
    state, actions = step(state0, Started(Role.FENCED, 1, 2, True), 0.0)
    assert state == state0
    assert actions == [
        RefuseStart(
            "refusing to start as a primary: fenced by epoch 2 (ours 1): "
            "rejoin as a standby of the new primary"
        )
    ]


def test_a_fenced_data_directory_that_followed_the_new_epoch_starts_as_a_primary() -> None:
    _, actions = step(RoleState.initial(PRIMARY), Started(Role.PRIMARY, 2, 2, True), 0.0)
    assert actions == [OpenForWrites(), StartJobs()]


def test_without_a_credential_a_standby_refuses_and_a_primary_warns() -> None:
    sb = RoleState.initial(replace(STANDBY, has_credential=False))
    _, actions = step(sb, Started(None, 0, 0, False), 0.0)
    assert len(actions) == 1 and isinstance(actions[0], RefuseStart)
    assert "a standby needs a replication credential" in actions[0].reason

    p = RoleState.initial(replace(PRIMARY, has_credential=False))
    _, actions = step(p, Started(None, 0, 0, False), 0.0)
    assert kinds(actions) == [LogLine, OpenForWrites, StartJobs]
    assert isinstance(actions[0], LogLine) and actions[0].level == logging.WARNING


def test_a_standby_follows_and_watches_only_with_auto_promote() -> None:
    _, actions = step(RoleState.initial(STANDBY), Started(Role.STANDBY, 1, 0, True), 0.0)
    assert actions == [StartFollower("old:1"), StartWatchdog(0.5)]
    plain = RoleState.initial(replace(STANDBY, auto_promote_after=0.0))
    state, actions = step(plain, Started(None, 0, 0, False), 0.0)
    assert actions == [StartFollower("old:1")] and state.role == Role.STANDBY
    quick = RoleState.initial(replace(STANDBY, auto_promote_after=1.0))
    _, actions = step(quick, Started(None, 0, 0, False), 0.0)
    assert actions[-1] == StartWatchdog(0.25)


def test_a_second_start_does_nothing() -> None:
    state = started(PRIMARY)
    assert step(state, Started(Role.PRIMARY, 1, 0, True), 1.0) == (state, [])


# --- auto-promotion ---------------------------------------------------------------------
def test_auto_promote_exactly_after_the_silence_and_not_before() -> None:
    state = started(STANDBY)
    state, out = run(
        state,
        (PrimaryHeard(True), 1.0),
        (Tick(), 1.0),
        (PrimarySilent(True), 5.0),  # the silence starts here
        (Tick(), 5.0),
        (PrimarySilent(True), 14.9),
        (Tick(), 14.9),
    )
    assert all(a == [] for a in out)
    state, actions = step(state, Tick(), 5.0 + AFTER)
    assert kinds(actions) == [LogLine, Promote]
    assert isinstance(actions[0], LogLine) and actions[0].level == logging.WARNING
    assert "silent for 10.0 s: auto-promoting (unsafe" in actions[0].message
    # one Promote per run, however long the silence lasts
    assert step(state, Tick(), 100.0)[1] == []


def test_a_reconnect_resets_the_silence_clock() -> None:
    state = started(STANDBY)
    state, out = run(
        state,
        (PrimarySilent(True), 0.0),
        (Tick(), 9.0),
        (PrimaryHeard(True), 9.5),
        (PrimarySilent(True), 10.0),  # silent again: counts from here
        (Tick(), 19.9),
    )
    assert all(a == [] for a in out)
    assert kinds(step(state, Tick(), 20.0)[1]) == [LogLine, Promote]


def test_never_auto_promote_a_standby_that_never_synced() -> None:
    state = started(STANDBY, synced=False)
    state, out = run(state, (PrimarySilent(False), 0.0), (Tick(), 1000.0))
    assert out == [[], []]
    # a sync that completed between two looks counts
    state, _ = step(state, PrimarySilent(True), 1001.0)
    assert kinds(step(state, Tick(), 1001.0)[1]) == [LogLine, Promote]


def test_no_auto_promote_without_the_setting_nor_on_a_primary() -> None:
    plain = started(replace(STANDBY, auto_promote_after=0.0))
    _, out = run(plain, (PrimarySilent(True), 0.0), (Tick(), 1e9))
    assert out == [[], []]
    primary = started(PRIMARY)
    _, out = run(primary, (PrimarySilent(True), 0.0), (Tick(), 1e9))
    assert out == [[], []]


# --- promotion and fencing --------------------------------------------------------------
def test_promote_request_then_promoted_starts_jobs_and_the_fencer() -> None:
    state = started(STANDBY)
    state, actions = step(state, PromoteRequested(), 1.0)
    assert actions == [Promote()]
    assert step(state, PromoteRequested(), 1.5)[1] == []  # asked once
    state, actions = step(state, Promoted(2), 2.0)
    assert actions == [StartJobs(), StartFencer("old:1")]
    assert (state.role, state.epoch, state.jobs_running, state.fencing) == (
        Role.PRIMARY,
        2,
        True,
        True,
    )
    assert step(state, Promoted(2), 3.0) == (state, [])  # promoting twice is harmless
    state, actions = step(state, FencerDone(FencingVerdict.DONE), 4.0)
    assert actions == [] and not state.fencing and state.role == Role.PRIMARY


def test_a_standby_without_a_known_primary_starts_no_fencer() -> None:
    state = started(replace(STANDBY, former_primary=""))
    _, actions = step(state, Promoted(2), 1.0)
    assert actions == [StartJobs()]


def test_a_higher_epoch_fences_a_primary_for_good() -> None:
    state = started(PRIMARY, epoch=1)
    assert step(state, HigherEpochSeen(1, "x"), 1.0) == (state, [])  # not higher
    state, actions = step(state, HigherEpochSeen(2, "new:1"), 1.0)
    assert kinds(actions) == [LogLine, StopJobs]
    assert isinstance(actions[0], LogLine) and "--primary new:1" in actions[0].message
    assert (state.role, state.fenced_by, state.deposed_by) == (Role.FENCED, 2, "new:1")
    for event in (
        Promoted(3),
        PromoteRequested(),
        HigherEpochSeen(5),
        LeaseWon(9),
        PrimarySilent(True),
        Tick(),
    ):
        state, actions = step(state, event, 100.0)
        assert actions == [] and state.role == Role.FENCED


def test_a_promoted_node_deposed_by_a_newer_primary_is_fenced() -> None:
    state = started(STANDBY)
    state, _ = step(state, Promoted(2), 1.0)
    state, actions = step(state, HigherEpochSeen(3, ""), 2.0)
    assert kinds(actions) == [LogLine, StopJobs] and state.role == Role.FENCED
    assert isinstance(actions[0], LogLine) and "<the promoted node>" in actions[0].message


def test_a_standby_ignores_higher_epochs_it_follows() -> None:
    state = started(STANDBY)
    assert step(state, HigherEpochSeen(9), 1.0) == (state, [])


def test_witness_events_change_nothing_without_a_witness() -> None:
    for config in (PRIMARY, STANDBY):
        state = started(config)
        for event in (LeaderIs("b:1", 9), LeaseWon(9), LeaseHeld(), LeaseLost()):
            assert step(state, event, 1.0) == (state, [])


def test_auto_promote_without_a_witness_needs_the_unsafe_flag() -> None:
    unsafe_off = RoleState.initial(replace(STANDBY, unsafe_auto_promote=False))
    _, actions = step(unsafe_off, Started(None, 0, 0, False), 0.0)
    assert kinds(actions) == [RefuseStart]
    assert isinstance(actions[0], RefuseStart) and "--unsafe-auto-promote" in actions[0].reason
    with_witness = RoleState.initial(replace(WITNESS, auto_promote_after=5.0))
    _, actions = step(with_witness, Started(None, 0, 0, False), 0.0)
    assert isinstance(actions[0], RefuseStart) and "exclude each other" in actions[0].reason


# --- with a witness: the lease decides ----------------------------------------------------
def test_with_a_witness_a_node_starts_as_neither_role_and_elects() -> None:
    for persisted in (None, Role.PRIMARY, Role.STANDBY, Role.FENCED):
        state, actions = step(RoleState.initial(WITNESS), Started(persisted, 3, 0, True), 0.0)
        assert actions == [StartElection()]
        assert (state.role, state.following, takes_writes(state)) == (Role.STANDBY, False, False)


def test_with_a_witness_a_standby_follows_the_holder_and_a_new_one() -> None:
    state = started(WITNESS)
    state, actions = step(state, LeaderIs("a:1", 5), 1.0)
    assert actions == [StartFollower("a:1")] and state.leader == "a:1"
    assert step(state, LeaderIs("a:1", 5), 2.0) == (state, [])
    state, actions = step(state, LeaderIs("b:1", 8), 3.0)
    assert actions == [StopFollower(), StartFollower("b:1")]


def test_a_won_lease_promotes_and_jobs_start_only_once_it_is_held() -> None:
    state, _ = step(started(WITNESS), LeaderIs("a:1", 5), 1.0)
    state, actions = step(state, LeaseWon(9), 2.0)
    assert actions == [Promote(9)]
    assert step(state, LeaseWon(9), 2.1) == (state, [])  # one promotion per lease
    state, actions = step(state, Promoted(9), 2.2)
    assert actions == [StartFencer("a:1")]  # the former holder: no job before LeaseHeld
    assert state.role == Role.PRIMARY and not takes_writes(state)
    state, actions = step(state, LeaseHeld(), 2.3)
    assert actions == [StartJobs()] and takes_writes(state)
    assert step(state, LeaseHeld(), 2.4) == (state, [])


def test_a_lapsed_lease_stops_the_jobs_and_a_renewed_one_restarts_them() -> None:
    state, _ = step(started(WITNESS), LeaseWon(4), 1.0)
    state, _ = step(state, Promoted(4), 1.0)
    state, _ = step(state, LeaseHeld(), 1.0)
    state, actions = step(state, LeaseLost(), 5.0)
    assert kinds(actions) == [LogLine, StopJobs] and state.role == Role.PRIMARY
    assert not takes_writes(state)
    assert step(state, LeaseLost(), 6.0) == (state, [])
    state, actions = step(state, LeaseHeld(), 7.0)
    assert actions == [StartJobs()] and takes_writes(state)


def test_a_primary_that_another_holder_outranks_steps_down_and_follows_it() -> None:
    state, _ = step(started(WITNESS), LeaderIs("a:1", 5), 1.0)
    for event in (LeaseWon(9), Promoted(9), LeaseHeld()):
        state, _ = step(state, event, 2.0)
    state, actions = step(state, LeaderIs("a:1", 12), 3.0)
    assert kinds(actions) == [LogLine, StopJobs, StopFencer, StepDown, StartFollower]
    assert actions[-2:] == [StepDown(12), StartFollower("a:1")]
    assert (state.role, state.jobs_running, state.following) == (Role.STANDBY, False, True)
    state, actions = step(state, LeaseWon(15), 4.0)  # it may win the next lease
    assert actions == [Promote(15)]


def test_with_a_witness_a_fenced_node_rejoins_the_holder() -> None:
    state, _ = step(started(WITNESS), LeaseWon(4), 1.0)
    for event in (Promoted(4), LeaseHeld()):
        state, _ = step(state, event, 1.0)
    state, actions = step(state, HigherEpochSeen(7, "b:1"), 2.0)
    assert state.role == Role.FENCED and "once the witness names" in str(actions[0])
    state, actions = step(state, LeaderIs("b:1", 7), 3.0)
    assert actions[-2:] == [StepDown(7), StartFollower("b:1")] and state.role == Role.STANDBY


def test_stopping_a_witness_node_stops_its_election() -> None:
    state, _ = step(started(WITNESS), LeaderIs("a:1", 5), 1.0)
    _, actions = step(state, Stopping(), 2.0)
    assert actions == [StopElection(), StopFollower()]


def test_stopping_stops_what_runs_and_then_nothing_happens() -> None:
    state = started(STANDBY)
    state, actions = step(state, Stopping(), 1.0)
    assert actions == [StopWatchdog(), StopFollower()]
    assert step(state, PromoteRequested(), 2.0) == (state, [])
    promoted, _ = step(started(STANDBY), Promoted(2), 1.0)
    _, actions = step(promoted, Stopping(), 2.0)
    assert actions == [StopWatchdog(), StopFencer(), StopJobs()]


# --- the invariants, under any order of events ------------------------------------------
EVENTS = st.one_of(
    st.builds(PrimaryHeard, st.booleans()),
    st.builds(PrimarySilent, st.booleans()),
    st.just(Tick()),
    st.just(PromoteRequested()),
    st.builds(Promoted, st.integers(0, 6)),
    st.builds(HigherEpochSeen, st.integers(0, 6), st.sampled_from(["", "b:1"])),
    st.builds(FencerDone, st.sampled_from(list(FencingVerdict))),
    st.builds(LeaderIs, st.sampled_from(["a:1", "b:1"]), st.integers(0, 9)),
    st.builds(LeaseWon, st.integers(0, 9)),
    st.just(LeaseHeld()),
    st.just(LeaseLost()),
    st.just(Stopping()),
)


class RoleMachine(RuleBasedStateMachine):
    state: RoleState
    now: float
    jobs: bool
    fenced: bool
    promotes: int
    epoch: int
    step_downs: int

    @initialize(
        requested=st.sampled_from([Role.PRIMARY, Role.STANDBY]),
        after=st.sampled_from([0.0, 1.0, 10.0]),
        credential=st.booleans(),
        persisted=st.sampled_from([None, Role.PRIMARY, Role.STANDBY, Role.FENCED]),
        epoch=st.integers(0, 3),
        fenced_epoch=st.integers(0, 4),
        synced=st.booleans(),
        witness=st.booleans(),
    )
    def start(
        self,
        requested: Role,
        after: float,
        credential: bool,
        persisted: Role | None,
        epoch: int,
        fenced_epoch: int,
        synced: bool,
        witness: bool,
    ) -> None:
        config = RoleConfig(
            requested,
            0.0 if witness else after,
            "a:1",
            credential,
            witness=witness,
            unsafe_auto_promote=True,
        )
        self.state, self.now = RoleState.initial(config), 0.0
        self.jobs, self.fenced, self.promotes, self.epoch = False, False, 0, 0
        self.step_downs = 0
        self.apply(Started(persisted, epoch, fenced_epoch, synced))

    def apply(self, event: Event) -> None:
        self.state, actions = step(self.state, event, self.now)
        for action in actions:
            if isinstance(action, StartJobs):
                assert not self.jobs, "StartJobs twice without StopJobs"
                self.jobs = True
            elif isinstance(action, StopJobs):
                assert self.jobs
                self.jobs = False
            elif isinstance(action, Promote):
                self.promotes += 1
            elif isinstance(action, StepDown):
                self.step_downs += 1
        assert self.state.jobs_running == self.jobs

    @rule(event=EVENTS, dt=st.floats(0.0, 6.0))
    def event(self, event: Event, dt: float) -> None:
        self.now += dt
        self.apply(event)

    @invariant()
    def fenced_is_absorbing_without_a_witness(self) -> None:
        if self.fenced and not self.state.config.witness:
            assert self.state.role == Role.FENCED
        self.fenced = self.state.role == Role.FENCED

    @invariant()
    def the_epoch_never_goes_down(self) -> None:
        assert self.state.epoch >= self.epoch
        self.epoch = self.state.epoch

    @invariant()
    def at_most_one_promotion_per_step_down(self) -> None:
        assert self.promotes <= 1 + self.step_downs

    @invariant()
    def jobs_run_only_on_a_primary_that_takes_writes(self) -> None:
        assert not self.jobs or (self.state.role == Role.PRIMARY and takes_writes(self.state))


TestRoleMachine = RoleMachine.TestCase
TestRoleMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
