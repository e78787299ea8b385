"""A node's role and replication figures, computed once for every reader.

``role_status`` is the single place that reads them; the Prometheus series
(``figures`` -> ``ReplicationFigures``) and the AdminService Role call
(``role_response``) are two renderings of the same ``RoleStatus``.

Which side reports the link: a writable primary reports its sender (the standby it
serves); a node that follows reports its follower (the primary it follows); a node
doing neither (a fenced former primary) reports its sender's last figures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pagesift.core.api.metricsources import ReplicationFigures
from pagesift.core.ha.roles import Role
from pagesift.core.replication.log import Log
from pagesift.primary.replication import ReplicationServicer
from pagesift.standby.follower import Follower
from pagesift.v1 import replication_pb2 as pb

_PB_ROLES = {
    Role.PRIMARY: pb.NODE_ROLE_PRIMARY,
    Role.STANDBY: pb.NODE_ROLE_STANDBY,
    Role.FENCED: pb.NODE_ROLE_FENCED,
}


@dataclass(frozen=True)
class RoleStatus:
    role: Role
    epoch: int
    history_id: str
    applied_offset: int  # this node's last offset
    backlog_bytes: int
    primary_offset: int  # the primary's last offset, as far as this node knows
    acked_offset: int = 0  # what the standby acknowledged (on a standby: its own applied)
    lag_offsets: int = 0
    lag_seconds: float = 0.0
    peer: str = ""  # the standby served, or the primary followed
    connected: bool = False
    full_resyncs: int = 0
    continues: int = 0
    discarded: int = 0  # a standby's discarded entries (never on a primary)
    sync_degraded: bool = False  # sync mode is degraded to async now
    sync_degraded_total: int = 0  # how many times it degraded


def role_status(
    log: Log,
    sender: ReplicationServicer,
    follower: Follower | None,
    *,
    role: Role | None = None,
) -> RoleStatus:
    """The figures of a node with this ``log``, its ``sender`` (the ReplicationService it
    serves) and its ``follower`` (if it follows).

    ``role`` is the node's role as its owner tracks it; the log's own view by default.
    """
    status = RoleStatus(
        role=log.role if role is None else role,
        epoch=log.epoch,
        history_id=log.history_id,
        applied_offset=log.last_offset,
        backlog_bytes=log.backlog_bytes,
        primary_offset=log.last_offset,
    )
    if follower is not None and not log.writable:
        fs = follower.status()
        return replace(
            status,
            primary_offset=fs.primary_offset,
            acked_offset=fs.applied_offset,
            lag_offsets=fs.lag_offsets,
            lag_seconds=fs.lag_seconds,
            peer=fs.target,
            connected=fs.connected,
            full_resyncs=fs.full_resyncs,
            continues=fs.continues,
            discarded=fs.discarded,
        )
    ps = sender.status()
    return replace(
        status,
        primary_offset=ps.last_offset,
        acked_offset=ps.acked_offset,
        lag_offsets=ps.lag_offsets,
        lag_seconds=ps.lag_seconds,
        peer=ps.peer,
        connected=ps.connected,
        full_resyncs=sender.full_resyncs,
        continues=sender.continues,
        sync_degraded=ps.sync_degraded,
        sync_degraded_total=sender.sync_degraded_total,
    )


def figures(s: RoleStatus) -> ReplicationFigures:
    """``s`` as the replication series show it."""
    return ReplicationFigures(
        role=s.role.value,
        epoch=s.epoch,
        applied_offset=s.applied_offset,
        primary_offset=s.primary_offset,
        acked_offset=s.acked_offset,
        lag_seconds=s.lag_seconds,
        connected=s.connected,
        backlog_bytes=s.backlog_bytes,
        full_resyncs=s.full_resyncs,
        sync_degraded=s.sync_degraded_total,
    )


def role_response(s: RoleStatus, node_id: str) -> pb.RoleResponse:
    """``s`` as the AdminService Role call answers it."""
    return pb.RoleResponse(
        role=_PB_ROLES[s.role],
        epoch=s.epoch,
        history_id=s.history_id,
        applied_offset=s.applied_offset,
        node_id=node_id,
        primary_offset=s.primary_offset,
        lag_offsets=s.lag_offsets,
        lag_seconds=s.lag_seconds,
        peer=s.peer,
        connected=s.connected,
        sync_degraded=s.sync_degraded,
        full_resyncs=s.full_resyncs,
        continues=s.continues,
        discarded=s.discarded,
    )
