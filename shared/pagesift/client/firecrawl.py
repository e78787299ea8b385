"""Firecrawl's shape of pagesift's documents and job states, for every Firecrawl-facing part.

What it owns
------------
``document(doc)``: a proto ``Document`` as Firecrawl's document dict (the formats it
carries, ``screenshot`` as a data URL, and ``metadata``); ``metadata(doc)``: Firecrawl's
``metadata`` (the page's own meta tags, ``og:title`` also as ``ogTitle``, then the fields
Firecrawl names, which win); ``STATES``: JobState -> Firecrawl status.

Who uses it: the HTTP gateway (``pagesift.gateway``) for its answers, and the node's
webhook delivery for Firecrawl-shaped webhooks, so both speak the same shape.

Invariants
----------
Pure: no I/O, no clock; it reads only the message it is given (tests/test_gateway_translate.py).
"""

from __future__ import annotations

import base64
import re
from typing import Any

from pagesift.v1 import jobs_pb2

__all__ = ["STATES", "document", "metadata"]

#: JobState -> Firecrawl status (a paused job is not finished: still "scraping")
STATES: dict[int, str] = {
    jobs_pb2.JOB_STATE_SCRAPING: "scraping",
    jobs_pb2.JOB_STATE_PAUSED: "scraping",
    jobs_pb2.JOB_STATE_COMPLETED: "completed",
    jobs_pb2.JOB_STATE_FAILED: "failed",
    jobs_pb2.JOB_STATE_CANCELLED: "cancelled",
}

_OG = re.compile(r"^og:([a-z0-9_:]+)$", re.I)


def _camel(key: str) -> str:
    parts = re.split(r"[:_]", key)
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def _rfc3339(ts: Any) -> str:
    return str(ts.ToJsonString())


def metadata(doc: jobs_pb2.Document) -> dict[str, Any]:
    """Firecrawl's ``metadata``: the page's own meta tags (``og:title`` also as
    ``ogTitle``), then the fields Firecrawl names, which win."""
    out: dict[str, Any] = {}
    for key, value in sorted(doc.metadata.items()):
        out[key] = value
        m = _OG.match(key)
        if m:
            name = _camel(m.group(1))
            out["og" + name[:1].upper() + name[1:]] = value
    named = {
        "title": doc.title,
        "description": doc.description,
        "language": doc.language,
        "sourceURL": doc.url,
        "url": doc.final_url or doc.url,
        "statusCode": doc.status_code,
        "contentType": doc.content_type,
        "cacheState": "hit" if doc.cache_hit else "miss",
    }
    out.update({k: v for k, v in named.items() if v != ""})
    if doc.num_pages:
        out["numPages"] = doc.num_pages
    if doc.cache_hit and doc.HasField("fetched_at"):
        out["cachedAt"] = _rfc3339(doc.fetched_at)
    return out


def document(doc: jobs_pb2.Document) -> dict[str, Any]:
    """A ``Document`` as Firecrawl's document: the formats it carries, and ``metadata``."""
    out: dict[str, Any] = {}
    if doc.markdown:
        out["markdown"] = doc.markdown
    if doc.html:
        out["html"] = doc.html
    if doc.raw_html:
        out["rawHtml"] = doc.raw_html
    if doc.links:
        out["links"] = list(doc.links)
    if doc.images:
        out["images"] = list(doc.images)
    if doc.screenshot.data:
        data = base64.b64encode(doc.screenshot.data).decode("ascii")
        out["screenshot"] = f"data:{doc.screenshot.content_type or 'image/png'};base64,{data}"
    out["metadata"] = metadata(doc)
    return out
