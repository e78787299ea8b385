"""The store: RocksDB (rocksdict) with KV, sequenced lists and sets, and ONE write path.

Every durable change in pagesift goes through ``Store.write``: a *write group*
collects its changes in memory (reads inside the group see its own writes), then
commits them atomically as one RocksDB ``WriteBatch`` and hands back the list of
``Op`` messages that describe it, in write order. Replication ships exactly those
ops; ``WriteGroup.apply_op`` on another store reproduces the group. No other code
writes RocksDB (the write section is a lock, and observers such as the replication
log stage their own node-local keys into the same batch, so "committed" and
"logged" are one atomic fact). ``write`` returns a ``Commit``: ``fn``'s result, the
ops, and the log offset the group was committed at (0 when no log observes the
store, or the group wrote no ops).

Key layout (one byte of tag, then the name; names never contain NUL):

    k{key}                      -> value                  KV
    m{list}                     -> u64 head, u64 next      list bounds (big-endian)
    l{list}\\0{seq:u64be}         -> item                  list item, seq = push order
    s{set}\\0{member}             -> b""                   set member
    c{set}                      -> u64 count               set size
    _{name}                     -> bytes                   node-local: never replicated or digested

Why a replay once, twice, or after a partial replay ends in the same store (the
log applies each entry once; this is the second line of defence):

- ``ListPush(list, seq, item)`` is skipped when ``seq < next``: the item is there.
- ``ListPopFront(list, seq)`` is skipped when ``seq < head``: already popped.
- ``ListClear(list, upto)`` removes items below ``upto`` and raises head/next to it;
  it carries ``upto`` instead of "everything" so a replayed clear can never delete
  an item pushed after it (the seed's plain clear could).
- KV puts/deletes and set clears are assignments, and so are set inserts/removes:
  they carry the set's size after them (``size``), so applying one writes the
  member and the size without reading either; replayed in log order, the last
  op leaves the size the source had. (A standby applies six of them per crawled
  page: the reads they used to need were a third of its apply time.)

Bounded groups: ``write`` measures a group (``WriteGroup.size``: the serialized bytes
of its ops, what its replication-log entry carries) after ``fn`` built it and before
anything is staged or written, and raises ``GroupTooLarge`` past the bound: the
caller's ``max_bytes`` (the job runtime passes a page's bound,
``jobrecords.page_group_bytes``), else the store's ``max_group_bytes``
(``DEFAULT_MAX_GROUP_BYTES``: a log entry is one protobuf message, which cannot pass
2 GiB, and a standby receives it whole). Nothing of a refused group is written,
logged or replicated. ``apply`` (replicated groups) is never bounded: the primary
bounded them when it wrote them.

Storage errors (disk full is a state, not an accident): RocksDB reports every I/O
failure as a plain ``Exception`` whose text names the file ("IO error: No space left
on device: While appending to file: /data/db/000009.log"). The write path turns each
one into ``StorageUnavailable`` with a ``reason`` (``no_space`` / ``io_error``) and a
message that names no path (the original is logged once, for the operator). After
one, the store *refuses writes* (``refusing``): every group raises
``StorageUnavailable`` at once, without touching RocksDB, until the node's storage
watcher (``pagesift.node.storage``) has recovered it and calls ``accept_writes``.
Recovery is ``reopen``: RocksDB keeps a failed WAL append as a sticky background
error that only a reopen clears; a read-only instance serves reads meanwhile, so
reads never stop. Nothing acknowledged is lost: a group is acknowledged only after
its batch is in the WAL, and a batch whose append failed is torn at the WAL's end,
which recovery drops whole (the group did not commit; its caller redoes it). The
replication log's ``stage`` already tolerates a group whose commit failed.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
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

from pagesift.shared.util import tracing
from pagesift.v1 import store_pb2

Op = store_pb2.Op
T = TypeVar("T")
logger = logging.getLogger("pagesift.store")
R = TypeVar("R", covariant=True)

_U64 = struct.Struct(">Q")
_BOUNDS = struct.Struct(">QQ")
LOCAL = b"_"


def _kv(key: str) -> bytes:
    return b"k" + key.encode()


def _meta(name: str) -> bytes:
    return b"m" + name.encode()


def _item_prefix(name: str) -> bytes:
    return b"l" + name.encode() + b"\x00"


def _item(name: str, seq: int) -> bytes:
    return _item_prefix(name) + _U64.pack(seq)


def _member_prefix(name: str) -> bytes:
    return b"s" + name.encode() + b"\x00"


def _count(name: str) -> bytes:
    return b"c" + name.encode()


def _check_name(name: str) -> str:
    if "\x00" in name:
        raise ValueError(f"store names cannot contain NUL: {name!r}")
    return name


NO_SPACE = "no_space"
IO_ERROR = "io_error"
_REASON_TEXT = {
    NO_SPACE: "the data volume is full",
    IO_ERROR: "the data volume failed a read or a write",
}
_PROBE_KEY = LOCAL + b"storage_probe"


class StorageUnavailable(Exception):
    """The store refuses writes: ``reason`` is ``NO_SPACE`` or ``IO_ERROR``. The
    message never names a path (clients see it: ``STORAGE_UNAVAILABLE``). Nothing of
    the group that raised it was written."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"the store refuses writes: {_REASON_TEXT.get(reason, reason)}; "
            "they resume by themselves once the node can write again"
        )


def storage_error(exc: BaseException) -> StorageUnavailable | None:
    """The ``StorageUnavailable`` a RocksDB error stands for, or None when it is no
    storage error. RocksDB's statuses are text: "IO error: ..." for every failed
    file operation, with the errno's text after it ("No space left on device")."""
    if isinstance(exc, StorageUnavailable):
        return exc
    text = str(exc)
    if isinstance(exc, OSError):
        return StorageUnavailable(NO_SPACE if exc.errno == errno.ENOSPC else IO_ERROR)
    if "No space left on device" in text or "ENOSPC" in text:
        return StorageUnavailable(NO_SPACE)
    if text.startswith("IO error") or "IO error:" in text:
        return StorageUnavailable(IO_ERROR)
    return None


def local_key(name: str) -> bytes:
    """A node-local key (applied offset, epoch, backlog): written only with a group."""
    return LOCAL + name.encode()


def digest_rows(rows: Iterable[tuple[bytes, bytes]]) -> str:
    """THE store digest: SHA-256 over (u64be length, key, u64be length, value) of each
    replicated row, in key order (``Store.digest`` and ``cuts.view_digest`` use it)."""
    h = hashlib.sha256()
    for key, value in rows:
        h.update(_U64.pack(len(key)))
        h.update(key)
        h.update(_U64.pack(len(value)))
        h.update(value)
    return h.hexdigest()


DEFAULT_MAX_GROUP_BYTES = 1 << 30  # a store's bound on one group (module docstring)


class GroupTooLarge(Exception):
    """``Store.write`` refused a group of ``size`` bytes of ops, over ``bound``;
    nothing of it was written."""

    def __init__(self, size: int, bound: int) -> None:
        self.size = size
        self.bound = bound
        super().__init__(f"a write group of {size} bytes is over the {bound}-byte bound")


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


class WriteGroup:
    """One atomic set of changes. Build it only through ``Store.write``."""

    def __init__(self, db: Rdict) -> None:
        self._db = db
        self._pending: dict[bytes, bytes | None] = {}
        self._ranges: list[tuple[bytes, bytes]] = []
        self.ops: list[store_pb2.Op] = []
        self.offset = 0  # the log offset, set by the replication log when it stages us

    # raw access -------------------------------------------------------------
    def _get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        for lo, hi in self._ranges:
            if lo <= key < hi:
                return None
        value: bytes | None = self._db.get(key)
        return value

    def _delete_range(self, lo: bytes, hi: bytes) -> None:
        self._ranges.append((lo, hi))
        for key in [k for k in self._pending if lo <= k < hi]:
            del self._pending[key]

    def _bounds(self, name: str) -> tuple[int, int]:
        raw = self._get(_meta(name))
        if raw is None:
            return 0, 0
        head, nxt = _BOUNDS.unpack(raw)
        return head, nxt

    def _set_bounds(self, name: str, head: int, nxt: int) -> None:
        self._pending[_meta(name)] = _BOUNDS.pack(head, nxt)

    def _set_count(self, name: str, delta: int) -> int:
        """Change the set's size by ``delta``; returns the new size."""
        key = _count(name)
        raw = self._get(key)
        n = (_U64.unpack(raw)[0] if raw else 0) + delta
        self._pending[key] = _U64.pack(n) if n > 0 else None
        return n

    def put_local(self, key: bytes, value: bytes | None) -> None:
        """Stage a node-local key (must start with ``LOCAL``); never replicated."""
        if not key.startswith(LOCAL):
            raise ValueError("local keys start with '_'")
        self._pending[key] = value

    def get_local(self, key: bytes) -> bytes | None:
        return self._get(key)

    def size(self) -> int:
        """Bytes of the group's ops, serialized (what its log entry carries)."""
        return sum(op.ByteSize() for op in self.ops)

    # KV ---------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        return self._get(_kv(key))

    def put(self, key: str, value: bytes) -> None:
        self._pending[_kv(key)] = value
        self.ops.append(Op(kv_put=store_pb2.KvPut(key=key, value=value)))

    def delete(self, key: str) -> None:
        self._pending[_kv(key)] = None
        self.ops.append(Op(kv_delete=store_pb2.KvDelete(key=key)))

    # lists ------------------------------------------------------------------
    def push(self, name: str, item: bytes) -> int:
        """Append ``item``; returns its sequence number."""
        head, seq = self._bounds(_check_name(name))
        self._pending[_item(name, seq)] = item
        self._set_bounds(name, head, seq + 1)
        self.ops.append(Op(list_push=store_pb2.ListPush(list=name, seq=seq, item=item)))
        return seq

    def list_len(self, name: str) -> int:
        head, nxt = self._bounds(name)
        return nxt - head

    def pop_front(self, name: str) -> tuple[int, bytes] | None:
        head, nxt = self._bounds(name)
        if head >= nxt:
            return None
        item = self._get(_item(name, head)) or b""
        self._pending[_item(name, head)] = None
        self._set_bounds(name, head + 1, nxt)
        self.ops.append(Op(list_pop_front=store_pb2.ListPopFront(list=name, seq=head)))
        return head, item

    def trim_front(self, name: str, upto: int) -> int:
        """Drop the items below ``upto`` (a consumed prefix of a queue) without reading
        them: one ``ListPopFront`` each, point deletes rather than a range tombstone.
        Returns how many went."""
        head, nxt = self._bounds(name)
        end = min(upto, nxt)
        for seq in range(head, end):
            self._pending[_item(name, seq)] = None
            self.ops.append(Op(list_pop_front=store_pb2.ListPopFront(list=name, seq=seq)))
        if end <= head:
            return 0
        self._set_bounds(name, end, nxt)
        return end - head

    def clear_list(self, name: str, *, drop: bool = False) -> None:
        """Remove every item; sequence numbers keep rising unless ``drop`` deletes the list."""
        _, nxt = self._bounds(name)
        self._clear_list_upto(name, nxt, drop)
        self.ops.append(Op(list_clear=store_pb2.ListClear(list=name, upto=nxt, drop=drop)))

    def _clear_list_upto(self, name: str, upto: int, drop: bool) -> None:
        head, nxt = self._bounds(name)
        self._delete_range(_item(name, 0), _item(name, upto))
        new_head, new_next = max(head, upto), max(nxt, upto)
        if drop:
            self._pending[_meta(name)] = None
        elif new_head or new_next:
            self._set_bounds(name, new_head, new_next)

    # sets -------------------------------------------------------------------
    def insert(self, name: str, member: bytes) -> bool:
        """Add ``member``; returns False (and records nothing) when it was there."""
        key = _member_prefix(_check_name(name)) + member
        if self._get(key) is not None:
            return False
        self._pending[key] = b""
        size = self._set_count(name, 1)
        self.ops.append(Op(set_insert=store_pb2.SetInsert(set=name, member=member, size=size)))
        return True

    def contains(self, name: str, member: bytes) -> bool:
        return self._get(_member_prefix(name) + member) is not None

    def set_len(self, name: str) -> int:
        raw = self._get(_count(name))
        return _U64.unpack(raw)[0] if raw else 0

    def remove(self, name: str, member: bytes) -> bool:
        key = _member_prefix(name) + member
        if self._get(key) is None:
            return False
        self._pending[key] = None
        size = self._set_count(name, -1)
        self.ops.append(Op(set_remove=store_pb2.SetRemove(set=name, member=member, size=size)))
        return True

    def clear_set(self, name: str) -> None:
        self._clear_set(name)
        self.ops.append(Op(set_clear=store_pb2.SetClear(set=name)))

    def _clear_set(self, name: str) -> None:
        prefix = _member_prefix(name)
        self._delete_range(prefix, prefix[:-1] + b"\x01")
        self._pending[_count(name)] = None

    # replication --------------------------------------------------------------
    def apply_op(self, op: store_pb2.Op) -> None:
        """Apply one replicated op idempotently, recording it like a local write."""
        fn = _APPLY.get(op.WhichOneof("op") or "")
        if fn is None:
            raise ValueError(f"unknown store op {op.WhichOneof('op')!r}")
        fn(self, op)

    def _apply_ops(self, ops: Sequence[store_pb2.Op]) -> None:
        # ``apply_op`` for many ops: the standby's hot path (hundreds of ops a batch).
        table = _APPLY
        for op in ops:
            fn = table.get(op.WhichOneof("op") or "")
            if fn is None:
                raise ValueError(f"unknown store op {op.WhichOneof('op')!r}")
            fn(self, op)

    # Each ``_apply_*`` does what the matching public method does (same keys, same
    # checks, same op recorded), minus the rebuilding of an equal ``Op`` message.
    def _apply_kv_put(self, op: store_pb2.Op) -> None:
        p = op.kv_put
        self._pending[b"k" + p.key.encode()] = p.value
        self.ops.append(op)

    def _apply_kv_delete(self, op: store_pb2.Op) -> None:
        self._pending[b"k" + op.kv_delete.key.encode()] = None
        self.ops.append(op)

    def _apply_list_push(self, op: store_pb2.Op) -> None:
        p = op.list_push
        name, seq = p.list, p.seq
        raw_name = name.encode()
        meta = b"m" + raw_name
        pending = self._pending
        raw = pending[meta] if meta in pending else self._get(meta)
        head, nxt = _BOUNDS.unpack(raw) if raw is not None else (0, 0)
        if seq < nxt:
            return
        pending[b"l" + raw_name + b"\x00" + _U64.pack(seq)] = p.item
        pending[meta] = _BOUNDS.pack(head, seq + 1)
        self.ops.append(op)

    def _apply_list_pop_front(self, op: store_pb2.Op) -> None:
        q = op.list_pop_front
        head, nxt = self._bounds(q.list)
        if q.seq < head:
            return
        self._pending[_item(q.list, q.seq)] = None
        self._set_bounds(q.list, q.seq + 1, max(nxt, q.seq + 1))
        self.ops.append(op)

    def _apply_list_clear(self, op: store_pb2.Op) -> None:
        c = op.list_clear
        self._clear_list_upto(c.list, c.upto, c.drop)
        self.ops.append(op)

    def _apply_set_insert(self, op: store_pb2.Op) -> None:
        p = op.set_insert
        if p.size < 1:
            raise ValueError(f"set insert into {p.set!r} without the set's size")
        raw_name = _check_name(p.set).encode()
        self._pending[b"s" + raw_name + b"\x00" + p.member] = b""
        self._pending[b"c" + raw_name] = _U64.pack(p.size)
        self.ops.append(op)

    def _apply_set_remove(self, op: store_pb2.Op) -> None:
        p = op.set_remove
        raw_name = _check_name(p.set).encode()
        self._pending[b"s" + raw_name + b"\x00" + p.member] = None
        self._pending[b"c" + raw_name] = _U64.pack(p.size) if p.size else None
        self.ops.append(op)

    def _apply_set_clear(self, op: store_pb2.Op) -> None:
        self._clear_set(op.set_clear.set)
        self.ops.append(op)

    def _batch(self) -> WriteBatch:
        batch = WriteBatch(raw_mode=True)
        for lo, hi in self._ranges:
            batch.delete_range(lo, hi)
        for key, value in self._pending.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        return batch


_APPLY: dict[str, Callable[[WriteGroup, store_pb2.Op], None]] = {
    "kv_put": WriteGroup._apply_kv_put,
    "kv_delete": WriteGroup._apply_kv_delete,
    "list_push": WriteGroup._apply_list_push,
    "list_pop_front": WriteGroup._apply_list_pop_front,
    "list_clear": WriteGroup._apply_list_clear,
    "set_insert": WriteGroup._apply_set_insert,
    "set_remove": WriteGroup._apply_set_remove,
    "set_clear": WriteGroup._apply_set_clear,
}


def rocksdb_options() -> Options:
    """The RocksDB options of every store (the benchmark's raw limit uses them too)."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
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
            group = WriteGroup(self._db)
            group.put_local(_PROBE_KEY, _U64.pack(self._db.latest_sequence_number()))
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
            group = WriteGroup(self._db)
            result = fn(group)
            if bound > 0 and group.ops:
                size = group.size()
                if size > bound:
                    raise GroupTooLarge(size, bound)
            self._commit(group)
            return Commit(result, group.ops, group.offset)

    def apply(
        self, ops: Sequence[store_pb2.Op], local: dict[bytes, bytes | None] | None = None
    ) -> WriteGroup:
        """Apply replicated ops (and node-local keys) as one group; idempotent."""

        def run(group: WriteGroup) -> WriteGroup:
            group._apply_ops(ops)
            for key, value in (local or {}).items():
                group.put_local(key, value)
            return group

        return self.write(run, max_bytes=0).result

    def _commit(self, group: WriteGroup, *, gate: bool = True) -> None:
        if not group.ops and not group._pending and not group._ranges:
            return
        if gate and self._refusing is not None:
            raise StorageUnavailable(self._refusing.reason)
        with tracing.span("store.commit") as span:  # a shared no-op when tracing is off
            if group.ops:
                for obs in self._observers:
                    obs.stage(group)
            try:
                self._db.write(group._batch(), self._wopts)
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
        value: bytes | None = self._db.get(_kv(key))
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
        lo = _kv(prefix)
        return [k[1:].decode() for k, _ in self._scan(lo, lo + b"\xff")]

    def list_bounds(self, name: str) -> tuple[int, int]:
        raw: bytes | None = self._db.get(_meta(name))
        if raw is None:
            return 0, 0
        head, nxt = _BOUNDS.unpack(raw)
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
        prefix = _item_prefix(name)
        for key, value in self._scan(prefix + _U64.pack(start), prefix[:-1] + b"\x01"):
            out.append((_U64.unpack(key[len(prefix) :])[0], value))
            if count is not None and len(out) >= count:
                break
        return out

    def set_contains(self, name: str, member: bytes) -> bool:
        return self._db.get(_member_prefix(name) + member) is not None

    def set_len(self, name: str) -> int:
        raw: bytes | None = self._db.get(_count(name))
        return _U64.unpack(raw)[0] if raw else 0

    def set_members(self, name: str) -> list[bytes]:
        prefix = _member_prefix(name)
        return [k[len(prefix) :] for k, _ in self._scan(prefix, prefix[:-1] + b"\x01")]

    def set_range(
        self, name: str, after: bytes | None = None, count: int = 100, *, reverse: bool = False
    ) -> list[bytes]:
        """At most ``count`` members of set ``name`` in byte order (``reverse``: from the
        largest down), starting past ``after`` (None: from the first, or the last). A
        cursor read for paging: a member removed since it was handed out still works
        as ``after``."""
        prefix = _member_prefix(name)
        hi = prefix[:-1] + b"\x01"
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
