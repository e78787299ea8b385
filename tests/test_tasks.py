"""``cancel_and_wait`` and ``cancel_and_wait_all``: a child's end is absorbed, the
caller's own cancellation is not. ``all_or_none``: no sibling outlives the call."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pagesift.core.util.tasks import all_or_none, cancel_and_wait, cancel_and_wait_all


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


class Refused(Exception):
    pass


async def test_when_one_sibling_raises_the_others_are_stopped_before_it_propagates() -> None:
    fetched: list[int] = []
    stopped: list[int] = []

    async def worker(k: int) -> None:
        try:
            for step in range(100):
                if k == 0 and step == 3:
                    raise Refused("the store takes no write")
                fetched.append(k)
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            stopped.append(k)
            raise

    with pytest.raises(Refused):
        await asyncio.wait_for(all_or_none(worker(k) for k in range(3)), 10)
    assert sorted(stopped) == [1, 2]
    after = len(fetched)
    await asyncio.sleep(0.1)
    assert len(fetched) == after  # nobody goes on (asyncio.gather leaves them running)


async def test_siblings_that_all_end_return_and_a_cancel_of_the_caller_stops_them() -> None:
    done: list[int] = []

    async def quick(k: int) -> None:
        await asyncio.sleep(0.01 * k)
        done.append(k)

    await asyncio.wait_for(all_or_none(quick(k) for k in range(3)), 10)
    assert sorted(done) == [0, 1, 2]
    stopping = asyncio.Event()
    siblings = all_or_none(slow_to_stop(stopping) for _ in range(2))
    workers = asyncio.create_task(siblings)
    await asyncio.sleep(0.01)
    workers.cancel()
    with pytest.raises(asyncio.CancelledError):
        await workers
    assert stopping.is_set()
