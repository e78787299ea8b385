"""The backlog: the recent log entries a node keeps on disk, bounded in bytes.

What it owns
------------
``Backlog`` keeps the log entries of one store (written on a primary, applied on a
standby) as the bytes that were logged, and the log's tail (the newest offset and its
epoch). ``stage`` puts new entries, the new tail and the deletes of trimmed entries
into a write group's batch and returns a ``Plan``; ``finish`` moves the in-memory
counters once that batch is durable. ``read_raw`` serves entries from an offset on, to
a standby that keeps up or reconnects; ``BacklogLost`` says the offset was trimmed.
``RecentEntries`` keeps the newest entries in memory as well.

Storage layout (node-local keys: never replicated, never digested)
------------------------------------------------------------------
::

    _repl/log/{offset:u64be}   -> LogEntry (protobuf)   the backlog, oldest first
    _repl/tail                 -> u64 offset, u64 epoch  last entry written/applied

The guarantees
--------------
* **Bounded, and it survives restarts.** Entries are trimmed oldest first once the
  backlog exceeds ``max_bytes``; the newest entry always stays, so a standby can
  always continue from the entry before the one it has not yet seen. On open, the
  first/last offsets and the sizes are recovered by scanning ``_repl/log/``.
* **Counters move only after the commit.** ``stage`` writes nothing but the batch; a
  failed commit leaves every counter as it was. ``finish`` applies the ``Plan``.
* **Entries travel as bytes.** ``read_raw`` returns exactly the bytes that were
  logged (from memory for the newest ones): nothing is re-serialized.
* **Memory holds only what the backlog holds.** The newest entries (up to
  ``RECENT_BYTES``) are kept in memory, and evicted as soon as they are trimmed:
  memory never serves an entry that ``read_raw`` must report as lost.

Why it is safe
--------------
The backlog is contiguous and ends at the tail because the entries and the tail are
written in the same batch, and trimming deletes from the front in the same batch as
the entry that caused it: the scan on open finds exactly what was committed (anything
else is reported as corruption). ``stage`` and ``finish`` run inside the store's write
section, so there is one writer. Reading takes no lock: entries at or below ``last``
are committed and immutable, a dict get is atomic, and the only race - trimming - is
reported as ``BacklogLost``.
"""

from __future__ import annotations

import itertools
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pagesift.core.store.db import Store
from pagesift.core.store.layout import local_key

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

#: An entry to stage: (offset, epoch, serialized ``LogEntry``).
Staged = tuple[int, int, bytes]


def _u64(raw: bytes | None) -> int:
    return int(_U64.unpack(raw)[0]) if raw else 0


def entry_key(offset: int) -> bytes:
    return _LOG + _U64.pack(offset)


def tail_local(offset: int, tail_epoch: int) -> dict[bytes, bytes | None]:
    """The tail key of a store whose log ends at (``offset``, ``tail_epoch``) with no
    entries kept (a store rebuilt from a snapshot)."""
    return {_TAIL: _U64X2.pack(offset, tail_epoch)}


class BacklogLost(Exception):
    """The requested offset was trimmed from the backlog (the reader fell behind)."""


@dataclass
class Plan:
    """What a staged group will do to the in-memory backlog once it commits."""

    first: int
    last: int
    tail_epoch: int
    new_sizes: list[int]
    dropped: int
    written: list[tuple[int, bytes]]  # (offset, entry bytes) that went into the backlog


class RecentEntries:
    """The newest backlog entries as bytes: offsets ``[lo, lo + len)``, a subset of the
    backlog, at most ``max_bytes`` (the newest entry always stays).

    Written inside the write section only; ``get`` is a dict get (atomic) of immutable
    bytes, so readers take no lock."""

    def __init__(self, max_bytes: int) -> None:
        self._entries: dict[int, bytes] = {}
        self._lo = 0
        self._bytes = 0
        self._max = max_bytes

    def get(self, offset: int) -> bytes | None:
        return self._entries.get(offset)

    def remember(self, written: list[tuple[int, bytes]], first: int) -> None:
        """Keep the entries just committed; evict those over the bound or below the
        backlog's ``first`` offset."""
        recent = self._entries
        if written and recent and written[0][0] != self._lo + len(recent):
            recent.clear()  # not contiguous (cannot happen today): start over
            self._bytes = 0
        for off, data in written:
            if not recent:
                self._lo = off
            recent[off] = data
            self._bytes += len(data)
        # Evict the oldest: over the bound, or trimmed from the backlog (never serve
        # from memory what ``read_raw`` must report as lost). The newest entry stays.
        while recent and (self._lo < first or (self._bytes > self._max and len(recent) > 1)):
            self._bytes -= len(recent.pop(self._lo))
            self._lo += 1


class Backlog:
    """The backlog and tail of one store. Create it under ``store.lock``; ``stage``
    and ``finish`` run inside the store's write section."""

    def __init__(self, store: Store, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self._store = store
        self.max_bytes = max_bytes
        self._recent = RecentEntries(min(max_bytes, RECENT_BYTES))
        tail = store.get_local(_TAIL)
        last, tail_epoch = _U64X2.unpack(tail) if tail else (0, 0)
        self._last: int = int(last)
        self._tail_epoch: int = int(tail_epoch)
        # Scan the entries: contiguous, ending at the tail (see the module docstring).
        self._sizes: deque[int] = deque()
        first = self._last + 1
        it = store.iterator()  # read-only scan; writes still go through Store
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

    @property
    def first(self) -> int:
        """The oldest entry kept (``last + 1`` when empty)."""
        return self._first

    @property
    def last(self) -> int:
        """The tail: the newest entry written or applied."""
        return self._last

    @property
    def tail_epoch(self) -> int:
        return self._tail_epoch

    @property
    def size(self) -> int:
        """Bytes held (keys and entries)."""
        return self._bytes

    def stage(self, put: Callable[[bytes, bytes | None], None], entries: Sequence[Staged]) -> Plan:
        """Stage entries (offset, epoch, bytes), the tail and the trimming deletes
        through ``put``; nothing changes here until ``finish``."""
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
        return Plan(self._first + dropped, last_off, last_epoch, new_sizes, dropped, written)

    def finish(self, plan: Plan) -> None:
        """The staged batch is durable: move the counters and remember the entries."""
        self._sizes.extend(plan.new_sizes)
        self._bytes += sum(plan.new_sizes)
        for _ in range(plan.dropped):
            self._bytes -= self._sizes.popleft()
        self._first, self._last, self._tail_epoch = plan.first, plan.last, plan.tail_epoch
        self._recent.remember(plan.written, self._first)

    def read_raw(
        self, from_offset: int, *, max_bytes: int = 1 << 20, max_entries: int = 10_000
    ) -> list[bytes]:
        """Entries from ``from_offset`` on as the bytes kept (at least one if any
        exists, then up to ``max_bytes``): entry ``from_offset + i`` is item ``i``.
        Lock-free; a trimmed offset raises ``BacklogLost``."""
        if from_offset < 1:
            raise ValueError("offsets start at 1")
        out: list[bytes] = []
        size = 0
        last = self._last
        offset = from_offset
        cached = self._recent.get
        get = self._store.get_local
        while offset <= last and len(out) < max_entries and (not out or size < max_bytes):
            data = cached(offset)
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
