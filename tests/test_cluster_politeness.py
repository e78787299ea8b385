"""Politeness across a cluster: one host's requests never exceed the per-host limit.

A real etcd, three pairs of one in-process node each (two nodes a pair would add
nothing here: only a pair's primary fetches, and six nodes crowd the 2 shared cores),
each registered by a ``Registrar`` as the node's ``--cluster`` would. Three sites on
three loopback hosts (127.0.0.1, .2, .3: the per-host slots key on the host, so one
host per site), each counted at the server (``pagesift.drill.counting``): every
request any node sends it, its peak concurrency and its Retry-After window. The pair
names are chosen so that pair k owns site k (rendezvous hashing is deterministic), so
the owner of every piece of work is known in advance.

Starts go through ``JobClient(cluster=...)``, from two clients that share nothing but
etcd. The control (``..._without_placement_...``) starts the same kind of crawls
directly on every node, and shows that the counting site does see a breach.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest

from pagesift.client import JobClient
from pagesift.client.registryview import ClusterView
from pagesift.coord.owners import RegistryOwners
from pagesift.coord.registry import EtcdRegistry, Registrar
from pagesift.core.cluster import ids, placement
from pagesift.core.cluster.registryrules import NodeRecord
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.accounts import Accounts
from pagesift.core.util.tasks import cancel_and_wait
from pagesift.demo.site import CALENDAR_EXCLUDE
from pagesift.drill.counting import CountedSite
from pagesift.drill.fixture import Etcd
from pagesift.node import clustering
from pagesift.primary.jobs.clustered import ClusteredJobs
from pagesift.v1 import jobs_pb2
from tests.helpers import RunningNode, eventually, in_process_node

pytestmark = pytest.mark.system

LIMIT = 2  # per_host_concurrency of every node
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
TERMINAL = {jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED}
NODE: dict[str, Any] = {"per_host_concurrency": LIMIT, "extract_processes": 0, "read_timeout": 2.0}


def _names(origins: Sequence[str], extra_owns: int | None = None) -> list[str]:
    """Pair names, name k owning origins[k]; with ``extra_owns``, a fourth name that,
    once added, owns origins[extra_owns] and nothing else of ``origins``."""
    pool = [f"p{i}" for i in range(16)]
    for names in itertools.permutations(pool, 3):
        if not all(placement.owner(o, names) == n for o, n in zip(origins, names, strict=True)):
            continue
        if extra_owns is None:
            return list(names)
        for extra in pool:
            if extra in names:
                continue
            after = [placement.owner(o, [*names, extra]) for o in origins]
            want = [extra if k == extra_owns else n for k, n in enumerate(names)]
            if after == want:
                return [*names, extra]
    raise AssertionError("no names spread the origins")


@dataclass
class Cluster:
    url: str
    sites: list[CountedSite]  # pairs[k] owns sites[k]
    pairs: list[str]
    nodes: dict[str, RunningNode] = field(default_factory=dict)
    registrars: dict[str, Registrar] = field(default_factory=dict)
    refreshing: list[asyncio.Task[None]] = field(default_factory=list)

    async def register(self, pair: str, node: RunningNode) -> None:
        self.nodes[pair] = node
        registrar = await registered(self.url, pair, node)
        self.registrars[pair] = registrar
        self.refreshing.append(asyncio.create_task(registrar.run()))  # as a node's does

    async def ran_on(self, job_id: str) -> list[str]:
        """The pairs whose node holds the bare UUID of ``job_id`` (asked directly)."""
        uid = ids.split_job_id(job_id)[1]
        found = []
        for pair, node in self.nodes.items():
            try:
                await node.stub.GetJob(jobs_pb2.GetJobRequest(id=uid, status_only=True))
                found.append(pair)
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND
        return found


async def registered(url: str, pair: str, node: RunningNode) -> Registrar:
    """A registrar that has written ``node``'s record as pair ``pair``'s primary in
    cluster ``url`` (its ``run`` keeps it), as the node's ``--cluster`` one would: with
    ownership enforced it feeds the node's tenure, whose lease holds the pair's hosts."""

    def record() -> NodeRecord:
        return NodeRecord(pair, f"{pair}-a", node.address, "primary", 1, updated=time.time())

    jobs = node.node.jobs
    owners = jobs.owners if isinstance(jobs, ClusteredJobs) else None
    tenure = owners.tenure if isinstance(owners, RegistryOwners) else None
    registrar = Registrar(EtcdRegistry(url), record, ttl=3, tenure=tenure)
    await registrar.step()
    return registrar


def enforce_ownership(monkeypatch: pytest.MonkeyPatch, etcd: Etcd, cluster: str) -> None:
    """Nodes started from now on build their runtime as ``--cluster NAME`` with the
    witness's etcd would (``clustering.jobs_factory``), without running the witness."""
    real = clustering.jobs_factory

    def factory(cfg: ServerConfig, accounts: Accounts, **_: Any) -> Any:
        joined = replace(cfg, cluster=cluster, witness=etcd.endpoint, witness_ttl=3)
        return real(joined, accounts)

    monkeypatch.setattr(clustering, "jobs_factory", factory)


async def owners_read(nodes: Sequence[RunningNode], pairs: int) -> None:
    """Every node's registry read shows ``pairs`` placeable pairs (bounded wait)."""

    async def read() -> bool | None:
        seen = []
        for n in nodes:
            assert isinstance(n.node.jobs, ClusteredJobs)
            seen.append(len(n.node.jobs.owners.current().pairs or ()))
        return True if all(k == pairs for k in seen) else None

    await eventually(read, f"every node to read {pairs} pairs", timeout=20)


@contextlib.asynccontextmanager
async def _cluster(
    etcd: Etcd,
    tmp: Path,
    *,
    delay: float,
    pages: int,
    retry_after: float = 0.0,
    extra: bool = False,
    enforce: pytest.MonkeyPatch | None = None,
) -> AsyncIterator[Cluster]:
    """Three pairs, three counted sites (pair k owns site k). With ``enforce`` the nodes
    run as ``--cluster`` wires them (``ClusteredJobs`` with the registry's owners, as
    ``enforce_ownership`` patches it); without, a plain runtime: only the clients
    place by owner."""
    async with contextlib.AsyncExitStack() as stack:
        sites = []
        for k, host in enumerate(HOSTS):
            site = CountedSite(
                pages, host=host, delay=delay, retry_after=retry_after if k == 2 else 0
            )
            await site.start()
            stack.push_async_callback(site.stop)
            sites.append(site)
        origins = [placement.host_of(s.root) for s in sites]
        c = Cluster(f"{etcd.endpoint}/polite", sites, _names(origins, 2 if extra else None))
        if enforce is not None:
            enforce_ownership(enforce, etcd, "polite")
        for pair in c.pairs[:3]:
            node = await stack.enter_async_context(in_process_node(tmp / pair, **NODE, pair=pair))
            await c.register(pair, node)
        try:
            yield c
        finally:
            for task in c.refreshing:
                await cancel_and_wait(task)
            for registrar in c.registrars.values():
                await registrar.close()


def _crawl(site: CountedSite) -> jobs_pb2.StartCrawlRequest:
    return jobs_pb2.StartCrawlRequest(
        url=site.root, exclude_paths=[CALENDAR_EXCLUDE], max_concurrency=8
    )


async def _finish(client: JobClient, job_id: str, timeout: float = 90) -> jobs_pb2.GetJobResponse:
    async def done() -> jobs_pb2.GetJobResponse | None:
        resp = await client.get_job(job_id, status_only=True)
        return resp if resp.state in TERMINAL else None

    return await eventually(done, f"job {job_id} to end", timeout)


async def test_one_hosts_concurrency_across_the_cluster_never_exceeds_the_per_host_limit(
    etcd: Etcd, tmp_path: Path
) -> None:
    async with (
        _cluster(etcd, tmp_path, delay=0.05, pages=12) as c,
        JobClient(cluster=c.url) as one,
        JobClient(cluster=c.url) as two,
    ):
        a, b, s3 = c.sites
        starts = [(one, a), (two, a), (one, a), (two, b), (one, b), (two, s3)]
        crawls = await asyncio.gather(*(cl.start_crawl(_crawl(s)) for cl, s in starts))
        batch_urls = [
            u for trio in zip(*(s.page_urls()[:6] for s in c.sites), strict=True) for u in trio
        ]
        batch = (
            await two.start_batch(
                jobs_pb2.StartBatchScrapeRequest(urls=batch_urls, max_concurrency=8)
            )
        ).id
        for job_id, (_, site) in zip(crawls, starts, strict=True):
            owner = c.pairs[c.sites.index(site)]
            assert ids.pair_of(job_id) == owner
            assert await c.ran_on(job_id) == [owner]
        assert [str(p) for p, _ in ids.job_parts(batch)] == c.pairs
        for job_id in [*crawls, batch]:
            final = await _finish(one, job_id)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED, (job_id, final.note)
        assert (await one.get_job(batch, status_only=True)).completed == len(batch_urls)
    # counted at the servers: every host reached the limit and none went past it
    assert [s.counter.peak for s in c.sites] == [LIMIT] * 3
    assert all(s.counter.requests > 12 for s in c.sites)


def _origin_owner(site: CountedSite, pairs: Sequence[str]) -> str:
    """The pair the client placed ``site`` on when placement keyed on the origin
    (``scheme://host:port``), before it keyed on the host."""
    return placement.owner(f"http://{site.host}:{urlsplit(site.root).port}", pairs)


async def test_one_host_on_two_ports_is_one_owners_within_one_limit(
    etcd: Etcd, tmp_path: Path
) -> None:
    # finding 3: placement keyed on the origin, the slots on the host: two ports of one
    # host were two pairs' work, each with its own per-host slots (4 in flight at 2)
    async with contextlib.AsyncExitStack() as stack:
        c = await stack.enter_async_context(_cluster(etcd, tmp_path, delay=0.05, pages=12))
        first = CountedSite(12, host="127.0.0.4", delay=0.05, seed=4)
        await first.start()
        stack.push_async_callback(first.stop)
        for _ in range(32):  # ports the origin rule would have put on two pairs
            second = CountedSite(12, host="127.0.0.4", delay=0.05, seed=5)
            second.counter = first.counter  # one host: one count over both ports
            second.site.app.middlewares[-1] = first.counter.middleware
            await second.start()
            stack.push_async_callback(second.stop)
            if _origin_owner(first, c.pairs) != _origin_owner(second, c.pairs):
                break
        else:
            raise AssertionError("no port pair that the origin rule split")
        client = await stack.enter_async_context(JobClient(cluster=c.url))
        jobs = await asyncio.gather(*(client.start_crawl(_crawl(s)) for s in (first, second)))
        owner = placement.owner("127.0.0.4", c.pairs)
        assert [ids.pair_of(j) for j in jobs] == [owner, owner]
        for job_id in jobs:
            final = await _finish(client, job_id)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert first.counter.peak == LIMIT  # reached, never passed, over both ports


async def test_without_placement_the_same_crawls_exceed_the_per_host_limit(
    etcd: Etcd, tmp_path: Path
) -> None:
    # the control: one site crawled by every pair at once (each call to its own node)
    async with _cluster(etcd, tmp_path, delay=0.05, pages=12) as c:
        site = c.sites[0]
        jobs = [(node, (await node.stub.StartCrawl(_crawl(site))).id) for node in c.nodes.values()]
        for node, job_id in jobs:

            async def done(
                node: RunningNode = node, job_id: str = job_id
            ) -> jobs_pb2.GetJobResponse | None:
                r = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, status_only=True))
                return r if r.state in TERMINAL else None

            await eventually(done, "a direct crawl to end", 90)
    assert site.counter.peak > LIMIT


async def test_a_retry_after_pause_of_a_host_holds_for_every_client_of_the_cluster(
    etcd: Etcd, tmp_path: Path
) -> None:
    # site 3's first page request is answered 429, Retry-After 2 s
    async with (
        _cluster(etcd, tmp_path, delay=0.02, pages=10, retry_after=2.0) as c,
        JobClient(cluster=c.url) as one,
        JobClient(cluster=c.url) as two,
    ):
        site = c.sites[2]
        first = await one.start_crawl(_crawl(site))
        await eventually(lambda: _true_if(site.counter.pause is not None), "the pause", timeout=30)
        # more work on that host while it is paused, from another client and a batch
        second = await two.start_crawl(_crawl(site))
        batch = (
            await two.start_batch(
                jobs_pb2.StartBatchScrapeRequest(urls=[*site.page_urls()[:5], c.sites[0].root])
            )
        ).id
        owner = c.pairs[2]
        assert ids.pair_of(first) == ids.pair_of(second) == owner
        assert str(ids.job_parts(batch)[0][0]) == owner
        for job_id in (first, second, batch):
            final = await _finish(one, job_id)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert site.counter.pause is not None
    assert site.counter.inside_pause() == []
    assert site.counter.peak <= LIMIT


async def _true_if(cond: bool) -> bool | None:
    return True if cond else None


async def test_a_pair_added_while_crawls_run_takes_new_work_for_its_origins_only(
    etcd: Etcd, tmp_path: Path
) -> None:
    async with (
        _cluster(etcd, tmp_path, delay=0.2, pages=12, extra=True) as c,
        in_process_node(tmp_path / c.pairs[3], **NODE) as newcomer,
    ):
        view = ClusterView(c.url)
        client = JobClient(cluster=view)
        try:
            await _added_while_running(c, view, client, newcomer)
        finally:
            await client.close()
            await view.close()


async def _added_while_running(
    c: Cluster, view: ClusterView, client: JobClient, newcomer: RunningNode
) -> None:
    running = [await client.start_crawl(_crawl(s)) for s in c.sites]
    assert [ids.pair_of(j) for j in running] == c.pairs[:3]
    await c.register(c.pairs[3], newcomer)

    async def sees_four() -> bool | None:
        return True if len(view.pairs) == 4 else None

    await eventually(sees_four, "the client to see the fourth pair", timeout=10)
    for job_id in running:  # still running, where they started
        state = (await client.get_job(job_id, status_only=True)).state
        assert state not in TERMINAL
    later = [await client.start_crawl(_crawl(s)) for s in c.sites]
    # the new pair owns site 3 now: new work for it goes there, the rest stays
    assert [ids.pair_of(j) for j in later] == [c.pairs[0], c.pairs[1], c.pairs[3]]
    for job_id in [*running, *later]:
        final = await _finish(client, job_id)
        assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
        assert await c.ran_on(job_id) == [ids.pair_of(job_id)]
    # the sites that kept their owner stayed within the limit; site 3 was fetched by its
    # old owner (the running crawl) and its new one at once: at most twice the limit
    # while ownership moved (docs/scaling.md, "Politeness across pairs")
    assert [s.counter.peak for s in c.sites[:2]] == [LIMIT, LIMIT]
    assert LIMIT <= c.sites[2].counter.peak <= 2 * LIMIT
