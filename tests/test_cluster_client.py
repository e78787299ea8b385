"""A client in cluster mode on a real etcd and three real nodes: routing, placement, merges.

Three in-process nodes, each registered as its own pair (a ``Registrar`` with a record
built here), and three demo sites whose hosts the pairs' names spread one to a pair
(``_spread``), so the owner of every site is known in advance. The client is
``JobClient(cluster="etcd://…/NAME")``: ids it hands out carry their pair, which node ran
a job is checked on the nodes themselves (a bare UUID answers only there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.rpc import error_details_pb2

from pagesift.cli import amain, main
from pagesift.client import ClusterView, JobClient, SyncJobClient
from pagesift.client.errors import details_of, status_of
from pagesift.coord.registry import EtcdRegistry, Registrar
from pagesift.core.cluster import ids, placement
from pagesift.core.cluster.registryrules import NodeRecord, PairView
from pagesift.demo.site import Site, build_site, serve_site
from pagesift.drill.clusterrun import spread_names
from pagesift.drill.fixture import Etcd
from pagesift.gateway import server as gateway
from pagesift.v1 import jobs_pb2
from tests.helpers import NodeFactory, RunningNode, crawl, eventually, in_process_node

pytestmark = pytest.mark.system

TERMINAL = {jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED}
SLOW = 1.5  # seconds /slow.html takes (under the nodes' read timeout)


@dataclass
class Cluster:
    url: str
    etcd: Etcd
    pairs: list[str]  # pairs[k] owns sites[k]
    sites: list[tuple[Site, str]]
    nodes: dict[str, RunningNode]
    registrars: dict[str, Registrar] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def record(self, pair: str) -> NodeRecord:
        address = self.nodes[pair].address
        return NodeRecord(pair, f"{pair}-a", address, "primary", epoch=1, updated=time.time())

    async def register(self, pair: str) -> None:
        registrar = Registrar(EtcdRegistry(self.url), lambda: self.record(pair), ttl=3)
        await registrar.step()
        self.registrars[pair] = registrar
        self.tasks[pair] = asyncio.create_task(registrar.run())  # refreshed, as a node's

    async def withdraw(self, pair: str) -> None:
        task = self.tasks.pop(pair)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await self.registrars.pop(pair).close()

    async def ran_on(self, job_id: str | None) -> list[str]:
        """The pairs whose node holds the job's bare UUID (asked directly)."""
        _, uid = ids.split_job_id(job_id or "")
        found = []
        for pair, node in self.nodes.items():
            try:
                await node.stub.GetJob(jobs_pb2.GetJobRequest(id=uid, status_only=True))
                found.append(pair)
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.NOT_FOUND
        return found


@pytest.fixture
async def cluster(etcd: Etcd, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with contextlib.AsyncExitStack() as stack:
        sites: list[tuple[Site, str]] = []
        for k in range(3):  # one host each: placement keys on the host
            site = build_site(10, slow_seconds=SLOW, big_bytes=64 * 1024)
            runner, root = await serve_site(site, host=f"127.0.0.{k + 1}")
            stack.push_async_callback(runner.cleanup)
            sites.append((site, root))
        pairs = spread_names([placement.host_of(root) for _, root in sites])
        nodes = {}
        for pair in pairs:
            nodes[pair] = await stack.enter_async_context(
                in_process_node(tmp_path / pair, read_timeout=5.0)
            )
        c = Cluster(f"{etcd.endpoint}/test", etcd, pairs, sites, nodes)
        for pair in pairs:
            await c.register(pair)
        try:
            yield c
        finally:
            for pair in list(c.registrars):
                await c.withdraw(pair)


def _parts(job_id: str) -> list[tuple[str, str]]:
    """The (pair, uuid) parts of a cluster id (every part names its pair)."""
    return [(str(pair), uid) for pair, uid in ids.job_parts(job_id)]


async def _finish(client: JobClient, job_id: str, timeout: float = 60) -> jobs_pb2.GetJobResponse:
    async def done() -> jobs_pb2.GetJobResponse | None:
        resp = await client.get_job(job_id, status_only=True)
        return resp if resp.state in TERMINAL else None

    return await eventually(done, f"job {job_id} to end", timeout)


async def test_crawls_of_three_sites_run_on_their_owners_and_read_back_by_id(
    cluster: Cluster,
) -> None:
    async with JobClient(cluster=cluster.url) as client:
        job_ids = [await client.start_crawl(crawl(root)) for _, root in cluster.sites]
        for pair, job_id in zip(cluster.pairs, job_ids, strict=True):
            assert ids.pair_of(job_id) == pair
            assert await cluster.ran_on(job_id) == [pair]
            final = await _finish(client, job_id)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED and final.id == job_id
            docs = [d async for d in client.iter_documents(job_id, page_size=3)]
            direct = await cluster.nodes[pair].stub.GetJob(
                jobs_pb2.GetJobRequest(id=ids.split_job_id(job_id)[1], limit=1000)
            )
            assert [d.url for d in docs] == [d.url for d in direct.documents]
            assert len(docs) == final.completed > 5
            assert (await client.errors(job_id)).next_page_token == ""
        # a bare UUID names no pair: refused by field, not guessed
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.get_job(ids.split_job_id(job_ids[0])[1])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        violations = details_of(status_of(err.value), error_details_pb2.BadRequest)
        assert [v.field for v in violations[0].field_violations] == ["id"]


def _batch_urls(cluster: Cluster, per_site: int, slow: bool = False) -> list[str]:
    """URLs of all three sites, interleaved (site 1's first)."""
    out = []
    for i in range(per_site):
        for site, root in cluster.sites:
            paths = sorted(site.manifest.pages)
            out.append(f"{root}slow.html?n={i}" if slow else root.rstrip("/") + paths[i])
    return out


async def test_a_batch_spanning_three_pairs_reads_pages_and_watches_as_one_job(
    cluster: Cluster,
) -> None:
    urls = _batch_urls(cluster, 4)
    async with JobClient(cluster=cluster.url) as client:
        resp = await client.start_batch(jobs_pb2.StartBatchScrapeRequest(urls=urls))
        parts = _parts(resp.id)
        assert [p for p, _ in parts] == cluster.pairs  # in the order of their first URLs
        for pair, uid in parts:
            assert await cluster.ran_on(f"{pair}.{uid}") == [pair]
        watched: list[jobs_pb2.WatchJobResponse] = [e async for e in client.watch(resp.id)]
        docs = [e.document for e in watched if e.WhichOneof("event") == "document"]
        assert [d.index for d in docs] == list(range(len(urls)))
        last = watched[-1].state
        assert last.state == jobs_pb2.JOB_STATE_COMPLETED and last.completed == len(urls)
        # part by part, each part in its own order: the stable order of the job
        expected = [
            d.url
            for pair, uid in parts
            for d in (
                await cluster.nodes[pair].stub.GetJob(jobs_pb2.GetJobRequest(id=uid, limit=100))
            ).documents
        ]
        assert [d.document.url for d in docs] == expected
        paged = [d.url async for d in client.iter_documents(resp.id, page_size=3)]
        assert paged == expected
        status = await client.get_job(resp.id, status_only=True)
        assert (status.id, status.total, status.completed) == (resp.id, 12, 12)
        # a watch resumed mid-way continues in the same sequence
        tail = [e async for e in client.watch(resp.id, from_index=5)]
        assert [e.document.index for e in tail if e.WhichOneof("event") == "document"] == list(
            range(5, 12)
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.get_job(resp.id, skip=13)
        assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert (await client.errors(resp.id)).next_page_token == ""


async def test_a_batch_spanning_pairs_is_cancelled_as_one_job(cluster: Cluster) -> None:
    urls = _batch_urls(cluster, 4, slow=True)  # ~6 s a part, one page at a time
    async with JobClient(cluster=cluster.url) as client:
        req = jobs_pb2.StartBatchScrapeRequest(urls=urls, max_concurrency=1)
        job_id = (await client.start_batch(req)).id
        assert len(_parts(job_id)) == 3
        assert (await client.get_job(job_id, status_only=True)).state == jobs_pb2.JOB_STATE_SCRAPING
        assert await client.cancel(job_id) == jobs_pb2.JOB_STATE_CANCELLED
        final = await _finish(client, job_id)
        assert final.state == jobs_pb2.JOB_STATE_CANCELLED
        for pair, uid in _parts(job_id):
            part = await cluster.nodes[pair].stub.GetJob(
                jobs_pb2.GetJobRequest(id=uid, status_only=True)
            )
            assert part.state == jobs_pb2.JOB_STATE_CANCELLED


async def test_list_jobs_merges_every_pair_newest_first_under_one_page_token(
    cluster: Cluster,
) -> None:
    async with JobClient(cluster=cluster.url) as client:
        started = []
        for _ in range(3):
            for _, root in cluster.sites:
                req = jobs_pb2.StartBatchScrapeRequest(urls=[root])
                started.append((await client.start_batch(req)).id)
        listed: list[jobs_pb2.JobSummary] = []
        token = ""
        pages = 0
        while True:
            page = await client.list_jobs_page(page_size=2, page_token=token)
            pages += 1
            assert len(page.jobs) <= 2
            listed.extend(page.jobs)
            if not page.next_page_token:
                break
            assert len(page.next_page_token) < 4096
            token = page.next_page_token
        assert sorted(j.id for j in listed) == sorted(started)
        keys = [(j.created_at.ToMilliseconds(), ids.split_job_id(j.id)[1]) for j in listed]
        assert keys == sorted(keys, reverse=True)
        assert pages >= 5
        assert [j.id for j in await client.list_jobs(page_size=4)] == [j.id for j in listed]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.list_jobs_page(page_token="nonsense")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_pair_gone_from_the_registry_fails_only_its_jobs_and_new_work_goes_elsewhere(
    cluster: Cluster,
) -> None:
    async with JobClient(cluster=cluster.url) as client:
        job_ids = [
            await client.start_batch(jobs_pb2.StartBatchScrapeRequest(urls=[root]))
            for _, root in cluster.sites
        ]
        for job in job_ids:
            await _finish(client, job.id)
        gone = cluster.pairs[0]
        await cluster.withdraw(gone)

        async def refused() -> grpc.aio.AioRpcError | None:
            try:
                await client.get_job(job_ids[0].id, status_only=True)
            except grpc.aio.AioRpcError as e:
                return e
            return None

        err = await eventually(refused, "the pair's jobs to be unavailable", timeout=10)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert f"pair {gone} " in (err.details() or "")
        for job in job_ids[1:]:  # the other pairs' jobs still answer
            assert (await client.get_job(job.id)).state == jobs_pb2.JOB_STATE_COMPLETED
        # new work on the gone pair's site goes to another pair
        moved = await client.start_crawl(crawl(cluster.sites[0][1], limit=2))
        assert ids.pair_of(moved) in cluster.pairs[1:]
        assert await cluster.ran_on(moved) == [ids.pair_of(moved)]
        # listing leaves the gone pair out; it comes back with the pair
        listed = {j.id for j in await client.list_jobs()}
        assert job_ids[0].id not in listed and job_ids[1].id in listed
        await cluster.register(gone)

        async def back() -> bool | None:
            try:
                return (await client.get_job(job_ids[0].id)).state == jobs_pb2.JOB_STATE_COMPLETED
            except grpc.aio.AioRpcError:
                return None

        assert await eventually(back, "the pair to serve its jobs again", timeout=10)


async def test_a_retried_start_with_its_idempotency_key_finds_its_job(cluster: Cluster) -> None:
    async with JobClient(cluster=cluster.url) as client:
        req = crawl(cluster.sites[1][1], limit=3, idempotency_key="crawl-key-1")
        first = await client.start_crawl(req)
        assert await client.start_crawl(req) == first
        assert ids.pair_of(first) == cluster.pairs[1]
        batch = jobs_pb2.StartBatchScrapeRequest(
            urls=_batch_urls(cluster, 2), idempotency_key="batch-key-1"
        )
        one = await client.start_batch(batch)
        again = await client.start_batch(batch)
        assert one.id == again.id and len(_parts(one.id)) == 3
        # with another client (another process, say) too
        async with JobClient(cluster=cluster.url) as other:
            assert (await other.start_batch(batch)).id == one.id
        await asyncio.gather(_finish(client, first), _finish(client, one.id))


async def test_the_commands_take_a_cluster_instead_of_a_server(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--cluster", cluster.url]
    urls = _batch_urls(cluster, 2)
    assert await amain(["batch", *urls, *where, "--wait", "--json"]) == 0
    started = json.loads(capsys.readouterr().out)
    assert len(_parts(started["id"])) == 3 and started["state"] == "completed"
    assert await amain(["status", started["id"], *where, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["completed"] == len(urls)
    assert await amain(["crawl", cluster.sites[2][1], "--limit", "2", *where, "--wait"]) == 0
    crawled = capsys.readouterr().out.split()[0]
    assert ids.pair_of(crawled) == cluster.pairs[2]
    assert await amain(["jobs", *where, "--json"]) == 0
    listed = {j["id"] for j in json.loads(capsys.readouterr().out)["jobs"]}
    # a batch spanning pairs is listed as its parts (each readable by its own id)
    assert listed == {f"{p}.{u}" for p, u in _parts(started["id"])} | {crawled}
    # a command that names a node takes no cluster; the two flags do not go together
    assert await amain(["role", *where]) == 2
    assert await amain(["status", crawled, *where, "--server", "127.0.0.1:1"]) == 2
    assert main(["gateway", *where, "--server", "127.0.0.1:1"]) == 2
    capsys.readouterr()
    unreachable = ["status", crawled, "--cluster", "etcd://127.0.0.1:1/test", "--json"]
    assert await amain([*unreachable, "--connect-timeout", "1"]) == 4
    assert "etcd://127.0.0.1:1/test" in json.loads(capsys.readouterr().out)["error"]["message"]


async def test_the_gateway_in_front_of_a_cluster_places_and_reads_jobs(cluster: Cluster) -> None:
    stop = asyncio.Event()
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    options = gateway.Options(cluster=cluster.url)
    task = asyncio.create_task(gateway.run("127.0.0.1:0", [], stop, started, options=options))
    try:
        base = "http://" + await asyncio.wait_for(started, 10)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as r:
                assert r.status == 200 and (await r.json())["ok"]
            urls = _batch_urls(cluster, 2)
            async with http.post(f"{base}/v2/batch/scrape", json={"urls": urls}) as r:
                assert r.status == 200, await r.text()
                job_id = (await r.json())["id"]
            assert [p for p, _ in _parts(job_id)] == cluster.pairs

            async def finished() -> dict[str, Any] | None:
                async with http.get(f"{base}/v2/batch/scrape/{job_id}") as r:
                    body: dict[str, Any] = await r.json()
                    return body if body["status"] == "completed" else None

            body = await eventually(finished, "the batch to complete over the gateway", 30)
            assert body["completed"] == body["total"] == len(urls)
            data = list(body["data"])
            for _ in range(20):  # the pages of its parts, by Firecrawl's "next"
                if "next" not in body:
                    break
                async with http.get(body["next"]) as r:
                    body = await r.json()
                data.extend(body["data"])
            sources = [d["metadata"]["sourceURL"] for d in data]
            assert sorted(sources) == sorted(urls) and len(set(sources)) == len(urls)
            crawl_body = {"url": cluster.sites[1][1], "limit": 2}
            async with http.post(f"{base}/v2/crawl", json=crawl_body) as r:
                assert ids.pair_of((await r.json())["id"]) == cluster.pairs[1]
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_a_pairs_failover_is_invisible_to_a_cluster_client_watching_its_crawl(
    nodes: NodeFactory, etcd: Etcd, site: tuple[Site, str]
) -> None:
    _, root = site
    url = f"{etcd.endpoint}/prod"
    extra = ("--witness", etcd.endpoint, "--pair", "p1", "--witness-ttl", "2",
             "--cluster", "prod")  # fmt: skip
    a = nodes("a", role="", extra=extra)
    b = nodes("b", role="", extra=extra)
    await asyncio.gather(a.start(), b.start())
    view = ClusterView(url)
    async with JobClient(cluster=view) as client:

        async def placeable() -> PairView | None:
            await view.reread()
            pair = view.pairs.get("p1")
            return pair if pair and pair.primary and pair.standbys else None

        primary = (
            a if (await eventually(placeable, "p1 registered", 30)).primary == a.address else b
        )
        job_id = await client.start_crawl(crawl(root, max_concurrency=2, delay=0.1))
        assert ids.pair_of(job_id) == "p1"
        docs: list[jobs_pb2.Document] = []
        killed = False
        async for event in client.watch(job_id):
            if event.WhichOneof("event") == "document":
                docs.append(event.document.document)
                if len(docs) == 3 and not killed:
                    primary.kill()  # mid-crawl: the pair fails over under the watch
                    killed = True
        assert killed and len(docs) > 3  # pages kept coming after the kill
        final = await client.get_job(job_id, status_only=True)
        assert final.state == jobs_pb2.JOB_STATE_COMPLETED
        bare = await client.get_job(ids.split_job_id(job_id)[1], status_only=True)
        assert bare.id == job_id  # a bare UUID is routed when the cluster has one pair
        urls = [d.url for d in docs]
        assert len(urls) == len(set(urls)) == final.completed
    await view.close()


async def test_while_etcd_is_down_jobs_answer_by_id_and_new_placements_wait(
    cluster: Cluster,
) -> None:
    view = ClusterView(cluster.url, stale_after=1.5)
    async with JobClient(cluster=view) as client:
        job = await client.start_batch(jobs_pb2.StartBatchScrapeRequest(urls=[cluster.sites[0][1]]))
        await _finish(client, job.id)
        cluster.etcd.child.kill()
        await asyncio.sleep(2.0)  # the view is older than stale_after now
        assert (await client.get_job(job.id)).state == jobs_pb2.JOB_STATE_COMPLETED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.start_crawl(crawl(cluster.sites[1][1], limit=1))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "new jobs wait" in (err.value.details() or "")
        await cluster.etcd.start()

        async def placed() -> str | None:
            try:
                return await client.start_crawl(crawl(cluster.sites[1][1], limit=1))
            except grpc.aio.AioRpcError:
                return None

        moved = await eventually(placed, "placements to resume with etcd", timeout=20)
        assert ids.pair_of(moved) == cluster.pairs[1]
    await view.close()


async def test_scrape_map_append_and_usage_go_to_the_owner_or_add_up(cluster: Cluster) -> None:
    site, root = cluster.sites[2]
    pages = sorted(site.manifest.pages)
    async with JobClient(cluster=cluster.url) as client:
        doc = await client.scrape(root.rstrip("/") + pages[1])
        assert doc.status_code == 200

        def scrape_in_a_thread() -> jobs_pb2.Document:
            with SyncJobClient(cluster=cluster.url) as sync:
                return sync.scrape(root.rstrip("/") + pages[1])

        assert (await asyncio.to_thread(scrape_in_a_thread)).url == doc.url
        assert root.rstrip("/") + pages[1] in await client.map(root)
        batch = await client.start_batch(jobs_pb2.StartBatchScrapeRequest(urls=[root]))
        assert ids.pair_of(batch.id) == cluster.pairs[2]
        added = await client.append_batch(batch.id, [root.rstrip("/") + pages[2]])
        assert added.id == batch.id and added.added == 1
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.append_batch(batch.id, [cluster.sites[0][1]])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"belongs to pair {cluster.pairs[0]}" in (err.value.details() or "")
        final = await _finish(client, batch.id)
        assert final.completed == 2
        other = await client.start_batch(
            jobs_pb2.StartBatchScrapeRequest(urls=[cluster.sites[0][1]])
        )
        await _finish(client, other.id)
        usage = await client.account_usage()
        # every pair's figures added up (here: what each node fetches at once)
        assert usage.max_concurrency == sum(
            n.config.max_concurrency for n in cluster.nodes.values()
        )
        assert usage.account == "anonymous" and usage.HasField("last_page_at")
