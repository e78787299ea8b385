"""Account limits that hold across pairs, as the primary's job runtime sees them (a port).

What it owns
------------
``ClusterLimits``, what the runtime (``pagesift.primary.jobs.runtime.Jobs``) and a page's
draw (``pagesift.primary.jobs.pagedraws``) ask of the cluster's share of an account's
limits, and
``NoClusterLimits``, the single-pair case (nothing is asked). The node wires the etcd
implementation (``pagesift.coord.budgets.ClusterBudgets``) when it runs with a cluster;
the primary never imports ``pagesift.node`` (tests/test_layers.py), so this port is how.

- ``starting``: around a job's registration: a concurrency slot taken first (and the
  account's daily pages checked), given back when the group did not create the job.
- ``changed``: a job's records changed (it may have ended: its slot is freed).
- ``take_page``: before a page's request leaves the node, one page spent from the
  pair's block; raises ``BlockNeeded`` when a block must be drawn first: the caller
  awaits ``draw`` / ``retry_later`` and takes again. ``give_back_page``: that request
  stored no document, its page goes back into the block.
- ``attach`` / ``detach``: the runtime starts (its running jobs re-take their slots,
  bounded) and stops (its slots and blocks are given back).

Refusals are ``quota.LimitExceeded`` of the same limit names as the local checks (so the
status, reason and metadata are the same); etcd not answering within the bound is
``ClusterUnavailable`` (UNAVAILABLE, reason ``CLUSTER_UNAVAILABLE``, naming etcd).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.quota import LimitExceeded
from pagesift.core.store.db import Store

__all__ = ["BlockNeeded", "ClusterLimits", "ClusterUnavailable", "NoClusterLimits", "Start"]

R = TypeVar("R")


class ClusterUnavailable(Exception):
    """The cluster's etcd did not answer within the bound: nothing was started."""


class BlockNeeded(Exception):
    """A page of ``account`` needs a block drawn first (nothing was spent). ``draw``
    raises ``ClusterUnavailable`` past the bound; ``retry_later`` returns either way
    (a running job's page then tries again)."""

    def __init__(self, account: str, draw: Callable[[], Awaitable[None]]) -> None:
        super().__init__(f"account {account!r}: a block of its daily pages must be drawn")
        self.account = account
        self._draw = draw

    async def draw(self) -> None:
        await self._draw()

    async def retry_later(self) -> None:
        with contextlib.suppress(ClusterUnavailable):
            await self._draw()


class Start:
    """A registration under way: ``keep`` hands its result through, noting whether it
    created the job (a job not created gives its slot back)."""

    def __init__(self) -> None:
        self.created = False

    def keep(self, registered: R) -> R:
        self.created = bool(getattr(registered, "created", False))
        return registered


class ClusterLimits(Protocol):
    async def attach(self, store: Store) -> None:
        """The runtime started over ``store``: its unfinished jobs re-take their slots."""

    async def detach(self) -> None:
        """The runtime stops: its slots and unused pages are given back (bounded)."""

    def starting(
        self, owner: str, job_id: str, idempotency_key: str
    ) -> contextlib.AbstractAsyncContextManager[Start]:
        """Around the registration of ``job_id`` (LimitExceeded, ClusterUnavailable)."""

    def changed(self, job_id: str) -> None:
        """The job's records changed: it may have ended."""

    def take_page(self, account: Account, now: float) -> LimitExceeded | None:
        """Before a page's request: one page spent (None), the allowance used up
        cluster-wide (the excess), or ``BlockNeeded``."""

    def give_back_page(self, account: Account, now: float) -> None:
        """A page ``take_page`` spent whose request stored nothing: back to the block."""


class NoClusterLimits:
    """A single pair: every limit is the node's own (``quota``)."""

    async def attach(self, store: Store) -> None:
        return None

    async def detach(self) -> None:
        return None

    @contextlib.asynccontextmanager
    async def starting(self, owner: str, job_id: str, idempotency_key: str) -> AsyncIterator[Start]:
        yield Start()

    def changed(self, job_id: str) -> None:
        return None

    def take_page(self, account: Account, now: float) -> LimitExceeded | None:
        return None

    def give_back_page(self, account: Account, now: float) -> None:
        return None
