"""One job, two APIs: a job started over gRPC is read over HTTP and the reverse.

A real in-process node with an accounts file, the gateway app in front of it
(``tests/test_gateway_contract.serve_gateway``) and ``JobClient`` on the node's own
address. The gateway keeps nothing of a job, so what HTTP shows must be what gRPC holds:
the same documents in the same order (``pagesift.core.jobs.firecrawlshape.document`` of each
gRPC document equals the HTTP one), the same errors, cancel on one side seen on the
other; and the account isolation holds across both (another account's key sees 404 over
HTTP and NOT_FOUND over gRPC, and its cancel changes nothing). A job started over
Firecrawl's v1 routes is the same job over v2 and gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from pagesift.client import JobClient
from pagesift.core.jobs.firecrawlshape import document
from pagesift.demo.site import CALENDAR_EXCLUDE, Site
from pagesift.v1 import jobs_pb2
from tests.helpers import ALICE, BOB, TERMINAL, SiteSpec, crawl, in_process_node, write_accounts
from tests.test_gateway_contract import Answer, ask, assert_error, finished, serve_gateway


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=8, slow_seconds=0.1, big_bytes=64 * 1024)


@contextlib.asynccontextmanager
async def pair_of_apis(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """A node with the test accounts and a gateway in front; yields (gateway base URL,
    the node's gRPC address)."""
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with (
        in_process_node(tmp_path / "data", accounts_file=str(accounts)) as node,
        serve_gateway([node.address]) as base,
    ):
        yield base, node.address


async def grpc_documents(client: JobClient, job_id: str) -> list[jobs_pb2.Document]:
    return [d async for d in client.iter_documents(job_id)]


async def grpc_finished(client: JobClient, job_id: str) -> jobs_pb2.GetJobResponse:
    for _ in range(600):
        job = await client.get_job(job_id, status_only=True)
        if job.state in TERMINAL:
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish")


async def http_documents(http: aiohttp.ClientSession, url: str, key: str) -> list[object]:
    """Every document of a status URL, following ``next`` (bounded)."""
    docs: list[object] = []
    page: str | None = url + "?limit=4"  # several pages
    for _ in range(100):
        if page is None:
            return docs
        a = await ask(http, "GET", page, key=key)
        assert a.status == 200, a.body
        docs += a.body["data"]
        page = a.body.get("next")
    raise AssertionError(f"{url}: paging did not end")


def slow_crawl(root: str) -> jobs_pb2.StartCrawlRequest:
    return jobs_pb2.StartCrawlRequest(url=root, limit=500, delay=1, max_concurrency=1)


async def assert_hidden_from_bob(http: aiohttp.ClientSession, base: str, route: str) -> None:
    """Every job route of ``route`` (``crawl/ID`` or ``batch/scrape/ID``) is 404 for
    BOB's key."""
    for method, tail in (("GET", ""), ("GET", "/errors"), ("DELETE", "")):
        a: Answer = await ask(http, method, f"{base}/v2/{route}{tail}", key=BOB.key)
        assert_error(a, 404, "NOT_FOUND")


async def test_a_job_started_over_grpc_is_read_paged_and_cancelled_over_http(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with (
        pair_of_apis(tmp_path) as (base, address),
        JobClient(address, api_key=ALICE.key) as alice,
        aiohttp.ClientSession() as http,
    ):
        job_id = await alice.start_crawl(crawl(root))
        url = f"{base}/v2/crawl/{job_id}"
        done = await finished(http, url, ALICE.key)
        assert done.body["status"] == "completed"
        over_grpc = await grpc_documents(alice, job_id)
        assert await http_documents(http, url, ALICE.key) == [document(d) for d in over_grpc]
        assert done.body["completed"] == len(over_grpc) > 4

        a = await ask(http, "GET", f"{url}/errors", key=ALICE.key)
        failed = await alice.errors(job_id)
        robots = "robots_disallowed"  # Firecrawl lists those apart, in robotsBlocked only
        pairs = {(e.url, e.code) for e in failed.errors if e.url and e.code != robots}
        assert {(e["url"], e["code"]) for e in a.body["errors"]} == pairs
        blocked = {e.url for e in failed.errors if e.code == robots} | set(failed.robots_blocked)
        assert set(a.body["robotsBlocked"]) == blocked and blocked
        await assert_hidden_from_bob(http, base, f"crawl/{job_id}")

        running = await alice.start_crawl(slow_crawl(root))
        await assert_hidden_from_bob(http, base, f"crawl/{running}")
        job = await alice.get_job(running, status_only=True)
        assert job.state == jobs_pb2.JOB_STATE_SCRAPING  # BOB's DELETE changed nothing
        a = await ask(http, "DELETE", f"{base}/v2/crawl/{running}", key=ALICE.key)
        assert a.status == 200 and a.body == {"success": True, "status": "cancelled"}
        job = await alice.get_job(running, status_only=True)
        assert job.state == jobs_pb2.JOB_STATE_CANCELLED

        batch = await alice.start_batch(
            jobs_pb2.StartBatchScrapeRequest(urls=[root + "about.html", root + "docs/"])
        )
        url = f"{base}/v2/batch/scrape/{batch.id}"
        assert (await finished(http, url, ALICE.key)).body["completed"] == 2
        over_grpc = await grpc_documents(alice, batch.id)
        assert await http_documents(http, url, ALICE.key) == [document(d) for d in over_grpc]
        a = await ask(http, "GET", f"{base}/v2/crawl/{batch.id}", key=ALICE.key)
        assert_error(a, 404, "NOT_FOUND")  # a batch, not a crawl
        await assert_hidden_from_bob(http, base, f"batch/scrape/{batch.id}")


async def test_a_job_started_over_http_is_read_and_cancelled_over_grpc(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with (
        pair_of_apis(tmp_path) as (base, address),
        JobClient(address, api_key=ALICE.key) as alice,
        JobClient(address, api_key=BOB.key) as bob,
        aiohttp.ClientSession() as http,
    ):
        body = {
            "url": root,
            "excludePaths": [CALENDAR_EXCLUDE],
            "scrapeOptions": {"formats": ["markdown", "links"], "onlyMainContent": False},
        }
        started = await ask(http, "POST", base + "/v2/crawl", body, key=ALICE.key)
        assert started.status == 200, started.body
        job_id = started.body["id"]
        job = await grpc_finished(alice, job_id)
        assert job.state == jobs_pb2.JOB_STATE_COMPLETED and job.kind == jobs_pb2.JOB_KIND_CRAWL
        over_grpc = await grpc_documents(alice, job_id)
        assert len(over_grpc) == job.completed > 4
        assert all(d.markdown and not d.html for d in over_grpc)  # the formats asked for
        assert any(d.links for d in over_grpc)
        over_http = await http_documents(http, started.body["url"], ALICE.key)
        assert over_http == [document(d) for d in over_grpc]

        for call in (bob.get_job(job_id), bob.errors(job_id), bob.cancel(job_id)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.NOT_FOUND

        slow = {"url": root, "limit": 500, "delay": 1, "maxConcurrency": 1}
        running = (await ask(http, "POST", base + "/v2/crawl", slow, key=ALICE.key)).body
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bob.cancel(running["id"])
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert await alice.cancel(running["id"]) == jobs_pb2.JOB_STATE_CANCELLED
        a = await ask(http, "GET", running["url"], key=ALICE.key)
        assert a.body["status"] == "cancelled"

        urls = [root + "about.html", root + "blog/", root + "guides/"]
        a = await ask(http, "POST", base + "/v2/batch/scrape", {"urls": urls}, key=ALICE.key)
        batch = await grpc_finished(alice, a.body["id"])
        assert batch.kind == jobs_pb2.JOB_KIND_BATCH_SCRAPE and batch.completed == 3
        over_grpc = await grpc_documents(alice, a.body["id"])
        assert {d.url for d in over_grpc} == set(urls)
        assert await http_documents(http, a.body["url"], ALICE.key) == [
            document(d) for d in over_grpc
        ]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bob.get_job(a.body["id"])
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_job_started_over_v1_is_the_same_job_over_v2_and_grpc_for_its_account_only(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with (
        pair_of_apis(tmp_path) as (base, address),
        JobClient(address, api_key=ALICE.key) as alice,
        aiohttp.ClientSession() as http,
    ):
        body = {"url": root, "excludePaths": [CALENDAR_EXCLUDE], "limit": 10}
        started = await ask(http, "POST", base + "/v1/crawl", body, key=ALICE.key)
        assert started.status == 200, started.body
        job_id = started.body["id"]
        assert started.body["url"] == f"{base}/v1/crawl/{job_id}"
        job = await grpc_finished(alice, job_id)
        assert job.state == jobs_pb2.JOB_STATE_COMPLETED and job.completed == 10
        over_grpc = [document(d) for d in await grpc_documents(alice, job_id)]
        assert await http_documents(http, started.body["url"], ALICE.key) == over_grpc
        assert await http_documents(http, f"{base}/v2/crawl/{job_id}", ALICE.key) == over_grpc
        for version in ("v1", "v2"):
            for method, tail in (("GET", ""), ("GET", "/errors"), ("DELETE", "")):
                url = f"{base}/{version}/crawl/{job_id}{tail}"
                assert_error(await ask(http, method, url, key=BOB.key), 404, "NOT_FOUND")
