"""GetAccountUsage over a real node: the caller's pages, jobs and pages in flight.

A real in-process node (and, for the standby, a real pair) with an accounts file,
crawling ``tests.gatedsite``: its pages wait at a gate, so the pages a job has in
flight are known exactly while the test reads the figures.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from pagesift.client import JobClient, SyncJobClient
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.gatedsite import gated_site
from tests.helpers import Acct, eventually, in_process_node, wait_done, write_accounts

METER = Acct("meter", {"pages_per_day": 50, "max_concurrent_jobs": 3})
OTHER = Acct("other", {"pages_per_day": 9})
TINY = Acct("tiny", {"pages_per_day": 2})
ACCOUNTS = (METER, OTHER, TINY)
SKIP = jobs_pb2.SITEMAP_MODE_SKIP
Usage = jobs_pb2.GetAccountUsageResponse


async def usage(stub: jobs_pb2_grpc.JobServiceAsyncStub, acct: Acct | None = None) -> Usage:
    md = acct.md if acct is not None else ()
    return await stub.GetAccountUsage(jobs_pb2.GetAccountUsageRequest(), metadata=md)


def crawl(root: str) -> jobs_pb2.StartCrawlRequest:
    return jobs_pb2.StartCrawlRequest(url=root, max_concurrency=2, sitemap=SKIP, limit=10)


async def test_the_figures_follow_a_running_crawl_and_a_scrape_and_stay_the_callers(
    tmp_path: Path,
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", ACCOUNTS)
    async with (
        gated_site(5) as site,
        in_process_node(tmp_path / "d", accounts_file=str(accounts), read_timeout=30) as node,
    ):
        before = await usage(node.stub, METER)
        assert (before.account, before.pages_used, before.running_jobs) == ("meter", 0, 0)
        assert (before.pages_per_day, before.pages_remaining, before.max_concurrent_jobs) == (
            50, 50, 3,
        )  # fmt: skip
        assert before.max_concurrency == node.config.max_concurrency
        assert not before.HasField("resets_at") and not before.HasField("last_page_at")
        hour = int(time.time() // 3600)
        assert before.period_start.seconds == (hour - 23) * 3600
        assert before.period_end.seconds == (hour + 1) * 3600

        job = await node.stub.StartCrawl(crawl(site.root), metadata=METER.md)
        await site.held(2)  # the home page is stored; two workers wait at the gate
        scrape = asyncio.ensure_future(
            node.stub.Scrape(jobs_pb2.ScrapeRequest(url=site.root + "p4"), metadata=METER.md)
        )
        await site.held(3)
        live = await usage(node.stub, METER)
        assert (live.running_jobs, live.pages_in_flight, live.pages_queued) == (1, 3, 3)
        assert (live.pages_used, live.pages_remaining) == (1, 49)
        assert live.HasField("resets_at") and live.HasField("last_page_at")
        assert (hour + 23) * 3600 <= live.resets_at.seconds <= (hour + 24) * 3600
        assert abs(live.last_page_at.seconds - time.time()) < 30

        other = await usage(node.stub, OTHER)  # another account sees none of it
        assert (other.account, other.running_jobs, other.pages_used) == ("other", 0, 0)
        assert (other.pages_in_flight, other.pages_queued) == (0, 0)
        assert other.pages_per_day == 9 and not other.HasField("max_concurrent_jobs")
        assert not other.HasField("last_page_at")

        site.open()
        await asyncio.wait_for(scrape, 30)
        done = await wait_done(node.stub, job.id, METER.md)
        assert done.state == jobs_pb2.JOB_STATE_COMPLETED and done.completed == 6
        after = await usage(node.stub, METER)
        assert (after.running_jobs, after.pages_in_flight, after.pages_queued) == (0, 0, 0)
        assert (after.pages_used, after.pages_remaining) == (7, 43)  # 6 crawled + 1 scrape
        assert after.last_page_at.ToMilliseconds() >= live.last_page_at.ToMilliseconds()
        assert (await usage(node.stub, OTHER)).pages_used == 0


async def test_a_spent_allowance_shows_none_remaining_and_when_it_resets(tmp_path: Path) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", ACCOUNTS)
    async with (
        gated_site(5) as site,
        in_process_node(tmp_path / "d", accounts_file=str(accounts)) as node,
    ):
        site.open()
        job = await node.stub.StartCrawl(crawl(site.root), metadata=TINY.md)
        await wait_done(node.stub, job.id, TINY.md)
        spent = await usage(node.stub, TINY)
    assert (spent.pages_used, spent.pages_per_day, spent.pages_remaining) == (2, 2, 0)
    assert spent.running_jobs == 0 and spent.HasField("resets_at")
    assert spent.resets_at.seconds > time.time()


async def test_anonymous_mode_shows_the_servers_own_limits(tmp_path: Path) -> None:
    async with in_process_node(tmp_path / "open") as node:
        open_ = await usage(node.stub)
    assert open_.account == "anonymous" and open_.running_jobs == 0
    assert not open_.HasField("pages_per_day") and not open_.HasField("pages_remaining")
    assert not open_.HasField("max_concurrent_jobs") and open_.pages_used == 0
    limits = tmp_path / "anonymous.toml"
    limits.write_text("[anonymous]\npages_per_day = 7\nmax_concurrent_jobs = 2\n")
    async with in_process_node(tmp_path / "limited", accounts_file=str(limits)) as node:
        limited = await usage(node.stub)
    assert limited.account == "anonymous"
    assert (limited.pages_per_day, limited.pages_remaining, limited.max_concurrent_jobs) == (
        7, 7, 2,
    )  # fmt: skip


async def test_an_unknown_key_is_unauthenticated(tmp_path: Path) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", ACCOUNTS)
    async with in_process_node(tmp_path / "d", accounts_file=str(accounts)) as node:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await usage(node.stub, Acct("nobody"))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_job_running_at_start_up_is_counted_by_the_new_runtime(tmp_path: Path) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", ACCOUNTS)
    kw: dict[str, Any] = {"accounts_file": str(accounts), "read_timeout": 30}
    async with gated_site(5) as site:
        async with in_process_node(tmp_path / "d", **kw) as node:
            job = await node.stub.StartCrawl(crawl(site.root), metadata=METER.md)
            await site.held(2)
        async with in_process_node(tmp_path / "d", **kw) as node:  # the job resumes
            again = await usage(node.stub, METER)
            assert again.running_jobs == 1 and again.pages_queued + again.pages_in_flight == 5
            site.open()
            await wait_done(node.stub, job.id, METER.md)
            assert (await usage(node.stub, METER)).running_jobs == 0


async def test_a_standby_answers_from_its_replica_without_pages_in_flight(
    tmp_path: Path,
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", ACCOUNTS)
    kw: dict[str, Any] = {"accounts_file": str(accounts), "read_timeout": 30}
    async with (
        gated_site(5) as site,
        in_process_node(tmp_path / "p", **kw) as p,
        in_process_node(tmp_path / "s", role="standby", primary=p.address, **kw) as s,
    ):
        await p.stub.StartCrawl(crawl(site.root), metadata=METER.md)
        await site.held(2)

        async def replicated() -> Usage | None:
            got = await usage(s.stub, METER)
            return got if got.running_jobs == 1 and got.pages_used == 1 else None

        seen = await eventually(replicated, "the standby to hold the running crawl")
        assert (seen.pages_in_flight, seen.pages_queued) == (0, 5)  # every page not done
        assert not seen.HasField("last_page_at") and seen.pages_remaining == 49
        other = await usage(s.stub, OTHER)
        assert (other.running_jobs, other.pages_used, other.pages_queued) == (0, 0, 0)
        site.open()


async def test_the_clients_read_the_usage_of_their_key(tmp_path: Path) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", ACCOUNTS)
    async with in_process_node(tmp_path / "d", accounts_file=str(accounts)) as node:
        async with JobClient([node.address], api_key=OTHER.key) as client:
            got = await client.account_usage()
        assert (got.account, got.pages_per_day) == ("other", 9)

        def blocking() -> Usage:
            with SyncJobClient([node.address], api_key=METER.key) as sync:
                return sync.account_usage()

        mine = await asyncio.to_thread(blocking)
    assert (mine.account, mine.max_concurrent_jobs) == ("meter", 3)


async def test_list_jobs_names_a_crawls_start_url_and_not_a_batchs(tmp_path: Path) -> None:
    async with gated_site(1) as site, in_process_node(tmp_path / "d") as node:
        site.open()
        crawled = await node.stub.StartCrawl(crawl(site.root))
        batch = await node.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=[site.root + "p0"])
        )
        await wait_done(node.stub, crawled.id)
        await wait_done(node.stub, batch.id)
        listed = await node.stub.ListJobs(jobs_pb2.ListJobsRequest())
    urls = {j.id: j.url for j in listed.jobs}
    assert urls == {crawled.id: site.root, batch.id: ""}
