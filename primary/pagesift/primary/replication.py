"""The primary's side of replication: the ``ReplicationService`` stream and sync mode.

What it owns
------------
``ReplicationServicer`` serves ``ReplicationService.Stream`` (one session per
connected standby), tracks each standby's acknowledged offset, and implements
``wait_replicated(offset)`` for sync mode. It is a thin asyncio shell: the decision
(continue / full / step down / refuse) is ``protocol.decide``; every decision after
it (sync mode's waits, degradation and restoration, linger, heartbeats, the lag) is
``senderstate.step``'s, a pure state machine over a frozen ``SenderState``: this
shell holds the current state, feeds it events with ``time.monotonic()`` as the time,
keeps the state each step returns and carries out every action (``_carry_out`` the
shell-wide ones, the waiter and the tail their own; an action nobody carried out
raises, it is never dropped); the entries,
the consistent cuts and the identity live in the replication ``Log``. ``add_to_server``
registers it (see step 4).

The session, step by step, and why each step is safe
----------------------------------------------------
1. **Hello.** The standby's first message names its history, applied offset and
   epoch. We read our own state under the write section (``Log.primary_state``) so
   first/last offsets and identity are one consistent fact.
2. **Decide.** ``protocol.decide``. A peer with a higher epoch means we were
   deposed: we fence ourselves (durably, before answering) so that no write accepted
   from now on can be lost to a history nobody follows, and abort the stream.
3. **Full resync.** ``Log.view()`` creates a RocksDB iterator while holding the write
   section, together with O = last offset. The iterator is an implicit snapshot: it
   sees every group <= O (they committed before we got the lock) and none > O (they
   need the lock). We release the lock at once and stream the cut in ~256 KB chunks
   of store ops, so writers never wait for the snapshot: a worker thread encodes each
   chunk straight from the rows (``framing.snapshot_messages``) and lets go of the GIL
   every millisecond; the event loop only hands the message to gRPC. The tail
   then starts at O + 1; should the backlog have dropped O + 1 while the snapshot was
   streaming (a backlog too small for the snapshot's duration), the session ends
   with RESOURCE_EXHAUSTED and the standby retries; size the backlog for it.
4. **Tail.** Entries are read from the backlog (committed entries are immutable, so
   reading outside the lock is safe; trimming is the only race and it is detected,
   never silently skipped), batched up to ``batch_bytes`` per message, in offset
   order. They travel as the bytes the log holds (the newest from memory), framed
   into the message without being parsed (``framing.entries_message``), and the
   snapshot's chunks likewise: ``add_to_server`` registers the stream with a
   serializer that passes bytes through. (Handing gRPC parsed messages, as the
   generated registration would, cost the primary ~25 us more per page-sized entry
   streamed: 63 against 38 us.) gRPC flow control pushes back on
   a slow standby: we read the next batch only after the previous one was accepted
   by the transport. In async mode a batch that is not full goes out at most once per
   ``linger`` (15 ms): a message costs both nodes far more CPU than an entry in it
   (a gRPC message, an ack, a cold wake-up of each process), and at crawl rate a
   primary otherwise sends one message per write. That delays an entry by at most
   ``linger``; sync mode never lingers (its writers wait for the ack).
5. **Heartbeats** carry our offset and clock every ``heartbeat_interval`` so the
   standby can measure its lag and detect a dead stream; once ``enable_failsafe`` each
   asks for a failsafe grant (``pagesift.core.ha.failsafe``), and each grant
   answered goes to ``on_grant`` (the elector) with the time its request left.
6. **Acks** arrive on the same stream (a reader task). An ack means "applied and
   durable up to N" because the standby writes the applied offset in the same batch
   as the data. The standby acks at once when it has nothing more to apply and
   coalesces acks while messages keep arriving (see ``pagesift.standby.follower``).

Sync mode
---------
``wait_replicated(offset)`` returns True once some standby acked ``offset``. After
``sync_timeout`` it returns False, logs a warning, counts
``pagesift_replication_sync_degraded_total`` and switches to degraded (async)
mode: further calls return at once until a standby acks our last offset again.
Never a stall: at most one timeout is paid per degradation. (The rules, and why
they hold, are ``senderstate``'s.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import assert_never

import grpc

from pagesift.core.api.errortable import (
    HelloExpected,
    NodeRefuser,
    NoLongerPrimary,
    ReplicationRefused,
    SteppedDownForPeer,
    answers_errors,
)
from pagesift.core.replication import protocol, senderstate
from pagesift.core.replication.framing import entries_message, snapshot_messages
from pagesift.core.replication.log import Log
from pagesift.core.replication.senderstate import (
    AckReceived,
    AwaitAck,
    Degraded,
    EntriesReady,
    EntriesSent,
    GrantConfirmed,
    Linger,
    Release,
    Restored,
    SendEntries,
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
from pagesift.core.replication.slot import StoreSlot
from pagesift.core.util.tasks import cancel_and_wait_all
from pagesift.v1 import replication_pb2 as pb

logger = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[pb.StreamRequest, pb.StreamResponse]
#: What the stream yields before serialization: messages, or messages already framed.
Frame = pb.StreamResponse | bytes
_SERVICE = pb.DESCRIPTOR.services_by_name["ReplicationService"].full_name


def add_to_server(servicer: ReplicationServicer, server: grpc.aio.Server) -> None:
    """Serve ``servicer`` on ``server`` with entry batches and snapshot chunks sent as
    the bytes they are framed into (step 4), never parsed and serialized again.

    The only registration of the stream (the generated one would need parsed
    messages for gRPC to serialize again)."""
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.stream_frames,
        request_deserializer=pb.StreamRequest.FromString,
        response_serializer=_serialize,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE, {"Stream": handler}),)
    )


def _serialize(frame: Frame) -> bytes:
    return frame if isinstance(frame, bytes) else frame.SerializeToString()


@dataclass(frozen=True)
class PrimaryStatus:
    """The figures Role reports on a primary."""

    connected: bool
    peer: str
    acked_offset: int
    last_offset: int
    lag_offsets: int
    lag_seconds: float
    sync_degraded: bool


class ReplicationServicer(NodeRefuser):
    """Serves the stream to standbys. Every node serves it, standbys included (the
    composition root, ``pagesift.node``, registers it on each node's server): it
    refuses while the node is not a writable primary, and serves after a promotion
    without being re-added."""

    def __init__(
        self,
        slot: StoreSlot,
        *,
        node_id: str,
        mode: str = "async",
        sync_timeout: float = 2.0,
        heartbeat_interval: float = 0.5,
        batch_bytes: int = 1 << 20,
        chunk_bytes: int = 256 << 10,
        hello_timeout: float = 10.0,
        linger: float = 0.015,
        on_fenced: Callable[[int, str], Awaitable[None]] | None = None,
        address: str = "",
    ) -> None:
        if mode not in ("async", "sync"):
            raise ValueError(f"replication mode must be async or sync, not {mode!r}")
        self._slot = slot
        self.node_id = node_id
        self.address = address  # where we serve clients, told to standbys ("" = unknown)
        self.chunk_bytes = chunk_bytes
        self.hello_timeout = hello_timeout
        self._on_fenced = on_fenced
        # Every decision past the session start: sync mode, linger, heartbeats, lag.
        self._sender = senderstate.SenderState(
            senderstate.SenderConfig(
                mode="sync" if mode == "sync" else "async",
                sync_timeout=sync_timeout,
                linger=linger,
                heartbeat_interval=heartbeat_interval,
                batch_bytes=batch_bytes,
            )
        )
        #: failsafe: told (standby node id, the request's send time) of each grant
        self.on_grant: Callable[[str, float], None] | None = None
        self._ids = itertools.count()  # sessions and waiters
        self._waiters: dict[int, asyncio.Future[bool]] = {}  # pending, by waiter id
        # counters (also for tests and bench)
        self.full_resyncs = 0
        self.continues = 0

    # --- configuration (fixed at construction) -------------------------------------------
    @property
    def mode(self) -> str:
        return self._sender.config.mode

    @property
    def sync_timeout(self) -> float:
        return self._sender.config.sync_timeout

    @property
    def heartbeat_interval(self) -> float:
        return self._sender.config.heartbeat_interval

    @property
    def batch_bytes(self) -> int:
        return self._sender.config.batch_bytes

    @property
    def linger(self) -> float:
        return self._sender.config.linger

    # --- status ------------------------------------------------------------------------
    @property
    def acked_offset(self) -> int:
        return self._sender.acked_offset

    @property
    def sync_degraded(self) -> bool:
        return self._sender.degraded

    @property
    def sync_degraded_total(self) -> int:
        return self._sender.degradations

    @property
    def failsafe_ttl(self) -> float:
        return self._sender.config.failsafe_ttl

    @property
    def grant_requests(self) -> int:
        return self._sender.grant_requests

    @property
    def grants_confirmed(self) -> int:
        return self._sender.grants_confirmed

    def enable_failsafe(self, ttl: float, on_grant: Callable[[str, float], None]) -> None:
        """Ask every heartbeat for a failsafe grant of ``ttl``; ``on_grant`` hears each."""
        self._sender = replace(self._sender, config=replace(self._sender.config, failsafe_ttl=ttl))
        self.on_grant = on_grant

    def standbys(self) -> tuple[str, ...]:
        """The node ids of the standbys streaming now (past their snapshot)."""
        return self._sender.standbys()

    def status(self) -> PrimaryStatus:
        st = self._sender.status(self._slot.log.last_offset, time.monotonic())
        return PrimaryStatus(
            connected=st.connected,
            peer=st.peer,
            acked_offset=st.acked_offset,
            last_offset=st.last_offset,
            lag_offsets=st.lag.offsets,
            lag_seconds=st.lag.seconds,
            sync_degraded=self._sender.degraded,
        )

    # --- carrying out the sender's decisions ---------------------------------------------
    def _step(self, event: senderstate.Event) -> list[senderstate.Action]:
        """Step the machine at ``time.monotonic()`` and keep the state it returns;
        carry out the shell-wide actions, return the caller's (``_carry_out``)."""
        self._sender, actions = senderstate.step(self._sender, event, time.monotonic())
        return self._carry_out(actions)

    def _step_done(self, event: senderstate.Event) -> None:
        """``_step`` for an event whose caller carries out nothing itself."""
        if rest := self._step(event):
            raise RuntimeError(f"the sender's actions {rest!r} for {event!r} went undone")

    def _carry_out(self, actions: list[senderstate.Action]) -> list[senderstate.Action]:
        """Resolve, log and count what the sender decided; returns, in order, the
        actions that belong to the caller (a waiter's own release or wait, the tail's
        sends and waits), which it must carry out in turn."""
        rest: list[senderstate.Action] = []
        for action in actions:
            match action:
                case Release(waiter, replicated) if waiter in self._waiters:
                    fut = self._waiters.pop(waiter)
                    if not fut.done():
                        fut.set_result(replicated)
                case Release() | AwaitAck():
                    rest.append(action)  # the answer to a waiter's own WaitStarted
                case Degraded(offset, acked):
                    logger.warning(
                        "sync replication: no ack for offset %d within %.2fs (acked %d); "
                        "degrading to async until the standby catches up",
                        offset,
                        self.sync_timeout,
                        acked,
                    )
                case Restored(acked):
                    logger.info("sync replication restored: standby acked offset %d", acked)
                case GrantConfirmed(node_id, sent_at):
                    if self.on_grant is not None:
                        self.on_grant(node_id, sent_at)
                case SendEntries() | Linger() | SendHeartbeat() | WaitForEntries():
                    rest.append(action)  # the tail's, carried out by ``_tail``
                case _:
                    assert_never(action)
        return rest

    # --- sync mode -----------------------------------------------------------------------
    async def wait_replicated(self, offset: int) -> bool:
        """True once a standby acknowledged ``offset`` (applied and durable).

        async mode: never waits. sync mode: waits up to ``sync_timeout``; on timeout
        degrades to async (warning + metric) and returns False; while degraded returns
        at once (False unless already acked) until a standby catches up again.
        """
        waiter = next(self._ids)
        match self._step(WaitStarted(waiter, offset)):
            case [Release(_, replicated)]:  # decided at once
                return replicated
            case [AwaitAck() as action]:
                pass
            case rest:
                raise RuntimeError(f"a wait answered with {rest!r}")
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters[waiter] = fut
        try:
            while not fut.done():
                await asyncio.wait({fut}, timeout=action.until - time.monotonic())
                if not fut.done():
                    self._step_done(Tick())  # degrades once the deadline has come
            return fut.result()
        finally:
            if self._waiters.pop(waiter, None) is not None:  # cancelled, never released
                self._step_done(WaitAbandoned(waiter))

    # --- the stream ----------------------------------------------------------------------
    @answers_errors
    async def stream_frames(
        self, request_iterator: AsyncIterator[pb.StreamRequest], context: Context
    ) -> AsyncGenerator[Frame, None]:
        """``ReplicationService.Stream``, with entry batches and snapshot chunks as the
        bytes they are framed into; served by ``add_to_server``."""
        requests = aiter(request_iterator)
        try:
            async with asyncio.timeout(self.hello_timeout):
                first = await anext(requests)
        except (StopAsyncIteration, TimeoutError):
            return
        if first.WhichOneof("msg") != "hello":
            raise HelloExpected()
        h = first.hello
        hello = protocol.Hello(h.node_id, h.history_id, h.applied_offset, h.epoch)
        log = self._slot.log
        decision = protocol.decide(hello, log.primary_state())
        logger.info("standby %s (%s): %s", hello.node_id, context.peer(), decision)
        if isinstance(decision, protocol.StepDown):
            await self.step_down(decision.peer_epoch, by=h.address)
            raise SteppedDownForPeer(decision.peer_epoch, decision.reason)
        if isinstance(decision, protocol.Refuse):
            raise ReplicationRefused(decision.reason)

        # A full resync starts from nothing we share: the standby's old offset counts
        # for nothing (it may even be of a diverged history) until it acks.
        shared = hello.applied_offset if isinstance(decision, protocol.Continue) else 0
        sid = next(self._ids)
        self._step_done(SessionOpened(sid, hello.node_id, context.peer(), shared))
        closed = asyncio.Event()
        reader = asyncio.create_task(self._read_acks(requests, sid, hello.node_id, closed))
        try:
            if isinstance(decision, protocol.Full):
                self.full_resyncs += 1
                view = log.view()  # the cut at O, taken inside the write section
                yield pb.StreamResponse(
                    decision=pb.SyncDecision(
                        kind=pb.SYNC_KIND_FULL,
                        from_offset=view.offset + 1,
                        snapshot_offset=view.offset,
                        snapshot_entry_epoch=view.tail_epoch,
                        history_id=log.history_id,
                        epoch=log.epoch,
                        primary_node_id=self.node_id,
                        primary_address=self.address,
                        reason=decision.reason,
                        discarded=decision.discarded,
                    )
                )
                # Outside the lock: writers go on while the cut streams. Each chunk is
                # encoded in a worker thread; the loop only hands it over.
                nxt = view.offset + 1
                chunks = snapshot_messages(view, self.chunk_bytes)
                del view  # the generator holds the pinned RocksDB version until it ends
                while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
                    yield chunk
                del chunks
            else:
                assert isinstance(decision, protocol.Continue)
                self.continues += 1
                yield pb.StreamResponse(
                    decision=pb.SyncDecision(
                        kind=pb.SYNC_KIND_CONTINUE,
                        from_offset=decision.from_offset,
                        history_id=log.history_id,
                        epoch=log.epoch,
                        primary_node_id=self.node_id,
                        primary_address=self.address,
                        reason=decision.reason,
                    )
                )
                nxt = decision.from_offset
            self._step_done(SessionTailing(sid))
            async for frame in self._tail(log, sid, nxt, closed):
                yield frame
        finally:
            self._step_done(SessionClosed(sid))
            await cancel_and_wait_all([reader])  # a cancel of the call itself still ends it

    async def _tail(
        self, log: Log, sid: int, nxt: int, closed: asyncio.Event
    ) -> AsyncIterator[Frame]:
        while not closed.is_set():
            if log is not self._slot.log or not log.writable:
                # Demoted (fenced) or replaced: the standby must re-ask whoever leads.
                raise NoLongerPrimary()
            # The entries' bytes, framed as they are: no parse, no copy per entry. A
            # trimmed ``nxt`` raises ``BacklogLost`` (STANDBY_TOO_SLOW): never skipped.
            entries = log.read_raw(nxt, max_bytes=self.batch_bytes)
            if entries:
                # Async mode: at most one batch per ``linger`` unless it is full, so
                # that a busy stream carries batches, not one message per write (a
                # message costs both sides far more CPU than an entry in it). Sync
                # mode sends at once: its writers wait for the standby's ack.
                match self._step(EntriesReady(sid, sum(map(len, entries)))):
                    case [SendEntries()]:
                        pass
                    case [Linger(until)]:
                        await asyncio.sleep(until - time.monotonic())
                        entries = log.read_raw(nxt, max_bytes=self.batch_bytes)
                    case rest:
                        raise RuntimeError(f"a batch answered with {rest!r}")
            if entries:
                nxt += len(entries)
                yield entries_message(entries)
                self._step_done(EntriesSent(sid))
            for action in self._step(TailTurnEnded(sid, sent=bool(entries))):
                match action:
                    case SendHeartbeat(request):
                        yield pb.StreamResponse(
                            heartbeat=pb.Heartbeat(
                                primary_offset=log.last_offset,
                                primary_time_ms=int(time.time() * 1000),
                                epoch=log.epoch,
                                failsafe_request=request,
                                failsafe_ttl_ms=int(self.failsafe_ttl * 1000) if request else 0,
                            )
                        )
                    case WaitForEntries(until):
                        await log.wait_for(nxt, within=max(0.0, until - time.monotonic()))
                    case _:
                        raise RuntimeError(f"a tail turn answered with {action!r}")

    async def _read_acks(
        self,
        requests: AsyncIterator[pb.StreamRequest],
        sid: int,
        node_id: str,
        closed: asyncio.Event,
    ) -> None:
        try:
            async for req in requests:
                if req.WhichOneof("msg") == "ack":
                    ack = AckReceived(
                        sid,
                        req.ack.applied_offset,
                        self._slot.log.last_offset,
                        req.ack.failsafe_grant,
                    )
                    self._step_done(ack)
        except (grpc.aio.AioRpcError, grpc.RpcError) as exc:
            logger.debug("standby %s: ack stream ended: %s", node_id, exc)
        finally:
            closed.set()

    async def step_down(self, peer_epoch: int, *, by: str = "") -> None:
        """A peer of ``peer_epoch`` (serving clients at ``by``, when known) deposed
        us: fence durably, release sync waiters, tell the node."""
        if self._slot.log.fence(peer_epoch):
            self._step_done(SteppedDown())
            if self._on_fenced is not None:
                await self._on_fenced(peer_epoch, by)
