"""A poison job is quarantined, not chased (issue 19, finding 2 and point 4).

The pure rule (``pagesift.core.jobs.quarantine``) first, with no I/O: interruptions and
worker losses counted, reset by progress, the threshold, suspects one at a time.

Then the real thing: ``pagesift serve`` children SIGKILLed while a job's page is in
flight on a loopback site, restarted, until the job is paused ``POISONED`` with the
page named in its evidence; and an etcd witness pair whose primary is frozen
(SIGSTOP) past its lease while the page is in flight, so the standby takes over, at
most ``poison_threshold`` times, while the owner's CancelJob through ``JobClient``
succeeds within a bound. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from functools import partial
from pathlib import Path

import grpc
import pytest
from aiohttp import web

from pagesift.cli import amain
from pagesift.cli.common import EXIT_JOB_NOT_COMPLETED
from pagesift.client import JobClient
from pagesift.core.jobs import quarantine
from pagesift.drill.fixture import Etcd
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from pagesift.v1 import replication_pb2 as pb
from tests import hostile
from tests.helpers import (
    ADMIN_KEY,
    ALICE,
    BOB,
    Metadata,
    NodeFactory,
    ServeProc,
    eventually,
    get_job,
    role,
    write_accounts,
)
from tests.hostile import workers as hw

LIMITS = quarantine.Limits(interruptions=2, worker_losses=3, progress_pages=20)
NEEDED = quarantine.progress_needed(LIMITS, 4)  # 20: more than 2 x concurrency 4


def marker(done_at_start: int, started_ms: int = 1_700_000_000_000) -> quarantine.RunMarker:
    return quarantine.RunMarker("run-1", "127.0.0.1:1", 3, started_ms, done_at_start)


def interrupted(done_at_start: int, done_now: int, *urls: str) -> quarantine.Interrupted:
    return quarantine.Interrupted(marker(done_at_start), done_now, urls, 1_700_000_001_000)


def lost(url: str, done_now: int) -> quarantine.WorkerLost:
    return quarantine.WorkerLost(url, done_now, "127.0.0.1:1", 3, 1_700_000_002_000)


# ---------------------------------------------------------------- the pure rule


def test_progress_needed_is_at_least_twice_the_concurrency() -> None:
    assert quarantine.progress_needed(LIMITS, 4) == 20
    assert quarantine.progress_needed(LIMITS, 32) == 64
    assert quarantine.progress_needed(quarantine.Limits(progress_pages=0), 0) == 1


def test_one_interruption_resumes_and_the_second_without_progress_poisons() -> None:
    first = quarantine.count(quarantine.Budget(), interrupted(0, 3, "http://s/p"), LIMITS, NEEDED)
    assert not first.poisoned and first.budget.interruptions == 1
    assert first.budget.suspect and first.budget.in_flight == ("http://s/p",)
    second = quarantine.count(first.budget, interrupted(3, 5, "http://s/p"), LIMITS, NEEDED)
    assert second.poisoned and second.budget.interruptions == 2
    assert "2 runs in a row" in second.reason
    assert len(second.budget.evidence) == 2 and "http://s/p" in second.budget.evidence[-1]


def test_an_interrupted_run_that_made_progress_starts_the_count_again() -> None:
    """A long crawl cut by unrelated failovers hours apart is never poisoned."""
    budget = quarantine.Budget()
    done = 0
    for _ in range(10):
        verdict = quarantine.count(
            budget, interrupted(done, done + NEEDED, "http://s/x"), LIMITS, NEEDED
        )
        assert not verdict.poisoned and verdict.budget.interruptions == 1
        budget, done = verdict.budget, done + NEEDED
    one_short = quarantine.count(budget, interrupted(done, done + NEEDED - 1), LIMITS, NEEDED)
    assert one_short.poisoned


def test_the_threshold_is_the_setting() -> None:
    limits = quarantine.Limits(interruptions=3)
    budget = quarantine.Budget()
    verdicts = []
    for _ in range(3):
        v = quarantine.count(budget, interrupted(0, 0), limits, NEEDED)
        budget = v.budget
        verdicts.append(v.poisoned)
    assert verdicts == [False, False, True]


def test_worker_losses_poison_at_their_own_threshold_unless_pages_were_done_between() -> None:
    budget = quarantine.Budget()
    for i, done in enumerate((10, 11, 12)):
        v = quarantine.count(budget, lost(f"http://s/doc{i}.pdf", done), LIMITS, NEEDED)
        budget = v.budget
    assert v.poisoned and budget.worker_losses == 3
    assert budget.in_flight == ("http://s/doc2.pdf",) and budget.interruptions == 0
    spread = quarantine.Budget()
    for i in range(6):  # one loss per NEEDED pages: sporadic bad documents
        v = quarantine.count(spread, lost(f"http://s/{i}.pdf", (i + 1) * NEEDED), LIMITS, NEEDED)
        assert not v.poisoned
        spread = v.budget
    assert spread.worker_losses == 1


def test_a_suspect_is_cleared_only_after_the_pages_needed() -> None:
    budget = quarantine.count(quarantine.Budget(), interrupted(0, 1), LIMITS, NEEDED).budget
    assert quarantine.cleared(budget, 1 + NEEDED - 1, 1, NEEDED) is None
    cleared = quarantine.cleared(budget, 1 + NEEDED, 1, NEEDED)
    assert cleared is not None and not cleared.suspect and cleared.mark == 1 + NEEDED
    assert (
        quarantine.cleared(quarantine.Budget(), 100, 0, NEEDED) is None
    )  # not a suspect: nothing to clear


def test_evidence_and_urls_are_bounded() -> None:
    urls = tuple(f"http://s/{'a' * 5000}{i}" for i in range(100))
    budget = quarantine.Budget()
    for _ in range(3 * quarantine.MAX_EVIDENCE):
        budget = quarantine.count(
            budget, interrupted(0, 0, *urls), quarantine.Limits(interruptions=10**6), 1
        ).budget
    assert len(budget.evidence) == quarantine.MAX_EVIDENCE
    assert len(budget.in_flight) == quarantine.MAX_IN_FLIGHT
    assert all(len(u) == quarantine.MAX_URL_CHARS for u in budget.in_flight)
    assert quarantine.Budget.decode(budget.encode()) == budget
    m = marker(7)
    assert quarantine.RunMarker.decode(m.encode()) == m


def test_suspects_run_one_at_a_time_in_arrival_order() -> None:
    s = quarantine.Suspects()
    assert s.admit("a") and not s.admit("b") and not s.admit("c")
    assert s.admit("a")  # the running one again
    assert s.release("b") is None and s.waiting == ["c"]  # a waiting one went away
    assert s.release("a") == "c" and s.running == "c"
    assert s.release("c") is None and s.running is None


# ---------------------------------------------------------------- a site with poison pages


class PoisonSite:
    """``/poison/{name}`` answers headers at once and holds its body back (bounded),
    counting each request, until ``cure()``; ``/hold/{name}`` the same, uncounted (an
    ordinary slow page); ``/ok/{n}`` answers at once."""

    HOLD_SECONDS = 30.0

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}  # poison pages only (``/hold/`` is not counted)
        self.cured = asyncio.Event()
        self.root = ""

    def cure(self) -> None:
        self.cured.set()

    async def poison(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if request.path.startswith("/poison/"):
            self.hits[name] = self.hits.get(name, 0) + 1
        resp = web.StreamResponse(headers={"Content-Type": "text/html"})
        await resp.prepare(request)
        if not self.cured.is_set():
            with suppress(TimeoutError):
                await asyncio.wait_for(self.cured.wait(), self.HOLD_SECONDS)
        await resp.write(f"<html><title>{name}</title><body>cured</body></html>".encode())
        return resp

    async def ok(self, request: web.Request) -> web.Response:
        n = request.match_info["n"]
        return web.Response(text=f"<html><title>ok {n}</title><body>page {n}</body></html>",
                            content_type="text/html")  # fmt: skip

    def url(self, path: str) -> str:
        return f"{self.root}{path}"

    def batch(self, name: str, ok: int = 3) -> jobs_pb2.StartBatchScrapeRequest:
        """The poison page first, then ``ok`` ordinary pages, one page at a time."""
        urls = [self.url(f"poison/{name}")] + [self.url(f"ok/{name}-{i}") for i in range(ok)]
        return jobs_pb2.StartBatchScrapeRequest(urls=urls, max_concurrency=1, max_retries=0)


@asynccontextmanager
async def poison_site() -> AsyncIterator[PoisonSite]:
    site = PoisonSite()
    app = web.Application()
    app.router.add_get("/poison/{name}", site.poison)
    app.router.add_get("/hold/{name}", site.poison)
    app.router.add_get("/ok/{n}", site.ok)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    site.root = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    try:
        yield site
    finally:
        site.cure()
        await runner.cleanup()


# long enough that a held page stays in flight until the test acts on it
NODE_CONFIG = {"read_timeout": 60.0, "poison_probation_seconds": 10.0}


async def start_batch(address: str, req: jobs_pb2.StartBatchScrapeRequest) -> str:
    async with grpc.aio.insecure_channel(address) as ch:
        return (await jobs_pb2_grpc.JobServiceStub(ch).StartBatchScrape(req, timeout=5)).id


async def list_paused(address: str) -> set[str]:
    async with grpc.aio.insecure_channel(address) as ch:
        resp = await jobs_pb2_grpc.JobServiceStub(ch).ListJobs(
            jobs_pb2.ListJobsRequest(states=[jobs_pb2.JOB_STATE_PAUSED]), timeout=5
        )
    for j in resp.jobs:
        assert j.paused.reason == jobs_pb2.PAUSE_REASON_POISONED
    return {j.id for j in resp.jobs}


async def state_is(
    address: str, job_id: str, state: jobs_pb2.JobState.ValueType
) -> jobs_pb2.GetJobResponse | None:
    try:
        job = await get_job(address, job_id)
    except grpc.aio.AioRpcError:
        return None  # a node between roles, or frozen
    return job if job.state == state else None


async def new_hit(site: PoisonSite, seen: dict[str, int]) -> list[str] | None:
    """The poison pages requested again since ``seen`` (updated), if any."""
    names = [name for name, n in site.hits.items() if n > seen.get(name, 0)]
    seen.update(site.hits)
    return names or None


# ---------------------------------------------------------------- SIGKILL, restart, repeat


@pytest.mark.system
async def test_a_job_that_crashes_its_node_twice_is_paused_poisoned_and_others_run(
    nodes: NodeFactory,
) -> None:
    """Two poison jobs: after the first crash both are suspects, but they run one at a
    time, so each is charged only for the crashes its own page caused: three crashes
    in all, not a crash loop. A job started after them completes; the owner resumes
    one (it completes once its page is cured) and cancels the other."""
    async with poison_site() as site:
        node = nodes("n", config=NODE_CONFIG)
        await node.start()
        a = await start_batch(node.address, site.batch("a"))
        c = await start_batch(node.address, site.batch("c"))
        seen: dict[str, int] = {}
        crashes = 0
        while await list_paused(node.address) != {a, c}:
            assert crashes < 4, f"{crashes} crashes and still not both quarantined"
            await eventually(lambda: new_hit(site, seen), "a poison page in flight", 20)
            node.kill()
            crashes += 1
            await node.start()
        assert crashes == 3  # 2 for the first job, then 1 more for the one that waited
        for job_id, name in ((a, "a"), (c, "c")):
            job = await get_job(node.address, job_id)
            assert job.state == jobs_pb2.JOB_STATE_PAUSED
            assert job.paused.reason == jobs_pb2.PAUSE_REASON_POISONED
            assert list(job.paused.in_flight_urls) == [site.url(f"poison/{name}")]
            assert job.paused.interruptions == 2 and job.paused.HasField("paused_at")
            assert "poisoned" in job.note and site.url(f"poison/{name}") in job.note
        assert "quarantined" in node.log_text()

        # a job started after the last crash completes while both stay paused
        b = await start_batch(
            node.address,
            jobs_pb2.StartBatchScrapeRequest(urls=[site.url(f"ok/b-{i}") for i in range(5)]),
        )
        done = await eventually(
            lambda: state_is(node.address, b, jobs_pb2.JOB_STATE_COMPLETED), "b completes", 20
        )
        assert done.completed == 5
        assert await list_paused(node.address) == {a, c}

        site.cure()
        async with JobClient(node.address, timeout=10) as client:
            assert await client.resume(a) == jobs_pb2.JOB_STATE_SCRAPING
            assert await client.cancel(c) == jobs_pb2.JOB_STATE_CANCELLED
            assert await client.cancel(c) == jobs_pb2.JOB_STATE_CANCELLED  # idempotent
        finished = await eventually(
            lambda: state_is(node.address, a, jobs_pb2.JOB_STATE_COMPLETED), "a completes", 30
        )
        assert finished.completed == 4 and not finished.HasField("paused")
        assert await list_paused(node.address) == set()


@pytest.mark.system
async def test_a_clean_restart_counts_no_interruption(nodes: NodeFactory) -> None:
    """SIGTERM (drain) clears the run markers: however often a node is restarted
    cleanly, its jobs are resumed, never quarantined."""
    async with poison_site() as site:
        node = nodes("n", config=NODE_CONFIG)
        await node.start()
        a = await start_batch(node.address, site.batch("a"))
        seen: dict[str, int] = {}
        for _ in range(3):
            await eventually(lambda: new_hit(site, seen), "the poison page in flight", 20)
            node.stop()
            await node.start()
        job = await get_job(node.address, a)
        assert job.state == jobs_pb2.JOB_STATE_SCRAPING and not job.HasField("paused")
        site.cure()
        await eventually(
            lambda: state_is(node.address, a, jobs_pb2.JOB_STATE_COMPLETED), "a completes", 30
        )


async def quarantined(node: ServeProc, site: PoisonSite, job_id: str, name: str) -> None:
    """SIGKILL ``node`` each time ``name``'s poison page is in flight, restart it, until
    ``job_id`` is paused (at most 3 crashes)."""
    seen: dict[str, int] = {}
    for _ in range(3):
        await eventually(lambda: new_hit(site, seen), "the poison page in flight", 20)
        node.kill()
        await node.start()
        paused = await state_is_md(node.address, job_id, jobs_pb2.JOB_STATE_PAUSED, ALICE.md)
        if paused is not None:
            return
    pytest.fail(f"job {job_id} not quarantined after 3 crashes")


async def state_is_md(
    address: str, job_id: str, state: jobs_pb2.JobState.ValueType, md: Metadata
) -> jobs_pb2.GetJobResponse | None:
    async with grpc.aio.insecure_channel(address) as ch:
        job = await jobs_pb2_grpc.JobServiceStub(ch).GetJob(
            jobs_pb2.GetJobRequest(id=job_id, status_only=True), metadata=md, timeout=5
        )
    return job if job.state == state else None


@pytest.mark.system
async def test_only_the_owner_or_the_admin_key_resumes_or_cancels_a_paused_job(
    nodes: NodeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another account sees no such job (NOT_FOUND for GetJob, ResumeJob, CancelJob);
    the admin key resumes and cancels it (``pagesift resume --admin-key``); the CLI's
    status names the reason and the page in flight."""
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    async with poison_site() as site:
        node = nodes("n", config={**NODE_CONFIG, "accounts_file": str(accounts)})
        await node.start()
        async with grpc.aio.insecure_channel(node.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            job = (await stub.StartBatchScrape(site.batch("a"), metadata=ALICE.md, timeout=5)).id
        await quarantined(node, site, job, "a")

        async with grpc.aio.insecure_channel(node.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            for call in (
                stub.GetJob(jobs_pb2.GetJobRequest(id=job), metadata=BOB.md, timeout=5),
                stub.ResumeJob(jobs_pb2.ResumeJobRequest(id=job), metadata=BOB.md, timeout=5),
                stub.CancelJob(jobs_pb2.CancelJobRequest(id=job), metadata=BOB.md, timeout=5),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ResumeJob(jobs_pb2.ResumeJobRequest(id=job), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert (await stub.GetJob(jobs_pb2.GetJobRequest(id=job), metadata=ALICE.md)).state == (
                jobs_pb2.JOB_STATE_PAUSED
            )

        server = ["--server", node.address]
        assert await amain(["status", job, "--api-key", ALICE.key, *server]) == 0
        out = capsys.readouterr().out
        assert "state:     paused" in out and "paused:    poisoned" in out
        assert f"in flight: {site.url('poison/a')}" in out
        assert await amain(["status", job, "--json", "--api-key", ALICE.key, *server]) == 0
        paused = json.loads(capsys.readouterr().out)["paused"]
        assert paused["reason"] == "poisoned" and paused["interruptions"] == 2
        assert paused["in_flight_urls"] == [site.url("poison/a")]
        assert await amain(["resume", job, "--admin-key", ADMIN_KEY, *server]) == 0
        assert capsys.readouterr().out.strip() == f"{job}: scraping"
        before = dict(site.hits)
        await eventually(lambda: new_hit(site, before), "the page fetched again", 20)
        assert await amain(["cancel", job, "--admin-key", ADMIN_KEY, "--json", *server]) == 0
        assert json.loads(capsys.readouterr().out) == {"id": job, "state": "cancelled"}
        assert await state_is_md(node.address, job, jobs_pb2.JOB_STATE_CANCELLED, ALICE.md)


# ---------------------------------------------------------------- extraction workers lost


@pytest.mark.system
async def test_a_job_whose_documents_keep_killing_workers_is_paused_unless_it_progresses(
    nodes: NodeFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every PDF conversion outlives its deadline (``document_timeout``), so its worker
    is killed (``PageError.worker_lost``). Three in a row pause the job, naming the
    third; the same three spread between ordinary pages are only page errors. ``batch
    --wait`` stops at the pause (it would wait for ever) with a not-completed status."""
    runner, root = await hostile.serve(hw.ROUTES)
    try:
        node = nodes(
            "n",
            config={
                "respect_robots": False,
                "extract_processes": 1,
                "document_timeout": 0.000_001,
                "poison_progress_pages": 4,  # progress: 4 pages (concurrency 1)
            },
        )
        await node.start()
        pdfs = [f"{root}workers/doc/{i}.pdf" for i in range(4)]
        pages = [f"{root}workers/page/{i}" for i in range(12)]
        poison = jobs_pb2.StartBatchScrapeRequest(urls=[*pdfs, pages[0]], max_concurrency=1)
        spread = jobs_pb2.StartBatchScrapeRequest(
            urls=[pdfs[0], *pages[:4], pdfs[1], *pages[4:8], pdfs[2], *pages[8:]],
            max_concurrency=1,
        )
        bad = await start_batch(node.address, poison)
        fine = await start_batch(node.address, spread)
        paused = await eventually(
            lambda: state_is(node.address, bad, jobs_pb2.JOB_STATE_PAUSED), "the pause", 30
        )
        assert paused.paused.reason == jobs_pb2.PAUSE_REASON_POISONED
        assert paused.paused.worker_losses == 3 and paused.paused.interruptions == 0
        assert list(paused.paused.in_flight_urls) == [pdfs[2]]
        assert "3 extraction workers lost" in paused.note
        assert paused.failed == 3 and paused.completed == 0  # the 4th PDF never ran
        done = await eventually(
            lambda: state_is(node.address, fine, jobs_pb2.JOB_STATE_COMPLETED), "the end", 30
        )
        assert done.failed == 3 and done.completed == 12 and not done.HasField("paused")

        argv = ["batch", *pdfs, "--concurrency", "1", "--wait", "--server", node.address]
        assert await asyncio.wait_for(amain(argv), 30) == EXIT_JOB_NOT_COMPLETED
        out = capsys.readouterr().out
        assert ": paused, 0 documents, 3 failed, 4 total (poisoned: pagesift resume" in out
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- a witness pair, SIGSTOP

TTL = 2
PAIR = "quarantine-pair"


async def primary_of(a: ServeProc, b: ServeProc) -> ServeProc | None:
    for node in (a, b):
        try:
            r = await role(node.address)
        except grpc.aio.AioRpcError:
            continue
        if r.role == pb.NODE_ROLE_PRIMARY:
            other = b if node is a else a
            try:
                ro = await role(other.address)
            except grpc.aio.AioRpcError:
                continue
            if ro.role == pb.NODE_ROLE_STANDBY and ro.connected:
                return node
    return None


@pytest.mark.system
async def test_a_witness_pair_quarantines_a_job_that_freezes_its_primary_and_cancel_works(
    nodes: NodeFactory, etcd: Etcd
) -> None:
    """The poison page's fetch freezes whichever node is primary (SIGSTOP past the
    lease). After ``poison_threshold`` (2) takeovers the job is paused on the new
    primary and its standby, and the pair stops failing over; an owner's CancelJob
    sent through JobClient while the primary is frozen succeeds within a bound."""
    async with poison_site() as site:
        extra = ("--witness", etcd.endpoint, "--pair", PAIR, "--witness-ttl", str(TTL))
        a = nodes("a", role="", extra=extra, config=NODE_CONFIG)
        b = nodes("b", role="", extra=extra, config=NODE_CONFIG)
        await asyncio.gather(a.start(), b.start())
        primary = await eventually(lambda: primary_of(a, b), "a primary and its standby", 30)
        job = await start_batch(primary.address, site.batch("p"))
        slow = jobs_pb2.StartBatchScrapeRequest(urls=[site.url("hold/other")], max_concurrency=1)
        other = await start_batch(primary.address, slow)  # the owner cancels it
        standby = b if primary is a else a
        for job_id in (job, other):  # on both nodes before anything fails
            await eventually(
                partial(state_is, standby.address, job_id, jobs_pb2.JOB_STATE_SCRAPING),
                "the jobs replicated",
                10,
            )
        seen: dict[str, int] = {}
        takeovers = 0
        cancel_seconds: float | None = None
        async with JobClient([a.address, b.address], timeout=10) as client:
            for _ in range(4):
                paused = await state_is(primary.address, job, jobs_pb2.JOB_STATE_PAUSED)
                if paused is not None:
                    break
                await eventually(lambda: new_hit(site, seen), "the poison page in flight", 30)
                with primary.frozen():
                    takeovers += 1
                    if cancel_seconds is None:  # the owner cancels while the pair fails over
                        t0 = time.monotonic()
                        state = await asyncio.wait_for(client.cancel(other), 40)
                        cancel_seconds = time.monotonic() - t0
                        assert state == jobs_pb2.JOB_STATE_CANCELLED
                    standby = b if primary is a else a
                    await until_primary(standby)
                primary = await eventually(
                    lambda: primary_of(a, b), "the frozen one to rejoin as standby", 30
                )
            else:
                pytest.fail("the job was never quarantined")
        assert takeovers == 2  # poison_threshold: then it stays paused
        assert cancel_seconds is not None and cancel_seconds < 30
        standby = b if primary is a else a
        for address in (primary.address, standby.address):  # the standby: from its replica
            got = await eventually(
                partial(state_is, address, job, jobs_pb2.JOB_STATE_PAUSED),
                "the pause on both nodes",
                10,
            )
            assert got.paused.reason == jobs_pb2.PAUSE_REASON_POISONED
            assert list(got.paused.in_flight_urls) == [site.url("poison/p")]
        hits = dict(site.hits)
        await asyncio.sleep(3 * TTL)  # no more takeover: nothing runs the poison page
        assert site.hits == hits
        assert await primary_of(a, b) is primary
        async with JobClient([a.address, b.address], timeout=10) as client:
            assert await client.cancel(job) == jobs_pb2.JOB_STATE_CANCELLED


async def until_primary(node: ServeProc) -> None:
    async def check() -> bool | None:
        try:
            r = await role(node.address)
        except grpc.aio.AioRpcError:
            return None
        return True if r.role == pb.NODE_ROLE_PRIMARY else None

    await eventually(check, "the standby to take over", 20)
