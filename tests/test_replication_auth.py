"""Who may follow a node, depose it or promote it: every role change needs a credential.

Real nodes (``grpcserver.run``) on 127.0.0.1 with real gRPC clients acting as the
attacker: a local process that can reach the port but holds no replication token
and no admin key.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from pagesift.core.api.tls import token_metadata
from pagesift.core.jobs.accounts import hash_key
from pagesift.node import grpcserver
from pagesift.node.startup import StartRefused
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2_grpc
from pagesift.v1 import replication_pb2 as pb
from tests.helpers import PAIR_TOKEN, PROMOTE_MD, in_process_node, node_config

API_KEY = "psk_alice_key_0123456789abcdef"
ALICE_MD = (("authorization", f"Bearer {API_KEY}"),)


def accounts_file(tmp: Path) -> Path:
    path = tmp / "accounts.toml"
    path.write_text(f'[[account]]\nname = "alice"\nkey_sha256 = "{hash_key(API_KEY)}"\n')
    return path


async def hello_then_first_answer(
    address: str, hello: pb.Hello, metadata: tuple[tuple[str, str], ...] = ()
) -> pb.StreamResponse:
    """Open the replication stream, send ``hello``, return the first answer (or raise)."""

    async def requests() -> AsyncIterator[pb.StreamRequest]:
        yield pb.StreamRequest(hello=hello)
        await asyncio.sleep(5)  # keep the stream open while the answer comes back

    async with grpc.aio.insecure_channel(address) as ch:
        call = replication_pb2_grpc.ReplicationServiceStub(ch).Stream(
            requests(), metadata=metadata, timeout=5
        )
        async for answer in call:
            call.cancel()
            return answer
    raise AssertionError("the stream ended without an answer or a status")


@pytest.mark.parametrize("token", [True, False], ids=["with-token", "without-credential"])
async def test_an_unauthenticated_peer_gets_no_snapshot_and_cannot_depose_the_primary(
    tmp_path: Path, token: bool
) -> None:
    overrides: dict[str, Any] = {"accounts_file": str(accounts_file(tmp_path))}
    if not token:
        overrides["replication_token_file"] = ""
    async with in_process_node(tmp_path / "p", **overrides) as n:
        stub = jobs_pb2_grpc.JobServiceStub(n.channel)
        await stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=ALICE_MD, timeout=5)
        epoch = n.node.slot.log.epoch
        attacks = [
            pb.Hello(node_id="thief", epoch=epoch),  # wants a full snapshot
            pb.Hello(node_id="rogue", epoch=99, address="rogue.invalid:443"),  # deposes
        ]
        for hello in attacks:
            for md in [(), (("pagesift-replication-token", "guessed-token-0123456789"),)]:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await hello_then_first_answer(n.address, hello, md)
                code = refused.value.code()
                assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
        assert n.node.role == "primary" and n.node.slot.log.epoch == epoch
        assert n.node.slot.log.writable
        started = await stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=["http://127.0.0.1:9/"]),
            metadata=ALICE_MD,
            timeout=5,
        )
        assert started.id
    # and it starts again as a primary: nothing was persisted as fenced
    async with in_process_node(tmp_path / "p", **overrides) as again:
        assert again.node.role == "primary" and again.node.slot.log.epoch == epoch


async def test_a_peer_with_the_pair_token_is_served(tmp_path: Path) -> None:
    async with in_process_node(tmp_path / "p") as n:
        hello = pb.Hello(node_id="standby-1", epoch=n.node.slot.log.epoch)
        answer = await hello_then_first_answer(n.address, hello, token_metadata(PAIR_TOKEN))
        assert answer.WhichOneof("msg") == "decision"


async def test_a_standby_without_a_replication_credential_refuses_to_start(
    tmp_path: Path,
) -> None:
    config = node_config(
        tmp_path / "s", role="standby", primary="127.0.0.1:9", replication_token_file=""
    )
    with pytest.raises(StartRefused, match="a standby needs a replication credential"):
        await grpcserver.run(config, asyncio.Event())


async def test_a_short_replication_token_is_refused_at_start(tmp_path: Path) -> None:
    short = tmp_path / "short.token"
    short.write_text("tooshort\n")
    config = node_config(tmp_path / "p", replication_token_file=str(short))
    with pytest.raises(StartRefused, match="fewer than 16"):
        await grpcserver.run(config, asyncio.Event())


async def test_promote_needs_the_pair_token_when_no_admin_key_is_configured(
    tmp_path: Path,
) -> None:
    """Anonymous mode without [admin]: Role stays open, Promote is not."""
    async with in_process_node(tmp_path / "s", role="standby", primary="127.0.0.1:9") as n:
        admin = replication_pb2_grpc.AdminServiceStub(n.channel)
        assert (await admin.Role(pb.RoleRequest(), timeout=5)).role == pb.NODE_ROLE_STANDBY
        for md in [(), (("authorization", "Bearer not-the-token-0123456789"),)]:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await admin.Promote(pb.PromoteRequest(), metadata=md, timeout=5)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert n.node.role == "standby"
        promoted = await admin.Promote(pb.PromoteRequest(), metadata=PROMOTE_MD, timeout=5)
        assert not promoted.already_primary and n.node.role == "primary"


async def test_a_caller_without_a_key_learns_nothing_from_validation_or_a_standby(
    tmp_path: Path,
) -> None:
    accounts = str(accounts_file(tmp_path))
    async with (
        in_process_node(tmp_path / "p", accounts_file=accounts) as p,
        in_process_node(
            tmp_path / "s", role="standby", primary=p.address, accounts_file=accounts
        ) as s,
    ):
        for node in (p, s):
            stub = jobs_pb2_grpc.JobServiceStub(node.channel)
            calls: list[Awaitable[object]] = [
                stub.GetJob(jobs_pb2.GetJobRequest(id="not-a-job-id", skip=-1), timeout=5),
                stub.StartBatchScrape(jobs_pb2.StartBatchScrapeRequest(urls=["nope"]), timeout=5),
                stub.CancelJob(jobs_pb2.CancelJobRequest(id="x"), timeout=5),
            ]
            for call in calls:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, node.address
                details = refused.value.details() or ""
                assert "API key" in details and p.address not in details
