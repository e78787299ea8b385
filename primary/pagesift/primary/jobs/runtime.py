"""The job runtime on the primary: register, run, cancel, finish, expire, resume.

Every durable change is one ``Store.write`` group (see ``pagesift.shared.store.db``)
over the layout of ``pagesift.shared.jobs.records``:

- register: meta + request + ``jobs`` set + idempotency key, one group. The same
  key from the same owner returns the first job's id and writes nothing.
- a page: document pushed to ``pages`` + done mark + (crawl) every newly admitted
  link pushed to ``frontier`` with its ``seen`` mark, ONE group. A crash before
  the commit loses only the fetch in flight (it is redone on resume); a crash after
  it loses nothing. No page can be recorded twice: the group re-checks ``done``.
- URL identity (crawl): the same group marks the page's aliases (its final URL after
  redirects and meta refreshes, its in-scope rel=canonical with ``follow_canonical``:
  ``Scope.aliases``) seen and done (``frontier.claim_aliases``). When one of them is
  done already, the page is recorded instead as a ``duplicate`` page error naming
  that key (no document, no link admitted); an alias still waiting in the frontier
  is recorded as a ``duplicate`` of this page, so it is never fetched and every
  frontier entry ends as one document or one error. A page meta robots or
  X-Robots-Tag marks ``noindex`` is a ``robots_noindex`` error (its links still
  admitted), and a ``nofollow`` page admits no links, unless the crawl has
  ``ignore_robots_meta``. All of it commits or is lost with the page, so a resumed
  crawl stores every page exactly once whatever URLs lead to it.
- freshness (``pagecache``): a page answered from the account's page cache costs no
  fetch; a fetched or revalidated page of a request with ``max_age`` is cached, and a
  change-tracked page compared and recorded, in the page's own group. A finished
  change-tracked crawl writes its ``removed`` URLs in one group before it finishes.
- a page error: error pushed to ``errors`` + done mark, one group.
- the job's cookie jar (``reqprofile.JobCookies``): the next page or page error group
  after a response's Set-Cookie changed it also writes the changes, one record per
  cookie whose value, attributes or expiry changed (``cookie/{slot}``, the cookie's
  own key: a change overwrites it, a deletion or expiry deletes it), never the whole
  jar, within RFC 6265's caps (4096 bytes a cookie, 50 a domain, 3000 and 1 MiB a
  job); a resumed job (restart or failover) rebuilds its request profile from the
  stored request and loads those records (or, for a job stored before them, replays
  its old ``cookies`` snapshot once), so it sends what it sent before (a login
  session included) plus at most what the lost fetch learnt.
- bounded groups: a page's group is written with ``max_bytes`` =
  ``jr.page_group_bytes(max_body_bytes)``; a bigger one (a hostile page whose links
  expand to many megabytes) is refused whole by ``Store.write`` (``GroupTooLarge``)
  and the page gets a ``too_large`` page error naming the bound instead.
- a retry (a transient failure, ``retrypolicy.is_transient``, with retries left):
  ``attempts`` gets "retry n of this page" in one group BEFORE the retry sleeps, so
  a crash never hands a page its spent retries back; the retry sleeps (full jitter,
  at least the Retry-After) in a task of its own that holds none of the job's
  ``max_concurrency`` permits, then takes one for its attempt. After a restart the
  page is simply not done: it is fetched again in frontier/batch order and its
  count read back (``jr.retries_used``), so a page makes at most ``1 + max_retries``
  attempts plus one per crash that cut an attempt short. The page error of the
  last attempt says how many attempts were made.
- finish / cancel: meta rewritten with state, times and note.
- expiry: every key of the job deleted in one group (lists dropped, sets cleared).

Quarantine (``pagesift.shared.jobs.quarantine`` states the rule): every run of a job
writes its run marker (``job/{id}/run``, one group) before it starts; finishing,
cancelling, pausing and a clean stop (``close``: SIGTERM, drain, stepping down) delete
it. ``start`` counts a marker it finds as one interruption of that job (with the
pages that were in flight, derived from the frontier or batch order) and deletes
it, in one group; a job interrupted ``poison_threshold`` times without progress is
paused (``poisoned``) instead of resumed, on whichever node starts. A page whose
extraction worker died (``PageError.worker_lost``) counts on the worker budget.
Jobs with an interruption counted (suspects) run one at a time until they make
progress or ``poison_probation_seconds`` pass, so a crash is charged to the one
suspect that was running. ``resume`` (ResumeJob) unpauses a job with its budget
reset; ``cancel`` ends a paused job like a running one.

Disk full (``pagesift.shared.store.db.StorageUnavailable``: the store refuses writes
while its volume is full or failed): a job's page, page error, retry mark and finish
wait in memory, their group not committed, until the node's storage watcher
(``pagesift.node.storage``) lets the store take writes again, then commit it afresh
(the group re-reads what it checks, so a page is recorded once, never lost). Nothing
durable records the pause and no job ends: a run cut short elsewhere by the refusal
(seeding, say) waits too and then runs again from its stored state.

Resume after a restart: jobs still ``scraping`` restart from their done set
(batch: indices not done; crawl: frontier entries not done, in enqueue order). The
frontier is read from the store in chunks, so memory stays flat however large
the crawl grows (seeding, admission and reading the frontier live in ``frontier``).

Sync replication (``wait_replicated`` given): a page is written, then the worker
waits for the standby to apply it before the page counts as visible (GetJob and
WatchJob cap what they return at ``visible(job_id)``). What the store held when the
runtime started (pages committed before a restart, or before a promotion) may never
have reached a standby: reads wait on ``readable()`` until a standby acknowledged
the offset the runtime started at (or sync mode degraded after its timeout), and a
resumed job is capped from its stored page count on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

from pagesift.primary.engine import retrypolicy
from pagesift.primary.engine.protocol import Engine, FetchPolicy, Page
from pagesift.primary.engine.reqprofile import JarChanges, RequestProfile
from pagesift.primary.jobs import frontier, mapper, pagecache
from pagesift.primary.webhooks import outbox as webhooks
from pagesift.shared.api.metrics import Metrics
from pagesift.shared.config.schema import ServerConfig
from pagesift.shared.jobs import patterns, quota, validate
from pagesift.shared.jobs import quarantine as q
from pagesift.shared.jobs import records as jr
from pagesift.shared.jobs.accounts import Accounts
from pagesift.shared.jobs.pageerrors import ErrorCode, PageError
from pagesift.shared.jobs.scope import Entry, Scope
from pagesift.shared.replication.identity import Identity, NotWritable
from pagesift.shared.store.db import Commit, GroupTooLarge, StorageUnavailable, Store, WriteGroup
from pagesift.v1 import jobs_pb2

logger = logging.getLogger("pagesift.jobs")
T = TypeVar("T")
#: how often a job paused by a refusing store looks whether it takes writes again
STORAGE_POLL_SECONDS = 0.1

# Sync replication: wait until the standby applied the given offset (None: everything
# committed so far); True when acknowledged, False when it timed out (degraded to async).
WaitReplicated = Callable[[int | None], Awaitable[bool]]


class _Run:
    """One job's run: its concurrency permits and its sleeping retries.

    ``on_change(delta)`` tells the caller a retry was scheduled (+1) or finished (-1)
    (the crawl counts them as in flight so its workers wait for what they admit).
    """

    def __init__(
        self, concurrency: int, max_retries: int, on_change: Callable[[int], None]
    ) -> None:
        self.permits = asyncio.Semaphore(concurrency)
        self.max_retries = max_retries
        self.on_change = on_change
        self.tasks: set[asyncio.Task[None]] = set()
        self.error: BaseException | None = None

    async def drain(self) -> None:
        """Wait for every retry (new ones included); re-raise the first failure."""
        for _ in range(1_000_000):  # each pass awaits at least one task: bounded
            if not self.tasks:
                break
            await asyncio.wait(set(self.tasks))
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        for t in self.tasks:
            t.cancel()


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
        deliverer: webhooks.Deliverer | None = None,
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
        self._wait_replicated = wait_replicated
        self._on_visible = on_visible
        self._visible: dict[str, int] = {}
        self._readable = asyncio.Event()  # sync mode: the start-up state is replicated
        self._confirming: asyncio.Task[None] | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._profiles: dict[str, RequestProfile] = {}  # of the jobs running here
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False
        self._random = random.Random()
        self._run_id = uuid.uuid4().hex  # this runtime's run markers (quarantine)
        self._suspects = q.Suspects()
        self._needed: dict[str, int] = {}  # job -> pages that count as progress
        self._later: set[asyncio.Task[None]] = set()  # _resume_later's waits
        self._limits = q.Limits(
            interruptions=config.poison_threshold,
            worker_losses=config.poison_worker_losses,
            progress_pages=config.poison_progress_pages,
        )

    # life cycle ---------------------------------------------------------------
    async def start(self) -> None:
        """Build the owner index of a store from before it (once), resume every job
        that was running, and start the expiry sweeper."""
        added = self.store.write(partial(jr.build_owner_index, store=self.store)).result
        if added:
            logger.info("owner index built: %d jobs", added)
        with contextlib.suppress(StorageUnavailable):  # a full volume: the sweeper's next round
            self.sweep()
        if self.deliverer is not None:
            await self.deliverer.start()  # resumes every outbox from its cursor
        resumed: list[str] = []
        for job_id in jr.all_job_ids(self.store):
            meta = jr.load_meta(self.store, job_id)
            if meta is not None and meta.state == "scraping":
                if self._wait_replicated is not None:
                    self._visible[job_id] = jr.progress(self.store, meta).completed
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
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for job_id in running:  # a clean stop: these runs were not interrupted
            with contextlib.suppress(Exception):  # not writable (fenced, lease lost)
                self.store.write(partial(self._clear_marker, job_id=job_id))
        if self.deliverer is not None:
            await self.deliverer.close()

    def visible(self, job_id: str) -> int | None:
        """How many of the job's pages clients may see (None: all that are stored).

        Sync mode caps every job this runtime runs (started or resumed); a finished
        job shows what is stored, once ``readable()``.
        """
        return self._visible.get(job_id)

    async def scrape(
        self, url: str, options: jobs_pb2.ScrapeOptions, owner: str
    ) -> jobs_pb2.Document:
        """One page, synchronously (the Scrape call) for account ``owner``; raises
        ``PageError`` (``PermissionError`` for options the account may not use)."""
        policy = FetchPolicy(request=self._profile(owner, options, [url]), owner=owner)
        page = await self._fetch_page(owner, url, options, policy)
        if pagecache.max_age_ms(options) > 0 or pagecache.tracks_changes(options):
            now = jr.now_ms()

            def group(g: WriteGroup) -> None:
                self._remember(g, owner, url, options, page, now)

            self.store.write(group)
        return page.document

    async def _fetch_page(
        self, owner: str, url: str, options: jobs_pb2.ScrapeOptions, policy: FetchPolicy
    ) -> Page:
        """The page at ``url``: from ``owner``'s page cache when a copy is fresh
        within the request's ``max_age``, else fetched, conditionally when an older
        copy has validators (a 304 returns that copy, revalidated; ``pagecache``)."""
        max_age = pagecache.max_age_ms(options)
        if max_age <= 0:
            return await self.engine.scrape(url, options, policy)
        entry = pagecache.lookup(self.store, pagecache.cache_key(owner, url, options))
        if entry is not None and pagecache.fresh(entry, max_age, jr.now_ms()):
            return pagecache.page_of(entry, url, "hit")
        if entry is not None:
            policy = replace(policy, validators=(entry.etag, entry.last_modified))
        page = await self.engine.scrape(url, options, policy)
        if page.not_modified and entry is not None:
            fresh = pagecache.page_of(entry, url, "revalidated")
            fresh.validators = page.validators if any(page.validators) else fresh.validators
            return fresh
        return page

    @staticmethod
    def _remember(
        g: WriteGroup,
        owner: str,
        url: str,
        options: jobs_pb2.ScrapeOptions,
        page: Page,
        now: int,
    ) -> None:
        """Inside the page's group: the page cache and change tracking (``pagecache``)."""
        pagecache.remember(g, owner, url, options, page, now)
        if pagecache.tracks_changes(options):
            pagecache.track(g, owner, page.document, options.change_tracking_diff, now)

    async def map(self, request: jobs_pb2.MapRequest, owner: str) -> list[str]:
        """The Map call for account ``owner``: the site's URLs (``mapper``), fetched
        with the server's request defaults; nothing is stored."""
        profile = self._profile(owner, jobs_pb2.ScrapeOptions(), [request.url])
        policy = FetchPolicy(request=profile, owner=owner)
        return await mapper.map_site(self.engine, request, self.config, policy)

    def _profile(
        self, owner: str, options: jobs_pb2.ScrapeOptions, targets: Sequence[str]
    ) -> RequestProfile:
        """The request profile of ``owner``'s scrape or job (``reqprofile``), with the
        permissions today's accounts file gives it."""
        account = self.accounts.get(owner)
        return RequestProfile.build(
            options,
            targets,
            may_ignore_robots=account is not None and account.allow_ignore_robots,
            may_use_proxy_url=account is not None and account.allow_proxy_url,
        )

    def _job_profile(
        self, meta: jr.JobMeta, options: jobs_pb2.ScrapeOptions, targets: Sequence[str]
    ) -> RequestProfile | None:
        """A job's profile, its cookie jar restored from the store; None (the job
        failed) when its options use what the owner may no longer use."""
        try:
            profile = self._profile(meta.owner, options, targets)
        except PermissionError as e:
            self._finish(meta.id, "failed", str(e))
            return None
        profile.cookies.load(*jr.read_cookies(self.store, meta.id))
        self._profiles[meta.id] = profile
        return profile

    def _save_cookies(self, g: WriteGroup, job_id: str) -> JarChanges | None:
        """Inside a page's group: what the job's jar changed since it was stored
        (``JobCookies.changes``); hand the result to ``_cookies_saved`` once the
        group is committed (a refused or failed group leaves them to the next)."""
        profile = self._profiles.get(job_id)
        changes = None if profile is None else profile.cookies.changes()
        if changes is None:
            return None
        keys = jr.JobKeys(job_id)
        for slot, record in changes.puts:
            g.put(keys.cookie(slot), record)
        for slot in changes.deletes:
            g.delete(keys.cookie(slot))
        if changes.slots is not None:
            g.put(keys.cookie_slots, str(changes.slots).encode())
        if changes.drop_legacy:
            g.delete(keys.cookies)
        return changes

    def _cookies_saved(self, job_id: str, changes: JarChanges | None) -> None:
        profile = self._profiles.get(job_id)
        if changes is not None and profile is not None:
            profile.cookies.committed(changes)

    # registration ---------------------------------------------------------------
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
    ) -> Registered:
        """Store a new job and start it. ``check`` runs inside the write section, just
        before anything is written (account limits: no other registration can slip in
        between the check and the write); what it raises propagates, nothing written.

        In sync mode the call returns once the standby holds the job (or the job an
        idempotency key names), so a retry after a failover finds the same job.

        AIP-155: a key already used by ``owner`` returns its job when the request is
        the same (``jr.request_hash`` of ``kind`` and ``request``, kept in the job's
        meta); with another request it raises ``jr.IdempotencyKeyReused``, nothing
        written. A key of a job stored before the hash was kept returns its job.
        """
        now = jr.now_ms()
        digest = jr.request_hash(kind, request) if idempotency_key else ""
        meta = jr.JobMeta(
            id=str(uuid.uuid4()),
            kind=kind,
            state="scraping",
            owner=owner,
            created_ms=now,
            expires_ms=now + int(self.config.job_ttl_seconds * 1000),
            total=total,
            limit=limit,
            idempotency_key=idempotency_key,
            extra={jr.REQUEST_HASH: digest} if digest else {},
        )

        def group(g: WriteGroup) -> Registered:
            if idempotency_key:
                existing = g.get(jr.idem_key(owner, idempotency_key))
                if existing is not None:
                    job_id = existing.decode()
                    raw = g.get(jr.JobKeys(job_id).meta)
                    first = jr.JobMeta.decode(raw).extra.get(jr.REQUEST_HASH) if raw else None
                    if first and first != digest:
                        raise jr.IdempotencyKeyReused(job_id)
                    return Registered(job_id, created=False)
                g.put(jr.idem_key(owner, idempotency_key), meta.id.encode())
            if check is not None:
                check()
            keys = jr.JobKeys(meta.id)
            g.put(keys.meta, meta.encode())
            g.put(keys.request, request)
            jr.index_owner(g, meta)  # before the jobs set: it checks the store was empty
            g.insert(jr.JOBS_SET, meta.id.encode())
            if webhook is not None and webhook.url:
                webhooks.configure(
                    g, meta.id, webhook.url, list(webhook.events), owner,
                    headers=dict(webhook.headers), metadata=dict(webhook.metadata),
                    include_document=webhook.include_document,
                    max_document_bytes=self.config.webhook_max_document_bytes,
                )  # fmt: skip
                webhooks.enqueue(
                    g, meta.id, "started", {"kind": kind, "total": total, "limit": limit}
                )
            return Registered(meta.id, created=True)

        reg = self.store.write(group).result
        if reg.created:
            self._wake(meta.id)
            if self._wait_replicated is not None:
                self._visible[meta.id] = 0
            logger.info(
                "job %s started (%s, account %s)",
                meta.id,
                kind,
                owner,
                extra={"job": meta.id, "account": owner},
            )
            self._spawn(meta)
        if self._wait_replicated is not None:
            await self._wait_replicated(None)
        return reg

    async def cancel(self, job_id: str) -> jr.JobMeta | None:
        """CancelJob: a running, waiting or paused job ends ``cancelled``; a finished
        one is returned as it is."""
        meta = jr.load_meta(self.store, job_id)
        if meta is None:
            return None
        if not meta.terminal:
            meta = self._finish(job_id, "cancelled", "cancelled by the caller")
            task = self._tasks.pop(job_id, None)
            if task is not None:
                task.cancel()
            else:
                self._release_suspect(job_id)  # a suspect waiting for its turn
            if self._wait_replicated is not None:
                await self._wait_replicated(None)
        return meta

    async def resume(self, job_id: str) -> jr.JobMeta | None:
        """ResumeJob: a paused job runs again, its quarantine budget deleted (one
        group); a running or finished job is returned as it is."""
        meta = self.store.write(partial(jr.unpause, job_id=job_id)).result
        if meta is None:
            return None
        if meta.state == "scraping" and job_id not in self._tasks:
            waiting = job_id in self._suspects.waiting or self._suspects.running == job_id
            if not waiting:
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

    # quarantine (pagesift.shared.jobs.quarantine) -----------------------------------------
    def _clear_marker(self, g: WriteGroup, job_id: str) -> None:
        """Inside a group: this runtime's marker of ``job_id`` deleted (a clean stop)."""
        key = jr.JobKeys(job_id).run
        raw = g.get(key)
        if raw is not None and q.RunMarker.decode(raw).run == self._run_id:
            g.delete(key)

    def _suspect(self, job_id: str) -> bool:
        return q.Budget.decode(self.store.get(jr.JobKeys(job_id).poison)).suspect

    def _epoch(self) -> int:
        with self.store.lock:
            return Identity(self.store).epoch

    def _node(self) -> str:
        return self.config.advertise or self.config.listen

    def _request(
        self, meta: jr.JobMeta
    ) -> jobs_pb2.StartBatchScrapeRequest | jobs_pb2.StartCrawlRequest:
        raw = self.store.get(jr.JobKeys(meta.id).request) or b""
        if meta.kind == "batch":
            return jobs_pb2.StartBatchScrapeRequest.FromString(raw)
        return jobs_pb2.StartCrawlRequest.FromString(raw)

    def _in_flight(
        self,
        meta: jr.JobMeta,
        req: jobs_pb2.StartBatchScrapeRequest | jobs_pb2.StartCrawlRequest,
        count: int,
    ) -> tuple[str, ...]:
        """The job's first ``count`` unfinished pages in queue order (every page in
        flight when a run stopped is among them: workers take them in this order)."""
        keys = jr.JobKeys(meta.id)
        count = max(1, min(count, q.MAX_IN_FLIGHT))
        out: list[str] = []
        if isinstance(req, jobs_pb2.StartBatchScrapeRequest):
            for i, url in enumerate(req.urls):
                if not self.store.set_contains(keys.done, str(i).encode()):
                    out.append(url)
                    if len(out) >= count:
                        break
            return tuple(out)
        if self.store.get(keys.seeded) is None:
            return (req.url,)  # still seeding: the start URL and its sitemaps
        start = 0
        while len(out) < count:
            items = self.store.list_items(keys.frontier, start, frontier.Frontier.CHUNK)
            if not items:
                break
            start = items[-1][0] + 1
            for _, raw in items:
                entry = Entry.decode(raw)
                if not self.store.set_contains(keys.done, entry.key.encode()):
                    out.append(entry.url)
                    if len(out) >= count:
                        break
        return tuple(out)

    def _count_interruption(self, meta: jr.JobMeta) -> jr.JobMeta | None:
        """Start-up: a run marker of ``meta``'s job means its last run was cut short:
        count it (and pause the job when that makes it poisoned), in one group."""
        keys = jr.JobKeys(meta.id)
        if self.store.get(keys.run) is None:
            return meta
        req = self._request(meta)
        concurrency = self._concurrency(req.max_concurrency)
        needed = q.progress_needed(self._limits, concurrency)
        in_flight = self._in_flight(meta, req, concurrency)

        def group(g: WriteGroup) -> tuple[jr.JobMeta | None, q.Verdict | None]:
            raw = g.get(keys.run)
            if raw is None:
                return meta, None
            event = q.Interrupted(
                q.RunMarker.decode(raw), jr.done_count(g, meta.id), in_flight, jr.now_ms()
            )
            verdict = q.count(q.Budget.decode(g.get(keys.poison)), event, self._limits, needed)
            g.put(keys.poison, verdict.budget.encode())
            g.delete(keys.run)
            if verdict.poisoned:
                note = "\n".join((verdict.reason, *verdict.budget.evidence))
                return jr.pause(g, meta.id, "poisoned", note), verdict
            return meta, verdict

        out, verdict = self.store.write(group).result
        if verdict is not None:
            logger.warning(
                "job %s %s (account %s): %s",
                meta.id,
                "quarantined" if verdict.poisoned else "was interrupted",
                meta.owner,
                verdict.reason or verdict.budget.evidence[-1],
                extra={"job": meta.id, "account": meta.owner},
            )
        return out

    def _worker_lost(self, job_id: str, url: str) -> None:
        """A page of the job lost its extraction worker: count it (one group); a job
        poisoned by it is paused and its run stopped."""
        keys = jr.JobKeys(job_id)
        needed = self._needed.get(job_id, q.progress_needed(self._limits, 1))
        node, epoch = self._node(), self._epoch()

        def group(g: WriteGroup) -> q.Verdict | None:
            raw = g.get(keys.meta)
            if raw is None or jr.JobMeta.decode(raw).state != "scraping":
                return None
            event = q.WorkerLost(url, jr.done_count(g, job_id), node, epoch, jr.now_ms())
            verdict = q.count(q.Budget.decode(g.get(keys.poison)), event, self._limits, needed)
            g.put(keys.poison, verdict.budget.encode())
            if verdict.poisoned:
                jr.pause(
                    g, job_id, "poisoned", "\n".join((verdict.reason, *verdict.budget.evidence))
                )
            return verdict

        verdict = self.store.write(group).result
        if verdict is None or not verdict.poisoned:
            return
        logger.warning("job %s quarantined: %s", job_id, verdict.reason, extra={"job": job_id})
        self._wake(job_id)
        task = self._tasks.pop(job_id, None)
        if task is not None:
            task.cancel()

    async def _probation(self, job_id: str, started_at: int) -> None:
        """A suspect's run: clear its interruptions once it made progress; stop holding
        the other suspects back then, or after ``poison_probation_seconds``."""
        keys = jr.JobKeys(job_id)
        needed = self._needed.get(job_id, 1)
        deadline = time.monotonic() + self.config.poison_probation_seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(min(0.25, self.config.poison_probation_seconds))
            if jr.done_count(self.store, job_id) - started_at < needed:
                continue

            def group(g: WriteGroup) -> None:
                budget = q.cleared(
                    q.Budget.decode(g.get(keys.poison)),
                    jr.done_count(g, job_id),
                    started_at,
                    needed,
                )
                if budget is not None:
                    g.put(keys.poison, budget.encode())

            with contextlib.suppress(StorageUnavailable):  # cleared next time it progresses
                self.store.write(group)
            break
        self._release_suspect(job_id)

    def _release_suspect(self, job_id: str) -> None:
        """``job_id`` no longer holds the suspects back: start the next that waits."""
        nxt = self._suspects.release(job_id)
        while nxt is not None and not self._closing:
            meta = jr.load_meta(self.store, nxt)
            if meta is not None and meta.state == "scraping" and nxt not in self._tasks:
                try:
                    self._spawn(meta)
                except StorageUnavailable:  # its run marker is a write: once it writes
                    self._resume_later(nxt)
                return
            nxt = self._suspects.release(nxt)

    def _resume_one(self, job_id: str) -> None:
        """Start-up (or later, see ``_resume_later``): a ``scraping`` job not running
        here is counted (an interruption when its marker is there: maybe paused
        now), then run, or queued behind the running suspect."""
        meta = jr.load_meta(self.store, job_id)
        if meta is None or meta.state != "scraping" or job_id in self._tasks:
            return
        meta = self._count_interruption(meta)
        if meta is None or meta.state != "scraping":
            return
        logger.info(
            "job %s resumed (%s, account %s)",
            job_id,
            meta.kind,
            meta.owner,
            extra={"job": job_id, "account": meta.owner},
        )
        if self._suspect(job_id) and not self._suspects.admit(job_id):
            logger.info("job %s waits: another interrupted job runs first", job_id)
            return
        self._spawn(meta)

    def _resume_later(self, job_id: str) -> None:
        """``_resume_one`` once the store takes writes again (it refused one)."""

        async def later() -> None:
            for _ in range(1_000_000):  # each round waits for the store: bounded
                await self._storage_back()
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

    # expiry -----------------------------------------------------------------------
    def sweep(self) -> int:
        """Delete every finished job whose TTL has passed; returns how many."""
        now = jr.now_ms()
        removed = 0
        for job_id in jr.all_job_ids(self.store):
            meta = jr.load_meta(self.store, job_id)
            if meta is None or (meta.terminal and meta.expires_ms <= now):
                logger.info(
                    "job %s expired (account %s)",
                    job_id,
                    meta.owner if meta else "-",
                    extra={"job": job_id, "account": meta.owner if meta else ""},
                )
                self.store.write(partial(jr.delete_job, job_id=job_id, meta=meta))
                self._visible.pop(job_id, None)
                removed += 1
        quota.prune_all(self.store, time.time())
        pagecache.sweep(
            self.store,
            now,
            int(self.config.page_cache_ttl * 1000),
            int(self.config.change_tracking_ttl * 1000),
        )
        return removed

    async def _sweep_loop(self) -> None:
        interval = max(0.2, min(60.0, self.config.job_ttl_seconds / 4))
        while not self._closing:
            await asyncio.sleep(interval)
            with contextlib.suppress(StorageUnavailable):  # the next round, when it writes
                self.sweep()

    # running ------------------------------------------------------------------------
    def _spawn(self, meta: jr.JobMeta) -> None:
        """Run the job: its run marker first (one group), then its task."""
        req = self._request(meta)
        self._needed[meta.id] = q.progress_needed(
            self._limits, self._concurrency(req.max_concurrency)
        )
        keys = jr.JobKeys(meta.id)
        node, epoch = self._node(), self._epoch()

        def mark(g: WriteGroup) -> int:
            done = jr.done_count(g, meta.id)
            g.put(keys.run, q.RunMarker(self._run_id, node, epoch, jr.now_ms(), done).encode())
            return done

        try:
            started_at = self.store.write(mark).result
        except NotWritable as e:  # fenced, or a lapsed lease: the job resumes elsewhere
            logger.info("job %s not started here: %s", meta.id, e)
            self._release_suspect(meta.id)
            return
        if isinstance(req, jobs_pb2.StartBatchScrapeRequest):
            coro = self._run_batch(meta, req)
        else:
            coro = self._run_crawl(meta, req)
        suspect = self._suspects.running == meta.id
        task = asyncio.create_task(self._guard(meta.id, coro, started_at if suspect else None))
        self._tasks[meta.id] = task

    async def _guard(
        self, job_id: str, coro: Awaitable[None], probation_from: int | None = None
    ) -> None:
        rerun = False
        probation = (
            asyncio.create_task(self._probation(job_id, probation_from))
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
            await self._storage_back()
            rerun = not self._closing
        except Exception as e:  # a bug must not leave a job "scraping" forever
            logger.exception("job %s failed", job_id)
            self._finish(job_id, "failed", f"internal error: {e}")
        finally:
            if probation is not None:
                probation.cancel()
            if self._tasks.get(job_id) is asyncio.current_task():
                self._tasks.pop(job_id, None)
            self._profiles.pop(job_id, None)
            self._needed.pop(job_id, None)
            self._release_suspect(job_id)
        while rerun and job_id not in self._tasks and not self._closing:
            meta = jr.load_meta(self.store, job_id)
            if meta is None or meta.state != "scraping":
                break
            try:
                self._spawn(meta)  # its run marker is a write: the store may refuse again
                break
            except StorageUnavailable:
                await self._storage_back()

    def _concurrency(self, asked: int) -> int:
        n = asked or self.config.default_concurrency
        return max(1, min(n, self.config.max_concurrency))

    def _max_retries(
        self, req: jobs_pb2.StartBatchScrapeRequest | jobs_pb2.StartCrawlRequest
    ) -> int:
        n = req.max_retries if req.HasField("max_retries") else self.config.max_retries
        return max(0, min(n, self.config.max_retries_limit))

    async def _attempt(
        self,
        run: _Run,
        job_id: str,
        mark: bytes,
        url: str,
        fetch: Callable[[], Awaitable[Page]],
        record: Callable[[Page], Awaitable[None]],
    ) -> None:
        """One attempt at a page inside one of the job's permits; a transient failure
        with retries left is scheduled again (module docstring), else recorded."""
        async with run.permits:
            try:
                page = await fetch()
            except PageError as e:
                if e.worker_lost:  # counted toward quarantine (module docstring)
                    self._worker_lost(job_id, url)
                used = jr.retries_used(self.store, job_id, mark, run.max_retries)
                if used < run.max_retries and retrypolicy.is_transient(e):
                    await self._retry_later(run, job_id, mark, url, e, used, fetch, record)
                    return
                if used:
                    e = PageError(
                        e.code,
                        f"{e.message} (after {used + 1} attempts; last cause: "
                        f"{retrypolicy.cause_of(e)})",
                        status=e.status,
                        retry_after=e.retry_after,
                    )
                await self._record_error(job_id, mark, url, e)
                return
            await record(page)

    async def _retry_later(
        self,
        run: _Run,
        job_id: str,
        mark: bytes,
        url: str,
        err: PageError,
        used: int,
        fetch: Callable[[], Awaitable[Page]],
        record: Callable[[Page], Awaitable[None]],
    ) -> None:
        n = used + 1
        marked = await self._write_when_writable(
            partial(jr.mark_retry, job_id=job_id, mark=mark, n=n)
        )
        if not marked.result:
            return  # done meanwhile, or the job is gone
        if self.metrics is not None:
            self.metrics.fetch_retry(retrypolicy.cause_of(err))
        cfg = self.config
        wait = retrypolicy.retry_delay(
            used, base=cfg.retry_base_delay, cap=cfg.retry_max_delay, draw=self._random.random()
        )
        if err.retry_after is not None and err.retry_after > wait:
            wait = err.retry_after  # the host is paused until then anyway

        async def later() -> None:
            try:
                await asyncio.sleep(wait)  # holding no permit
                await self._attempt(run, job_id, mark, url, fetch, record)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # surfaces from drain(), at the job's end
                if run.error is None:
                    run.error = e
            finally:
                run.on_change(-1)

        run.on_change(+1)
        task = asyncio.create_task(later())
        run.tasks.add(task)
        task.add_done_callback(run.tasks.discard)

    async def _run_batch(self, meta: jr.JobMeta, req: jobs_pb2.StartBatchScrapeRequest) -> None:
        done = jr.JobKeys(meta.id).done
        pending: Iterator[tuple[int, str]] = (
            (i, url)
            for i, url in enumerate(req.urls)
            if not self.store.set_contains(done, str(i).encode())
        )

        profile = self._job_profile(meta, req.options, req.urls)
        if profile is None:
            return
        policy = FetchPolicy(request=profile, owner=meta.owner)
        concurrency = self._concurrency(req.max_concurrency)
        run = _Run(concurrency, self._max_retries(req), lambda delta: None)

        async def worker() -> None:
            for i, url in pending:
                mark = str(i).encode()

                async def record(page: Page, mark: bytes = mark, url: str = url) -> None:
                    await self._record_page(meta.id, mark, page, [], source=(url, req.options))

                fetch = partial(self._fetch_page, meta.owner, url, req.options, policy)
                await self._attempt(run, meta.id, mark, url, fetch, record)

        try:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            await run.drain()
        finally:
            run.cancel()
        await self._finish_when_writable(meta.id, "completed", "")

    async def _run_crawl(self, meta: jr.JobMeta, req: jobs_pb2.StartCrawlRequest) -> None:
        try:  # compiled again at every (re)start, on the pattern pool, within the bounds
            scope = await Scope.build(req, meta.limit, validate.regex_limits(self.config))
        except patterns.PatternError as e:  # stored before today's bounds: refuse it now
            field = f"{e.which}_paths" + ("" if e.index is None else f"[{e.index}]")
            self._finish(meta.id, "failed", f"{field}: {e.reason}")
            return
        profile = self._job_profile(meta, req.options, [req.url])
        if profile is None:
            return
        policy = FetchPolicy(delay=req.delay, request=profile, owner=meta.owner)
        follow = req.sitemap != jobs_pb2.SITEMAP_MODE_ONLY
        queue = frontier.Frontier(self.store, meta.id)

        def retries_in_flight(delta: int) -> None:
            # a sleeping retry counts as in flight: the workers wait for what it admits
            queue.in_flight += delta
            queue.changed.set()

        # The start URL is queued now, durably, before any sitemap is fetched; the
        # sitemaps are read meanwhile, bounded by crawl_seed_timeout (frontier).
        seeding: asyncio.Task[None] | None = None
        if frontier.seed_start(self.store, meta.id, req, scope):
            retries_in_flight(1)  # the sitemap step holds the frontier open
            seeding = asyncio.create_task(
                self._seed_sitemaps(meta.id, req, scope, policy, queue, retries_in_flight)
            )
        concurrency = self._concurrency(req.max_concurrency)
        run = _Run(concurrency, self._max_retries(req), retries_in_flight)

        async def worker() -> None:
            async for entry in queue.entries():
                mark = entry.key.encode()

                async def record(page: Page, entry: Entry = entry, mark: bytes = mark) -> None:
                    depth = entry.depth + 1
                    robots_meta = not req.ignore_robots_meta
                    links = page.links if follow and not (robots_meta and page.nofollow) else []
                    found = {scope.key(link): link for link in links}
                    admitted = await scope.admit(found, depth)  # regexes off the event loop
                    aliases = await scope.aliases(
                        entry.key, page.document.final_url, page.canonical
                    )
                    skip = None
                    if robots_meta and page.noindex:
                        skip = PageError(ErrorCode.ROBOTS_NOINDEX, "meta robots or X-Robots-Tag")
                    await self._record_page(
                        meta.id, mark, page, admitted, aliases, skip, (entry.url, req.options)
                    )

                fetch = partial(self._fetch_page, meta.owner, entry.url, req.options, policy)
                await self._attempt(run, meta.id, mark, entry.url, fetch, record)

        try:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            await run.drain()
        finally:
            run.cancel()
            if seeding is not None:
                seeding.cancel()
        pages = self.store.list_len(jr.JobKeys(meta.id).pages)
        if pages and pagecache.tracks_changes(req.options):
            await self._record_removed(meta, req.url)
        if pages == 0:
            errors, _ = jr.read_errors(self.store, meta.id)
            why = f"{errors[0].code}: {errors[0].message}" if errors else "nothing to crawl"
            await self._finish_when_writable(meta.id, "failed", f"the crawl found no page ({why})")
        else:
            await self._finish_when_writable(meta.id, "completed", "")

    async def _seed_sitemaps(
        self,
        job_id: str,
        req: jobs_pb2.StartCrawlRequest,
        scope: Scope,
        policy: FetchPolicy,
        queue: frontier.Frontier,
        in_flight: Callable[[int], None],
    ) -> None:
        """A crawl's sitemap step (``frontier.seed_sitemaps``) beside its workers; it
        was counted in flight by the caller and is uncounted when it ends, however."""
        try:
            await frontier.seed_sitemaps(
                self.store,
                self.engine,
                job_id,
                req,
                scope,
                policy,
                self.config.crawl_seed_timeout,
                queue.wake,
            )
        except asyncio.CancelledError:
            raise
        except Exception:  # e.g. the store refusing writes: resumed later as SEEDING
            logger.exception("job %s: reading its sitemaps failed", job_id)
        finally:
            in_flight(-1)

    # recording ------------------------------------------------------------------------
    async def _storage_back(self) -> None:
        """Returns once the store takes writes again (or the runtime closes): a job's
        pause while the volume is full is this wait, in memory."""
        while not self._closing:
            if self.store.refusing is None:
                return
            await asyncio.sleep(STORAGE_POLL_SECONDS)

    async def _write_when_writable(
        self, fn: Callable[[WriteGroup], T], *, max_bytes: int | None = None
    ) -> Commit[T]:
        """``store.write(fn)``; while the store refuses writes, wait and run the group
        again (it re-reads what it checks: nothing is recorded twice or lost)."""
        while True:
            try:
                return self.store.write(fn, max_bytes=max_bytes)
            except StorageUnavailable:
                if self._closing:
                    raise
                await self._storage_back()

    async def _finish_when_writable(self, job_id: str, state: str, note: str) -> None:
        """``_finish`` at a run's end, waiting like ``_write_when_writable``."""
        while True:
            try:
                self._finish(job_id, state, note)
                return
            except StorageUnavailable:
                if self._closing:
                    raise
                await self._storage_back()

    async def _record_page(
        self,
        job_id: str,
        mark: bytes,
        page: Page,
        admitted: list[Entry],
        aliases: Sequence[str] = (),
        skip: PageError | None = None,
        source: tuple[str, jobs_pb2.ScrapeOptions] | None = None,
    ) -> None:
        """Store the page, or (crawl) a ``duplicate``/``skip`` error in its place;
        ``source`` (the URL asked for, the job's options) feeds the page cache and
        change tracking in the same group (``pagecache``)."""
        doc = page.document
        raw = doc.SerializeToString()
        now = time.time()
        now_ms = jr.now_ms()
        keys = jr.JobKeys(job_id)
        kind = ""
        not_stored: str = ""  # the error code recorded instead of the page
        saved: JarChanges | None = None  # the jar's changes in the group

        def error(g: WriteGroup, url: str, err: PageError) -> None:
            item = jobs_pb2.PageError(
                url=url, code=str(err.code), message=err.message, time=jr.timestamp(jr.now_ms())
            )
            g.push(keys.errors, item.SerializeToString())
            webhooks.enqueue(
                g,
                job_id,
                "page_failed",
                {"url": url, "code": str(err.code), "message": err.message},
            )

        def group(g: WriteGroup) -> tuple[int | None, quota.LimitExceeded | None]:
            nonlocal kind
            meta_raw = g.get(keys.meta)
            if meta_raw is None or g.contains(keys.done, mark):
                return None, None  # the job is gone, or the page recorded already
            meta = jr.JobMeta.decode(meta_raw)
            kind = meta.kind
            if meta.terminal:
                return None, None  # cancelled or stopped while this page was in flight
            nonlocal saved, not_stored
            saved = self._save_cookies(g, job_id)
            original, queued = frontier.claim_aliases(g, job_id, aliases)
            if original is not None or skip is not None:
                if original is not None:  # nothing claimed: the original's links are in
                    err = PageError(ErrorCode.DUPLICATE, f"same page as {original}")
                else:
                    assert skip is not None
                    err = skip
                    if admitted:
                        frontier.admit(g, job_id, admitted, meta.limit)
                error(g, doc.url, err)
                g.insert(keys.done, mark)
                not_stored = str(err.code)
                for alias in queued:
                    error(g, alias, PageError(ErrorCode.DUPLICATE, f"same page as {doc.url}"))
                return None, None
            account = self.accounts.get(meta.owner)
            if account is not None and account.pages_per_day is not None:
                hit = quota.page_limit_hit(g, account, now)
                if hit is not None:
                    return None, hit
                quota.charge(g, meta.owner, 1, now)
            stored = raw
            if source is not None:
                self._remember(g, meta.owner, source[0], source[1], page, now_ms)
                if pagecache.tracks_changes(source[1]):
                    stored = doc.SerializeToString()  # with its change status
            seq = g.push(keys.pages, stored)
            g.insert(keys.done, mark)
            if admitted:
                frontier.admit(g, job_id, admitted, meta.limit)
            for alias in queued:
                error(g, alias, PageError(ErrorCode.DUPLICATE, f"same page as {doc.url}"))
            webhooks.enqueue(
                g,
                job_id,
                "page",
                {"index": seq, "url": doc.url, "final_url": doc.final_url,
                 "status_code": doc.status_code, "title": doc.title},
            )  # fmt: skip
            return seq, None

        bound = jr.page_group_bytes(self.config.max_body_bytes)
        try:
            commit = await self._write_when_writable(group, max_bytes=bound)
        except GroupTooLarge as e:  # nothing of it written: the page is an error instead
            why = f"the page's write group is {e.size} bytes, over the {e.bound}-byte bound"
            await self._record_error(job_id, mark, doc.url, PageError(ErrorCode.TOO_LARGE, why))
            return
        self._cookies_saved(job_id, saved)
        seq, hit = commit.result
        if hit is not None:
            self._stop_on_quota(job_id, hit)
            return
        if not_stored:
            if self.metrics is not None:
                self.metrics.page_failed(not_stored)
            self._wake(job_id)
            return
        if seq is None:
            return
        if self.metrics is not None:
            self.metrics.page_recorded(kind)
        if self._wait_replicated is not None:
            if commit.offset:  # the group's log offset (0: no log attached)
                await self._wait_replicated(commit.offset)
            if job_id in self._visible:
                self._visible[job_id] = max(self._visible[job_id], seq + 1)
            if self._on_visible is not None:
                self._on_visible(job_id)
        self._wake(job_id)

    async def _record_removed(self, meta: jr.JobMeta, start_url: str) -> None:
        """A change-tracked crawl's end: which pages of the account's previous such
        crawl from this start URL are gone (``pagecache.crawl_removed``)."""
        keys = jr.JobKeys(meta.id)
        stored: list[str] = []
        for start in range(0, self.store.list_len(keys.pages), 256):
            for raw in self.store.list_range(keys.pages, start, 256):
                stored.append(jobs_pb2.Document.FromString(raw).url)

        def group(g: WriteGroup) -> None:
            if g.get(keys.removed) is not None:
                return  # written before a crash: the crawl set is this crawl's already
            removed = pagecache.crawl_removed(g, meta.owner, start_url, stored)
            g.put(keys.removed, "\n".join(removed).encode())

        await self._write_when_writable(group)

    def _stop_on_quota(self, job_id: str, hit: quota.LimitExceeded) -> None:
        """The account's daily pages ran out mid-job: stop it, keeping its pages."""
        if self.metrics is not None:
            self.metrics.limit_hit(hit.limit_name)
        self._finish(job_id, "failed", hit.message)
        task = self._tasks.pop(job_id, None)
        if task is not None:
            task.cancel()

    def _wake(self, job_id: str) -> None:
        if self.deliverer is not None:
            self.deliverer.wake(job_id)

    async def _record_error(self, job_id: str, mark: bytes, url: str, err: PageError) -> None:
        item = jobs_pb2.PageError(
            url=url, code=str(err.code), message=err.message, time=jr.timestamp(jr.now_ms())
        ).SerializeToString()

        saved: JarChanges | None = None

        def group(g: WriteGroup) -> bool:
            nonlocal saved
            keys = jr.JobKeys(job_id)
            if g.contains(keys.done, mark) or g.get(keys.meta) is None:
                return False
            saved = self._save_cookies(g, job_id)
            g.push(keys.errors, item)
            g.insert(keys.done, mark)
            webhooks.enqueue(
                g,
                job_id,
                "page_failed",
                {"url": url, "code": str(err.code), "message": err.message},
            )
            return True

        recorded = (await self._write_when_writable(group)).result
        self._cookies_saved(job_id, saved)
        if recorded:
            if self.metrics is not None:
                self.metrics.page_failed(str(err.code))
            self._wake(job_id)

    def _finish(self, job_id: str, state: str, note: str) -> jr.JobMeta | None:
        keys = jr.JobKeys(job_id)

        def group(g: WriteGroup) -> jr.JobMeta | None:
            raw = g.get(keys.meta)
            if raw is None:
                return None
            meta = jr.JobMeta.decode(raw)
            if meta.terminal:
                return meta
            now = jr.now_ms()
            meta.state, meta.note, meta.finished_ms = state, note, now
            meta.expires_ms = now + int(self.config.job_ttl_seconds * 1000)
            g.put(keys.meta, meta.encode())
            g.delete(keys.run)  # the run ended cleanly (quarantine)
            if note and state != "cancelled":
                g.push(
                    keys.notes,
                    jobs_pb2.PageError(
                        code=state, message=note, time=jr.timestamp(now)
                    ).SerializeToString(),
                )
            webhooks.enqueue(
                g,
                job_id,
                state,
                {"state": state, "note": note,
                 "completed": g.list_len(keys.pages),
                 "failed": g.list_len(keys.errors)},
            )  # fmt: skip
            return meta

        meta = self.store.write(group).result
        self._wake(job_id)
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
