"""Worker isolation: a page's worker failure is charged to that page alone.

Unit level (a real ``WorkerPool``, real forkserver processes, the callables of
``tests.hostile.workers``): a call that crashes its worker, outlives its deadline or
runs past the address-space cap fails alone while 60 calls of another owner all
succeed (issue 19, finding 7: the old pool failed 4 of 60); the memory cap is a clean
error and the next call works; a worker whose call peaked past the recycle threshold
is replaced; a spinning worker ends at its CPU limit even when the node's loop
cannot kill it; an owner with a long queue cannot starve another; a worker that died
idle costs no call; a cancelled call's worker is killed; ``close`` fails every call.

Node level (a real node and the hostile site's ``/workers/`` pages): an HTML page
whose extraction outlives ``extract_timeout`` fails alone, naming the deadline, while
another account's pages complete (finding 5); and while a heavy page is extracted
and a document's worker is killed on its deadline, the node answers another account's
ListJobs within ``tests.liveness.bound`` of a control (that ListJobs timed before the
heavy pages start: 20 times it, at least 8 s, so a loaded box passes) and its event
loop never lags past ``tests.liveness.LAG_BOUND`` (3 s) -- the page is never
re-extracted on the event loop (finding 6: the old fallback froze the loop for the
whole extraction, 4.4 s on an idle box and longer on a loaded one); and one
account's queue of slow pages does not hold back another account's Scrape (the owner
reaches the pool from the job runtime).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from pagesift.primary.engine.workers import (
    Limits,
    PoolClosed,
    WorkerCrashed,
    WorkerOutOfMemory,
    WorkerPool,
    WorkerTimeout,
)
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests import hostile, liveness
from tests.helpers import (
    ALICE,
    BOB,
    TERMINAL,
    NodeFactory,
    eventually,
    free_port,
    metric,
    scrape_metrics,
    until,
    wait_done,
    write_accounts,
)
from tests.hostile import workers as hw

MiB = 1 << 20
GONE_WITHIN = 10.0


@contextlib.asynccontextmanager
async def pool_of(processes: int, limits: Limits | None = None) -> AsyncIterator[WorkerPool]:
    """A pool of real workers, closed at the end whatever happened."""
    pool = WorkerPool(processes, limits or Limits())
    try:
        yield pool
    finally:
        pool.close()


def exited_within(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` exits within ``timeout`` s (True if already gone)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the pool


async def test_a_crashing_call_fails_alone_and_every_call_of_another_owner_succeeds() -> None:
    async with pool_of(2, Limits(memory_bytes=512 * MiB)) as pool:
        alice = [pool.run(hw.echo, i, 0.01, timeout=30, owner="alice") for i in range(60)]
        bob = [
            pool.run(hw.crash, "exit", owner="bob"),
            pool.run(hw.crash, "segv", owner="bob"),
            pool.run(hw.hang, 60, timeout=0.5, owner="bob"),
            pool.run(hw.hog, 1024 * MiB, owner="bob"),
            pool.run(hw.hang, 60, timeout=0.5, owner="bob"),
        ]
        got = await asyncio.wait_for(asyncio.gather(*alice, *bob, return_exceptions=True), 90)
    assert got[:60] == list(range(60)), [g for g in got[:60] if isinstance(g, BaseException)]
    exit_, segv, hang1, hog, hang2 = got[60:]
    assert isinstance(exit_, WorkerCrashed) and exit_.charged, exit_
    assert "exit status 3" in str(exit_)
    assert isinstance(segv, WorkerCrashed) and "SIGSEGV" in str(segv), segv
    assert isinstance(hang1, WorkerTimeout) and isinstance(hang2, WorkerTimeout), (hang1, hang2)
    assert "0.5 s" in str(hang1)
    assert isinstance(hog, WorkerOutOfMemory) and "512 MiB" in str(hog), hog
    assert pool.deaths == {"crashed": 2, "deadline": 2, "memory": 1}


async def test_a_call_past_the_address_space_cap_is_a_clean_error_and_the_next_call_works() -> None:
    async with pool_of(1, Limits(memory_bytes=384 * MiB)) as pool:
        first = await pool.run(hw.worker_pid, timeout=30)
        with pytest.raises(WorkerOutOfMemory) as info:
            await pool.run(hw.hog, 512 * MiB, timeout=30)
        assert "memory cap (384 MiB)" in str(info.value)
        assert exited_within(first, GONE_WITHIN), "the worker that ran out of memory stayed"
        after = await pool.call(hw.hog, 64 * MiB, timeout=30)  # within the cap: fine
        assert after.value != first
        assert after.peak_rss_bytes >= 64 * MiB


async def test_a_worker_whose_call_peaked_past_the_recycle_threshold_is_replaced() -> None:
    async with pool_of(1, Limits(recycle_rss_bytes=160 * MiB)) as pool:
        small = await pool.call(hw.hog, 8 * MiB, timeout=30)
        again = await pool.call(hw.worker_pid, timeout=30)
        assert again.value == small.value, "a worker under the threshold was replaced"
        assert small.peak_rss_bytes < 160 * MiB
        big = await pool.call(hw.hog, 256 * MiB, timeout=30)
        assert big.value == small.value  # it ran in the same worker ...
        assert big.peak_rss_bytes >= 256 * MiB  # ... the peak of that call is reported ...
        assert exited_within(big.value, GONE_WITHIN)  # ... and the worker is gone after it
        fresh = await pool.call(hw.worker_pid, timeout=30)
        assert fresh.value != big.value
        assert fresh.peak_rss_bytes < 160 * MiB  # the new worker starts small
        assert pool.recycled == 1


async def test_an_owner_with_a_long_queue_cannot_starve_another() -> None:
    async with pool_of(2) as pool:
        await asyncio.gather(pool.run(hw.echo, 0), pool.run(hw.echo, 0))  # both started
        done: list[int] = []

        async def alice(i: int) -> None:
            await pool.run(hw.echo, i, 0.3, timeout=60, owner="alice")
            done.append(i)

        alices = [asyncio.create_task(alice(i)) for i in range(20)]
        try:
            await until(lambda: pool.waiting() == 18, "alice's calls to queue")
            assert await pool.run(hw.echo, "bob", timeout=60, owner="bob") == "bob"
            # bob got the second worker to free up: at most the two running calls and
            # the one served before him in turn were done first, not alice's whole queue
            assert len(done) <= 3, f"bob waited behind {len(done)} of alice's calls"
            await asyncio.wait_for(asyncio.gather(*alices), 60)
        finally:
            for t in alices:
                t.cancel()
        assert sorted(done) == list(range(20))


async def test_a_worker_spinning_past_its_cpu_limit_ends_even_if_the_node_cannot_kill_it() -> None:
    async with pool_of(1, Limits(cpu_margin_seconds=0)) as pool:
        busy = await pool.run(hw.worker_pid, timeout=30)  # idle: the next call is sent at once
        task = asyncio.create_task(pool.run(hw.spin, 60, timeout=0.5))
        await until(lambda: pool.busy() == 1, "the call to start")
        await asyncio.sleep(0.05)  # the call is on its way
        # the node's loop is blocked from here (a blocking wait): its deadline cannot
        # fire, and RLIMIT_CPU (the CPU used so far plus 0.5 s, whole seconds) ends it
        assert exited_within(busy, GONE_WITHIN), "a spinning worker outlived its CPU limit"
        with pytest.raises((WorkerCrashed, WorkerTimeout)):
            await task
        assert await pool.run(hw.echo, 1, timeout=30) == 1


async def test_a_worker_that_died_idle_costs_no_call() -> None:
    async with pool_of(1) as pool:
        idle = await pool.run(hw.worker_pid, timeout=30)
        os.kill(idle, signal.SIGKILL)
        assert exited_within(idle, GONE_WITHIN)
        # the call goes to the dead worker first, sees it die before starting, and is
        # sent again to a fresh one: not charged to the call
        assert await pool.run(hw.echo, "fine", timeout=30) == "fine"
        assert await pool.run(hw.worker_pid, timeout=30) != idle
        assert "crashed" not in pool.deaths


async def test_a_cancelled_call_kills_its_worker_and_the_pool_goes_on() -> None:
    async with pool_of(1) as pool:
        busy = await pool.run(hw.worker_pid, timeout=30)  # idle: the next call is sent at once
        task = asyncio.create_task(pool.run(hw.hang, 60))
        await until(lambda: pool.busy() == 1, "the call to start")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert exited_within(busy, GONE_WITHIN), "a cancelled call's worker kept running"
        assert await pool.run(hw.echo, 7, timeout=30) == 7


async def test_closing_the_pool_fails_the_calls_in_flight_and_waiting() -> None:
    pool = WorkerPool(1)
    try:
        running = asyncio.create_task(pool.run(hw.hang, 60))
        await until(lambda: pool.busy() == 1, "the call to start")
        (busy,) = pool.pids()
        waiting = asyncio.create_task(pool.run(hw.echo, 1))
        await until(lambda: pool.waiting() == 1, "the second call to queue")
    finally:
        pool.close()
    for task in (running, waiting):
        with pytest.raises(PoolClosed):
            await asyncio.wait_for(task, 30)
    assert exited_within(busy, GONE_WITHIN)
    with pytest.raises(PoolClosed):
        await pool.run(hw.echo, 1)


# ---------------------------------------------------------------- a node


@contextlib.asynccontextmanager
async def node_and_site(
    nodes: NodeFactory, tmp_path: Path, **config: object
) -> AsyncIterator[tuple[jobs_pb2_grpc.JobServiceAsyncStub, str]]:
    """A ``pagesift serve`` process with two extraction workers, and the hostile site's
    ``/workers/`` pages: (a stub on the node, the site's root URL)."""
    runner, root = await hostile.serve(hw.ROUTES)
    accounts = write_accounts(tmp_path / "accounts.toml")
    settings = {
        "accounts_file": str(accounts),
        "respect_robots": False,
        "max_body_bytes": hw.HEAVY_BYTES,
        "extract_processes": 2,
        **config,
    }
    node = nodes("node", config=settings)
    try:
        await node.start()
        async with grpc.aio.insecure_channel(node.address) as channel:
            yield jobs_pb2_grpc.JobServiceStub(channel), root
    finally:
        await runner.cleanup()


async def control_of(stub: jobs_pb2_grpc.JobServiceAsyncStub) -> float:
    """Alice's ListJobs timed before anything heavy runs: the control (``tests.liveness``)."""
    return await liveness.control(
        lambda: stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=ALICE.md, timeout=30)
    )


async def answers_meanwhile(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str, md: tuple[tuple[str, str], ...]
) -> tuple[float, jobs_pb2.GetJobResponse]:
    """Poll another account's (alice's) ListJobs until job ``job_id`` ends: the slowest
    answer (s) and the job at its end."""
    slowest = 0.0
    deadline = time.monotonic() + 90
    for _ in range(2000):
        t0 = time.monotonic()
        await stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=ALICE.md, timeout=30)
        slowest = max(slowest, time.monotonic() - t0)
        req = jobs_pb2.GetJobRequest(id=job_id, status_only=True)
        job = await stub.GetJob(req, metadata=md)
        if job.state in TERMINAL:
            return slowest, job
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end in time")


async def errors_of(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str, md: tuple[tuple[str, str], ...]
) -> dict[str, jobs_pb2.PageError]:
    resp = await stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=job_id), metadata=md)
    return {e.url.rsplit("/workers/", 1)[-1]: e for e in resp.errors}


@pytest.mark.system
async def test_an_extraction_past_its_deadline_fails_that_page_alone(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    metrics_at = f"127.0.0.1:{free_port()}"
    # read_timeout: the site builds the 11 MB heavy pages per request, which a loaded
    # box can take more than the suite's 1 s to start sending
    config = {"extract_timeout": 1.0, "metrics_listen": metrics_at, "read_timeout": 10.0}
    async with node_and_site(nodes, tmp_path, **config) as (stub, root):
        control = await control_of(stub)
        heavy = [f"{root}workers/heavy.html?links={n}" for n in (200_000, 199_999)]
        bobs = await stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=heavy, max_concurrency=2), metadata=BOB.md
        )
        mine = [f"{root}workers/page/{i}" for i in range(30)]
        mine += [f"{root}workers/doc/{i}.pdf" for i in range(10)]
        alices = await stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=mine, max_concurrency=4), metadata=ALICE.md
        )
        slowest, bob_job = await answers_meanwhile(stub, bobs.id, BOB.md)
        alice_job = await wait_done(stub, alices.id, ALICE.md, timeout=60)
        bob_errors = await errors_of(stub, bobs.id, BOB.md)
        alice_errors = await errors_of(stub, alices.id, ALICE.md)
        samples = await scrape_metrics(metrics_at)
    limit = liveness.bound(control)
    assert slowest < limit, f"ListJobs took {slowest:.1f} s while the heavy pages ran ({control=})"
    lag = metric(samples, "pagesift_event_loop_lag_max_seconds")
    assert lag < liveness.LAG_BOUND, f"the node's event loop lagged {lag:.2f} s"
    assert sorted(bob_errors) == sorted(u.rsplit("/workers/", 1)[-1] for u in heavy), bob_job
    for err in bob_errors.values():
        assert err.code == "parse_failed", err
        assert "took over 1s" in err.message and "killed" in err.message, err.message
    assert not alice_errors, {k: v.message for k, v in alice_errors.items()}
    assert alice_job.state == jobs_pb2.JOB_STATE_COMPLETED
    assert alice_job.completed == 40
    assert metric(samples, "pagesift_worker_losses_total", cause="deadline") == 2
    assert metric(samples, "pagesift_worker_peak_memory_bytes_count") >= 40


@pytest.mark.system
async def test_a_page_whose_worker_was_killed_is_never_redone_on_the_event_loop(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    # late.pdf arrives a second after heavy.html, whose extraction then runs for
    # seconds; its conversion is killed at once (document_timeout). The old pool
    # killed every worker, and heavy.html was extracted again on the event loop.
    metrics_at = f"127.0.0.1:{free_port()}"
    config = {"document_timeout": 0.000_001, "read_timeout": 5.0, "metrics_listen": metrics_at}
    async with node_and_site(nodes, tmp_path, **config) as (stub, root):
        control = await control_of(stub)
        urls = [f"{root}workers/heavy.html", f"{root}workers/late.pdf?delay=1"]
        job = await stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=urls, max_concurrency=2), metadata=BOB.md
        )
        slowest, done = await answers_meanwhile(stub, job.id, BOB.md)
        errors = await errors_of(stub, job.id, BOB.md)
        lag = metric(await scrape_metrics(metrics_at), "pagesift_event_loop_lag_max_seconds")
    print(f"ListJobs: control {control:.3f} s, slowest {slowest:.3f} s; loop lag max {lag:.3f} s")
    # the inline fallback held the loop for the whole extraction: the lag shows it
    assert lag < liveness.LAG_BOUND, f"the node's event loop lagged {lag:.2f} s"
    limit = liveness.bound(control)
    assert slowest < limit, f"ListJobs took {slowest:.1f} s: the loop was blocked ({control=})"
    assert list(errors) == ["late.pdf?delay=1"], errors
    assert errors["late.pdf?delay=1"].code == "parse_failed"
    assert "took over" in errors["late.pdf?delay=1"].message
    assert done.completed == 1  # heavy.html, extracted whole in its worker


@pytest.mark.system
async def test_one_accounts_queue_of_slow_pages_does_not_hold_back_another_accounts_scrape(
    nodes: NodeFactory, tmp_path: Path
) -> None:
    # One worker; bob's eight slow pages (about a second of extraction each) queue
    # for it; alice's one page is served at the next turn, not after bob's queue.
    async with node_and_site(nodes, tmp_path, extract_processes=1) as (stub, root):
        urls = [f"{root}workers/heavy.html?links={40_000 + i}" for i in range(8)]
        bobs = await stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=urls, max_concurrency=8), metadata=BOB.md
        )

        async def bob_started() -> bool | None:
            req = jobs_pb2.GetJobRequest(id=bobs.id, status_only=True)
            job = await stub.GetJob(req, metadata=BOB.md)
            return True if job.completed >= 1 else None

        await eventually(bob_started, "bob's first page", timeout=60)
        page = await stub.Scrape(
            jobs_pb2.ScrapeRequest(url=f"{root}workers/page/1"), metadata=ALICE.md, timeout=60
        )
        req = jobs_pb2.GetJobRequest(id=bobs.id, status_only=True)
        bob_then = (await stub.GetJob(req, metadata=BOB.md)).completed
        done = await wait_done(stub, bobs.id, BOB.md, timeout=120)
    assert page.document.title == "page 1"
    # FIFO would have served alice after bob's whole queue (7 or 8 done); her turn
    # comes after at most the page running and the one served before her in turn
    assert bob_then <= 4, f"alice's page waited for {bob_then} of bob's 8 pages"
    assert done.completed == 8
