"""``AdminService``: Role, Promote and Digest, on both roles; and ``verify_digests``.

Digest at an offset (how both nodes hash "the same" state while writes go on)
-----------------------------------------------------------------------------
A digest is always taken from a consistent cut (``replog.View``: a RocksDB iterator
created inside the write/apply section, so it is pinned at exactly one offset) and
hashed OUTSIDE that section: neither writers nor the standby's apply wait for it.

``Digest(at_offset=X)``:

* ``X == 0``: the cut at the node's current offset, returned with that offset.
* the node stands exactly at X: the cut now.
* the node is behind X: a *pin* at X is registered; the commit of entry X (the
  primary's write group, or the standby's apply group, which is split right after
  X) creates the cut inside its critical section. Same state on both nodes, because
  both applied exactly entries 1..X.
* the node is past X: FAILED_PRECONDITION (that state is gone).

``verify_digests`` drives it: it asks the primary for its offset P and asks both
nodes for the digest at P concurrently. If writes continue, the primary may be past
P already: then it retries at a FUTURE offset (current + 1), which both nodes pin
before reaching it, so the comparison is exact while writes go on. If writes stop,
both already stand at (or the standby soon reaches) P. So: exact comparison at one
offset in both cases, never holding writers or the standby's apply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from pagesift.primary.replication import ReplicationServicer
from pagesift.shared.replog import OffsetPassed, StoreSlot, view_digest
from pagesift.standby.follower import Follower
from pagesift.standby.promotion import Promoter
from pagesift.v1 import replication_pb2 as pb
from pagesift.v1 import replication_pb2_grpc

_ROLES = {
    "primary": pb.NODE_ROLE_PRIMARY,
    "standby": pb.NODE_ROLE_STANDBY,
    "fenced": pb.NODE_ROLE_FENCED,
}


class AdminServicer(replication_pb2_grpc.AdminServiceServicer):
    """Role, Promote and Digest for one node. ``follower`` is a getter (the Node may
    create or drop its follower); ``promoter`` is None on a node that cannot promote."""

    def __init__(
        self,
        slot: StoreSlot,
        *,
        node_id: str,
        replication: ReplicationServicer | None = None,
        follower: Callable[[], Follower | None] | None = None,
        promoter: Promoter | None = None,
        default_digest_timeout: float = 10.0,
    ) -> None:
        self._slot = slot
        self.node_id = node_id
        self._replication = replication
        self._follower = follower or (lambda: None)
        self._promoter = promoter
        self.default_digest_timeout = default_digest_timeout

    async def Role(
        self,
        request: pb.RoleRequest,
        context: grpc.aio.ServicerContext[pb.RoleRequest, pb.RoleResponse],
    ) -> pb.RoleResponse:
        log = self._slot.log
        out = pb.RoleResponse(
            role=_ROLES[log.role],
            epoch=log.epoch,
            history_id=log.history_id,
            applied_offset=log.last_offset,
            node_id=self.node_id,
        )
        follower = self._follower()
        if log.writable and self._replication is not None:
            st = self._replication.status()
            out.primary_offset = st.last_offset
            out.lag_offsets = st.lag_offsets
            out.lag_seconds = st.lag_seconds
            out.peer = st.peer
            out.connected = st.connected
            out.sync_degraded = st.sync_degraded
            out.full_resyncs = self._replication.full_resyncs
            out.continues = self._replication.continues
        elif follower is not None:
            fs = follower.status()
            out.primary_offset = fs.primary_offset
            out.lag_offsets = fs.lag_offsets
            out.lag_seconds = fs.lag_seconds
            out.peer = fs.target
            out.connected = fs.connected
            out.full_resyncs = fs.full_resyncs
            out.continues = fs.continues
            out.discarded = fs.discarded
        return out

    async def Promote(
        self,
        request: pb.PromoteRequest,
        context: grpc.aio.ServicerContext[pb.PromoteRequest, pb.PromoteResponse],
    ) -> pb.PromoteResponse:
        if self._promoter is None:
            log = self._slot.log
            if log.writable:  # a node started as the primary: report its state (the contract)
                return pb.PromoteResponse(
                    epoch=log.epoch,
                    history_id=log.history_id,
                    switch_offset=log.switch_offset,
                    already_primary=True,
                )
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this node cannot promote")
        assert self._promoter is not None
        result = await self._promoter.promote()
        p = result.promotion
        return pb.PromoteResponse(
            epoch=p.epoch,
            history_id=p.history_id,
            switch_offset=p.switch_offset,
            already_primary=result.already_primary,
        )

    async def Digest(
        self,
        request: pb.DigestRequest,
        context: grpc.aio.ServicerContext[pb.DigestRequest, pb.DigestResponse],
    ) -> pb.DigestResponse:
        timeout = request.timeout_seconds or self.default_digest_timeout
        try:
            view = await self._slot.log.view_at(request.at_offset, within=timeout)
        except OffsetPassed as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"offset {request.at_offset} not reached in {timeout:.1f}s "
                f"(at {self._slot.log.last_offset})",
            )
        digest = await asyncio.to_thread(view_digest, view)
        return pb.DigestResponse(digest=digest, offset=view.offset)


@dataclass(frozen=True)
class VerifyResult:
    equal: bool
    offset: int
    primary_digest: str
    standby_digest: str


async def verify_digests(
    primary: replication_pb2_grpc.AdminServiceAsyncStub,
    standby: replication_pb2_grpc.AdminServiceAsyncStub,
    *,
    attempts: int = 6,
    per_call_seconds: float = 5.0,
) -> VerifyResult:
    """Compare both nodes' digests at the same offset (see the module docstring)."""
    role = await primary.Role(pb.RoleRequest())
    target = role.applied_offset
    deadline = time.monotonic() + per_call_seconds * attempts
    last_error = ""
    for _ in range(attempts):
        if time.monotonic() > deadline:
            break
        req = pb.DigestRequest(at_offset=target, timeout_seconds=per_call_seconds)
        p_call = asyncio.ensure_future(primary.Digest(req))
        s_call = asyncio.ensure_future(standby.Digest(req))
        results = await asyncio.gather(p_call, s_call, return_exceptions=True)
        p_res, s_res = results
        if isinstance(p_res, pb.DigestResponse) and isinstance(s_res, pb.DigestResponse):
            return VerifyResult(p_res.digest == s_res.digest, target, p_res.digest, s_res.digest)
        last_error = "; ".join(str(r) for r in results if isinstance(r, BaseException))
        role = await primary.Role(pb.RoleRequest())
        # Writes going on: aim at the next offset, which both nodes will pin before
        # reaching. Writes stopped: the current offset is stable.
        passed = any(
            isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.FAILED_PRECONDITION
            for r in results
        )
        target = role.applied_offset + 1 if passed else role.applied_offset
    raise TimeoutError(f"could not take both digests at one offset: {last_error}")
