"""JobClient: a typed asyncio client for JobService, failing over across server addresses.

This module owns how a caller talks to one or more pagesift servers; it
guarantees:

- Every call goes to the address that last answered (the first one at start),
  then to the others in the order given. An address "answers" a call when it
  returns anything but UNAVAILABLE or FAILED_PRECONDITION (a standby refuses
  writes with FAILED_PRECONDITION); that address becomes the preferred one.
- When every address is UNAVAILABLE, a retryable call is tried again with
  bounded exponential backoff (``retry_budget`` seconds of sleep in all, ~10 s by
  default), then the error is raised. Reads, Scrape and CancelJob are retryable;
  StartCrawl and StartBatchScrape only with an idempotency key, and the client
  sets a fresh uuid4 key on any such request that has none, so one method call
  never registers two jobs.
- ``watch`` resumes a broken stream at the next document index (from whichever
  address answers), so a consumer sees every document index once.
- ``iter_pages``/``iter_documents`` follow ``next_skip`` until it is absent.
- Errors surface as ``grpc.aio.AioRpcError`` (``ClientError`` for a server that
  breaks the paging contract).

The failover decisions are small pure functions (``should_try_next``,
``pick_error``, ``backoff_delays``, ``is_retryable``) and one tiny state object
(``Failover``) so that the replication feature can steer the order (e.g. ask a
``Role`` RPC for the primary and call ``Failover.prefer``) without touching the
RPC wrappers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import grpc
import grpc.aio

from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

if TYPE_CHECKING:
    from pagesift.v1.jobs_pb2_grpc import JobServiceAsyncStub

__all__ = [
    "DEFAULT_ADDRESS",
    "FAILOVER_CODES",
    "ClientError",
    "Failover",
    "JobClient",
    "backoff_delays",
    "is_retryable",
    "parse_addresses",
    "pick_error",
    "should_try_next",
    "with_idempotency_key",
]

DEFAULT_ADDRESS = "127.0.0.1:50051"
FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION})
READ_METHODS = frozenset({"GetJob", "WatchJob", "GetJobErrors", "ListJobs"})
IDEMPOTENT_WRITES = frozenset({"Scrape", "CancelJob"})
KEYED_WRITES = frozenset({"StartCrawl", "StartBatchScrape"})

_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # a restarted server is found within ~1 s, not after grpc's default 1..120 s backoff
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

T = TypeVar("T")
KeyedRequest = TypeVar("KeyedRequest", jobs_pb2.StartCrawlRequest, jobs_pb2.StartBatchScrapeRequest)


class ClientError(Exception):
    """The server answered, but broke the API contract (e.g. a non-advancing next_skip)."""


# ---------------------------------------------------------------- pure helpers


def parse_addresses(values: str | Iterable[str] | None) -> list[str]:
    """``["a:1,b:2", "c:3"]`` -> ``["a:1", "b:2", "c:3"]``: split, strip, dedupe, keep order.

    Nothing given means ``[DEFAULT_ADDRESS]``.
    """
    if values is None:
        values = []
    elif isinstance(values, str):
        values = [values]
    out: list[str] = []
    for value in values:
        for part in value.split(","):
            addr = part.strip()
            if addr and addr not in out:
                out.append(addr)
    return out or [DEFAULT_ADDRESS]


def is_retryable(method: str, idempotency_key: str = "") -> bool:
    """May ``method`` be sent again (to this or another address) after UNAVAILABLE?"""
    if method in READ_METHODS or method in IDEMPOTENT_WRITES:
        return True
    return method in KEYED_WRITES and bool(idempotency_key)


def should_try_next(code: grpc.StatusCode, *, retryable: bool) -> bool:
    """After ``code`` from one address, try the next one?

    FAILED_PRECONDITION (e.g. a standby refusing a write) means the call did
    nothing, so moving on is always safe; UNAVAILABLE may come after the request
    left, so only a retryable call moves on.
    """
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return True
    return code == grpc.StatusCode.UNAVAILABLE and retryable


def pick_error(codes: Sequence[grpc.StatusCode]) -> int:
    """Which of a round's failures (one per address, in order) to report: its index.

    The first FAILED_PRECONDITION (a server that answered and names the
    primary, or refused for a reason of its own) beats UNAVAILABLE; among
    UNAVAILABLEs the last one.
    """
    if not codes:
        raise ValueError("no errors to pick from")
    for i, code in enumerate(codes):
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return i
    return len(codes) - 1


def backoff_delays(
    budget: float = 10.0, first: float = 0.1, factor: float = 2.0, cap: float = 2.0
) -> list[float]:
    """Sleeps between retry rounds: ``first`` growing by ``factor`` up to ``cap``, summing
    to at most ``budget`` (the last one is trimmed to fit)."""
    delays: list[float] = []
    total, delay = 0.0, first
    while total < budget - 1e-9 and delay > 0:
        step = min(delay, cap, budget - total)
        delays.append(step)
        total += step
        delay *= factor
    return delays


def with_idempotency_key(request: KeyedRequest) -> KeyedRequest:
    """``request`` itself when it has a key, else a copy with a fresh uuid4 key."""
    if request.idempotency_key:
        return request
    keyed = type(request)()
    keyed.CopyFrom(request)
    keyed.idempotency_key = str(uuid.uuid4())
    return keyed


class Failover:
    """Which address to try first, then the rest in their given order.

    ``answered`` makes an address the preferred one; ``prefer`` is the hook for
    a caller that knows better (a future ``Role`` lookup of the primary).
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ValueError("at least one address is needed")
        self.addresses: list[str] = list(addresses)
        self.current = 0

    def order(self) -> list[str]:
        """The preferred address, then the others in their given order."""
        first = self.addresses[self.current]
        return [first, *(a for a in self.addresses if a != first)]

    def answered(self, address: str) -> None:
        self.current = self.addresses.index(address)

    def prefer(self, address: str) -> None:
        """Try ``address`` first from now on (added to the list if unknown)."""
        if address not in self.addresses:
            self.addresses.append(address)
        self.answered(address)

    @property
    def preferred(self) -> str:
        return self.addresses[self.current]


# ---------------------------------------------------------------- the client


class JobClient:
    """Async client over grpc.aio; use ``async with JobClient([...]) as c`` or ``close()``."""

    def __init__(
        self,
        addresses: str | Sequence[str] | None = None,
        *,
        timeout: float | None = 60.0,
        scrape_timeout: float | None = 300.0,
        retry_budget: float = 10.0,
    ) -> None:
        """``timeout`` bounds each unary call (``scrape_timeout`` a Scrape); streams are
        unbounded. ``retry_budget`` is the most seconds spent sleeping between retries."""
        self.failover = Failover(parse_addresses(addresses))
        self.timeout = timeout
        self.scrape_timeout = scrape_timeout
        self.retry_budget = retry_budget
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, JobServiceAsyncStub] = {}

    async def __aenter__(self) -> JobClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            await channel.close(None)

    @property
    def addresses(self) -> list[str]:
        return list(self.failover.addresses)

    def stub(self, address: str) -> JobServiceAsyncStub:
        """The stub for ``address`` (one channel per address, made on first use)."""
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
            self._channels[address] = channel
            stub = self._stubs[address] = jobs_pb2_grpc.JobServiceStub(channel)
        return stub

    async def call(
        self, invoke: Callable[[JobServiceAsyncStub], Awaitable[T]], *, retryable: bool
    ) -> T:
        """Run one unary call under the failover and retry rules of the module docstring."""
        delays = iter(backoff_delays(self.retry_budget))
        while True:
            errors: list[grpc.aio.AioRpcError] = []
            for address in self.failover.order():
                try:
                    result = await invoke(self.stub(address))
                except grpc.aio.AioRpcError as err:
                    if not should_try_next(err.code(), retryable=retryable):
                        self.failover.answered(address)
                        raise
                    errors.append(err)
                    continue
                self.failover.answered(address)
                return result
            await self._after_failed_round(errors, delays, retryable=retryable)

    async def _after_failed_round(
        self,
        errors: list[grpc.aio.AioRpcError],
        delays: Iterator[float],
        *,
        retryable: bool,
    ) -> None:
        """Sleep before the next round, or raise the round's most telling error."""
        err = errors[pick_error([e.code() for e in errors])]
        if not retryable or err.code() != grpc.StatusCode.UNAVAILABLE:
            raise err
        delay = next(delays, None)
        if delay is None:
            raise err
        await asyncio.sleep(delay)

    # ------------------------------------------------------------ RPCs

    async def scrape(
        self, url: str, options: jobs_pb2.ScrapeOptions | None = None
    ) -> jobs_pb2.Document:
        req = jobs_pb2.ScrapeRequest(url=url, options=options)
        resp = await self.call(
            lambda s: s.Scrape(req, timeout=self.scrape_timeout),
            retryable=is_retryable("Scrape"),
        )
        return resp.document

    async def start_batch(
        self, request: jobs_pb2.StartBatchScrapeRequest
    ) -> jobs_pb2.StartBatchScrapeResponse:
        """Register a batch-scrape job; a request without idempotency key gets one."""
        req = with_idempotency_key(request)
        return await self.call(
            lambda s: s.StartBatchScrape(req, timeout=self.timeout),
            retryable=is_retryable("StartBatchScrape", req.idempotency_key),
        )

    async def start_crawl(self, request: jobs_pb2.StartCrawlRequest) -> str:
        """Register a crawl job and return its id; a request without key gets one."""
        req = with_idempotency_key(request)
        resp = await self.call(
            lambda s: s.StartCrawl(req, timeout=self.timeout),
            retryable=is_retryable("StartCrawl", req.idempotency_key),
        )
        return resp.id

    async def get_job(
        self, job_id: str, *, skip: int = 0, limit: int = 0
    ) -> jobs_pb2.GetJobResponse:
        req = jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=limit)
        return await self.call(lambda s: s.GetJob(req, timeout=self.timeout), retryable=True)

    async def iter_pages(
        self, job_id: str, *, page_size: int = 0
    ) -> AsyncIterator[jobs_pb2.GetJobResponse]:
        """Every GetJob page from skip 0, following ``next_skip`` until it is absent."""
        skip = 0
        while True:
            page = await self.get_job(job_id, skip=skip, limit=page_size)
            yield page
            if not page.HasField("next_skip"):
                return
            if page.next_skip <= skip:
                raise ClientError(f"next_skip {page.next_skip} does not advance past {skip}")
            skip = page.next_skip

    async def iter_documents(
        self, job_id: str, *, page_size: int = 0
    ) -> AsyncIterator[jobs_pb2.Document]:
        """Every document of the job, in index order, across all pages."""
        async for page in self.iter_pages(job_id, page_size=page_size):
            for doc in page.documents:
                yield doc

    async def watch(
        self, job_id: str, from_index: int = 0
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        """WatchJob's events; a stream broken by UNAVAILABLE resumes at the next index."""
        next_index = from_index
        delays = iter(backoff_delays(self.retry_budget))
        while True:
            errors: list[grpc.aio.AioRpcError] = []
            progressed = False
            for address in self.failover.order():
                req = jobs_pb2.WatchJobRequest(id=job_id, from_index=next_index)
                call = self.stub(address).WatchJob(req)
                try:
                    async for event in call:
                        if not progressed:
                            self.failover.answered(address)
                            progressed = True
                        if event.WhichOneof("event") == "document":
                            next_index = event.document.index + 1
                        yield event
                    return
                except grpc.aio.AioRpcError as err:
                    if progressed and err.code() == grpc.StatusCode.UNAVAILABLE:
                        break  # the server went away mid-stream: start a fresh round
                    if not should_try_next(err.code(), retryable=True):
                        self.failover.answered(address)
                        raise
                    errors.append(err)
                finally:
                    call.cancel()
            if progressed:
                delays = iter(backoff_delays(self.retry_budget))
                continue
            await self._after_failed_round(errors, delays, retryable=True)

    async def errors(self, job_id: str) -> jobs_pb2.GetJobErrorsResponse:
        req = jobs_pb2.GetJobErrorsRequest(id=job_id)
        return await self.call(lambda s: s.GetJobErrors(req, timeout=self.timeout), retryable=True)

    async def cancel(self, job_id: str) -> jobs_pb2.JobState.ValueType:
        req = jobs_pb2.CancelJobRequest(id=job_id)
        resp = await self.call(
            lambda s: s.CancelJob(req, timeout=self.timeout),
            retryable=is_retryable("CancelJob"),
        )
        return resp.state

    async def list_jobs(self, *, active_only: bool = False) -> list[jobs_pb2.JobSummary]:
        req = jobs_pb2.ListJobsRequest(active_only=active_only)
        resp = await self.call(lambda s: s.ListJobs(req, timeout=self.timeout), retryable=True)
        return list(resp.jobs)
