"""The WebSocket watch of a crawl (``GET /v2/crawl/{id}`` upgraded), driven by Firecrawl's
own SDK watchers (``Firecrawl.watcher``, ``AsyncFirecrawl.watcher``) and by a raw aiohttp
client (the JS SDK's way: the key as the subprotocol), against a real gateway in front of
a real in-process node crawling the demo site (``tests.test_gateway.gateway``, whose
status pages, and so whose catchups, hold ``PAGE_DOCS`` documents).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType
from firecrawl import AsyncFirecrawl

from pagesift.client.firecrawl import document
from pagesift.demo.site import CALENDAR_EXCLUDE, Site
from pagesift.gateway.watch import (
    catchup,
    close_code,
    close_reason,
    is_upgrade,
    key_of,
    stalled,
)
from pagesift.v1 import jobs_pb2
from tests.helpers import ALICE, BOB, SiteSpec, write_accounts
from tests.test_gateway import PAGE_DOCS, client, gateway, sdk

WRONG_KEY = "psk_test_wrong_0123456789"


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=8, slow_seconds=0.1, big_bytes=64 * 1024)


def ws_url(base: str, job_id: str, version: str = "v2") -> str:
    return base.replace("http://", "ws://", 1) + f"/{version}/crawl/{job_id}"


async def read_all(
    ws: aiohttp.ClientWebSocketResponse, timeout: float = 30, stop_after: int = 0
) -> tuple[list[dict[str, Any]], str]:
    """Every text message until the server closes (or ``stop_after`` messages), and the
    close frame's reason."""
    out: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while True:
            msg = await ws.receive()
            if msg.type == WSMsgType.TEXT:
                out.append(json.loads(msg.data))
                if stop_after and len(out) >= stop_after:
                    return out, ""
            elif msg.type == WSMsgType.CLOSE:
                return out, str(msg.extra or "")
            elif msg.type in (WSMsgType.CLOSED, WSMsgType.CLOSING, WSMsgType.ERROR):
                return out, ""


def sources(docs: list[dict[str, Any]]) -> list[str]:
    return [d["metadata"]["sourceURL"] for d in docs]


def streamed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The documents of a watch: the catchup's, then each ``document`` message's."""
    docs: list[dict[str, Any]] = []
    for m in messages:
        if m["type"] == "catchup":
            docs += m["data"]["data"]
        elif m["type"] == "document":
            docs.append(m["data"])
    return docs


async def every_source(base: str, job_id: str, key: str = "anonymous") -> set[str]:
    status = await sdk(client(base, key).get_crawl_status, job_id)
    assert status.status == "completed"
    found = [d.metadata.source_url for d in status.data if d.metadata]
    assert len(found) == len(set(found)) == status.completed
    return {s for s in found if s}


async def slow_crawl(base: str, root: str, key: str = "anonymous") -> str:
    """A crawl that runs for a few seconds (one page at a time, 0.3 s apart: the SDK's
    own types take whole seconds only, so it is started over HTTP)."""
    body = {"url": root, "limit": 10, "excludePaths": [CALENDAR_EXCLUDE], "delay": 0.3}
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        body["maxConcurrency"] = 1
        async with http.post(f"{base}/v2/crawl", json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            return str((await resp.json())["id"])


async def test_the_sdk_watcher_streams_every_page_once_then_done(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        fc = client(base)
        job_id = await slow_crawl(base, root)
        watcher = fc.watcher(job_id, kind="crawl", poll_interval=30, timeout=60)
        docs: list[dict[str, Any]] = []
        dones: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        snapshots: list[Any] = []
        ended = threading.Event()
        watcher.add_event_listener("document", lambda e: docs.append(e["data"]))
        watcher.add_event_listener("done", lambda e: (dones.append(e), ended.set()))
        watcher.add_event_listener("error", lambda e: (errors.append(e), ended.set()))
        watcher.add_listener(snapshots.append)
        watcher.start()
        try:
            assert await asyncio.wait_for(asyncio.to_thread(ended.wait, 60), 65)
        finally:
            await asyncio.to_thread(watcher.stop)
        expected = await every_source(base, job_id)
    assert errors == [] and len(dones) == 1
    got = sources(docs)
    assert len(got) == len(set(got)) and set(got) == expected
    final = snapshots[-1]  # from `done`, with the job's final counters
    assert final.status == "completed" and final.completed == len(expected)
    assert len(final.data) == len(expected)


async def test_the_async_sdk_watcher_ends_with_every_page_once(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        job_id = await slow_crawl(base, root)
        afc = AsyncFirecrawl(api_key="anonymous", api_url=base)
        snapshots = []
        async with asyncio.timeout(60):
            async for snapshot in afc.watcher(job_id, kind="crawl", poll_interval=30, timeout=60):
                snapshots.append(snapshot)
        expected = await every_source(base, job_id)
    final = snapshots[-1]
    assert final.status == "completed"
    got = [d.metadata.source_url for d in final.data if d.metadata]
    assert len(got) == len(set(got)) and set(got) == expected


async def test_the_key_as_subprotocol_is_accepted_and_answered_and_a_wrong_key_is_an_error(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with gateway(tmp_path / "data", accounts_file=str(accounts)) as base:
        job = await sdk(
            client(base, ALICE.key).crawl, root, limit=5, exclude_paths=[CALENDAR_EXCLUDE],
            poll_interval=1, timeout=50,
        )  # fmt: skip
        url = ws_url(base, job.id)
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(url, protocols=(ALICE.key,)) as ws:
                assert ws.protocol == ALICE.key  # a browser fails a handshake without it
                messages, reason = await read_all(ws)
                assert ws.close_code == 1000
            assert messages[0]["type"] == "catchup"
            assert messages[-1]["type"] == "done" and json.loads(reason) == {"type": "done"}
            got = sources(streamed(messages))
            assert len(got) == len(set(got)) == job.completed
            refusals = [
                {"protocols": (WRONG_KEY,)},
                {"headers": {"Authorization": f"Bearer {WRONG_KEY}"}},
                {"headers": {"Authorization": f"Basic {ALICE.key}"}},
                {},  # no key: anonymous, which a node with accounts refuses
            ]
            for kw in refusals:
                async with http.ws_connect(url, **kw) as ws:
                    messages, reason = await read_all(ws)
                    assert ws.close_code == 3000, kw
                assert len(messages) == 1 and messages[0]["type"] == "error", kw
                assert messages[0]["error"] and json.loads(reason)["type"] == "error"
            async with http.ws_connect(url, protocols=(BOB.key,)) as ws:  # not Bob's job
                messages, _ = await read_all(ws)
                assert ws.close_code in (1008, 3003)
            assert [m["type"] for m in messages] == ["error"]


async def test_a_catchup_bounded_below_the_job_still_delivers_every_document_once(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        job = await sdk(
            client(base).crawl, root, limit=10, exclude_paths=[CALENDAR_EXCLUDE],
            poll_interval=1, timeout=50,
        )  # fmt: skip
        assert job.completed > PAGE_DOCS
        expected = await every_source(base, job.id)
        async with http.ws_connect(ws_url(base, job.id)) as ws:
            messages, _ = await read_all(ws)
        first = messages[0]
        assert first["type"] == "catchup" and len(first["data"]["data"]) == PAGE_DOCS
        # the job is finished but the catchup does not hold it all: not its last word
        assert first["data"]["status"] == "scraping"
        assert first["data"]["completed"] == job.completed
        kinds = [m["type"] for m in messages]
        assert kinds == ["catchup"] + ["document"] * (job.completed - PAGE_DOCS) + ["done"]
        assert messages[-1]["data"]["status"] == "completed"
        assert messages[-1]["data"]["completed"] == job.completed
        got = sources(streamed(messages))
        assert len(got) == len(set(got)) and set(got) == expected
        # the SDK's watcher on the same finished job: it must not stop at the catchup
        docs: list[dict[str, Any]] = []
        ended = threading.Event()
        watcher = client(base).watcher(job.id, kind="crawl", poll_interval=30, timeout=60)
        watcher.add_event_listener("document", lambda e: docs.append(e["data"]))
        watcher.add_event_listener("done", lambda e: ended.set())
        watcher.start()
        try:
            assert await asyncio.wait_for(asyncio.to_thread(ended.wait, 60), 65)
        finally:
            await asyncio.to_thread(watcher.stop)
        assert sorted(sources(docs)) == sorted(expected)
    async with gateway(tmp_path / "bytes", page_bytes=1) as base, aiohttp.ClientSession() as http:
        job = await sdk(
            client(base).crawl, root, limit=5, exclude_paths=[CALENDAR_EXCLUDE],
            poll_interval=1, timeout=50,
        )  # fmt: skip
        async with http.ws_connect(ws_url(base, job.id)) as ws:
            messages, _ = await read_all(ws)
        assert messages[0]["data"]["data"] == []  # one document is over the byte bound
        assert [m["type"] for m in messages[1:]] == ["document"] * job.completed + ["done"]


async def test_a_reconnect_gets_a_consistent_catchup_and_everything_again(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        job_id = await slow_crawl(base, root)
        async with http.ws_connect(ws_url(base, job_id)) as ws:
            first, _ = await read_all(ws, stop_after=2)  # then the client goes
        assert first[0]["type"] == "catchup"
        async with http.ws_connect(ws_url(base, job_id)) as ws:
            again, _ = await read_all(ws, timeout=60)
        expected = await every_source(base, job_id)
        got = sources(streamed(again))
        assert again[-1]["type"] == "done"
        assert len(got) == len(set(got)) and set(got) == expected
        async with http.ws_connect(ws_url(base, job_id)) as ws:  # and once it is over
            after, _ = await read_all(ws)
        assert sources(streamed(after)) == got  # the same documents, in index order


async def test_an_unknown_job_or_a_batch_is_an_error_and_a_plain_get_stays_the_status(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        batch = await sdk(client(base).start_batch_scrape, [root + "about.html"])
        for job_id in ("no-such-job", "0" * 32, batch.id):
            async with http.ws_connect(ws_url(base, job_id)) as ws:
                messages, reason = await read_all(ws)
                assert ws.close_code == 1008, job_id
            assert [m["type"] for m in messages] == ["error"]
            assert json.loads(reason)["type"] == "error"
        job = await sdk(client(base).start_crawl, root, limit=2)
        async with http.get(f"{base}/v2/crawl/{job.id}") as resp:
            body = await resp.json()
        assert resp.status == 200 and body["success"] is True and "status" in body


# ---------------------------------------------------------------- the pure rules


def _page(state: int, completed: int, docs: int, more: bool = False) -> jobs_pb2.GetJobResponse:
    page = jobs_pb2.GetJobResponse(state=state, total=completed, completed=completed)  # type: ignore[arg-type]
    for i in range(docs):
        page.documents.add(url=f"http://x/{i}", markdown="m" * 100)
    if more:
        page.next_skip = docs
    return page


@pytest.mark.parametrize(
    ("state", "completed", "docs", "more", "bound", "kept", "status", "final"),
    [
        (jobs_pb2.JOB_STATE_COMPLETED, 3, 3, False, 5, 3, "completed", True),
        (jobs_pb2.JOB_STATE_COMPLETED, 8, 5, True, 5, 5, "scraping", False),
        (jobs_pb2.JOB_STATE_COMPLETED, 8, 8, False, 5, 5, "scraping", False),
        (jobs_pb2.JOB_STATE_CANCELLED, 2, 2, False, 5, 2, "cancelled", True),
        (jobs_pb2.JOB_STATE_SCRAPING, 2, 2, True, 5, 2, "scraping", False),
        (jobs_pb2.JOB_STATE_PAUSED, 0, 0, True, 5, 0, "scraping", False),
        (jobs_pb2.JOB_STATE_FAILED, 0, 0, False, 5, 0, "failed", True),
    ],
)
def test_the_catchup_is_the_jobs_last_word_only_when_it_holds_every_document(
    state: int, completed: int, docs: int, more: bool, bound: int, kept: int, status: str,
    final: bool,
) -> None:  # fmt: skip
    text, n, last = catchup(_page(state, completed, docs, more), bound, 10 << 20, document)
    body = json.loads(text)
    assert body["type"] == "catchup" and (n, last) == (kept, final)
    assert len(body["data"]["data"]) == kept and body["data"]["status"] == status
    assert body["data"]["completed"] == completed and body["data"]["success"] is True


def test_the_catchup_is_cut_by_bytes_and_may_hold_no_document() -> None:
    page = _page(jobs_pb2.JOB_STATE_COMPLETED, 4, 4)
    one = len(json.dumps(document(page.documents[0])).encode()) + 1
    assert catchup(page, 10, 2 * one, document)[1:] == (2, False)
    assert catchup(page, 10, one - 1, document)[1:] == (0, False)


def test_keys_close_codes_and_reasons() -> None:
    assert key_of({"Authorization": "Bearer k1", "Sec-WebSocket-Protocol": "k2"}) == ("k1", "k2")
    assert key_of({"Sec-WebSocket-Protocol": "k2, other"}) == ("k2", "k2")
    assert key_of({}) == ("", None)
    with pytest.raises(Exception, match="Bearer"):
        key_of({"Authorization": "Basic abc"})
    assert is_upgrade({"Upgrade": "WebSocket"}) and not is_upgrade({})
    assert [close_code(s) for s in (401, 403, 404, 429, 500)] == [3000, 3003, 1008, 1013, 1011]
    long = close_reason({"type": "error", "error": "é" * 500})
    assert len(long) <= 123 and json.loads(long)["type"] == "error"
    assert json.loads(close_reason({"type": "done"})) == {"type": "done"}


def test_a_quiet_stream_is_stuck_only_when_the_job_moved_past_it() -> None:
    running = jobs_pb2.JOB_STATE_SCRAPING
    assert not stalled(5, jobs_pb2.GetJobResponse(state=running, completed=5))
    assert stalled(5, jobs_pb2.GetJobResponse(state=running, completed=6))
    assert stalled(5, jobs_pb2.GetJobResponse(state=jobs_pb2.JOB_STATE_COMPLETED, completed=5))
