"""A batch scrape across a cluster's pairs: split by host, started part by part, undone
when a part is refused, each refusal named in the caller's own ``urls[i]``.

What it owns
------------
``start(req, timeout, pairs, unary)``: one split and start of a StartBatchScrape over
``pairs`` (the placeable pairs, read by ``ClusterRouter``). The URLs are split by host
(``placement.split_by_host``): one pair takes the request as it is; several take one
part each, in the order of their first URL, each under a key derived from the caller's
(``merge.part_key``), so a retried start finds every part again. The parts start one
after another:

- the first part refused HOST_OWNED_ELSEWHERE raises ``NothingStarted`` (the node's
  registry read differs from the caller's; ``ClusterRouter`` reads the registry again
  and splits again);
- a part refused otherwise cancels the parts already started, then raises the refusal;
- a part's pair UNAVAILABLE leaves the parts started, for the caller's retry under the
  same key to find;
- every refusal is renumbered (``renumbered``): a part's ``urls[j]`` is named as the
  caller's ``urls[i]`` in the message, the BadRequest violations and the ErrorInfo.

The answer's id is the parts' ids joined (``ids.composite_job_id``), its invalid URLs
in the caller's order. It does no I/O of its own: every call goes through ``unary``,
``ClusterRouter._unary``, the pair client's retry and failover included.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

import grpc
import grpc.aio
from google.rpc import error_details_pb2

from pagesift.client.errors import DETAILS_KEY, status_of
from pagesift.client.pairs import invalid_field, owner_named
from pagesift.client.retry import is_retryable
from pagesift.core.cluster import ids, merge, placement
from pagesift.v1 import jobs_pb2

__all__ = ["NothingStarted", "Unary", "renumbered", "start"]


class Unary(Protocol):
    """``ClusterRouter._unary``: one call of ``method`` on ``pair``'s client."""

    def __call__(
        self,
        pair: str,
        method: str,
        req: Any,
        timeout: float | None,
        *,
        retryable: bool = True,
        control: bool = False,
    ) -> Awaitable[Any]: ...


class NothingStarted(Exception):
    """A batch's first part was refused HOST_OWNED_ELSEWHERE: no part started."""

    def __init__(self, err: grpc.aio.AioRpcError) -> None:
        super().__init__(err.details())
        self.err = err


async def start(
    req: jobs_pb2.StartBatchScrapeRequest,
    timeout: float | None,
    pairs: list[str],
    unary: Unary,
) -> jobs_pb2.StartBatchScrapeResponse:
    """One split and start (see the module docstring)."""
    try:
        split = placement.split_by_host(list(req.urls), pairs)
    except ValueError:
        split = {}
    if not split:  # no URL at all: the key's owner refuses it by its field
        split = {placement.owner(req.idempotency_key, pairs): []}
    order = sorted(split, key=lambda p: split[p][0][0] if split[p] else 0)
    if len(order) > ids.MAX_PARTS:
        raise invalid_field(
            "urls",
            f"the URLs' hosts belong to {len(order)} pairs; a batch spans at "
            f"most {ids.MAX_PARTS}: split it",
        )
    retryable = is_retryable("StartBatchScrape", req.idempotency_key)
    if len(order) == 1:
        try:
            resp = await unary(order[0], "StartBatchScrape", req, timeout, retryable=retryable)
        except grpc.aio.AioRpcError as err:
            if owner_named(err) is not None:
                raise NothingStarted(err) from None
            raise
        resp.id = ids.cluster_job_id(order[0], resp.id)
        return resp  # type: ignore[no-any-return]
    started: list[tuple[str, str]] = []
    invalid: list[tuple[int, str]] = []
    for pair in order:  # one after another: a refusal stops before the rest start
        indexes = [i for i, _ in split[pair]]
        part = jobs_pb2.StartBatchScrapeRequest()
        part.CopyFrom(req)
        del part.urls[:]
        part.urls.extend(u for _, u in split[pair])
        part.idempotency_key = merge.part_key(req.idempotency_key, pair)
        try:
            resp = await unary(pair, "StartBatchScrape", part, timeout, retryable=retryable)
        except grpc.aio.AioRpcError as err:
            if not started and owner_named(err) is not None:
                raise NothingStarted(renumbered(err, indexes)) from None
            if err.code() != grpc.StatusCode.UNAVAILABLE:  # refused: undo the rest
                await _cancel_quietly(started, timeout, unary)
            # UNAVAILABLE: the parts started stay, for a retry under the same key
            raise renumbered(err, indexes) from None
        started.append((pair, resp.id))
        where = {u: i for i, u in reversed(split[pair])}
        invalid.extend((where.get(u, 0), u) for u in resp.invalid_urls)
    return jobs_pb2.StartBatchScrapeResponse(
        id=ids.composite_job_id(started), invalid_urls=[u for _, u in sorted(invalid)]
    )


async def _cancel_quietly(
    parts: Sequence[tuple[str, str]], timeout: float | None, unary: Unary
) -> None:
    for pair, uid in parts:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await unary(pair, "CancelJob", jobs_pb2.CancelJobRequest(id=uid), timeout, control=True)


def renumbered(err: grpc.aio.AioRpcError, indexes: Sequence[int]) -> grpc.aio.AioRpcError:
    """A part's refusal, its ``urls[j]`` named as the caller's ``urls[i]``."""
    status = status_of(err)
    details = merge.renumber_field(err.details() or "", indexes)
    if status is None:
        return grpc.aio.AioRpcError(
            err.code(), grpc.aio.Metadata(), grpc.aio.Metadata(), details, ""
        )
    status.message = merge.renumber_field(status.message, indexes)
    out = type(status)(code=status.code, message=status.message)
    for any_ in status.details:
        if any_.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            any_.Unpack(bad)
            for v in bad.field_violations:
                v.field = merge.renumber_field(v.field, indexes)
                v.description = merge.renumber_field(v.description, indexes)
            out.details.add().Pack(bad)
        elif any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            any_.Unpack(info)
            for k, v in list(info.metadata.items()):
                info.metadata[k] = merge.renumber_field(v, indexes)
            out.details.add().Pack(info)
        else:
            out.details.add().CopyFrom(any_)
    trailing = grpc.aio.Metadata((DETAILS_KEY, out.SerializeToString()))
    return grpc.aio.AioRpcError(
        err.code(), grpc.aio.Metadata(), trailing, details=details, debug_error_string=""
    )
