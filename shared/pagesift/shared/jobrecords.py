"""Job records in the store: key layout, codecs, and the read side both roles serve.

Layout (every key of a job carries its id, so expiry can delete them all):

    set  jobs                     ids of every stored job (ListJobs, expiry sweep)
    KV   job/{id}                 JobMeta as JSON: kind, state, owner, times, note, counters
    KV   job/{id}/request         the Start*Request protobuf, as sent (resume re-reads it)
    KV   job/{id}/seeded          present once a crawl's start URL and sitemap are queued
    KV   idem/{owner}/{sha(key)}  the job id an idempotency key created
    list job/{id}/pages           Document protobufs in completion order; seq = paging index
    list job/{id}/errors          PageError protobufs (page errors)
    list job/{id}/notes           PageError protobufs without URL (job-level notes)
    list job/{id}/frontier        "{depth} {url}" crawl entries in enqueue order (never popped)
    set  job/{id}/seen            normalized URLs ever queued (crawl dedup)
    set  job/{id}/done            finished URLs (crawl) or indices (batch)

A page's document and its done mark are written in the same group (see
``Jobs._record_page`` in ``pagesift.primary.jobs``), so the pages list never holds a
page twice and never lacks a page whose done mark exists. The read functions here
touch only the store, which is why a standby answers them from its replica exactly
as the primary does.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from pagesift.shared.store import Store
from pagesift.v1 import jobs_pb2

JOBS_SET = "jobs"
TERMINAL = {"completed", "failed", "cancelled"}

STATE_TO_PB = {
    "scraping": jobs_pb2.JOB_STATE_SCRAPING,
    "completed": jobs_pb2.JOB_STATE_COMPLETED,
    "failed": jobs_pb2.JOB_STATE_FAILED,
    "cancelled": jobs_pb2.JOB_STATE_CANCELLED,
}
KIND_TO_PB = {"batch": jobs_pb2.JOB_KIND_BATCH_SCRAPE, "crawl": jobs_pb2.JOB_KIND_CRAWL}


def meta_key(job_id: str) -> str:
    return f"job/{job_id}"


def part(job_id: str, what: str) -> str:
    """Key of one of a job's lists, sets or side KVs: ``job/{id}/{what}``."""
    return f"job/{job_id}/{what}"


def idem_key(owner: str, key: str) -> str:
    return f"idem/{owner}/{hashlib.sha256(key.encode()).hexdigest()[:32]}"


LISTS = ("pages", "errors", "notes", "frontier")
SETS = ("seen", "done")
SIDE_KVS = ("request", "seeded")


@dataclass
class JobMeta:
    id: str
    kind: str  # batch | crawl
    state: str  # scraping | completed | failed | cancelled
    owner: str
    created_ms: int
    expires_ms: int
    total: int = 0  # batch: URLs; crawl: derived from the frontier
    limit: int = 0  # crawl page limit
    idempotency_key: str = ""
    note: str = ""
    finished_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> JobMeta:
        return cls(**json.loads(raw))

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


def now_ms() -> int:
    return int(time.time() * 1000)


def timestamp(ms: int) -> Timestamp:
    ts = Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def load_meta(store: Store, job_id: str) -> JobMeta | None:
    raw = store.get(meta_key(job_id))
    return JobMeta.decode(raw) if raw is not None else None


@dataclass
class Progress:
    total: int
    completed: int
    failed: int


def progress(store: Store, meta: JobMeta, visible: int | None = None) -> Progress:
    """Counters derived from list lengths (no counter key to keep in step)."""
    completed = store.list_len(part(meta.id, "pages"))
    if visible is not None:
        completed = min(completed, visible)
    failed = store.list_len(part(meta.id, "errors"))
    total = store.list_len(part(meta.id, "frontier")) if meta.kind == "crawl" else meta.total
    return Progress(total=total, completed=completed, failed=failed)


def read_documents(
    store: Store, job_id: str, skip: int, limit: int, visible: int | None = None
) -> list[jobs_pb2.Document]:
    if visible is not None:
        limit = max(0, min(limit, visible - skip))
    return [
        jobs_pb2.Document.FromString(raw)
        for raw in store.list_range(part(job_id, "pages"), skip, limit)
    ]


def read_errors(store: Store, job_id: str) -> tuple[list[jobs_pb2.PageError], list[str]]:
    """Page errors then job notes, and the robots-blocked URLs among the errors."""
    errors = [jobs_pb2.PageError.FromString(r) for r in store.list_range(part(job_id, "errors"))]
    robots = [e.url for e in errors if e.code == "robots_disallowed"]
    errors += [jobs_pb2.PageError.FromString(r) for r in store.list_range(part(job_id, "notes"))]
    return errors, robots


def all_job_ids(store: Store) -> list[str]:
    return [m.decode() for m in store.set_members(JOBS_SET)]


def summary(store: Store, meta: JobMeta, visible: int | None = None) -> jobs_pb2.JobSummary:
    p = progress(store, meta, visible)
    return jobs_pb2.JobSummary(
        id=meta.id,
        kind=KIND_TO_PB[meta.kind],
        state=STATE_TO_PB[meta.state],
        total=p.total,
        completed=p.completed,
        created_at=timestamp(meta.created_ms),
    )
