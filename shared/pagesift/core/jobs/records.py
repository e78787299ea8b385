"""Job records in the store: key layout, codecs, and the changes a group makes to them.

How the API presents a job (progress, summaries, error pages) is ``views``'; this
module spells the records, encodes them, and writes them inside a caller's group
(``delete_job``, ``pause``, ``mark_retry``, the owner index), with the point reads
those need (``load_meta``, ``all_job_ids``, ``read_cookies``, ``retries_used``).

Layout (every key of a job carries its id, so expiry can delete them all). ``JobKeys``
is the one place that spells these names; everything else (the runtime, webhooks,
expiry, watchers, tests) asks it:

    set  jobs                     ids of every stored job (expiry sweep, resume)
    set  owner/{account}/jobs     "{created_ms:016d} {id}" of each of the account's jobs:
                                  byte order is creation order (ListJobs pages it newest
                                  first, ``Store.set_range``); written with the job,
                                  removed with it (``owner_member``)
    KV   owner_index              "1": every job is in its owner's set. Written by the
                                  start-up migration of a store whose jobs were stored
                                  without the index (``build_owner_index``), or by the
                                  first registration into an empty store; deleted with
                                  the last job (an empty store has no key). Absent while
                                  jobs exist: ListJobs scans the jobs set instead
    KV   job/{id}                 JobMeta as JSON: kind, state, owner, times, note, counters
    KV   job/{id}/request         the Start*Request protobuf, as sent (resume re-reads it)
    KV   job/{id}/seeded          present once a crawl's start URL and sitemap are queued
    KV   idem/{owner}/{sha(key)}  the job id an idempotency key created (the hash of the
                                  request it came with is the job's meta
                                  ``extra["request_sha256"]``; a key whose job meta has
                                  no hash returns its job whatever the request)
    list job/{id}/pages           Document protobufs in completion order; seq = paging index
    list job/{id}/errors          PageError protobufs (page errors)
    list job/{id}/notes           PageError protobufs without URL (job-level notes)
    list job/{id}/frontier        "{depth} {url}" crawl entries in enqueue order (never popped)
    list job/{id}/added           URLs AppendBatchScrape added to a batch, in order (never
                                  popped): batch index = len(request.urls) + seq
    KV   job/{id}/appends         JSON {sha(key): [request hash, first, count, reopened]} of
                                  the job's latest keyed appends (AIP-155 replays)
    set  job/{id}/seen            page keys ever queued, and aliases claimed (crawl dedup)
    set  job/{id}/done            finished page keys and aliases (crawl) or indices (batch)
    set  job/{id}/attempts        "{n} {mark}": retry n of the page ``mark`` (its done
                                  mark) was scheduled (``retries_used``/``mark_retry``)
    KV   job/{id}/cookie/{slot}   one cookie of the job's jar, as JSON
                                  (``pagesift.primary.engine.cookiejar.JobCookies.changes``):
                                  a cookie keeps its slot while it lives, so a change
                                  overwrites its record and its deletion deletes it;
                                  written in the group of the page that changed it,
                                  or of a later one past the jar's write budget
                                  (``cookierecords``: 32 KiB + 4 KiB a page)
    KV   job/{id}/cookie_slots    how many slots were ever used (decimal): expiry deletes
                                  ``cookie/0`` up to it (at most ``MAX_JOB_COOKIES`` + the
                                  few reserved by a failed group), without a scan
    KV   job/{id}/cookies         a jar stored as one snapshot (a job stored without
                                  ``cookie/{slot}`` records): its Set-Cookie lines
                                  (read once on resume, deleted by the next page)
    KV   job/{id}/model_usage     ModelUsage protobuf: the model calls and tokens of the
                                  job's stored pages, summed in each page's group
    KV   job/{id}/removed         a finished change-tracked crawl: the URLs of the previous
                                  one it did not find again, one per line (``pagecache``)
    KV   job/{id}/webhook         the job's webhook config (``pagesift.primary.webhooks.outbox``)
    list job/{id}/outbox          webhook events not yet delivered
    KV   job/{id}/webhook_ack     the webhook delivery cursor
    KV   job/{id}/run             the run marker of the node running the job
                                  (``pagesift.core.jobs.quarantine.RunMarker``): present
                                  while a run is in progress; found at start-up, it
                                  means that run ended uncleanly
    KV   job/{id}/poison          the job's quarantine budget (``quarantine.Budget``)

A paused job (state ``paused``: quarantined, ``quarantine``; or stopped by the store)
keeps its reason in its meta's ``extra["pause_reason"]`` (``poisoned`` or
``storage_unavailable``) and ``extra["paused_ms"]``, its evidence in ``note`` and
the poison budget; it is not resumed at start-up, is not terminal (it does not
expire, and counts as one of its owner's active jobs) and ends by ``ResumeJob`` or
``CancelJob``.

Quota usage (``usage/{account}/{hour}``, ``pagesift.core.jobs.quota``) belongs to the
account, not the job, and outlives it.

A page's document and its done mark are written in the same group (see
``record_page`` in ``pagesift.primary.jobs.recording``), so the pages list never holds
a page twice and never lacks a page whose done mark exists. The reads here touch only
the store, which is why a standby answers them from its replica exactly as the primary
does.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from google.protobuf.timestamp_pb2 import Timestamp

from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.v1 import jobs_pb2

JOBS_SET = "jobs"
TERMINAL = {"completed", "failed", "cancelled"}

STATE_TO_PB = {
    "scraping": jobs_pb2.JOB_STATE_SCRAPING,
    "completed": jobs_pb2.JOB_STATE_COMPLETED,
    "failed": jobs_pb2.JOB_STATE_FAILED,
    "cancelled": jobs_pb2.JOB_STATE_CANCELLED,
    "paused": jobs_pb2.JOB_STATE_PAUSED,
}
PAUSE_REASONS = {
    "poisoned": jobs_pb2.PAUSE_REASON_POISONED,
    "storage_unavailable": jobs_pb2.PAUSE_REASON_STORAGE_UNAVAILABLE,
}
KIND_TO_PB = {"batch": jobs_pb2.JOB_KIND_BATCH_SCRAPE, "crawl": jobs_pb2.JOB_KIND_CRAWL}


JOB_PREFIX = "job/"

KeyKind = Literal["kv", "list", "set"]


@dataclass(frozen=True)
class JobKeys:
    """Every store name a job owns (see the layout above)."""

    job_id: str

    @property
    def meta(self) -> str:
        return f"{JOB_PREFIX}{self.job_id}"

    @property
    def prefix(self) -> str:
        """What every name of the job but ``meta`` starts with: ``job/{id}/``."""
        return f"{JOB_PREFIX}{self.job_id}/"

    def _part(self, what: str) -> str:
        return f"{JOB_PREFIX}{self.job_id}/{what}"

    @property
    def request(self) -> str:
        return self._part("request")

    @property
    def model_usage(self) -> str:
        return self._part("model_usage")

    @property
    def seeded(self) -> str:
        return self._part("seeded")

    @property
    def pages(self) -> str:
        return self._part("pages")

    @property
    def errors(self) -> str:
        return self._part("errors")

    @property
    def notes(self) -> str:
        return self._part("notes")

    @property
    def frontier(self) -> str:
        return self._part("frontier")

    @property
    def added(self) -> str:
        return self._part("added")

    @property
    def appends(self) -> str:
        return self._part("appends")

    @property
    def seen(self) -> str:
        return self._part("seen")

    @property
    def done(self) -> str:
        return self._part("done")

    @property
    def attempts(self) -> str:
        return self._part("attempts")

    @property
    def cookies(self) -> str:
        return self._part("cookies")

    def cookie(self, slot: int) -> str:
        return self._part(f"cookie/{slot}")

    @property
    def cookie_prefix(self) -> str:
        return self._part("cookie/")

    @property
    def cookie_slots(self) -> str:
        return self._part("cookie_slots")

    @property
    def removed(self) -> str:
        return self._part("removed")

    @property
    def webhook(self) -> str:
        return self._part("webhook")

    @property
    def outbox(self) -> str:
        return self._part("outbox")

    @property
    def webhook_ack(self) -> str:
        return self._part("webhook_ack")

    @property
    def run(self) -> str:
        return self._part("run")

    @property
    def poison(self) -> str:
        return self._part("poison")

    def all(self) -> list[tuple[KeyKind, str]]:
        """Every (kind, name) of the job, in the order expiry deletes them: its lists,
        sets and side KVs, the webhook's keys, and ``meta`` last (the job exists until
        its metadata goes). The idempotency key is the owner's (``idem_key``)."""
        return [
            ("list", self.pages),
            ("list", self.errors),
            ("list", self.notes),
            ("list", self.frontier),
            ("list", self.added),
            ("set", self.seen),
            ("set", self.done),
            ("set", self.attempts),
            ("kv", self.request),
            ("kv", self.seeded),
            ("kv", self.cookies),
            ("kv", self.cookie_slots),
            ("kv", self.removed),
            ("kv", self.model_usage),
            ("kv", self.appends),
            ("kv", self.run),
            ("kv", self.poison),
            ("list", self.outbox),
            ("kv", self.webhook),
            ("kv", self.webhook_ack),
            ("kv", self.meta),
        ]


def _attempt_member(mark: bytes, n: int) -> bytes:
    return f"{n} ".encode() + mark


def retries_used(store: Store, job_id: str, mark: bytes, limit: int) -> int:
    """How many retries of page ``mark`` were scheduled (at most ``limit`` looked up:
    retry n is only ever marked after retry n - 1)."""
    name = JobKeys(job_id).attempts
    n = 0
    while n < limit and store.set_contains(name, _attempt_member(mark, n + 1)):
        n += 1
    return n


def mark_retry(g: WriteGroup, job_id: str, mark: bytes, n: int) -> bool:
    """Inside a group: record that retry ``n`` of page ``mark`` is scheduled; False
    (nothing written) when the page is done or the job gone."""
    keys = JobKeys(job_id)
    if g.get(keys.meta) is None or g.contains(keys.done, mark):
        return False
    g.insert(keys.attempts, _attempt_member(mark, n))
    return True


def delete_job(g: WriteGroup, job_id: str, meta: JobMeta | None) -> None:
    """Expiry, in one group: every name ``JobKeys.all`` lists (the webhook's too), the
    owner's idempotency key for the job, the job's place in its owner's index and in
    the jobs set."""
    keys = JobKeys(job_id)
    slots = g.get(keys.cookie_slots)
    for slot in range(int(slots) if slots is not None and slots.isdigit() else 0):
        g.delete(keys.cookie(slot))  # the jar's records (``cookie_slots`` bounds them)
    for kind, name in keys.all():
        if name == keys.meta and meta is not None and meta.idempotency_key:
            g.delete(idem_key(meta.owner, meta.idempotency_key))  # the order it always had
        if kind == "list":
            g.clear_list(name, drop=True)
        elif kind == "set":
            g.clear_set(name)
        else:
            g.delete(name)
    g.remove(JOBS_SET, job_id.encode())
    if meta is not None:
        g.remove(owner_set(meta.owner), owner_member(meta.created_ms, job_id))
    if g.set_len(JOBS_SET) == 0 and g.get(OWNER_INDEX_DONE) is not None:
        g.delete(OWNER_INDEX_DONE)  # an empty store's index is complete without it


def read_cookies(store: Store, job_id: str) -> tuple[list[tuple[int, bytes]], int, bytes | None]:
    """A job's cookie jar as stored: its ``(slot, record)`` pairs, its slot count and
    the snapshot of a job stored without records (None: none)."""
    keys = JobKeys(job_id)
    prefix = keys.cookie_prefix
    records: list[tuple[int, bytes]] = []
    for name in store.keys(prefix):
        slot, raw = name[len(prefix) :], store.get(name)
        if slot.isdigit() and raw is not None:
            records.append((int(slot), raw))
    slots = store.get(keys.cookie_slots)
    count = int(slots) if slots is not None and slots.isdigit() else 0
    return records, count, store.get(keys.cookies)


# The bound of one page's write group (``recording.record_page``; ``Store.write`` refuses a
# bigger one with ``GroupTooLarge``, and the page gets a ``too_large`` error instead).
# What a legitimate page's group holds, for a body of B = max_body_bytes:
#   its Document: raw_html, html and markdown, each about the body's size      3 B
#   the page cache's copy of it (a request with max_age)                       3 B
#   change tracking: the markdown again, and a diff of at most both versions   3 B
#   its links: in the Document, the cache copy, the frontier and seen set;
#     an absolute link costs its own length in the body, so at most            4 B
#   = 13 B; PAGE_GROUP_FACTOR = 16 leaves 3 B for text a decoder widens (a
#   Latin-1 byte is two UTF-8 bytes) and Set-Cookie changes are bounded apart:
#   one group writes at most cookierecords.JAR_BURST_BYTES (32 KiB) of the jar's
#   records, well under PAGE_GROUP_JAR_BYTES.
# Defaults: 16 x 10 MiB + 2 MiB = 162 MiB. What passes it comes from a hostile page,
# e.g. 60 KB of relative links under a 2,000-character URL, each one stored as a
# 2 KB absolute URL several times over.
PAGE_GROUP_FACTOR = 16
PAGE_GROUP_JAR_BYTES = 2 << 20


def page_group_bytes(max_body_bytes: int) -> int:
    """The most bytes (of ops) one page's write group may carry (see above)."""
    return PAGE_GROUP_FACTOR * max_body_bytes + PAGE_GROUP_JAR_BYTES


def job_of(name: str) -> str | None:
    """The id of the job owning store name ``name`` (``job/{id}`` or ``job/{id}/...``),
    or None for a name no job owns."""
    if not name.startswith(JOB_PREFIX):
        return None
    return name[len(JOB_PREFIX) :].split("/", 1)[0] or None


def idem_key(owner: str, key: str) -> str:
    return f"idem/{owner}/{hashlib.sha256(key.encode()).hexdigest()[:32]}"


class IdempotencyKeyReused(Exception):
    """AIP-155: an idempotency key already used with another request (``job_id`` is
    the job it created)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


class JobNotAppendable(Exception):
    """AppendBatchScrape on a job that cannot take URLs: not a batch scrape, or one
    that ended ``failed`` or ``cancelled`` (a completed one runs again)."""

    def __init__(self, job_id: str, kind: str, state: str) -> None:
        what = "not a batch-scrape job" if kind != "batch" else f"the job ended {state}"
        super().__init__(f"id: job {job_id} takes no more URLs: {what} (kind {kind})")
        self.job_id = job_id
        self.kind = kind
        self.state = state


REQUEST_HASH = (
    "request_sha256"  # JobMeta.extra: the hash of the request an idempotency key came with
)


def request_hash(kind: str, request: bytes) -> str:
    """What identifies a registration's request for AIP-155: its kind and its stored
    (deterministically serialized) request."""
    h = hashlib.sha256(kind.encode() + b"\x00")
    h.update(request)
    return h.hexdigest()


# the owner index (ListJobs) ----------------------------------------------------------

OWNER_INDEX_DONE = "owner_index"


def owner_set(owner: str) -> str:
    return f"owner/{owner}/jobs"


def owner_member(created_ms: int, job_id: str) -> bytes:
    return f"{created_ms:016d} {job_id}".encode()


def member_job(member: bytes) -> str:
    """The job id of an owner-index member."""
    return member.decode().split(" ", 1)[1]


def build_owner_index(g: WriteGroup, store: Store) -> int:
    """The start-up migration, as one group: every stored job into its owner's set,
    then the ``owner_index`` marker. Returns how many members were added (0, and no
    op, once the marker is there or when there is no job)."""
    if g.get(OWNER_INDEX_DONE) is not None or g.set_len(JOBS_SET) == 0:
        return 0
    added = 0
    for job_id in all_job_ids(store):
        meta = load_meta(store, job_id)
        if meta is not None and g.insert(
            owner_set(meta.owner), owner_member(meta.created_ms, job_id)
        ):
            added += 1
    g.put(OWNER_INDEX_DONE, b"1")
    return added


def index_owner(g: WriteGroup, meta: JobMeta) -> None:
    """Inside the registration's group: the new job into its owner's set (and the
    marker, when this is the first job of an empty store)."""
    if g.get(OWNER_INDEX_DONE) is None and g.set_len(JOBS_SET) == 0:
        g.put(OWNER_INDEX_DONE, b"1")
    g.insert(owner_set(meta.owner), owner_member(meta.created_ms, meta.id))


def has_owner_index(store: Store) -> bool:
    """Whether ListJobs may read the owner index (complete, or no job at all)."""
    return store.get(OWNER_INDEX_DONE) is not None or store.set_len(JOBS_SET) == 0


# webhook events: the one list, and the one validator (job start, webhooks.configure) ----

WEBHOOK_EVENTS = ("started", "page", "page_failed", "completed", "failed", "cancelled")


def event_name(event: jobs_pb2.WebhookEvent.ValueType) -> str:
    """The string form of a ``WebhookEvent`` ("" for UNSPECIFIED or an unknown number)."""
    if event == jobs_pb2.WEBHOOK_EVENT_UNSPECIFIED:
        return ""
    try:
        return jobs_pb2.WebhookEvent.Name(event)[len("WEBHOOK_EVENT_") :].lower()
    except ValueError:
        return ""


def webhook_events(events: Sequence[str], field: str = "webhook.events") -> tuple[str, ...]:
    """The wanted events in canonical order; none listed means all. ``ValueError``
    names the field index of an unknown event."""
    if not events:
        return WEBHOOK_EVENTS
    for i, event in enumerate(events):
        if event not in WEBHOOK_EVENTS:
            raise ValueError(
                f"{field}[{i}]: unknown event {event!r} (one of {', '.join(WEBHOOK_EVENTS)})"
            )
    wanted = set(events)
    return tuple(e for e in WEBHOOK_EVENTS if e in wanted)


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

    @property
    def paused(self) -> bool:
        return self.state == "paused"


def now_ms() -> int:
    return int(time.time() * 1000)


def timestamp(ms: int) -> Timestamp:
    ts = Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def load_meta(store: Store, job_id: str) -> JobMeta | None:
    raw = store.get(JobKeys(job_id).meta)
    return JobMeta.decode(raw) if raw is not None else None


def model_usage(store: Store, job_id: str) -> jobs_pb2.ModelUsage:
    """The job's model calls and tokens so far (``JobKeys.model_usage``)."""
    usage = jobs_pb2.ModelUsage()
    raw = store.get(JobKeys(job_id).model_usage)
    if raw is not None:
        usage.ParseFromString(raw)
    return usage


def all_job_ids(store: Store) -> list[str]:
    return [m.decode() for m in store.set_members(JOBS_SET)]


# pausing (quarantine, storage) ------------------------------------------------------


def done_count(store: Store | WriteGroup, job_id: str) -> int:
    """Pages the job finished: documents plus page errors."""
    keys = JobKeys(job_id)
    return store.list_len(keys.pages) + store.list_len(keys.errors)


def pause(g: WriteGroup, job_id: str, reason: str, note: str) -> JobMeta | None:
    """Inside a group: a running job paused for ``reason`` (a ``PAUSE_REASONS`` key)
    with ``note`` as its evidence; its run marker goes (the stop is clean). The meta
    after the group (a finished or missing job: unchanged, or None)."""
    if reason not in PAUSE_REASONS:
        raise ValueError(f"not a pause reason: {reason!r}")
    keys = JobKeys(job_id)
    raw = g.get(keys.meta)
    if raw is None:
        return None
    meta = JobMeta.decode(raw)
    if meta.terminal:
        return meta
    meta.state, meta.note = "paused", note
    meta.extra = {**meta.extra, "pause_reason": reason, "paused_ms": now_ms()}
    g.put(keys.meta, meta.encode())
    g.delete(keys.run)
    return meta


def unpause(g: WriteGroup, job_id: str) -> JobMeta | None:
    """Inside a group: a paused job running again (``ResumeJob``, or the store taking
    writes again), its quarantine budget deleted when it was quarantined (a job
    paused for storage keeps its counts). The meta after the group (unchanged unless
    it was paused)."""
    keys = JobKeys(job_id)
    raw = g.get(keys.meta)
    if raw is None:
        return None
    meta = JobMeta.decode(raw)
    if not meta.paused:
        return meta
    poisoned = meta.extra.get("pause_reason") == "poisoned"
    meta.state, meta.note = "scraping", ""
    meta.extra = {k: v for k, v in meta.extra.items() if k not in ("pause_reason", "paused_ms")}
    g.put(keys.meta, meta.encode())
    if poisoned:
        g.delete(keys.poison)
    return meta
