"""The store: an open RocksDB directory (rocksdict) and its ONE write path.

Every durable change in pagesift goes through ``Store.write``: it runs a function on
a fresh ``groups.WriteGroup`` and commits the group atomically as one RocksDB
``WriteBatch`` (the keys are ``layout``'s). This module is the only one that imports
rocksdict or holds the database handle (``tests/test_write_path.py``). The write
section is a lock, and observers such as the replication log stage their own
node-local keys into the same batch, so "committed" and "logged" are one atomic fact.
``write`` returns a ``Commit``: ``fn``'s result, the ops, and the log offset the group
was committed at (0 when no log observes the store, or the group wrote no ops).

Bounds: ``write`` measures a group after ``fn`` built it and before anything is
staged or written, against the caller's ``max_bytes`` (the job runtime passes a
page's bound, ``records.page_group_bytes``), else the store's ``max_group_bytes``.
Nothing of a refused group is written, logged or replicated. ``apply`` (replicated
groups) is never bounded: the primary bounded them when it wrote them.

Storage errors (``errors``): after one, the store *refuses writes* (``refusing``):
every group raises ``StorageUnavailable`` at once, without touching RocksDB, until the
storage watcher (``pagesift.core.api.storagewatch``) has recovered it and calls
``accept_writes``. Recovery is ``reopen``: RocksDB keeps a failed WAL append as a
sticky error that only a reopen clears; a read-only instance serves reads meanwhile.
Nothing acknowledged is lost: a group is acknowledged only after its batch is in the
WAL, and a batch whose append failed is torn at the WAL's end, which recovery drops
whole (the group did not commit; its caller redoes it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Checkpoint,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from pagesift.core.store.errors import IO_ERROR, StorageUnavailable, storage_error
from pagesift.core.store.groups import DEFAULT_MAX_GROUP_BYTES, WriteGroup
from pagesift.core.store.layout import (
    BOUNDS,
    LOCAL,
    U64,
    bounds_key,
    count_key,
    digest_rows,
    item_prefix,
    kv_key,
    member_prefix,
    prefix_end,
)
from pagesift.core.util import tracing
from pagesift.v1 import store_pb2

T = TypeVar("T")
R = TypeVar("R", covariant=True)
logger = logging.getLogger("pagesift.store")

_PROBE_KEY = LOCAL + b"storage_probe"


@dataclass(frozen=True)
class Commit(Generic[R]):
    """What the write path returns for one committed group (``Store.write``,
    ``Log.write``).

    ``result`` is what the group function returned; ``ops`` the group's ops in write
    order (empty when it wrote nothing replicated); ``offset`` the replication-log
    offset that covers the group: the entry it was logged as, or - from ``Log.write``
    for a group without ops - the log's last offset. ``0`` means no log: the store
    has no replication log attached (offsets start at 1), or ``Store.write`` ran a
    group without ops.
    """

    result: R
    ops: Sequence[store_pb2.Op]
    offset: int = 0


class Observer(Protocol):
    """Sees every non-empty group inside the write section (the replication log)."""

    def stage(self, group: WriteGroup) -> None:
        """Called before the commit; may add node-local keys to the same batch."""

    def committed(self, group: WriteGroup) -> None:
        """Called after the batch is durable, still inside the write section."""


#: table files one store keeps open at most (RocksDB's table cache; -1, its default, is
#: every file): a bound the node's descriptor reserve counts (pagesift.node.fdreserve)
MAX_OPEN_FILES = 512


def rocksdb_options() -> Options:
    """The RocksDB options of every store (the benchmark's raw limit uses them too)."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_max_open_files(MAX_OPEN_FILES)
    # Most point reads ask for keys that are absent (is this URL seen, is this member
    # in, which bounds does a new list have); without a filter each one reads an index
    # and a data block per level. 10 bits/key: ~1% false positives.
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return opts


class Store:
    """An open RocksDB directory. Reads are lock-free; writes go through ``write``."""

    def __init__(
        self,
        path: Path | str,
        *,
        fsync: bool = False,
        max_group_bytes: int = DEFAULT_MAX_GROUP_BYTES,
    ) -> None:
        self.path = Path(path)
        self.max_group_bytes = max_group_bytes  # 0: unbounded
        self.path.mkdir(parents=True, exist_ok=True)
        self._db = Rdict(str(self.path), rocksdb_options())
        self._wopts = WriteOptions()
        self._wopts.sync = fsync
        self._lock = threading.RLock()
        self._observers: list[Observer] = []
        # storage errors (module docstring): why writes are refused (None: they are
        # not), and whether ``_db`` needs a reopen (a failed write, or read-only)
        self._refusing: StorageUnavailable | None = None
        self._broken = False
        self._read_only = False

    def close(self) -> None:
        """Close the instance. A full or failed volume is logged, not raised: what
        was acknowledged is in the WAL (RocksDB's close-time flush may need room)."""
        with self._lock:
            try:
                self._db.close()
            except Exception as e:
                if storage_error(e) is None:
                    raise
                logger.warning("store %s closed without its final flush: %s", self.path, e)

    # storage errors -------------------------------------------------------------
    @property
    def refusing(self) -> StorageUnavailable | None:
        """Why the store refuses writes now (None: it takes them)."""
        return self._refusing

    @property
    def needs_reopen(self) -> bool:
        """A write failed in RocksDB (its error is sticky) or reads come from the
        read-only stand-in: only ``reopen`` makes the store writable again."""
        return self._broken or self._read_only

    def refuse_writes(self, reason: str) -> None:
        """Refuse every group from now on (the storage watcher keeps the store shut
        until the volume has room for its reserve again)."""
        with self._lock:
            if self._refusing is None or self._refusing.reason != reason:
                self._refusing = StorageUnavailable(reason)

    def accept_writes(self) -> None:
        """Take groups again (the storage watcher, once a probe wrote)."""
        with self._lock:
            if not self.needs_reopen:
                self._refusing = None

    def _failed(self, exc: Exception) -> StorageUnavailable:
        """Inside the write section: RocksDB refused a write. Map it, log the original
        (with its path) once per episode, refuse from now on."""
        err = storage_error(exc)
        if err is None:
            raise exc
        if self._refusing is None:
            logger.error("store %s refuses writes (%s): %s", self.path, err.reason, exc)
        self._refusing = err
        self._broken = True
        return StorageUnavailable(err.reason)

    def probe(self) -> None:
        """Write one node-local key (never replicated or digested) through RocksDB even
        while writes are refused: does the store take writes? Raises
        ``StorageUnavailable`` (and refuses writes) when it does not."""
        with self._lock:
            if self.needs_reopen:
                raise StorageUnavailable(self._refusing.reason if self._refusing else IO_ERROR)
            group = WriteGroup(self._db.get)
            group.put_local(_PROBE_KEY, U64.pack(self._db.latest_sequence_number()))
            self._commit(group, gate=False)

    def reopen(self) -> None:
        """Clear a sticky RocksDB error by reopening the directory, reads served all
        along: a read-only instance (it needs no free space and takes no lock) stands
        in while the broken one closes and a read-write one opens. When the read-write
        open fails (recovery flushes the WAL into a table file, which needs room),
        the stand-in stays and ``StorageUnavailable`` is raised; call again later.

        The swap happens inside the write section, so no group sees it. A reader on
        another thread that took the old instance just before may see one error; the
        event loop's readers never do when this runs on the event loop thread."""
        with self._lock:
            if not self.needs_reopen:
                return
            started = time.monotonic()
            if not self._read_only:
                stand_in = Rdict(
                    str(self.path), rocksdb_options(), access_type=AccessType.read_only()
                )
                old, self._db = self._db, stand_in
                self._read_only = True
                self._broken = False
                try:
                    old.close()
                except Exception as e:  # the sticky error again: the instance is gone anyway
                    logger.info("store %s: closing the failed instance: %s", self.path, e)
                del old
            try:
                fresh = Rdict(str(self.path), rocksdb_options())
            except Exception as e:
                err = storage_error(e)
                if err is None:
                    raise
                logger.info("store %s: reopen failed (%s): %s", self.path, err.reason, e)
                self._refusing = StorageUnavailable(err.reason)
                raise StorageUnavailable(err.reason) from None
            stand_in, self._db = self._db, fresh
            self._read_only = False
            stand_in.close()
            logger.info(
                "store %s reopened after a storage error in %.3f s",
                self.path,
                time.monotonic() - started,
            )

    def add_observer(self, observer: Observer) -> None:
        self._observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        self._observers.remove(observer)

    @property
    def lock(self) -> threading.RLock:
        """The write section; hold it to read a cut consistent with the log."""
        return self._lock

    # the one write path ---------------------------------------------------------
    def write(self, fn: Callable[[WriteGroup], T], *, max_bytes: int | None = None) -> Commit[T]:
        """Run ``fn`` on a fresh group and commit it atomically.

        Returns the ``Commit``: ``fn``'s result, the group's ops in write order and
        its log offset (0 without a log). If ``fn`` raises, nothing is written. A
        group without ops and without local keys writes nothing. A group of more
        than ``max_bytes`` (None: the store's ``max_group_bytes``; 0: no bound)
        raises ``GroupTooLarge`` and writes nothing.
        """
        bound = self.max_group_bytes if max_bytes is None else max_bytes
        with self._lock:
            group = WriteGroup(self._db.get)
            result = fn(group)
            group.check_bound(bound)  # before anything is staged, logged or written
            self._commit(group)
            return Commit(result, group.ops, group.offset)

    def apply(
        self, ops: Sequence[store_pb2.Op], local: dict[bytes, bytes | None] | None = None
    ) -> WriteGroup:
        """Apply replicated ops (and node-local keys) as one group; idempotent."""

        def run(group: WriteGroup) -> WriteGroup:
            group.apply_ops(ops)
            for key, value in (local or {}).items():
                group.put_local(key, value)
            return group

        return self.write(run, max_bytes=0).result

    def _commit(self, group: WriteGroup, *, gate: bool = True) -> None:
        if group.empty:
            return
        if gate and self._refusing is not None:
            raise StorageUnavailable(self._refusing.reason)
        with tracing.span("store.commit") as span:  # a shared no-op when tracing is off
            if group.ops:
                for obs in self._observers:
                    obs.stage(group)
            try:
                self._db.write(_batch(group), self._wopts)
            except Exception as e:  # RocksDB raises plain Exception with a status text
                raise self._failed(e) from None
            if group.ops:
                for obs in self._observers:
                    obs.committed(group)
            if span is not None:
                span.set_attribute("pagesift.store.ops", len(group.ops))
                span.set_attribute("pagesift.log.offset", group.offset)

    # reads ----------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        value: bytes | None = self._db.get(kv_key(key))
        return value

    def get_local(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(key)
        return value

    def _scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(lo)
        while it.valid():
            key: bytes = it.key()
            if key >= hi:
                return
            yield key, it.value()
            it.next()

    def keys(self, prefix: str) -> list[str]:
        """KV keys starting with ``prefix``, in byte order."""
        lo = kv_key(prefix)
        return [k[1:].decode() for k, _ in self._scan(lo, lo + b"\xff")]

    def list_bounds(self, name: str) -> tuple[int, int]:
        raw: bytes | None = self._db.get(bounds_key(name))
        if raw is None:
            return 0, 0
        head, nxt = BOUNDS.unpack(raw)
        return head, nxt

    def list_len(self, name: str) -> int:
        head, nxt = self.list_bounds(name)
        return nxt - head

    def list_range(self, name: str, start: int = 0, count: int | None = None) -> list[bytes]:
        """Items with sequence numbers from ``start`` on, at most ``count`` of them."""
        return [item for _, item in self.list_items(name, start, count)]

    def list_items(
        self, name: str, start: int = 0, count: int | None = None
    ) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        if count is not None and count <= 0:
            return out
        prefix = item_prefix(name)
        for key, value in self._scan(prefix + U64.pack(start), prefix_end(prefix)):
            out.append((U64.unpack(key[len(prefix) :])[0], value))
            if count is not None and len(out) >= count:
                break
        return out

    def set_contains(self, name: str, member: bytes) -> bool:
        return self._db.get(member_prefix(name) + member) is not None

    def set_len(self, name: str) -> int:
        raw: bytes | None = self._db.get(count_key(name))
        return U64.unpack(raw)[0] if raw else 0

    def set_members(self, name: str) -> list[bytes]:
        prefix = member_prefix(name)
        return [k[len(prefix) :] for k, _ in self._scan(prefix, prefix_end(prefix))]

    def set_range(
        self, name: str, after: bytes | None = None, count: int = 100, *, reverse: bool = False
    ) -> list[bytes]:
        """At most ``count`` members of set ``name`` in byte order (``reverse``: from the
        largest down), starting past ``after`` (None: from the first, or the last). A
        cursor read for paging: a member removed since it was handed out still works
        as ``after``."""
        prefix = member_prefix(name)
        hi = prefix_end(prefix)
        out: list[bytes] = []
        if count <= 0:
            return out
        it = self._db.iter()
        if not reverse:
            it.seek(prefix + after + b"\x00" if after is not None else prefix)
            while it.valid() and len(out) < count:
                key: bytes = it.key()
                if key >= hi:
                    break
                out.append(key[len(prefix) :])
                it.next()
            return out
        start = prefix + after if after is not None else hi
        it.seek_for_prev(start)
        while it.valid() and len(out) < count:
            key = it.key()
            if key >= start:  # ``after`` itself (or the end bound): not included
                it.prev()
                continue
            if not key.startswith(prefix):
                break
            out.append(key[len(prefix) :])
            it.prev()
        return out

    # whole-store views (resync, verify) ------------------------------------------
    def iterator(self) -> Any:
        """A raw RocksDB iterator: a point-in-time view from its creation on (take it
        under ``lock`` for a cut consistent with the log). Read-only."""
        return self._db.iter()

    def sync_wal(self) -> None:
        """Make every committed group durable on disk now (promotion, resync switch)."""
        with self._lock:
            try:
                self._db.flush_wal(True)
            except Exception as e:
                raise self._failed(e) from None

    def checkpoint(self, path: Path) -> None:
        """A RocksDB checkpoint of the store in the new directory ``path`` (a backup):
        SST files hard-linked when ``path`` is on the same filesystem, the rest
        copied; it opens as a store of its own. Taken at one point of the write
        order: hold ``lock`` for a copy consistent with what the log reports."""
        Checkpoint(self._db).create_checkpoint(str(path))

    def replicated_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every replicated key/value pair in byte order (node-local keys skipped)."""
        it = self._db.iter()
        it.seek_to_first()
        while it.valid():
            key: bytes = it.key()
            if not key.startswith(LOCAL):
                yield key, it.value()
            it.next()

    def digest(self) -> str:
        """``digest_rows`` of every replicated row: equal digests, equal stores."""
        return digest_rows(self.replicated_items())


def _batch(group: WriteGroup) -> WriteBatch:
    """The group as one RocksDB batch: its range deletes, then its key writes."""
    ranges, pending = group.staged()
    batch = WriteBatch(raw_mode=True)
    for lo, hi in ranges:
        batch.delete_range(lo, hi)
    for key, value in pending.items():
        if value is None:
            batch.delete(key)
        else:
            batch.put(key, value)
    return batch
