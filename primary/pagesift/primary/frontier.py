"""The crawl frontier in the store: seeding it, admitting links to it, reading it back.

Owns the ``frontier``/``seen``/``seeded`` keys of a crawl job (layout in
``pagesift.shared.jobrecords``); ``jobs.Jobs`` runs the crawl over it. The guarantees:

- ``admit`` queues an entry only if its key was never seen, and never grows the
  frontier past the crawl limit; it writes inside the caller's ``WriteGroup``, so
  admission commits atomically with the page that found the links;
- ``claim_aliases`` marks the other keys of a fetched page (final URL, canonical:
  ``Scope.aliases``) seen and done in the caller's group, or names the key the page
  duplicates when one of them is done already (then nothing is claimed);
- ``seed`` queues the start URL and the sitemap's in-scope URLs in one group that
  also writes the ``seeded`` mark, so a resumed crawl never seeds twice;
- ``Frontier`` hands workers every entry not done yet, in enqueue order, reading the
  store in chunks from a cursor, so memory stays flat however large the crawl grows.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence

from pagesift.primary.crawl import Entry, Scope
from pagesift.primary.engine import Engine, FetchPolicy
from pagesift.shared import jobrecords as jr
from pagesift.shared.store import Store, WriteGroup
from pagesift.v1 import jobs_pb2

__all__ = ["Frontier", "admit", "claim_aliases", "seed"]


def admit(g: WriteGroup, job_id: str, entries: list[Entry], limit: int) -> None:
    """Queue entries whose key was never seen while the frontier is below the crawl limit."""
    keys = jr.JobKeys(job_id)
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
    keys = jr.JobKeys(job_id)
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


async def seed(
    store: Store,
    engine: Engine,
    job_id: str,
    req: jobs_pb2.StartCrawlRequest,
    scope: Scope,
    policy: FetchPolicy,
) -> None:
    """Queue the start URL and the sitemap's URLs, once (``seeded`` marks it); the
    sitemaps are fetched under the job's ``policy`` (its headers, cookies, proxy)."""
    entries: list[Entry] = []
    if req.sitemap != jobs_pb2.SITEMAP_MODE_SKIP:
        found = await engine.sitemap_urls(scope.root, policy)
        entries = await scope.admit({scope.key(u): u for u in found}, 1)  # same scope
    if req.sitemap != jobs_pb2.SITEMAP_MODE_ONLY or not entries:
        start = scope.fetch_form(req.url.partition("#")[0])
        entries.insert(0, Entry(0, scope.key(req.url), start))

    def group(g: WriteGroup) -> None:
        admit(g, job_id, entries, scope.limit)
        g.put(jr.JobKeys(job_id).seeded, b"1")

    store.write(group)


class Frontier:
    """Hands crawl workers the frontier entries not done yet, in enqueue order.

    Entries are read from the store in chunks from a cursor; workers that find
    nothing wait for a page in flight to finish (it may admit new links), and all
    stop when nothing is queued and nothing is in flight.
    """

    CHUNK = 256

    def __init__(self, store: Store, job_id: str) -> None:
        self.store = store
        self.list = jr.JobKeys(job_id).frontier
        self.done = jr.JobKeys(job_id).done
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
