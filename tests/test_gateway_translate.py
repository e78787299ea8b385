"""The gateway's pure parts: Firecrawl bodies -> proto requests, documents and status
pages -> Firecrawl's shapes, and the one gRPC -> HTTP error table."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import pydantic
import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from pagesift.client.errors import BLOCKED_ADDRESS
from pagesift.core.api import rpcerrors
from pagesift.core.api.errortable import CallFacts, refusal_of
from pagesift.core.jobs import renderoptions, validate
from pagesift.gateway import options, translate
from pagesift.gateway.httperrors import (
    BY_STATUS,
    TABLE,
    UNREACHABLE,
    VIOLATION_REASONS,
    HttpError,
    from_aio_error,
    from_rpc,
    issue,
)
from pagesift.gateway.models import BatchScrapeRequest, CrawlRequest, MapRequest, ScrapeRequest
from pagesift.v1 import jobs_pb2
from tests.firecrawlerrors import named as field_of

C = grpc.StatusCode
URL = "https://example.com/"


def scrape(**body: Any) -> jobs_pb2.ScrapeOptions:
    return translate.scrape_request(ScrapeRequest.model_validate({"url": URL, **body}))


def refused(call: Any) -> HttpError:
    with pytest.raises(HttpError) as err:
        call()
    assert err.value.status == 400 and err.value.code == "BAD_REQUEST"
    return err.value


# ---------------------------------------------------------------- requests


def test_scrape_options_map_onto_their_proto_fields_with_firecrawls_defaults() -> None:
    opts = scrape(
        formats=["markdown", "rawHtml", {"type": "links"}, "images", "html", "markdown"],
        headers={"X-A": "1"},
        includeTags=["main"],
        excludeTags=[".ad"],
        timeout=15000,
        waitFor=1500,
        mobile=True,
        skipTlsVerification=True,
        maxAge=60000,
    )
    assert list(opts.formats) == [
        jobs_pb2.FORMAT_MARKDOWN,
        jobs_pb2.FORMAT_RAW_HTML,
        jobs_pb2.FORMAT_LINKS,
        jobs_pb2.FORMAT_IMAGES,
        jobs_pb2.FORMAT_HTML,
    ]
    assert dict(opts.headers) == {"X-A": "1"}
    assert list(opts.include_tags) == ["main"] and list(opts.exclude_tags) == [".ad"]
    assert opts.timeout.ToMilliseconds() == 15000
    assert opts.wait_for.duration.ToMilliseconds() == 1500
    assert opts.max_age.ToMilliseconds() == 60000
    assert opts.mobile and opts.skip_tls_verification
    # Firecrawl's defaults: main content only, base64 images removed
    assert opts.only_main_content and opts.remove_base64_images
    plain = scrape()
    assert plain.only_main_content and plain.remove_base64_images
    assert not plain.HasField("timeout") and not plain.HasField("max_age")
    assert not plain.HasField("wait_for") and list(plain.formats) == []
    off = scrape(onlyMainContent=False, removeBase64Images=False)
    assert not off.only_main_content and not off.remove_base64_images


def test_a_screenshot_format_object_maps_its_options() -> None:
    opts = scrape(
        formats=[{"type": "screenshot", "fullPage": True, "quality": 70,
                  "viewport": {"width": 800, "height": 600}}]
    )  # fmt: skip
    assert list(opts.formats) == [jobs_pb2.FORMAT_SCREENSHOT]
    assert opts.screenshot.full_page and opts.screenshot.quality == 70
    assert opts.screenshot.format == jobs_pb2.IMAGE_FORMAT_JPEG
    assert (opts.viewport.width, opts.viewport.height) == (800, 600)
    png = scrape(formats=["screenshot"])
    assert png.screenshot.format == jobs_pb2.IMAGE_FORMAT_UNSPECIFIED


@pytest.mark.parametrize("name", ["question", "branding", "rawBase64", "bogus"])
def test_a_format_pagesift_does_not_produce_is_refused_by_position(name: str) -> None:
    for second in (name, {"type": name}):
        err = refused(lambda second=second: scrape(formats=["markdown", second]))
        assert err.error.startswith("formats[1]:") and repr(name) in err.error


@pytest.mark.parametrize(
    ("attr", "name"), [(a, n) for a, (n, _) in translate.UNSUPPORTED_SCRAPE.items()]
)
def test_every_scrape_option_not_mapped_is_refused_by_name(attr: str, name: str) -> None:
    value: Any = [{"type": "scrape"}] if attr in ("actions", "parsers") else "x"
    if attr in ("min_age",):
        value = 1000
    if attr in (
        "check_prompt_injection",
        "fast_mode",
        "only_clean_content",
        "lockdown",
        "safe_mode",
        "domain_tools",
    ):
        value = True
    assert refused(lambda: scrape(**{name: value})).error.startswith(f"{name}:")
    # inside a crawl the path names scrapeOptions; a batch takes them at the top level
    body = {"url": URL, "scrapeOptions": {name: value}}
    nested = refused(lambda: translate.crawl_request(CrawlRequest.model_validate(body)))
    assert nested.error.startswith(f"scrapeOptions.{name}:")
    assert field_of(nested.details[0]) == f"scrapeOptions.{name}"
    batch = BatchScrapeRequest.model_validate({"urls": [URL], name: value})
    assert refused(lambda: translate.batch_request(batch)).error.startswith(f"{name}:")


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"proxy": "stealth"}, "proxy"),
        ({"proxy": "enhanced"}, "proxy"),
        ({"fastMode": True}, "fastMode"),
        ({"storeInCache": False, "maxAge": 1000}, "storeInCache"),
        ({"zeroDataRetention": True}, "zeroDataRetention"),
    ],
)
def test_options_pagesift_cannot_honour_are_refused_by_name(
    body: dict[str, Any], named: str
) -> None:
    assert refused(lambda: scrape(**body)).error.startswith(f"{named}:")


def test_options_pagesift_honours_as_firecrawl_sends_them_are_accepted() -> None:
    # the SDK sends these defaults with every scrape options object
    opts = scrape(proxy="basic", blockAds=True, fastMode=False, storeInCache=True,
                  maxAge=14400000, integration="sdk")  # fmt: skip
    assert opts.max_age.ToMilliseconds() == 14400000
    assert scrape(proxy="auto", storeInCache=False).max_age.ToMilliseconds() == 0


@pytest.mark.parametrize(
    ("model", "body", "named"),
    [
        (CrawlRequest, {"robotsUserAgent": "x"}, "robotsUserAgent"),
        (BatchScrapeRequest, {"appendToId": "abc"}, "appendToId"),
        (MapRequest, {"location": {"country": "US"}}, "location"),
        (MapRequest, {"useIndex": True}, "useIndex"),
    ],
)
def test_job_options_not_mapped_are_refused_by_name(
    model: type[pydantic.BaseModel], body: dict[str, Any], named: str
) -> None:
    base = {"urls": [URL]} if model is BatchScrapeRequest else {"url": URL}
    request: Any = model.model_validate({**base, **body})
    call: dict[type[pydantic.BaseModel], Callable[[Any], object]] = {
        CrawlRequest: translate.crawl_request,
        BatchScrapeRequest: translate.batch_request,
        MapRequest: translate.map_arguments,
    }
    assert refused(lambda: call[model](request)).error.startswith(f"{named}:")


def test_crawl_options_map_onto_start_crawl() -> None:
    body = {
        "url": URL,
        "includePaths": ["^/docs/"],
        "excludePaths": ["^/docs/old"],
        "maxDiscoveryDepth": 3,
        "sitemap": "skip",
        "ignoreQueryParameters": True,
        "limit": 40,
        "crawlEntireDomain": True,
        "allowExternalLinks": True,
        "allowSubdomains": True,
        "ignoreRobotsTxt": True,
        "delay": 1.5,
        "maxConcurrency": 4,
        "deduplicateSimilarURLs": False,
        "regexOnFullURL": True,
        "prompt": "docs only",
        "scrapeOptions": {"formats": ["html"], "onlyMainContent": False},
    }
    req = translate.crawl_request(CrawlRequest.model_validate(body))
    assert req.url == URL and req.limit == 40 and req.max_depth == 3
    assert req.prompt == "docs only"  # the node turns it into crawl options with the model
    assert list(req.include_paths) == ["^/docs/"] and list(req.exclude_paths) == ["^/docs/old"]
    assert req.sitemap == jobs_pb2.SITEMAP_MODE_SKIP
    assert req.ignore_query_parameters and req.crawl_entire_domain and req.regex_on_full_url
    assert req.allow_external_links and req.allow_subdomains
    assert req.options.ignore_robots_txt and not req.dedupe_similar_urls
    assert req.delay == 1.5 and req.max_concurrency == 4
    assert list(req.options.formats) == [jobs_pb2.FORMAT_HTML]
    assert not req.options.only_main_content
    plain = translate.crawl_request(CrawlRequest.model_validate({"url": URL}))
    assert plain.dedupe_similar_urls and plain.options.only_main_content  # Firecrawl's
    assert plain.sitemap == jobs_pb2.SITEMAP_MODE_INCLUDE and plain.limit == 0
    assert plain.prompt == ""


@pytest.mark.parametrize(
    ("body", "limit", "max_depth", "sitemap"),
    [
        ({}, 0, 0, jobs_pb2.SITEMAP_MODE_INCLUDE),  # no depth: unlimited, as both say
        ({"maxDiscoveryDepth": 0}, 1, 0, jobs_pb2.SITEMAP_MODE_SKIP),  # the start page only
        ({"maxDiscoveryDepth": 0, "limit": 50}, 1, 0, jobs_pb2.SITEMAP_MODE_SKIP),
        ({"maxDiscoveryDepth": 0, "sitemap": "only"}, 1, 0, jobs_pb2.SITEMAP_MODE_SKIP),
        ({"maxDiscoveryDepth": 1}, 0, 1, jobs_pb2.SITEMAP_MODE_INCLUDE),
        ({"maxDiscoveryDepth": 2, "limit": 9}, 9, 2, jobs_pb2.SITEMAP_MODE_INCLUDE),
    ],
)
def test_max_discovery_depth_zero_is_the_start_page_alone(
    body: dict[str, Any], limit: int, max_depth: int, sitemap: int
) -> None:
    """Firecrawl's ``maxDiscoveryDepth: 0`` is the start page only; pagesift's
    ``max_depth`` 0 is unlimited, so 0 becomes ``limit`` 1 with the sitemap skipped."""
    req = translate.crawl_request(CrawlRequest.model_validate({"url": URL, **body}))
    assert (req.limit, req.max_depth, req.sitemap) == (limit, max_depth, sitemap)


def test_batch_and_map_options_map_onto_their_calls() -> None:
    batch = BatchScrapeRequest.model_validate(
        {"urls": [URL, URL + "a"], "formats": ["links"], "ignoreInvalidURLs": True,
         "maxConcurrency": 2}
    )  # fmt: skip
    req = translate.batch_request(batch)
    assert list(req.urls) == [URL, URL + "a"] and req.ignore_invalid_urls
    assert req.max_concurrency == 2 and list(req.options.formats) == [jobs_pb2.FORMAT_LINKS]
    kw = translate.map_arguments(MapRequest.model_validate({"url": URL}))
    assert kw == {
        "limit": 5000,
        "search": "",
        "sitemap": jobs_pb2.SITEMAP_MODE_INCLUDE,
        "include_paths": (),
        "exclude_paths": (),
        "allow_subdomains": True,
        "ignore_query_parameters": True,
    }
    kw = translate.map_arguments(
        MapRequest.model_validate(
            {"url": URL, "limit": 7, "search": "blog", "sitemap": "only",
             "includeSubdomains": False, "ignoreQueryParameters": False,
             "includePaths": ["^/blog/"], "excludePaths": ["^/blog/old"]}
        )
    )  # fmt: skip
    assert kw["include_paths"] == ["^/blog/"] and kw["exclude_paths"] == ["^/blog/old"]
    assert kw["limit"] == 7 and kw["search"] == "blog"
    assert kw["sitemap"] == jobs_pb2.SITEMAP_MODE_ONLY
    assert not kw["allow_subdomains"] and not kw["ignore_query_parameters"]


@pytest.mark.parametrize(
    ("model", "body", "path"),
    [
        (ScrapeRequest, {"url": URL, "bogus": 1}, "bogus"),
        (CrawlRequest, {"url": URL, "scrapeOptions": {"x": 1}}, "scrapeOptions.x"),
        (ScrapeRequest, {"url": URL, "formats": [{"type": "screenshot", "zoom": 2}]},
         "formats.0.FormatObject.zoom"),
        (MapRequest, {"url": URL, "ignoreSitemap": True}, "ignoreSitemap"),
    ],
)  # fmt: skip
def test_bodies_are_strict(
    model: type[pydantic.BaseModel], body: dict[str, Any], path: str
) -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        model.model_validate(body)
    paths = [".".join(str(p) for p in e["loc"]) for e in err.value.errors()]
    assert path in paths
    assert any(e["type"] == "extra_forbidden" for e in err.value.errors())


# ---------------------------------------------------------------- answers


def doc(**kw: Any) -> jobs_pb2.Document:
    base: dict[str, Any] = {
        "url": URL,
        "final_url": URL + "final",
        "status_code": 200,
        "content_type": "text/html; charset=utf-8",
        "title": "T",
        "description": "D",
        "language": "en",
        "markdown": "# T",
    }
    return jobs_pb2.Document(**{**base, **kw})


def test_a_document_carries_its_formats_and_firecrawls_metadata() -> None:
    d = translate.document(
        doc(
            html="<p>x</p>",
            raw_html="<html>",
            links=["https://a.example/"],
            images=["https://a.example/i.png"],
            screenshot=jobs_pb2.Screenshot(data=b"\x89PNG", content_type="image/png"),
            metadata={"og:title": "OT", "og:site_name": "S", "og:locale:alternate": "fr",
                      "twitter:card": "summary", "title": "shadowed"},
            num_pages=3,
        )
    )  # fmt: skip
    assert d["markdown"] == "# T" and d["html"] == "<p>x</p>" and d["rawHtml"] == "<html>"
    assert d["links"] == ["https://a.example/"] and d["images"] == ["https://a.example/i.png"]
    assert d["screenshot"] == "data:image/png;base64,iVBORw=="
    md = d["metadata"]
    assert md["title"] == "T" and md["description"] == "D" and md["language"] == "en"
    assert md["sourceURL"] == URL and md["url"] == URL + "final"
    assert md["statusCode"] == 200 and md["contentType"].startswith("text/html")
    assert md["ogTitle"] == "OT" and md["og:title"] == "OT" and md["ogSiteName"] == "S"
    assert md["ogLocaleAlternate"] == "fr" and md["twitter:card"] == "summary"
    assert md["numPages"] == 3 and md["cacheState"] == "miss" and "cachedAt" not in md
    json.dumps(d)  # JSON as it is


def test_a_document_omits_formats_it_does_not_carry() -> None:
    d = translate.document(doc(final_url=""))
    assert set(d) == {"markdown", "metadata"}
    assert d["metadata"]["url"] == URL
    fetched = timestamp_pb2.Timestamp(seconds=1_800_000_000)
    cached = translate.document(doc(cache_hit=True, fetched_at=fetched))["metadata"]
    assert cached["cacheState"] == "hit" and cached["cachedAt"] == "2027-01-15T08:00:00Z"


def page(
    n: int, state: jobs_pb2.JobState.ValueType = jobs_pb2.JOB_STATE_COMPLETED, **kw: Any
) -> jobs_pb2.GetJobResponse:
    return jobs_pb2.GetJobResponse(
        id="j",
        state=state,
        total=n,
        completed=n,
        expires_at=timestamp_pb2.Timestamp(seconds=1_800_000_000),
        documents=[doc(url=f"{URL}{i}", markdown="x" * 1000) for i in range(n)],
        **kw,
    )


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (jobs_pb2.JOB_STATE_SCRAPING, "scraping"),
        (jobs_pb2.JOB_STATE_PAUSED, "scraping"),
        (jobs_pb2.JOB_STATE_COMPLETED, "completed"),
        (jobs_pb2.JOB_STATE_FAILED, "failed"),
        (jobs_pb2.JOB_STATE_CANCELLED, "cancelled"),
    ],
)
def test_a_status_page_says_firecrawls_status(
    state: jobs_pb2.JobState.ValueType, status: str
) -> None:
    body = translate.status_page(page(2, state), 0, "http://g/v2/crawl/j", 10 << 20)
    assert body["status"] == status and body["success"] is True
    assert body["total"] == body["completed"] == body["creditsUsed"] == 2
    assert body["expiresAt"] == "2027-01-15T08:00:00Z"
    assert "next" not in body and len(body["data"]) == 2


def test_next_follows_the_servers_next_skip() -> None:
    body = translate.status_page(page(3, next_skip=13), 10, "http://g/v2/crawl/j", 10 << 20)
    assert body["next"] == "http://g/v2/crawl/j?skip=13" and len(body["data"]) == 3


def test_a_page_is_cut_at_its_byte_cap_and_next_resumes_after_the_last_document() -> None:
    one = len(json.dumps(translate.document(page(1).documents[0]))) + 1
    body = translate.status_page(page(10, next_skip=30), 20, "http://g/x", 3 * one + 10)
    assert len(body["data"]) == 3 and body["next"] == "http://g/x?skip=23"
    assert len(json.dumps(body["data"])) <= 3 * one + 10
    tiny = translate.status_page(page(4), 0, "http://g/x", 10)  # one document at least
    assert len(tiny["data"]) == 1 and tiny["next"] == "http://g/x?skip=1"
    limited = translate.status_page(page(2, next_skip=7), 5, "http://g/x", 10 << 20, 2)
    assert limited["next"] == "http://g/x?skip=7&limit=2"  # the caller's limit, kept


def test_the_errors_body_lists_failed_pages_not_job_notes() -> None:
    resp = jobs_pb2.GetJobErrorsResponse(
        errors=[
            jobs_pb2.PageError(url=URL + "missing", code="http_status", message="404"),
            jobs_pb2.PageError(url="", code="completed", message="limit reached"),
            jobs_pb2.PageError(url=URL + "private/", code="robots_disallowed", message="robots"),
            jobs_pb2.PageError(url=URL + "admin/", code="robots_disallowed", message="robots"),
        ],
        robots_blocked=[URL + "private/"],
    )
    body = translate.errors_body(resp, "j")
    assert [e["url"] for e in body["errors"]] == [URL + "missing"]  # robots URLs only apart
    assert body["errors"][0]["code"] == "http_status" and body["errors"][0]["error"] == "404"
    assert body["robotsBlocked"] == [URL + "private/", URL + "admin/"]


# ---------------------------------------------------------------- the error table


@pytest.mark.parametrize(
    ("status", "reason", "metadata", "http", "code"),
    [
        (C.INVALID_ARGUMENT, "INVALID_FIELD", {}, 400, "BAD_REQUEST"),
        (C.INVALID_ARGUMENT, "IDEMPOTENCY_KEY_REUSED", {}, 409, "CONFLICT"),
        (C.FAILED_PRECONDITION, "HOST_OWNED_ELSEWHERE", {"owner": "b"}, 421, "MISDIRECTED"),
        (C.UNAUTHENTICATED, "UNAUTHENTICATED", {}, 401, "UNAUTHORIZED"),
        (C.PERMISSION_DENIED, "PERMISSION_DENIED_FIELD", {}, 403, "FORBIDDEN"),
        (C.NOT_FOUND, "JOB_NOT_FOUND", {}, 404, "NOT_FOUND"),
        (C.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED", {"limit": "pages_per_day"}, 402,
         "QUOTA_EXCEEDED"),
        (C.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED", {"limit": "max_crawl_limit"}, 402,
         "QUOTA_EXCEEDED"),
        (C.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED", {"limit": "max_concurrent_jobs"}, 429,
         "RATE_LIMIT_EXCEEDED"),
        (C.UNAVAILABLE, "PAGE_FETCH_FAILED", {"code": "timeout"}, 408, "SCRAPE_TIMEOUT"),
        (C.INVALID_ARGUMENT, "PAGE_FETCH_FAILED", {"code": "blocked_address"}, 403,
         "URL_BLOCKED"),
        (C.PERMISSION_DENIED, "PAGE_FETCH_FAILED", {"code": "robots_disallowed"}, 403,
         "ROBOTS_DISALLOWED"),
        (C.UNAVAILABLE, "PAGE_FETCH_FAILED", {"code": "dns"}, 500,
         "SCRAPE_DNS_RESOLUTION_ERROR"),
        (C.UNKNOWN, "PAGE_FETCH_FAILED", {"code": "http_status", "http_status": "404"}, 500,
         "SCRAPE_FAILED"),
        (C.FAILED_PRECONDITION, "NOT_PRIMARY", {}, 503, "UNAVAILABLE"),
        (C.DEADLINE_EXCEEDED, None, {}, 408, "SCRAPE_TIMEOUT"),
        (C.UNAVAILABLE, None, {}, 503, "UNAVAILABLE"),
        (C.INVALID_ARGUMENT, "A_REASON_FROM_THE_FUTURE", {}, 400, "BAD_REQUEST"),
        (C.INTERNAL, None, {}, 500, "INTERNAL_SERVER_ERROR"),
        (C.DATA_LOSS, "A_REASON_FROM_THE_FUTURE", {}, 500, "INTERNAL_SERVER_ERROR"),
    ],
)  # fmt: skip
def test_the_error_table(
    status: grpc.StatusCode, reason: str | None, metadata: dict[str, str], http: int, code: str
) -> None:
    err = from_rpc(status, reason, metadata, "it failed")
    assert (err.status, err.code) == (http, code)
    body = err.body()
    said = UNREACHABLE if (status, reason) == (C.UNAVAILABLE, None) else "it failed"
    assert body["success"] is False and body["error"] == said and body["code"] == code
    assert ("Retry-After" in err.headers) == (http in (429, 503))


def test_every_server_reason_has_a_row_or_a_deliberate_fallback() -> None:
    unmapped = {r.value for r in rpcerrors.Reason} - set(TABLE)
    # the admin and replication reasons never reach a JobService caller
    assert unmapped == {
        "CANNOT_PROMOTE", "OFFSET_PASSED", "OFFSET_NOT_REACHED", "BACKUP_IN_PROGRESS",
        "BACKUP_FAILED", "REPLICATION_REFUSED", "STEPPED_DOWN", "NO_LONGER_PRIMARY",
        "STANDBY_TOO_SLOW",
    }  # fmt: skip
    assert all(400 <= http <= 503 for http, _ in [*TABLE.values(), *BY_STATUS.values()])


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert from_rpc(C.RESOURCE_EXHAUSTED, None, {}, "", retry_after=2.2).headers == {
        "Retry-After": "3"
    }
    assert from_rpc(C.UNAVAILABLE, None, {}, "", retry_after=0.0).headers == {"Retry-After": "1"}


def test_a_malformed_job_id_is_an_unknown_job() -> None:
    err = from_rpc(C.INVALID_ARGUMENT, "INVALID_FIELD", {}, "bad id", violations=[("id", "no")])
    assert err.status == 404
    other = from_rpc(C.INVALID_ARGUMENT, "INVALID_FIELD", {}, "x", violations=[("limit", "<0")])
    assert other.status == 400 and other.details == [issue("custom", ["limit"], "<0")]


def test_a_url_the_address_guard_refuses_is_403_by_its_violation_reason_not_its_words() -> None:
    why = "http://10.0.0.1/ is refused: 10.0.0.1 is a private address"
    bad = [("urls[0]", "not a URL"), ("urls[2]", why)]
    err = from_rpc(
        C.INVALID_ARGUMENT,
        "INVALID_FIELD",
        {},
        why,
        violations=bad,
        violation_reasons=["", BLOCKED_ADDRESS],
    )
    assert (err.status, err.code) == (403, "URL_BLOCKED")
    words_only = from_rpc(C.INVALID_ARGUMENT, "INVALID_FIELD", {}, why, violations=bad)
    assert (words_only.status, words_only.code) == (400, "BAD_REQUEST")


def test_the_blocked_address_reason_is_one_wire_constant_on_both_sides() -> None:
    assert BLOCKED_ADDRESS == validate.BLOCKED_ADDRESS == "BLOCKED_ADDRESS"
    assert set(VIOLATION_REASONS) == {BLOCKED_ADDRESS}


def test_the_node_sends_the_guards_refusal_as_a_violation_reason_the_gateway_reads() -> None:
    guard = validate.InvalidArgument(
        "url", "http://10.0.0.1/ is refused: private", cause=BLOCKED_ADDRESS
    )
    other = validate.InvalidArgument("limit", "must be positive")
    both = validate.InvalidArgument.combined([other, guard])
    _, reason, refusal = refusal_of(both, CallFacts())
    (bad,) = [d for d in refusal.details if isinstance(d, error_details_pb2.BadRequest)]
    assert [(v.field, v.reason) for v in bad.field_violations] == [
        ("limit", ""),
        ("url", BLOCKED_ADDRESS),
    ]
    rich = rpcerrors.rich_status(
        C.INVALID_ARGUMENT, str(both), reason, refusal.metadata, refusal.details
    )
    trailing = grpc.aio.Metadata(*rpc_status.to_status(rich).trailing_metadata)
    err = from_aio_error(rpc_error(C.INVALID_ARGUMENT, trailing, str(both)))
    assert (err.status, err.code) == (403, "URL_BLOCKED")


def rpc_error(code: grpc.StatusCode, trailing: grpc.aio.Metadata, details: str) -> Any:
    """An ``AioRpcError`` as grpc.aio raises it, with ``trailing`` metadata."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details, None)


def test_an_rpc_errors_rich_details_are_read_into_the_answer() -> None:
    rich = rpcerrors.rich_status(
        C.RESOURCE_EXHAUSTED,
        "too many jobs",
        "QUOTA_EXCEEDED",
        {"limit": "max_concurrent_jobs"},
        [rpcerrors.retry_info(4.5)],
    )
    trailing = grpc.aio.Metadata(*rpc_status.to_status(rich).trailing_metadata)
    err = rpc_error(C.RESOURCE_EXHAUSTED, trailing, "too many jobs")
    answer = from_aio_error(err)
    assert (answer.status, answer.code, answer.error) == (
        429,
        "RATE_LIMIT_EXCEEDED",
        "too many jobs",
    )
    assert answer.headers == {"Retry-After": "5"}
    bad = rpcerrors.rich_status(
        C.INVALID_ARGUMENT, "urls[1]: not a URL", "INVALID_FIELD", {},
        [rpcerrors.bad_request([("urls[1]", "not a URL")])],
    )  # fmt: skip
    trailing = grpc.aio.Metadata(*rpc_status.to_status(bad).trailing_metadata)
    answer = from_aio_error(rpc_error(C.INVALID_ARGUMENT, trailing, "x"))
    assert answer.status == 400 and answer.details == [issue("custom", ["urls", 1], "not a URL")]
    plain = from_aio_error(rpc_error(C.UNAVAILABLE, grpc.aio.Metadata(), ""))
    assert plain.status == 503 and plain.error == UNREACHABLE


# ------------------------------------------- actions, location, parsers, change tracking


def _action(**a: Any) -> jobs_pb2.Action:
    (one,) = scrape(actions=[a]).actions
    return one


@pytest.mark.parametrize(
    ("firecrawl", "pagesift"),
    [
        ({"type": "wait", "milliseconds": 1500},
         jobs_pb2.Action(wait=jobs_pb2.WaitAction(
             duration=duration_pb2.Duration(seconds=1, nanos=500_000_000)))),
        ({"type": "wait", "selector": "#done"},
         jobs_pb2.Action(wait=jobs_pb2.WaitAction(selector="#done"))),
        ({"type": "click", "selector": "button.more"},
         jobs_pb2.Action(click=jobs_pb2.ClickAction(selector="button.more"))),
        ({"type": "write", "text": "hello"},
         jobs_pb2.Action(write=jobs_pb2.WriteAction(text="hello"))),
        ({"type": "press", "key": "Enter"},
         jobs_pb2.Action(press=jobs_pb2.PressAction(key="Enter"))),
        ({"type": "scroll"},
         jobs_pb2.Action(scroll=jobs_pb2.ScrollAction(direction=jobs_pb2.SCROLL_DIRECTION_DOWN))),
        ({"type": "scroll", "direction": "up"},
         jobs_pb2.Action(scroll=jobs_pb2.ScrollAction(direction=jobs_pb2.SCROLL_DIRECTION_UP))),
        ({"type": "executeJavascript", "script": "return 1"},
         jobs_pb2.Action(execute_javascript=jobs_pb2.ExecuteJavascriptAction(script="return 1"))),
        ({"type": "screenshot"}, jobs_pb2.Action(screenshot=jobs_pb2.ScreenshotOptions())),
        ({"type": "screenshot", "fullPage": True, "quality": 60},
         jobs_pb2.Action(screenshot=jobs_pb2.ScreenshotOptions(
             full_page=True, format=jobs_pb2.IMAGE_FORMAT_JPEG, quality=60))),
    ],
)  # fmt: skip
def test_each_firecrawl_action_becomes_its_pagesift_step(
    firecrawl: dict[str, Any], pagesift: jobs_pb2.Action
) -> None:
    assert _action(**firecrawl) == pagesift


def test_actions_keep_their_order_and_ask_for_the_browser_engine() -> None:
    opts = scrape(actions=[{"type": "click", "selector": "a"}, {"type": "wait", "milliseconds": 5}])
    assert [a.WhichOneof("action") for a in opts.actions] == ["click", "wait"]
    assert opts.engine == jobs_pb2.FETCH_ENGINE_BROWSER
    assert scrape().engine == jobs_pb2.FETCH_ENGINE_UNSPECIFIED  # no actions: the node's AUTO


@pytest.mark.parametrize(
    ("action", "named"),
    [
        ({"type": "scrape"}, "actions[1]"),
        ({"type": "pdf", "format": "A4"}, "actions[1]"),
        ({"type": "click", "selector": "a", "all": True}, "actions[1].all"),
        ({"type": "scroll", "selector": "#list"}, "actions[1].selector"),
        ({"type": "screenshot", "viewport": {"width": 800, "height": 600}}, "actions[1].viewport"),
        ({"type": "wait"}, "actions[1]"),
        ({"type": "wait", "milliseconds": 5, "selector": "a"}, "actions[1]"),
    ],
)
def test_an_action_pagesift_has_no_step_for_is_refused_by_index(
    action: dict[str, Any], named: str
) -> None:
    err = refused(lambda: scrape(actions=[{"type": "press", "key": "Tab"}, action]))
    assert err.error.startswith(f"{named}:") and field_of(err.details[0]) == named
    body = {"url": URL, "scrapeOptions": {"actions": [{"type": "press", "key": "a"}, action]}}
    nested = refused(lambda: translate.crawl_request(CrawlRequest.model_validate(body)))
    assert field_of(nested.details[0]) == f"scrapeOptions.{named}"


def test_an_unknown_action_type_is_a_validation_error_listing_the_known_ones() -> None:
    with pytest.raises(pydantic.ValidationError, match="unknown action type: one of wait, click"):
        scrape(actions=[{"type": "hover", "selector": "a"}])


def test_location_languages_are_accept_language_and_the_locale_only_when_rendering() -> None:
    plain = scrape(location={"languages": ["fr-CH", "fr", "en"]})
    assert dict(plain.headers) == {"Accept-Language": "fr-CH, fr;q=0.9, en;q=0.8"}
    assert plain.locale == ""  # a locale would make every page render
    rendered = scrape(location={"languages": ["de-DE"]}, formats=["markdown", "screenshot"])
    assert rendered.locale == "de-DE" and rendered.headers["Accept-Language"] == "de-DE"
    acted = scrape(location={"languages": ["ja"]}, actions=[{"type": "press", "key": "End"}])
    assert acted.locale == "ja"
    assert scrape(location={}).headers == {}


def test_location_country_and_a_second_accept_language_are_refused() -> None:
    err = refused(lambda: scrape(location={"country": "DE", "languages": ["de"]}))
    assert field_of(err.details[0]) == "location.country" and "country" in err.error
    clash = {"headers": {"accept-language": "en"}, "location": {"languages": ["de"]}}
    assert field_of(refused(lambda: scrape(**clash)).details[0]) == "location.languages"
    with pytest.raises(pydantic.ValidationError):
        scrape(location={"languages": ["not a tag"]})


def test_a_user_agent_header_becomes_the_jobs_user_agent() -> None:
    opts = scrape(headers={"user-agent": "Acme-Bot/2.0", "X-Team": "a"})
    assert opts.user_agent == "Acme-Bot/2.0" and dict(opts.headers) == {"X-Team": "a"}


@pytest.mark.parametrize(
    ("parsers", "max_pages"),
    [(["pdf"], 0), ([{"type": "pdf"}], 0), ([{"type": "pdf", "maxPages": 7, "mode": "fast"}], 7)],
)
def test_the_pdf_parser_maps_its_page_limit(parsers: list[Any], max_pages: int) -> None:
    assert scrape(parsers=parsers).max_pages == max_pages


@pytest.mark.parametrize(
    ("parsers", "named"),
    [
        ([], "parsers"),
        (["pdf", "image"], "parsers[1]"),
        ([{"type": "image"}], "parsers[0]"),
        ([{"type": "pdf", "mode": "ocr"}], "parsers[0].mode"),
        ([{"type": "pdf", "pages": True}], "parsers[0].pages"),
        ([{"type": "pdf", "blocks": True}], "parsers[0].blocks"),
        ([{"type": "pdf", "pageMarkers": True}], "parsers[0].pageMarkers"),
    ],
)
def test_a_parser_setting_pagesift_cannot_honour_is_refused(parsers: list[Any], named: str) -> None:
    assert field_of(refused(lambda: scrape(parsers=parsers)).details[0]) == named


def test_the_change_tracking_format_and_its_git_diff_mode_map_onto_change_tracking() -> None:
    plain = scrape(formats=["markdown", "changeTracking"])
    assert jobs_pb2.FORMAT_CHANGE_TRACKING in plain.formats and not plain.change_tracking_diff
    diff = scrape(formats=["markdown", {"type": "changeTracking", "modes": ["git-diff"]}])
    assert diff.change_tracking_diff
    v1_style = scrape(
        formats=["markdown", "changeTracking"], changeTrackingOptions={"modes": ["git-diff"]}
    )
    assert v1_style.change_tracking_diff


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"formats": ["changeTracking"]}, "formats"),
        ({"formats": ["markdown", {"type": "changeTracking", "modes": ["json"]}]},
         "formats[1].modes[0]"),
        ({"formats": ["markdown", {"type": "changeTracking", "prompt": "x"}]}, "formats[1].prompt"),
        ({"formats": ["markdown", {"type": "changeTracking", "tag": "daily"}]}, "formats[1].tag"),
        ({"formats": ["markdown", {"type": "links", "modes": ["git-diff"]}]}, "formats[1]"),
        ({"formats": ["markdown", "changeTracking"], "changeTrackingOptions": {"schema": {}}},
         "changeTrackingOptions.schema"),
    ],
)  # fmt: skip
def test_change_tracking_settings_pagesift_cannot_honour_are_refused(
    body: dict[str, Any], named: str
) -> None:
    assert field_of(refused(lambda: scrape(**body)).details[0]) == named


@pytest.mark.parametrize(
    "opts",
    [
        jobs_pb2.ScrapeOptions(),
        jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_SCREENSHOT]),
        jobs_pb2.ScrapeOptions(mobile=True),
        jobs_pb2.ScrapeOptions(wait_for=jobs_pb2.WaitFor(selector="a")),
        jobs_pb2.ScrapeOptions(viewport=jobs_pb2.Viewport(width=800)),
        jobs_pb2.ScrapeOptions(timezone="Europe/Paris"),
        jobs_pb2.ScrapeOptions(actions=[jobs_pb2.Action(click=jobs_pb2.ClickAction(selector="a"))]),
        jobs_pb2.ScrapeOptions(headers={"A": "b"}, max_pages=3),
    ],
)
def test_the_gateways_renders_rule_is_the_nodes_browser_fields(
    opts: jobs_pb2.ScrapeOptions,
) -> None:
    assert options.renders(opts) == bool(renderoptions.browser_fields(opts))


def test_a_document_carries_firecrawls_actions_answer() -> None:
    doc = jobs_pb2.Document(
        url=URL,
        action_results=[
            jobs_pb2.ActionResult(index=1, javascript_return='"Title"'),
            jobs_pb2.ActionResult(
                index=2, screenshot=jobs_pb2.Screenshot(data=b"\x89PNG", content_type="image/png")
            ),
            jobs_pb2.ActionResult(index=3, javascript_return="[1, 2]"),
            jobs_pb2.ActionResult(index=4, javascript_return="3.5"),
            jobs_pb2.ActionResult(index=5, javascript_return="null"),
        ],
    )
    out = translate.document(doc)["actions"]
    assert out["screenshots"] == ["data:image/png;base64,iVBORw=="]
    assert out["javascriptReturns"] == [
        {"type": "string", "value": "Title"},
        {"type": "object", "value": [1, 2]},
        {"type": "number", "value": 3.5},
        {"type": "object", "value": None},
    ]
    assert out["scrapes"] == [] and out["pdfs"] == []
    assert "actions" not in translate.document(jobs_pb2.Document(url=URL))


def test_a_document_carries_firecrawls_change_tracking_answer() -> None:
    new = translate.document(jobs_pb2.Document(url=URL, change_status=jobs_pb2.CHANGE_STATUS_NEW))
    assert new["changeTracking"] == {
        "previousScrapeAt": None, "changeStatus": "new", "visibility": "visible"
    }  # fmt: skip
    diff = "--- previous\n+++ current\n@@ -1,2 +1,2 @@\n a\n-b\n+B"
    changed = jobs_pb2.Document(
        url=URL, change_status=jobs_pb2.CHANGE_STATUS_CHANGED, change_diff=diff,
        previous_scrape_at=timestamp_pb2.Timestamp(seconds=1_700_000_000),
    )  # fmt: skip
    out = translate.document(changed)["changeTracking"]
    assert out["changeStatus"] == "changed"
    assert out["previousScrapeAt"] == "2023-11-14T22:13:20Z"
    assert out["diff"]["text"] == diff
    (file,) = out["diff"]["json"]["files"]
    assert (file["from"], file["to"]) == ("previous", "current")
    assert [(c["type"], c.get("ln"), c["content"]) for c in file["chunks"][0]["changes"]] == [
        ("normal", None, " a"), ("del", 2, "-b"), ("add", 2, "+B"),
    ]  # fmt: skip
    assert "changeTracking" not in translate.document(jobs_pb2.Document(url=URL))
