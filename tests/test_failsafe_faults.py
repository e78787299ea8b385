"""Failsafe proved by fault injection (issue 29, point 2): a real pair, real etcd, real faults.

The invariant under test: **never two nodes accepting writes in overlapping intervals,
and an acknowledged write is never lost**, while a pair whose standby vouches for its
primary keeps writing through a witness outage. Each system test runs a witness pair
(``tests/faultpair.py``: each node's etcd link and the replication stream through a
``CutProxy``, every committed write traced), a paced crawl of the demo site watched by
a client (``Watcher``: the pages it saw acknowledged), a fault, and the checker
(``tests/writechecker.py``) over the trace, what the client saw and what the surviving
primary holds at the end: 0 overlapping writers, 0 stale writers, 0 lost pages.

- etcd SIGSTOPped for 3 ttls: pages keep coming on the primary the whole time (before
  failsafe every primary stopped one ttl in), nobody takes over.
- etcd reachable by the standby and not by the primary (its proxy cut): the standby,
  bound by its promises, does not take the vacant lease; the primary writes on.
- the replication stream cut during an etcd outage (etcd stopped for both, or cut for
  the primary alone): the primary's last write falls within a grant of the cut; the
  standby, when it takes over, writes only after the primary's last write.
- seeded randomized rounds of those faults mixed with SIGKILL of either node; in each
  round that failsafe must write through (etcd stopped or killed, the primary's etcd
  link cut), the trace has writes after the lease ran out.

The first tests check the harness itself: the proxy (cut, blackhole, heal) and the
three-member etcd (a quorum survives one member's SIGKILL, not two frozen). Timing
assertions are generous (a loaded box): a grant is 2 s, the bound on "stopped within
the grant" is the grant plus ``SLACK``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aetcd
import grpc
import pytest

from pagesift.demo.site import Site
from pagesift.v1 import replication_pb2 as rpb
from tests.cutproxy import CutProxy, State
from tests.etcdcluster import EtcdCluster
from tests.faultpair import (
    SYNC,
    TTL,
    FaultPair,
    PairNode,
    Watcher,
    crawling,
    inject,
    keep_crawling,
    pages_on,
    rounds,
    start_job,
    verdict,
    watching,
)
from tests.helpers import NodeFactory, SiteSpec, crawl, eventually, role

#: seconds beyond a grant a loaded box may take to notice that it ran out
SLACK = 3.0
#: the seed and count of the randomized rounds here (the bench runs more)
SEED, ROUNDS = 20261204, 4


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=1500)


@pytest.fixture
async def etcd1(tmp_path: Path) -> AsyncIterator[EtcdCluster]:
    async with EtcdCluster(tmp_path / "etcd", members=1) as cluster:
        yield cluster


@pytest.fixture
async def pair(nodes: NodeFactory, etcd1: EtcdCluster, tmp_path: Path) -> AsyncIterator[FaultPair]:
    fp = FaultPair(nodes, etcd1, tmp_path / "writes.trace", config=SYNC)
    try:
        await fp.start()
        yield fp
    finally:
        await fp.close()


async def settle_and_check(pair: FaultPair, watcher: Watcher) -> None:
    """After the faults: a primary and its standby again, and the checker clean over
    the trace, what the client saw and what that primary holds."""
    primary, _ = await pair.elected(timeout=60)
    found = await verdict(pair, watcher, primary)
    assert found.ok, found.explain()
    assert len(found.tenures) >= 1


# ---------------------------------------------------------------- the harness itself


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
    writer.close()


async def _roundtrip(address: str, payload: bytes, timeout: float = 2.0) -> bytes:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), timeout)
    finally:
        writer.close()


async def test_the_proxy_relays_cuts_blackholes_and_heals() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    upstream = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with CutProxy(upstream) as proxy:
            assert await _roundtrip(proxy.address, b"hello") == b"hello"
            host, port = proxy.address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            await proxy.cut()
            assert proxy.state is State.CUT
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                writer.write(b"x")
                await writer.drain()
                await asyncio.wait_for(reader.readexactly(1), 2)
            writer.close()
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                await _roundtrip(proxy.address, b"refused")
            await proxy.heal()
            assert await _roundtrip(proxy.address, b"again") == b"again"
            proxy.blackhole()
            reader, writer = await asyncio.open_connection(host, int(port))  # accepted
            writer.write(b"held")
            await writer.drain()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.readexactly(4), 0.5)
            await proxy.heal()
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"held"
            writer.close()
    finally:
        server.close()


async def _put(address: str, key: bytes, timeout: float = 2.0) -> None:
    host, port = address.rsplit(":", 1)
    client = aetcd.Client(host=host, port=int(port), timeout=timeout)
    try:
        await asyncio.wait_for(client.put(key, b"v"), timeout)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), 1)


async def _put_eventually(address: str, key: bytes, timeout: float = 30.0) -> None:
    """``_put`` until it succeeds (a member's loss may cost an election first)."""

    async def attempt() -> bool | None:
        try:
            await _put(address, key)
        except (aetcd.ClientError, TimeoutError):
            return None
        return True

    await eventually(attempt, f"a put of {key!r} through {address}", timeout)


@pytest.mark.system
async def test_three_etcd_members_keep_a_quorum_through_one_sigkill_not_two_frozen(
    tmp_path: Path,
) -> None:
    async with EtcdCluster(tmp_path / "etcd", members=3) as cluster:
        before = await cluster.writes(0)
        cluster.kill(2)
        await _put_eventually(cluster.members[0].address, b"/k1")
        assert await cluster.writes(0) > before
        with cluster.frozen(1), pytest.raises((aetcd.ClientError, TimeoutError)):
            await _put(cluster.members[0].address, b"/k2")
        await cluster.restart(2)
        await _put_eventually(cluster.members[2].address, b"/k3")


# ---------------------------------------------------------------- failsafe under faults


@pytest.mark.system
async def test_a_pair_keeps_writing_while_etcd_is_stopped_for_three_ttls(
    pair: FaultPair, site: tuple[Site, str]
) -> None:
    _, root = site
    watcher = Watcher(pair)
    async with watching(watcher):
        job_id = await crawling(pair, root, watcher)
        primary, standby = await pair.elected()
        async with pair.etcd.outage():
            start = await pages_on(primary, job_id)
            await asyncio.sleep(TTL + 1)  # past the lease: the landed code stopped here
            past_lease = await pages_on(primary, job_id)
            await asyncio.sleep(2 * TTL - 1)
            end = await pages_on(primary, job_id)
            assert (await role(standby.address)).role == rpb.NODE_ROLE_STANDBY
        assert end > past_lease >= start, f"pages froze: {start}, {past_lease}, {end}"
    await settle_and_check(pair, watcher)


@pytest.mark.system
async def test_a_node_whose_clock_is_a_day_ahead_changes_nothing_through_an_outage(
    nodes: NodeFactory, etcd1: EtcdCluster, tmp_path: Path, site: tuple[Site, str]
) -> None:
    # node b's monotonic clock reads a day ahead of node a's (a time namespace): a
    # grant, a promise or a deadline compared across the two would end at once or never
    fp = FaultPair(nodes, etcd1, tmp_path / "writes.trace", config=SYNC, clock_ahead=86_400)
    try:
        await fp.start()
        b = fp.nodes[1].proc.proc
        assert b is not None
        offsets = (await asyncio.to_thread(Path(f"/proc/{b.pid}/timens_offsets").read_text)).split()
        assert offsets[offsets.index("monotonic") + 1] == "86400"
        _, root = site
        watcher = Watcher(fp)
        async with watching(watcher):
            job_id = await crawling(fp, root, watcher)
            primary, standby = await eventually(fp.vouched, "the standby to vouch", timeout=40)
            async with fp.etcd.outage():
                await asyncio.sleep(TTL + 1)
                past_lease = await pages_on(primary, job_id)
                await asyncio.sleep(2 * TTL)
                end = await pages_on(primary, job_id)
                assert (await role(standby.address)).role == rpb.NODE_ROLE_STANDBY
            assert end > past_lease, f"pages froze: {past_lease} -> {end}"
        await settle_and_check(fp, watcher)  # no overlapping writers, no page lost
    finally:
        await fp.close()


@pytest.mark.system
async def test_a_clustered_pair_crawls_on_through_an_etcd_outage_on_its_hosts_tenure(
    nodes: NodeFactory, etcd1: EtcdCluster, tmp_path: Path, site: tuple[Site, str]
) -> None:
    # in a cluster every request also asks the pair's hold on its host (its registry
    # lease): the registrar keeps trying through the outage, so the hold stays (failsafe)
    fp = FaultPair(nodes, etcd1, tmp_path / "writes.trace", config={"cluster": "faults"})
    try:
        await fp.start()
        _, root = site
        watcher = Watcher(fp)
        async with watching(watcher):
            job_id = await crawling(fp, root, watcher)
            primary, _ = await eventually(fp.vouched, "the standby to vouch", timeout=40)
            async with fp.etcd.outage():
                await asyncio.sleep(TTL + 1)  # past the witness's and the registry's leases
                past_lease = await pages_on(primary, job_id)
                await asyncio.sleep(2 * TTL)
                end = await pages_on(primary, job_id)
            assert end > past_lease, f"pages froze in the outage: {past_lease} -> {end}"
        await settle_and_check(fp, watcher)
    finally:
        await fp.close()


@pytest.mark.system
async def test_a_standby_that_reaches_etcd_does_not_take_over_from_the_primary_it_vouches_for(
    pair: FaultPair, site: tuple[Site, str]
) -> None:
    _, root = site
    watcher = Watcher(pair)
    async with watching(watcher):
        job_id = await crawling(pair, root, watcher)
        primary, standby = await pair.elected()
        await primary.etcd.cut()  # the standby still reaches etcd, the primary does not
        start = await pages_on(primary, job_id)
        held_until = time.monotonic() + 4 * TTL
        while time.monotonic() < held_until:
            r = await role(standby.address)
            assert r.role == rpb.NODE_ROLE_STANDBY, "the standby took over while it vouched"
            await asyncio.sleep(0.2)
        end = await pages_on(primary, job_id)
        await primary.etcd.heal()
        assert end > start, "the primary stopped writing although its standby vouched for it"
    assert not any(len(s.primaries) > 1 for s in watcher.samples), "two primaries at once"
    await settle_and_check(pair, watcher)


async def write_refused(address: str, root: str) -> bool | None:
    """True once the node at ``address`` refuses a new crawl (None while it takes one)."""
    try:
        await start_job(address, crawl(root, limit=1))
    except grpc.aio.AioRpcError:
        return True
    return None


async def is_primary(node: PairNode) -> bool | None:
    return True if (await role(node.address)).role == rpb.NODE_ROLE_PRIMARY else None


@pytest.mark.parametrize("outage", ["etcd stopped", "primary's etcd cut"])
@pytest.mark.system
async def test_a_stream_cut_during_an_etcd_outage_stops_the_primary_within_the_grant(
    pair: FaultPair, site: tuple[Site, str], outage: str
) -> None:
    _, root = site
    watcher = Watcher(pair)
    async with watching(watcher):
        job_id = await crawling(pair, root, watcher)
        primary, standby = await pair.elected()
        primary_id = (await role(primary.address)).node_id
        async with contextlib.AsyncExitStack() as faults:
            if outage == "etcd stopped":
                await faults.enter_async_context(pair.etcd.outage())
            else:
                await primary.etcd.cut()
                faults.push_async_callback(primary.etcd.heal)
            await asyncio.sleep(TTL + 1)  # past the lease: writing on the standby's grants
            failsafe_start = await pages_on(primary, job_id)
            await asyncio.sleep(2)
            failsafe_end = await pages_on(primary, job_id)
            assert failsafe_end > failsafe_start, "no write past the lease before the cut"
            cut_ns = time.monotonic_ns()
            await primary.peer.cut()
            faults.push_async_callback(primary.peer.heal)
            await eventually(lambda: write_refused(primary.address, root), "a refusal", 3 * TTL)
            if outage == "primary's etcd cut":  # the standby reaches etcd: once its
                # promise ran out it takes the lease (the checker: after the last write)
                await eventually(lambda: is_primary(standby), "the takeover", 4 * TTL + SLACK)
            else:
                await asyncio.sleep(TTL)
        last = max(w.ns for w in pair.writes() if w.node == primary_id)
        grant_ns = int((TTL + SLACK) * 1e9)
        assert last <= cut_ns + grant_ns, f"wrote {(last - cut_ns) / 1e9:.2f} s after the cut"
    await settle_and_check(pair, watcher)


@pytest.mark.system
async def test_randomized_rounds_of_faults_leave_no_overlapping_writer_and_no_lost_page(
    pair: FaultPair, site: tuple[Site, str]
) -> None:
    _, root = site
    watcher = Watcher(pair)
    plan = rounds(SEED, ROUNDS, TTL)
    assert any(r.writes_through for r in plan), "the seed draws no outage to write through"
    async with watching(watcher):
        await crawling(pair, root, watcher)
        held = []
        for r in plan:
            await keep_crawling(pair, root, watcher)
            held.append(await inject(pair, watcher, r))
    await settle_and_check(pair, watcher)
    writes = pair.writes()
    for r, (start, end) in zip(plan, held, strict=True):
        if r.writes_through:  # the pair wrote past the lease, up to the fault's end
            window = (start + int((TTL + 1) * 1e9), end)
            assert any(window[0] <= w.ns <= window[1] for w in writes), f"no write in {r}"
