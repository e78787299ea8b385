"""A client of a cluster of pairs: every call routed to its pair, new jobs placed.

What it owns
------------
``ClusterRouter``: what ``JobClient(cluster="etcd://HOST:PORT[,...]/NAME")`` calls in
place of a pair's JobService stub (``JobClient.stub`` returns it), so the client's
whole surface (paging, watch resume, ``errors``, ``list_jobs``) works unchanged on top.
It holds the registry's view (``ClusterView``) and one single-pair client per pair,
made from the pair's registered addresses (primary first, then its standbys: the pair's
failover is that client's, its reads go to a standby while the primary is down) and the
TLS name the members file gives the pair (``ClusterView.tls_name``: each channel checks
the node's certificate against it, ``pagesift.client.transport``), made again when
those addresses change.

Routing
-------
- Ids: a node mints a bare UUID; this client hands out ``{pair}.{uuid}`` (a batch
  spanning pairs: its parts' ids joined, ``pagesift.core.cluster.ids``) and strips the
  pair when it calls the pair. A bare UUID is refused (INVALID_ARGUMENT naming ``id``)
  unless exactly one pair is registered.
- GetJob, WatchJob, GetJobErrors, CancelJob, ResumeJob, AppendBatchScrape go to the
  pair in the id (``composite`` for a job of parts). A pair not in the registry (both
  nodes gone), or one whose nodes do not answer, is UNAVAILABLE naming the pair.
- Scrape, Map and StartCrawl go to the owner of the URL's host
  (``placement.owner`` over ``registryrules.placeable``); a start with no host, to the
  owner of its idempotency key. StartBatchScrape is split by host
  (``placement.split_by_host``; ``pagesift.client.clusterbatch`` starts it), one part
  per pair, each with a key derived from the caller's (``merge.part_key``): a retried
  start finds every part. A part refused
  stops the start: the parts already started are cancelled, and the refusal names the
  caller's ``urls[i]``; a part's pair UNAVAILABLE leaves them, for the caller's retry
  under the same key (which the client makes for every start) to find. No placeable
  pair is UNAVAILABLE saying so; a view older than ``ClusterView.stale_after`` is read
  again first (``ClusterView.fresh``, waiting up to ``place_wait`` for etcd), then
  UNAVAILABLE with reason ``CLUSTER_UNAVAILABLE`` naming etcd.
- A node refuses new work on a host another pair owns (FAILED_PRECONDITION, reason
  ``HOST_OWNED_ELSEWHERE``, ErrorInfo ``owner``: its registry read differs from this
  view, a pair joining or leaving): this client reads the registry again and sends the
  call to ``owner``, at most ``OWNER_HOPS`` times (Scrape, Map, StartCrawl; a batch
  split again when its first part is refused, before any part started). An append
  goes to its job's pair and cannot move: the refusal is the caller's.
- ListJobs asks every registered pair and merges (``merge.merge_lists``) under one
  page token; a pair that does not answer is left out of that page.
- GetAccountUsage adds up every pair's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.rpc import error_details_pb2

from pagesift.client import clusterbatch, composite
from pagesift.client.errors import DOMAIN, reason_of
from pagesift.client.pairs import (
    PairClient,
    invalid_field,
    owner_named,
    pair_unavailable,
    rpc_error,
)
from pagesift.client.registryview import ClusterUnavailable, ClusterView
from pagesift.client.retry import is_retryable
from pagesift.core.cluster import ids, merge, placement
from pagesift.core.cluster.members import Members
from pagesift.core.cluster.registryrules import placeable
from pagesift.v1 import jobs_pb2

__all__ = ["RETIRE_SECONDS", "ClusterRouter", "open_router"]

T = TypeVar("T")
#: the owners a placed call follows (HOST_OWNED_ELSEWHERE) before the refusal stands
OWNER_HOPS = 3
#: a pair's old client (its addresses changed) is closed this long after it was replaced
RETIRE_SECONDS = 30.0
DEFAULT_LIST_PAGE = 50
_closing: set[asyncio.Future[Any]] = set()  # streams' closes under way


class _Stream:
    """A server stream made of an async iterator: what ``JobClient`` iterates and
    cancels (``WatchJob``, ``Map``)."""

    def __init__(self, it: AsyncIterator[Any]) -> None:
        self._it = it

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._it

    def cancel(self) -> bool:
        close = getattr(self._it, "aclose", None)
        if close is not None:
            _closing.add(task := asyncio.ensure_future(close()))
            task.add_done_callback(_closing.discard)
        return True


class ClusterRouter:
    """The cluster's JobService, as one stub (see the module docstring)."""

    def __init__(self, view: ClusterView, make_client: Callable[[list[str], str], PairClient]):
        self.view = view
        self.cluster = view.name
        self._make = make_client
        self._clients: dict[str, tuple[frozenset[str], PairClient]] = {}
        self._retired: set[PairClient] = set()
        self._busy: dict[int, int] = {}  # id(client) -> calls and streams using it
        self._expired: set[PairClient] = set()  # retired long enough: closed once idle
        self._waits: set[asyncio.Future[None]] = set()  # retired clients' grace periods
        self._closers: set[asyncio.Future[None]] = set()  # closes under way

    # ------------------------------------------------------------ pairs

    async def ready(self) -> None:
        try:
            await self.view.ready()
        except ClusterUnavailable as e:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, str(e)) from None

    def _client(self, pair: str) -> PairClient:
        view = self.view.pairs.get(pair)
        if view is None:
            why = "it is not in the registry (both nodes down?)"
            raise pair_unavailable(self.cluster, pair, why)
        addresses = [a for a in (view.primary, *view.standbys) if a]
        known = self._clients.get(pair)
        if known is not None and known[0] == frozenset(addresses):
            return known[1]  # a failover within the pair is its client's to follow
        client = self._make(addresses, self.view.tls_name(pair))
        self._clients[pair] = (frozenset(addresses), client)
        if known is not None:
            self._retire(known[1])
        return client

    def _retire(self, client: PairClient) -> None:
        self._retired.add(client)

        async def later() -> None:
            await asyncio.sleep(RETIRE_SECONDS)
            self._expired.add(client)
            if not self._busy.get(id(client)):  # else its last user closes it (a watch)
                self._close_soon(client)

        self._track(asyncio.ensure_future(later()), self._waits)

    def _close_soon(self, client: PairClient) -> None:
        self._expired.discard(client)
        self._retired.discard(client)
        self._track(asyncio.ensure_future(client.close()), self._closers)

    @staticmethod
    def _track(task: asyncio.Future[None], into: set[asyncio.Future[None]]) -> None:
        into.add(task)
        task.add_done_callback(into.discard)

    @contextlib.contextmanager
    def _using(self, client: PairClient) -> Iterator[None]:
        key = id(client)
        self._busy[key] = self._busy.get(key, 0) + 1
        try:
            yield
        finally:
            self._busy[key] -= 1
            if not self._busy[key]:
                del self._busy[key]
                if client in self._expired:
                    self._close_soon(client)

    async def on_pair(self, pair: str, fn: Callable[[PairClient], Awaitable[T]]) -> T:
        """``fn(pair's client)``; a pair gone or not answering is UNAVAILABLE naming it."""
        await self.ready()
        client = self._client(pair)
        try:
            with self._using(client):
                return await fn(client)
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or reason_of(err) is not None:
                raise
            with contextlib.suppress(ClusterUnavailable):
                await self.view.reread()
            why = "it is not in the registry" if pair not in self.view.pairs else err.details()
            raise pair_unavailable(self.cluster, pair, why or "no node answered") from err

    async def watch_on(
        self, pair: str, job_uuid: str, from_index: int
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        """One pair's watch of ``job_uuid`` (its client resumes a broken stream)."""
        await self.ready()
        client = self._client(pair)
        try:
            with self._using(client):
                async for event in client.watch(job_uuid, from_index):
                    yield event
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or reason_of(err) is not None:
                raise
            raise pair_unavailable(self.cluster, pair, err.details() or "no node answered") from err

    def _parts(self, job_id: str, field: str = "id") -> list[tuple[str, str]]:
        try:
            parts = ids.job_parts(job_id)
        except ValueError as e:
            raise invalid_field(field, str(e)) from None
        out: list[tuple[str, str]] = []
        for pair, uid in parts:
            if pair is None:
                known = list(self.view.pairs)
                if len(known) != 1:
                    raise invalid_field(
                        field,
                        f"{job_id[:80]!r} names no pair, and cluster {self.cluster} has "
                        f"{len(known)}: give the id as the cluster handed it out, PAIR.UUID",
                    )
                pair = known[0]
            out.append((pair, uid))
        return out

    async def _placeable(self) -> list[str]:
        try:
            await self.view.fresh()  # a stale view is read again, a bounded wait
        except ClusterUnavailable as e:
            info = error_details_pb2.ErrorInfo(
                reason="CLUSTER_UNAVAILABLE", domain=DOMAIN, metadata={"cluster": self.cluster}
            )
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, str(e), info=info) from None
        await self.ready()
        pairs = placeable(self.view.pairs.values())
        if not pairs:
            raise rpc_error(
                grpc.StatusCode.UNAVAILABLE,
                f"cluster {self.cluster}: no pair can take new work (none registered "
                "with a primary that accepts it)",
            )
        return pairs

    async def _followed(self, pair: str, call: Callable[[str], Awaitable[T]]) -> tuple[str, T]:
        """``call(pair)``, then on the pair each HOST_OWNED_ELSEWHERE refusal names
        (the view read again first), ``OWNER_HOPS`` times at most: (the pair, result)."""
        for _ in range(OWNER_HOPS):
            try:
                return pair, await call(pair)
            except grpc.aio.AioRpcError as err:
                owner = owner_named(err)
                if owner is None or owner == pair:
                    raise
            with contextlib.suppress(ClusterUnavailable):
                await self.view.reread()
            pair = owner
        return pair, await call(pair)

    async def _place(self, url: str, key: str) -> str:
        pairs = await self._placeable()
        try:
            return placement.owner_of_url(url, pairs)
        except ValueError:  # no host: the key's owner (the node refuses the URL by name)
            return placement.owner(key, pairs)

    async def _unary(
        self,
        pair: str,
        method: str,
        req: Any,
        timeout: float | None,
        *,
        retryable: bool = True,
        control: bool = False,
    ) -> Any:
        async def call(c: PairClient) -> Any:
            return await c.call(
                lambda s: getattr(s, method)(req, timeout=timeout),
                retryable=retryable,
                control=control,
            )

        return await self.on_pair(pair, call)

    # ------------------------------------------------------------ placed calls

    async def Scrape(
        self, req: jobs_pb2.ScrapeRequest, timeout: float | None = None, **_: Any
    ) -> jobs_pb2.ScrapeResponse:
        pair = await self._place(req.url, "")

        async def scrape(p: str) -> jobs_pb2.ScrapeResponse:
            return await self._unary(p, "Scrape", req, timeout)  # type: ignore[no-any-return]

        return (await self._followed(pair, scrape))[1]

    def Map(self, req: jobs_pb2.MapRequest, timeout: float | None = None, **_: Any) -> _Stream:
        return _Stream(self._map_stream(req, timeout))

    async def _map_stream(
        self, req: jobs_pb2.MapRequest, timeout: float | None
    ) -> AsyncIterator[jobs_pb2.MapResponse]:
        pair = await self._place(req.url, "")

        async def call(c: PairClient) -> list[jobs_pb2.MapResponse]:
            async def collect(stub: Any) -> list[jobs_pb2.MapResponse]:
                stream = stub.Map(req, timeout=timeout)
                try:
                    return [batch async for batch in stream]
                finally:
                    stream.cancel()

            return await c.call(collect, retryable=True)

        _, batches = await self._followed(pair, lambda p: self.on_pair(p, call))
        for batch in batches:
            yield batch

    async def StartCrawl(
        self, req: jobs_pb2.StartCrawlRequest, timeout: float | None = None, **_: Any
    ) -> jobs_pb2.StartCrawlResponse:
        pair = await self._place(req.url, req.idempotency_key)
        retryable = is_retryable("StartCrawl", req.idempotency_key)

        async def start(p: str) -> jobs_pb2.StartCrawlResponse:
            resp = await self._unary(p, "StartCrawl", req, timeout, retryable=retryable)
            return resp  # type: ignore[no-any-return]

        pair, resp = await self._followed(pair, start)
        return jobs_pb2.StartCrawlResponse(id=ids.cluster_job_id(pair, resp.id))

    async def StartBatchScrape(
        self, req: jobs_pb2.StartBatchScrapeRequest, timeout: float | None = None, **_: Any
    ) -> jobs_pb2.StartBatchScrapeResponse:
        for _hop in range(OWNER_HOPS):
            try:
                return await clusterbatch.start(req, timeout, await self._placeable(), self._unary)
            except clusterbatch.NothingStarted:  # a node's view differs: read, split again
                with contextlib.suppress(ClusterUnavailable):
                    await self.view.reread()
        try:
            return await clusterbatch.start(req, timeout, await self._placeable(), self._unary)
        except clusterbatch.NothingStarted as moved:
            raise moved.err from None

    async def AppendBatchScrape(
        self, req: jobs_pb2.AppendBatchScrapeRequest, timeout: float | None = None, **_: Any
    ) -> jobs_pb2.AppendBatchScrapeResponse:
        await self.ready()
        parts = self._parts(req.id)
        pairs = await self._placeable()
        for i, url in enumerate(req.urls):
            try:
                owner = placement.owner_of_url(url, pairs)
            except ValueError:
                continue  # the node refuses it by its field
            if len(parts) > 1 or owner != parts[0][0]:
                raise invalid_field(
                    f"urls[{i}]",
                    f"its host belongs to pair {owner}, and this job runs on "
                    f"{', '.join(p for p, _ in parts)}: URLs can be added to a batch on "
                    "one pair, of hosts that pair owns; start another batch for the rest",
                )
        pair, uid = parts[0]
        part = jobs_pb2.AppendBatchScrapeRequest()
        part.CopyFrom(req)
        part.id = uid
        retryable = is_retryable("AppendBatchScrape", req.idempotency_key)
        resp = await self._unary(pair, "AppendBatchScrape", part, timeout, retryable=retryable)
        resp.id = req.id
        return resp  # type: ignore[no-any-return]

    # ------------------------------------------------------------ calls by id

    async def GetJob(
        self, req: jobs_pb2.GetJobRequest, timeout: float | None = None, **_: Any
    ) -> jobs_pb2.GetJobResponse:
        await self.ready()
        parts = self._parts(req.id)
        if len(parts) > 1:
            return await composite.get_job(self, req.id, parts, req, timeout)
        (pair, uid), part = parts[0], jobs_pb2.GetJobRequest()
        part.CopyFrom(req)
        part.id = uid
        resp = await self._unary(pair, "GetJob", part, timeout)
        resp.id = ids.cluster_job_id(pair, uid)
        return resp  # type: ignore[no-any-return]

    def WatchJob(self, req: jobs_pb2.WatchJobRequest, **_: Any) -> _Stream:
        return _Stream(self._watch(req))

    async def _watch(
        self, req: jobs_pb2.WatchJobRequest
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        await self.ready()
        parts = self._parts(req.id)
        if len(parts) > 1:
            async for event in composite.watch(self, req.id, parts, req.from_index, None):
                yield event
            return
        async for event in self.watch_on(*parts[0], req.from_index):
            yield event

    async def GetJobErrors(
        self, req: jobs_pb2.GetJobErrorsRequest, timeout: float | None = None, **_: Any
    ) -> jobs_pb2.GetJobErrorsResponse:
        await self.ready()
        parts = self._parts(req.id)
        if len(parts) > 1:
            return await composite.errors_page(self, parts, req, timeout)
        part = jobs_pb2.GetJobErrorsRequest()
        part.CopyFrom(req)
        part.id = parts[0][1]
        return await self._unary(parts[0][0], "GetJobErrors", part, timeout)  # type: ignore[no-any-return]

    async def _control(
        self, method: str, job_id: str, timeout: float | None
    ) -> jobs_pb2.JobState.ValueType:
        await self.ready()
        parts = self._parts(job_id)
        return await composite.control(self, parts, method, timeout)

    async def CancelJob(
        self, req: jobs_pb2.CancelJobRequest, timeout: float | None = None, **_: Any
    ) -> jobs_pb2.CancelJobResponse:
        return jobs_pb2.CancelJobResponse(state=await self._control("CancelJob", req.id, timeout))  # type: ignore[arg-type]

    async def ResumeJob(
        self, req: jobs_pb2.ResumeJobRequest, timeout: float | None = None, **_: Any
    ) -> jobs_pb2.ResumeJobResponse:
        return jobs_pb2.ResumeJobResponse(state=await self._control("ResumeJob", req.id, timeout))  # type: ignore[arg-type]

    # ------------------------------------------------------------ fan-out

    async def _answering(
        self,
        method: str,
        make: Callable[[str], Any],
        timeout: float | None,
        pairs: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """``method`` on ``pairs`` (default: every registered pair) at once; the pairs
        that answered. A refusal (not UNAVAILABLE) of any pair is the call's."""
        await self.ready()
        pairs = sorted(self.view.pairs if pairs is None else pairs)
        results = await asyncio.gather(
            *(self._unary(p, method, make(p), timeout) for p in pairs), return_exceptions=True
        )
        out: dict[str, Any] = {}
        for pair, result in zip(pairs, results, strict=True):
            if isinstance(result, grpc.aio.AioRpcError):
                if result.code() != grpc.StatusCode.UNAVAILABLE:
                    raise result
                continue
            if isinstance(result, BaseException):
                raise result
            out[pair] = result
        return out

    async def ListJobs(
        self, req: jobs_pb2.ListJobsRequest, timeout: float | None = None, **_: Any
    ) -> jobs_pb2.ListJobsResponse:
        try:
            cursor = merge.list_untoken(req.page_token)
        except ValueError as e:
            raise invalid_field("page_token", str(e)) from None
        size = req.page_size or DEFAULT_LIST_PAGE
        await self.ready()
        wanted = [p for p in self.view.pairs if cursor.tokens.get(p, "") is not None]

        def ask(pair: str) -> jobs_pb2.ListJobsRequest:
            return jobs_pb2.ListJobsRequest(
                active_only=req.active_only,
                states=req.states,
                page_size=size,
                page_token=cursor.tokens.get(pair) or "",
            )

        answers: dict[str, jobs_pb2.ListJobsResponse] = {}
        if wanted:
            answers = await self._answering("ListJobs", ask, timeout, wanted)
        pages = {
            p: merge.PairPage(ask(p).page_token, [_key(j) for j in a.jobs], a.next_page_token)
            for p, a in answers.items()
        }
        taken, nxt = merge.merge_lists(cursor, pages, size)
        out = jobs_pb2.ListJobsResponse(next_page_token=merge.list_token(nxt) if nxt else "")
        for pair, index in taken:
            job = out.jobs.add()
            job.CopyFrom(answers[pair].jobs[index])
            job.id = ids.cluster_job_id(pair, job.id)
        return out

    async def GetAccountUsage(
        self, req: jobs_pb2.GetAccountUsageRequest, timeout: float | None = None, **_: Any
    ) -> jobs_pb2.GetAccountUsageResponse:
        answers = list((await self._answering("GetAccountUsage", lambda _p: req, timeout)).values())
        if not answers:
            why = f"cluster {self.cluster}: no pair answered"
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, why)
        out = jobs_pb2.GetAccountUsageResponse()
        out.CopyFrom(answers[0])
        for a in answers[1:]:
            out.pages_used += a.pages_used
            out.running_jobs += a.running_jobs
            out.pages_queued += a.pages_queued
            out.pages_in_flight += a.pages_in_flight
            out.max_concurrency += a.max_concurrency
            if a.last_page_at.ToNanoseconds() > out.last_page_at.ToNanoseconds():
                out.last_page_at.CopyFrom(a.last_page_at)
        if out.HasField("pages_per_day"):
            out.pages_remaining = max(0, out.pages_per_day - out.pages_used)
        return out

    async def close(self) -> None:
        clients = [c for _, c in self._clients.values()] + list(self._retired)
        self._clients.clear()
        self._retired.clear()
        for task in list(self._waits):
            task.cancel()
        await asyncio.gather(*self._waits, *self._closers, return_exceptions=True)
        for client in clients:
            await client.close()


def open_router(
    cluster: str | ClusterView,
    make_client: Callable[[list[str], str], PairClient],
    members: Members | None = None,
) -> tuple[ClusterRouter, ClusterView | None]:
    """The router of ``cluster`` (a URL: a view of its own, verified against
    ``members``, returned to be closed with it; a ``ClusterView``: shared, with its own
    members, its maker closes it). ``make_client(addresses, tls_name)``: a pair's client."""
    if isinstance(cluster, ClusterView) and members is not None:
        raise ValueError("a shared ClusterView has its members file: give it there")
    view = cluster if isinstance(cluster, ClusterView) else ClusterView(cluster, members=members)
    return ClusterRouter(view, make_client), (None if view is cluster else view)


def _key(job: jobs_pb2.JobSummary) -> tuple[int, str]:
    return job.created_at.ToMilliseconds(), job.id
