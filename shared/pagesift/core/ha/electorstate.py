"""The elector as a pure state machine: when to look, campaign, keep alive, publish, write.

What it owns
------------
``ElectorState`` is everything a node's witness loop decides from: the lease it holds
(``Grant``), its write deadline, what it is waiting for, the holder it last reported,
and the figures (witness up, leader, takeover lag). ``step(state, event, now)``
returns the new state and the actions, in the order the shell must carry them out.
Without a lease it looks every ``poll_interval``: a vacant key, then the pair state,
then ``may_campaign``. With one: a keepalive every ``keepalive_interval``; each grant
or keepalive acknowledged, once the pair state is published after it, moves the
deadline to ``write_deadline(sent_at)``.
No I/O, no clock, no asyncio: ``pagesift.node.elector`` reads ``time.monotonic()``
once per event (and once as a request leaves: its ``sent_at``). Every request
(``ReadLeader``...``KeepAlive``, ``SleepUntil``) is the last action of its batch and
is answered by exactly one event; every answer issues the next request, so the loop
never stalls. ``Tick`` (a ``WakeAt`` timer) and ``WriterPublished`` issue none.
The events and actions are declared by ``pagesift.core.util.machine``'s convention
(``EVENTS``, ``ACTIONS``).

The guarantees, by construction
-------------------------------
- ``Start`` sets the deadline ``CLOSED`` (``-inf``, every write refused) first.
- An open deadline is only ever ``election.write_deadline(sent_at, ttl)`` of a grant or
  keepalive of the lease held, set after that lease's pair state was published and
  only while it lies ahead of ``now``; ``LeaseHeld`` follows it in the same batch.
- Losing the lease (refused keepalive or publish, failed promotion, ``Stop``) closes
  the deadline first, then resigns; ``LeaseLost`` goes out when the lease is given up
  or when a ``Tick`` finds the deadline passed with no acknowledged keepalive.
- ``LeaderIs`` goes out once per holder and epoch seen, only while holding no lease;
  the role machine stops the jobs before it follows (``rolestate._leader_is``).

Failsafe (``ElectorConfig.failsafe``; the rule and its proof are ``failsafe``'s)
-------------------------------------------------------------------------------
- The deadline is the later of the lease's (``lease_deadline``, as above) and
  ``failsafe.failsafe_deadline`` over ``members`` (the standbys of every publish sent
  since the last one acknowledged, and of that one) and ``grants`` (``GrantAcked``:
  each member's latest answered request). Grants count only while ``members`` is
  non-empty, i.e. after a publish under a lease of this node; every way out of the
  primary's role (giving up, another holder seen or winning the key, ``Stop``)
  clears both, and the deadline closes first.
- A lease found lapsed (``KeepaliveRefused``, ``PublishRefused``) while a grant still
  covers ``now``: the deadline becomes the grants' alone, the old lease is resigned
  and the key is campaigned for at once, without ``LeaseLost`` (the jobs go on); a
  campaign lost then closes the deadline. Without a grant: ``LeaseLost``.
- A campaign: ``may_campaign`` gets the promise left (``Candidate.promised_until``,
  and one ttl after ``Start``: the promises a previous run of this node gave), and
  ``StopGranting`` goes out before ``Campaign`` in the same batch, so the follower
  gives no promise once the check passed; ``ResumeGranting`` once the node holds no
  lease and no campaign is under way.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from pagesift.core.ha import election, failsafe, rolestate
from pagesift.core.ha.election import Candidate, Holder, PairState
from pagesift.core.util.machine import Kinds, declare

#: The deadline of a node that holds no lease: every write is refused.
CLOSED = float("-inf")


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease this node holds: its witness id and the epoch of its leader key."""

    id: int
    epoch: int


class Waiting(enum.Enum):
    """The one request the loop has outstanding."""

    NOTHING = "nothing"  # not started, or stopped
    LEADER = "leader"
    PAIR_STATE = "pair state"
    CAMPAIGN = "campaign"
    PROMOTION = "promotion"
    PUBLISH = "publish"
    KEEPALIVE = "keepalive"
    SLEEP = "sleep"


@dataclass(frozen=True, slots=True)
class ElectorConfig:
    node_id: str
    address: str  # where this node serves clients (the figures' leader once it wins)
    ttl: float  # the lease's ttl, whole seconds as the witness grants it
    failsafe: bool = False  # write past the lease on the standbys' grants (``failsafe``)


@dataclass(frozen=True, slots=True)
class ElectorState:
    config: ElectorConfig
    waiting: Waiting = Waiting.NOTHING
    lease: Grant | None = None
    deadline: float = CLOSED  # the log's write deadline, as last set
    lease_deadline: float = CLOSED  # the part of it the lease alone vouches for
    acked_sent_at: float = CLOSED  # the grant or keepalive acknowledged, not yet published
    held: bool = False  # LeaseHeld went out since the last LeaseLost
    vacant_since: float | None = None
    seen: tuple[str, int] | None = None  # the holder last reported (replication, epoch)
    why_not: str = ""  # the last reason not to campaign, logged once
    out_of_sync_published: bool = False  # sync mode: the witness names no sync standby
    published_order: int = 0  # the order of the publish the flag above comes from
    behind: int = 0  # the verdict of the campaign under way
    up: bool = False  # the last answer from the witness was not an error
    leader: str = ""  # the holder's client address, as last read
    takeover_behind: int = 0  # entries behind the pair state at the last takeover
    members: frozenset[str] = frozenset()  # failsafe: the standbys whose grants count
    attempted: int = 0  # the order of the last publish sent (``PublishAttempted``)
    grants: tuple[tuple[str, float], ...] = ()  # failsafe: (standby, sent_at answered)
    restart_promise: float = CLOSED  # no campaign before (the promises of a previous run)

    @classmethod
    def initial(cls, config: ElectorConfig) -> ElectorState:
        return cls(config=config)


EVENTS = Kinds("an elector event")
ACTIONS = Kinds("an elector action")


# --- events -----------------------------------------------------------------------------
@declare(EVENTS)
class Start:
    pass


@declare(EVENTS)
class LeaderSeen:
    """``ReadLeader``: ``holder`` holds the leader key (maybe this node, from before a restart)."""

    holder: Holder


@declare(EVENTS)
class KeyVacant:
    """``ReadLeader``: nobody holds the leader key."""


@declare(EVENTS)
class PairStateRead:
    """``ReadPairState``: the pair state, and this node as a candidate now."""

    state: PairState | None
    candidate: Candidate


@declare(EVENTS)
class LeaseGranted:
    """``Campaign``: the key is ours under ``lease``; the campaign left at ``sent_at``."""

    lease: Grant
    sent_at: float


@declare(EVENTS)
class CampaignLost:
    """``Campaign``: another node holds the key."""


@declare(EVENTS)
class PromotionSettled:
    """``CheckPromoted``: whether the role machine made this node the primary."""

    primary: bool


@declare(EVENTS)
class Published:
    """``Publish``: ``state`` is in the witness; ``order`` counts the node's publishes."""

    state: PairState
    order: int


@declare(EVENTS)
class PublishRefused:
    """``Publish``: the leader key is no longer this lease's."""


@declare(EVENTS)
class KeepaliveAcked:
    """``KeepAlive``: the witness refreshed the lease; the keepalive left at ``sent_at``."""

    sent_at: float


@declare(EVENTS)
class KeepaliveRefused:
    """``KeepAlive``: the witness says the lease lapsed."""


@declare(EVENTS)
class Unavailable:
    """Any request: the witness did not answer in time (or answered with an error)."""

    why: str


@declare(EVENTS)
class Woke:
    """``SleepUntil``: the pause is over."""


@declare(EVENTS)
class Tick:
    """A ``WakeAt`` timer fired (the deadline may have passed)."""


@declare(EVENTS)
class WriterPublished:
    """A writer published ``state`` (``Elector.record_out_of_sync``), ``order`` as above."""

    state: PairState
    order: int


@declare(EVENTS)
class GrantAcked:
    """Failsafe: standby ``node_id`` answered the grant request sent at ``sent_at``."""

    node_id: str
    sent_at: float


@declare(EVENTS)
class PublishAttempted:
    """A publish numbered ``order`` goes out naming ``standbys`` (it may land even if
    its answer is lost: they count until a later publish is acknowledged)."""

    order: int
    standbys: tuple[str, ...]


@declare(EVENTS)
class Stop:
    pass


Event = (
    Start
    | LeaderSeen
    | KeyVacant
    | PairStateRead
    | LeaseGranted
    | CampaignLost
    | PromotionSettled
    | Published
    | PublishRefused
    | KeepaliveAcked
    | KeepaliveRefused
    | Unavailable
    | Woke
    | Tick
    | WriterPublished
    | GrantAcked
    | PublishAttempted
    | Stop
)
EVENTS.seal(Event)


# --- actions ----------------------------------------------------------------------------
@declare(ACTIONS)
class ReadLeader:
    """Request: who holds the leader key (``LeaderSeen`` / ``KeyVacant``)."""


@declare(ACTIONS)
class ReadPairState:
    """Request: the pair state (``PairStateRead``)."""


@declare(ACTIONS)
class Campaign:
    """Request: take the vacant key under a new lease (``LeaseGranted`` / ``CampaignLost``)."""


@declare(ACTIONS)
class CheckPromoted:
    """Request: is the node the primary now (``PromotionSettled``)?"""


@declare(ACTIONS)
class Publish:
    """Request: publish the pair state while ``lease``'s key is the leader key."""

    lease: Grant


@declare(ACTIONS)
class KeepAlive:
    """Request: refresh ``lease`` (``KeepaliveAcked`` / ``KeepaliveRefused``)."""

    lease: Grant


@declare(ACTIONS)
class SleepUntil:
    """Request: pause the loop until ``at`` (``Woke``)."""

    at: float


@declare(ACTIONS)
class SetDeadline:
    """The log takes no write from ``at`` on (``CLOSED``: none at all)."""

    at: float


@declare(ACTIONS)
class WakeAt:
    """Feed ``Tick`` at ``at`` (one timer: it replaces the previous one)."""

    at: float


@declare(ACTIONS)
class Resign:
    """Give ``lease`` up in the witness (revoking a lapsed lease is harmless)."""

    lease: Grant


@declare(ACTIONS)
class Emit:
    """Feed ``event`` to the role machine; ``wait=False``: without holding up this loop
    (starting or stopping jobs must not delay a keepalive)."""

    event: rolestate.Event
    wait: bool = True


@declare(ACTIONS)
class Warn:
    message: str


@declare(ACTIONS)
class StopGranting:
    """Failsafe: give no more promises not to campaign (a campaign is going out)."""


@declare(ACTIONS)
class ResumeGranting:
    """Failsafe: promises may be given again (no lease held, no campaign under way)."""


Request = ReadLeader | ReadPairState | Campaign | CheckPromoted | Publish | KeepAlive | SleepUntil
Action = Request | SetDeadline | WakeAt | Resign | Emit | Warn | StopGranting | ResumeGranting
ACTIONS.seal(Action)


def writable_lease(state: ElectorState, now: float) -> Grant | None:
    """The lease a write may be published under at ``now`` (None past the lease's own
    deadline: a failsafe grant lets the log write, not the witness be told)."""
    return state.lease if now < state.lease_deadline else None


def failsafe_until(state: ElectorState) -> float:
    """Until when the members' grants vouch for this primary (``failsafe.NONE``: not)."""
    if not state.config.failsafe or not state.members:
        return failsafe.NONE
    return failsafe.failsafe_deadline(state.members, dict(state.grants), state.config.ttl)


def in_failsafe(state: ElectorState, now: float) -> bool:
    """The log takes writes at ``now`` on the standbys' grants alone."""
    return state.lease_deadline <= now < state.deadline


def lease_remaining(state: ElectorState, now: float) -> float:
    return max(0.0, state.deadline - now)


def step(state: ElectorState, event: Event, now: float) -> tuple[ElectorState, list[Action]]:
    """Apply ``event`` at ``now``: the new state and the actions, in order."""
    match event:
        case Start():
            if state.waiting is not Waiting.NOTHING:
                return state, []
            promise = now + state.config.ttl if state.config.failsafe else CLOSED
            started = replace(state, waiting=Waiting.LEADER, restart_promise=promise)
            return started, [SetDeadline(CLOSED), ReadLeader()]
        case Stop():
            actions: list[Action] = [SetDeadline(CLOSED)]
            if state.lease is not None:
                actions.append(Resign(state.lease))  # the standby need not wait for the ttl
            stopped = replace(_unprimary(state), waiting=Waiting.NOTHING)
            return stopped, actions
        case Tick():
            return _deadline_check(state, now)
        case WriterPublished(pair, order):
            return _open(_note_published(state, pair, order), now)
        case GrantAcked(node_id, sent_at):
            return _granted(state, node_id, sent_at, now)
        case PublishAttempted(order, standbys):
            attempted = replace(state, members=state.members | set(standbys), attempted=order)
            return _open(attempted, now)
        case Unavailable(why):
            return _unavailable(state, why, now)
    if not _answers(state.waiting, event):
        return state, []  # not the answer to the request outstanding: nothing to do
    if not isinstance(event, Woke | PromotionSettled):
        state = replace(state, up=True)  # the witness answered
    match event:
        case Woke():
            if state.lease is not None:
                return replace(state, waiting=Waiting.KEEPALIVE), [KeepAlive(state.lease)]
            return replace(state, waiting=Waiting.LEADER), [ReadLeader()]
        case LeaderSeen(holder):
            return _leader_seen(state, holder, now)
        case KeyVacant():
            since = now if state.vacant_since is None else state.vacant_since
            return replace(state, waiting=Waiting.PAIR_STATE, vacant_since=since), [ReadPairState()]
        case PairStateRead(read, candidate):
            return _maybe_campaign(state, read, candidate, now)
        case LeaseGranted(lease, sent_at):
            return _won(state, lease, sent_at)
        case CampaignLost():
            if state.deadline > now:  # re-taking on the grants: someone else holds it
                return _give_up(state, "another node took the leader key", now)
            slept, sleep = _sleep(state, now)  # the next look follows the faster node
            return slept, [*_resume_granting(state), *sleep]
        case PromotionSettled(primary):
            if not primary or state.lease is None:
                return _give_up(state, "the promotion did not happen", now)
            return replace(state, waiting=Waiting.PUBLISH), [Publish(state.lease)]
        case Published(pair, order):
            return _extend(_note_published(state, pair, order), now)
        case PublishRefused():
            return _lapsed(state, "the leader key is no longer ours", now)
        case KeepaliveAcked(sent_at):
            if state.lease is None:
                return _sleep(state, now)
            published = replace(state, waiting=Waiting.PUBLISH, acked_sent_at=sent_at)
            return published, [Publish(state.lease)]
        case KeepaliveRefused():
            return _lapsed(state, "the witness says our lease lapsed", now)
    raise EVENTS.unknown(event)


_ANSWERS: dict[Waiting, tuple[type, ...]] = {
    Waiting.LEADER: (LeaderSeen, KeyVacant),
    Waiting.PAIR_STATE: (PairStateRead,),
    Waiting.CAMPAIGN: (LeaseGranted, CampaignLost),
    Waiting.PROMOTION: (PromotionSettled,),
    Waiting.PUBLISH: (Published, PublishRefused),
    Waiting.KEEPALIVE: (KeepaliveAcked, KeepaliveRefused),
    Waiting.SLEEP: (Woke,),
}


def _answers(waiting: Waiting, event: Event) -> bool:
    return isinstance(event, _ANSWERS.get(waiting, ()))


def _sleep(
    state: ElectorState, now: float, pause: float = 0.0
) -> tuple[ElectorState, list[Action]]:
    return replace(state, waiting=Waiting.SLEEP), [SleepUntil(now + pause)]


def _poll(state: ElectorState, now: float) -> tuple[ElectorState, list[Action]]:
    return _sleep(state, now, election.poll_interval(state.config.ttl))


def _leader_seen(
    state: ElectorState, holder: Holder, now: float
) -> tuple[ElectorState, list[Action]]:
    if holder.node_id == state.config.node_id:
        return _poll(state, now)  # our own key from before a restart: it lapses within ttl
    actions: list[Action] = []
    if state.deadline != CLOSED:  # writing on the grants, yet another node holds the key
        actions += [Warn(f"{holder.address} holds the leader key: this node takes no write")]
        actions += [SetDeadline(CLOSED), *_lost(state), *_resume_granting(state)]
        state = _unprimary(state)
    seen = (holder.replication, holder.epoch)
    following = replace(state, vacant_since=None, leader=holder.address, seen=seen)
    if state.seen != seen:
        actions.append(Emit(rolestate.LeaderIs(holder.replication, holder.epoch)))
    polled, sleep = _poll(following, now)
    return polled, [*actions, *sleep]


def _maybe_campaign(
    state: ElectorState, pair: PairState | None, candidate: Candidate, now: float
) -> tuple[ElectorState, list[Action]]:
    since = now if state.vacant_since is None else state.vacant_since
    promised = max(candidate.promised_until, state.restart_promise)
    verdict = election.may_campaign(
        candidate, pair, vacant_for=now - since, promised_for=promised - now
    )
    if verdict.ok:
        # no await between this check of the promise and the end of granting (``failsafe``)
        stop: list[Action] = [StopGranting()] if state.config.failsafe else []
        campaigning = replace(state, waiting=Waiting.CAMPAIGN, behind=verdict.behind)
        return campaigning, [*stop, Campaign()]
    actions: list[Action] = []
    if verdict.reason != state.why_not:
        actions.append(Warn(f"the leader key is vacant; not campaigning: {verdict.reason}"))
    polled, sleep = _poll(replace(state, why_not=verdict.reason), now)
    return polled, [*actions, *sleep]


def _won(state: ElectorState, lease: Grant, sent_at: float) -> tuple[ElectorState, list[Action]]:
    behind = f"; {state.behind} entries behind the last published offset" if state.behind else ""
    won = replace(
        state,
        waiting=Waiting.PROMOTION,
        lease=lease,
        acked_sent_at=sent_at,
        held=state.held and bool(state.members),  # a re-take: the jobs never stopped
        seen=None,  # once the lease is gone, whoever holds the key is reported anew
        why_not="",
        takeover_behind=state.behind,
        leader=state.config.address,
    )
    return won, [
        Warn(f"won the witness lease (epoch {lease.epoch}){behind}"),
        Emit(rolestate.LeaseWon(lease.epoch)),  # promotes: durable before any write
        CheckPromoted(),
    ]


def _note_published(state: ElectorState, pair: PairState, order: int) -> ElectorState:
    """The publish of ``order`` is in the witness; the flag follows the latest one (a
    writer's publish and the loop's may finish in either order)."""
    if order <= state.published_order:
        return state
    out_of_sync = pair.mode == "sync" and not pair.sync_standby
    # the witness holds this publish's standbys, and maybe those of a later one sent
    members = set(pair.standbys) | (state.members if order < state.attempted else set())
    return replace(
        state,
        out_of_sync_published=out_of_sync,
        published_order=order,
        members=frozenset(members),
    )


def _extend(state: ElectorState, now: float) -> tuple[ElectorState, list[Action]]:
    """The pair state is published under the lease whose grant or keepalive left at
    ``acked_sent_at``: writes may go on until the new deadline, the jobs (re)start."""
    deadline = election.write_deadline(state.acked_sent_at, state.config.ttl)
    interval = election.keepalive_interval(state.config.ttl)
    if state.lease is None:
        return _sleep(state, now, interval)
    opened, actions = _open(replace(state, lease_deadline=deadline), now)
    slept, sleep = _sleep(opened, now, interval)
    return slept, [*actions, *sleep]


def _open(state: ElectorState, now: float) -> tuple[ElectorState, list[Action]]:
    """Set the deadline to the later of the lease's and the grants' (which may be
    earlier than the one set: a member joined, a lease was found lapsed); the jobs
    (re)start when it lies ahead. A deadline passed and still passed: nothing."""
    lease = state.lease_deadline if state.lease is not None else CLOSED
    target = max(lease, failsafe_until(state))
    if target <= now and state.deadline <= now:
        return state, []  # acknowledged too late to help
    actions: list[Action] = []
    if target != state.deadline:
        actions += [SetDeadline(target), WakeAt(target)]
    opened = replace(state, deadline=target)
    if target > now and not state.held:
        actions.append(Emit(rolestate.LeaseHeld(), wait=False))
        opened = replace(opened, held=True)
    return opened, actions


def _granted(
    state: ElectorState, node_id: str, sent_at: float, now: float
) -> tuple[ElectorState, list[Action]]:
    """A standby answered a grant request: its grant moves on (never back)."""
    if not state.config.failsafe:
        return state, []
    grants = dict(state.grants)
    if sent_at <= grants.get(node_id, failsafe.NONE):
        return state, []
    grants[node_id] = sent_at
    return _open(replace(state, grants=tuple(sorted(grants.items()))), now)


def _deadline_check(state: ElectorState, now: float) -> tuple[ElectorState, list[Action]]:
    """At the deadline: if no keepalive moved it, the jobs stop (the log already
    refuses writes by itself); a timer that fired early is set again."""
    if not state.held:
        return state, []
    if now < state.deadline:
        return state, [WakeAt(state.deadline)]
    return replace(state, held=False), [Emit(rolestate.LeaseLost(), wait=False)]


def _give_up(state: ElectorState, why: str, now: float) -> tuple[ElectorState, list[Action]]:
    """The lease, or its key, is gone: no write from now on (the deadline closes at
    once); the next look follows whoever holds the key, or campaigns again."""
    actions: list[Action] = [Warn(f"{why}: this node takes no write"), SetDeadline(CLOSED)]
    if state.lease is not None:
        actions.append(Resign(state.lease))
    actions += [Emit(rolestate.LeaseLost()), *_resume_granting(state)]
    slept, sleep = _sleep(_unprimary(state), now)
    return slept, [*actions, *sleep]


def _lapsed(state: ElectorState, why: str, now: float) -> tuple[ElectorState, list[Action]]:
    """The witness says the lease is gone. Still covered by the standbys' grants: go on
    writing on them alone and take the key again at once; else give up."""
    until = failsafe_until(state)
    if until <= now:
        return _give_up(state, why, now)
    actions: list[Action] = [
        Warn(
            f"{why}; the standbys' failsafe grants cover writes for {until - now:.1f} s more: "
            "taking the vacant leader key again"
        )
    ]
    if until != state.deadline:
        actions += [SetDeadline(until), WakeAt(until)]
    if state.lease is not None:
        actions.append(Resign(state.lease))
    retaking = replace(
        state, lease=None, lease_deadline=CLOSED, deadline=until, waiting=Waiting.CAMPAIGN, behind=0
    )
    return retaking, [*actions, Campaign()]


def _lost(state: ElectorState) -> list[Action]:
    """``LeaseLost`` when the jobs may be running (the deadline was last ahead)."""
    return [Emit(rolestate.LeaseLost())] if state.held else []


def _unprimary(state: ElectorState) -> ElectorState:
    """No lease, no deadline, no failsafe: what the machine holds as no primary."""
    return replace(
        state,
        lease=None,
        deadline=CLOSED,
        lease_deadline=CLOSED,
        held=False,
        members=frozenset(),
        grants=(),
    )


def _resume_granting(state: ElectorState) -> list[Action]:
    return [ResumeGranting()] if state.config.failsafe else []


def _unavailable(state: ElectorState, why: str, now: float) -> tuple[ElectorState, list[Action]]:
    """A request failed: look again after ``poll_interval``; a lease held keeps its
    deadline (the witness not answering ends nothing by itself: the deadline does)."""
    if state.waiting in (Waiting.NOTHING, Waiting.SLEEP):
        return state, []  # not the loop's request (a writer's publish)
    actions: list[Action] = [Warn(why)] if state.up else []
    if state.waiting is Waiting.CAMPAIGN and not state.members:
        actions += _resume_granting(state)  # (a lost answer's key lapses unused)
    checked, lost = _deadline_check(replace(state, up=False), now)
    lost = [a for a in lost if not isinstance(a, WakeAt)]  # the timer is set already
    polled, sleep = _poll(checked, now)
    return polled, [*actions, *lost, *sleep]
