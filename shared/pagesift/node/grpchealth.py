"""Role-aware ``grpc.health.v1``: which node takes writes, which standby may serve reads.

Service names and what SERVING means (``health_statuses`` decides, a pure function):

- ``""``: the process serves (liveness);
- ``pagesift.primary``: this node takes writes now (NOT_SERVING on a standby, on a
  fenced node, on a primary whose witness lease has lapsed or is not yet
  published: ``rolestate.takes_writes``, and on a primary whose store refuses writes:
  its volume is full or failed, ``pagesift.core.api.storagewatch``; SERVING again once the
  store takes writes);
- ``pagesift.replica``: a standby that has synced with its primary and is within
  ``replica_max_lag`` seconds of it. A standby whose session dropped stays SERVING
  until the time since it last heard its primary (plus the lag it had then) passes
  ``replica_max_lag``, so a primary restart or a network blip does not drop it from a
  load balancer at once; a standby that never synced is NOT_SERVING;
- ``pagesift.v1.JobService``: SERVING while the process serves, on every role (a
  standby answers reads and refuses writes naming the primary; route writes by
  ``pagesift.primary``);
- ``pagesift.render``: this node can render pages (its ``browser_executable`` is
  there), whatever its role: a standby without a browser is healthy (the names above)
  and says NOT_SERVING here, so it cannot take over rendering work when promoted.

``HealthPublisher`` is the node's shell for it: every ``interval`` seconds, and at
once when the role changes, it reads the node's figures and pushes each status that
changed to the ``HealthServicer`` (``set`` only on a change), so Watch streams see
every transition.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

from grpc_health.v1 import health_pb2

from pagesift.core.ha.roles import Role
from pagesift.core.util.tasks import cancel_and_wait
from pagesift.node.status import RoleStatus

LIVENESS = ""
PRIMARY = "pagesift.primary"
REPLICA = "pagesift.replica"
JOB_SERVICE = "pagesift.v1.JobService"
RENDER = "pagesift.render"

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

#: ``health_pb2.HealthCheckResponse.ServingStatus`` (grpc_health ships no usable types).
ServingStatus = Any


def health_statuses(
    role: Role,
    takes_writes: bool,
    connected: bool,
    lag_seconds: float,
    replica_max_lag: float,
    store_writable: bool = True,
) -> dict[str, ServingStatus]:
    """Every health service name's status for a node in ``role``; ``takes_writes``:
    it is the primary and (with a witness) holds its lease; ``store_writable``: its
    store takes writes (False while the volume is full or failed).

    ``connected``: (standby) it has synced with its primary since it started following;
    ``lag_seconds``: how far behind the primary its data may be (``Freshness``).
    """

    def status(ok: bool) -> ServingStatus:
        return SERVING if ok else NOT_SERVING

    fresh_replica = role == Role.STANDBY and connected and lag_seconds <= replica_max_lag
    return {
        LIVENESS: SERVING,
        JOB_SERVICE: SERVING,
        PRIMARY: status(takes_writes and store_writable),
        REPLICA: status(fresh_replica),
    }


@dataclass
class Freshness:
    """A standby's staleness across dropped sessions (pure: the caller passes ``now``).

    While a session is up it is the follower's lag; once it drops, the lag it had then
    plus the time since (the primary may have written since without us hearing).
    """

    synced: bool = False
    last_heard: float = 0.0
    lag_then: float = 0.0

    def observe(self, connected: bool, lag_seconds: float, now: float) -> tuple[bool, float]:
        """(has synced, lag seconds) from the follower's figures at ``now``."""
        if connected:
            self.synced, self.last_heard, self.lag_then = True, now, lag_seconds
            return True, lag_seconds
        if not self.synced:
            return False, math.inf
        return True, self.lag_then + (now - self.last_heard)


class _Servicer(Protocol):
    async def set(self, service: str, status: ServingStatus) -> None: ...


class _Node(Protocol):
    @property
    def role(self) -> Role: ...

    @property
    def role_changed(self) -> asyncio.Event: ...

    @property
    def takes_writes(self) -> bool: ...

    @property
    def store_writable(self) -> bool: ...

    def role_status(self) -> RoleStatus: ...

    @property
    def can_render(self) -> bool: ...


class HealthPublisher:
    """Pushes ``health_statuses`` of ``node`` to ``servicer`` as they change."""

    def __init__(
        self, node: _Node, servicer: _Servicer, *, replica_max_lag: float, interval: float = 0.25
    ) -> None:
        self._node = node
        self._servicer = servicer
        self._max_lag = replica_max_lag
        self._interval = interval
        self._freshness = Freshness()
        self._published: dict[str, ServingStatus] = {}
        self._task: asyncio.Task[None] | None = None

    def current(self) -> dict[str, ServingStatus]:
        s = self._node.role_status()
        if s.role == Role.STANDBY:
            connected, lag = self._freshness.observe(s.connected, s.lag_seconds, time.monotonic())
        else:
            self._freshness = Freshness()  # a later standby life starts unsynced
            connected, lag = s.connected, s.lag_seconds
        takes_writes = self._node.takes_writes
        writable = self._node.store_writable
        out = health_statuses(s.role, takes_writes, connected, lag, self._max_lag, writable)
        out[RENDER] = SERVING if self._node.can_render else NOT_SERVING
        return out

    async def publish(self) -> None:
        """Set every status that differs from the last one published."""
        for service, status in self.current().items():
            if self._published.get(service) != status:
                await self._servicer.set(service, status)
                self._published[service] = status

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="health")

    async def _run(self) -> None:
        changed = self._node.role_changed
        while True:
            changed.clear()
            await self.publish()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self._interval)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
