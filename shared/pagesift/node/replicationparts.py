"""A node's replication pieces, wired one way for the server, the tests and the bench.

``ReplicationParts`` holds what replication needs on one node, whatever its role:

- the store slot (store + replication log) and the node's id;
- ``sender``: the primary's side (``ReplicationServicer``). Every node has one and
  serves it (a standby's refuses until a promotion makes it the primary);
- ``follower``: the standby's side, while the node follows a primary (``follow``);
- ``promoter``: on a node that may be promoted (``enable_promotion``); its first
  step stops the follower;
- fencing: after a promotion, ``fence_former_primary`` deposes the primary the node
  used to follow (``pagesift.standby.fencing``), saying hello with the new epoch.

``pagesift.node.grpcserver.grpc_server`` puts them (and an ``AdminServicer`` over
them) on a gRPC server; ``role_status`` reads their figures, with the node's role from
the ``role`` source it is given (the node's role machine), else the log's view.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypedDict, Unpack

import grpc

from pagesift.core.ha.failsafe import StandbyPromise
from pagesift.core.ha.fencingrules import FencingVerdict
from pagesift.core.ha.roles import Role
from pagesift.core.replication.slot import StoreSlot
from pagesift.node.status import RoleStatus, role_status
from pagesift.primary.replication import ReplicationServicer
from pagesift.standby.fencing import fence_former_primary
from pagesift.standby.follower import Follower, hello_message
from pagesift.standby.promotion import Promoter
from pagesift.v1 import replication_pb2 as pb


class SenderTuning(TypedDict, total=False):
    """``ReplicationServicer`` knobs (its defaults apply to those left out)."""

    mode: str
    sync_timeout: float
    heartbeat_interval: float
    chunk_bytes: int


class FollowerTuning(TypedDict, total=False):
    """``Follower`` knobs (its defaults apply to those left out)."""

    idle_timeout: float
    backoff_base: float
    backoff_cap: float


class ReplicationParts:
    """One node's replication pieces (see the module docstring)."""

    def __init__(
        self,
        slot: StoreSlot,
        *,
        node_id: str,
        address: str = "",
        on_fenced: Callable[[int, str], Awaitable[None]] | None = None,
        role: Callable[[], Role] | None = None,
        promise: StandbyPromise | None = None,
        **tuning: Unpack[SenderTuning],
    ) -> None:
        self.slot = slot
        self.promise = promise  # failsafe: what every follower of this node promises
        self.node_id = node_id
        self.sender = ReplicationServicer(
            slot, node_id=node_id, address=address, on_fenced=on_fenced, **tuning
        )
        self.follower: Follower | None = None
        self.promoter: Promoter | None = None
        self._role = role

    def follow(
        self,
        target: str,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
        **tuning: Unpack[FollowerTuning],
    ) -> Follower:
        """Start following the primary at ``target`` (replacing a stopped follower)."""
        self.follower = Follower(
            self.slot,
            target,
            node_id=self.node_id,
            credentials=credentials,
            metadata=metadata,
            promise=self.promise,
            **tuning,
        )
        self.follower.start()
        return self.follower

    async def stop_following(self) -> None:
        if self.follower is not None:
            await self.follower.stop()

    def enable_promotion(self, on_promoted: Callable[[], Awaitable[None]]) -> Promoter:
        """Let this node be promoted; ``on_promoted`` runs once it is the primary."""
        self.promoter = Promoter(
            self.slot, stop_follower=self.stop_following, on_promoted=on_promoted
        )
        return self.promoter

    def fencing_hello(self) -> pb.Hello:
        """The hello a promoted node sends its former primary: our new epoch and history,
        and where we serve clients (so its refusals can name us)."""
        return hello_message(self.slot.log.hello(self.node_id), self.sender.address)

    def fence_former_primary(
        self,
        target: str,
        *,
        still_primary: Callable[[], bool],
        credentials: grpc.ChannelCredentials | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> asyncio.Task[FencingVerdict]:
        """Depose the primary at ``target`` for as long as we are the primary; a newer
        primary there deposes us instead (our sender steps down)."""
        return asyncio.create_task(
            fence_former_primary(
                target,
                self.fencing_hello,
                still_primary=still_primary,
                on_deposed=self.sender.step_down,
                credentials=credentials,
                metadata=metadata,
            ),
            name="fence-former-primary",
        )

    def status(self) -> RoleStatus:
        """This node's role and replication figures: the role from ``role`` (the node's
        role machine, ``pagesift.core.ha.rolestate``) when given, else the log's view."""
        role = self._role() if self._role is not None else None
        return role_status(self.slot.log, self.sender, self.follower, role=role)

    async def close(self) -> None:
        """Stop following; the slot stays open (its owner closes it)."""
        await self.stop_following()
