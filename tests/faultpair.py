"""A witness pair wired for fault injection, the client that watches it, and the faults.

What it owns
------------
``FaultPair``: two ``pagesift serve`` children on one witness (no ``--role``: the lease
decides), each with its own links, so that one link can fail alone:

- ``PairNode.etcd``: one ``CutProxy`` per etcd member; the node's ``--witness`` names
  the proxies, so cutting them is "etcd reachable by the other node and not this one";
- ``PairNode.peer``: a ``CutProxy`` in front of the node, which the node advertises
  (``--advertise``): its standby dials the replication stream through it, so cutting
  the primary's peer proxy cuts the stream (and the failsafe grants it carries) while
  the test still reaches both nodes directly.

Every write a node commits is traced (``PAGESIFT_WRITE_TRACE`` set for the children
only, ``trace_env``) into one file, which ``tests/writechecker`` reads.

``Watcher``: the client. Every ``interval`` it asks both nodes their role and reads,
from each node that says it is the primary, the documents of the watched jobs it has
not read yet (per node: a node's list only grows, a resynced one starts over): the
pages the client saw acknowledged. It also samples the primary's page count (the
pages/s figures) and keeps every role sample (the primaries it ever saw).

``keep_crawling`` (between rounds) resumes a paused crawl or starts a new one, so
every round has pages to write. ``FAULTS`` and ``inject``: the faults of the
randomized rounds, each a bounded coroutine that breaks something, holds it, and
heals it: etcd stopped (SIGSTOP), etcd killed and restarted, the primary's etcd link
cut, the stream cut during an etcd outage, the primary or the standby SIGKILLed and
restarted on its command line.

Bounds
------
Every RPC has a deadline, every wait is ``tests.helpers.eventually``; the watcher runs
until ``stop`` and each of its rounds is bounded by its RPC deadlines; proxies close
with the pair (``close``), the nodes with the ``NodeFactory`` that made them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
import grpc

from pagesift.coord.keys import state_key, witness_pair
from pagesift.core.ha.election import PairState
from pagesift.core.replication.writetrace import ENV as TRACE_ENV
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from pagesift.v1 import replication_pb2 as rpb
from tests.cutproxy import CutProxy
from tests.etcdcluster import EtcdCluster
from tests.helpers import NodeFactory, ServeProc, crawl, eventually, role, wait_ready
from tests.writechecker import Verdict, Write, check, parse

#: the witness ttl of the fault tests: etcd's practical minimum, so a round takes seconds
TTL = 2
RPC_TIMEOUT = 5.0
#: sync replication: a page is visible (acknowledged) once the standby applied it, so
#: no page the client saw may be missing from whichever node is primary at the end
#: (in async mode a killed primary's unreplicated tail is lost by design)
SYNC = {"replication_mode": "sync", "sync_timeout": 1.0}


@contextlib.contextmanager
def trace_env(path: Path) -> Iterator[None]:
    """``PAGESIFT_WRITE_TRACE=path`` while a child is launched (it copies the
    environment), and the caller's environment as it was after."""
    before = os.environ.get(TRACE_ENV)
    os.environ[TRACE_ENV] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRACE_ENV, None)
        else:
            os.environ[TRACE_ENV] = before


class Link:
    """One node's way to every etcd member: a proxy per member."""

    def __init__(self, etcd: EtcdCluster) -> None:
        self.proxies = [CutProxy(m.address) for m in etcd.members]

    @property
    def endpoint(self) -> str:
        return "etcd://" + ",".join(p.address for p in self.proxies)

    async def start(self) -> None:
        for p in self.proxies:
            await p.start()

    async def cut(self) -> None:
        for p in self.proxies:
            await p.cut()

    def blackhole(self) -> None:
        for p in self.proxies:
            p.blackhole()

    async def heal(self) -> None:
        for p in self.proxies:
            await p.heal()

    async def close(self) -> None:
        for p in self.proxies:
            await p.close()


@dataclass
class PairNode:
    proc: ServeProc
    etcd: Link
    peer: CutProxy

    @property
    def address(self) -> str:
        return self.proc.address


class FaultPair:
    def __init__(
        self,
        make: NodeFactory,
        etcd: EtcdCluster,
        trace: Path,
        *,
        name: str = "faults",
        ttl: int = TTL,
        config: Mapping[str, Any] | None = None,
        clock_ahead: float = 0.0,
    ) -> None:
        """``clock_ahead``: node b's monotonic clock runs that many seconds ahead of
        node a's (its own time namespace: ``unshare --time --monotonic``)."""
        self.etcd = etcd
        self.trace = trace
        self.name = name
        self.config = dict(config or {})
        self.ttl = ttl
        self.nodes: list[PairNode] = []
        for label in ("a", "b"):
            wrapper: list[str] = []
            if label == "b" and clock_ahead:
                wrapper = ["unshare", "--time", "--monotonic", f"{clock_ahead:.0f}"]
            proc = make(f"{name}-{label}", role="", config=dict(config or {}), wrapper=wrapper)
            self.nodes.append(PairNode(proc, Link(etcd), CutProxy(proc.address)))

    async def start(self) -> FaultPair:
        for n in self.nodes:
            await n.etcd.start()
            await n.peer.start()
            n.proc.extra = [
                "--witness", n.etcd.endpoint, "--pair", self.name,
                "--witness-ttl", str(self.ttl), "--advertise", n.peer.address,
            ]  # fmt: skip
            self.launch(n)
        await asyncio.gather(*(wait_ready(n.address) for n in self.nodes))
        return self

    def launch(self, node: PairNode) -> None:
        """(Re)start the node's process on its command line, traced."""
        with trace_env(self.trace):
            node.proc.launch()

    async def restart(self, node: PairNode) -> None:
        self.launch(node)
        await wait_ready(node.address)

    def by_address(self, address: str) -> PairNode:
        return next(n for n in self.nodes if n.address == address)

    async def settled(self) -> tuple[PairNode, PairNode] | None:
        """(primary, standby) when one node is the primary and the other follows it."""
        try:
            ra, rb = [await role(n.address) for n in self.nodes]
        except grpc.aio.AioRpcError:
            return None
        a, b = self.nodes
        for p, s, rp, rs in ((a, b, ra, rb), (b, a, rb, ra)):
            primary = rp.role == rpb.NODE_ROLE_PRIMARY
            follows = rs.role == rpb.NODE_ROLE_STANDBY and rs.connected
            if primary and follows and rs.peer == p.peer.address:
                return p, s
        return None

    async def vouched(self) -> tuple[PairNode, PairNode] | None:
        """(primary, standby) once settled and the pair state in etcd names the standby
        among those whose failsafe grants count (``PairState.standbys``): before that a
        new primary has no one to vouch for it, and an outage stops it as it should."""
        found = await self.settled()
        if found is None:
            return None
        primary, standby = found
        try:
            standby_id = (await role(standby.address)).node_id
        except grpc.aio.AioRpcError:
            return None
        host, port = self.etcd.members[0].address.rsplit(":", 1)
        client = aetcd.Client(host=host, port=int(port), timeout=RPC_TIMEOUT)
        try:
            cluster = str(self.config.get("cluster", ""))
            key = state_key(witness_pair(self.name, cluster)).encode()
            got = await asyncio.wait_for(client.get(key), RPC_TIMEOUT)
        except (aetcd.ClientError, TimeoutError):
            return None
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 1)
        if got is None or standby_id not in PairState.parse(got.value).standbys:
            return None
        return primary, standby

    async def elected(self, timeout: float = 40.0) -> tuple[PairNode, PairNode]:
        return await eventually(
            self.settled, f"pair {self.name}: a primary and its standby", timeout
        )

    def writes(self) -> list[Write]:
        return parse(self.trace.read_text()) if self.trace.exists() else []

    async def close(self) -> None:
        for n in self.nodes:
            await n.peer.close()
            await n.etcd.close()


# ---------------------------------------------------------------- the client


async def start_job(address: str, req: jobs_pb2.StartCrawlRequest) -> str:
    async with grpc.aio.insecure_channel(address) as ch:
        resp = await jobs_pb2_grpc.JobServiceStub(ch).StartCrawl(req, timeout=RPC_TIMEOUT)
        return str(resp.id)


async def job_on(address: str, job_id: str) -> jobs_pb2.GetJobResponse:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        resp: jobs_pb2.GetJobResponse = await stub.GetJob(
            jobs_pb2.GetJobRequest(id=job_id, limit=1), timeout=RPC_TIMEOUT
        )
        return resp


async def urls_from(address: str, job_id: str, skip: int) -> tuple[list[str], int]:
    """The URLs of the job's documents on ``address`` from ``skip`` on, and the next skip."""
    urls: list[str] = []
    async with grpc.aio.insecure_channel(address) as ch:
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        for _ in range(1000):
            resp = await stub.GetJob(
                jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=100), timeout=RPC_TIMEOUT
            )
            urls.extend(d.url for d in resp.documents)
            if not resp.HasField("next_skip") or resp.next_skip == skip:
                skip += len(resp.documents)
                break
            skip = resp.next_skip
    return urls, skip


def paced(root: str) -> jobs_pb2.StartCrawlRequest:
    """A crawl of the demo site that lasts through a fault: a few pages a second."""
    return crawl(root, max_concurrency=2, delay=0.1)


async def pages_on(node: PairNode, job_id: str) -> int:
    job = await job_on(node.address, job_id)
    return int(job.completed + job.failed)


async def crawling(pair: FaultPair, root: str, watcher: Watcher, at_least: int = 10) -> str:
    """A paced crawl on the elected primary, watched, once ``at_least`` pages are in."""
    primary, _ = await pair.elected()
    job_id = await start_job(primary.address, paced(root))
    watcher.watch(job_id)

    async def enough() -> int | None:
        done = await pages_on(primary, job_id)
        return done if done >= at_least else None

    await eventually(enough, f"{at_least} pages", 60)
    return job_id


async def resume_job(address: str, job_id: str) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        await stub.ResumeJob(jobs_pb2.ResumeJobRequest(id=job_id), timeout=RPC_TIMEOUT)


async def keep_crawling(pair: FaultPair, root: str, watcher: Watcher, pages: int = 3) -> str:
    """Between rounds: the watched crawl progressing again on the elected primary (a
    paused one resumed, a finished or stuck one replaced by a new crawl); its id."""
    primary, _ = await pair.elected(timeout=60)
    job_id = watcher.jobs[-1]
    job = await job_on(primary.address, job_id)
    if job.state == jobs_pb2.JOB_STATE_PAUSED:
        await resume_job(primary.address, job_id)
    elif job.state != jobs_pb2.JOB_STATE_SCRAPING:
        return await crawling(pair, root, watcher)
    start = job.completed + job.failed

    async def moved() -> bool | None:
        return True if await pages_on(primary, job_id) >= start + pages else None

    try:
        await eventually(moved, f"job {job_id} to progress", 30)
    except AssertionError:
        return await crawling(pair, root, watcher)
    return job_id


@dataclass
class Sample:
    at: float  # time.monotonic() of the test process
    primaries: tuple[str, ...]  # addresses answering NODE_ROLE_PRIMARY
    pages: int  # completed + failed on the first primary, summed over the jobs (-1: none)


@dataclass
class Watcher:
    pair: FaultPair
    interval: float = 0.5
    jobs: list[str] = field(default_factory=list)
    acknowledged: dict[str, set[str]] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    _skips: dict[tuple[str, str], int] = field(default_factory=dict)

    def watch(self, job_id: str) -> None:
        self.jobs.append(job_id)
        self.acknowledged.setdefault(job_id, set())

    async def _primaries(self) -> tuple[str, ...]:
        out = []
        for n in self.pair.nodes:
            with contextlib.suppress(grpc.aio.AioRpcError):
                if (await role(n.address)).role == rpb.NODE_ROLE_PRIMARY:
                    out.append(n.address)
        return tuple(out)

    async def poll(self) -> Sample:
        primaries = await self._primaries()
        pages = -1
        for address in primaries:
            for job_id in self.jobs:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    key = (address, job_id)
                    urls, skip = await urls_from(address, job_id, self._skips.get(key, 0))
                    self.acknowledged[job_id].update(urls)
                    self._skips[key] = skip
        if primaries:
            total = 0
            with contextlib.suppress(grpc.aio.AioRpcError):
                for job_id in self.jobs:
                    job = await job_on(primaries[0], job_id)
                    total += job.completed + job.failed
                pages = total
        sample = Sample(time.monotonic(), primaries, pages)
        self.samples.append(sample)
        return sample

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    def forget(self, address: str) -> None:
        """A node that restarted may have been resynced: read its lists from the top."""
        for key in [k for k in self._skips if k[0] == address]:
            del self._skips[key]

    def pages_between(self, start: float, end: float) -> tuple[int, float] | None:
        """(pages done, seconds) between the first and last sample in [start, end]
        that saw a primary; None with fewer than two."""
        inside = [s for s in self.samples if start <= s.at <= end and s.pages >= 0]
        if len(inside) < 2:
            return None
        return inside[-1].pages - inside[0].pages, inside[-1].at - inside[0].at


@contextlib.asynccontextmanager
async def watching(watcher: Watcher) -> Any:
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    try:
        yield watcher
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def final_urls(address: str, jobs: list[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for job_id in jobs:
        urls, _ = await urls_from(address, job_id, 0)
        out[job_id] = set(urls)
    return out


async def verdict(pair: FaultPair, watcher: Watcher, primary: PairNode) -> Verdict:
    """The checker over the run: the trace, what the watcher saw, what ``primary`` holds."""
    await watcher.poll()
    final = await final_urls(primary.address, watcher.jobs)
    return check(pair.writes(), watcher.acknowledged, final)


# ---------------------------------------------------------------- the faults

Fault = Callable[[FaultPair, Watcher, float], Awaitable[None]]


async def etcd_stopped(pair: FaultPair, watcher: Watcher, hold: float) -> None:
    """Every etcd member SIGSTOPped for ``hold`` seconds."""
    async with pair.etcd.outage():
        await asyncio.sleep(hold)


async def etcd_killed(pair: FaultPair, watcher: Watcher, hold: float) -> None:
    """Every etcd member SIGKILLed, restarted on its data after ``hold`` seconds."""
    for i in range(len(pair.etcd.members)):
        pair.etcd.kill(i)
    await asyncio.sleep(hold)
    await asyncio.gather(*(pair.etcd.restart(i) for i in range(len(pair.etcd.members))))


async def primary_loses_etcd(pair: FaultPair, watcher: Watcher, hold: float) -> None:
    """The primary's links to etcd cut (its standby still reaches etcd)."""
    primary, _ = await pair.elected()
    await primary.etcd.cut()
    await asyncio.sleep(hold)
    await primary.etcd.heal()


async def stream_cut_in_outage(pair: FaultPair, watcher: Watcher, hold: float) -> None:
    """etcd stopped, then the replication stream cut (the primary's peer proxy)."""
    primary, _ = await pair.elected()
    async with pair.etcd.outage():
        await asyncio.sleep(pair.ttl / 2)
        await primary.peer.cut()
        await asyncio.sleep(hold)
    await primary.peer.heal()


async def primary_killed(pair: FaultPair, watcher: Watcher, hold: float) -> None:
    primary, _ = await pair.elected()
    primary.proc.kill()
    await asyncio.sleep(hold)
    watcher.forget(primary.address)
    await pair.restart(primary)


async def standby_killed(pair: FaultPair, watcher: Watcher, hold: float) -> None:
    _, standby = await pair.elected()
    standby.proc.kill()
    await asyncio.sleep(hold)
    watcher.forget(standby.address)
    await pair.restart(standby)


FAULTS: dict[str, Fault] = {
    "etcd stopped": etcd_stopped,
    "etcd killed": etcd_killed,
    "primary loses etcd": primary_loses_etcd,
    "stream cut in an etcd outage": stream_cut_in_outage,
    "primary SIGKILL": primary_killed,
    "standby SIGKILL": standby_killed,
}


#: the faults a pair must write through (failsafe): its standby still vouches
WRITES_THROUGH = frozenset({"etcd stopped", "etcd killed", "primary loses etcd"})


@dataclass(frozen=True)
class Round:
    fault: str
    hold: float  # seconds

    @property
    def writes_through(self) -> bool:
        return self.fault in WRITES_THROUGH


def rounds(seed: int, count: int, ttl: float) -> list[Round]:
    """``count`` faults drawn with ``seed``, each held 2 to 4 ttls (past the lease); one
    the pair must write through is held 3 to 5, so that at least 2 s of it fall past
    the lease's end plus a second's slack (a loaded box's paced crawl may write
    nothing in a shorter stretch)."""
    rng = random.Random(seed)
    names = sorted(FAULTS)
    out = []
    for _ in range(count):
        fault = rng.choice(names)
        low = 3.0 if fault in WRITES_THROUGH else 2.0
        out.append(Round(fault, round(ttl * rng.uniform(low, low + 2.0), 2)))
    return out


async def inject(pair: FaultPair, watcher: Watcher, r: Round) -> tuple[int, int]:
    """One round: the fault held for its time, then the pair settled again; returns
    the fault's [start, end] on CLOCK_MONOTONIC ns (the trace's clock). A fault the
    pair must write through waits first for the standby to be named in the pair state
    (``vouched``): a primary elected in the round before may not have published it yet."""
    if r.writes_through:
        await eventually(pair.vouched, f"pair {pair.name}: the standby named in its state", 60)
    start = time.monotonic_ns()
    await FAULTS[r.fault](pair, watcher, r.hold)
    end = time.monotonic_ns()
    await pair.elected(timeout=60)
    return start, end
