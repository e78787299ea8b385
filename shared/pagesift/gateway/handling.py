"""What every gateway route shares: app keys, auth, body parsing, JSON answers, errors.

What it owns
------------
The application keys (``CLIENTS``, ``PROBE``, ``PAGING``, ``TRUST_FORWARDED``) and the
request's chosen client (``client_of``); ``answer(handler)``, the one place a failure
becomes Firecrawl's error body; ``body(request, model)`` (a JSON object within
``pagesift.gateway.bounds``' limits, validated by a strict model of
``pagesift.gateway.models``); ``json_answer`` (built and serialized off the loop);
``job_of`` (GetJob of the route's job, 404 for a job of another kind); ``int_query`` (a
query integer bounded by its proto field), ``base_url`` and ``idempotency_key``;
``DEFECTS``, the rate limit of the catch-all's log line (``shared.util.logthrottle``).
Route modules (``v2``, and any other API version) import these and never each other.

Invariants
----------
- ``Authorization: Bearer KEY`` is passed through as the client's API key (no header:
  anonymous, which a node with an accounts file refuses with 401).
- Request bodies are bounded (``MAX_BODY_BYTES``; depth, count, numbers and text by
  ``bounds.parse_json``, every integer by its proto field) and past ``OFF_LOOP_BYTES``
  parsed in a thread; every document answer is built and serialized in one. Bad input
  is a 400 naming the field before anything runs (``details``: zod-like issues
  ``[{code, path, message}]``, ``httperrors.issue``: Firecrawl's shape).
- Every failure is ``{success: false, error, code?, details?}`` (``errors.HttpError``);
  an unexpected exception is a defect: a 500 that names no internals, its traceback
  logged once per route and exception type per minute with the count held back
  (``DEFECTS``), so no caller can fill the log with them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pydantic
from aiohttp import web

from pagesift.client import JobClient
from pagesift.core.util.logthrottle import Throttle
from pagesift.gateway.bounds import int_range, parse_json
from pagesift.gateway.clients import Clients
from pagesift.gateway.forwarded import origin
from pagesift.gateway.health import PrimaryProbe
from pagesift.gateway.httperrors import (
    HttpError,
    bad_request,
    dotted,
    from_aio_error,
    issue,
    unauthorized,
)
from pagesift.gateway.metrics import note_grpc_error
from pagesift.gateway.unserved import refusal_for
from pagesift.v1 import jobs_pb2

__all__ = [
    "CLIENTS", "MAX_BODY_BYTES", "MAX_LIMIT", "OFF_LOOP_BYTES", "PAGE_BYTES", "PAGE_DOCUMENTS",
    "PAGING", "PROBE", "TRUST_FORWARDED", "Handler", "answer", "api_key", "base_url", "body",
    "checked_key", "client_of", "idempotency_key", "int_query", "job_of", "json_answer",
    "unrouted",
]  # fmt: skip

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
PAGE_BYTES = 10 * 1024 * 1024  # Firecrawl's cap on one status page
PAGE_DOCUMENTS = 100
OFF_LOOP_BYTES = 64 * 1024  # a larger request body is parsed in a thread
MAX_LIMIT = 1000  # the most documents a ?limit= may ask for (the node's max_page_size)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CLIENTS: web.AppKey[Clients] = web.AppKey("clients")
PROBE: web.AppKey[PrimaryProbe] = web.AppKey("probe")
PAGING: web.AppKey[tuple[int, int]] = web.AppKey("paging")  # (documents, bytes) per page
TRUST_FORWARDED: web.AppKey[bool] = web.AppKey("trust_forwarded", bool)  # --trust-forwarded
_REQUEST_CLIENT: web.RequestKey[JobClient] = web.RequestKey("client")  # chosen by answer


MAX_KEY_CHARS = 1024
_KEY = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY_CHARS}}}")  # what gRPC metadata carries


def api_key(request: web.Request) -> str:
    """The caller's API key from ``Authorization: Bearer KEY`` ("" when absent); a key
    that is not visible ASCII (at most ``MAX_KEY_CHARS``), which no account has and no
    gRPC metadata can carry, is a 401 here."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if header and scheme.lower() != "bearer":
        raise HttpError(401, "Authorization must be 'Bearer KEY'", "UNAUTHORIZED")
    return checked_key(token.strip())


def checked_key(token: str) -> str:
    """``token`` as an API key ("" for none); one that is not visible ASCII (at most
    ``MAX_KEY_CHARS``) is a 401: no account has it, and gRPC metadata cannot carry it."""
    if token and not _KEY.fullmatch(token):
        why = f"the API key must be at most {MAX_KEY_CHARS} visible ASCII characters"
        raise HttpError(401, why, "UNAUTHORIZED")
    return token


MAX_IDEMPOTENCY_KEY_CHARS = 256
_IDEMPOTENCY_KEY = re.compile(rf"[\x21-\x7e]{{0,{MAX_IDEMPOTENCY_KEY_CHARS}}}")


def idempotency_key(request: web.Request) -> str:
    """The job start's AIP-155 key: Firecrawl's ``x-idempotency-key`` header, which its
    SDKs send on crawl and batch starts ("" without one: ``JobClient`` makes one up); one
    that is not visible ASCII (at most ``MAX_IDEMPOTENCY_KEY_CHARS``) is a 400 naming it."""
    key = request.headers.get("x-idempotency-key", "").strip()
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        why = f"must be at most {MAX_IDEMPOTENCY_KEY_CHARS} visible ASCII characters"
        detail = [issue("invalid_format", ["x-idempotency-key"], why)]
        raise bad_request(f"Bad Request: x-idempotency-key {why}", detail)
    return key


def client_of(request: web.Request) -> JobClient:
    """The request's client (``answer`` chose it by the request's key)."""
    return request[_REQUEST_CLIENT]


def _model_names() -> set[str]:
    names, todo = set(), [pydantic.BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            names.add(sub.__name__)
            todo.append(sub)
    return names


#: pydantic error type (its prefix) -> zod's issue code (Firecrawl's details)
_ZOD_CODES = (
    ("missing", "invalid_type"),
    ("less_than", "too_big"),
    ("too_long", "too_big"),
    ("greater_than", "too_small"),
    ("too_short", "too_small"),
    ("literal_error", "invalid_value"),
    ("enum", "invalid_value"),
    ("string_pattern", "invalid_format"),
    ("url", "invalid_format"),
    ("union_tag", "invalid_union"),
    ("invalid_", "invalid_union"),  # a discriminated union's own (unknown action type)
)


def _zod_code(kind: str) -> str:
    if kind.endswith(("_type", "_parsing")):
        return "invalid_type"
    return next((code for prefix, code in _ZOD_CODES if kind.startswith(prefix)), "custom")


def _validation(err: pydantic.ValidationError) -> HttpError:
    """400 naming each bad field by its body path, as zod issues (Firecrawl's
    ``details``): a union member's tag that pydantic puts in ``loc``
    (``formats.0.FormatObject.bogus``) is left out, and unknown keys come first
    (``unrecognized_keys`` at the object's path, the key in ``keys``: ``formats.0.bogus``
    leads, not the ``str`` branch's type error)."""
    tags = _model_names() | {"str"}
    details, unknown = [], []
    for e in err.errors():
        loc = [p for i, p in enumerate(e["loc"]) if not (i and p in tags)]
        if e["type"] == "extra_forbidden":
            named = dotted(loc)
            why = f"Unrecognized key in body: '{named}'"
            unknown.append(issue("unrecognized_keys", loc[:-1], why, keys=[str(loc[-1])]))
        else:
            details.append(issue(_zod_code(e["type"]), loc, e["msg"]))
    details = unknown + details
    first = details[0]
    named = dotted([*first["path"], *first.get("keys", ())])
    return bad_request(f"Bad Request: {first['message']} ({named})", details)


def _parse(raw: bytes, model: type[pydantic.BaseModel]) -> Any:
    value = parse_json(raw)  # the JSON shape bounded first (pagesift.gateway.bounds)
    if not isinstance(value, dict):
        raise bad_request("Bad Request: the body must be a JSON object")
    try:
        return model.model_validate(value)
    except pydantic.ValidationError as err:
        raise _validation(err) from None


async def body(request: web.Request, model: type[pydantic.BaseModel]) -> Any:
    """The request's body as ``model`` (a large one parsed off the event loop)."""
    raw = await request.read()
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(_parse, raw, model)
    return _parse(raw, model)


async def json_answer(make: Callable[[], Any]) -> web.Response:
    """``make()``'s value as a JSON answer, built and serialized off the event loop (a
    status page or a document may be megabytes)."""
    text = await asyncio.to_thread(lambda: json.dumps(make(), ensure_ascii=False))
    return web.Response(text=text, content_type="application/json")


#: the catch-all's log lines: one per route and exception type per minute, with a count
DEFECTS = Throttle(60.0)


def _log_defect(request: web.Request, exc: Exception) -> None:
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "(unrouted)"
    write, held = DEFECTS.allow(f"{request.method} {route} {type(exc).__name__}", time.monotonic())
    if write:
        log.error(
            "gateway: %s %s failed (%d more of these not logged in the last %.0f s)",
            request.method, route, held, DEFECTS.interval, exc_info=exc,
        )  # fmt: skip


def answer(handler: Handler) -> Handler:
    """Run ``handler`` with the client of the caller's key; any failure becomes
    Firecrawl's error body."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        key = ""
        try:
            key = api_key(request)
            async with request.app[CLIENTS].use(key) as client:
                request[_REQUEST_CLIENT] = client
                return await handler(request)
        except HttpError as err:
            return web.json_response(err.body(), status=err.status, headers=err.headers)
        except grpc.aio.AioRpcError as err:
            note_grpc_error(request, err.code())
            e = unauthorized(from_aio_error(err), bool(key))
            return web.json_response(e.body(), status=e.status, headers=e.headers)
        except web.HTTPRequestEntityTooLarge:
            e = HttpError(
                413, f"the body is larger than {MAX_BODY_BYTES} bytes", "PAYLOAD_TOO_LARGE"
            )
            return web.json_response(e.body(), status=e.status)
        except (
            Exception
        ) as exc:  # a defect: no input may get here (tests/test_gateway_schemathesis.py)
            _log_defect(request, exc)
            out = {"success": False, "error": "internal error", "code": "INTERNAL_SERVER_ERROR"}
            return web.json_response(out, status=500)

    return wrapped


@web.middleware
async def unrouted(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A path no route has (404) or a method a route does not take (405), in Firecrawl's
    error shape rather than aiohttp's text; a Firecrawl route pagesift does not serve
    is its 501 refusal saying why (``unserved``)."""
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
        refused = refusal_for(request.method, request.path)
        if refused is not None:
            return web.json_response(refused.body(), status=refused.status)
        if exc.status == 404:
            e = HttpError(404, f"Not found: {request.method} {request.path}", "NOT_FOUND")
        else:
            e = HttpError(405, f"Method {request.method} is not allowed here", "METHOD_NOT_ALLOWED")
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
        return web.json_response(e.body(), status=e.status, headers=headers)


def base_url(request: web.Request) -> str:
    """``scheme://host`` of the request, for the absolute URLs of answers (a trusted
    proxy's ``Forwarded`` headers decide it: ``pagesift.gateway.forwarded``)."""
    trust = request.app.get(TRUST_FORWARDED, False)
    return origin(request.headers, request.scheme, request.host, trust)


def int_query(request: web.Request, name: str, default: int, field: str) -> int:
    """The non-negative integer query parameter ``name`` (ASCII digits), at most what the
    proto integer ``field`` it lands in holds (``"GetJobRequest.skip"``); a 400 naming
    ``name`` otherwise."""
    raw = request.query.get(name)
    if raw is None:
        return default
    high = int_range(field)[1]
    digits = raw.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        why = "must be an integer"
    elif digits != raw:
        why = "must not be negative"
    elif len(digits) > len(str(high)) or int(digits) > high:
        why = f"must be at most {high}"
    else:
        return int(digits)
    kind = "invalid_type" if why == "must be an integer" else "too_small"
    if why.startswith("must be at most"):
        kind = "too_big"
    raise bad_request(f"Bad Request: {name} {why}", [issue(kind, [name], why)])


async def job_of(request: web.Request, kind: int, **kw: Any) -> jobs_pb2.GetJobResponse:
    """GetJob of the route's job (``{id}``); a job of the other kind is unknown here (404)."""
    job_id = request.match_info["id"]
    resp = await client_of(request).get_job(job_id, **kw)
    if resp.kind != kind:
        raise HttpError(404, f"Job not found: {job_id}", "NOT_FOUND")
    return resp
