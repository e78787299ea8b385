"""Account limits across pairs: the etcd shell of ``pagesift.core.cluster.budgetplans``.

What it owns
------------
``EtcdBudgets`` (the etcd calls: slot keys, the daily pages counter by compare-and-swap)
and ``ClusterBudgets``, the ``ClusterLimits`` port (``pagesift.core.jobs.clusterlimits``)
a node hands its job runtime when it runs in a cluster (wired by
``pagesift.node.clustering.jobs_factory``). The keys are ``coord.keys``'; the plans are
the pure module's (``free_slot``, ``plan_draw``, ``plan_return``, ``BlockLedger``); this
module only does their I/O and keeps the node's holdings.

- Concurrency: a job start takes ``slot_key(cluster, account, i)`` by a create-if-absent
  transaction whose value is the job id, under this node's own budgets lease (kept
  alive every ``ttl / 3``; a dead node's slots lapse with it). A job that ends
  (``changed`` sees its meta terminal, or the loop's round does) deletes its key, only
  if it still holds its id. ``attach`` (the node became primary) re-takes a slot for
  every unfinished job, moving a key that names the job onto this lease (a failover),
  bounded by ``wait``; a job that finds none runs on and retries every round.
- Daily pages: per account one block at a time (``BlockLedger``), drawn by CAS on
  ``pages_key(cluster, account, day)`` (day = the UTC date), spent in memory before each
  page's request (``take_page``; ``give_back_page`` when it stored nothing,
  ``pagesift.primary.jobs.pagedraws``); the unused rest goes back (``plan_return``)
  once the account has no unfinished job here and spent nothing for ``linger``
  seconds, and at ``detach`` (where the slots are left to lapse with the lease, for the
  node taking over).
  etcd sees one write per block and one per return, never one per page (``writes``).

Failure model
-------------
Every etcd call is bounded (``EtcdRegistry``'s timeout). While etcd is down, running jobs
spend the block they hold and keep the slots they hold; a page that needs a new block
waits (the runner retries) and a start that needs a slot or block waits up to ``wait``
seconds, then is refused ``ClusterUnavailable`` naming etcd. When etcd answers again the
next round refreshes the lease (or re-takes every slot under a new one if it lapsed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import aetcd
import aetcd.transactions as txn

from pagesift.coord.etcd import EtcdUnavailable, describe
from pagesift.coord.keys import pages_key, slot_key, slots_prefix
from pagesift.coord.registry import EtcdRegistry
from pagesift.core.cluster.budgetplans import (
    BlockLedger,
    Draw,
    block_size,
    free_slot,
    plan_draw,
    plan_return,
)
from pagesift.core.jobs import records
from pagesift.core.jobs.accounts import Account, Accounts
from pagesift.core.jobs.clusterlimits import BlockNeeded, ClusterUnavailable, Start
from pagesift.core.jobs.quota import LimitExceeded, rfc3339
from pagesift.core.store.db import Store

__all__ = ["ClusterBudgets", "EtcdBudgets", "day_of"]

log = logging.getLogger(__name__)

PAIRS_REFRESH_SECONDS = 30.0  # how often the pair count (block size) is read again


def day_of(now: float) -> str:
    """The UTC date of ``now``: the daily pages counter's day."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")


def _midnight_after(now: float) -> float:
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (day + timedelta(days=1)).timestamp()


class EtcdBudgets(EtcdRegistry):
    """The slot keys and pages counters of cluster ``etcd://…/NAME`` (``writes`` counts
    the successful writes by kind: ``slot``, ``pages``, ``lease``)."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.writes: Counter[str] = Counter()

    async def slots(self, account: str) -> dict[int, tuple[str, int]]:
        """The account's taken slots: index -> (job id, lease)."""
        prefix = slots_prefix(self.cluster, account).encode()

        async def scan(c: aetcd.Client) -> list[tuple[bytes, bytes, int]]:
            return [(bytes(kv.key), bytes(kv.value), int(kv.lease)) for kv in
                    (await c.get_prefix(prefix)).kvs]  # fmt: skip

        out: dict[int, tuple[str, int]] = {}
        for key, value, lease in await self.etcd.call(scan):
            index = key[len(prefix) :]
            if index.isdigit():
                out[int(index)] = (value.decode(), lease)
        return out

    async def _txn(self, compare: list[Any], success: list[Any], kind: str) -> bool:
        async def run(c: aetcd.Client) -> bool:
            done, _ = await c.transaction(compare=compare, success=success, failure=[])
            return bool(done)

        done: bool = await self.etcd.call(run)
        if done:
            self.writes[kind] += 1
        return done

    async def create_slot(self, account: str, index: int, job_id: str, lease: int) -> bool:
        key = slot_key(self.cluster, account, index).encode()
        put = txn.Put(key, job_id.encode(), lease=lease)
        return await self._txn([txn.Create(key) == 0], [put], "slot")

    async def move_slot(self, account: str, index: int, job_id: str, lease: int) -> bool:
        """The key that names ``job_id`` put under ``lease`` (a job adopted after a failover)."""
        key = slot_key(self.cluster, account, index).encode()
        put = txn.Put(key, job_id.encode(), lease=lease)
        return await self._txn([txn.Value(key) == job_id.encode()], [put], "slot")

    async def delete_slot(self, key: str, job_id: str) -> bool:
        raw = key.encode()
        return await self._txn([txn.Value(raw) == job_id.encode()], [txn.Delete(raw)], "slot")

    async def counter(self, account: str, day: str) -> tuple[int, int]:
        """Pages of ``day`` drawn so far and the key's mod revision (0, 0: none yet)."""
        key = pages_key(self.cluster, account, day).encode()
        got = await self.etcd.call(lambda c: c.get(key))
        if got is None:
            return 0, 0
        value = bytes(got.value)
        return (int(value) if value.isdigit() else 0), int(got.mod_revision)

    async def swap(self, account: str, day: str, plan: Draw) -> bool:
        """Apply a draw or return plan if nobody changed the counter since it was read."""
        key = pages_key(self.cluster, account, day).encode()
        put = txn.Put(key, str(plan.value).encode())
        return await self._txn([txn.Mod(key) == plan.revision], [put], "pages")

    async def grant(self, ttl: int) -> int:
        lease = await super().grant(ttl)
        self.writes["lease"] += 1
        return lease

    async def refresh(self, lease: int) -> bool:
        alive = await super().refresh(lease)
        self.writes["lease"] += 1
        return alive


class ClusterBudgets:
    """``ClusterLimits`` over etcd for one node (see the module docstring)."""

    def __init__(
        self,
        etcd: EtcdBudgets,
        accounts: Accounts,
        *,
        ttl: int = 5,
        wait: float = 5.0,
        interval: float = 1.0,
        linger: float = 1.0,
    ) -> None:
        self.etcd = etcd
        self.accounts = accounts
        self.ttl = max(2, ttl)
        self.wait = wait
        self.interval = min(interval, self.ttl / 3)
        self.linger = linger
        self.ledger = BlockLedger()
        self.pages_spent = 0  # pages taken from blocks (the etcd write figure's base)
        self._lease: int | None = None
        self._refreshed = 0.0
        self._store: Store | None = None
        self._jobs: dict[str, str] = {}  # unfinished job here -> its account
        self._slots: dict[str, str] = {}  # job -> the slot key it holds
        self._unslotted: set[str] = set()  # jobs that need a slot and hold none
        self._ended: set[str] = set()
        self._orphans: dict[str, str] = {}  # slot key -> job: to delete (a start undone)
        self._last_spend: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._pairs = (1, -PAIRS_REFRESH_SECONDS)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # the port (ClusterLimits) ---------------------------------------------------------
    async def attach(self, store: Store) -> None:
        self._store = store
        for job_id in records.all_job_ids(store):
            meta = records.load_meta(store, job_id)
            account = None if meta is None else self.accounts.get(meta.owner)
            if meta is None or meta.terminal or account is None:
                continue
            if account.max_concurrent_jobs is not None or account.pages_per_day is not None:
                self._jobs[job_id] = meta.owner
            if account.max_concurrent_jobs is not None:
                self._unslotted.add(job_id)
        with contextlib.suppress(TimeoutError, EtcdUnavailable):
            await asyncio.wait_for(self._retake(), self.wait)
        self._task = asyncio.create_task(self._run())

    async def detach(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(TimeoutError, EtcdUnavailable):
            await asyncio.wait_for(self._give_back(), max(1.0, self.wait))
        self._jobs.clear()
        self._slots.clear()
        self._unslotted.clear()
        self._store = None
        await self.etcd.close()  # connected again by the next attach's first call

    @contextlib.asynccontextmanager
    async def starting(self, owner: str, job_id: str, idempotency_key: str) -> AsyncIterator[Start]:
        start = Start()
        account = self.accounts.get(owner)
        store = self._store
        known = bool(idempotency_key) and store is not None and (
            store.get(records.idem_key(owner, idempotency_key)) is not None
        )  # fmt: skip
        if account is None or known:
            yield start  # a retried start finds its job: it holds its slot already
            return
        if account.pages_per_day is not None:
            await self._start_pages(account)
        key = None
        if account.max_concurrent_jobs is not None:
            key = await self._bounded(partial(self._claim, account, job_id), "slot", owner)
        try:
            yield start
        finally:
            if start.created:
                if account.max_concurrent_jobs is not None or account.pages_per_day is not None:
                    self._jobs[job_id] = owner
                if key is not None:
                    self._slots[job_id] = key
            elif key is not None:
                self._orphans[key] = job_id
                self._wake.set()

    def changed(self, job_id: str) -> None:
        if job_id not in self._jobs or self._store is None:
            return
        meta = records.load_meta(self._store, job_id)
        if meta is None or meta.terminal:
            self._ended.add(job_id)
            self._wake.set()

    def take_page(self, account: Account, now: float) -> LimitExceeded | None:
        if account.pages_per_day is None:
            return None
        name, day = account.name, day_of(now)
        self._last_spend[name] = time.monotonic()
        grant = self.ledger.take(name, day)
        if grant.ok:
            self.pages_spent += 1
            return None
        if grant.draw:
            raise BlockNeeded(name, partial(self._draw, name))
        when = _midnight_after(now)
        return LimitExceeded(
            "pages_per_day",
            f"account {name!r} reached its pages_per_day limit of {account.pages_per_day} "
            "across the cluster today (UTC): no page more is fetched for it (a job stops, "
            f"keeping its pages so far); it resets at {rfc3339(when)}",
            when,
        )

    def give_back_page(self, account: Account, now: float) -> None:
        if account.pages_per_day is None:
            return
        self.ledger.give_back(account.name, day_of(now))
        self.pages_spent -= 1

    # slots ----------------------------------------------------------------------------
    async def _lease_id(self) -> int:
        if self._lease is None:
            self._lease = await self.etcd.grant(self.ttl)
            self._refreshed = time.monotonic()
        return self._lease

    async def _claim(self, account: Account, job_id: str) -> str:
        """The slot of ``job_id`` (taken now, or moved onto this lease); LimitExceeded
        when every slot is another job's."""
        limit = account.max_concurrent_jobs or 0
        lease = await self._lease_id()
        for _ in range(limit + 4):  # a lost race re-reads: bounded
            held = await self.etcd.slots(account.name)
            mine = [i for i, (job, _) in held.items() if job == job_id]
            if mine:
                if held[mine[0]][1] == lease or await self.etcd.move_slot(
                    account.name, mine[0], job_id, lease
                ):
                    return slot_key(self.etcd.cluster, account.name, mine[0])
                continue
            index = free_slot(held, limit)
            if index is None:
                running = sum(1 for i in held if i < limit)
                raise LimitExceeded(
                    "max_concurrent_jobs",
                    f"account {account.name!r} already runs {running} job(s) across the "
                    f"cluster, its max_concurrent_jobs limit is {limit}; it frees when one "
                    "of them finishes or is cancelled",
                )
            if await self.etcd.create_slot(account.name, index, job_id, lease):
                return slot_key(self.etcd.cluster, account.name, index)
        raise EtcdUnavailable("registry: the slots kept changing under this start")

    async def _retake(self) -> None:
        """Every unfinished job here without a slot tries to take one."""
        for job_id in sorted(self._unslotted):
            owner = self._jobs.get(job_id)
            account = None if owner is None else self.accounts.get(owner)
            if account is None or account.max_concurrent_jobs is None:
                self._unslotted.discard(job_id)
                continue
            try:
                self._slots[job_id] = await self._claim(account, job_id)
                self._unslotted.discard(job_id)
            except LimitExceeded as e:
                log.warning("job %s runs without a cluster slot for now: %s", job_id, e)

    async def _free(self, key: str, job_id: str) -> None:
        await self.etcd.delete_slot(key, job_id)

    # pages ----------------------------------------------------------------------------
    def _holds(self, name: str, day: str) -> bool:
        if self.ledger.take(name, day).ok:
            self.ledger.drawn(name, day, 1)  # only looked: the page goes back
            return True
        return False

    async def _start_pages(self, account: Account) -> None:
        """A start of ``account``: its block, drawn now if it holds none; refused when
        the day's allowance is drawn cluster-wide."""
        now = time.time()
        day = day_of(now)
        if self._holds(account.name, day):
            return
        await self._draw(account.name)
        if not self._holds(account.name, day):
            when = _midnight_after(now)
            raise LimitExceeded(
                "pages_per_day",
                f"account {account.name!r} used its pages_per_day limit of "
                f"{account.pages_per_day} across the cluster today (UTC); it resets at "
                f"{rfc3339(when)}",
                when,
            )

    async def _draw(self, name: str) -> None:
        """A block for ``name`` (one draw at a time per account; ClusterUnavailable when
        etcd does not answer within ``wait``)."""
        async with self._locks.setdefault(name, asyncio.Lock()):
            account = self.accounts.get(name)
            day = day_of(time.time())
            if account is None or account.pages_per_day is None or self._holds(name, day):
                return  # another worker drew meanwhile
            await self._bounded(partial(self._draw_once, account, day), "block of pages", name)

    async def _draw_once(self, account: Account, day: str) -> None:
        allowance = account.pages_per_day or 0
        block = block_size(allowance, await self._pair_count())
        for _ in range(16):  # a lost race re-reads: bounded
            drawn, revision = await self.etcd.counter(account.name, day)
            plan = plan_draw(drawn, revision, allowance, block)
            if plan is None:
                self.ledger.drawn(account.name, day, 0)
                return
            if await self.etcd.swap(account.name, day, plan):
                self.ledger.drawn(account.name, day, plan.granted)
                self._last_spend[account.name] = time.monotonic()  # returned when idle
                return
        raise EtcdUnavailable("registry: the pages counter kept changing under a draw")

    async def _return(self, name: str) -> None:
        day = day_of(time.time())
        unused = self.ledger.release(name, day)
        try:
            for _ in range(16):  # a lost race re-reads: bounded
                drawn, revision = await self.etcd.counter(name, day)
                plan = plan_return(drawn, revision, unused)
                if plan is None or await self.etcd.swap(name, day, plan):
                    return
        except EtcdUnavailable:
            self.ledger.drawn(name, day, unused)  # kept: returned on a later round
            raise

    async def _pair_count(self) -> int:
        count, read_at = self._pairs
        if time.monotonic() - read_at >= PAIRS_REFRESH_SECONDS:
            with contextlib.suppress(EtcdUnavailable):
                count = max(1, len({r.pair for r in await self.etcd.nodes()}))
            self._pairs = (count, time.monotonic())
        return count

    # the loop -------------------------------------------------------------------------
    async def _bounded(self, call: Any, what: str, account: str) -> Any:
        """``call()`` retried while etcd does not answer, for ``wait`` seconds at most."""
        deadline = time.monotonic() + self.wait
        while True:
            try:
                return await call()
            except EtcdUnavailable as e:
                if time.monotonic() >= deadline:
                    endpoints = describe(self.etcd.endpoints)
                    raise ClusterUnavailable(
                        f"etcd (cluster {self.etcd.cluster!r} at {endpoints}) did not answer "
                        f"within {self.wait:g} s: a start of account {account!r} needs its "
                        f"cluster-wide {what}; nothing was started, running jobs go on "
                        f"({e})"
                    ) from e
                await asyncio.sleep(min(0.25, self.wait / 4))

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            try:
                await self.step()
            except EtcdUnavailable as e:
                log.info("cluster %s budgets: %s (retrying)", self.etcd.cluster, e)

    async def step(self) -> None:
        """One round: the lease kept alive, ended jobs' slots freed, slots re-taken,
        idle accounts' blocks returned."""
        if self._lease is not None and time.monotonic() - self._refreshed >= self.ttl / 3:
            if await self.etcd.refresh(self._lease):
                self._refreshed = time.monotonic()
            else:  # lapsed (etcd was away longer than the ttl): every slot again
                log.warning("cluster %s: the budgets lease lapsed", self.etcd.cluster)
                self._lease = None
                self._unslotted.update(self._slots)
                self._slots.clear()
        store = self._store
        for job_id in list(self._jobs):
            meta = None if store is None else records.load_meta(store, job_id)
            if job_id in self._ended or meta is None or meta.terminal:
                self._ended.discard(job_id)
                self._jobs.pop(job_id, None)
                self._unslotted.discard(job_id)
                key = self._slots.pop(job_id, None)
                if key is not None:
                    self._orphans[key] = job_id
        for key, job_id in list(self._orphans.items()):
            await self._free(key, job_id)
            del self._orphans[key]
        if self._unslotted:
            await self._retake()
        busy = set(self._jobs.values())
        idle_since = time.monotonic() - self.linger
        for name, spent in list(self._last_spend.items()):
            if name not in busy and spent <= idle_since:
                await self._return(name)
                del self._last_spend[name]

    async def _give_back(self) -> None:
        """The unused pages go back. The slots stay until the lease lapses (nothing
        refreshes it now): the unfinished jobs resume on the node taking over, which
        moves their slots onto its own lease first, so no start elsewhere slips in."""
        self._lease = None
        for name in list(self._last_spend):
            await self._return(name)
            del self._last_spend[name]
