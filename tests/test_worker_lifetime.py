"""Worker lifetime: no process a node starts outlives the node, whatever ends it.

A real ``pagesift serve`` primary scrapes the demo site with extraction workers (the
site's ``/files/big.html`` is large enough to be extracted in a worker process); its
descendants (forkserver, workers, resource tracker) are recorded by walking
``/proc`` while it runs, each held by a pidfd (exact: no pid reuse can fool the
check), then the node is killed with SIGKILL (or stopped with SIGTERM) mid-crawl
and every recorded process must be gone within a bounded wait. A lower-level test
kills a node while its worker is in the middle of a task. A pool call past its timeout
kills its stuck worker and the pool starts afresh. Every process a test
starts is SIGKILLed through its pidfd at the end, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest

from pagesift.demo.site import Site
from pagesift.primary.engine.workers import WorkerPool, WorkerTimeout
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import TERMINAL, NodeFactory, ServeProc, SiteSpec

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="walks /proc and uses pidfds (Linux)"
)

GONE_WITHIN = 10.0  # seconds a descendant may outlive its node


def _ppids() -> dict[int, int]:
    """pid -> parent pid of every process now visible in /proc."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rindex(b")") + 2 :].split()
        out[int(name)] = int(fields[1])
    return out


def descendants(roots: set[int]) -> set[int]:
    """Every live process below ``roots`` (not the roots themselves)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _ppids().items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    for _ in range(10_000):  # a process tree is far smaller than this
        if not todo:
            break
        for child in children.get(todo.pop(), []):
            if child not in found and child not in roots:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


class Tracked:
    """Processes held by pidfds: exact liveness checks and a final SIGKILL."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}
        self.names: dict[int, str] = {}

    def add(self, pids: set[int]) -> None:
        for pid in pids - self.fds.keys():
            try:
                self.fds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            self.names[pid] = cmdline(pid)

    def alive(self) -> list[int]:
        poller = select.poll()  # not select(): a long test run's fds may pass 1024
        for fd in self.fds.values():
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(0)}  # a pidfd is readable once it exited
        return sorted(pid for pid, fd in self.fds.items() if fd not in ready)

    def wait_gone(self, timeout: float) -> list[int]:
        """Poll (bounded) until every tracked process exited; returns the survivors."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.alive()
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)

    def describe(self, pids: list[int]) -> str:
        return "; ".join(f"{pid}: {self.names.get(pid, '?')[:160]}" for pid in pids)

    def kill_all(self) -> None:
        for pid in self.alive():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.fds[pid], signal.SIGKILL)
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


@contextlib.contextmanager
def tracked() -> Iterator[Tracked]:
    t = Tracked()
    try:
        yield t
    finally:
        t.kill_all()


def _is_forkserver(pid: int) -> bool:
    # the forkserver and the workers it forks share its command line
    return "multiprocessing.forkserver" in cmdline(pid)


def workers_of(pids: set[int]) -> set[int]:
    """The extraction workers below ``pids``: children of a forkserver among them."""
    ppids = _ppids()
    servers = {pid for pid in pids if _is_forkserver(pid) and not _is_forkserver(ppids.get(pid, 0))}
    return {pid for pid, ppid in ppids.items() if ppid in servers}


def tree_of(pid: int) -> set[int]:
    """``pid``'s descendants, plus those of any forkserver among them (a worker the
    forkserver forks after this scan is still found through it)."""
    below = descendants({pid})
    return below | workers_of(below)


async def poll_until_workers(node: ServeProc, at_least: int, timeout: float = 30.0) -> set[int]:
    """Wait (bounded) until the node has ``at_least`` extraction workers; its tree."""
    assert node.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tree = tree_of(node.proc.pid)
        if len(workers_of(tree)) >= at_least:
            return tree
        await asyncio.sleep(0.05)
    tree = tree_of(node.proc.pid)
    raise AssertionError(f"no extraction worker after {timeout} s: {sorted(tree)}")


@pytest.fixture
def site_spec() -> SiteSpec:
    # big.html (256 KiB, under the 1 MiB body cap) is a document extracted in a worker
    return SiteSpec(pages=200, slow_seconds=1.5, big_bytes=256 * 1024)


@pytest.mark.system
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
async def test_no_process_of_a_node_outlives_it(
    nodes: NodeFactory, site: tuple[Site, str], how: str
) -> None:
    s, root = site
    # per_host_delay spreads the job's pages over ~8 s: the kill lands mid-job
    node = nodes("node", config={"extract_processes": 2, "per_host_delay": 0.05})
    await node.start()
    assert node.proc is not None
    pages = sorted(s.expected_documents(root))[:150]
    with tracked() as procs:
        async with grpc.aio.insecure_channel(node.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            job = await stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(
                    urls=[root + "files/big.html", *pages], max_concurrency=2
                )
            )
            procs.add(await poll_until_workers(node, 1))
            now = await stub.GetJob(jobs_pb2.GetJobRequest(id=job.id, limit=1))
            assert now.state not in TERMINAL, f"the job ended before the kill: {now.note}"
        procs.add(tree_of(node.proc.pid))
        assert any(_is_forkserver(pid) for pid in procs.fds), procs.describe(sorted(procs.fds))
        if how == "SIGKILL":
            node.kill()
        else:
            node.proc.terminate()
            assert node.proc.wait(20) == 0, node.log_text()[-2000:]
        procs.add(workers_of(set(procs.fds)))  # a worker forked just before the kill
        survivors = procs.wait_gone(GONE_WITHIN)
        assert not survivors, (
            f"{len(survivors)} of the node's {len(procs.fds)} processes alive "
            f"{GONE_WITHIN} s after {how}: {procs.describe(survivors)}"
        )


# A minimal node: a pool of one worker that blocks in a task (an HTTP request the
# test answers never), or that finishes a task and then closes the pool and exits.
NODE_SCRIPT = """
import asyncio, os, sys, urllib.request
from pagesift.primary.engine.workers import WorkerPool

async def main(mode, url):
    pool = WorkerPool(1)
    print(await pool.run(os.getpid), flush=True)
    if mode == "busy":
        await pool.run(urllib.request.urlopen, url, None, 600)
    pool.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def start_node_script(mode: str, url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", NODE_SCRIPT, mode, url],
        stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def read_line(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> str:
    """One stdout line, bounded in time (the node is killed on timeout)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        raise AssertionError(f"no output from the node in {timeout} s")
    return proc.stdout.readline().decode().strip()


@pytest.mark.system
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_worker_busy_in_a_task_dies_with_its_node(sig: signal.Signals) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener, tracked() as procs:
        listener.settimeout(30)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/hold"
        node = start_node_script("busy", url)
        try:
            worker = int(read_line(node))
            procs.add(tree_of(node.pid))
            assert worker in procs.fds, procs.describe(sorted(procs.fds))
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(30)
                # the request has arrived: the worker is now inside its task, waiting
                assert conn.recv(65536).startswith(b"GET /hold")
                os.kill(node.pid, sig)
                node.wait(10)
                procs.add(workers_of(set(procs.fds)))
                survivors = procs.wait_gone(GONE_WITHIN)
                assert not survivors, procs.describe(survivors)
                conn.settimeout(GONE_WITHIN)
                assert conn.recv(65536) == b""  # EOF: the worker's socket died with it
        finally:
            if node.poll() is None:
                node.kill()
                node.wait(10)
            assert node.stdout is not None
            node.stdout.close()


@pytest.mark.system
def test_a_node_that_closes_its_pool_and_exits_leaves_nothing() -> None:
    with tracked() as procs:
        node = start_node_script("idle", "-")
        try:
            int(read_line(node))
            procs.add(tree_of(node.pid))
            assert any(_is_forkserver(pid) for pid in procs.fds)
            assert node.wait(20) == 0
            survivors = procs.wait_gone(GONE_WITHIN)
            assert not survivors, procs.describe(survivors)
        finally:
            if node.poll() is None:
                node.kill()
                node.wait(10)
            assert node.stdout is not None
            node.stdout.close()


async def test_a_call_past_its_timeout_kills_its_stuck_worker_and_the_pool_starts_afresh() -> None:
    pool = WorkerPool(1)
    try:
        stuck = await pool.run(os.getpid)
        pidfd = os.pidfd_open(stuck)
        try:
            t0 = time.monotonic()
            with pytest.raises(WorkerTimeout):
                await pool.run(time.sleep, 120, timeout=0.5)  # C code that does not return
            assert time.monotonic() - t0 < 30  # its 0.5 s timeout, not the call's 120 s
            ready, _, _ = select.select([pidfd], [], [], GONE_WITHIN)
            assert ready, f"worker {stuck} still alive after its call timed out"
        finally:
            os.close(pidfd)
        fresh = await pool.run(os.getpid, timeout=30)
        assert fresh != stuck
        assert await pool.run(sum, [1, 2, 3], timeout=30) == 6  # in time: a plain result
    finally:
        pool.close()
