"""Starting a job through the gateway: Firecrawl's ``maxDiscoveryDepth: 0`` and its
``x-idempotency-key`` header, driven by firecrawl-py (v2 and its V1 client).

A real gateway in front of a real in-process node crawling the demo site (the helpers
of tests/test_gateway.py). ``maxDiscoveryDepth: 0`` is the start page alone (pagesift's
own ``max_depth`` 0 means unlimited, so the gateway maps it onto ``limit`` 1 with the
sitemap skipped). ``x-idempotency-key``, which the SDKs send on crawl and batch starts,
is the start's AIP-155 key: a retry with the same key and body answers the same job,
the same key with another body is a 409 in Firecrawl's shape, and each account's keys
are its own.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
from firecrawl import V1FirecrawlApp
from firecrawl.v2.utils.error_handler import FirecrawlError

from pagesift.demo.site import CALENDAR_EXCLUDE, Site
from pagesift.gateway import v1translate
from pagesift.gateway.v1models import CrawlRequestV1
from pagesift.v1 import jobs_pb2
from tests.helpers import ALICE, BOB, SiteSpec, write_accounts
from tests.test_gateway import client, gateway, sdk


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=8, slow_seconds=0.05, big_bytes=16 * 1024)


def v1(base: str, key: str = "anonymous") -> V1FirecrawlApp:
    return V1FirecrawlApp(api_key=key, api_url=base)


# ---------------------------------------------------------------- maxDiscoveryDepth: 0


async def test_max_discovery_depth_zero_crawls_the_start_page_alone_over_v2_and_v1(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    wait: dict[str, Any] = {"limit": 6, "poll_interval": 1}
    async with gateway(tmp_path) as base:
        fc = client(base)
        job = await sdk(fc.crawl, root, max_discovery_depth=0, timeout=50, **wait)
        old = await sdk(v1(base).crawl_url, root, max_discovery_depth=0, **wait)
        deeper = await sdk(  # depth 1 is the start page and the pages it links to
            fc.crawl, root, max_discovery_depth=1, exclude_paths=[CALENDAR_EXCLUDE], **wait
        )
    assert job.status == "completed" and (job.total, job.completed) == (1, 1)
    assert [d.metadata.source_url for d in job.data if d.metadata] == [root]
    assert old.status == "completed" and (old.total, old.completed) == (1, 1)
    assert [d.metadata["sourceURL"] for d in old.data if d.metadata] == [root]
    assert deeper.status == "completed" and deeper.completed > 1


def test_v1s_max_discovery_depth_zero_is_v2s() -> None:
    body = {"url": "https://example.com/", "maxDiscoveryDepth": 0, "limit": 50}
    req = v1translate.crawl_request(CrawlRequestV1.model_validate(body))
    assert (req.limit, req.sitemap) == (1, jobs_pb2.SITEMAP_MODE_SKIP)


# ---------------------------------------------------------------- x-idempotency-key


async def test_a_start_retried_with_its_idempotency_key_is_the_same_job_on_every_start_route(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    urls = [root + "about.html", root + "docs/"]
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        fc, old = client(base), v1(base)
        key = str(uuid.uuid4())  # the SDK sends it as x-idempotency-key
        batches = [await sdk(fc.start_batch_scrape, urls, idempotency_key=key) for _ in "ab"]
        assert batches[0].id == batches[1].id
        fresh = await sdk(fc.start_batch_scrape, urls, idempotency_key=str(uuid.uuid4()))
        unkeyed = [(await sdk(fc.start_batch_scrape, urls)).id for _ in "ab"]
        assert len({batches[0].id, fresh.id, *unkeyed}) == 4  # no key: a job per call

        v1key = str(uuid.uuid4())
        v1_batches = [await sdk(old.async_batch_scrape_urls, urls, idempotency_key=v1key)]
        v1_batches.append(await sdk(old.async_batch_scrape_urls, urls, idempotency_key=v1key))
        assert v1_batches[0].id == v1_batches[1].id != batches[0].id
        crawl_key = str(uuid.uuid4())
        v1_crawls = [
            await sdk(old.async_crawl_url, root, limit=2, idempotency_key=crawl_key) for _ in "ab"
        ]
        assert v1_crawls[0].id == v1_crawls[1].id

        body = {"url": root, "limit": 2}  # the v2 SDK sends no key on a crawl: raw HTTP
        headers = {"x-idempotency-key": str(uuid.uuid4())}
        ids = []
        for _ in "ab":
            async with http.post(f"{base}/v2/crawl", json=body, headers=headers) as resp:
                assert resp.status == 200
                ids.append((await resp.json())["id"])
        assert ids[0] == ids[1] != v1_crawls[0].id
        status = await sdk(fc.get_crawl_status, ids[0])
    assert status.total >= 1  # one job, readable as any other


async def test_an_idempotency_key_reused_with_another_body_is_a_409_naming_the_key(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    async with gateway(tmp_path / "data", accounts_file=str(accounts)) as base:
        alice, bob = client(base, ALICE.key), client(base, BOB.key)
        key = str(uuid.uuid4())
        first = await sdk(alice.start_batch_scrape, [root + "about.html"], idempotency_key=key)
        with pytest.raises(FirecrawlError) as err:
            await sdk(alice.start_batch_scrape, [root + "docs/"], idempotency_key=key)
        assert err.value.status_code == 409
        body = err.value.response.json() if err.value.response is not None else {}
        assert body["success"] is False and body["code"] == "CONFLICT"
        assert "idempotency_key" in body["error"] and first.id in body["error"]
        theirs = await sdk(bob.start_batch_scrape, [root + "docs/"], idempotency_key=key)
        assert theirs.id != first.id  # a key is the caller's own

        crawl_key = str(uuid.uuid4())
        old = v1(base, ALICE.key)
        await sdk(old.async_crawl_url, root, limit=2, idempotency_key=crawl_key)
        with pytest.raises(requests.HTTPError) as http_err:  # the V1 client's error
            await sdk(old.async_crawl_url, root, limit=3, idempotency_key=crawl_key)
        assert http_err.value.response is not None
        assert http_err.value.response.status_code == 409
