"""Pure translation between Firecrawl's v2 shapes and JobService's messages.

What it owns
------------
Requests: a validated Firecrawl body (``pagesift.gateway.models``) -> the proto request
(``scrape_options``, ``crawl_request``, ``batch_request``, ``map_arguments``), and back:
a ``StartCrawlRequest`` -> Firecrawl's crawl options (``crawl_options``, the answer of
``/v2/crawl/params-preview``).
Answers (documents in ``pagesift.core.jobs.firecrawlshape``'s shape, re-exported here): a
``GetJobResponse`` page -> Firecrawl's status body with ``next`` (``status_page``), a
``GetJobErrorsResponse`` -> Firecrawl's errors body (``errors_body``).

Invariants
----------
- No I/O, no clock: every function maps its arguments only (tests/test_gateway_translate.py).
- Nothing is dropped silently: an option pagesift cannot honour, or that the gateway
  does not map yet, raises ``HttpError`` 400 naming its Firecrawl field path
  (``scrapeOptions.actions``, ``formats[1]``).
- ``status_page`` keeps a page's JSON under ``max_bytes`` (at least one document per
  page, so paging always advances) and points ``next`` at the first document left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import duration_pb2

from pagesift.core.jobs.firecrawlshape import STATES, metadata
from pagesift.gateway import options, structured
from pagesift.gateway.httperrors import HttpError
from pagesift.gateway.models import (
    BatchScrapeRequest,
    CrawlRequest,
    FormatObject,
    MapRequest,
    ScrapeOptions,
    ScrapeRequest,
    WebhookOptions,
    _Job,
)
from pagesift.gateway.structured import document
from pagesift.v1 import jobs_pb2

__all__ = [
    "FORMATS",
    "STATES",
    "append_arguments",
    "batch_request",
    "crawl_options",
    "crawl_request",
    "document",
    "error_status_document",
    "errors_body",
    "map_arguments",
    "metadata",
    "path_prefix_regex",
    "scrape_options",
    "scrape_request",
    "skips_tls",
    "status_page",
    "webhook",
]

#: Firecrawl format name -> pagesift Format (every other name is refused)
FORMATS: dict[str, jobs_pb2.Format.ValueType] = {
    "markdown": jobs_pb2.FORMAT_MARKDOWN,
    "html": jobs_pb2.FORMAT_HTML,
    "rawHtml": jobs_pb2.FORMAT_RAW_HTML,
    "links": jobs_pb2.FORMAT_LINKS,
    "images": jobs_pb2.FORMAT_IMAGES,
    "screenshot": jobs_pb2.FORMAT_SCREENSHOT,
    "changeTracking": jobs_pb2.FORMAT_CHANGE_TRACKING,
    **structured.FORMATS,  # json, summary, attributes, selectors: structured.format_object
}
_LLM = "an LLM format pagesift does not offer (its model formats are json and summary)"
#: Firecrawl's other format names -> why pagesift refuses them (an unknown name too)
UNSUPPORTED_FORMATS: dict[str, str] = {
    "question": _LLM,
    "highlights": _LLM,
    "query": _LLM,
    "branding": _LLM,
    "product": _LLM,
    "menu": _LLM,
    "deterministicJson": "runs generated extractors in Firecrawl's code sandbox; pagesift has none",
    "rawBase64": "pagesift keeps a page as text (rawHtml), not its raw bytes",
    "audio": "pagesift downloads no media",
    "video": "pagesift downloads no media",
}

_SITEMAP = {
    "include": jobs_pb2.SITEMAP_MODE_INCLUDE,
    "skip": jobs_pb2.SITEMAP_MODE_SKIP,
    "only": jobs_pb2.SITEMAP_MODE_ONLY,
}

#: scrape option attribute -> (Firecrawl name, why it is refused when set)
UNSUPPORTED_SCRAPE: dict[str, tuple[str, str]] = {
    "fast_mode": ("fastMode", "pagesift has no fast mode"),
    "min_age": (
        "minAge",
        "pagesift has no cache-only read: a copy older than maxAge is revalidated or fetched",
    ),
    "use_mock": ("useMock", "pagesift has no mock responses"),
    "redact_pii": ("redactPII", "pagesift does not redact documents"),
    "check_prompt_injection": ("checkPromptInjection", "the model formats check no injection"),
    "threat_protection": ("threatProtection", "pagesift's address guard is not configurable"),
    "audit_metadata": ("auditMetadata", "pagesift keeps no audit log per request"),
    "only_clean_content": (
        "onlyCleanContent",
        "pagesift has no content cleaner beyond onlyMainContent and include/excludeTags",
    ),
    "lockdown": (
        "lockdown",
        "pagesift has no cache-only mode: a page is fetched unless a maxAge copy is fresh",
    ),
    "profile": (
        "profile",
        "pagesift keeps no browser profile across jobs: each job gets a fresh context",
    ),
    "safe_mode": (
        "safeMode",
        "pagesift has no safe mode to choose: its address guard and robots.txt rules apply "
        "to every request",
    ),
    "domain_tools": ("domainTools", "pagesift has no domain tools (Firecrawl's Alexandria)"),
    "tool_detail": ("toolDetail", "pagesift has no domain tools (Firecrawl's Alexandria)"),
    "search_preview_token": ("__searchPreviewToken", "a Firecrawl-internal flag"),
    "experimental_omce_domain": ("__experimental_omceDomain", "a Firecrawl-internal flag"),
}
_INTERNAL = ("__agentInterop", "Firecrawl-internal: its agents' own calls")
UNSUPPORTED_SCRAPE_REQUEST: dict[str, tuple[str, str]] = {"agent_interop": _INTERNAL}
UNSUPPORTED_CRAWL: dict[str, tuple[str, str]] = {
    "robots_user_agent": (
        "robotsUserAgent",
        "pagesift matches robots.txt with the job's own User-Agent (a User-Agent header), "
        "not a separate agent",
    ),
}
UNSUPPORTED_BATCH: dict[str, tuple[str, str]] = {"agent_interop": _INTERNAL}
_MAP_WHY = "Firecrawl's map does not apply it; pagesift's Map has no such option"
UNSUPPORTED_MAP: dict[str, tuple[str, str]] = {
    "location": ("location", "pagesift's map sends no request options (headers, locale)"),
    "headers": ("headers", "pagesift's map sends no request options (headers, locale)"),
    "use_index": ("useIndex", "pagesift keeps no index of other accounts' pages"),
    "threat_protection": ("threatProtection", "pagesift's address guard is not configurable"),
    "audit_metadata": ("auditMetadata", "pagesift keeps no audit log per request"),
    "allow_external_links": ("allowExternalLinks", "pagesift's Map lists one site"),
    "allow_subdomains": ("allowSubdomains", "map's own option is includeSubdomains"),
    "ignore_robots_txt": ("ignoreRobotsTxt", "pagesift's Map always honours robots.txt"),
    "robots_user_agent": ("robotsUserAgent", "pagesift's Map reads robots.txt for its own agent"),
    "deduplicate_similar_urls": ("deduplicateSimilarURLs", _MAP_WHY),
    "regex_on_full_url": ("regexOnFullURL", "pagesift's Map matches paths only"),
    "delay": ("delay", _MAP_WHY),
}
#: a refused field's accepted values where they are not (None, False): its default
MAP_ACCEPTS: dict[str, tuple[Any, ...]] = {"deduplicate_similar_urls": (None, True)}
UNSUPPORTED_JOB: dict[str, tuple[str, str]] = {
    "zero_data_retention": ("zeroDataRetention", "pagesift keeps every job's documents"),
}
#: request model -> its refused fields (the nested models' are ``options.REFUSED``):
#: what docs/gateway.md's field table says "refused" for (tests/test_gateway_fields.py)
REFUSED: dict[type[Any], Mapping[str, tuple[str, str]]] = {
    ScrapeOptions: UNSUPPORTED_SCRAPE,
    ScrapeRequest: UNSUPPORTED_SCRAPE_REQUEST,
    CrawlRequest: UNSUPPORTED_CRAWL,
    BatchScrapeRequest: UNSUPPORTED_BATCH,
    MapRequest: UNSUPPORTED_MAP,
    _Job: UNSUPPORTED_JOB,
    **options.REFUSED,
}
_DEFAULTS = ScrapeOptions.model_validate({})  # Firecrawl's defaults, as sent by nobody
_PROXIES = {"basic", "auto"}  # the server's own proxy setting; stealth/enhanced refused


def _refuse(field: str, why: str) -> HttpError:
    return options.refuse(field, why)


def _refuse_set(
    model: Any,
    table: Mapping[str, tuple[str, str]],
    prefix: str,
    accepts: Mapping[str, tuple[Any, ...]] | None = None,
) -> None:
    """Refuse the first field of ``table`` that ``model`` sets to a value other than
    those accepted (None and False, or ``accepts[attr]``)."""
    for attr, (name, why) in table.items():
        if getattr(model, attr) not in (accepts or {}).get(attr, (None, False)):
            raise _refuse(prefix + name, why)


def skips_tls(o: ScrapeOptions) -> bool:
    """Whether the request accepts any certificate: ``skipTlsVerification`` when given,
    else Firecrawl's default (true, but false for a request with headers or actions)."""
    if o.skip_tls_verification is not None:
        return o.skip_tls_verification
    return not (o.headers or o.actions)


def _millis(ms: int) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(ms)
    return d


def _format(opts: jobs_pb2.ScrapeOptions, fmt: str | FormatObject, field: str) -> None:
    if structured.format_object(opts, fmt, field):  # json, summary, attributes, selectors
        return
    name = fmt if isinstance(fmt, str) else fmt.type
    value = FORMATS.get(name)
    if value is None:
        why = UNSUPPORTED_FORMATS.get(name, "not a format pagesift knows")
        raise _refuse(field, f"format {name!r}: {why}")
    if isinstance(fmt, FormatObject):
        if name != "screenshot" and (fmt.full_page or fmt.quality or fmt.viewport):
            raise _refuse(field, f"format {name!r} takes no screenshot options")
        tracking = (fmt.modes, fmt.prompt, fmt.schema_, fmt.tag)
        if name != "changeTracking" and any(k is not None for k in tracking):
            raise _refuse(field, f"format {name!r} takes no change-tracking options")
        if name == "changeTracking":
            options.change_tracking(fmt, opts, field)
        if name == "screenshot":
            opts.screenshot.full_page = fmt.full_page
            if fmt.quality is not None:
                opts.screenshot.format = jobs_pb2.IMAGE_FORMAT_JPEG
                opts.screenshot.quality = fmt.quality
            if fmt.viewport is not None:
                opts.viewport.width = fmt.viewport.width
                opts.viewport.height = fmt.viewport.height
    if value not in opts.formats:
        opts.formats.append(value)


def scrape_options(o: ScrapeOptions, prefix: str = "") -> jobs_pb2.ScrapeOptions:
    """Firecrawl scrape options -> ``ScrapeOptions`` (``prefix``: the path that names
    them in a refusal, ``scrapeOptions.`` inside a crawl)."""
    _refuse_set(o, UNSUPPORTED_SCRAPE, prefix)
    if o.proxy is not None and o.proxy not in _PROXIES:
        raise _refuse(prefix + "proxy", f"proxy {o.proxy!r}: pagesift has no stealth proxies")
    if not o.store_in_cache and o.max_age:
        raise _refuse(prefix + "storeInCache", "pagesift stores every page read with maxAge")
    opts = jobs_pb2.ScrapeOptions(
        only_main_content=o.only_main_content,
        headers=o.headers or {},
        include_tags=o.include_tags or (),
        exclude_tags=o.exclude_tags or (),
        skip_tls_verification=skips_tls(o),
        remove_base64_images=o.remove_base64_images,
        mobile=o.mobile,
    )
    for i, fmt in enumerate(o.formats or ()):
        _format(opts, fmt, f"{prefix}formats[{i}]")
    tracked = jobs_pb2.FORMAT_CHANGE_TRACKING in opts.formats
    if tracked and jobs_pb2.FORMAT_MARKDOWN not in opts.formats:
        why = "the changeTracking format compares markdown: add the markdown format (as Firecrawl)"
        raise _refuse(prefix + "formats", why)
    if o.timeout is not None:
        opts.timeout.CopyFrom(_millis(o.timeout))
    if o.wait_for:
        opts.wait_for.duration.CopyFrom(_millis(o.wait_for))
    if o.max_age:
        opts.max_age.CopyFrom(_millis(o.max_age))
    options.apply(o, opts, prefix)
    return opts


#: Firecrawl's webhook event name -> the pagesift events it selects (a cancelled job
#: is Firecrawl's ``failed``; pagesift's page_failed has no Firecrawl event)
WEBHOOK_EVENTS: dict[str, tuple[jobs_pb2.WebhookEvent.ValueType, ...]] = {
    "started": (jobs_pb2.WEBHOOK_EVENT_STARTED,),
    "page": (jobs_pb2.WEBHOOK_EVENT_PAGE,),
    "completed": (jobs_pb2.WEBHOOK_EVENT_COMPLETED,),
    "failed": (jobs_pb2.WEBHOOK_EVENT_FAILED, jobs_pb2.WEBHOOK_EVENT_CANCELLED),
}


def webhook(w: WebhookOptions) -> jobs_pb2.Webhook:
    """Firecrawl's ``webhook`` option -> a Firecrawl-shaped ``Webhook`` (no events = all)."""
    hook = jobs_pb2.Webhook(
        url=w.url,
        headers=w.headers or {},
        metadata=w.metadata or {},
        format=jobs_pb2.WEBHOOK_FORMAT_FIRECRAWL,
    )
    for name in w.events or WEBHOOK_EVENTS:
        hook.event_types.extend(e for e in WEBHOOK_EVENTS[name] if e not in hook.event_types)
    return hook


def _job_checks(r: Any, prefix: str = "") -> None:
    _refuse_set(r, UNSUPPORTED_JOB, prefix)


def scrape_request(r: ScrapeRequest) -> jobs_pb2.ScrapeOptions:
    """``POST /v2/scrape``'s body -> the ``ScrapeOptions`` of a Scrape of ``r.url``."""
    _job_checks(r)
    _refuse_set(r, UNSUPPORTED_SCRAPE_REQUEST, "")
    return scrape_options(r)


def crawl_request(r: CrawlRequest) -> jobs_pb2.StartCrawlRequest:
    """``POST /v2/crawl``'s body -> ``StartCrawlRequest``. ``maxDiscoveryDepth: 0`` is
    Firecrawl's "the start page only" (its sitemap's URLs, at discovery depth 0, are
    filtered off too), where pagesift's ``max_depth`` 0 is unlimited: it maps onto
    ``limit`` 1 with the sitemap skipped (the start URL is queued first, and the
    frontier never grows past the limit)."""
    _job_checks(r)
    _refuse_set(r, UNSUPPORTED_CRAWL, "")
    options = scrape_options(r.scrape_options or _DEFAULTS, "scrapeOptions.")
    if r.ignore_robots_txt:
        options.ignore_robots_txt = True
    start_only = r.max_discovery_depth == 0  # Firecrawl: the start page alone
    out = jobs_pb2.StartCrawlRequest(
        url=r.url,
        limit=1 if start_only else r.limit or 0,
        max_depth=r.max_discovery_depth or 0,
        include_paths=r.include_paths or (),
        exclude_paths=r.exclude_paths or (),
        allow_subdomains=r.allow_subdomains,
        allow_external_links=r.allow_external_links,
        ignore_query_parameters=r.ignore_query_parameters,
        sitemap=jobs_pb2.SITEMAP_MODE_SKIP if start_only else _SITEMAP[r.sitemap],
        max_concurrency=r.max_concurrency or 0,
        delay=r.delay or 0.0,
        options=options,
        dedupe_similar_urls=r.deduplicate_similar_urls,
        crawl_entire_domain=r.crawl_entire_domain,
        regex_on_full_url=r.regex_on_full_url,
        prompt=r.prompt or "",
    )
    if r.webhook is not None:
        out.webhook.CopyFrom(webhook(r.webhook))
    return out


def batch_request(r: BatchScrapeRequest) -> jobs_pb2.StartBatchScrapeRequest:
    """``POST /v2/batch/scrape``'s body -> ``StartBatchScrapeRequest`` (a body with
    ``appendToId`` is ``append_arguments``': refused here, never dropped)."""
    _job_checks(r)
    _refuse_set(r, UNSUPPORTED_BATCH, "")
    if r.append_to_id is not None:
        raise _refuse("appendToId", "adding to a batch is mapped on POST /v2/batch/scrape only")
    out = jobs_pb2.StartBatchScrapeRequest(
        urls=r.urls,
        options=scrape_options(r),
        max_concurrency=r.max_concurrency or 0,
        ignore_invalid_urls=r.ignore_invalid_urls,
    )
    if r.webhook is not None:
        out.webhook.CopyFrom(webhook(r.webhook))
    return out


#: the scrape options of a batch body (set in an append: they must be the job's own)
_OPTION_FIELDS = frozenset(ScrapeOptions.model_fields)


def append_arguments(r: BatchScrapeRequest, idempotency_key: str) -> dict[str, Any]:
    """``POST /v2/batch/scrape`` with ``appendToId`` -> ``JobClient.append_batch``'s
    arguments: the URLs join that job, scraped with its options (scrape options and
    ``maxConcurrency`` given here must be the job's: the node refuses others by name);
    the job keeps its webhook (``webhook`` here is a 400)."""
    _job_checks(r)
    _refuse_set(r, UNSUPPORTED_BATCH, "")
    if r.webhook is not None:
        raise _refuse("webhook", "an append keeps the webhook the job started with")
    given = bool(_OPTION_FIELDS & r.model_fields_set)
    return {
        "job_id": r.append_to_id or "",
        "urls": r.urls,
        "ignore_invalid_urls": r.ignore_invalid_urls,
        "options": scrape_options(r) if given else None,
        "max_concurrency": r.max_concurrency or 0,
        "idempotency_key": idempotency_key,
    }


def path_prefix_regex(path: str) -> str:
    """RE2 regex of the paths that start with ``path`` (Firecrawl's ``startsWith``); a
    directory (``/docs/``) also admits its slashless spelling (``/docs``), which is
    the same page to pagesift (its page keys drop the trailing slash)."""
    escaped = "".join(c if c.isalnum() or c in "/%_" else "\\" + c for c in path)
    if path.endswith("/"):
        return "^" + escaped.rstrip("/") + "(?:/|\\?|$)"
    return "^" + escaped


def start_path(url: str) -> str:
    """The path of ``url`` (one without scheme read as ``http://``, as Firecrawl does);
    a URL that cannot be split (``http://[x/``: an unclosed IPv6 bracket) is a 400 naming url."""
    try:
        return urlsplit(url if "://" in url else "http://" + url).path
    except ValueError as exc:
        raise _refuse("url", f"not a URL: {exc}") from None


def map_arguments(r: MapRequest) -> dict[str, Any]:
    """``POST /v2/map``'s body -> ``JobClient.map``'s keyword arguments (Firecrawl's
    default limit 5000; the server caps it at its ``max_map_urls``). ``filterByPath``
    (Firecrawl's default) keeps the URLs whose path starts with the start URL's when
    that is not the root (an include regex; with ``includePaths`` too, a 400: the
    node's include list is any-of, so the two cannot both hold)."""
    _job_checks(r)
    _refuse_set(r, UNSUPPORTED_MAP, "", MAP_ACCEPTS)
    include: Any = r.include_paths or ()
    start = start_path(r.url)
    if r.filter_by_path and start not in ("", "/"):
        if include:
            why = (
                "cannot be combined with filterByPath (the default) below the site root; "
                "send filterByPath: false to list by includePaths alone"
            )
            raise _refuse("includePaths", why)
        include = [path_prefix_regex(start)]
    return {
        "limit": r.limit or 5000,
        "search": r.search or "",
        "sitemap": _SITEMAP[r.sitemap],
        "include_paths": include,
        "exclude_paths": r.exclude_paths or (),
        "allow_subdomains": r.include_subdomains,
        "ignore_query_parameters": r.ignore_query_parameters,
    }


_SITEMAP_NAMES = {v: k for k, v in _SITEMAP.items()}


def crawl_options(r: jobs_pb2.StartCrawlRequest) -> dict[str, Any]:
    """A ``StartCrawlRequest`` -> Firecrawl's crawl options (``/v2/crawl/params-preview``'s
    ``data``): the reverse of ``crawl_request`` for the crawl's own fields, each named
    as Firecrawl's crawl body names it; a field the request leaves unset is left out
    (``limit`` 0, ``max_depth`` 0: no bound, Firecrawl's absent)."""
    out: dict[str, Any] = {"url": r.url}
    if r.include_paths:
        out["includePaths"] = list(r.include_paths)
    if r.exclude_paths:
        out["excludePaths"] = list(r.exclude_paths)
    if r.max_depth:
        out["maxDiscoveryDepth"] = r.max_depth
    if r.limit:
        out["limit"] = r.limit
    if r.sitemap in _SITEMAP_NAMES:
        out["sitemap"] = _SITEMAP_NAMES[r.sitemap]
    out.update(
        crawlEntireDomain=r.crawl_entire_domain,
        allowExternalLinks=r.allow_external_links,
        allowSubdomains=r.allow_subdomains,
        ignoreQueryParameters=r.ignore_query_parameters,
        deduplicateSimilarURLs=r.dedupe_similar_urls,
        regexOnFullURL=r.regex_on_full_url,
    )
    if r.options.ignore_robots_txt:
        out["ignoreRobotsTxt"] = True
    if r.delay:
        out["delay"] = int(r.delay) if float(r.delay).is_integer() else r.delay
    if r.max_concurrency:
        out["maxConcurrency"] = r.max_concurrency
    return out


# ---------------------------------------------------------------- answers


def _rfc3339(ts: Any) -> str:
    return str(ts.ToJsonString())


def status_page(
    resp: jobs_pb2.GetJobResponse,
    skip: int,
    next_url: str,
    max_bytes: int,
    limit: int | None = None,
) -> dict[str, Any]:
    """One status page in Firecrawl's shape. ``next_url`` is the page URL without its
    query; ``next`` (``?skip=N``, and ``&limit=`` when the caller gave one, as
    Firecrawl) is absent at the end of a finished job."""
    data: list[dict[str, Any]] = []
    size = 0
    for doc in resp.documents:
        d = document(doc)
        n = len(json.dumps(d, ensure_ascii=False).encode()) + 1
        if data and size + n > max_bytes:
            break
        data.append(d)
        size += n
    out: dict[str, Any] = {
        "success": True,
        "status": STATES.get(resp.state, "scraping"),
        "total": resp.total,
        "completed": resp.completed,
        "creditsUsed": resp.completed,
        "expiresAt": _rfc3339(resp.expires_at),
    }
    more = f"&limit={limit}" if limit is not None else ""
    if len(data) < len(resp.documents):
        out["next"] = f"{next_url}?skip={skip + len(data)}{more}"
    elif resp.HasField("next_skip"):
        out["next"] = f"{next_url}?skip={resp.next_skip}{more}"
    out["data"] = data
    return out


_TEXT_FORMATS = {
    jobs_pb2.FORMAT_MARKDOWN: "markdown",
    jobs_pb2.FORMAT_HTML: "html",
    jobs_pb2.FORMAT_RAW_HTML: "rawHtml",
}
_LIST_FORMATS = {jobs_pb2.FORMAT_LINKS: "links", jobs_pb2.FORMAT_IMAGES: "images"}


def error_status_document(
    url: str, final_url: str, status: int, why: str, options: jobs_pb2.ScrapeOptions
) -> dict[str, Any]:
    """The document of a page that answered an HTTP error ``status`` (Firecrawl answers
    a 404 with its document, ``metadata.statusCode`` 404): what pagesift knows of it.
    The node reads no body of an error status, so each text format asked is empty and
    ``metadata.error`` says why (``why``: the node's page error)."""
    doc = document(jobs_pb2.Document(url=url, final_url=final_url, status_code=status))
    asked = list(options.formats) or [jobs_pb2.FORMAT_MARKDOWN]
    out: dict[str, Any] = {name: "" for f, name in _TEXT_FORMATS.items() if f in asked}
    out.update({name: [] for f, name in _LIST_FORMATS.items() if f in asked})
    out["metadata"] = {
        **doc["metadata"],
        "error": f"{why} (pagesift keeps no body of an HTTP error page)",
    }
    return out


_ROBOTS_DISALLOWED = "robots_disallowed"  # pagesift.core.jobs.pageerrors.ErrorCode's


def errors_body(resp: jobs_pb2.GetJobErrorsResponse, job_id: str) -> dict[str, Any]:
    """Firecrawl's ``GET .../errors`` body: the failed pages (job notes, whose url is
    empty, are not page errors) and, apart as Firecrawl lists them, the URLs robots.txt
    kept out (never in ``errors`` too)."""
    errors = [
        {
            "id": f"{job_id}-{i}",
            "timestamp": _rfc3339(e.time),
            "url": e.url,
            "code": e.code,
            "error": e.message,
        }
        for i, e in enumerate(resp.errors)
        if e.url and e.code != _ROBOTS_DISALLOWED
    ]
    blocked = list(dict.fromkeys([*resp.robots_blocked] + [
        e.url for e in resp.errors if e.code == _ROBOTS_DISALLOWED and e.url
    ]))  # fmt: skip
    return {"success": True, "errors": errors, "robotsBlocked": blocked}
