"""Webhook delivery: every job's outbox POSTed in order, one event in flight per job.

``Deliverer`` walks each job's outbox (``pagesift.primary.webhooks.outbox``: the layout,
the event bodies, the signature) from its cursor, on the primary only.

The guarantees, and why they hold
---------------------------------
- **In order, one in flight per job.** One task per job walks the outbox from the
  cursor; it POSTs event ``seq`` and only after a 2xx (or giving up) moves to ``seq+1``.
- **An acknowledged event is never sent again.** After a 2xx the cursor is written
  (``store.write``) before the next event is read, and that write replicates like any
  other; a restart or a promoted standby resumes from the cursor (``resume``).
- **None is lost.** The cursor only passes an event after a 2xx, or after
  ``max_attempts`` failures, and then a job note (``code = "webhook_undeliverable"``,
  naming the seq) is written IN THE SAME GROUP as the cursor move, so every event is
  either acknowledged or visible in GetJobErrors. A reason that holds for every event
  of the job (the address guard refuses the URL, the account has no secret) gives up
  all the events pending at that moment with ONE note naming the seq range.
- At-least-once at the edge: an event POSTed but not yet acknowledged when the process
  stops (or before the cursor write reached the standby, on failover) is sent again.
  Receivers deduplicate on ``pagesift-event-id`` (a random id fixed when the event is
  enqueued). Not on ``{job}:{seq}``: in async replication, events the standby never
  received are undone by a failover, and the new primary may issue different events
  under the same seq (in sync mode nothing is POSTed before it replicated).
- **The address guard** applies: unless ``allow_private_networks``, a URL whose host
  is (or resolves to) a loopback, private, link-local or metadata address is refused
  (checked before each event, and again at connect time by the default session's
  ``netguard.guarded_connector``: its resolver judges every address of a name and its
  socket factory the exact address each socket connects to, so neither DNS rebinding
  nor a host spelling can slip past); redirects are not followed. The URL is POSTed
  in ``urls.fetch_url`` form (canonical host, no userinfo, so no Basic auth).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable

import aiohttp

from pagesift.core.api.metrics import Metrics
from pagesift.core.jobs import blockedaddresses, records, urls
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.core.util.backoff import backoff_delay
from pagesift.core.util.loopwake import on_loop
from pagesift.core.util.tasks import cancel_and_wait_all
from pagesift.primary.engine.netguard import AddressGuard, BlockedAddressError, guarded_connector
from pagesift.primary.webhooks.outbox import (
    NOTE_CODE,
    WebhookConfig,
    build_body,
    delivery_headers,
    load_config,
    page_of,
    pending,
    read_ack,
)
from pagesift.v1 import jobs_pb2

__all__ = ["Deliverer", "SessionFactory", "default_session_factory"]

logger = logging.getLogger("pagesift.webhooks")

USER_AGENT = "pagesift-webhooks/0.1"

SessionFactory = Callable[[], aiohttp.ClientSession]


def default_session_factory(
    *, allow_private_networks: bool, user_agent: str = USER_AGENT
) -> SessionFactory:
    """aiohttp sessions whose connector refuses blocked addresses (unless allowed)."""

    def make() -> aiohttp.ClientSession:
        connector = guarded_connector(None if allow_private_networks else AddressGuard(), limit=64)
        return aiohttp.ClientSession(
            connector=connector, headers={"user-agent": user_agent}, trust_env=False
        )

    return make


class _GiveUp(Exception):
    def __init__(self, reason: str, *, every_pending: bool = False) -> None:
        super().__init__(reason)
        self.every_pending = every_pending


class Deliverer:
    """Delivers every job's outbox, in order, one event in flight per job.

    ``store_getter`` is called at each use (a standby's resync may replace the store).
    ``secret_for(account)`` returns the account's webhook secret (None: deliveries of
    that account become job notes). ``session_factory`` makes the aiohttp session
    (None: ``default_session_factory``). Run it on the primary only: ``start`` resumes
    every job with undelivered events; call ``wake(job_id)`` after a commit that
    enqueued events; ``close`` stops at once (an unacknowledged event in flight is
    sent again by the next Deliverer).

    ``wait_replicated()`` (sync replication; None otherwise) returns once everything
    committed so far has reached the standby, or the primary stopped waiting for it
    (degraded to async). Each event is POSTed only after it returned, so in sync mode a
    receiver never hears of a change that a failover could undo, exactly as GetJob and
    WatchJob never show a page before it replicated.
    """

    def __init__(
        self,
        store_getter: Callable[[], Store],
        session_factory: SessionFactory | None,
        *,
        secret_for: Callable[[str], str | None],
        allow_private_networks: bool,
        max_attempts: int = 8,
        base_delay: float = 0.5,
        max_delay: float = 30.0,
        timeout: float = 10.0,
        max_in_flight: int = 32,
        poll_interval: float = 10.0,
        metrics: Metrics | None = None,
        rng: Callable[[], float] = random.random,
        wait_replicated: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._store_getter = store_getter
        self._session_factory = session_factory or default_session_factory(
            allow_private_networks=allow_private_networks
        )
        self._secret_for = secret_for
        self.allow_private_networks = allow_private_networks
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.timeout = timeout
        self.poll_interval = poll_interval
        self._metrics = metrics
        self._rng = rng
        self._wait_replicated = wait_replicated
        self._sem = asyncio.Semaphore(max_in_flight)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._poller: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # life cycle ---------------------------------------------------------------------------
    async def start(self) -> int:
        """Open the session and resume every job with undelivered events; returns how many."""
        if self._closed:
            raise RuntimeError("a closed Deliverer cannot start again; make a new one")
        self._loop = asyncio.get_running_loop()
        if self._session is None:
            self._session = self._session_factory()
        n = self.resume()
        if self.poll_interval > 0 and self._poller is None:
            self._poller = asyncio.create_task(self._poll(), name="webhooks-poll")
        return n

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks.values())
        if self._poller is not None:
            tasks.append(self._poller)
        await cancel_and_wait_all(tasks)  # a cancel of close() itself still propagates
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def resume(self) -> int:
        """Wake every job whose cursor is behind its outbox; returns how many."""
        store = self._store_getter()
        n = 0
        for job_id in records.all_job_ids(store):
            if (
                store.get(records.JobKeys(job_id).webhook) is not None
                and pending(store, job_id) > 0
            ):
                self.wake(job_id)
                n += 1
        return n

    def wake(self, job_id: str) -> None:
        """Deliver the job's new events (safe to call from any thread, any number of times)."""
        if self._closed or self._loop is None:
            return
        on_loop(self._loop, self._wake_on_loop, job_id)

    def _wake_on_loop(self, job_id: str) -> None:
        if self._closed:
            return
        self._dirty.add(job_id)
        if job_id not in self._tasks:
            self._tasks[job_id] = asyncio.create_task(self._run(job_id), name=f"webhook-{job_id}")

    @property
    def delivering(self) -> int:
        """Jobs with a delivery task right now."""
        return len(self._tasks)

    async def _poll(self) -> None:
        """A safety net: a job woken by nobody is still delivered within ``poll_interval``."""
        while not self._closed:
            await asyncio.sleep(self.poll_interval)
            try:
                self.resume()
            except Exception:
                logger.exception("webhooks: resume scan failed")

    # one job ---------------------------------------------------------------------------------
    async def _run(self, job_id: str) -> None:
        try:
            while not self._closed:
                self._dirty.discard(job_id)
                await self._drain(job_id)
                if job_id not in self._dirty:
                    return  # no await between this check and leaving: no wake-up is lost
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("webhooks: delivery for job %s stopped", job_id)
        finally:
            if self._tasks.get(job_id) is asyncio.current_task():
                del self._tasks[job_id]

    async def _drain(self, job_id: str) -> None:
        while not self._closed:
            store = self._store_getter()
            cfg = load_config(store, job_id)
            if cfg is None:
                return  # expired, or no webhook
            ack = read_ack(store, job_id)
            items = store.list_items(records.JobKeys(job_id).outbox, ack, 1)
            if not items:
                return
            seq, item = items[0]
            if self._wait_replicated is not None:
                # the item is committed, so "everything committed so far" covers it
                await self._wait_replicated()
            await self._deliver(job_id, cfg, seq, item)

    async def _deliver(self, job_id: str, cfg: WebhookConfig, seq: int, item: bytes) -> None:
        event = str(json.loads(item)["event"])
        host = urls.host_of(cfg.url) or cfg.url
        try:
            if not self.allow_private_networks:
                reason = await blockedaddresses.blocked_reason(cfg.url)
                if reason is not None:
                    raise BlockedAddressError(reason)
            secret = self._secret_for(cfg.account)
            if not secret:
                raise _GiveUp(f"account {cfg.account!r} has no webhook_secret", every_pending=True)
            if cfg.include_document and event == "page":  # read here, decoded off the loop
                page = page_of(self._store_getter(), job_id, item)
                body = await asyncio.to_thread(build_body, job_id, seq, item, cfg, page)
            else:
                body = build_body(job_id, seq, item, cfg)
            last = ""
            for attempt in range(1, self.max_attempts + 1):
                async with self._sem:
                    ok, last = await self._post(cfg, job_id, seq, event, body, secret)
                if ok:
                    self._count("ok")
                    self._advance(job_id, seq, None)
                    return
                self._count("error")
                logger.info(
                    "webhook %s:%d to %s: attempt %d/%d failed: %s",
                    job_id, seq, host, attempt, self.max_attempts, last,
                )  # fmt: skip
                if attempt < self.max_attempts:
                    delay = backoff_delay(  # attempt 1 failed: the first retry (0)
                        attempt - 1, base=self.base_delay, cap=self.max_delay, jitter=self._rng()
                    )
                    await asyncio.sleep(delay)
            raise _GiveUp(f"no 2xx after {self.max_attempts} attempt(s); last: {last}")
        except BlockedAddressError as e:  # the URL's host, or the address _post dialled
            self._count("blocked")
            why = _GiveUp(f"refused by the address guard: {e}", every_pending=True)
            self._give_up(job_id, seq, event, host, why)
        except _GiveUp as why:
            self._give_up(job_id, seq, event, host, why)

    def _give_up(self, job_id: str, seq: int, event: str, host: str, why: _GiveUp) -> None:
        # a reason that holds for every event of the job (the URL is refused, there is
        # no secret) gives up every pending event with ONE note, not one note each
        last_seq = seq
        if why.every_pending:
            outbox = records.JobKeys(job_id).outbox
            last_seq = max(seq, self._store_getter().list_bounds(outbox)[1] - 1)
        what = (
            f"webhook event {seq} ({event})"
            if last_seq == seq
            else f"webhook events {seq}-{last_seq} (from {event})"
        )
        message = f"{what} to {host} not delivered: {why}"
        logger.warning("job %s: %s", job_id, message)
        self._count("undeliverable", last_seq - seq + 1)
        self._advance(job_id, last_seq, message)

    async def _post(
        self, cfg: WebhookConfig, job_id: str, seq: int, event: str, body: bytes, secret: str
    ) -> tuple[bool, str]:
        """One attempt: (True, "") on a 2xx, else (False, what went wrong). Raises
        ``BlockedAddressError`` when the address guard refused the connection (not an
        attempt that failed: no retry can pass it)."""
        session = self._session
        if session is None:
            raise RuntimeError("Deliverer.start() was not awaited")
        url = cfg.url
        timestamp = str(int(time.time()))
        headers = delivery_headers(cfg, job_id, seq, event, body, secret, timestamp)
        try:
            target = urls.fetch_url(url)
        except ValueError as e:
            return False, f"invalid URL: {e}"
        try:
            async with session.post(
                target,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as resp:
                if 200 <= resp.status < 300:
                    return True, ""
                return False, f"HTTP {resp.status}"
        except aiohttp.ClientConnectorError as e:
            if isinstance(e.os_error, BlockedAddressError):
                raise e.os_error from e
            return False, f"connect: {e.os_error or e}"
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return False, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

    def _advance(self, job_id: str, seq: int, note: str | None) -> None:
        """Move the cursor past ``seq`` (with the job note when given up) and drop the
        events it passed, one group. Written only while the job and its webhook exist
        (an expired job stays gone), and never backwards."""
        now = records.now_ms()
        keys = records.JobKeys(job_id)

        def group(g: WriteGroup) -> None:
            if g.get(keys.webhook) is None or g.get(keys.meta) is None:
                return  # the job expired meanwhile: write nothing, leave no stray key
            if read_ack(g, job_id) > seq:
                return
            g.put(keys.webhook_ack, str(seq + 1).encode())
            g.trim_front(keys.outbox, seq + 1)  # delivered or given up: not kept
            if note is not None:
                g.push(
                    keys.notes,
                    jobs_pb2.PageError(
                        url="", code=NOTE_CODE, message=note, time=records.timestamp(now)
                    ).SerializeToString(),
                )

        self._store_getter().write(group)

    def _count(self, result: str, n: int = 1) -> None:
        if self._metrics is not None:
            self._metrics.webhook_deliveries.labels(result).inc(n)
