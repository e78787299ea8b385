"""The elector: a node's loop against the witness (who is primary is the lease's call).

What it owns
------------
``Elector.run`` is the only code that talks to the witness on a running node. It
reads the leader key and the pair state, campaigns when the key is vacant and the
rules allow (``pagesift.shared.election.may_campaign``), keeps its lease alive,
publishes the pair state, and sets the log's write deadline. What it sees becomes
events of the node's role machine (``pagesift.shared.rolestate``), which decides:

- another node holds the key -> ``LeaderIs`` (follow it; a primary steps down);
- this node took the key -> ``LeaseWon`` (promote, with the key's revision as the
  epoch), then, once the state is published and the deadline set, ``LeaseHeld``
  (the jobs start);
- the deadline passed with no acknowledged keepalive -> ``LeaseLost`` (jobs stop).

The protocol with the witness
-----------------------------
Without the lease: look every ``poll_interval(ttl)``. With it: a keepalive every
``keepalive_interval(ttl)`` (three per ttl); each acknowledged one moves the write
deadline to ``write_deadline(sent_at, ttl)``, and the pair state is published after
it (history, epoch, offset, mode, and in sync mode the standby that holds every
acknowledged write). A keepalive that etcd answers with "lapsed" ends the lease; a
witness that does not answer ends nothing by itself: the deadline does.

The guarantee, and why it holds
-------------------------------
A primary takes no write at or after its deadline: the log checks it inside its
write section (``Log.set_write_deadline``), whatever this loop is doing, and a node
starts with no deadline at all (``-inf``: writes refused) until it wins and has
published. Promotion is durable before the first write, as without a witness. In
sync mode ``record_out_of_sync`` clears the synchronous standby in the witness before
a write its standby did not confirm is acknowledged; if the witness cannot be told
before the deadline, that write is not acknowledged (``NotWritable``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from pagesift.node.witness import Lease, Witness, WitnessUnavailable, lease_ttl
from pagesift.shared import election, rolestate
from pagesift.shared.election import Candidate, Holder, PairState
from pagesift.shared.identity import NotWritable

logger = logging.getLogger("pagesift.elector")

#: The deadline of a node that holds no lease: every write is refused.
CLOSED = float("-inf")


@dataclass
class ElectorHost:
    """What the elector needs of its node (``pagesift.node.node.Node`` provides it)."""

    me: Holder  # this node's id and addresses (epoch unused)
    mode: str  # the replication mode: "async" | "sync"
    candidate: Callable[[], Candidate]  # history and offset now
    pair_state: Callable[[int], PairState]  # what a holder of this epoch publishes now
    set_write_deadline: Callable[[float], None]
    feed: Callable[[rolestate.Event], Coroutine[Any, Any, None]]
    takes_writes: Callable[[], bool]
    is_primary: Callable[[], bool]


@dataclass
class WitnessFigures:
    up: bool = False  # the last call to the witness succeeded
    deadline: float = CLOSED  # this node's write deadline (monotonic)
    leader: str = ""  # the holder's client address, as last read
    takeover_behind: int = 0  # entries behind the pair state at the last takeover

    def lease_remaining(self, now: float) -> float:
        return max(0.0, self.deadline - now)


class Elector:
    """The witness loop of one node (see the module docstring)."""

    def __init__(self, witness: Witness, host: ElectorHost, *, ttl: float) -> None:
        self.witness = witness
        self.host = host
        self.ttl = float(lease_ttl(ttl))
        self.figures = WitnessFigures()
        self._lease: Lease | None = None
        self._vacant_since: float | None = None
        self._seen: tuple[str, int] | None = None
        self._why_not = ""
        self._out_of_sync_published = False
        self._publish_lock = asyncio.Lock()
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._feeding: set[asyncio.Task[None]] = set()  # events fed from callbacks

    # --- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        self._set_deadline(CLOSED)
        try:
            while True:
                pause = await self._turn()
                await asyncio.sleep(pause)
        finally:
            lease, self._lease = self._lease, None
            self._set_deadline(CLOSED)  # and no timer left behind
            if lease is not None:
                await self.witness.resign(lease)  # the standby need not wait for the ttl
            await self.witness.close()

    async def _turn(self) -> float:
        """One look at the witness; returns how long to wait before the next."""
        try:
            pause = await (self._hold() if self._lease is not None else self._observe())
            self.figures.up = True
            return pause
        except WitnessUnavailable as e:
            if self.figures.up:
                logger.warning("%s", e)
            self.figures.up = False
            return election.poll_interval(self.ttl)

    async def _observe(self) -> float:
        holder = await self.witness.holder()
        now = time.monotonic()
        if holder is not None and holder.node_id != self.host.me.node_id:
            self._vacant_since = None
            self.figures.leader = holder.address
            if self._seen != (holder.replication, holder.epoch):
                self._seen = (holder.replication, holder.epoch)
                await self.host.feed(rolestate.LeaderIs(holder.replication, holder.epoch))
            return election.poll_interval(self.ttl)
        if holder is not None:  # our own key from before a restart: it lapses within ttl
            return election.poll_interval(self.ttl)
        if self._vacant_since is None:
            self._vacant_since = now
        state = await self.witness.pair_state()
        verdict = election.may_campaign(
            self.host.candidate(), state, vacant_for=now - self._vacant_since
        )
        if not verdict.ok:
            if verdict.reason != self._why_not:
                self._why_not = verdict.reason
                logger.warning("the leader key is vacant; not campaigning: %s", verdict.reason)
            return election.poll_interval(self.ttl)
        await self._campaign(verdict)
        return election.keepalive_interval(self.ttl) if self._lease else 0.0

    async def _campaign(self, verdict: election.Eligibility) -> None:
        sent = time.monotonic()
        me = self.host.me
        lease = await self.witness.campaign(me, int(self.ttl))
        if lease is None:
            return  # another node was faster: the next look follows it
        self._lease, self._seen, self._why_not = lease, None, ""
        self.figures.takeover_behind = verdict.behind
        self.figures.leader = me.address
        logger.warning(
            "won the witness lease (epoch %d): %s%s",
            lease.epoch,
            verdict.reason,
            f"; {verdict.behind} entries behind the last published offset"
            if verdict.behind
            else "",
        )
        await self.host.feed(rolestate.LeaseWon(lease.epoch))
        if not self.host.is_primary():
            await self._give_up("the promotion did not happen")
        elif not await self._publish(lease):
            await self._give_up("the leader key is no longer ours")
        else:
            self._extend(sent)

    async def _hold(self) -> float:
        lease = self._lease
        assert lease is not None
        sent = time.monotonic()
        try:
            alive = await self.witness.keepalive(lease)
        except WitnessUnavailable:
            self._check_deadline()
            raise
        if not alive:
            await self._give_up("the witness says our lease lapsed")
            return 0.0
        if not await self._publish(lease):
            await self._give_up("the leader key is no longer ours")
            return 0.0
        self._extend(sent)
        return election.keepalive_interval(self.ttl)

    async def _give_up(self, why: str) -> None:
        """The lease, or its key, is gone: no write from now on (the deadline closes at
        once); the next look follows whoever holds the key, or campaigns again."""
        lease, self._lease = self._lease, None
        logger.warning("%s: this node takes no write", why)
        self._set_deadline(CLOSED)
        if lease is not None:
            await self.witness.resign(lease)  # revoking a lapsed lease is harmless
        await self.host.feed(rolestate.LeaseLost())

    # --- the deadline --------------------------------------------------------------------
    def _extend(self, sent: float) -> None:
        """A keepalive (or the grant) sent at ``sent`` was acknowledged: writes may go
        on until the new deadline; the jobs (re)start if they had stopped."""
        deadline = election.write_deadline(sent, self.ttl)
        if deadline <= time.monotonic():
            return  # acknowledged too late to help
        self._set_deadline(deadline)
        if self.host.is_primary() and not self.host.takes_writes():
            self._feed_later(rolestate.LeaseHeld())

    def _set_deadline(self, deadline: float) -> None:
        self.figures.deadline = deadline
        self.host.set_write_deadline(deadline)
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if deadline > time.monotonic():
            delay = deadline - time.monotonic()
            loop = asyncio.get_running_loop()
            self._deadline_timer = loop.call_later(delay, self._check_deadline)

    def _check_deadline(self) -> None:
        """At the deadline: if no keepalive moved it, the jobs stop (the log already
        refuses writes by itself)."""
        if time.monotonic() >= self.figures.deadline and self.host.takes_writes():
            self._feed_later(rolestate.LeaseLost())

    def _feed_later(self, event: rolestate.Event) -> None:
        task = asyncio.get_running_loop().create_task(self.host.feed(event))
        self._feeding.add(task)
        task.add_done_callback(self._feeding.discard)

    # --- the pair state ------------------------------------------------------------------
    async def _publish(self, lease: Lease) -> bool:
        """Publish the pair state while ``lease``'s key is the leader key; False when it
        is not (any more)."""
        async with self._publish_lock:
            state = self.host.pair_state(lease.epoch)
            if not await self.witness.publish(lease, state):
                return False
            self._out_of_sync_published = self.host.mode == "sync" and not state.sync_standby
            return True

    async def record_out_of_sync(self) -> None:
        """Sync mode: a write the standby did not confirm is about to be acknowledged.
        The witness learns first that no standby holds everything (so none may take
        over); ``NotWritable`` when it cannot be told before the deadline."""
        if self._out_of_sync_published:
            return
        while time.monotonic() < self.figures.deadline and (lease := self._lease) is not None:
            try:
                # published under the lock from the sender's state then: degraded (no
                # synchronous standby), or restored by an ack that covers this write
                if await self._publish(lease):
                    return
                break  # the key is not ours: this write is not acknowledged
            except WitnessUnavailable:
                await asyncio.sleep(election.poll_interval(self.ttl))
        raise NotWritable("the witness could not record that the standby is behind")
