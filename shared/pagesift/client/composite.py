"""A job of several parts (a batch scrape spanning pairs), read and controlled as one.

What it owns
------------
The calls of a cluster client on a composite id (``pagesift.core.cluster.ids``):
``get_job`` (status: the parts' counters summed, their states merged; documents: part
by part, each in index order, one part's page per call), ``watch`` (the parts' streams
one after another, renumbered, with the merged state), ``errors_page`` (part after part
under one token), ``control`` (CancelJob / ResumeJob on every part at once). The rules
are ``pagesift.core.cluster.merge``'s (pure); this is their shell over ``PairCalls``.

Guarantees
----------
- A part's documents are visible once every part before it has ended
  (``merge.locate``), so the documents read as one sequence that only grows at its
  end: ``next_skip`` paging and a watch resumed at ``from_index`` see each once, in
  a stable order.
- Every call to a part goes through the router (``PairCalls.on_pair``), so a part on a
  pair that is gone fails the call with UNAVAILABLE naming that pair.
- Bounded: a status is one ``status_only`` GetJob per part (concurrently); a page reads
  one part; a watch holds one part's stream and refreshes the other parts' counters
  at most once per ``STATUS_SECONDS``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import grpc

from pagesift.client.pairs import (
    STATE_NAMES,
    STATE_OF_NAME,
    TERMINAL,
    PairCalls,
    PairClient,
    invalid_field,
    rpc_error,
)
from pagesift.core.cluster import merge
from pagesift.v1 import jobs_pb2

__all__ = ["STATUS_SECONDS", "control", "errors_page", "get_job", "header", "statuses", "watch"]

STATUS_SECONDS = 1.0
Parts = Sequence[tuple[str, str]]


async def _status(
    r: PairCalls, pair: str, uid: str, timeout: float | None
) -> jobs_pb2.GetJobResponse:
    req = jobs_pb2.GetJobRequest(id=uid, status_only=True)

    async def call(c: PairClient) -> jobs_pb2.GetJobResponse:
        return await c.call(lambda s: s.GetJob(req, timeout=timeout), retryable=True)

    return await r.on_pair(pair, call)


async def statuses(
    r: PairCalls, parts: Parts, timeout: float | None
) -> list[jobs_pb2.GetJobResponse]:
    """Every part's status (``status_only``), concurrently, in part order."""
    return list(await asyncio.gather(*(_status(r, p, u, timeout) for p, u in parts)))


def _name(state: jobs_pb2.JobState.ValueType) -> str:
    return STATE_NAMES.get(state, "scraping")


def layout(sts: Sequence[jobs_pb2.GetJobResponse]) -> list[merge.Part]:
    return [merge.Part(s.completed, _name(s.state) in TERMINAL) for s in sts]


def header(
    job_id: str, parts: Parts, sts: Sequence[jobs_pb2.GetJobResponse]
) -> jobs_pb2.GetJobResponse:
    """The merged status of a job of parts (no documents)."""
    resp = jobs_pb2.GetJobResponse(
        id=job_id,
        kind=sts[0].kind,
        state=STATE_OF_NAME[merge.merged_state([_name(s.state) for s in sts])],
        total=sum(s.total for s in sts),
        completed=sum(s.completed for s in sts),
        failed=sum(s.failed for s in sts),
        note="; ".join(f"{p}: {s.note}" for (p, _), s in zip(parts, sts, strict=True) if s.note),
    )
    resp.created_at.CopyFrom(min(sts, key=lambda s: s.created_at.ToNanoseconds()).created_at)
    resp.expires_at.CopyFrom(min(sts, key=lambda s: s.expires_at.ToNanoseconds()).expires_at)
    paused = next((s.paused for s in sts if s.HasField("paused")), None)
    if paused is not None and resp.state == jobs_pb2.JOB_STATE_PAUSED:
        resp.paused.CopyFrom(paused)
    return resp


async def get_job(
    r: PairCalls, job_id: str, parts: Parts, req: jobs_pb2.GetJobRequest, timeout: float | None
) -> jobs_pb2.GetJobResponse:
    """GetJob of a job of parts (see the module docstring)."""
    sts = await statuses(r, parts, timeout)
    resp = header(job_id, parts, sts)
    if req.status_only:
        return resp
    shape = layout(sts)
    where = merge.locate(req.skip, shape)
    if where is None:
        message = f"skip: {req.skip} is beyond the last document ({resp.completed})"
        raise rpc_error(grpc.StatusCode.OUT_OF_RANGE, message)
    k, local = where
    pair, uid = parts[k]
    part_req = jobs_pb2.GetJobRequest(id=uid, skip=local, limit=req.limit)

    async def call(c: PairClient) -> jobs_pb2.GetJobResponse:
        return await c.call(lambda s: s.GetJob(part_req, timeout=timeout), retryable=True)

    page = await r.on_pair(pair, call)
    resp.documents.extend(page.documents)
    offset = merge.offset_of(k, shape)
    if page.HasField("next_skip"):
        resp.next_skip = offset + page.next_skip
    elif k < len(parts) - 1:
        resp.next_skip = offset + page.completed  # the next part's first document
    return resp


def _state_event(head: jobs_pb2.GetJobResponse) -> jobs_pb2.WatchJobResponse:
    event = jobs_pb2.WatchJobResponse()
    event.state.state = head.state
    event.state.total = head.total
    event.state.completed = head.completed
    event.state.failed = head.failed
    if head.HasField("paused"):
        event.state.paused.CopyFrom(head.paused)
    return event


async def watch(
    r: PairCalls, job_id: str, parts: Parts, from_index: int, timeout: float | None
) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
    """WatchJob of a job of parts: the parts' documents one part after another (each
    part's own stream, live), renumbered into the job's sequence, and the merged state
    whenever it changes; ends once every part has ended and its documents were sent."""
    if from_index < 0:
        raise invalid_field("from_index", "negative")
    sts = await statuses(r, parts, timeout)
    where = merge.locate(from_index, layout(sts))
    k, local = where if where is not None else (len(parts) - 1, sts[-1].completed)
    offset = merge.offset_of(k, layout(sts))
    last: tuple[int, int, int, int] | None = None
    polled = time.monotonic()
    for j in range(k, len(parts)):
        pair, uid = parts[j]
        async for event in r.watch_on(pair, uid, local if j == k else 0):
            if event.WhichOneof("event") == "document":
                event.document.index += offset
                yield event
                continue
            s = sts[j]
            s.state, s.total = event.state.state, event.state.total
            s.completed, s.failed = event.state.completed, event.state.failed
            if time.monotonic() - polled > STATUS_SECONDS:
                polled = time.monotonic()
                others = [i for i in range(len(parts)) if i != j]
                fresh = await asyncio.gather(*(_status(r, *parts[i], timeout) for i in others))
                for i, f in zip(others, fresh, strict=True):
                    sts[i] = f
            head = header(job_id, parts, sts)
            if j < len(parts) - 1 and head.state != jobs_pb2.JOB_STATE_SCRAPING:
                head.state = jobs_pb2.JOB_STATE_SCRAPING  # later parts' documents follow
            key = (head.state, head.total, head.completed, head.failed)
            if key != last:
                last = key
                yield _state_event(head)
        offset += sts[j].completed
    sts = await statuses(r, parts, timeout)
    head = header(job_id, parts, sts)
    if (head.state, head.total, head.completed, head.failed) != last:
        yield _state_event(head)


async def errors_page(
    r: PairCalls, parts: Parts, req: jobs_pb2.GetJobErrorsRequest, timeout: float | None
) -> jobs_pb2.GetJobErrorsResponse:
    """One page of a job of parts' errors: part after part, one token for all."""
    try:
        k, token = merge.errors_untoken(req.page_token, len(parts))
    except ValueError as e:
        raise invalid_field("page_token", str(e)) from None
    pair, uid = parts[k]
    part_req = jobs_pb2.GetJobErrorsRequest(id=uid, page_size=req.page_size, page_token=token)

    async def call(c: PairClient) -> jobs_pb2.GetJobErrorsResponse:
        return await c.call(lambda s: s.GetJobErrors(part_req, timeout=timeout), retryable=True)

    page = await r.on_pair(pair, call)
    if page.next_page_token:
        page.next_page_token = merge.errors_token(k, page.next_page_token)
    elif k < len(parts) - 1:
        page.next_page_token = merge.errors_token(k + 1, "")
    return page


async def control(
    r: PairCalls, parts: Parts, method: str, timeout: float | None
) -> jobs_pb2.JobState.ValueType:
    """CancelJob or ResumeJob (``method``) on every part at once; the merged state."""

    async def one(pair: str, uid: str) -> jobs_pb2.JobState.ValueType:
        async def call(c: PairClient) -> jobs_pb2.JobState.ValueType:
            if method == "CancelJob":
                creq = jobs_pb2.CancelJobRequest(id=uid)
                resp = await c.call(
                    lambda s: s.CancelJob(creq, timeout=timeout), retryable=True, control=True
                )
                return resp.state
            rreq = jobs_pb2.ResumeJobRequest(id=uid)
            got = await c.call(
                lambda s: s.ResumeJob(rreq, timeout=timeout), retryable=True, control=True
            )
            return got.state

        return await r.on_pair(pair, call)

    states = await asyncio.gather(*(one(p, u) for p, u in parts))
    return STATE_OF_NAME[merge.merged_state([_name(s) for s in states])]
