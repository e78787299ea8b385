"""The admin commands (``role``, ``promote``, ``verify``) and the client's primary lookup.

The JSON shapes and exit statuses are pinned against a real primary/standby pair
(``pagesift serve`` children, the CLI run as a child too); the paths a healthy pair
never takes (digests that differ, a stale primary still answering) against small
in-process fake nodes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pagesift import cli
from pagesift.cli.common import EXIT_UNREACHABLE, EXIT_USAGE
from pagesift.client import JobClient
from pagesift.demo.site import CALENDAR_EXCLUDE, build_site, serve_site
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2_grpc
from pagesift.v1 import replication_pb2 as pb
from tests.helpers import PAIR_TOKEN, ServeProc, eventually, finished, free_port, role

PROMOTE_KEY = ("--admin-key", PAIR_TOKEN)  # no [admin] key: the pair's token promotes
ROLE_KEYS = {
    "address", "node_id", "role", "epoch", "history_id", "applied_offset", "primary_offset",
    "lag_offsets", "lag_seconds", "peer", "connected", "sync_degraded", "full_resyncs",
    "continues", "discarded",
}  # fmt: skip


def pagesift(*argv: str) -> tuple[int, str, str]:
    """The real ``pagesift`` command line, as a child process."""
    proc = subprocess.run(
        [sys.executable, "-m", "pagesift.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout, proc.stderr


async def run_json(*argv: str) -> tuple[int, Any]:
    code, out, err = await asyncio.to_thread(pagesift, *argv, "--json")
    assert out.count("\n") == 1, (out, err)  # exactly one JSON object on stdout
    return code, json.loads(out)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ServeProc, ServeProc]]:
    primary = ServeProc(tmp_path, "primary")
    standby = ServeProc(tmp_path, "standby", role="standby", primary=primary.address)
    try:
        yield primary, standby
    finally:
        for node in (primary, standby):
            node.stop()


@pytest.mark.system
async def test_role_promote_and_verify_print_one_json_object_each_against_a_real_pair(
    pair: tuple[ServeProc, ServeProc],
) -> None:
    primary, standby = pair
    P, S = primary.address, standby.address
    site = build_site(20, slow_seconds=1.5, big_bytes=2 * 1024 * 1024)
    runner, root = await serve_site(site)
    try:
        await asyncio.gather(primary.start(), standby.start())
        async with JobClient(P) as client:
            job_id = await client.start_crawl(
                jobs_pb2.StartCrawlRequest(url=root, exclude_paths=[CALENDAR_EXCLUDE])
            )
        await finished(P, job_id)
    finally:
        await runner.cleanup()

    async def caught_up() -> int | None:
        p, s = await role(P), await role(S)
        return p.applied_offset if s.applied_offset == p.applied_offset else None

    offset = await eventually(caught_up, "the standby to catch up")

    # the read-only commands run side by side (each is a child process of its own)
    on_p, on_s, on_both, verified, (code, text, _) = await asyncio.gather(
        run_json("role", "--server", P),
        run_json("role", "--server", S),
        run_json("role", "--server", S, "--server", P),
        run_json("verify", "--primary", P, "--standby", S),
        asyncio.to_thread(pagesift, "verify", "--primary", P, "--standby", S),
    )
    assert code == 0
    code, out = verified
    assert text.splitlines() == [
        f"offset   {offset}",
        f"primary  {out['primary']['digest']}  {P}",
        f"standby  {out['standby']['digest']}  {S}",
        "equal",
    ]

    code, out = on_p
    assert code == 0 and set(out) == ROLE_KEYS
    assert (out["address"], out["role"], out["epoch"], out["applied_offset"]) == (
        P, "primary", 1, offset,
    )  # fmt: skip
    assert out["connected"] is True and out["lag_offsets"] == 0 and len(out["history_id"]) == 32

    code, out = on_s
    assert code == 0 and set(out) == ROLE_KEYS
    assert (out["role"], out["peer"], out["connected"], out["full_resyncs"]) == (
        "standby", P, True, 1,
    )  # fmt: skip

    code, out = on_both
    assert code == 0 and out["primary"] == P
    assert [n["role"] for n in out["nodes"]] == ["standby", "primary"]

    code, out = verified
    assert code == 0, out
    assert set(out) == {"equal", "offset", "primary", "standby"}
    assert out["equal"] is True and out["offset"] == offset
    assert out["primary"]["address"] == P and out["standby"]["address"] == S
    assert out["primary"]["digest"] == out["standby"]["digest"]
    assert len(out["primary"]["digest"]) == 64

    # a primary reports its state
    code, out = await run_json("promote", "--server", P, *PROMOTE_KEY)
    assert code == 0
    assert out == {
        "address": P, "epoch": 1, "history_id": out["history_id"], "switch_offset": 0,
        "already_primary": True,
    }  # fmt: skip

    primary.kill()
    code, out = await run_json("promote", "--server", S, *PROMOTE_KEY)
    assert code == 0
    assert (out["epoch"], out["switch_offset"], out["already_primary"]) == (2, offset, False)
    code, again = await run_json("promote", "--server", S, *PROMOTE_KEY)
    assert again == {**out, "already_primary": True}

    code, out = await run_json("role", "--server", S, "--server", P)
    assert code == EXIT_UNREACHABLE  # one node did not answer
    assert out["primary"] == S
    assert out["nodes"][0]["role"] == "primary" and out["nodes"][0]["epoch"] == 2
    assert out["nodes"][1]["address"] == P and "UNAVAILABLE" in out["nodes"][1]["error"]


async def test_promote_takes_exactly_one_server(capsys: pytest.CaptureFixture[str]) -> None:
    code = await cli.amain(["promote", "--server", "127.0.0.1:1", "--server", "127.0.0.1:2"])
    assert code == EXIT_USAGE
    assert "exactly one --server" in capsys.readouterr().err


# ---------------------------------------------------------------- fake nodes


class FakeAdmin(replication_pb2_grpc.AdminServiceServicer):
    def __init__(self, role: pb.NodeRole.ValueType, epoch: int, offset: int, digest: str) -> None:
        self.role, self.epoch, self.offset, self.digest = role, epoch, offset, digest

    async def Role(
        self,
        request: pb.RoleRequest,
        context: grpc.aio.ServicerContext[pb.RoleRequest, pb.RoleResponse],
    ) -> pb.RoleResponse:
        return pb.RoleResponse(role=self.role, epoch=self.epoch, applied_offset=self.offset)

    async def Digest(
        self,
        request: pb.DigestRequest,
        context: grpc.aio.ServicerContext[pb.DigestRequest, pb.DigestResponse],
    ) -> pb.DigestResponse:
        return pb.DigestResponse(digest=self.digest, offset=request.at_offset or self.offset)


class FakeJobs(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[str] = []

    async def StartCrawl(
        self,
        request: jobs_pb2.StartCrawlRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.StartCrawlResponse:
        self.calls.append("StartCrawl")
        return jobs_pb2.StartCrawlResponse(id=f"job-on-{self.name}")


@pytest.fixture
async def fake_nodes() -> AsyncIterator[list[tuple[str, FakeAdmin, FakeJobs]]]:
    """Two nodes that both claim to be the primary: a stale one (epoch 1) and the
    promoted one (epoch 2); their digests differ at the same offset."""
    servers: list[grpc.aio.Server] = []
    made: list[tuple[str, FakeAdmin, FakeJobs]] = []
    for name, epoch, digest in (("old", 1, "a" * 64), ("new", 2, "b" * 64)):
        server = grpc.aio.server()
        # only what the tests call is implemented (grpc answers UNIMPLEMENTED otherwise)
        admin = FakeAdmin(pb.NODE_ROLE_PRIMARY, epoch, 7, digest)  # type: ignore[abstract]
        jobs = FakeJobs(name)  # type: ignore[abstract]
        replication_pb2_grpc.add_AdminServiceServicer_to_server(admin, server)
        jobs_pb2_grpc.add_JobServiceServicer_to_server(jobs, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        made.append((f"127.0.0.1:{port}", admin, jobs))
    try:
        yield made
    finally:
        for server in servers:
            await server.stop(None)


async def test_verify_exits_1_and_prints_both_digests_when_they_differ(
    fake_nodes: list[tuple[str, FakeAdmin, FakeJobs]], capsys: pytest.CaptureFixture[str]
) -> None:
    (a, _, _), (b, _, _) = fake_nodes
    assert await cli.amain(["verify", "--primary", a, "--standby", b]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "offset   7",
        f"primary  {'a' * 64}  {a}",
        f"standby  {'b' * 64}  {b}",
        "DIFFERENT",
    ]
    assert await cli.amain(["verify", "--primary", a, "--standby", b, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "equal": False,
        "offset": 7,
        "primary": {"address": a, "digest": "a" * 64},
        "standby": {"address": b, "digest": "b" * 64},
    }


async def test_verify_exits_4_when_a_node_is_unreachable(
    fake_nodes: list[tuple[str, FakeAdmin, FakeJobs]], capsys: pytest.CaptureFixture[str]
) -> None:
    (a, _, _), _ = fake_nodes
    dead = f"127.0.0.1:{free_port()}"
    argv = ["verify", "--primary", dead, "--standby", a, "--connect-timeout", "0.5"]
    assert await cli.amain(argv) == EXIT_UNREACHABLE
    assert capsys.readouterr().err == f"error: cannot reach {dead} (connect timeout 0.5 s)\n"


async def test_the_client_sends_writes_to_the_primary_of_the_highest_epoch(
    fake_nodes: list[tuple[str, FakeAdmin, FakeJobs]],
) -> None:
    (old, _, old_jobs), (new, _, new_jobs) = fake_nodes
    # A deposed primary that does not know it yet still takes writes: Role's epoch
    # is what tells the client which one leads.
    async with JobClient([old, new]) as client:
        assert await client.start_crawl(jobs_pb2.StartCrawlRequest(url="http://x/")) == (
            "job-on-new"
        )
        assert client.failover.preferred == new
    assert old_jobs.calls == [] and new_jobs.calls == ["StartCrawl"]
