"""Stopping a child task without swallowing the caller's own cancellation.

``cancel_and_wait(task)`` cancels ``task`` and waits until it has ended. The
``CancelledError`` that ends the child is absorbed; a cancellation of the *awaiting*
task itself (Ctrl-C through ``asyncio.run``, a shutdown) is not: it propagates. The
common ``with suppress(CancelledError): await task`` cannot tell the two apart, so a
cancel that arrives while the caller waits is lost and the caller runs on.
"""

from __future__ import annotations

import asyncio
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
