"""The elector: a node's loop against the witness (who is primary is the lease's call).

What it owns
------------
``Elector.run`` is the only code that talks to the witness on a running node. It is
the thin shell of ``pagesift.core.ha.electorstate``, which decides everything: it
reads ``time.monotonic()`` once per event (and once as a campaign or keepalive
leaves, its ``sent_at``), feeds ``electorstate.step``, and carries out every action
``step`` returns, in order. A request's answer (or ``Unavailable``) is the next
event; ``SetDeadline`` goes to the log; ``WakeAt`` arms the one timer that feeds
``Tick``; ``Emit`` feeds the node's role machine (``pagesift.core.ha.rolestate``):
``LeaderIs`` (another node holds the key: a primary stops its jobs, then follows),
``LeaseWon`` (promote, with the key's revision as the epoch), ``LeaseHeld`` (the
state is published and the deadline set: jobs start), ``LeaseLost`` (jobs stop).
Failsafe (``failsafe=True``): ``grant_acked`` (the replication stream's grants)
feeds ``GrantAcked``; each publish is stepped as ``PublishAttempted`` before it goes
out; ``StopGranting``/``ResumeGranting`` close and open the node's
``StandbyPromise`` (its follower gives no promise while it campaigns or leads).

The guarantee, and why it holds
-------------------------------
A primary takes no write at or after its deadline (the lease's, or with failsafe the
later of it and the standbys' grants: ``pagesift.core.ha.failsafe``): the log checks it inside its
write section (``Log.set_write_deadline``), whatever this loop is doing, and the
machine's first action is ``SetDeadline(CLOSED)`` (writes refused) until the node
wins, is promoted, and has published. Promotion is durable before the first write,
as without a witness. In sync mode ``record_out_of_sync`` clears the synchronous
standby in the witness before a write its standby did not confirm is acknowledged;
if the witness cannot be told before the deadline, that write is not acknowledged
(``NotWritable``). Publishes are serialized and numbered, so the machine's
"already published out of sync" flag follows the last one the witness holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, assert_never

from pagesift.coord.etcd import EtcdUnavailable
from pagesift.coord.witness import Lease, Witness, lease_ttl
from pagesift.core.ha import election, electorstate, rolestate
from pagesift.core.ha.election import Candidate, Holder, PairState
from pagesift.core.ha.electorstate import (
    CLOSED,
    Campaign,
    CampaignLost,
    CheckPromoted,
    ElectorConfig,
    ElectorState,
    Emit,
    Grant,
    GrantAcked,
    KeepAlive,
    KeepaliveAcked,
    KeepaliveRefused,
    KeyVacant,
    LeaderSeen,
    LeaseGranted,
    PairStateRead,
    PromotionSettled,
    Publish,
    PublishAttempted,
    Published,
    PublishRefused,
    ReadLeader,
    ReadPairState,
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
)
from pagesift.core.ha.failsafe import StandbyPromise
from pagesift.core.replication.identity import NotWritable

__all__ = ["CLOSED", "Elector", "ElectorHost", "WitnessFigures"]

logger = logging.getLogger("pagesift.elector")


@dataclass
class ElectorHost:
    """What the elector needs of its node (``pagesift.node.node.Node`` provides it)."""

    me: Holder  # this node's id and addresses (epoch unused)
    mode: str  # the replication mode: "async" | "sync"
    candidate: Callable[[], Candidate]  # history and offset now
    pair_state: Callable[[int], PairState]  # what a holder of this epoch publishes now
    set_write_deadline: Callable[[float], None]
    feed: Callable[[rolestate.Event], Coroutine[Any, Any, None]]
    is_primary: Callable[[], bool]  # asked once the role machine had LeaseWon
    promise: StandbyPromise | None = None  # failsafe: the promise the follower gives


@dataclass(frozen=True)
class WitnessFigures:
    up: bool = False  # the last call to the witness succeeded
    deadline: float = CLOSED  # this node's write deadline (monotonic)
    leader: str = ""  # the holder's client address, as last read
    takeover_behind: int = 0  # entries behind the pair state at the last takeover
    failsafe: bool = False  # the deadline stands on the standbys' grants, not the lease

    def lease_remaining(self, now: float) -> float:
        return max(0.0, self.deadline - now)


class Elector:
    """The witness loop of one node (see the module docstring)."""

    def __init__(
        self, witness: Witness, host: ElectorHost, *, ttl: float, failsafe: bool = False
    ) -> None:
        self.witness = witness
        self.host = host
        self.ttl = float(lease_ttl(ttl))
        config = ElectorConfig(host.me.node_id, host.me.address, self.ttl, failsafe=failsafe)
        self.state = ElectorState.initial(config)
        self._published = 0  # publishes sent, in the witness's order (under the lock)
        self._publish_lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # ticks and emits off the loop

    @property
    def figures(self) -> WitnessFigures:
        s = self.state
        failsafe = electorstate.in_failsafe(s, time.monotonic())
        return WitnessFigures(s.up, s.deadline, s.leader, s.takeover_behind, failsafe)

    def grant_acked(self, node_id: str, sent_at: float) -> None:
        """Failsafe: standby ``node_id`` answered the grant request sent at ``sent_at``
        (the primary's replication stream calls it)."""
        self._spawn(self._drive(GrantAcked(node_id, sent_at)))

    # --- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._drive(Start())  # every answer asks the next question: runs until cancelled
        finally:
            await self._drive(Stop())  # the deadline closes, then the lease is resigned
            if self._timer is not None:
                self._timer.cancel()  # no timer left behind
            await self.witness.close()

    async def _drive(self, first: electorstate.Event) -> None:
        """Step ``first``, carry out its actions in order; each answer is stepped next."""
        events: deque[electorstate.Event] = deque([first])
        while events:
            now = time.monotonic()
            self.state, actions = electorstate.step(self.state, events.popleft(), now)
            for action in actions:
                answer = await self._carry_out(action, now)
                if answer is not None:
                    events.append(answer)

    async def _carry_out(
        self, action: electorstate.Action, now: float
    ) -> electorstate.Event | None:
        match action:
            case SetDeadline(at):
                self.host.set_write_deadline(at)
            case WakeAt(at):
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = asyncio.get_running_loop().call_later(at - now, self._tick)
            case Emit(event, wait):
                if wait:
                    await self.host.feed(event)
                else:
                    self._spawn(self.host.feed(event))
            case Warn(message):
                logger.warning("%s", message)
            case StopGranting() | ResumeGranting():
                if self.host.promise is not None:
                    self.host.promise.granting = isinstance(action, ResumeGranting)
            case Resign(grant):
                await self.witness.resign(_lease(grant))
            case SleepUntil(at):
                await asyncio.sleep(max(0.0, at - now))
                return Woke()
            case CheckPromoted():
                return PromotionSettled(self.host.is_primary())
            case ReadLeader() | ReadPairState() | Campaign() | Publish() | KeepAlive():
                try:
                    return await self._ask(action)
                except EtcdUnavailable as e:
                    return Unavailable(str(e))
            case _:
                assert_never(action)
        return None

    async def _ask(
        self, request: ReadLeader | ReadPairState | Campaign | Publish | KeepAlive
    ) -> electorstate.Event:
        """One request to the witness; its answer as the machine's event."""
        match request:
            case ReadLeader():
                holder = await self.witness.holder()
                return KeyVacant() if holder is None else LeaderSeen(holder)
            case ReadPairState():
                pair = await self.witness.pair_state()
                return PairStateRead(pair, self.host.candidate())
            case Campaign():
                sent_at = time.monotonic()
                lease = await self.witness.campaign(self.host.me, int(self.ttl))
                if lease is None:
                    return CampaignLost()
                return LeaseGranted(Grant(lease.id, lease.epoch), sent_at)
            case KeepAlive(grant):
                sent_at = time.monotonic()
                if await self.witness.keepalive(_lease(grant)):
                    return KeepaliveAcked(sent_at)
                return KeepaliveRefused()
            case Publish(grant):
                published = await self._publish(grant)
                return PublishRefused() if published is None else Published(*published)

    def _tick(self) -> None:
        self._timer = None
        self._spawn(self._drive(Tick()))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- the pair state ------------------------------------------------------------------
    async def _publish(self, grant: Grant) -> tuple[PairState, int] | None:
        """Publish the pair state while ``grant``'s key is the leader key, with its
        order among this node's publishes (sent, whatever became of them); None when
        the key is not (any more) ours."""
        async with self._publish_lock:
            state = self.host.pair_state(grant.epoch)
            self._published += 1
            order = self._published
            await self._drive(PublishAttempted(order, state.standbys))
            if not await self.witness.publish(_lease(grant), state):
                return None
            return state, order

    async def record_out_of_sync(self) -> None:
        """Sync mode: a write the standby did not confirm is about to be acknowledged.
        The witness learns first that no standby holds everything (so none may take
        over); ``NotWritable`` when it cannot be told before the deadline."""
        if self.state.out_of_sync_published:
            return
        while (grant := electorstate.writable_lease(self.state, time.monotonic())) is not None:
            try:
                # published under the lock from the sender's state then: degraded (no
                # synchronous standby), or restored by an ack that covers this write
                published = await self._publish(grant)
            except EtcdUnavailable:
                await asyncio.sleep(election.poll_interval(self.ttl))
                continue
            if published is None:
                break  # the key is not ours: this write is not acknowledged
            await self._drive(WriterPublished(*published))
            return
        raise NotWritable("the witness could not record that the standby is behind")


def _lease(grant: Grant) -> Lease:
    return Lease(grant.id, grant.epoch)
