"""The public ``JobService`` (gRPC), served by both roles.

Reads (GetJob, WatchJob, GetJobErrors, ListJobs) come from the store only, so a
standby answers them from its replica exactly like the primary; the node adds its
replication position to the response metadata. Writes (Scrape, StartBatchScrape,
StartCrawl, CancelJob) need the job runtime, which only a primary has: a standby
answers FAILED_PRECONDITION naming the primary's address.

Statuses: a bad field is INVALID_ARGUMENT naming it; an unknown (or someone
else's, or expired) job is NOT_FOUND; a page that cannot be scraped by ``Scrape``
maps its error code to a status (see ``_PAGE_STATUS``) and carries the code in
the ``pagesift-error-code`` trailing metadata.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import grpc

from pagesift.shared import jobrecords as jr
from pagesift.shared import validate
from pagesift.shared.config import ServerConfig
from pagesift.shared.events import JobEvents
from pagesift.shared.store import Store
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

log = logging.getLogger("pagesift.api")

ANONYMOUS = "anonymous"
WATCH_POLL_SECONDS = 1.0  # a watcher re-reads at least this often, even without a wake-up


class Registration(Protocol):
    id: str
    created: bool


class PageFailure(Protocol):
    code: str
    message: str


class JobRuntime(Protocol):
    """What the service needs from the primary's job runtime."""

    def register(
        self,
        kind: str,
        owner: str,
        request: bytes,
        idempotency_key: str,
        *,
        total: int = 0,
        limit: int = 0,
    ) -> Registration: ...

    def cancel(self, job_id: str) -> jr.JobMeta | None: ...

    def visible(self, job_id: str) -> int | None: ...

    async def scrape(self, url: str, options: jobs_pb2.ScrapeOptions) -> jobs_pb2.Document: ...


class Node(Protocol):
    """The running node as the API sees it; its role may change while it runs."""

    config: ServerConfig
    events: JobEvents

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


def owner_of(context: grpc.aio.ServicerContext[object, object]) -> str:
    """The calling account (accounts arrive with the platform issue)."""
    return ANONYMOUS


class JobService(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, node: Node) -> None:
        self.node = node

    # helpers ----------------------------------------------------------------------
    async def _runtime(self, context: grpc.aio.ServicerContext[object, object]) -> JobRuntime:
        runtime = self.node.runtime()
        if runtime is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this node is a standby; send writes to the primary at {self.node.primary_hint()}",
            )
            raise AssertionError("unreachable")
        return runtime

    async def _meta(
        self, job_id: str, context: grpc.aio.ServicerContext[object, object]
    ) -> jr.JobMeta:
        try:
            validate.job_id(job_id)
        except validate.InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        meta = jr.load_meta(self.node.store(), job_id)
        if (
            meta is None
            or meta.owner != owner_of(context)
            or (meta.terminal and meta.expires_ms <= jr.now_ms())
        ):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"id: no job {job_id}")
            raise AssertionError("unreachable")
        return meta

    def _visible(self, job_id: str) -> int | None:
        runtime = self.node.runtime()
        return runtime.visible(job_id) if runtime is not None else None

    def _read_md(self, context: grpc.aio.ServicerContext[object, object]) -> None:
        md = self.node.read_metadata()
        if md:
            context.set_trailing_metadata(tuple(md))

    # writes -------------------------------------------------------------------------
    async def Scrape(
        self,
        request: jobs_pb2.ScrapeRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.ScrapeResponse:
        runtime = await self._runtime(context)
        try:
            await validate.url(request.url, "url", self.node.config)
            validate.options(request.options)
        except validate.InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        from pagesift.primary.engine import PageError

        try:
            doc = await runtime.scrape(request.url, request.options)
        except PageError as e:
            context.set_trailing_metadata((("pagesift-error-code", str(e.code)),))
            status = _PAGE_STATUS.get(str(e.code), grpc.StatusCode.FAILED_PRECONDITION)
            await context.abort(status, f"page error {e.code}: {e.message}")
            raise AssertionError("unreachable") from None
        return jobs_pb2.ScrapeResponse(document=doc)

    async def StartBatchScrape(
        self,
        request: jobs_pb2.StartBatchScrapeRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.StartBatchScrapeResponse:
        runtime = await self._runtime(context)
        try:
            plan = await validate.batch(request, self.node.config)
        except validate.InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable") from None
        stored = jobs_pb2.StartBatchScrapeRequest()
        stored.CopyFrom(request)
        del stored.urls[:]
        stored.urls.extend(plan.urls)
        reg = runtime.register(
            "batch",
            owner_of(context),
            stored.SerializeToString(),
            request.idempotency_key,
            total=len(plan.urls),
        )
        return jobs_pb2.StartBatchScrapeResponse(id=reg.id, invalid_urls=plan.invalid)

    async def StartCrawl(
        self,
        request: jobs_pb2.StartCrawlRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.StartCrawlResponse:
        runtime = await self._runtime(context)
        try:
            limit = await validate.crawl(request, self.node.config)
        except validate.InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable") from None
        reg = runtime.register(
            "crawl",
            owner_of(context),
            request.SerializeToString(),
            request.idempotency_key,
            limit=limit,
        )
        return jobs_pb2.StartCrawlResponse(id=reg.id)

    async def CancelJob(
        self,
        request: jobs_pb2.CancelJobRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.CancelJobResponse:
        runtime = await self._runtime(context)
        await self._meta(request.id, context)
        meta = runtime.cancel(request.id)
        if meta is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"id: no job {request.id}")
            raise AssertionError("unreachable")
        return jobs_pb2.CancelJobResponse(state=jr.STATE_TO_PB[meta.state])

    # reads ----------------------------------------------------------------------------
    async def GetJob(
        self,
        request: jobs_pb2.GetJobRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.GetJobResponse:
        try:
            limit = validate.page(request.skip, request.limit, self.node.config)
        except validate.InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable") from None
        meta = await self._meta(request.id, context)
        store = self.node.store()
        visible = self._visible(meta.id)
        p = jr.progress(store, meta, visible)
        if request.skip > p.completed and meta.terminal:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"skip: {request.skip} is beyond the last document ({p.completed})",
            )
        docs = jr.read_documents(store, meta.id, request.skip, limit, visible)
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
        if end < p.completed or not meta.terminal:
            resp.next_skip = end
        self._read_md(context)
        return resp

    async def WatchJob(
        self,
        request: jobs_pb2.WatchJobRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        meta = await self._meta(request.id, context)
        if request.from_index < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "from_index: negative")
        index = request.from_index
        last: tuple[int, int, int, int] | None = None
        events = self.node.events
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
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.GetJobErrorsResponse:
        meta = await self._meta(request.id, context)
        errors, robots = jr.read_errors(self.node.store(), meta.id)
        self._read_md(context)
        return jobs_pb2.GetJobErrorsResponse(errors=errors, robots_blocked=robots)

    async def ListJobs(
        self,
        request: jobs_pb2.ListJobsRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> jobs_pb2.ListJobsResponse:
        store = self.node.store()
        owner, now = owner_of(context), jr.now_ms()
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
