"""Rich gRPC errors: every status a pagesift server sends carries ``google.rpc`` details.

What it owns
------------
The one way a server ends a call with an error (``abort`` and the helpers built on
it); a client reads the details back with ``pagesift.client.errors`` (``status_of``,
``error_info_of``, ``reason_of``; its wire constants equal ``DOMAIN`` and ``DETAILS_KEY``,
tests/test_client_errors.py). Details travel as a serialized ``google.rpc.Status`` in the
``grpc-status-details-bin`` trailing metadata (the gRPC convention that
``grpc_status.rpc_status.from_call`` reads); its code and message are those of the
call, so the status a caller already saw is unchanged.

Guarantees
----------
- Every refusal of every pagesift servicer and interceptor goes through ``abort``
  (applied by the error table, ``errortable.refuse``), so every error carries an
  ``ErrorInfo`` whose ``domain`` is ``DOMAIN`` and whose ``reason`` is one of
  ``Reason`` (UPPER_SNAKE, stable: part of the API; a new one may be added, none is
  renamed).
- Every INVALID_ARGUMENT also carries a ``BadRequest`` with one field violation per
  bad field, each naming the field path (``urls[3]``, ``include_paths[1]``,
  ``options.headers['Host']``); a URL the address guard refuses has the violation
  reason ``BLOCKED_ADDRESS`` (``pagesift.core.jobs.validate.BLOCKED_ADDRESS``).
- Every limit (reason ``QUOTA_EXCEEDED``, RESOURCE_EXHAUSTED) carries a
  ``QuotaFailure`` (subject ``account:NAME`` or ``node``, the limit as ``quota_id``)
  and, when the limit has a known reset time, a ``RetryInfo``; the
  ``pagesift-limit`` / ``pagesift-limit-resets-at`` trailing metadata says the same
  alongside, for clients that read no details.
- Trailing metadata already set on the call is kept (``abort`` merges it).

Reasons (domain ``pagesift.dev``): ``Reason`` lists them; which status each is, its
metadata keys and when it happens are ``pagesift.core.api.errortable.TABLE``'s (the
API docs' reason table is generated from it), and so is the mapping of the
servicers' domain exceptions to statuses (JobService, AdminService, the replication
stream).

``NOT_PRIMARY`` and ``FENCED`` are the only reasons that mean "nothing was done here,
send it to the primary": the client (``pagesift.client.failover``) fails over on them,
not on the status code. They keep FAILED_PRECONDITION so that clients older than the
details still move on.

``HOST_OWNED_ELSEWHERE``: in a cluster, work for a host another pair owns
(``pagesift.core.cluster.ownership``); nothing was done here. ErrorInfo ``owner``
names the pair to send it to: the cluster client (``pagesift.client.cluster``) re-reads
the registry and does, a bounded number of times. It is not NOT_PRIMARY: the pair is
right to refuse, no failover within it would help.

``STORAGE_UNAVAILABLE``: the node's store refuses writes (its volume is full, or it
reported an I/O error; ``pagesift.core.store.errors.StorageUnavailable``). Nothing was
written; reads still answer; writes resume by themselves once the node can write
again (``pagesift.core.api.storagewatch``). The message never names a filesystem path. Any
servicer that lets ``StorageUnavailable`` escape answers this (the error table's row,
applied to every RPC by ``pagesift.core.api.storagewatch.StorageErrors``).

Statuses by page error code (``PAGE_STATUS``, Scrape): every ``ErrorCode`` has its
status, none is UNKNOWN (``tests/test_render_errors.py`` walks them; a code missing from
the map would be INTERNAL, a defect). DEADLINE_EXCEEDED is only ever the caller's own
deadline, and an upstream failure is never FAILED_PRECONDITION (which, without
details, means "send it elsewhere"). UNAVAILABLE: the page may answer later
(``timeout``, a ``wait_for`` that did not show in time included, ``connect``, ``dns``,
``retry_after_too_long``, ``http_status`` 408/425/429/5xx, ``render_failed``: the
browser failed or its renderer crashed, the next attempt gets a fresh one); NOT_FOUND:
the page said 404/410; PERMISSION_DENIED: ``robots_disallowed`` (and ``robots_noindex``, and
``host_owned_elsewhere``: a redirect to a host another pair of the cluster owns);
INVALID_ARGUMENT: ``invalid_url``, ``blocked_address`` (field ``url``);
RESOURCE_EXHAUSTED: ``too_large``, the page passed a bound of the server
(``max_body_bytes``, the rendered HTML, a screenshot, ``browser_page_memory_limit``);
ABORTED: the page answered but the scrape was given up as asked, and the same request
fails the same way until the page or the request changes (``action_failed``, another
``http_status``, ``unsupported_content``, ``redirect_loop``, ``tls``, ``parse_failed``:
AIP-193's "retry at a higher level"); ALREADY_EXISTS: ``duplicate`` (a crawl outcome).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from pagesift.core.jobs.pageerrors import ErrorCode

__all__ = [
    "DETAILS_KEY",
    "DOMAIN",
    "PAGE_STATUS",
    "Reason",
    "abort",
    "bad_request",
    "error_info",
    "page_status",
    "quota_failure",
    "retry_info",
    "rich_status",
]

DOMAIN = "pagesift.dev"
DETAILS_KEY = "grpc-status-details-bin"  # grpc_status's GRPC_DETAILS_METADATA_KEY


class Reason(enum.StrEnum):
    """``ErrorInfo.reason`` values (the module docstring says when each happens)."""

    INVALID_FIELD = "INVALID_FIELD"
    MALFORMED_REQUEST = "MALFORMED_REQUEST"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    ADMIN_KEY_REQUIRED = "ADMIN_KEY_REQUIRED"
    REPLICATION_NOT_ALLOWED = "REPLICATION_NOT_ALLOWED"
    PERMISSION_DENIED_FIELD = "PERMISSION_DENIED_FIELD"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    JOB_NOT_APPENDABLE = "JOB_NOT_APPENDABLE"
    SKIP_OUT_OF_RANGE = "SKIP_OUT_OF_RANGE"
    NOT_PRIMARY = "NOT_PRIMARY"
    FENCED = "FENCED"
    WEBHOOK_SECRET_MISSING = "WEBHOOK_SECRET_MISSING"
    RENDERING_UNAVAILABLE = "RENDERING_UNAVAILABLE"
    MODEL_UNANSWERED = "MODEL_UNANSWERED"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    DOCUMENT_TOO_LARGE = "DOCUMENT_TOO_LARGE"
    PAGE_FETCH_FAILED = "PAGE_FETCH_FAILED"
    CANNOT_PROMOTE = "CANNOT_PROMOTE"
    OFFSET_PASSED = "OFFSET_PASSED"
    OFFSET_NOT_REACHED = "OFFSET_NOT_REACHED"
    BACKUP_IN_PROGRESS = "BACKUP_IN_PROGRESS"
    BACKUP_FAILED = "BACKUP_FAILED"
    REPLICATION_REFUSED = "REPLICATION_REFUSED"
    STEPPED_DOWN = "STEPPED_DOWN"
    NO_LONGER_PRIMARY = "NO_LONGER_PRIMARY"
    STANDBY_TOO_SLOW = "STANDBY_TOO_SLOW"
    STORAGE_UNAVAILABLE = "STORAGE_UNAVAILABLE"
    CLUSTER_UNAVAILABLE = "CLUSTER_UNAVAILABLE"
    HOST_OWNED_ELSEWHERE = "HOST_OWNED_ELSEWHERE"


_U = grpc.StatusCode.UNAVAILABLE
_GIVEN_UP = grpc.StatusCode.ABORTED

#: Scrape's status for each page error code (``http_status`` is refined by
#: ``page_status``); the module docstring says why each.
PAGE_STATUS: dict[str, grpc.StatusCode] = {
    ErrorCode.ROBOTS_DISALLOWED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.BLOCKED_ADDRESS: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_URL: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.TIMEOUT: _U,
    ErrorCode.CONNECT: _U,
    ErrorCode.DNS: _U,
    ErrorCode.RETRY_AFTER_TOO_LONG: _U,
    ErrorCode.RENDER_FAILED: _U,
    ErrorCode.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.HTTP_STATUS: _GIVEN_UP,
    ErrorCode.ACTION_FAILED: _GIVEN_UP,
    ErrorCode.UNSUPPORTED_CONTENT: _GIVEN_UP,
    ErrorCode.REDIRECT_LOOP: _GIVEN_UP,
    ErrorCode.TLS: _GIVEN_UP,
    ErrorCode.PARSE_FAILED: _GIVEN_UP,
    ErrorCode.DUPLICATE: grpc.StatusCode.ALREADY_EXISTS,  # crawl outcomes, never Scrape's
    ErrorCode.ROBOTS_NOINDEX: grpc.StatusCode.PERMISSION_DENIED,
    # a Scrape redirected to a host another pair owns (its own host is checked first)
    ErrorCode.HOST_OWNED_ELSEWHERE: grpc.StatusCode.PERMISSION_DENIED,
}

_TRANSIENT_HTTP = frozenset({408, 425, 429})


def page_status(code: str, http_status: int | None = None) -> grpc.StatusCode:
    """Scrape's status for a page error: see ``PAGE_STATUS`` and the module docstring."""
    if code == ErrorCode.HTTP_STATUS and http_status is not None:
        if http_status in _TRANSIENT_HTTP or 500 <= http_status <= 599:
            return _U
        if http_status in (404, 410):
            return grpc.StatusCode.NOT_FOUND
    return PAGE_STATUS.get(code, grpc.StatusCode.INTERNAL)  # unmapped: a defect, never UNKNOWN


# ---------------------------------------------------------------- building


def error_info(reason: str, metadata: Mapping[str, object] | None = None) -> Any:
    """An ``ErrorInfo`` of ``DOMAIN`` (metadata values as text; None values left out)."""
    md = {k: str(v) for k, v in (metadata or {}).items() if v is not None}
    return error_details_pb2.ErrorInfo(reason=str(reason), domain=DOMAIN, metadata=md)


def bad_request(violations: Iterable[tuple[str, str]], reasons: Sequence[str] = ()) -> Any:
    """A ``BadRequest`` with one field violation per ``(field, description)``; ``reasons``
    (aligned with them, "" for none) set each violation's stable ``reason``."""
    pairs = list(violations)
    causes = list(reasons) + [""] * (len(pairs) - len(reasons))
    return error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=f, description=d, reason=r)
            for (f, d), r in zip(pairs, causes, strict=False)
        ]
    )


def quota_failure(subject: str, description: str, quota_id: str) -> Any:
    """A ``QuotaFailure`` with one violation (``quota_id`` is the limit's name)."""
    violation = error_details_pb2.QuotaFailure.Violation(
        subject=subject, description=description, quota_id=quota_id
    )
    return error_details_pb2.QuotaFailure(violations=[violation])


def retry_info(seconds: float) -> Any:
    """A ``RetryInfo`` asking to wait ``seconds`` (at least 0, whole nanoseconds)."""
    seconds = max(0.0, seconds)
    whole = math.floor(seconds)
    delay = duration_pb2.Duration(seconds=whole, nanos=int((seconds - whole) * 1e9))
    return error_details_pb2.RetryInfo(retry_delay=delay)


def rich_status(
    code: grpc.StatusCode,
    message: str,
    reason: str,
    metadata: Mapping[str, object] | None = None,
    details: Sequence[Message] = (),
) -> status_pb2.Status:
    """The ``google.rpc.Status``: ``ErrorInfo`` first, then ``details`` in order."""
    status = status_pb2.Status(code=code.value[0], message=message)
    for detail in (error_info(reason, metadata), *details):
        status.details.add().Pack(detail)
    return status


def _set_trailing(context: Any) -> list[tuple[str, str | bytes]]:
    getter = getattr(context, "trailing_metadata", None)
    try:
        current = getter() if callable(getter) else None
    except Exception:  # a context that cannot tell: nothing to keep
        current = None
    return [(k, v) for k, v in (current or ()) if k != DETAILS_KEY]


async def abort(
    context: Any,
    code: grpc.StatusCode,
    message: str,
    reason: str,
    metadata: Mapping[str, object] | None = None,
    *,
    details: Sequence[Message] = (),
    trailing: Sequence[tuple[str, str]] = (),
) -> NoReturn:
    """End the call with ``code``/``message`` and the rich status (``ErrorInfo`` of
    ``reason`` and ``metadata``, then ``details``) in ``grpc-status-details-bin``,
    next to the trailing metadata already set and ``trailing``. ``context`` is a
    ``grpc.aio.ServicerContext``."""
    rich = rpc_status.to_status(rich_status(code, message, reason, metadata, details))
    md: list[tuple[str, str | bytes]] = _set_trailing(context)
    md.extend(trailing)
    md.extend(rich.trailing_metadata)  # (DETAILS_KEY, the serialized Status)
    await context.abort(rich.code, rich.details, trailing_metadata=tuple(md))
    raise AssertionError("unreachable")  # abort raises


#: how long a client asked to retry after STORAGE_UNAVAILABLE waits (seconds)
STORAGE_RETRY_SECONDS = 5.0
