"""The public ``JobService`` (gRPC), served by both roles.

Reads (GetJob, WatchJob, GetJobErrors, ListJobs) come from the store only, so a
standby answers them from its replica exactly like the primary; the node adds its
replication position to the response metadata. Writes (Scrape, StartBatchScrape,
StartCrawl, CancelJob) need the job runtime, which only a primary has: a standby
answers FAILED_PRECONDITION naming the primary's address.

Callers are accounts (``pagesift.shared.accounts``): a missing or unknown API key
is UNAUTHENTICATED; a job belongs to the account that started it, and to everyone
else it does not exist (NOT_FOUND, so ids are no oracle). Account limits are
checked inside the registration's write section (RESOURCE_EXHAUSTED naming the
limit and when it resets).

Statuses: a bad field is INVALID_ARGUMENT naming it; an unknown (or someone
else's, or expired) job is NOT_FOUND; a page that cannot be scraped by ``Scrape``
maps its error code to a status (see ``_PAGE_STATUS``) and carries the code in
the ``pagesift-error-code`` trailing metadata.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import NoReturn, Protocol

import grpc

from pagesift.shared import jobrecords as jr
from pagesift.shared import quota, validate
from pagesift.shared.accounts import Account, Accounts, Unauthenticated
from pagesift.shared.config import ServerConfig
from pagesift.shared.events import JobEvents
from pagesift.shared.metrics import Metrics
from pagesift.shared.store import Store
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

WATCH_POLL_SECONDS = 1.0  # a watcher re-reads at least this often, even without a wake-up


class Registration(Protocol):
    id: str
    created: bool


class JobRuntime(Protocol):
    """What the service needs from the primary's job runtime."""

    async def register(
        self,
        kind: str,
        owner: str,
        request: bytes,
        idempotency_key: str,
        *,
        total: int = 0,
        limit: int = 0,
        webhook: jobs_pb2.Webhook | None = None,
        check: Callable[[], None] | None = None,
    ) -> Registration: ...

    async def cancel(self, job_id: str) -> jr.JobMeta | None: ...

    def visible(self, job_id: str) -> int | None: ...

    async def readable(self) -> None: ...

    async def scrape(self, url: str, options: jobs_pb2.ScrapeOptions) -> jobs_pb2.Document: ...


class Node(Protocol):
    """The running node as the API sees it; its role may change while it runs."""

    config: ServerConfig
    events: JobEvents
    accounts: Accounts
    metrics: Metrics

    def store(self) -> Store: ...

    def runtime(self) -> JobRuntime | None:
        """The job runtime when this node is the primary, else None."""

    def primary_hint(self) -> str:
        """Where the writes go, for a standby's FAILED_PRECONDITION message."""

    def read_metadata(self) -> Sequence[tuple[str, str]]:
        """Trailing metadata for reads (a standby's applied offset and lag)."""


_PAGE_STATUS = {
    "robots_disallowed": grpc.StatusCode.PERMISSION_DENIED,
    "blocked_address": grpc.StatusCode.INVALID_ARGUMENT,
    "invalid_url": grpc.StatusCode.INVALID_ARGUMENT,
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
}


Context = grpc.aio.ServicerContext[object, object]
WEBHOOK_EVENTS = ("started", "page", "page_failed", "completed", "failed", "cancelled")


async def _abort(context: Context, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("unreachable")


class JobService(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    # helpers ----------------------------------------------------------------------
    async def _caller(self, context: Context) -> Account:
        try:
            metadata = [(k, v) for k, v in context.invocation_metadata() or ()]
            return self.node.accounts.authenticate(metadata)
        except Unauthenticated as e:
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED, str(e))

    async def _runtime(self, context: Context) -> JobRuntime:
        runtime = self.node.runtime()
        if runtime is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this node is a standby; send writes to the primary at {self.node.primary_hint()}",
            )
            raise AssertionError("unreachable")
        return runtime

    async def _meta(self, job_id: str, context: Context) -> jr.JobMeta:
        try:
            validate.job_id(job_id)
        except validate.InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        caller = await self._caller(context)
        meta = jr.load_meta(self.node.store(), job_id)
        if (
            meta is None
            or meta.owner != caller.name
            or (meta.terminal and meta.expires_ms <= jr.now_ms())
        ):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"id: no job {job_id}")
            raise AssertionError("unreachable")
        return meta

    def _visible(self, job_id: str) -> int | None:
        runtime = self.node.runtime()
        return runtime.visible(job_id) if runtime is not None else None

    async def _readable(self) -> None:
        """Sync mode on a primary: wait until the store it started with is replicated."""
        runtime = self.node.runtime()
        if runtime is not None:
            await runtime.readable()

    def _read_md(self, context: Context) -> None:
        md = self.node.read_metadata()
        if md:
            context.set_trailing_metadata(tuple(md))

    # writes -------------------------------------------------------------------------
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

    async def _refuse_limit(self, context: Context, e: quota.LimitExceeded) -> NoReturn:
        self.node.metrics.limit_hit(e.limit_name)
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED, e.message, trailing_metadata=e.trailing_metadata()
        )
        raise AssertionError("unreachable")

    async def _webhook(
        self, context: Context, caller: Account, hook: jobs_pb2.Webhook
    ) -> jobs_pb2.Webhook | None:
        if not hook.url:
            if hook.events:
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "webhook.url: missing")
            return None
        try:
            await validate.url(hook.url, "webhook.url", self.node.config)
        except validate.InvalidArgument as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        for i, event in enumerate(hook.events):
            if event not in WEBHOOK_EVENTS:
                await _abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"webhook.events[{i}]: unknown event {event!r} "
                    f"(one of {', '.join(WEBHOOK_EVENTS)})",
                )
        if self.node.accounts.webhook_secret(caller.name) is None:
            await _abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"webhook: account {caller.name!r} has no webhook_secret to sign with",
            )
        return hook

    async def Scrape(
        self, request: jobs_pb2.ScrapeRequest, context: Context
    ) -> jobs_pb2.ScrapeResponse:
        runtime = await self._runtime(context)
        caller = await self._caller(context)
        try:
            await validate.url(request.url, "url", self.node.config)
            validate.options(request.options)
        except validate.InvalidArgument as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        try:
            self._limits(caller, "scrape")()
        except quota.LimitExceeded as e:
            await self._refuse_limit(context, e)
        from pagesift.primary.engine import PageError

        try:
            doc = await runtime.scrape(request.url, request.options)
        except PageError as e:
            context.set_trailing_metadata((("pagesift-error-code", str(e.code)),))
            status = _PAGE_STATUS.get(str(e.code), grpc.StatusCode.FAILED_PRECONDITION)
            await _abort(context, status, f"page error {e.code}: {e.message}")
        if caller.pages_per_day is not None:
            self.node.store().write(lambda g: quota.charge(g, caller.name, 1, time.time()))
        return jobs_pb2.ScrapeResponse(document=doc)

    async def StartBatchScrape(
        self, request: jobs_pb2.StartBatchScrapeRequest, context: Context
    ) -> jobs_pb2.StartBatchScrapeResponse:
        runtime = await self._runtime(context)
        caller = await self._caller(context)
        try:
            plan = await validate.batch(request, self.node.config)
        except validate.InvalidArgument as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        hook = await self._webhook(context, caller, request.webhook)
        stored = jobs_pb2.StartBatchScrapeRequest()
        stored.CopyFrom(request)
        del stored.urls[:]
        stored.urls.extend(plan.urls)
        check = self._limits(caller, "batch", batch_urls=len(plan.urls))
        try:
            reg = await runtime.register(
                "batch",
                caller.name,
                stored.SerializeToString(),
                request.idempotency_key,
                total=len(plan.urls),
                webhook=hook,
                check=check,
            )
        except quota.LimitExceeded as e:
            await self._refuse_limit(context, e)
        return jobs_pb2.StartBatchScrapeResponse(id=reg.id, invalid_urls=plan.invalid)

    async def StartCrawl(
        self, request: jobs_pb2.StartCrawlRequest, context: Context
    ) -> jobs_pb2.StartCrawlResponse:
        runtime = await self._runtime(context)
        caller = await self._caller(context)
        try:
            await validate.crawl(request, self.node.config)
        except validate.InvalidArgument as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        hook = await self._webhook(context, caller, request.webhook)
        limit = quota.crawl_limit_for(caller, request.limit, self.node.config.default_crawl_limit)
        check = self._limits(caller, "crawl", limit=limit)
        try:
            reg = await runtime.register(
                "crawl",
                caller.name,
                request.SerializeToString(),
                request.idempotency_key,
                limit=limit,
                webhook=hook,
                check=check,
            )
        except quota.LimitExceeded as e:
            await self._refuse_limit(context, e)
        return jobs_pb2.StartCrawlResponse(id=reg.id)

    async def CancelJob(
        self, request: jobs_pb2.CancelJobRequest, context: Context
    ) -> jobs_pb2.CancelJobResponse:
        runtime = await self._runtime(context)
        await self._meta(request.id, context)
        meta = await runtime.cancel(request.id)
        if meta is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"id: no job {request.id}")
        return jobs_pb2.CancelJobResponse(state=jr.STATE_TO_PB[meta.state])

    # reads ----------------------------------------------------------------------------
    async def GetJob(
        self,
        request: jobs_pb2.GetJobRequest,
        context: Context,
    ) -> jobs_pb2.GetJobResponse:
        try:
            limit = validate.page(request.skip, request.limit, self.node.config)
        except validate.InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable") from None
        meta = await self._meta(request.id, context)
        await self._readable()
        store = self.node.store()
        visible = self._visible(meta.id)
        p = jr.progress(store, meta, visible)
        if request.skip > p.completed and meta.terminal:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"skip: {request.skip} is beyond the last document ({p.completed})",
            )
        docs = (
            []
            if request.status_only
            else jr.read_documents(store, meta.id, request.skip, limit, visible)
        )
        end = request.skip + len(docs)
        resp = jobs_pb2.GetJobResponse(
            id=meta.id,
            kind=jr.KIND_TO_PB[meta.kind],
            state=jr.STATE_TO_PB[meta.state],
            total=p.total,
            completed=p.completed,
            failed=p.failed,
            created_at=jr.timestamp(meta.created_ms),
            expires_at=jr.timestamp(meta.expires_ms),
            documents=docs,
            note=meta.note,
        )
        if not request.status_only and (end < p.completed or not meta.terminal):
            resp.next_skip = end
        self._read_md(context)
        return resp

    async def WatchJob(
        self,
        request: jobs_pb2.WatchJobRequest,
        context: Context,
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        meta = await self._meta(request.id, context)
        if request.from_index < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "from_index: negative")
        index = request.from_index
        last: tuple[int, int, int, int] | None = None
        events = self.node.events
        await self._readable()
        while True:
            wake = events.current(meta.id)  # before reading: no change slips between
            store = self.node.store()
            fresh = jr.load_meta(store, meta.id)
            if fresh is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"id: job {meta.id} expired")
                return
            visible = self._visible(meta.id)
            docs = jr.read_documents(store, meta.id, index, 256, visible)
            for doc in docs:
                yield jobs_pb2.WatchJobResponse(
                    document=jobs_pb2.IndexedDocument(index=index, document=doc)
                )
                index += 1
            if docs:
                continue
            p = jr.progress(store, fresh, visible)
            state = (jr.STATE_TO_PB[fresh.state], p.total, p.completed, p.failed)
            if state != last:
                last = state
                yield jobs_pb2.WatchJobResponse(
                    state=jobs_pb2.StateChange(
                        state=state[0], total=p.total, completed=p.completed, failed=p.failed
                    )
                )
            if fresh.terminal and index >= p.completed:
                return
            await events.wait(wake, WATCH_POLL_SECONDS)

    async def GetJobErrors(
        self,
        request: jobs_pb2.GetJobErrorsRequest,
        context: Context,
    ) -> jobs_pb2.GetJobErrorsResponse:
        meta = await self._meta(request.id, context)
        await self._readable()
        errors, robots = jr.read_errors(self.node.store(), meta.id)
        self._read_md(context)
        return jobs_pb2.GetJobErrorsResponse(errors=errors, robots_blocked=robots)

    async def ListJobs(
        self,
        request: jobs_pb2.ListJobsRequest,
        context: Context,
    ) -> jobs_pb2.ListJobsResponse:
        owner, now = (await self._caller(context)).name, jr.now_ms()
        await self._readable()
        store = self.node.store()
        metas = [m for i in jr.all_job_ids(store) if (m := jr.load_meta(store, i)) is not None]
        metas = [
            m
            for m in metas
            if m.owner == owner
            and not (m.terminal and m.expires_ms <= now)
            and not (request.active_only and m.terminal)
        ]
        metas.sort(key=lambda m: m.created_ms, reverse=True)
        self._read_md(context)
        return jobs_pb2.ListJobsResponse(
            jobs=[jr.summary(store, m, self._visible(m.id)) for m in metas]
        )
