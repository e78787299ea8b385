"""``cancel_and_wait`` and ``cancel_and_wait_all``: a child's end is absorbed, the
caller's own cancellation is not."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pagesift.shared.util.tasks import cancel_and_wait, cancel_and_wait_all


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


async def fails_when_stopped(stopping: asyncio.Event) -> None:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        stopping.set()
        await asyncio.sleep(0.05)
        raise RuntimeError("failed while stopping") from None


async def test_every_child_is_stopped_whatever_it_ended_with() -> None:
    children = [asyncio.create_task(slow_to_stop(asyncio.Event())) for _ in range(2)]
    children.append(asyncio.create_task(fails_when_stopped(asyncio.Event())))
    children.append(asyncio.create_task(asyncio.sleep(0)))
    await asyncio.sleep(0)
    await cancel_and_wait_all(children)
    assert all(child.done() for child in children)
    assert children[0].cancelled() and not children[2].cancelled()


async def test_a_cancel_of_the_caller_waiting_for_all_is_not_swallowed() -> None:
    stopping = asyncio.Event()
    children = [asyncio.create_task(fails_when_stopped(stopping))]
    await asyncio.sleep(0)
    caller = asyncio.create_task(cancel_and_wait_all(children))
    await stopping.wait()  # the caller waits for the child's clean-up
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    with pytest.raises(RuntimeError):
        await children[0]


async def test_suppressing_the_cancel_around_an_await_loses_the_callers_cancel() -> None:
    """Why ``cancel_and_wait_all`` exists: the pattern it replaces runs on when cancelled."""

    async def suppressing(child: asyncio.Task[None]) -> str:
        child.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await child
        return "ran on"

    stopping = asyncio.Event()
    child = asyncio.create_task(fails_when_stopped(stopping))
    await asyncio.sleep(0)
    caller = asyncio.create_task(suppressing(child))
    await stopping.wait()
    caller.cancel()
    assert await caller == "ran on"  # the caller's cancel was lost
