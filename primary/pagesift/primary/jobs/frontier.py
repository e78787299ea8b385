"""The crawl frontier in the store: seeding it, admitting links to it, reading it back.

Owns the ``frontier``/``seen``/``seeded`` keys of a crawl job (layout in
``pagesift.core.jobs.records``); ``jobs.Jobs`` runs the crawl over it. The guarantees:

- ``admit`` queues an entry only if its key was never seen, and never grows the
  frontier past the crawl limit; it writes inside the caller's ``WriteGroup``, so
  admission commits atomically with the page that found the links;
- ``claim_aliases`` marks the other keys of a fetched page (final URL, canonical:
  ``Scope.aliases``) seen and done in the caller's group, or names the key the page
  duplicates when one of them is done already (then nothing is claimed);
- seeding (issue 19, finding 10: discovery has a time bound) is two steps, so the
  crawl starts at once and sitemaps arrive while its pages are fetched:
  ``seed_start`` queues the start URL in the group that writes ``seeded = SEEDING``
  (``SEEDED`` at once when the crawl skips sitemaps), before any sitemap is fetched;
  then ``seed_sitemaps`` admits the sitemaps' in-scope URLs batch by batch as they
  are parsed (each batch one group; ``admit`` skips every key already seen), for at
  most ``crawl_seed_timeout`` seconds or until the frontier holds the crawl limit,
  and writes ``seeded = SEEDED`` at the end (with
  the start URL in ``SITEMAP_MODE_ONLY`` when the frontier is still empty: there the
  start URL is only the fallback). A crash between the two steps or during the
  second neither loses nor duplicates the start URL: it is in the frontier, with its
  ``seen`` mark, from the first group on, and ``seed_start`` writes nothing once
  ``seeded`` exists. On resume with ``seeded = SEEDING`` the sitemap step runs
  again, from the first file, under a fresh deadline (it does not just mark seeding
  done): re-admitting what the lost run admitted is a no-op (``seen``), so nothing is
  queued twice, and the URLs the lost run had not reached yet are not lost. A
  sitemap that crashes the node on every run is the quarantine's business (a job
  that took the node down is paused, not resumed: issue 19, point 4). While the
  sitemap step runs it counts as a page in flight (``Frontier.in_flight``, as
  ``jobs`` runs it), so workers that run dry wait for its batches (``Frontier.wake``)
  instead of finishing the crawl;
- ``Frontier`` hands workers every entry not done yet, in enqueue order, reading the
  store in chunks from a cursor, so memory stays flat however large the crawl grows.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

from pagesift.core.jobs import records
from pagesift.core.jobs.scope import Entry, Scope
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.primary.engine.interface import Engine, FetchPolicy
from pagesift.v1 import jobs_pb2

__all__ = [
    "SEEDED",
    "SEEDING",
    "Frontier",
    "admit",
    "claim_aliases",
    "seed_sitemaps",
    "seed_start",
    "seed_state",
    "sitemap_stream",
]


def admit(g: WriteGroup, job_id: str, entries: list[Entry], limit: int) -> None:
    """Queue entries whose key was never seen while the frontier is below the crawl limit."""
    keys = records.JobKeys(job_id)
    frontier, seen = keys.frontier, keys.seen
    size = g.list_len(frontier)
    for entry in entries:
        if limit and size >= limit:
            return
        if g.insert(seen, entry.key.encode()):
            g.push(frontier, entry.encode())
            size += 1


def claim_aliases(
    g: WriteGroup, job_id: str, aliases: Sequence[str]
) -> tuple[str | None, list[str]]:
    """Inside a page's write group: ``(done_alias, [])`` when an alias is done already
    (the page duplicates the one recorded under it; nothing written); else
    ``(None, queued)`` after marking every alias seen (never queued from now on) and
    done (a queued entry for it is skipped), where ``queued`` are the aliases that
    were in the frontier and not done: the caller records them as duplicates, so
    every frontier entry still ends as exactly one document or one error."""
    keys = records.JobKeys(job_id)
    for alias in aliases:
        if g.contains(keys.done, alias.encode()):
            return alias, []
    queued: list[str] = []
    for alias in aliases:
        raw = alias.encode()
        if not g.insert(keys.seen, raw):
            queued.append(alias)  # seen and not done: an entry waits in the frontier
        g.insert(keys.done, raw)
    return None, queued


SEEDING = b"start"  # ``seeded``: the start URL is queued, the sitemaps not all read
SEEDED = b"1"  # ``seeded``: seeding is over (the value a crawl had before: resumes as done)
_MAX_SEED_GROUP = 1 << 20  # bytes of entries one sitemap group carries at most


async def sitemap_stream(
    engine: Engine, root: str, policy: FetchPolicy
) -> AsyncGenerator[list[str], None]:
    """The sitemap URLs of ``root``'s site in batches, as the engine parses them; closing
    this generator closes the engine's (no sitemap read outlives its reader)."""
    async with contextlib.aclosing(engine.sitemap_batches(root, policy)) as batches:
        async for batch in batches:
            yield batch


def seed_state(store: Store, job_id: str) -> bytes | None:
    """None (not seeded), ``SEEDING`` or ``SEEDED``."""
    return store.get(records.JobKeys(job_id).seeded)


def _start_entry(req: jobs_pb2.StartCrawlRequest, scope: Scope) -> Entry:
    return Entry(0, scope.key(req.url), scope.fetch_form(req.url.partition("#")[0]))


def seed_start(store: Store, job_id: str, req: jobs_pb2.StartCrawlRequest, scope: Scope) -> bool:
    """Queue the start URL (not in ``SITEMAP_MODE_ONLY``) in the group that marks the
    crawl ``SEEDING`` (``SEEDED`` when it skips sitemaps); nothing once ``seeded``
    exists. Returns whether the sitemaps are still to be read (``seed_sitemaps``)."""
    keys = records.JobKeys(job_id)
    mode = req.sitemap

    def group(g: WriteGroup) -> bool:
        state = g.get(keys.seeded)
        if state is None:
            if mode != jobs_pb2.SITEMAP_MODE_ONLY:
                admit(g, job_id, [_start_entry(req, scope)], scope.limit)
            state = SEEDED if mode == jobs_pb2.SITEMAP_MODE_SKIP else SEEDING
            g.put(keys.seeded, state)
        return state == SEEDING

    return store.write(group).result


async def seed_sitemaps(
    store: Store,
    engine: Engine,
    job_id: str,
    req: jobs_pb2.StartCrawlRequest,
    scope: Scope,
    policy: FetchPolicy,
    timeout: float,
    wake: Callable[[], None] = lambda: None,
) -> int:
    """Admit the sitemap URLs in scope as they are parsed, for at most ``timeout``
    seconds, then mark the crawl ``SEEDED`` (module docstring); ``wake()`` after each
    group that queued something. Returns how many entries were queued. Sitemaps are
    fetched under the job's ``policy`` (its headers, cookies, proxy)."""
    keys = records.JobKeys(job_id)
    queued = 0

    full = False

    def group_of(entries: list[Entry]) -> Callable[[WriteGroup], int]:
        def group(g: WriteGroup) -> int:
            nonlocal full
            if g.get(keys.meta) is None:
                full = True  # the job is gone: nothing more to queue
                return 0
            before = g.list_len(keys.frontier)
            admit(g, job_id, entries, scope.limit)
            after = g.list_len(keys.frontier)
            full = bool(scope.limit) and after >= scope.limit
            return after - before

        return group

    try:
        async with asyncio.timeout(timeout):
            stream = sitemap_stream(engine, scope.root, policy)
            async with contextlib.aclosing(stream) as batches:
                async for batch in batches:
                    entries = await scope.admit({scope.key(u): u for u in batch}, 1)
                    for part in _by_size(entries):
                        added = store.write(group_of(part)).result
                        if added:
                            queued += added
                            wake()
                    if full:
                        break  # the crawl limit is reached: reading on is waste
    except TimeoutError:
        pass  # what arrived in time is queued; the crawl goes on without the rest

    def finish(g: WriteGroup) -> int:
        if g.get(keys.meta) is None:
            return 0
        added = 0
        if req.sitemap == jobs_pb2.SITEMAP_MODE_ONLY and g.list_len(keys.frontier) == 0:
            admit(g, job_id, [_start_entry(req, scope)], scope.limit)  # the fallback
            added = g.list_len(keys.frontier)
        g.put(keys.seeded, SEEDED)
        return added

    added = store.write(finish).result
    if added:
        wake()
    return queued + added


def _by_size(entries: list[Entry]) -> list[list[Entry]]:
    """``entries`` cut in parts of at most ``_MAX_SEED_GROUP`` encoded bytes."""
    parts: list[list[Entry]] = []
    size = 0
    for entry in entries:
        weight = 2 * len(entry.key) + len(entry.url) + 8  # frontier entry + seen key
        if not parts or size + weight > _MAX_SEED_GROUP:
            parts.append([])
            size = 0
        parts[-1].append(entry)
        size += weight
    return parts


class Frontier:
    """Hands crawl workers the frontier entries not done yet, in enqueue order.

    Entries are read from the store in chunks from a cursor; workers that find
    nothing wait for a page in flight to finish (it may admit new links), and all
    stop when nothing is queued and nothing is in flight.
    """

    CHUNK = 256

    def __init__(self, store: Store, job_id: str) -> None:
        self.store = store
        self.list = records.JobKeys(job_id).frontier
        self.done = records.JobKeys(job_id).done
        self.cursor = 0
        self.buffer: deque[Entry] = deque()
        self.in_flight = 0
        self.changed = asyncio.Event()

    def _next(self) -> Entry | None:
        while True:
            while self.buffer:
                entry = self.buffer.popleft()
                if not self.store.set_contains(self.done, entry.key.encode()):
                    return entry
            items = self.store.list_items(self.list, self.cursor, self.CHUNK)
            if not items:
                return None
            self.cursor = items[-1][0] + 1
            self.buffer.extend(Entry.decode(raw) for _, raw in items)

    def wake(self) -> None:
        """Something was queued: waiting workers look again."""
        self.changed.set()

    async def entries(self) -> AsyncIterator[Entry]:
        while True:
            entry = self._next()
            if entry is None:
                if self.in_flight == 0:
                    self.changed.set()  # wake the others so they stop too
                    return
                self.changed.clear()
                await self.changed.wait()
                continue
            self.in_flight += 1
            try:
                yield entry
            finally:
                self.in_flight -= 1
                self.changed.set()
