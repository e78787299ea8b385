"""Stopping child tasks without swallowing the caller's own cancellation.

``cancel_and_wait(task)`` cancels ``task`` and waits until it has ended. The
``CancelledError`` that ends the child is absorbed; a cancellation of the *awaiting*
task itself (Ctrl-C through ``asyncio.run``, a shutdown) is not: it propagates. The
common ``with suppress(CancelledError): await task`` cannot tell the two apart, so a
cancel that arrives while the caller waits is lost and the caller runs on.

``cancel_and_wait_all(tasks)`` does the same for several children whose own ends do
not matter to the caller (a shutdown): however each ended (its cancellation, an
error it raised) is absorbed, and the caller's own cancellation still propagates
(``asyncio.wait`` raises only for the waiting task, never for a child).

``all_or_none(coros)`` runs sibling coroutines (a job's workers) as tasks until every
one has ended, and when one raises, cancels the others and waits for their end before
its exception propagates: no sibling outlives the call. ``asyncio.gather`` leaves the
others running when one raises -- a job's worker that met a store refusing writes
ended its run while its siblings went on fetching, and wrote again once the store took
writes, beside the run that resumed the job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for its end (see the module docstring)."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # ours, not the child's


async def cancel_and_wait_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel every one of ``tasks`` and wait until all have ended (module docstring)."""
    children = list(tasks)
    for task in children:
        task.cancel()
    if children:
        await asyncio.wait(children)
    for task in children:
        if not task.cancelled():
            task.exception()  # retrieved: its end is not the caller's concern


async def all_or_none(coros: Iterable[Coroutine[Any, Any, Any]]) -> None:
    """Run ``coros`` as tasks until all have ended; the first to raise cancels the rest
    (awaited) and its exception propagates; a cancel of the caller cancels them all
    first (module docstring)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        await cancel_and_wait_all(tasks)
        raise
    errors = [t.exception() for t in tasks if t.done() and not t.cancelled()]
    await cancel_and_wait_all(t for t in tasks if not t.done())
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
