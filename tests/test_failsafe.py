"""Failsafe with a real pair and a real etcd (issue 29, finding 1 and point 2).

A witness pair (two ``pagesift serve`` children, no role, ttl 2 s, as in
``tests/test_witness``) crawls the demo site at a pace; etcd is SIGKILLed for
three ttls. With its standby connected the primary keeps writing through the outage
(its page count grows well past the lease, ``pagesift_witness_failsafe`` reads 1, a
start during the outage is taken), nobody takes over, and once etcd is back the crawl
completes with every page once on both nodes. A primary with no standby has no one to
vouch for it: it stops within a ttl, and its refusal does not name the
node itself as the primary to send writes to. Fault injection beyond this (SIGSTOP,
one node cut from etcd, the stream cut, randomized rounds) is ``test_failsafe_faults``.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from pagesift.core.util.children import free_port
from pagesift.demo.site import Site
from pagesift.drill.fixture import Etcd
from pagesift.v1 import jobs_pb2
from pagesift.v1 import replication_pb2 as pb
from tests.helpers import (
    NodeFactory,
    SiteSpec,
    assert_every_page_once,
    crawl,
    eventually,
    finished,
    get_job,
    metric,
    role,
    scrape_metrics,
)
from tests.test_witness import PAIR, TTL, documents, elected, start_crawl

#: etcd stays down this long: three ttls, well past any lease
OUTAGE = 3 * TTL


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=400)


def paced(root: str) -> jobs_pb2.StartCrawlRequest:
    """About 30 pages/s at most (one host, 0.03 s apart): the crawl outlasts the outage."""
    return crawl(root, max_concurrency=4, delay=0.03)


async def pages(address: str, job_id: str) -> int:
    job = await get_job(address, job_id)
    return job.completed + job.failed


async def at_least(address: str, job_id: str, n: int) -> int | None:
    done = await pages(address, job_id)
    return done if done >= n else None


@pytest.mark.system
async def test_an_etcd_outage_of_three_ttls_stops_no_pair_and_loses_no_page(
    nodes: NodeFactory, etcd: Etcd, site: tuple[Site, str]
) -> None:
    s, root = site
    metrics = {name: f"127.0.0.1:{free_port()}" for name in ("a", "b")}
    extra = ("--witness", etcd.endpoint, "--pair", PAIR, "--witness-ttl", str(TTL))
    a, b = (nodes(n, role="", extra=extra, config={"metrics_listen": m})
            for n, m in metrics.items())  # fmt: skip
    await asyncio.gather(a.start(), b.start())
    primary, standby = await elected(a, b)
    metrics_at = metrics[primary.name]
    job_id = await start_crawl(primary.address, paced(root))
    await eventually(lambda: at_least(primary.address, job_id, 20), "20 pages", 30)

    etcd.child.kill()
    killed = time.monotonic()
    # past the lease: the witness has not answered for a ttl and more
    await asyncio.sleep(TTL + 1.0)
    past_lease = await pages(primary.address, job_id)
    samples = await scrape_metrics(metrics_at)
    assert metric(samples, "pagesift_witness_up") == 0.0
    assert metric(samples, "pagesift_witness_failsafe") == 1.0
    assert metric(samples, "pagesift_witness_failsafe_grants_total") > 0
    # a start during the outage is taken (finding 1: it was refused, naming the node itself)
    during = await start_crawl(primary.address, crawl(root, limit=3))
    await asyncio.sleep(max(0.0, killed + OUTAGE - time.monotonic()))
    at_end = await pages(primary.address, job_id)
    assert at_end > past_lease + 10, (past_lease, at_end)  # writing on, a ttl past the lease
    assert (await role(primary.address)).role == pb.NODE_ROLE_PRIMARY
    assert (await role(standby.address)).role == pb.NODE_ROLE_STANDBY  # nobody took over

    await etcd.start()  # the same data directory: the leases renewed, or re-taken
    final = await finished(primary.address, job_id, timeout=90)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    expected = s.expected_documents(root)
    assert_every_page_once(await documents(primary.address, job_id), expected)
    assert (await finished(primary.address, during)).state == jobs_pb2.JOB_STATE_COMPLETED

    async def replicated() -> bool | None:
        done = await get_job(standby.address, job_id)
        return True if done.state == jobs_pb2.JOB_STATE_COMPLETED else None

    await eventually(replicated, "the standby to hold the finished crawl", 30)
    assert_every_page_once(await documents(standby.address, job_id), expected)


@pytest.mark.system
async def test_a_primary_without_a_standby_stops_within_a_ttl_and_names_no_primary(
    nodes: NodeFactory, etcd: Etcd, site: tuple[Site, str]
) -> None:
    _, root = site
    extra = ("--witness", etcd.endpoint, "--pair", PAIR, "--witness-ttl", str(TTL))
    alone = nodes("alone", role="", extra=extra)
    await alone.start()

    async def primary() -> bool | None:
        return True if (await role(alone.address)).role == pb.NODE_ROLE_PRIMARY else None

    await eventually(primary, "the lone node to win the lease", 30)
    job_id = await start_crawl(alone.address, paced(root))
    await eventually(lambda: at_least(alone.address, job_id, 10), "10 pages", 30)
    etcd.child.kill()

    async def refusal() -> grpc.aio.AioRpcError | None:
        try:
            await start_crawl(alone.address, crawl(root, limit=1))
        except grpc.aio.AioRpcError as err:
            return err
        return None

    err = await eventually(refusal, "the lone primary to refuse writes", TTL + 5)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert alone.address not in (err.details() or "")  # not "send writes to ... itself"
    assert "takes no write" in (err.details() or "")  # either refusal path says so
    stopped = await pages(alone.address, job_id)  # reads are served
    await asyncio.sleep(TTL)
    assert await pages(alone.address, job_id) == stopped  # the log refuses every write
    await etcd.start()
    final = await finished(alone.address, job_id, timeout=90)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
