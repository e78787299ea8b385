"""Pure translation of Firecrawl's v1 request bodies, through v2's, onto JobService.

What it owns
------------
``scrape_request``, ``crawl_request``, ``batch_request``, ``map_arguments``: a validated
v1 body (``pagesift.gateway.v1models``) -> the v2 model it means
(``pagesift.gateway.models``) -> v2's mapping (``pagesift.gateway.translate``), so an
option means the same in both versions and is refused for the same reason. What v1
spells differently is translated here: string formats (``screenshot@fullPage``),
``ignoreSitemap``/``sitemapOnly`` (v2's ``sitemap``), ``allowBackwardLinks``
(``crawlEntireDomain``), a webhook given as a URL, ``maxDepth`` and map's
``filterByPath`` (below). Answers are v2's (``translate``): v1 shares the shapes.

Invariants
----------
- No I/O, no clock (tests/test_gateway_v1.py holds the tables).
- Never silently ignored: a v1-only field pagesift cannot honour is a 400 naming it
  (``UNSUPPORTED_SCRAPE_V1``, ``MAP_CRAWLER_OPTIONS``); the rest is v2's rule. A URL
  this module must split itself (map's path filter, ``maxDepth``) and cannot is a 400
  naming ``url``.
- ``maxDepth`` is Firecrawl v1's path depth: a URL is skipped when its path has more
  than maxDepth + (the start URL's) segments, empty, ``index.php`` and ``index.html``
  segments not counted (Firecrawl's ``getURLDepth``). It becomes one exclude regex
  (``path_depth_regex``, RE2 syntax, no lookaround), exact over the path (plus
  ``?query``) and over the whole URL (``regexOnFullURL``) alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pydantic

from pagesift.gateway import options, structured, translate
from pagesift.gateway.httperrors import HttpError
from pagesift.gateway.models import BatchScrapeRequest, CrawlRequest, MapRequest, ScrapeRequest
from pagesift.gateway.translate import path_prefix_regex
from pagesift.gateway.v1models import (
    BatchScrapeRequestV1,
    CrawlRequestV1,
    MapRequestV1,
    ScrapeOptionsV1,
    ScrapeRequestV1,
)
from pagesift.v1 import jobs_pb2

__all__ = [
    "FORMATS_V1",
    "MAP_CRAWLER_OPTIONS",
    "UNSUPPORTED_SCRAPE_V1",
    "batch_request",
    "crawl_request",
    "map_arguments",
    "path_depth",
    "path_depth_regex",
    "path_prefix_regex",
    "scrape_request",
]

M = TypeVar("M", bound=pydantic.BaseModel)

#: Firecrawl v1's format names (a string each); v2's rules then map or refuse them
FORMATS_V1 = frozenset(
    {"markdown", "html", "rawHtml", "links", "screenshot", "screenshot@fullPage", "extract",
     "json", "summary", "changeTracking"}
)  # fmt: skip

#: v1-only scrape option attribute -> (Firecrawl name, why it is refused when changed
#: from its default)
UNSUPPORTED_SCRAPE_V1: dict[str, tuple[str, str]] = {
    "parse_pdf": ("parsePDF", "pagesift always extracts a PDF's text"),
    "search_preview_token": ("__searchPreviewToken", "a Firecrawl-internal flag"),
    "experimental_omce": ("__experimental_omce", "a Firecrawl-internal flag"),
    "experimental_omce_domain": ("__experimental_omceDomain", "a Firecrawl-internal flag"),
}

_MAP_WHY = "Firecrawl's map does not apply it; pagesift's Map has no such option"
#: crawler options v1's map accepts -> (Firecrawl name, why refused when changed)
MAP_CRAWLER_OPTIONS: dict[str, tuple[str, str]] = {
    "max_depth": ("maxDepth", _MAP_WHY),
    "max_discovery_depth": ("maxDiscoveryDepth", _MAP_WHY),
    "allow_backward_links": ("allowBackwardLinks", _MAP_WHY),
    "crawl_entire_domain": ("crawlEntireDomain", _MAP_WHY),
    "allow_external_links": ("allowExternalLinks", "pagesift's Map lists one site"),
    "allow_subdomains": ("allowSubdomains", "map's own option is includeSubdomains"),
    "ignore_robots_txt": ("ignoreRobotsTxt", "pagesift's Map always honours robots.txt"),
    "deduplicate_similar_urls": ("deduplicateSimilarURLs", _MAP_WHY),
    "regex_on_full_url": ("regexOnFullURL", "pagesift's Map matches paths only"),
    "delay": ("delay", _MAP_WHY),
    "use_mock": ("useMock", "pagesift has no mock responses"),
}

#: the most path segments maxDepth may count to (RE2's program for the depth regex
#: grows with it; 100 fits the node's default regex memory budget of 1 MiB)
MAX_PATH_SEGMENTS = 100
#: a path-depth limit past this is no limit: a URL has at most max_url_length
#: characters (8,192 on a node by default), two per counted segment ("/x")
VACUOUS_SEGMENTS = 8192 // 2

_NOT_COUNTED = ("index.php", "index.html")  # Firecrawl's getURLDepth skips them
_SEG = "/?#"


def _refuse(field: str, why: str) -> HttpError:
    return options.refuse(field, why)


def _refuse_changed(
    model: pydantic.BaseModel, table: Mapping[str, tuple[str, str]], prefix: str
) -> None:
    fields = type(model).model_fields
    for attr, (name, why) in table.items():
        if getattr(model, attr) != fields[attr].default:
            raise _refuse(prefix + name, why)


def _v2(model: type[M], data: dict[str, Any]) -> M:
    """``data`` (v2's camelCase keys) as the v2 model; v1 bounds are v2's or tighter,
    so a failure names a field the caller sent."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        e = err.errors()[0]
        path = ".".join(str(p) for p in e["loc"])
        raise _refuse(path, e["msg"]) from None


def _formats(formats: list[str], prefix: str) -> list[Any]:
    out: list[Any] = []
    for i, name in enumerate(formats):
        if name not in FORMATS_V1:
            raise _refuse(f"{prefix}formats[{i}]", f"{name!r} is not a Firecrawl v1 format")
        out.append(
            {"type": "screenshot", "fullPage": True} if name == "screenshot@fullPage" else name
        )
    if "screenshot" in formats and "screenshot@fullPage" in formats:
        raise _refuse(
            f"{prefix}formats", "You may only specify either screenshot or screenshot@fullPage"
        )
    return out


_V1_ONLY = frozenset(
    {*UNSUPPORTED_SCRAPE_V1, "geolocation", "experimental_cache", "extract", "json_options"}
)
EXPERIMENTAL_CACHE_MS = 4 * 60 * 60 * 1000  # v1's __experimental_cache: maxAge 4 hours
_SCRAPE_KEYS = frozenset(ScrapeOptionsV1.model_fields) - _V1_ONLY


def _options(o: ScrapeOptionsV1, prefix: str = "") -> dict[str, Any]:
    """v1 scrape options -> v2's (camelCase keys; only those the caller sent, so v2's
    defaults, which are v1's, apply; but for ``skipTlsVerification``, whose v1 default
    is false where v2's is true)."""
    _refuse_changed(o, UNSUPPORTED_SCRAPE_V1, prefix)
    data = o.model_dump(by_alias=True, exclude_unset=True, include=set(_SCRAPE_KEYS))
    data.setdefault("skipTlsVerification", o.skip_tls_verification)  # v1's default: false
    if o.location is None and o.geolocation is not None:
        data["location"] = o.geolocation  # v1's deprecated spelling, as Firecrawl reads it
    if o.experimental_cache and o.max_age is None:
        data["maxAge"] = EXPERIMENTAL_CACHE_MS  # as Firecrawl's v1 -> v2 conversion
    formats = _formats(o.formats or [], prefix)  # json/extract: their options (structured)
    formats = structured.v1_formats(formats, o.extract, o.json_options, prefix)
    if o.formats is not None:
        data["formats"] = formats
    return data


def _job(r: Any) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if r.zero_data_retention is not None:
        data["zeroDataRetention"] = r.zero_data_retention
    if r.integration is not None:
        data["integration"] = r.integration
    if r.origin is not None:
        data["origin"] = r.origin
    return data


def _webhook(value: Any) -> Any:
    return {"url": value} if isinstance(value, str) else value  # v1 takes a bare URL


def scrape_request(r: ScrapeRequestV1) -> tuple[ScrapeRequest, jobs_pb2.ScrapeOptions]:
    """``POST /v1/scrape``'s body -> v2's body (its ``timeout`` bounds the call) and the
    ``ScrapeOptions`` of a Scrape of its url."""
    if r.agent is not None:
        raise _refuse("agent", "needs an LLM; pagesift runs none")
    v2 = _v2(ScrapeRequest, {**_options(r), **_job(r), "url": r.url})
    return v2, translate.scrape_request(v2)


def batch_request(r: BatchScrapeRequestV1) -> jobs_pb2.StartBatchScrapeRequest:
    """``POST /v1/batch/scrape``'s body -> ``StartBatchScrapeRequest``."""
    data = {**_options(r), **_job(r), "urls": r.urls, "ignoreInvalidURLs": r.ignore_invalid_urls}
    if r.max_concurrency is not None:
        data["maxConcurrency"] = r.max_concurrency
    if r.webhook is not None:
        data["webhook"] = _webhook(r.webhook)
    if r.append_to_id is not None:
        data["appendToId"] = r.append_to_id
    return translate.batch_request(_v2(BatchScrapeRequest, data))


# ---------------------------------------------------------------- path depth


def _path(url: str) -> str:
    """The path of ``url`` (one without scheme read as ``http://``, as v1 does); a URL
    that cannot be split (``http://[x/``: an unclosed IPv6 bracket) is a 400 naming url."""
    try:
        return urlsplit(url if "://" in url else "http://" + url).path
    except ValueError as exc:
        raise _refuse("url", f"not a URL: {exc}") from None


def path_depth(url: str) -> int:
    """Firecrawl's ``getURLDepth``: the path's segments, empty ones and ``index.php``/
    ``index.html`` not counted (a URL without scheme read as ``http://``, as v1 does)."""
    path = _path(url)
    return sum(1 for s in path.split("/") if s and s not in _NOT_COUNTED)


def _other_segment(words: frozenset[str]) -> str:
    """RE2 regex of one non-empty path segment that is none of ``words`` (RE2 has no
    lookahead: a trie of the words, each branch leaving it at its first difference)."""

    def node(prefix: str) -> str:
        nexts = sorted({w[len(prefix)] for w in words if w.startswith(prefix) and w != prefix})
        alts = [""] if prefix and prefix not in words else []  # the segment ends here
        if prefix in words:
            alts.append(f"[^{_SEG}]+")  # longer than the word
        else:
            alts.append(f"[^{_SEG}{''.join(re.escape(c) for c in nexts)}][^{_SEG}]*")
        alts += [re.escape(c) + node(prefix + c) for c in nexts]
        return "(?:" + "|".join(alts) + ")"

    return node("")


_COUNTED = _other_segment(frozenset(_NOT_COUNTED))
_SKIPPED = "(?:" + "|".join(re.escape(w) for w in _NOT_COUNTED) + ")"


def path_depth_regex(segments: int) -> str:
    """RE2 regex matching a URL path (plus ``?query``), or a whole URL, with at least
    ``segments`` counted segments (as ``path_depth`` counts them)."""
    return (
        f"^(?:[a-zA-Z][a-zA-Z0-9+.-]*://[^{_SEG}]*)?"
        f"(?:/+(?:{_SKIPPED}/+)*{_COUNTED}){{{segments}}}(?:[/?]|$)"
    )


def _max_depth_exclude(url: str, max_depth: int) -> list[str]:
    start = path_depth(url)
    if start > max_depth:  # Firecrawl v1's own check
        raise _refuse("url", "URL depth exceeds the specified maxDepth")
    segments = max_depth + start + 1  # the first depth Firecrawl skips
    if segments > VACUOUS_SEGMENTS:
        return []
    if segments > MAX_PATH_SEGMENTS:
        why = (
            f"pagesift limits path depth to at most {MAX_PATH_SEGMENTS - 1} segments "
            f"(this start URL has {start}); leave maxDepth out for no path-depth limit"
        )
        raise _refuse("maxDepth", why)
    return [path_depth_regex(segments)]


# ---------------------------------------------------------------- crawl and map


def crawl_request(r: CrawlRequestV1) -> jobs_pb2.StartCrawlRequest:
    """``POST /v1/crawl``'s body -> ``StartCrawlRequest``."""
    exclude = list(r.exclude_paths or ())
    if r.max_depth is not None:
        exclude += _max_depth_exclude(r.url, r.max_depth)
    entire = r.crawl_entire_domain
    if entire is None:
        entire = bool(r.allow_backward_links)  # deprecated v1 spelling
    data: dict[str, Any] = {
        **_job(r),
        "url": r.url,
        "excludePaths": exclude,
        "sitemap": "skip" if r.ignore_sitemap else "include",
        "crawlEntireDomain": entire,
        "allowExternalLinks": r.allow_external_links,
        "allowSubdomains": r.allow_subdomains,
        "ignoreRobotsTxt": r.ignore_robots_txt,
        "deduplicateSimilarURLs": r.deduplicate_similar_urls,
        "ignoreQueryParameters": r.ignore_query_parameters,
        "regexOnFullURL": r.regex_on_full_url,
    }
    optional = {
        "includePaths": r.include_paths,
        "maxDiscoveryDepth": r.max_discovery_depth,
        "limit": r.limit,
        "delay": r.delay,
        "maxConcurrency": r.max_concurrency,
        "webhook": None if r.webhook is None else _webhook(r.webhook),
    }
    data.update({k: v for k, v in optional.items() if v is not None})
    if r.scrape_options is not None:
        data["scrapeOptions"] = _options(r.scrape_options, "scrapeOptions.")
    return translate.crawl_request(_v2(CrawlRequest, data))


def map_arguments(r: MapRequestV1) -> tuple[MapRequest, dict[str, Any]]:
    """``POST /v1/map``'s body -> v2's body (its ``timeout`` bounds the call) and
    ``JobClient.map``'s keyword arguments. ``filterByPath`` (v1's default) keeps the
    URLs whose path starts with the start URL's, when that is not the root."""
    _refuse_changed(r, MAP_CRAWLER_OPTIONS, "")
    sitemap = "only" if r.sitemap_only else "skip" if r.ignore_sitemap else "include"
    data: dict[str, Any] = {
        **_job(r),
        "url": r.url,
        "includeSubdomains": r.include_subdomains,
        "ignoreQueryParameters": r.ignore_query_parameters,
        "sitemap": sitemap,
        "filterByPath": False,  # v1's own path filter, below (v2's is the same rule)
    }
    optional = {"search": r.search, "limit": r.limit, "timeout": r.timeout, "useIndex": r.use_index}
    data.update({k: v for k, v in optional.items() if v is not None})
    v2 = _v2(MapRequest, data)
    args = translate.map_arguments(v2)
    include = list(r.include_paths or ())
    start = _path(r.url)
    if r.filter_by_path and start not in ("", "/"):
        if include:
            why = (
                "cannot be combined with filterByPath (the default) below the site root; "
                "send filterByPath: false to list by includePaths alone"
            )
            raise _refuse("includePaths", why)
        include = [path_prefix_regex(start)]
    args["include_paths"] = include
    args["exclude_paths"] = list(r.exclude_paths or ())
    return v2, args
