"""A node's role as a pure state machine: start, auto-promotion, promotion, fencing.

What it owns
------------
``RoleState`` is the one place a running node's role lives (``Role``), with what the
role decisions need: the node's epoch as last reported, when the primary it follows
was last heard (``silent_since``), whether its history was ever synced, and what it
has running (jobs, follower, watchdog, fencer). ``step(state, event, now)`` applies one
event at the time ``now`` and returns the new state and the actions it calls for. It
does no I/O, reads no clock and never waits: ``pagesift.node.node.Node`` is the
asyncio shell that turns happenings into events (``now`` is ``time.monotonic()``) and
carries the actions out. Its events and actions are declared by
``pagesift.core.util.machine``'s convention (``EVENTS``, ``ACTIONS``). The tests drive
it with a fake clock (``tests/test_rolestate.py``).

What stays durable, and where
-----------------------------
The durable facts (epoch, history, fenced epoch, the role last recorded) belong to
``pagesift.core.replication.identity.Identity``, which writes them (WAL synced)
before they take effect; this machine never persists anything. They come in as the
fields of ``Started`` and ``Promoted``. The role itself is read from here and only
here (``Node.role``, the metrics, the Role RPC): the identity's own view
(``Log.role``, derived from its writability) cannot tell a former primary that now
follows the new one (a standby) from one still deposed, and knows nothing of what the
node runs.

The decisions
-------------
``Started(persisted_role, epoch, fenced_epoch, synced, has_credential)``:

- no replication credential: a standby refuses (``RefuseStart``); a primary warns;
- as primary: refuses a standby's data directory and a fenced one (a restart must not
  fork the history nor resurrect a deposed primary), else ``OpenForWrites`` then
  ``StartJobs``;
- as standby: ``StartFollower``, and with ``auto_promote_after`` a ``StartWatchdog``.

``PrimaryHeard``/``PrimarySilent`` (the watchdog's view of the follower's link) reset
or start the silence clock; ``Tick`` promotes (a warning ``LogLine`` then ``Promote``)
once the primary has been silent for ``auto_promote_after`` (``now - silent_since >=
after``, not an instant before), and never a standby that never synced a history.
UNSAFE without an outside witness: a primary that is alive but cut off keeps serving
until it is fenced. ``PromoteRequested`` asks for the same ``Promote``.

``Promoted(epoch)``: primary; ``StartJobs`` and, when the node knows the primary it
followed, ``StartFencer`` against it. ``HigherEpochSeen(epoch, by)`` on a primary:
fenced (``StopJobs``, reads only). Without a witness, fenced lasts until a restart as
a standby; with one, ``LeaderIs`` makes it the holder's standby and ``Promoted`` (a
lease won) its primary. ``FencerDone`` records that the fencer ended (a ``DEPOSED`` verdict arrives
as ``HigherEpochSeen`` through the sender). ``Stopping`` stops what runs; nothing
happens after it.

With a witness (``RoleConfig.witness``; ``pagesift.node.elector`` feeds these):

- ``Started``: neither role yet: a standby that follows nobody, and ``StartElection``.
  ``auto_promote_after`` is refused with a witness, and refused without one unless
  ``unsafe_auto_promote`` says so.
- ``LeaderIs(address, epoch)``: another node holds the lease. A standby follows it
  (``StartFollower``, or a new follower when the holder changed); a primary or a
  fenced node stops its jobs, records the holder's epoch as the one that fences it
  (``StepDown``), and follows it: it rejoins by itself, without a restart.
- ``LeaseWon(epoch)``: this node took the lease: ``Promote(epoch)`` (the epoch is
  the witness's). ``Promoted`` makes it the primary but starts no job yet:
- ``LeaseHeld``: the pair state is published and the write deadline set: the jobs
  start (again). ``LeaseLost``: the deadline passed with no keepalive acknowledged:
  the jobs stop (the log refuses writes already: it checks the deadline itself).

The guarantees
--------------
- ``StartJobs`` is never issued twice without a ``StopJobs`` between.
- Without a witness ``FENCED`` is absorbing: no event leaves it within one run. With
  one, only ``LeaderIs`` (it follows the holder) and ``Promoted`` (it won the lease)
  leave it.
- The epoch never goes down.
- At most one ``Promote`` per run; with a witness, at most one per lease won (a
  step-down in between allows the next).
- With a witness, jobs run only on a primary that holds its lease (``takes_writes``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from pagesift.core.ha import fencingrules
from pagesift.core.ha.fencingrules import FencingVerdict
from pagesift.core.ha.roles import Role
from pagesift.core.util.machine import Kinds, declare

#: The longest pause between two looks of the auto-promote watchdog.
WATCHDOG_MAX_INTERVAL = 0.5


@dataclass(frozen=True, slots=True)
class RoleConfig:
    requested: Role  # the role asked for at start (primary or standby)
    auto_promote_after: float = 0.0  # seconds of silence before auto-promoting; 0 = never
    former_primary: str = ""  # the primary a standby follows (fenced after a promotion)
    has_credential: bool = True  # a replication token or mTLS is configured
    witness: bool = False  # a witness's lease decides the role (``requested`` is ignored)
    unsafe_auto_promote: bool = False  # auto_promote_after allowed with no witness


@dataclass(frozen=True, slots=True)
class RoleState:
    config: RoleConfig
    role: Role
    epoch: int = 0  # this node's epoch, as last reported to the machine
    fenced_by: int = 0  # the higher epoch that deposed this node (FENCED)
    deposed_by: str = ""  # where the node that deposed us serves, if it said
    synced: bool = False  # the node holds a history (it completed a sync or was a primary)
    silent_since: float | None = None  # since when the followed primary is silent
    started: bool = False
    stopped: bool = False
    jobs_running: bool = False
    following: bool = False
    watching: bool = False  # the auto-promote watchdog runs
    promoting: bool = False  # a Promote was issued
    fencing: bool = False  # the fencer runs
    electing: bool = False  # the elector runs (witness mode)
    leased: bool = False  # witness mode: this primary holds the lease and may write
    leader: str = ""  # witness mode: the address of the holder this node follows

    @classmethod
    def initial(cls, config: RoleConfig) -> RoleState:
        return cls(config=config, role=config.requested)


EVENTS = Kinds("a role event")
ACTIONS = Kinds("a role action")


# --- events -----------------------------------------------------------------------------
@declare(EVENTS)
class Started:
    persisted_role: Role | None  # the role last recorded in the data directory
    epoch: int
    fenced_epoch: int
    synced: bool  # the data directory holds a history


@declare(EVENTS)
class PrimaryHeard:
    synced: bool


@declare(EVENTS)
class PrimarySilent:
    synced: bool


@declare(EVENTS)
class Tick: ...


@declare(EVENTS)
class PromoteRequested: ...


@declare(EVENTS)
class Promoted:
    epoch: int


@declare(EVENTS)
class HigherEpochSeen:
    epoch: int
    by: str = ""


@declare(EVENTS)
class FencerDone:
    verdict: FencingVerdict


@declare(EVENTS)
class LeaderIs:
    """Witness mode: another node holds the leader key; it replicates at ``address``."""

    address: str
    epoch: int


@declare(EVENTS)
class LeaseWon:
    """Witness mode: this node took the leader key, whose epoch is ``epoch``."""

    epoch: int


@declare(EVENTS)
class LeaseHeld:
    """Witness mode: the pair state is published and the write deadline set: the
    primary may write (again)."""


@declare(EVENTS)
class LeaseLost:
    """Witness mode: the write deadline passed with no keepalive acknowledged (the
    log already refuses writes: it checks the deadline itself)."""


@declare(EVENTS)
class Stopping: ...


Event = (
    Started
    | PrimaryHeard
    | PrimarySilent
    | Tick
    | PromoteRequested
    | Promoted
    | HigherEpochSeen
    | FencerDone
    | LeaderIs
    | LeaseWon
    | LeaseHeld
    | LeaseLost
    | Stopping
)
EVENTS.seal(Event)


# --- actions ----------------------------------------------------------------------------
@declare(ACTIONS)
class RefuseStart:
    reason: str


@declare(ACTIONS)
class LogLine:
    """A line for the node's log, at ``level`` (the shell writes it as it comes)."""

    level: int
    message: str


@declare(ACTIONS)
class OpenForWrites: ...


@declare(ACTIONS)
class StartJobs: ...


@declare(ACTIONS)
class StopJobs: ...


@declare(ACTIONS)
class StartFollower:
    target: str


@declare(ACTIONS)
class StopFollower: ...


@declare(ACTIONS)
class StartWatchdog:
    interval: float


@declare(ACTIONS)
class StopWatchdog: ...


@declare(ACTIONS)
class Promote:
    epoch: int = 0  # the lowest epoch to take (a witness's), 0 for the next one


@declare(ACTIONS)
class StartElection: ...


@declare(ACTIONS)
class StopElection: ...


@declare(ACTIONS)
class StepDown:
    """Witness mode: another node holds the lease at ``epoch``: record it as the epoch
    that fences this node (durably) before following it."""

    epoch: int


@declare(ACTIONS)
class StartFencer:
    former_primary: str


@declare(ACTIONS)
class StopFencer: ...


Action = (
    RefuseStart
    | LogLine
    | OpenForWrites
    | StartJobs
    | StopJobs
    | StartFollower
    | StopFollower
    | StartWatchdog
    | StopWatchdog
    | Promote
    | StartFencer
    | StopFencer
    | StartElection
    | StopElection
    | StepDown
)
ACTIONS.seal(Action)

NO_CREDENTIAL_STANDBY = (
    "a standby needs a replication credential: replication_token_file "
    "(the same file on both nodes) or replication_ca + replication_cert + "
    "replication_key (mTLS)"
)
NO_CREDENTIAL_PRIMARY = (
    "no replication credential (replication_token_file or mTLS): this node "
    "serves its log to nobody, so no standby can follow it"
)
UNSAFE_AUTO_PROMOTE = (
    "auto_promote_after without a witness lets a cut-off primary and the promoted "
    "standby both take writes: use --witness etcd://..., or say --unsafe-auto-promote"
)
AUTO_PROMOTE_WITH_WITNESS = (
    "auto_promote_after and a witness exclude each other: with a witness the lease "
    "decides when the standby takes over"
)
STANDBY_DATA = (
    "this data directory belongs to a standby: promote it (pagesift promote) "
    "or start it with --role standby; starting it as a primary would fork "
    "its primary's history"
)


def takes_writes(state: RoleState) -> bool:
    """The node is the primary and, with a witness, holds its lease (health's
    ``pagesift.primary``)."""
    return state.role == Role.PRIMARY and (state.leased or not state.config.witness)


def step(state: RoleState, event: Event, now: float) -> tuple[RoleState, list[Action]]:
    """Apply ``event`` at ``now``: the new state and the actions it calls for."""
    if state.stopped:
        return state, []
    match event:
        case Started():
            return _started(state, event)
        case PrimaryHeard(synced):
            return replace(state, silent_since=None, synced=state.synced or synced), []
        case PrimarySilent(synced):
            since = now if state.silent_since is None else state.silent_since
            return replace(state, silent_since=since, synced=state.synced or synced), []
        case Tick():
            return _tick(state, now)
        case PromoteRequested():
            if state.role != Role.STANDBY or not state.started or state.promoting:
                return state, []
            return replace(state, promoting=True), [Promote()]
        case Promoted(epoch):
            return _promoted(state, epoch)
        case HigherEpochSeen(epoch, by):
            return _higher_epoch(state, epoch, by)
        case FencerDone():
            return replace(state, fencing=False), []
        case LeaderIs(address, epoch):
            return _leader_is(state, address, epoch)
        case LeaseWon(epoch):
            return _lease_won(state, epoch)
        case LeaseHeld():
            return _lease_held(state)
        case LeaseLost():
            return _lease_lost(state)
        case Stopping():
            return _stopping(state)


def _started(state: RoleState, ev: Started) -> tuple[RoleState, list[Action]]:
    if state.started:
        return state, []
    cfg = state.config
    actions: list[Action] = []
    if cfg.auto_promote_after > 0 and cfg.witness:
        return state, [RefuseStart(AUTO_PROMOTE_WITH_WITNESS)]
    if cfg.auto_promote_after > 0 and not cfg.unsafe_auto_promote:
        return state, [RefuseStart(UNSAFE_AUTO_PROMOTE)]
    if not cfg.has_credential:
        if cfg.requested == Role.STANDBY or cfg.witness:
            return state, [RefuseStart(NO_CREDENTIAL_STANDBY)]
        actions.append(LogLine(logging.WARNING, NO_CREDENTIAL_PRIMARY))
    if cfg.witness:  # the lease decides: follow its holder, or take it (see the elector)
        electing = replace(
            state,
            role=Role.STANDBY,
            epoch=max(state.epoch, ev.epoch),
            synced=state.synced or ev.synced,
            started=True,
            electing=True,
        )
        return electing, [*actions, StartElection()]
    if cfg.requested == Role.PRIMARY:
        if ev.persisted_role == Role.STANDBY:
            return state, [*actions, RefuseStart(STANDBY_DATA)]
        if not fencingrules.may_accept_writes(ev.epoch, ev.fenced_epoch):
            reason = (
                f"refusing to start as a primary: fenced by epoch {ev.fenced_epoch} "
                f"(ours {ev.epoch}): rejoin as a standby of the new primary"
            )
            return state, [*actions, RefuseStart(reason)]
        started = replace(
            state,
            role=Role.PRIMARY,
            epoch=max(state.epoch, ev.epoch, 1),  # a new history starts at epoch 1
            synced=True,
            started=True,
            jobs_running=True,
        )
        return started, [*actions, OpenForWrites(), StartJobs()]
    actions.append(StartFollower(cfg.former_primary))
    watching = cfg.auto_promote_after > 0
    if watching:
        actions.append(StartWatchdog(min(WATCHDOG_MAX_INTERVAL, cfg.auto_promote_after / 4)))
    started = replace(
        state,
        role=Role.STANDBY,
        epoch=max(state.epoch, ev.epoch),
        synced=state.synced or ev.synced,
        started=True,
        following=True,
        watching=watching,
    )
    return started, actions


def _tick(state: RoleState, now: float) -> tuple[RoleState, list[Action]]:
    after = state.config.auto_promote_after
    if (
        state.role != Role.STANDBY
        or not state.watching
        or state.promoting
        or after <= 0
        or state.silent_since is None
        or not state.synced
    ):
        return state, []
    silent = now - state.silent_since
    if silent < after:
        return state, []
    warning = (
        f"the primary has been silent for {silent:.1f} s: auto-promoting (unsafe without "
        "an outside witness)"
    )
    return replace(state, promoting=True), [LogLine(logging.WARNING, warning), Promote()]


def _promoted(state: RoleState, epoch: int) -> tuple[RoleState, list[Action]]:
    witness = state.config.witness
    if state.role == Role.PRIMARY or (state.role == Role.FENCED and not witness):
        return state, []  # a primary already (promoting twice is harmless), or fenced
        # without a witness (fenced lasts until a restart as a standby)
    former = state.leader if witness else state.config.former_primary
    # with a witness the jobs start once the lease is published (LeaseHeld)
    start_jobs = not witness and not state.jobs_running
    actions: list[Action] = []
    if start_jobs:
        actions.append(StartJobs())
    if former and not state.fencing:
        actions.append(StartFencer(former))
    promoted = replace(
        state,
        role=Role.PRIMARY,
        epoch=max(state.epoch, epoch),
        synced=True,
        silent_since=None,
        promoting=True,  # one promotion per run (per lease, with a witness)
        following=False,  # the promoter stopped the follower
        jobs_running=state.jobs_running or start_jobs,
        fencing=state.fencing or bool(former),
    )
    return promoted, actions


def _leader_is(state: RoleState, address: str, epoch: int) -> tuple[RoleState, list[Action]]:
    if not state.config.witness or not state.started:
        return state, []
    if state.role == Role.STANDBY:
        if state.promoting or (state.following and state.leader == address):
            return state, []
        actions: list[Action] = [StopFollower()] if state.following else []
        return replace(state, following=True, leader=address), [*actions, StartFollower(address)]
    # a primary (or a fenced one) that another node's lease outranks: it follows that node
    actions = [
        LogLine(
            logging.WARNING,
            f"the witness names {address} (epoch {epoch}) the primary: this node takes no "
            "write and rejoins as its standby",
        )
    ]
    if state.jobs_running:
        actions.append(StopJobs())
    if state.fencing:
        actions.append(StopFencer())
    actions += [StepDown(epoch), StartFollower(address)]
    following = replace(
        state,
        role=Role.STANDBY,
        leased=False,
        jobs_running=False,
        fencing=False,
        promoting=False,
        following=True,
        leader=address,
        silent_since=None,
    )
    return following, actions


def _lease_won(state: RoleState, epoch: int) -> tuple[RoleState, list[Action]]:
    if not state.config.witness or state.role == Role.PRIMARY or state.promoting:
        return state, []  # a primary that won again keeps its epoch: nobody held it between
    return replace(state, promoting=True), [Promote(epoch)]


def _lease_held(state: RoleState) -> tuple[RoleState, list[Action]]:
    if state.role != Role.PRIMARY or not state.config.witness:
        return state, []
    actions: list[Action] = [] if state.jobs_running else [StartJobs()]
    return replace(state, leased=True, jobs_running=True), actions


def _lease_lost(state: RoleState) -> tuple[RoleState, list[Action]]:
    if state.role != Role.PRIMARY or not state.leased:
        return state, []
    actions: list[Action] = [
        LogLine(
            logging.WARNING,
            "the witness lease may have lapsed: this primary takes no write (reads go on) "
            "until it renews the lease or another node takes it",
        )
    ]
    if state.jobs_running:
        actions.append(StopJobs())
    return replace(state, leased=False, jobs_running=False), actions


def _higher_epoch(state: RoleState, epoch: int, by: str) -> tuple[RoleState, list[Action]]:
    if state.role != Role.PRIMARY or epoch <= state.epoch:
        return state, []  # a standby adopts epochs by following; fenced stays fenced
    rejoin = (
        "it rejoins as a standby once the witness names the new primary"
        if state.config.witness
        else f"restart it with --role standby --primary {by or '<the promoted node>'} to rejoin"
    )
    warning = f"fenced by epoch {epoch}: this primary stops writing; {rejoin}"
    actions: list[Action] = [LogLine(logging.WARNING, warning)]
    if state.jobs_running:
        actions.append(StopJobs())
    fenced = replace(
        state,
        role=Role.FENCED,
        fenced_by=epoch,
        deposed_by=by,
        jobs_running=False,
        leased=False,
    )
    return fenced, actions


def _stopping(state: RoleState) -> tuple[RoleState, list[Action]]:
    actions: list[Action] = []
    if state.electing:
        actions.append(StopElection())
    if state.watching:
        actions.append(StopWatchdog())
    if state.fencing:
        actions.append(StopFencer())
    if state.following:
        actions.append(StopFollower())
    if state.jobs_running:
        actions.append(StopJobs())
    stopped = replace(
        state,
        stopped=True,
        electing=False,
        leased=False,
        watching=False,
        fencing=False,
        following=False,
        jobs_running=False,
    )
    return stopped, actions
