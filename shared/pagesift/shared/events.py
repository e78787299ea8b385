"""Change notification for job watchers, fed by the store itself.

``JobEvents`` is a store ``Observer``: every committed group wakes the watchers of
the jobs its ops touched (keys ``job/{id}``...). Because it hangs on the one write
path, it works the same on a primary (local writes) and on a standby (applied
entries), and no writer can forget to notify. The job runtime also calls
``notify`` directly when a page becomes visible later than its commit (sync
replication). Watchers must take ``current(job_id)`` *before* reading the store,
so a change that lands between their read and their wait is never missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from pagesift.shared.store import WriteGroup


def job_of(key: str) -> str | None:
    if not key.startswith("job/"):
        return None
    rest = key[4:]
    return rest.split("/", 1)[0] or None


class JobEvents:
    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def current(self, job_id: str) -> asyncio.Event:
        ev = self._events.get(job_id)
        if ev is None:
            ev = self._events[job_id] = asyncio.Event()
        return ev

    def notify(self, job_id: str) -> None:
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            with contextlib.suppress(RuntimeError):  # loop closed: nobody is watching
                self._loop.call_soon_threadsafe(self.notify, job_id)
            return
        ev = self._events.pop(job_id, None)
        if ev is not None:
            ev.set()

    async def wait(self, ev: asyncio.Event, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout)

    # Observer ---------------------------------------------------------------
    def stage(self, group: WriteGroup) -> None:
        pass

    def committed(self, group: WriteGroup) -> None:
        touched: set[str] = set()
        for op in group.ops:
            kind = op.WhichOneof("op")
            if kind is None:
                continue
            msg = getattr(op, kind)
            name = getattr(msg, "key", "") or getattr(msg, "list", "") or getattr(msg, "set", "")
            job = job_of(str(name))
            if job is not None:
                touched.add(job)
        for job in touched:
            self.notify(job)
