"""Change notification for job watchers, fed by the store itself.

``JobEvents`` is a store ``Observer``: every committed group wakes the watchers of
the jobs its ops touched (``records.job_of`` names the job that owns a key).
Because it hangs on the one write path, it works the same on a primary (local
writes) and on a standby (applied entries), and no writer can forget to notify.
The job runtime also calls ``notify`` directly when a page becomes visible later
than its commit (sync replication). Watchers must take ``current(job_id)``
*before* reading the store, so a change that lands between their read and their
wait is never missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from pagesift.core.jobs.records import JobKeys, job_of
from pagesift.core.store.groups import Op, WriteGroup
from pagesift.core.util.loopwake import on_loop


class JobEvents:
    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def current(self, job_id: str) -> asyncio.Event:
        ev = self._events.get(job_id)
        if ev is None:
            ev = self._events[job_id] = asyncio.Event()
        return ev

    def notify(self, job_id: str) -> None:
        """Wake the watchers of ``job_id`` (from any thread: ``loopwake.on_loop``)."""
        if self._loop is not None:
            on_loop(self._loop, self._notify_here, job_id)
        else:
            self._notify_here(job_id)

    def _notify_here(self, job_id: str) -> None:
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
        # Runs inside the write section of EVERY group (a standby's apply batches hold
        # hundreds of ops). Nobody watching: nothing to do. This check is race-free: a
        # watcher registers (``current``) before it reads the store, and this runs
        # after the batch is durable, so a watcher registering after the check reads
        # the new state anyway.
        events = self._events
        if not events:
            return
        touched: set[str] = set()
        last = ""  # the "job/{id}/" prefix of the previous op: groups touch few jobs
        for op in group.ops:
            kind = op.WhichOneof("op")
            if kind is None:
                continue
            name = _NAME[kind](op)
            if last and name.startswith(last):
                continue
            job = job_of(name)
            if job is not None:
                last = JobKeys(job).prefix
                if job in events:
                    touched.add(job)
        for job in touched:
            self.notify(job)


_NAME: dict[str, Callable[[Op], str]] = {
    "kv_put": lambda op: op.kv_put.key,
    "kv_delete": lambda op: op.kv_delete.key,
    "list_push": lambda op: op.list_push.list,
    "list_pop_front": lambda op: op.list_pop_front.list,
    "list_clear": lambda op: op.list_clear.list,
    "set_insert": lambda op: op.set_insert.set,
    "set_remove": lambda op: op.set_remove.set,
    "set_clear": lambda op: op.set_clear.set,
}
