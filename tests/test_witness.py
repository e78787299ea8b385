"""Automatic failover through the etcd witness, with real etcd and real processes.

Two ``pagesift serve`` children started with the same kind of command line (``--witness
etcd://... --pair P``, no ``--role``) and a real etcd, all on loopback. The tests kill
the primary with SIGKILL mid-crawl, freeze it with SIGSTOP past its ttl, kill etcd,
and restart nodes with their same command line; nobody calls Promote. Every wait is
bounded; the ttl is 2 s (etcd's practical minimum) so that a takeover takes seconds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aetcd
import grpc
import pytest
from aetcd import rpc as etcd_rpc
from aetcd.rpc import auth_pb2 as etcd_auth
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagesift import cli
from pagesift.coord.etcd import EtcdUnavailable
from pagesift.coord.witness import EtcdWitness
from pagesift.core.ha.election import Holder
from pagesift.demo.site import Site
from pagesift.drill.fixture import Etcd
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from pagesift.v1 import replication_pb2 as pb
from tests.helpers import (
    NodeFactory,
    ServeProc,
    SiteSpec,
    all_documents,
    assert_every_page_once,
    crawl,
    eventually,
    finished,
    get_job,
    pages_done,
    role,
    until,
)

TTL = 2
PAIR = "test-pair"


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=120)


async def witness_pair(
    nodes: NodeFactory, etcd: Etcd, ttl: int = TTL, **config: object
) -> tuple[ServeProc, ServeProc]:
    """Two started nodes with one command line each, and no role: the witness decides."""
    extra = ("--witness", etcd.endpoint, "--pair", PAIR, "--witness-ttl", str(ttl))
    a = nodes("a", role="", extra=extra, config=config)
    b = nodes("b", role="", extra=extra, config=config)
    await asyncio.gather(a.start(), b.start())
    return a, b


async def settled(a: ServeProc, b: ServeProc) -> tuple[ServeProc, ServeProc] | None:
    """(primary, standby) when one node is the primary and the other follows it."""
    ra, rb = await role(a.address), await role(b.address)
    for p, s, rp, rs in ((a, b, ra, rb), (b, a, rb, ra)):
        if rp.role == pb.NODE_ROLE_PRIMARY and rs.role == pb.NODE_ROLE_STANDBY and rs.connected:
            return p, s
    return None


async def elected(a: ServeProc, b: ServeProc, timeout: float = 30.0) -> tuple[ServeProc, ServeProc]:
    return await eventually(lambda: settled(a, b), "one primary and its standby", timeout)


async def is_primary(node: ServeProc) -> pb.RoleResponse | None:
    r = await role(node.address)
    return r if r.role == pb.NODE_ROLE_PRIMARY else None


async def follows(node: ServeProc, primary: ServeProc) -> bool | None:
    r = await role(node.address)
    ok = r.role == pb.NODE_ROLE_STANDBY and r.connected and r.peer == primary.address
    return True if ok else None


async def start_crawl(address: str, req: jobs_pb2.StartCrawlRequest) -> str:
    async with grpc.aio.insecure_channel(address) as ch:
        resp = await jobs_pb2_grpc.JobServiceStub(ch).StartCrawl(req, timeout=5)
        return resp.id


async def write_refused(address: str, root: str) -> grpc.StatusCode | None:
    """The status of a write (a new crawl) the node at ``address`` refuses; None when it
    accepts it."""
    try:
        await start_crawl(address, crawl(root, limit=1))
    except grpc.aio.AioRpcError as err:
        return err.code()
    return None


async def health(address: str, service: str) -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return int(resp.status)


async def documents(address: str, job_id: str) -> list[jobs_pb2.Document]:
    async with grpc.aio.insecure_channel(address) as ch:
        return await all_documents(jobs_pb2_grpc.JobServiceStub(ch), job_id)


def paced(root: str) -> jobs_pb2.StartCrawlRequest:
    return crawl(root, max_concurrency=8, delay=0.03)


# ---------------------------------------------------------------- the tests


@pytest.mark.system
async def test_sigkill_of_the_primary_mid_crawl_hands_over_and_the_old_one_rejoins_as_standby(
    nodes: NodeFactory, etcd: Etcd, site: tuple[Site, str]
) -> None:
    s, root = site
    primary, standby = await elected(*await witness_pair(nodes, etcd))
    first_epoch = (await role(primary.address)).epoch
    job_id = await start_crawl(primary.address, paced(root))
    await eventually(lambda: pages_done(standby.address, job_id, 30), "30 pages replicated")
    primary.kill()
    took_over = await eventually(lambda: is_primary(standby), "the standby to take over", 20)
    assert took_over.epoch > first_epoch  # the witness's revision: a new, higher epoch
    await primary.start()  # the command line it was started with
    await eventually(lambda: follows(primary, standby), "the old primary to rejoin", 30)
    final = await finished(standby.address, job_id, timeout=90)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert_every_page_once(await documents(standby.address, job_id), s.expected_documents(root))
    assert "won the witness lease" in standby.log_text()


@pytest.mark.system
async def test_a_primary_frozen_past_its_ttl_refuses_writes_at_once_and_rejoins_as_standby(
    nodes: NodeFactory, etcd: Etcd, site: tuple[Site, str]
) -> None:
    _, root = site
    primary, standby = await elected(*await witness_pair(nodes, etcd))
    with primary.frozen():
        await eventually(lambda: is_primary(standby), "the standby to take over", 20)
    # the first write after SIGCONT: its deadline passed while it was frozen
    assert await write_refused(primary.address, root) == grpc.StatusCode.FAILED_PRECONDITION
    await eventually(lambda: follows(primary, standby), "the frozen primary to rejoin", 30)
    assert await write_refused(standby.address, root) is None
    assert "rejoins as its standby" in primary.log_text()


@pytest.mark.system
async def test_a_primary_that_loses_etcd_goes_read_only_within_ttl_and_writes_resume_after(
    nodes: NodeFactory, etcd: Etcd, site: tuple[Site, str]
) -> None:
    _, root = site
    # without failsafe (``test_failsafe``: with it, the standby's grants keep it writing)
    primary, standby = await elected(*await witness_pair(nodes, etcd, witness_failsafe=False))
    job_id = await start_crawl(primary.address, crawl(root, limit=5))
    await finished(primary.address, job_id)
    assert (
        await health(primary.address, "pagesift.primary") == health_pb2.HealthCheckResponse.SERVING
    )
    etcd.child.kill()

    async def refused() -> grpc.StatusCode | None:
        return await write_refused(primary.address, root)

    code = await eventually(refused, "the primary to refuse writes", timeout=TTL + 3)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert (await get_job(primary.address, job_id)).state == jobs_pb2.JOB_STATE_COMPLETED
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    assert await health(primary.address, "pagesift.primary") == not_serving
    assert (await role(standby.address)).role == pb.NODE_ROLE_STANDBY  # nobody took over
    await etcd.start()  # the same data: the lease and the keys are still there

    async def accepted_somewhere() -> bool | None:
        for node in (primary, standby):
            if await write_refused(node.address, root) is None:
                return True
        return None

    await eventually(accepted_somewhere, "writes to resume", timeout=30)


@pytest.mark.system
async def test_in_sync_mode_a_standby_that_missed_acknowledged_writes_does_not_take_over(
    nodes: NodeFactory, etcd: Etcd, site: tuple[Site, str]
) -> None:
    _, root = site
    a, b = await witness_pair(nodes, etcd, replication_mode="sync", sync_timeout=0.3)
    primary, standby = await elected(a, b)
    with standby.frozen():
        # acknowledged without the standby: sync mode degrades, and the witness hears first
        job_id = await start_crawl(primary.address, crawl(root, limit=10))
        await finished(primary.address, job_id)
        primary.kill()
    await until(
        lambda: "not campaigning: sync mode" in standby.log_text(),
        "the standby to decline the vacant lease",
        timeout=4 * TTL + 5,
    )
    assert (await role(standby.address)).role == pb.NODE_ROLE_STANDBY
    await primary.start()  # the node that holds every acknowledged write takes it back
    await eventually(lambda: is_primary(primary), "the old primary to win again", 30)
    await eventually(lambda: follows(standby, primary), "the standby to follow again", 30)
    final = await finished(standby.address, job_id)
    assert final.completed == 10


@pytest.mark.system
async def test_in_sync_mode_the_witness_hears_the_standby_is_behind_before_an_ack(
    nodes: NodeFactory, etcd: Etcd, site: tuple[Site, str]
) -> None:
    _, root = site
    # a long ttl: the periodic publish (every ttl/3) cannot be what clears the name
    a, b = await witness_pair(nodes, etcd, ttl=15, replication_mode="sync", sync_timeout=0.3)
    primary, standby = await elected(a, b)
    witness = EtcdWitness(etcd.endpoint, PAIR)
    try:
        standby_id = (await role(standby.address)).node_id

        async def names_the_standby() -> bool | None:
            state = await witness.pair_state()
            return True if state is not None and state.sync_standby == standby_id else None

        await eventually(names_the_standby, "the pair state to name the standby", 20)
        standby.kill()
        await start_crawl(primary.address, crawl(root, limit=1))  # acknowledged without it
        state = await witness.pair_state()
        assert state is not None and state.sync_standby == ""
    finally:
        await witness.close()


@pytest.mark.system
async def test_a_deleted_leader_key_stops_the_primarys_writes_and_the_pair_recovers(
    nodes: NodeFactory, etcd: Etcd, site: tuple[Site, str]
) -> None:
    _, root = site
    primary, standby = await elected(*await witness_pair(nodes, etcd))
    client = aetcd.Client(host="127.0.0.1", port=etcd.client_port, timeout=5)
    try:  # an operator's mistake: the key goes, the holder's lease stays
        await client.delete(f"/pagesift/{PAIR}/leader".encode())
    finally:
        await client.close()

    await until(lambda: "no longer ours" in primary.log_text(), "the primary to give up")

    async def recovered() -> tuple[ServeProc, ServeProc] | None:
        pair = await settled(primary, standby)
        if pair is None or await write_refused(pair[0].address, root) is not None:
            return None
        return pair

    await eventually(recovered, "one primary that takes writes, and its standby", 30)


async def enable_etcd_auth(etcd: Etcd, user: str, password: str) -> None:
    """etcd's RBAC as an operator sets it up: root, and ``user`` with read-write on the
    pair's prefix only."""
    prefix = f"/pagesift/{PAIR}/".encode()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{etcd.client_port}") as ch:
        auth = etcd_rpc.AuthStub(ch)
        await auth.UserAdd(etcd_rpc.AuthUserAddRequest(name="root", password="root-secret"))
        await auth.UserGrantRole(etcd_rpc.AuthUserGrantRoleRequest(user="root", role="root"))
        await auth.RoleAdd(etcd_rpc.AuthRoleAddRequest(name="pagesift"))
        permission = etcd_auth.Permission(
            permType=etcd_auth.Permission.READWRITE, key=prefix, range_end=prefix[:-1] + b"0"
        )
        await auth.RoleGrantPermission(
            etcd_rpc.AuthRoleGrantPermissionRequest(name="pagesift", perm=permission)
        )
        await auth.UserAdd(etcd_rpc.AuthUserAddRequest(name=user, password=password))
        await auth.UserGrantRole(etcd_rpc.AuthUserGrantRoleRequest(user=user, role="pagesift"))
        await auth.AuthEnable(etcd_rpc.AuthEnableRequest())


@pytest.mark.system
async def test_with_etcd_auth_only_the_pairs_user_takes_the_lease(
    nodes: NodeFactory, etcd: Etcd, tmp_path: Path
) -> None:
    await enable_etcd_auth(etcd, "pair-user", "pair-secret")
    me = Holder("x", "127.0.0.1:9", "127.0.0.1:9")
    for user, password in (("", ""), ("pair-user", "wrong"), ("other", "pair-secret")):
        intruder = EtcdWitness(etcd.endpoint, PAIR, user=user, password=password)
        try:
            with pytest.raises(EtcdUnavailable):
                await intruder.campaign(me, TTL)
        finally:
            await intruder.close()
    secret = tmp_path / "etcd-password"
    secret.write_text("pair-secret\n")
    extra = ("--witness", etcd.endpoint, "--pair", PAIR, "--witness-ttl", str(TTL))
    auth = ("--witness-user", "pair-user", "--witness-password-file", str(secret))
    node = nodes("a", role="", extra=(*extra, *auth))
    await node.start()
    await eventually(lambda: is_primary(node), "the authenticated node to take the lease", 20)


def test_auto_promote_without_a_witness_refuses_to_start_unless_unsafe(tmp_path: Path) -> None:
    args = ["serve", "--role", "standby", "--primary", "127.0.0.1:9", "--data", str(tmp_path)]
    assert cli.main([*args, "--auto-promote-after", "3"]) == 2
    with_role = ["serve", "--witness", "etcd://127.0.0.1:9", "--role", "primary"]
    assert cli.main([*with_role, "--data", str(tmp_path)]) == 2
    bad_url = ["serve", "--witness", "http://127.0.0.1:9", "--data", str(tmp_path)]
    assert cli.main(bad_url) == 2
