"""The cluster registry on a real etcd: records under leases, lapsing by themselves."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import grpc
import pytest

from pagesift.coord.etcd import EtcdUnavailable
from pagesift.coord.registry import EtcdRegistry, Registrar
from pagesift.core.cluster.registryrules import Load, NodeRecord, PairView, pair_views, placeable
from pagesift.demo.site import Site
from pagesift.drill.fixture import Etcd
from pagesift.v1 import jobs_pb2_grpc
from tests.helpers import NodeFactory, crawl, eventually

pytestmark = pytest.mark.system


def record(pair: str, node: str, role: str, epoch: int = 1, running: int = 0) -> NodeRecord:
    return NodeRecord(pair, node, f"127.0.0.1:{1000 + len(node)}", role, epoch=epoch,
                      load=Load(running_jobs=running), updated=time.time())  # fmt: skip


async def test_registered_nodes_are_listed_and_merged_into_pairs(etcd: Etcd) -> None:
    url = f"{etcd.endpoint}/prod"
    registrars = [
        Registrar(EtcdRegistry(url), lambda r=r: r, ttl=2)  # type: ignore[misc]
        for r in (
            record("p1", "a", "primary", 3, running=2),
            record("p1", "bb", "standby", 3),
            record("p2", "ccc", "primary", 1),
        )
    ]
    reader = EtcdRegistry(url)
    try:
        for r in registrars:
            await r.step()
        views = pair_views(await reader.nodes())
        assert placeable(views.values()) == ["p1", "p2"]
        assert views["p1"].primary == "127.0.0.1:1001" and views["p1"].load.running_jobs == 2
        assert views["p1"].standbys == ("127.0.0.1:1002",)
        other = EtcdRegistry(f"{etcd.endpoint}/staging")  # another cluster, same etcd
        assert await other.nodes() == []
        await other.close()
    finally:
        for r in registrars:
            await r.close()
        assert await reader.nodes() == []  # a clean stop withdraws at once
        await reader.close()


async def test_a_node_that_stops_refreshing_drops_out_after_its_ttl(etcd: Etcd) -> None:
    url = f"{etcd.endpoint}/prod"
    gone = Registrar(EtcdRegistry(url), lambda: record("p1", "a", "primary"), ttl=2)
    stays = Registrar(EtcdRegistry(url), lambda: record("p1", "bb", "standby"), ttl=2)
    reader = EtcdRegistry(url)
    task = asyncio.create_task(stays.run())
    try:
        await gone.step()  # and never again: as if SIGKILLed
        await asyncio.wait_for(stays.registered.wait(), 5)
        assert len(await reader.nodes()) == 2

        async def lapsed() -> bool | None:
            return [n.node for n in await reader.nodes()] == ["bb"] or None

        await eventually(lapsed, "the silent node's record to lapse", timeout=8)
        views = pair_views(await reader.nodes())
        assert views["p1"].primary == "" and placeable(views.values()) == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await stays.close()
        await gone.registry.close()
        await reader.close()


async def test_the_registrar_re_registers_after_etcd_comes_back(etcd: Etcd) -> None:
    url = f"{etcd.endpoint}/prod"
    reg = Registrar(EtcdRegistry(url, timeout=0.5), lambda: record("p1", "a", "primary"), ttl=2)
    task = asyncio.create_task(reg.run())
    reader = EtcdRegistry(url)
    try:
        await asyncio.wait_for(reg.registered.wait(), 5)
        etcd.child.kill()
        try:
            await reader.nodes()
            raise AssertionError("etcd answered after SIGKILL")
        except EtcdUnavailable:
            pass
        await asyncio.sleep(3)  # longer than the ttl: the lease lapses meanwhile
        await etcd.start()

        async def back() -> bool | None:
            try:
                return [n.node for n in await reader.nodes()] == ["a"] or None
            except EtcdUnavailable:
                return None

        await eventually(back, "the record to come back with etcd", timeout=15)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await reg.close()
        await reader.close()


async def test_cluster_status_shows_every_pair_and_what_is_unhealthy(etcd: Etcd) -> None:
    url = f"{etcd.endpoint}/prod"
    registrars = [
        Registrar(EtcdRegistry(url), lambda r=r: r, ttl=5)  # type: ignore[misc]
        for r in (
            record("p1", "a", "primary", 3, running=2),
            record("p1", "bb", "standby", 3),
            record("p2", "ccc", "primary", 1),
        )
    ]
    try:
        for r in registrars:
            await r.step()
        cmd = [sys.executable, "-m", "pagesift.cli", "cluster", "status", "--cluster", url]
        done = await asyncio.to_thread(
            subprocess.run, [*cmd, "--json"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1, done.stderr  # p2 has no standby
        out = json.loads(done.stdout)
        assert out["cluster"] == "prod" and out["placeable"] == ["p1", "p2"]
        by_pair = {p["pair"]: p for p in out["pairs"]}
        assert by_pair["p1"]["primary"] == "127.0.0.1:1001" and by_pair["p1"]["problems"] == []
        assert by_pair["p1"]["load"]["running_jobs"] == 2
        assert any("no standby" in x for x in by_pair["p2"]["problems"])
        text = await asyncio.to_thread(
            subprocess.run, cmd, capture_output=True, text=True, timeout=60
        )
        assert "p1: primary 127.0.0.1:1001, standby 127.0.0.1:1002" in text.stdout
        assert "healthy" in text.stdout and "no standby" in text.stdout
    finally:
        for r in registrars:
            await r.close()
    etcd.child.kill()
    down = await asyncio.to_thread(
        subprocess.run, [*cmd, "--json"], capture_output=True, text=True, timeout=60
    )
    assert down.returncode == 4 and "error" in json.loads(down.stdout)


# ---------------------------------------------------------------- a real pair in a cluster


async def pair_view(url: str, pair: str) -> PairView | None:
    reader = EtcdRegistry(url)
    try:
        return pair_views(await reader.nodes()).get(pair)
    finally:
        await reader.close()


async def test_a_pairs_nodes_register_and_the_view_follows_a_failover(
    nodes: NodeFactory, etcd: Etcd, site: tuple[Site, str]
) -> None:
    _, root = site
    url = f"{etcd.endpoint}/prod"
    extra = ("--witness", etcd.endpoint, "--pair", "p1", "--witness-ttl", "2",
             "--cluster", "prod")  # fmt: skip
    a = nodes("a", role="", extra=extra, config={"per_host_concurrency": 3})
    b = nodes("b", role="", extra=extra, config={"per_host_concurrency": 5})
    await asyncio.gather(a.start(), b.start())

    async def settled() -> PairView | None:
        v = await pair_view(url, "p1")
        return v if v and v.primary and len(v.standbys) == 1 else None

    first = await eventually(settled, "p1 registered with a primary and a standby", 30)
    reader = EtcdRegistry(url)
    try:  # each node publishes the per-host limit it runs with (the drill judges by it)
        limits = {r.address: r.per_host_concurrency for r in await reader.nodes()}
    finally:
        await reader.close()
    assert limits == {a.address: 3, b.address: 5}
    primary, standby = (a, b) if first.primary == a.address else (b, a)
    assert first.standbys == (standby.address,)
    async with grpc.aio.insecure_channel(primary.address) as ch:
        req = crawl(root, max_concurrency=2, delay=0.2)
        job = (await jobs_pb2_grpc.JobServiceStub(ch).StartCrawl(req, timeout=5)).id

    async def busy() -> PairView | None:
        v = await pair_view(url, "p1")
        return v if v and v.load.running_jobs == 1 and v.load.queued_pages > 0 else None

    await eventually(busy, "the running crawl in p1's load", 15)
    primary.kill()

    async def took_over() -> PairView | None:
        v = await pair_view(url, "p1")
        return v if v and v.primary == standby.address and not v.standbys else None

    after = await eventually(took_over, "the standby registered as p1's primary", 30)
    assert after.epoch > first.epoch
    assert job  # the crawl goes on on the new primary (tests/test_witness.py checks its pages)
