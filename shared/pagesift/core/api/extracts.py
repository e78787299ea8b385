"""``StartExtract`` and ``GetExtract``: Firecrawl's /v2/extract as one durable batch job.

What it owns
------------
- ``batch_request``: a StartExtract request as the StartBatchScrape request it runs
  as. Its URLs, each kept as given but one ending in ``/*``, which stands for the
  site's URLs under that path: Map's list of them (``JobRuntime.map``: sitemaps and a
  shallow link walk, nothing stored), those whose path starts with the prefix, in
  Map's order. Duplicates are dropped and the list cut at ``limit`` (0: ``DEFAULT_LIMIT``;
  at most ``MAX_LIMIT``). The options are the request's with FORMAT_JSON and its
  ``json``, and ``extract`` set, so GetExtract knows the job. The service checks and
  registers it as any batch (``specs.batch``, the account's limits): one write group,
  replicated, resumed after a restart or a failover like any job.
- ``get_extract``: the job's state and its pages' objects merged (``extractmerge``), in
  the order of its URLs. A read: a standby answers from its replica.

Bounds: at most ``MAX_URLS`` URLs in a request and ``MAX_LIMIT`` pages a job, so the
merge reads a bounded number of documents.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from pagesift.core.api.ports import JobRuntime
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import extractmerge, modelrequests, records, specs, validate, views
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.validate import InvalidArgument, PermissionDenied
from pagesift.core.store.db import Store
from pagesift.v1 import jobs_pb2

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "MAX_URLS", "batch_request", "get_extract"]

MAX_URLS = 100
DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000


def _under(prefix: str, url: str) -> bool:
    base, found = urlsplit(prefix), urlsplit(url)
    return found.netloc == base.netloc and found.path.startswith(base.path.rstrip("/") or "/")


async def batch_request(
    runtime: JobRuntime,
    caller: Account,
    request: jobs_pb2.StartExtractRequest,
    config: ServerConfig,
) -> jobs_pb2.StartBatchScrapeRequest:
    if not config.model_url:  # before Map fetches anything for a request that cannot run
        raise InvalidArgument("json", "an extract needs the server's model endpoint (model_url)")
    if not caller.allow_model:
        raise PermissionDenied(
            "json", f"account {caller.name!r} may not use the model (allow_model)"
        )
    if not 1 <= len(request.urls) <= MAX_URLS:
        raise InvalidArgument("urls", f"{len(request.urls)} URLs, 1..{MAX_URLS}")
    if not 0 <= request.limit <= MAX_LIMIT:
        raise InvalidArgument("limit", f"{request.limit} is outside 0..{MAX_LIMIT}")
    modelrequests.json_options(request.json, "json")
    if request.options.formats:
        raise InvalidArgument("options.formats", "set by the extract (FORMAT_JSON): leave it empty")
    if request.options.HasField("json"):
        raise InvalidArgument("options.json", "the extract's schema and prompt are its json")
    limit = request.limit or DEFAULT_LIMIT
    found: list[str] = []
    for i, url in enumerate(request.urls):
        if not url.endswith("/*"):
            found.append(url)
            continue
        prefix = url[:-2] or url
        await validate.url(prefix, f"urls[{i}]", config)
        listed = await runtime.map(jobs_pb2.MapRequest(url=prefix, limit=limit), caller.name)
        found.extend(u for u in listed if _under(prefix, u))
    kept = list(dict.fromkeys(found))[:limit]
    options = jobs_pb2.ScrapeOptions()
    options.CopyFrom(request.options)
    options.formats.append(jobs_pb2.FORMAT_JSON)
    options.json.CopyFrom(request.json)
    return jobs_pb2.StartBatchScrapeRequest(
        urls=kept,
        options=options,
        idempotency_key=request.idempotency_key,
        ignore_invalid_urls=request.ignore_invalid_urls,
        extract=True,
    )


def get_extract(
    store: Store, meta: records.JobMeta, visible: int | None
) -> jobs_pb2.GetExtractResponse:
    spec = specs.stored(store, meta) if meta.kind == "batch" else None
    if not isinstance(spec, specs.BatchSpec) or not spec.request.extract:
        raise InvalidArgument("id", f"job {meta.id} is not an extract job (StartExtract)")
    order = {url: i for i, url in enumerate(spec.request.urls)}
    p = views.progress(store, meta, visible)
    docs = views.read_documents(store, meta.id, 0, MAX_LIMIT, visible)
    docs.sort(key=lambda d: order.get(d.url, len(order)))
    merged, sources = extractmerge.merge((d.url, json.loads(d.json)) for d in docs if d.json)
    resp = jobs_pb2.GetExtractResponse(
        id=meta.id,
        state=records.STATE_TO_PB[meta.state],
        data=json.dumps(merged, ensure_ascii=False, separators=(",", ":")),
        total=p.total,
        completed=p.completed,
        failed=p.failed,
        note=meta.note,
        model_usage=records.model_usage(store, meta.id),
        expires_at=records.timestamp(meta.expires_ms),
    )
    for key, urls in sources.items():
        resp.sources.append(jobs_pb2.ExtractSource(key=key, urls=urls))
    return resp
