"""Firecrawl's ``appendToId`` through the gateway: the mapping as tables, then firecrawl-py.

The pure part: ``translate.append_arguments`` (what reaches ``JobClient.append_batch``:
scrape options only when the body sets some, ``webhook`` refused, the idempotency key)
and the error table's rows for a job that takes no URLs. Then the SDK's own
``start_batch_scrape``/``batch_scrape`` with ``append_to_id=`` against a real gateway in
front of a real node fetching a loopback site whose ``/hold`` page waits for the test.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from firecrawl.v2.utils.error_handler import BadRequestError, FirecrawlError

from pagesift.gateway import translate
from pagesift.gateway.httperrors import HttpError, from_rpc
from pagesift.gateway.models import BatchScrapeRequest
from pagesift.v1 import jobs_pb2
from tests.helpers import ALICE, BOB, serve_handler, write_accounts
from tests.test_gateway import client, done, gateway, sdk

JOB = str(uuid.uuid4())
URL = "https://example.com/"


def test_an_append_maps_onto_append_batch_with_options_only_when_the_body_sets_them() -> None:
    bare = BatchScrapeRequest.model_validate({"urls": [URL], "appendToId": JOB})
    assert translate.append_arguments(bare, "key-1") == {
        "job_id": JOB,
        "urls": [URL],
        "ignore_invalid_urls": False,
        "options": None,  # the job's own
        "max_concurrency": 0,
        "idempotency_key": "key-1",
    }
    full = BatchScrapeRequest.model_validate(
        {"urls": [URL], "appendToId": JOB, "formats": ["html"], "maxConcurrency": 3,
         "ignoreInvalidURLs": True}
    )  # fmt: skip
    kw = translate.append_arguments(full, "")
    assert kw["options"] == translate.scrape_options(full)  # as the job's start maps them
    assert list(kw["options"].formats) == [jobs_pb2.FORMAT_HTML]
    assert (kw["max_concurrency"], kw["ignore_invalid_urls"]) == (3, True)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"webhook": "https://hooks.example.com/x"}, "webhook"),
        ({"zeroDataRetention": True}, "zeroDataRetention"),
    ],
)
def test_an_append_refuses_by_name_what_it_cannot_honour(body: dict[str, Any], named: str) -> None:
    r = BatchScrapeRequest.model_validate({"urls": [URL], "appendToId": JOB, **body})
    with pytest.raises(HttpError) as err:
        translate.append_arguments(r, "")
    assert err.value.status == 400 and err.value.error.startswith(f"{named}:")


def test_a_start_never_drops_append_to_id() -> None:
    r = BatchScrapeRequest.model_validate({"urls": [URL], "appendToId": JOB})
    with pytest.raises(HttpError) as err:  # the v1 route maps its body through here
        translate.batch_request(r)
    assert err.value.status == 400 and err.value.error.startswith("appendToId:")


@pytest.mark.parametrize(
    ("metadata", "status", "code"),
    [
        ({"kind": "batch", "state": "cancelled"}, 409, "CONFLICT"),
        ({"kind": "batch", "state": "failed"}, 409, "CONFLICT"),
        ({"kind": "crawl", "state": "scraping"}, 404, "NOT_FOUND"),  # unknown as a batch
    ],
)
def test_a_job_that_takes_no_urls_is_409_or_404_for_a_crawl(
    metadata: dict[str, str], status: int, code: str
) -> None:
    err = from_rpc(grpc.StatusCode.FAILED_PRECONDITION, "JOB_NOT_APPENDABLE", metadata, "no")
    assert (err.status, err.code) == (status, code)


# ---------------------------------------------------------------- firecrawl-py


@pytest.fixture
async def held_site() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A loopback site: ``/hold`` answers once the event is set, any other path at once."""
    gate = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/hold":
            await asyncio.wait_for(gate.wait(), 30)
        name = request.path.strip("/") or "home"
        html = f"<html><head><title>{name}</title></head><body><p>{name} text</p></body></html>"
        return web.Response(text=html, content_type="text/html")

    async with serve_handler(handler) as port:
        yield f"http://127.0.0.1:{port}/", gate


def sources(job: Any) -> list[str]:
    return [d.metadata.source_url for d in job.data]


async def test_sdk_appends_to_a_running_batch_and_its_waiter_gets_every_page_in_order(
    tmp_path: Path, held_site: tuple[str, asyncio.Event]
) -> None:
    root, gate = held_site
    async with gateway(tmp_path) as base:
        fc = client(base)
        first = await sdk(fc.start_batch_scrape, [root + "hold", root + "a"], max_concurrency=1)
        added = await sdk(fc.start_batch_scrape, [root + "b", root + "c"], append_to_id=first.id)
        assert (added.id, added.url) == (first.id, first.url)  # that job's id and url
        status = await sdk(fc.get_batch_scrape_status, first.id)
        assert (status.status, status.total) == ("scraping", 4)
        gate.set()
        await done(fc.get_batch_scrape_status, first.id)
        job = await sdk(fc.get_batch_scrape_status, first.id)  # the SDK pages on by itself
        again = await sdk(  # appendToId with the SDK's own waiter, on a completed job
            fc.batch_scrape, [root + "d"], append_to_id=first.id, poll_interval=1, wait_timeout=50
        )
    assert job.status == "completed" and job.total == job.completed == 4
    assert sources(job) == [root + p for p in ("hold", "a", "b", "c")]
    assert again.status == "completed" and again.total == 5
    assert sources(again) == [root + p for p in ("hold", "a", "b", "c", "d")]


async def test_sdk_append_retried_with_its_idempotency_key_adds_once_and_refusals_are_firecrawls(
    tmp_path: Path, held_site: tuple[str, asyncio.Event]
) -> None:
    root, gate = held_site
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    async with gateway(tmp_path / "data", accounts_file=str(accounts)) as base:
        alice, bob = client(base, ALICE.key), client(base, BOB.key)
        job = await sdk(alice.start_batch_scrape, [root + "hold"], max_concurrency=1)
        for _ in range(2):
            await sdk(
                alice.start_batch_scrape, [root + "a"], append_to_id=job.id,
                idempotency_key="append-a",
            )  # fmt: skip
        assert (await sdk(alice.get_batch_scrape_status, job.id)).total == 2
        with pytest.raises(FirecrawlError) as err:  # someone else's job: unknown
            await sdk(bob.start_batch_scrape, [root + "b"], append_to_id=job.id)
        assert err.value.status_code == 404
        with pytest.raises(BadRequestError) as bad:  # the job's options stay its own
            await sdk(alice.start_batch_scrape, [root + "b"], append_to_id=job.id, formats=["html"])
        assert "options" in str(bad.value)
        crawl = await sdk(alice.start_crawl, root + "hold", limit=1)
        with pytest.raises(FirecrawlError) as err:  # a crawl is no batch
            await sdk(alice.start_batch_scrape, [root + "b"], append_to_id=crawl.id)
        assert err.value.status_code == 404
        assert await sdk(alice.cancel_batch_scrape, job.id) is True
        with pytest.raises(FirecrawlError) as err:  # a cancelled batch takes no URLs
            await sdk(alice.start_batch_scrape, [root + "b"], append_to_id=job.id)
        assert err.value.status_code == 409
        gate.set()
        await sdk(alice.cancel_crawl, crawl.id)
