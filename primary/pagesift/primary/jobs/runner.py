"""A job's run: its worker loops (batch, crawl), its attempts and their retries.

``Runner.run`` is one run of one job, started by ``runtime.Jobs`` in a task of its own
(the runtime wrote the run marker first), from the job's spec as stored
(``specs.stored``: parsed once, trusted; a crawl's regexes are compiled as accepted,
``CrawlSpec.scope``). ``max_concurrency`` workers take pages in
queue order (batch: indices not done; crawl: ``frontier`` entries not done, in enqueue
order, read in chunks so memory stays flat), fetch each as a Scrape does
(``oneoff.fetch_page``) and hand the outcome to ``commits`` (``committing.Committer``:
what ``recording`` writes for it committed, one group a page, and the job's end).

- hosts owned elsewhere (a node of a cluster: ``owners``, the registry as last read,
  ``pagesift.core.cluster.ownership``): a crawl's queued URL whose host another pair
  owns is recorded ``host_owned_elsewhere`` and never fetched (left to its owner, the
  keeper of that host's politeness), and so is a redirect or meta refresh of any page
  to such a host (``FetchPolicy.foreign_host``). The crawl's own site is no exception:
  when it moves to another pair (one joined, this one lapsed and came back) its pages
  left are recorded so too, and the engine's host gate (``clustered.OwnedHosts``)
  holds every request to the instant it is sent.
- daily pages: every attempt draws its page first (``pagedraws``: the node's count and,
  in a cluster, the pair's block) inside its permit, before the request leaves, and
  settles it after: charged when its group stored a document, else given back. A draw
  refused stops the job as the quota's excess (its pages so far kept).

- retries: a transient failure (``retrypolicy.is_transient``) with retries left first
  writes "retry n of this page" (``records.mark_retry``, one group) BEFORE it sleeps, so a
  crash never hands a page its spent retries back. The sleep (full jitter, at least
  the Retry-After) runs in a task of its own holding none of the job's permits, then
  takes one for its attempt. After a restart the page is fetched again in queue order
  and its count read back (``records.retries_used``): at most ``1 + max_retries`` attempts
  plus one per crash that cut an attempt short. The last error says how many.
- disk full (``StorageUnavailable``): a page, page error, retry mark or finish waits in
  memory, its group not committed, until the store takes writes again, then runs the
  group afresh (``Committer.write_when_writable``: recorded once, never lost).
- a change-tracked crawl writes its ``removed`` URLs in one group before it finishes.

What the run asks of the runtime (ending a job's run, quarantine, sync visibility) is
the ``Host`` protocol, so imports flow runtime -> runner -> committing -> recording.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Protocol
from urllib.parse import urlsplit

from pagesift.core.api.metrics import Metrics
from pagesift.core.cluster.ownership import NoOwners, OwnersSource, left_to_owner
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import patterns, quota, records, specs, urls, views
from pagesift.core.jobs.accounts import Accounts
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.jobs.scope import Entry, Scope
from pagesift.core.store.db import Store
from pagesift.core.util.tasks import all_or_none
from pagesift.primary.engine import retrypolicy
from pagesift.primary.engine.interface import Engine, FetchPolicy, Page
from pagesift.primary.engine.reqprofile import RequestProfile
from pagesift.primary.jobs import appending, frontier, oneoff, pagecache, recording
from pagesift.primary.jobs.activity import Activity
from pagesift.primary.jobs.committing import CommitHost, Committer
from pagesift.primary.jobs.pagedraws import PageDraws
from pagesift.primary.jobs.recording import PageResult
from pagesift.primary.models.formats import ModelFormats
from pagesift.v1 import jobs_pb2

__all__ = [
    "Host",
    "JobRequest",
    "Runner",
    "concurrency",
    "first_unfinished",
]

logger = logging.getLogger("pagesift.jobs")

JobRequest = jobs_pb2.StartBatchScrapeRequest | jobs_pb2.StartCrawlRequest


class Host(CommitHost, Protocol):
    """What a run asks of the runtime that started it (``runtime.Jobs``): what its
    commits ask (``committing.CommitHost``), and to count a lost worker."""

    def worker_lost(self, job_id: str, url: str) -> None:
        """A page lost its extraction worker (quarantine counts it)."""


def concurrency(config: ServerConfig, asked: int) -> int:
    """A job's workers: what it asked (or the default) within ``max_concurrency``."""
    n = asked or config.default_concurrency
    return max(1, min(n, config.max_concurrency))


def first_unfinished(store: Store, job_id: str, req: JobRequest, count: int) -> tuple[str, ...]:
    """The job's first ``count`` (at least 1) unfinished pages in queue order: every
    page in flight when a run stopped is among them (workers take them in this order)."""
    keys = records.JobKeys(job_id)
    count = max(1, count)
    out: list[str] = []
    if isinstance(req, jobs_pb2.StartBatchScrapeRequest):
        for _, url in appending.batch_urls(store, job_id, req):  # the added URLs too
            out.append(url)
            if len(out) >= count:
                break
        return tuple(out)
    if store.get(keys.seeded) is None:
        return (req.url,)  # still seeding: the start URL and its sitemaps
    start = 0
    while len(out) < count:
        items = store.list_items(keys.frontier, start, frontier.Frontier.CHUNK)
        if not items:
            break
        start = items[-1][0] + 1
        for _, raw in items:
            entry = Entry.decode(raw)
            if not store.set_contains(keys.done, entry.key.encode()):
                out.append(entry.url)
                if len(out) >= count:
                    break
    return tuple(out)


class _Run:
    """One job's run: its concurrency permits and its sleeping retries.

    ``on_change(delta)`` tells the caller a retry was scheduled (+1) or finished (-1)
    (the crawl counts them as in flight so its workers wait for what they admit).
    """

    def __init__(
        self, permits: int, max_retries: int, on_change: Callable[[int], None], owner: str
    ) -> None:
        self.owner = owner  # the job's account (its pages in flight are counted: Activity)
        self.permits = asyncio.Semaphore(permits)
        self.max_retries = max_retries
        self.on_change = on_change
        self.tasks: set[asyncio.Task[None]] = set()
        self.error: BaseException | None = None
        self.over_quota = False  # a draw was refused: the job is stopped

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


class Runner:
    def __init__(
        self,
        store: Store,
        engine: Engine,
        config: ServerConfig,
        accounts: Accounts,
        host: Host,
        *,
        metrics: Metrics | None = None,
        models: ModelFormats | None = None,
    ) -> None:
        self.store = store
        self.engine = engine
        self.models = models  # the model formats (None: the node has no model endpoint)
        self.config = config
        self.accounts = accounts
        self.metrics = metrics
        self._host = host
        self._random = random.Random()
        self.activity = Activity()  # per account: jobs, pages in flight (GetAccountUsage)
        # what a run records, committed (waiting while the store refuses); the job's end
        self.commits = Committer(store, config, accounts, host, self.activity, metrics=metrics)
        self.draws = PageDraws(store, accounts)  # daily pages, drawn before each request
        self.owners: OwnersSource = NoOwners()  # the hosts this pair owns (a cluster's)

    async def run(self, meta: records.JobMeta, spec: specs.JobSpec) -> None:
        """One run of the job (``spec``: as stored), until it finishes (or its task
        is cancelled)."""
        try:
            if isinstance(spec, specs.BatchSpec):
                await self._run_batch(meta, spec.request)
            else:
                await self._run_crawl(meta, spec)
        finally:
            self.commits.jars.pop(meta.id, None)

    def foreign(self) -> Callable[[str], str | None]:
        """Why a host (an engine slot key) is not fetched here: another pair owns it
        (None: this pair's, or no registry read yet)."""

        def why(host: str) -> str | None:
            if not host:
                return None
            owner = self.owners.current().elsewhere(host)
            if owner is None:
                return None
            return left_to_owner(host, owner)

        return why

    # the job's request ---------------------------------------------------------------
    def _profile(
        self, meta: records.JobMeta, options: jobs_pb2.ScrapeOptions, targets: list[str]
    ) -> RequestProfile | None:
        """The job's request profile, its cookie jar restored from the store; None
        (the job failed) when its options use what today's accounts file denies its owner."""
        try:
            profile = oneoff.request_profile(self.accounts, meta.owner, options, targets)
        except PermissionError as e:
            self.commits.finish(meta.id, "failed", str(e))
            return None
        profile.cookies.load(*records.read_cookies(self.store, meta.id))
        self.commits.jars[meta.id] = profile.cookies
        return profile

    def _max_retries(self, req: JobRequest) -> int:
        n = req.max_retries if req.HasField("max_retries") else self.config.max_retries
        return max(0, min(n, self.config.max_retries_limit))

    # attempts and retries ------------------------------------------------------------
    async def _attempt(
        self,
        run: _Run,
        job_id: str,
        mark: bytes,
        url: str,
        fetch: Callable[[], Awaitable[Page]],
        record: Callable[[Page], Awaitable[bool]],
    ) -> None:
        """One attempt at a page inside one of the job's permits, its page drawn first
        and settled after (module docstring); a transient failure with retries left is
        scheduled again, else recorded."""
        async with run.permits, self.activity.fetching(run.owner, job_id):
            drawn = await self.draws.draw(run.owner)
            if isinstance(drawn, quota.LimitExceeded):
                if not run.over_quota:  # the first worker refused stops the job, once
                    run.over_quota = True
                    self.commits.stop_on_quota(job_id, drawn)
                return
            stored = False
            try:
                stored = await self._fetch_and_record(run, job_id, mark, url, fetch, record)
            finally:
                drawn.settle(stored=stored)

    async def _fetch_and_record(
        self,
        run: _Run,
        job_id: str,
        mark: bytes,
        url: str,
        fetch: Callable[[], Awaitable[Page]],
        record: Callable[[Page], Awaitable[bool]],
    ) -> bool:
        """The attempt's fetch and what it records: True when a document was stored."""
        try:
            page = await fetch()
        except PageError as e:
            if e.worker_lost:  # counted toward quarantine (runtime)
                self._host.worker_lost(job_id, url)
            used = records.retries_used(self.store, job_id, mark, run.max_retries)
            if used < run.max_retries and retrypolicy.is_transient(e):
                await self._retry_later(run, job_id, mark, url, e, used, fetch, record)
                return False
            if used:
                e = PageError(
                    e.code,
                    f"{e.message} (after {used + 1} attempts; last cause: "
                    f"{retrypolicy.cause_of(e)})",
                    status=e.status,
                    retry_after=e.retry_after,
                )
            await self.commits.record_error(job_id, mark, url, e)
            return False
        return await record(page)

    async def _retry_later(
        self,
        run: _Run,
        job_id: str,
        mark: bytes,
        url: str,
        err: PageError,
        used: int,
        fetch: Callable[[], Awaitable[Page]],
        record: Callable[[Page], Awaitable[bool]],
    ) -> None:
        n = used + 1
        marked = await self.commits.write_when_writable(
            partial(records.mark_retry, job_id=job_id, mark=mark, n=n)
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

    # the run loops -------------------------------------------------------------------
    async def _run_batch(
        self, meta: records.JobMeta, req: jobs_pb2.StartBatchScrapeRequest
    ) -> None:
        """The batch's URLs not done, in index order, URLs added meanwhile included
        (``appending``): it ends once a check in the end's group finds none it missed."""
        targets = [u for _, u in appending.batch_urls(self.store, meta.id, req, undone=False)]
        profile = self._profile(meta, req.options, targets)
        if profile is None:
            return
        known, seeded = len(targets), {urlsplit(u).netloc for u in targets}
        del targets
        covered = appending.Covered()
        pending: Iterator[tuple[int, str]] = iter(())
        policy = FetchPolicy(request=profile, owner=meta.owner, foreign_host=self.foreign())
        workers = concurrency(self.config, req.max_concurrency)
        run = _Run(workers, self._max_retries(req), lambda delta: None, meta.owner)

        async def worker() -> None:
            for i, url in pending:
                mark = str(i).encode()
                if i >= known and req.options.cookies and urlsplit(url).netloc not in seeded:
                    seeded.add(urlsplit(url).netloc)  # added while it runs: its cookies
                    profile.cookies.seed(req.options.cookies, [url])

                async def record(page: Page, mark: bytes = mark, url: str = url) -> bool:
                    result = PageResult(mark, page, source=(url, req.options))
                    return await self.commits.record_page(meta.id, result)

                fetch = partial(
                    oneoff.fetch_page,
                    self.store,
                    self.engine,
                    meta.owner,
                    url,
                    req.options,
                    policy,
                    self.models,
                )
                await self._attempt(run, meta.id, mark, url, fetch, record)

        try:
            while True:
                start, covered.end = covered.end, 0
                pending = appending.batch_urls(self.store, meta.id, req, start, covered)
                await all_or_none(worker() for _ in range(workers))
                await run.drain()
                if await self._end_batch(meta.id, covered.end):
                    return
        finally:
            run.cancel()

    async def _end_batch(self, job_id: str, covered: int) -> bool:
        """``appending.record_end`` (waiting while the store refuses): True once the
        job ended, False when URLs were added past ``covered``."""
        ttl = int(self.config.job_ttl_seconds * 1000)
        group = partial(appending.record_end, job_id=job_id, covered=covered, ttl_ms=ttl)
        ended, meta = (
            await self.commits.write_when_writable(partial(group, now_ms=records.now_ms()))
        ).result
        if ended:
            self._host.wake(job_id)
            if meta is not None:
                logger.info("job %s %s", job_id, meta.state, extra={"job": job_id})
        return ended

    async def _run_crawl(self, meta: records.JobMeta, spec: specs.CrawlSpec) -> None:
        req = spec.request
        try:  # compiled at every (re)start, on the pattern pool, as accepted
            scope = await spec.scope(self.config.max_regex_memory)
        except patterns.PatternError as e:  # no RE2 program within the run's memory
            field = f"{e.which}_paths" + ("" if e.index is None else f"[{e.index}]")
            self.commits.finish(meta.id, "failed", f"{field}: {e.reason}")
            return
        profile = self._profile(meta, req.options, [req.url])
        if profile is None:
            return
        foreign = self.foreign()
        policy = FetchPolicy(
            delay=req.delay, request=profile, owner=meta.owner, foreign_host=foreign
        )
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
        workers = concurrency(self.config, req.max_concurrency)
        run = _Run(workers, self._max_retries(req), retries_in_flight, meta.owner)

        async def worker() -> None:
            async for entry in queue.entries():
                mark = entry.key.encode()
                elsewhere = foreign(urls.host_of(entry.url))
                if elsewhere is not None:  # left to the host's owner, never fetched
                    err = PageError(ErrorCode.HOST_OWNED_ELSEWHERE, elsewhere)
                    await self.commits.record_error(meta.id, mark, entry.url, err)
                    continue

                async def record(page: Page, entry: Entry = entry, mark: bytes = mark) -> bool:
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
                    result = PageResult(
                        mark, page, admitted, aliases, skip, (entry.url, req.options)
                    )
                    return await self.commits.record_page(meta.id, result)

                fetch = partial(
                    oneoff.fetch_page,
                    self.store,
                    self.engine,
                    meta.owner,
                    entry.url,
                    req.options,
                    policy,
                    self.models,
                )
                await self._attempt(run, meta.id, mark, entry.url, fetch, record)

        try:
            await all_or_none(worker() for _ in range(workers))
            await run.drain()
        finally:
            run.cancel()
            if seeding is not None:
                seeding.cancel()
        pages = self.store.list_len(records.JobKeys(meta.id).pages)
        if pages and pagecache.tracks_changes(req.options):
            await self.record_removed(meta, req.url)
        if pages == 0:
            errors, _ = views.read_errors(self.store, meta.id)
            why = f"{errors[0].code}: {errors[0].message}" if errors else "nothing to crawl"
            await self.commits.finish_when_writable(
                meta.id, "failed", f"the crawl found no page ({why})"
            )
        else:
            await self.commits.finish_when_writable(meta.id, "completed", "")

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

    async def record_removed(self, meta: records.JobMeta, start_url: str) -> None:
        """A change-tracked crawl's end: its ``removed`` URLs (``recording``)."""
        keys = records.JobKeys(meta.id)
        stored: list[str] = []
        for start in range(0, self.store.list_len(keys.pages), 256):
            for raw in self.store.list_range(keys.pages, start, 256):
                stored.append(jobs_pb2.Document.FromString(raw).url)
        group = partial(
            recording.record_removed,
            job_id=meta.id,
            owner=meta.owner,
            start_url=start_url,
            stored=stored,
        )
        await self.commits.write_when_writable(group)
