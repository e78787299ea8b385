"""The public ``JobService`` (gRPC), served by both roles: authenticate, validate, register.

Reads (GetJob, WatchJob, GetJobErrors, ListJobs, GetAccountUsage) come from the store
(GetAccountUsage adds the primary's pages in flight), so a standby answers them from
its replica like the primary; the node adds its replication position to the response
metadata. Writes (Scrape, StartBatchScrape, StartCrawl,
CancelJob, ResumeJob, Map) need the job runtime, which only a primary has: a standby
refuses them (NOT_PRIMARY, naming the primary).

Each write handler reads straight through: the caller (``Accounts.authenticate``: a
missing or unknown key is UNAUTHENTICATED before anything else), the runtime, one
``requestspecs`` call that validates the whole request against the caller's
permissions, then the registration, whose write section checks the account's limits.
Handlers raise domain exceptions; ``errortable.answers_errors`` turns each into its
status once, per the error table (which also documents every reason).

A job belongs to the account that started it; to everyone else it does not exist
(NOT_FOUND, so ids are no oracle). CancelJob and ResumeJob are the owner's or the
admin key's, return the state after the call and are idempotent. Paused jobs carry
``PauseInfo`` in GetJob, ListJobs and WatchJob's state events (a standby shows it too).

Responses are bounded: GetJob pages by count and by ``max_response_bytes``; WatchJob
streams are counted per account and node (``pagesift.core.api.streams``) and read a
window at a time from the node's byte budget; a document over the send limit is
refused naming its index (DOCUMENT_TOO_LARGE), never a transport error. Paging and
windows are ``pagesift.core.api.paging``'s.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar

import grpc

from pagesift.core.api import appends, extracts, paging, previews, usage
from pagesift.core.api.errortable import (
    CallFacts,
    DocumentTooLarge,
    JobNotFound,
    PageFailed,
    SkipOutOfRange,
    StandbyNode,
    answers_errors,
)
from pagesift.core.api.paging import field_bytes
from pagesift.core.api.ports import JobRuntime, Node
from pagesift.core.api.streams import StreamBytes, StreamSlots, WatchBytes
from pagesift.core.jobs import modelrequests, quota, records, specs, validate, views
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.pageerrors import PageError
from pagesift.core.jobs.specs import Permissions
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

WATCH_POLL_SECONDS = 1.0  # a watcher re-reads at least this often, even without a wake-up
TRIM_AFTER_BYTES = 4 * 1024 * 1024  # a batch request this large is followed by malloc_trim
TRIM_DELAY_SECONDS = 1.0  # ... this long after its handler returned
WATCH_TRIM_BYTES = 1024 * 1024  # ... and a WatchJob stream that held this much at once
# The server's grpc.max_send_message_length (pagesift.node.grpcserver uses this): a
# response above it is refused here, naming the document, not failed by the transport.
MAX_SEND_MESSAGE_BYTES = 64 * 1024 * 1024
_MAX_INT32 = 2**31 - 1


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (another libc)."""
    try:
        fn: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return fn


_MALLOC_TRIM = _malloc_trim()


Context = grpc.aio.ServicerContext[object, object]

# The account the current call authenticated as (each RPC runs in its own task, so
# its own context): what a refusal names (PERMISSION_DENIED_FIELD, QUOTA_EXCEEDED).
_CALLER: ContextVar[str] = ContextVar("pagesift_caller", default="")


def _trim_heap_soon() -> None:
    """After a large request: once gRPC has dropped it, hand the freed heap back to the
    OS (glibc keeps freed memory in its arenas otherwise: ~35 MB after a 16 MB batch)."""
    global _trim_pending
    if _MALLOC_TRIM is None or _trim_pending:
        return  # one trim covers every request that ended before it runs
    trim = _MALLOC_TRIM
    loop = asyncio.get_running_loop()

    def run() -> None:
        global _trim_pending
        _trim_pending = False
        loop.run_in_executor(None, trim, 0)

    _trim_pending = True
    loop.call_later(TRIM_DELAY_SECONDS, run)


_trim_pending = False


def _no_job(job_id: str, message: str = "") -> JobNotFound:
    return JobNotFound(job_id, message or f"id: no job {job_id}")


async def _scrape(runtime: JobRuntime, spec: specs.ScrapeSpec, owner: str) -> jobs_pb2.Document:
    """The runtime's scrape; a page error names the URL asked for (``PageFailed``)."""
    try:
        return await runtime.scrape(spec.url, spec.options, owner)
    except PageError as e:
        raise PageFailed(e, spec.url) from e


class JobService(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, node: Node) -> None:
        self.node = node
        cfg = node.config
        self.streams = StreamSlots(cfg.max_concurrent_streams, cfg.max_total_streams, node.metrics)
        self.watch_bytes = WatchBytes(
            cfg.watch_stream_bytes, cfg.watch_total_bytes, node.metrics, cfg.watch_account_bytes
        )

    # the error table's view of a call (errortable.Refuser) -----------------------------
    def call_facts(self) -> CallFacts:
        return CallFacts(_CALLER.get(), self.node.primary_hint(), time.time())

    def refused(self, exc: Exception) -> None:
        if isinstance(exc, quota.LimitExceeded):
            self.node.metrics.limit_hit(exc.limit_name)

    # helpers ----------------------------------------------------------------------
    def _caller(self, context: Context) -> Account:
        """The calling account (``Unauthenticated`` without a valid key)."""
        metadata = [(k, v) for k, v in context.invocation_metadata() or ()]
        caller = self.node.accounts.authenticate(metadata)
        _CALLER.set(caller.name)
        return caller

    def _permissions(self, caller: Account) -> Permissions:
        secret = self.node.accounts.webhook_secret(caller.name)
        return Permissions(caller, can_sign_webhooks=secret is not None)

    def _runtime(self) -> JobRuntime:
        runtime = self.node.runtime()
        if runtime is None:
            raise StandbyNode()
        return runtime

    def _control(self, job_id: str, context: Context) -> JobRuntime:
        """CancelJob and ResumeJob: the caller (an account, or the admin key), then the
        runtime (a standby answers NOT_PRIMARY before it looks the job up: its replica
        may lag, and the client must go on to the primary), then the job, for its
        owner or the admin key (NOT_FOUND when it is gone or someone else's)."""
        metadata = [(k, v) for k, v in context.invocation_metadata() or ()]
        admin = self.node.accounts.carries_admin_key(metadata)
        caller = None if admin else self._caller(context)
        runtime = self._runtime()
        if caller is not None:
            self._owned(caller, job_id)
            return runtime
        validate.job_id(job_id)
        meta = records.load_meta(self.node.store(), job_id)
        if meta is None or (meta.terminal and meta.expires_ms <= records.now_ms()):
            raise _no_job(job_id)
        return runtime

    def _owned(self, caller: Account, job_id: str) -> records.JobMeta:
        """The caller's job ``job_id``; NOT_FOUND when it is anyone else's or gone."""
        validate.job_id(job_id)
        meta = records.load_meta(self.node.store(), job_id)
        if (
            meta is None
            or meta.owner != caller.name
            or (meta.terminal and meta.expires_ms <= records.now_ms())
        ):
            raise _no_job(job_id)
        return meta

    def _visible(self, job_id: str) -> int | None:
        return self.node.visible(job_id)

    async def _readable(self) -> None:
        """Sync mode on a primary: wait until the store it started with is replicated."""
        runtime = self.node.runtime()
        if runtime is not None:
            await runtime.readable()

    def _read_md(self, context: Context) -> None:
        md = self.node.read_metadata()
        if md:
            context.set_trailing_metadata(tuple(md))

    def _limits(
        self, caller: Account, kind: str, *, batch_urls: int = 0, limit: int = 0
    ) -> Callable[[], None]:
        """A check of the caller's limits to run inside the registration's write section."""
        store = self.node.store()

        def check() -> None:
            now = time.time()
            quota.check_start(
                caller,
                quota.active_jobs(store, caller.name),
                quota.used_today(store, caller.name, now),
                kind,
                batch_urls=batch_urls,
                crawl_limit=limit,
                resets_at=quota.resets_at(store, caller.name, now, caller.pages_per_day),
            )

        return check

    # writes -------------------------------------------------------------------------
    @answers_errors
    async def Scrape(
        self, request: jobs_pb2.ScrapeRequest, context: Context
    ) -> jobs_pb2.ScrapeResponse:
        caller = self._caller(context)
        runtime = self._runtime()
        spec = await specs.scrape(
            request, self._permissions(caller), self.node.config, renders=self.node.can_render
        )
        self._limits(caller, "scrape")()
        modelrequests.tokens_left(self.node.store(), caller, spec.options, time.time())
        doc = await _scrape(runtime, spec, caller.name)  # charged there, with its page
        return jobs_pb2.ScrapeResponse(document=doc)

    @answers_errors
    async def StartBatchScrape(
        self, request: jobs_pb2.StartBatchScrapeRequest, context: Context
    ) -> jobs_pb2.StartBatchScrapeResponse:
        caller = self._caller(context)
        runtime = self._runtime()
        spec = await specs.batch(
            request, self._permissions(caller), self.node.config, renders=self.node.can_render
        )
        modelrequests.tokens_left(self.node.store(), caller, spec.options, time.time())
        reg = await runtime.register(
            spec, caller.name, check=self._limits(caller, "batch", batch_urls=spec.total)
        )
        if request.ByteSize() >= TRIM_AFTER_BYTES:
            _trim_heap_soon()
        return jobs_pb2.StartBatchScrapeResponse(id=reg.id, invalid_urls=spec.invalid)

    @answers_errors
    async def AppendBatchScrape(
        self, request: jobs_pb2.AppendBatchScrapeRequest, context: Context
    ) -> jobs_pb2.AppendBatchScrapeResponse:
        """URLs added to the caller's batch job (``pagesift.core.api.appends``)."""
        return await appends.append_batch(self.node, self._caller(context), request)

    @answers_errors
    async def StartCrawl(
        self, request: jobs_pb2.StartCrawlRequest, context: Context
    ) -> jobs_pb2.StartCrawlResponse:
        caller = self._caller(context)
        runtime = self._runtime()
        if request.prompt:  # the words become options first, then the request is checked
            request = await previews.prompted_crawl(runtime, caller, request, self.node.config)
        spec = await specs.crawl(
            request, self._permissions(caller), self.node.config, renders=self.node.can_render
        )
        modelrequests.tokens_left(self.node.store(), caller, spec.options, time.time())
        reg = await runtime.register(
            spec, caller.name, check=self._limits(caller, "crawl", limit=spec.limit)
        )
        return jobs_pb2.StartCrawlResponse(id=reg.id)

    @answers_errors
    async def PreviewCrawlParams(
        self, request: jobs_pb2.PreviewCrawlParamsRequest, context: Context
    ) -> jobs_pb2.PreviewCrawlParamsResponse:
        caller = self._caller(context)
        runtime = self._runtime()
        return await previews.preview(
            runtime, self._permissions(caller), request, self.node.config, self.node.can_render
        )

    @answers_errors
    async def StartExtract(
        self, request: jobs_pb2.StartExtractRequest, context: Context
    ) -> jobs_pb2.StartExtractResponse:
        """One batch of FORMAT_JSON pages (``extracts``), registered as a batch's."""
        caller = self._caller(context)
        runtime = self._runtime()
        batch = await extracts.batch_request(runtime, caller, request, self.node.config)
        spec = await specs.batch(
            batch, self._permissions(caller), self.node.config, renders=self.node.can_render
        )
        modelrequests.tokens_left(self.node.store(), caller, spec.options, time.time())
        reg = await runtime.register(
            spec, caller.name, check=self._limits(caller, "batch", batch_urls=spec.total)
        )
        return jobs_pb2.StartExtractResponse(
            id=reg.id, urls=list(spec.kept()), invalid_urls=spec.invalid
        )

    @answers_errors
    async def GetExtract(
        self, request: jobs_pb2.GetExtractRequest, context: Context
    ) -> jobs_pb2.GetExtractResponse:
        caller = self._caller(context)
        meta = self._owned(caller, request.id)
        await self._readable()
        resp = extracts.get_extract(self.node.store(), meta, self._visible(meta.id))
        self._read_md(context)
        return resp

    @answers_errors
    async def CancelJob(
        self, request: jobs_pb2.CancelJobRequest, context: Context
    ) -> jobs_pb2.CancelJobResponse:
        meta = await self._control(request.id, context).cancel(request.id)
        if meta is None:
            raise _no_job(request.id)
        return jobs_pb2.CancelJobResponse(state=records.STATE_TO_PB[meta.state])

    @answers_errors
    async def ResumeJob(
        self, request: jobs_pb2.ResumeJobRequest, context: Context
    ) -> jobs_pb2.ResumeJobResponse:
        meta = await self._control(request.id, context).resume(request.id)
        if meta is None:
            raise _no_job(request.id)
        return jobs_pb2.ResumeJobResponse(state=records.STATE_TO_PB[meta.state])

    # reads ----------------------------------------------------------------------------
    @answers_errors
    async def GetJob(
        self,
        request: jobs_pb2.GetJobRequest,
        context: Context,
    ) -> jobs_pb2.GetJobResponse:
        caller = self._caller(context)
        limit = validate.page(request.skip, request.limit, self.node.config)
        meta = self._owned(caller, request.id)
        await self._readable()
        store = self.node.store()
        visible = self._visible(meta.id)
        p = views.progress(store, meta, visible)
        if request.skip > p.completed and meta.terminal:
            raise SkipOutOfRange(request.skip, p.completed)
        resp = jobs_pb2.GetJobResponse(
            id=meta.id,
            kind=records.KIND_TO_PB[meta.kind],
            state=records.STATE_TO_PB[meta.state],
            total=p.total,
            completed=p.completed,
            failed=p.failed,
            created_at=records.timestamp(meta.created_ms),
            expires_at=records.timestamp(meta.expires_ms),
            note=meta.note,
            next_skip=min(request.skip + limit, _MAX_INT32),  # sized at its largest
            removed_urls=views.read_removed(store, meta.id) if meta.terminal else (),
            paused=views.pause_info(store, meta),
            model_usage=records.model_usage(store, meta.id),
        )
        base = resp.ByteSize()
        resp.ClearField("next_skip")
        raws = (
            []
            if request.status_only
            else paging.sized_window(
                store, meta.id, request.skip, limit, visible,
                self.node.config.max_response_bytes - base,
            )
        )  # fmt: skip
        if len(raws) == 1 and base + field_bytes(len(raws[0])) > MAX_SEND_MESSAGE_BYTES:
            raise DocumentTooLarge(request.skip, len(raws[0]), MAX_SEND_MESSAGE_BYTES, "skip")
        resp.documents.extend(jobs_pb2.Document.FromString(raw) for raw in raws)
        end = request.skip + len(raws)
        del raws
        if not request.status_only and (end < p.completed or not meta.terminal):
            resp.next_skip = end
        self._read_md(context)
        return resp

    @answers_errors
    async def WatchJob(
        self,
        request: jobs_pb2.WatchJobRequest,
        context: Context,
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        """The job's documents from ``from_index`` on, then its state changes, until it
        ends. The next documents are read only once gRPC has taken the previous ones,
        a window at a time (``watch_stream_bytes``), granted from the node's byte budget
        first (``watch_total_bytes``, ``watch_account_bytes``): a client that does not
        read holds the server to one window; past the budget, streams wait holding
        nothing. A stream that held big documents is followed by ``malloc_trim``."""
        caller = self._caller(context)
        if request.from_index < 0:
            raise validate.InvalidArgument("from_index", "negative")
        meta = self._owned(caller, request.id)
        slot = self.streams.acquire(caller)
        metrics = self.node.metrics
        held = 0  # documents read from the store that gRPC has not taken yet
        inflight = self.watch_bytes.stream(caller.name)  # ... their bytes, in the budget
        peak = 0  # the most bytes this stream held at once
        try:
            index = request.from_index
            last: tuple[int, int, int, int] | None = None
            events = self.node.events
            await self._readable()
            while True:
                wake = events.current(meta.id)  # before reading: no change slips between
                store = self.node.store()
                fresh = records.load_meta(store, meta.id)
                if fresh is None:
                    raise _no_job(meta.id, f"id: job {meta.id} expired")
                visible = self._visible(meta.id)
                p = views.progress(store, fresh, visible)
                if index < p.completed:
                    raws = await self._watch_read(inflight, meta.id, index, visible)
                    peak = max(peak, inflight.held)
                    held = len(raws)
                    metrics.watch_documents_read.inc(held)
                    metrics.watch_documents_buffered.inc(held)
                    raws.reverse()  # pop from the end: each raw document is dropped as sent
                    while raws:
                        raw = raws.pop()
                        size = field_bytes(len(raw))
                        if size + 16 > MAX_SEND_MESSAGE_BYTES:  # + index
                            raise DocumentTooLarge(
                                index, len(raw), MAX_SEND_MESSAGE_BYTES, "from_index"
                            )
                        resp = jobs_pb2.WatchJobResponse()
                        resp.document.index = index
                        resp.document.document.MergeFromString(raw)  # the one parsed copy
                        del raw
                        yield resp  # resumes once the transport took it (flow control)
                        del resp
                        inflight.give(size)
                        held -= 1
                        metrics.watch_documents_buffered.dec()
                        index += 1
                    continue
                state = (records.STATE_TO_PB[fresh.state], p.total, p.completed, p.failed)
                if state != last:
                    last = state
                    yield jobs_pb2.WatchJobResponse(
                        state=jobs_pb2.StateChange(
                            state=state[0],
                            total=p.total,
                            completed=p.completed,
                            failed=p.failed,
                            paused=views.pause_info(store, fresh),
                        )
                    )
                if fresh.terminal and index >= p.completed:
                    return
                await events.wait(wake, WATCH_POLL_SECONDS)
        finally:  # ended, failed, or cancelled (the client went away)
            metrics.watch_documents_buffered.dec(held)
            inflight.close()
            slot.release()
            if peak >= WATCH_TRIM_BYTES:
                _trim_heap_soon()  # big documents: give the freed pages back to the OS

    async def _watch_read(
        self, inflight: StreamBytes, job_id: str, index: int, visible: int | None
    ) -> list[bytes]:
        """A watcher's next window (``paging.watch_window``), its bytes granted by the node's
        budget first: the stream waits (holding nothing) while the budget is spent. A
        document bigger than the stream's window is put back and read again once the
        budget has granted its whole size, so no stream holds bytes it was not granted."""
        budget = self.watch_bytes.per_stream
        await inflight.reserve(budget)
        raws, size = paging.watch_window(self.node.store(), job_id, index, visible, budget)
        if size <= budget:
            inflight.give(budget - size)
            return raws
        del raws  # one document larger than a window: drop it, wait for its whole size
        inflight.give(budget)
        await inflight.reserve(size)
        raws = paging.window(self.node.store(), job_id, index, 1, visible)
        got = sum(field_bytes(len(r)) for r in raws)
        inflight.give(size - got)  # stored documents do not change: 0 unless it expired
        return raws

    @answers_errors
    async def GetJobErrors(
        self,
        request: jobs_pb2.GetJobErrorsRequest,
        context: Context,
    ) -> jobs_pb2.GetJobErrorsResponse:
        caller = self._caller(context)
        size = paging.page_size(request.page_size, self.node.config)
        meta = self._owned(caller, request.id)
        start = paging.errors_start(request.page_token, meta.id)
        await self._readable()
        page = views.read_errors_page(self.node.store(), meta.id, start, size)
        self._read_md(context)
        nxt = page.next
        return jobs_pb2.GetJobErrorsResponse(
            errors=page.errors,
            robots_blocked=page.robots_blocked,
            next_page_token=(
                paging.token(
                    paging.ERRORS_TOKEN, meta.id.encode(), nxt[0].encode(), str(nxt[1]).encode()
                )
                if nxt is not None
                else ""
            ),
        )

    @answers_errors
    async def ListJobs(
        self,
        request: jobs_pb2.ListJobsRequest,
        context: Context,
    ) -> jobs_pb2.ListJobsResponse:
        """One page of the caller's jobs, newest first (AIP-158), read through the
        owner index (``owner/{account}/jobs``): never another account's job. A store
        whose index is not built yet (a standby of a primary that has not migrated)
        pages the same members computed from the jobs set."""
        owner = self._caller(context).name
        size = paging.page_size(request.page_size, self.node.config)
        wanted, tag = paging.list_filter(request)
        after = paging.list_after(request.page_token, tag)
        await self._readable()
        store = self.node.store()
        now = records.now_ms()
        fetch = paging.index_reader(store, owner)

        def keep(member: bytes) -> records.JobMeta | None:
            m = records.load_meta(store, records.member_job(member))
            if m is None or m.owner != owner or (m.terminal and m.expires_ms <= now):
                return None
            return m if wanted is None or m.state in wanted else None

        metas: list[records.JobMeta] = []
        last = after
        budget = max(paging.LIST_SCAN_MIN, paging.LIST_SCAN_FACTOR * size)
        scanned = 0
        more = True
        while len(metas) < size and scanned < budget:
            batch = fetch(last, max(16, size - len(metas)))
            if not batch:
                more = False
                break
            for member in batch:
                last, scanned = member, scanned + 1
                if (m := keep(member)) is not None:
                    metas.append(m)
                if len(metas) >= size or scanned >= budget:
                    break
        if more and last is not None:
            more = bool(fetch(last, 1))
        self._read_md(context)
        return jobs_pb2.ListJobsResponse(
            jobs=[views.summary(store, m, self._visible(m.id)) for m in metas],
            next_page_token=paging.token(paging.JOBS_TOKEN, tag, last) if more and last else "",
        )

    @answers_errors
    async def GetAccountUsage(
        self,
        request: jobs_pb2.GetAccountUsageRequest,
        context: Context,
    ) -> jobs_pb2.GetAccountUsageResponse:
        """The caller's own usage and limits (``pagesift.core.api.usage``: what one call
        costs). A read: a standby answers from its replica, without in-flight pages."""
        caller = self._caller(context)
        await self._readable()
        runtime = self.node.runtime()
        activity = runtime.activity(caller.name) if runtime is not None else None
        resp = usage.account_usage(
            self.node.store(),
            caller,
            activity,
            self.node.config.max_concurrency,
            time.time(),
            model_enabled=bool(self.node.config.model_url),
        )
        self._read_md(context)
        return resp

    # Map ------------------------------------------------------------------------------
    @answers_errors
    async def Map(
        self,
        request: jobs_pb2.MapRequest,
        context: Context,
    ) -> AsyncIterator[jobs_pb2.MapResponse]:
        """A site's URLs (``pagesift.primary.jobs.mapper``), streamed in batches once all
        are found and ranked; nothing is stored or charged. Primary only."""
        caller = self._caller(context)
        runtime = self._runtime()
        spec = await specs.map_spec(request, self._permissions(caller), self.node.config)
        found = await runtime.map(spec.request, caller.name)
        for batch in paging.url_batches(found):
            yield jobs_pb2.MapResponse(urls=batch)
