"""Retries, Retry-After and adaptive politeness (issue 11, points 1 and 2).

Two halves: the pure policy (``retrypolicy``) with a fake clock and fixed draws, and
real misbehaving aiohttp sites on 127.0.0.1 crawled by real nodes (in process, or a
``pagesift serve`` child that is SIGKILLed in the middle of a retry storm). Every
count is taken at the server: what it received, when.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web

from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine import retrypolicy
from pagesift.primary.engine.retrypolicy import HostThrottle, parse_retry_after, retry_delay
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import (
    ServeProc,
    eventually,
    free_port,
    in_process_node,
    metric,
    scrape_metrics,
    wait_terminal,
)

# fast retries for the tests (the defaults are 0.5 s / 30 s)
FAST: dict[str, Any] = {"retry_base_delay": 0.02, "retry_max_delay": 0.2}


# ---------------------------------------------------------------- the pure policy


def http(status: int, retry_after: float | None = None) -> PageError:
    return PageError(
        ErrorCode.HTTP_STATUS, f"HTTP {status}", status=status, retry_after=retry_after
    )


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504])
def test_transient_statuses_are_retried(status: int) -> None:
    assert retrypolicy.is_transient(http(status))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 451, 501])
def test_permanent_statuses_are_not_retried(status: int) -> None:
    assert not retrypolicy.is_transient(http(status))


def test_connect_errors_and_timeouts_are_retried_but_not_permanent_failures() -> None:
    assert retrypolicy.is_transient(PageError(ErrorCode.CONNECT, "reset"))
    assert retrypolicy.is_transient(PageError(ErrorCode.TIMEOUT, "read"))
    for code in (
        ErrorCode.ROBOTS_DISALLOWED,
        ErrorCode.BLOCKED_ADDRESS,
        ErrorCode.TOO_LARGE,
        ErrorCode.UNSUPPORTED_CONTENT,
        ErrorCode.INVALID_URL,
        ErrorCode.RETRY_AFTER_TOO_LONG,
        ErrorCode.TLS,
    ):
        assert not retrypolicy.is_transient(PageError(code, "x"))


def test_retry_delay_is_full_jitter_over_a_doubling_capped_window() -> None:
    assert retry_delay(0, base=0.5, cap=30, draw=1.0) == 0.5
    assert retry_delay(3, base=0.5, cap=30, draw=1.0) == 4.0
    assert retry_delay(10, base=0.5, cap=30, draw=1.0) == 30.0
    assert retry_delay(3, base=0.5, cap=30, draw=0.0) == 0.0
    assert retry_delay(3, base=0.5, cap=30, draw=0.25) == 1.0
    assert retry_delay(10_000, base=0.5, cap=30, draw=0.5) == 15.0  # no overflow
    rng = random.Random(7)
    delays = [retry_delay(2, base=0.5, cap=30, draw=rng.random()) for _ in range(1000)]
    assert all(0.0 <= d <= 2.0 for d in delays)
    assert min(delays) < 0.2 and max(delays) > 1.8  # spread over the whole window


def test_retry_after_parses_seconds_and_http_dates_against_now() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after(" 0 ", now) == 0.0
    date = email.utils.formatdate(now + 90, usegmt=True)
    assert parse_retry_after(date, now) == pytest.approx(90.0)
    assert parse_retry_after(email.utils.formatdate(now - 50, usegmt=True), now) == 0.0
    for bad in (None, "", "soon", "-5", "1.5e3"):
        assert parse_retry_after(bad, now) is None


def test_the_throttle_doubles_once_per_window_on_429_and_decays_on_success() -> None:
    t = HostThrottle(concurrency=8, max_delay=10.0)
    clock = 0.0
    step = HostThrottle.STEP
    assert t.slow_down("h", clock) == step
    # eight concurrent 429s inside the same window double it once, not eight times
    assert t.slow_down("h", clock + step) == 2 * step
    for _ in range(8):
        assert t.slow_down("h", clock + step + 0.01) == 2 * step
    assert t.slow_down("h", clock + 4 * step) == 4 * step
    for i in range(20):
        t.slow_down("h", clock + 1 + 100 * i)
    assert t.delay("h") == 10.0  # capped
    previous = t.delay("h")
    for _ in range(100):  # fast successes: the delay decays, then the host is forgotten
        now_delay = t.success("h", 0.001)
        assert now_delay <= previous
        previous = now_delay
    assert t.delay("h") == 0.0 and len(t) == 0
    assert t.delay("other") == 0.0


def test_an_isolated_refusal_among_successes_holds_the_step_without_doubling() -> None:
    t = HostThrottle(concurrency=8, max_delay=10.0)
    for i in range(50):  # refuse, succeed, refuse, succeed ...
        t.slow_down("h", float(i))
        assert t.delay("h") == HostThrottle.STEP
        t.success("h", 0.001)
        assert t.delay("h") < HostThrottle.STEP


def test_the_throttle_follows_rising_latency_toward_latency_over_concurrency() -> None:
    t = HostThrottle(concurrency=4, max_delay=10.0)
    values = [t.success("h", 2.0) for _ in range(20)]
    assert values == sorted(values)
    assert values[-1] == pytest.approx(0.5, rel=1e-3)  # 2 s / 4 requests at once


def test_the_throttle_keeps_a_bounded_number_of_hosts() -> None:
    t = HostThrottle(concurrency=1, max_delay=10.0, max_hosts=3)
    for i in range(10):
        t.slow_down(f"h{i}", float(i))
    assert list(t.delays()) == ["h7", "h8", "h9"]


# ---------------------------------------------------------------- misbehaving sites


@dataclass
class Misbehaving:
    """A site of ``pages`` linked pages; the first answer to each page is ``mode``."""

    pages: int
    mode: str  # 503 | 500 | reset | 429-seconds | 503-date | none
    retry_after: float = 1.0
    always: set[str] = field(default_factory=set)  # paths that misbehave every time
    hits: Counter[str] = field(default_factory=Counter)
    arrivals: list[tuple[float, str]] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)  # Retry-After windows
    on_first: Callable[[str], bool] | None = None  # which first answers misbehave

    def paths(self) -> list[str]:
        return ["/"] + [f"/p/{i}.html" for i in range(self.pages)]

    def page(self, path: str) -> str:
        if path == "/":
            links = [f"/p/{i}.html" for i in range(min(self.pages, 8))]
        else:
            i = int(path.rsplit("/", 1)[1].split(".")[0])
            links = [f"/p/{j}.html" for j in range(i + 1, min(self.pages, i + 9))]
        body = "".join(f'<a href="{u}">{u}</a> ' for u in links)
        return f"<html><head><title>{path}</title></head><body><p>{path}</p>{body}</body></html>"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        now = time.time()
        self.arrivals.append((now, path))
        if path in ("/robots.txt", "/sitemap.xml"):
            return web.Response(status=404)
        self.hits[path] += 1
        first = self.hits[path] == 1 and (self.on_first is None or self.on_first(path))
        if first or path in self.always:
            return self.misbehave(request, now)
        if path == "/missing.html":
            return web.Response(status=404)
        return web.Response(text=self.page(path), content_type="text/html")

    def misbehave(self, request: web.Request, now: float) -> web.StreamResponse:
        if self.mode == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=200)  # never sent
        if self.mode in ("500", "503"):
            return web.Response(status=int(self.mode))
        if self.mode == "429-seconds":
            self.windows.append((now, now + self.retry_after))
            return web.Response(status=429, headers={"Retry-After": f"{self.retry_after:g}"})
        if self.mode == "503-date":
            until = math.ceil(now) + self.retry_after
            self.windows.append((now, until))
            return web.Response(
                status=503, headers={"Retry-After": email.utils.formatdate(until, usegmt=True)}
            )
        return web.Response(status=500)

    def inside_windows(self) -> list[tuple[float, str]]:
        """Requests that arrived inside a Retry-After window (after its answer left)."""
        return [
            (t, p) for t, p in self.arrivals if any(start < t < end for start, end in self.windows)
        ]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Misbehaving], asyncio.Future[str]]]:
    runners: list[web.AppRunner] = []

    async def start(site: Misbehaving) -> str:
        app = web.Application()
        app.router.add_get("/{tail:.*}", site.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}/"

    yield start  # type: ignore[misc]
    for r in runners:
        await r.cleanup()


async def crawl_to_end(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, req: jobs_pb2.StartCrawlRequest, timeout: float = 120
) -> jobs_pb2.GetJobResponse:
    job = await stub.StartCrawl(req)
    return await wait_terminal(stub, job.id, timeout=timeout)


async def all_urls(stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str) -> list[str]:
    out: list[str] = []
    skip = 0
    for _ in range(1000):
        resp = await stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=100))
        out.extend(d.url for d in resp.documents)
        if not resp.HasField("next_skip") or resp.next_skip == skip:
            break
        skip = resp.next_skip
    return out


async def errors_of(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str
) -> list[jobs_pb2.PageError]:
    resp = await stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=job_id))
    return list(resp.errors)


@pytest.mark.parametrize(
    ("mode", "pages"),
    # Retry-After pauses the whole host each time: a few pages keep the test short
    [("503", 60), ("500", 60), ("reset", 60), ("429-seconds", 3), ("503-date", 3)],
)
async def test_a_crawl_whose_first_answers_fail_transiently_completes_with_every_page_once(
    tmp_path: Path, serve: Callable[[Misbehaving], asyncio.Future[str]], mode: str, pages: int
) -> None:
    site = Misbehaving(pages=pages, mode=mode)
    root = await serve(site)
    async with in_process_node(tmp_path / "n", **FAST) as n:
        final = await crawl_to_end(n.stub, jobs_pb2.StartCrawlRequest(url=root, max_concurrency=8))
        assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
        got = await all_urls(n.stub, final.id)
        assert final.failed == 0, await errors_of(n.stub, final.id)
    assert sorted(got) == sorted(root.rstrip("/") + p if p != "/" else root for p in site.paths())
    # every page answered once (its second request), and asked exactly twice
    assert {p: site.hits[p] for p in site.paths()} == {p: 2 for p in site.paths()}
    # (requests sent concurrently with a 429 may land in its window: the window test
    # below runs one request at a time to count exactly)


@pytest.mark.parametrize("mode", ["429-seconds", "503-date"])
async def test_no_request_reaches_a_host_inside_its_retry_after_window_from_any_job(
    tmp_path: Path, serve: Callable[[Misbehaving], asyncio.Future[str]], mode: str
) -> None:
    # only the first request the site ever receives misbehaves; two jobs share the host
    first: list[str] = []

    def only_the_very_first(path: str) -> bool:
        if first:
            return False
        first.append(path)
        return True

    site = Misbehaving(pages=30, mode=mode, retry_after=2.0, on_first=only_the_very_first)
    root = await serve(site)
    urls_a = [f"{root}p/{i}.html" for i in range(0, 15)]
    urls_b = [f"{root}p/{i}.html" for i in range(15, 30)]
    async with in_process_node(
        tmp_path / "n", per_host_concurrency=1, metrics_listen=f"127.0.0.1:{free_port()}", **FAST
    ) as n:
        a = await n.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=urls_a, max_concurrency=4)
        )
        b = await n.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=urls_b, max_concurrency=4)
        )

        async def paused() -> float | None:
            samples = await scrape_metrics(n.config.metrics_listen)
            seconds = metric(samples, "pagesift_host_delay_seconds", host="127.0.0.1")
            return seconds if seconds > 0 else None

        assert await eventually(paused, "the host's pause in the metrics", timeout=10) > 0
        for job in (a, b):
            final = await wait_terminal(n.stub, job.id, timeout=60)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
            assert final.failed == 0
        samples = await scrape_metrics(n.config.metrics_listen)
        retried = {"429-seconds": "http_429", "503-date": "http_503"}[mode]
        assert metric(samples, "pagesift_fetch_retries_total", cause=retried) == 1
    assert len(site.windows) == 1
    assert site.inside_windows() == []  # counted at the server: nothing in the window
    (_start, end), path = site.windows[0], first[0]
    retry_at = [t for t, p in site.arrivals if p == path][1]
    assert retry_at >= end  # the page itself came back after the window
    assert all(site.hits[f"/p/{i}.html"] == (2 if f"/p/{i}.html" == path else 1) for i in range(30))


async def test_a_retry_after_beyond_the_maximum_fails_the_page_with_its_own_code(
    tmp_path: Path, serve: Callable[[Misbehaving], asyncio.Future[str]]
) -> None:
    site = Misbehaving(pages=1, mode="429-seconds", retry_after=600, always={"/p/0.html"})
    root = await serve(site)
    async with in_process_node(tmp_path / "n", max_retry_after=5.0, **FAST) as n:
        job = await n.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(urls=[f"{root}p/0.html"])
        )
        final = await wait_terminal(n.stub, job.id)
        errors = await errors_of(n.stub, job.id)
    assert final.failed == 1
    assert [e.code for e in errors] == ["retry_after_too_long"]
    assert "600" in errors[0].message and "max_retry_after" in errors[0].message
    assert site.hits["/p/0.html"] == 1


async def test_permanent_failures_are_not_retried_and_exhausted_retries_name_attempts_and_cause(
    tmp_path: Path, serve: Callable[[Misbehaving], asyncio.Future[str]]
) -> None:
    site = Misbehaving(pages=2, mode="503", always={"/p/1.html"}, on_first=lambda p: False)
    root = await serve(site)
    async with in_process_node(tmp_path / "n", **FAST) as n:
        job = await n.stub.StartBatchScrape(
            jobs_pb2.StartBatchScrapeRequest(
                urls=[f"{root}missing.html", f"{root}p/1.html", f"{root}p/0.html"], max_retries=2
            )
        )
        final = await wait_terminal(n.stub, job.id)
        errors = {e.url: e for e in await errors_of(n.stub, job.id)}
    assert final.completed == 1 and final.failed == 2
    assert site.hits["/missing.html"] == 1  # a 404 is permanent
    assert site.hits["/p/1.html"] == 3  # 1 + max_retries
    failed = errors[f"{root}p/1.html"]
    assert failed.code == "http_status"
    assert "after 3 attempts" in failed.message and "http_503" in failed.message


async def test_max_retries_above_the_server_maximum_is_invalid_argument_naming_the_field(
    tmp_path: Path,
) -> None:
    async with in_process_node(tmp_path / "n", max_retries_limit=4) as n:
        with pytest.raises(grpc.aio.AioRpcError) as crawl:
            await n.stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url="http://127.0.0.1:1/", max_retries=5)
            )
        with pytest.raises(grpc.aio.AioRpcError) as batch:
            await n.stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(urls=["http://127.0.0.1:1/"], max_retries=5)
            )
    for info in (crawl, batch):
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith("max_retries")


# ---------------------------------------------------------------- crash in a retry storm

CRASH_CONFIG = {
    "read_timeout": 1.0,
    "connect_timeout": 1.0,
    "extract_processes": 0,
    "retry_base_delay": 0.05,
    "retry_max_delay": 0.5,
    # the test's two kills land before the job does much: no quarantine (test_quarantine)
    "poison_threshold": 100,
}


@pytest.mark.system
async def test_a_sigkill_in_a_retry_storm_keeps_every_page_once_and_every_retry_budget(
    tmp_path: Path, serve: Callable[[Misbehaving], asyncio.Future[str]]
) -> None:
    always = {f"/p/{i}.html" for i in range(5, 70, 20)}  # 503 for ever: spend the budget
    site = Misbehaving(pages=70, mode="503", always=always)
    root = await serve(site)
    server = ServeProc(tmp_path, "server", config=CRASH_CONFIG)
    kills = 2
    try:
        await server.start()
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            job = await stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url=root, max_concurrency=8, max_retries=3)
            )
        for at in (25, 55):

            async def requests_seen(at: int = at) -> bool | None:
                return True if len(site.arrivals) >= at else None

            await eventually(requests_seen, f"{at} requests at the site", timeout=60)
            server.kill()
            await server.start()
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = jobs_pb2_grpc.JobServiceStub(ch)
            final = await wait_terminal(stub, job.id, timeout=120)
            assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
            got = await all_urls(stub, job.id)
            errors = await errors_of(stub, job.id)
    finally:
        server.stop()
    expected = {root.rstrip("/") + p if p != "/" else root for p in site.paths()}
    # the always-failing pages past the last kill are never reached if a parent failed:
    # every page reachable is once in the results or once in the errors
    assert len(got) == len(set(got)), "a page is in the results twice"
    failed = [e.url for e in errors]
    assert len(failed) == len(set(failed)), "a page failed twice"
    assert set(got) | set(failed) <= expected
    assert set(failed) <= {root.rstrip("/") + p for p in always}
    assert set(got) == expected - set(failed)
    for p in site.paths():  # 1 + max_retries attempts, plus one per kill at most
        assert site.hits[p] <= 1 + 3 + kills, (p, site.hits[p])
    for e in errors:
        assert "attempts" in e.message
