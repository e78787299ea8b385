"""Finding 2 of issue 19 on a real witness pair: the poisoned sitemap causes no failover.

On the landed code, a crawl behind ``<urlset>`` + 16,000 unclosed ``<loc>`` froze the
primary's event loop for ~46 s; with an etcd witness (ttl 5) the primary lost its
lease, the standby took over, resumed the same job and froze in turn: epochs 2 -> 77
in ten minutes. Here the same crawl, and a Map of the same site, run on a pair with a
witness of ttl 2 (a freeze of 2 s would fail it over): the job completes, the same
node stays primary at the same epoch the whole time, and no job is quarantined.
(``test_quarantine`` shows what happens to a poison the parsers do not defuse.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from pagesift.drill.fixture import Etcd
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from pagesift.v1 import replication_pb2 as pb
from tests import hostile
from tests.helpers import NodeFactory, ServeProc, eventually, role, wait_done
from tests.hostile import sitemaps as hostile_sitemaps

pytestmark = pytest.mark.system

TTL = 2
PAIR = "hostile-sitemap-pair"


@contextlib.asynccontextmanager
async def _poisoned_site() -> AsyncIterator[str]:
    robots_txt = hostile_sitemaps.robots_route("unclosed.xml.gz")
    runner, root = await hostile.serve([*hostile_sitemaps.ROUTES, robots_txt])
    try:
        yield root
    finally:
        await runner.cleanup()


async def _roles(a: ServeProc, b: ServeProc) -> dict[str, pb.RoleResponse]:
    out: dict[str, pb.RoleResponse] = {}
    for node in (a, b):
        with contextlib.suppress(grpc.aio.AioRpcError):
            out[node.name] = await role(node.address)
    return out


async def _primary(a: ServeProc, b: ServeProc) -> tuple[ServeProc, int] | None:
    """The primary whose standby streams from it, and its epoch."""
    roles = await _roles(a, b)
    for node, other in ((a, b), (b, a)):
        mine, theirs = roles.get(node.name), roles.get(other.name)
        if mine is None or theirs is None:
            continue
        primary = mine.role == pb.NODE_ROLE_PRIMARY
        if primary and theirs.role == pb.NODE_ROLE_STANDBY and theirs.connected:
            return node, mine.epoch
    return None


async def test_the_poisoned_sitemap_on_a_witness_pair_fails_nothing_over(
    nodes: NodeFactory, etcd: Etcd
) -> None:
    extra = ("--witness", etcd.endpoint, "--pair", PAIR, "--witness-ttl", str(TTL))
    a = nodes("a", role="", extra=extra)
    b = nodes("b", role="", extra=extra)
    await asyncio.gather(a.start(), b.start())
    primary, epoch = await eventually(lambda: _primary(a, b), "a primary and its standby", 30)
    async with _poisoned_site() as root, grpc.aio.insecure_channel(primary.address) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        start = root + "sitemaps/page/start"
        job = await stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=start, limit=5))

        async def map_site() -> list[str]:
            stream = stub.Map(jobs_pb2.MapRequest(url=root), timeout=60)
            return [u async for batch in stream for u in batch.urls]

        mapped = asyncio.create_task(map_site())
        seen: list[tuple[str, int]] = []
        for _ in range(4 * TTL * 2):  # four ttl's worth of looks, half a second apart
            now = await _primary(a, b)
            assert now is not None, "the pair lost its primary or its standby"
            seen.append((now[0].name, now[1]))
            await asyncio.sleep(0.5)
        final = await wait_done(stub, job.id, timeout=60)
        await asyncio.wait_for(mapped, 60)  # it answers (what it found does not matter)
        after = await _primary(a, b)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final
    assert set(seen) == {(primary.name, epoch)}, seen
    assert after is not None and (after[0].name, after[1]) == (primary.name, epoch)
