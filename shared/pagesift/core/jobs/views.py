"""Job views: what the API shows of a stored job, read from its records.

What it owns
------------
The protobuf views GetJob, ListJobs, GetJobErrors and WatchJob build from a job's
records (``records``' layout): its progress (``progress``, derived from list lengths,
so no counter key can fall out of step), its summary, why it is paused
(``pause_info``), its documents, its removed URLs, and its page errors and notes
(``read_errors``, ``read_errors_page``) with their ``code_enum``.

Why it is safe
--------------
Every function here only reads the store, never writes: a standby answers them from
its replica exactly as the primary does, and a reader needs no write section.
``visible`` (where given) caps what is shown at the pages sync replication has made
visible (``pagesift.primary.jobs.runtime``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesift.core.jobs.quarantine import Budget
from pagesift.core.jobs.records import (
    KIND_TO_PB,
    PAUSE_REASONS,
    STATE_TO_PB,
    JobKeys,
    JobMeta,
    timestamp,
)
from pagesift.core.store.db import Store
from pagesift.v1 import jobs_pb2


def code_enum(code: str) -> jobs_pb2.PageErrorCode.ValueType:
    """``PageError.code_enum`` of a code string (UNSPECIFIED for one this version does
    not know)."""
    if not code:
        return jobs_pb2.PAGE_ERROR_CODE_UNSPECIFIED
    try:
        return jobs_pb2.PageErrorCode.Value(f"PAGE_ERROR_CODE_{code.upper()}")
    except ValueError:
        return jobs_pb2.PAGE_ERROR_CODE_UNSPECIFIED


@dataclass
class Progress:
    total: int
    completed: int
    failed: int


def progress(store: Store, meta: JobMeta, visible: int | None = None) -> Progress:
    """Counters derived from list lengths (no counter key to keep in step)."""
    keys = JobKeys(meta.id)
    completed = store.list_len(keys.pages)
    if visible is not None:
        completed = min(completed, visible)
    failed = store.list_len(keys.errors)
    total = store.list_len(keys.frontier) if meta.kind == "crawl" else meta.total
    return Progress(total=total, completed=completed, failed=failed)


def read_documents(
    store: Store, job_id: str, skip: int, limit: int, visible: int | None = None
) -> list[jobs_pb2.Document]:
    if visible is not None:
        limit = max(0, min(limit, visible - skip))
    return [
        jobs_pb2.Document.FromString(raw)
        for raw in store.list_range(JobKeys(job_id).pages, skip, limit)
    ]


def read_removed(store: Store, job_id: str) -> list[str]:
    """A finished change-tracked crawl's removed URLs (``JobKeys.removed``)."""
    raw = store.get(JobKeys(job_id).removed)
    return [u for u in raw.decode().split("\n") if u] if raw else []


ROBOTS_CODES = ("robots_disallowed", "robots_noindex")


def _page_error(raw: bytes) -> jobs_pb2.PageError:
    e = jobs_pb2.PageError.FromString(raw)
    e.code_enum = code_enum(e.code)
    return e


def read_errors(store: Store, job_id: str) -> tuple[list[jobs_pb2.PageError], list[str]]:
    """Page errors then job notes, and the robots-blocked URLs among the errors
    (robots.txt disallowed, or skipped for a noindex meta robots / X-Robots-Tag)."""
    keys = JobKeys(job_id)
    errors = [_page_error(r) for r in store.list_range(keys.errors)]
    robots = [e.url for e in errors if e.code in ROBOTS_CODES]
    errors += [_page_error(r) for r in store.list_range(keys.notes)]
    return errors, robots


@dataclass
class ErrorsPage:
    errors: list[jobs_pb2.PageError]
    robots_blocked: list[str]
    next: tuple[str, int] | None  # where the next page starts: ("errors"|"notes", seq)


def read_errors_page(store: Store, job_id: str, start: tuple[str, int], count: int) -> ErrorsPage:
    """At most ``count`` errors from ``start`` (a list, "errors" then "notes", and a
    sequence number in it) on: page errors in record order, then job notes; the
    robots-blocked URLs among them; where the next page starts (None at the end)."""
    keys = JobKeys(job_id)
    names = {"errors": keys.errors, "notes": keys.notes}
    which, seq = start
    out: list[jobs_pb2.PageError] = []
    robots: list[str] = []
    while True:
        items = store.list_items(names[which], seq, count - len(out) + 1)
        for item_seq, raw in items:
            if len(out) == count:
                return ErrorsPage(out, robots, (which, item_seq))
            e = _page_error(raw)
            out.append(e)
            if which == "errors" and e.code in ROBOTS_CODES:
                robots.append(e.url)
        if which == "notes":
            return ErrorsPage(out, robots, None)
        which, seq = "notes", 0
        if len(out) == count:
            nxt = store.list_items(keys.notes, 0, 1)
            return ErrorsPage(out, robots, ("notes", nxt[0][0]) if nxt else None)


def summary(store: Store, meta: JobMeta, visible: int | None = None) -> jobs_pb2.JobSummary:
    p = progress(store, meta, visible)
    return jobs_pb2.JobSummary(
        id=meta.id,
        kind=KIND_TO_PB[meta.kind],
        state=STATE_TO_PB[meta.state],
        total=p.total,
        completed=p.completed,
        created_at=timestamp(meta.created_ms),
        paused=pause_info(store, meta),
        url=crawl_url(store, meta),
    )


def crawl_url(store: Store, meta: JobMeta) -> str:
    """A crawl's start URL from its stored request ("" for a batch: its request holds
    every URL, too much to read for one line of a list)."""
    if meta.kind != "crawl":
        return ""
    raw = store.get(JobKeys(meta.id).request) or b""
    return jobs_pb2.StartCrawlRequest.FromString(raw).url


def pause_info(store: Store, meta: JobMeta) -> jobs_pb2.PauseInfo | None:
    """Why a paused job is paused (None for a job that is not)."""
    if not meta.paused:
        return None
    budget = Budget.decode(store.get(JobKeys(meta.id).poison))
    return jobs_pb2.PauseInfo(
        reason=PAUSE_REASONS.get(
            str(meta.extra.get("pause_reason", "")), jobs_pb2.PAUSE_REASON_UNSPECIFIED
        ),
        evidence=meta.note,
        in_flight_urls=budget.in_flight,
        interruptions=budget.interruptions,
        worker_losses=budget.worker_losses,
        paused_at=timestamp(int(meta.extra.get("paused_ms", 0))),
    )
