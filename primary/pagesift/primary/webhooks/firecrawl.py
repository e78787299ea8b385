"""Firecrawl-shaped webhooks: the body, headers and signature of one outbox event.

A job whose webhook asks for ``WEBHOOK_FORMAT_FIRECRAWL`` (the gateway asks for it for
Firecrawl's ``webhook`` option) keeps pagesift's outbox, cursor, retries and order
(``pagesift.primary.webhooks.outbox``, ``delivery``); only what one POST carries differs.
This module maps one stored event to that POST, as Firecrawl's API server sends it
(``apps/api/src/services/webhook/``):

    {"success", "type": "<crawl|batch_scrape>.<started|page|completed|failed>", "id",
     "webhookId", "data": [...], "error"?, "metadata": {...}}

signed with ``X-Firecrawl-Signature: sha256=<hex HMAC-SHA256(secret, raw body)>``.

Invariants
----------
- Pure: the body is a function of the stored event, the job's config and the stored
  page, so a retried, resumed or failed-over delivery sends the same bytes (and, with
  no timestamp in it, the same signature). ``webhookId`` is the event's id, fixed when
  it was enqueued: receivers deduplicate on it, as Firecrawl documents.
- A page event carries the page in Firecrawl's document shape
  (``pagesift.core.jobs.firecrawlshape.document``, what the gateway answers); past the
  config's document cap it carries the document's metadata only, marked
  ``documentOmitted``. ``cancelled`` is sent as ``<kind>.failed`` (Firecrawl's documented
  event for a failed or cancelled crawl); ``page_failed`` has no Firecrawl event and is
  never enqueued for such a webhook (``outbox.configure``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Mapping
from typing import Any

from pagesift.core.jobs.firecrawlshape import document, metadata
from pagesift.v1 import jobs_pb2

__all__ = [
    "EVENTS",
    "SIGNATURE_HEADER",
    "body",
    "headers",
    "prefix",
    "sign",
    "verify_signature",
]

SIGNATURE_HEADER = "X-Firecrawl-Signature"

#: pagesift event -> (Firecrawl's event suffix, ``success``); the events a
#: Firecrawl-shaped webhook enqueues (``page_failed`` has no Firecrawl event)
EVENTS: dict[str, tuple[str, bool]] = {
    "started": ("started", True),
    "page": ("page", True),
    "completed": ("completed", True),
    "failed": ("failed", False),
    "cancelled": ("failed", False),
}

_PREFIX = {"crawl": "crawl", "batch": "batch_scrape"}


def prefix(kind: str) -> str:
    """Firecrawl's event namespace of a job kind (``crawl``, ``batch`` -> ``batch_scrape``)."""
    return _PREFIX.get(kind, kind)


def _webhook_id(event_id: str) -> str:
    try:
        return str(uuid.UUID(hex=event_id))  # Firecrawl's webhookId is a UUID
    except ValueError:
        return event_id


def _page(page: bytes | None, index: object, cap: int) -> list[dict[str, Any]]:
    if page is None:
        return []  # not while the job lives (the page and its event are one group)
    doc = jobs_pb2.Document()
    doc.ParseFromString(page)
    out = document(doc)
    size = len(json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode())
    if cap and size > cap:
        meta = {**metadata(doc), "documentOmitted": "too_large", "documentBytes": size}
        out = {"metadata": {**meta, "pageIndex": index}}
    return [out]


def _error(event: str, data: Mapping[str, Any]) -> str:
    note = str(data.get("note") or "")
    if event == "cancelled":
        return f"cancelled: {note}" if note else "cancelled"
    return note or event


def body(
    job_id: str,
    kind: str,
    item: Mapping[str, Any],
    meta: Mapping[str, str],
    page: bytes | None = None,
    cap: int = 0,
) -> bytes:
    """The POST body of the decoded outbox ``item`` of job ``job_id`` (``kind``: the
    job's kind), with the config's ``meta`` and (page events) the stored ``page``,
    whose Firecrawl JSON is embedded when at most ``cap`` bytes (0: no cap)."""
    event = str(item["event"])
    suffix, success = EVENTS[event]
    data = item.get("data") or {}
    out: dict[str, Any] = {
        "success": success,
        "type": f"{prefix(kind)}.{suffix}",
        "id": job_id,
        "webhookId": _webhook_id(str(item.get("event_id", ""))),
        "data": _page(page, data.get("index"), cap) if event == "page" else [],
    }
    if not success:
        out["error"] = _error(event, data)
    out["metadata"] = dict(meta)
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()


def sign(secret: str, raw: bytes) -> str:
    """The ``X-Firecrawl-Signature`` value: ``sha256=<hex HMAC-SHA256(secret, raw)>``."""
    return "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


def verify_signature(secret: str, raw: bytes, header: str) -> bool:
    """For receivers: True when ``header`` (``X-Firecrawl-Signature``) signs the RAW
    body ``raw`` with ``secret``."""
    return hmac.compare_digest(header.strip().encode(), sign(secret, raw).encode())


def headers(job_headers: Mapping[str, str], raw: bytes, secret: str) -> dict[str, str]:
    """One POST's headers: the job's own, then the content type and the signature
    (names the job's headers may not use: ``specs.webhook`` refuses them)."""
    return {
        **job_headers,
        "content-type": "application/json",
        SIGNATURE_HEADER: sign(secret, raw),
    }
