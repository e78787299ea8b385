"""The gateway's HTTP contract, route by route: status codes and the exact JSON shapes.

Plain aiohttp requests (not the SDK, which tolerates extra or missing keys), against a
real gateway app on a free loopback port in front of a real in-process node and the
demo site. Checked: every route's success shape; every error as Firecrawl's
``{success: false, error, code?, details?}`` with its status (400 validation and
strictness at nested levels, 401 key, 402 daily quota, 403 guarded URL, 404 unknown or
other-kind job, 408 scrape timeout, 409 finished job, 413 body bound, 429 and 503 with
``Retry-After``); ``?skip``/``?limit`` validation; the 10 MiB cap of one status page
with ``next`` at the first document left out (the node's own GetJob byte bound is
raised here, so the gateway's cap is the one that cuts). The cross-route checks (401 for
a bad key, 404 for an unknown job, 413, an unknown key named) walk every route the app
registers, v1 and the account routes included, so a route added later is covered.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pagesift.demo.site import (
    CALENDAR_EXCLUDE,
    CrawlSettings,
    Site,
    build_site,
    normalize_url,
    serve_site,
)
from pagesift.gateway.app import make_app
from pagesift.gateway.clients import Clients
from pagesift.gateway.handling import MAX_BODY_BYTES, PAGE_BYTES
from pagesift.v1 import jobs_pb2
from tests.firecrawlerrors import names
from tests.helpers import (
    DAILY,
    SOLO,
    SiteSpec,
    in_process_node,
    serve_handler,
    write_accounts,
)

MiB = 1024 * 1024
ERROR_KEYS = {"success", "error", "code", "details"}
STATUS_KEYS = {"success", "status", "total", "completed", "creditsUsed", "expiresAt", "data"}
DOCUMENT_KEYS = {"markdown", "html", "rawHtml", "links", "images", "screenshot", "metadata"}
ERROR_ITEM_KEYS = {"id", "timestamp", "url", "code", "error"}
#: the site's slow page answers within the node's read timeout, its big page fits
FAST: CrawlSettings = {"slow_times_out": False, "big_too_large": False}


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=8, slow_seconds=0.1, big_bytes=64 * 1024)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: Any
    size: int  # bytes of the body as sent


@contextlib.asynccontextmanager
async def serve_gateway(addresses: list[str], **client_kw: Any) -> AsyncIterator[str]:
    """The gateway app (``make_app``, default paging) on a free loopback port in front of
    ``addresses``; yields its base URL."""
    runner = web.AppRunner(make_app(Clients(addresses, **client_kw)), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def node_and_gateway(data: Path, **node_kw: Any) -> AsyncIterator[str]:
    async with in_process_node(data, **node_kw) as node, serve_gateway([node.address]) as base:
        yield base


async def ask(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    *,
    key: str | None = None,
    raw: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    hdrs = dict(headers or {})
    if key is not None:
        hdrs["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    if data is not None:
        hdrs.setdefault("Content-Type", "application/json")
    timeout = aiohttp.ClientTimeout(total=60)
    async with http.request(method, url, data=data, headers=hdrs, timeout=timeout) as resp:
        text = await resp.read()
        assert resp.content_type == "application/json", (resp.status, text[:200])
        return Answer(resp.status, resp.headers, json.loads(text), len(text))


def assert_error(a: Answer, status: int, code: str | None = None) -> dict[str, Any]:
    """``a`` is Firecrawl's error body with ``status`` (and ``code``); 429 and 503 carry
    ``Retry-After``, other statuses do not."""
    assert a.status == status, (a.status, a.body)
    body = a.body
    assert isinstance(body, dict) and {"success", "error"} <= set(body) <= ERROR_KEYS, body
    assert body["success"] is False
    assert isinstance(body["error"], str) and body["error"], body
    if code is not None:
        assert body.get("code") == code, body
    if status in (429, 503):
        assert int(a.headers["Retry-After"]) >= 1
    else:
        assert "Retry-After" not in a.headers
    return body


def assert_document(doc: dict[str, Any], formats: set[str], first: str) -> None:
    """A document of ``formats`` (an empty one, e.g. no links, is left out; ``first``
    never is) and Firecrawl's metadata."""
    assert set(doc) <= DOCUMENT_KEYS and first in doc, sorted(doc)
    assert set(doc) - {"metadata"} <= formats, sorted(doc)
    md = doc["metadata"]
    assert md["statusCode"] == 200 and md["contentType"].startswith("text/html")
    assert md["sourceURL"].startswith("http://127.0.0.1:") and md["url"]
    assert md["cacheState"] == "miss"


def rfc3339(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


async def finished(http: aiohttp.ClientSession, url: str, key: str | None = None) -> Answer:
    """GET ``url`` (a status page) until the job is no longer scraping (bounded)."""
    for _ in range(600):
        a = await ask(http, "GET", url, key=key)
        assert a.status == 200, a.body
        if a.body["status"] != "scraping":
            return a
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not finish")


# ---------------------------------------------------------------- success shapes


async def test_every_route_answers_its_firecrawl_success_shape(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    async with node_and_gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        a = await ask(http, "POST", base + "/v2/scrape", {"url": root + "about.html"})
        assert a.status == 200 and set(a.body) == {"success", "data"} and a.body["success"]
        assert_document(a.body["data"], {"markdown"}, "markdown")  # Firecrawl's default format
        assert a.body["data"]["metadata"]["sourceURL"] == root + "about.html"

        a = await ask(http, "POST", base + "/v2/map", {"url": root, "limit": 5})
        assert a.status == 200 and set(a.body) == {"success", "links"} and a.body["success"]
        assert 0 < len(a.body["links"]) <= 5
        for link in a.body["links"]:
            assert {"url"} <= set(link) <= {"url", "title", "description"}

        options = {"formats": ["markdown", "links"]}
        crawl = {"url": root, "excludePaths": [CALENDAR_EXCLUDE], "scrapeOptions": options}
        a = await ask(http, "POST", base + "/v2/crawl", crawl)
        assert a.status == 200 and set(a.body) == {"success", "id", "url"}, a.body
        crawl_id = a.body["id"]
        assert a.body["url"] == f"{base}/v2/crawl/{crawl_id}"
        done = await finished(http, a.body["url"])
        assert set(done.body) == STATUS_KEYS, sorted(done.body)  # no next: done, all here
        assert done.body["status"] == "completed" and done.body["success"] is True
        n = len(s.expected_documents(root, **FAST))
        assert done.body["total"] >= done.body["completed"] == done.body["creditsUsed"] == n
        assert len(done.body["data"]) == n
        assert rfc3339(done.body["expiresAt"]) > dt.datetime.now(dt.UTC)
        for doc in done.body["data"]:
            assert_document(doc, {"markdown", "links"}, "markdown")
        assert any("links" in doc for doc in done.body["data"])
        sources = {normalize_url(d["metadata"]["sourceURL"]) for d in done.body["data"]}
        assert sources == s.expected_documents(root, **FAST)

        a = await ask(http, "GET", f"{base}/v2/crawl/{crawl_id}/errors")
        assert a.status == 200 and set(a.body) == {"success", "errors", "robotsBlocked"}
        expected = s.expected_errors(root, **FAST)
        failed = {k: v for k, v in expected.items() if v != "robots_disallowed"}
        listed = {normalize_url(e["url"]): e["code"] for e in a.body["errors"]}
        assert failed.items() <= listed.items() <= failed.items()  # robots ones only apart
        for e in a.body["errors"]:
            assert set(e) == ERROR_ITEM_KEYS and e["error"] and rfc3339(e["timestamp"])
        blocked = {k for k, v in expected.items() if v == "robots_disallowed"}
        assert {normalize_url(u) for u in a.body["robotsBlocked"]} == blocked

        a = await ask(http, "DELETE", f"{base}/v2/crawl/{crawl_id}")
        assert_error(a, 409, "CONFLICT")  # it completed: nothing to cancel

        slow = {"url": root, "limit": 500, "delay": 1, "maxConcurrency": 1}
        a = await ask(http, "POST", base + "/v2/crawl", slow)
        running = a.body["id"]
        a = await ask(http, "DELETE", f"{base}/v2/crawl/{running}")
        assert a.status == 200 and a.body == {"success": True, "status": "cancelled"}
        a = await ask(http, "GET", f"{base}/v2/crawl/{running}")
        assert a.body["status"] == "cancelled"

        urls = [root + "about.html", root + "docs/", "not a url"]
        batch = {"urls": urls, "ignoreInvalidURLs": True, "formats": ["html"]}
        a = await ask(http, "POST", base + "/v2/batch/scrape", batch)
        assert a.status == 200, a.body
        assert set(a.body) == {"success", "id", "url", "invalidURLs"}
        assert a.body["invalidURLs"] == ["not a url"]
        batch_id = a.body["id"]
        assert a.body["url"] == f"{base}/v2/batch/scrape/{batch_id}"
        done = await finished(http, a.body["url"])
        assert set(done.body) == STATUS_KEYS and done.body["completed"] == 2
        for doc in done.body["data"]:
            assert_document(doc, {"html"}, "html")
        assert {d["metadata"]["sourceURL"] for d in done.body["data"]} == set(urls[:2])
        a = await ask(http, "GET", f"{base}/v2/batch/scrape/{batch_id}/errors")
        assert a.status == 200 and a.body == {"success": True, "errors": [], "robotsBlocked": []}
        assert_error(await ask(http, "DELETE", f"{base}/v2/batch/scrape/{batch_id}"), 409)

        a = await ask(http, "POST", base + "/v2/batch/scrape", {"urls": urls[:2]})
        assert set(a.body) == {"success", "id", "url"}  # no invalidURLs unless asked for


# ---------------------------------------------------------------- 404


async def test_unknown_jobs_and_jobs_of_the_other_kind_are_404_on_every_job_route(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with node_and_gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        a = await ask(http, "POST", base + "/v2/crawl", {"url": root, "limit": 1})
        crawl_id = a.body["id"]
        a = await ask(http, "POST", base + "/v2/batch/scrape", {"urls": [root]})
        batch_id = a.body["id"]
        cases = [
            ("crawl", str(uuid.uuid4())),
            ("crawl", "not-a-job-id"),
            ("crawl", batch_id),
            ("batch/scrape", str(uuid.uuid4())),
            ("batch/scrape", "not-a-job-id"),
            ("batch/scrape", crawl_id),
        ]
        for route, job in cases:
            for method, tail in (("GET", ""), ("GET", "/errors"), ("DELETE", "")):
                a = await ask(http, method, f"{base}/v2/{route}/{job}{tail}")
                assert_error(a, 404, "NOT_FOUND")
        # both jobs are still there and of their own kind
        assert (await ask(http, "GET", f"{base}/v2/crawl/{crawl_id}")).status == 200
        assert (await ask(http, "GET", f"{base}/v2/batch/scrape/{batch_id}")).status == 200


# ---------------------------------------------------------------- every route of the app

#: routes with no key and no Firecrawl body (probes and documents)
OPEN_ROUTES = {
    "/healthz", "/metrics", "/v2/openapi.json",
    *(f"/{v}/health/{p}" for v in ("v0", "v1") for p in ("liveness", "readiness")),
}  # fmt: skip


def app_routes() -> list[tuple[str, str]]:
    """(method, path template) of every keyed route the gateway registers (v1, v2, the
    account routes, and any added later): the cross-route checks cannot miss one."""
    app = make_app(Clients([]))
    routes = {
        (r.method, r.resource.canonical)
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    return sorted((m, p) for m, p in routes if p not in OPEN_ROUTES)


def valid_body(path: str, root: str) -> dict[str, Any] | None:
    """A minimal body each POST route accepts (None for the other methods)."""
    if path.endswith("/batch/scrape"):
        return {"urls": [root]}
    if path.endswith("/extract"):
        return {"urls": [root], "prompt": "x"}
    if path.endswith("/params-preview"):
        return {"url": root, "prompt": "the docs pages only"}
    return {"url": root}


async def test_every_keyed_route_refuses_a_bad_key_with_401_in_firecrawls_shape(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    routes = app_routes()
    assert len(routes) >= 28 and ("GET", "/v1/crawl/{id}") in routes
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with (
        node_and_gateway(tmp_path / "data", accounts_file=str(accounts)) as base,
        aiohttp.ClientSession() as http,
    ):
        for method, path in routes:
            body = valid_body(path, root) if method == "POST" else None
            url = base + path.replace("{id}", str(uuid.uuid4()))
            a = await ask(http, method, url, body, key="psk_test_wrong_0123456789")
            assert a.status == 401, (method, path, a.body)
            assert_error(a, 401, "UNAUTHORIZED")


async def test_every_route_of_both_versions_keeps_the_contract_for_jobs_and_bodies(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    routes = app_routes()
    posts = [p for m, p in routes if m == "POST"]
    jobs = [(m, p) for m, p in routes if "{id}" in p]
    assert {"/v1/crawl", "/v2/crawl", "/v1/batch/scrape", "/v2/batch/scrape"} <= set(posts)
    over = b'{"url": "' + b"x" * MAX_BODY_BYTES + b'"}'
    async with node_and_gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        for method, path in jobs:  # an unknown job, on every job route of v1 and v2
            a = await ask(http, method, base + path.replace("{id}", str(uuid.uuid4())))
            assert a.status == 404, (method, path, a.body)
            assert_error(a, 404, "NOT_FOUND")
        for path in posts:
            a = await ask(http, "POST", base + path, raw=over)
            assert a.status == 413, (path, a.body)
            assert_error(a, 413, "PAYLOAD_TOO_LARGE")
            body = {**(valid_body(path, root) or {}), "notAFirecrawlKey": 1}
            a = await ask(http, "POST", base + path, body)
            assert a.status == 400, (path, a.body)
            assert "'notAFirecrawlKey'" in assert_error(a, 400, "BAD_REQUEST")["error"]


# ---------------------------------------------------------------- 400 and 413


async def test_unknown_keys_are_400_naming_the_key_at_every_level(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    shot = {"type": "screenshot", "viewport": {"width": 10, "height": 10, "depth": 3}}
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("/v2/scrape", {"url": root, "bogusKey": 1}, "bogusKey"),
        (
            "/v2/scrape",
            {"url": root, "formats": [{"type": "html", "bogus": 1}]},
            "formats[0].bogus",
        ),
        ("/v2/scrape", {"url": root, "formats": [shot]}, "formats[0].viewport.depth"),
        ("/v2/crawl", {"url": root, "maxDepth": 2}, "maxDepth"),
        ("/v2/crawl", {"url": root, "scrapeOptions": {"nope": True}}, "scrapeOptions.nope"),
        (
            "/v2/crawl",
            {"url": root, "scrapeOptions": {"formats": [{"type": "markdown", "x": 1}]}},
            "scrapeOptions.formats[0].x",
        ),
        ("/v2/batch/scrape", {"urls": [root], "extra": []}, "extra"),
        ("/v2/map", {"url": root, "maxDepth": 2}, "maxDepth"),
    ]
    async with node_and_gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        for path, body, named in cases:
            a = await ask(http, "POST", base + path, body)
            answer = assert_error(a, 400, "BAD_REQUEST")
            assert f"'{named}'" in answer["error"], (path, named, answer)
            assert named in names(answer), (named, answer)

        bad: list[tuple[str, bytes, str]] = [
            ("/v2/scrape", b"", "not JSON"),
            ("/v2/scrape", b"{not json", "not JSON"),
            ("/v2/crawl", b"[1, 2]", "object"),
            ("/v2/map", b'"just a string"', "object"),
            ("/v2/scrape", json.dumps({"url": 5}).encode(), "(url)"),
            ("/v2/crawl", json.dumps({"url": root, "limit": "many"}).encode(), "(limit)"),
            ("/v2/crawl", json.dumps({"url": root, "limit": 0}).encode(), "(limit)"),
            ("/v2/batch/scrape", json.dumps({"urls": []}).encode(), "(urls)"),
            ("/v2/crawl", json.dumps({"url": root, "sitemap": "all"}).encode(), "(sitemap)"),
            ("/v2/crawl", json.dumps({"limit": 3}).encode(), "(url)"),
        ]
        for path, raw, said in bad:
            answer = assert_error(await ask(http, "POST", base + path, raw=raw), 400, "BAD_REQUEST")
            assert said in answer["error"], (path, raw, answer)


async def test_bodies_past_the_bound_are_413_on_every_post_route(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    over = b'{"url": "' + b"x" * MAX_BODY_BYTES + b'"}'
    under = json.dumps({"url": root, "headers": {"X-Pad": "x" * (MAX_BODY_BYTES // 2)}, "no": 1})
    async with node_and_gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        for path in ("/v2/scrape", "/v2/crawl", "/v2/batch/scrape", "/v2/map"):
            a = await ask(http, "POST", base + path, raw=over)
            assert_error(a, 413, "PAYLOAD_TOO_LARGE")
        a = await ask(http, "POST", base + "/v2/scrape", raw=under.encode())
        assert "'no'" in assert_error(a, 400)["error"]  # under the bound: read and validated


async def test_skip_and_limit_are_validated_and_limit_is_kept_in_next(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    s, root = site
    async with node_and_gateway(tmp_path) as base, aiohttp.ClientSession() as http:
        body = {"url": root, "excludePaths": [CALENDAR_EXCLUDE]}
        job_url = (await ask(http, "POST", base + "/v2/crawl", body)).body["url"]
        done = await finished(http, job_url)
        total = len(done.body["data"])
        for query, said in [
            ("skip=-1", "skip must not be negative"),
            ("skip=x", "skip must be an integer"),
            ("skip=1.5", "skip must be an integer"),
            ("limit=-3", "limit must not be negative"),
            ("limit=ten", "limit must be an integer"),
        ]:
            a = await ask(http, "GET", f"{job_url}?{query}")
            assert said in assert_error(a, 400, "BAD_REQUEST")["error"]
        a = await ask(http, "GET", f"{job_url}?limit=0")  # 0: the default page
        assert a.status == 200 and len(a.body["data"]) == total and "next" not in a.body
        a = await ask(http, "GET", f"{job_url}?skip={total - 2}")
        assert len(a.body["data"]) == 2 and "next" not in a.body
        seen: list[str] = []
        url: str | None = f"{job_url}?limit=3"
        for _ in range(total):
            assert url is not None
            a = await ask(http, "GET", url)
            assert a.status == 200 and 0 < len(a.body["data"]) <= 3
            seen += [normalize_url(d["metadata"]["sourceURL"]) for d in a.body["data"]]
            url = a.body.get("next")
            if url is None:
                break
            assert url == f"{job_url}?skip={len(seen)}&limit=3"
        assert url is None and len(seen) == len(set(seen)) == total
        assert set(seen) == s.expected_documents(root, **FAST)


# ---------------------------------------------------------------- the 10 MiB page cap


async def test_a_status_page_stops_under_10_mib_with_next_at_the_first_document_left_out(
    tmp_path: Path,
) -> None:
    big = 3 * MiB  # each document is one copy of big.html as rawHtml: ~3 MiB of JSON
    s = build_site(8, slow_seconds=0.1, big_bytes=big)
    runner, root = await serve_site(s)
    copies = [f"{root}files/big.html?copy={i}" for i in range(5)]  # ~15 MiB in all
    try:
        async with (
            in_process_node(tmp_path, max_body_bytes=4 * MiB, max_response_bytes=48 * MiB) as node,
            serve_gateway([node.address]) as base,
            aiohttp.ClientSession() as http,
        ):
            body = {"urls": copies, "formats": ["rawHtml"]}
            job_url = (await ask(http, "POST", base + "/v2/batch/scrape", body)).body["url"]
            first = await finished(http, job_url)
            assert first.body["status"] == "completed" and first.body["completed"] == 5
            assert first.size <= PAGE_BYTES  # the whole JSON answer, as sent
            kept = len(first.body["data"])
            assert kept == 3, (kept, first.size)  # a fourth copy would pass 10 MiB
            assert first.body["next"] == f"{job_url}?skip=3"
            rest = await ask(http, "GET", first.body["next"])
            assert rest.status == 200 and "next" not in rest.body
            assert len(rest.body["data"]) == 2
            docs = first.body["data"] + rest.body["data"]
            assert sorted(d["metadata"]["sourceURL"] for d in docs) == sorted(copies)
            assert all(len(d["rawHtml"]) == big for d in docs)
            # ``next`` names the first document left out: the node's document at index 3
            resp = await node.stub.GetJob(
                jobs_pb2.GetJobRequest(id=job_url.rsplit("/", 1)[1], skip=3, limit=1)
            )
            assert rest.body["data"][0]["metadata"]["sourceURL"] == resp.documents[0].url
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- 401, 402, 403, 429


async def test_account_errors_are_401_for_a_key_402_for_the_daily_quota_429_for_concurrency(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with (
        node_and_gateway(tmp_path / "data", accounts_file=str(accounts)) as base,
        aiohttp.ClientSession() as http,
    ):
        refused: list[dict[str, str]] = [
            {"Authorization": "Bearer psk_test_wrong_0123456789"},
            {},  # anonymous, refused by a node with an accounts file
            {"Authorization": f"Basic {DAILY.key}"},  # not a bearer token
        ]
        for headers in refused:
            for method, path, body in [
                ("POST", "/v2/scrape", {"url": root}),
                ("POST", "/v2/crawl", {"url": root}),
                ("GET", f"/v2/crawl/{uuid.uuid4()}", None),
            ]:
                a = await ask(http, method, base + path, body, headers=headers)
                assert_error(a, 401, "UNAUTHORIZED")

        pages = [root + p for p in ("about.html", "docs/", "blog/", "guides/", "reference/")]
        pages += [root + "landing/spring-launch.html", root + "landing/partner-program.html"]
        pages += [root + "landing/enterprise-trial.html", root + "old/launch.html", root]
        assert len(pages) == 10  # DAILY's pages_per_day
        a = await ask(http, "POST", base + "/v2/batch/scrape", {"urls": pages}, key=DAILY.key)
        assert a.status == 200, a.body
        done = await finished(http, a.body["url"], DAILY.key)
        assert done.body["completed"] == 10
        for path, body in [("/v2/scrape", {"url": root}), ("/v2/crawl", {"url": root})]:
            a = await ask(http, "POST", base + path, body, key=DAILY.key)
            assert "pages_per_day" in assert_error(a, 402, "QUOTA_EXCEEDED")["error"]

        slow = {"url": root, "limit": 500, "delay": 1, "maxConcurrency": 1}
        first = await ask(http, "POST", base + "/v2/crawl", slow, key=SOLO.key)
        assert first.status == 200
        more: list[tuple[str, Any]] = [
            ("/v2/crawl", {"url": root}),
            ("/v2/batch/scrape", {"urls": [root]}),
        ]
        for path, again in more:
            a = await ask(http, "POST", base + path, again, key=SOLO.key)
            assert_error(a, 429, "RATE_LIMIT_EXCEEDED")
        a = await ask(http, "DELETE", f"{base}/v2/crawl/{first.body['id']}", key=SOLO.key)
        assert a.status == 200


async def test_a_url_the_address_guard_refuses_is_403_url_blocked(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with (
        node_and_gateway(tmp_path, allow_private_networks=False) as base,
        aiohttp.ClientSession() as http,
    ):
        for path, body in [
            ("/v2/scrape", {"url": root}),
            ("/v2/crawl", {"url": root}),
            ("/v2/batch/scrape", {"urls": [root]}),
            ("/v2/map", {"url": root}),
        ]:
            a = await ask(http, "POST", base + path, body)
            assert_error(a, 403, "URL_BLOCKED")


# ---------------------------------------------------------------- 408, 503


async def test_a_scrape_past_its_timeout_is_408_scrape_timeout(tmp_path: Path) -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response(text="<html><body>late</body></html>", content_type="text/html")

    async with (
        serve_handler(slow) as port,
        node_and_gateway(tmp_path) as base,
        aiohttp.ClientSession() as http,
    ):
        started = time.monotonic()
        body = {"url": f"http://127.0.0.1:{port}/", "timeout": 400}
        a = await ask(http, "POST", base + "/v2/scrape", body)
        assert_error(a, 408, "SCRAPE_TIMEOUT")
        assert time.monotonic() - started < 4.5  # the request's bound, not the page's


async def test_no_node_answering_is_503_with_retry_after() -> None:
    async with (
        serve_gateway(["127.0.0.1:1"], retry_budget=0.2) as base,
        aiohttp.ClientSession() as http,
    ):
        for method, path, body in [
            ("POST", "/v2/crawl", {"url": "http://127.0.0.1:9/"}),
            ("GET", f"/v2/crawl/{uuid.uuid4()}", None),
        ]:
            err = assert_error(await ask(http, method, base + path, body), 503, "UNAVAILABLE")
            assert "127.0.0.1" not in err["error"]  # gRPC's text names what it dialled


async def test_an_unknown_path_or_method_answers_in_firecrawls_error_shape() -> None:
    async with serve_gateway(["127.0.0.1:1"]) as base, aiohttp.ClientSession() as http:
        assert_error(await ask(http, "GET", base + "/v2/nothing-here"), 404, "NOT_FOUND")
        wrong = await ask(http, "PUT", base + "/v2/scrape", {})
        assert_error(wrong, 405, "METHOD_NOT_ALLOWED")
        assert "POST" in wrong.headers["Allow"]
