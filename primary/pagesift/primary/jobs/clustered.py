"""The job runtime of a node in a cluster: ``Jobs`` with account limits that hold across pairs.

What it owns
------------
``ClusteredJobs``, the runtime a node runs when it is one pair of a cluster: the same
``runtime.Jobs`` with its limits' cluster-wide share asked of a ``ClusterLimits`` port
(``pagesift.shared.jobs.clusterlimits``; the node wires the etcd one,
``pagesift.coord.budgets``), at the points where a job's life changes:

- ``register``: the job's id minted first, its slot taken (and its account's daily
  pages checked) before the registration's group, given back when the group did not
  create the job (a limit inside it, an idempotent retry);
- ``start`` / ``close``: the unfinished jobs re-take their slots before they resume;
  on stepping down or stopping, the slots and unused pages go back;
- ``append`` that reopens a finished batch: a slot first, as for a start;
- ``wake`` (every record of a job, its end included): the port looks whether it ended;
- pages: each page's group spends from the pair's block (``runner.pages``), and so does
  a Scrape's (``oneoff.scrape``).

Why a subclass: the local limits (``quota``) still hold inside each pair exactly as
before; this only adds the cluster's check around them, and a single pair runs
``runtime.Jobs`` unchanged.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pagesift.primary.jobs import oneoff
from pagesift.primary.jobs.appending import Appended, Check
from pagesift.primary.jobs.runtime import Jobs, Registered
from pagesift.shared.jobs import records as jr
from pagesift.shared.jobs.clusterlimits import ClusterLimits
from pagesift.shared.jobs.specs import AppendSpec
from pagesift.v1 import jobs_pb2

__all__ = ["ClusteredJobs"]


class ClusteredJobs(Jobs):
    def __init__(self, *args: Any, budgets: ClusterLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.budgets = budgets
        self.runner.pages = budgets

    async def start(self) -> None:
        await self.budgets.attach(self.store)  # slots before the jobs resume (bounded)
        await super().start()

    async def close(self) -> None:
        await super().close()
        await self.budgets.detach()

    def wake(self, job_id: str) -> None:
        super().wake(job_id)
        self.budgets.changed(job_id)

    async def register(
        self,
        kind: str,
        owner: str,
        request: bytes,
        idempotency_key: str,
        *,
        total: int = 0,
        limit: int = 0,
        webhook: jobs_pb2.Webhook | None = None,
        check: Callable[[], None] | None = None,
        job_id: str = "",
    ) -> Registered:
        job_id = job_id or str(uuid.uuid4())
        register = super().register
        async with self.budgets.starting(owner, job_id, idempotency_key) as start:
            reg = await register(
                kind, owner, request, idempotency_key, total=total, limit=limit,
                webhook=webhook, check=check, job_id=job_id,
            )  # fmt: skip
            return start.keep(reg)

    async def append(self, spec: AppendSpec, check: Check) -> Appended | None:
        """AppendBatchScrape: a finished batch that the URLs reopen runs again, so it
        takes a slot first (given back when the append did not reopen it)."""
        meta = jr.load_meta(self.store, spec.id)
        if meta is None or not meta.terminal or meta.owner != spec.owner:
            return await super().append(spec, check)
        async with self.budgets.starting(spec.owner, spec.id, "") as start:
            got = await super().append(spec, check)
            start.created = got is not None and got.reopened
            return got

    async def scrape(
        self, url: str, options: jobs_pb2.ScrapeOptions, owner: str
    ) -> jobs_pb2.Document:
        async with self.runner.activity.fetching(owner):
            return await oneoff.scrape(
                self.store, self.engine, self.accounts, owner, url, options, self.budgets
            )
