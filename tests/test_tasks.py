"""``cancel_and_wait``: a child's cancellation is absorbed, the caller's own is not."""

from __future__ import annotations

import asyncio

import pytest

from pagesift.shared.util.tasks import cancel_and_wait


async def slow_to_stop(stopping: asyncio.Event) -> None:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        stopping.set()
        await asyncio.sleep(0.05)  # cleans up before it ends
        raise


async def test_the_childs_cancellation_is_absorbed() -> None:
    child = asyncio.create_task(slow_to_stop(asyncio.Event()))
    await asyncio.sleep(0)
    await cancel_and_wait(child)
    assert child.cancelled()


async def test_a_cancel_of_the_waiting_caller_is_not_swallowed() -> None:
    stopping = asyncio.Event()
    child = asyncio.create_task(slow_to_stop(stopping))
    await asyncio.sleep(0)
    caller = asyncio.create_task(cancel_and_wait(child))
    await stopping.wait()  # the caller now waits for the child's clean-up
    caller.cancel()  # e.g. Ctrl-C reaching the drill's main task right then
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert child.done()
