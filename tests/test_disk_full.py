"""Disk full is a state, not an accident (issue 19, finding 9 and point 7).

A real node whose data directory is a small tmpfs crawls until RocksDB reports
ENOSPC. Reads keep answering, writes answer UNAVAILABLE / ``STORAGE_UNAVAILABLE``
without a path, ``pagesift.primary`` health is NOT_SERVING and the job stays
SCRAPING with its task waiting; once a filler file on the same tmpfs is deleted the
node recovers by itself (the storage watcher: reserve released, RocksDB reopened,
reserve made again, probe) and the crawl completes with every page exactly once.

The tmpfs tests need root (``mount -t tmpfs``); they skip, saying so, elsewhere. The
pure parts (error mapping, the watcher's decisions, health) run everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagesift.client.errors import error_info_of, reason_of
from pagesift.core.api import rpcerrors
from pagesift.core.api.storagewatch import RESERVE_FILE, Look, Step, decide
from pagesift.core.ha.roles import Role
from pagesift.core.store.db import Store
from pagesift.core.store.errors import IO_ERROR, NO_SPACE, StorageUnavailable, storage_error
from pagesift.core.store.groups import WriteGroup
from pagesift.node.grpchealth import NOT_SERVING, PRIMARY, SERVING, health_statuses
from pagesift.node.node import Node
from pagesift.node.startup import StartRefused
from pagesift.v1 import jobs_pb2
from tests.helpers import (
    all_documents,
    eventually,
    in_process_node,
    node_config,
    serve_handler,
    until,
)

MIB = 1 << 20

# ---------------------------------------------------------------- a real tmpfs


@contextlib.contextmanager
def tmpfs(path: Path, size_mib: int) -> Iterator[Path]:
    """A fresh tmpfs of ``size_mib`` MiB mounted at ``path`` (unmounted after); skips
    the test, saying why, when this process may not mount one."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs (mount -t tmpfs)")
    path.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if run.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {run.stderr.strip() or run.returncode}")
    try:
        yield path
    finally:
        for argv in (["umount", str(path)], ["umount", "-l", str(path)]):
            if subprocess.run(argv, capture_output=True, timeout=10).returncode == 0:
                break


def fill(path: Path, nbytes: int) -> None:
    with path.open("wb") as fh:
        left = nbytes
        while left > 0:
            left -= fh.write(bytes(min(left, MIB)))


def put(g: WriteGroup, key: str, value: bytes) -> None:
    g.put(key, value)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# ---------------------------------------------------------------- pure parts


def test_rocksdb_io_errors_map_to_a_reason_and_the_message_names_no_path() -> None:
    full = Exception(
        "IO error: No space left on device: While appending to file: /srv/data/db/000009.sst"
    )
    eio = Exception("IO error: While fsync: /srv/data/db/000004.log: Input/output error")
    err, other = storage_error(full), storage_error(eio)
    assert err is not None and err.reason == NO_SPACE
    assert other is not None and other.reason == IO_ERROR
    for e in (err, other):
        assert "/" not in str(e) and "000" not in str(e)
    assert storage_error(Exception("Invalid argument: column family not found")) is None
    enospc = storage_error(OSError(28, "No space left on device"))
    assert enospc is not None and enospc.reason == NO_SPACE


def test_the_watcher_releases_the_reserve_reopens_and_resumes_only_with_room_for_it() -> None:
    def look(refusing: str | None, reopen: bool, present: int, free: int) -> Step:
        return decide(Look(refusing, reopen, present, 8 * MIB, free))

    assert look(None, False, 8 * MIB, 0) is Step.HEALTHY
    assert look(None, False, 0, 15 * MIB) is Step.HEALTHY  # no room for it yet
    assert look(None, False, 0, 16 * MIB) is Step.RESTORE
    assert look(NO_SPACE, True, 8 * MIB, 0) is Step.RELEASE
    assert look(NO_SPACE, True, 0, 8 * MIB) is Step.REOPEN
    assert look(NO_SPACE, False, 0, 10 * MIB) is Step.WAIT_FOR_SPACE
    assert look(NO_SPACE, False, 0, 16 * MIB) is Step.RESTORE
    assert look(NO_SPACE, False, 8 * MIB, 16 * MIB) is Step.RESUME
    assert look(IO_ERROR, True, 8 * MIB, 100 * MIB) is Step.REOPEN  # the reserve stays
    assert decide(Look(NO_SPACE, False, 0, 0, 0)) is Step.RESUME  # no reserve configured


def test_primary_health_is_not_serving_while_the_store_refuses_writes() -> None:
    ok = health_statuses(Role.PRIMARY, True, False, 0.0, 5.0, store_writable=True)
    full = health_statuses(Role.PRIMARY, True, False, 0.0, 5.0, store_writable=False)
    assert ok[PRIMARY] == SERVING and full[PRIMARY] == NOT_SERVING
    assert full[""] == SERVING  # the process still serves reads


# ---------------------------------------------------------------- the store on a full volume


@pytest.mark.system
def test_a_full_volume_refuses_writes_keeps_reads_and_a_reopen_brings_writes_back(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "vol", 32) as vol:
        fill(vol / "filler", 20 * MIB)
        store = Store(vol / "db")
        try:
            blob = secrets.token_bytes(256 * 1024)
            written = 0
            with pytest.raises(StorageUnavailable) as caught:
                for i in range(1000):
                    store.write(partial(put, key=f"k{i:05d}", value=blob))
                    written = i + 1
            assert caught.value.reason == NO_SPACE and str(vol) not in str(caught.value)
            assert written > 10 and store.refusing is not None and store.needs_reopen
            # refused at once now, RocksDB untouched; every acknowledged write reads back
            with pytest.raises(StorageUnavailable):
                store.write(lambda g: g.put("small", b"x"))
            assert all(store.get(f"k{i:05d}") == blob for i in range(written))
            with pytest.raises(StorageUnavailable):
                store.probe()
            # no room to replay the WAL into a table file: the read-only stand-in serves
            with pytest.raises(StorageUnavailable):
                store.reopen()
            assert all(store.get(f"k{i:05d}") == blob for i in range(written))
            (vol / "filler").unlink()
            store.reopen()
            assert all(store.get(f"k{i:05d}") == blob for i in range(written))
            assert store.refusing is not None  # still refused until told
            store.probe()
            store.accept_writes()
            store.write(lambda g: g.put("after", b"y"))
            assert store.get("after") == b"y" and store.get(f"k{written:05d}") is None
        finally:
            store.close()


# ---------------------------------------------------------------- a real node


PAGES = 200
BODY = 96 * 1024


def path(i: int) -> str:
    return "/" if i == 0 else f"/p{i}"


def site_page(i: int) -> bytes:
    children = [j for j in (2 * i + 1, 2 * i + 2) if j < PAGES]
    links = "".join(f'<a href="{path(j)}">page {j}</a> ' for j in children)
    text = secrets.token_urlsafe(BODY)[:BODY]  # incompressible: the volume fills as planned
    return (
        f"<html><head><title>p{i}</title></head><body><p>{text}</p>{links}</body></html>".encode()
    )


async def health_is(channel: grpc.aio.Channel, status: int) -> bool | None:
    """``pagesift.primary``'s health is ``status`` (None: not yet)."""
    stub = health_pb2_grpc.HealthStub(channel)
    resp = await stub.Check(health_pb2.HealthCheckRequest(service=PRIMARY), timeout=5)
    return True if resp.status == status else None


@pytest.mark.system
async def test_a_node_whose_volume_fills_pauses_its_crawl_and_resumes_it_when_space_is_freed(
    tmp_path: Path,
) -> None:
    pages = {path(i): site_page(i) for i in range(PAGES)}

    async def handler(request: web.Request) -> web.Response:
        body = pages.get(request.path)
        if body is None:
            return web.Response(status=404)
        return web.Response(body=body, content_type="text/html")

    with tmpfs(tmp_path / "vol", 64) as vol:
        fill(vol / "filler", 30 * MIB)
        async with (
            serve_handler(handler) as port,
            in_process_node(
                vol / "data",
                storage_reserve_bytes=4 * MIB,
                default_concurrency=4,
                backlog_bytes=1 * MIB,
            ) as node,
        ):
            assert (vol / "data" / RESERVE_FILE).stat().st_size == 4 * MIB
            root = f"http://127.0.0.1:{port}/"
            job = await node.stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(
                    url=root, limit=PAGES, sitemap=jobs_pb2.SITEMAP_MODE_SKIP
                )
            )

            async def refusing() -> bool | None:
                return True if not node.node.store_writable else None

            await eventually(refusing, "the store to refuse writes (the volume full)", 25)
            await eventually(lambda: health_is(node.channel, NOT_SERVING), "NOT_SERVING", 5)
            # reads answer; the job is SCRAPING, paused in memory, not lost
            before = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job.id, status_only=True))
            assert before.state == jobs_pb2.JOB_STATE_SCRAPING
            assert 0 < before.completed < PAGES, before.completed
            listed = await node.stub.ListJobs(jobs_pb2.ListJobsRequest())
            assert [j.id for j in listed.jobs] == [job.id]
            acknowledged = {d.url for d in await all_documents(node.stub, job.id)}
            assert len(acknowledged) == before.completed
            # a write answers UNAVAILABLE / STORAGE_UNAVAILABLE, naming no path
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=root), timeout=5)
            err = refused.value
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            assert reason_of(err) == rpcerrors.Reason.STORAGE_UNAVAILABLE
            info = error_info_of(err)
            assert info is not None and info.metadata["cause"] == NO_SPACE
            message = err.details() or ""
            assert "/" not in message and str(vol) not in message and ".sst" not in message
            # the series say so
            text = node.node.metrics.exposition().decode()
            assert "pagesift_store_refusing_writes 1.0" in text
            assert "pagesift_store_free_bytes" in text
            assert node.node.runtime() is not None
            assert job.id in node.node.runtime()._tasks  # type: ignore[union-attr]  # waiting

            (vol / "filler").unlink()  # the operator frees space
            freed = time.monotonic()

            async def writable() -> bool | None:
                return True if node.node.store_writable else None

            await eventually(writable, "the store to take writes again", 20)
            resumed = time.monotonic() - freed

            async def done() -> jobs_pb2.GetJobResponse | None:
                r = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job.id, status_only=True))
                return r if r.state != jobs_pb2.JOB_STATE_SCRAPING else None

            final = await eventually(done, "the crawl to resume and finish", 30)
            finished = time.monotonic() - freed
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final
            await eventually(lambda: health_is(node.channel, SERVING), "SERVING again", 5)
            assert (vol / "data" / RESERVE_FILE).stat().st_size == 4 * MIB
            urls = [d.url for d in await all_documents(node.stub, job.id)]
            assert len(urls) == len(set(urls)), "a page stored twice"
            expected = {f"http://127.0.0.1:{port}{path(i)}" for i in range(PAGES)}
            assert set(urls) == expected
            assert acknowledged <= set(urls)
            assert node.node.storage.episodes == 1
            text = node.node.metrics.exposition().decode()
            assert "pagesift_store_refusing_writes 0.0" in text
            print(
                f"\ndisk full: {before.completed} of {PAGES} pages stored when the volume filled;"
                f" writes taken again {resumed:.2f} s after space was freed, crawl complete"
                f" after {finished:.2f} s; free after recovery {free_bytes(vol) // MIB} MiB"
            )


async def test_jobs_wait_while_the_store_refuses_writes_and_go_on_when_it_takes_them(
    tmp_path: Path,
) -> None:
    """Without a full volume (no root needed): the store told to refuse writes while
    the watcher is stopped. Pages fetched meanwhile wait unrecorded, writes answer
    STORAGE_UNAVAILABLE, health is NOT_SERVING; the watcher, started again, probes and
    lets the store take writes, and the crawl completes with every page once."""
    n = 24
    gate = asyncio.Event()
    hits: dict[str, int] = {}

    async def handler(request: web.Request) -> web.Response:
        hits[request.path] = hits.get(request.path, 0) + 1
        if request.path == "/":
            links = "".join(f'<a href="/p{i}">{i}</a> ' for i in range(1, n))
            return web.Response(text=f"<html><body>{links}</body></html>", content_type="text/html")
        if request.path.startswith("/p") and request.path[2:].isdigit():
            await gate.wait()
            return web.Response(
                text=f"<html><body>{request.path}</body></html>", content_type="text/html"
            )
        return web.Response(status=404)

    async with (
        serve_handler(handler) as port,
        in_process_node(tmp_path / "data", storage_reserve_bytes=0) as node,
    ):
        root = f"http://127.0.0.1:{port}/"
        job = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(url=root, sitemap=jobs_pb2.SITEMAP_MODE_SKIP)
        )

        async def status() -> jobs_pb2.GetJobResponse:
            return await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job.id, status_only=True))

        async def root_done() -> bool | None:
            return True if (await status()).completed == 1 else None

        await eventually(root_done, "the start page recorded", 15)
        await node.node.storage.stop()
        node.node.store().refuse_writes(IO_ERROR)
        gate.set()  # the other pages are fetched now, and cannot be recorded
        await eventually(lambda: health_is(node.channel, NOT_SERVING), "NOT_SERVING", 5)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=root), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        info = error_info_of(refused.value)
        assert info is not None and info.reason == rpcerrors.Reason.STORAGE_UNAVAILABLE
        assert info.metadata["cause"] == IO_ERROR
        await asyncio.sleep(0.5)  # the fetches are done: nothing is recorded meanwhile
        paused = await status()
        assert paused.state == jobs_pb2.JOB_STATE_SCRAPING and paused.completed == 1
        runtime = node.node.runtime()
        assert runtime is not None and job.id in runtime._tasks  # type: ignore[attr-defined]

        await node.node.storage.start()  # probes, then the store takes writes again

        async def finished() -> jobs_pb2.GetJobResponse | None:
            r = await status()
            return r if r.state != jobs_pb2.JOB_STATE_SCRAPING else None

        final = await eventually(finished, "the crawl to go on and complete", 20)
        assert final.state == jobs_pb2.JOB_STATE_COMPLETED and final.completed == n
        urls = [d.url for d in await all_documents(node.stub, job.id)]
        assert sorted(urls) == sorted([root] + [f"{root}p{i}" for i in range(1, n)])
        # each page fetched once: the page waited with its document, it was not fetched again
        assert {path: k for path, k in hits.items() if k != 1} == {}
        await eventually(lambda: health_is(node.channel, SERVING), "SERVING again", 5)


@pytest.mark.system
async def test_a_node_restarted_on_a_full_volume_opens_by_releasing_its_reserve(
    tmp_path: Path,
) -> None:
    """RocksDB's open writes (a new manifest and WAL, the old WAL as a table file): on a
    volume filled while the node was down, the node starts by releasing its reserve,
    answers reads, and makes the reserve again once space is freed."""
    pages = {path(i): site_page(i) for i in range(12)}

    async def handler(request: web.Request) -> web.Response:
        body = pages.get(request.path)
        if body is None:
            return web.Response(status=404)
        return web.Response(body=body, content_type="text/html")

    with tmpfs(tmp_path / "vol", 32) as vol:
        data = vol / "data"
        async with serve_handler(handler) as port:
            root = f"http://127.0.0.1:{port}/"
            async with in_process_node(data, storage_reserve_bytes=8 * MIB) as node:
                job = await node.stub.StartCrawl(
                    jobs_pb2.StartCrawlRequest(url=root, sitemap=jobs_pb2.SITEMAP_MODE_SKIP)
                )

                async def done() -> bool | None:
                    r = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job.id, status_only=True))
                    return True if r.state == jobs_pb2.JOB_STATE_COMPLETED else None

                await eventually(done, "the crawl to complete", 20)
            with contextlib.suppress(OSError):  # fill the volume to the last block
                fill(vol / "filler", 64 * MIB)
            assert free_bytes(vol) < MIB and (data / RESERVE_FILE).exists()
            async with in_process_node(data, storage_reserve_bytes=8 * MIB) as node:
                assert not (data / RESERVE_FILE).exists()  # released to open the store
                got = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job.id, status_only=True))
                assert got.state == jobs_pb2.JOB_STATE_COMPLETED and got.completed == 12
                (vol / "filler").unlink()
                await until(lambda: (data / RESERVE_FILE).exists(), "the reserve made again", 5)


@pytest.mark.system
async def test_a_node_stopped_while_its_volume_is_full_refuses_to_start_then_resumes_its_crawl(
    tmp_path: Path,
) -> None:
    """The operator's reflex, a restart, on a volume still full: the start is refused
    with a message saying to free space (not a RocksDB traceback); once space is freed
    the node starts, resumes the crawl, and completes it with every page once."""
    pages = {path(i): site_page(i) for i in range(PAGES)}

    async def handler(request: web.Request) -> web.Response:
        body = pages.get(request.path)
        if body is None:
            return web.Response(status=404)
        return web.Response(body=body, content_type="text/html")

    with tmpfs(tmp_path / "vol", 64) as vol:
        fill(vol / "filler", 30 * MIB)
        data = vol / "data"
        async with serve_handler(handler) as port:
            root = f"http://127.0.0.1:{port}/"
            async with in_process_node(data, storage_reserve_bytes=4 * MIB) as node:
                job = await node.stub.StartCrawl(
                    jobs_pb2.StartCrawlRequest(
                        url=root, limit=PAGES, sitemap=jobs_pb2.SITEMAP_MODE_SKIP
                    )
                )

                async def refusing() -> bool | None:
                    return True if not node.node.store_writable else None

                await eventually(refusing, "the store to refuse writes (the volume full)", 25)
                stored = {d.url for d in await all_documents(node.stub, job.id)}
            with pytest.raises(StartRefused, match="free space"):
                Node(node_config(data, storage_reserve_bytes=4 * MIB))
            (vol / "filler").unlink()
            async with in_process_node(data, storage_reserve_bytes=4 * MIB) as node:

                async def done() -> jobs_pb2.GetJobResponse | None:
                    r = await node.stub.GetJob(jobs_pb2.GetJobRequest(id=job.id, status_only=True))
                    return r if r.state != jobs_pb2.JOB_STATE_SCRAPING else None

                final = await eventually(done, "the resumed crawl to finish", 30)
                assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final
                urls = [d.url for d in await all_documents(node.stub, job.id)]
        assert len(urls) == len(set(urls)), "a page stored twice"
        assert set(urls) == {f"{root}{path(i)[1:]}" for i in range(PAGES)}
        assert stored <= set(urls)
