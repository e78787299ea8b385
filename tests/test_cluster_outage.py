"""A cluster client through an etcd outage (issue 29, finding 1's client side), on a real etcd.

One in-process node registered as pair ``p1`` (a ``Registrar`` with a long ttl, so its
record outlives the outage), the demo site, etcd SIGKILLed and started again on the
same data:

- a start right after etcd returns reads the registry again and is placed, instead of
  failing on the outage's age ("the registry has not answered for 16 s");
- a start during the outage waits ``place_wait`` for etcd: placed when etcd returns
  within it, else UNAVAILABLE with reason ``CLUSTER_UNAVAILABLE`` naming etcd;
- a client made while etcd is down reads an existing job by its id through the members
  file's addresses (``ClusterView(members=...)``);
- on a node (``tests.test_cluster_budgets``' two pairs, ``wait`` 1.5 s), a start that
  needs a block of pages right after a 12 s outage is served at once: its etcd
  connection does not inherit gRPC's shared reconnect backoff (``coord.etcd``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from pagesift.client import ClusterView, JobClient
from pagesift.client.errors import reason_of
from pagesift.coord.registry import EtcdRegistry, Registrar
from pagesift.core.cluster import ids
from pagesift.core.cluster.members import parse_members
from pagesift.core.cluster.registryrules import NodeRecord
from pagesift.demo.site import Site
from pagesift.drill.fixture import Etcd
from tests.helpers import RunningNode, crawl, in_process_node, wait_done
from tests.test_cluster_budgets import BIG, GatedEngine, two_pairs
from tests.test_cluster_budgets import crawl as fake_crawl

pytestmark = pytest.mark.system

RECORD_TTL = 60  # the registration outlives every outage here


@dataclass
class OnePair:
    url: str
    etcd: Etcd
    node: RunningNode
    root: str


@pytest.fixture
async def one_pair(etcd: Etcd, tmp_path: Path, site: tuple[Site, str]) -> AsyncIterator[OnePair]:
    url = f"{etcd.endpoint}/outage"
    async with in_process_node(tmp_path / "p1") as node:

        def record() -> NodeRecord:
            return NodeRecord("p1", "p1-a", node.address, "primary", epoch=1, updated=time.time())

        registrar = Registrar(EtcdRegistry(url), record, ttl=RECORD_TTL)
        await registrar.step()
        task = asyncio.create_task(registrar.run())
        try:
            yield OnePair(url, etcd, node, site[1])
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(registrar.close(), 10)


async def test_a_start_right_after_etcd_returns_reads_the_registry_again(
    one_pair: OnePair,
) -> None:
    # no background read for a minute: only the start itself can refresh the view
    view = ClusterView(one_pair.url, refresh=60, stale_after=1.0)
    async with JobClient(cluster=view) as client:
        first = await client.start_crawl(crawl(one_pair.root, limit=1))
        one_pair.etcd.child.kill()
        await asyncio.sleep(1.5)  # the view is older than stale_after now
        await one_pair.etcd.start()
        placed = await client.start_crawl(crawl(one_pair.root, limit=1))
        assert ids.pair_of(first) == ids.pair_of(placed) == "p1"
    await view.close()


async def test_a_start_during_the_outage_waits_then_is_refused_naming_etcd(
    one_pair: OnePair,
) -> None:
    view = ClusterView(one_pair.url, stale_after=0.5, place_wait=1.5)
    async with JobClient(cluster=view) as client:
        await client.start_crawl(crawl(one_pair.root, limit=1))
        one_pair.etcd.child.kill()
        await asyncio.sleep(1.0)
        began = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.start_crawl(crawl(one_pair.root, limit=1))
        waited = time.monotonic() - began
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert reason_of(err.value) == "CLUSTER_UNAVAILABLE"
        assert f"etcd at {one_pair.etcd.endpoint.split('://')[1]}" in (err.value.details() or "")
        assert waited >= 1.0  # it waited for etcd (place_wait 1.5 s), not refused at once
    await view.close()


async def test_a_start_during_the_outage_is_placed_when_etcd_returns_within_the_wait(
    one_pair: OnePair,
) -> None:
    view = ClusterView(one_pair.url, stale_after=0.5, place_wait=45)
    async with JobClient(cluster=view) as client:
        one_pair.etcd.child.kill()
        await asyncio.sleep(1.0)
        start = asyncio.create_task(client.start_crawl(crawl(one_pair.root, limit=1)))
        await asyncio.sleep(1.0)
        assert not start.done()  # waiting for etcd, not refused
        await one_pair.etcd.start()
        assert ids.pair_of(await asyncio.wait_for(start, 45)) == "p1"
    await view.close()


async def test_a_client_made_while_etcd_is_down_reads_a_job_through_the_members_file(
    one_pair: OnePair,
) -> None:
    async with JobClient(cluster=one_pair.url) as client:
        job_id = await client.start_crawl(crawl(one_pair.root, limit=1))
    one_pair.etcd.child.kill()
    key = base64.b64encode(os.urandom(32)).decode()
    members = parse_members(
        f'[pairs.p1]\npublic_key = "{key}"\nnodes = ["{one_pair.node.address}"]\n'
    )
    view = ClusterView(one_pair.url, members=members)
    async with JobClient(cluster=view) as late:
        assert (await late.get_job(job_id, status_only=True)).id == job_id
        with pytest.raises(grpc.aio.AioRpcError) as err:  # placement still needs etcd
            await late.start_crawl(crawl(one_pair.root, limit=1))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    await view.close()
    without = ClusterView(one_pair.url)  # no members file: nothing to reach the pair by
    async with JobClient(cluster=without) as blind:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await blind.get_job(job_id, status_only=True)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    await without.close()


async def test_a_nodes_start_right_after_a_long_outage_is_not_refused(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with two_pairs(tmp_path, etcd, monkeypatch, GatedEngine()) as ((a, _), (b, _)):
        first = await a.stub.StartCrawl(fake_crawl("http://one.test/", 3), metadata=BIG.md)
        await wait_done(a.stub, first.id, BIG.md)
        etcd.child.kill()
        await asyncio.sleep(12)  # every connection failing all along: backoffs grow
        await etcd.start()
        second = await b.stub.StartCrawl(fake_crawl("http://two.test/", 3), metadata=BIG.md)
        done = await wait_done(b.stub, second.id, BIG.md)
        assert done.completed == 3
