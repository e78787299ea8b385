"""Account limits across pairs, on a real etcd: two in-process nodes of one cluster (two
pairs, each its own primary) with the same accounts file, each running ``ClusteredJobs``
over its own ``ClusterBudgets`` (its own lease), as ``pagesift.node.clustering`` wires them.

- ``max_concurrent_jobs`` = 2 holds across the pairs: a third start is refused on either
  pair (the local limit's status, reason and metadata), and a job's end frees its slot;
- a node that stops refreshing its lease (as if SIGKILLed) frees its slots after the
  ttl, and a node that takes over its store re-takes them first (a failover);
- ``pages_per_day`` = N over crawls on both pairs: at most N pages cluster-wide, at
  least N minus one block per pair; the etcd writes per 1,000 pages are measured;
- etcd SIGKILLed: a running job finishes on the block it holds, a start that needs a
  slot fails UNAVAILABLE / CLUSTER_UNAVAILABLE naming etcd after the bound, and starts
  work again once etcd is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

import pagesift.node.clustering as clustering_module
from pagesift.client.errors import reason_of
from pagesift.coord.budgets import ClusterBudgets, EtcdBudgets, day_of
from pagesift.core.cluster.budgetplans import block_size
from pagesift.drill.fixture import Etcd
from pagesift.primary.engine.interface import FetchPolicy, Page
from pagesift.primary.jobs.clustered import ClusteredJobs
from pagesift.v1 import jobs_pb2
from tests.fakeengine import FakeEngine, page
from tests.helpers import Acct, RunningNode, eventually, in_process_node, wait_done, write_accounts

pytestmark = pytest.mark.system

TWO = Acct("two", {"max_concurrent_jobs": 2})
DAILY = Acct("daily", {"pages_per_day": 40})
BIG = Acct("big", {"pages_per_day": 100_000, "max_concurrent_jobs": 4})
TTL = 2


def site(url: str) -> Page:
    """Every page links to its next ten (an endless site: a crawl ends by its limit)."""
    n = int(url.rsplit("/p", 1)[-1]) if "/p" in url else 0
    root = url.split("/p", 1)[0].rstrip("/")
    return page(url, *(f"{root}/p{n * 10 + i}" for i in range(1, 11)))


class GatedEngine(FakeEngine):
    """``site``'s pages, each held until ``gate`` opens (a job that stays running)."""

    def __init__(self) -> None:
        super().__init__(site)
        self.gate = asyncio.Event()
        self.gate.set()

    async def scrape(
        self,
        url: str,
        options: jobs_pb2.ScrapeOptions,
        policy: FetchPolicy = FetchPolicy(),  # noqa: B008 (frozen, shared safely)
    ) -> Page:
        await asyncio.wait_for(self.gate.wait(), 30)
        return await super().scrape(url, options, policy)


Pair = tuple[RunningNode, ClusterBudgets]


@contextlib.asynccontextmanager
async def two_pairs(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch, engine: FakeEngine
) -> AsyncIterator[tuple[Pair, Pair]]:
    accounts = write_accounts(tmp_path / "accounts.toml", (TWO, DAILY, BIG))
    shells: dict[str, ClusterBudgets] = {}

    real_factory = clustering_module.jobs_factory

    def factory(cfg: Any, accts: Any, **_: Any) -> Any:
        # what serve's node wires with --cluster: the same config, its witness's etcd
        witness = replace(cfg, cluster="prod", witness=etcd.endpoint, witness_ttl=TTL)
        make = real_factory(witness, accts, wait=1.5, linger=0.3)
        assert isinstance(make, partial) and make.func is ClusteredJobs
        shells[cfg.listen] = make.keywords["budgets"]
        return make

    monkeypatch.setattr(clustering_module, "jobs_factory", factory)
    async with (
        in_process_node(tmp_path / "a", engine=engine, accounts_file=str(accounts)) as a,
        in_process_node(tmp_path / "b", engine=engine, accounts_file=str(accounts)) as b,
    ):
        yield (a, shells[a.address]), (b, shells[b.address])


def crawl(root: str, limit: int) -> jobs_pb2.StartCrawlRequest:
    return jobs_pb2.StartCrawlRequest(url=root, limit=limit, sitemap=jobs_pb2.SITEMAP_MODE_SKIP)


async def refused(node: RunningNode, acct: Acct, req: jobs_pb2.StartCrawlRequest) -> Any:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await node.stub.StartCrawl(req, metadata=acct.md)
    return info.value


def limit_of(err: Any) -> str:
    return str(dict(err.trailing_metadata() or ()).get("pagesift-limit", ""))


async def test_an_accounts_concurrency_holds_across_pairs_and_an_end_frees_a_slot(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = GatedEngine()
    engine.gate.clear()
    async with two_pairs(tmp_path, etcd, monkeypatch, engine) as ((a, _), (b, shell_b)):
        keyed = crawl("http://one.test/", 5)
        keyed.idempotency_key = "first"
        first = await a.stub.StartCrawl(keyed, metadata=TWO.md)
        await b.stub.StartCrawl(crawl("http://two.test/", 5), metadata=TWO.md)
        again = await a.stub.StartCrawl(keyed, metadata=TWO.md)  # a retry finds its job
        assert again.id == first.id
        for node in (a, b):  # each pair runs one: the third is refused on either
            err = await refused(node, TWO, crawl("http://three.test/", 5))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert reason_of(err) == "QUOTA_EXCEEDED"
            assert limit_of(err) == "max_concurrent_jobs"
            assert "across the cluster" in (err.details() or "")
        assert sorted(await shell_b.etcd.slots("two")) == [0, 1]
        await a.stub.CancelJob(jobs_pb2.CancelJobRequest(id=first.id), metadata=TWO.md)

        async def freed() -> bool | None:
            return len(await shell_b.etcd.slots("two")) == 1 or None

        await eventually(freed, "the cancelled job's slot to be freed", timeout=5)
        third = await b.stub.StartCrawl(crawl("http://three.test/", 5), metadata=TWO.md)
        engine.gate.set()
        await wait_done(b.stub, third.id, TWO.md)

        async def all_free() -> bool | None:
            return not await shell_b.etcd.slots("two") or None

        await eventually(all_free, "every finished job's slot to be freed", timeout=5)


async def test_a_silent_nodes_slots_lapse_after_its_ttl_and_a_takeover_re_takes_them(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = GatedEngine()
    engine.gate.clear()
    async with two_pairs(tmp_path, etcd, monkeypatch, engine) as ((a, shell_a), (b, shell_b)):
        for name in ("one", "two"):
            await a.stub.StartCrawl(crawl(f"http://{name}.test/", 5), metadata=TWO.md)
        assert limit_of(await refused(b, TWO, crawl("http://x.test/", 5))) == "max_concurrent_jobs"
        # a takeover of a's store (its standby promoted) re-takes both slots onto its
        # own lease before the old lease lapses: nothing frees meanwhile
        assert a.node.jobs is not None
        standby = ClusterBudgets(EtcdBudgets(f"{etcd.endpoint}/prod"), a.node.accounts, ttl=TTL)
        await standby.attach(a.node.jobs.store)
        assert {lease for _, lease in (await shell_b.etcd.slots("two")).values()} == {
            standby._lease
        }
        # both holders stop refreshing, as if SIGKILLed: the slots lapse after the ttl
        for shell in (shell_a, standby):
            assert shell._task is not None
            shell._task.cancel()
        assert limit_of(await refused(b, TWO, crawl("http://x.test/", 5))) == "max_concurrent_jobs"

        async def lapsed() -> bool | None:
            return not await shell_b.etcd.slots("two") or None

        await eventually(lapsed, "the silent holder's slots to lapse", timeout=3 * TTL + 2)
        started = await b.stub.StartCrawl(crawl("http://x.test/", 5), metadata=TWO.md)
        engine.gate.set()
        await wait_done(b.stub, started.id, TWO.md)
        await standby.etcd.close()


async def test_daily_pages_hold_across_pairs_within_one_block_per_pair(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowance = DAILY.limits["pages_per_day"]
    block = block_size(allowance, 1)  # no registered pair yet: the pair count reads 1
    async with two_pairs(tmp_path, etcd, monkeypatch, FakeEngine(site)) as ((a, sa), (b, sb)):
        ids = [
            (a, (await a.stub.StartCrawl(crawl("http://one.test/", 500), metadata=DAILY.md)).id),
        ]
        try:  # a's crawl may have drawn the whole day already (a fast engine, a busy box)
            started = await b.stub.StartCrawl(crawl("http://two.test/", 500), metadata=DAILY.md)
            ids.append((b, started.id))
        except grpc.aio.AioRpcError as first_refusal:
            assert first_refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, first_refusal
            assert limit_of(first_refusal) == "pages_per_day"
        done = [await wait_done(node.stub, job_id, DAILY.md) for node, job_id in ids]
        pages = sum(d.completed for d in done)
        assert allowance - 2 * block <= pages <= allowance, (pages, block)
        assert all(d.state == jobs_pb2.JOB_STATE_FAILED for d in done)  # stopped by the quota
        assert all("pages_per_day" in d.note for d in done)
        for node in (a, b):  # the day's pages are drawn: a start is refused on either
            err = await refused(node, DAILY, crawl("http://three.test/", 5))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert limit_of(err) == "pages_per_day"
        drawn, _ = await sa.etcd.counter("daily", _today())
        assert pages <= drawn <= allowance
        writes = sa.etcd.writes["pages"] + sb.etcd.writes["pages"]
        assert writes <= -(-allowance // block) + 2  # one per block drawn, one per return


def _today() -> str:
    return day_of(time.time())


async def test_etcd_writes_per_thousand_pages_are_one_per_block(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with two_pairs(tmp_path, etcd, monkeypatch, FakeEngine(site)) as ((a, sa), _):
        started = await a.stub.StartCrawl(crawl("http://one.test/", 1000), metadata=BIG.md)
        done = await wait_done(a.stub, started.id, BIG.md, timeout=120)
        assert done.completed == 1000 and sa.pages_spent == 1000

        async def returned() -> bool | None:  # the unused rest of the last block went back
            back = (await sa.etcd.counter("big", _today()))[0] == 1000
            return (back and "big" not in sa._last_spend) or None  # and the round ended

        await eventually(returned, "the unused block to go back", timeout=5)
        block = block_size(BIG.limits["pages_per_day"], 1)
        pages_writes, slot_writes = sa.etcd.writes["pages"], sa.etcd.writes["slot"]
        print(f"\netcd writes per 1,000 pages: {pages_writes} pages (block {block}), "
              f"{slot_writes} slot, {sa.etcd.writes['lease']} lease")  # fmt: skip
        assert pages_writes == -(-1000 // block) + 1  # the draws and the one return
        assert slot_writes == 2  # taken at the start, freed at the end


async def test_etcd_down_running_jobs_go_on_new_starts_fail_unavailable_then_resume(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = GatedEngine()
    engine.gate.clear()
    async with two_pairs(tmp_path, etcd, monkeypatch, engine) as ((a, _), (b, _)):
        running = await a.stub.StartCrawl(crawl("http://one.test/", 30), metadata=BIG.md)
        etcd.child.kill()
        engine.gate.set()  # its pages come from the block it holds
        done = await wait_done(a.stub, running.id, BIG.md)
        assert done.state == jobs_pb2.JOB_STATE_COMPLETED and done.completed == 30
        err = await refused(b, BIG, crawl("http://two.test/", 5))
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert reason_of(err) == "CLUSTER_UNAVAILABLE"
        assert "etcd" in (err.details() or "")
        await etcd.start()

        async def starts() -> str | None:
            try:
                req = crawl("http://two.test/", 5)
                return (await b.stub.StartCrawl(req, metadata=BIG.md)).id
            except grpc.aio.AioRpcError:
                return None

        job_id = await eventually(starts, "a start once etcd is back", timeout=20)
        await wait_done(b.stub, job_id, BIG.md)


async def test_scrapes_on_both_pairs_spend_one_daily_allowance(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowance = DAILY.limits["pages_per_day"]
    async with two_pairs(tmp_path, etcd, monkeypatch, FakeEngine(site)) as ((a, _), (b, _)):
        scraped, refusals = 0, []
        for i in range(allowance + 10):
            node = (a, b)[i % 2]
            req = jobs_pb2.ScrapeRequest(url=f"http://one.test/p{i}")
            try:
                await node.stub.Scrape(req, metadata=DAILY.md)
                scraped += 1
            except grpc.aio.AioRpcError as err:
                refusals.append(err)
        block = block_size(allowance, 1)
        assert allowance - 2 * block <= scraped <= allowance
        assert refusals and all(limit_of(e) == "pages_per_day" for e in refusals)
        assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refusals)


async def test_an_append_that_reopens_a_finished_batch_needs_a_cluster_slot(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = GatedEngine()
    async with two_pairs(tmp_path, etcd, monkeypatch, engine) as ((a, _), (b, shell_b)):
        batch = jobs_pb2.StartBatchScrapeRequest(urls=["http://one.test/p1"])
        done_id = (await a.stub.StartBatchScrape(batch, metadata=TWO.md)).id
        await wait_done(a.stub, done_id, TWO.md)

        async def freed() -> bool | None:
            return not await shell_b.etcd.slots("two") or None

        await eventually(freed, "the finished batch's slot to be freed", timeout=5)
        engine.gate.clear()
        crawls = [
            (await node.stub.StartCrawl(crawl(f"http://{n}.test/", 5), metadata=TWO.md)).id
            for node, n in ((a, "two"), (b, "three"))
        ]
        more = jobs_pb2.AppendBatchScrapeRequest(id=done_id, urls=["http://one.test/p2"])
        with pytest.raises(grpc.aio.AioRpcError) as info:  # it would run a third job
            await a.stub.AppendBatchScrape(more, metadata=TWO.md)
        assert limit_of(info.value) == "max_concurrent_jobs"
        await b.stub.CancelJob(jobs_pb2.CancelJobRequest(id=crawls[1]), metadata=TWO.md)

        async def appended() -> bool | None:
            try:
                return (await a.stub.AppendBatchScrape(more, metadata=TWO.md)).reopened or None
            except grpc.aio.AioRpcError:
                return None

        await eventually(appended, "the append once a slot is free", timeout=5)
        engine.gate.set()
        assert (await wait_done(a.stub, done_id, TWO.md)).completed == 2
