"""The gateway's account routes, driven by firecrawl-py's own methods.

A real gateway in front of a real in-process node with an accounts file, crawling
``tests.gatedsite`` (its pages wait at a gate, so pages in flight are known exactly):
``get_credit_usage``, ``get_queue_status``, ``get_concurrency`` and
``get_active_crawls`` follow a running crawl, show the accounts file's limits, keep
two accounts apart, and show the server's own limits in anonymous mode. The bodies'
mapping is also checked as pure tables (``pagesift.gateway.team``).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from firecrawl import V1FirecrawlApp
from firecrawl.v2.client import FirecrawlClient
from firecrawl.v2.utils.error_handler import BadRequestError, UnauthorizedError

from pagesift.core.jobs.records import timestamp
from pagesift.gateway.team import (
    UNLIMITED,
    active_crawls,
    concurrency,
    credit_usage,
    queue_status,
)
from pagesift.v1 import jobs_pb2
from tests.gatedsite import gated_site
from tests.helpers import Acct, eventually, write_accounts
from tests.test_gateway import client, gateway, sdk

METER = Acct("meter", {"pages_per_day": 50, "max_concurrent_jobs": 3})
OTHER = Acct("other", {"pages_per_day": 9})
TOKENS = Acct("tokens")
ACCOUNTS = (METER, OTHER)
MAX_CONCURRENCY = 64  # ServerConfig.max_concurrency's default


async def test_sdk_usage_follows_a_running_crawl_with_the_accounts_files_limits(
    tmp_path: Path,
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", ACCOUNTS)
    kw: dict[str, Any] = {"accounts_file": str(accounts), "read_timeout": 30}
    async with gated_site(5) as site, gateway(tmp_path / "d", **kw) as base:
        fc, other = client(base, METER.key), client(base, OTHER.key)
        credit = await sdk(fc.get_credit_usage)
        assert (credit.remaining_credits, credit.plan_credits) == (50, 50)
        start = datetime.fromisoformat(credit.billing_period_start or "")
        end = datetime.fromisoformat(credit.billing_period_end or "")
        assert (end - start).total_seconds() == 24 * 3600
        assert start.timestamp() <= time.time() < end.timestamp()
        conc = await sdk(fc.get_concurrency)
        assert (conc.concurrency, conc.max_concurrency) == (0, 3)
        queue = await sdk(fc.get_queue_status)
        assert (queue.jobs_in_queue, queue.active_jobs_in_queue) == (0, 0)
        assert queue.max_concurrency == 3 * MAX_CONCURRENCY
        assert queue.most_recent_success is None
        assert (await sdk(fc.get_active_crawls)).crawls == []

        job = await sdk(fc.start_crawl, site.root, limit=10, max_concurrency=2, sitemap="skip")
        await site.held(2)  # the home page is stored, two pages at the gate, three wait
        queue = await sdk(fc.get_queue_status)
        assert (queue.jobs_in_queue, queue.active_jobs_in_queue) == (5, 2)
        assert queue.waiting_jobs_in_queue == 3 and queue.most_recent_success is not None
        assert (await sdk(fc.get_concurrency)).concurrency == 1
        assert (await sdk(fc.get_credit_usage)).remaining_credits == 49
        active = (await sdk(fc.get_active_crawls)).crawls
        assert [(c.id, c.team_id, c.url) for c in active] == [(job.id, "meter", site.root)]

        # another account sees none of it, and its own limits
        theirs = await sdk(other.get_credit_usage)
        assert (theirs.remaining_credits, theirs.plan_credits) == (9, 9)
        conc = await sdk(other.get_concurrency)
        assert (conc.concurrency, conc.max_concurrency) == (0, UNLIMITED)
        queue = await sdk(other.get_queue_status)
        assert (queue.jobs_in_queue, queue.max_concurrency) == (0, UNLIMITED)
        assert queue.most_recent_success is None
        assert (await sdk(other.get_active_crawls)).crawls == []

        site.open()

        async def finished() -> bool | None:
            status = await sdk(fc.get_crawl_status, job.id)
            return True if status.status == "completed" else None

        await eventually(finished, "the crawl to complete")
        assert (await sdk(fc.get_credit_usage)).remaining_credits == 44  # 6 pages
        assert (await sdk(fc.get_concurrency)).concurrency == 0
        queue = await sdk(fc.get_queue_status)
        assert (queue.jobs_in_queue, queue.active_jobs_in_queue) == (0, 0)
        assert (await sdk(fc.get_active_crawls)).crawls == []


async def test_anonymous_mode_shows_the_servers_own_limits(tmp_path: Path) -> None:
    async with gateway(tmp_path / "open") as base:
        fc = client(base)
        credit = await sdk(fc.get_credit_usage)
        conc = await sdk(fc.get_concurrency)
        queue = await sdk(fc.get_queue_status)
    assert (credit.remaining_credits, credit.plan_credits) == (UNLIMITED, None)
    assert (conc.concurrency, conc.max_concurrency) == (0, UNLIMITED)
    assert queue.max_concurrency == UNLIMITED
    limits = tmp_path / "anonymous.toml"
    limits.write_text("[anonymous]\npages_per_day = 7\nmax_concurrent_jobs = 2\n")
    async with gateway(tmp_path / "limited", accounts_file=str(limits)) as base:
        fc = client(base)
        credit = await sdk(fc.get_credit_usage)
        conc = await sdk(fc.get_concurrency)
        queue = await sdk(fc.get_queue_status)
    assert (credit.remaining_credits, credit.plan_credits) == (7, 7)
    assert conc.max_concurrency == 2 and queue.max_concurrency == 2 * MAX_CONCURRENCY


def _model_accounts(path: Path) -> Path:
    """``ACCOUNTS`` with the model allowed to ``METER`` (1000 tokens a day) and to
    ``TOKENS`` (no daily token limit); ``OTHER`` may not use it."""
    write_accounts(path, (*ACCOUNTS, TOKENS))
    lines = path.read_text().splitlines()
    out: list[str] = []
    for line in lines:
        out.append(line)
        if line == f'name = "{METER.name}"':
            out += ["allow_model = true", "model_tokens_per_day = 1000"]
        if line == f'name = "{TOKENS.name}"':
            out.append("allow_model = true")
    path.write_text("\n".join(out) + "\n")
    return path


#: a model endpoint nothing listens on: token usage reads the account, never the model
NO_MODEL_SERVER: dict[str, Any] = {
    "model_url": "http://127.0.0.1:9/v1",
    "model_name": "none",
    "model_bypass_address_guard": True,
}


async def test_token_usage_is_the_rolling_days_model_tokens_and_history_is_400_saying_why(
    tmp_path: Path,
) -> None:
    accounts = _model_accounts(tmp_path / "accounts.toml")
    kw: dict[str, Any] = {"accounts_file": str(accounts), **NO_MODEL_SERVER}
    async with gateway(tmp_path / "d", **kw) as base:
        fc = client(base, METER.key)
        tokens = await sdk(fc.get_token_usage)
        assert (tokens.remaining_tokens, tokens.plan_tokens) == (1000, 1000)
        start = datetime.fromisoformat(tokens.billing_period_start or "")
        end = datetime.fromisoformat(tokens.billing_period_end or "")
        assert (end - start).total_seconds() == 24 * 3600
        unlimited = await sdk(client(base, TOKENS.key).get_token_usage)
        assert (unlimited.remaining_tokens, unlimited.plan_tokens) == (UNLIMITED, None)
        refused = await sdk(client(base, OTHER.key).get_token_usage)  # no allow_model
        assert (refused.remaining_tokens, refused.plan_tokens) == (0, 0)
        headers = {"Authorization": f"Bearer {METER.key}"}
        async with (
            aiohttp.ClientSession(headers=headers) as http,
            http.get(base + "/v2/team/token-usage") as resp,
        ):
            assert resp.status == 200
            body = await resp.json()
        assert body["success"] is True and set(body["data"]) == {
            "remainingTokens", "planTokens", "billingPeriodStart", "billingPeriodEnd"
        }  # fmt: skip
        assert (body["data"]["remainingTokens"], body["data"]["planTokens"]) == (1000, 1000)
        v2 = FirecrawlClient(api_key=METER.key, api_url=base)  # where the history lives
        with pytest.raises(BadRequestError, match="rolling day's model tokens"):
            await sdk(v2.get_token_usage_historical)
        with pytest.raises(BadRequestError, match="rolling day"):
            await sdk(v2.get_credit_usage_historical)
        wrong = client(base, "psk_test_wrong_0123456789")
        for call in (wrong.get_credit_usage, wrong.get_concurrency, wrong.get_token_usage):
            with pytest.raises(UnauthorizedError):
                await sdk(call)
        async with aiohttp.ClientSession(headers=headers) as http:
            for path in ("/v2/crawl/ongoing", "/v2/crawl/active"):
                async with http.get(base + path) as resp:
                    assert resp.status == 200
                    assert await resp.json() == {"success": True, "crawls": []}


async def test_without_a_model_endpoint_every_account_has_0_of_0_tokens(tmp_path: Path) -> None:
    accounts = _model_accounts(tmp_path / "accounts.toml")
    async with gateway(tmp_path / "d", accounts_file=str(accounts)) as base:
        for acct in (METER, TOKENS, OTHER):
            tokens = await sdk(client(base, acct.key).get_token_usage)
            assert (tokens.remaining_tokens, tokens.plan_tokens) == (0, 0), acct.name


async def test_the_v1_sdk_reads_the_same_credits_and_tokens(tmp_path: Path) -> None:
    accounts = _model_accounts(tmp_path / "accounts.toml")
    kw: dict[str, Any] = {"accounts_file": str(accounts), "read_timeout": 30, **NO_MODEL_SERVER}
    async with gated_site(5) as site, gateway(tmp_path / "d", **kw) as base:
        v1 = V1FirecrawlApp(api_key=METER.key, api_url=base)
        credit = (await sdk(v1.get_credit_usage)).data
        assert (credit.remaining_credits, credit.plan_credits) == (50, 50)
        assert credit.billing_period_start and credit.billing_period_end
        tokens = (await sdk(v1.get_token_usage)).data
        assert (tokens.remaining_tokens, tokens.plan_tokens) == (1000, 1000)
        assert tokens.billing_period_start == credit.billing_period_start
        job = await sdk(client(base, METER.key).start_crawl, site.root, limit=10, sitemap="skip")
        await site.held(1)
        headers = {"Authorization": f"Bearer {METER.key}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.get(base + "/v1/crawl/active") as resp:
                active = await resp.json()
            async with http.get(base + "/v1/concurrency-check") as resp:
                conc = await resp.json()
        assert [(c["id"], c["url"]) for c in active["crawls"]] == [(job.id, site.root)]
        assert conc == {"success": True, "concurrency": 1, "maxConcurrency": 3}
        site.open()


# ---------------------------------------------------------------- the mapping, as tables


def _usage(**fields: Any) -> jobs_pb2.GetAccountUsageResponse:
    u = jobs_pb2.GetAccountUsageResponse(
        account="acme",
        max_concurrency=8,
        period_start=timestamp(0),
        period_end=timestamp(86_400_000),
    )
    for name, value in fields.items():
        if name == "last_page_at":
            u.last_page_at.CopyFrom(timestamp(value))
        else:
            setattr(u, name, value)
    return u


@pytest.mark.parametrize(
    ("fields", "remaining", "plan"),
    [
        ({}, UNLIMITED, None),
        ({"pages_per_day": 100, "pages_remaining": 40, "pages_used": 60}, 40, 100),
        ({"pages_per_day": 5, "pages_remaining": 0, "pages_used": 5}, 0, 5),
    ],
)
def test_credit_usage_is_pages_left_in_the_rolling_day(
    fields: dict[str, Any], remaining: int, plan: int | None
) -> None:
    body = credit_usage(_usage(**fields))
    assert body == {
        "success": True,
        "data": {
            "remainingCredits": remaining,
            "planCredits": plan,
            "billingPeriodStart": "1970-01-01T00:00:00Z",
            "billingPeriodEnd": "1970-01-02T00:00:00Z",
        },
    }
    v1 = credit_usage(_usage(**fields), v1=True)["data"]
    assert (v1["remaining_credits"], v1["plan_credits"]) == (remaining, plan)
    assert v1["billing_period_end"] == "1970-01-02T00:00:00Z" and len(v1) == 4


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, (0, 0, 0, UNLIMITED, None)),
        (
            {"pages_queued": 7, "pages_in_flight": 2, "max_concurrent_jobs": 3},
            (9, 2, 7, 24, None),
        ),
        (
            {"pages_in_flight": 1, "last_page_at": 1000},
            (1, 1, 0, UNLIMITED, "1970-01-01T00:00:01Z"),
        ),
    ],
)
def test_queue_status_counts_pages_in_flight_and_waiting(
    fields: dict[str, Any], expected: tuple[int, int, int, int, str | None]
) -> None:
    body = queue_status(_usage(**fields))
    got = (
        body["jobsInQueue"],
        body["activeJobsInQueue"],
        body["waitingJobsInQueue"],
        body["maxConcurrency"],
        body["mostRecentSuccess"],
    )
    assert body["success"] is True and got == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [({}, (0, UNLIMITED)), ({"running_jobs": 2, "max_concurrent_jobs": 4}, (2, 4))],
)
def test_concurrency_counts_jobs_against_max_concurrent_jobs(
    fields: dict[str, Any], expected: tuple[int, int]
) -> None:
    body = concurrency(_usage(**fields))
    assert (body["concurrency"], body["maxConcurrency"]) == expected


def test_active_crawls_lists_running_crawls_only() -> None:
    crawl, batch = jobs_pb2.JOB_KIND_CRAWL, jobs_pb2.JOB_KIND_BATCH_SCRAPE
    running, paused = jobs_pb2.JOB_STATE_SCRAPING, jobs_pb2.JOB_STATE_PAUSED
    jobs = [
        jobs_pb2.JobSummary(
            id="a", kind=crawl, state=running, url="https://a/", created_at=timestamp(0)
        ),
        jobs_pb2.JobSummary(id="b", kind=batch, state=running),
        jobs_pb2.JobSummary(id="c", kind=crawl, state=paused, url="https://c/"),
    ]
    assert active_crawls("acme", jobs) == {
        "success": True,
        "crawls": [
            {"id": "a", "teamId": "acme", "url": "https://a/", "created_at": "1970-01-01T00:00:00Z"}
        ],
    }
