"""Daily pages exact in fetches: no request leaves a node for a page not drawn first.

Finding 4 of issue 29: ``pages_per_day = 300`` over two pairs stored 300 documents while
the origins served 315 and 312 page requests: the pages were charged in the group that
stored them, after the fetch, so every worker in flight when the day ran out fetched a
page that was then thrown away. Now every attempt draws its page first
(``pagesift.primary.jobs.pagedraws``) and gives it back when it stored nothing.

- ``PageDraws`` itself, deterministic: the node's count (charged + held) never passes
  the limit, a draw refused while pages are in flight waits for one to come back, and
  the cluster's block is taken before the request and refilled by a give-back;
- one node, a counting origin (``pagesift.drill.counting``), a crawl of eight
  workers for an account of 12 pages a day: the origin's page requests (robots.txt is
  free, named in ``pagedraws``) are the 12 stored documents plus the requests that
  stored nothing and were recorded as the job's errors (free, named too), none more;
- two pairs of one cluster (a real etcd, the nodes built as ``--cluster`` builds them),
  a crawl on each of its own counted site, one account of 30 pages a day: 30 documents
  stored across the cluster, and the two origins' page requests together are those
  documents plus the jobs' recorded errors, none more.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from pathlib import Path

import pytest

from pagesift.core.cluster import placement
from pagesift.core.jobs import quota
from pagesift.core.jobs.accounts import Account, Accounts
from pagesift.core.jobs.clusterlimits import NoClusterLimits
from pagesift.core.jobs.quota import LimitExceeded
from pagesift.core.store.db import Store
from pagesift.core.util.tasks import cancel_and_wait
from pagesift.demo.site import CALENDAR_EXCLUDE
from pagesift.drill.counting import CountedSite
from pagesift.drill.fixture import Etcd
from pagesift.primary.jobs.pagedraws import Draw, PageDraws
from pagesift.v1 import jobs_pb2
from tests.helpers import Acct, in_process_node, wait_done, write_accounts
from tests.test_cluster_politeness import enforce_ownership, owners_read, registered

DAILY = Acct("daily", {"pages_per_day": 12})
HOSTS = ("127.0.0.1", "127.0.0.2")


def _accounts(tmp_path: Path, limit: int) -> Accounts:
    return Accounts.load(
        write_accounts(tmp_path / "accounts.toml", (Acct("a", {"pages_per_day": limit}),))
    )


def _charge(store: Store, name: str) -> None:
    store.write(lambda g: quota.charge(g, name, 1, time.time()))


class Block(NoClusterLimits):
    """A pair's block of ``left`` pages (the ``ClusterLimits`` port's page half)."""

    def __init__(self, left: int) -> None:
        self.left = left

    def take_page(self, account: Account, now: float) -> LimitExceeded | None:
        if self.left <= 0:
            return LimitExceeded("pages_per_day", "across the cluster")
        self.left -= 1
        return None

    def give_back_page(self, account: Account, now: float) -> None:
        self.left += 1


async def test_the_nodes_charged_and_held_pages_never_pass_the_limit(
    tmp_path: Path, store: Store
) -> None:
    draws = PageDraws(store, _accounts(tmp_path, 2))
    first, second = await draws.draw("a"), await draws.draw("a")
    assert isinstance(first, Draw) and isinstance(second, Draw)
    third = asyncio.create_task(draws.draw("a"))  # two in flight: it waits for one
    await asyncio.sleep(0.05)
    assert not third.done()
    first.settle(stored=False)  # the attempt stored nothing: its page goes back
    got = await asyncio.wait_for(third, 5)
    assert isinstance(got, Draw) and draws.held("a") == 2
    for drawn in (second, got):  # both stored: charged in the store, then settled
        _charge(store, "a")
        drawn.settle(stored=True)
    assert draws.held("a") == 0
    refused = await draws.draw("a")  # nothing in flight: refused at once
    assert isinstance(refused, LimitExceeded) and refused.limit_name == "pages_per_day"


async def test_the_clusters_page_is_taken_before_the_request_and_a_give_back_refills_it(
    tmp_path: Path, store: Store
) -> None:
    draws = PageDraws(store, _accounts(tmp_path, 100))
    block = Block(1)
    draws.cluster = block
    drawn = await draws.draw("a")
    assert isinstance(drawn, Draw) and block.left == 0
    waiting = asyncio.create_task(draws.draw("a"))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the block is spent but a page is in flight here
    drawn.settle(stored=False)
    again = await asyncio.wait_for(waiting, 5)
    assert isinstance(again, Draw) and block.left == 0
    _charge(store, "a")
    again.settle(stored=True)  # spent for good: nothing goes back
    assert block.left == 0
    refused = await draws.draw("a")
    assert isinstance(refused, LimitExceeded) and "cluster" in refused.message
    assert draws.held("a") == 0  # the refused draw held nothing


@pytest.mark.system
async def test_a_crawl_sends_no_page_request_past_the_accounts_daily_pages(
    tmp_path: Path,
) -> None:
    site = CountedSite(80, delay=0.05)
    await site.start()
    accounts = write_accounts(tmp_path / "accounts.toml", (DAILY,))
    try:
        async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
            req = jobs_pb2.StartCrawlRequest(
                url=site.root, exclude_paths=[CALENDAR_EXCLUDE], max_concurrency=8,
                sitemap=jobs_pb2.SITEMAP_MODE_SKIP, max_retries=0,
            )  # fmt: skip
            job = await node.stub.StartCrawl(req, metadata=DAILY.md)
            final = await wait_done(node.stub, job.id, DAILY.md, timeout=60)
            errors = await node.stub.GetJobErrors(
                jobs_pb2.GetJobErrorsRequest(id=job.id, page_size=1000), metadata=DAILY.md
            )
    finally:
        await site.stop()
    limit = DAILY.limits["pages_per_day"]
    assert final.state == jobs_pb2.JOB_STATE_FAILED and "pages_per_day" in final.note
    assert final.completed == limit
    pages = [p for _, p in site.counter.arrivals if p != "/robots.txt"]
    # every page request stored a document or is one of the job's errors (free)
    assert len(pages) <= limit + len(errors.errors), (len(pages), len(errors.errors))


def _page_requests(site: CountedSite) -> int:
    return sum(1 for _, path in site.counter.arrivals if path != "/robots.txt")


@pytest.mark.system
async def test_two_pairs_send_no_page_request_past_the_accounts_daily_pages(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = Acct("shared", {"pages_per_day": 30})
    accounts = write_accounts(tmp_path / "accounts.toml", (account,))
    enforce_ownership(monkeypatch, etcd, "quota")
    async with contextlib.AsyncExitStack() as stack:
        sites = []
        for host in HOSTS:
            site = CountedSite(80, host=host, delay=0.05)
            await site.start()
            stack.push_async_callback(site.stop)
            sites.append(site)
        finals, errors = [], 0
        pairs = next(  # pair k owns site k: its crawl is never left to the other
            names
            for names in itertools.permutations([f"q{k}" for k in range(8)], 2)
            if all(placement.owner(h, names) == n for h, n in zip(HOSTS, names, strict=True))
        )
        nodes = [
            await stack.enter_async_context(
                in_process_node(tmp_path / pair, accounts_file=str(accounts), pair=pair)
            )
            for pair in pairs
        ]
        for pair, node in zip(pairs, nodes, strict=True):
            registrar = await registered(f"{etcd.endpoint}/quota", pair, node)
            stack.push_async_callback(registrar.close)
            stack.push_async_callback(cancel_and_wait, asyncio.create_task(registrar.run()))
        await owners_read(nodes, 2)
        jobs = []
        for node, site in zip(nodes, sites, strict=True):
            req = jobs_pb2.StartCrawlRequest(
                url=site.root, exclude_paths=[CALENDAR_EXCLUDE], max_concurrency=8,
                sitemap=jobs_pb2.SITEMAP_MODE_SKIP, max_retries=0,
            )  # fmt: skip
            jobs.append((node, (await node.stub.StartCrawl(req, metadata=account.md)).id))
        for node, job_id in jobs:
            finals.append(await wait_done(node.stub, job_id, account.md, timeout=90))
            got = await node.stub.GetJobErrors(
                jobs_pb2.GetJobErrorsRequest(id=job_id, page_size=1000), metadata=account.md
            )
            errors += len(got.errors)
    limit = account.limits["pages_per_day"]
    assert all("pages_per_day" in f.note for f in finals), [f.note for f in finals]
    stored = sum(f.completed for f in finals)
    assert stored <= limit
    requests = sum(_page_requests(s) for s in sites)
    # every page request of either pair stored a document or is a recorded error (free)
    assert requests <= stored + errors, (requests, stored, errors)
