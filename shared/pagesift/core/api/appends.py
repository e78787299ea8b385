"""``JobService.AppendBatchScrape``: URLs added to a batch-scrape job its caller started.

What it owns
------------
``append_batch``, the handler's body (``service.JobService.AppendBatchScrape`` is its
thin shell, authenticated there): the runtime (a standby answers NOT_PRIMARY before
it looks the job up), the job (the caller's, not expired: NOT_FOUND otherwise, as every
other call), its stored request, one ``specs.append`` call (the URLs as a start's:
count, rules, address guard; options and concurrency the job's own), then the
runtime's one write group, whose write section checks the limits.

Invariants
----------
- The limits of a start apply to the job as it will be (``check``): the server's
  ``max_batch_urls`` and the account's on its total after the append (a job never holds
  more URLs than one start could give it), the account's daily pages, and
  ``max_concurrent_jobs`` when the append runs a completed job again.
- A crawl, or a batch that ended failed or cancelled, is JOB_NOT_APPENDABLE
  (FAILED_PRECONDITION); the runtime re-checks everything inside its group.
"""

from __future__ import annotations

import time

from pagesift.core.api.errortable import JobNotFound, StandbyNode
from pagesift.core.api.ports import Node
from pagesift.core.jobs import quota, records, specs, validate
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.specs import Permissions
from pagesift.core.jobs.validate import InvalidArgument
from pagesift.v1 import jobs_pb2

__all__ = ["append_batch"]


def _gone(job_id: str) -> JobNotFound:
    return JobNotFound(job_id, f"id: no job {job_id}")


async def append_batch(
    node: Node, caller: Account, request: jobs_pb2.AppendBatchScrapeRequest
) -> jobs_pb2.AppendBatchScrapeResponse:
    """AppendBatchScrape for ``caller`` (authenticated by the service)."""
    runtime = node.runtime()
    if runtime is None:
        raise StandbyNode()
    validate.job_id(request.id)
    store = node.store()
    meta = records.load_meta(store, request.id)
    if (
        meta is None
        or meta.owner != caller.name
        or (meta.terminal and meta.expires_ms <= records.now_ms())
    ):
        raise _gone(request.id)
    stored = specs.stored(store, meta) if meta.kind == "batch" else None  # parsed once
    if not isinstance(stored, specs.BatchSpec):
        raise records.JobNotAppendable(meta.id, meta.kind, meta.state)
    job = stored.request
    del stored
    permissions = Permissions(caller, node.accounts.webhook_secret(caller.name) is not None)
    spec = await specs.append(request, permissions, node.config, job)
    del job
    cap = node.config.max_batch_urls

    def check(total: int, running: bool) -> None:
        """Inside the group: the limits a start of the job as it will be meets."""
        if total > cap:
            raise InvalidArgument("urls", f"the job would hold {total} URLs, over the cap of {cap}")
        now = time.time()
        quota.check_start(
            caller,
            quota.active_jobs(store, caller.name) - (1 if running else 0),
            quota.used_today(store, caller.name, now),
            "batch",
            batch_urls=total,
            resets_at=quota.resets_at(store, caller.name, now, caller.pages_per_day),
        )

    got = await runtime.append(spec, check)
    if got is None:
        raise _gone(request.id)
    return jobs_pb2.AppendBatchScrapeResponse(
        id=request.id,
        invalid_urls=spec.invalid,
        first_index=got.first,
        added=got.added,
        total=got.total,
        reopened=got.reopened,
    )
