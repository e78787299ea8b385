"""The Firecrawl gateway, driven by Firecrawl's own Python SDK (firecrawl-py).

A real gateway (``pagesift.gateway.server.run`` on a free loopback port) in front of a
real in-process node crawling the demo site. The SDK is synchronous (requests), so its
calls run in a thread while the node and the gateway serve on the test's event loop.
Paging is made small (``PAGE_DOCS`` documents a page) so that the SDK's own paging
follows ``next`` across several pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from firecrawl import Firecrawl
from firecrawl.v2.utils.error_handler import (
    BadRequestError,
    FirecrawlError,
    PaymentRequiredError,
    RequestTimeoutError,
    UnauthorizedError,
    WebsiteNotSupportedError,
)

from pagesift.core.util.children import free_port
from pagesift.demo.site import CALENDAR_EXCLUDE, Site
from pagesift.gateway.clients import Clients
from pagesift.gateway.server import run
from tests.firecrawlerrors import names
from tests.helpers import (
    ALICE,
    SMALL,
    SOLO,
    SiteSpec,
    in_process_node,
    serve_handler,
    write_accounts,
)

PAGE_DOCS = 3
T = TypeVar("T")


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=8, slow_seconds=0.1, big_bytes=64 * 1024)


@contextlib.asynccontextmanager
async def gateway(data: Path, page_bytes: int = 10 << 20, **node_kw: Any) -> AsyncIterator[str]:
    """A node and a gateway in front of it; yields the gateway's base URL."""
    async with in_process_node(data, **node_kw) as node:
        stop = asyncio.Event()
        started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        paging: dict[str, Any] = {"page_documents": PAGE_DOCS, "page_bytes": page_bytes}
        task = asyncio.create_task(run("127.0.0.1:0", [node.address], stop, started, **paging))
        try:
            yield f"http://{await asyncio.wait_for(started, 10)}"
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


async def sdk(call: Callable[..., T], *args: Any, **kw: Any) -> T:
    """Run one blocking SDK call off the loop, bounded."""
    return await asyncio.wait_for(asyncio.to_thread(call, *args, **kw), 60)


async def done(status: Callable[[str], Any], job_id: str) -> None:
    """Poll the SDK's status call until the job is finished (bounded)."""
    for _ in range(300):
        if (await sdk(status, job_id)).status != "scraping":
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish")


def client(base: str, key: str = "anonymous") -> Firecrawl:
    return Firecrawl(api_key=key, api_url=base)


async def test_sdk_scrape_returns_the_formats_asked_for_and_firecrawl_metadata(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        doc = await sdk(
            client(base).scrape, root + "about.html", formats=["markdown", "html", "links"]
        )
    assert doc.markdown and "About" in doc.markdown
    assert doc.html and "<" in doc.html
    assert doc.links and all(link.startswith("http") for link in doc.links)
    assert doc.raw_html is None  # not asked for, not sent
    md = doc.metadata
    assert md is not None
    assert md.status_code == 200
    assert md.source_url == root + "about.html"
    assert md.title and md.language
    assert (md.content_type or "").startswith("text/html")


async def test_sdk_map_lists_the_site_as_link_objects(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        result = await sdk(client(base).map, root, limit=50, sitemap="only")
    urls = {link.url for link in result.links}
    assert root in urls or root.rstrip("/") in urls
    assert any(u.endswith("/about.html") for u in urls)
    assert len(urls) == len(result.links) <= 50


async def test_sdk_crawl_waits_and_pages_every_document_once(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        job = await sdk(
            client(base).crawl,
            root,
            limit=12,
            exclude_paths=[CALENDAR_EXCLUDE],
            poll_interval=1,
            timeout=50,
        )
        errors = await sdk(client(base).get_crawl_errors, job.id)
    assert job.status == "completed"
    assert job.completed > PAGE_DOCS  # the SDK followed `next` over several pages
    assert len(job.data) == job.completed
    sources = [d.metadata.source_url for d in job.data if d.metadata]
    assert len(sources) == len(set(sources)) == job.completed
    assert job.credits_used == job.completed and job.expires_at is not None
    for err in errors.errors:
        assert err.url and err.error


async def test_sdk_batch_scrape_returns_one_document_per_url(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    urls = [root + "about.html", root + "docs/", root + "blog/", root + "guides/"]
    async with gateway(tmp_path) as base:
        fc = client(base)
        job = await sdk(fc.batch_scrape, urls, formats=["markdown"], poll_interval=1, timeout=50)
        started = await sdk(fc.start_batch_scrape, urls[:2])
        await done(fc.get_batch_scrape_status, started.id)
        again = await sdk(fc.get_batch_scrape_status, started.id)
        errors = await sdk(fc.get_batch_scrape_errors, started.id)
    assert job.status == "completed" and job.completed == len(urls)
    assert {d.metadata.source_url for d in job.data if d.metadata} == set(urls)
    assert all(d.markdown for d in job.data)
    assert again.status == "completed"
    assert {d.metadata.source_url for d in again.data if d.metadata} == set(urls[:2])
    assert errors.errors == []
    async with gateway(tmp_path / "again") as base, aiohttp.ClientSession() as http:
        batch = await sdk(client(base).start_batch_scrape, urls[:1])
        async with http.get(f"{base}/v2/crawl/{batch.id}") as resp:
            assert resp.status == 404  # a batch is not a crawl


async def test_sdk_cancel_stops_a_running_crawl_and_409s_a_finished_one(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        fc = client(base)
        started = await sdk(fc.start_crawl, root, limit=5000, delay=1, max_concurrency=1)
        assert await sdk(fc.cancel_crawl, started.id) is True
        status = await sdk(fc.get_crawl_status, started.id)
        assert status.status == "cancelled"
        assert await sdk(fc.cancel_crawl, started.id) is True  # idempotent
        small = await sdk(fc.start_crawl, root, limit=1)
        await done(fc.get_crawl_status, small.id)
        assert await sdk(fc.cancel_crawl, small.id) is False  # 409: it completed
        batch = await sdk(fc.start_batch_scrape, [root + "about.html"])
        await done(fc.get_batch_scrape_status, batch.id)
        with pytest.raises(FirecrawlError) as err:
            await sdk(fc.cancel_batch_scrape, batch.id)
        assert err.value.status_code == 409


async def test_unknown_body_keys_are_400_naming_them(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        cases = [
            ("/v2/scrape", {"url": root, "bogusKey": 1}, "bogusKey"),
            ("/v2/crawl", {"url": root, "scrapeOptions": {"nope": True}}, "scrapeOptions.nope"),
            ("/v2/map", {"url": root, "maxDepth": 2}, "maxDepth"),
            ("/v2/batch/scrape", {"urls": [root], "extra": []}, "extra"),
        ]
        for path, body, named in cases:
            async with http.post(base + path, json=body) as resp:
                answer = await resp.json()
            assert resp.status == 400, (path, answer)
            assert answer["success"] is False
            assert f"'{named}'" in answer["error"], answer
            assert named in names(answer), answer


async def test_options_pagesift_cannot_honour_are_400_not_dropped(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        fc = client(base)
        # no model endpoint on this node: the node refuses the model's formats by field
        with pytest.raises(BadRequestError, match=r"FORMAT_SUMMARY|model endpoint"):
            await sdk(fc.scrape, root, formats=["summary"])
        with pytest.raises(BadRequestError, match="proxy"):
            await sdk(fc.scrape, root, proxy="stealth")
        # a crawl's prompt is forwarded; the node without a model endpoint refuses it
        with pytest.raises(BadRequestError, match=r"prompt: .*model endpoint"):
            await sdk(fc.start_crawl, root, prompt="only the blog")
        with pytest.raises(BadRequestError, match=r"scrapeOptions\.actions"):
            await sdk(fc.start_crawl, root, scrape_options={"actions": [{"type": "scrape"}]})


async def test_unknown_job_is_404(tmp_path: Path) -> None:
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        paths = ["/v2/crawl/no-such-job", "/v2/batch/scrape/no-such-job"]
        paths += [f"/v2/crawl/{uuid.uuid4()}", f"/v2/batch/scrape/{uuid.uuid4()}/errors"]
        paths += [f"/v2/crawl/{uuid.uuid4()}/errors"]
        for path in paths:
            async with http.get(base + path) as resp:
                answer = await resp.json()
            assert resp.status == 404, answer
            assert answer["success"] is False and answer["error"]


async def test_a_bad_api_key_is_401_and_a_good_one_scrapes(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with gateway(tmp_path / "data", accounts_file=str(accounts)) as base:
        with pytest.raises(UnauthorizedError):
            await sdk(client(base, "psk_test_wrong_0123456789").scrape, root + "about.html")
        doc = await sdk(client(base, ALICE.key).scrape, root + "about.html")
        assert doc.markdown
        async with aiohttp.ClientSession() as http, http.get(base + "/healthz") as resp:
            assert resp.status == 200
            assert (await resp.json())["ok"] is True


async def test_account_limits_are_402_for_quota_and_429_with_retry_after_for_concurrency(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with gateway(tmp_path / "data", accounts_file=str(accounts)) as base:
        urls = [root + p for p in ("about.html", "docs/", "blog/", "guides/")]
        with pytest.raises(PaymentRequiredError):  # max_batch_urls = 3
            await sdk(client(base, SMALL.key).start_batch_scrape, urls)
        solo = client(base, SOLO.key)
        first = await sdk(solo.start_crawl, root, limit=5000, delay=1, max_concurrency=1)
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {SOLO.key}"}
            async with http.post(base + "/v2/crawl", json={"url": root}, headers=headers) as r:
                answer = await r.json()
                assert r.status == 429, answer  # max_concurrent_jobs = 1
                assert int(r.headers["Retry-After"]) >= 1
                assert answer["success"] is False and answer["code"] == "RATE_LIMIT_EXCEEDED"
        assert await sdk(solo.cancel_crawl, first.id) is True


async def test_the_address_guard_applies_through_the_gateway(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path, allow_private_networks=False) as base:
        with pytest.raises(WebsiteNotSupportedError) as err:  # 403
            await sdk(client(base).scrape, root + "about.html")
    assert err.value.status_code == 403


async def test_status_paging_honours_limit_and_bodies_are_bounded(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        job = await sdk(
            client(base).crawl, root, limit=6, exclude_paths=[CALENDAR_EXCLUDE],
            poll_interval=1, timeout=50,
        )  # fmt: skip
        seen: list[str] = []
        url: str | None = f"{base}/v2/crawl/{job.id}?limit=2"
        while url:
            async with http.get(url) as resp:
                body = await resp.json()
            assert resp.status == 200 and len(body["data"]) <= 2
            seen += [d["metadata"]["sourceURL"] for d in body["data"]]
            url = body.get("next")
            assert url is None or url.endswith("&limit=2")
        assert len(seen) == len(set(seen)) == job.completed
        big = b'{"url": "' + b"x" * (9 * 1024 * 1024) + b'"}'
        async with http.post(base + "/v2/scrape", data=big) as resp:
            assert resp.status == 413
            assert (await resp.json())["success"] is False
        padded = {"url": root, "headers": {"X-Pad": "x" * 100_000}, "bogus": 1}
        async with http.post(base + "/v2/scrape", json=padded) as resp:  # parsed off-loop
            assert resp.status == 400 and "'bogus'" in (await resp.json())["error"]
        async with http.post(base + "/v2/scrape", data=b"[1, 2]") as resp:
            assert resp.status == 400 and "object" in (await resp.json())["error"]


async def test_the_gateway_command_serves_in_front_of_a_node(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with in_process_node(tmp_path) as node:
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pagesift.cli", "gateway",
            "--listen", f"127.0.0.1:{port}", "--server", f"127.0.0.1:1,{node.address}",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:

                async def healthy() -> bool:
                    try:
                        async with http.get(base + "/healthz") as resp:
                            return resp.status == 200
                    except aiohttp.ClientError:
                        return False

                for _ in range(200):
                    if await healthy():
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("the gateway did not become healthy")
            doc = await sdk(client(base).scrape, root + "about.html")
            assert doc.markdown
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)
        assert proc.returncode == 0, await proc.stderr.read() if proc.stderr else b""


async def test_a_scrape_past_its_timeout_is_408(tmp_path: Path) -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response(text="<html><body>late</body></html>", content_type="text/html")

    async with serve_handler(slow) as port, gateway(tmp_path) as base:
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError) as err:
            await sdk(client(base).scrape, f"http://127.0.0.1:{port}/", timeout=500)
    assert err.value.status_code == 408
    assert time.monotonic() - started < 4.5  # bounded by the request's timeout, not the page


async def test_a_client_evicted_while_in_use_is_closed_after_its_last_request() -> None:
    clients = Clients(["127.0.0.1:1"], limit=1)
    async with clients.use("key-a") as a:
        a.stub("127.0.0.1:1")  # a channel, opened lazily (nothing listens there)
        async with clients.use("key-b") as b:
            assert b is not a and len(clients) == 2  # a: evicted, still in use
            assert a.addresses == ["127.0.0.1:1"]
        await asyncio.sleep(0)
        assert len(clients) == 2  # b stays cached; a is still in use
    for _ in range(100):  # a's close runs as a task once its request is done
        if len(clients) == 1:
            break
        await asyncio.sleep(0.01)
    assert len(clients) == 1
    async with clients.use("key-b") as again:
        assert again is b  # the cached one
    async with clients.use("key-a") as fresh:
        assert fresh is not a  # a new client for the evicted key
    await clients.close()
    assert len(clients) == 0


async def test_a_page_over_its_byte_cap_is_cut_and_the_sdk_pages_on(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path, page_bytes=1) as base, aiohttp.ClientSession() as http:
        fc = client(base)
        job = await sdk(
            fc.crawl, root, limit=5, exclude_paths=[CALENDAR_EXCLUDE], poll_interval=1,
            timeout=50,
        )  # fmt: skip
        async with http.get(f"{base}/v2/crawl/{job.id}") as resp:
            first = await resp.json()
    assert len(first["data"]) == 1 and first["next"].endswith("?skip=1")  # cut at 1 byte
    assert job.status == "completed" and len(job.data) == job.completed > 1
    sources = {d.metadata.source_url for d in job.data if d.metadata}
    assert len(sources) == job.completed


async def test_healthz_is_503_while_no_primary_answers() -> None:
    stop = asyncio.Event()
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run("127.0.0.1:0", ["127.0.0.1:1"], stop, started))
    try:
        base = f"http://{await asyncio.wait_for(started, 10)}"
        async with aiohttp.ClientSession() as http, http.get(base + "/healthz") as resp:
            assert resp.status == 503
            assert await resp.json() == {"ok": False, "primary": None}
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
