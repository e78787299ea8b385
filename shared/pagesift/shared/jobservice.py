"""The public ``JobService`` (gRPC), served by both roles.

Reads (GetJob, WatchJob, GetJobErrors, ListJobs) come from the store only, so a
standby answers them from its replica exactly like the primary; the node adds its
replication position to the response metadata. Writes (Scrape, StartBatchScrape,
StartCrawl, CancelJob, ResumeJob, Map) need the job runtime, which only a primary
has: a standby answers FAILED_PRECONDITION with reason NOT_PRIMARY and the primary's
address.

Paused jobs (``pagesift.shared.quarantine``): GetJob, ListJobs and WatchJob's state
events carry ``PauseInfo`` (reason, evidence, in-flight URLs) for a job in
``JOB_STATE_PAUSED``, read from the store like the rest (a standby shows it too).
CancelJob and ResumeJob are the job owner's, or the admin key's (``[admin]`` in the
accounts file; the server's guard lets that key through to these two calls only):
CancelJob ends a running or paused job, ResumeJob runs a paused one again; both
return the state after the call and are idempotent (a finished job is returned as
it is).

Callers are accounts (``pagesift.shared.accounts``): a missing or unknown API key
is UNAUTHENTICATED before anything else is looked at (the server's guard checks the
key before a handler runs, and each handler authenticates first too); a job belongs
to the account that started it, and to everyone else it does not exist (NOT_FOUND,
so ids are no oracle). Account limits are checked inside the registration's write
section (RESOURCE_EXHAUSTED naming the limit and when it resets).

WatchJob streams are bounded (``pagesift.shared.streams``): each account may hold
``max_concurrent_streams`` open and the node ``max_total_streams`` in all (beyond:
RESOURCE_EXHAUSTED naming the limit, like the other limits), and a stream reads the
job a small window at a time: the next documents are read from the store only once
gRPC has taken the previous ones, so a client that does not read holds the server
to one window, not the whole job. Windows are bounded in bytes (``watch_stream_bytes``)
and granted from the node's byte budget before they are read (``watch_total_bytes``,
``watch_account_bytes``): past it, streams wait, holding nothing; a stream that held
big documents is followed by ``malloc_trim`` when it ends, so the node's resident
memory comes back down.

GetJob pages by count and by size: a response holds at most ``limit`` documents and
at most ``max_response_bytes`` serialized bytes (documents plus status), ``next_skip``
following the last document it holds; a document larger than that comes alone. One
whose message would pass the server's send limit (``MAX_SEND_MESSAGE_BYTES``) is
refused with RESOURCE_EXHAUSTED naming its index (in GetJob and in a WatchJob
stream alike), never a transport error; the caller can skip past it.

Statuses: every one is sent through ``pagesift.shared.rpcerrors`` and carries its
``google.rpc`` details (an ``ErrorInfo`` reason, and a ``BadRequest``, ``QuotaFailure``
or ``RetryInfo`` where they apply; the reasons table is that module's). A bad field is
INVALID_ARGUMENT naming it; an unknown (or someone else's, or expired) job is
NOT_FOUND (JOB_NOT_FOUND); a page that cannot be scraped by ``Scrape`` maps its error
code to a status (``rpcerrors.page_status``; reason PAGE_FETCH_FAILED with the code)
and carries the code in the ``pagesift-error-code`` trailing metadata too.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ctypes
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import NoReturn, Protocol

import grpc
from google.protobuf.message import Message

from pagesift.shared import jobrecords as jr
from pagesift.shared import quota, rpcerrors, validate
from pagesift.shared.accounts import Account, Accounts, Unauthenticated
from pagesift.shared.config import ServerConfig
from pagesift.shared.errors import ErrorCode, PageError
from pagesift.shared.events import JobEvents
from pagesift.shared.identity import Fenced, NotWritable
from pagesift.shared.metrics import Metrics
from pagesift.shared.rpcerrors import Reason
from pagesift.shared.store import Store
from pagesift.shared.streams import WINDOW_DOCS, StreamBytes, StreamSlots, WatchBytes
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

    async def resume(self, job_id: str) -> jr.JobMeta | None: ...

    def visible(self, job_id: str) -> int | None: ...

    async def readable(self) -> None: ...

    async def scrape(
        self, url: str, options: jobs_pb2.ScrapeOptions, owner: str
    ) -> jobs_pb2.Document: ...

    async def map(self, request: jobs_pb2.MapRequest, owner: str) -> list[str]: ...


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
        """Where the writes go, for a standby's NOT_PRIMARY message (an address, or
        an address followed by words, or "(unknown)")."""

    def read_metadata(self) -> Sequence[tuple[str, str]]:
        """Trailing metadata for reads (a standby's applied offset and lag)."""


Context = grpc.aio.ServicerContext[object, object]

# Page errors whose status is INVALID_ARGUMENT name the field ``url`` in a BadRequest.
_URL_PAGE_ERRORS = frozenset({ErrorCode.BLOCKED_ADDRESS, ErrorCode.INVALID_URL})


async def _invalid(context: Context, e: validate.InvalidArgument) -> NoReturn:
    """INVALID_ARGUMENT naming the bad field(s) (reason INVALID_FIELD, BadRequest)."""
    await rpcerrors.invalid_argument(context, str(e), e.violations)


async def _no_job(context: Context, job_id: str, message: str) -> NoReturn:
    await rpcerrors.abort(
        context, grpc.StatusCode.NOT_FOUND, message, Reason.JOB_NOT_FOUND, {"id": job_id}
    )


async def _key_reused(context: Context, e: jr.IdempotencyKeyReused) -> NoReturn:
    """AIP-155: the key names a job of another request (INVALID_ARGUMENT naming it)."""
    message = (
        f"idempotency_key: already used for job {e.job_id} with a different request "
        "(AIP-155: a key identifies one request; use a fresh key for a new one)"
    )
    await rpcerrors.invalid_argument(
        context,
        message,
        [("idempotency_key", message)],
        Reason.IDEMPOTENCY_KEY_REUSED,
        {"field": "idempotency_key", "id": e.job_id},
    )


# paging (AIP-158) ----------------------------------------------------------------------

LIST_SCAN_FACTOR = 10  # ListJobs reads at most this many index members per wanted job
LIST_SCAN_MIN = 1_000  # ... and at least this many, before it returns a short page
_JOBS_TOKEN = b"jobs1"
_ERRORS_TOKEN = b"errors1"


def _page_size(size: int, config: ServerConfig) -> int:
    """AIP-158: 0 is the default, above the maximum is cut to it, negative is refused."""
    if size < 0:
        raise validate.InvalidArgument("page_size", f"{size} is negative")
    return min(size or config.default_page_size, config.max_page_size) or 1


def _token(*parts: bytes) -> str:
    return base64.urlsafe_b64encode(b"\x00".join(parts)).decode()


def _untoken(token: str, kind: bytes, n: int) -> list[bytes]:
    """The ``n`` parts after ``kind`` of a page token, or InvalidArgument naming it."""
    try:
        parts = base64.urlsafe_b64decode(token.encode("ascii")).split(b"\x00")
    except (ValueError, binascii.Error, UnicodeEncodeError):
        parts = []
    if len(parts) != n + 1 or parts[0] != kind:
        raise validate.InvalidArgument("page_token", "not a page token of this call")
    return parts[1:]


_MEMBER = re.compile(rb"\d{16} [0-9A-Za-z_-]{1,64}")
_STATE_OF_PB = {pb: name for name, pb in jr.STATE_TO_PB.items()}


def _list_filter(request: jobs_pb2.ListJobsRequest) -> tuple[frozenset[str] | None, bytes]:
    """The states ListJobs keeps (None: every one) and the filter's tag in its tokens."""
    wanted: set[str] | None = None
    for i, state in enumerate(request.states):
        name = _STATE_OF_PB.get(state)
        if name is None:
            raise validate.InvalidArgument(f"states[{i}]", f"not a job state: {state}")
        wanted = (wanted or set()) | {name}
    if request.active_only:
        wanted = {"scraping"} & wanted if wanted is not None else {"scraping"}
    tag = b"all" if wanted is None else ",".join(sorted(wanted)).encode()
    return (frozenset(wanted) if wanted is not None else None), tag


def _list_after(token: str, tag: bytes) -> bytes | None:
    if not token:
        return None
    got_tag, member = _untoken(token, _JOBS_TOKEN, 2)
    if got_tag != tag:
        raise validate.InvalidArgument(
            "page_token", "issued for another filter (active_only, states): start again"
        )
    if not _MEMBER.fullmatch(member):
        raise validate.InvalidArgument("page_token", "not a page token of this call")
    return member


def _errors_start(token: str, job_id: str) -> tuple[str, int]:
    if not token:
        return "errors", 0
    got_id, which, seq = _untoken(token, _ERRORS_TOKEN, 3)
    if got_id != job_id.encode():
        raise validate.InvalidArgument("page_token", "issued for another job")
    if which not in (b"errors", b"notes") or not seq.isdigit() or len(seq) > 19:
        raise validate.InvalidArgument("page_token", "not a page token of this call")
    return which.decode(), int(seq)


def _primary_address(hint: str) -> str:
    """The address in ``Node.primary_hint`` (its first word), or "" when it names none."""
    word = hint.split(" ", 1)[0] if hint else ""
    return "" if not word or word.startswith("(") or word == "the" else word


async def _page_failed(context: Context, e: PageError, url: str) -> NoReturn:
    """Scrape's status for a page error (``rpcerrors.page_status``): reason
    PAGE_FETCH_FAILED with the code (and HTTP status), plus RetryInfo when the site
    asked for a pause, BadRequest (field ``url``) when the URL itself is refused."""
    code = str(e.code)
    status = rpcerrors.page_status(code, e.status)
    details: list[Message] = []
    if e.retry_after is not None and status == grpc.StatusCode.UNAVAILABLE:
        details.append(rpcerrors.retry_info(e.retry_after))
    if status == grpc.StatusCode.INVALID_ARGUMENT or code in _URL_PAGE_ERRORS:
        details.append(rpcerrors.bad_request([("url", e.message)]))
    await rpcerrors.abort(
        context,
        status,
        f"page error {e.code}: {e.message}",
        Reason.PAGE_FETCH_FAILED,
        {"code": code, "http_status": e.status, "url": url[:1024]},
        details=details,
        trailing=(("pagesift-error-code", code),),
    )


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


def _stored_batch(request: jobs_pb2.StartBatchScrapeRequest, plan: validate.BatchPlan) -> bytes:
    """The batch request to store: as sent when every URL is valid, else the same
    request with only the valid URLs, built without copying the sent URLs first
    (protobuf merges concatenated encodings, repeated fields appended in order)."""
    if not plan.invalid:
        return request.SerializeToString(deterministic=True)
    rest = jobs_pb2.StartBatchScrapeRequest()
    for field, value in request.ListFields():
        if field.name == "urls":
            continue
        if hasattr(value, "extend"):  # a repeated field
            getattr(rest, field.name).extend(value)
        elif field.message_type is not None:
            getattr(rest, field.name).CopyFrom(value)
        else:
            setattr(rest, field.name, value)
    urls = jobs_pb2.StartBatchScrapeRequest(urls=plan.urls)
    return rest.SerializeToString(deterministic=True) + urls.SerializeToString()


def _window(store: Store, job_id: str, index: int, count: int, visible: int | None) -> list[bytes]:
    """Up to ``count`` stored documents from ``index`` on, as bytes (capped at ``visible``)."""
    if visible is not None:
        count = min(count, visible - index)
    return store.list_range(jr.JobKeys(job_id).pages, index, count) if count > 0 else []


def _watch_window(
    store: Store, job_id: str, index: int, visible: int | None, budget: int
) -> tuple[list[bytes], int]:
    """A watcher's next documents from ``index`` on, and their size as message fields:
    at most ``WINDOW_DOCS`` (capped at ``visible``) and at most ``budget`` bytes, read
    one at a time so that no more is ever held; at least one (a bigger one alone)."""
    count = WINDOW_DOCS if visible is None else min(WINDOW_DOCS, visible - index)
    key = jr.JobKeys(job_id).pages
    out: list[bytes] = []
    used = 0
    while len(out) < count:
        got = store.list_range(key, index + len(out), 1)
        if not got:
            break
        size = _field_bytes(len(got[0]))
        if out and used + size > budget:
            break  # read again by the next window
        out.append(got[0])
        used += size
        if used >= budget:
            break
    return out, used


def _field_bytes(size: int) -> int:
    """What a length-delimited field of ``size`` bytes (numbers below 16) adds to its message."""
    length = 1
    while size >= 1 << (7 * length):
        length += 1
    return 1 + length + size


def _sized_window(
    store: Store, job_id: str, index: int, count: int, visible: int | None, budget: int
) -> list[bytes]:
    """Stored documents from ``index`` on, as bytes: at most ``count`` (capped at
    ``visible``) and at most ``budget`` bytes as message fields, but at least one (a
    larger document comes alone). Read a few at a time, so a page of big documents
    holds about ``budget`` in memory, not ``count`` of them."""
    if visible is not None:
        count = min(count, visible - index)
    key = jr.JobKeys(job_id).pages
    out: list[bytes] = []
    used = 0
    chunk = min(WINDOW_DOCS, count)
    while len(out) < count:
        raws = store.list_range(key, index + len(out), min(chunk, count - len(out)))
        if not raws:
            break
        for raw in raws:
            size = _field_bytes(len(raw))
            if out and used + size > budget:
                return out
            out.append(raw)
            used += size
        average = max(1, used // len(out))
        chunk = max(1, min(4 * WINDOW_DOCS, (budget - used) // average + 1))
    return out


def _too_large(index: int, size: int, resume: str) -> str:
    return (
        f"document {index} is {size} bytes, over the {MAX_SEND_MESSAGE_BYTES}-byte "
        f"message limit; it cannot be sent ({resume}={index + 1} continues past it)"
    )


async def _refuse_too_large(context: Context, index: int, size: int, resume: str) -> NoReturn:
    await rpcerrors.abort(
        context,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        _too_large(index, size, resume),
        Reason.DOCUMENT_TOO_LARGE,
        {"index": index, "size": size, "max_bytes": MAX_SEND_MESSAGE_BYTES},
    )


MAP_BATCH_URLS = 1_000  # URLs in one MapResponse at most
MAP_BATCH_BYTES = 1024 * 1024  # ... and about this many bytes (a long URL comes alone)


def _url_batches(found: list[str]) -> list[list[str]]:
    """``found`` cut into MapResponse batches: in order, at most ``MAP_BATCH_URLS``
    URLs and about ``MAP_BATCH_BYTES`` each (at least one URL a batch)."""
    out: list[list[str]] = []
    batch: list[str] = []
    size = 0
    for url in found:
        cost = _field_bytes(len(url.encode()))
        if batch and (len(batch) >= MAP_BATCH_URLS or size + cost > MAP_BATCH_BYTES):
            out.append(batch)
            batch, size = [], 0
        batch.append(url)
        size += cost
    if batch:
        out.append(batch)
    return out


def _index_reader(store: Store, owner: str) -> Callable[[bytes | None, int], list[bytes]]:
    """``(after, count) -> members`` of the owner's jobs, newest first: the owner index,
    or (before the start-up migration built it) the same members from the jobs set."""
    if jr.has_owner_index(store):
        name = jr.owner_set(owner)
        return lambda after, count: store.set_range(name, after, count, reverse=True)
    members = sorted(
        (
            jr.owner_member(m.created_ms, m.id)
            for i in jr.all_job_ids(store)
            if (m := jr.load_meta(store, i)) is not None and m.owner == owner
        ),
        reverse=True,
    )

    def fallback(after: bytes | None, count: int) -> list[bytes]:
        rest = members if after is None else [m for m in members if m < after]
        return rest[:count]

    return fallback


class JobService(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, node: Node) -> None:
        self.node = node
        cfg = node.config
        self.streams = StreamSlots(cfg.max_concurrent_streams, cfg.max_total_streams, node.metrics)
        self.watch_bytes = WatchBytes(
            cfg.watch_stream_bytes, cfg.watch_total_bytes, node.metrics, cfg.watch_account_bytes
        )

    # helpers ----------------------------------------------------------------------
    async def _caller(self, context: Context) -> Account:
        try:
            metadata = [(k, v) for k, v in context.invocation_metadata() or ()]
            return self.node.accounts.authenticate(metadata)
        except Unauthenticated as e:
            await rpcerrors.abort(
                context, grpc.StatusCode.UNAUTHENTICATED, str(e), Reason.UNAUTHENTICATED
            )

    async def _runtime(self, context: Context) -> JobRuntime:
        runtime = self.node.runtime()
        if runtime is None:
            hint = self.node.primary_hint()
            await rpcerrors.abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this node is a standby; send writes to the primary at {hint}",
                Reason.NOT_PRIMARY,
                {"primary": _primary_address(hint), "hint": hint},
            )
        return runtime

    async def _not_writable(self, context: Context, err: NotWritable) -> NoReturn:
        """A write reached a node that stopped taking them after the call began
        (FENCED: it met a higher epoch; NOT_PRIMARY: its witness lease lapsed, or it is
        a standby now): nothing was written."""
        hint = self.node.primary_hint()
        await rpcerrors.abort(
            context,
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{err}; send writes to the primary at {hint}",
            Reason.FENCED if isinstance(err, Fenced) else Reason.NOT_PRIMARY,
            {"primary": _primary_address(hint), "hint": hint, "detail": str(err)},
        )

    async def _meta(self, job_id: str, context: Context) -> jr.JobMeta:
        return await self._owned(await self._caller(context), job_id, context)

    async def _control(self, job_id: str, context: Context) -> JobRuntime:
        """CancelJob and ResumeJob: the caller (an account, or the admin key), then the
        runtime (a standby answers NOT_PRIMARY before it looks the job up: its replica
        may lag, and the client must go on to the primary), then the job, for its
        owner or the admin key (NOT_FOUND when it is gone or someone else's)."""
        metadata = [(k, v) for k, v in context.invocation_metadata() or ()]
        admin = self.node.accounts.carries_admin_key(metadata)
        caller = None if admin else await self._caller(context)
        runtime = await self._runtime(context)
        if caller is not None:
            await self._owned(caller, job_id, context)
            return runtime
        try:
            validate.job_id(job_id)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        meta = jr.load_meta(self.node.store(), job_id)
        if meta is None or (meta.terminal and meta.expires_ms <= jr.now_ms()):
            await _no_job(context, job_id, f"id: no job {job_id}")
        return runtime

    async def _owned(self, caller: Account, job_id: str, context: Context) -> jr.JobMeta:
        """The caller's job ``job_id``; NOT_FOUND when it is anyone else's or gone."""
        try:
            validate.job_id(job_id)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        meta = jr.load_meta(self.node.store(), job_id)
        if (
            meta is None
            or meta.owner != caller.name
            or (meta.terminal and meta.expires_ms <= jr.now_ms())
        ):
            await _no_job(context, job_id, f"id: no job {job_id}")
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

    async def _request_control(
        self, context: Context, caller: Account, options: jobs_pb2.ScrapeOptions
    ) -> None:
        """INVALID_ARGUMENT or PERMISSION_DENIED, naming the field, for request-control
        options (headers, cookies, proxy, robots...) the caller may not send."""
        try:
            await validate.request_control(options, caller, self.node.config)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        except validate.PermissionDenied as e:
            await rpcerrors.abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                str(e),
                Reason.PERMISSION_DENIED_FIELD,
                {"field": e.field, "account": caller.name},
            )

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

    async def _refuse_limit(
        self, context: Context, e: quota.LimitExceeded, caller: Account
    ) -> NoReturn:
        """RESOURCE_EXHAUSTED, reason QUOTA_EXCEEDED, with a QuotaFailure and (when the
        limit resets at a known time) a RetryInfo. The ``pagesift-limit`` trailing
        metadata is still sent alongside, for one release."""
        self.node.metrics.limit_hit(e.limit_name)
        subject = "node" if e.limit_name == "max_total_streams" else f"account:{caller.name}"
        details: list[Message] = [rpcerrors.quota_failure(subject, e.message, e.limit_name)]
        if e.resets_at is not None:
            details.append(rpcerrors.retry_info(e.resets_at - time.time()))
        await rpcerrors.abort(
            context,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            e.message,
            Reason.QUOTA_EXCEEDED,
            {
                "limit": e.limit_name,
                "resets_at": quota.rfc3339(e.resets_at) if e.resets_at is not None else None,
            },
            details=details,
            trailing=e.trailing_metadata(),
        )

    async def _webhook(
        self, context: Context, caller: Account, hook: jobs_pb2.Webhook
    ) -> jobs_pb2.Webhook | None:
        if not hook.url:
            if (
                hook.events
                or hook.event_types
                or hook.headers
                or hook.metadata
                or hook.include_document
            ):
                await _invalid(context, validate.InvalidArgument("webhook.url", "missing"))
            return None
        try:
            await validate.url(hook.url, "webhook.url", self.node.config)
            validate.webhook_payload(hook)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        try:
            jr.webhook_events(hook.events, "webhook.events")
        except ValueError as e:
            field = str(e).split(":", 1)[0] if str(e).startswith("webhook.events") else ""
            await rpcerrors.invalid_argument(context, str(e), [(field or "webhook.events", str(e))])
        if hook.event_types:
            names: list[str] = []
            for i, event in enumerate(hook.event_types):
                name = jr.event_name(event)
                if not name:
                    await _invalid(
                        context,
                        validate.InvalidArgument(
                            f"webhook.event_types[{i}]", f"not a webhook event: {event}"
                        ),
                    )
                names.append(name)
            merged = jobs_pb2.Webhook()
            merged.CopyFrom(hook)
            merged.ClearField("event_types")
            merged.events[:] = list(jr.webhook_events([*hook.events, *names]))
            hook = merged
        if self.node.accounts.webhook_secret(caller.name) is None:
            await rpcerrors.abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"webhook: account {caller.name!r} has no webhook_secret to sign with",
                Reason.WEBHOOK_SECRET_MISSING,
                {"account": caller.name},
            )
        return hook

    async def Scrape(
        self, request: jobs_pb2.ScrapeRequest, context: Context
    ) -> jobs_pb2.ScrapeResponse:
        caller = await self._caller(context)
        runtime = await self._runtime(context)
        try:
            await validate.url(request.url, "url", self.node.config)
            validate.options(request.options, self.node.config)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        await self._request_control(context, caller, request.options)
        try:
            self._limits(caller, "scrape")()
        except quota.LimitExceeded as e:
            await self._refuse_limit(context, e, caller)
        try:
            doc = await runtime.scrape(request.url, request.options, caller.name)
        except PageError as e:
            await _page_failed(context, e, request.url)
        if caller.pages_per_day is not None:
            try:
                self.node.store().write(lambda g: quota.charge(g, caller.name, 1, time.time()))
            except NotWritable as e:
                await self._not_writable(context, e)
        return jobs_pb2.ScrapeResponse(document=doc)

    async def StartBatchScrape(
        self, request: jobs_pb2.StartBatchScrapeRequest, context: Context
    ) -> jobs_pb2.StartBatchScrapeResponse:
        caller = await self._caller(context)
        runtime = await self._runtime(context)
        try:
            plan = await validate.batch(request, self.node.config)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        await self._request_control(context, caller, request.options)
        hook = await self._webhook(context, caller, request.webhook)
        total = len(plan.urls)
        stored = _stored_batch(request, plan)  # serialized once; no copy of the request
        del plan.urls[:]  # the URL strings are in ``stored`` now
        check = self._limits(caller, "batch", batch_urls=total)
        try:
            reg = await runtime.register(
                "batch",
                caller.name,
                stored,
                request.idempotency_key,
                total=total,
                webhook=hook,
                check=check,
            )
        except quota.LimitExceeded as e:
            await self._refuse_limit(context, e, caller)
        except NotWritable as e:
            await self._not_writable(context, e)
        except jr.IdempotencyKeyReused as e:
            await _key_reused(context, e)
        if len(stored) >= TRIM_AFTER_BYTES:
            _trim_heap_soon()
        return jobs_pb2.StartBatchScrapeResponse(id=reg.id, invalid_urls=plan.invalid)

    async def StartCrawl(
        self, request: jobs_pb2.StartCrawlRequest, context: Context
    ) -> jobs_pb2.StartCrawlResponse:
        caller = await self._caller(context)
        runtime = await self._runtime(context)
        try:
            await validate.crawl(request, self.node.config)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        await self._request_control(context, caller, request.options)
        hook = await self._webhook(context, caller, request.webhook)
        limit = quota.crawl_limit_for(caller, request.limit, self.node.config.default_crawl_limit)
        check = self._limits(caller, "crawl", limit=limit)
        try:
            reg = await runtime.register(
                "crawl",
                caller.name,
                request.SerializeToString(deterministic=True),  # AIP-155 hashes it
                request.idempotency_key,
                limit=limit,
                webhook=hook,
                check=check,
            )
        except quota.LimitExceeded as e:
            await self._refuse_limit(context, e, caller)
        except NotWritable as e:
            await self._not_writable(context, e)
        except jr.IdempotencyKeyReused as e:
            await _key_reused(context, e)
        return jobs_pb2.StartCrawlResponse(id=reg.id)

    async def CancelJob(
        self, request: jobs_pb2.CancelJobRequest, context: Context
    ) -> jobs_pb2.CancelJobResponse:
        runtime = await self._control(request.id, context)
        try:
            meta = await runtime.cancel(request.id)
        except NotWritable as e:
            await self._not_writable(context, e)
        if meta is None:
            await _no_job(context, request.id, f"id: no job {request.id}")
        return jobs_pb2.CancelJobResponse(state=jr.STATE_TO_PB[meta.state])

    async def ResumeJob(
        self, request: jobs_pb2.ResumeJobRequest, context: Context
    ) -> jobs_pb2.ResumeJobResponse:
        runtime = await self._control(request.id, context)
        try:
            meta = await runtime.resume(request.id)
        except NotWritable as e:
            await self._not_writable(context, e)
        if meta is None:
            await _no_job(context, request.id, f"id: no job {request.id}")
        return jobs_pb2.ResumeJobResponse(state=jr.STATE_TO_PB[meta.state])

    # reads ----------------------------------------------------------------------------
    async def GetJob(
        self,
        request: jobs_pb2.GetJobRequest,
        context: Context,
    ) -> jobs_pb2.GetJobResponse:
        caller = await self._caller(context)
        try:
            limit = validate.page(request.skip, request.limit, self.node.config)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        meta = await self._owned(caller, request.id, context)
        await self._readable()
        store = self.node.store()
        visible = self._visible(meta.id)
        p = jr.progress(store, meta, visible)
        if request.skip > p.completed and meta.terminal:
            message = f"skip: {request.skip} is beyond the last document ({p.completed})"
            await rpcerrors.abort(
                context,
                grpc.StatusCode.OUT_OF_RANGE,
                message,
                Reason.SKIP_OUT_OF_RANGE,
                {"skip": request.skip, "completed": p.completed},
                details=[rpcerrors.bad_request([("skip", message)])],
            )
        resp = jobs_pb2.GetJobResponse(
            id=meta.id,
            kind=jr.KIND_TO_PB[meta.kind],
            state=jr.STATE_TO_PB[meta.state],
            total=p.total,
            completed=p.completed,
            failed=p.failed,
            created_at=jr.timestamp(meta.created_ms),
            expires_at=jr.timestamp(meta.expires_ms),
            note=meta.note,
            next_skip=min(request.skip + limit, _MAX_INT32),  # sized at its largest
            removed_urls=jr.read_removed(store, meta.id) if meta.terminal else (),
            paused=jr.pause_info(store, meta),
        )
        base = resp.ByteSize()
        resp.ClearField("next_skip")
        raws = (
            []
            if request.status_only
            else _sized_window(
                store, meta.id, request.skip, limit, visible,
                self.node.config.max_response_bytes - base,
            )
        )  # fmt: skip
        if len(raws) == 1 and base + _field_bytes(len(raws[0])) > MAX_SEND_MESSAGE_BYTES:
            await _refuse_too_large(context, request.skip, len(raws[0]), "skip")
        resp.documents.extend(jobs_pb2.Document.FromString(raw) for raw in raws)
        end = request.skip + len(raws)
        del raws
        if not request.status_only and (end < p.completed or not meta.terminal):
            resp.next_skip = end
        self._read_md(context)
        return resp

    async def WatchJob(
        self,
        request: jobs_pb2.WatchJobRequest,
        context: Context,
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        caller = await self._caller(context)
        if request.from_index < 0:
            await _invalid(context, validate.InvalidArgument("from_index", "negative"))
        meta = await self._owned(caller, request.id, context)
        try:
            slot = self.streams.acquire(caller)
        except quota.LimitExceeded as e:
            await self._refuse_limit(context, e, caller)
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
                fresh = jr.load_meta(store, meta.id)
                if fresh is None:
                    await _no_job(context, meta.id, f"id: job {meta.id} expired")
                visible = self._visible(meta.id)
                p = jr.progress(store, fresh, visible)
                if index < p.completed:
                    raws = await self._watch_read(inflight, meta.id, index, visible)
                    peak = max(peak, inflight.held)
                    held = len(raws)
                    metrics.watch_documents_read.inc(held)
                    metrics.watch_documents_buffered.inc(held)
                    raws.reverse()  # pop from the end: each raw document is dropped as sent
                    while raws:
                        raw = raws.pop()
                        size = _field_bytes(len(raw))
                        if size + 16 > MAX_SEND_MESSAGE_BYTES:  # + index
                            await _refuse_too_large(context, index, len(raw), "from_index")
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
                state = (jr.STATE_TO_PB[fresh.state], p.total, p.completed, p.failed)
                if state != last:
                    last = state
                    yield jobs_pb2.WatchJobResponse(
                        state=jobs_pb2.StateChange(
                            state=state[0],
                            total=p.total,
                            completed=p.completed,
                            failed=p.failed,
                            paused=jr.pause_info(store, fresh),
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
        """A watcher's next window (``_watch_window``), its bytes granted by the node's
        budget first: the stream waits (holding nothing) while the budget is spent. A
        document bigger than the stream's window is put back and read again once the
        budget has granted its whole size, so no stream holds bytes it was not granted."""
        budget = self.watch_bytes.per_stream
        await inflight.reserve(budget)
        raws, size = _watch_window(self.node.store(), job_id, index, visible, budget)
        if size <= budget:
            inflight.give(budget - size)
            return raws
        del raws  # one document larger than a window: drop it, wait for its whole size
        inflight.give(budget)
        await inflight.reserve(size)
        raws = _window(self.node.store(), job_id, index, 1, visible)
        got = sum(_field_bytes(len(r)) for r in raws)
        inflight.give(size - got)  # stored documents do not change: 0 unless it expired
        return raws

    async def GetJobErrors(
        self,
        request: jobs_pb2.GetJobErrorsRequest,
        context: Context,
    ) -> jobs_pb2.GetJobErrorsResponse:
        caller = await self._caller(context)
        try:
            size = _page_size(request.page_size, self.node.config)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        meta = await self._owned(caller, request.id, context)
        try:
            start = _errors_start(request.page_token, meta.id)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        await self._readable()
        page = jr.read_errors_page(self.node.store(), meta.id, start, size)
        self._read_md(context)
        nxt = page.next
        return jobs_pb2.GetJobErrorsResponse(
            errors=page.errors,
            robots_blocked=page.robots_blocked,
            next_page_token=(
                _token(_ERRORS_TOKEN, meta.id.encode(), nxt[0].encode(), str(nxt[1]).encode())
                if nxt is not None
                else ""
            ),
        )

    async def ListJobs(
        self,
        request: jobs_pb2.ListJobsRequest,
        context: Context,
    ) -> jobs_pb2.ListJobsResponse:
        """One page of the caller's jobs, newest first (AIP-158), read through the
        owner index (``owner/{account}/jobs``): never another account's job. A store
        whose index is not built yet (a standby of a primary that has not migrated)
        pages the same members computed from the jobs set."""
        owner = (await self._caller(context)).name
        try:
            size = _page_size(request.page_size, self.node.config)
            wanted, tag = _list_filter(request)
            after = _list_after(request.page_token, tag)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        await self._readable()
        store = self.node.store()
        now = jr.now_ms()
        fetch = _index_reader(store, owner)

        def keep(member: bytes) -> jr.JobMeta | None:
            m = jr.load_meta(store, jr.member_job(member))
            if m is None or m.owner != owner or (m.terminal and m.expires_ms <= now):
                return None
            return m if wanted is None or m.state in wanted else None

        metas: list[jr.JobMeta] = []
        last = after
        budget = max(LIST_SCAN_MIN, LIST_SCAN_FACTOR * size)
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
            jobs=[jr.summary(store, m, self._visible(m.id)) for m in metas],
            next_page_token=_token(_JOBS_TOKEN, tag, last) if more and last else "",
        )

    # Map ------------------------------------------------------------------------------
    async def Map(
        self,
        request: jobs_pb2.MapRequest,
        context: Context,
    ) -> AsyncIterator[jobs_pb2.MapResponse]:
        """A site's URLs (``pagesift.primary.mapper``), streamed in batches once all
        are found and ranked; nothing is stored or charged. Primary only."""
        caller = await self._caller(context)
        runtime = await self._runtime(context)
        try:
            await validate.map_request(request, self.node.config)
        except validate.InvalidArgument as e:
            await _invalid(context, e)
        try:
            found = await runtime.map(request, caller.name)
        except PermissionError as e:  # request control the account may no longer use
            await rpcerrors.abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                str(e),
                Reason.PERMISSION_DENIED_FIELD,
                {"field": str(e).split(":", 1)[0], "account": caller.name},
            )
        for batch in _url_batches(found):
            yield jobs_pb2.MapResponse(urls=batch)
