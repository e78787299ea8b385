"""Consistent cuts of a store, and waiting - from any event loop - for commits.

What it owns
------------
``View``: a consistent cut, a RocksDB iterator pinned at a log offset, read by
``replicated_pairs`` (every replicated row, in key order) and ``view_digest``.
``Waiters``: the futures that a commit resolves from whatever thread commits - an
offset waiter (``Log.wait_for``) wakes on every commit and checks its offset; a
pinned cut (``Log.view_at``) is a ``View`` taken inside the commit of exactly its
offset. ``OffsetPassed`` says that offset is already behind the log.

Layout
------
No keys of its own. Node-local keys (``_`` + name, see ``pagesift.core.store.layout``) all
sort before ``_LOCAL_END``: a cut skips them with one seek, so they are never
replicated and never digested.

The guarantees
--------------
* **Consistent cuts without stopping writers.** A ``View`` is created (by ``Log``)
  while holding the write section: a RocksDB iterator reads an implicit snapshot
  pinned at its creation, so iterating it later, outside the lock, sees exactly the
  state at ``view.offset`` while writers go on. (rocksdict 0.3.29's
  ``Snapshot.iter()``/``items()`` do NOT honour the snapshot - only point reads do -
  so the plain iterator is the snapshot here; ``tests/test_replog.py`` pins this.)
* **A pinned cut is exactly at its offset.** ``committed(offset, ...)`` takes the
  view inside the commit of ``offset``, before the next group can commit.
* **No wake-up is lost.** A waiter registers, then re-checks its condition: a commit
  between the first check and the registration is seen by the re-check, and one
  after the registration wakes it.

Why it is safe
--------------
``committed`` may run on any thread (the primary's event loop, a standby's apply
thread): each future is resolved on its own loop by ``loopwake.on_loop`` - directly
when that loop is the running one (no self-pipe write, the primary's usual case), else
through ``call_soon_threadsafe``; a closed loop has nobody waiting. The registries are
guarded by their own small lock, never held across a call out.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pagesift.core.store.layout import LOCAL, digest_rows
from pagesift.core.util.loopwake import on_loop

T = TypeVar("T")

_LOCAL_END = bytes([LOCAL[0] + 1])  # first key after every node-local key


class OffsetPassed(Exception):
    """A digest was asked for an offset this node has already applied past."""


@dataclass
class View:
    """A consistent cut: a RocksDB iterator pinned at ``offset`` (see module doc)."""

    iterator: Any  # rocksdict.RdictIter: an implicit snapshot taken at creation
    offset: int
    tail_epoch: int


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
    """``Store.digest()`` of the cut: the one digest, ``store.digest_rows``."""
    return digest_rows(replicated_pairs(view))


def _wake(fut: asyncio.Future[T], value: T) -> None:
    if not fut.done():
        fut.set_result(value)


class Waiters:
    """Offset waiters and pinned cuts of one log (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._pins: dict[int, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[View]]]] = {}

    async def wait_until(self, reached: Callable[[], bool], within: float) -> bool:
        """Wait until ``reached()`` (checked after each commit); False on timeout."""
        if reached():
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters.append((loop, fut))
        if reached():  # committed between the check and the registration
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await fut
        return reached()

    def pin(self, offset: int) -> asyncio.Future[View]:
        """Ask for the cut at ``offset``, which must not have committed yet (call
        under the store's lock); await it with ``pinned_view``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[View] = loop.create_future()
        with self._lock:
            self._pins.setdefault(offset, []).append((loop, fut))
        return fut

    async def pinned_view(self, offset: int, fut: asyncio.Future[View], within: float) -> View:
        """The cut ``pin(offset)`` asked for; ``TimeoutError`` when not reached in time."""
        try:
            async with asyncio.timeout(within):
                return await fut
        finally:
            with self._lock:
                pins = self._pins.get(offset, [])
                entry = (fut.get_loop(), fut)
                if entry in pins:
                    pins.remove(entry)
                if not pins:
                    self._pins.pop(offset, None)

    def first_pinned(self, offsets: Iterable[int]) -> int | None:
        """The index of the first of ``offsets`` that a cut is pinned at, if any."""
        if not self._pins:
            return None
        with self._lock:
            for i, offset in enumerate(offsets):
                if offset in self._pins:
                    return i
        return None

    def committed(self, offset: int, take_view: Callable[[], View]) -> None:
        """``offset`` just committed (inside the write section, any thread): hand the
        cuts pinned there ``take_view()``, and wake every offset waiter."""
        with self._lock:
            pins = self._pins.pop(offset, [])
        if pins:
            view = take_view()  # still inside the commit's critical section
            for loop, fut in pins:
                on_loop(loop, _wake, fut, view)
        self.wake_all()

    def wake_all(self) -> None:
        """Wake every offset waiter (each re-checks its own condition)."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            on_loop(loop, _wake, fut, None)
