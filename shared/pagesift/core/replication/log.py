"""The replication log: every write group as an entry (epoch, offset, ops), on disk.

What it owns
------------
``Log`` is the ``Store`` observer that turns each committed write group into a log
entry at the next offset (the write hook, on a primary), and applies and logs the
entries a standby receives (the apply path). It composes the parts that live in
their own modules and is the one object the roles use:

* ``pagesift.core.replication.identity`` - history id, epoch, role, fencing (``Identity``);
* ``pagesift.core.replication.backlog`` - the bounded backlog of entries and the tail;
* ``pagesift.core.store.cuts`` - consistent cuts (``View``) and cross-thread waiters;
* ``pagesift.core.replication.framing`` - entries and snapshots as wire bytes;
* ``pagesift.core.replication.slot`` - the node's current (store, log) and the resync switch;
* ``pagesift.core.replication.writetrace`` - the opt-in trace of committed writes (fault tests).

Storage layout
--------------
``Log`` adds no keys of its own: an entry is ``LogEntry(epoch, offset, ops)``
(replication.proto) stored under the backlog's ``_repl/log/{offset}`` with the
backlog's ``_repl/tail``, next to the identity keys (see those modules).

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
* **Entries travel as bytes.** The bytes a primary logs are the bytes it sends
  (``read_raw`` + ``framing.entries_message``) and the bytes a standby logs
  (``framing.split_entries_message`` + ``append_replicated(raw=...)``).
* **Writes only on a writable primary.** ``stage`` raises ``NotWritable`` (and so
  the whole write fails, nothing committed) unless ``open_for_writes`` or
  ``promote`` made this node the primary and no higher epoch fenced it, nor (with a
  witness) after the write deadline: the instant its lease could have expired, on
  the monotonic clock, checked inside the write section before the commit.
* **A cut at an offset is exactly there.** ``view_at(offset)`` is taken inside the
  commit of ``offset``; the apply path cuts its runs after any such offset.

Why it is safe
--------------
Everything that moves the log - staging, committing, applying, identity changes,
taking a cut - holds ``store.lock`` (the store's write section, reentrant), so there
is one writer and offsets follow commit order. Reads (``read``, ``read_raw``, the
offset properties) take no lock: entries at or below ``last_offset`` are committed
and immutable, and the only race, trimming, is reported as ``BacklogLost``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from pagesift.core.ha.roles import Role
from pagesift.core.replication import protocol
from pagesift.core.replication.backlog import DEFAULT_BACKLOG_BYTES, Backlog, Plan, tail_local
from pagesift.core.replication.identity import Identity, NotWritable
from pagesift.core.replication.writetrace import from_env as write_trace
from pagesift.core.store.cuts import OffsetPassed, View, Waiters
from pagesift.core.store.db import Commit, Store
from pagesift.core.store.groups import WriteGroup
from pagesift.v1 import replication_pb2

T = TypeVar("T")
LogEntry = replication_pb2.LogEntry


class Log:
    """The replication log of one store (an ``Observer``; attaches itself on creation).

    Lifecycle: ``Log(store)`` on both roles at start-up; then ``open_for_writes()`` on
    a primary (or ``promote()`` later on a standby). A standby's follower calls
    ``adopt`` after each decision and ``append_replicated`` for each batch.
    """

    def __init__(self, store: Store, *, max_bytes: int = DEFAULT_BACKLOG_BYTES) -> None:
        self._store = store
        self._applying = False
        self._closed = False
        self._staged: Plan | None = None  # the plan of the group between stage and commit
        self._write_deadline: float | None = None  # see set_write_deadline
        self._waiters = Waiters()
        self._trace = write_trace(store.path)  # None unless PAGESIFT_WRITE_TRACE is set
        with store.lock:
            self._backlog = Backlog(store, max_bytes)
            self._identity = Identity(store)
            store.add_observer(self)

    # --- state -------------------------------------------------------------------------
    @property
    def store(self) -> Store:
        return self._store

    @property
    def max_bytes(self) -> int:
        """The backlog's byte bound."""
        return self._backlog.max_bytes

    @property
    def last_offset(self) -> int:
        """The newest entry written (primary) or applied (standby)."""
        return self._backlog.last

    @property
    def first_offset(self) -> int:
        """The oldest entry still in the backlog (``last_offset + 1`` when empty)."""
        return self._backlog.first

    @property
    def tail_epoch(self) -> int:
        return self._backlog.tail_epoch

    @property
    def backlog_bytes(self) -> int:
        return self._backlog.size

    @property
    def writable(self) -> bool:
        return self._identity.writable

    @property
    def role(self) -> Role:
        """What this log accepts (``Identity.role``); a node's role is its machine's."""
        return self._identity.role

    @property
    def epoch(self) -> int:
        return self._identity.epoch

    @property
    def history_id(self) -> str:
        """The history this node's data belongs to ("" = never synced)."""
        return self._identity.history_id

    @property
    def prev_history_id(self) -> str:
        """The history this node was promoted from."""
        return self._identity.prev_history_id

    @property
    def switch_offset(self) -> int:
        """The last offset of ``prev_history_id`` on this node."""
        return self._identity.switch_offset

    @property
    def fenced_epoch(self) -> int:
        """The highest epoch seen as primary while this node was one (0 = none)."""
        return self._identity.fenced_epoch

    @property
    def persisted_role(self) -> Role | None:
        """The role last recorded on disk (None: never recorded)."""
        return self._identity.persisted_role

    def primary_state(self) -> protocol.PrimaryState:
        with self._store.lock:
            ident, backlog = self._identity, self._backlog
            return protocol.PrimaryState(
                writable=ident.writable,
                epoch=ident.epoch,
                history_id=ident.history_id,
                prev_history_id=ident.prev_history_id,
                switch_offset=ident.switch_offset,
                first_offset=backlog.first,
                last_offset=backlog.last,
            )

    def hello(self, node_id: str) -> protocol.Hello:
        with self._store.lock:
            ident = self._identity
            return protocol.Hello(node_id, ident.history_id, self._backlog.last, ident.epoch)

    # --- identity changes (durable before they take effect: see identity.py) ----------
    def open_for_writes(self) -> None:
        """Make this node the writable primary (start-up of a primary); ``Fenced``
        when a higher epoch fenced it."""
        self._identity.open_for_writes()

    def promote(self, new_history_id: str | None = None, *, epoch: int = 0) -> protocol.Promotion:
        """Standby -> primary at the applied offset: epoch + 1 (at least ``epoch``, a
        witness's), a new history id and the switch offset recorded durably, THEN
        writes. Idempotent on a primary."""
        with self._store.lock:
            return self._identity.promote(self._backlog.last, new_history_id, epoch=epoch)

    def set_write_deadline(self, deadline: float | None) -> None:
        """With a witness: take no write once ``time.monotonic()`` reaches ``deadline``
        (the instant this node's lease could have expired); None: no such bound."""
        with self._store.lock:
            self._write_deadline = deadline

    def fence(self, higher_epoch: int) -> bool:
        """Stop taking writes because a peer or entry of ``higher_epoch`` was seen
        (durably); True when this call fenced the node."""
        return self._identity.fence(higher_epoch)

    def step_down(self, epoch: int) -> None:
        """Take no more writes because a witness names another primary, of ``epoch``:
        fenced by it (durably) when it is higher than ours, else simply not writable."""
        with self._store.lock:
            if not self._identity.fence(epoch):
                self._identity.stop_writes()

    def adopt(self, history_id: str, epoch: int) -> None:
        """A standby follows a primary of (``history_id``, ``epoch``): record it."""
        self._identity.adopt(history_id, epoch)

    @staticmethod
    def snapshot_locals(
        *, offset: int, tail_epoch: int, history_id: str, epoch: int
    ) -> dict[bytes, bytes | None]:
        """The node-local keys a fresh store gets in the SAME group as the last
        snapshot chunk: until that group commits the store claims no history, so a
        standby killed mid-snapshot can never believe it is in sync."""
        return {
            **tail_local(offset, tail_epoch),
            **Identity.standby_locals(history_id, epoch),
        }

    # --- the write path (primary) ------------------------------------------------------
    def write(self, fn: Callable[[WriteGroup], T]) -> Commit[T]:
        """``store.write(fn)``, whose ``Commit.offset`` is never 0 once the log has an
        entry: the group's own offset (for ``wait_replicated``), or the last offset
        when the group wrote no ops."""
        with self._store.lock:
            commit = self._store.write(fn)
            if commit.offset:
                return commit
            return replace(commit, offset=self._backlog.last)

    def stage(self, group: WriteGroup) -> None:
        """Observer hook, inside the write section before the commit: stages the
        entry into the group's batch and sets ``group.offset``."""
        self._staged = None  # a group whose commit failed left its plan here
        if self._applying:
            return  # append_replicated staged the entries itself
        if self._closed or not self._identity.writable:
            raise NotWritable(f"this node is a {self.role}; writes go to the primary")
        if self._write_deadline is not None and time.monotonic() >= self._write_deadline:
            raise NotWritable("this primary's witness lease may have lapsed: it takes no write")
        offset = self._backlog.last + 1
        epoch = self._identity.epoch
        data = LogEntry(epoch=epoch, offset=offset, ops=group.ops).SerializeToString()
        self._staged = self._backlog.stage(group.put_local, [(offset, epoch, data)])
        group.offset = offset

    def committed(self, group: WriteGroup) -> None:
        """Observer hook, after the batch is durable, still inside the write section
        (which also held since ``stage``: the plan staged there is this group's)."""
        plan, self._staged = self._staged, None
        if plan is not None:
            self._finish(plan)
            if self._trace is not None:
                self._trace.committed(self._identity.epoch, plan.last)

    def _finish(self, plan: Plan) -> None:
        """The staged group is durable: move the backlog, hand out the cut pinned at
        its offset (still inside the commit), wake the offset waiters."""
        self._backlog.finish(plan)
        self._waiters.committed(plan.last, self._view_locked)

    # --- the apply path (standby) ------------------------------------------------------
    def append_replicated(
        self,
        entries: Sequence[replication_pb2.LogEntry],
        *,
        primary_epoch: int,
        raw: Sequence[bytes] | None = None,
    ) -> int:
        """Apply received entries and log them; returns the new applied offset.

        Validated by ``protocol.check_batch`` (contiguous, epochs sane); entries at
        or below the applied offset are skipped. Runs of entries go in one group each
        (ops + the entries + the tail in one WriteBatch), split after any offset a
        Digest is waiting for, so that digest sees exactly that offset.

        ``raw``, when given, holds each entry as received (``raw[i]`` serializes
        ``entries[i]``): the backlog logs those bytes instead of re-serializing.
        """
        if raw is not None and len(raw) != len(entries):
            raise ValueError("raw must hold one serialized entry per entry")
        with self._store.lock:
            if self._identity.writable:
                raise RuntimeError("a writable primary does not apply replicated entries")
            backlog = self._backlog
            metas = [protocol.EntryMeta(e.offset, e.epoch) for e in entries]
            skip = protocol.check_batch(
                metas,
                applied=backlog.last,
                tail_epoch=backlog.tail_epoch,
                primary_epoch=primary_epoch,
            )
            todo = list(entries[skip:])
            todo_raw = list(raw[skip:]) if raw is not None else None
            while todo:
                pinned = self._waiters.first_pinned(e.offset for e in todo)
                cut = len(todo) if pinned is None else pinned + 1
                part, todo = todo[:cut], todo[cut:]
                if todo_raw is not None:
                    part_raw, todo_raw = todo_raw[:cut], todo_raw[cut:]
                else:
                    part_raw = [e.SerializeToString() for e in part]
                local: dict[bytes, bytes | None] = {}
                plan = backlog.stage(
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
            return backlog.last

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
        return self._backlog.read_raw(from_offset, max_bytes=max_bytes, max_entries=max_entries)

    async def wait_for(self, offset: int, within: float) -> bool:
        """Wait until ``last_offset >= offset``; False on timeout."""
        backlog = self._backlog
        return await self._waiters.wait_until(lambda: backlog.last >= offset, within)

    # --- consistent cuts (snapshots, digests: see cuts.py) -----------------------------
    def view(self) -> View:
        """A consistent cut at the current offset."""
        with self._store.lock:
            return self._view_locked()

    def _view_locked(self) -> View:
        backlog = self._backlog
        return View(self._store.iterator(), backlog.last, backlog.tail_epoch)

    async def view_at(self, offset: int, within: float) -> View:
        """A cut exactly at ``offset`` (0 = now): immediate when we stand there, taken
        inside the commit of ``offset`` when we are behind; ``OffsetPassed`` when we
        are past it, ``TimeoutError`` when it is not reached in time."""
        if offset <= 0:
            return self.view()
        with self._store.lock:
            last = self._backlog.last
            if offset == last:
                return self._view_locked()
            if offset < last:
                raise OffsetPassed(f"asked for offset {offset}, already at {last}")
            fut = self._waiters.pin(offset)
        return await self._waiters.pinned_view(offset, fut, within)

    def close(self) -> None:
        """Detach from the store (before the store closes or is replaced)."""
        with self._store.lock:
            if self._closed:
                return
            self._closed = True
            self._identity.stop_writes()
            self._store.remove_observer(self)
            if self._trace is not None:
                self._trace.close()
        self._waiters.wake_all()
