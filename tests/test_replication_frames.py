"""The stream registered by ``replication.add_to_server`` (entries and snapshot chunks
go out as the bytes they are framed into): a standby follows it through a many-chunk
full resync and a sync-mode tail, and ends with the primary's digest; the standby's
shell carries out every action its machine returns, whichever event it answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from pagesift.core.replication import followerstate
from pagesift.core.replication.followerstate import (
    EntriesApplied,
    FollowerState,
    HeartbeatReceived,
    SendAck,
    SnapshotInstalled,
)
from pagesift.core.replication.slot import open_slot
from pagesift.core.store.groups import WriteGroup
from pagesift.primary import replication
from pagesift.primary.replication import ReplicationServicer
from pagesift.standby.follower import Follower
from tests.helpers import until


def put(key: str, value: bytes) -> Callable[[WriteGroup], None]:
    return lambda g: g.put(key, value)


async def test_a_standby_follows_the_framed_stream_through_a_resync_and_the_tail(
    tmp_path: Path,
) -> None:
    a = open_slot(tmp_path / "a", backlog_bytes=4 << 20)
    b = open_slot(tmp_path / "b", backlog_bytes=4 << 20)
    a.log.open_for_writes()
    repl = ReplicationServicer(
        a, node_id="a", mode="sync", sync_timeout=5.0, chunk_bytes=4096, heartbeat_interval=0.05
    )
    server = grpc.aio.server()
    replication.add_to_server(repl, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    follower = Follower(b, f"127.0.0.1:{port}", node_id="b", idle_timeout=1.0, backoff_base=0.02)
    try:
        for i in range(200):  # a snapshot of many 4 KB chunks
            a.log.write(put(f"page/{i}", bytes([i % 251]) * 300))
        follower.start()
        await until(lambda: b.log.last_offset == a.log.last_offset, "the full resync")
        assert follower.full_resyncs == 1
        for i in range(50):  # the tail, each write waiting for the standby's ack
            offset = a.log.write(put(f"late/{i}", b"x" * 100)).offset
            assert await repl.wait_replicated(offset) is True
        assert b.store.digest() == a.store.digest()
        assert repl.status().lag_offsets == 0 and follower.status().lag_offsets == 0
    finally:
        await follower.stop()
        await server.stop(grace=None)
        b.close()
        a.close()


MACHINE_STEP = followerstate.step


@dataclass(slots=True)
class AckingOnEveryEvent:
    """The real machine's step, asking for one more ack after every event whose actions
    the shell once dropped (entries applied, a heartbeat, a snapshot installed)."""

    asked: int = 0  # SendAck actions returned, by every step
    extra: int = 0  # of which added here

    def step(
        self, state: FollowerState, event: followerstate.Event, now: float
    ) -> tuple[FollowerState, list[followerstate.Action]]:
        state, actions = MACHINE_STEP(state, event, now)
        if isinstance(event, EntriesApplied | HeartbeatReceived | SnapshotInstalled):
            actions = [*actions, SendAck()]
            self.extra += 1
        self.asked += sum(isinstance(a, SendAck) for a in actions)
        return state, actions


async def test_the_standby_shell_carries_out_every_action_its_machine_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = open_slot(tmp_path / "a", backlog_bytes=4 << 20)
    b = open_slot(tmp_path / "b", backlog_bytes=4 << 20)
    a.log.open_for_writes()
    repl = ReplicationServicer(
        a, node_id="a", mode="sync", sync_timeout=5.0, chunk_bytes=4096, heartbeat_interval=0.02
    )
    server = grpc.aio.server()
    replication.add_to_server(repl, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    follower = Follower(b, f"127.0.0.1:{port}", node_id="b", idle_timeout=1.0, backoff_base=0.02)
    state = AckingOnEveryEvent()
    monkeypatch.setattr(followerstate, "step", state.step)  # the step the shell calls
    try:
        for i in range(20):  # a snapshot first, then a tail
            a.log.write(put(f"page/{i}", b"x" * 300))
        follower.start()
        await until(lambda: b.log.last_offset == a.log.last_offset, "the full resync")
        for i in range(20):
            offset = a.log.write(put(f"late/{i}", b"y" * 100)).offset
            assert await repl.wait_replicated(offset) is True
        heard = follower.messages
        await until(lambda: follower.messages >= heard + 3, "a few heartbeats")
        # every SendAck any step returned went out (an ack is sent in the same run of
        # the event loop as the step that asked for it)
        assert state.extra >= 20  # at least one per tail write
        assert follower.acks == state.asked
    finally:
        await follower.stop()
        await server.stop(grace=None)
        b.close()
        a.close()
