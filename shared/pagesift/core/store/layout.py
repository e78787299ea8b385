"""The store's key layout: how KV, lists and sets sit in RocksDB's one key space.

Every row of a store is spelled here and nowhere else; ``groups`` writes these keys,
``db`` reads them, ``cuts`` and replication's ``framing`` scan them. One byte of tag,
then the name (names never contain NUL, ``check_name``):

    k{key}                      -> value                  KV
    m{list}                     -> u64 head, u64 next      list bounds (big-endian)
    l{list}\\0{seq:u64be}         -> item                  list item, seq = push order
    s{set}\\0{member}             -> b""                   set member
    c{set}                      -> u64 count               set size
    _{name}                     -> bytes                   node-local: never replicated or digested

Why the tags and the NUL: every list's items and every set's members are one
contiguous key range (``prefix`` .. ``prefix_end``), so a scan or a clear of one
never reaches another's; sequence numbers are big-endian so byte order is push order.
``_`` sorts before every other tag, so a scan of replicated rows skips node-local keys
with one seek. ``digest_rows`` is THE digest of a store's replicated rows: equal
digests, equal stores (a standby verifies its replica with it).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

U64 = struct.Struct(">Q")  # a list's sequence number, a set's size
BOUNDS = struct.Struct(">QQ")  # a list's (head, next)
LOCAL = b"_"


def kv_key(key: str) -> bytes:
    return b"k" + key.encode()


def bounds_key(name: str) -> bytes:
    return b"m" + name.encode()


def item_prefix(name: str) -> bytes:
    return b"l" + name.encode() + b"\x00"


def item_key(name: str, seq: int) -> bytes:
    return item_prefix(name) + U64.pack(seq)


def member_prefix(name: str) -> bytes:
    return b"s" + name.encode() + b"\x00"


def count_key(name: str) -> bytes:
    return b"c" + name.encode()


def prefix_end(prefix: bytes) -> bytes:
    """The first key past every key under an ``item_prefix`` or ``member_prefix``
    (their NUL separator raised to 1)."""
    return prefix[:-1] + b"\x01"


def check_name(name: str) -> str:
    if "\x00" in name:
        raise ValueError(f"store names cannot contain NUL: {name!r}")
    return name


def local_key(name: str) -> bytes:
    """A node-local key (applied offset, epoch, backlog): written only with a group."""
    return LOCAL + name.encode()


def digest_rows(rows: Iterable[tuple[bytes, bytes]]) -> str:
    """THE store digest: SHA-256 over (u64be length, key, u64be length, value) of each
    replicated row, in key order (``Store.digest`` and ``cuts.view_digest`` use it)."""
    h = hashlib.sha256()
    for key, value in rows:
        h.update(U64.pack(len(key)))
        h.update(key)
        h.update(U64.pack(len(value)))
        h.update(value)
    return h.hexdigest()
