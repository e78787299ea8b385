"""Firecrawl's extract and token-usage routes onto StartExtract, GetExtract and GetAccountUsage.

What it owns
------------
``ExtractRequest`` (Firecrawl's extract body, strict), the pure ``extract_request``
(body -> ``StartExtractRequest``), ``extract_status`` (``GetExtractResponse`` ->
Firecrawl's extract status body) and ``token_usage`` (``GetAccountUsageResponse`` ->
``team/token-usage``'s body), and ``add_extract_routes(app)``: ``POST /v2/extract``,
``GET /v2/extract/{id}``, ``GET /v2/team/token-usage``, the same under ``/v1/`` (v1's
token names are snake_case, as its credit-usage).

Mapping (docs/gateway.md, "Extract and tokens")
-----------------------------------------------
- ``urls`` (a ``/*`` URL stands for the site's pages under the path), ``schema``,
  ``prompt``, ``systemPrompt``, ``limit``, ``scrapeOptions`` (v2's scrape options,
  formats excepted: the job's is FORMAT_JSON) and ``ignoreInvalidURLs`` (false unless
  given, as a batch's) map onto StartExtract; ``x-idempotency-key`` is its AIP-155 key.
- ``enableWebSearch``, ``allowExternalLinks``, ``includeSubdomains: false``, ``agent``
  and the other options pagesift cannot honour are a 400 naming the key.
- GET answers ``sources`` (for each top-level key, the pages it came from) whether or
  not ``showSources`` was sent: the gateway keeps nothing of a job to remember it by.
- Tokens: the model tokens of the account's rolling day; an account without
  ``model_tokens_per_day`` has ``team.UNLIMITED`` remaining and no plan, one without
  ``allow_model`` (or a server without a model endpoint) 0 of 0.

Invariants
----------
Stateless, as every route; the request and answer mappings are pure (tested without a
server, tests/test_gateway_structured.py).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

import grpc
import grpc.aio
from aiohttp import web
from pydantic import Field

from pagesift.client.retry import is_retryable
from pagesift.gateway import translate
from pagesift.gateway.bounds import proto_int
from pagesift.gateway.handling import answer, body, client_of, idempotency_key
from pagesift.gateway.httperrors import HttpError
from pagesift.gateway.models import ScrapeOptions, Strict
from pagesift.gateway.options import refuse
from pagesift.gateway.team import UNLIMITED
from pagesift.v1 import jobs_pb2

__all__ = [
    "REFUSED",
    "ExtractRequest",
    "add_extract_routes",
    "extract_request",
    "extract_status",
    "token_usage",
]

ExtractLimit = Annotated[int, proto_int("StartExtractRequest.limit", low=1)]


class ExtractRequest(Strict):
    """``POST /v2/extract`` (Firecrawl's ``extractRequestSchema``)."""

    urls: list[str] = Field(min_length=1, max_length=100)
    prompt: str | None = Field(None, max_length=10_000)
    schema_: Any = Field(None, alias="schema")
    system_prompt: str | None = Field(None, alias="systemPrompt", max_length=10_000)
    limit: ExtractLimit | None = None
    scrape_options: ScrapeOptions | None = Field(None, alias="scrapeOptions")
    ignore_invalid_urls: bool = Field(False, alias="ignoreInvalidURLs")
    show_sources: bool = Field(False, alias="showSources")  # sources are always answered
    include_subdomains: bool | None = Field(None, alias="includeSubdomains")
    origin: str | None = None
    integration: str | None = None
    # declared so that they are refused by name (REFUSED)
    enable_web_search: bool = Field(False, alias="enableWebSearch")
    allow_external_links: bool = Field(False, alias="allowExternalLinks")
    agent: Any = None
    threat_protection: Any = Field(None, alias="threatProtection")
    webhook: Any = None
    cache_mode: Any = Field(None, alias="__experimental_cacheMode")
    stream_steps: Any = Field(None, alias="__experimental_streamSteps")
    llm_usage: Any = Field(None, alias="__experimental_llmUsage")
    show_sources_x: Any = Field(None, alias="__experimental_showSources")
    cache_key: Any = Field(None, alias="__experimental_cacheKey")
    show_cost: Any = Field(None, alias="__experimental_showCostTracking")


_INTERNAL = "a Firecrawl-internal experiment"
#: attribute -> (Firecrawl name, why it is refused when set)
REFUSED: dict[str, tuple[str, str]] = {
    "enable_web_search": ("enableWebSearch", "pagesift has no web search: give the URLs"),
    "allow_external_links": (
        "allowExternalLinks",
        "pagesift extracts from the URLs given (a /* URL: the site's pages under its path)",
    ),
    "agent": ("agent", "pagesift runs no agent (FIRE-1): one model call a page"),
    "threat_protection": ("threatProtection", "pagesift's address guard is not configurable"),
    "webhook": ("webhook", "pagesift's extract jobs send no webhooks: poll GET /v2/extract/{id}"),
    "cache_mode": ("__experimental_cacheMode", _INTERNAL),
    "stream_steps": ("__experimental_streamSteps", _INTERNAL),
    "llm_usage": ("__experimental_llmUsage", _INTERNAL),
    "show_sources_x": ("__experimental_showSources", "showSources' own spelling is showSources"),
    "cache_key": ("__experimental_cacheKey", _INTERNAL),
    "show_cost": ("__experimental_showCostTracking", _INTERNAL),
}


def extract_request(r: ExtractRequest, key: str = "") -> jobs_pb2.StartExtractRequest:
    """``POST /v2/extract``'s body -> ``StartExtractRequest`` (``key``: x-idempotency-key)."""
    for attr, (name, why) in REFUSED.items():
        if getattr(r, attr) not in (None, False):
            raise refuse(name, why)
    if r.include_subdomains:
        why = "a /* URL stands for its own host's pages, never a subdomain's (send false)"
        raise refuse("includeSubdomains", why)
    if r.schema_ is None and not r.prompt:
        raise refuse("schema", "an extract needs a schema or a prompt (or both)")
    if r.schema_ is not None and not isinstance(r.schema_, dict):
        raise refuse("schema", "a JSON Schema is an object")
    scrape = r.scrape_options or ScrapeOptions.model_validate({})
    if scrape.formats:
        raise refuse("scrapeOptions.formats", "an extract's format is json: give no formats")
    out = jobs_pb2.StartExtractRequest(
        urls=r.urls,
        options=translate.scrape_options(scrape, "scrapeOptions."),
        limit=r.limit or 0,
        idempotency_key=key,
        ignore_invalid_urls=r.ignore_invalid_urls,
    )
    out.json.SetInParent()
    if r.schema_ is not None:
        out.json.schema = json.dumps(r.schema_, ensure_ascii=False, separators=(",", ":"))
    out.json.prompt = r.prompt or ""
    out.json.system_prompt = r.system_prompt or ""
    return out


#: JobState -> Firecrawl's extract status
STATUS: dict[int, str] = {
    jobs_pb2.JOB_STATE_SCRAPING: "processing",
    jobs_pb2.JOB_STATE_PAUSED: "processing",
    jobs_pb2.JOB_STATE_COMPLETED: "completed",
    jobs_pb2.JOB_STATE_FAILED: "failed",
    jobs_pb2.JOB_STATE_CANCELLED: "cancelled",
}


def extract_status(resp: jobs_pb2.GetExtractResponse) -> dict[str, Any]:
    """``GET /v2/extract/{id}``: Firecrawl's extract status (``data`` the merged object,
    ``null`` before any page is done, as Firecrawl's processing answer)."""
    data = json.loads(resp.data) if resp.data else None
    status = STATUS.get(resp.state, "processing")
    out: dict[str, Any] = {
        "success": True,
        "id": resp.id,
        "status": status,
        "data": data if data or status == "completed" else None,
        "expiresAt": resp.expires_at.ToJsonString(),
        "sources": {s.key: list(s.urls) for s in resp.sources},
        "creditsUsed": resp.completed,
        "tokensUsed": resp.model_usage.input_tokens + resp.model_usage.output_tokens,
    }
    if status == "failed":
        out["error"] = resp.note or "the extract failed"
    elif resp.failed:
        out["warning"] = f"{resp.failed} of {resp.total} pages failed; data is the others'"
    return out


def token_usage(u: jobs_pb2.GetAccountUsageResponse, *, v1: bool = False) -> dict[str, Any]:
    """``GET /v2/team/token-usage``: the model tokens left in the account's rolling day."""
    if not u.model_allowed:
        remaining, plan = 0, 0
    elif u.HasField("model_tokens_per_day"):
        plan = u.model_tokens_per_day
        remaining = max(0, plan - u.model_tokens_used)
    else:
        remaining, plan = UNLIMITED, None
    data: dict[str, Any] = {
        "remainingTokens": remaining,
        "planTokens": plan,
        "billingPeriodStart": u.period_start.ToJsonString(),
        "billingPeriodEnd": u.period_end.ToJsonString(),
    }
    if v1:
        data = {_V1_NAMES[k]: v for k, v in data.items()}
    return {"success": True, "data": data}


_V1_NAMES = {
    "remainingTokens": "remaining_tokens",
    "planTokens": "plan_tokens",
    "billingPeriodStart": "billing_period_start",
    "billingPeriodEnd": "billing_period_end",
}


_NO_EXTRACT = (
    "extract: the node does not offer StartExtract/GetExtract (a pagesift without them, "
    "or a cluster client, which routes no such call)"
)
T = TypeVar("T")


def _rpc(stub: Any, name: str) -> Any:
    rpc = getattr(stub, name, None)
    if rpc is None:  # the cluster router: no such call to route
        raise HttpError(501, _NO_EXTRACT, "NOT_IMPLEMENTED")
    return rpc


async def _unimplemented(call: Awaitable[T]) -> T:
    try:
        return await call
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise HttpError(501, _NO_EXTRACT, "NOT_IMPLEMENTED") from None
        raise


async def start_extract(request: web.Request) -> web.StreamResponse:
    req: ExtractRequest = await body(request, ExtractRequest)
    start = extract_request(req, idempotency_key(request))
    client = client_of(request)

    def invoke(stub: Any) -> Any:  # a /* URL is listed through Map: a scrape's time
        return _rpc(stub, "StartExtract")(start, timeout=client.scrape_timeout)

    retry = is_retryable("StartExtract", start.idempotency_key)
    resp: jobs_pb2.StartExtractResponse = await _unimplemented(client.call(invoke, retryable=retry))
    out: dict[str, Any] = {"success": True, "id": resp.id, "urlTrace": []}
    if req.ignore_invalid_urls:
        out["invalidURLs"] = list(resp.invalid_urls)
    return web.json_response(out)


async def get_extract(request: web.Request) -> web.StreamResponse:
    ask = jobs_pb2.GetExtractRequest(id=request.match_info["id"])
    client = client_of(request)
    call = client.call(
        lambda s: _rpc(s, "GetExtract")(ask, timeout=client.timeout),
        retryable=is_retryable("GetExtract"),
    )
    resp: jobs_pb2.GetExtractResponse = await _unimplemented(call)
    return web.json_response(extract_status(resp))


async def token_usage_route(request: web.Request) -> web.StreamResponse:
    usage = await client_of(request).account_usage()
    return web.json_response(token_usage(usage, v1=request.path.startswith("/v1/")))


def add_extract_routes(app: web.Application) -> None:
    """Register the extract and token-usage routes of v2 and v1 on ``app``."""
    r = app.router
    for v in ("v2", "v1"):
        r.add_post(f"/{v}/extract", answer(start_extract))
        r.add_get(f"/{v}/extract/{{id}}", answer(get_extract))
        r.add_get(f"/{v}/team/token-usage", answer(token_usage_route))
