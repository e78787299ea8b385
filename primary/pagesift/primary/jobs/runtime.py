"""The job runtime on the primary (``Jobs``): what the service and the node call.

It owns a job's life cycle; a run's loops are ``runner``'s, what a page writes is
``recording``'s, the quarantine's books are ``quarantining``'s, the expiry sweep is
``sweep``'s, Scrape and Map are ``oneoff``'s.
Every durable change is one ``Store.write`` group (layout: ``pagesift.core.jobs.records``).

- register: meta + request + ``jobs`` set + owner index + idempotency key (+ webhook),
  one group. AIP-155: the same key from the same owner returns the first job's id and
  writes nothing (another request under it: ``IdempotencyKeyReused``).
- start (the node became primary): resume every ``scraping`` job from its stored
  state (its done set), start the sweeper; ``close`` (SIGTERM, drain, stepping down)
  cancels the runs and deletes their run markers: a clean stop is no interruption.
- cancel / finish: meta rewritten with state, times and note (``recording``).
- quarantine (``pagesift.core.jobs.quarantine`` states the rule, ``quarantining`` keeps
  its books; the runtime calls it at each step): a run writes its marker
  (``job/{id}/run``) before it starts. ``start`` counts a marker it finds as one
  interruption (with the pages in flight, derived from the queue order) and deletes
  it, one group; a job interrupted ``poison_threshold`` times without progress is
  paused (``poisoned``), on whichever node starts. A lost extraction worker counts on
  the worker budget. Suspects run one at a time until they progress or
  ``poison_probation_seconds`` pass, so a crash is charged to the one that ran.
  ``resume`` unpauses a job with its budget reset.
- disk full (``StorageUnavailable``): a job whose start the store refused waits in
  memory (``_resume_later``) and starts once the store writes again.
- sync replication (``wait_replicated``): a page counts as visible once the standby
  applied it (GetJob and WatchJob cap at ``visible``); reads wait on ``readable`` until
  a standby holds what the store held at start (or sync mode degraded).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from pagesift.core.api.metrics import Metrics
from pagesift.core.api.ports import AccountActivity
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import quota, records, specs, views
from pagesift.core.jobs.accounts import Accounts
from pagesift.core.replication.identity import NotWritable
from pagesift.core.store.db import Store
from pagesift.core.store.errors import StorageUnavailable
from pagesift.core.store.groups import WriteGroup
from pagesift.core.util.tasks import cancel_and_wait_all
from pagesift.primary.engine.interface import Engine
from pagesift.primary.jobs import appending, oneoff, sweep
from pagesift.primary.jobs.quarantining import Quarantining
from pagesift.primary.jobs.runner import Runner
from pagesift.primary.models import crawlprompt
from pagesift.primary.models.endpoint import ModelEndpoint
from pagesift.primary.models.formats import ModelFormats
from pagesift.primary.models.settings import ModelSettings
from pagesift.primary.webhooks import delivery, outbox
from pagesift.v1 import jobs_pb2

__all__ = ["Jobs", "Registered", "WaitReplicated"]

logger = logging.getLogger("pagesift.jobs")

# Sync replication: wait until the standby applied the given offset (None: everything
# committed so far); True when acknowledged, False when it timed out (degraded to async).
WaitReplicated = Callable[[int | None], Awaitable[bool]]


@dataclass
class Registered:
    id: str
    created: bool  # False when an idempotency key matched an existing job


class Jobs:
    def __init__(
        self,
        store: Store,
        engine: Engine,
        config: ServerConfig,
        *,
        accounts: Accounts | None = None,
        deliverer: delivery.Deliverer | None = None,
        metrics: Metrics | None = None,
        wait_replicated: WaitReplicated | None = None,
        on_visible: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.engine = engine
        self.config = config
        self.accounts = accounts or Accounts.from_dict({})
        self.deliverer = deliverer
        self.metrics = metrics
        settings = ModelSettings.from_config(config)
        self.models = (
            None
            if settings is None
            else ModelFormats(ModelEndpoint(settings, metrics), self.accounts, store.get)
        )
        self.runner = Runner(
            store, engine, config, self.accounts, self, metrics=metrics, models=self.models
        )
        self._wait_replicated = wait_replicated
        self._on_visible = on_visible
        self._visible: dict[str, int] = {}
        self._readable = asyncio.Event()  # sync mode: the start-up state is replicated
        self._confirming: asyncio.Task[None] | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False
        self._quarantine = Quarantining(store, config, self)  # markers, budgets, suspects
        self._later: set[asyncio.Task[None]] = set()  # _resume_later's waits

    # life cycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Build the owner index of a store from before it (once), resume every job
        that was running, and start the expiry sweeper."""
        added = self.store.write(partial(records.build_owner_index, store=self.store)).result
        if added:
            logger.info("owner index built: %d jobs", added)
        with contextlib.suppress(StorageUnavailable):  # a full volume: the sweeper's next round
            self.sweep()
        if self.deliverer is not None:
            await self.deliverer.start()  # resumes every outbox from its cursor
        resumed: list[str] = []
        for job_id in records.all_job_ids(self.store):
            meta = records.load_meta(self.store, job_id)
            if meta is not None and not meta.terminal:  # counted by GetAccountUsage
                self.runner.activity.job_started(meta.owner, job_id)
            if meta is not None and meta.state == "scraping":
                if self._wait_replicated is not None:
                    self._visible[job_id] = views.progress(self.store, meta).completed
                resumed.append(job_id)
                try:
                    self._resume_one(job_id)
                except StorageUnavailable:  # counted and started once the store writes
                    self._resume_later(job_id)
        if self._wait_replicated is None:
            self._readable.set()
        else:
            self._confirming = asyncio.create_task(self._confirm_start(resumed))
        self._sweeper = asyncio.create_task(self._sweep_loop())

    async def _confirm_start(self, resumed: list[str]) -> None:
        """Sync mode: open reads once a standby holds what the store held at start."""
        assert self._wait_replicated is not None
        await self._wait_replicated(None)  # False after sync_timeout: degraded, open anyway
        self._readable.set()
        if self._on_visible is not None:
            for job_id in resumed:
                self._on_visible(job_id)

    async def readable(self) -> None:
        """Returns once reads may show what the store holds (at once in async mode)."""
        await self._readable.wait()

    async def close(self) -> None:
        self._closing = True
        running = list(self._tasks)
        tasks = list(self._tasks.values()) + list(self._later)
        tasks += [t for t in (self._sweeper, self._confirming) if t is not None]
        await cancel_and_wait_all(tasks)  # a cancel of close() itself still propagates
        for job_id in running:  # a clean stop: these runs were not interrupted
            with contextlib.suppress(Exception):  # not writable (fenced, lease lost)
                self.store.write(partial(self._quarantine.clear_marker, job_id=job_id))
        if self.deliverer is not None:
            await self.deliverer.close()
        if self.models is not None:
            await self.models.endpoint.close()

    # sync visibility ------------------------------------------------------------
    def visible(self, job_id: str) -> int | None:
        """How many of the job's pages clients may see (None: all that are stored).

        Sync mode caps every job this runtime runs (started or resumed); a finished
        job shows what is stored, once ``readable()``.
        """
        return self._visible.get(job_id)

    async def published(self, job_id: str, seq: int, offset: int) -> None:
        """``runner.Host``: page ``seq`` of the job is committed at log ``offset``; in
        sync mode it becomes visible once the standby applied it."""
        if self._wait_replicated is None:
            return
        if offset:  # the group's log offset (0: no log attached)
            await self._wait_replicated(offset)
        if job_id in self._visible:
            self._visible[job_id] = max(self._visible[job_id], seq + 1)
        if self._on_visible is not None:
            self._on_visible(job_id)

    # the one-off calls (oneoff) ---------------------------------------------------
    async def scrape(
        self, url: str, options: jobs_pb2.ScrapeOptions, owner: str
    ) -> jobs_pb2.Document:
        """The Scrape call for account ``owner`` (``oneoff.scrape``)."""
        async with self.runner.activity.fetching(owner):  # in flight, then its last page
            return await oneoff.scrape(
                self.store, self.engine, self.runner.draws, owner, url, options, models=self.models
            )

    async def crawl_options(
        self, url: str, prompt: str, owner: str
    ) -> tuple[jobs_pb2.StartCrawlRequest, jobs_pb2.ModelUsage]:
        """The crawl options ``prompt`` describes (``crawlprompt``), its tokens charged
        to ``owner``'s day in a group of their own; ``CrawlPromptFailed`` or
        ``quota.LimitExceeded`` (the day's tokens spent) when there are none."""
        if self.models is None:
            raise crawlprompt.CrawlPromptFailed(
                "model_unavailable", "this server has no model endpoint", jobs_pb2.ModelUsage()
            )
        account = self.accounts.get(owner)
        if account is not None:
            hit = quota.token_limit_hit(self.store, account, time.time())
            if hit is not None:
                raise hit
        try:
            chosen, usage = await crawlprompt.crawl_options(
                self.models.endpoint, owner, url, prompt
            )
        except crawlprompt.CrawlPromptFailed as e:
            self._charge_tokens(owner, e.usage)
            raise
        self._charge_tokens(owner, usage)
        return chosen, usage

    def _charge_tokens(self, owner: str, usage: jobs_pb2.ModelUsage) -> None:
        tokens = usage.input_tokens + usage.output_tokens
        account = self.accounts.get(owner)
        if tokens and account is not None and account.model_tokens_per_day is not None:
            now = time.time()
            self.store.write(lambda g: quota.charge_tokens(g, account, tokens, now))

    async def map(self, request: jobs_pb2.MapRequest, owner: str) -> list[str]:
        """The Map call for account ``owner`` (``oneoff.map_site``); nothing is stored."""
        return await oneoff.map_site(self.engine, self.config, self.accounts, request, owner)

    def running(self) -> list[str]:
        """The ids of the jobs this runtime runs now."""
        return list(self._tasks)

    def activity(self, owner: str) -> AccountActivity:
        """GetAccountUsage: ``owner``'s unfinished jobs and pages in flight (``activity``)."""
        return self.runner.activity.of(self.store, owner)

    # what a run asks of the runtime (runner.Host) ----------------------------------
    @property
    def closing(self) -> bool:
        return self._closing

    def wake(self, job_id: str) -> None:
        if self.deliverer is not None:
            self.deliverer.wake(job_id)

    def stop(self, job_id: str) -> None:
        """End the job's run (its meta says why: quota spent, poisoned)."""
        task = self._tasks.pop(job_id, None)
        if task is not None:
            task.cancel()

    def worker_lost(self, job_id: str, url: str) -> None:
        """A page of the job lost its extraction worker (``Quarantining.worker_lost``)."""
        self._quarantine.worker_lost(job_id, url)

    # registration ---------------------------------------------------------------
    async def register(
        self,
        spec: specs.JobSpec,
        owner: str,
        *,
        check: Callable[[], None] | None = None,
        job_id: str = "",  # minted by the caller (clustered: its slot names it), else here
    ) -> Registered:
        """Store a new job (its ``spec``, as validated) and start it: the request key
        holds ``spec.encode()``, the meta its kind, ``total`` and ``limit``, the outbox
        its webhook. ``check`` runs inside the write section, just
        before anything is written (account limits: no other registration can slip in
        between the check and the write); what it raises propagates, nothing written.

        In sync mode the call returns once the standby holds the job (or the job an
        idempotency key names), so a retry after a failover finds the same job.

        AIP-155: a key already used by ``owner`` returns its job when the request is
        the same (``records.request_hash`` of ``kind`` and ``request``, kept in the job's
        meta); with another request it raises ``records.IdempotencyKeyReused``, nothing
        written. A key whose job keeps no request hash in its meta returns its job.
        """
        request = spec.encode()
        meta = _new_meta(spec, request, owner, job_id, self.config.job_ttl_seconds)
        group = partial(
            _registration,
            meta=meta,
            request=request,
            webhook=spec.webhook,
            check=check,
            max_document_bytes=self.config.webhook_max_document_bytes,
        )
        reg = self.store.write(group).result
        if reg.created:
            self.runner.activity.job_started(owner, meta.id)
            self.wake(meta.id)
            if self._wait_replicated is not None:
                self._visible[meta.id] = 0
            logger.info(
                "job %s started (%s, account %s)",
                meta.id,
                meta.kind,
                owner,
                extra={"job": meta.id, "account": owner},
            )
            self._spawn(meta)
        if self._wait_replicated is not None:
            await self._wait_replicated(None)
        return reg

    async def append(
        self, spec: specs.AppendSpec, check: appending.Check
    ) -> appending.Appended | None:
        """AppendBatchScrape: ``appending.append``, one group; a completed job it reopens
        runs again once the run that finished it is gone. In sync mode it returns once
        the standby holds the group."""
        ttl = int(self.config.job_ttl_seconds * 1000)
        group = partial(
            appending.append, spec=spec, check=check, now_ms=records.now_ms(), ttl_ms=ttl
        )
        got = self.store.write(group).result
        if got is not None and got.reopened:
            ending = self._tasks.get(spec.id)
            if ending is None:
                self._resume_later(spec.id)
            else:
                ending.add_done_callback(lambda _: self._resume_later(spec.id))
        if self._wait_replicated is not None:
            self._visible.setdefault(spec.id, got.completed if got else 0)
            await self._wait_replicated(None)
        return got

    async def cancel(self, job_id: str) -> records.JobMeta | None:
        """CancelJob: a running, waiting or paused job ends ``cancelled``; a finished
        one is returned as it is."""
        meta = records.load_meta(self.store, job_id)
        if meta is None:
            return None
        if not meta.terminal:
            meta = self.runner.commits.finish(job_id, "cancelled", "cancelled by the caller")
            task = self._tasks.pop(job_id, None)
            if task is not None:
                task.cancel()
            else:
                self._quarantine.release(job_id)  # a suspect waiting for its turn
            if self._wait_replicated is not None:
                await self._wait_replicated(None)
        return meta

    async def resume(self, job_id: str) -> records.JobMeta | None:
        """ResumeJob: a paused job runs again, its quarantine budget deleted (one
        group); a running or finished job is returned as it is."""
        meta = self.store.write(partial(records.unpause, job_id=job_id)).result
        if meta is None:
            return None
        held = self._quarantine.holds(job_id)  # the running suspect, or waiting its turn
        if meta.state == "scraping" and job_id not in self._tasks and not held:
            logger.info(
                "job %s resumed by the caller (account %s)",
                job_id,
                meta.owner,
                extra={"job": job_id, "account": meta.owner},
            )
            try:
                self._spawn(meta)
            except StorageUnavailable:  # resumed: it runs once the store writes
                self._resume_later(job_id)
        if self._wait_replicated is not None:
            await self._wait_replicated(None)
        return meta

    def _resume_one(self, job_id: str) -> None:
        """Start-up (or later, see ``_resume_later``): a ``scraping`` job not running
        here is counted (an interruption when its marker is there: maybe paused
        now), then run, or queued behind the running suspect."""
        meta = records.load_meta(self.store, job_id)
        if meta is None or meta.state != "scraping" or job_id in self._tasks:
            return
        spec = specs.stored(self.store, meta)  # this run's, parsed once
        meta = self._quarantine.count_interruption(meta, spec.request)
        if meta is None or meta.state != "scraping":
            return
        logger.info(
            "job %s resumed (%s, account %s)",
            job_id,
            meta.kind,
            meta.owner,
            extra={"job": job_id, "account": meta.owner},
        )
        if self._quarantine.waits(job_id):
            logger.info("job %s waits: another interrupted job runs first", job_id)
            return
        self._spawn(meta, spec)

    def _resume_later(self, job_id: str) -> None:
        """``_resume_one`` once the store takes writes again (it refused one)."""

        async def later() -> None:
            for _ in range(1_000_000):  # each round waits for the store: bounded
                await self.runner.commits.storage_back()
                if self._closing:
                    return
                try:
                    self._resume_one(job_id)
                    return
                except StorageUnavailable:
                    continue

        task = asyncio.create_task(later())
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    # expiry (sweep) -------------------------------------------------------------------
    def sweep(self) -> int:
        """One expiry sweep (``sweep.sweep``); returns how many jobs it deleted."""
        removed = sweep.sweep(self.store, self.config, time.time())
        for job_id in removed:
            self._visible.pop(job_id, None)
        return len(removed)

    async def _sweep_loop(self) -> None:
        interval = sweep.interval(self.config)
        while not self._closing:
            await asyncio.sleep(interval)
            with contextlib.suppress(StorageUnavailable):  # the next round, when it writes
                self.sweep()

    # running ------------------------------------------------------------------------
    def _spawn(self, meta: records.JobMeta, spec: specs.JobSpec | None = None) -> None:
        """Run the job (``spec``: as stored, ``specs.stored`` when not given): its run
        marker first (one group: ``Quarantining.mark``), then its task."""
        if spec is None:
            spec = specs.stored(self.store, meta)
        try:
            started_at = self._quarantine.mark(meta, spec.request)
        except NotWritable as e:  # fenced, or a lapsed lease: the job resumes elsewhere
            logger.info("job %s not started here: %s", meta.id, e)
            self._quarantine.release(meta.id)
            return
        coro = self.runner.run(meta, spec)
        suspect = self._quarantine.on_probation(meta.id)
        task = asyncio.create_task(self._guard(meta.id, coro, started_at if suspect else None))
        self._tasks[meta.id] = task

    async def _guard(
        self, job_id: str, coro: Awaitable[None], probation_from: int | None = None
    ) -> None:
        rerun = False
        probation = (
            asyncio.create_task(self._quarantine.probation(job_id, probation_from))
            if probation_from is not None
            else None
        )
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except NotWritable as e:  # fenced, or a lapsed lease: the job resumes elsewhere
            logger.info("job %s paused: %s", job_id, e)
        except StorageUnavailable:  # the volume is full: wait, then run on from the store
            logger.info("job %s waits for the store to take writes", job_id)
            await self.runner.commits.storage_back()
            rerun = not self._closing
        except Exception as e:  # a bug must not leave a job "scraping" forever
            logger.exception("job %s failed", job_id)
            self.runner.commits.finish(job_id, "failed", f"internal error: {e}")
        finally:
            if probation is not None:
                probation.cancel()
            if self._tasks.get(job_id) is asyncio.current_task():
                self._tasks.pop(job_id, None)
            self._quarantine.ended(job_id)
        while rerun and job_id not in self._tasks and not self._closing:
            meta = records.load_meta(self.store, job_id)
            if meta is None or meta.state != "scraping":
                break
            try:
                self._spawn(meta)  # its run marker is a write: the store may refuse again
                break
            except StorageUnavailable:
                await self.runner.commits.storage_back()


def _new_meta(
    spec: specs.JobSpec, request: bytes, owner: str, job_id: str, ttl_seconds: float
) -> records.JobMeta:
    """A new job's meta: its kind, ``total`` and ``limit`` from the spec, the request's
    hash beside its idempotency key (AIP-155: a retry is told apart from a reuse)."""
    key = spec.request.idempotency_key
    digest = records.request_hash(spec.kind, request) if key else ""
    now = records.now_ms()
    return records.JobMeta(
        id=job_id or str(uuid.uuid4()),
        kind=spec.kind,
        state="scraping",
        owner=owner,
        created_ms=now,
        expires_ms=now + int(ttl_seconds * 1000),
        total=spec.total,
        limit=spec.limit,
        idempotency_key=key,
        extra={records.REQUEST_HASH: digest} if digest else {},
    )


def _registration(
    g: WriteGroup,
    *,
    meta: records.JobMeta,
    request: bytes,
    webhook: jobs_pb2.Webhook | None,
    check: Callable[[], None] | None,
    max_document_bytes: int,
) -> Registered:
    """A new job's ONE group (pure over ``g``): the idempotency record, ``check`` (the
    account limits, inside the write section), the meta, the request, the owner index,
    the jobs set, and the webhook's configuration with its ``started`` event. A key the
    owner used already returns its job (the same request) or raises
    ``records.IdempotencyKeyReused`` (another), nothing written."""
    owner, key = meta.owner, meta.idempotency_key
    if key:
        existing = g.get(records.idem_key(owner, key))
        if existing is not None:
            job_id = existing.decode()
            raw = g.get(records.JobKeys(job_id).meta)
            first = records.JobMeta.decode(raw).extra.get(records.REQUEST_HASH) if raw else None
            if first and first != meta.extra.get(records.REQUEST_HASH, ""):
                raise records.IdempotencyKeyReused(job_id)
            return Registered(job_id, created=False)
        g.put(records.idem_key(owner, key), meta.id.encode())
    if check is not None:
        check()
    keys = records.JobKeys(meta.id)
    g.put(keys.meta, meta.encode())
    g.put(keys.request, request)
    records.index_owner(g, meta)  # before the jobs set: it checks the store was empty
    g.insert(records.JOBS_SET, meta.id.encode())
    if webhook is not None and webhook.url:
        outbox.configure(
            g, meta.id, webhook.url, list(webhook.events), owner,
            headers=dict(webhook.headers), metadata=dict(webhook.metadata),
            include_document=webhook.include_document,
            max_document_bytes=max_document_bytes,
            format=outbox.FIRECRAWL
            if webhook.format == jobs_pb2.WEBHOOK_FORMAT_FIRECRAWL
            else outbox.PAGESIFT,
            kind=meta.kind,
        )  # fmt: skip
        started = {"kind": meta.kind, "total": meta.total, "limit": meta.limit}
        outbox.enqueue(g, meta.id, "started", started)
    return Registered(meta.id, created=True)
