"""The primary's side of replication: the ``ReplicationService`` stream and sync mode.

What it owns
------------
``ReplicationServicer`` serves ``ReplicationService.Stream`` (one session per
connected standby), tracks each standby's acknowledged offset, and implements
``wait_replicated(offset)`` for sync mode. It is a thin asyncio shell: the decision
(continue / full / step down / refuse) is ``replproto.decide``; the entries, the
consistent cuts and the identity live in ``replog.Log``.

The session, step by step, and why each step is safe
----------------------------------------------------
1. **Hello.** The standby's first message names its history, applied offset and
   epoch. We read our own state under the write section (``Log.primary_state``) so
   first/last offsets and identity are one consistent fact.
2. **Decide.** ``replproto.decide``. A peer with a higher epoch means we were
   deposed: we fence ourselves (durably, before answering) so that no write accepted
   from now on can be lost to a history nobody follows, and abort the stream.
3. **Full resync.** ``Log.view()`` creates a RocksDB iterator while holding the write
   section, together with O = last offset. The iterator is an implicit snapshot: it
   sees every group <= O (they committed before we got the lock) and none > O (they
   need the lock). We release the lock at once and stream the cut in ~256 KB chunks
   of store ops, so writers never wait for the snapshot: a worker thread encodes each
   chunk straight from the rows (``replog.snapshot_messages``) and lets go of the GIL
   every millisecond; the event loop only hands the message to gRPC. The tail
   then starts at O + 1; should the backlog have dropped O + 1 while the snapshot was
   streaming (a backlog too small for the snapshot's duration), the session ends
   with RESOURCE_EXHAUSTED and the standby retries; size the backlog for it.
4. **Tail.** Entries are read from the backlog (committed entries are immutable, so
   reading outside the lock is safe; trimming is the only race and it is detected,
   never silently skipped), batched up to ``batch_bytes`` per message, in offset
   order. They travel as the bytes the log holds (the newest from memory), framed
   into the message without being parsed. gRPC flow control pushes back on a slow
   standby: we read the next batch only after the previous one was accepted by the
   transport. In async mode a batch that is not full goes out at most once per
   ``linger`` (15 ms): a message costs both nodes far more CPU than an entry in it
   (a gRPC message, an ack, a cold wake-up of each process), and at crawl rate a
   primary otherwise sends one message per write. That delays an entry by at most
   ``linger``; sync mode never lingers (its writers wait for the ack).
5. **Heartbeats** carry our offset and clock every ``heartbeat_interval`` so the
   standby can measure its lag and detect a dead stream.
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
Never a stall: at most one timeout is paid per degradation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import grpc
import prometheus_client

from pagesift.shared import replproto
from pagesift.shared.replog import (
    BacklogLost,
    Log,
    StoreSlot,
    entries_message,
    snapshot_messages,
)
from pagesift.v1 import replication_pb2 as pb
from pagesift.v1 import replication_pb2_grpc

logger = logging.getLogger(__name__)

SYNC_DEGRADED = prometheus_client.Counter(
    "pagesift_replication_sync_degraded",
    "Times sync replication timed out and degraded to async.",
)

Context = grpc.aio.ServicerContext[pb.StreamRequest, pb.StreamResponse]


@dataclass
class _Session:
    node_id: str
    peer: str
    acked: int
    caught_up_at: float = field(default_factory=time.monotonic)
    closed: asyncio.Event = field(default_factory=asyncio.Event)


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


class ReplicationServicer(replication_pb2_grpc.ReplicationServiceServicer):
    """Serves the stream to standbys; add it to the grpc.aio server on BOTH roles
    (it refuses while the node is not a writable primary, and serves after a
    promotion without being re-added)."""

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
        self.mode = mode
        self.sync_timeout = sync_timeout
        self.heartbeat_interval = heartbeat_interval
        self.batch_bytes = batch_bytes
        self.chunk_bytes = chunk_bytes
        self.hello_timeout = hello_timeout
        self.linger = linger
        self._on_fenced = on_fenced
        self._sessions: dict[int, _Session] = {}
        self._next_id = 0
        self._sync_waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self._degraded = False
        # counters (also for tests and bench)
        self.full_resyncs = 0
        self.continues = 0
        self.sync_degraded_total = 0

    # --- status ------------------------------------------------------------------------
    @property
    def acked_offset(self) -> int:
        return max((s.acked for s in self._sessions.values()), default=0)

    @property
    def sync_degraded(self) -> bool:
        return self._degraded

    def status(self) -> PrimaryStatus:
        last = self._slot.log.last_offset
        best = max(self._sessions.values(), key=lambda s: s.acked, default=None)
        acked = best.acked if best else 0
        lag = max(0, last - acked)
        return PrimaryStatus(
            connected=best is not None,
            peer=best.node_id if best else "",
            acked_offset=acked,
            last_offset=last,
            lag_offsets=lag,
            lag_seconds=time.monotonic() - best.caught_up_at if best and lag else 0.0,
            sync_degraded=self._degraded,
        )

    # --- sync mode -----------------------------------------------------------------------
    async def wait_replicated(self, offset: int) -> bool:
        """True once a standby acknowledged ``offset`` (applied and durable).

        async mode: never waits. sync mode: waits up to ``sync_timeout``; on timeout
        degrades to async (warning + metric) and returns False; while degraded returns
        at once (False unless already acked) until a standby catches up again.
        """
        if self.acked_offset >= offset:
            return True
        if self.mode != "sync" or self._degraded:
            return False
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._sync_waiters.append((offset, fut))
        try:
            async with asyncio.timeout(self.sync_timeout):
                return await asyncio.shield(fut)
        except TimeoutError:
            self._degrade(offset)
            return False
        finally:
            with contextlib.suppress(ValueError):
                self._sync_waiters.remove((offset, fut))

    def _degrade(self, offset: int) -> None:
        if self._degraded:
            return
        self._degraded = True
        self.sync_degraded_total += 1
        SYNC_DEGRADED.inc()
        logger.warning(
            "sync replication: no ack for offset %d within %.2fs (acked %d); "
            "degrading to async until the standby catches up",
            offset,
            self.sync_timeout,
            self.acked_offset,
        )
        waiters, self._sync_waiters = self._sync_waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_result(False)

    def _on_ack(self, session: _Session, applied: int) -> None:
        session.acked = max(session.acked, applied)
        last = self._slot.log.last_offset
        if session.acked >= last:
            session.caught_up_at = time.monotonic()
            if self._degraded:
                self._degraded = False
                logger.info("sync replication restored: standby acked offset %d", session.acked)
        keep: list[tuple[int, asyncio.Future[bool]]] = []
        for offset, fut in self._sync_waiters:
            if offset <= session.acked:
                if not fut.done():
                    fut.set_result(True)
            else:
                keep.append((offset, fut))
        self._sync_waiters = keep

    # --- the stream ----------------------------------------------------------------------
    async def Stream(
        self, request_iterator: AsyncIterator[pb.StreamRequest], context: Context
    ) -> AsyncIterator[pb.StreamResponse]:
        requests = aiter(request_iterator)
        try:
            async with asyncio.timeout(self.hello_timeout):
                first = await anext(requests)
        except (StopAsyncIteration, TimeoutError):
            return
        if first.WhichOneof("msg") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be hello")
        h = first.hello
        hello = replproto.Hello(h.node_id, h.history_id, h.applied_offset, h.epoch)
        log = self._slot.log
        decision = replproto.decide(hello, log.primary_state())
        logger.info("standby %s (%s): %s", hello.node_id, context.peer(), decision)
        if isinstance(decision, replproto.StepDown):
            await self.step_down(decision.peer_epoch, by=h.address)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, decision.reason)
        if isinstance(decision, replproto.Refuse):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, decision.reason)

        # A full resync starts from nothing we share: the standby's old offset counts
        # for nothing (it may even be of a diverged history) until it acks.
        shared = hello.applied_offset if isinstance(decision, replproto.Continue) else 0
        session = _Session(hello.node_id, context.peer(), shared)
        sid = self._next_id
        self._next_id += 1
        reader = asyncio.create_task(self._read_acks(requests, session))
        try:
            if isinstance(decision, replproto.Full):
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
                # encoded (and parsed into the message grpc serializes) in a worker
                # thread; the loop only hands it over.
                nxt = view.offset + 1
                chunks = snapshot_messages(view, self.chunk_bytes)
                del view  # the generator holds the pinned RocksDB version until it ends
                while True:
                    msg = await asyncio.to_thread(_next_chunk, chunks)
                    yield msg
                    if msg.snapshot_chunk.last:
                        break
                del chunks  # release the pinned RocksDB version
            else:
                assert isinstance(decision, replproto.Continue)
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
            self._sessions[sid] = session
            async for msg in self._tail(log, session, nxt, context):
                yield msg
        finally:
            self._sessions.pop(sid, None)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _tail(
        self, log: Log, session: _Session, nxt: int, context: Context
    ) -> AsyncIterator[pb.StreamResponse]:
        beat_due = 0.0
        sent_at = 0.0  # when the last entry batch went out
        while not session.closed.is_set():
            if log is not self._slot.log or not log.writable:
                # Demoted (fenced) or replaced: the standby must re-ask whoever leads.
                await context.abort(grpc.StatusCode.UNAVAILABLE, "this node is no longer primary")
            try:
                # The entries' bytes, framed as they are: no parse, no copy per entry.
                entries = log.read_raw(nxt, max_bytes=self.batch_bytes)
                linger = sent_at + self.linger - time.monotonic()
                if (
                    entries
                    and linger > 0
                    and self.mode != "sync"
                    and sum(map(len, entries)) < self.batch_bytes
                ):
                    # Async mode: at most one batch per ``linger`` unless it is full, so
                    # that a busy stream carries batches, not one message per write (a
                    # message costs both sides far more CPU than an entry in it). Sync
                    # mode sends at once: its writers wait for the standby's ack.
                    await asyncio.sleep(linger)
                    entries = log.read_raw(nxt, max_bytes=self.batch_bytes)
            except BacklogLost as exc:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"standby too slow: {exc}")
            if entries:
                nxt += len(entries)
                yield pb.StreamResponse.FromString(entries_message(entries))
                sent_at = time.monotonic()
            now = time.monotonic()
            if now >= beat_due:
                beat_due = now + self.heartbeat_interval
                yield pb.StreamResponse(
                    heartbeat=pb.Heartbeat(
                        primary_offset=log.last_offset,
                        primary_time_ms=int(time.time() * 1000),
                        epoch=log.epoch,
                    )
                )
            if not entries:
                await log.wait_for(nxt, within=max(0.0, beat_due - time.monotonic()))

    async def _read_acks(
        self, requests: AsyncIterator[pb.StreamRequest], session: _Session
    ) -> None:
        try:
            async for req in requests:
                if req.WhichOneof("msg") == "ack":
                    self._on_ack(session, req.ack.applied_offset)
        except (grpc.aio.AioRpcError, grpc.RpcError) as exc:
            logger.debug("standby %s: ack stream ended: %s", session.node_id, exc)
        finally:
            session.closed.set()

    async def step_down(self, peer_epoch: int, *, by: str = "") -> None:
        """A peer of ``peer_epoch`` (serving clients at ``by``, when known) deposed
        us: fence durably, release sync waiters, tell the node."""
        if self._slot.log.fence(peer_epoch):
            for _, fut in self._sync_waiters:
                if not fut.done():
                    fut.set_result(False)
            if self._on_fenced is not None:
                await self._on_fenced(peer_epoch, by)


def _next_chunk(chunks: Iterator[bytes]) -> pb.StreamResponse:
    """The next snapshot message, encoded and parsed in the calling (worker) thread."""
    return pb.StreamResponse.FromString(next(chunks))
