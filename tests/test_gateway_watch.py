"""The WebSocket watch of a crawl (``GET /v2/crawl/{id}`` upgraded), driven by Firecrawl's
own SDK watchers (``Firecrawl.watcher``, ``AsyncFirecrawl.watcher``) and by a raw aiohttp
client (the JS SDK's way: the key as the subprotocol), against a real gateway in front of
a real in-process node crawling the demo site (``tests.test_gateway.gateway``, whose
status pages, and so whose catchups, hold ``PAGE_DOCS`` documents).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from firecrawl import AsyncFirecrawl

from pagesift.core.jobs.firecrawlshape import document
from pagesift.demo.site import CALENDAR_EXCLUDE, Site
from pagesift.gateway.app import make_app
from pagesift.gateway.clients import Clients
from pagesift.gateway.server import run
from pagesift.gateway.watch import (
    WATCH,
    WatchLimits,
    catchup,
    close_code,
    close_reason,
    is_upgrade,
    key_of,
    resume_at,
    stalled,
)
from pagesift.v1 import jobs_pb2
from tests.helpers import (
    ALICE,
    BOB,
    NodeFactory,
    SiteSpec,
    in_process_node,
    serve_handler,
    write_accounts,
)
from tests.test_failover import promote, start_pair
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

        def ending(into: list[dict[str, Any]]) -> Callable[[dict[str, Any]], None]:
            def record(event: dict[str, Any]) -> None:
                into.append(event)
                ended.set()

            return record

        watcher.add_event_listener("done", ending(dones))
        watcher.add_event_listener("error", ending(errors))
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
            refusals: list[dict[str, Any]] = [
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


async def test_a_gateway_shutting_down_closes_its_watches_with_going_away(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with aiohttp.ClientSession() as http:
        async with gateway(tmp_path) as base:
            job_id = await slow_crawl(base, root)
            ws = await http.ws_connect(ws_url(base, job_id))
            first = await asyncio.wait_for(ws.receive_json(), 10)
            assert first["type"] == "catchup"
            reading = asyncio.create_task(read_all(ws))
        messages, _ = await asyncio.wait_for(reading, 15)
        assert ws.close_code == 1001  # going away: reconnect (here or elsewhere)
        assert all(m["type"] == "document" for m in messages)
        await ws.close()


@pytest.mark.system
async def test_a_failover_of_the_pair_mid_watch_is_no_error_to_the_websocket_client(
    nodes: NodeFactory, site: tuple[Site, str]
) -> None:
    _, root = site
    primary, standby = await start_pair(
        nodes,
        primary_config={"sync_timeout": 10.0},  # sync: what a watcher saw is on the standby
        primary_extra=("--replication-mode", "sync"),
    )
    stop = asyncio.Event()
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    addresses = [primary.address, standby.address]
    task = asyncio.create_task(run("127.0.0.1:0", addresses, stop, started, page_documents=1))
    try:
        base = f"http://{await asyncio.wait_for(started, 10)}"
        job_id = await slow_crawl(base, root)
        async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(base, job_id)) as ws:
            before, _ = await read_all(ws, stop_after=3)  # the catchup and two documents
            primary.kill()
            await promote(standby.address)
            after, reason = await read_all(ws, timeout=90)
            assert ws.close_code == 1000, (after[-1:], reason)
        assert before[0]["data"]["status"] == "scraping"
        assert any(m["type"] == "document" for m in after)  # streamed past the failover
        messages = before + after
        assert [m["type"] for m in messages if m["type"] in ("error", "done")] == ["done"]
        got = sources(streamed(messages))
        assert len(got) == len(set(got)) and set(got) == await every_source(base, job_id)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


@contextlib.asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """``app`` on a free loopback port; yields its base URL."""
    runner = web.AppRunner(app, shutdown_timeout=5, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def big_pages(request: web.Request) -> web.StreamResponse:
    """A site of ``BIG_PAGES`` pages of ~0.85 MB of text each, linked from its root."""
    if request.path == "/":
        links = "".join(f'<a href="/p{i}">p{i}</a> ' for i in range(BIG_PAGES))
        body = f"<html><body>{links}</body></html>"
    else:
        body = "<html><body><p>" + " ".join(f"w{i}" for i in range(120_000)) + "</p></body></html>"
    return web.Response(text=body, content_type="text/html")


BIG_PAGES = 12


async def test_a_client_that_reads_nothing_is_dropped_and_the_watch_holds_no_job(
    tmp_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    async with serve_handler(big_pages) as port, in_process_node(tmp_path) as node:
        app = make_app(Clients([node.address]), page_documents=1)
        app[WATCH] = WatchLimits(send_seconds=1, close_seconds=1)
        async with serve_app(app) as base:
            job = await sdk(
                client(base).crawl, f"http://127.0.0.1:{port}/", limit=BIG_PAGES + 1,
                poll_interval=1, timeout=50,
            )  # fmt: skip
            assert job.completed == BIG_PAGES + 1  # ~10 MB of documents to send
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a tiny window
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, ("127.0.0.1", int(base.rsplit(":", 1)[1])))
                await loop.sock_sendall(sock, (
                    f"GET /v2/crawl/{job.id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n"
                ).encode())  # fmt: skip
                await asyncio.sleep(4)  # reads nothing: the gateway's sends block, then it drops us
                data = bytearray()
                async with asyncio.timeout(20):  # the gateway closed: reading ends
                    while True:
                        try:
                            chunk = await loop.sock_recv(sock, 1 << 20)
                        except ConnectionResetError:
                            break
                        if not chunk:
                            break
                        data += chunk
            finally:
                sock.close()
            assert data.startswith(b"HTTP/1.1 101")
            assert b'"type": "done"' not in data  # dropped before the end of the job
            assert len(data) < 7 << 20  # no more than the sockets' buffers and one document


@pytest.mark.system
async def test_a_stream_stuck_on_a_frozen_primary_resumes_on_the_promoted_standby(
    nodes: NodeFactory, site: tuple[Site, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, root = site
    caplog.set_level(logging.INFO, logger="pagesift.gateway.watch")
    primary, standby = await start_pair(
        nodes,
        primary_config={"sync_timeout": 10.0},
        primary_extra=("--replication-mode", "sync"),
    )
    app = make_app(Clients([primary.address, standby.address], timeout=3.0), page_documents=1)
    app[WATCH] = WatchLimits(stall_seconds=2)
    async with serve_app(app) as base, aiohttp.ClientSession() as http:
        job_id = await slow_crawl(base, root)
        async with http.ws_connect(ws_url(base, job_id)) as ws:
            before, _ = await read_all(ws, stop_after=3)
            with primary.frozen():  # alive, its sockets open, answering nothing
                await promote(standby.address)
                after, reason = await read_all(ws, timeout=90)
                assert ws.close_code == 1000, (after[-1:], reason)
        assert any(m["type"] == "document" for m in after)
        assert "stuck behind its job; resumed" in caplog.text  # not the client's own rules
        messages = before + after
        assert [m["type"] for m in messages if m["type"] in ("error", "done")] == ["done"]
        got = sources(streamed(messages))
        async with http.get(f"{base}/v2/crawl/{job_id}?limit=100") as resp:
            status = await resp.json()
        expected = sources(status["data"])
        assert status["status"] == "completed" and sorted(got) == sorted(expected)


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


def test_a_stuck_stream_resumes_on_the_node_that_shows_the_most() -> None:
    def page(completed: int, state: int = jobs_pb2.JOB_STATE_SCRAPING) -> jobs_pb2.GetJobResponse:
        return jobs_pb2.GetJobResponse(state=state, completed=completed)  # type: ignore[arg-type]

    assert resume_at(5, [("a", None), ("b", page(5))]) is None  # quiet, not stuck
    assert resume_at(5, [("a", None), ("b", None)]) is None  # nobody answered
    assert resume_at(5, [("a", page(6)), ("b", page(9))]) == "b"
    assert resume_at(5, [("a", page(9)), ("b", page(9))]) == "a"  # the client's order
    assert resume_at(5, [("a", None), ("b", page(5, jobs_pb2.JOB_STATE_CANCELLED))]) == "b"


def test_a_quiet_stream_is_stuck_only_when_the_job_moved_past_it() -> None:
    running = jobs_pb2.JOB_STATE_SCRAPING
    assert not stalled(5, jobs_pb2.GetJobResponse(state=running, completed=5))
    assert stalled(5, jobs_pb2.GetJobResponse(state=running, completed=6))
    assert stalled(5, jobs_pb2.GetJobResponse(state=jobs_pb2.JOB_STATE_COMPLETED, completed=5))
