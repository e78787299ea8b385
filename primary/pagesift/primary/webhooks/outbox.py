"""Webhooks: the per-job outbox in the store, and what each event's POST carries.

The job runtime records events here (``configure``, ``enqueue``, both inside the write
group of the change they report); ``pagesift.primary.webhooks.delivery`` POSTs them.
Nothing here POSTs: the body (``build_body``) and its signature (``sign``, and
``verify_signature`` for receivers) are functions of stored data.

Storage layout (every key carries the job id, so job expiry removes them with the job)
--------------------------------------------------------------------------------------

    KV   job/{id}/webhook       the job's webhook, JSON: {"url", "events": [...], "account",
                                "headers", "metadata", "include_document",
                                "max_document_bytes", "format", "kind"} (the last six
                                only when set; the
                                signing secret is NOT stored: ``account`` names it, and
                                the accounts file on each node holds it)
    list job/{id}/outbox        one item per event, JSON {"event", "data", "created_at"};
                                the item's list sequence number is the event's ``seq``;
                                items behind the cursor are dropped as it passes them
    KV   job/{id}/webhook_ack   the delivery cursor, decimal text: every event with a
                                smaller seq was acknowledged (2xx) or given up (job note)

The guarantee this module holds
------------------------------
- **An event exists iff its change was committed.** ``enqueue`` is called by the job
  runtime INSIDE the write group of the change it reports (a page, a page error, a
  state change), so the event and the change are one atomic ``WriteBatch``.

The request
-----------
``POST url`` with body ``{"id": job, "seq": n, "event_id", "event": e, "data": {...},
"metadata": {...}, "created_at": RFC 3339}`` (``metadata`` only when the job set some)
and headers ``content-type: application/json``, ``pagesift-event``,
``pagesift-delivery: {job}:{seq}``, ``pagesift-event-id``, ``pagesift-timestamp: <unix s>``,
``pagesift-signature: v1=<hex HMAC-SHA256(secret, f"{timestamp}.{body}")>``, plus the
job's own ``headers`` (validated at job start: none of these names). Receivers check it
with ``verify_signature`` (or its ten lines, in any language). A webhook of ``format``
FIRECRAWL sends Firecrawl's body and signature instead (``pagesift.primary.webhooks.firecrawl``).

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

import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from google.protobuf.json_format import MessageToDict

from pagesift.core.jobs import blockedaddresses, records, urls
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.primary.webhooks import firecrawl
from pagesift.v1 import jobs_pb2

__all__ = [
    "FIRECRAWL",
    "NOTE_CODE",
    "PAGESIFT",
    "WebhookConfig",
    "check_url",
    "configure",
    "delivery_headers",
    "document_json",
    "enqueue",
    "pending",
    "queue_depth",
    "sign",
    "verify_signature",
]

logger = logging.getLogger("pagesift.webhooks")

NOTE_CODE = "webhook_undeliverable"
PAGESIFT, FIRECRAWL = "pagesift", "firecrawl"  # WebhookConfig.format


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
    format: str = PAGESIFT  # the deliveries' shape: PAGESIFT or FIRECRAWL
    kind: str = ""  # the job's kind (Firecrawl's event namespace); FIRECRAWL only

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
        if self.format != PAGESIFT:
            doc["format"] = self.format
            doc["kind"] = self.kind
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
            str(doc.get("format", PAGESIFT)),
            str(doc.get("kind", "")),
        )


async def check_url(
    url: str, *, allow_private_networks: bool, max_length: int = 8192
) -> str | None:
    """Why ``url`` cannot be a webhook target (for INVALID_ARGUMENT at job start), or None."""
    problem = urls.validate(url, max_length)
    if problem is not None:
        return problem
    if not allow_private_networks:
        return await blockedaddresses.blocked_reason(url)
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
    format: str = PAGESIFT,
    kind: str = "",
) -> None:
    """Give the job a webhook; call it in the registration group, BEFORE ``enqueue``
    of the ``started`` event (a group reads its own writes). ``headers`` and
    ``metadata`` (validated by the caller: ``validate.webhook_payload``) and the
    document cap are stored with it, so every delivery of the job uses the same.
    ``format`` FIRECRAWL (``kind``: the job's kind) always embeds the document and
    keeps only the events Firecrawl has (``firecrawl.EVENTS``: no ``page_failed``)."""
    wanted = records.webhook_events(events)
    if format == FIRECRAWL:
        wanted = tuple(e for e in wanted if e in firecrawl.EVENTS)
        include_document = True
    elif format != PAGESIFT:
        raise ValueError(f"unknown webhook format {format!r}")
    cfg = WebhookConfig(
        url,
        wanted,
        account,
        tuple(sorted((headers or {}).items())),
        tuple(sorted((metadata or {}).items())),
        include_document,
        max_document_bytes if include_document else 0,
        format,
        kind if format == FIRECRAWL else "",
    )
    g.put(records.JobKeys(job_id).webhook, cfg.encode())


def load_config(reader: Reader, job_id: str) -> WebhookConfig | None:
    raw = reader.get(records.JobKeys(job_id).webhook)
    return WebhookConfig.decode(raw) if raw is not None else None


def rfc3339_ms(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def enqueue(
    g: WriteGroup, job_id: str, event: str, data: dict[str, object], *, now: float | None = None
) -> int | None:
    """Append ``event`` to the job's outbox inside ``g`` (the group of the change it
    reports). Nothing happens when the job has no webhook or does not want the event.
    Returns the event's seq, or None. Never raises for odd data (``str`` fallback)."""
    if event not in records.WEBHOOK_EVENTS:
        raise ValueError(f"unknown webhook event {event!r}")
    keys = records.JobKeys(job_id)
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
    raw = reader.get(records.JobKeys(job_id).webhook_ack)
    return int(raw) if raw else 0


def pending(store: Store, job_id: str) -> int:
    """Events of the job not yet acknowledged or given up."""
    _, nxt = store.list_bounds(records.JobKeys(job_id).outbox)
    return max(0, nxt - read_ack(store, job_id))


def queue_depth(store: Store) -> int:
    """Undelivered events over every job (the ``pagesift_webhook_queue_depth`` gauge)."""
    return sum(
        pending(store, job_id)
        for job_id in records.all_job_ids(store)
        if store.get(records.JobKeys(job_id).webhook) is not None
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
    items = pages.list_items(records.JobKeys(job_id).pages, index, 1)
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
    if cfg is not None and cfg.format == FIRECRAWL:
        meta = dict(cfg.metadata)
        return firecrawl.body(job_id, cfg.kind, doc, meta, page, cfg.max_document_bytes)
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


def delivery_headers(
    cfg: WebhookConfig, job_id: str, seq: int, event: str, body: bytes, secret: str, timestamp: str
) -> dict[str, str]:
    """One POST's headers in the config's format: the job's own first, then the
    scheme's (which none of the job's may name: ``specs.webhook``)."""
    if cfg.format == FIRECRAWL:
        return firecrawl.headers(dict(cfg.headers), body, secret)
    return {
        **dict(cfg.headers),
        "content-type": "application/json",
        "pagesift-event": event,
        "pagesift-delivery": f"{job_id}:{seq}",
        "pagesift-event-id": json.loads(body).get("event_id", ""),
        "pagesift-timestamp": timestamp,
        "pagesift-signature": sign(secret, timestamp, body),
    }


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
