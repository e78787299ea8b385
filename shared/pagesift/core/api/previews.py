"""A crawl described in words: ``StartCrawl``'s ``prompt`` and ``PreviewCrawlParams``.

What it owns
------------
- ``prompted_crawl``: a StartCrawl request with a ``prompt``, turned into the request
  that runs: the model's options (``JobRuntime.crawl_options``) under the request's own
  fields (``merged``: a field the caller set wins), the prompt cleared. The service then
  checks it with ``specs.crawl`` like any request and stores it as it runs, so the job
  never asks the model again (not on resume, not after a failover).
- ``preview``: the same options, checked by ``specs.crawl`` as StartCrawl would check
  them, returned without starting anything (Firecrawl's ``/v2/crawl/params-preview``).

Refusals: a prompt over its bound (INVALID_ARGUMENT naming ``prompt``), a server
without a model endpoint (INVALID_ARGUMENT), an account without ``allow_model``
(PERMISSION_DENIED), the day's model tokens spent (RESOURCE_EXHAUSTED), no usable
answer (UNAVAILABLE, ``MODEL_UNANSWERED``). Nothing here writes but the runtime's token
charge.
"""

from __future__ import annotations

from pagesift.core.api.ports import JobRuntime
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import modelrequests, specs, validate
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.specs import Permissions
from pagesift.v1 import jobs_pb2

__all__ = ["merged", "preview", "prompted_crawl"]

_CHOSEN = (
    "include_paths", "exclude_paths", "max_depth", "limit", "sitemap",
    "allow_subdomains", "crawl_entire_domain",
)  # fmt: skip


def merged(
    request: jobs_pb2.StartCrawlRequest, chosen: jobs_pb2.StartCrawlRequest
) -> jobs_pb2.StartCrawlRequest:
    """``request`` with the model's options where it set none itself, its prompt
    cleared (the stored request says what runs, not the words it came from)."""
    out = jobs_pb2.StartCrawlRequest()
    out.CopyFrom(request)
    for name in _CHOSEN:
        if name in ("include_paths", "exclude_paths"):
            if not getattr(request, name):
                getattr(out, name).extend(getattr(chosen, name))
        elif not getattr(request, name):
            setattr(out, name, getattr(chosen, name))
    out.prompt = ""
    return out


async def prompted_crawl(
    runtime: JobRuntime, caller: Account, request: jobs_pb2.StartCrawlRequest, config: ServerConfig
) -> jobs_pb2.StartCrawlRequest:
    modelrequests.crawl_prompt(request.prompt, config, caller)
    await validate.url(request.url, "url", config)
    chosen, _ = await runtime.crawl_options(request.url, request.prompt, caller.name)
    return merged(request, chosen)


async def preview(
    runtime: JobRuntime,
    caller: Permissions,
    request: jobs_pb2.PreviewCrawlParamsRequest,
    config: ServerConfig,
    renders: bool,
) -> jobs_pb2.PreviewCrawlParamsResponse:
    modelrequests.check_prompt(request.prompt, "prompt", required=True)
    modelrequests.crawl_prompt(request.prompt, config, caller.account)
    await validate.url(request.url, "url", config)
    chosen, usage = await runtime.crawl_options(request.url, request.prompt, caller.account.name)
    await specs.crawl(chosen, caller, config, renders=renders)  # as StartCrawl would check it
    return jobs_pb2.PreviewCrawlParamsResponse(request=chosen, model_usage=usage)
