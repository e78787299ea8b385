"""The job runtime of a node in a cluster: ``Jobs`` with account limits that hold across pairs.

What it owns
------------
``ClusteredJobs``, the runtime a node runs when it is one pair of a cluster: the same
``runtime.Jobs`` with its limits' cluster-wide share asked of a ``ClusterLimits`` port
(``pagesift.core.jobs.clusterlimits``; the node wires the etcd one,
``pagesift.coord.budgets``), at the points where a job's life changes:

- ``register``: the job's id minted first, its slot taken (and its account's daily
  pages checked) before the registration's group, given back when the group did not
  create the job (a limit inside it, an idempotent retry);
- ``start`` / ``close``: the unfinished jobs re-take their slots before they resume;
  on stepping down or stopping, the slots and unused pages go back;
- ``append`` that reopens a finished batch: a slot first, as for a start;
- ``wake`` (every record of a job, its end included): the port looks whether it ended;
- pages: each request for a page (a job's attempt, a Scrape) first spends one page of
  the pair's block (``runner.draws``, ``pagedraws``), given back when it stored nothing.

And the hosts this pair owns (``owners``, an ``OwnersSource``: the registry as this node
last read it, ``pagesift.core.cluster.ownership``): new work on a host another pair
owns is refused ``HostOwnedElsewhere`` naming the owner, before anything is written or
fetched: ``register`` (a crawl's start URL, a batch's URLs; a retried start whose key
already holds its job is not refused: that job is here), ``append`` (its URLs), Scrape
and Map (their URL). The engine's slot key is the host checked (``urls.host_of``), so
what the node refuses is exactly what its per-host slots would not cover. A crawl's
links to hosts owned elsewhere are the runner's (``runner.owners``).

And the last word before any request leaves: while this runtime runs, the engine's
per-host slots carry ``OwnedHosts`` as their gate (``politeness.HostSlots.gate``):
inside the host's slot, a request to a host another pair owns is refused
``HOST_OWNED_ELSEWHERE`` and one this pair does not hold yet (a handover, a lease not
confirmed: ``pagesift.core.cluster.tenure``) waits, at most ``ADMIT_WAIT`` seconds
(then ``TIMEOUT``, retried as any transient failure). A registry read that moves hosts
away abandons the requests in flight to them (``HostSlots.abandon``), and ``start``
tells the tenure this node has just become its pair's primary (``joined``).

Why a subclass: the local limits (``quota``) still hold inside each pair exactly as
before; this only adds the cluster's check around them, and a single pair runs
``runtime.Jobs`` unchanged.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from pagesift.core.cluster.ownership import NoOwners, Owners, OwnersSource, left_to_owner
from pagesift.core.jobs import records, urls
from pagesift.core.jobs.clusterlimits import ClusterLimits
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.jobs.specs import AppendSpec, BatchSpec, JobSpec
from pagesift.primary.jobs import oneoff
from pagesift.primary.jobs.appending import Appended, Check
from pagesift.primary.jobs.runtime import Jobs, Registered
from pagesift.v1 import jobs_pb2

__all__ = ["ADMIT_WAIT", "ClusteredJobs", "OwnedHosts"]

ADMIT_WAIT = 30.0  # the longest a request waits for this pair's hold on its host


class OwnedHosts:
    """The engine's host gate of a clustered node (module docstring)."""

    def __init__(self, owners: OwnersSource, *, limit: float = ADMIT_WAIT) -> None:
        self.owners = owners
        self.limit = limit

    async def admit(self, host: str) -> None:
        deadline = time.monotonic() + self.limit
        while True:
            owners = self.owners.current()
            owner = owners.elsewhere(host)
            if owner is not None:
                raise PageError(ErrorCode.HOST_OWNED_ELSEWHERE, left_to_owner(host, owner))
            now = time.monotonic()
            wait = self.owners.fence(host, now)
            if wait <= 0:
                return
            if now >= deadline:
                raise PageError(
                    ErrorCode.TIMEOUT,
                    f"pair {owners.here} has not held host {host} for {self.limit:g} s "
                    "(a handover, or a registry lease etcd has not confirmed)",
                )
            await asyncio.sleep(min(wait, deadline - now))


class ClusteredJobs(Jobs):
    def __init__(
        self,
        *args: Any,
        budgets: ClusterLimits,
        owners: OwnersSource | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.budgets = budgets
        self.owners: OwnersSource = owners or NoOwners()
        self.runner.draws.cluster = budgets
        self.runner.owners = self.owners

    async def start(self) -> None:
        await self.owners.start()
        self.owners.joined(time.monotonic())
        slots = self.engine.host_slots()
        slots.gate = OwnedHosts(self.owners)

        def moved(owners: Owners) -> None:
            slots.abandon(lambda host: owners.elsewhere(host) is not None)

        self.owners.moved = moved
        await self.budgets.attach(self.store)  # slots before the jobs resume (bounded)
        await super().start()

    async def close(self) -> None:
        await super().close()
        self.owners.moved = None
        self.engine.host_slots().gate = None
        await self.budgets.detach()
        await self.owners.stop()

    def _check_owned(self, targets: Iterable[str], field: str) -> None:
        """``HostOwnedElsewhere`` for the first URL whose host another pair owns."""
        self.owners.current().check(targets, field, urls.host_of)

    def _new_start(self, owner: str, idempotency_key: str) -> bool:
        """Whether a start creates a job (a retried key finds its job here)."""
        key = records.idem_key(owner, idempotency_key) if idempotency_key else ""
        return not key or self.store.get(key) is None

    def wake(self, job_id: str) -> None:
        super().wake(job_id)
        self.budgets.changed(job_id)

    async def register(
        self,
        spec: JobSpec,
        owner: str,
        *,
        check: Callable[[], None] | None = None,
        job_id: str = "",
    ) -> Registered:
        idempotency_key = spec.request.idempotency_key
        if self._new_start(owner, idempotency_key):
            if isinstance(spec, BatchSpec):
                self._check_owned(spec.kept(), "urls")
            else:
                self._check_owned([spec.request.url], "url")
        job_id = job_id or str(uuid.uuid4())
        register = super().register
        async with self.budgets.starting(owner, job_id, idempotency_key) as start:
            reg = await register(spec, owner, check=check, job_id=job_id)
            return start.keep(reg)

    async def append(self, spec: AppendSpec, check: Check) -> Appended | None:
        """AppendBatchScrape: a finished batch that the URLs reopen runs again, so it
        takes a slot first (given back when the append did not reopen it)."""
        self._check_owned(spec.urls, "urls")
        meta = records.load_meta(self.store, spec.id)
        if meta is None or not meta.terminal or meta.owner != spec.owner:
            return await super().append(spec, check)
        async with self.budgets.starting(spec.owner, spec.id, "") as start:
            got = await super().append(spec, check)
            start.created = got is not None and got.reopened
            return got

    async def scrape(
        self, url: str, options: jobs_pb2.ScrapeOptions, owner: str
    ) -> jobs_pb2.Document:
        self._check_owned([url], "url")
        async with self.runner.activity.fetching(owner):
            draws, foreign = self.runner.draws, self.runner.foreign()
            return await oneoff.scrape(self.store, self.engine, draws, owner, url, options, foreign)

    async def map(self, request: jobs_pb2.MapRequest, owner: str) -> list[str]:
        self._check_owned([request.url], "url")
        return await super().map(request, owner)
