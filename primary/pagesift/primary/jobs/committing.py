"""A run's commits (``Committer``): what ``recording`` writes, stored, and who is told.

``Runner`` (one per job runtime) holds one ``Committer``; the run loops hand it each
page's outcome and the job's end, and the runtime its own ends (cancel, a bug).

What it owns
------------
- ``record_page`` / ``record_error``: a page's group (``recording.record_page``, bounded
  by ``records.page_group_bytes(max_body_bytes)``; ``recording.record_error``)
  committed, the job's cookie jar (``jars``, of the jobs running here) told what the
  group stored, then the metrics, the account's activity, sync-mode visibility
  (``published``) and the webhook deliverer (``wake``). A group over its bound is
  refused whole (``GroupTooLarge``) and the page gets a ``too_large`` error instead.
- ``finish`` / ``finish_when_writable``: the job's end (``recording.record_finish``, one
  group), logged and woken; ``stop_on_quota``: the account's daily pages ran out, the
  job fails with its pages kept and its run is stopped.
- disk full (``StorageUnavailable``): ``write_when_writable`` waits in memory
  (``storage_back``, polling every ``STORAGE_POLL_SECONDS``) until the store takes
  writes again, then runs the group afresh; it gives up only when the runtime closes.

Why it is safe
--------------
- Each outcome is one group, and a group run again after a refusal re-reads what it
  checks (done marks, the meta): a page is recorded once, never lost, never twice.
- A jar is told a group's changes only after that group committed, so the jar never
  holds a cookie the store lost.
- What it asks of the runtime is the ``CommitHost`` protocol, so imports flow runner
  -> committing -> recording and the runtime is never imported.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol, TypeVar

from pagesift.core.api.metrics import Metrics
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import quota, records
from pagesift.core.jobs.accounts import Accounts
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.store.db import Commit, Store
from pagesift.core.store.errors import StorageUnavailable
from pagesift.core.store.groups import GroupTooLarge, WriteGroup
from pagesift.primary.engine.cookiejar import JarChanges, JobCookies
from pagesift.primary.jobs import recording
from pagesift.primary.jobs.activity import Activity
from pagesift.primary.jobs.recording import PageResult

__all__ = ["STORAGE_POLL_SECONDS", "CommitHost", "Committer"]

logger = logging.getLogger("pagesift.jobs")
T = TypeVar("T")
#: how often a job paused by a refusing store looks whether it takes writes again
STORAGE_POLL_SECONDS = 0.1


class CommitHost(Protocol):
    """What committing a run's records asks of the runtime (``runtime.Jobs``)."""

    @property
    def closing(self) -> bool: ...

    def wake(self, job_id: str) -> None:
        """The job's records changed: its webhook deliverer looks."""

    def stop(self, job_id: str) -> None:
        """End the job's run now (its meta already says why)."""

    async def published(self, job_id: str, seq: int, offset: int) -> None:
        """Page ``seq`` is committed at log ``offset``: clients may see it once the
        sync-mode standby holds it."""


class Committer:
    def __init__(
        self,
        store: Store,
        config: ServerConfig,
        accounts: Accounts,
        host: CommitHost,
        activity: Activity,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.accounts = accounts
        self.metrics = metrics
        self._host = host
        self._activity = activity
        self.jars: dict[str, JobCookies] = {}  # of the jobs running here

    # waiting for the store -----------------------------------------------------------
    async def storage_back(self) -> None:
        """Returns once the store takes writes again (or the runtime closes): a job's
        pause while the volume is full is this wait, in memory."""
        while not self._host.closing:
            if self.store.refusing is None:
                return
            await asyncio.sleep(STORAGE_POLL_SECONDS)

    async def write_when_writable(
        self, fn: Callable[[WriteGroup], T], *, max_bytes: int | None = None
    ) -> Commit[T]:
        """``store.write(fn)``; while the store refuses writes, wait and run the group
        again (it re-reads what it checks: nothing is recorded twice or lost)."""
        while True:
            try:
                return self.store.write(fn, max_bytes=max_bytes)
            except StorageUnavailable:
                if self._host.closing:
                    raise
                await self.storage_back()

    # the end of a job ----------------------------------------------------------------
    def finish(self, job_id: str, state: str, note: str) -> records.JobMeta | None:
        """The job ends ``state`` (``recording.record_finish``, one group)."""
        group = partial(
            recording.record_finish,
            job_id=job_id,
            state=state,
            note=note,
            now_ms=records.now_ms(),
            ttl_ms=int(self.config.job_ttl_seconds * 1000),
        )
        meta = self.store.write(group).result
        self._host.wake(job_id)
        if meta is not None:
            logger.info(
                "job %s %s (account %s)%s",
                job_id,
                meta.state,
                meta.owner,
                f": {note}" if note else "",
                extra={"job": job_id, "account": meta.owner},
            )
        return meta

    async def finish_when_writable(self, job_id: str, state: str, note: str) -> None:
        """``finish`` at a run's end, waiting like ``write_when_writable``."""
        while True:
            try:
                self.finish(job_id, state, note)
                return
            except StorageUnavailable:
                if self._host.closing:
                    raise
                await self.storage_back()

    def stop_on_quota(self, job_id: str, hit: quota.LimitExceeded) -> None:
        """The account's daily pages ran out mid-job: stop it, keeping its pages."""
        if self.metrics is not None:
            self.metrics.limit_hit(hit.limit_name)
        self.finish(job_id, "failed", hit.message)
        self._host.stop(job_id)

    # committing what recording writes --------------------------------------------------
    def _committed(self, jar: JobCookies | None, changes: JarChanges | None) -> None:
        if jar is not None and changes is not None:
            jar.committed(changes)

    async def record_page(self, job_id: str, result: PageResult) -> bool:
        """Commit the page's group (``recording.record_page``; the cluster's page was
        spent at the draw), then tell who waits; True when a document was stored."""
        jar = self.jars.get(job_id)

        def group(g: WriteGroup) -> recording.Recorded:
            return recording.record_page(
                g, job_id, result, accounts=self.accounts, jar=jar, now=time.time()
            )

        bound = records.page_group_bytes(self.config.max_body_bytes)
        try:
            commit = await self.write_when_writable(group, max_bytes=bound)
        except GroupTooLarge as e:  # nothing of it written: the page is an error instead
            why = f"the page's write group is {e.size} bytes, over the {e.bound}-byte bound"
            url = result.page.document.url
            await self.record_error(job_id, result.mark, url, PageError(ErrorCode.TOO_LARGE, why))
            return False
        done = commit.result
        self._committed(jar, done.cookies)
        if done.over_quota is not None:
            self.stop_on_quota(job_id, done.over_quota)
            return False
        if done.failed:
            if self.metrics is not None:
                self.metrics.page_failed(done.failed)
            self._host.wake(job_id)
            return False
        if done.seq is None:
            return False
        self._activity.page_stored(job_id)
        if self.metrics is not None:
            self.metrics.page_recorded(done.kind)
        await self._host.published(job_id, done.seq, commit.offset)
        self._host.wake(job_id)
        return True

    async def record_error(self, job_id: str, mark: bytes, url: str, err: PageError) -> None:
        """Commit the page's error (``recording.record_error``), then wake the deliverer."""
        jar = self.jars.get(job_id)

        def group(g: WriteGroup) -> recording.Recorded:
            return recording.record_error(g, job_id, mark, url, err, jar=jar, now=time.time())

        done = (await self.write_when_writable(group)).result
        self._committed(jar, done.cookies)
        if done.failed:
            if self.metrics is not None:
                self.metrics.page_failed(done.failed)
            self._host.wake(job_id)
