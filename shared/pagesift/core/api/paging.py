"""Reading a job's results a piece at a time: page tokens, size-bounded windows, Map batches.

What it owns: the AIP-158 paging of ListJobs and GetJobErrors (``page_size``, opaque
``page_token`` s that name the call and filter they were issued for), the windows
GetJob and WatchJob read from the store (bounded in count and in bytes, read a few
documents at a time so that no more than a window is ever held), and the batches a
Map response is cut into.

Invariants: every function here is pure over the store it is given (no gRPC, no
clock); a token from another call, filter or job is ``InvalidArgument`` naming
``page_token``; a window holds at least one document (a bigger one comes alone),
so a reader always makes progress.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable

from pagesift.core.api.streams import WINDOW_DOCS
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import records
from pagesift.core.jobs.validate import InvalidArgument
from pagesift.core.store.db import Store
from pagesift.v1 import jobs_pb2

LIST_SCAN_FACTOR = 10  # ListJobs reads at most this many index members per wanted job
LIST_SCAN_MIN = 1_000  # ... and at least this many, before it returns a short page
JOBS_TOKEN = b"jobs1"
ERRORS_TOKEN = b"errors1"


def page_size(size: int, config: ServerConfig) -> int:
    """AIP-158: 0 is the default, above the maximum is cut to it, negative is refused."""
    if size < 0:
        raise InvalidArgument("page_size", f"{size} is negative")
    return min(size or config.default_page_size, config.max_page_size) or 1


def token(*parts: bytes) -> str:
    return base64.urlsafe_b64encode(b"\x00".join(parts)).decode()


def untoken(token: str, kind: bytes, n: int) -> list[bytes]:
    """The ``n`` parts after ``kind`` of a page token, or InvalidArgument naming it."""
    try:
        parts = base64.urlsafe_b64decode(token.encode("ascii")).split(b"\x00")
    except (ValueError, binascii.Error, UnicodeEncodeError):
        parts = []
    if len(parts) != n + 1 or parts[0] != kind:
        raise InvalidArgument("page_token", "not a page token of this call")
    return parts[1:]


_MEMBER = re.compile(rb"\d{16} [0-9A-Za-z_-]{1,64}")
_STATE_OF_PB = {pb: name for name, pb in records.STATE_TO_PB.items()}


def list_filter(request: jobs_pb2.ListJobsRequest) -> tuple[frozenset[str] | None, bytes]:
    """The states ListJobs keeps (None: every one) and the filter's tag in its tokens."""
    wanted: set[str] | None = None
    for i, state in enumerate(request.states):
        name = _STATE_OF_PB.get(state)
        if name is None:
            raise InvalidArgument(f"states[{i}]", f"not a job state: {state}")
        wanted = (wanted or set()) | {name}
    if request.active_only:
        wanted = {"scraping"} & wanted if wanted is not None else {"scraping"}
    tag = b"all" if wanted is None else ",".join(sorted(wanted)).encode()
    return (frozenset(wanted) if wanted is not None else None), tag


def list_after(token: str, tag: bytes) -> bytes | None:
    if not token:
        return None
    got_tag, member = untoken(token, JOBS_TOKEN, 2)
    if got_tag != tag:
        raise InvalidArgument(
            "page_token", "issued for another filter (active_only, states): start again"
        )
    if not _MEMBER.fullmatch(member):
        raise InvalidArgument("page_token", "not a page token of this call")
    return member


def errors_start(token: str, job_id: str) -> tuple[str, int]:
    if not token:
        return "errors", 0
    got_id, which, seq = untoken(token, ERRORS_TOKEN, 3)
    if got_id != job_id.encode():
        raise InvalidArgument("page_token", "issued for another job")
    if which not in (b"errors", b"notes") or not seq.isdigit() or len(seq) > 19:
        raise InvalidArgument("page_token", "not a page token of this call")
    return which.decode(), int(seq)


def window(store: Store, job_id: str, index: int, count: int, visible: int | None) -> list[bytes]:
    """Up to ``count`` stored documents from ``index`` on, as bytes (capped at ``visible``)."""
    if visible is not None:
        count = min(count, visible - index)
    return store.list_range(records.JobKeys(job_id).pages, index, count) if count > 0 else []


def watch_window(
    store: Store, job_id: str, index: int, visible: int | None, budget: int
) -> tuple[list[bytes], int]:
    """A watcher's next documents from ``index`` on, and their size as message fields:
    at most ``WINDOW_DOCS`` (capped at ``visible``) and at most ``budget`` bytes, read
    one at a time so that no more is ever held; at least one (a bigger one alone)."""
    count = WINDOW_DOCS if visible is None else min(WINDOW_DOCS, visible - index)
    key = records.JobKeys(job_id).pages
    out: list[bytes] = []
    used = 0
    while len(out) < count:
        got = store.list_range(key, index + len(out), 1)
        if not got:
            break
        size = field_bytes(len(got[0]))
        if out and used + size > budget:
            break  # read again by the next window
        out.append(got[0])
        used += size
        if used >= budget:
            break
    return out, used


def field_bytes(size: int) -> int:
    """What a length-delimited field of ``size`` bytes (numbers below 16) adds to its message."""
    length = 1
    while size >= 1 << (7 * length):
        length += 1
    return 1 + length + size


def sized_window(
    store: Store, job_id: str, index: int, count: int, visible: int | None, budget: int
) -> list[bytes]:
    """Stored documents from ``index`` on, as bytes: at most ``count`` (capped at
    ``visible``) and at most ``budget`` bytes as message fields, but at least one (a
    larger document comes alone). Read a few at a time, so a page of big documents
    holds about ``budget`` in memory, not ``count`` of them."""
    if visible is not None:
        count = min(count, visible - index)
    key = records.JobKeys(job_id).pages
    out: list[bytes] = []
    used = 0
    chunk = min(WINDOW_DOCS, count)
    while len(out) < count:
        raws = store.list_range(key, index + len(out), min(chunk, count - len(out)))
        if not raws:
            break
        for raw in raws:
            size = field_bytes(len(raw))
            if out and used + size > budget:
                return out
            out.append(raw)
            used += size
        average = max(1, used // len(out))
        chunk = max(1, min(4 * WINDOW_DOCS, (budget - used) // average + 1))
    return out


MAP_BATCH_URLS = 1_000  # URLs in one MapResponse at most
MAP_BATCH_BYTES = 1024 * 1024  # ... and about this many bytes (a long URL comes alone)


def url_batches(found: list[str]) -> list[list[str]]:
    """``found`` cut into MapResponse batches: in order, at most ``MAP_BATCH_URLS``
    URLs and about ``MAP_BATCH_BYTES`` each (at least one URL a batch)."""
    out: list[list[str]] = []
    batch: list[str] = []
    size = 0
    for url in found:
        cost = field_bytes(len(url.encode()))
        if batch and (len(batch) >= MAP_BATCH_URLS or size + cost > MAP_BATCH_BYTES):
            out.append(batch)
            batch, size = [], 0
        batch.append(url)
        size += cost
    if batch:
        out.append(batch)
    return out


def index_reader(store: Store, owner: str) -> Callable[[bytes | None, int], list[bytes]]:
    """``(after, count) -> members`` of the owner's jobs, newest first: the owner index,
    or (before the start-up migration built it) the same members from the jobs set."""
    if records.has_owner_index(store):
        name = records.owner_set(owner)
        return lambda after, count: store.set_range(name, after, count, reverse=True)
    members = sorted(
        (
            records.owner_member(m.created_ms, m.id)
            for i in records.all_job_ids(store)
            if (m := records.load_meta(store, i)) is not None and m.owner == owner
        ),
        reverse=True,
    )

    def fallback(after: bytes | None, count: int) -> list[bytes]:
        rest = members if after is None else [m for m in members if m < after]
        return rest[:count]

    return fallback
