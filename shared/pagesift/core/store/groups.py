"""Write groups: one atomic set of changes to a store, and the ops that describe it.

A ``WriteGroup`` collects its changes in memory (reads inside the group see its own
writes) and records, in write order, the ``Op`` messages that describe them; it is
built only by ``db.Store.write``, which commits it as one RocksDB batch, and it reads
the store through the point read the store hands it (it holds no database handle:
``tests/test_write_path.py``). Replication ships exactly its ops, and ``apply_ops``
on another store's group reproduces it.

Why a replay once, twice, or after a partial replay ends in the same store (the
log applies each entry once; this is the second line of defence):

- ``ListPush(list, seq, item)`` is skipped when ``seq < next``: the item is there.
- ``ListPopFront(list, seq)`` is skipped when ``seq < head``: already popped.
- ``ListClear(list, upto)`` removes items below ``upto`` and raises head/next to it;
  it carries ``upto`` instead of "everything" so a replayed clear can never delete
  an item pushed after it.
- KV puts/deletes and set clears are assignments, and so are set inserts/removes:
  they carry the set's size after them (``size``), so applying one writes the
  member and the size without reading either (a standby applies six per crawled
  page); replayed in log order, the last op leaves the size the source had.

Bounded groups: ``check_bound`` measures a group (``size``: the serialized bytes of
its ops, what its log entry carries) and raises ``GroupTooLarge`` past a bound;
``DEFAULT_MAX_GROUP_BYTES`` because a log entry is one protobuf message, which cannot
pass 2 GiB, and a standby receives it whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pagesift.core.store.layout import (
    BOUNDS,
    LOCAL,
    U64,
    bounds_key,
    check_name,
    count_key,
    item_key,
    kv_key,
    member_prefix,
    prefix_end,
)
from pagesift.v1 import store_pb2

Op = store_pb2.Op

DEFAULT_MAX_GROUP_BYTES = 1 << 30  # a store's bound on one group (module docstring)


class GroupTooLarge(Exception):
    """``Store.write`` refused a group of ``size`` bytes of ops, over ``bound``;
    nothing of it was written."""

    def __init__(self, size: int, bound: int) -> None:
        self.size = size
        self.bound = bound
        super().__init__(f"a write group of {size} bytes is over the {bound}-byte bound")


class WriteGroup:
    """One atomic set of changes. Build it only through ``Store.write``."""

    def __init__(self, read: Callable[[bytes], bytes | None]) -> None:
        self._read = read  # the store's point read (``db.Store`` hands it over)
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
        return self._read(key)

    def _delete_range(self, lo: bytes, hi: bytes) -> None:
        self._ranges.append((lo, hi))
        for key in [k for k in self._pending if lo <= k < hi]:
            del self._pending[key]

    def _bounds(self, name: str) -> tuple[int, int]:
        raw = self._get(bounds_key(name))
        if raw is None:
            return 0, 0
        head, nxt = BOUNDS.unpack(raw)
        return head, nxt

    def _set_bounds(self, name: str, head: int, nxt: int) -> None:
        self._pending[bounds_key(name)] = BOUNDS.pack(head, nxt)

    def _set_count(self, name: str, delta: int) -> int:
        """Change the set's size by ``delta``; returns the new size."""
        key = count_key(name)
        raw = self._get(key)
        n = (U64.unpack(raw)[0] if raw else 0) + delta
        self._pending[key] = U64.pack(n) if n > 0 else None
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

    def check_bound(self, bound: int) -> None:
        """Raise ``GroupTooLarge`` when the group's ops are over ``bound`` bytes (0: no
        bound). Measured only when there are ops: a group of local keys is never big."""
        if bound > 0 and self.ops:
            size = self.size()
            if size > bound:
                raise GroupTooLarge(size, bound)

    @property
    def empty(self) -> bool:
        """Nothing to commit: no op, no key write, no range delete."""
        return not self.ops and not self._pending and not self._ranges

    def staged(self) -> tuple[Sequence[tuple[bytes, bytes]], Mapping[bytes, bytes | None]]:
        """What the commit writes, read by ``Store`` to build the one batch: the range
        deletes (``[lo, hi)``), then the key writes (None: a delete), which win over
        a range because the group dropped its own pending keys inside each range."""
        return self._ranges, self._pending

    # KV ---------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        return self._get(kv_key(key))

    def put(self, key: str, value: bytes) -> None:
        self._pending[kv_key(key)] = value
        self.ops.append(Op(kv_put=store_pb2.KvPut(key=key, value=value)))

    def delete(self, key: str) -> None:
        self._pending[kv_key(key)] = None
        self.ops.append(Op(kv_delete=store_pb2.KvDelete(key=key)))

    # lists ------------------------------------------------------------------
    def push(self, name: str, item: bytes) -> int:
        """Append ``item``; returns its sequence number."""
        head, seq = self._bounds(check_name(name))
        self._pending[item_key(name, seq)] = item
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
        item = self._get(item_key(name, head)) or b""
        self._pending[item_key(name, head)] = None
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
            self._pending[item_key(name, seq)] = None
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
        self._delete_range(item_key(name, 0), item_key(name, upto))
        new_head, new_next = max(head, upto), max(nxt, upto)
        if drop:
            self._pending[bounds_key(name)] = None
        elif new_head or new_next:
            self._set_bounds(name, new_head, new_next)

    # sets -------------------------------------------------------------------
    def insert(self, name: str, member: bytes) -> bool:
        """Add ``member``; returns False (and records nothing) when it was there."""
        key = member_prefix(check_name(name)) + member
        if self._get(key) is not None:
            return False
        self._pending[key] = b""
        size = self._set_count(name, 1)
        self.ops.append(Op(set_insert=store_pb2.SetInsert(set=name, member=member, size=size)))
        return True

    def contains(self, name: str, member: bytes) -> bool:
        return self._get(member_prefix(name) + member) is not None

    def set_len(self, name: str) -> int:
        raw = self._get(count_key(name))
        return U64.unpack(raw)[0] if raw else 0

    def remove(self, name: str, member: bytes) -> bool:
        key = member_prefix(name) + member
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
        prefix = member_prefix(name)
        self._delete_range(prefix, prefix_end(prefix))
        self._pending[count_key(name)] = None

    # replication --------------------------------------------------------------
    def apply_op(self, op: store_pb2.Op) -> None:
        """Apply one replicated op idempotently, recording it like a local write."""
        fn = _APPLY.get(op.WhichOneof("op") or "")
        if fn is None:
            raise ValueError(f"unknown store op {op.WhichOneof('op')!r}")
        fn(self, op)

    def apply_ops(self, ops: Sequence[store_pb2.Op]) -> None:
        """``apply_op`` for many ops: the standby's hot path (hundreds of ops a batch)."""
        table = _APPLY
        for op in ops:
            fn = table.get(op.WhichOneof("op") or "")
            if fn is None:
                raise ValueError(f"unknown store op {op.WhichOneof('op')!r}")
            fn(self, op)

    # Each ``_apply_*`` does what the matching public method does (same keys, same
    # checks, same op recorded), minus the rebuilding of an equal ``Op`` message; the
    # hot ones spell ``layout``'s keys inline (b"k", b"m", b"l", b"s", b"c") to save
    # the calls on the standby's apply path.
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
        head, nxt = BOUNDS.unpack(raw) if raw is not None else (0, 0)
        if seq < nxt:
            return
        pending[b"l" + raw_name + b"\x00" + U64.pack(seq)] = p.item
        pending[meta] = BOUNDS.pack(head, seq + 1)
        self.ops.append(op)

    def _apply_list_pop_front(self, op: store_pb2.Op) -> None:
        q = op.list_pop_front
        head, nxt = self._bounds(q.list)
        if q.seq < head:
            return
        self._pending[item_key(q.list, q.seq)] = None
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
        raw_name = check_name(p.set).encode()
        self._pending[b"s" + raw_name + b"\x00" + p.member] = b""
        self._pending[b"c" + raw_name] = U64.pack(p.size)
        self.ops.append(op)

    def _apply_set_remove(self, op: store_pb2.Op) -> None:
        p = op.set_remove
        raw_name = check_name(p.set).encode()
        self._pending[b"s" + raw_name + b"\x00" + p.member] = None
        self._pending[b"c" + raw_name] = U64.pack(p.size) if p.size else None
        self.ops.append(op)

    def _apply_set_clear(self, op: store_pb2.Op) -> None:
        self._clear_set(op.set_clear.set)
        self.ops.append(op)


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
