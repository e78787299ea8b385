"""Firecrawl's shape of pagesift's documents and job states, for every Firecrawl-facing part.

What it owns
------------
``document(doc)``: a proto ``Document`` as Firecrawl's document dict (the formats it
carries, ``screenshot`` as a data URL, ``actions`` when actions returned something,
``changeTracking`` when it was asked for, the model formats' ``json`` and ``summary``,
Firecrawl's ``warning`` naming each format that gave nothing, and ``metadata``);
``metadata(doc)``: Firecrawl's ``metadata`` (the page's own meta tags, ``og:title`` also
as ``ogTitle``, then the fields Firecrawl names, which win); ``STATES``: JobState ->
Firecrawl status.

Who uses it: the HTTP gateway (``pagesift.gateway``) for its answers, and the node's
webhook delivery for Firecrawl-shaped webhooks, so both speak the same shape.

Invariants
----------
Pure: no I/O, no clock; it reads only the message it is given (tests/test_gateway_translate.py).
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from pagesift.v1 import jobs_pb2

__all__ = [
    "STATES",
    "actions",
    "change_tracking",
    "diff_json",
    "document",
    "javascript_return",
    "metadata",
]

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
        out["screenshot"] = _data_url(doc.screenshot)
    if doc.action_results:
        out["actions"] = actions(doc)
    if doc.change_status:
        out["changeTracking"] = change_tracking(doc)
    if doc.json:
        out["json"] = json.loads(doc.json)  # stored valid: the node judged it
    if doc.summary:
        out["summary"] = doc.summary
    if doc.format_errors:
        out["warning"] = warning(doc)
    out["metadata"] = metadata(doc)
    return out


def warning(doc: jobs_pb2.Document) -> str:
    """Firecrawl's ``warning``: why formats the request asked for are missing."""
    return "; ".join(
        f"{jobs_pb2.Format.Name(e.format).removeprefix('FORMAT_').lower()}: {e.code}: {e.message}"
        for e in doc.format_errors
    )


def _data_url(shot: jobs_pb2.Screenshot) -> str:
    data = base64.b64encode(shot.data).decode("ascii")
    return f"data:{shot.content_type or 'image/png'};base64,{data}"


def javascript_return(raw: str) -> dict[str, Any]:
    """An action's JSON return value as Firecrawl's ``{type, value}`` (``type`` as
    JavaScript's ``typeof`` says it: null, arrays and objects are "object")."""
    value = json.loads(raw) if raw else None
    kinds = {str: "string", bool: "boolean", int: "number", float: "number"}
    return {"type": kinds.get(type(value), "object"), "value": value}


def actions(doc: jobs_pb2.Document) -> dict[str, Any]:
    """Firecrawl's ``actions``: the screenshot actions' images (data URLs) and the
    executeJavascript actions' returns, each in action order (pagesift has no scrape or
    pdf action: those lists are empty)."""
    shots = [_data_url(r.screenshot) for r in doc.action_results if r.HasField("screenshot")]
    returns = [
        javascript_return(r.javascript_return)
        for r in doc.action_results
        if r.WhichOneof("result") == "javascript_return"
    ]
    return {"screenshots": shots, "scrapes": [], "javascriptReturns": returns, "pdfs": []}


_CHANGE = {
    jobs_pb2.CHANGE_STATUS_NEW: "new",
    jobs_pb2.CHANGE_STATUS_SAME: "same",
    jobs_pb2.CHANGE_STATUS_CHANGED: "changed",
}
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def diff_json(text: str) -> dict[str, Any]:
    """A unified diff as Firecrawl's ``diff.json`` (parse-diff's shape: files of chunks
    of changes, ``add``/``del`` with ``ln``, ``normal`` with ``ln1``/``ln2``)."""
    files: list[dict[str, Any]] = []
    chunk: dict[str, Any] | None = None
    old = new = 0
    for line in text.splitlines():
        if line.startswith("--- ") and chunk is None:
            files.append({"from": line[4:], "to": None, "chunks": []})
        elif line.startswith("+++ ") and chunk is None and files:
            files[-1]["to"] = line[4:]
        elif (m := _HUNK.match(line)) and files:
            old, new = int(m.group(1)), int(m.group(2))
            chunk = {"content": line, "changes": []}
            files[-1]["chunks"].append(chunk)
        elif chunk is not None and line[:1] == "+":
            chunk["changes"].append({"type": "add", "add": True, "ln": new, "content": line})
            new += 1
        elif chunk is not None and line[:1] == "-":
            chunk["changes"].append({"type": "del", "del": True, "ln": old, "content": line})
            old += 1
        elif chunk is not None:
            change = {"type": "normal", "normal": True, "ln1": old, "ln2": new, "content": line}
            chunk["changes"].append(change)
            old, new = old + 1, new + 1
    return {"files": files}


def change_tracking(doc: jobs_pb2.Document) -> dict[str, Any]:
    """Firecrawl's ``changeTracking``: the status against the account's previous scrape
    of the URL, when that was (null for a new page), and the diff when one was asked
    for and the page changed. ``visibility`` is always "visible": pagesift tracks the
    pages a job reached, by links or sitemaps alike."""
    out: dict[str, Any] = {
        "previousScrapeAt": (
            _rfc3339(doc.previous_scrape_at) if doc.HasField("previous_scrape_at") else None
        ),
        "changeStatus": _CHANGE.get(doc.change_status, "new"),
        "visibility": "visible",
    }
    if doc.change_diff:
        out["diff"] = {"text": doc.change_diff, "json": diff_json(doc.change_diff)}
    return out
