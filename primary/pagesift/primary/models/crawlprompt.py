"""Crawl options from words: a crawl's ``prompt`` and PreviewCrawlParams (``crawl_options``).

What it owns
------------
``crawl_options(models, owner, url, prompt)``: one question to the model
(``prompts.crawl_messages``, answered under ``prompts.CRAWL_OPTIONS_SCHEMA``, asked
again at most ``model_retries`` times) and the answer as a ``StartCrawlRequest``
holding ``url`` and the options the model chose (``include_paths``,
``exclude_paths``, ``max_depth``, ``limit``, ``sitemap``, ``allow_subdomains``,
``crawl_entire_domain``), with the calls' ``ModelUsage``
(``pagesift.core.api.previews.merged`` lays a request's own fields over those).

Guarantee
---------
The model only proposes: what it returns is an ordinary request, validated by
``specs.crawl`` like any other before it runs (a regex RE2 refuses is the request's
INVALID_ARGUMENT, naming ``include_paths[i]``), and a stored crawl keeps the options,
never the words, so a resumed or failed-over crawl never asks the model again.
"""

from __future__ import annotations

from typing import Any

from pagesift.core.jobs.modelrequests import ModelUnanswered
from pagesift.primary.models import prompts
from pagesift.primary.models.answers import Invalid, judge
from pagesift.primary.models.endpoint import ModelEndpoint, ModelUnavailable
from pagesift.v1 import jobs_pb2

__all__ = ["CrawlPromptFailed", "crawl_options", "request_of"]

_SITEMAP = {
    "include": jobs_pb2.SITEMAP_MODE_INCLUDE,
    "skip": jobs_pb2.SITEMAP_MODE_SKIP,
    "only": jobs_pb2.SITEMAP_MODE_ONLY,
}
MAX_PATHS = 32


class CrawlPromptFailed(ModelUnanswered):
    """The model gave no usable crawl options (``code``: model_unavailable,
    invalid_answer); ``usage`` is what the calls took."""

    def __init__(self, code: str, message: str, usage: jobs_pb2.ModelUsage) -> None:
        super().__init__(code, message)
        self.usage = usage


def request_of(url: str, value: dict[str, Any]) -> jobs_pb2.StartCrawlRequest:
    """The model's valid answer as a crawl request for ``url``."""
    req = jobs_pb2.StartCrawlRequest(url=url)
    req.include_paths.extend(str(p) for p in value.get("includePaths", [])[:MAX_PATHS] if p)
    req.exclude_paths.extend(str(p) for p in value.get("excludePaths", [])[:MAX_PATHS] if p)
    req.max_depth = int(value.get("maxDepth", 0))
    req.limit = int(value.get("limit", 0))
    req.allow_subdomains = bool(value.get("allowSubdomains", False))
    req.crawl_entire_domain = bool(value.get("crawlEntireDomain", False))
    req.sitemap = _SITEMAP.get(str(value.get("sitemap", "")), jobs_pb2.SITEMAP_MODE_UNSPECIFIED)
    return req


async def crawl_options(
    endpoint: ModelEndpoint, owner: str, url: str, prompt: str
) -> tuple[jobs_pb2.StartCrawlRequest, jobs_pb2.ModelUsage]:
    usage = jobs_pb2.ModelUsage()
    asked = prompts.crawl_messages(url, prompt)
    messages = asked
    reason = ""
    for _ in range(1 + endpoint.settings.retries):
        try:
            answer = await endpoint.complete(
                owner, messages, schema=prompts.CRAWL_OPTIONS_SCHEMA, max_tokens=512
            )
        except ModelUnavailable as e:
            raise CrawlPromptFailed("model_unavailable", e.reason, usage) from None
        usage.calls += 1
        usage.input_tokens += answer.input_tokens
        usage.output_tokens += answer.output_tokens
        judged = judge(answer.text, prompts.CRAWL_OPTIONS_SCHEMA)
        if not isinstance(judged, Invalid):
            return request_of(url, judged), usage
        endpoint.count_invalid()
        reason = judged.reason
        messages = prompts.retry_messages(asked, answer.text, reason)
    raise CrawlPromptFailed(
        "invalid_answer", f"the model gave no valid crawl options: {reason}", usage
    )
