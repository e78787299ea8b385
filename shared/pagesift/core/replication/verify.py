"""``verify_digests``: do a primary and its standby hold the same state? (client side)

It drives ``AdminService.Digest`` on both nodes (the server side, and how a node takes
a digest at an offset while writes go on, is ``pagesift.node.admin``): it asks the
primary for its offset P and asks both nodes for the digest at P concurrently. If
writes continue, the primary may be past P already: then it retries at a FUTURE
offset (current + 1), which both nodes pin before reaching it, so the comparison is
exact while writes go on. If writes stop, both already stand at (or the standby soon
reaches) P. So: exact comparison at one offset in both cases, never holding writers
or the standby's apply.

Only the AdminService stubs are needed: the CLI (``pagesift verify``) and the tests
use it without loading either role.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc

from pagesift.v1 import replication_pb2 as pb
from pagesift.v1 import replication_pb2_grpc


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
