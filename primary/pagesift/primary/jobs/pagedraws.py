"""Pages drawn before they are fetched: an account's daily pages exact in requests.

What it owns
------------
``PageDraws``, one per job runtime (the runner's ``draws``), shared by every job's page
and every Scrape of the node. Before a request for a page leaves the node (an attempt of
a job's page, a Scrape), ``draw`` takes one page of the account's ``pages_per_day``:

- on this node: the pages charged today in the store (``quota.used_today``) plus the
  pages drawn here and not settled yet (``held``) stay within the limit
  (``quota.page_limit_hit`` of ``held + 1`` pages);
- in a cluster (``cluster``, the ``ClusterLimits`` port): one page of the pair's block
  (``take_page`` outside any group; a block drawn first when it holds none).

The attempt then settles its ``Draw``: ``settle(stored=True)`` when its group stored a
document (that group charged the page in the store, ``recording.charge_page`` without
the cluster port: the cluster's page was spent at the draw), else the page goes back,
here and to the pair's block (``give_back_page``).

Guarantee
---------
At every instant, per node, pages charged + pages drawn <= ``pages_per_day``, and across
the cluster no page is fetched that was not taken from a drawn block. So no request for
a page leaves a node before the account was charged for it. What is free (drawn, then
given back, so the origin may count more requests than the account stored documents):

- an attempt that failed: at most ``1 + max_retries`` attempts per page, each its own
  draw; a page stored as a duplicate or a robots ``noindex`` skip: once per URL the
  crawl admitted (its ``limit`` bounds them);
- requests that are not a page and draw nothing: robots.txt (one per host per robots
  cache lifetime, the engine's), a crawl's sitemaps (its seeding step, bounded by
  ``crawl_seed_timeout``) and Map (no document, never charged); the redirect hops of one
  page are that page's request (``max_redirects`` bounds them).

A draw refused while this node holds unsettled draws of the account waits (bounded:
``SETTLE_WAITS`` waits of ``SETTLE_WAIT_SECONDS`` at most) for one to settle and looks
again: a page given back makes room, so a job does not stop on pages only in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

from pagesift.core.jobs import quota
from pagesift.core.jobs.accounts import Account, Accounts
from pagesift.core.jobs.clusterlimits import (
    BlockNeeded,
    ClusterLimits,
    ClusterUnavailable,
    NoClusterLimits,
)
from pagesift.core.store.db import Store

__all__ = [
    "BLOCK_TRIES",
    "JOB_BLOCK_TRIES",
    "SETTLE_WAITS",
    "SETTLE_WAIT_SECONDS",
    "Draw",
    "PageDraws",
]

#: a Scrape's draws of a cluster block (each fills the block, finds the day spent, or
#: raises ClusterUnavailable once etcd has not answered within the budgets' bound)
BLOCK_TRIES = 8
#: a job page's: each waits out the budgets' bound while etcd is away, so a running job
#: pauses through an etcd outage (hours of them) instead of failing
JOB_BLOCK_TRIES = 100_000
#: waits for an unsettled draw of the account before a refusal stands
SETTLE_WAITS = 64
SETTLE_WAIT_SECONDS = 2.0


class Draw:
    """One page drawn for ``account`` (None: the account has no daily limit, nothing
    was drawn); ``settle`` once, when its attempt stored a document or did not."""

    def __init__(self, draws: PageDraws | None, account: Account | None) -> None:
        self._draws = draws
        self.account = account

    def settle(self, *, stored: bool) -> None:
        draws, self._draws = self._draws, None
        if draws is not None and self.account is not None:
            draws.settled(self.account, stored=stored)


class PageDraws:
    """The node's pages drawn and not settled, per account (module docstring)."""

    def __init__(self, store: Store, accounts: Accounts) -> None:
        self.store = store
        self.accounts = accounts
        self.cluster: ClusterLimits = NoClusterLimits()  # ClusteredJobs sets its budgets
        self._held: Counter[str] = Counter()
        self._settled = asyncio.Event()  # set (and replaced) at every settle

    def held(self, name: str) -> int:
        return self._held[name]

    async def draw(self, owner: str, *, wait_block: bool = False) -> Draw | quota.LimitExceeded:
        """One page of ``owner``'s daily pages, or the refusal (the local limit's
        excess, or the cluster's). ``wait_block``: a block that cannot be drawn raises
        ``ClusterUnavailable`` after ``BLOCK_TRIES`` (a Scrape); without it, a job's
        page tries ``JOB_BLOCK_TRIES`` times (it waits for etcd)."""
        account = self.accounts.get(owner)
        if account is None or account.pages_per_day is None:
            return Draw(None, None)
        hit: quota.LimitExceeded | None = None
        for _ in range(SETTLE_WAITS):
            hit = await self._try(account, wait_block)
            if hit is None:
                return Draw(self, account)
            if not self._held[account.name]:
                return hit  # nothing in flight here can come back
            settled = self._settled
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), SETTLE_WAIT_SECONDS)
        assert hit is not None
        return hit

    async def _try(self, account: Account, wait_block: bool) -> quota.LimitExceeded | None:
        """One page held (None) or the refusal. The node's page is held before any
        await (a block drawn), so two draws never both pass the local check on one
        page; a refusal of the cluster lets it go again."""
        name, now = account.name, time.time()
        hit = quota.page_limit_hit(self.store, account, now, self._held[name] + 1)
        if hit is not None:
            return hit
        self._held[name] += 1
        try:
            hit = await self._take_cluster_page(account, now, wait_block)
        except BaseException:
            self._release(name)
            raise
        if hit is not None:
            self._release(name)
        return hit

    async def _take_cluster_page(
        self, account: Account, now: float, wait_block: bool
    ) -> quota.LimitExceeded | None:
        tries = BLOCK_TRIES if wait_block else JOB_BLOCK_TRIES
        for _ in range(tries):
            try:
                return self.cluster.take_page(account, now)
            except BlockNeeded as e:
                await (e.draw() if wait_block else e.retry_later())
        raise ClusterUnavailable(
            f"account {account.name!r}: no block of its daily pages could be drawn in "
            f"{tries} tries; try again"
        )

    def _release(self, name: str) -> None:
        self._held[name] -= 1
        if self._held[name] <= 0:
            del self._held[name]

    def settled(self, account: Account, *, stored: bool) -> None:
        """A draw's attempt ended: charged in the store (``stored``) or given back."""
        self._release(account.name)
        if not stored:
            self.cluster.give_back_page(account, time.time())
        settled, self._settled = self._settled, asyncio.Event()
        settled.set()
