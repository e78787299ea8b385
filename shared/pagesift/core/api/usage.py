"""``GetAccountUsage``'s answer: one account's usage and limits, read without a write.

What it owns
------------
``account_usage(store, account, activity, max_concurrency, now)``: the response from
the account's limits (the accounts file), its hour buckets of pages
(``pagesift.core.jobs.quota``) and its unfinished jobs with their counters
(``views.progress``: list lengths), plus what only the primary's runtime knows
(``ports.AccountActivity``: pages in flight, the last page time). ``unfinished_jobs``
is the standby's way to the same jobs, through the owner index.

Cost of one call
----------------
- the rolling day: 2 x 24 point reads of the account's hour buckets;
- on the primary: one meta read and three list lengths per unfinished job of the
  account (the runtime's set, ``pagesift.primary.jobs.activity``), never a scan of
  every job: bounded by ``max_concurrent_jobs`` when the account has one;
- on a standby: one meta read per stored job of the account (its owner index: the
  jobs it ran in the last ``job_ttl_seconds`` and those still running).

Invariants
----------
- Only the caller's own account is read: no other account's key is touched.
- ``pages_queued`` never counts a page twice nor goes negative: a job's pages in
  flight are taken from its unfinished pages, at 0 at least.
"""

from __future__ import annotations

from pagesift.core.api import paging
from pagesift.core.api.ports import AccountActivity
from pagesift.core.jobs import quota, records, views
from pagesift.core.jobs.accounts import Account
from pagesift.core.store.db import Store
from pagesift.v1 import jobs_pb2

__all__ = ["SCAN_BATCH", "account_usage", "unfinished_jobs"]

SCAN_BATCH = 256  # owner-index members read at once on a standby


def unfinished_jobs(store: Store, owner: str) -> tuple[records.JobMeta, ...]:
    """``owner``'s jobs that are not finished, read through its owner index (a standby,
    which has no runtime; before the index is built, from the jobs set)."""
    fetch = paging.index_reader(store, owner)
    out: list[records.JobMeta] = []
    after: bytes | None = None
    while batch := fetch(after, SCAN_BATCH):
        for member in batch:
            meta = records.load_meta(store, records.member_job(member))
            if meta is not None and meta.owner == owner and not meta.terminal:
                out.append(meta)
        after = batch[-1]
    return tuple(out)


def account_usage(
    store: Store,
    account: Account,
    activity: AccountActivity | None,
    max_concurrency: int,
    now: float,
    model_enabled: bool = False,
) -> jobs_pb2.GetAccountUsageResponse:
    """The figures of ``account`` at ``now`` (``activity``: the primary's; None on a
    standby, whose jobs come from the owner index and which has nothing in flight)."""
    name = account.name
    hour = quota.hour_of(now)
    resp = jobs_pb2.GetAccountUsageResponse(
        account=name,
        max_concurrency=max_concurrency,
        period_start=records.timestamp((hour - quota.WINDOW_HOURS + 1) * quota.HOUR * 1000),
        period_end=records.timestamp((hour + 1) * quota.HOUR * 1000),
    )
    limit = account.pages_per_day
    if limit is not None:
        used = quota.used_today(store, name, now)
        resp.pages_used = used
        resp.pages_per_day = limit
        resp.pages_remaining = max(0, limit - used)
        when = quota.resets_at(store, name, now, limit if used >= limit else None)
        if when is not None:
            resp.resets_at.CopyFrom(records.timestamp(int(when * 1000)))
    if account.max_concurrent_jobs is not None:
        resp.max_concurrent_jobs = account.max_concurrent_jobs
    resp.model_allowed = model_enabled and account.allow_model  # model_enabled: model_url
    if account.model_tokens_per_day is not None:
        resp.model_tokens_used = quota.tokens_today(store, name, now)
        resp.model_tokens_per_day = account.model_tokens_per_day
    jobs = activity.jobs if activity is not None else unfinished_jobs(store, name)
    resp.running_jobs = len(jobs)
    in_flight = 0
    for meta in jobs:
        p = views.progress(store, meta)
        fetching = activity.in_flight.get(meta.id, 0) if activity is not None else 0
        resp.pages_queued += max(0, p.total - p.completed - p.failed - fetching)
        in_flight += fetching
    if activity is not None:
        resp.pages_in_flight = in_flight + activity.scrapes_in_flight
        if activity.last_page_ms:
            resp.last_page_at.CopyFrom(records.timestamp(activity.last_page_ms))
    return resp
