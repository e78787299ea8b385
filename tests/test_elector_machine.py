"""The elector's machine (``electorstate``), driven by a fake clock.

The first tests walk its sequences one event at a time: win, publish, deadline,
``LeaseHeld``; keepalives moving the deadline; a deadline passing with no ack; a
lapsed lease; another holder. The last one is a hypothesis state machine: two nodes,
each an elector machine and a role machine (``rolestate``), share a simulated etcd
(leases that lapse ``ttl`` after the last keepalive it received, a leader key that
goes with its lease) under one fake clock, with requests that arrive late, get lost
before or after the witness applied them, and nodes that stop (and resign). It
checks the witness's promises: no write on a node whose lease may have lapsed, never
two open deadlines at one instant, jobs stopped before a node follows another.
Nothing here sleeps, opens a socket or reads a clock.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pagesift.core.ha import rolestate
from pagesift.core.ha.election import (
    EMPTY_NODE_GRACE,
    Candidate,
    Holder,
    PairState,
    keepalive_interval,
    poll_interval,
    write_deadline,
)
from pagesift.core.ha.electorstate import (
    CLOSED,
    Action,
    Campaign,
    CampaignLost,
    CheckPromoted,
    ElectorConfig,
    ElectorState,
    Emit,
    Event,
    Grant,
    KeepAlive,
    KeepaliveAcked,
    KeepaliveRefused,
    KeyVacant,
    LeaderSeen,
    LeaseGranted,
    PairStateRead,
    PromotionSettled,
    Publish,
    Published,
    PublishRefused,
    ReadLeader,
    ReadPairState,
    Request,
    Resign,
    ResumeGranting,
    SetDeadline,
    SleepUntil,
    Start,
    Stop,
    StopGranting,
    Tick,
    Unavailable,
    WakeAt,
    Warn,
    Woke,
    WriterPublished,
    lease_remaining,
    step,
    writable_lease,
)
from pagesift.core.ha.roles import Role

TTL = 3.0
T0 = 1000.0
CONFIG = ElectorConfig("a", "a:50051", TTL)
ME = Candidate("a", "h1", 10)
OTHER = Holder("b", "b:50051", "b:50052", epoch=7)
GRANT = Grant(id=0x51, epoch=9)
PUBLISHED = PairState("a", "h1", 9, 10, "async")


def run(state: ElectorState, *timed: tuple[Event, float]) -> tuple[ElectorState, list[Action]]:
    """Step every (event, now) in turn; the actions of the last one."""
    actions: list[Action] = []
    for event, now in timed:
        state, actions = step(state, event, now)
    return state, actions


def looking(now: float = T0) -> ElectorState:
    state, actions = step(ElectorState.initial(CONFIG), Start(), now)
    assert actions == [SetDeadline(CLOSED), ReadLeader()]
    return state


def campaigning(now: float = T0) -> ElectorState:
    state, actions = run(looking(now), (KeyVacant(), now), (PairStateRead(PUBLISHED, ME), now))
    assert actions == [Campaign()]
    return state


def holding(sent_at: float = T0, now: float = T0 + 0.1) -> ElectorState:
    """Won at ``sent_at``, promoted and published at ``now``: the deadline is open."""
    state, _ = run(
        campaigning(sent_at),
        (LeaseGranted(GRANT, sent_at), now),
        (PromotionSettled(primary=True), now),
        (Published(PUBLISHED, 1), now),
    )
    assert state.deadline == write_deadline(sent_at, TTL)
    return state


# --- the sequences ------------------------------------------------------------------------
def test_a_node_starts_with_its_deadline_closed_and_looks_at_the_leader_key() -> None:
    state, actions = step(ElectorState.initial(CONFIG), Start(), T0)
    assert actions == [SetDeadline(CLOSED), ReadLeader()]
    assert writable_lease(state, T0) is None
    assert step(state, Start(), T0)[1] == []  # one loop per node


def test_a_won_lease_promotes_then_publishes_then_opens_the_deadline_then_starts_jobs() -> None:
    state = campaigning()
    state, actions = step(state, LeaseGranted(GRANT, T0), T0 + 0.05)
    assert [type(a) for a in actions] == [Warn, Emit, CheckPromoted]
    assert actions[1] == Emit(rolestate.LeaseWon(GRANT.epoch))  # awaited: durable first
    assert state.deadline == CLOSED and state.leader == CONFIG.address

    state, actions = step(state, PromotionSettled(primary=True), T0 + 0.1)
    assert actions == [Publish(GRANT)]
    assert state.deadline == CLOSED  # nothing written before the state is published

    state, actions = step(state, Published(PUBLISHED, 1), T0 + 0.2)
    deadline = write_deadline(T0, TTL)  # from when the campaign left, not when it came back
    assert actions == [
        SetDeadline(deadline),
        WakeAt(deadline),
        Emit(rolestate.LeaseHeld(), wait=False),
        SleepUntil(T0 + 0.2 + keepalive_interval(TTL)),
    ]
    assert writable_lease(state, deadline - 0.001) == GRANT
    assert writable_lease(state, deadline) is None  # not at the deadline itself
    assert lease_remaining(state, T0 + 0.2) == deadline - (T0 + 0.2)


def test_each_acknowledged_keepalive_moves_the_deadline_from_when_it_was_sent() -> None:
    state = holding()
    t = T0 + 1.0
    state, actions = step(state, Woke(), t)
    assert actions == [KeepAlive(GRANT)]
    state, actions = step(state, KeepaliveAcked(sent_at=t), t + 0.4)  # a slow answer
    assert actions == [Publish(GRANT)]
    assert state.deadline == write_deadline(T0, TTL)  # not moved before the publish
    state, actions = step(state, Published(PUBLISHED, 2), t + 0.5)
    assert actions == [
        SetDeadline(write_deadline(t, TTL)),
        WakeAt(write_deadline(t, TTL)),
        SleepUntil(t + 0.5 + keepalive_interval(TTL)),  # no second LeaseHeld
    ]


def test_an_acknowledgement_that_comes_back_after_its_deadline_does_not_reopen_writes() -> None:
    state = holding()
    sent = T0 + 1.0
    late = write_deadline(sent, TTL) + 0.01
    state, actions = run(state, (Woke(), sent), (KeepaliveAcked(sent), late))
    state, actions = step(state, Published(PUBLISHED, 2), late)
    assert not any(isinstance(a, SetDeadline | Emit) for a in actions)
    assert writable_lease(state, late) is None


def test_no_ack_before_the_deadline_stops_the_jobs_and_leaves_writes_refused() -> None:
    state = holding()
    deadline = state.deadline
    # the witness does not answer: nothing ends by itself, the loop looks again soon
    state, actions = run(state, (Woke(), T0 + 1.0), (Unavailable("timeout"), T0 + 2.0))
    assert actions == [Warn("timeout"), SleepUntil(T0 + 2.0 + poll_interval(TTL))]
    assert state.lease == GRANT and state.deadline == deadline
    # a timer that fires early is set again; at the deadline the jobs stop
    assert step(state, Tick(), deadline - 0.001)[1] == [WakeAt(deadline)]
    state, actions = step(state, Tick(), deadline)
    assert actions == [Emit(rolestate.LeaseLost(), wait=False)]
    assert writable_lease(state, deadline) is None
    assert step(state, Tick(), deadline + 1)[1] == []  # said once
    # a later ack within a new deadline starts them again
    t = deadline + 0.5
    state, actions = run(state, (Woke(), t), (KeepaliveAcked(t), t), (Published(PUBLISHED, 2), t))
    assert Emit(rolestate.LeaseHeld(), wait=False) in actions


def test_an_unanswered_keepalive_past_the_deadline_stops_the_jobs_at_once() -> None:
    state = holding()
    late = state.deadline + 0.1
    state, actions = run(state, (Woke(), T0 + 1.0), (Unavailable("timeout"), late))
    assert actions == [
        Warn("timeout"),
        Emit(rolestate.LeaseLost(), wait=False),
        SleepUntil(late + poll_interval(TTL)),
    ]


def test_a_lapsed_lease_closes_the_deadline_then_resigns_then_reports_lease_lost() -> None:
    state = holding()
    t = T0 + 1.0
    state, actions = run(state, (Woke(), t), (KeepaliveRefused(), t))
    assert actions == [
        Warn("the witness says our lease lapsed: this node takes no write"),
        SetDeadline(CLOSED),
        Resign(GRANT),
        Emit(rolestate.LeaseLost()),
        SleepUntil(t),
    ]
    assert state.lease is None and state.deadline == CLOSED
    state, actions = step(state, Woke(), t)
    assert actions == [ReadLeader()]  # follows whoever holds the key now, or campaigns


def test_a_leader_key_no_longer_ours_ends_the_lease_the_same_way() -> None:
    state = holding()
    t = T0 + 1.0
    state, actions = run(state, (Woke(), t), (KeepaliveAcked(t), t), (PublishRefused(), t))
    assert actions[1:4] == [SetDeadline(CLOSED), Resign(GRANT), Emit(rolestate.LeaseLost())]


def test_a_promotion_that_did_not_happen_gives_the_lease_up_without_publishing() -> None:
    _, actions = run(
        campaigning(), (LeaseGranted(GRANT, T0), T0), (PromotionSettled(primary=False), T0)
    )
    assert not any(isinstance(a, Publish) for a in actions)
    assert actions[1:4] == [SetDeadline(CLOSED), Resign(GRANT), Emit(rolestate.LeaseLost())]


def test_another_holder_is_reported_once_per_epoch_and_followed() -> None:
    state, actions = step(looking(), LeaderSeen(OTHER), T0)
    assert actions == [
        Emit(rolestate.LeaderIs(OTHER.replication, OTHER.epoch)),
        SleepUntil(T0 + poll_interval(TTL)),
    ]
    assert state.leader == OTHER.address
    state, actions = run(state, (Woke(), T0 + 1), (LeaderSeen(OTHER), T0 + 1))
    assert actions == [SleepUntil(T0 + 1 + poll_interval(TTL))]
    newer = replace(OTHER, epoch=OTHER.epoch + 1)
    state, actions = run(state, (Woke(), T0 + 2), (LeaderSeen(newer), T0 + 2))
    assert actions[0] == Emit(rolestate.LeaderIs(newer.replication, newer.epoch))


def test_a_primary_that_sees_another_holder_stops_its_jobs_before_it_follows() -> None:
    role = rolestate.RoleState.initial(rolestate.RoleConfig(Role.STANDBY, witness=True))
    role, _ = rolestate.step(role, rolestate.Started(None, 0, 0, True), T0)
    for event in (rolestate.LeaseWon(9), rolestate.Promoted(9), rolestate.LeaseHeld()):
        role, _ = rolestate.step(role, event, T0)
    assert rolestate.takes_writes(role)
    # the lease lapsed (the node was frozen); the next look finds another holder
    state = holding()
    state, _ = run(state, (Woke(), T0 + 5), (KeepaliveRefused(), T0 + 5), (Woke(), T0 + 5))
    state, actions = step(state, LeaderSeen(OTHER), T0 + 5)
    (emit,) = [a for a in actions if isinstance(a, Emit)]
    role, role_actions = rolestate.step(role, emit.event, T0 + 5)
    kinds = [type(a) for a in role_actions]
    assert kinds.index(rolestate.StopJobs) < kinds.index(rolestate.StartFollower)
    assert not rolestate.takes_writes(role)


def test_an_empty_node_lets_a_node_with_data_go_first_and_says_why_once() -> None:
    empty = Candidate("a", "", 0)
    state, actions = run(looking(), (KeyVacant(), T0), (PairStateRead(None, empty), T0))
    assert actions == [
        Warn(
            "the leader key is vacant; not campaigning: "
            "an empty node lets a node with data go first"
        ),
        SleepUntil(T0 + poll_interval(TTL)),
    ]
    t = T0 + EMPTY_NODE_GRACE / 2
    state, actions = run(state, (Woke(), t), (KeyVacant(), t), (PairStateRead(None, empty), t))
    assert actions == [SleepUntil(t + poll_interval(TTL))]  # vacant since T0, said once
    t = T0 + EMPTY_NODE_GRACE
    state, actions = run(state, (Woke(), t), (KeyVacant(), t), (PairStateRead(None, empty), t))
    assert actions == [Campaign()]


def test_a_vacancy_ends_when_a_holder_appears() -> None:
    empty = Candidate("a", "", 0)
    state, _ = run(looking(), (KeyVacant(), T0), (PairStateRead(None, empty), T0))
    t = T0 + EMPTY_NODE_GRACE
    state, _ = run(state, (Woke(), t), (LeaderSeen(OTHER), t))
    state, actions = run(state, (Woke(), t), (KeyVacant(), t), (PairStateRead(None, empty), t))
    assert actions[-1] == SleepUntil(t + poll_interval(TTL))  # the grace starts again


def test_this_nodes_own_key_from_before_a_restart_is_waited_out() -> None:
    own = Holder("a", "a:50051", "a:50051", epoch=3)
    state, actions = step(looking(), LeaderSeen(own), T0)
    assert actions == [SleepUntil(T0 + poll_interval(TTL))]
    assert state.seen is None


def test_a_campaign_another_node_won_looks_again_at_once() -> None:
    state, actions = step(campaigning(), CampaignLost(), T0)
    assert actions == [SleepUntil(T0)]
    assert state.lease is None


def test_stop_closes_the_deadline_before_it_resigns() -> None:
    state, actions = step(holding(), Stop(), T0 + 1)
    assert actions == [SetDeadline(CLOSED), Resign(GRANT)]
    assert step(state, Woke(), T0 + 1)[1] == []  # nothing after it
    assert step(looking(), Stop(), T0)[1] == [SetDeadline(CLOSED)]


def test_the_out_of_sync_flag_follows_the_publish_the_witness_holds_last() -> None:
    behind = PairState("a", "h1", 9, 10, "sync", sync_standby="")
    in_sync = replace(behind, sync_standby="b")
    state = holding()
    state, _ = step(state, WriterPublished(behind, 3), T0 + 1)
    assert state.out_of_sync_published
    state, _ = step(state, WriterPublished(in_sync, 2), T0 + 1)  # an older publish, late
    assert state.out_of_sync_published
    state, _ = step(state, WriterPublished(in_sync, 4), T0 + 1)
    assert not state.out_of_sync_published


def test_an_answer_to_no_outstanding_request_changes_nothing() -> None:
    state = looking()
    for event in (Published(PUBLISHED, 1), KeepaliveAcked(T0), PromotionSettled(True), Woke()):
        assert step(state, event, T0) == (state, [])


def test_the_witness_going_down_is_warned_once() -> None:
    state, actions = step(looking(), Unavailable("down"), T0)
    assert actions == [SleepUntil(T0 + poll_interval(TTL))]  # never up yet: nothing to say
    state, _ = run(state, (Woke(), T0 + 1), (KeyVacant(), T0 + 1))
    assert state.up
    state, actions = step(state, Unavailable("down"), T0 + 1)
    assert actions[0] == Warn("down")
    state, actions = run(state, (Woke(), T0 + 2), (Unavailable("down"), T0 + 2))
    assert not any(isinstance(a, Warn) for a in actions)


# --- two nodes, one simulated witness -----------------------------------------------------
SIM_TTL = 2.0
NAMES = ("a", "b")


@dataclass
class SimWitness:
    """etcd as the elector sees it: a lease lapses ``ttl`` after the last keepalive
    it received; the leader key is deleted with its lease; its create revision is the
    epoch."""

    revision: int = 100
    leases: dict[int, float] = field(default_factory=dict)  # lease id -> lapses at
    key: tuple[str, int, int] | None = None  # (node, lease id, epoch)
    pair: PairState | None = None
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def expire(self, now: float) -> None:
        for lease, lapses in list(self.leases.items()):
            if now >= lapses:
                self.revoke(lease)

    def revoke(self, lease: int) -> None:
        self.leases.pop(lease, None)
        if self.key is not None and self.key[1] == lease:
            self.key = None

    def holder_lease(self, node: str, now: float) -> int | None:
        """The lease through which ``node`` holds the key at ``now``, if it does."""
        if self.key is None or self.key[0] != node:
            return None
        lapses = self.leases.get(self.key[1])
        return self.key[1] if lapses is not None and now < lapses else None


@dataclass
class SimNode:
    name: str
    elector: ElectorState
    role: rolestate.RoleState
    offset: int = 10
    log_deadline: float = CLOSED  # what the log refuses writes from
    waiting: tuple[Request, float] | None = None  # the request out, and when it left
    timer: float | None = None
    jobs: bool = False
    following: str = ""
    published_epoch: int = 0  # the epoch of the last publish answered
    stopped: bool = False
    writes: int = 0


class TwoNodesOneWitness(RuleBasedStateMachine):
    """Both nodes' shells as the real ones carry actions out, over ``SimWitness``."""

    @initialize()
    def start(self) -> None:
        self.now = T0
        self.witness = SimWitness()
        self.order = itertools.count(1)
        self.nodes: dict[str, SimNode] = {}
        for name in NAMES:
            config = rolestate.RoleConfig(Role.STANDBY, witness=True)
            node = SimNode(
                name,
                ElectorState.initial(ElectorConfig(name, f"{name}:1", SIM_TTL)),
                rolestate.RoleState.initial(config),
            )
            self.nodes[name] = node
            self.feed_role(node, rolestate.Started(None, 0, 0, True))
            self.step(node, Start())

    # --- the shells ---------------------------------------------------------------------
    def step(self, node: SimNode, event: Event) -> None:
        node.elector, actions = step(node.elector, event, self.now)
        requests = [i for i, a in enumerate(actions) if isinstance(a, Request)]
        assert requests in ([], [len(actions) - 1]), actions  # one request, the last action
        for action in actions:
            self.carry_out(node, action)

    def carry_out(self, node: SimNode, action: Action) -> None:
        match action:
            case SetDeadline(at):
                node.log_deadline = at
            case WakeAt(at):
                node.timer = at
            case Resign(grant):
                self.witness.revoke(grant.id)
            case Emit(event):
                if isinstance(event, rolestate.LeaseHeld):  # published, deadline open
                    lease = node.elector.lease
                    assert lease is not None and node.published_epoch == lease.epoch
                    assert node.log_deadline > self.now
                self.feed_role(node, event)
            case Warn() | StopGranting() | ResumeGranting():
                pass  # this model has no standby to give failsafe grants
            case _:
                assert node.waiting is None, (node.waiting, action)  # one loop per node
                node.waiting = (action, self.now)

    def feed_role(self, node: SimNode, event: rolestate.Event) -> None:
        node.role, actions = rolestate.step(node.role, event, self.now)
        for action in actions:
            match action:
                case rolestate.Promote(epoch):  # Node: durable, then Promoted
                    self.feed_role(node, rolestate.Promoted(max(epoch, node.role.epoch)))
                case rolestate.StartJobs():
                    assert not node.jobs
                    node.jobs = True
                case rolestate.StopJobs():
                    node.jobs = False
                case rolestate.StartFollower(target):
                    assert not node.jobs, "a node follows another only once its jobs stopped"
                    node.following = target
                case rolestate.StopFollower():
                    node.following = ""
                case rolestate.RefuseStart(reason):
                    raise AssertionError(reason)

    def answer(self, node: SimNode, request: Request, sent_at: float) -> Event:
        """The witness applies ``request`` now (at or after it left) and answers."""
        w = self.witness
        w.expire(self.now)
        match request:
            case ReadLeader():
                if w.key is None:
                    return KeyVacant()
                name, _, epoch = w.key
                return LeaderSeen(Holder(name, f"{name}:1", f"{name}:2", epoch))
            case ReadPairState():
                return PairStateRead(w.pair, Candidate(node.name, "h1", node.offset))
            case Campaign():
                lease = next(w.ids)
                w.leases[lease] = self.now + SIM_TTL
                if w.key is not None:
                    w.revoke(lease)
                    return CampaignLost()
                w.revision += 1
                w.key = (node.name, lease, w.revision)
                return LeaseGranted(Grant(lease, w.revision), sent_at)
            case CheckPromoted():
                return PromotionSettled(node.role.role == Role.PRIMARY)
            case KeepAlive(grant):
                if grant.id not in w.leases:
                    return KeepaliveRefused()
                w.leases[grant.id] = self.now + SIM_TTL
                return KeepaliveAcked(sent_at)
            case Publish(grant):
                if w.key is None or w.key[2] != grant.epoch:
                    return PublishRefused()
                w.pair = PairState(node.name, "h1", grant.epoch, node.offset, "async")
                node.published_epoch = grant.epoch
                return Published(w.pair, next(self.order))
            case SleepUntil():
                return Woke()
        raise AssertionError(request)

    # --- the world ----------------------------------------------------------------------
    @rule(dt=st.floats(0.0, 1.5 * SIM_TTL))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @rule(name=st.sampled_from(NAMES))
    def the_answer_arrives(self, name: str) -> None:
        node = self.nodes[name]
        if node.stopped or node.waiting is None:
            return
        request, sent_at = node.waiting
        if isinstance(request, SleepUntil) and self.now < request.at:
            return
        node.waiting = None
        self.step(node, self.answer(node, request, sent_at))

    @rule(rounds=st.integers(1, 30), dt=st.sampled_from([0.05, 0.1, 0.3]))
    def all_goes_well_for_a_while(self, rounds: int, dt: float) -> None:
        """Answers arrive, timers fire and jobs write, ``dt`` apart (the promises are
        checked at every instant)."""
        for _ in range(rounds):
            self.time_passes(dt)
            for name in NAMES:
                self.the_timer_fires(name)
                self.the_answer_arrives(name)
                self.a_job_writes(name)
                self.never_two_open_deadlines_at_one_instant()
                self.an_open_deadline_ends_before_the_lease_can_lapse()

    @rule(name=st.sampled_from(NAMES), applied=st.booleans())
    def the_witness_call_fails(self, name: str, applied: bool) -> None:
        node = self.nodes[name]
        if node.stopped or node.waiting is None:
            return
        request, sent_at = node.waiting
        if isinstance(request, SleepUntil | CheckPromoted):
            return
        node.waiting = None
        if applied:  # it reached the witness; the answer was lost
            self.answer(node, request, sent_at)
        self.step(node, Unavailable("timeout"))

    @rule(name=st.sampled_from(NAMES))
    def the_timer_fires(self, name: str) -> None:
        node = self.nodes[name]
        if node.stopped or node.timer is None or self.now < node.timer:
            return
        node.timer = None
        self.step(node, Tick())
        assert self.now < node.log_deadline or not node.jobs, "jobs on past the deadline"

    @rule(name=st.sampled_from(NAMES))
    def a_job_writes(self, name: str) -> None:
        node = self.nodes[name]
        if not node.jobs or self.now >= node.log_deadline:
            return  # no job runs, or the log refuses it
        node.writes += 1
        node.offset += 1
        lease = self.witness.holder_lease(name, self.now)
        assert lease is not None, "a write on a node whose lease may have lapsed"
        assert node.elector.lease is not None and node.elector.lease.id == lease

    @rule(name=st.sampled_from(NAMES))
    def the_node_stops(self, name: str) -> None:
        node = self.nodes[name]
        if node.stopped:
            return
        node.waiting = None
        self.step(node, Stop())
        self.feed_role(node, rolestate.Stopping())
        node.stopped = True

    # --- the promises -------------------------------------------------------------------
    @invariant()
    def never_two_open_deadlines_at_one_instant(self) -> None:
        if hasattr(self, "nodes"):
            open_now = [n.name for n in self.nodes.values() if self.now < n.log_deadline]
            assert len(open_now) <= 1, open_now

    @invariant()
    def an_open_deadline_ends_before_the_lease_can_lapse(self) -> None:
        if not hasattr(self, "nodes"):
            return
        for node in self.nodes.values():
            if self.now < node.log_deadline:
                lease = self.witness.holder_lease(node.name, self.now)
                assert lease is not None
                assert node.log_deadline < self.witness.leases[lease]

    @invariant()
    def a_running_node_always_has_its_next_look_due(self) -> None:
        if hasattr(self, "nodes"):
            for node in self.nodes.values():
                assert node.stopped or node.waiting is not None

    @invariant()
    def jobs_run_only_on_a_primary_that_holds_its_lease(self) -> None:
        if hasattr(self, "nodes"):
            for node in self.nodes.values():
                assert not node.jobs or rolestate.takes_writes(node.role)


TwoNodesOneWitness.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
test_two_nodes_sharing_a_witness_keep_its_promises = TwoNodesOneWitness.TestCase


def test_the_simulated_pair_elects_one_and_hands_over_when_it_stops() -> None:
    """The model itself works: one node wins and writes; stopped, the other takes over."""
    sim = TwoNodesOneWitness()
    sim.start()

    sim.all_goes_well_for_a_while(40, 0.1)
    (first,) = [n for n in sim.nodes.values() if n.jobs]
    assert first.writes > 0
    (second,) = [n for n in sim.nodes.values() if n is not first]
    assert second.following == f"{first.name}:2"
    sim.the_node_stops(first.name)
    sim.all_goes_well_for_a_while(40, 0.1)
    assert second.jobs and second.writes > 0
