"""The Firecrawl v2 request bodies the gateway accepts, as strict pydantic models.

What it owns
------------
One model per request body (``ScrapeRequest``, ``CrawlRequest``, ``BatchScrapeRequest``,
``MapRequest``, ``CrawlParamsPreviewRequest``) and the scrape options they share
(``ScrapeOptions``), with Firecrawl's
camelCase field names (as its ``apps/api/src/controllers/v2/types.ts`` spells them) as
aliases of snake_case attributes.

Invariants
----------
- ``extra="forbid"`` everywhere: an unknown key is a validation error naming it (the
  app answers 400), as Firecrawl's strict schemas do.
- Every field Firecrawl defines that pagesift cannot honour (yet) is declared here with
  a neutral default, so that ``pagesift.gateway.translate`` refuses it by name with a
  400 saying so instead of it being dropped: declared, never silently ignored.
- Defaults are Firecrawl's where they change behaviour (``onlyMainContent`` and
  ``removeBase64Images`` true, ``deduplicateSimilarURLs`` true, map's ``filterByPath``
  true; ``skipTlsVerification`` absent is Firecrawl's rule, ``translate.skips_tls``).
  Not a batch's ``ignoreInvalidURLs`` (Firecrawl's true): false, so a URL the address
  guard refuses is a 403, never skipped unasked (docs/gateway.md).
- Every integer is ``Annotated[int, Bound]`` (``pagesift.gateway.bounds``): at most what
  the proto field it lands in holds (int32 counts; times in ms of a Duration), so a
  value the model accepts never makes building the request raise; the few no proto
  field carries (``minAge``, map's ``timeout``) have a bound of the gateway's own.
  tests/test_gateway_input_bounds.py walks every field of every request model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from pagesift.gateway.bounds import DURATION_MAX_MS, gateway_int, proto_int, proto_millis
from pagesift.gateway.optionmodels import (
    Action,
    ChangeTrackingOptions,
    Location,
    Parser,
    Quality,
    Viewport,
)

__all__ = [
    "MAP_MAX_LIMIT",
    "BatchScrapeRequest",
    "CrawlParamsPreviewRequest",
    "CrawlRequest",
    "FormatObject",
    "MapRequest",
    "ScrapeOptions",
    "ScrapeRequest",
    "Viewport",
    "WebhookOptions",
]

Sitemap = Literal["skip", "include", "only"]

# Every integer is bounded by the proto field it lands in (pagesift.gateway.bounds):
# times are milliseconds of a google.protobuf.Duration, counts the int32 of their field
Timeout = Annotated[int, proto_millis("ScrapeOptions.timeout", low=1)]
WaitFor = Annotated[int, proto_millis("WaitFor.duration")]
MaxAge = Annotated[int, proto_millis("ScrapeOptions.max_age")]
MinAge = Annotated[
    int, gateway_int(0, DURATION_MAX_MS, "refused by name (translate.UNSUPPORTED_SCRAPE)")
]
BatchConcurrency = Annotated[
    int,
    proto_int(
        "StartBatchScrapeRequest.max_concurrency", "AppendBatchScrapeRequest.max_concurrency", low=1
    ),
]
CrawlConcurrency = Annotated[int, proto_int("StartCrawlRequest.max_concurrency", low=1)]
CrawlLimit = Annotated[int, proto_int("StartCrawlRequest.limit", low=1)]
DiscoveryDepth = Annotated[int, proto_int("StartCrawlRequest.max_depth")]
MAP_MAX_LIMIT = 30_000  # Firecrawl's map schema: limit at most 30,000 (a 400 past it)
MapLimit = Annotated[int, proto_int("MapRequest.limit", low=1, high=MAP_MAX_LIMIT)]
MapTimeout = Annotated[
    int, gateway_int(1, DURATION_MAX_MS, "bounds the Map call in the gateway (within)")
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False)


class FormatObject(Strict):
    """A format given as an object: ``{"type": "screenshot", "fullPage": true}``,
    ``{"type": "changeTracking", "modes": ["git-diff"]}``; the keys of the screenshot and
    change-tracking formats are declared (a key of another format is refused by name)."""

    type: str
    full_page: bool = Field(False, alias="fullPage")
    quality: Quality | None = None
    viewport: Viewport | None = None
    # changeTracking's (prompt and schema are also json's: gateway.structured)
    modes: list[Literal["git-diff", "json"]] | None = None
    prompt: str | None = None
    schema_: Any = Field(None, alias="schema")
    tag: str | None = None
    # the json format's systemPrompt (pagesift's), the attributes format's selectors
    system_prompt: str | None = Field(None, alias="systemPrompt", max_length=10_000)
    selectors: list[dict[str, Any]] | None = Field(None, max_length=100)


class ScrapeOptions(Strict):
    """Firecrawl's scrape options (``scrapeOptions`` of a crawl, the top level of a scrape
    or a batch scrape). Times are milliseconds, as in Firecrawl."""

    formats: list[str | FormatObject] | None = None
    headers: dict[str, str] | None = None
    include_tags: list[str] | None = Field(None, alias="includeTags")
    exclude_tags: list[str] | None = Field(None, alias="excludeTags")
    only_main_content: bool = Field(True, alias="onlyMainContent")
    timeout: Timeout | None = None
    wait_for: WaitFor = Field(0, alias="waitFor")
    mobile: bool = False
    # absent: Firecrawl's default (true, false with headers or actions: translate.skips_tls)
    skip_tls_verification: bool | None = Field(None, alias="skipTlsVerification")
    remove_base64_images: bool = Field(True, alias="removeBase64Images")
    max_age: MaxAge | None = Field(None, alias="maxAge")
    store_in_cache: bool = Field(True, alias="storeInCache")
    # accepted at any value: pagesift fetches no ad resources it could block
    block_ads: bool = Field(True, alias="blockAds")
    fast_mode: bool = Field(False, alias="fastMode")
    proxy: str | None = None
    actions: list[Action] | None = Field(None, max_length=50)
    location: Location | None = None
    parsers: list[Parser] | None = None
    change_tracking_options: ChangeTrackingOptions | None = Field(
        None, alias="changeTrackingOptions"
    )
    # declared so that they are refused by name (translate.UNSUPPORTED_SCRAPE)
    min_age: MinAge | None = Field(None, alias="minAge")
    use_mock: str | None = Field(None, alias="useMock")
    redact_pii: Any = Field(None, alias="redactPII")
    check_prompt_injection: bool | None = Field(None, alias="checkPromptInjection")
    threat_protection: Any = Field(None, alias="threatProtection")
    audit_metadata: Any = Field(None, alias="auditMetadata")
    only_clean_content: bool = Field(False, alias="onlyCleanContent")
    lockdown: bool = False
    profile: Any = None
    safe_mode: bool | None = Field(None, alias="safeMode")
    # the caller's tags: the SDKs' scrape options carry them too (no effect)
    integration: str | None = None
    origin: str | None = None
    domain_tools: bool | None = Field(None, alias="domainTools")  # the SDKs' (Alexandria)
    tool_detail: str | None = Field(None, alias="toolDetail")
    search_preview_token: str | None = Field(None, alias="__searchPreviewToken")
    experimental_omce_domain: str | None = Field(None, alias="__experimental_omceDomain")
    # Firecrawl-internal experiments of its own engines: accepted at any value, no effect
    experimental_omce: bool | None = Field(None, alias="__experimental_omce")
    experimental_engpicker: bool | None = Field(None, alias="__experimental_engpicker")
    force_fire_pdf: bool | None = Field(None, alias="__forceFirePDF")


class WebhookOptions(Strict):
    """Firecrawl's ``webhook`` option of a crawl or a batch scrape (a bare URL string is
    ``{"url": ...}``, as Firecrawl's schema preprocesses it); ``events`` are Firecrawl's
    names, none = all four."""

    url: str = Field(min_length=1)
    headers: dict[str, str] | None = None
    metadata: dict[str, str] | None = None
    events: list[Literal["completed", "failed", "page", "started"]] | None = None


def _webhook_url(value: Any) -> Any:
    return {"url": value} if isinstance(value, str) else value


def _url_or_object(schema: dict[str, Any]) -> None:
    """The JSON Schema says what the validator takes: the URL alone, or the object."""
    schema["anyOf"] = [{"type": "string", "description": "the URL alone"}, *schema["anyOf"]]


Webhook = Annotated[
    WebhookOptions | None,
    BeforeValidator(_webhook_url),
    Field(json_schema_extra=_url_or_object),
]


class _Job(Strict):
    zero_data_retention: bool = Field(False, alias="zeroDataRetention")
    integration: str | None = None  # the caller's own tag; no effect on the job
    origin: str | None = None  # the same (Firecrawl's analytics)


class ScrapeRequest(ScrapeOptions, _Job):
    """``POST /v2/scrape``."""

    url: str = Field(min_length=1)
    agent_interop: Any = Field(None, alias="__agentInterop")  # refused (Firecrawl-internal)


class BatchScrapeRequest(ScrapeOptions, _Job):
    """``POST /v2/batch/scrape``: the scrape options at the top level, as in Firecrawl."""

    urls: list[str] = Field(min_length=1)
    ignore_invalid_urls: bool = Field(False, alias="ignoreInvalidURLs")
    max_concurrency: BatchConcurrency | None = Field(None, alias="maxConcurrency")
    webhook: Webhook = None
    append_to_id: str | None = Field(None, alias="appendToId")
    agent_interop: Any = Field(None, alias="__agentInterop")  # refused (Firecrawl-internal)


class CrawlRequest(_Job):
    """``POST /v2/crawl``."""

    url: str = Field(min_length=1)
    include_paths: list[str] | None = Field(None, alias="includePaths")
    exclude_paths: list[str] | None = Field(None, alias="excludePaths")
    max_discovery_depth: DiscoveryDepth | None = Field(None, alias="maxDiscoveryDepth")
    sitemap: Sitemap = "include"
    ignore_query_parameters: bool = Field(False, alias="ignoreQueryParameters")
    limit: CrawlLimit | None = None
    crawl_entire_domain: bool = Field(False, alias="crawlEntireDomain")
    allow_external_links: bool = Field(False, alias="allowExternalLinks")
    allow_subdomains: bool = Field(False, alias="allowSubdomains")
    ignore_robots_txt: bool = Field(False, alias="ignoreRobotsTxt")
    delay: float | None = Field(None, ge=0)
    max_concurrency: CrawlConcurrency | None = Field(None, alias="maxConcurrency")
    deduplicate_similar_urls: bool = Field(True, alias="deduplicateSimilarURLs")
    regex_on_full_url: bool = Field(False, alias="regexOnFullURL")
    scrape_options: ScrapeOptions | None = Field(None, alias="scrapeOptions")
    webhook: Webhook = None
    prompt: str | None = Field(None, max_length=10_000)  # StartCrawlRequest.prompt
    # declared so that it is refused by name (translate.UNSUPPORTED_CRAWL)
    robots_user_agent: str | None = Field(None, alias="robotsUserAgent")


class MapRequest(_Job):
    """``POST /v2/map``."""

    url: str = Field(min_length=1)
    search: str | None = None
    include_paths: list[str] | None = Field(None, alias="includePaths")
    exclude_paths: list[str] | None = Field(None, alias="excludePaths")
    include_subdomains: bool = Field(True, alias="includeSubdomains")
    ignore_query_parameters: bool = Field(True, alias="ignoreQueryParameters")
    limit: MapLimit | None = None
    sitemap: Sitemap = "include"
    timeout: MapTimeout | None = None  # ms: the whole call's bound (408 past it)
    filter_by_path: bool = Field(True, alias="filterByPath")  # Firecrawl's path filter
    # accepted, no effect (docs/gateway.md): pagesift's Map walks the whole origin to its
    # own depth, reads the live site, and has no mock responses
    max_discovery_depth: DiscoveryDepth | None = Field(None, alias="maxDiscoveryDepth")
    crawl_entire_domain: bool | None = Field(None, alias="crawlEntireDomain")
    ignore_cache: bool = Field(False, alias="ignoreCache")
    use_mock: str | None = Field(None, alias="useMock")
    # declared so that they are refused by name (translate.UNSUPPORTED_MAP)
    location: Any = None
    headers: dict[str, str] | None = None
    use_index: bool | None = Field(None, alias="useIndex")
    threat_protection: Any = Field(None, alias="threatProtection")
    audit_metadata: Any = Field(None, alias="auditMetadata")
    allow_external_links: bool = Field(False, alias="allowExternalLinks")
    allow_subdomains: bool = Field(False, alias="allowSubdomains")
    ignore_robots_txt: bool = Field(False, alias="ignoreRobotsTxt")
    robots_user_agent: str | None = Field(None, alias="robotsUserAgent")
    # Firecrawl's default true; false is refused (translate.MAP_ACCEPTS)
    deduplicate_similar_urls: bool | None = Field(None, alias="deduplicateSimilarURLs")
    regex_on_full_url: bool = Field(False, alias="regexOnFullURL")
    delay: float | None = Field(None, ge=0)


class CrawlParamsPreviewRequest(Strict):
    """``POST /v2/crawl/params-preview``: the crawl options ``prompt`` describes for a
    crawl of ``url`` (``origin`` and ``integration``: the caller's tags, as on every body)."""

    url: str = Field(min_length=1)
    prompt: str = Field(min_length=1, max_length=10_000)
    origin: str | None = None
    integration: str | None = None
