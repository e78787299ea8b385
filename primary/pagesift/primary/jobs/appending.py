"""A batch job's URL list as it grows: AppendBatchScrape's group, the run's queue, its end.

What it owns
------------
- ``append``: the ONE group of an AppendBatchScrape (pure over the group): the URLs
  pushed onto ``job/{id}/added``, the meta's ``total`` grown, a ``completed`` job
  reopened (``scraping``, a fresh TTL), the idempotency record. ``runtime.Jobs.append``
  commits it and runs a reopened job once its ending run is gone.
- ``batch_urls``: a batch's ``(index, url)`` from an index on: the request's URLs, then
  the added ones (read in chunks, and again at their end: a run sees what is appended
  while it runs).
- ``record_end``: a batch run's end, one group: ``completed`` unless URLs were added
  past what the run covered (then it goes on with them).

Why it is safe
--------------
- The URLs, ``total`` and the key's record are one group: a crash loses the whole
  append or none of it, and a replay of the key (``APPEND_KEYS_KEPT`` latest kept)
  adds nothing. Batch indices only grow, so pages keep their order, done marks stay
  valid and a resumed run takes every index not done once.
- The end check and the append are groups, serialized by the store's write section:
  a job never ends ``completed`` with an added URL its run did not cover.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pagesift.core.jobs import records
from pagesift.core.jobs.specs import AppendSpec
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.primary.jobs import recording
from pagesift.v1 import jobs_pb2

__all__ = ["APPEND_KEYS_KEPT", "CHUNK", "Appended", "append", "batch_urls", "record_end"]

APPEND_KEYS_KEPT = 256  # keyed appends a job remembers (a retry comes within seconds)
CHUNK = 512  # added URLs read at once

#: a limit check run inside the group, before anything is written: the job's total
#: after the append, and whether the job counts as running already
Check = Callable[[int, bool], None]


@dataclass(frozen=True)
class Appended:
    """What an append did (``replayed``: its key matched; nothing was written)."""

    first: int
    added: int
    total: int
    reopened: bool = False
    replayed: bool = False
    completed: int = 0  # the job's stored documents (sync-mode visibility)


def _keys(raw: bytes | None) -> dict[str, list[object]]:
    return dict(json.loads(raw)) if raw else {}


def append(
    g: WriteGroup, spec: AppendSpec, *, now_ms: int, ttl_ms: int, check: Check
) -> Appended | None:
    """Add ``spec.urls`` to its owner's batch job (None: no such job of theirs, or
    expired). A known key returns its first answer (``records.IdempotencyKeyReused`` for
    another request); ``records.JobNotAppendable`` for a crawl or a failed/cancelled batch."""
    job_id, owner, urls, key, digest = spec.id, spec.owner, spec.urls, spec.key, spec.digest
    keys = records.JobKeys(job_id)
    raw = g.get(keys.meta)
    meta = records.JobMeta.decode(raw) if raw is not None else None
    if meta is None or meta.owner != owner or (meta.terminal and meta.expires_ms <= now_ms):
        return None
    known = _keys(g.get(keys.appends)) if key else {}
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    if name in known:
        first_digest, first, count, reopened = (*known[name], False)[:4]
        if first_digest != digest:
            raise records.IdempotencyKeyReused(job_id)
        n, k = int(str(first)), int(str(count))
        return Appended(n, k, n + k, reopened=bool(reopened), replayed=True)
    if meta.kind != "batch" or meta.state in ("failed", "cancelled"):
        raise records.JobNotAppendable(job_id, meta.kind, meta.state)
    first = meta.total
    check(first + len(urls), not meta.terminal)
    for url in urls:
        g.push(keys.added, url.encode())
    meta.total = first + len(urls)
    reopened = meta.state == "completed"
    if reopened:  # it runs again; its TTL starts over when it finishes
        meta.state, meta.note, meta.finished_ms = "scraping", "", 0
        meta.expires_ms = now_ms + ttl_ms
    g.put(keys.meta, meta.encode())
    if key:
        known[name] = [digest, first, len(urls), reopened]
        kept = list(known.items())[-APPEND_KEYS_KEPT:]
        g.put(keys.appends, json.dumps(dict(kept), separators=(",", ":")).encode())
    return Appended(first, len(urls), meta.total, reopened, completed=g.list_len(keys.pages))


@dataclass
class Covered:
    """How far a run's ``batch_urls`` read: every index below ``end`` was handed out."""

    end: int = 0


def batch_urls(
    store: Store,
    job_id: str,
    req: jobs_pb2.StartBatchScrapeRequest,
    start: int = 0,
    covered: Covered | None = None,
    *,
    undone: bool = True,
) -> Iterator[tuple[int, str]]:
    """``(index, url)`` of the batch from ``start`` on (``undone``: those without a done
    mark), the request's then the added ones; ``covered.end`` is where it stopped."""
    keys = records.JobKeys(job_id)
    base = len(req.urls)

    def wanted(i: int) -> bool:
        return not undone or not store.set_contains(keys.done, str(i).encode())

    for i in range(start, base):
        if wanted(i):
            yield i, req.urls[i]
    seq = max(0, start - base)
    while True:
        items = store.list_items(keys.added, seq, CHUNK)
        if not items:
            if covered is not None:
                covered.end = base + seq
            return
        for item_seq, raw in items:
            if wanted(base + item_seq):
                yield base + item_seq, raw.decode()
        seq = items[-1][0] + 1


def record_end(
    g: WriteGroup, job_id: str, covered: int, *, now_ms: int, ttl_ms: int
) -> tuple[bool, records.JobMeta | None]:
    """A batch run's end: ``(True, meta)`` once the job is finished (``completed``
    now, or ended already, or gone: meta None); ``(False, None)`` when URLs were
    added at or past ``covered`` (the run goes on with them; nothing written)."""
    raw = g.get(records.JobKeys(job_id).meta)
    if raw is not None:
        meta = records.JobMeta.decode(raw)
        if not meta.terminal and meta.total > covered:
            return False, None
    done = recording.record_finish(g, job_id, "completed", "", now_ms=now_ms, ttl_ms=ttl_ms)
    return True, done
