"""JobClient: a typed asyncio client for JobService, failing over across server addresses.

What it owns
------------
The I/O shell of the client: one channel per address (``pagesift.client.transport``:
TLS, the name the node's certificate must carry, the bearer keys), the unary call loop
(``call``), the resumed watch stream, paging, and ``AdminService`` lookups. Which
address comes next and whether a round is tried again are ``pagesift.client.failover``'s
pure rules; which calls may be repeated and the sleeps between rounds are
``pagesift.client.retry``'s.

Guarantees
----------
- With more than one address the primary is looked up (``find_primary``: every
  node's ``Role``, concurrently, bounded by ``ROLE_LOOKUP_SECONDS``) before the first
  call and after every failed round, so a promoted standby is found by its epoch;
  reads fall back to a standby while the primary is down.
- Every unary attempt is bounded by ``timeout`` (Scrape and Map by
  ``scrape_timeout``; CancelJob/ResumeJob by ``CONTROL_ATTEMPT_SECONDS``, so a frozen
  primary costs that); retries add at most the ``RetryPolicy`` budget of sleep (a call
  to addresses where nothing listens takes the whole budget: ``wait_connected``
  bounds that wait first, raising ``Unreachable``).
- ``watch`` resumes a broken stream at the next document index, from whichever
  address answers, so a consumer sees every document index once; ``iter_pages`` and
  ``iter_documents`` follow ``next_skip`` until it is absent.
- ``JobClient(cluster="etcd://HOST:PORT[,...]/NAME")`` (or a shared ``ClusterView``)
  is a client of a cluster of pairs: ``stub`` is then the cluster's router
  (``pagesift.client.cluster``), which routes each call by its job id or places it,
  through one client per pair (its retries; none here), pinned to the pair's TLS name.
- Errors surface as ``grpc.aio.AioRpcError`` (``ClientError`` for a server that breaks
  the paging contract); ``pagesift.client.errors.reason_of`` reads their reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import grpc
import grpc.aio

from pagesift.client.auth import auth_interceptors, tls_credentials
from pagesift.client.cluster import ClusterRouter, open_router
from pagesift.client.errors import ClientError, Unreachable, reason_of
from pagesift.client.failover import (
    Failover,
    choose_primary,
    follow_primary,
    keeps_trying,
    parse_addresses,
    pick_error,
    primary_named,
    should_try_next,
)
from pagesift.client.registryview import ClusterView
from pagesift.client.retry import RetryPolicy, is_retryable, with_idempotency_key
from pagesift.client.transport import Transport
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2, replication_pb2_grpc

if TYPE_CHECKING:
    from pagesift.core.cluster.members import Members
    from pagesift.v1.jobs_pb2_grpc import JobServiceAsyncStub
    from pagesift.v1.replication_pb2_grpc import AdminServiceAsyncStub

__all__ = ["CONTROL_ATTEMPT_SECONDS", "ROLE_LOOKUP_SECONDS", "JobClient"]

#: one CancelJob/ResumeJob attempt at most: a frozen primary costs this, not ``timeout``
CONTROL_ATTEMPT_SECONDS = 5.0
ROLE_LOOKUP_SECONDS = 2.0  # bound on one round of Role calls

T = TypeVar("T")


class JobClient:
    """Async client over grpc.aio; use ``async with JobClient([...]) as c`` or ``close()``."""

    def __init__(
        self,
        addresses: str | Sequence[str] | None = None,
        *,
        timeout: float | None = 60.0,
        scrape_timeout: float | None = 300.0,
        retry_budget: float | None = None,
        api_key: str = "",
        admin_key: str = "",
        tls_ca: str = "",
        tls_cert: str = "",
        tls_key: str = "",
        retry: RetryPolicy | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
        cluster: str | ClusterView | None = None,
        cluster_members: Members | None = None,
        tls_name: str = "",
        insecure_keys: bool | None = None,
    ) -> None:
        """``timeout`` bounds each unary call (``scrape_timeout`` a Scrape and a Map);
        WatchJob is unbounded. ``retry`` is the retry policy (``RetryPolicy()`` by
        default); ``retry_budget``, when given, replaces its budget (the most seconds
        spent sleeping between retries). ``api_key`` / ``admin_key`` are sent as bearer
        tokens. ``tls_ca`` (a PEM file) turns on TLS and names the CA to trust;
        ``tls_cert`` + ``tls_key`` (PEM files, both or neither; TLS on, trusting the
        system roots without ``tls_ca``) are a client certificate to present (mTLS).
        ``credentials`` (e.g. ``grpc.ssl_channel_credentials(...)``, or composite ones)
        replaces all three. ``channel_options`` (``("grpc.keepalive_time_ms",
        30000)``, ...) are passed to every channel, over the client's own defaults.
        ``tls_name``: the name every address's certificate must carry ("": its host;
        a cluster's pairs: ``cluster_members``'); ``insecure_keys``: keys may go in
        plaintext off loopback (by default with addresses, not in cluster mode).
        ``cluster`` (instead of ``addresses``): the cluster's registry, an
        ``etcd://HOST:PORT[,...]/NAME`` URL or a ``ClusterView`` shared by clients;
        ``cluster_members`` (with a URL): its members file, which verifies the records
        and names each pair's ``tls_name`` (``pagesift.client.transport``)."""
        self._credentials = credentials or tls_credentials(tls_ca, tls_cert, tls_key)
        self._transport = Transport.of(
            self._credentials,
            auth_interceptors(api_key, admin_key),
            channel_options,
            tls_name=tls_name,
            plaintext_keys=insecure_keys is not False,
        )
        self._channel_options = self._transport.options  # the defaults under the caller's
        self.failover = Failover(parse_addresses(addresses))
        self.timeout = timeout
        self.scrape_timeout = scrape_timeout
        policy = retry or RetryPolicy()
        if retry_budget is not None:
            policy = dataclasses.replace(policy, budget=retry_budget)
        self.retry = policy
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, JobServiceAsyncStub] = {}
        self._admin_stubs: dict[str, AdminServiceAsyncStub] = {}
        self._located = False
        self._router: ClusterRouter | None = None
        self._own_view: ClusterView | None = None
        if cluster is not None:  # the pairs' clients retry, with this client's options
            if addresses is not None or tls_name:  # each pair's name: the members file's
                raise ValueError("a cluster client takes no addresses and no tls_name")
            kw: dict[str, Any] = dict(
                timeout=timeout,
                scrape_timeout=scrape_timeout,
                retry=policy,
                api_key=api_key,
                admin_key=admin_key,
                credentials=self._credentials,
                channel_options=channel_options,
                insecure_keys=bool(insecure_keys),  # the registry names the nodes: refused
            )
            self._router, self._own_view = open_router(
                cluster, lambda a, name: JobClient(a, tls_name=name, **kw), cluster_members
            )
            self.failover = Failover([f"cluster:{self._router.cluster}"])
            self.retry = RetryPolicy(budget=0)

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
        router, self._router = self._router, None
        if router is not None:
            await router.close()
        if self._own_view is not None:
            await self._own_view.close()
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        self._admin_stubs.clear()
        for channel in channels:
            await channel.close(None)

    @property
    def addresses(self) -> list[str]:
        return list(self.failover.addresses)

    @property
    def retry_budget(self) -> float:
        """The retry policy's budget: the most seconds of sleep between retries."""
        return self.retry.budget

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._transport.open(address)
        return channel

    def stub(self, address: str) -> JobServiceAsyncStub:
        """The stub for ``address`` (one channel per address, made on first use); in
        cluster mode, the cluster's router."""
        if self._router is not None:
            return cast("JobServiceAsyncStub", self._router)
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = jobs_pb2_grpc.JobServiceStub(self._channel(address))
        return stub

    def admin_stub(self, address: str) -> AdminServiceAsyncStub:
        """The AdminService stub for ``address`` (any address; same channel as ``stub``)."""
        if self._router is not None:
            raise ClientError("AdminService calls name one node: not through a cluster client")
        stub = self._admin_stubs.get(address)
        if stub is None:
            channel = self._channel(address)
            stub = self._admin_stubs[address] = replication_pb2_grpc.AdminServiceStub(channel)  # type: ignore[assignment]
        return stub

    # ------------------------------------------------------------ admin and the primary

    async def role(
        self, address: str, *, timeout: float | None = None
    ) -> replication_pb2.RoleResponse:
        """``AdminService.Role`` of one node (no failover: the caller names the node)."""
        return await self.admin_stub(address).Role(
            replication_pb2.RoleRequest(), timeout=timeout or self.timeout
        )

    async def promote(self, address: str) -> replication_pb2.PromoteResponse:
        """``AdminService.Promote`` on one node (never retried, never sent elsewhere)."""
        return await self.admin_stub(address).Promote(
            replication_pb2.PromoteRequest(), timeout=self.timeout
        )

    async def find_primary(self) -> str | None:
        """Ask every address for its Role (concurrently, bounded) and prefer the primary
        of the highest epoch; returns its address (None: no primary answered)."""
        self._located = True
        addresses = list(self.failover.addresses)
        bound = min(self.timeout or ROLE_LOOKUP_SECONDS, ROLE_LOOKUP_SECONDS)
        results = await asyncio.gather(
            *(self.role(a, timeout=bound) for a in addresses), return_exceptions=True
        )
        answers = [
            (a, r if isinstance(r, replication_pb2.RoleResponse) else None)
            for a, r in zip(addresses, results, strict=True)
        ]
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, grpc.aio.AioRpcError):
                raise r  # a cancellation or a bug, not a node that could not answer
        primary = choose_primary(answers)
        if primary is not None:
            self.failover.prefer(primary)
        return primary

    async def wait_connected(
        self, timeout: float, addresses: Sequence[str] | None = None, *, every: bool = False
    ) -> None:
        """Wait at most ``timeout`` seconds for a ready channel to one of ``addresses``
        (default: the client's), or to every one of them with ``every``; ``Unreachable``
        names those not ready otherwise. The calls' failover and retries are unchanged:
        this only bounds how long a caller waits for a server that is not there at all.
        In cluster mode: for the registry's first read."""
        if self._router is not None:
            try:
                await asyncio.wait_for(self._router.ready(), timeout)
            except (grpc.aio.AioRpcError, TimeoutError):
                raise Unreachable([self._router.view.url], timeout) from None
            return
        targets = list(dict.fromkeys(addresses or self.failover.addresses))
        waits = {asyncio.ensure_future(self._channel(a).channel_ready()): a for a in targets}
        try:
            done, _ = await asyncio.wait(
                waits,
                timeout=timeout,
                return_when=asyncio.ALL_COMPLETED if every else asyncio.FIRST_COMPLETED,
            )
        finally:
            for task in waits:
                task.cancel()
        ready = {waits[t] for t in done if not t.cancelled() and t.exception() is None}
        if not ready or (every and len(ready) < len(targets)):
            raise Unreachable([a for a in targets if a not in ready], timeout)

    async def _locate_once(self) -> None:
        if not self._located and len(self.failover.addresses) > 1:
            await self.find_primary()

    async def call(
        self,
        invoke: Callable[[JobServiceAsyncStub], Awaitable[T]],
        *,
        retryable: bool,
        control: bool = False,
    ) -> T:
        """Run one unary call under the failover and retry rules
        (``pagesift.client.failover``; ``control``: those of CancelJob and ResumeJob)."""
        delays = iter(self.retry.delays())
        await self._locate_once()
        while True:
            errors: list[grpc.aio.AioRpcError] = []
            known = set(self.failover.addresses)
            order = self.failover.order()
            tried = 0
            while tried < len(order):
                address = order[tried]
                tried += 1
                try:
                    result = await invoke(self.stub(address))
                except grpc.aio.AioRpcError as err:
                    reason = reason_of(err)
                    timed_out = (
                        control
                        and reason is None
                        and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    )  # a frozen node: an idempotent control write moves on
                    if not timed_out and not should_try_next(
                        err.code(), retryable=retryable, reason=reason
                    ):
                        self.failover.prefer(address)
                        raise
                    # NOT_PRIMARY names the primary: try it next (even if not listed).
                    follow_primary(order, tried, primary_named(err))
                    if address in known or reason is not None:
                        # a named primary that is not listed and cannot be reached
                        # (e.g. an address only its standby can reach) does not turn
                        # the round into a retry loop: it is simply not chosen
                        errors.append(err)
                    continue
                self.failover.prefer(address)
                return result
            await self._after_failed_round(errors, delays, retryable=retryable, control=control)

    async def _after_failed_round(
        self,
        errors: list[grpc.aio.AioRpcError],
        delays: Iterator[float],
        *,
        retryable: bool,
        control: bool = False,
    ) -> None:
        """Sleep before the next round (and look the primary up again), or raise the
        round's most telling error."""
        codes = [e.code() for e in errors]
        reasons = [reason_of(e) for e in errors]
        err = errors[pick_error(codes, reasons)]
        if not keeps_trying(codes, reasons, retryable=retryable, control=control):
            raise err
        delay = next(delays, None)
        if delay is None:
            raise err
        await asyncio.sleep(delay)
        if len(self.failover.addresses) > 1:
            await self.find_primary()  # a standby may have been promoted meanwhile

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

    async def append_batch(
        self,
        job_id: str,
        urls: Sequence[str],
        *,
        ignore_invalid_urls: bool = False,
        options: jobs_pb2.ScrapeOptions | None = None,
        max_concurrency: int = 0,
        idempotency_key: str = "",
    ) -> jobs_pb2.AppendBatchScrapeResponse:
        """Add ``urls`` to the batch job ``job_id`` (AppendBatchScrape; ``options`` and
        ``max_concurrency``, when given, must be the job's); a call without key gets
        one, so a retry through a failover adds nothing twice."""
        req = with_idempotency_key(
            jobs_pb2.AppendBatchScrapeRequest(
                id=job_id,
                urls=urls,
                ignore_invalid_urls=ignore_invalid_urls,
                options=options,
                max_concurrency=max_concurrency,
                idempotency_key=idempotency_key,
            )
        )
        return await self.call(
            lambda s: s.AppendBatchScrape(req, timeout=self.timeout),
            retryable=is_retryable("AppendBatchScrape", req.idempotency_key),
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
        self, job_id: str, *, skip: int = 0, limit: int = 0, status_only: bool = False
    ) -> jobs_pb2.GetJobResponse:
        req = jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=limit, status_only=status_only)
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
        delays = iter(self.retry.delays())
        await self._locate_once()
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
                    reason = reason_of(err)
                    if progressed and err.code() == grpc.StatusCode.UNAVAILABLE and not reason:
                        break  # the server went away mid-stream: start a fresh round
                    if not should_try_next(err.code(), retryable=True, reason=reason):
                        self.failover.answered(address)
                        raise
                    errors.append(err)
                finally:
                    call.cancel()
            if progressed:
                delays = iter(self.retry.delays())
                continue
            await self._after_failed_round(errors, delays, retryable=True)

    async def errors_page(
        self, job_id: str, *, page_size: int = 0, page_token: str = ""
    ) -> jobs_pb2.GetJobErrorsResponse:
        """One page of the job's errors (AIP-158: next_page_token empty at the end)."""
        req = jobs_pb2.GetJobErrorsRequest(id=job_id, page_size=page_size, page_token=page_token)
        return await self.call(lambda s: s.GetJobErrors(req, timeout=self.timeout), retryable=True)

    async def errors(self, job_id: str, *, page_size: int = 0) -> jobs_pb2.GetJobErrorsResponse:
        """Every error of the job, all pages in one response (next_page_token empty)."""
        out = jobs_pb2.GetJobErrorsResponse()
        token = ""
        while True:
            page = await self.errors_page(job_id, page_size=page_size, page_token=token)
            out.errors.extend(page.errors)
            out.robots_blocked.extend(page.robots_blocked)
            if not page.next_page_token or page.next_page_token == token:
                return out
            token = page.next_page_token

    def _control_timeout(self) -> float:
        if self.timeout is None:
            return CONTROL_ATTEMPT_SECONDS
        return min(self.timeout, CONTROL_ATTEMPT_SECONDS)

    async def cancel(self, job_id: str) -> jobs_pb2.JobState.ValueType:
        """CancelJob, tried through a failover (``failover.keeps_trying``); the job's state
        after it (cancelling a finished job returns its state)."""
        req = jobs_pb2.CancelJobRequest(id=job_id)
        resp = await self.call(
            lambda s: s.CancelJob(req, timeout=self._control_timeout()),
            retryable=is_retryable("CancelJob"),
            control=True,
        )
        return resp.state

    async def resume(self, job_id: str) -> jobs_pb2.JobState.ValueType:
        """ResumeJob (a paused job runs again), tried like ``cancel``; the job's state
        after it."""
        req = jobs_pb2.ResumeJobRequest(id=job_id)
        resp = await self.call(
            lambda s: s.ResumeJob(req, timeout=self._control_timeout()),
            retryable=is_retryable("ResumeJob"),
            control=True,
        )
        return resp.state

    async def map(
        self,
        url: str,
        *,
        limit: int = 0,
        search: str = "",
        sitemap: jobs_pb2.SitemapMode.ValueType = jobs_pb2.SITEMAP_MODE_INCLUDE,
        include_paths: Sequence[str] = (),
        exclude_paths: Sequence[str] = (),
        allow_subdomains: bool = False,
        ignore_query_parameters: bool = False,
    ) -> list[str]:
        """The site's URLs (``JobService.Map``), every batch of the stream, in rank
        order. Map stores nothing, so a call broken by UNAVAILABLE (or refused by a
        standby) is simply sent again whole, like a read; bounded by ``scrape_timeout``."""
        req = jobs_pb2.MapRequest(
            url=url,
            limit=limit,
            search=search,
            sitemap=sitemap,
            include_paths=include_paths,
            exclude_paths=exclude_paths,
            allow_subdomains=allow_subdomains,
            ignore_query_parameters=ignore_query_parameters,
        )

        async def collect(stub: JobServiceAsyncStub) -> list[str]:
            call = stub.Map(req, timeout=self.scrape_timeout)
            try:
                return [u async for batch in call for u in batch.urls]
            finally:
                call.cancel()

        return await self.call(collect, retryable=True)

    async def list_jobs_page(
        self,
        *,
        active_only: bool = False,
        states: Sequence[jobs_pb2.JobState.ValueType] = (),
        page_size: int = 0,
        page_token: str = "",
    ) -> jobs_pb2.ListJobsResponse:
        """One page of the caller's jobs, newest first (AIP-158: send next_page_token
        back with the same filter; empty at the end)."""
        req = jobs_pb2.ListJobsRequest(
            active_only=active_only, states=states, page_size=page_size, page_token=page_token
        )
        return await self.call(lambda s: s.ListJobs(req, timeout=self.timeout), retryable=True)

    async def account_usage(self) -> jobs_pb2.GetAccountUsageResponse:
        """GetAccountUsage: the caller's pages used and allowance in the rolling day, its
        running jobs and max_concurrent_jobs, pages queued and in flight (a read: the
        primary, else a standby's replica without in-flight pages)."""
        req = jobs_pb2.GetAccountUsageRequest()
        return await self.call(
            lambda s: s.GetAccountUsage(req, timeout=self.timeout), retryable=True
        )

    async def list_jobs(
        self,
        *,
        active_only: bool = False,
        states: Sequence[jobs_pb2.JobState.ValueType] = (),
        page_size: int = 0,
    ) -> list[jobs_pb2.JobSummary]:
        """Every job of the caller (newest first), page after page."""
        jobs: list[jobs_pb2.JobSummary] = []
        token = ""
        while True:
            page = await self.list_jobs_page(
                active_only=active_only, states=states, page_size=page_size, page_token=token
            )
            jobs.extend(page.jobs)
            if not page.next_page_token or page.next_page_token == token:
                return jobs
            token = page.next_page_token
