"""Bounds on WatchJob streams: how many may be open, and how much each may hold.

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

The window each stream holds is set here too: WatchJob reads at most ``WINDOW_DOCS``
documents and about ``WINDOW_BYTES`` from the store at a time, and reads the next
batch only once gRPC has taken every document of the last one (a yield of a
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
"""

from __future__ import annotations

from pagesift.shared.accounts import Account
from pagesift.shared.metrics import Metrics
from pagesift.shared.quota import LimitExceeded

__all__ = ["WINDOW_BYTES", "WINDOW_DOCS", "Slot", "StreamSlots"]

WINDOW_DOCS = 8  # documents read from the store per batch, at most
WINDOW_BYTES = 256 * 1024  # ... and about this many bytes (at least one document)


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
