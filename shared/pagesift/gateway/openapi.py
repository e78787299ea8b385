"""``GET /v2/openapi.json``: the gateway's OpenAPI 3.1 document, made from what it runs.

What it owns
------------
``REQUEST_MODELS`` (each route with a JSON body -> the ``pagesift.gateway.models``
class its handler validates the body with), ``QUERY`` (each route's query integers and
the proto field that bounds each, ``jobroutes.STATUS_QUERY``), ``IDEMPOTENT`` (the starts
that read ``x-idempotency-key``), ``document(routes)`` (pure: the document of a route
list, every request model's JSON Schema, by alias, under ``components.schemas``, every
4xx a Firecrawl ``Error``) and ``add_openapi_route(app)``, which builds the document
once, when the app starts (every route module is registered by then), from the app's
own router. tests/test_gateway_schemathesis.py fuzzes the gateway from this document.

Invariants
----------
- Cannot drift: the paths are the router's routes (templates as registered); a body's
  schema is ``model_json_schema(by_alias=True)`` of the same strict model that
  rejects an unknown key (``additionalProperties: false``), so each integer's
  ``minimum``/``maximum`` is the bound it is validated with (``pagesift.gateway.bounds``);
  a query integer's ``maximum`` is its proto field's, as ``handling.int_query`` checks;
  a route with a body and no model in ``REQUEST_MODELS`` fails ``tests/test_gateway_server.py``.
- Pure but for ``add_openapi_route``: ``document`` takes (method, path) pairs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import pydantic
from aiohttp import web
from pydantic.json_schema import models_json_schema

from pagesift.gateway.bounds import int_range
from pagesift.gateway.extractroutes import ExtractRequest
from pagesift.gateway.jobroutes import STATUS_QUERY
from pagesift.gateway.models import (
    BatchScrapeRequest,
    CrawlParamsPreviewRequest,
    CrawlRequest,
    MapRequest,
    ScrapeRequest,
)
from pagesift.gateway.v1models import (
    BatchScrapeRequestV1,
    CrawlRequestV1,
    MapRequestV1,
    ScrapeRequestV1,
)

__all__ = ["BODY_METHODS", "REQUEST_MODELS", "add_openapi_route", "document", "routes_of"]

OPENAPI_PATH = "/v2/openapi.json"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: (method, route template) -> the model its body is validated with
REQUEST_MODELS: dict[tuple[str, str], type[pydantic.BaseModel]] = {
    ("POST", "/v2/scrape"): ScrapeRequest,
    ("POST", "/v2/crawl"): CrawlRequest,
    ("POST", "/v2/crawl/params-preview"): CrawlParamsPreviewRequest,
    ("POST", "/v2/batch/scrape"): BatchScrapeRequest,
    ("POST", "/v2/map"): MapRequest,
    ("POST", "/v1/scrape"): ScrapeRequestV1,
    ("POST", "/v1/crawl"): CrawlRequestV1,
    ("POST", "/v1/batch/scrape"): BatchScrapeRequestV1,
    ("POST", "/v1/map"): MapRequestV1,
    ("POST", "/v2/extract"): ExtractRequest,
    ("POST", "/v1/extract"): ExtractRequest,  # v1's extract body is v2's (Firecrawl's too)
}
#: (method, route template) -> its query integers (name -> the proto field it lands in)
QUERY: dict[tuple[str, str], dict[str, str]] = {
    ("GET", f"/{v}/{kind}/{{id}}"): STATUS_QUERY
    for v in ("v1", "v2")
    for kind in ("crawl", "batch/scrape")
}
#: the job starts that read ``x-idempotency-key`` (AIP-155)
_STARTS = ("crawl", "batch/scrape", "extract")
IDEMPOTENT = frozenset(("POST", f"/{v}/{kind}") for v in ("v1", "v2") for kind in _STARTS)
#: routes that need no ``Authorization`` (probes and this document)
OPEN_PATHS = frozenset(
    {"/healthz", "/metrics", OPENAPI_PATH}
    | {f"/{v}/health/{probe}" for v in ("v0", "v1") for probe in ("liveness", "readiness")}
)
_PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")
_ERROR = {
    "type": "object",
    "properties": {
        "success": {"const": False},
        "error": {"type": "string"},
        "code": {"type": "string"},
        "details": {},
    },
    "required": ["success", "error"],
}

OPENAPI: web.AppKey[dict[str, bytes]] = web.AppKey("openapi")  # "json": the document


def routes_of(app: web.Application) -> list[tuple[str, str]]:
    """The (method, template) of every route on ``app`` (aiohttp's implicit HEAD of
    each GET left out)."""
    out = []
    for route in app.router.routes():
        if route.method in ("HEAD", "*") or route.resource is None:
            continue
        out.append((route.method, _PARAM.sub(r"{\1}", route.resource.canonical)))
    return out


def _parameters(method: str, path: str) -> list[dict[str, Any]]:
    """The path parameters, the query integers (bounded as ``handling.int_query``
    bounds them) and the idempotency header of one operation."""
    params: list[dict[str, Any]] = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
        for p in _PARAM.findall(path)
    ]
    for name, field in QUERY.get((method, path), {}).items():
        schema = {"type": "integer", "minimum": 0, "maximum": int_range(field)[1]}
        params.append({"name": name, "in": "query", "required": False, "schema": schema})
    if (method, path) in IDEMPOTENT:
        schema = {
            "type": "string",
            "description": "AIP-155: a retry with the same body is the same job",
        }
        params.append(
            {"name": "x-idempotency-key", "in": "header", "required": False, "schema": schema}
        )
    return params


def _operation(method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": f"{method.lower()}{re.sub(r'[^A-Za-z0-9]+', '_', path).rstrip('_')}",
        "responses": {"200": {"description": "success"}},
    }
    params = _parameters(method, path)
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if path not in OPEN_PATHS:
        op["security"] = [{"bearer": []}]
        op["responses"]["4XX"] = op["responses"]["default"] = {
            "description": "a Firecrawl error body",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    return op


def document(
    routes: Iterable[tuple[str, str]],
    models: dict[tuple[str, str], type[pydantic.BaseModel]] | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` with the request ``models``."""
    table = REQUEST_MODELS if models is None else models
    listed = sorted(set(routes), key=lambda r: (r[1], r[0]))
    used = list(dict.fromkeys(m for r in listed if (m := table.get(r)) is not None))
    refs, defs = models_json_schema(
        [(m, "validation") for m in used],
        by_alias=True,
        ref_template="#/components/schemas/{model}",
    )  # refs: each model's {"$ref": ...} (two models of one name are told apart)
    paths: dict[str, dict[str, Any]] = {}
    for method, path in listed:
        model = table.get((method, path))
        body = dict(refs[(model, "validation")]) if model is not None else None
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, body)
    schemas = {**defs.get("$defs", {}), "Error": _ERROR}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "pagesift Firecrawl-compatible gateway",
            "version": "2",
            "description": "Firecrawl's HTTP API in front of a pagesift pair (docs/gateway.md).",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def _openapi(request: web.Request) -> web.StreamResponse:
    return web.Response(body=request.app[OPENAPI]["json"], content_type="application/json")


def add_openapi_route(app: web.Application) -> None:
    """``GET /v2/openapi.json`` on ``app``; the document is built when the app starts."""
    app.router.add_get(OPENAPI_PATH, _openapi)
    app[OPENAPI] = built = {}  # filled at start-up (the app is frozen by then)

    async def build(app: web.Application) -> None:
        built["json"] = json.dumps(document(routes_of(app))).encode()

    app.on_startup.append(build)
