"""How the job commands show a job: its JSON shapes and its text lines.

Owns the names output uses for job enums (``state_name``, ``kind_name``), timestamps
(RFC 3339 UTC, or None when unset), the ``*_json`` shapes ``--json`` prints (tests
pin their keys and order down), and the text lines of ``status``, ``watch``,
``errors`` and ``jobs``. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from pagesift.cli.common import enum_name
from pagesift.v1 import jobs_pb2


def state_name(state: jobs_pb2.JobState.ValueType) -> str:
    """``JOB_STATE_COMPLETED`` -> ``"completed"`` (``"unspecified"`` for 0 or unknown)."""
    return enum_name(jobs_pb2.JobState.DESCRIPTOR, state, "JOB_STATE_")


def kind_name(kind: jobs_pb2.JobKind.ValueType) -> str:
    """``JOB_KIND_BATCH_SCRAPE`` -> ``"batch_scrape"``, ``JOB_KIND_CRAWL`` -> ``"crawl"``."""
    return enum_name(jobs_pb2.JobKind.DESCRIPTOR, kind, "JOB_KIND_")


def timestamp_json(msg: Message, name: str) -> str | None:
    """``msg.<name>`` in RFC 3339 UTC (``2026-01-02T03:04:05Z``), None when it is unset."""
    ts = getattr(msg, name)
    if not msg.HasField(name) or (ts.seconds == 0 and ts.nanos == 0):
        return None
    text: str = ts.ToJsonString()
    return text


# ---------------------------------------------------------------- JSON shapes


def document_dict(doc: jobs_pb2.Document) -> dict[str, Any]:
    """The API's document as JSON, every field of ``Document``, from the message itself.

    protobuf's JSON mapping (``MessageToDict``: timestamps in RFC 3339, enums by name,
    maps as objects) with the proto's field names, every field printed even when it is
    empty; a message field that is unset (``fetched_at``) is ``None``. The keys follow
    the proto's declaration order, so a field added to the proto appears here by itself.
    """
    mapped = json_format.MessageToDict(
        doc, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return {f.name: mapped.get(f.name) for f in doc.DESCRIPTOR.fields}


def document_json(doc: jobs_pb2.Document, *, full: bool = False) -> dict[str, Any]:
    """``{"url", "final_url", "title"}``; with ``full`` the whole document
    (``document_dict``: every field of the message)."""
    if full:
        return document_dict(doc)
    return {"url": doc.url, "final_url": doc.final_url, "title": doc.title}


def job_json(
    job: jobs_pb2.GetJobResponse,
    documents: Iterable[jobs_pb2.Document],
    *,
    next_skip: int | None = None,
    full: bool = False,
) -> dict[str, Any]:
    """A job's fields, its documents (url, final_url, title; with ``full`` every field)
    and where paging goes on."""
    return {
        "id": job.id,
        "kind": kind_name(job.kind),
        "state": state_name(job.state),
        "total": job.total,
        "completed": job.completed,
        "failed": job.failed,
        "created_at": timestamp_json(job, "created_at"),
        "expires_at": timestamp_json(job, "expires_at"),
        "note": job.note,
        "documents": [document_json(d, full=full) for d in documents],
        "next_skip": next_skip,
        **({"paused": pause_json(job.paused)} if job.HasField("paused") else {}),
    }


def pause_reason_name(reason: jobs_pb2.PauseReason.ValueType) -> str:
    """``PAUSE_REASON_POISONED`` -> ``"poisoned"``."""
    return enum_name(jobs_pb2.PauseReason.DESCRIPTOR, reason, "PAUSE_REASON_")


def pause_json(info: jobs_pb2.PauseInfo) -> dict[str, Any]:
    return {
        "reason": pause_reason_name(info.reason),
        "in_flight_urls": list(info.in_flight_urls),
        "interruptions": info.interruptions,
        "worker_losses": info.worker_losses,
        "paused_at": timestamp_json(info, "paused_at"),
    }


def errors_json(job_id: str, resp: jobs_pb2.GetJobErrorsResponse) -> dict[str, Any]:
    return {
        "id": job_id,
        "errors": [
            {"url": e.url, "code": e.code, "message": e.message, "time": timestamp_json(e, "time")}
            for e in resp.errors
        ],
        "robots_blocked": list(resp.robots_blocked),
    }


def watch_json(event: jobs_pb2.WatchJobResponse, *, full: bool = False) -> dict[str, Any]:
    """One ``watch --json`` line: ``{"index", "document"}`` (the document's url,
    final_url and title; with ``full`` every field) or ``{"state", "total",
    "completed", "failed"}``."""
    if event.WhichOneof("event") == "document":
        doc = document_json(event.document.document, full=full)
        return {"index": event.document.index, "document": doc}
    st = event.state
    return {
        "state": state_name(st.state),
        "total": st.total,
        "completed": st.completed,
        "failed": st.failed,
    }


def jobs_json(jobs: Iterable[jobs_pb2.JobSummary]) -> dict[str, Any]:
    return {
        "jobs": [
            {
                "id": j.id,
                "kind": kind_name(j.kind),
                "state": state_name(j.state),
                "total": j.total,
                "completed": j.completed,
                "created_at": timestamp_json(j, "created_at"),
            }
            for j in jobs
        ]
    }


# ---------------------------------------------------------------- text lines


def _document_tail(doc: jobs_pb2.Document) -> str:
    """``URL -> FINAL  TITLE`` (no arrow when the page was not redirected)."""
    final = f" -> {doc.final_url}" if doc.final_url and doc.final_url != doc.url else ""
    return f"{doc.url}{final}  {doc.title}"


def status_lines(
    job: jobs_pb2.GetJobResponse, docs: list[jobs_pb2.Document], next_skip: int | None
) -> Iterator[str]:
    yield f"id:        {job.id}"
    yield f"kind:      {kind_name(job.kind)}"
    yield f"state:     {state_name(job.state)}"
    yield f"progress:  {job.completed}/{job.total} done, {job.failed} failed"
    yield f"created:   {timestamp_json(job, 'created_at') or '-'}"
    yield f"expires:   {timestamp_json(job, 'expires_at') or '-'}"
    if job.HasField("paused"):
        reason = pause_reason_name(job.paused.reason)
        yield f"paused:    {reason} (pagesift resume {job.id}, or pagesift cancel {job.id})"
        for url in job.paused.in_flight_urls:
            yield f"in flight: {url}"
    if job.note:
        yield f"note:      {job.note}"
    if docs:
        yield f"documents: {len(docs)}{'' if next_skip is None else ' (more: use --all)'}"
        for doc in docs:
            yield document_line(doc)


def document_line(doc: jobs_pb2.Document) -> str:
    """One document of ``status``: ``  200 URL -> FINAL  TITLE``."""
    return f"  {doc.status_code:3d} {_document_tail(doc)}"


def watch_line(event: jobs_pb2.WatchJobResponse) -> str:
    if event.WhichOneof("event") == "document":
        d = event.document.document
        return f"[{event.document.index}] {d.status_code} {_document_tail(d)}"
    st = event.state
    return f"state: {state_name(st.state)} ({st.completed}/{st.total} done, {st.failed} failed)"


def errors_lines(resp: jobs_pb2.GetJobErrorsResponse) -> Iterator[str]:
    for e in resp.errors:
        yield f"{e.url}\t{e.code}\t{e.message}" if e.url else f"note: {e.code}: {e.message}"
    if resp.robots_blocked:
        yield f"blocked by robots.txt ({len(resp.robots_blocked)}):"
        for url in resp.robots_blocked:
            yield f"  {url}"


def jobs_line(j: jobs_pb2.JobSummary) -> str:
    created = timestamp_json(j, "created_at") or "-"
    return (
        f"{j.id}  {kind_name(j.kind):<12} {state_name(j.state):<10} "
        f"{j.completed}/{j.total}  {created}"
    )
