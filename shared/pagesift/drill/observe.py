"""What the drill watches while it runs: the job as a client sees it, writes, roles.

Owns:

- ``Follower``: follows the crawl with WatchJob through the drill's ``JobClient``
  (which fails over between the two nodes and resumes at the next index) and records
  every document it was shown (``DocKey``: index, URL, fetch time). A broken watch is
  resumed from the next index, a bounded number of times.
- ``Prober``: after a kill, one small write (a one-URL batch job) every ``interval``
  seconds to the given node(s), each with its own deadline, recording when each was
  answered and whether it was accepted (``verdict.Probe``) until the caller's
  condition holds or its deadline passes. Probe jobs are never part of the checks.
- ``role_of``/``roles``/``wait_for``: bounded Role calls and a bounded poll.
- ``final_job``: the ended job read in full (documents in index order, page errors,
  notes).

Every loop here is bounded in time (a deadline) and in count.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from pagesift.client import JobClient
from pagesift.drill.verdict import DocKey, FinalJob, Probe
from pagesift.v1 import jobs_pb2
from pagesift.v1 import replication_pb2 as rpb

T = TypeVar("T")

STATE_NAMES = {
    jobs_pb2.JOB_STATE_COMPLETED: "completed",
    jobs_pb2.JOB_STATE_FAILED: "failed",
    jobs_pb2.JOB_STATE_CANCELLED: "cancelled",
}


def doc_key(index: int, doc: jobs_pb2.Document) -> DocKey:
    fetched = doc.fetched_at.seconds * 1_000_000_000 + doc.fetched_at.nanos
    return DocKey(index, doc.url, fetched)


async def wait_for(
    check: Callable[[], Awaitable[T | None]], timeout: float, interval: float = 0.05
) -> T | None:
    """``await check()`` until it returns something other than None (returned), or
    ``timeout`` seconds (None). A check that raises a gRPC error counts as None."""
    deadline = time.monotonic() + timeout
    for _ in range(1 + int(timeout / interval) * 4):  # a count bound besides the clock
        try:
            got = await check()
        except grpc.aio.AioRpcError:
            got = None
        if got is not None:
            return got
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(interval)
    return None


async def role_of(client: JobClient, address: str, timeout: float = 2.0) -> rpb.RoleResponse | None:
    """The node's Role, or None if it did not answer within ``timeout``."""
    try:
        return await client.role(address, timeout=timeout)
    except grpc.aio.AioRpcError:
        return None


async def roles(client: JobClient, addresses: Sequence[str]) -> dict[str, rpb.RoleResponse | None]:
    got = await asyncio.gather(*(role_of(client, a) for a in addresses))
    return dict(zip(addresses, got, strict=True))


class Follower:
    """Follows one job with WatchJob and records what it was shown."""

    def __init__(self, client: JobClient, job_id: str, *, max_resumes: int = 200) -> None:
        self.client = client
        self.job_id = job_id
        self.max_resumes = max_resumes
        self.shown: list[DocKey] = []
        self.ended = False  # the stream reported a terminal state
        self._next = 0
        self._changed = asyncio.Event()

    async def run(self) -> None:
        for _ in range(self.max_resumes):
            try:
                async for event in self.client.watch(self.job_id, from_index=self._next):
                    kind = event.WhichOneof("event")
                    if kind == "document":
                        d = event.document
                        self.shown.append(doc_key(d.index, d.document))
                        self._next = d.index + 1
                    elif kind == "state" and event.state.state in STATE_NAMES:
                        self.ended = True
                    self._changed.set()
                if self.ended:
                    return
            except grpc.aio.AioRpcError:
                pass  # the client's retries ran out (a long failover): resume
            await asyncio.sleep(0.2)

    async def wait_shown(self, count: int, timeout: float) -> bool:
        """Until ``count`` documents were shown (True), the job ended or ``timeout``."""
        deadline = time.monotonic() + timeout
        while len(self.shown) < count and not self.ended:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
        return len(self.shown) >= count


class Prober:
    """Small writes to ``targets``, one every ``interval`` seconds (see the module)."""

    def __init__(
        self,
        client: JobClient,
        targets: Sequence[str],
        probe_url: str,
        *,
        interval: float = 0.05,
        call_timeout: float = 5.0,
    ) -> None:
        self.client = client
        self.targets = list(targets)
        self.probe_url = probe_url
        self.interval = interval
        self.call_timeout = call_timeout
        self.probes: list[Probe] = []
        self.job_ids: list[str] = []

    async def _one(self, address: str) -> Probe:
        req = jobs_pb2.StartBatchScrapeRequest(urls=[self.probe_url], max_concurrency=1)
        try:
            resp = await self.client.stub(address).StartBatchScrape(req, timeout=self.call_timeout)
        except grpc.aio.AioRpcError as err:
            return Probe(time.monotonic(), False, err.code().name)
        self.job_ids.append(resp.id)
        return Probe(time.monotonic(), True)

    async def run(self, done: Callable[[list[Probe]], bool], timeout: float) -> bool:
        """Probe until ``done(probes)`` (True) or ``timeout`` seconds (False)."""
        deadline = time.monotonic() + timeout
        for _ in range(1 + int(timeout / self.interval)):
            tick = time.monotonic()
            for address in self.targets:
                self.probes.append(await self._one(address))
                if self.probes[-1].accepted:
                    break  # one accepted write per tick is enough
            if done(self.probes):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - tick)))
        return done(self.probes)


def first_accepted(probes: list[Probe]) -> bool:
    return any(p.accepted for p in probes)


def refused_then_accepted(probes: list[Probe]) -> bool:
    seen_refusal = False
    for p in probes:
        seen_refusal = seen_refusal or not p.accepted
        if seen_refusal and p.accepted:
            return True
    return False


async def final_job(client: JobClient, job_id: str) -> FinalJob:
    """The job's state, every document (index order), page errors and notes."""
    job = await client.get_job(job_id, status_only=True)
    docs: list[DocKey] = []
    async for doc in client.iter_documents(job_id, page_size=200):
        docs.append(doc_key(len(docs), doc))
    errors = await client.errors(job_id)
    return FinalJob(
        state=STATE_NAMES.get(job.state, "running"),
        documents=docs,
        failed_urls=[e.url for e in errors.errors if e.url],
        notes=[f"{e.code}: {e.message}" for e in errors.errors if not e.url],
    )
