"""Replication messages built from bytes and split back into bytes, by hand.

What it owns
------------
The hot paths move serialized entries and rows without building a protobuf object
per entry or per row. ``entries_message`` frames a primary's logged entries (the
bytes its backlog holds) into a serialized ``StreamResponse(entries=EntryBatch)``;
``split_entries_message`` cuts such a message back into the entries' bytes, which a
standby logs as received. ``snapshot_messages`` encodes a cut's rows straight into
serialized ``StreamResponse(snapshot_chunk=SnapshotChunk(ops=...))`` in a worker
thread; ``_row_op`` is the one row -> op mapping, and ``ops_from_pairs`` and
``snapshot_chunks`` read its bytes back as protobuf objects.

Wire format
-----------
Protobuf, with the field numbers of replication.proto and store.proto::

    StreamResponse   entries = 3 (EntryBatch), snapshot_chunk = 2 (SnapshotChunk)
    EntryBatch       entries = 1 (LogEntry, repeated)
    SnapshotChunk    ops = 1 (Op, repeated), last = 2 (bool)
    Op               kv_put = 1, list_push = 3, list_clear = 5, set_insert = 6
    KvPut            key = 1, value = 2
    ListPush         list = 1, seq = 2 (varint), item = 3
    ListClear        list = 1, upto = 2 (varint)
    SetInsert        set = 1, member = 2, size = 3 (varint)

Store rows (``pagesift.core.store.layout``): ``k{key}`` a value, ``l{list}\\0{seq:u64be}`` a
list item, ``m{list}`` a list's (head, next), ``s{set}\\0{member}`` a set member,
``c{set}`` a set's size.

The guarantees
--------------
* **Entries travel as bytes.** The bytes a primary logs are the bytes it sends and
  the bytes a standby logs: nothing is re-serialized on the way, so a promoted
  standby serves exactly what it received.
* **The same bytes as the protobuf runtime.** Every message here parses to what the
  runtime would build (proto3: empty fields and zero varints omitted);
  ``tests/test_replog.py`` checks the bytes against the runtime.
* **A snapshot rebuilds the same store** through the one write path,
  ``Store.apply`` (see ``ops_from_pairs`` for why it is exact).
* **The snapshot shares the GIL.** ``snapshot_chunk_bodies`` releases it about every
  millisecond, so the event loop never waits a whole switch interval for it.

Why it is safe
--------------
Everything here is a pure function of its input (the rows of a cut, or bytes).
``split_entries_message`` accepts only the exact layout ``entries_message`` writes
and returns ``None`` for anything else, so the caller falls back to parsing.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Sequence

from pagesift.core.store.cuts import View, replicated_pairs
from pagesift.v1 import replication_pb2, store_pb2

_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")
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


# --- entry batches ----------------------------------------------------------------------


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


# --- snapshots: store rows as ops ------------------------------------------------------


def ops_from_pairs(pairs: Iterator[tuple[bytes, bytes]]) -> Iterator[store_pb2.Op]:
    """Re-express raw store rows (the layout in ``pagesift.core.store.layout``) as ops, so
    a full resync rebuilds the standby through the one write path, ``Store.apply``.

    The one row -> op mapping is ``_row_op`` (which the snapshot encodes straight to
    bytes); this parses what it encodes, so both agree by construction.

    Rebuilding is exact because: a list's items keep their sequence numbers (a
    ``ListPush`` per item, seq preserved) and its head is restored by a
    ``ListClear(upto=head)`` (items below the head do not exist, so it deletes
    nothing and only raises the head); the next counter equals the last item + 1, or
    the head for an empty list, which the clear restores too. A set's size row (``c``)
    sorts before its members (``s``): each member's ``SetInsert`` carries that size,
    which is what the set holds once all of them are in. Rows come in key order.
    """
    sizes: dict[bytes, int] = {}
    parse = replication_pb2.SnapshotChunk.FromString
    for key, value in pairs:
        parts: list[bytes] = []
        if _row_op(parts, key, value, sizes):
            yield parse(b"".join(parts)).ops[0]


def _set_size(sizes: dict[bytes, int], name: bytes) -> int:
    size = sizes.get(name)
    if size is None:
        raise ValueError(f"set {name[:32]!r} has members but no size row")
    return size


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


def snapshot_chunks(view: View, chunk_bytes: int = 1 << 20) -> Iterator[list[store_pb2.Op]]:
    """The cut as lists of ops of about ``chunk_bytes`` each (at least one list): the
    ops of ``ops_from_pairs``, in the chunks ``snapshot_messages`` sends."""
    for body, _ in snapshot_chunk_bodies(view, chunk_bytes):
        yield list(replication_pb2.SnapshotChunk.FromString(body).ops)
