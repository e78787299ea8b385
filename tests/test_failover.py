"""Replication and failover with real processes: ``pagesift serve`` children on loopback.

Every node is a child process with its own data directory under ``tmp_path``; the
tests kill them with SIGKILL (``os.kill``) at chosen instants, restart them, promote
standbys through ``AdminService.Promote`` and compare stores with ``verify`` (digests
of both nodes at one offset). Crawls are paced (``delay`` between two requests to the
demo site) so that "mid-crawl" is a wide window; every wait is bounded; every child is
terminated (then killed) in a ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from pagesift import cli
from pagesift.cli.common import EXIT_OK
from pagesift.client import JobClient
from pagesift.core.replication.slot import open_slot
from pagesift.core.replication.verify import VerifyResult, verify_digests
from pagesift.demo.site import CALENDAR_EXCLUDE, Site, build_site, serve_site
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2_grpc
from pagesift.v1 import replication_pb2 as pb
from tests.helpers import (
    PROMOTE_MD,
    NodeFactory,
    ServeProc,
    SiteSpec,
    all_documents,
    assert_every_page_once,
    eventually,
    finished,
    free_port,
    get_job,
    metric,
    pages_done,
    role,
    scrape_metrics,
)

pytestmark = pytest.mark.system

MiB = 1024 * 1024
CONCURRENCY = 8
PAGES = 150
PACE = 0.02  # seconds between two request starts to the site: a crawl lasts ~3-4 s


# ---------------------------------------------------------------- processes


async def start_pair(
    nodes: NodeFactory,
    *,
    primary_config: dict[str, Any] | None = None,
    primary_extra: tuple[str, ...] = (),
    standby_config: dict[str, Any] | None = None,
) -> tuple[ServeProc, ServeProc]:
    primary = nodes("primary", config=primary_config, extra=primary_extra)
    standby = nodes("standby", role="standby", primary=primary.address, config=standby_config)
    await asyncio.gather(primary.start(), standby.start())
    await eventually(lambda: _connected(standby.address), "the standby to connect")
    return primary, standby


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=PAGES, slow_seconds=1.5, big_bytes=2 * MiB)


# ---------------------------------------------------------------- waits and RPCs


async def promote(address: str) -> pb.PromoteResponse:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = replication_pb2_grpc.AdminServiceStub(ch)
        resp: pb.PromoteResponse = await stub.Promote(
            pb.PromoteRequest(), metadata=PROMOTE_MD, timeout=10
        )
        return resp


async def _connected(address: str) -> bool | None:
    return True if (await role(address)).connected else None


async def _caught_up(primary: str, standby: str) -> int | None:
    p, s = await role(primary), await role(standby)
    same = s.applied_offset == p.applied_offset and s.history_id == p.history_id
    return p.applied_offset if same and p.applied_offset > 0 else None


async def converge(primary: ServeProc, standby: ServeProc, timeout: float = 60.0) -> VerifyResult:
    """Wait until the standby stands at the primary's offset, then compare digests."""
    await eventually(
        lambda: _caught_up(primary.address, standby.address),
        f"{standby.name} to catch up with {primary.name}",
        timeout,
    )
    async with (
        grpc.aio.insecure_channel(primary.address) as p_ch,
        grpc.aio.insecure_channel(standby.address) as s_ch,
    ):
        return await verify_digests(
            replication_pb2_grpc.AdminServiceStub(p_ch),  # type: ignore[arg-type]
            replication_pb2_grpc.AdminServiceStub(s_ch),  # type: ignore[arg-type]
        )


def crawl_request(root: str, key: str = "", delay: float = PACE) -> jobs_pb2.StartCrawlRequest:
    return jobs_pb2.StartCrawlRequest(
        url=root,
        exclude_paths=[CALENDAR_EXCLUDE],
        max_concurrency=CONCURRENCY,
        delay=delay,
        idempotency_key=key,
    )


async def start_crawl(address: str, req: jobs_pb2.StartCrawlRequest) -> str:
    async with JobClient(address) as client:
        return await client.start_crawl(req)


async def offset_at_least(address: str, offset: int) -> int | None:
    got = (await role(address)).applied_offset
    return got if got >= offset else None


async def documents(address: str, job_id: str) -> list[jobs_pb2.Document]:
    async with grpc.aio.insecure_channel(address) as ch:
        return await all_documents(jobs_pb2_grpc.JobServiceStub(ch), job_id)


# ---------------------------------------------------------------- (a) steady state


async def test_after_a_crawl_the_standby_digest_equals_the_primarys(
    nodes: NodeFactory, site: tuple[Site, str], capsys: pytest.CaptureFixture[str]
) -> None:
    s, root = site
    primary, standby = await start_pair(nodes)
    job_id = await start_crawl(primary.address, crawl_request(root, delay=0.0))
    assert (await finished(primary.address, job_id)).state == jobs_pb2.JOB_STATE_COMPLETED
    offset = await eventually(
        lambda: _caught_up(primary.address, standby.address), "the standby to catch up"
    )
    capsys.readouterr()
    code = await cli.amain(
        ["verify", "--primary", primary.address, "--standby", standby.address, "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK, out
    assert out["equal"] is True and out["offset"] == offset
    assert out["primary"]["digest"] == out["standby"]["digest"]
    # the standby serves the same job, page for page
    on_standby = await documents(standby.address, job_id)
    assert [d.url for d in on_standby] == [d.url for d in await documents(primary.address, job_id)]
    assert_every_page_once(on_standby, s.expected_documents(root))
    # reads on the standby carry its position; writes name the primary
    async with grpc.aio.insecure_channel(standby.address) as ch:
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        call = stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, limit=1))
        await call
        md = dict(await call.trailing_metadata() or ())
        assert md["pagesift-role"] == "standby"
        assert int(md["pagesift-applied-offset"]) == offset
        assert md["pagesift-lag-offsets"] == "0"
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.StartCrawl(crawl_request(root))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert primary.address in (e.value.details() or "")


# ---------------------------------------------------------------- (b) continue


async def test_a_standby_killed_mid_crawl_reconnects_with_continue_not_a_full_resync(
    nodes: NodeFactory, site: tuple[Site, str]
) -> None:
    s, root = site
    primary, standby = await start_pair(nodes)
    before = await role(primary.address)
    assert (before.full_resyncs, before.continues) == (1, 0)  # the standby's first sync
    job_id = await start_crawl(primary.address, crawl_request(root, delay=0.03))
    await eventually(lambda: pages_done(standby.address, job_id, 10), "10 pages on the standby")
    standby.kill()
    killed_at = (await role(primary.address)).applied_offset
    await eventually(lambda: offset_at_least(primary.address, killed_at + 10), "more writes")
    await standby.start()
    await eventually(lambda: _connected(standby.address), "the standby to reconnect")
    job = await get_job(primary.address, job_id)
    assert job.state == jobs_pb2.JOB_STATE_SCRAPING, "the crawl ended before the reconnection"
    st = await role(standby.address)
    assert (st.continues, st.full_resyncs) == (1, 0), standby.log_text()[-2000:]
    assert "continuing from" in standby.log_text()
    pr = await role(primary.address)
    assert (pr.continues, pr.full_resyncs) == (1, 1)
    assert (await finished(primary.address, job_id)).state == jobs_pb2.JOB_STATE_COMPLETED
    assert (await converge(primary, standby)).equal
    assert_every_page_once(await documents(standby.address, job_id), s.expected_documents(root))


# ---------------------------------------------------------------- (c) backlog overflow


class HeldPage:
    """An aiohttp middleware for a demo site: once ``hold()`` is called, the next page
    request waits until ``release()`` (at most ``HELD_AT_MOST`` seconds), so a crawl
    cannot finish before the test says; every other request is answered as usual."""

    HELD_AT_MOST = 120.0

    def __init__(self) -> None:
        self._holding = False
        self.held = asyncio.Event()  # a request is being held
        self._released = asyncio.Event()

    def hold(self) -> None:
        self._holding = True

    def release(self) -> None:
        self._released.set()

    def middleware(self) -> Middleware:
        @web.middleware
        async def held_page(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self._holding and not self.held.is_set() and request.path.endswith(".html"):
                self.held.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._released.wait(), self.HELD_AT_MOST)
            return await handler(request)

        return held_page


async def test_a_standby_away_longer_than_the_backlog_gets_a_full_resync_while_the_crawl_writes(
    nodes: NodeFactory, site_spec: SiteSpec
) -> None:
    s = build_site(
        site_spec.pages, slow_seconds=site_spec.slow_seconds, big_bytes=site_spec.big_bytes
    )
    gate = HeldPage()
    s.app.middlewares.append(gate.middleware())
    runner, root = await serve_site(s)
    try:
        # a held page waits for the resync without timing out (read_timeout past it)
        primary, standby = await start_pair(
            nodes, primary_config={"backlog_bytes": 20_000, "read_timeout": 2 * gate.HELD_AT_MOST}
        )
        # paced (~170 pages at 0.1 s) so the crawl is still writing once the standby is away
        job_id = await start_crawl(primary.address, crawl_request(root, delay=0.1))
        await eventually(lambda: pages_done(standby.address, job_id, 10), "10 pages on the standby")
        gate.hold()  # the crawl cannot end before the resync: one page waits for it
        standby.kill()
        away_at = (await role(primary.address)).applied_offset
        # far more than 20 000 bytes of page groups: the entry after away_at is trimmed
        await eventually(lambda: offset_at_least(primary.address, away_at + 30), "more writes")
        await standby.start()

        async def resynced() -> pb.RoleResponse | None:
            st = await role(standby.address)
            return st if st.full_resyncs >= 1 else None

        await eventually(resynced, "a full resync of the restarted standby")
        job = await get_job(primary.address, job_id)
        assert gate.held.is_set(), "no page was held: the crawl had fetched every page"
        assert job.state == jobs_pb2.JOB_STATE_SCRAPING, "the crawl ended before the resync"
        gate.release()
        assert "full resync from" in standby.log_text()
        assert "backlog starts at" in standby.log_text()  # the reason: not a new standby
        assert (await finished(primary.address, job_id)).state == jobs_pb2.JOB_STATE_COMPLETED
        result = await converge(primary, standby)
        assert result.equal, result
        assert (await role(primary.address)).full_resyncs >= 2  # the first sync, then this one
        # read_timeout is past the site's slow page here, so it is a document too
        expected = s.expected_documents(root, slow_times_out=False)
        assert_every_page_once(await documents(standby.address, job_id), expected)
    finally:
        gate.release()
        await runner.cleanup()


# ---------------------------------------------------------------- (d) killed mid-snapshot


def _dir_bytes(path: Path) -> int:
    total = 0
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            total += entry.stat().st_size
    return total


def _current(data: Path) -> str:
    path = data / "CURRENT"
    return path.read_text().strip() if path.exists() else ""


def _snapshot_state(data: Path, min_bytes: int) -> tuple[str, Path | None] | None:
    """("under way", the fresh store directory that CURRENT does not name yet and that
    holds ``min_bytes`` already), ("done", None) once CURRENT names a fresh store, or
    None (not started yet)."""
    if not data.exists():
        return None
    current = _current(data)
    if current.startswith("store-"):
        return ("done", None)
    for child in data.glob("store-*"):
        try:
            if child.name != current and _dir_bytes(child) >= min_bytes:
                return ("under way", child)
        except FileNotFoundError:
            continue
    return None


async def test_a_standby_killed_mid_snapshot_restarts_unsynced_and_converges(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    # A store of ~60 MB (big documents in three formats) makes the snapshot last
    # about a second: a wide window to kill the standby inside it.
    big = build_site(40, slow_seconds=1.5, big_bytes=4 * MiB)
    runner, root = await serve_site(big)
    try:
        primary = nodes("primary", config={"max_body_bytes": 8 * MiB, "read_timeout": 5.0})
        await primary.start()
        formats = [jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_HTML, jobs_pb2.FORMAT_RAW_HTML]
        options = jobs_pb2.ScrapeOptions(formats=formats)
        urls = [f"{root}files/big.html?copy={i}" for i in range(4)]
        async with JobClient(primary.address) as client:
            crawl_id = await client.start_crawl(
                jobs_pb2.StartCrawlRequest(
                    url=root, exclude_paths=[CALENDAR_EXCLUDE], max_concurrency=4, options=options
                )
            )
            batch = await client.start_batch(
                jobs_pb2.StartBatchScrapeRequest(urls=urls, options=options, max_concurrency=2)
            )
        for job_id in (crawl_id, batch.id):
            assert (await finished(primary.address, job_id)).state == jobs_pb2.JOB_STATE_COMPLETED

        standby = nodes("standby", role="standby", primary=primary.address)
        leftover: Path | None = None
        for _attempt in range(3):  # the kill must land inside the snapshot
            shutil.rmtree(standby.data, ignore_errors=True)
            standby.launch()
            _, leftover = await eventually(
                lambda: asyncio.to_thread(_snapshot_state, standby.data, 4 * MiB),
                "the snapshot to begin",
            )
            standby.kill()
            if leftover is not None and _current(standby.data) != leftover.name:
                break
            leftover = None  # the snapshot completed before the kill: try again
        assert leftover is not None, "could not kill the standby inside its snapshot"
        assert leftover.exists()

        # The killed standby never believes it is in sync: its CURRENT store (the old
        # one) claims no history and no offset. (Opening it also drops the leftover.)
        slot = open_slot(standby.data)
        try:
            assert (slot.log.history_id, slot.log.last_offset) == ("", 0)
        finally:
            slot.close()
        assert not leftover.exists()

        await standby.start()
        result = await converge(primary, standby)
        assert result.equal, result
        st = await role(standby.address)
        assert st.full_resyncs == 1 and st.history_id == (await role(primary.address)).history_id
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- (e) failover


async def kill_when(node: ServeProc, job_id: str, pages: int) -> None:
    await eventually(lambda: pages_done(node.address, job_id, pages), f"{pages} pages")
    node.kill()


async def test_a_crawl_whose_primary_is_killed_completes_on_the_promoted_standby_once_per_page(
    nodes: NodeFactory, site: tuple[Site, str]
) -> None:
    s, root = site
    primary, standby = await start_pair(nodes)
    job_id = await start_crawl(primary.address, crawl_request(root, key="crawl-e"))
    await kill_when(primary, job_id, 40)
    async with JobClient([primary.address, standby.address], retry_budget=2.0) as client:
        # reads fail over to the standby while the primary is down
        job = await client.get_job(job_id)
        assert job.state == jobs_pb2.JOB_STATE_SCRAPING and job.completed > 0
        assert client.failover.preferred == standby.address
    promoted = await promote(standby.address)
    assert promoted.epoch == 2 and not promoted.already_primary
    final = await finished(standby.address, job_id)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert_every_page_once(await documents(standby.address, job_id), s.expected_documents(root))


async def test_a_deposed_primary_still_running_stops_writing_once_it_hears_the_promoted_node(
    nodes: NodeFactory, site: tuple[Site, str]
) -> None:
    _, root = site
    primary, standby = await start_pair(nodes)
    job_id = await start_crawl(primary.address, crawl_request(root))
    await eventually(lambda: pages_done(standby.address, job_id, 5), "5 pages on the standby")
    with primary.frozen():  # mid-crawl: unreachable, not dead
        promoted = await promote(standby.address)
        assert promoted.epoch == 2 and not promoted.already_primary
        await asyncio.sleep(1.0)  # the promoted node keeps asking meanwhile

    async def fenced() -> pb.RoleResponse | None:
        r = await role(primary.address)
        return r if r.role == pb.NODE_ROLE_FENCED else None

    await eventually(fenced, "the old primary to be fenced", timeout=30)
    first = (await role(primary.address)).applied_offset
    async with grpc.aio.insecure_channel(primary.address) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await jobs_pb2_grpc.JobServiceStub(ch).StartCrawl(crawl_request(root), timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert standby.address in (info.value.details() or "")  # it names the new primary
    # The crawl goes on at the promoted node, which fetches every page the old primary
    # had in flight (and all the rest): once it finished there, a crawl still running on
    # the old primary would have written pages too.
    final = await finished(standby.address, job_id)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert (await role(primary.address)).applied_offset == first  # its crawl stopped writing
    assert "fenced by epoch 2" in primary.log_text()
    assert "takes no writes" in standby.log_text()


# ---------------------------------------------------------------- (f) the old primary rejoins


async def test_the_old_primary_rejoins_as_a_standby_discarding_its_unreplicated_writes(
    nodes: NodeFactory, site: tuple[Site, str]
) -> None:
    s, root = site
    primary, standby = await start_pair(nodes)
    job_id = await start_crawl(primary.address, crawl_request(root))
    await eventually(lambda: pages_done(standby.address, job_id, 20), "20 pages on the standby")
    # The standby dies first; the primary goes on writing what will never replicate.
    standby.kill()
    lost_from = (await role(primary.address)).applied_offset
    await eventually(lambda: offset_at_least(primary.address, lost_from + 15), "more writes")
    primary.kill()
    old_last = _last_offset(primary.data)

    # The standby comes back (its primary is gone) and is promoted.
    await standby.start()
    promoted = await promote(standby.address)
    assert promoted.epoch == 2
    unreplicated = old_last - promoted.switch_offset
    assert unreplicated >= 15

    # The old primary is restarted as a standby of the new one.
    await primary.start(role="standby", primary=standby.address)

    async def rejoined() -> pb.RoleResponse | None:
        st = await role(primary.address)
        return st if st.connected and st.full_resyncs == 1 else None

    st = await eventually(rejoined, "the old primary to rejoin")
    assert st.role == pb.NODE_ROLE_STANDBY and st.epoch == 2
    assert st.discarded == unreplicated
    assert f"discarding {unreplicated} local writes" in primary.log_text()

    final = await finished(standby.address, job_id)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    result = await converge(standby, primary)
    assert result.equal, result
    assert_every_page_once(await documents(primary.address, job_id), s.expected_documents(root))


def _last_offset(data: Path) -> int:
    """The offset a (dead) node's store stands at, read offline."""
    slot = open_slot(data)
    try:
        return slot.log.last_offset
    finally:
        slot.close()


# ---------------------------------------------------------------- (g) sync mode


async def test_in_sync_mode_every_page_a_watcher_saw_is_on_the_promoted_standby(
    nodes: NodeFactory, site: tuple[Site, str]
) -> None:
    s, root = site
    primary, standby = await start_pair(
        nodes,
        primary_config={"sync_timeout": 10.0},  # no degradation on a busy test box
        primary_extra=("--replication-mode", "sync"),
    )
    job_id = await start_crawl(primary.address, crawl_request(root))
    seen: dict[int, str] = {}

    async def watch() -> None:
        async with grpc.aio.insecure_channel(primary.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            async for event in stub.WatchJob(jobs_pb2.WatchJobRequest(id=job_id)):
                if event.HasField("document"):
                    seen[event.document.index] = event.document.document.url

    watcher = asyncio.create_task(watch())
    try:

        async def saw_enough() -> bool | None:
            assert not watcher.done() or not watcher.exception(), watcher.exception()
            return True if len(seen) >= 40 else None

        await eventually(saw_enough, "the watcher to see 40 pages")
        assert not (await role(primary.address)).sync_degraded
        primary.kill()
        await asyncio.wait({watcher}, timeout=5)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await watcher  # the stream broke with the primary
    snapshot = dict(seen)  # what the watcher saw before the primary died

    await promote(standby.address)
    docs = await documents(standby.address, job_id)
    missing = {i: url for i, url in snapshot.items() if i >= len(docs) or docs[i].url != url}
    assert not missing, f"{len(missing)} watched pages lost: {sorted(missing.items())[:5]}"
    final = await finished(standby.address, job_id)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert_every_page_once(await documents(standby.address, job_id), s.expected_documents(root))


async def test_in_sync_mode_a_restarted_primary_shows_nothing_the_standby_does_not_hold(
    nodes: NodeFactory, site: tuple[Site, str]
) -> None:
    _, root = site
    primary, standby = await start_pair(
        nodes,
        primary_config={"sync_timeout": 30.0},  # the frozen standby never degrades it
        primary_extra=("--replication-mode", "sync"),
    )
    job_id = await start_crawl(primary.address, crawl_request(root))
    await eventually(lambda: pages_done(standby.address, job_id, 10), "10 pages on the standby")
    with standby.frozen():  # no more acks: the primary commits pages nobody holds
        frozen_at = await eventually(
            lambda: _offset_beyond(primary.address, 5), "pages the standby does not hold"
        )
        primary.kill()
        await primary.start()  # sync mode again; its store holds unreplicated pages
        async with grpc.aio.insecure_channel(primary.address) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await jobs_pb2_grpc.JobServiceStub(ch).GetJob(
                    jobs_pb2.GetJobRequest(id=job_id, limit=1), timeout=1.5
                )
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # it waits for the ack
    job = await get_job(primary.address, job_id)  # the standby caught up and acked
    held = await documents(standby.address, job_id)
    assert job.completed <= len(held) and (await role(standby.address)).applied_offset >= frozen_at
    final = await finished(primary.address, job_id)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note


async def _offset_beyond(primary: str, by: int) -> int | None:
    """The primary's offset once it is ``by`` past the last one a standby acked."""
    r = await role(primary)
    return r.applied_offset if r.lag_offsets >= by else None


# ---------------------------------------------------------------- (h) idempotency


async def test_start_crawl_retried_with_its_key_across_a_failover_returns_the_same_job(
    nodes: NodeFactory, site: tuple[Site, str]
) -> None:
    s, root = site
    metrics_at = f"127.0.0.1:{free_port()}"
    primary, standby = await start_pair(nodes, standby_config={"metrics_listen": metrics_at})
    req = crawl_request(root, key="the-nightly-crawl")
    async with JobClient([standby.address, primary.address], retry_budget=20.0) as client:
        job_id = await client.start_crawl(req)
        assert client.failover.preferred == primary.address  # found through Role
        # async replication: the registration must have reached the standby
        registered_at = (await role(primary.address)).applied_offset
        await eventually(lambda: offset_at_least(standby.address, registered_at), "replication")
        primary.kill()

        # The retry goes out while no node takes writes (the primary is down, the
        # standby refuses); the promotion comes a moment later; the retry lands on it.
        retry = asyncio.create_task(client.start_crawl(req))

        async def refused_by_the_standby() -> bool | None:
            samples = await scrape_metrics(metrics_at)
            refusals = metric(
                samples,
                "pagesift_grpc_requests_total",
                method="pagesift.v1.JobService/StartCrawl",
                code="FAILED_PRECONDITION",
            )
            return True if refusals >= 1 else None

        await eventually(refused_by_the_standby, "the retry to reach the standby", 20)
        assert not retry.done()  # refused there, and nobody else takes writes
        await promote(standby.address)
        again = await asyncio.wait_for(retry, 30)
        assert again == job_id
        assert client.failover.preferred == standby.address
        jobs = await client.list_jobs()
        assert [j.id for j in jobs] == [job_id]  # never a second job
        # and once more, now that the standby is the primary
        assert await client.start_crawl(req) == job_id
    final = await finished(standby.address, job_id)
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert_every_page_once(await documents(standby.address, job_id), s.expected_documents(root))


async def applies_a_write_made_after(
    primary: ServeProc, standby: ServeProc, seconds: float
) -> None:
    """Write marker jobs on the primary until one is written ``seconds`` after the call,
    and wait for the standby to apply it: the standby's event loop (its watchdog's too)
    ran through that whole window, however slow the machine."""
    start = asyncio.get_running_loop().time()
    while True:
        await start_crawl(primary.address, jobs_pb2.StartCrawlRequest(url="http://127.0.0.1:9/"))
        if asyncio.get_running_loop().time() - start >= seconds:
            break
        await asyncio.sleep(0.2)
    marker = (await role(primary.address)).applied_offset
    await eventually(lambda: offset_at_least(standby.address, marker), f"offset {marker}")


async def test_a_standby_with_unsafe_auto_promote_takes_over_once_the_primary_is_silent(
    nodes: NodeFactory,
) -> None:
    primary = nodes("primary")
    standby = nodes(
        "standby",
        role="standby",
        primary=primary.address,
        extra=("--auto-promote-after", "1", "--unsafe-auto-promote"),
    )
    await asyncio.gather(primary.start(), standby.start())
    await eventually(lambda: _connected(standby.address), "the standby to connect")
    await applies_a_write_made_after(primary, standby, seconds=3.0)  # 3x --auto-promote-after
    # connected all along: no promotion while the primary speaks
    assert (await role(standby.address)).role == pb.NODE_ROLE_STANDBY
    assert "auto-promoting" not in standby.log_text()
    primary.kill()

    async def promoted() -> pb.RoleResponse | None:
        r = await role(standby.address)
        return r if r.role == pb.NODE_ROLE_PRIMARY else None

    r = await eventually(promoted, "the standby to promote itself", timeout=20)
    assert r.epoch == 2
    assert "auto-promoting" in standby.log_text()
