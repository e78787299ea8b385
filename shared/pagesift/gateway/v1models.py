"""The Firecrawl v1 request bodies the gateway accepts, as strict pydantic models.

What it owns
------------
One model per v1 request body (``ScrapeRequestV1``, ``CrawlRequestV1``,
``BatchScrapeRequestV1``, ``MapRequestV1``) and the v1 scrape options they share
(``ScrapeOptionsV1``), with the camelCase names of Firecrawl's
``apps/api/src/controllers/v1/types.ts`` as aliases of snake_case attributes.

Invariants
----------
- ``extra="forbid"`` everywhere: an unknown key is a 400 naming it, as Firecrawl's v1
  schemas (``.strict``) answer; a v2-only key (``sitemap``, ``parsers``...) is unknown here.
- Every v1 field is declared, those pagesift cannot honour with a neutral default, so
  that ``pagesift.gateway.v1translate`` refuses them by name (declared, never
  silently ignored); everything v1 shares with v2 is mapped through v2's models and
  ``pagesift.gateway.translate``, so both versions mean the same.
- Integers carry v2's bounds (``pagesift.gateway.models``: the proto field each lands
  in), or v1's tighter ones (``waitFor`` up to 60 s, map's ``limit`` up to 30,000), so
  re-validation as v2 never fails on a value v1 took; ``maxDepth`` (a regex, no proto
  field) is an int32 of the gateway's own.
- Defaults are Firecrawl v1's where they change behaviour (``onlyMainContent``,
  ``removeBase64Images``, ``deduplicateSimilarURLs``, ``parsePDF``, map's
  ``includeSubdomains``, ``ignoreQueryParameters`` and ``filterByPath`` true).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from pagesift.gateway.bounds import INT32_MAX, gateway_int, proto_int, proto_millis
from pagesift.gateway.models import (
    BatchConcurrency,
    CrawlConcurrency,
    CrawlLimit,
    DiscoveryDepth,
    MapTimeout,
    MaxAge,
    Timeout,
)

__all__ = [
    "BatchScrapeRequestV1",
    "CrawlRequestV1",
    "MapRequestV1",
    "ScrapeOptionsV1",
    "ScrapeRequestV1",
]


#: v2's bounds (pagesift.gateway.models), and v1's own where it has them
WaitForV1 = Annotated[int, proto_millis("WaitFor.duration", high=60000)]
PathDepth = Annotated[
    int, gateway_int(0, INT32_MAX, "an exclude regex of v1translate (no limit past 4096)")
]
MapLimitV1 = Annotated[int, proto_int("MapRequest.limit", low=1, high=30000)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False)


class ScrapeOptionsV1(Strict):
    """Firecrawl v1's scrape options (``baseScrapeOptions``): ``scrapeOptions`` of a
    crawl, the top level of a scrape or a batch scrape. Times are milliseconds."""

    formats: list[str] | None = None  # v1 formats are strings only
    headers: dict[str, str] | None = None
    include_tags: list[str] | None = Field(None, alias="includeTags")
    exclude_tags: list[str] | None = Field(None, alias="excludeTags")
    only_main_content: bool = Field(True, alias="onlyMainContent")
    timeout: Timeout | None = None
    wait_for: WaitForV1 = Field(0, alias="waitFor")
    mobile: bool = False
    skip_tls_verification: bool = Field(False, alias="skipTlsVerification")
    remove_base64_images: bool = Field(True, alias="removeBase64Images")
    block_ads: bool = Field(True, alias="blockAds")
    fast_mode: bool = Field(False, alias="fastMode")
    proxy: str | None = None
    max_age: MaxAge | None = Field(None, alias="maxAge")
    store_in_cache: bool = Field(True, alias="storeInCache")
    # mapped by v2's rules (refused there while v2 refuses them)
    actions: list[Any] | None = None
    location: Any = None
    change_tracking_options: Any = Field(None, alias="changeTrackingOptions")
    use_mock: str | None = Field(None, alias="useMock")
    # v1 only: geolocation is location when that is absent; __experimental_cache is
    # maxAge 4 h when that is absent (as Firecrawl's own v1 -> v2 conversion)
    geolocation: Any = None
    experimental_cache: bool = Field(False, alias="__experimental_cache")
    # v1 only: refused by name (v1translate.UNSUPPORTED_SCRAPE_V1)
    parse_pdf: bool = Field(True, alias="parsePDF")
    extract: Any = None
    json_options: Any = Field(None, alias="jsonOptions")
    search_preview_token: str | None = Field(None, alias="__searchPreviewToken")
    experimental_omce: bool = Field(False, alias="__experimental_omce")
    experimental_omce_domain: str | None = Field(None, alias="__experimental_omceDomain")


class _JobV1(Strict):
    zero_data_retention: bool | None = Field(None, alias="zeroDataRetention")
    integration: str | None = None  # the caller's own tag; no effect on the job
    origin: str | None = None  # the same (Firecrawl's analytics; the SDK sends it)


class ScrapeRequestV1(ScrapeOptionsV1, _JobV1):
    """``POST /v1/scrape``."""

    url: str = Field(min_length=1)
    agent: Any = None  # refused: needs an LLM


class BatchScrapeRequestV1(ScrapeOptionsV1, _JobV1):
    """``POST /v1/batch/scrape``: the scrape options at the top level, as in Firecrawl."""

    urls: list[str] = Field(min_length=1)
    ignore_invalid_urls: bool = Field(False, alias="ignoreInvalidURLs")
    max_concurrency: BatchConcurrency | None = Field(None, alias="maxConcurrency")
    webhook: Any = None  # a URL or {url, headers, metadata, events}
    append_to_id: str | None = Field(None, alias="appendToId")


class _CrawlerOptionsV1(Strict):
    """Firecrawl v1's ``crawlerOptions`` (a crawl's, and accepted by v1's map)."""

    include_paths: list[str] | None = Field(None, alias="includePaths")
    exclude_paths: list[str] | None = Field(None, alias="excludePaths")
    max_depth: PathDepth | None = Field(None, alias="maxDepth")  # path depth (segments)
    max_discovery_depth: DiscoveryDepth | None = Field(None, alias="maxDiscoveryDepth")
    allow_backward_links: bool | None = Field(None, alias="allowBackwardLinks")  # deprecated
    crawl_entire_domain: bool | None = Field(None, alias="crawlEntireDomain")
    allow_external_links: bool = Field(False, alias="allowExternalLinks")
    allow_subdomains: bool = Field(False, alias="allowSubdomains")
    ignore_robots_txt: bool = Field(False, alias="ignoreRobotsTxt")
    ignore_sitemap: bool = Field(False, alias="ignoreSitemap")
    deduplicate_similar_urls: bool = Field(True, alias="deduplicateSimilarURLs")
    regex_on_full_url: bool = Field(False, alias="regexOnFullURL")
    delay: float | None = Field(None, gt=0)  # seconds


class CrawlRequestV1(_CrawlerOptionsV1, _JobV1):
    """``POST /v1/crawl``."""

    url: str = Field(min_length=1)
    limit: CrawlLimit | None = None
    ignore_query_parameters: bool = Field(False, alias="ignoreQueryParameters")
    max_concurrency: CrawlConcurrency | None = Field(None, alias="maxConcurrency")
    scrape_options: ScrapeOptionsV1 | None = Field(None, alias="scrapeOptions")
    webhook: Any = None  # a URL or {url, headers, metadata, events}


class MapRequestV1(_CrawlerOptionsV1, _JobV1):
    """``POST /v1/map``: its own options and, as Firecrawl's v1 schema, the crawler
    options (``v1translate`` maps the paths and refuses the others when changed)."""

    url: str = Field(min_length=1)
    search: str | None = None
    include_subdomains: bool = Field(True, alias="includeSubdomains")
    ignore_query_parameters: bool = Field(True, alias="ignoreQueryParameters")
    sitemap_only: bool = Field(False, alias="sitemapOnly")
    limit: MapLimitV1 | None = None
    timeout: MapTimeout | None = None  # ms: the whole call's bound (408 past it)
    filter_by_path: bool = Field(True, alias="filterByPath")
    use_index: bool | None = Field(None, alias="useIndex")
    use_mock: str | None = Field(None, alias="useMock")
