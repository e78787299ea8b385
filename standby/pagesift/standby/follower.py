"""The standby's client loop: follow the primary's log into the local store.

Wiring: ``pagesift.node.replicationparts.ReplicationParts`` builds a node's follower
(``follow``) beside its sender and promoter; read ``slot.store``/``slot.log`` at use,
never cache them (a full resync replaces both). An old primary restarted as a
standby of the new one simply runs a ``Follower``: it says hello with its own
history; the new primary answers continue (offset within the shared history) or
full (its unreplicated writes are discarded and counted in the log).

What it owns
------------
``Follower`` keeps one ``ReplicationService.Stream`` open to the primary:

1. **Hello** with (node id, history id, applied offset, epoch) from the local log.
2. **Decision.** A primary of a lower epoch than ours is stale (it lost a promotion)
   and is never followed. ``continue``: we adopt the primary's history id and epoch
   (durably) and wait for entries from applied + 1. ``full``: see 3.
3. **Full resync.** Snapshot chunks are applied into a FRESH store in a new
   directory beside the current one (through ``Store.apply``, the one write path);
   the last chunk's group also writes that store's tail offset, history and epoch.
   Only then the slot switches to it (``StoreSlot.install``, on the event loop: WAL
   synced, CURRENT replaced atomically, old store closed, then deleted). A standby
   killed mid-snapshot restarts on its OLD store, which names its old offset: it
   never believes it is in sync, it just asks again. Reads keep being served from
   the old store meanwhile.
4. **Entries.** Each batch is validated (``protocol.check_batch``) and applied by
   ``Log.append_replicated``: the ops, the entries (logged with the primary's
   offsets and epochs, so a promoted standby can serve ``continue``) and the new
   applied offset in ONE WriteBatch. Exactly once: an offset at or below the applied
   one is skipped; a crash between batches loses nothing that was acked. Messages
   arrive as bytes: an entry batch is cut into its entries' bytes
   (``framing.split_entries_message``), each parsed once for its ops and logged as
   received (never re-serialized). Batches are applied on the event loop in runs of
   at most ``APPLY_RUN_BYTES`` (one WriteBatch each), yielding between runs, while
   the next message is already being received.
5. **Acks** (the primary's sync mode waits for them): when no further message is
   waiting, at once but no sooner than ``ACK_MIN_GAP`` after the previous ack, so a
   lone entry is acked as soon as it is durable; while messages keep coming (the
   next one already buffered), once ``ACK_MAX_DELAY`` has passed since the previous
   ack. Heartbeats are acked the same way; they give
   the primary's offset and clock for lag. When to ack, and the lag, are decided by
   ``followerstate.step`` over a frozen ``FollowerState`` (pure, with a fake clock in
   its tests); this loop holds the current state, feeds it what happens, with
   ``time.monotonic()`` as the time (``_step``), keeps the state each step returns and
   carries out every action (``_carry_out``: acks, and waits for a message).
   A heartbeat that asks for a failsafe grant is answered on the next ack only once
   ``StandbyPromise.grant`` recorded this node's promise not to campaign
   (``pagesift.core.ha.failsafe``): a node without one, or campaigning, answers none.
6. **Reconnect** with bounded exponential backoff (jittered), from the applied
   offset, whenever the stream ends, errs or stays silent past ``idle_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

import grpc

from pagesift.core.ha.failsafe import StandbyPromise
from pagesift.core.replication import followerstate, protocol
from pagesift.core.replication.followerstate import (
    EntriesApplied,
    HeartbeatReceived,
    NextMessage,
    SendAck,
    SessionSynced,
    SnapshotInstalled,
    WaitForMessage,
)
from pagesift.core.replication.framing import split_entries_message
from pagesift.core.replication.log import Log
from pagesift.core.replication.slot import StoreSlot
from pagesift.core.util import tracing
from pagesift.core.util.backoff import backoff_delay
from pagesift.core.util.channels import open_channel
from pagesift.v1 import replication_pb2 as pb

logger = logging.getLogger(__name__)


# Responses arrive as bytes (no deserializer): an entry batch is cut into its entries'
# bytes, which the backlog logs as received; every other message is parsed here.
StreamCall = grpc.aio.StreamStreamCall[pb.StreamRequest, bytes]
_SERVICE = pb.DESCRIPTOR.services_by_name["ReplicationService"]
_STREAM_METHOD = f"/{_SERVICE.full_name}/{_SERVICE.methods_by_name['Stream'].name}"

# One entry (a page group) or one snapshot row can exceed gRPC's 4 MB default
# receive limit; a message we could never receive would loop the session forever.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]

#: Entries are applied on the event loop in runs of up to this many bytes (one
#: WriteBatch each; a single larger entry is a run of its own), yielding to the loop
#: between runs so reads on the standby wait at most one run. No worker thread:
#: rocksdict holds the GIL while it writes, so a thread only adds hand-offs.
APPLY_RUN_BYTES = 256 * 1024
#: Acks: when no further message is waiting, at once (sync mode on the primary waits
#: for them) but no sooner than ACK_MIN_GAP after the previous one; while the next
#: message is already buffered, once ACK_MAX_DELAY has passed since the previous one
#: (``followerstate`` decides).
ACK_MIN_GAP = followerstate.ACK_MIN_GAP
ACK_MAX_DELAY = followerstate.ACK_MAX_DELAY


def _drop(task: asyncio.Future[object] | None) -> None:
    """Cancel a read-ahead nobody will await, and never report its outcome."""
    if task is not None:
        task.cancel()
        task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Future[object]) -> None:
    if not task.cancelled():
        task.exception()


def hello_message(h: protocol.Hello, address: str = "") -> pb.Hello:
    """The wire form of a hello (``address``: where the sender serves clients, sent
    by a promoted node to its former primary)."""
    return pb.Hello(
        node_id=h.node_id,
        history_id=h.history_id,
        applied_offset=h.applied_offset,
        epoch=h.epoch,
        address=address,
    )


@dataclass(frozen=True)
class FollowerStatus:
    """What Role reports on a standby."""

    connected: bool
    target: str
    applied_offset: int
    primary_offset: int
    lag_offsets: int
    lag_seconds: float
    clock_skew_seconds: float  # primary clock minus ours, from the last heartbeat
    full_resyncs: int
    continues: int
    discarded: int
    last_error: str


class Follower:
    """Follows the primary at ``target`` into ``slot`` (see the module docstring)."""

    def __init__(
        self,
        slot: StoreSlot,
        target: str,
        *,
        node_id: str,
        idle_timeout: float = 5.0,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
        rng: Callable[[], float] = random.random,
        credentials: grpc.ChannelCredentials | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
        promise: StandbyPromise | None = None,
    ) -> None:
        self._slot = slot
        self._promise = promise  # failsafe: the node's promise not to campaign
        self.target = target
        self._credentials = credentials  # TLS / mTLS to the primary (None: plaintext)
        self._metadata = metadata  # e.g. the replication token
        self.node_id = node_id
        self.idle_timeout = idle_timeout
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._rng = rng
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._connected = False
        # The primary's offset and clock as heard, the lag, the acks owed.
        self._state = followerstate.FollowerState(
            caught_up_at=time.monotonic(), ack_min_gap=ACK_MIN_GAP, ack_max_delay=ACK_MAX_DELAY
        )
        self.full_resyncs = 0
        self.continues = 0
        self.discarded = 0
        self.primary_address = ""  # where the primary serves clients, as it told us
        self.sessions = 0
        self.messages = 0  # messages received after the decisions (all sessions)
        self.acks = 0  # acks sent (all sessions)
        self.last_error = ""

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        if self._stopping:
            raise RuntimeError("the follower is stopping")
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"follower->{self.target}")
        return self._task

    async def stop(self) -> None:
        """Stop following; returns when no apply is in flight any more."""
        task, self._task = self._task, None
        self._stopping = True
        if task is not None:
            # Re-cancel until done: library code (grpc's call teardown, a timeout
            # firing at the same moment) may absorb a single cancellation.
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=0.5)
            if not task.cancelled():
                task.exception()  # retrieved: ``run`` logged whatever ended it
        self._stopping = False
        self._connected = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # --- status --------------------------------------------------------------------------
    @property
    def applied_offset(self) -> int:
        return self._slot.log.last_offset

    def status(self) -> FollowerStatus:
        applied = self.applied_offset
        lag = self._state.lag(applied, time.monotonic())
        return FollowerStatus(
            connected=self._connected,
            target=self.target,
            applied_offset=applied,
            primary_offset=self._state.primary_offset,
            lag_offsets=lag.offsets,
            lag_seconds=lag.seconds,
            clock_skew_seconds=self._state.clock_skew,
            full_resyncs=self.full_resyncs,
            continues=self.continues,
            discarded=self.discarded,
            last_error=self.last_error,
        )

    # --- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        """Follow until cancelled; every failure leads to a bounded backoff."""
        attempt = 0
        while not self._stopping:
            synced = False
            try:
                synced = await self._session()
                self.last_error = "stream ended"
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self.last_error = f"{exc.code().name}: {exc.details()}"
                logger.warning("replication stream to %s: %s", self.target, self.last_error)
            except protocol.StalePrimary as exc:
                self.last_error = f"stale primary: {exc}"
                logger.error("not following %s: %s", self.target, exc)
            except Exception as exc:  # protocol errors, timeouts, disk errors: retry
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning("replication from %s failed: %s", self.target, self.last_error)
            finally:
                self._connected = False
            if self._stopping:
                return
            if synced:
                attempt = 0  # a session that got going resets the backoff
            delay = backoff_delay(
                attempt, base=self.backoff_base, cap=self.backoff_cap, jitter=self._rng()
            )
            attempt += 1
            await asyncio.sleep(delay)

    def _read_ahead(self, call: StreamCall) -> asyncio.Future[object]:
        """Start reading the next message (while we apply the current one)."""
        return asyncio.ensure_future(call.read())

    async def _next(self, reading: asyncio.Future[object]) -> bytes | None:
        """The message ``reading`` receives, or None at the end of the stream;
        ``TimeoutError`` when the primary stays silent past ``idle_timeout``."""
        if reading.done():
            msg = reading.result()
        else:
            async with asyncio.timeout(self.idle_timeout):  # cancels the read on expiry
                msg = await reading
        # Anything but bytes is grpc.aio.EOF: the primary closed the stream.
        return msg if isinstance(msg, bytes) else None

    async def _read(self, call: StreamCall) -> pb.StreamResponse | None:
        reading = self._read_ahead(call)
        try:
            raw = await self._next(reading)
        except BaseException:
            _drop(reading)
            raise
        return None if raw is None else pb.StreamResponse.FromString(raw)

    async def _session(self) -> bool:
        """One stream; returns whether it got past the decision."""
        channel = open_channel(self.target, self._credentials, options=_CHANNEL_OPTIONS)
        async with channel:
            stream = channel.stream_stream(
                _STREAM_METHOD,
                request_serializer=pb.StreamRequest.SerializeToString,
                response_deserializer=None,  # bytes: see StreamCall
            )
            # No request iterator: we write hello and acks on the call ourselves.
            call: StreamCall = stream(metadata=self._metadata)  # type: ignore[call-arg,assignment]
            self.sessions += 1
            log = self._slot.log
            if log.writable:
                raise RuntimeError("a writable primary does not follow anyone")
            await call.write(pb.StreamRequest(hello=hello_message(log.hello(self.node_id))))
            msg = await self._read(call)
            if msg is None:
                return False
            if msg.WhichOneof("msg") != "decision":
                raise protocol.ProtocolError("the primary's first message must be a decision")
            d = msg.decision
            # Never follow a primary of a lower epoch: it lost a promotion.
            protocol.check_primary_epoch(log.epoch, d.epoch)
            self.primary_address = d.primary_address
            if d.kind == pb.SYNC_KIND_FULL:
                logger.info(
                    "full resync from %s at offset %d: %s", self.target, d.snapshot_offset, d.reason
                )
                if d.discarded:
                    self.discarded += d.discarded
                    logger.warning(
                        "discarding %d local writes that never replicated (offsets past the "
                        "new primary's switch offset)",
                        d.discarded,
                    )
                await self._full_resync(call, d)
            elif d.kind == pb.SYNC_KIND_CONTINUE:
                if d.from_offset != log.last_offset + 1:
                    raise protocol.ProtocolError(
                        f"continue from {d.from_offset}, but we applied {log.last_offset}"
                    )
                log.adopt(d.history_id, d.epoch)
                self.continues += 1
                logger.info("continuing from %s at offset %d", self.target, d.from_offset)
            else:
                raise protocol.ProtocolError(f"unknown sync kind {d.kind}")
            self._connected = True
            await self._carry_out(call, self._step(SessionSynced()))
            await self._follow(call, d.epoch)
            return True

    async def _full_resync(self, call: StreamCall, d: pb.SyncDecision) -> None:
        store = self._slot.fresh_store()
        reading: asyncio.Future[object] | None = None
        try:
            while True:
                if reading is None:
                    reading = self._read_ahead(call)
                raw = await self._next(reading)
                reading = None
                if raw is None:
                    raise protocol.ProtocolError("stream ended inside the snapshot")
                msg = pb.StreamResponse.FromString(raw)
                if msg.WhichOneof("msg") != "snapshot_chunk":
                    raise protocol.ProtocolError("expected a snapshot chunk")
                chunk = msg.snapshot_chunk
                if not chunk.last:
                    reading = self._read_ahead(call)  # receive the next chunk meanwhile
                # The last chunk's group also writes the fresh store's identity: until
                # it commits, that store claims no history and no offset.
                local = (
                    Log.snapshot_locals(
                        offset=d.snapshot_offset,
                        tail_epoch=d.snapshot_entry_epoch,
                        history_id=d.history_id,
                        epoch=d.epoch,
                    )
                    if chunk.last
                    else None
                )
                store.apply(chunk.ops, local=local)
                if chunk.last:
                    break
        except BaseException:
            _drop(reading)
            self._slot.discard(store)
            raise
        # Complete: switch (WAL sync, CURRENT rename, old store closed and deleted).
        # On the event loop thread, so nobody on it sees the switch half made.
        old_path = self._slot.store.path
        try:
            self._slot.install(store, delete_old=False)
        except BaseException:
            if self._slot.store is not store:
                self._slot.discard(store)
            raise
        self.full_resyncs += 1
        await asyncio.to_thread(shutil.rmtree, old_path, True)
        installed = SnapshotInstalled(d.snapshot_offset, self.applied_offset)
        await self._carry_out(call, self._step(installed))

    async def _follow(self, call: StreamCall, primary_epoch: int) -> None:
        reading = self._read_ahead(call)
        try:
            while True:
                # An ack owed goes out when the stream is idle (ACK_MIN_GAP apart); while
                # messages keep coming, acks are coalesced (ACK_MAX_DELAY apart).
                await self._carry_out(call, self._step(NextMessage(reading.done())), reading)
                raw = await self._next(reading)
                if raw is None:
                    return
                reading = self._read_ahead(call)
                self.messages += 1
                raws = split_entries_message(raw)
                if raws is not None:
                    entries = [pb.LogEntry.FromString(data) for data in raws]
                else:
                    msg = pb.StreamResponse.FromString(raw)
                    kind = msg.WhichOneof("msg")
                    if kind == "heartbeat":
                        hb = msg.heartbeat
                        if hb.epoch != primary_epoch:
                            raise protocol.ProtocolError(
                                f"heartbeat epoch {hb.epoch} != {primary_epoch}"
                            )
                        heard = HeartbeatReceived(
                            hb.primary_offset,
                            hb.primary_time_ms,
                            time.time(),
                            self.applied_offset,
                            self._grant(hb.failsafe_request, hb.failsafe_ttl_ms),
                        )
                        await self._carry_out(call, self._step(heard))
                        continue
                    if kind != "entries":
                        raise protocol.ProtocolError(f"unexpected {kind} after the decision")
                    entries = list(msg.entries.entries)  # an unusual layout: re-serialized
                    raws = None
                if not entries:
                    continue
                await self._apply(entries, raws, primary_epoch)
                applied = EntriesApplied(entries[-1].offset, self.applied_offset)
                await self._carry_out(call, self._step(applied))
        finally:
            _drop(reading)

    async def _apply(
        self, entries: list[pb.LogEntry], raws: list[bytes] | None, primary_epoch: int
    ) -> None:
        """Apply a message's entries on the event loop in runs of about
        ``APPLY_RUN_BYTES``, letting the loop serve reads between runs."""
        sizes = [len(r) for r in raws] if raws is not None else [e.ByteSize() for e in entries]
        start, n = 0, len(entries)
        while start < n:
            end, size = start + 1, sizes[start]
            while end < n and size + sizes[end] <= APPLY_RUN_BYTES:
                size += sizes[end]
                end += 1
            # linked to the primary's store.commit spans by offset, not by trace context
            with tracing.span("replication.apply") as span:
                if span is not None:
                    span.set_attribute("pagesift.log.first_offset", entries[start].offset)
                    span.set_attribute("pagesift.log.last_offset", entries[end - 1].offset)
                    span.set_attribute("pagesift.log.entries", end - start)
                self._slot.log.append_replicated(
                    entries[start:end],
                    primary_epoch=primary_epoch,
                    raw=raws[start:end] if raws is not None else None,
                )
            start = end
            if start < n:
                await asyncio.sleep(0)

    def _step(self, event: followerstate.Event) -> list[followerstate.Action]:
        """Step the machine at ``time.monotonic()``, keep the state it returns; its
        actions are the caller's to carry out (``_carry_out``), every one."""
        self._state, actions = followerstate.step(self._state, event, time.monotonic())
        return actions

    async def _carry_out(
        self,
        call: StreamCall,
        actions: list[followerstate.Action],
        reading: asyncio.Future[object] | None = None,
    ) -> None:
        """Carry out every action ``step`` returned, in order. ``WaitForMessage`` answers
        ``NextMessage`` only: wait for the message being ``reading`` until then, and ask
        again (its answer is carried out in turn)."""
        pending = deque(actions)
        while pending:
            action = pending.popleft()
            match action:
                case SendAck(grant):
                    await self._ack(call, grant)
                case WaitForMessage(until):
                    if reading is None:
                        raise RuntimeError("WaitForMessage answers NextMessage only")
                    await asyncio.wait({reading}, timeout=until - time.monotonic())
                    again = self._step(NextMessage(reading.done()))
                    pending.extendleft(reversed(again))
                case _:
                    assert_never(action)

    def _grant(self, request: int, ttl_ms: int) -> int:
        """The failsafe request to answer: ``request`` once promised, else 0."""
        if not request or self._promise is None:
            return 0
        return request if self._promise.grant(time.monotonic(), ttl_ms / 1000) else 0

    async def _ack(self, call: StreamCall, grant: int) -> None:
        self.acks += 1
        ack = pb.Ack(applied_offset=self.applied_offset, failsafe_grant=grant)
        await call.write(pb.StreamRequest(ack=ack))
