"""Bounds on WatchJob streams: how many may be open, and how many bytes they may hold.

What it owns
------------
``StreamSlots`` counts the open WatchJob streams of each account and of the whole
node (in memory: a stream does not outlive its process). ``acquire`` takes a slot or
raises ``quota.LimitExceeded`` naming the limit, for a RESOURCE_EXHAUSTED status in
the shape of the other account limits (message + ``pagesift-limit`` trailing
metadata):

- ``max_concurrent_streams``: an account's own value from the accounts file, else the
  server's ``max_concurrent_streams`` (default 64); 0 in the server config = no cap.
- ``max_total_streams``: every account together on this node (default 1024; 0 = no
  cap), so that many accounts cannot exhaust memory between them either.

``WatchBytes`` bounds what the streams hold in memory, in bytes (issue 19, finding
11: the window used to count documents, so 60 unread streams on a job of 4 MB
documents each held eight of them, 2.8 GB in all). A stream's *bytes in flight* are
the serialized sizes of the documents it has read from the store that the transport
has not taken yet:

- per stream, ``watch_stream_bytes``: a stream reads the next documents (at most
  ``WINDOW_DOCS``) only up to this many bytes, one at a time, so it never holds more;
  a single document bigger than that is one message and cannot be split: it is read
  alone, after the node budget granted its whole size;
- per node, ``watch_total_bytes`` (0 = no cap): the bytes in flight of every stream
  together. A stream reserves its window from this budget *before* it reads, and
  waits (in order, holding nothing) while the budget is spent; it gives each document's
  bytes back as soon as gRPC has taken the message (HTTP/2 flow control holds the
  message while the peer does not read: that is the back-pressure). A document larger
  than the whole budget goes when nothing else is in flight, so it never waits forever.
- per account, ``watch_account_bytes`` (0 = no cap): the share of that budget one
  account's streams may hold together, so that one account's unread streams make
  only its own streams wait, never another account's. A waiter held back by its own
  account's share is passed over; one held back by the node's budget is not (no
  overtaking there, so a big document is not starved by small ones).

A stream whose client never reads keeps its bytes until the client reads, cancels or
disconnects: gRPC cannot end it sooner (a status sent behind an unread message waits
behind it, the handler's done callbacks do not run, and the message stays in gRPC's
buffers; measured with grpcio 1.85), so ending "stalled" streams would free nothing
and hide what they hold. What bounds those is this budget: the streams beyond it
wait instead of reading, and the account shares keep the wait within the account
that does not read.

Each byte in flight costs about three in memory (the parsed response, its serialized
copy, gRPC core's copy of that).

The window each stream holds is set here too: WatchJob reads at most ``WINDOW_DOCS``
documents and at most ``watch_stream_bytes`` from the store at a time, and reads the
next batch only once gRPC has taken every document of the last one (a yield of a
grpc.aio server stream resumes only when the message has been handed to the
transport, and HTTP/2 flow control stops that when the peer does not read).

Guarantees
----------
- ``acquire``/``release`` are synchronous (no await between check and count), so
  concurrent openings on the event loop never overshoot a cap.
- Every acquired slot is released exactly once (``Slot.release`` is idempotent); the
  caller releases in a ``finally``, so streams that end, fail or are cancelled give
  their slot back.
- ``metrics.watch_streams`` always equals the number of held slots.
- ``WatchBytes.used`` (``pagesift_watch_bytes_in_flight``) is the sum of the open
  streams' ``StreamBytes.held``, and never passes ``watch_total_bytes`` except by one
  document larger than the whole budget, alone (likewise an account's share).
  Grants are synchronous (no await between the check and the count), and the
  waiter records its grant in the same step (``_Waiter.granted``), so who owns the
  bytes is never guessed from a future's state. A waiter cancelled at any point
  (queued; granted but not resumed yet; many in the same loop turn) gives back what
  it was granted, or else leaves the queue if no wake dropped it already, and then
  always wakes the queue (issue 28, finding 6: 60 streams cancelled together raised
  ValueError from a second ``remove`` and skipped that wake). ``StreamBytes.close``
  (in the stream's ``finally``) returns everything the stream held, so an ended or
  cancelled stream holds nothing. tests/test_watch_bytes.py drives random schedules
  of reserve/cancel/give/close (hypothesis) and checks the budget returns to zero.
- The decision (``fits``) is pure: the bytes used, the budget and the size asked.
"""

from __future__ import annotations

import asyncio
from collections import deque

from pagesift.core.api.metrics import Metrics
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.quota import LimitExceeded

__all__ = ["WINDOW_DOCS", "Slot", "StreamBytes", "StreamSlots", "WatchBytes", "fits"]

WINDOW_DOCS = 8  # documents read from the store per batch, at most


class Slot:
    """One open stream's place; ``release`` gives it back (once)."""

    def __init__(self, owner: StreamSlots, account: str) -> None:
        self._owner = owner
        self.account = account
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._owner._release(self.account)


class StreamSlots:
    """Open WatchJob streams per account and in all, against their caps."""

    def __init__(self, per_account: int, total: int, metrics: Metrics) -> None:
        self.per_account = per_account  # the server default (0: none)
        self.total = total  # 0: none
        self._metrics = metrics
        self._open: dict[str, int] = {}
        self._all = 0

    def cap(self, account: Account) -> int | None:
        """The account's cap: its own value, else the server default (None: no cap)."""
        if account.max_concurrent_streams is not None:
            return account.max_concurrent_streams
        return self.per_account or None

    def open(self, account: str | None = None) -> int:
        """Streams open now: the account's, or (None) the node's."""
        return self._all if account is None else self._open.get(account, 0)

    def acquire(self, account: Account) -> Slot:
        """A slot for a new stream of ``account``, or ``LimitExceeded``."""
        name = account.name
        held = self._open.get(name, 0)
        cap = self.cap(account)
        if cap is not None and held >= cap:
            raise LimitExceeded(
                "max_concurrent_streams",
                f"account {name!r} already has {held} WatchJob stream(s) open, its "
                f"max_concurrent_streams limit is {cap}; it frees when one of them ends "
                "or is cancelled",
            )
        if self.total and self._all >= self.total:
            raise LimitExceeded(
                "max_total_streams",
                f"this node already serves {self._all} WatchJob streams, its "
                f"max_total_streams limit is {self.total}; it frees when a stream ends "
                "(or use GetJob paging)",
            )
        self._open[name] = held + 1
        self._all += 1
        self._metrics.watch_streams.set(self._all)
        return Slot(self, name)

    def _release(self, name: str) -> None:
        left = self._open.get(name, 0) - 1
        if left > 0:
            self._open[name] = left
        else:
            self._open.pop(name, None)
        self._all -= 1
        self._metrics.watch_streams.set(self._all)


def fits(used: int, size: int, total: int) -> bool:
    """Whether ``size`` more bytes may be in flight when ``used`` are, under ``total``
    (0: no cap). Anything fits when nothing is in flight: a document bigger than the
    whole budget goes alone instead of never."""
    return not total or used == 0 or used + size <= total


class _Waiter:
    """One stream waiting for ``size`` bytes of ``account``. Who owns the bytes is
    never inferred from the future's state: ``granted`` is set by the wake that
    counted them, and cleared by whoever takes them over (the resumed caller, or
    ``_abandon`` giving them back). Compared by identity, so ``remove`` finds this one."""

    __slots__ = ("account", "fut", "granted", "size")

    def __init__(self, account: str, size: int, fut: asyncio.Future[None]) -> None:
        self.account = account
        self.size = size
        self.fut = fut
        self.granted = False


class WatchBytes:
    """The node's budget of WatchJob bytes in flight, shared by every stream, with a
    share per account; waiters are served in order (FIFO), except that one waiting
    for its own account's share does not hold up other accounts' streams."""

    def __init__(self, per_stream: int, total: int, metrics: Metrics, per_account: int = 0) -> None:
        self.per_stream = max(1, per_stream)
        self.total = total  # 0: none
        self.per_account = per_account  # 0: none
        self.used = 0
        self._by_account: dict[str, int] = {}
        self._metrics = metrics
        self._waiters: deque[_Waiter] = deque()
        self._streams: set[StreamBytes] = set()
        metrics.watch_stream_bytes_max.set_function(self.largest)

    def stream(self, account: str = "") -> StreamBytes:
        """The account of one new stream of ``account`` (``close`` it when it ends)."""
        held = StreamBytes(self, account)
        self._streams.add(held)
        return held

    def largest(self) -> float:
        """The most bytes any one open stream holds now."""
        return float(max((s.held for s in self._streams), default=0))

    def held_by(self, account: str) -> int:
        return self._by_account.get(account, 0)

    def waiting(self) -> int:
        return len(self._waiters)

    def _fits(self, account: str, size: int) -> tuple[bool, bool]:
        """(fits the account's share, fits the node's budget)."""
        mine = fits(self._by_account.get(account, 0), size, self.per_account)
        return mine, fits(self.used, size, self.total)

    async def _take(self, account: str, size: int) -> None:
        if not self._waiters and all(self._fits(account, size)):
            self._grant(account, size)
            return
        waiter = _Waiter(account, size, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._metrics.watch_streams_waiting.set(len(self._waiters))
        self._wake()  # it may fit now, behind waiters held back by their own share
        try:
            await waiter.fut
        except BaseException:  # cancelled (the client went away), whatever the moment
            self._abandon(waiter)
            raise
        waiter.granted = False  # the bytes are the caller's now (StreamBytes.held)

    def _abandon(self, waiter: _Waiter) -> None:
        """A waiter that will not use its grant, at any point of its wait: granted
        already (its future resolved, the task not resumed yet), it gives the bytes
        back; not granted, it leaves the queue if a wake has not dropped it already
        (``Task.cancel`` cancels its future at once, and any wake drops a done one).
        Either way the queue is woken after: it may have been the one holding the
        others back."""
        if waiter.granted:
            waiter.granted = False
            self._give(waiter.account, waiter.size)  # wakes
            return
        waiter.fut.cancel()  # no later wake can grant it
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        self._metrics.watch_streams_waiting.set(len(self._waiters))
        self._wake()

    def _grant(self, account: str, size: int) -> None:
        self.used += size
        self._by_account[account] = self._by_account.get(account, 0) + size
        self._metrics.watch_bytes.set(self.used)

    def _give(self, account: str, size: int) -> None:
        self.used -= size
        left = self._by_account.get(account, 0) - size
        if left > 0:
            self._by_account[account] = left
        else:
            self._by_account.pop(account, None)
        self._metrics.watch_bytes.set(self.used)
        self._wake()

    def _wake(self) -> None:
        """Grant waiters in order: one that does not fit the node's budget stops the
        scan (no overtaking, so a big document is not starved by small ones); one
        that does not fit its account's share is passed over; one whose future is
        done (cancelled) is dropped, holding nothing. Synchronous: a waiter is granted
        (``granted`` set, its future resolved) in the same step as the bytes are
        counted, so the grant's owner is never in doubt."""
        kept: deque[_Waiter] = deque()
        while self._waiters:
            waiter = self._waiters.popleft()
            if waiter.fut.done():
                continue
            mine, node = self._fits(waiter.account, waiter.size)
            if not node:
                kept.append(waiter)
                break
            if not mine:
                kept.append(waiter)
                continue
            self._grant(waiter.account, waiter.size)
            waiter.granted = True
            waiter.fut.set_result(None)
        kept.extend(self._waiters)
        self._waiters = kept
        self._metrics.watch_streams_waiting.set(len(self._waiters))

    def _closed(self, held: StreamBytes) -> None:
        self._streams.discard(held)


class StreamBytes:
    """One stream's bytes in flight, taken from (and given back to) the node's budget."""

    def __init__(self, budget: WatchBytes, account: str) -> None:
        self._budget = budget
        self.account = account
        self.held = 0
        self._open = True

    async def reserve(self, size: int) -> None:
        """Wait until the node's budget grants ``size`` more bytes to this stream."""
        await self._budget._take(self.account, size)
        if not self._open:  # closed while it waited (cannot happen from the stream itself)
            self._budget._give(self.account, size)
            return
        self.held += size

    def give(self, size: int) -> None:
        """``size`` bytes of this stream are no longer in flight."""
        size = min(size, self.held)
        if size > 0:
            self.held -= size
            self._budget._give(self.account, size)

    def close(self) -> None:
        """Give back everything this stream holds (idempotent)."""
        if self._open:
            self._open = False
            self.give(self.held)
            self._budget._closed(self)
