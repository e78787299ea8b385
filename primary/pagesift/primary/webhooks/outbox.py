"""Signed, durable webhooks: a per-job outbox in the store, and its in-order delivery.

Storage layout (every key carries the job id, so job expiry removes them with the job)
--------------------------------------------------------------------------------------

    KV   job/{id}/webhook       the job's webhook, JSON: {"url", "events": [...], "account",
                                "headers", "metadata", "include_document",
                                "max_document_bytes"} (the last four only when set; the
                                signing secret is NOT stored: ``account`` names it, and
                                the accounts file on each node holds it)
    list job/{id}/outbox        one item per event, JSON {"event", "data", "created_at"};
                                the item's list sequence number is the event's ``seq``;
                                items behind the cursor are dropped as it passes them
    KV   job/{id}/webhook_ack   the delivery cursor, decimal text: every event with a
                                smaller seq was acknowledged (2xx) or given up (job note)

The guarantees, and why they hold
---------------------------------
- **An event exists iff its change was committed.** ``enqueue`` is called by the job
  runtime INSIDE the write group of the change it reports (a page, a page error, a
  state change), so the event and the change are one atomic ``WriteBatch``.
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

The request
-----------
``POST url`` with body ``{"id": job, "seq": n, "event_id", "event": e, "data": {...},
"metadata": {...}, "created_at": RFC 3339}`` (``metadata`` only when the job set some)
and headers ``content-type: application/json``, ``pagesift-event``,
``pagesift-delivery: {job}:{seq}``, ``pagesift-event-id``, ``pagesift-timestamp: <unix s>``,
``pagesift-signature: v1=<hex HMAC-SHA256(secret, f"{timestamp}.{body}")>``, plus the
job's own ``headers`` (validated at job start: none of these names). Receivers check it
with ``verify_signature`` (or its ten lines, in any language).

Payloads: headers, metadata and the document
--------------------------------------------
The job's ``headers`` and ``metadata`` live in its webhook config (``configure``, in the
registration group), not in each outbox item: every event of the job, before or after a
restart or a failover, is sent with the same ones, and an event costs no copy of them.

``include_document``: a ``page`` event's outbox item holds only ``{"index", ...}``, NOT
the document. The Deliverer reads the document at delivery time from the job's pages
list (``job/{id}/pages``, item ``index``; that list is never trimmed while the job
lives, and the page and its event are written in one group) and embeds its JSON
(``MessageToDict`` with the proto field names, as the CLI's ``--json`` shows documents)
as ``data.document``. So the store never holds a document twice: not while the event
waits, and not after. A document whose JSON is larger than ``max_document_bytes`` is
left out: ``data.document_omitted = "too_large"`` with ``data.document_bytes``; the
receiver fetches it with ``GetJob(skip=index, limit=1)``. The cap is the server's
``webhook_max_document_bytes`` WHEN THE JOB STARTED, stored in the job's config, so the
body of an event is a function of stored, immutable data (the outbox item, the config,
the page): a resumed or failed-over delivery sends the same bytes (each POST is signed
with its own timestamp, so every delivery's signature verifies). The body is built once
per event and kept across its retries; for a document it is built off the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import aiohttp
from google.protobuf.json_format import MessageToDict

from pagesift.primary.engine.netguard import AddressGuard, BlockedAddressError, guarded_connector
from pagesift.shared.api.metrics import Metrics
from pagesift.shared.jobs import records as jr
from pagesift.shared.jobs import urls
from pagesift.shared.store.db import Store
from pagesift.shared.store.groups import WriteGroup
from pagesift.shared.util.backoff import backoff_delay
from pagesift.shared.util.loopwake import on_loop
from pagesift.shared.util.tasks import cancel_and_wait_all
from pagesift.v1 import jobs_pb2

__all__ = [
    "NOTE_CODE",
    "Deliverer",
    "WebhookConfig",
    "check_url",
    "configure",
    "default_session_factory",
    "document_json",
    "enqueue",
    "pending",
    "queue_depth",
    "sign",
    "verify_signature",
]

logger = logging.getLogger("pagesift.webhooks")

NOTE_CODE = "webhook_undeliverable"
USER_AGENT = "pagesift-webhooks/0.1"


class Reader(Protocol):
    def get(self, key: str) -> bytes | None: ...


class PageReader(Reader, Protocol):
    def list_items(
        self, name: str, start: int = 0, count: int | None = None
    ) -> list[tuple[int, bytes]]: ...


# configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookConfig:
    url: str
    events: tuple[str, ...]
    account: str
    headers: tuple[tuple[str, str], ...] = ()  # sent with every delivery
    metadata: tuple[tuple[str, str], ...] = ()  # echoed as "metadata" in every body
    include_document: bool = False  # page events embed the document (up to the cap)
    max_document_bytes: int = 0  # the cap on the document's JSON, fixed at job start

    def encode(self) -> bytes:
        doc: dict[str, object] = {
            "url": self.url,
            "events": list(self.events),
            "account": self.account,
        }
        if self.headers:
            doc["headers"] = dict(self.headers)
        if self.metadata:
            doc["metadata"] = dict(self.metadata)
        if self.include_document:
            doc["include_document"] = True
            doc["max_document_bytes"] = self.max_document_bytes
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> WebhookConfig:
        doc = json.loads(raw)
        return cls(
            str(doc["url"]),
            tuple(doc["events"]),
            str(doc["account"]),
            tuple((str(k), str(v)) for k, v in doc.get("headers", {}).items()),
            tuple((str(k), str(v)) for k, v in doc.get("metadata", {}).items()),
            bool(doc.get("include_document", False)),
            int(doc.get("max_document_bytes", 0)),
        )


async def check_url(
    url: str, *, allow_private_networks: bool, max_length: int = 8192
) -> str | None:
    """Why ``url`` cannot be a webhook target (for INVALID_ARGUMENT at job start), or None."""
    problem = urls.validate(url, max_length)
    if problem is not None:
        return problem
    if not allow_private_networks:
        return await urls.blocked_reason(url)
    return None


def configure(
    g: WriteGroup,
    job_id: str,
    url: str,
    events: Sequence[str],
    account: str,
    *,
    headers: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
    include_document: bool = False,
    max_document_bytes: int = 0,
) -> None:
    """Give the job a webhook; call it in the registration group, BEFORE ``enqueue``
    of the ``started`` event (a group reads its own writes). ``headers`` and
    ``metadata`` (validated by the caller: ``validate.webhook_payload``) and the
    document cap are stored with it, so every delivery of the job uses the same."""
    cfg = WebhookConfig(
        url,
        jr.webhook_events(events),
        account,
        tuple(sorted((headers or {}).items())),
        tuple(sorted((metadata or {}).items())),
        include_document,
        max_document_bytes if include_document else 0,
    )
    g.put(jr.JobKeys(job_id).webhook, cfg.encode())


def load_config(reader: Reader, job_id: str) -> WebhookConfig | None:
    raw = reader.get(jr.JobKeys(job_id).webhook)
    return WebhookConfig.decode(raw) if raw is not None else None


def rfc3339_ms(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def enqueue(
    g: WriteGroup, job_id: str, event: str, data: dict[str, object], *, now: float | None = None
) -> int | None:
    """Append ``event`` to the job's outbox inside ``g`` (the group of the change it
    reports). Nothing happens when the job has no webhook or does not want the event.
    Returns the event's seq, or None. Never raises for odd data (``str`` fallback)."""
    if event not in jr.WEBHOOK_EVENTS:
        raise ValueError(f"unknown webhook event {event!r}")
    keys = jr.JobKeys(job_id)
    raw = g.get(keys.webhook)
    if raw is None:
        return None
    if event not in WebhookConfig.decode(raw).events:
        return None
    item = {
        "event_id": uuid.uuid4().hex,
        "event": event,
        "data": data,
        "created_at": rfc3339_ms(time.time() if now is None else now),
    }
    return g.push(keys.outbox, json.dumps(item, separators=(",", ":"), default=str).encode())


def read_ack(reader: Reader, job_id: str) -> int:
    raw = reader.get(jr.JobKeys(job_id).webhook_ack)
    return int(raw) if raw else 0


def pending(store: Store, job_id: str) -> int:
    """Events of the job not yet acknowledged or given up."""
    _, nxt = store.list_bounds(jr.JobKeys(job_id).outbox)
    return max(0, nxt - read_ack(store, job_id))


def queue_depth(store: Store) -> int:
    """Undelivered events over every job (the ``pagesift_webhook_queue_depth`` gauge)."""
    return sum(
        pending(store, job_id)
        for job_id in jr.all_job_ids(store)
        if store.get(jr.JobKeys(job_id).webhook) is not None
    )


# signing ------------------------------------------------------------------------------------


def document_json(doc: jobs_pb2.Document) -> dict[str, object]:
    """A document as a webhook embeds it: the proto JSON mapping with the proto field
    names (``final_url``, ``status_code``, ... as the CLI's ``--json``), empty fields
    left out, timestamps in RFC 3339, enums by name."""
    out: dict[str, object] = MessageToDict(doc, preserving_proto_field_name=True)
    return out


def page_of(pages: PageReader, job_id: str, item: bytes) -> bytes | None:
    """The stored document a page event names (``data.index``), or None: not a page
    event, or (never while the job lives) no such page."""
    doc = json.loads(item)
    index = doc["data"].get("index") if doc["event"] == "page" else None
    if not isinstance(index, int):
        return None
    items = pages.list_items(jr.JobKeys(job_id).pages, index, 1)
    return items[0][1] if items and items[0][0] == index else None


def _with_document(data: dict[str, object], page: bytes | None, cap: int) -> dict[str, object]:
    """``data`` of a page event with the document ``page`` (or why it is left out)."""
    if page is None:
        return {**data, "document_omitted": "gone"}  # not while the job lives
    doc = jobs_pb2.Document()
    doc.ParseFromString(page)
    as_json = document_json(doc)
    size = len(json.dumps(as_json, separators=(",", ":")).encode())  # as embedded
    if size > cap:
        return {**data, "document_omitted": "too_large", "document_bytes": size}
    return {**data, "document": as_json}


def build_body(
    job_id: str,
    seq: int,
    item: bytes,
    cfg: WebhookConfig | None = None,
    page: bytes | None = None,
) -> bytes:
    """The POST body of outbox ``item``: a function of the item, the job's config and
    (``include_document``) the stored page it names (``page_of``), all written once
    and never changed, so every delivery of the event sends the same bytes."""
    doc = json.loads(item)
    data = doc["data"]
    if cfg is not None and cfg.include_document and doc["event"] == "page":
        data = _with_document(data, page, cfg.max_document_bytes)
    body: dict[str, object] = {
        "id": job_id,
        "seq": seq,
        "event_id": doc.get("event_id", ""),
        "event": doc["event"],
        "data": data,
    }
    if cfg is not None and cfg.metadata:
        body["metadata"] = dict(cfg.metadata)
    body["created_at"] = doc["created_at"]
    return json.dumps(body, separators=(",", ":")).encode()


def sign(secret: str, timestamp: int | str, body: bytes) -> str:
    """The ``pagesift-signature`` header value: ``v1=<hex HMAC-SHA256>``."""
    message = str(timestamp).encode() + b"." + body
    return "v1=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str,
    timestamp: int | str,
    body: bytes,
    header: str,
    tolerance_s: float = 300,
    now: float | None = None,
) -> bool:
    """For receivers: True when ``header`` (``pagesift-signature``) signs ``body`` at
    ``timestamp`` (``pagesift-timestamp``) with ``secret``, and the timestamp is within
    ``tolerance_s`` of ``now`` (rejects replays of old deliveries). Pass the RAW body
    bytes as received. Several ``v1=`` values (comma separated) are accepted, so a
    secret can be rotated."""
    text = str(timestamp).strip()
    if not text.isdigit():
        return False
    now = time.time() if now is None else now
    if abs(now - int(text)) > tolerance_s:
        return False
    want = sign(secret, text, body)
    ok = False
    for part in header.replace(" ", ",").split(","):
        if part.startswith("v1="):
            ok = hmac.compare_digest(part.encode(), want.encode()) or ok
    return ok


# delivery -----------------------------------------------------------------------------------

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
        for job_id in jr.all_job_ids(store):
            if store.get(jr.JobKeys(job_id).webhook) is not None and pending(store, job_id) > 0:
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
            items = store.list_items(jr.JobKeys(job_id).outbox, ack, 1)
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
                reason = await urls.blocked_reason(cfg.url)
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
            outbox = jr.JobKeys(job_id).outbox
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
        headers = {
            **dict(cfg.headers),  # the job's own first: none can replace the scheme's below
            "content-type": "application/json",
            "pagesift-event": event,
            "pagesift-delivery": f"{job_id}:{seq}",
            "pagesift-event-id": json.loads(body).get("event_id", ""),
            "pagesift-timestamp": timestamp,
            "pagesift-signature": sign(secret, timestamp, body),
        }
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
        now = jr.now_ms()
        keys = jr.JobKeys(job_id)

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
                        url="", code=NOTE_CODE, message=note, time=jr.timestamp(now)
                    ).SerializeToString(),
                )

        self._store_getter().write(group)

    def _count(self, result: str, n: int = 1) -> None:
        if self._metrics is not None:
            self._metrics.webhook_deliveries.labels(result).inc(n)
