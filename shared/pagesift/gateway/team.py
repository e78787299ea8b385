"""Firecrawl's account routes: credits, the queue, concurrency and the running crawls.

What it owns
------------
``add_team_routes(app)``: ``GET /v2/team/credit-usage``, ``/v2/team/queue-status`` and
``/v2/concurrency-check`` (one ``GetAccountUsage`` each), ``GET /v2/crawl/active`` and
its alias ``/v2/crawl/ongoing`` (the caller's running crawls, from ``ListJobs``), the
same under ``/v1/`` (v1's credit names are snake_case), and the routes the SDKs call
that pagesift cannot answer, refused by name with a 400 saying why (``REFUSED``): the
two ``.../historical`` ones (it keeps only the rolling day's usage); ``team/token-usage``
is ``pagesift.gateway.extractroutes``'. The bodies are the
pure ``credit_usage``, ``queue_status``, ``concurrency`` and ``active_crawls``.

Mapping (docs/gateway.md, "Account routes")
-------------------------------------------
- One page is one credit (``pages_per_day`` counts pages); the period is the rolling day.
- ``UNLIMITED`` (99999999, what Firecrawl's self-hosted server reports when it enforces
  no limit) stands for a limit the account does not have.
- concurrency-check counts jobs (of ``max_concurrent_jobs``, the limit a new job is
  refused by, 429); queue-status counts pages (in flight, waiting; ``maxConcurrency``:
  ``max_concurrent_jobs`` jobs of ``max_concurrency`` pages).
- Registered before the job routes: ``/v2/crawl/active`` is not a crawl id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from pagesift.gateway.handling import answer, client_of
from pagesift.gateway.httperrors import HttpError, bad_request
from pagesift.v1 import jobs_pb2

__all__ = [
    "REFUSED",
    "UNLIMITED",
    "active_crawls",
    "add_team_routes",
    "concurrency",
    "credit_usage",
    "queue_status",
]

#: Firecrawl's self-hosted stand-in for "no limit" (its ACUC without authentication)
UNLIMITED = 99999999

_NO_TOKENS = "pagesift keeps only the rolling day's model tokens: GET /{v}/team/token-usage"
#: route -> why pagesift cannot answer it (a 400 naming the route and the reason)
REFUSED: dict[str, str] = {
    f"/{v}/team/{route}": why
    for v in ("v2", "v1")
    for route, why in (
        ("token-usage/historical", _NO_TOKENS.format(v=v)),
        (
            "credit-usage/historical",
            f"pagesift keeps only the rolling day's usage: GET /{v}/team/credit-usage",
        ),
    )
}


def _time(ts: Any) -> str:
    return str(ts.ToJsonString())


def credit_usage(u: jobs_pb2.GetAccountUsageResponse, *, v1: bool = False) -> dict[str, Any]:
    """``GET /v2/team/credit-usage``: pages left in the rolling day as credits (``v1``:
    ``/v1/team/credit-usage``, the same figures under v1's snake_case names)."""
    limited = u.HasField("pages_per_day")
    data = {
        "remainingCredits": u.pages_remaining if limited else UNLIMITED,
        "planCredits": u.pages_per_day if limited else None,
        "billingPeriodStart": _time(u.period_start),
        "billingPeriodEnd": _time(u.period_end),
    }
    if v1:
        data = {_V1_NAMES[k]: v for k, v in data.items()}
    return {"success": True, "data": data}


_V1_NAMES = {
    "remainingCredits": "remaining_credits",
    "planCredits": "plan_credits",
    "billingPeriodStart": "billing_period_start",
    "billingPeriodEnd": "billing_period_end",
}


def _page_ceiling(u: jobs_pb2.GetAccountUsageResponse) -> int:
    """The most pages the account's jobs fetch at once (``UNLIMITED`` without a
    ``max_concurrent_jobs``)."""
    if not u.HasField("max_concurrent_jobs"):
        return UNLIMITED
    return min(UNLIMITED, u.max_concurrent_jobs * u.max_concurrency)


def queue_status(u: jobs_pb2.GetAccountUsageResponse) -> dict[str, Any]:
    """``GET /v2/team/queue-status``: the account's pages in flight and waiting."""
    return {
        "success": True,
        "jobsInQueue": u.pages_in_flight + u.pages_queued,
        "activeJobsInQueue": u.pages_in_flight,
        "waitingJobsInQueue": u.pages_queued,
        "maxConcurrency": _page_ceiling(u),
        "mostRecentSuccess": _time(u.last_page_at) if u.HasField("last_page_at") else None,
    }


def concurrency(u: jobs_pb2.GetAccountUsageResponse) -> dict[str, Any]:
    """``GET /v2/concurrency-check``: running jobs of ``max_concurrent_jobs``."""
    limit = u.max_concurrent_jobs if u.HasField("max_concurrent_jobs") else UNLIMITED
    return {"success": True, "concurrency": u.running_jobs, "maxConcurrency": limit}


def active_crawls(account: str, jobs: Sequence[jobs_pb2.JobSummary]) -> dict[str, Any]:
    """``GET /v2/crawl/active``: the running crawls among ``jobs`` (ListJobs' summaries
    of ``account``), newest first. Firecrawl's ``options`` (the crawl's request) are
    left out: ListJobs does not carry a job's request, and the SDK reads them as
    optional."""
    crawls = [
        {
            "id": j.id,
            "teamId": account,
            "url": j.url,
            "created_at": _time(j.created_at),
        }
        for j in jobs
        if j.kind == jobs_pb2.JOB_KIND_CRAWL and j.state == jobs_pb2.JOB_STATE_SCRAPING
    ]
    return {"success": True, "crawls": crawls}


async def _usage(request: web.Request) -> jobs_pb2.GetAccountUsageResponse:
    return await client_of(request).account_usage()


async def credit_usage_route(request: web.Request) -> web.StreamResponse:
    v1 = request.path.startswith("/v1/")
    return web.json_response(credit_usage(await _usage(request), v1=v1))


async def queue_status_route(request: web.Request) -> web.StreamResponse:
    return web.json_response(queue_status(await _usage(request)))


async def concurrency_route(request: web.Request) -> web.StreamResponse:
    return web.json_response(concurrency(await _usage(request)))


async def active_crawls_route(request: web.Request) -> web.StreamResponse:
    client = client_of(request)
    account = (await client.account_usage()).account
    jobs = await client.list_jobs(active_only=True)
    return web.json_response(active_crawls(account, jobs))


async def refused_route(request: web.Request) -> web.StreamResponse:
    await _usage(request)  # the key first, as Firecrawl's auth runs first (401)
    raise refusal(request.path)


def refusal(path: str) -> HttpError:
    """The 400 of a route in ``REFUSED``."""
    why = REFUSED[path]
    return bad_request(f"{path}: {why}")


def add_team_routes(app: web.Application) -> None:
    """Register the account routes of v2 and v1 on ``app`` (before the job routes)."""
    r = app.router
    for v in ("v2", "v1"):
        r.add_get(f"/{v}/team/credit-usage", answer(credit_usage_route))
        r.add_get(f"/{v}/team/queue-status", answer(queue_status_route))
        r.add_get(f"/{v}/concurrency-check", answer(concurrency_route))
        r.add_get(f"/{v}/crawl/active", answer(active_crawls_route))
        r.add_get(f"/{v}/crawl/ongoing", answer(active_crawls_route))
    for path in REFUSED:
        r.add_get(path, answer(refused_route))
