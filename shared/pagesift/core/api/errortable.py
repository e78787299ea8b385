"""The error table: which status each refusal of a pagesift server is, in one place.

What it owns: ``TABLE``, one ``Row`` per ``ErrorInfo`` reason (``rpcerrors.Reason``),
in the order the API docs list them. A row names its status code(s), the metadata
keys and when it happens (docs/api.md's reason table is generated from these:
``reason_table_markdown``), the domain exception types it maps and how one becomes a
``Refusal`` (message, ErrorInfo metadata, extra details, trailing metadata), the way
etcd's ``v3rpc/util.go`` keeps ``toGRPCErrorMap``. ``answers_errors`` applies it
once per handler (JobService, AdminService, the replication stream), so handlers
raise and read straight through; ``refuse`` applies it anywhere else (the
interceptors: the request guard, malformed requests, storage).

Invariants (``tests/test_error_table.py``):
- every ``Reason`` has exactly one row with at least one exception type, and an
  exception type maps to one row (the most specific class wins: ``Fenced`` is
  FENCED, any other ``NotWritable`` NOT_PRIMARY);
- a row's exceptions become its reason and its code (PAGE_FETCH_FAILED: the page
  error code's, ``rpcerrors.page_status``; a guard's refusal: its rule's), and every
  metadata key a refusal sends is named in the row's documented keys;
- a refusal's message is the exception's: it names no filesystem path or key, but
  for BACKUP_FAILED (the node's own error, told to the admin who asked).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, TypeVar, cast

import grpc
from google.protobuf.message import Message

from pagesift.core.api import adminerrors, rpcerrors
from pagesift.core.api.rpcerrors import Reason
from pagesift.core.cluster.ownership import HostOwnedElsewhere
from pagesift.core.jobs import quota
from pagesift.core.jobs.accounts import Unauthenticated
from pagesift.core.jobs.clusterlimits import ClusterUnavailable
from pagesift.core.jobs.modelrequests import ModelUnanswered
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.jobs.records import IdempotencyKeyReused, JobNotAppendable
from pagesift.core.jobs.renderoptions import RenderingUnavailable
from pagesift.core.jobs.specs import WebhookSecretMissing
from pagesift.core.jobs.validate import BLOCKED_ADDRESS, InvalidArgument, PermissionDenied
from pagesift.core.replication.backlog import BacklogLost
from pagesift.core.replication.identity import Fenced, NotWritable
from pagesift.core.store.errors import StorageUnavailable

C = grpc.StatusCode

# ------------------------------------------------------------------ domain exceptions


class JobNotFound(Exception):
    """No such job for this caller: unknown, someone else's, or expired."""

    def __init__(self, job_id: str, message: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class SkipOutOfRange(Exception):
    """GetJob's ``skip`` is past the last document of a finished job."""

    def __init__(self, skip: int, completed: int) -> None:
        super().__init__(f"skip: {skip} is beyond the last document ({completed})")
        self.skip = skip
        self.completed = completed


class DocumentTooLarge(Exception):
    """Document ``index`` (``size`` bytes) cannot be sent under ``max_bytes``; the
    message says which request field (``resume``) continues past it."""

    def __init__(self, index: int, size: int, max_bytes: int, resume: str) -> None:
        super().__init__(
            f"document {index} is {size} bytes, over the {max_bytes}-byte "
            f"message limit; it cannot be sent ({resume}={index + 1} continues past it)"
        )
        self.index = index
        self.size = size
        self.max_bytes = max_bytes


class StandbyNode(Exception):
    """A write reached a standby (it has no job runtime); nothing was done."""


class PageFailed(Exception):
    """Scrape could not scrape ``url``: the engine's ``PageError``."""

    def __init__(self, error: PageError, url: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.url = url


# the interceptors (before any handler runs)


class CallNotAllowed(Exception):
    """A guard refused the call to ``method`` before its handler ran, with ``code``
    (the guard rule's); a subclass per reason."""

    def __init__(self, method: str, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.method = method
        self.code = code


class KeyRequired(CallNotAllowed):
    """The call needs a valid API key (UNAUTHENTICATED)."""


class AdminKeyRequired(CallNotAllowed):
    """An AdminService call without the admin key."""


class ReplicationNotAllowed(CallNotAllowed):
    """The replication stream without the pair's token, or where mTLS serves it."""


class MalformedRequest(Exception):
    """The request bytes are not a ``message`` (the method's protobuf message name)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"request: not a valid {message}")
        self.message = message


# AdminService and the replication stream (``adminerrors``; imported from here)
BackupFailed = adminerrors.BackupFailed
BackupInProgress = adminerrors.BackupInProgress
CannotPromote = adminerrors.CannotPromote
DigestOffsetPassed = adminerrors.DigestOffsetPassed
HelloExpected = adminerrors.HelloExpected
NoLongerPrimary = adminerrors.NoLongerPrimary
OffsetNotReached = adminerrors.OffsetNotReached
ReplicationRefused = adminerrors.ReplicationRefused
SteppedDownForPeer = adminerrors.SteppedDownForPeer


# ------------------------------------------------------------------ the table


@dataclass(frozen=True)
class CallFacts:
    """What a refusal may name beyond its exception: the authenticated caller (empty
    before authentication), where writes go (``Node.primary_hint``), and the time."""

    account: str = ""
    primary_hint: str = "(unknown)"
    now: float = 0.0


@dataclass(frozen=True)
class Refusal:
    """An exception as the status it becomes (``code`` None: the row's)."""

    message: str
    metadata: Mapping[str, object] = field(default_factory=dict)
    details: Sequence[Message] = ()
    trailing: Sequence[tuple[str, str]] = ()
    code: grpc.StatusCode | None = None


Build = Callable[[Any, CallFacts], Refusal]


@dataclass(frozen=True)
class Row:
    """One reason: its codes, documented metadata keys and when (docs table cells, in
    markdown), and the exceptions that become it (``build``: how)."""

    reason: Reason
    codes: tuple[grpc.StatusCode, ...]
    metadata: str
    when: str
    raised_by: tuple[type[Exception], ...] = ()
    build: Build | None = None
    status: str = ""  # the docs' status cell when it is not the codes


#: ``Node.primary_hint`` of a primary that takes no write now (witness mode: its lease
#: lapsed and no failsafe grant covers it): it names no other node, nor itself.
NO_PRIMARY_NOW = "(none now)"


def primary_address(hint: str) -> str:
    """The address in ``Node.primary_hint`` (its first word), or "" when it names none."""
    word = hint.split(" ", 1)[0] if hint else ""
    return "" if not word or word.startswith("(") or word == "the" else word


def _invalid(e: InvalidArgument, _: CallFacts) -> Refusal:
    md = {"field": e.violations[0][0]}
    return Refusal(str(e), md, [rpcerrors.bad_request(e.violations, e.causes)])


def _key_reused(e: IdempotencyKeyReused, _: CallFacts) -> Refusal:
    message = (
        f"idempotency_key: already used for job {e.job_id} with a different request "
        "(AIP-155: a key identifies one request; use a fresh key for a new one)"
    )
    md = {"field": "idempotency_key", "id": e.job_id}
    return Refusal(message, md, [rpcerrors.bad_request([("idempotency_key", message)])])


def _unauthenticated(e: Unauthenticated | KeyRequired, facts: CallFacts) -> Refusal:
    return _not_allowed(e, facts) if isinstance(e, KeyRequired) else Refusal(str(e))


def _not_allowed(e: CallNotAllowed, _: CallFacts) -> Refusal:
    return Refusal(str(e), {"method": e.method}, code=e.code)


def _malformed(e: MalformedRequest, _: CallFacts) -> Refusal:
    bad = rpcerrors.bad_request([("request", f"not a valid {e.message}")])
    return Refusal(str(e), {"message": e.message}, [bad])


def _denied(e: PermissionDenied, facts: CallFacts) -> Refusal:
    return Refusal(str(e), {"field": e.field, "account": facts.account})


def _no_job(e: JobNotFound, _: CallFacts) -> Refusal:
    return Refusal(str(e), {"id": e.job_id})


def _skip(e: SkipOutOfRange, _: CallFacts) -> Refusal:
    md = {"skip": e.skip, "completed": e.completed}
    return Refusal(str(e), md, [rpcerrors.bad_request([("skip", str(e))])])


def _standby(e: StandbyNode, facts: CallFacts) -> Refusal:
    hint = facts.primary_hint
    if hint == NO_PRIMARY_NOW:
        return Refusal(
            "this node is the primary but takes no write now: its witness lease lapsed and "
            "no standby's failsafe grant covers it; retry once the lease is renewed or the "
            "standby takes over (reads are served)",
            {"primary": "", "hint": hint},
        )
    return Refusal(
        f"this node is a standby; send writes to the primary at {hint}",
        {"primary": primary_address(hint), "hint": hint},
    )


def _not_writable(e: NotWritable, facts: CallFacts) -> Refusal:
    """A write reached a node that stopped taking them after the call began (FENCED:
    it met a higher epoch; NOT_PRIMARY: its witness lease lapsed, or it is a standby
    now): nothing was written."""
    hint = facts.primary_hint
    where = (
        "no node takes writes now: retry once the lease is renewed or the standby takes over"
        if hint == NO_PRIMARY_NOW
        else f"send writes to the primary at {hint}"
    )
    return Refusal(
        f"{e}; {where}",
        {"primary": primary_address(hint), "hint": hint, "detail": str(e)},
    )


def _webhook_secret(e: WebhookSecretMissing, _: CallFacts) -> Refusal:
    return Refusal(str(e), {"account": e.account})


def _limit(e: quota.LimitExceeded, facts: CallFacts) -> Refusal:
    """A QuotaFailure, and a RetryInfo when the limit resets at a known time; the
    ``pagesift-limit`` trailing metadata is sent alongside (``LimitExceeded``)."""
    subject = "node" if e.limit_name == "max_total_streams" else f"account:{facts.account}"
    details: list[Message] = [rpcerrors.quota_failure(subject, e.message, e.limit_name)]
    resets = None
    if e.resets_at is not None:
        details.append(rpcerrors.retry_info(e.resets_at - facts.now))
        resets = quota.rfc3339(e.resets_at)
    md = {"limit": e.limit_name, "resets_at": resets}
    return Refusal(e.message, md, details, e.trailing_metadata())


def _too_large(e: DocumentTooLarge, _: CallFacts) -> Refusal:
    return Refusal(str(e), {"index": e.index, "size": e.size, "max_bytes": e.max_bytes})


# Page errors whose status is INVALID_ARGUMENT name the field ``url`` in a BadRequest.
_URL_PAGE_ERRORS = frozenset({ErrorCode.BLOCKED_ADDRESS, ErrorCode.INVALID_URL})


def _page_failed(e: PageFailed, _: CallFacts) -> Refusal:
    """The page error code's status (``rpcerrors.page_status``), plus RetryInfo when
    the site asked for a pause, BadRequest (field ``url``) when the URL is refused;
    the code travels as ``pagesift-error-code`` trailing metadata too."""
    err = e.error
    code = str(err.code)
    status = rpcerrors.page_status(code, err.status)
    details: list[Message] = []
    if err.retry_after is not None and status == C.UNAVAILABLE:
        details.append(rpcerrors.retry_info(err.retry_after))
    if status == C.INVALID_ARGUMENT or code in _URL_PAGE_ERRORS:
        blocked = BLOCKED_ADDRESS if code == ErrorCode.BLOCKED_ADDRESS else ""
        details.append(rpcerrors.bad_request([("url", err.message)], [blocked]))
    return Refusal(
        f"page error {err.code}: {err.message}",
        {"code": code, "http_status": err.status, "url": e.url[:1024]},
        details,
        (("pagesift-error-code", code),),
        code=status,
    )


def _storage(e: StorageUnavailable, _: CallFacts) -> Refusal:
    """The store refuses writes for ``cause`` (``no_space``, ``io_error``); the
    message names no path."""
    return Refusal(
        str(e), {"cause": e.reason}, [rpcerrors.retry_info(rpcerrors.STORAGE_RETRY_SECONDS)]
    )


def _message(e: Exception, _: CallFacts) -> Refusal:
    """The exception's message, nothing else (the reasons whose rows name no keys)."""
    return Refusal(str(e))


def _offset_passed(e: DigestOffsetPassed, _: CallFacts) -> Refusal:
    return Refusal(str(e), {"offset": e.offset})


def _offset_not_reached(e: OffsetNotReached, _: CallFacts) -> Refusal:
    return Refusal(str(e), {"offset": e.offset, "at": e.at})


def _stepped_down(e: SteppedDownForPeer, _: CallFacts) -> Refusal:
    return Refusal(str(e), {"epoch": e.epoch})


def _too_slow(e: BacklogLost, _: CallFacts) -> Refusal:
    return Refusal(f"standby too slow: {e}")


def _row(
    reason: Reason,
    codes: grpc.StatusCode | tuple[grpc.StatusCode, ...],
    metadata: str,
    when: str,
    raised_by: tuple[type[Exception], ...] = (),
    build: Build | None = None,
    status: str = "",
) -> Row:
    codes = codes if isinstance(codes, tuple) else (codes,)
    return Row(reason, codes, metadata, when, raised_by, build, status)


R = Reason
TABLE: tuple[Row, ...] = (
    _row(R.INVALID_FIELD, C.INVALID_ARGUMENT,
         "`field` (+ `BadRequest`; a URL the address guard refuses: violation reason "
         "`BLOCKED_ADDRESS`)",
         "a request field cannot be accepted; each bad field (each bad URL of a batch) "
         "is a violation, the first one leads the message",
         (InvalidArgument,), _invalid),
    _row(R.MALFORMED_REQUEST, C.INVALID_ARGUMENT,
         "`message` (+ `BadRequest`, field `request`)",
         "the request bytes are not the method's protobuf message",
         (MalformedRequest,), _malformed),
    _row(R.IDEMPOTENCY_KEY_REUSED, C.INVALID_ARGUMENT,
         "`field` (= `idempotency_key`), `id` (the job the key created) "
         "(+ `BadRequest`, field `idempotency_key`)",
         "StartBatchScrape/StartCrawl: the key was already used by this account with a "
         "different request (AIP-155)",
         (IdempotencyKeyReused,), _key_reused),
    _row(R.UNAUTHENTICATED, C.UNAUTHENTICATED, "`method` (from the guard)",
         "a JobService call without a valid API key",
         (Unauthenticated, KeyRequired), _unauthenticated),
    _row(R.ADMIN_KEY_REQUIRED, C.PERMISSION_DENIED, "`method`",
         "an AdminService call (Role, Digest, Promote, Backup) without the admin key",
         (AdminKeyRequired,), _not_allowed),
    _row(R.REPLICATION_NOT_ALLOWED, (C.UNAUTHENTICATED, C.PERMISSION_DENIED), "`method`",
         "the replication stream without the pair's token, or on a port where mTLS "
         "serves it",
         (ReplicationNotAllowed,), _not_allowed),
    _row(R.PERMISSION_DENIED_FIELD, C.PERMISSION_DENIED, "`field`, `account`",
         "the account may not use that option (`options.ignore_robots_txt`, "
         "`options.proxy_url`, `options.actions[N].execute_javascript`)",
         (PermissionDenied,), _denied),
    _row(R.JOB_NOT_FOUND, C.NOT_FOUND, "`id`",
         "no such job, someone else's, or expired (also mid-WatchJob)",
         (JobNotFound,), _no_job),
    _row(R.JOB_NOT_APPENDABLE, C.FAILED_PRECONDITION, "`id`, `kind`, `state`",
         "AppendBatchScrape to a crawl, or to a batch scrape that ended failed or cancelled",
         (JobNotAppendable,), lambda e, _: Refusal(str(e), {"id": e.job_id, "kind": e.kind,
                                                            "state": e.state})),
    _row(R.SKIP_OUT_OF_RANGE, C.OUT_OF_RANGE,
         "`skip`, `completed` (+ `BadRequest`, field `skip`)",
         "GetJob `skip` past the last document of a finished job",
         (SkipOutOfRange,), _skip),
    _row(R.NOT_PRIMARY, C.FAILED_PRECONDITION,
         "`primary` (address; empty when unknown), `hint` (and `detail` once a write "
         "began)",
         "a write sent to a standby, or to a node whose witness lease lapsed; nothing was "
         "done: send it to `primary`",
         (StandbyNode, NotWritable), lambda e, f: (
             _standby(e, f) if isinstance(e, StandbyNode) else _not_writable(e, f)
         )),
    _row(R.FENCED, C.FAILED_PRECONDITION, "`primary`, `hint`, `detail`",
         "a write reached a primary deposed by a higher epoch; nothing was written: send "
         "it to `primary`",
         (Fenced,), _not_writable),
    _row(R.WEBHOOK_SECRET_MISSING, C.FAILED_PRECONDITION, "`account`",
         "a job asks for webhooks, but the account has no `webhook_secret`",
         (WebhookSecretMissing,), _webhook_secret),
    _row(R.RENDERING_UNAVAILABLE, C.FAILED_PRECONDITION, "`field`",
         "the request needs a browser (`options.engine` BROWSER, a wait, an action, a "
         "screenshot, emulation) and this node cannot render: send it to one that can",
         (RenderingUnavailable,), lambda e, _: Refusal(str(e), {"field": e.field})),
    _row(R.MODEL_UNANSWERED, C.UNAVAILABLE, "`code`",
         "a crawl's `prompt` or PreviewCrawlParams got no usable answer from the model "
         "endpoint (`code`: `model_unavailable`, `invalid_answer`); nothing started: retry, "
         "or give the crawl options yourself",
         (ModelUnanswered,), lambda e, _: Refusal(e.message, {"code": e.code})),
    _row(R.QUOTA_EXCEEDED, C.RESOURCE_EXHAUSTED,
         "`limit`, `resets_at` (RFC 3339, when known) (+ `QuotaFailure` subject "
         "`account:NAME` or `node`, `quota_id` = the limit; `RetryInfo` when `resets_at` "
         "is known)",
         "an account or node limit: `max_batch_urls`, `max_crawl_limit`, "
         "`max_concurrent_jobs`, `pages_per_day`, `model_tokens_per_day`, "
         "`max_concurrent_streams`, `max_total_streams`",
         (quota.LimitExceeded,), _limit),
    _row(R.DOCUMENT_TOO_LARGE, C.RESOURCE_EXHAUSTED, "`index`, `size`, `max_bytes`",
         "one stored document is larger than the 64 MiB message limit (skip past it)",
         (DocumentTooLarge,), _too_large),
    _row(R.PAGE_FETCH_FAILED, tuple(dict.fromkeys(rpcerrors.PAGE_STATUS.values())),
         "`code`, `http_status` (when there is one), `url` (+ `RetryInfo` when the site "
         "sent Retry-After; `BadRequest` field `url` for `INVALID_ARGUMENT`)",
         "Scrape: the page could not be scraped",
         (PageFailed,), _page_failed, status="by page error code (below)"),
    _row(R.CANNOT_PROMOTE, C.FAILED_PRECONDITION, "",
         "Promote on a node that has no promoter",
         (CannotPromote,), _message),
    _row(R.OFFSET_PASSED, C.FAILED_PRECONDITION, "`offset`",
         "Digest at an offset the node is already past",
         (DigestOffsetPassed,), _offset_passed),
    _row(R.OFFSET_NOT_REACHED, C.DEADLINE_EXCEEDED, "`offset`, `at`",
         "Digest: the offset was not reached within the request's `timeout_seconds` "
         "(the caller's own bound)",
         (OffsetNotReached,), _offset_not_reached),
    _row(R.BACKUP_IN_PROGRESS, C.RESOURCE_EXHAUSTED, "", "a second Backup while one runs",
         (BackupInProgress,), _message),
    _row(R.BACKUP_FAILED, C.INTERNAL, "",
         "a Backup failed on the node (the message says why)",
         (BackupFailed,), _message),
    _row(R.REPLICATION_REFUSED, C.FAILED_PRECONDITION, "",
         "the primary refuses a standby's Hello (the message says why)",
         (ReplicationRefused,), _message),
    _row(R.STEPPED_DOWN, C.FAILED_PRECONDITION, "`epoch`",
         "a Hello of a higher epoch: the primary stepped down",
         (SteppedDownForPeer,), _stepped_down),
    _row(R.NO_LONGER_PRIMARY, C.UNAVAILABLE, "",
         "the replication stream's node was demoted or replaced",
         (NoLongerPrimary,), _message),
    _row(R.STANDBY_TOO_SLOW, C.RESOURCE_EXHAUSTED, "",
         "the standby fell behind the primary's backlog",
         (BacklogLost,), _too_slow),
    _row(R.STORAGE_UNAVAILABLE, C.UNAVAILABLE,
         "`cause` (`no_space`, `io_error`) (+ `RetryInfo`)",
         "the node's store refuses writes (its data volume is full or failing); nothing "
         "was written, reads still answer, writes resume by themselves ([disk full]"
         "(operations.md#disk-full))",
         (StorageUnavailable,), _storage),
    _row(R.CLUSTER_UNAVAILABLE, C.UNAVAILABLE, "",
         "a job start needs a cluster-wide slot or block of the account's pages and the "
         "cluster's etcd did not answer within the bound; nothing was started, running "
         "jobs go on ([scaling](scaling.md#account-limits-across-pairs))",
         (ClusterUnavailable,), _message),
    _row(R.HOST_OWNED_ELSEWHERE, C.FAILED_PRECONDITION, "`owner`, `host`, `field`",
         "in a cluster, new work (a start, Scrape, Map, an append) for a host another "
         "pair owns; nothing was done: send it to `owner` (the cluster client does) "
         "([scaling](scaling.md#politeness-across-pairs))",
         (HostOwnedElsewhere,), lambda e, _: Refusal(
             str(e), {"owner": e.owner, "host": e.host, "field": e.field})),
)  # fmt: skip

_BY_TYPE: dict[type[Exception], Row] = {t: row for row in TABLE for t in row.raised_by}
#: every exception type the table maps (what ``answers_errors`` catches)
HANDLED: tuple[type[Exception], ...] = tuple(_BY_TYPE)


def row_for(exc: BaseException) -> Row | None:
    """The row of ``exc``'s most specific mapped class, or None."""
    for cls in type(exc).__mro__:
        row = _BY_TYPE.get(cast(type[Exception], cls))
        if row is not None:
            return row
    return None


def refusal_of(exc: Exception, facts: CallFacts) -> tuple[grpc.StatusCode, Reason, Refusal]:
    """The status code, reason and refusal ``exc`` becomes (``KeyError``: not mapped)."""
    row = row_for(exc)
    if row is None or row.build is None:
        raise KeyError(type(exc).__name__)
    refusal = row.build(exc, facts)
    return refusal.code or row.codes[0], row.reason, refusal


async def refuse(context: Any, exc: Exception, facts: CallFacts | None = None) -> NoReturn:
    """End the call with the status ``exc`` maps to (``rpcerrors.abort``)."""
    code, reason, r = refusal_of(exc, facts or CallFacts(now=time.time()))
    await rpcerrors.abort(
        context, code, r.message, reason, r.metadata, details=r.details, trailing=r.trailing
    )


class Refuser(Protocol):
    """A servicer whose handlers ``answers_errors`` wraps."""

    def call_facts(self) -> CallFacts:
        """The facts of the current call (its caller, where writes go, now)."""

    def refused(self, exc: Exception) -> None:
        """Told of each mapped exception before it is sent (metrics)."""


class NodeRefuser:
    """A ``Refuser`` for the node's own services (AdminService, the replication
    stream): no caller account and no primary hint to name, nothing to count."""

    def call_facts(self) -> CallFacts:
        return CallFacts(now=time.time())

    def refused(self, exc: Exception) -> None:
        return None


F = TypeVar("F", bound=Callable[..., Any])


def answers_errors(method: F) -> F:
    """Wrap a servicer handler (unary, or a server-streaming async generator) so every
    exception of ``HANDLED`` it raises ends the call with its row's status; anything
    else (an abort already under way, a bug) passes through untouched."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Refuser, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                # aclosing: a cancelled or abandoned call closes the handler at once
                async with contextlib.aclosing(method(self, request, context)) as items:
                    async for item in items:
                        yield item
            except HANDLED as e:
                self.refused(e)
                await refuse(context, e, self.call_facts())

        return cast(F, stream)

    @functools.wraps(method)
    async def unary(self: Refuser, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except HANDLED as e:
            self.refused(e)
            await refuse(context, e, self.call_facts())

    return cast(F, unary)


def reason_table_markdown() -> str:
    """The API docs' reason table (between ``reason-table:begin``/``end`` markers)."""
    rows = ["| reason | status | metadata keys | when |", "|---|---|---|---|"]
    for row in TABLE:
        status = row.status or " / ".join(f"`{c.name}`" for c in row.codes)
        rows.append(f"| `{row.reason}` | {status} | {row.metadata or '—'} | {row.when} |")
    return "\n".join(rows) + "\n"
