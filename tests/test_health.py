"""Role-aware grpc.health.v1: ``""``, ``pagesift.primary``, ``pagesift.replica``.

The pure decision (``health_statuses``, ``Freshness``) with a fake clock, then real
nodes (``grpcserver.run``) on 127.0.0.1 checked and watched over real gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagesift.core.ha.roles import Role
from pagesift.node.grpchealth import (
    JOB_SERVICE,
    LIVENESS,
    NOT_SERVING,
    PRIMARY,
    REPLICA,
    SERVING,
    Freshness,
    health_statuses,
)
from pagesift.v1 import replication_pb2 as rpb
from pagesift.v1 import replication_pb2_grpc
from tests.helpers import PROMOTE_MD, in_process_node, until

# ---------------------------------------------------------------- the pure decision


@pytest.mark.parametrize(
    ("role", "writes", "connected", "lag", "primary", "replica"),
    [
        (Role.PRIMARY, True, False, 0.0, SERVING, NOT_SERVING),
        (Role.PRIMARY, True, True, 0.0, SERVING, NOT_SERVING),  # its standby is connected
        (Role.PRIMARY, False, True, 0.0, NOT_SERVING, NOT_SERVING),  # its lease lapsed
        (Role.STANDBY, False, True, 0.0, NOT_SERVING, SERVING),
        (Role.STANDBY, False, True, 10.0, NOT_SERVING, SERVING),  # at the bound
        (Role.STANDBY, False, True, 10.5, NOT_SERVING, NOT_SERVING),  # past it
        (Role.STANDBY, False, False, math.inf, NOT_SERVING, NOT_SERVING),  # never synced
        (Role.FENCED, False, False, 0.0, NOT_SERVING, NOT_SERVING),
        (Role.FENCED, False, True, 0.0, NOT_SERVING, NOT_SERVING),
    ],
)
def test_health_statuses_decide_by_role_lease_connection_and_lag(
    role: Role, writes: bool, connected: bool, lag: float, primary: Any, replica: Any
) -> None:
    got = health_statuses(role, writes, connected, lag, 10.0)
    assert got == {LIVENESS: SERVING, JOB_SERVICE: SERVING, PRIMARY: primary, REPLICA: replica}


def test_freshness_counts_the_time_since_the_primary_was_last_heard() -> None:
    f = Freshness()
    assert f.observe(False, 0.0, 100.0) == (False, math.inf)  # never synced
    assert f.observe(True, 0.5, 101.0) == (True, 0.5)
    assert f.observe(True, 0.2, 102.0) == (True, 0.2)
    # the session drops: the lag it had, plus the time since it was last heard
    assert f.observe(False, 0.0, 102.0) == (True, 0.2)
    assert f.observe(False, 0.0, 105.0) == (True, 3.2)
    assert f.observe(True, 0.0, 106.0) == (True, 0.0)  # reconnected


# ---------------------------------------------------------------- real nodes


def health(channel: grpc.aio.Channel) -> health_pb2_grpc.HealthStub:
    return health_pb2_grpc.HealthStub(channel)


async def check(channel: grpc.aio.Channel, service: str) -> Any:
    got = await health(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return got.status


class Watch:
    """One Watch stream; ``until(status)`` reads its messages up to ``status``."""

    def __init__(self, channel: grpc.aio.Channel, service: str) -> None:
        self.service = service
        self.call = health(channel).Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=60
        )
        self.seen: list[Any] = []

    async def next(self, timeout: float = 15.0) -> Any:
        """The next status sent; an AssertionError after ``timeout`` seconds."""
        try:
            msg = await asyncio.wait_for(self.call.read(), timeout)
        except TimeoutError:
            raise AssertionError(f"{self.service!r}: nothing after {self.seen}") from None
        # anything else is grpc.aio.EOF: the stream ended
        assert isinstance(msg, health_pb2.HealthCheckResponse), (
            f"{self.service!r} ended: {self.seen}"
        )
        self.seen.append(msg.status)
        return msg.status

    async def until(self, status: Any, timeout: float = 15.0) -> None:
        """Read until ``status`` arrives; bounded by ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        while await self.next(max(deadline - time.monotonic(), 0.0)) != status:
            pass

    def cancel(self) -> None:
        self.call.cancel()


async def test_a_primary_is_primary_and_no_replica(tmp_path: Path) -> None:
    async with in_process_node(tmp_path / "p") as p:
        assert await check(p.channel, LIVENESS) == SERVING
        assert await check(p.channel, JOB_SERVICE) == SERVING
        assert await check(p.channel, PRIMARY) == SERVING
        assert await check(p.channel, REPLICA) == NOT_SERVING


async def test_a_connected_standby_is_a_replica_and_no_primary(tmp_path: Path) -> None:
    async with (
        in_process_node(tmp_path / "p") as p,
        in_process_node(tmp_path / "s", role="standby", primary=p.address) as s,
    ):
        replica = Watch(s.channel, REPLICA)
        try:
            await replica.until(SERVING)
        finally:
            replica.cancel()
        assert s.node.follower is not None and s.node.follower.status().connected
        assert await check(s.channel, PRIMARY) == NOT_SERVING
        assert await check(s.channel, LIVENESS) == SERVING
        assert await check(p.channel, PRIMARY) == SERVING
        assert await check(p.channel, REPLICA) == NOT_SERVING


async def test_promotion_moves_primary_to_the_promoted_node_and_off_the_fenced_one(
    tmp_path: Path,
) -> None:
    async with (
        in_process_node(tmp_path / "p") as p,
        in_process_node(tmp_path / "s", role="standby", primary=p.address) as s,
    ):
        replica = Watch(s.channel, REPLICA)
        promoted = Watch(s.channel, PRIMARY)
        deposed = Watch(p.channel, PRIMARY)
        try:
            await replica.until(SERVING)
            assert await promoted.next() == NOT_SERVING
            assert await deposed.next() == SERVING
            admin = replication_pb2_grpc.AdminServiceStub(s.channel)
            answer = await admin.Promote(rpb.PromoteRequest(), metadata=PROMOTE_MD, timeout=10)
            assert not answer.already_primary
            assert await promoted.next() == SERVING
            assert promoted.seen == [NOT_SERVING, SERVING]
            await replica.until(NOT_SERVING)  # a primary is no replica
            # the promoted node's hellos fence the former primary: it takes no writes now
            await deposed.until(NOT_SERVING)
            assert p.node.role == Role.FENCED
            assert await check(p.channel, REPLICA) == NOT_SERVING
        finally:
            for w in (replica, promoted, deposed):
                w.cancel()


async def test_a_standby_whose_primary_is_gone_stops_being_a_replica_after_max_lag(
    tmp_path: Path,
) -> None:
    max_lag = 1.0
    async with contextlib.AsyncExitStack() as primary_life:
        p = await primary_life.enter_async_context(in_process_node(tmp_path / "p"))
        async with in_process_node(
            tmp_path / "s", role="standby", primary=p.address, replica_max_lag=max_lag
        ) as s:
            follower = s.node.follower
            assert follower is not None
            replica = Watch(s.channel, REPLICA)
            try:
                await replica.until(SERVING)
                await primary_life.aclose()  # the primary stops
                await until(lambda: not follower.status().connected, "the session to drop")
                lost = time.monotonic()
                # a dropped session alone does not take the replica out ...
                assert await check(s.channel, REPLICA) == SERVING
                # ... its lag passing replica_max_lag does
                assert await replica.next() == NOT_SERVING
                assert time.monotonic() - lost > max_lag / 2
                assert replica.seen[-2:] == [SERVING, NOT_SERVING]
                assert await check(s.channel, PRIMARY) == NOT_SERVING
                assert await check(s.channel, LIVENESS) == SERVING
            finally:
                replica.cancel()
