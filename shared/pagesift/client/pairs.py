"""What the cluster client's modules share: a pair's client, and the errors they raise.

What it owns
------------
- ``PairClient``: what the cluster client needs of one pair's client (a single-pair
  ``JobClient`` is one: its ``call`` loop with the pair's failover and retries, its
  resumed ``watch``). Structural, so these modules never import ``aio`` (which
  imports them: no cycle).
- ``PairCalls``: what the composite-job code needs of the router (one call on a named
  pair, one pair's watch).
- The errors a cluster client makes itself, shaped as a server's
  (``grpc.aio.AioRpcError`` with a ``google.rpc.Status`` in the trailing metadata):
  ``invalid_field`` (INVALID_ARGUMENT, reason INVALID_FIELD, a ``BadRequest`` naming
  the field, as a pagesift server sends it) and ``pair_unavailable`` (UNAVAILABLE whose
  message names the pair; its ``ErrorInfo`` is of ``CLUSTER_DOMAIN``, not pagesift's,
  so every caller treats it as it treats a pair it cannot reach: the CLI's exit 4, the
  gateway's 503).
- ``STATE_NAMES``: job states as the pure rules (``pagesift.core.cluster.merge``) name them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

import grpc
import grpc.aio
from google.rpc import error_details_pb2, status_pb2

from pagesift.client.errors import DETAILS_KEY, DOMAIN, error_info_of
from pagesift.v1 import jobs_pb2

if TYPE_CHECKING:
    from pagesift.v1.jobs_pb2_grpc import JobServiceAsyncStub

__all__ = [
    "CLUSTER_DOMAIN", "STATE_NAMES", "STATE_OF_NAME", "PairCalls", "PairClient",
    "invalid_field", "owner_named", "pair_unavailable", "rpc_error",
]  # fmt: skip

CLUSTER_DOMAIN = "cluster.pagesift.dev"

T = TypeVar("T")

STATE_NAMES: dict[jobs_pb2.JobState.ValueType, str] = {
    jobs_pb2.JOB_STATE_SCRAPING: "scraping",
    jobs_pb2.JOB_STATE_PAUSED: "paused",
    jobs_pb2.JOB_STATE_COMPLETED: "completed",
    jobs_pb2.JOB_STATE_FAILED: "failed",
    jobs_pb2.JOB_STATE_CANCELLED: "cancelled",
}
STATE_OF_NAME = {name: value for value, name in STATE_NAMES.items()}
TERMINAL = frozenset({"completed", "failed", "cancelled"})


class PairClient(Protocol):
    """One pair's client (a single-pair ``JobClient``)."""

    async def call(
        self,
        invoke: Callable[[JobServiceAsyncStub], Awaitable[T]],
        *,
        retryable: bool,
        control: bool = False,
    ) -> T: ...

    def watch(
        self, job_id: str, from_index: int = 0
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]: ...

    async def close(self) -> None: ...


class PairCalls(Protocol):
    """The router, as the composite-job code sees it."""

    async def on_pair(self, pair: str, fn: Callable[[PairClient], Awaitable[T]]) -> T: ...

    def watch_on(
        self, pair: str, job_uuid: str, from_index: int
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]: ...


def rpc_error(
    code: grpc.StatusCode,
    message: str,
    *,
    info: error_details_pb2.ErrorInfo | None = None,
    details: tuple[object, ...] = (),
) -> grpc.aio.AioRpcError:
    """An error shaped as a server's: ``code``, ``message`` and the rich status."""
    status = status_pb2.Status(code=code.value[0], message=message)
    for detail in (info, *details):
        if detail is not None:
            status.details.add().Pack(detail)  # type: ignore[arg-type]
    trailing = grpc.aio.Metadata((DETAILS_KEY, status.SerializeToString()))
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), trailing, details=message, debug_error_string=""
    )


def invalid_field(field: str, message: str) -> grpc.aio.AioRpcError:
    """INVALID_ARGUMENT naming ``field``, as a pagesift server refuses one."""
    text = f"{field}: {message}"
    return rpc_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        text,
        info=error_details_pb2.ErrorInfo(
            reason="INVALID_FIELD", domain=DOMAIN, metadata={"field": field}
        ),
        details=(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=field, description=text)
                ]
            ),
        ),
    )


def owner_named(err: grpc.aio.AioRpcError) -> str | None:
    """The pair a HOST_OWNED_ELSEWHERE refusal names (None: another error)."""
    if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    info = error_info_of(err)
    if info is None or info.reason != "HOST_OWNED_ELSEWHERE":
        return None
    return str(info.metadata.get("owner", "")) or None


def pair_unavailable(
    cluster: str, pair: str, why: str, metadata: Mapping[str, str] | None = None
) -> grpc.aio.AioRpcError:
    """UNAVAILABLE for a call that needs ``pair`` (the message names it)."""
    return rpc_error(
        grpc.StatusCode.UNAVAILABLE,
        f"pair {pair} of cluster {cluster} is unavailable: {why}",
        info=error_details_pb2.ErrorInfo(
            reason="PAIR_UNAVAILABLE",
            domain=CLUSTER_DOMAIN,
            metadata={"pair": pair, "cluster": cluster, **(metadata or {})},
        ),
    )
