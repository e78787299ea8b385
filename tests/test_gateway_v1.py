"""The gateway's Firecrawl v1 routes, driven by the SDK's own v1 client (V1FirecrawlApp).

A real gateway in front of a real in-process node crawling the demo site (the helpers
of tests/test_gateway.py), and the pure v1 -> v2 mapping (``v1translate``) by tables:
formats, the renamed options, the refusals by name, map's path filter and the
``maxDepth`` regex checked against Firecrawl's own depth count on random paths.
"""

from __future__ import annotations

import asyncio
import random
import re
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
from firecrawl import V1FirecrawlApp, V1ScrapeOptions

from pagesift.core.jobs import patterns
from pagesift.demo.site import CALENDAR_EXCLUDE, Site
from pagesift.gateway import models, v1translate
from pagesift.gateway.httperrors import HttpError
from pagesift.gateway.v1models import (
    BatchScrapeRequestV1,
    CrawlRequestV1,
    MapRequestV1,
    ScrapeRequestV1,
)
from pagesift.v1 import jobs_pb2
from tests.helpers import ALICE, SiteSpec, write_accounts
from tests.test_gateway import PAGE_DOCS, gateway, sdk

DOC = Path(__file__).resolve().parent.parent / "docs" / "gateway.md"


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=8, slow_seconds=0.1, big_bytes=64 * 1024)


def v1(base: str, key: str = "anonymous") -> V1FirecrawlApp:
    return V1FirecrawlApp(api_key=key, api_url=base)


def status_of(err: pytest.ExceptionInfo[requests.HTTPError]) -> int:
    assert err.value.response is not None
    return int(err.value.response.status_code)


def refused(call: Any, *args: Any, **kw: Any) -> HttpError:
    with pytest.raises(HttpError) as err:
        call(*args, **kw)
    assert err.value.status == 400
    return err.value


# ---------------------------------------------------------------- the SDK's v1 client


async def test_v1_sdk_scrape_returns_the_formats_asked_for_and_firecrawl_metadata(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        doc = await sdk(
            v1(base).scrape_url, root + "about.html", formats=["markdown", "html", "links"]
        )
    assert doc.markdown and "About" in doc.markdown
    assert doc.html and "<" in doc.html
    assert doc.links and all(link.startswith("http") for link in doc.links)
    assert doc.rawHtml is None and doc.screenshot is None  # not asked for, not sent
    md = doc.metadata
    assert md["statusCode"] == 200 and md["sourceURL"] == root + "about.html"
    assert md["title"] and md["contentType"].startswith("text/html")


async def test_v1_sdk_crawl_waits_pages_and_is_the_same_job_over_v2(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        app = v1(base)
        job = await sdk(
            app.crawl_url, root, limit=12, exclude_paths=[CALENDAR_EXCLUDE], poll_interval=1
        )
        started = await sdk(app.async_crawl_url, root, limit=4, exclude_paths=[CALENDAR_EXCLUDE])
        assert started.url == f"{base}/v1/crawl/{started.id}"
        for _ in range(300):
            status = await sdk(app.check_crawl_status, started.id)
            if status.status != "scraping":
                break
        errors = await sdk(app.check_crawl_errors, started.id)
        async with http.get(f"{base}/v1/crawl/{started.id}") as resp:
            first = await resp.json()
        async with http.get(f"{base}/v2/crawl/{started.id}") as resp:  # v1's job over v2
            over_v2 = await resp.json()
        async with http.post(f"{base}/v2/crawl", json={"url": root, "limit": 1}) as resp:
            v2_id = (await resp.json())["id"]
        v2_job = await sdk(app.check_crawl_status, v2_id)  # and v2's over v1
    assert job.status == "completed" and job.completed > PAGE_DOCS  # paged by the SDK
    sources = [d.metadata["sourceURL"] for d in job.data]
    assert len(sources) == len(set(sources)) == job.completed == job.creditsUsed
    assert status.status == "completed" and len(status.data) == status.completed == 4
    assert status.next is None
    assert len(first["data"]) == PAGE_DOCS
    assert first["next"] == f"{base}/v1/crawl/{started.id}?skip={PAGE_DOCS}"
    assert over_v2["status"] == "completed" and over_v2["completed"] == 4
    assert over_v2["next"].startswith(f"{base}/v2/crawl/{started.id}?skip=")
    assert errors.robotsBlocked == [] or all(u.startswith(root) for u in errors.robotsBlocked)
    assert v2_job.total >= 1 and v2_job.status in ("scraping", "completed")


async def test_v1_sdk_watcher_gets_every_document_then_done(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        watcher = await sdk(
            v1(base).crawl_url_and_watch, root, limit=5, exclude_paths=[CALENDAR_EXCLUDE]
        )
        documents: list[dict[str, Any]] = []
        done: list[dict[str, Any]] = []
        watcher.add_event_listener("document", lambda e: documents.append(e["data"]))
        watcher.add_event_listener("done", done.append)
        await asyncio.wait_for(watcher.connect(), 60)  # over ws://.../v1/crawl/{id}
    sources = [d["metadata"]["sourceURL"] for d in documents]
    assert len(done) == 1 and done[0]["id"] == watcher.id
    assert len(sources) == len(set(sources)) == 5 and len(watcher.data) == 5


async def test_v1_max_depth_keeps_the_crawl_within_path_depth_and_ignore_sitemap_maps(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        job = await sdk(
            v1(base).crawl_url, root, max_depth=1, ignore_sitemap=True, limit=60, poll_interval=1
        )
    depths = [v1translate.path_depth(d.metadata["sourceURL"]) for d in job.data]
    assert job.status == "completed" and len(depths) == job.completed >= 4
    assert max(depths) == 1 and 0 in depths  # the sections are in, their articles out
    # the sitemap's articles were skipped with it, and the link walk found none
    sources = {d.metadata["sourceURL"] for d in job.data}
    assert not any(s.endswith(".html") and s.count("/") > 3 for s in sources)


async def test_v1_sdk_batch_scrape_returns_one_document_per_url(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    urls = [root + "about.html", root + "docs/", root + "blog/", root + "guides/"]
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        app = v1(base)
        job = await sdk(app.batch_scrape_urls, urls, formats=["markdown"], poll_interval=1)
        started = await sdk(app.async_batch_scrape_urls, urls[:2], formats=["html"])
        for _ in range(300):
            status = await sdk(app.check_batch_scrape_status, started.id)
            if status.status != "scraping":
                break
        errors = await sdk(app.check_batch_scrape_errors, started.id)
        async with http.get(f"{base}/v1/crawl/{started.id}") as resp:
            assert resp.status == 404  # a batch is not a crawl
    assert job.status == "completed" and job.completed == len(urls)
    assert {d.metadata["sourceURL"] for d in job.data} == set(urls)
    assert all(d.markdown for d in job.data)
    assert status.status == "completed" and all(d.html and not d.markdown for d in status.data)
    assert started.url == f"{base}/v1/batch/scrape/{started.id}"
    assert errors.errors == []


async def test_v1_sdk_map_answers_links_as_strings_filtered_by_the_start_path(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        app = v1(base)
        whole = await sdk(app.map_url, root, sitemap_only=True, limit=50)
        docs = await sdk(app.map_url, root + "docs/", limit=50)
        body = {"url": root + "docs/", "filterByPath": False, "limit": 50}  # not in the SDK
        async with http.post(base + "/v1/map", json=body) as resp:
            every = await resp.json()
    assert whole.links and all(isinstance(u, str) for u in whole.links)
    assert any(u.endswith("/about.html") for u in whole.links) and len(whole.links) <= 50
    assert docs.links and all(u.startswith(root + "docs") for u in docs.links)
    assert len(docs.links) > 1  # the section's articles, below its path
    assert every["success"] is True and all(isinstance(u, str) for u in every["links"])
    assert any(not u.startswith(root + "docs") for u in every["links"])


async def test_v1_cancel_stops_a_running_crawl_and_409s_a_finished_one(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base:
        app = v1(base)
        started = await sdk(app.async_crawl_url, root, limit=5000, delay=1, max_concurrency=1)
        assert await sdk(app.cancel_crawl, started.id) == {"success": True, "status": "cancelled"}
        assert (await sdk(app.check_crawl_status, started.id)).status == "cancelled"
        finished = await sdk(app.async_crawl_url, root, limit=1)
        for _ in range(300):
            if (await sdk(app.check_crawl_status, finished.id)).status != "scraping":
                break
        with pytest.raises(requests.HTTPError, match="Conflict") as err:
            await sdk(app.cancel_crawl, finished.id)
        assert status_of(err) == 409


async def test_v1_unknown_keys_and_unhonoured_options_are_400_naming_them(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        cases = [
            ("/v1/scrape", {"url": root, "bogusKey": 1}, "'bogusKey'"),
            ("/v1/crawl", {"url": root, "sitemap": "skip"}, "'sitemap'"),  # v2's name
            ("/v1/crawl", {"url": root, "scrapeOptions": {"nope": 1}}, "'scrapeOptions.nope'"),
            ("/v1/map", {"url": root, "sitemap": "only"}, "'sitemap'"),
            ("/v1/batch/scrape", {"urls": [root], "extra": []}, "'extra'"),
            ("/v1/scrape", {"url": root, "formats": ["images"]}, "formats[0]"),  # v2 only
            # v1's jsonOptions go with the json format (as Firecrawl v1), alone they are refused
            (
                "/v1/scrape",
                {"url": root, "jsonOptions": {"prompt": "x"}},
                "jsonOptions: jsonOptions goes with the 'json' format",
            ),
            ("/v1/crawl", {"url": root, "maxDepth": 500}, "maxDepth"),
            ("/v1/map", {"url": root, "maxDepth": 2}, "maxDepth"),
            ("/v1/map", {"url": root + "docs/", "includePaths": ["a"]}, "includePaths"),
        ]
        for path, body, named in cases:
            async with http.post(base + path, json=body) as resp:
                answer = await resp.json()
            assert resp.status == 400, (path, answer)
            assert answer["success"] is False and named in answer["error"], (path, answer)
        app = v1(base)
        # no model endpoint on this node: the node refuses the model's formats by field
        with pytest.raises(requests.HTTPError, match=r"FORMAT_SUMMARY|model endpoint") as err:
            await sdk(app.scrape_url, root, formats=["summary"])
        assert status_of(err) == 400
        with pytest.raises(requests.HTTPError, match="useIndex"):
            await sdk(app.map_url, root, use_index=True)
        with pytest.raises(requests.HTTPError, match="proxy"):
            opts = V1ScrapeOptions(proxy="stealth")
            await sdk(app.crawl_url, root, scrape_options=opts, poll_interval=1)


async def test_v1_unknown_job_is_404_and_a_bad_key_401(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with gateway(tmp_path / "data", accounts_file=str(accounts)) as base:
        with pytest.raises(requests.HTTPError) as err:
            await sdk(v1(base, "psk_test_wrong_0123456789").scrape_url, root + "about.html")
        assert status_of(err) == 401
        with pytest.raises(requests.HTTPError) as err:
            await sdk(v1(base, "psk_test_wrong_0123456789").check_crawl_status, "x")
        assert status_of(err) == 401
        good = v1(base, ALICE.key)
        assert (await sdk(good.scrape_url, root + "about.html")).markdown
        for call in (good.check_crawl_status, good.check_batch_scrape_errors):
            with pytest.raises(requests.HTTPError) as err:
                await sdk(call, str(uuid.uuid4()))
            assert status_of(err) == 404


# ---------------------------------------------------------------- the pure mapping


def test_v1_crawl_options_map_onto_v2s_meaning() -> None:
    req = v1translate.crawl_request(
        CrawlRequestV1.model_validate(
            {
                "url": "http://h.test/docs/", "includePaths": ["^/docs/a"], "limit": 7,
                "maxDiscoveryDepth": 3, "ignoreSitemap": True, "allowBackwardLinks": True,
                "allowSubdomains": True, "ignoreRobotsTxt": True, "delay": 2,
                "deduplicateSimilarURLs": False, "regexOnFullURL": True, "maxConcurrency": 4,
                "scrapeOptions": {"formats": ["rawHtml", "screenshot@fullPage"], "timeout": 9000},
                "origin": "python-sdk", "integration": "langchain",
            }
        )
    )  # fmt: skip
    assert (req.limit, req.max_depth, req.max_concurrency, req.delay) == (7, 3, 4, 2.0)
    assert list(req.include_paths) == ["^/docs/a"] and list(req.exclude_paths) == []
    assert req.sitemap == jobs_pb2.SITEMAP_MODE_SKIP and req.crawl_entire_domain
    assert req.allow_subdomains and req.options.ignore_robots_txt and req.regex_on_full_url
    assert not req.dedupe_similar_urls
    assert list(req.options.formats) == [jobs_pb2.FORMAT_RAW_HTML, jobs_pb2.FORMAT_SCREENSHOT]
    assert req.options.screenshot.full_page and req.options.timeout.ToMilliseconds() == 9000
    plain = v1translate.crawl_request(CrawlRequestV1.model_validate({"url": "http://h.test/"}))
    assert plain.sitemap == jobs_pb2.SITEMAP_MODE_INCLUDE and not plain.crawl_entire_domain
    assert plain.dedupe_similar_urls and plain.limit == 0 and plain.max_depth == 0
    newer = {"url": "http://h.test/", "allowBackwardLinks": True, "crawlEntireDomain": False}
    assert not v1translate.crawl_request(CrawlRequestV1.model_validate(newer)).crawl_entire_domain


def test_v1_webhook_given_as_a_url_is_a_webhook_of_every_event() -> None:
    body = {"url": "http://h.test/", "webhook": "http://hooks.test/in"}
    req = v1translate.crawl_request(CrawlRequestV1.model_validate(body))
    assert req.webhook.url == "http://hooks.test/in" and len(req.webhook.event_types) >= 4
    batch = v1translate.batch_request(
        BatchScrapeRequestV1.model_validate(
            {"urls": ["http://h.test/"], "webhook": {"url": "http://hooks.test/in",
             "events": ["completed"]}, "ignoreInvalidURLs": True, "maxConcurrency": 2}
        )
    )  # fmt: skip
    assert batch.webhook.url == "http://hooks.test/in" and batch.ignore_invalid_urls
    assert list(batch.webhook.event_types) == [jobs_pb2.WEBHOOK_EVENT_COMPLETED]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"formats": ["images"]}, "formats[0]"),
        ({"formats": ["markdown", "extract"]}, "extract"),  # the format without its options
        ({"formats": ["screenshot", "screenshot@fullPage"]}, "formats"),
        ({"parsePDF": False}, "parsePDF"),
        ({"extract": {"prompt": "x"}}, "extract"),
        ({"jsonOptions": {"prompt": "x"}}, "jsonOptions"),
        ({"geolocation": {"country": "DE"}}, "location.country"),  # as v2's location
        ({"__experimental_omce": True}, "__experimental_omce"),
        ({"agent": {"model": "FIRE-1", "prompt": "x"}}, "agent"),
        ({"proxy": "stealth"}, "proxy"),
        ({"fastMode": True}, "fastMode"),
        ({"zeroDataRetention": True}, "zeroDataRetention"),
    ],
)
def test_v1_scrape_options_pagesift_cannot_honour_are_refused_by_name(
    body: dict[str, Any], named: str
) -> None:
    err = refused(
        v1translate.scrape_request, ScrapeRequestV1.model_validate({"url": "http://h/", **body})
    )
    assert err.error.startswith(named + ":"), err.error


def test_v1_scrape_keeps_v2s_defaults_and_its_timeout() -> None:
    v2, opts = v1translate.scrape_request(
        ScrapeRequestV1.model_validate(
            {"url": "http://h/", "timeout": 30000, "parsePDF": True, "blockAds": False,
             "onlyMainContent": False, "waitFor": 500, "maxAge": 60000, "origin": "sdk"}
        )
    )  # fmt: skip
    assert v2.timeout == 30000 and not opts.only_main_content and opts.remove_base64_images
    assert opts.wait_for.duration.ToMilliseconds() == 500
    assert opts.max_age.ToMilliseconds() == 60000
    _, cached = v1translate.scrape_request(
        ScrapeRequestV1.model_validate(
            {"url": "http://h/", "__experimental_cache": True, "geolocation": {"languages": ["de"]}}
        )
    )
    assert cached.max_age.ToMilliseconds() == 4 * 3600 * 1000
    assert cached.headers["Accept-Language"].startswith("de")
    crawl = {"url": "http://h/", "scrapeOptions": {"parsePDF": False}}
    err = refused(v1translate.crawl_request, CrawlRequestV1.model_validate(crawl))
    assert err.error.startswith("scrapeOptions.parsePDF:")


def test_v1_map_maps_its_sitemap_flags_and_filters_by_the_start_path() -> None:
    def args(body: dict[str, Any]) -> dict[str, Any]:
        return v1translate.map_arguments(MapRequestV1.model_validate(body))[1]

    root = args({"url": "http://h.test/"})
    assert root["sitemap"] == jobs_pb2.SITEMAP_MODE_INCLUDE and root["include_paths"] == []
    assert root["allow_subdomains"] and root["ignore_query_parameters"]
    assert args({"url": "http://h.test/", "sitemapOnly": True})["sitemap"] == (
        jobs_pb2.SITEMAP_MODE_ONLY
    )
    skip = args({"url": "http://h.test/", "ignoreSitemap": True, "includeSubdomains": False})
    assert skip["sitemap"] == jobs_pb2.SITEMAP_MODE_SKIP and not skip["allow_subdomains"]
    docs = args({"url": "http://h.test/docs/", "excludePaths": ["x"], "search": "api"})
    assert docs["include_paths"] == [v1translate.path_prefix_regex("/docs/")]
    assert docs["exclude_paths"] == ["x"] and docs["search"] == "api"
    free = args({"url": "http://h.test/docs/", "filterByPath": False, "includePaths": ["a"]})
    assert free["include_paths"] == ["a"]
    for key, value in [("maxDepth", 3), ("allowExternalLinks", True), ("delay", 1),
                       ("deduplicateSimilarURLs", False), ("useMock", "x"),
                       ("useIndex", True), ("zeroDataRetention", True)]:  # fmt: skip
        body = {"url": "http://h.test/", key: value}
        err = refused(v1translate.map_arguments, MapRequestV1.model_validate(body))
        assert err.error.startswith(key + ":"), err.error
    kept = {"url": "http://h.test/", "deduplicateSimilarURLs": True, "allowSubdomains": False}
    assert args(kept)["include_paths"] == []  # Firecrawl's defaults, sent: no change


def test_path_prefix_regex_is_firecrawls_starts_with() -> None:
    cases = {
        "/docs/": {"/docs": True, "/docs/": True, "/docs/a/b": True, "/docsx": False, "/": False},
        "/docs/intro": {"/docs/intro": True, "/docs/introduction": True, "/docs/": False},
        "/a.b(c)-d~/": {"/a.b(c)-d~/x": True, "/aXb(c)-d~/x": False},
    }
    for start, paths in cases.items():
        f = patterns.PathFilter([v1translate.path_prefix_regex(start)], [])
        for path, allowed in paths.items():
            assert f.allows("http://h.test" + path) is allowed, (start, path)


def test_max_depth_regex_counts_path_segments_as_firecrawl_does() -> None:
    rng = random.Random(22)
    words = ["a", "i", "in", "index", "index.", "index.ph", "index.php", "index.html",
             "index.htmlx", "index.phpp", "xindex.html", "b.html", "", "%2F"]  # fmt: skip
    for segments in (1, 2, 3, 5):
        regex = v1translate.path_depth_regex(segments)
        on_path = patterns.PathFilter([], [regex])
        on_url = patterns.PathFilter([], [regex], full_url=True)
        for _ in range(1500):
            path = "/" + "/".join(rng.choice(words) for _ in range(rng.randint(0, 7)))
            url = "http://h.test:8080" + path + rng.choice(["", "/", "?q=/a/b/c/d/e"])
            shallow = v1translate.path_depth(url) < segments
            assert on_path.allows(url) is shallow, (segments, url)
            assert on_url.allows(url) is shallow, (segments, url)
    patterns.compile_patterns([v1translate.path_depth_regex(v1translate.MAX_PATH_SEGMENTS)])


def test_max_depth_counts_from_the_start_urls_depth() -> None:
    def exclude(url: str, depth: int) -> list[str]:
        body = {"url": url, "maxDepth": depth}
        return list(v1translate.crawl_request(CrawlRequestV1.model_validate(body)).exclude_paths)

    assert exclude("http://h.test/", 2) == [v1translate.path_depth_regex(3)]
    assert exclude("http://h.test/a/b/index.html", 3) == [v1translate.path_depth_regex(6)]
    assert exclude("http://h.test/", 10_000) == []  # deeper than any URL the node takes
    err = refused(
        v1translate.crawl_request,
        CrawlRequestV1.model_validate({"url": "http://h/a/b", "maxDepth": 1}),
    )
    assert err.error.startswith("url:")  # Firecrawl v1's own check
    err = refused(
        v1translate.crawl_request,
        CrawlRequestV1.model_validate({"url": "http://h/", "maxDepth": 150}),
    )
    assert err.error.startswith("maxDepth:")
    both = {"url": "http://h.test/", "maxDepth": 1, "excludePaths": ["^/x"]}
    assert list(v1translate.crawl_request(CrawlRequestV1.model_validate(both)).exclude_paths) == [
        "^/x", v1translate.path_depth_regex(2)
    ]  # fmt: skip


def _aliases(*bodies: type[Any]) -> set[str]:
    return {f.alias or name for body in bodies for name, f in body.model_fields.items()}


def test_the_docs_v1_table_lists_every_field_v1_spells_differently() -> None:
    text = DOC.read_text().split("## The v1 API", 1)[1].split("\n## ", 1)[0]
    table = set(re.findall(r"^\| `([^`]+)` \|", text, re.M))
    v1 = _aliases(ScrapeRequestV1, CrawlRequestV1, BatchScrapeRequestV1, MapRequestV1)
    v2 = _aliases(
        models.ScrapeRequest, models.CrawlRequest, models.BatchScrapeRequest, models.MapRequest
    )
    assert v1 - v2 <= table, "v1 fields without v2's name must be in the docs' v1 table"
    assert table <= v1, "the docs' v1 table names a field v1's models do not have"
    named = set(re.findall(r"`(\w+)`", text.split("v1's map also accepts", 1)[1]))
    map_refused = {name for name, _ in v1translate.MAP_CRAWLER_OPTIONS.values()}
    assert map_refused <= named  # the map paragraph names each crawl option it refuses
