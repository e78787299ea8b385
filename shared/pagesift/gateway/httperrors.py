"""The gateway's one error table: a gRPC error from JobService -> a Firecrawl HTTP error.

What it owns
------------
``TABLE`` (reason -> HTTP status and Firecrawl ``code``), its refinements by the error's
metadata (``QUOTA_EXCEEDED`` by ``limit``, ``PAGE_FETCH_FAILED`` by page error ``code``,
``INVALID_FIELD`` on ``id`` as an unknown job, a violation of reason ``BLOCKED_ADDRESS``
(the address guard refused a URL) as blocked, ``JOB_NOT_APPENDABLE`` of a crawl as an
unknown batch),
the fallback by gRPC status (``BY_STATUS``), and ``HttpError``: the status, the body
``{success: false, error, code?, details?}`` and the headers (``Retry-After`` on 429/503).

``details`` has one shape, Firecrawl's (the zod issues its validation errors carry): a
list of ``{code, path, message}`` (``issue``), ``path`` the list of keys and indices
that leads to the value at fault (``["scrapeOptions", "actions", 2, "all"]``), ``code``
zod's issue code (``unrecognized_keys``, whose ``keys`` name the unknown keys under
``path``; ``invalid_type``, ``invalid_value``, ``too_big``, ``too_small``,
``invalid_format``, ``invalid_union``, ``custom``: a value the gateway or the node
refuses); a failed page is one issue on ``["url"]`` whose ``code`` is the page error's
(``tls``, ``dns``...) with the page's ``url`` (and ``statusCode``, an HTTP status).
A 401 says what HTTP sends (``Authorization: Bearer KEY``), never gRPC's metadata
(``unauthorized``).

Invariants
----------
- Pure: ``from_rpc`` takes the status, reason, metadata, message, field violations and
  retry delay already read off the error (``from_aio_error`` reads them with
  ``pagesift.client.errors``), so the table is tested without a server.
- Every 429 and 503 carries ``Retry-After`` in whole seconds (at least 1).
- A reason the table does not know falls back to its gRPC status; a status it does not
  know is 500. The message is the server's own; an UNAVAILABLE that no server sent
  (the channel could not connect) says ``UNREACHABLE`` instead of gRPC's text, which
  names the addresses it dialled.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import error_details_pb2

from pagesift.client.errors import BLOCKED_ADDRESS, details_of, error_info_of, status_of

__all__ = [
    "BY_STATUS",
    "TABLE",
    "VIOLATION_REASONS",
    "HttpError",
    "bad_request",
    "dotted",
    "from_aio_error",
    "from_rpc",
    "issue",
    "path_of",
    "unauthorized",
]

C = grpc.StatusCode


@dataclass(eq=False)  # an exception: not frozen (raising sets __traceback__)
class HttpError(Exception):
    """A Firecrawl error answer: HTTP ``status`` with body ``body()`` and ``headers``."""

    status: int
    error: str
    code: str = ""
    details: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"success": False, "error": self.error}
        if self.code:
            out["code"] = self.code
        if self.details is not None:
            out["details"] = self.details
        return out


PathPart = str | int
_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def path_of(field: str) -> list[PathPart]:
    """A field path as the gateway and the node write it (``scrapeOptions.actions[2].all``,
    ``formats.0.bogus``, ``urls[1]``) -> zod's path (``["scrapeOptions", "actions", 2,
    "all"]``): indices are integers."""
    out: list[PathPart] = []
    for index, name in _PART.findall(field):
        if index:
            out.append(int(index))
        else:
            out.append(int(name) if name.isascii() and name.isdigit() else name)
    return out


def dotted(path: Sequence[PathPart]) -> str:
    """``["scrapeOptions", "actions", 2, "all"]`` -> ``scrapeOptions.actions[2].all``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def issue(code: str, path: Sequence[PathPart] | str, message: str, **extra: Any) -> dict[str, Any]:
    """One entry of ``details`` (the module docstring): a zod-like issue."""
    parts = path_of(path) if isinstance(path, str) else list(path)
    return {"code": code, "path": parts, "message": message, **extra}


#: reason -> (HTTP status, Firecrawl code)
TABLE: dict[str, tuple[int, str]] = {
    "INVALID_FIELD": (400, "BAD_REQUEST"),
    "MALFORMED_REQUEST": (400, "BAD_REQUEST"),
    "SKIP_OUT_OF_RANGE": (400, "BAD_REQUEST"),
    "WEBHOOK_SECRET_MISSING": (400, "BAD_REQUEST"),
    "RENDERING_UNAVAILABLE": (400, "RENDERING_UNAVAILABLE"),
    "UNAUTHENTICATED": (401, "UNAUTHORIZED"),
    "ADMIN_KEY_REQUIRED": (403, "FORBIDDEN"),
    "PERMISSION_DENIED_FIELD": (403, "FORBIDDEN"),
    "REPLICATION_NOT_ALLOWED": (403, "FORBIDDEN"),
    "JOB_NOT_FOUND": (404, "NOT_FOUND"),
    "JOB_NOT_APPENDABLE": (409, "CONFLICT"),  # appendToId: a batch that ended failed/cancelled
    # x-idempotency-key already used with another body: 409 as Firecrawl's own reuse
    # answer (a retry with the same body is the same job, not a 409: AIP-155)
    "IDEMPOTENCY_KEY_REUSED": (409, "CONFLICT"),
    # a gateway in front of one pair of a cluster, asked for a host another pair owns
    # (a cluster gateway's client follows the owner and never shows it): 421 Misdirected
    "HOST_OWNED_ELSEWHERE": (421, "MISDIRECTED"),
    "QUOTA_EXCEEDED": (429, "RATE_LIMIT_EXCEEDED"),
    "DOCUMENT_TOO_LARGE": (500, "DOCUMENT_TOO_LARGE"),
    "PAGE_FETCH_FAILED": (500, "SCRAPE_FAILED"),
    "NOT_PRIMARY": (503, "UNAVAILABLE"),
    "FENCED": (503, "UNAVAILABLE"),
    "STORAGE_UNAVAILABLE": (503, "UNAVAILABLE"),
    "CLUSTER_UNAVAILABLE": (503, "UNAVAILABLE"),
    # the model endpoint gave no usable answer (a crawl's prompt, params-preview): again later
    "MODEL_UNANSWERED": (503, "UNAVAILABLE"),
}

#: QUOTA_EXCEEDED by its ``limit``: the account's allowance is used up (402), not a rate
QUOTA_LIMITS = frozenset({"pages_per_day", "max_batch_urls", "max_crawl_limit"})

#: PAGE_FETCH_FAILED by the page error ``code``: a render's failures each have theirs
#: (a ``waitFor`` selector that never showed is ``timeout``; a renderer killed past
#: ``browser_page_memory_limit`` is ``too_large``), none a 500
PAGE_CODES: dict[str, tuple[int, str]] = {
    "timeout": (408, "SCRAPE_TIMEOUT"),
    "action_failed": (422, "SCRAPE_ACTION_ERROR"),
    "too_large": (422, "SCRAPE_TOO_LARGE"),
    "connect": (502, "SCRAPE_SITE_ERROR"),
    "render_failed": (502, "SCRAPE_SITE_ERROR"),
    "blocked_address": (403, "URL_BLOCKED"),
    "robots_disallowed": (403, "ROBOTS_DISALLOWED"),
    "invalid_url": (400, "BAD_REQUEST"),
    "dns": (500, "SCRAPE_DNS_RESOLUTION_ERROR"),
    "tls": (500, "SCRAPE_SSL_ERROR"),
}

#: BadRequest violation reasons -> (HTTP status, Firecrawl code): the node's address
#: guard refusing a URL of the request (``FieldViolation.reason``, a wire constant)
VIOLATION_REASONS: dict[str, tuple[int, str]] = {BLOCKED_ADDRESS: (403, "URL_BLOCKED")}

#: the message of an UNAVAILABLE no server sent (the channel's own failure)
UNREACHABLE = "no node of the pair answered; try again"

#: fallback by gRPC status (a reason the table does not know, or none)
BY_STATUS: dict[grpc.StatusCode, tuple[int, str]] = {
    C.INVALID_ARGUMENT: (400, "BAD_REQUEST"),
    C.OUT_OF_RANGE: (400, "BAD_REQUEST"),
    C.UNAUTHENTICATED: (401, "UNAUTHORIZED"),
    C.PERMISSION_DENIED: (403, "FORBIDDEN"),
    C.NOT_FOUND: (404, "NOT_FOUND"),
    C.DEADLINE_EXCEEDED: (408, "SCRAPE_TIMEOUT"),
    C.RESOURCE_EXHAUSTED: (429, "RATE_LIMIT_EXCEEDED"),
    C.UNIMPLEMENTED: (501, "NOT_IMPLEMENTED"),  # a node without the RPC the route needs
    C.UNAVAILABLE: (503, "UNAVAILABLE"),
}


def _retry_after(seconds: float | None) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds or 1)))}


def from_rpc(
    status: grpc.StatusCode,
    reason: str | None,
    metadata: Mapping[str, str],
    message: str,
    *,
    violations: Sequence[tuple[str, str]] = (),
    violation_reasons: Sequence[str] = (),
    retry_after: float | None = None,
) -> HttpError:
    """The HTTP error for one gRPC error (see the module docstring); ``violation_reasons``
    are the BadRequest violations' stable reasons ("" for none), in their order."""
    http, code = TABLE.get(reason or "", BY_STATUS.get(status, (500, "INTERNAL_SERVER_ERROR")))
    details: Any = None
    if reason == "QUOTA_EXCEEDED" and metadata.get("limit") in QUOTA_LIMITS:
        http, code = 402, "QUOTA_EXCEEDED"
    if reason == "JOB_NOT_APPENDABLE" and metadata.get("kind") != "batch":
        http, code = 404, "NOT_FOUND"  # a crawl is unknown on the batch routes (job_of)
    if reason == "PAGE_FETCH_FAILED":
        http, code = PAGE_CODES.get(metadata.get("code", ""), (http, code))
        page: dict[str, Any] = {"url": metadata.get("url", "")}
        if metadata.get("http_status", "").isdigit():
            page["statusCode"] = int(metadata["http_status"])
        details = [issue(metadata.get("code", "failed"), ["url"], message, **page)]
    if violations:
        details = [issue("custom", f, d) for f, d in violations]
        if reason == "INVALID_FIELD" and {f for f, _ in violations} == {"id"}:
            http, code = 404, "NOT_FOUND"  # a job id that cannot exist: unknown, as Firecrawl
        for why in violation_reasons:
            http, code = VIOLATION_REASONS.get(why, (http, code))
    headers = _retry_after(retry_after) if http in (429, 503) else {}
    if status == C.UNAVAILABLE and not reason:  # gRPC's own words name the addresses it dialled
        message = UNREACHABLE
    return HttpError(http, message or status.name, code, details, headers)


def from_aio_error(err: grpc.aio.AioRpcError) -> HttpError:
    """``from_rpc`` of an error raised by ``JobClient``, its details read off the call."""
    info = error_info_of(err)
    status = status_of(err)
    found = [
        v for b in details_of(status, error_details_pb2.BadRequest) for v in b.field_violations
    ]
    delays = details_of(status, error_details_pb2.RetryInfo)
    retry = delays[0].retry_delay.ToTimedelta().total_seconds() if delays else None
    return from_rpc(
        err.code(),
        str(info.reason) if info is not None else None,
        dict(info.metadata) if info is not None else {},
        err.details() or "",
        violations=[(v.field, v.description) for v in found],
        violation_reasons=[v.reason for v in found],
        retry_after=retry,
    )


def bad_request(message: str, details: Any = None) -> HttpError:
    """A 400 the gateway itself answers (an unknown key, an option it cannot honour)."""
    return HttpError(400, message, "BAD_REQUEST", details)


NO_KEY = "Unauthorized: no API key; send the header 'Authorization: Bearer <key>'"
BAD_KEY = "Unauthorized: the API key sent as 'Authorization: Bearer <key>' is not valid"


def unauthorized(err: HttpError, had_key: bool) -> HttpError:
    """``err`` with a 401's text in HTTP's words (the node's speaks of gRPC metadata):
    no key sent, or the key sent is not valid; any other error as it is."""
    if err.status != 401:
        return err
    return HttpError(401, BAD_KEY if had_key else NO_KEY, err.code, err.details, err.headers)
