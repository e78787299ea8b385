"""Every refusal of the AdminService and the ReplicationService, pinned: its status
code, message, ``ErrorInfo`` reason and metadata, and its other details, as a client
reads them over a real gRPC server on 127.0.0.1 (the error table's rows for these
reasons, ``pagesift.core.api.errortable``). Every wait is bounded."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_status import rpc_status

from pagesift.core.api import tls
from pagesift.core.api.guard import GuardRule, MetadataGuard
from pagesift.core.api.rpcerrors import DOMAIN, Reason
from pagesift.core.replication.slot import open_slot
from pagesift.core.store.groups import WriteGroup
from pagesift.node.admin import AdminServicer
from pagesift.node.replicationparts import ReplicationParts
from pagesift.primary.replication import add_to_server
from pagesift.v1 import replication_pb2 as pb
from pagesift.v1 import replication_pb2_grpc

C = grpc.StatusCode


@dataclass
class Served:
    parts: ReplicationParts
    admin_servicer: AdminServicer
    channel: grpc.aio.Channel

    def admin(self) -> replication_pb2_grpc.AdminServiceAsyncStub:
        return replication_pb2_grpc.AdminServiceStub(self.channel)  # type: ignore[return-value]

    def stream(self) -> Any:
        stub = replication_pb2_grpc.ReplicationServiceStub(self.channel)
        return stub.Stream(timeout=10)  # type: ignore[call-arg]


async def serve(
    path: Path,
    *,
    primary: bool,
    backlog_bytes: int = 1 << 20,
    interceptors: Sequence[tls.ServerInterceptor] = (),
) -> Served:
    parts = ReplicationParts(
        open_slot(path, backlog_bytes=backlog_bytes), node_id=path.name, heartbeat_interval=0.05
    )
    if primary:
        parts.slot.log.open_for_writes()
    server = grpc.aio.server(interceptors=list(interceptors))
    add_to_server(parts.sender, server)
    admin = AdminServicer(parts)
    replication_pb2_grpc.add_AdminServiceServicer_to_server(admin, server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    served = Served(parts, admin, channel)
    _servers.append((served, server))
    return served


_servers: list[tuple[Served, grpc.aio.Server]] = []


@pytest.fixture(autouse=True)
async def _close_servers() -> AsyncIterator[None]:
    yield
    while _servers:
        served, server = _servers.pop()
        await served.channel.close(grace=None)
        await server.stop(grace=None)
        await served.parts.close()
        served.parts.slot.close()


@dataclass(frozen=True)
class Seen:
    code: grpc.StatusCode
    message: str
    reason: str
    metadata: dict[str, str]
    details: list[str]  # the other details' type names, in order
    bad_request: list[tuple[str, str]]


def seen(err: grpc.aio.AioRpcError) -> Seen:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, "a refusal without rich details"
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info) and info.domain == DOMAIN
    bad = error_details_pb2.BadRequest()
    violations = [
        (v.field, v.description)
        for d in status.details
        if d.Unpack(bad)
        for v in bad.field_violations
    ]
    others = [d.TypeName() for d in status.details][1:]
    assert status.code == err.code().value[0] and status.message == err.details()
    message = err.details() or ""
    return Seen(err.code(), message, info.reason, dict(info.metadata), others, violations)


async def refused(call: Any) -> Seen:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return seen(info.value)


async def stream_ends(call: Any) -> Seen:
    """How the replication stream ``call`` ends, past the heartbeats it sends first."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with asyncio.timeout(10):
            while True:
                message = await call.read()
                assert isinstance(message, pb.StreamResponse)  # not the end of the stream
                assert message.WhichOneof("msg") == "heartbeat"
    return seen(info.value)


def write(served: Served, n: int) -> None:
    for i in range(n):
        served.parts.slot.log.write(partial(put, f"k{i}"))


def put(key: str, group: WriteGroup) -> None:
    group.put(key, b"v" * 100)


# ---------------------------------------------------------------- AdminService


async def test_promote_on_a_node_without_a_promoter_is_cannot_promote(tmp_path: Path) -> None:
    standby = await serve(tmp_path / "s", primary=False)
    got = await refused(standby.admin().Promote(pb.PromoteRequest()))
    assert got == Seen(
        C.FAILED_PRECONDITION, "this node cannot promote", Reason.CANNOT_PROMOTE, {}, [], []
    )


async def test_a_digest_at_a_passed_offset_is_offset_passed(tmp_path: Path) -> None:
    primary = await serve(tmp_path / "p", primary=True)
    write(primary, 3)
    last = primary.parts.slot.log.last_offset
    got = await refused(primary.admin().Digest(pb.DigestRequest(at_offset=1)))
    assert got == Seen(
        C.FAILED_PRECONDITION,
        f"asked for offset 1, already at {last}",
        Reason.OFFSET_PASSED,
        {"offset": "1"},
        [],
        [],
    )


async def test_a_digest_at_an_offset_not_reached_in_time_is_offset_not_reached(
    tmp_path: Path,
) -> None:
    primary = await serve(tmp_path / "p", primary=True)
    write(primary, 2)
    last = primary.parts.slot.log.last_offset
    request = pb.DigestRequest(at_offset=last + 5, timeout_seconds=0.2)
    got = await refused(primary.admin().Digest(request))
    assert got == Seen(
        C.DEADLINE_EXCEEDED,
        f"offset {last + 5} not reached in 0.2s (at {last})",
        Reason.OFFSET_NOT_REACHED,
        {"offset": str(last + 5), "at": str(last)},
        [],
        [],
    )


async def test_a_second_backup_is_backup_in_progress(tmp_path: Path) -> None:
    primary = await serve(tmp_path / "p", primary=True)
    write(primary, 2)
    first = primary.admin_servicer.backups.stream()
    try:
        assert (await anext(first)).chunk.path == "CURRENT"  # the first one runs
        got = await refused(primary.admin().Backup(pb.BackupRequest()).read())
    finally:
        await first.aclose()
    assert got == Seen(
        C.RESOURCE_EXHAUSTED,
        "a backup of this node is already running (one at a time): retry once it ends",
        Reason.BACKUP_IN_PROGRESS,
        {},
        [],
        [],
    )


async def test_a_backup_that_fails_on_the_node_is_backup_failed(tmp_path: Path) -> None:
    primary = await serve(tmp_path / "p", primary=True)
    data = primary.parts.slot.data_dir
    data.rename(tmp_path / "moved")  # the copy's directory cannot be made
    try:
        got = await refused(primary.admin().Backup(pb.BackupRequest()).read())
    finally:
        (tmp_path / "moved").rename(data)
    assert (got.code, got.reason, got.metadata, got.details) == (
        C.INTERNAL,
        Reason.BACKUP_FAILED,
        {},
        [],
    )
    assert re.fullmatch(r"backup failed: \[Errno 2\] No such file or directory: .*", got.message)


# ---------------------------------------------------------------- ReplicationService


def hello(served: Served, *, epoch: int | None = None, applied: int = 0) -> pb.StreamRequest:
    log = served.parts.slot.log
    h = pb.Hello(
        node_id="peer",
        history_id=log.history_id,
        applied_offset=applied,
        epoch=log.epoch if epoch is None else epoch,
    )
    return pb.StreamRequest(hello=h)


async def test_a_stream_that_does_not_start_with_hello_is_invalid_field(tmp_path: Path) -> None:
    primary = await serve(tmp_path / "p", primary=True)
    call = primary.stream()
    await call.write(pb.StreamRequest(ack=pb.Ack(applied_offset=1)))
    got = await refused(call.read())
    message = "the first message must be hello"
    assert got == Seen(
        C.INVALID_ARGUMENT,
        message,
        Reason.INVALID_FIELD,
        {"field": "hello"},
        ["google.rpc.BadRequest"],
        [("hello", message)],
    )


async def test_a_hello_to_a_standby_is_replication_refused(tmp_path: Path) -> None:
    standby = await serve(tmp_path / "s", primary=False)
    call = standby.stream()
    await call.write(hello(standby))
    got = await refused(call.read())
    assert got == Seen(
        C.FAILED_PRECONDITION,
        "this node is not a writable primary",
        Reason.REPLICATION_REFUSED,
        {},
        [],
        [],
    )


async def test_a_hello_of_a_higher_epoch_is_stepped_down(tmp_path: Path) -> None:
    primary = await serve(tmp_path / "p", primary=True)
    log = primary.parts.slot.log
    ours = log.epoch
    call = primary.stream()
    await call.write(hello(primary, epoch=ours + 1))
    got = await refused(call.read())
    assert got == Seen(
        C.FAILED_PRECONDITION,
        f"peer 'peer' has epoch {ours + 1} > ours {ours}",
        Reason.STEPPED_DOWN,
        {"epoch": str(ours + 1)},
        [],
        [],
    )
    assert log.role == "fenced"


async def test_a_stream_whose_node_is_demoted_ends_no_longer_primary(tmp_path: Path) -> None:
    primary = await serve(tmp_path / "p", primary=True)
    write(primary, 2)
    log = primary.parts.slot.log
    call = primary.stream()
    await call.write(hello(primary, applied=log.last_offset))
    first = await call.read()
    assert first.decision.kind == pb.SYNC_KIND_CONTINUE
    await primary.parts.sender.step_down(log.epoch + 1)  # deposed while tailing
    got = await stream_ends(call)
    assert got == Seen(
        C.UNAVAILABLE, "this node is no longer primary", Reason.NO_LONGER_PRIMARY, {}, [], []
    )


async def test_a_standby_behind_the_backlog_is_standby_too_slow(tmp_path: Path) -> None:
    primary = await serve(tmp_path / "p", primary=True, backlog_bytes=4_000)
    write(primary, 2)
    log = primary.parts.slot.log
    call = primary.stream()
    await call.write(hello(primary, applied=log.last_offset))
    first = await call.read()
    assert first.decision.kind == pb.SYNC_KIND_CONTINUE
    nxt = log.last_offset + 1
    write(primary, 200)  # in one step: the tail wakes to find its next entry trimmed
    assert log.first_offset > nxt
    got = await stream_ends(call)
    assert (got.code, got.reason, got.metadata, got.details) == (
        C.RESOURCE_EXHAUSTED,
        Reason.STANDBY_TOO_SLOW,
        {},
        [],
    )
    assert got.message.startswith("standby too slow: ")


# ---------------------------------------------------------------- the guard (before any handler)


async def test_each_guard_refusal_names_its_reason_and_the_method(tmp_path: Path) -> None:
    def never(md: tls.Metadata) -> bool:
        return False

    denied = C.PERMISSION_DENIED
    guard = MetadataGuard(
        [
            GuardRule("/pagesift.v1.ReplicationService/", never, "needs the token", denied),
            GuardRule("/pagesift.v1.AdminService/", never, "needs the admin key", denied),
            GuardRule("/grpc.health.v1.Health/", never, "needs an API key"),
        ]
    )
    node = await serve(tmp_path / "p", primary=True, interceptors=[guard])
    stream = node.stream()
    await stream.write(hello(node))
    health = health_pb2_grpc.HealthStub(node.channel)
    assert await refused(stream.read()) == Seen(
        denied,
        "needs the token",
        Reason.REPLICATION_NOT_ALLOWED,
        {"method": "/pagesift.v1.ReplicationService/Stream"},
        [],
        [],
    )
    assert await refused(node.admin().Role(pb.RoleRequest())) == Seen(
        denied,
        "needs the admin key",
        Reason.ADMIN_KEY_REQUIRED,
        {"method": "/pagesift.v1.AdminService/Role"},
        [],
        [],
    )
    assert await refused(health.Check(health_pb2.HealthCheckRequest())) == Seen(
        C.UNAUTHENTICATED,
        "needs an API key",
        Reason.UNAUTHENTICATED,
        {"method": "/grpc.health.v1.Health/Check"},
        [],
        [],
    )
