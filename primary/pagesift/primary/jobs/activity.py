"""Per account, what this primary is doing now: its unfinished jobs, pages in flight, last page.

What it owns
------------
``Activity``, the in-memory figures ``GetAccountUsage`` reads from the primary's runtime
(``runtime.Jobs.activity``) and nothing else does:

- ``fetching(owner, job_id)``: an async context around one page's fetch and record (a
  job's attempt inside its permit; a Scrape call, ``job_id`` ""): pages in flight.
- ``page_stored(job_id)`` (a job's page was stored) and a Scrape call's ``fetching``
  ending without an exception: the account's most recent successful page.
- ``job_started(owner, job_id)`` (at registration, and at start-up for every job not
  finished) and ``of(store, owner)``: the account's unfinished jobs, each checked
  against its stored meta (finished or deleted ones leave the set), so one call costs
  a meta read per unfinished job of the account (plus those finished since the last
  call), never a scan of every job.

Invariants
----------
- Every stored job that is not finished is in its owner's set: a job becomes
  unfinished only by registration (paused jobs stay unfinished; nothing makes a
  finished job run again), and start-up adds every one it finds.
- Nothing here is durable or replicated: a new primary starts with no page in flight
  and no last page time (the RPC then leaves ``last_page_at`` unset).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from pagesift.core.api.ports import AccountActivity
from pagesift.core.jobs import records
from pagesift.core.store.db import Store

__all__ = ["Activity"]


class Activity:
    def __init__(self) -> None:
        self._jobs: dict[str, set[str]] = {}  # owner -> job ids that may be unfinished
        self._jobs_in_flight: dict[str, int] = {}  # job id -> its pages being fetched
        self._owner_of: dict[str, str] = {}  # job id -> its owner, while a page is in flight
        self._scrapes: dict[str, int] = {}  # owner -> Scrape calls being fetched
        self._last_ms: dict[str, int] = {}  # owner -> its latest successful page

    def job_started(self, owner: str, job_id: str) -> None:
        self._jobs.setdefault(owner, set()).add(job_id)

    @contextlib.asynccontextmanager
    async def fetching(self, owner: str, job_id: str = "") -> AsyncIterator[None]:
        """One page of ``owner`` in flight: of job ``job_id`` (its run calls
        ``page_stored`` when it stores it), or a Scrape call (``job_id`` ""), which
        succeeded when the context ends without an exception."""
        counts, key = (self._jobs_in_flight, job_id) if job_id else (self._scrapes, owner)
        counts[key] = counts.get(key, 0) + 1
        if job_id:
            self._owner_of[job_id] = owner
        try:
            yield
            if not job_id:
                self._page_done(owner)
        finally:
            counts[key] -= 1
            if not counts[key]:
                del counts[key]
                self._owner_of.pop(key, None)

    def page_stored(self, job_id: str) -> None:
        """A page of ``job_id`` (in flight, inside ``fetching``) was stored."""
        owner = self._owner_of.get(job_id)
        if owner is not None:
            self._page_done(owner)

    def _page_done(self, owner: str) -> None:
        self._last_ms[owner] = max(records.now_ms(), self._last_ms.get(owner, 0))

    def of(self, store: Store, owner: str) -> AccountActivity:
        """``owner``'s unfinished jobs (as stored now), pages in flight, last page."""
        ids = self._jobs.get(owner, set())
        metas: list[records.JobMeta] = []
        for job_id in sorted(ids):
            meta = records.load_meta(store, job_id)
            if meta is None or meta.terminal or meta.owner != owner:
                ids.discard(job_id)
            else:
                metas.append(meta)
        if not ids:
            self._jobs.pop(owner, None)
        return AccountActivity(
            jobs=tuple(metas),
            in_flight={m.id: self._jobs_in_flight.get(m.id, 0) for m in metas},
            scrapes_in_flight=self._scrapes.get(owner, 0),
            last_page_ms=self._last_ms.get(owner, 0),
        )
