"""Waking a loop from any thread (``loopwake``) and opening channels (``channels``)."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from pagesift.core.util.channels import open_channel
from pagesift.core.util.loopwake import on_loop


async def test_on_the_running_loop_the_call_happens_at_once() -> None:
    seen: list[int] = []
    on_loop(asyncio.get_running_loop(), seen.append, 1)
    assert seen == [1]


async def test_from_another_thread_the_call_runs_on_the_loop_thread() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    ran_on: list[int] = []

    def resolve(value: int) -> None:
        ran_on.append(threading.get_ident())
        done.set_result(value)

    thread = threading.Thread(target=on_loop, args=(loop, resolve, 7))
    thread.start()
    thread.join()
    assert await asyncio.wait_for(done, 5) == 7
    assert ran_on == [threading.get_ident()]


def test_a_closed_loop_drops_the_call() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    seen: list[int] = []
    on_loop(loop, seen.append, 1)  # no error into the caller
    assert seen == []


def test_without_a_running_loop_the_call_waits_for_the_loop() -> None:
    loop = asyncio.new_event_loop()
    try:
        seen: list[int] = []
        on_loop(loop, seen.append, 1)
        assert seen == []
        loop.run_until_complete(asyncio.sleep(0))
        assert seen == [1]
    finally:
        loop.close()


async def test_channels_are_secure_exactly_when_given_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[tuple[str, object]] = []
    real_secure, real_insecure = grpc.aio.secure_channel, grpc.aio.insecure_channel

    def secure(target: str, creds: object, **kw: object) -> grpc.aio.Channel:
        made.append(("secure", kw["options"]))
        return real_secure(target, creds, **kw)  # type: ignore[arg-type]

    def insecure(target: str, **kw: object) -> grpc.aio.Channel:
        made.append(("insecure", kw["options"]))
        return real_insecure(target, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(grpc.aio, "secure_channel", secure)
    monkeypatch.setattr(grpc.aio, "insecure_channel", insecure)
    opts = [("grpc.max_receive_message_length", -1)]
    async with open_channel("127.0.0.1:1", None, options=opts):
        pass
    async with open_channel("127.0.0.1:1", grpc.ssl_channel_credentials()):
        pass
    assert made == [("insecure", tuple(opts)), ("secure", ())]
