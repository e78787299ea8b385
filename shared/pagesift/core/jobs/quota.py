"""Quotas: per-account limits checked at job start, and rolling-day page usage in the store.

What it owns
------------
The pages-per-day counters and every limit check. Usage lives IN THE STORE, so it
is written in the same group as the page it counts, replicates to the standby like
any other write, and survives restarts and failovers:

    KV usage/{account}/{hour}     pages charged during that hour, as decimal text
                                  (hour = floor(unix seconds / 3600))
    KV tokens/{account}/{hour}    model tokens (input and output) charged during that
                                  hour, the same way (``charge_tokens``)

The rolling day is the current hour bucket and the 23 before it. A page therefore
counts for between 23 and 24 hours; ``resets_at`` says exactly when usage drops.

Guarantees
----------
- ``charge`` runs INSIDE the page's write group (``store.write``), so a page is
  charged iff it is recorded: a crash can neither lose a charge nor charge twice.
  Because groups are serialized by the store's write section, ``page_limit_hit`` +
  ``charge`` in one group never lets concurrent workers overshoot the limit.
- Reads (``used_today``, ``resets_at``) accept a ``Store`` or a ``WriteGroup`` (a
  group sees its own pending writes).
- Buckets older than the window are deleted by ``prune`` / ``prune_all`` (and the
  bucket that just left the window by each ``charge``), through write groups, so
  the deletes replicate too.
- ``check_start`` and ``page_limit_hit`` are pure: they raise/return a
  ``LimitExceeded`` whose message names the limit, the account, the numbers and when
  the limit resets (RFC 3339, UTC), for a gRPC RESOURCE_EXHAUSTED status.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol

from pagesift.core.jobs import records
from pagesift.core.jobs.accounts import Account
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup

__all__ = [
    "WINDOW_HOURS",
    "LimitExceeded",
    "active_jobs",
    "bucket_key",
    "charge",
    "charge_tokens",
    "check_start",
    "crawl_limit_for",
    "page_limit_hit",
    "prune",
    "prune_all",
    "resets_at",
    "rfc3339",
    "token_limit_hit",
    "tokens_today",
    "used_today",
]

WINDOW_HOURS = 24
HOUR = 3600
USAGE_PREFIX = "usage/"
TOKENS_PREFIX = "tokens/"
PRUNE_LOOKBACK_HOURS = 24 * 14  # how far back ``prune`` looks for stale buckets


class Reader(Protocol):
    def get(self, key: str) -> bytes | None: ...


class LimitExceeded(Exception):
    """A limit was hit. ``resets_at`` is unix seconds, or None for per-request limits
    (and for ``max_concurrent_jobs``, which frees when a running job finishes)."""

    def __init__(self, limit_name: str, message: str, resets_at: float | None = None) -> None:
        super().__init__(message)
        self.limit_name = limit_name
        self.message = message
        self.resets_at = resets_at

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        """``pagesift-limit`` and (when known) ``pagesift-limit-resets-at`` for the status."""
        md: tuple[tuple[str, str], ...] = (("pagesift-limit", self.limit_name),)
        if self.resets_at is not None:
            md += (("pagesift-limit-resets-at", rfc3339(self.resets_at)),)
        return md


def rfc3339(ts: float) -> str:
    """Unix seconds as RFC 3339 in UTC, to the second (``2026-05-01T12:00:00Z``)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def hour_of(now: float) -> int:
    return int(now // HOUR)


def bucket_key(account: str, hour: int, prefix: str = USAGE_PREFIX) -> str:
    return f"{prefix}{account}/{hour}"


def _read(reader: Reader, key: str) -> int:
    raw = reader.get(key)
    return int(raw) if raw else 0


def buckets(
    reader: Reader, account: str, now: float, prefix: str = USAGE_PREFIX
) -> list[tuple[int, int]]:
    """``(hour, pages)`` of the non-empty buckets in the window, oldest first."""
    current = hour_of(now)
    out: list[tuple[int, int]] = []
    for hour in range(current - WINDOW_HOURS + 1, current + 1):
        pages = _read(reader, bucket_key(account, hour, prefix))
        if pages:
            out.append((hour, pages))
    return out


def used_today(reader: Reader, account: str, now: float, prefix: str = USAGE_PREFIX) -> int:
    """Pages (``TOKENS_PREFIX``: tokens) charged to ``account`` in the rolling day
    ending at ``now``."""
    return sum(pages for _, pages in buckets(reader, account, now, prefix))


def resets_at(
    reader: Reader,
    account: str,
    now: float,
    limit: int | None = None,
    prefix: str = USAGE_PREFIX,
) -> float | None:
    """When usage drops: unix seconds, or None when nothing is counted.

    Without ``limit``: when the oldest counted bucket leaves the window. With
    ``limit``: the first moment usage is below ``limit`` again (None if it is already).
    """
    counted = buckets(reader, account, now, prefix)
    used = sum(p for _, p in counted)
    if not counted or (limit is not None and used < limit):
        return None
    if limit is None:
        return float((counted[0][0] + WINDOW_HOURS) * HOUR)
    for hour, pages in counted:
        used -= pages
        if used < limit:
            return float((hour + WINDOW_HOURS) * HOUR)
    raise AssertionError("unreachable: usage reaches 0 once every bucket has left")


def charge(g: WriteGroup, account: str, pages: int, now: float, prefix: str = USAGE_PREFIX) -> None:
    """Add ``pages`` to the current hour's bucket (call it inside the page's group)."""
    if pages <= 0:
        return
    hour = hour_of(now)
    key = bucket_key(account, hour, prefix)
    g.put(key, str(_read(g, key) + pages).encode())
    stale = bucket_key(account, hour - WINDOW_HOURS, prefix)
    if g.get(stale) is not None:
        g.delete(stale)


def prune(
    g: WriteGroup, account: str, now: float, lookback_hours: int = PRUNE_LOOKBACK_HOURS
) -> int:
    """Delete the account's buckets older than the window (up to ``lookback_hours``
    further back); returns how many. ``prune_all`` finds every stale bucket instead."""
    oldest_kept = hour_of(now) - WINDOW_HOURS + 1
    removed = 0
    for hour in range(oldest_kept - lookback_hours, oldest_kept):
        key = bucket_key(account, hour)
        if g.get(key) is not None:
            g.delete(key)
            removed += 1
    return removed


def prune_all(store: Store, now: float) -> int:
    """Delete every account's stale buckets in one group (call it from the sweeper)."""
    oldest_kept = hour_of(now) - WINDOW_HOURS + 1
    stale: list[str] = []
    for key in (*store.keys(USAGE_PREFIX), *store.keys(TOKENS_PREFIX)):
        _, _, hour_text = key.rpartition("/")
        if hour_text.isdigit() and int(hour_text) < oldest_kept:
            stale.append(key)
    if not stale:
        return 0

    def group(g: WriteGroup) -> None:
        for key in stale:
            g.delete(key)

    store.write(group)
    return len(stale)


def active_jobs(store: Store, owner: str) -> int:
    """How many of ``owner``'s jobs are still running (for ``max_concurrent_jobs``)."""
    n = 0
    for job_id in records.all_job_ids(store):
        meta = records.load_meta(store, job_id)
        if meta is not None and meta.owner == owner and not meta.terminal:
            n += 1
    return n


def crawl_limit_for(account: Account, requested: int, default: int) -> int:
    """The effective crawl limit: the request's, or (when it asks for none, 0) the
    server default capped at the account's ``max_crawl_limit``."""
    if requested:
        return requested
    if account.max_crawl_limit is not None:
        return min(default, account.max_crawl_limit)
    return default


def check_start(
    account: Account,
    active_jobs: int,
    usage: int,
    kind: str,
    batch_urls: int = 0,
    crawl_limit: int = 0,
    *,
    resets_at: float | None = None,
) -> None:
    """Raise ``LimitExceeded`` when ``account`` may not start this job now.

    ``kind`` is ``batch``, ``crawl`` or ``scrape`` (a single page: only the daily
    pages are checked). ``usage`` is ``used_today``; ``resets_at`` is
    ``resets_at(store, account, now, account.pages_per_day)`` for the message.
    Per-request limits are checked first, then concurrency, then the daily pages.
    """
    who = f"account {account.name!r}"
    if (
        kind == "batch"
        and account.max_batch_urls is not None
        and batch_urls > account.max_batch_urls
    ):
        raise LimitExceeded(
            "max_batch_urls",
            f"urls: {batch_urls} URLs exceed {who}'s max_batch_urls limit of "
            f"{account.max_batch_urls} (a per-request limit; it does not reset: "
            "split the batch)",
        )
    if (
        kind == "crawl"
        and account.max_crawl_limit is not None
        and (crawl_limit == 0 or crawl_limit > account.max_crawl_limit)
    ):
        asked = "no limit" if crawl_limit == 0 else f"a limit of {crawl_limit} pages"
        raise LimitExceeded(
            "max_crawl_limit",
            f"limit: {asked} exceeds {who}'s max_crawl_limit of "
            f"{account.max_crawl_limit} pages (a per-request limit; it does not reset: "
            "ask for a lower limit)",
        )
    if (
        kind != "scrape"
        and account.max_concurrent_jobs is not None
        and active_jobs >= account.max_concurrent_jobs
    ):
        raise LimitExceeded(
            "max_concurrent_jobs",
            f"{who} already runs {active_jobs} job(s), its max_concurrent_jobs limit "
            f"is {account.max_concurrent_jobs}; it frees when one of them finishes or "
            "is cancelled",
        )
    if account.pages_per_day is not None and usage >= account.pages_per_day:
        raise LimitExceeded(
            "pages_per_day",
            f"{who} used {usage} of its pages_per_day limit of {account.pages_per_day} "
            f"in the last 24 h; {_resets_text(resets_at)}",
            resets_at,
        )


def page_limit_hit(
    reader: Reader, account: Account, now: float | None = None, pages: int = 1
) -> LimitExceeded | None:
    """Inside a page's group: the ``pages_per_day`` excess if charging ``pages`` more
    would pass the limit, else None. The caller records nothing and stops the job
    (with the excess's message as the job note) when it gets one."""
    if account.pages_per_day is None:
        return None
    now = time.time() if now is None else now
    used = used_today(reader, account.name, now)
    if used + pages <= account.pages_per_day:
        return None
    when = resets_at(reader, account.name, now, account.pages_per_day - pages + 1)
    return LimitExceeded(
        "pages_per_day",
        f"stopped: account {account.name!r} reached its pages_per_day limit of "
        f"{account.pages_per_day} ({used} pages in the last 24 h); the pages so far are "
        f"kept; {_resets_text(when)}",
        when,
    )


def tokens_today(reader: Reader, account: str, now: float) -> int:
    """Model tokens charged to ``account`` in the rolling day ending at ``now``."""
    return used_today(reader, account, now, TOKENS_PREFIX)


def charge_tokens(g: WriteGroup, account: Account | None, tokens: int, now: float) -> None:
    """Inside the page's group: its model tokens, for an account with a token limit.
    Tokens are charged whole even past the limit: the calls were made (the limit
    stops the next ones, ``token_limit_hit``)."""
    if account is not None and account.model_tokens_per_day is not None:
        charge(g, account.name, tokens, now, TOKENS_PREFIX)


def token_limit_hit(reader: Reader, account: Account, now: float) -> LimitExceeded | None:
    """The ``model_tokens_per_day`` excess when the account's day is spent, else None."""
    limit = account.model_tokens_per_day
    if limit is None:
        return None
    used = tokens_today(reader, account.name, now)
    if used < limit:
        return None
    when = resets_at(reader, account.name, now, limit, TOKENS_PREFIX)
    return LimitExceeded(
        "model_tokens_per_day",
        f"account {account.name!r} used {used} of its model_tokens_per_day limit of "
        f"{limit} in the last 24 h; {_resets_text(when)}",
        when,
    )


def _resets_text(when: float | None) -> str:
    if when is None:
        return "it resets as the oldest counted hour leaves the 24 h window"
    return f"it resets at {rfc3339(when)}"
