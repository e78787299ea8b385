"""The replication log: every write group as an entry (epoch, offset, ops), on disk.

What it owns
------------
``Log`` is the ``Store`` observer that turns each committed write group into a log
entry, keeps a byte-bounded backlog of recent entries for standbys that reconnect,
and keeps the node's replication identity (epoch, history id, previous history and
switch offset, fencing). ``StoreSlot`` holds the node's CURRENT store and its log:
a standby's full resync builds a fresh store next to the current one and switches
the slot (and the on-disk CURRENT pointer) only when the snapshot is complete.

Storage layout (node-local keys: never replicated, never digested)
------------------------------------------------------------------
::

    _repl/log/{offset:u64be}   -> LogEntry (protobuf)   the backlog, oldest first
    _repl/tail                 -> u64 offset, u64 epoch  last entry written/applied
    _repl/epoch                -> u64                    this node's epoch
    _repl/history              -> utf-8                  history id ("" = never synced)
    _repl/prev_history         -> utf-8                  history we were promoted from
    _repl/switch               -> u64                    its last offset on this node
    _repl/fenced               -> u64                    higher epoch seen as primary
    _repl/role                 -> b"primary" | b"standby" | b"fenced"  (informative)

    {data_dir}/CURRENT         -> name of the store directory in use (e.g. "db")

The guarantees
--------------
* **Commit and log are one fact.** On a primary, ``stage`` runs inside the store's
  write section, before the commit, and puts the entry, the new tail and the
  deletes of trimmed entries into the group's own WriteBatch: a crash keeps both or
  neither, and because offsets are assigned under the same lock, log order is write
  order. In-memory counters move only in ``committed`` (after the batch is durable),
  so a failed commit leaves them untouched.
* **Applied offset and data are one fact.** On a standby, ``append_replicated``
  applies a run of entries' ops together with those entries (same offsets, same
  epochs) and the new tail in ONE group: an entry is applied exactly once, and a
  replay of an already-applied offset is skipped by the offset check (and would be
  harmless anyway: every op is idempotent). Logging them keeps a backlog from which
  the standby, once promoted, can serve ``continue`` to the old primary.
* **Bounded backlog that survives restarts.** Entries are trimmed oldest first once
  the backlog exceeds ``max_bytes`` (the newest entry always stays). On open, the
  first/last offsets and sizes are recovered by scanning ``_repl/log/``. The newest
  entries (up to ``RECENT_BYTES``) are also kept in memory as the bytes written, so
  a standby that keeps up is served without reading RocksDB; memory only ever holds
  entries the backlog holds too, and reading it is as lock-free as reading RocksDB.
* **Entries travel as bytes.** The bytes a primary logs are the bytes it sends
  (``read_raw`` + ``entries_message``) and the bytes a standby logs
  (``split_entries_message`` + ``append_replicated(raw=...)``): nothing is
  re-serialized on the way, and a promoted standby serves exactly what it received.
* **Writes only on a writable primary.** ``stage`` raises ``NotWritable`` (and so
  the whole write fails, nothing committed) unless ``open_for_writes`` or
  ``promote`` made this node the primary and no higher epoch fenced it.
* **Consistent cuts without stopping writers.** ``view()`` creates a RocksDB
  iterator while holding the write section: a RocksDB iterator reads an implicit
  snapshot pinned at its creation, so iterating it later, outside the lock, sees
  exactly the state at ``view.offset`` while writers go on. (rocksdict 0.3.29's
  ``Snapshot.iter()``/``items()`` do NOT honour the snapshot - only point reads do -
  so the plain iterator is the snapshot here; ``tests/test_replog.py`` pins this.)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
import shutil
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pagesift.shared import replproto
from pagesift.shared.store import LOCAL, Store, WriteGroup, local_key
from pagesift.v1 import replication_pb2, store_pb2

logger = logging.getLogger(__name__)

T = TypeVar("T")
LogEntry = replication_pb2.LogEntry

#: Default backlog bound: at least 60 s at peak write rate. The crawl bench peaks at
#: ~240 pages/s with ~16 KB of Markdown per page (bench/out/crawl.md), i.e. ~4 MB/s
#: of page groups plus small frontier/done groups: 60 s is ~250-300 MB, so 512 MiB
#: (Redis users suffer endless full-resync loops from its 1 MB default).
DEFAULT_BACKLOG_BYTES = 512 * 1024 * 1024

#: The newest entries are also kept in memory, serialized, so that a standby that keeps
#: up is fed without reading each entry back from RocksDB (bounded by the backlog too).
RECENT_BYTES = 32 * 1024 * 1024

_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")
_LOG = local_key("repl/log/")
_TAIL = local_key("repl/tail")
_EPOCH = local_key("repl/epoch")
_HISTORY = local_key("repl/history")
_PREV = local_key("repl/prev_history")
_SWITCH = local_key("repl/switch")
_FENCED = local_key("repl/fenced")
_ROLE = local_key("repl/role")
_LOCAL_END = bytes([LOCAL[0] + 1])  # first key after every node-local key
_PLAN = "replog.plan"


def _u64(raw: bytes | None) -> int:
    return int(_U64.unpack(raw)[0]) if raw else 0


def entry_key(offset: int) -> bytes:
    return _LOG + _U64.pack(offset)


class NotWritable(RuntimeError):
    """A write reached a node that is not a writable primary (standby or fenced)."""


class Fenced(NotWritable):
    """This node met a higher epoch; it takes no writes until it follows the new one."""


class BacklogLost(Exception):
    """The requested offset was trimmed from the backlog (the reader fell behind)."""


class OffsetPassed(Exception):
    """A digest was asked for an offset this node has already applied past."""


@dataclass
class View:
    """A consistent cut: a RocksDB iterator pinned at ``offset`` (see module doc)."""

    iterator: Any  # rocksdict.RdictIter: an implicit snapshot taken at creation
    offset: int
    tail_epoch: int


@dataclass
class _Plan:
    """What a staged group will do to the in-memory backlog once it commits."""

    first: int
    last: int
    tail_epoch: int
    new_sizes: list[int]
    dropped: int
    written: list[tuple[int, bytes]]  # (offset, entry bytes) that went into the backlog


def _wake(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _call_in_loop(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any], value: Any) -> None:
    # committed() may run on any thread: hand the wake-up to the future's own loop
    # (directly when we are on it: no self-pipe write, the primary's usual case).
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        _wake(fut, value)
        return
    with contextlib.suppress(RuntimeError):  # loop already closed: nobody waits
        loop.call_soon_threadsafe(_wake, fut, value)


class Log:
    """The replication log of one store (an ``Observer``; attaches itself on creation).

    Lifecycle: ``Log(store)`` on both roles at start-up; then ``open_for_writes()`` on
    a primary (or ``promote()`` later on a standby). A standby's follower calls
    ``adopt`` after each decision and ``append_replicated`` for each batch.
    """

    def __init__(self, store: Store, *, max_bytes: int = DEFAULT_BACKLOG_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self._store = store
        self.max_bytes = max_bytes
        self._writable = False
        self._applying = False
        self._closed = False
        self._wlock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = []
        self._pins: dict[int, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]]] = {}
        # The newest backlog entries as bytes: offsets [_recent_lo, _last], a subset of
        # the backlog. ``read`` looks here first (a dict get is atomic; entries are
        # immutable) and falls back to RocksDB.
        self._recent: dict[int, bytes] = {}
        self._recent_lo = 0
        self._recent_bytes = 0
        self._recent_max = min(max_bytes, RECENT_BYTES)
        with store.lock:
            self._load()
            store.add_observer(self)

    # --- recovery --------------------------------------------------------------------
    def _load(self) -> None:
        get = self._store.get_local
        tail = get(_TAIL)
        last, tail_epoch = _U64X2.unpack(tail) if tail else (0, 0)
        self._last: int = int(last)
        self._tail_epoch: int = int(tail_epoch)
        self.epoch: int = _u64(get(_EPOCH))
        self.history_id: str = (get(_HISTORY) or b"").decode()
        self.prev_history_id: str = (get(_PREV) or b"").decode()
        self.switch_offset: int = _u64(get(_SWITCH))
        self.fenced_epoch: int = _u64(get(_FENCED))
        self.persisted_role: str = (get(_ROLE) or b"").decode()
        # Scan the backlog: it is contiguous and ends at the tail because entries
        # and the tail are written in the same batch, and trimming deletes from the
        # front in the same batch as the entry that caused it.
        self._sizes: deque[int] = deque()
        first = self._last + 1
        it = self._store.iterator()  # read-only scan; writes still go through Store
        it.seek(_LOG)
        expected = -1
        while it.valid():
            key: bytes = it.key()
            if not key.startswith(_LOG):
                break
            offset = _u64(key[len(_LOG) :])
            if expected not in (-1, offset) or offset > self._last:
                raise RuntimeError(f"corrupt backlog at offset {offset} (tail {self._last})")
            if expected == -1:
                first = offset
            self._sizes.append(len(key) + len(it.value()))
            expected = offset + 1
            it.next()
        del it
        self._first = first
        self._bytes = sum(self._sizes)

    # --- state -------------------------------------------------------------------------
    @property
    def store(self) -> Store:
        return self._store

    @property
    def last_offset(self) -> int:
        """The newest entry written (primary) or applied (standby)."""
        return self._last

    @property
    def first_offset(self) -> int:
        """The oldest entry still in the backlog (``last_offset + 1`` when empty)."""
        return self._first

    @property
    def tail_epoch(self) -> int:
        return self._tail_epoch

    @property
    def backlog_bytes(self) -> int:
        return self._bytes

    @property
    def writable(self) -> bool:
        return self._writable

    @property
    def role(self) -> str:
        if self._writable:
            return "primary"
        if not replproto.may_accept_writes(self.epoch, self.fenced_epoch):
            return "fenced"
        return "standby"

    def primary_state(self) -> replproto.PrimaryState:
        with self._store.lock:
            return replproto.PrimaryState(
                writable=self._writable,
                epoch=self.epoch,
                history_id=self.history_id,
                prev_history_id=self.prev_history_id,
                switch_offset=self.switch_offset,
                first_offset=self._first,
                last_offset=self._last,
            )

    def hello(self, node_id: str) -> replproto.Hello:
        with self._store.lock:
            return replproto.Hello(node_id, self.history_id, self._last, self.epoch)

    # --- identity changes (durable before they take effect) ----------------------------
    def _persist(self, values: dict[bytes, bytes | None]) -> None:
        def run(group: WriteGroup) -> None:
            for key, value in values.items():
                group.put_local(key, value)

        self._store.write(run)  # no ops: observers are not involved, only the batch
        # Identity changes are rare and must survive power loss even with fsync off.
        self._store.sync_wal()

    def open_for_writes(self) -> None:
        """Make this node the writable primary (start-up of a primary).

        A node with no history starts one (epoch 1). Raises ``Fenced`` when a higher
        epoch fenced this node: restarting must not resurrect a deposed primary.
        """
        with self._store.lock:
            if not replproto.may_accept_writes(self.epoch, self.fenced_epoch):
                raise Fenced(
                    f"fenced by epoch {self.fenced_epoch} (ours {self.epoch}): "
                    "rejoin as a standby of the new primary"
                )
            if not self.history_id:
                self.history_id = uuid.uuid4().hex
                self.epoch = max(self.epoch, 1)
            self._persist(
                {
                    _HISTORY: self.history_id.encode(),
                    _EPOCH: _U64.pack(self.epoch),
                    _ROLE: b"primary",
                }
            )
            self.persisted_role = "primary"
            self._writable = True

    def promote(self, new_history_id: str | None = None) -> replproto.Promotion:
        """Standby -> primary: record epoch + 1, a new history id and the switch offset
        durably (WAL synced), THEN accept writes. Idempotent on a primary."""
        with self._store.lock:
            if self._writable:
                return replproto.Promotion(
                    self.epoch, self.history_id, self.prev_history_id, self.switch_offset
                )
            plan = replproto.plan_promotion(
                epoch=max(self.epoch, self.fenced_epoch),
                history_id=self.history_id,
                applied_offset=self._last,
                new_history_id=new_history_id or uuid.uuid4().hex,
            )
            self._persist(
                {
                    _EPOCH: _U64.pack(plan.epoch),
                    _HISTORY: plan.history_id.encode(),
                    _PREV: plan.prev_history_id.encode(),
                    _SWITCH: _U64.pack(plan.switch_offset),
                    _ROLE: b"primary",
                }
            )
            self.epoch, self.history_id = plan.epoch, plan.history_id
            self.prev_history_id, self.switch_offset = plan.prev_history_id, plan.switch_offset
            self.persisted_role = "primary"
            self._writable = True
            return plan

    def fence(self, higher_epoch: int) -> bool:
        """Stop taking writes because a peer or entry of ``higher_epoch`` was seen.

        Durable: a restart keeps the node fenced until it follows a primary of that
        epoch. Returns True when this call fenced the node."""
        with self._store.lock:
            if not replproto.must_fence(self.epoch, higher_epoch):
                return False
            was_writable = self._writable
            self._writable = False
            if higher_epoch > self.fenced_epoch:
                self.fenced_epoch = higher_epoch
                self._persist({_FENCED: _U64.pack(higher_epoch), _ROLE: b"fenced"})
                self.persisted_role = "fenced"
            if was_writable:
                logger.error(
                    "fenced: met epoch %d > ours %d; this node takes no more writes",
                    higher_epoch,
                    self.epoch,
                )
            return was_writable

    def adopt(self, history_id: str, epoch: int) -> None:
        """A standby follows a primary of (``history_id``, ``epoch``): record it."""
        with self._store.lock:
            if self._writable:
                raise RuntimeError("a writable primary cannot follow another node")
            replproto.check_primary_epoch(self.epoch, epoch)
            if (history_id, epoch) == (self.history_id, self.epoch) and (
                self.persisted_role == "standby"
            ):
                return
            self._persist(
                {_HISTORY: history_id.encode(), _EPOCH: _U64.pack(epoch), _ROLE: b"standby"}
            )
            self.history_id, self.epoch, self.persisted_role = history_id, epoch, "standby"

    @staticmethod
    def snapshot_locals(
        *, offset: int, tail_epoch: int, history_id: str, epoch: int
    ) -> dict[bytes, bytes | None]:
        """The node-local keys a fresh store gets in the SAME group as the last
        snapshot chunk: until that group commits the store claims no history, so a
        standby killed mid-snapshot can never believe it is in sync."""
        return {
            _TAIL: _U64X2.pack(offset, tail_epoch),
            _HISTORY: history_id.encode(),
            _EPOCH: _U64.pack(epoch),
            _ROLE: b"standby",
        }

    # --- the write path (primary) ------------------------------------------------------
    def write(self, fn: Callable[[WriteGroup], T]) -> tuple[T, int]:
        """``store.write(fn)`` that also returns the group's offset (for
        ``wait_replicated``); the last offset when the group wrote nothing."""
        with self._store.lock:
            result, _ = self._store.write(fn)
            return result, self._last

    def stage(self, group: WriteGroup) -> None:
        """Observer hook, inside the write section before the commit."""
        if self._applying:
            return  # append_replicated staged the entries itself
        if self._closed or not self._writable:
            raise NotWritable(f"this node is a {self.role}; writes go to the primary")
        offset = self._last + 1
        data = LogEntry(epoch=self.epoch, offset=offset, ops=group.ops).SerializeToString()
        group.info["offset"] = offset
        group.info[_PLAN] = self._stage_entries(group.put_local, [(offset, self.epoch, data)])

    def committed(self, group: WriteGroup) -> None:
        """Observer hook, after the batch is durable, still inside the write section."""
        plan = group.info.get(_PLAN)
        if isinstance(plan, _Plan):
            self._finish(plan)

    def _stage_entries(
        self,
        put: Callable[[bytes, bytes | None], None],
        entries: Sequence[tuple[int, int, bytes]],
    ) -> _Plan:
        """Stage entries (offset, epoch, bytes), the tail and the trimming deletes."""
        new_sizes = [len(entry_key(off)) + len(data) for off, _, data in entries]
        total = self._bytes + sum(new_sizes)
        count = len(self._sizes) + len(new_sizes)
        sizes = itertools.chain(self._sizes, new_sizes)  # consumed only while trimming
        dropped = 0
        # Oldest first, and never the newest entry: a standby can always continue
        # from the entry before the one it has not yet seen.
        while total > self.max_bytes and dropped < count - 1:
            total -= next(sizes)
            dropped += 1
        old_dropped = min(dropped, len(self._sizes))
        for i in range(old_dropped):
            put(entry_key(self._first + i), None)
        written: list[tuple[int, bytes]] = []
        for i, (off, _, data) in enumerate(entries):
            if len(self._sizes) + i >= dropped:  # an entry trimmed at birth is not written
                put(entry_key(off), data)
                written.append((off, data))
        last_off, last_epoch, _ = entries[-1]
        put(_TAIL, _U64X2.pack(last_off, last_epoch))
        return _Plan(self._first + dropped, last_off, last_epoch, new_sizes, dropped, written)

    def _finish(self, plan: _Plan) -> None:
        self._sizes.extend(plan.new_sizes)
        self._bytes += sum(plan.new_sizes)
        for _ in range(plan.dropped):
            self._bytes -= self._sizes.popleft()
        self._first, self._last, self._tail_epoch = plan.first, plan.last, plan.tail_epoch
        self._remember(plan.written)
        self._resolve_pin(plan.last)
        with self._wlock:
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            _call_in_loop(loop, fut, None)

    def _remember(self, written: list[tuple[int, bytes]]) -> None:
        """Keep the newest entries in memory (inside the write section, after commit)."""
        recent = self._recent
        if written and recent and written[0][0] != self._recent_lo + len(recent):
            recent.clear()  # not contiguous (cannot happen today): start over
            self._recent_bytes = 0
        for off, data in written:
            if not recent:
                self._recent_lo = off
            recent[off] = data
            self._recent_bytes += len(data)
        # Evict the oldest: over the bound, or trimmed from the backlog (never serve
        # from memory what ``read`` must report as lost). The newest entry stays.
        while recent and (
            self._recent_lo < self._first
            or (self._recent_bytes > self._recent_max and len(recent) > 1)
        ):
            self._recent_bytes -= len(recent.pop(self._recent_lo))
            self._recent_lo += 1

    # --- the apply path (standby) ------------------------------------------------------
    def append_replicated(
        self,
        entries: Sequence[replication_pb2.LogEntry],
        *,
        primary_epoch: int,
        raw: Sequence[bytes] | None = None,
    ) -> int:
        """Apply received entries and log them; returns the new applied offset.

        Validated by ``replproto.check_batch`` (contiguous, epochs sane); entries at
        or below the applied offset are skipped. Runs of entries go in one group each
        (ops + the entries + the tail in one WriteBatch), split after any offset a
        Digest is waiting for, so that digest sees exactly that offset.

        ``raw``, when given, holds each entry as received (``raw[i]`` serializes
        ``entries[i]``): the backlog logs those bytes instead of re-serializing.
        """
        if raw is not None and len(raw) != len(entries):
            raise ValueError("raw must hold one serialized entry per entry")
        with self._store.lock:
            if self._writable:
                raise RuntimeError("a writable primary does not apply replicated entries")
            metas = [replproto.EntryMeta(e.offset, e.epoch) for e in entries]
            skip = replproto.check_batch(
                metas, applied=self._last, tail_epoch=self._tail_epoch, primary_epoch=primary_epoch
            )
            todo = list(entries[skip:])
            todo_raw = list(raw[skip:]) if raw is not None else None
            while todo:
                cut = len(todo)
                if self._pins:
                    with self._wlock:
                        pinned = [i for i, e in enumerate(todo) if e.offset in self._pins]
                    if pinned:
                        cut = pinned[0] + 1
                part, todo = todo[:cut], todo[cut:]
                if todo_raw is not None:
                    part_raw, todo_raw = todo_raw[:cut], todo_raw[cut:]
                else:
                    part_raw = [e.SerializeToString() for e in part]
                local: dict[bytes, bytes | None] = {}
                plan = self._stage_entries(
                    local.__setitem__,
                    [(e.offset, e.epoch, data) for e, data in zip(part, part_raw, strict=True)],
                )
                ops = [op for e in part for op in e.ops]
                self._applying = True
                try:
                    self._store.apply(ops, local=local)
                finally:
                    self._applying = False
                self._finish(plan)
            return self._last

    # --- reading -----------------------------------------------------------------------
    def read(
        self, from_offset: int, *, max_bytes: int = 1 << 20, max_entries: int = 10_000
    ) -> list[replication_pb2.LogEntry]:
        """Entries from ``from_offset`` on (at least one if any exists, then up to
        ``max_bytes``). Lock-free: entries at or below ``last_offset`` are committed
        and immutable; the only race is trimming, reported as ``BacklogLost``."""
        raws = self.read_raw(from_offset, max_bytes=max_bytes, max_entries=max_entries)
        return [LogEntry.FromString(data) for data in raws]

    def read_raw(
        self, from_offset: int, *, max_bytes: int = 1 << 20, max_entries: int = 10_000
    ) -> list[bytes]:
        """``read``, serialized: entry ``from_offset + i`` is item ``i`` (the bytes the
        backlog holds, from memory for the newest entries)."""
        if from_offset < 1:
            raise ValueError("offsets start at 1")
        out: list[bytes] = []
        size = 0
        last = self._last
        offset = from_offset
        recent = self._recent
        get = self._store.get_local
        while offset <= last and len(out) < max_entries and (not out or size < max_bytes):
            data = recent.get(offset)
            if data is None:
                data = get(entry_key(offset))
                if data is None:
                    raise BacklogLost(f"entry {offset} left the backlog (first {self._first})")
            out.append(data)
            size += len(data)
            offset += 1
        if not out and from_offset < self._first:
            raise BacklogLost(f"entry {from_offset} left the backlog (first {self._first})")
        return out

    async def wait_for(self, offset: int, within: float) -> bool:
        """Wait until ``last_offset >= offset``; False on timeout."""
        if self._last >= offset:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        with self._wlock:
            self._waiters.append((loop, fut))
        if self._last >= offset:  # committed between the check and the registration
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await fut
        return self._last >= offset

    # --- consistent cuts (snapshots, digests) -----------------------------------------
    def view(self) -> View:
        """A consistent cut at the current offset (see the module docstring)."""
        with self._store.lock:
            return self._view_locked()

    def _view_locked(self) -> View:
        return View(self._store.iterator(), self._last, self._tail_epoch)

    def _resolve_pin(self, offset: int) -> None:
        with self._wlock:
            waiters = self._pins.pop(offset, [])
        if waiters:
            view = self._view_locked()  # still inside the commit's critical section
            for loop, fut in waiters:
                _call_in_loop(loop, fut, view)

    async def view_at(self, offset: int, within: float) -> View:
        """A cut exactly at ``offset`` (0 = now): immediate when we stand there, taken
        inside the commit of ``offset`` when we are behind; ``OffsetPassed`` when we
        are past it, ``TimeoutError`` when it is not reached in time."""
        if offset <= 0:
            return self.view()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        with self._store.lock:
            if offset == self._last:
                return self._view_locked()
            if offset < self._last:
                raise OffsetPassed(f"asked for offset {offset}, already at {self._last}")
            with self._wlock:
                self._pins.setdefault(offset, []).append((loop, fut))
        try:
            async with asyncio.timeout(within):
                view: View = await fut
            return view
        finally:
            with self._wlock:
                pins = self._pins.get(offset, [])
                if (loop, fut) in pins:
                    pins.remove((loop, fut))
                if not pins:
                    self._pins.pop(offset, None)

    def close(self) -> None:
        """Detach from the store (before the store closes or is replaced)."""
        with self._store.lock:
            if self._closed:
                return
            self._closed = True
            self._writable = False
            self._store.remove_observer(self)
        with self._wlock:
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            _call_in_loop(loop, fut, None)


# --- snapshots as ops ---------------------------------------------------------------------


def replicated_pairs(view: View) -> Iterator[tuple[bytes, bytes]]:
    """Every replicated key/value of the cut in byte order (node-local keys skipped
    with one seek: they all sort before ``_LOCAL_END``)."""
    it = view.iterator
    it.seek_to_first()
    while it.valid():
        key: bytes = it.key()
        if key.startswith(LOCAL):
            it.seek(_LOCAL_END)
            continue
        yield key, it.value()
        it.next()


def view_digest(view: View) -> str:
    """``Store.digest()`` of the cut (same hash, same order)."""
    h = hashlib.sha256()
    for key, value in replicated_pairs(view):
        h.update(_U64.pack(len(key)))
        h.update(key)
        h.update(_U64.pack(len(value)))
        h.update(value)
    return h.hexdigest()


def ops_from_pairs(pairs: Iterator[tuple[bytes, bytes]]) -> Iterator[store_pb2.Op]:
    """Re-express raw store rows (the layout in ``pagesift.shared.store``) as ops, so
    a full resync rebuilds the standby through the one write path, ``Store.apply``.

    Rebuilding is exact because: a list's items keep their sequence numbers (a
    ``ListPush`` per item, seq preserved) and its head is restored by a
    ``ListClear(upto=head)`` (items below the head do not exist, so it deletes
    nothing and only raises the head); the next counter equals the last item + 1, or
    the head for an empty list, which the clear restores too. A set's size row (``c``)
    sorts before its members (``s``): each member's ``SetInsert`` carries that size,
    which is what the set holds once all of them are in. Rows come in key order.
    """
    op = store_pb2.Op
    sizes: dict[bytes, int] = {}
    for key, value in pairs:
        tag, rest = key[:1], key[1:]
        if tag == b"k":
            yield op(kv_put=store_pb2.KvPut(key=rest.decode(), value=value))
        elif tag == b"l":
            name, _, seq = rest.partition(b"\x00")
            yield op(
                list_push=store_pb2.ListPush(
                    list=name.decode(), seq=_U64.unpack(seq)[0], item=value
                )
            )
        elif tag == b"m":
            head, _ = _U64X2.unpack(value)
            if head:
                yield op(list_clear=store_pb2.ListClear(list=rest.decode(), upto=head))
        elif tag == b"s":
            name, _, member = rest.partition(b"\x00")
            yield op(
                set_insert=store_pb2.SetInsert(
                    set=name.decode(), member=member, size=_set_size(sizes, name)
                )
            )
        elif tag == b"c":
            sizes[rest] = _U64.unpack(value)[0]
        else:
            raise ValueError(f"unknown store row {key[:32]!r}")


def _set_size(sizes: dict[bytes, int], name: bytes) -> int:
    size = sizes.get(name)
    if size is None:
        raise ValueError(f"set {name[:32]!r} has members but no size row")
    return size


def snapshot_chunks(view: View, chunk_bytes: int = 1 << 20) -> Iterator[list[store_pb2.Op]]:
    """The cut as lists of ops of about ``chunk_bytes`` each (at least one list): the
    ops of ``ops_from_pairs``, in the chunks ``snapshot_messages`` sends."""
    for body, _ in snapshot_chunk_bodies(view, chunk_bytes):
        yield list(replication_pb2.SnapshotChunk.FromString(body).ops)


# --- wire encoding: replication messages built from (and split into) bytes -------------
#
# The hot paths move serialized entries and rows without building a protobuf object per
# entry or per row: the primary keeps each entry's bytes (the backlog holds them) and
# frames them into an ``EntryBatch``; the standby cuts the received batch back into the
# entries' bytes and logs exactly those; the snapshot encodes rows straight into ``Op``
# bytes in the worker thread. Field numbers are those of replication.proto and
# store.proto; ``tests/test_replog.py`` checks the bytes against the protobuf runtime.

_VARINTS = [bytes([n]) if n < 0x80 else bytes([(n & 0x7F) | 0x80, n >> 7]) for n in range(1 << 14)]
_TAG1 = b"\x0a"  # field 1, length-delimited: EntryBatch.entries, SnapshotChunk.ops, names
_TAG2 = b"\x12"  # field 2, length-delimited: StreamResponse.snapshot_chunk, values, members
_TAG3 = b"\x1a"  # field 3, length-delimited: StreamResponse.entries, ListPush.item
_SEQ = b"\x10"  # field 2, varint: ListPush.seq, ListClear.upto
_SIZE = b"\x18"  # field 3, varint: SetInsert.size
_OP_KV_PUT = b"\x0a"  # Op.kv_put = 1
_OP_LIST_PUSH = b"\x1a"  # Op.list_push = 3
_OP_LIST_CLEAR = b"\x2a"  # Op.list_clear = 5
_OP_SET_INSERT = b"\x32"  # Op.set_insert = 6
_CHUNK_LAST = b"\x10\x01"  # SnapshotChunk.last = true
_GIL_ROWS = 16  # rows between clock checks while building a snapshot chunk
_GIL_HOLD = 0.001  # seconds of GIL use between releases (the switch interval is 5 ms)


def _varint(n: int) -> bytes:
    if n < 1 << 14:
        return _VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def entries_message(raws: Sequence[bytes]) -> bytes:
    """A serialized ``StreamResponse(entries=EntryBatch(entries=...))`` of serialized
    entries, framed without parsing them."""
    parts: list[bytes] = [_TAG3, b""]
    size = 0
    for data in raws:
        n = _varint(len(data))
        parts += (_TAG1, n, data)
        size += 1 + len(n) + len(data)
    parts[1] = _varint(size)
    return b"".join(parts)


def split_entries_message(raw: bytes) -> list[bytes] | None:
    """The serialized entries of a serialized ``StreamResponse`` that carries an
    ``EntryBatch`` laid out as ``entries_message`` lays it out; ``None`` for any other
    message or layout (the caller then parses it the ordinary way)."""
    if not raw or raw[0] != 0x1A:
        return None
    try:
        size, pos = _read_varint(raw, 1)
        end = len(raw)
        if pos + size != end:
            return None
        out: list[bytes] = []
        while pos < end:
            if raw[pos] != 0x0A:
                return None
            size, pos = _read_varint(raw, pos + 1)
            nxt = pos + size
            if nxt > end:
                return None
            out.append(raw[pos:nxt])
            pos = nxt
    except (IndexError, ValueError):
        return None
    return out


def _put_field(parts: list[bytes], tag: bytes, data: bytes) -> int:
    """Append a length-delimited field (proto3: an empty one is omitted); its size."""
    if not data:
        return 0
    n = _varint(len(data))
    parts += (tag, n, data)
    return 1 + len(n) + len(data)


def _put_varint(parts: list[bytes], tag: bytes, value: int) -> int:
    """Append a varint field (proto3: zero is omitted); its size."""
    if not value:
        return 0
    n = _varint(value)
    parts += (tag, n)
    return 1 + len(n)


def _row_op(parts: list[bytes], key: bytes, value: bytes, sizes: dict[bytes, int]) -> int:
    """Append the ``SnapshotChunk.ops`` field of the op ``ops_from_pairs`` makes of one
    row (nothing for a set's size, which it notes in ``sizes``); returns the bytes
    appended."""
    tag = key[:1]
    inner: list[bytes] = []
    if tag == b"k":
        size = _put_field(inner, _TAG1, key[1:]) + _put_field(inner, _TAG2, value)
        op = _OP_KV_PUT
    elif tag == b"l":
        name, _, raw_seq = key[1:].partition(b"\x00")
        size = _put_field(inner, _TAG1, name)
        size += _put_varint(inner, _SEQ, _U64.unpack(raw_seq)[0])
        size += _put_field(inner, _TAG3, value)
        op = _OP_LIST_PUSH
    elif tag == b"m":
        head, _ = _U64X2.unpack(value)
        if not head:
            return 0
        size = _put_field(inner, _TAG1, key[1:]) + _put_varint(inner, _SEQ, head)
        op = _OP_LIST_CLEAR
    elif tag == b"s":
        name, _, member = key[1:].partition(b"\x00")
        size = _put_field(inner, _TAG1, name) + _put_field(inner, _TAG2, member)
        size += _put_varint(inner, _SIZE, _set_size(sizes, name))
        op = _OP_SET_INSERT
    elif tag == b"c":
        sizes[key[1:]] = _U64.unpack(value)[0]
        return 0
    else:
        raise ValueError(f"unknown store row {key[:32]!r}")
    n_inner = _varint(size)
    op_size = 1 + len(n_inner) + size
    n_op = _varint(op_size)
    parts += (_TAG1, n_op, op, n_inner)
    parts += inner
    return 1 + len(n_op) + op_size


def snapshot_chunk_bodies(view: View, chunk_bytes: int = 1 << 20) -> Iterator[tuple[bytes, bool]]:
    """The cut as serialized ``SnapshotChunk`` ops fields of about ``chunk_bytes``
    each, with whether it is the last one (there is always one, maybe empty).

    Meant for a worker thread: it releases the GIL about every millisecond, so the
    event loop (the primary's writers) never waits a whole switch interval for it."""
    parts: list[bytes] = []
    size = 0
    sizes: dict[bytes, int] = {}  # set sizes seen so far (they sort before the members)
    clock = time.perf_counter
    released = clock()
    for rows, (key, value) in enumerate(replicated_pairs(view), 1):
        size += _row_op(parts, key, value, sizes)
        if rows % _GIL_ROWS == 0 and clock() - released >= _GIL_HOLD:
            time.sleep(0)  # a real release (~50 us): a waiting thread gets the GIL
            released = clock()
        if size >= chunk_bytes:
            yield b"".join(parts), False
            parts, size = [], 0
    yield b"".join(parts), True


def snapshot_messages(view: View, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """``snapshot_chunk_bodies`` as serialized ``StreamResponse(snapshot_chunk=...)``."""
    for body, last in snapshot_chunk_bodies(view, chunk_bytes):
        if last:
            body += _CHUNK_LAST
        yield _TAG2 + _varint(len(body)) + body


# --- the current store and its switch --------------------------------------------------

_CURRENT = "CURRENT"
_DEFAULT_DIR = "db"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_current(data_dir: Path, name: str) -> None:
    """Point CURRENT at ``name`` atomically: write a temp file, fsync, rename, fsync
    the directory. A crash leaves CURRENT naming either the old or the new store."""
    tmp = data_dir / (_CURRENT + ".tmp")
    with tmp.open("w") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, data_dir / _CURRENT)
    _fsync_dir(data_dir)


class StoreSlot:
    """The node's current (store, log). A standby's full resync REPLACES both, so
    everyone reads ``slot.store`` / ``slot.log`` at use, never caches them."""

    def __init__(
        self, data_dir: Path, store: Store, log: Log, *, fsync: bool, backlog_bytes: int
    ) -> None:
        self.data_dir = data_dir
        self._store = store
        self._log = log
        self._fsync = fsync
        self._backlog_bytes = backlog_bytes
        self._listeners: list[Callable[[Store, Log], None]] = []

    @property
    def store(self) -> Store:
        return self._store

    @property
    def log(self) -> Log:
        return self._log

    def add_listener(self, fn: Callable[[Store, Log], None]) -> None:
        """``fn(new_store, new_log)`` runs after every switch (on the event loop
        thread when the follower switches)."""
        self._listeners.append(fn)

    def fresh_store(self) -> Store:
        """An empty store in a new directory beside the current one (for a resync)."""
        return Store(self.data_dir / f"store-{uuid.uuid4().hex[:12]}", fsync=self._fsync)

    def discard(self, store: Store) -> None:
        """Drop an unfinished fresh store."""
        store.close()
        shutil.rmtree(store.path, ignore_errors=True)

    def install(self, store: Store, *, delete_old: bool = True) -> Log:
        """Switch to a COMPLETE fresh store: its data and local keys are durable (WAL
        synced) before CURRENT names it, and CURRENT is replaced atomically; only
        then the old store is closed (and its directory deleted, unless the caller
        prefers to delete it off the event loop: ``delete_old=False``)."""
        store.sync_wal()
        log = Log(store, max_bytes=self._backlog_bytes)
        try:
            _write_current(self.data_dir, store.path.name)
        except BaseException:
            log.close()
            raise
        old_store, old_log = self._store, self._log
        self._store, self._log = store, log
        old_log.close()
        old_store.close()
        if delete_old:
            shutil.rmtree(old_store.path, ignore_errors=True)
        for fn in self._listeners:
            fn(store, log)
        return log

    def close(self) -> None:
        self._log.close()
        self._store.close()


def open_slot(
    data_dir: Path | str, *, fsync: bool = False, backlog_bytes: int = DEFAULT_BACKLOG_BYTES
) -> StoreSlot:
    """Open the store CURRENT names under ``data_dir`` (``db`` at first) with its log,
    and delete leftovers of resyncs that never completed."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    current = data_dir / _CURRENT
    name = current.read_text().strip() if current.exists() else ""
    if not name:
        name = _DEFAULT_DIR
        _write_current(data_dir, name)
    for child in data_dir.iterdir():
        stale = child.name.startswith("store-") or child.name == _DEFAULT_DIR
        if child.is_dir() and stale and child.name != name:
            logger.warning("removing %s: an unfinished or superseded resync", child)
            shutil.rmtree(child, ignore_errors=True)
    store = Store(data_dir / name, fsync=fsync)
    log = Log(store, max_bytes=backlog_bytes)
    return StoreSlot(data_dir, store, log, fsync=fsync, backlog_bytes=backlog_bytes)
