"""Model call slots shared fairly between accounts (``FairSlots``).

What it owns
------------
The node's ``model_concurrency`` slots. A call takes one with ``async with
slots.slot(owner)``; when every slot is taken it waits in its account's queue.

Protocol
--------
A freed slot goes to the next waiting account in round-robin order (accounts in the
order they first waited since they last had none waiting), and within an account to
its oldest waiter. So an account with a thousand pages queued and another with one
alternate slot by slot: the second waits for at most one call of each account ahead
of it, never behind the first account's whole queue.

Why it is safe
--------------
- A slot is handed over (``_grant``) before its waiter wakes, so no third caller can
  take it in between, and ``held`` never passes ``capacity``.
- A waiter cancelled after its grant gives the slot back; one cancelled before is
  removed from its queue: no slot leaks either way.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["FairSlots"]


class FairSlots:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.held = 0
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @asynccontextmanager
    async def slot(self, owner: str) -> AsyncIterator[None]:
        await self._acquire(owner)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, owner: str) -> None:
        if self.held < self.capacity and not self._waiting:
            self.held += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(owner, deque()).append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # granted, then cancelled: give the slot on
            else:
                self._forget(owner, waiter)
            raise

    def _forget(self, owner: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(owner)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            return
        if not queue:
            del self._waiting[owner]

    def _release(self) -> None:
        self.held -= 1
        self._grant()

    def _grant(self) -> None:
        while self.held < self.capacity and self._waiting:
            owner, queue = next(iter(self._waiting.items()))
            waiter = queue.popleft()
            del self._waiting[owner]
            if queue:  # the account goes to the back of the round
                self._waiting[owner] = queue
            if waiter.done():
                continue
            self.held += 1
            waiter.set_result(None)
