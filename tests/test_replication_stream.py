"""Replication over real grpc.aio servers on 127.0.0.1, in process, Store only.

Each node is a slot (store + log) with its replication pieces wired as the real
server wires them (``pagesift.node.replicationparts.ReplicationParts``) and served by the
server's own assembly (``pagesift.node.grpcserver.grpc_server``, without the JobService
and the guards); a standby also runs a Follower. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from pagesift.core.replication.identity import NotWritable
from pagesift.core.replication.log import Log
from pagesift.core.replication.slot import StoreSlot, open_slot
from pagesift.core.replication.verify import verify_digests
from pagesift.core.store.groups import WriteGroup
from pagesift.node.grpcserver import grpc_server
from pagesift.node.replicationparts import ReplicationParts
from pagesift.primary.replication import ReplicationServicer
from pagesift.standby import follower as follower_module
from pagesift.standby.fencing import fence_former_primary
from pagesift.standby.follower import Follower, hello_message
from pagesift.standby.promotion import Promoter
from pagesift.v1 import replication_pb2 as pb
from pagesift.v1 import replication_pb2_grpc
from tests.helpers import until

T = TypeVar("T")


@dataclass
class Node:
    name: str
    path: Path
    parts: ReplicationParts
    server: grpc.aio.Server | None = None
    port: int = 0
    promoted: int = 0
    fenced: list[int] = field(default_factory=list)
    channel: grpc.aio.Channel | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def slot(self) -> StoreSlot:
        return self.parts.slot

    @property
    def log(self) -> Log:
        return self.slot.log

    @property
    def repl(self) -> ReplicationServicer:
        return self.parts.sender

    @property
    def follower(self) -> Follower | None:
        return self.parts.follower

    @property
    def promoter(self) -> Promoter | None:
        return self.parts.promoter

    def admin(self) -> replication_pb2_grpc.AdminServiceAsyncStub:
        if self.channel is None:
            self.channel = grpc.aio.insecure_channel(self.addr)
        return replication_pb2_grpc.AdminServiceStub(self.channel)  # type: ignore[return-value]

    async def serve(self) -> None:
        server = grpc_server(self.parts)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        assert self.port
        await server.start()
        self.server = server

    async def halt(self) -> None:
        """Stop serving (the process 'dies' for its peers); the store stays open."""
        if self.server is not None:
            await self.server.stop(grace=None)
            self.server = None

    def follow(self, target: Node) -> Follower:
        return self.parts.follow(target.addr, idle_timeout=1.0, backoff_base=0.02, backoff_cap=0.2)

    async def close(self) -> None:
        await self.parts.close()
        if self.channel is not None:
            await self.channel.close(grace=None)
        await self.halt()
        self.slot.close()

    def write(self, key: str, value: bytes = b"v") -> int:
        offset = self.log.write(lambda g: g.put(key, value)).offset
        return offset


async def start_node(
    path: Path,
    name: str,
    *,
    primary: bool,
    backlog_bytes: int = 1 << 20,
    mode: str = "async",
    sync_timeout: float = 2.0,
    chunk_bytes: int = 1 << 20,
) -> Node:
    async def on_fenced(epoch: int, by: str) -> None:
        node.fenced.append(epoch)

    async def on_promoted() -> None:
        node.promoted += 1

    parts = ReplicationParts(
        open_slot(path, backlog_bytes=backlog_bytes),
        node_id=name,
        on_fenced=on_fenced,
        mode=mode,
        sync_timeout=sync_timeout,
        chunk_bytes=chunk_bytes,
        heartbeat_interval=0.05,
    )
    node = Node(name, path, parts)
    parts.enable_promotion(on_promoted)
    if primary:
        parts.slot.log.open_for_writes()
    await node.serve()
    return node


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[list[Node]]:
    made: list[Node] = []
    yield made
    for node in made:
        await node.close()


def without_suspending(call: Coroutine[Any, Any, T]) -> T:
    """What ``call`` returns when it runs to the end in one step; an AssertionError if it
    suspends instead (awaits an ack, a timer, anything not already there)."""
    try:
        call.send(None)
    except StopIteration as returned:
        value: T = returned.value
        return value
    call.close()
    raise AssertionError("the call suspended: it waited")


async def caught_up(standby: Node, primary: Node) -> None:
    await until(
        lambda: standby.log.last_offset == primary.log.last_offset,
        f"{standby.name} to reach {primary.log.last_offset}",
    )


async def pair(
    tmp_path: Path,
    nodes: list[Node],
    *,
    backlog_bytes: int = 1 << 20,
    mode: str = "async",
    sync_timeout: float = 2.0,
    chunk_bytes: int = 1 << 20,
) -> tuple[Node, Node]:
    a = await start_node(
        tmp_path / "a",
        "a",
        primary=True,
        backlog_bytes=backlog_bytes,
        mode=mode,
        sync_timeout=sync_timeout,
        chunk_bytes=chunk_bytes,
    )
    b = await start_node(tmp_path / "b", "b", primary=False)
    nodes += [a, b]
    return a, b


# --- tests ------------------------------------------------------------------------------


async def test_a_standby_catches_up_and_digests_match(tmp_path: Path, nodes: list[Node]) -> None:
    a, b = await pair(tmp_path, nodes)
    for i in range(50):

        def job(g: WriteGroup, i: int = i) -> None:
            g.put(f"job/{i}", b"meta")
            g.push(f"job/{i}/pages", b"p")

        a.log.write(job)
    follower = b.follow(a)
    await caught_up(b, a)
    for i in range(50, 80):
        a.write(f"job/{i}")
    await caught_up(b, a)
    assert b.slot.store.digest() == a.slot.store.digest()
    assert (follower.full_resyncs, follower.continues) == (1, 0)
    assert (b.log.history_id, b.log.epoch) == (a.log.history_id, a.log.epoch)
    # the standby logged the entries it applied at the primary's offsets
    assert [e.offset for e in b.log.read(b.log.first_offset)][-1] == a.log.last_offset

    await until(lambda: a.repl.acked_offset == a.log.last_offset, "the standby's ack")
    role_b = await b.admin().Role(pb.RoleRequest())
    assert role_b.role == pb.NODE_ROLE_STANDBY and role_b.connected
    assert role_b.applied_offset == role_b.primary_offset == a.log.last_offset
    assert role_b.lag_offsets == 0 and role_b.peer == a.addr
    role_a = await a.admin().Role(pb.RoleRequest())
    assert role_a.role == pb.NODE_ROLE_PRIMARY and role_a.peer == "b" and role_a.connected
    result = await verify_digests(a.admin(), b.admin(), per_call_seconds=2)
    assert result.equal and result.offset == a.log.last_offset


async def test_a_cut_stream_reconnects_and_continues_from_its_offset(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes)
    for i in range(20):
        a.write(f"k{i}")
    follower = b.follow(a)
    await caught_up(b, a)
    await a.halt()  # the stream is cut; writes go on meanwhile
    for i in range(20, 40):
        a.write(f"k{i}")
    await asyncio.sleep(0.1)
    assert follower.status().connected is False
    await a.serve()  # same port
    await caught_up(b, a)
    assert (follower.full_resyncs, follower.continues) == (1, 1)
    assert b.slot.store.digest() == a.slot.store.digest()


async def test_backlog_overflow_forces_a_full_resync_while_writes_continue(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes, backlog_bytes=8_000, chunk_bytes=2_000)
    for i in range(100):
        a.write(f"k{i}", b"x" * 50)
    follower = b.follow(a)
    await caught_up(b, a)
    await follower.stop()
    for i in range(100, 400):  # far more than the backlog holds
        a.write(f"k{i}", b"y" * 50)
    assert a.log.first_offset > b.log.last_offset + 1
    old_store = b.slot.store

    stop = asyncio.Event()

    async def writer() -> int:
        n = 0
        while not stop.is_set() and n < 2_000:
            a.write(f"w{n % 50}", str(n).encode())
            n += 1
            await asyncio.sleep(0.002)
        return n

    task = asyncio.create_task(writer())
    b.follow(a)
    assert b.follower is not None
    await until(lambda: b.follower is not None and b.follower.full_resyncs == 1, "a full resync")
    assert b.slot.store is not old_store  # switched to the freshly built store
    # the digests agree at one offset even while writes continue
    result = await verify_digests(a.admin(), b.admin(), per_call_seconds=2)
    assert result.equal
    stop.set()
    assert await task > 0
    await caught_up(b, a)
    assert b.slot.store.digest() == a.slot.store.digest()
    assert (tmp_path / "b" / "CURRENT").read_text().strip() == b.slot.store.path.name


async def test_sync_mode_waits_for_the_ack_and_degrades_to_async_on_timeout(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes, mode="sync", sync_timeout=0.3)
    b.follow(a)
    await caught_up(b, a)
    offset = a.write("page/1")
    assert await a.repl.wait_replicated(offset) is True
    assert b.log.last_offset >= offset  # visible only once the standby applied it

    assert b.follower is not None
    await b.follower.stop()
    offset = a.write("page/2")
    t0 = time.monotonic()
    assert await a.repl.wait_replicated(offset) is False
    assert 0.25 <= time.monotonic() - t0 < 10.0  # its 0.3 s, with room for a loaded box
    assert a.repl.sync_degraded and a.repl.sync_degraded_total == 1
    # degraded: no further stall (the answer comes without suspending: no wait for an
    # ack nor a timeout), no second count
    offset = a.write("page/3")
    assert without_suspending(a.repl.wait_replicated(offset)) is False
    assert a.repl.sync_degraded_total == 1

    b.follow(a)
    await until(lambda: not a.repl.sync_degraded, "sync mode to be restored")
    offset = a.write("page/4")
    assert await a.repl.wait_replicated(offset) is True


async def test_promotion_bumps_the_epoch_durably_before_writes(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes)
    for i in range(10):
        a.write(f"k{i}")
    b.follow(a)
    await caught_up(b, a)
    old_history = a.log.history_id
    with pytest.raises(NotWritable):
        b.write("nope")

    resp = await b.admin().Promote(pb.PromoteRequest())
    assert (resp.epoch, resp.switch_offset, resp.already_primary) == (2, 10, False)
    assert resp.history_id != old_history and b.promoted == 1
    assert b.follower is not None and not b.follower.running
    assert b.write("after") == 11
    assert b.log.read(11)[0].epoch == 2
    again = await b.admin().Promote(pb.PromoteRequest())
    assert again.already_primary and again.epoch == 2 and b.promoted == 1

    await b.close()  # restart: the promotion survived
    nodes.remove(b)
    b2 = await start_node(tmp_path / "b", "b2", primary=False)
    nodes.append(b2)
    log = b2.log
    assert (log.epoch, log.history_id) == (2, resp.history_id)
    assert (log.prev_history_id, log.switch_offset, log.persisted_role) == (
        old_history,
        10,
        "primary",
    )
    assert log.last_offset == 11


async def test_the_old_primary_rejoins_the_promoted_standby_with_continue(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes)
    for i in range(30):
        a.write(f"k{i}")
    b.follow(a)
    await caught_up(b, a)
    await a.close()  # the primary dies
    nodes.remove(a)
    assert b.promoter is not None
    await b.promoter.promote()
    for i in range(15):
        b.write(f"new{i}")

    a2 = await start_node(tmp_path / "a", "a", primary=False)  # restarted as a standby
    nodes.append(a2)
    follower = a2.follow(b)
    await caught_up(a2, b)
    assert (follower.continues, follower.full_resyncs, follower.discarded) == (1, 0, 0)
    assert (a2.log.epoch, a2.log.history_id) == (2, b.log.history_id)
    assert a2.slot.store.digest() == b.slot.store.digest()


async def test_an_old_primary_with_unreplicated_writes_is_fenced_then_resyncs(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes)
    for i in range(20):
        a.write(f"k{i}")
    b.follow(a)
    await caught_up(b, a)
    assert b.follower is not None
    await b.follower.stop()  # partition: a keeps writing, nothing reaches b
    for i in range(5):
        a.write(f"lost{i}")
    assert b.promoter is not None
    await b.promoter.promote()
    b.write("b-only")

    # a meets a peer of the higher epoch: it fences itself and refuses the stream
    async with grpc.aio.insecure_channel(a.addr) as ch:
        call = replication_pb2_grpc.ReplicationServiceStub(ch).Stream()  # type: ignore[call-arg]
        hello = pb.Hello(node_id="b", history_id=b.log.history_id, applied_offset=21, epoch=2)
        await call.write(pb.StreamRequest(hello=hello))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert a.fenced == [2] and a.log.role == "fenced"
    with pytest.raises(NotWritable):
        a.write("after-fence")

    await a.close()  # restarted: still fenced, so it can only rejoin as a standby
    nodes.remove(a)
    a2 = await start_node(tmp_path / "a", "a", primary=False)
    nodes.append(a2)
    assert a2.log.role == "fenced"
    follower = a2.follow(b)
    await caught_up(a2, b)
    assert (follower.full_resyncs, follower.discarded) == (1, 5)
    assert a2.slot.store.get("lost0") is None and a2.slot.store.get("b-only") == b"v"
    assert a2.slot.store.digest() == b.slot.store.digest()
    assert a2.log.role == "standby" and a2.log.epoch == 2


async def test_a_standby_stopped_mid_snapshot_keeps_its_old_store(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes, chunk_bytes=512)

    def big(g: WriteGroup) -> None:
        for i in range(4_000):
            g.put(f"k{i:05}", b"z" * 200)

    a.log.write(big)
    follower = b.follow(a)
    data = tmp_path / "b"
    await until(lambda: any(p.name.startswith("store-") for p in data.iterdir()), "a resync dir")
    await follower.stop()
    assert follower.full_resyncs == 0
    assert (data / "CURRENT").read_text().strip() == "db" and b.slot.store.path.name == "db"
    assert (b.log.last_offset, b.log.history_id) == (0, "")  # never believes it is in sync
    assert not any(p.name.startswith("store-") for p in data.iterdir())
    b.follow(a)
    await caught_up(b, a)
    assert b.slot.store.digest() == a.slot.store.digest()


async def test_an_entry_above_grpcs_default_message_limit_still_replicates(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes)
    a.write("big-before", b"b" * (5 << 20))  # travels in the snapshot
    b.follow(a)
    await caught_up(b, a)
    a.write("big-after", b"a" * (5 << 20))  # travels as an entry
    await caught_up(b, a)
    assert b.slot.store.digest() == a.slot.store.digest()


async def test_a_busy_stream_carries_batches_and_the_standby_still_acks_everything(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes)
    follower = b.follow(a)
    await until(lambda: follower.status().connected, "the standby to connect")
    messages = follower.messages
    for i in range(300):  # a writer on the loop, as the job runtime writes
        a.write(f"k{i}", b"x" * 100)
        await asyncio.sleep(0)
    await caught_up(b, a)
    await until(lambda: a.repl.acked_offset == a.log.last_offset, "the last ack")
    # async mode: at most one batch per linger (15 ms), not one message per write
    assert follower.messages - messages < 100
    assert b.slot.store.digest() == a.slot.store.digest()
    assert [e.offset for e in b.log.read(1, max_bytes=1 << 30)] == list(range(1, 301))


async def test_a_large_batch_is_applied_in_runs_with_the_loop_serving_between_them(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes, backlog_bytes=8 << 20)
    a.write("first")  # the standby gets a history, so the next session continues
    follower = b.follow(a)
    await caught_up(b, a)
    await follower.stop()
    for i in range(120):  # ~1.2 MB of entries: catching up gets ~1 MB batches
        a.write(f"k{i}", bytes([i]) * 10_000)

    ticks = 0
    commits: list[tuple[int, int]] = []  # (entries in the group, ticks seen at its commit)

    class Runs:
        def stage(self, group: WriteGroup) -> None:
            pass

        def committed(self, group: WriteGroup) -> None:
            commits.append((len(group.ops), ticks))

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    b.slot.store.add_observer(Runs())
    tick_task = asyncio.create_task(ticker())
    try:
        assert b.follow(a).continues == 0
        await caught_up(b, a)
    finally:
        tick_task.cancel()
    assert b.follower is not None and b.follower.continues == 1
    per_run = follower_module.APPLY_RUN_BYTES // 10_000
    assert sum(n for n, _ in commits) == 120
    assert max(n for n, _ in commits) <= per_run
    assert len(commits) >= 120 // per_run
    # the loop ran between every two runs, also between runs of one message
    assert all(t1 > t0 for (_, t0), (_, t1) in itertools.pairwise(commits))
    assert b.slot.store.digest() == a.slot.store.digest()


def fencing_hello(node: Node) -> pb.Hello:
    return hello_message(node.log.hello(node.name), node.addr)


async def test_the_promoted_node_fences_its_former_primary_and_a_newer_primary_deposes_it(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes)
    a.write("k")
    b.follow(a)
    await caught_up(b, a)
    await b.admin().Promote(pb.PromoteRequest())
    assert a.log.writable  # nobody told the old primary yet

    async def b_deposed(epoch: int) -> None:
        await b.repl.step_down(epoch, by="")

    def fence_a() -> Awaitable[str]:
        return fence_former_primary(
            a.addr,
            lambda: fencing_hello(b),
            still_primary=lambda: b.log.writable,
            on_deposed=b_deposed,
            backoff_base=0.01,
        )

    assert await fence_a() == "done"
    assert not a.log.writable and a.log.fenced_epoch == 2 and a.fenced == [2]
    assert await fence_a() == "done"  # asked again: a fenced node refuses too

    # a rejoins b, is promoted over b's head (epoch 3): b's hello now meets a newer
    # primary, and b is the one to step down
    a.follow(b)
    await caught_up(a, b)
    await a.admin().Promote(pb.PromoteRequest())
    assert a.log.epoch == 3 and b.log.writable
    assert await fence_a() == "deposed"
    assert not b.log.writable and b.fenced == [3]


async def test_fencing_an_unreachable_former_primary_retries_until_we_are_no_primary(
    tmp_path: Path, nodes: list[Node]
) -> None:
    a, b = await pair(tmp_path, nodes)
    await a.halt()  # nobody listens at a's address any more
    asks = 0

    def still_primary() -> bool:
        nonlocal asks
        asks += 1
        return asks <= 3

    verdict = await fence_former_primary(
        a.addr,
        lambda: fencing_hello(b),
        still_primary=still_primary,
        on_deposed=b.repl.step_down,
        answer_timeout=1.0,
        backoff_base=0.01,
    )
    assert verdict == "stopped" and asks == 4
