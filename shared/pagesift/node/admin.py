"""``AdminService``: Role, Promote, Digest and Backup, on either role.

It reports both roles' figures (the sender's on a primary, the follower's on a
standby: ``pagesift.node.status``), so it lives in the composition root.

Digest at an offset (how both nodes hash "the same" state while writes go on)
-----------------------------------------------------------------------------
A digest is always taken from a consistent cut (``cuts.View``: a RocksDB iterator
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

The client side, comparing both nodes at one offset, is
``pagesift.core.replication.verify.verify_digests``.

Backup (a consistent copy of the store, streamed as a data directory) is
``pagesift.core.replication.backup.BackupSource``: one per servicer, so one backup at a time per
node (a second one: RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from pagesift.core.api.errortable import (
    BackupFailed,
    BackupInProgress,
    CannotPromote,
    DigestOffsetPassed,
    NodeRefuser,
    OffsetNotReached,
    answers_errors,
)
from pagesift.core.replication.backup import BackupBusy, BackupSource
from pagesift.core.store.cuts import OffsetPassed, view_digest
from pagesift.node.replicationparts import ReplicationParts
from pagesift.node.status import role_response
from pagesift.v1 import replication_pb2 as pb
from pagesift.v1 import replication_pb2_grpc


class AdminServicer(replication_pb2_grpc.AdminServiceServicer, NodeRefuser):
    """Role, Promote and Digest for the node whose replication pieces are ``parts``
    (read at each call: the node may start or stop following, or become promotable,
    while it runs). A node without a promoter cannot be promoted. Refusals are domain
    exceptions, sent as the error table's rows (``answers_errors``)."""

    def __init__(self, parts: ReplicationParts, *, default_digest_timeout: float = 10.0) -> None:
        self._parts = parts
        self.default_digest_timeout = default_digest_timeout
        self.backups = BackupSource(parts.slot, parts.node_id)

    async def Role(
        self,
        request: pb.RoleRequest,
        context: grpc.aio.ServicerContext[pb.RoleRequest, pb.RoleResponse],
    ) -> pb.RoleResponse:
        return role_response(self._parts.status(), self._parts.node_id)

    @answers_errors
    async def Promote(
        self,
        request: pb.PromoteRequest,
        context: grpc.aio.ServicerContext[pb.PromoteRequest, pb.PromoteResponse],
    ) -> pb.PromoteResponse:
        promoter = self._parts.promoter
        if promoter is None:
            log = self._parts.slot.log
            if log.writable:  # a node started as the primary: report its state (the contract)
                return pb.PromoteResponse(
                    epoch=log.epoch,
                    history_id=log.history_id,
                    switch_offset=log.switch_offset,
                    already_primary=True,
                )
            raise CannotPromote()
        result = await promoter.promote()
        p = result.promotion
        return pb.PromoteResponse(
            epoch=p.epoch,
            history_id=p.history_id,
            switch_offset=p.switch_offset,
            already_primary=result.already_primary,
        )

    @answers_errors
    async def Digest(
        self,
        request: pb.DigestRequest,
        context: grpc.aio.ServicerContext[pb.DigestRequest, pb.DigestResponse],
    ) -> pb.DigestResponse:
        slot = self._parts.slot
        timeout = request.timeout_seconds or self.default_digest_timeout
        try:
            view = await slot.log.view_at(request.at_offset, within=timeout)
        except OffsetPassed as exc:
            raise DigestOffsetPassed(request.at_offset, str(exc)) from exc
        except TimeoutError:  # the caller's own wait bound (timeout_seconds)
            raise OffsetNotReached(request.at_offset, slot.log.last_offset, timeout) from None
        digest = await asyncio.to_thread(view_digest, view)
        return pb.DigestResponse(digest=digest, offset=view.offset)

    @answers_errors
    async def Backup(
        self,
        request: pb.BackupRequest,
        context: grpc.aio.ServicerContext[pb.BackupRequest, pb.BackupResponse],
    ) -> AsyncIterator[pb.BackupResponse]:
        # aclosing: a cancelled call closes the stream at once (its temp directory goes)
        async with contextlib.aclosing(self.backups.stream()) as stream:
            try:
                async for message in stream:
                    yield message
            except BackupBusy as exc:
                raise BackupInProgress(str(exc)) from exc
            except Exception as exc:  # a RocksDB or file error: say what it was
                raise BackupFailed(exc) from exc
