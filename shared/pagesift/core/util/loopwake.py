"""Running a callback on an event loop from any thread: the one way pagesift does it.

What it owns
------------
``on_loop(loop, fn, *args)`` runs ``fn(*args)`` on ``loop``. Commits happen on
whatever thread writes (the primary's event loop, a standby's apply thread, a worker
in ``asyncio.to_thread``), and what they wake lives on a loop: a commit waiter's future
(``pagesift.core.store.cuts``), a job watcher's event (``pagesift.core.jobs.events``), a
webhook delivery task (``pagesift.primary.webhooks.outbox``). Each of those goes through here.

Why it is safe
--------------
- On ``loop`` itself (it is the running loop of the calling thread) ``fn`` runs at
  once: no self-pipe write on the common path, and the caller sees its effect.
- Anywhere else (another thread, or no loop running) ``fn`` is queued with
  ``call_soon_threadsafe``, the one thread-safe entry into a loop; asyncio objects are
  then touched only by their own loop's thread.
- A closed loop has nobody waiting on it: the call is dropped, never raised into the
  committing thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVarTuple

__all__ = ["on_loop"]

Ts = TypeVarTuple("Ts")


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[*Ts], object], *args: *Ts) -> None:
    """Run ``fn(*args)`` on ``loop``: now if it is the running loop here, else queued
    thread-safely; dropped when ``loop`` is closed (see the module docstring)."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        fn(*args)
        return
    with contextlib.suppress(RuntimeError):  # loop already closed: nobody waits
        loop.call_soon_threadsafe(fn, *args)
