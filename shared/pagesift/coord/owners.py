"""The hosts a node's pair owns, read from the registry: the etcd shell of ``ownership``.

What it owns
------------
``RegistryOwners``, the ``OwnersSource`` a clustered node's job runtime asks
(``pagesift.primary.jobs.clustered``): every ``interval`` seconds one read of the
registry's node records (``EtcdRegistry.nodes``: the same records, decoded the same way,
that cluster clients place by), turned into the placeable pairs (``registry.placeable``
over ``registry.pair_views``) and kept as one immutable ``Owners`` (pure:
``pagesift.core.cluster.ownership``). ``current`` hands out the last good read's and
never calls etcd, so a refusal costs no round trip and an etcd outage never blocks a
start: the node goes on deciding by its last read (before any read it refuses nothing).

With a ``Tenure`` (``pagesift.core.cluster.tenure``: the node's hold on its hosts,
which its registrar feeds too) every good read is also the tenure's ``read``, and
``fence(host, now)`` is its ``wait``: the seconds a request to a host this pair owns
must still wait (a handover, a lease not confirmed). A read that changes who owns what
calls ``moved`` with the new ``Owners`` (the job runtime abandons the requests in
flight to the hosts that left). ``joined`` says this node has just become its pair's
primary: the hosts other pairs owned while the pair had none wait the handover.

Bounds: one read per ``interval`` (a prefix scan of ``C/nodes/``, as a client's view
does), each bounded by the registry's timeout; a failed read keeps the last ``Owners``
and is logged at most once per outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from pagesift.coord.etcd import EtcdUnavailable
from pagesift.coord.registry import EtcdRegistry
from pagesift.core.cluster.ownership import Owners
from pagesift.core.cluster.registryrules import pair_views, placeable
from pagesift.core.cluster.tenure import Tenure

__all__ = ["READ_SECONDS", "RegistryOwners"]

log = logging.getLogger(__name__)

READ_SECONDS = 1.0  # how often the node reads who owns what (a client's view: 1 s too)


class RegistryOwners:
    """The owners of hosts as pair ``here`` reads them from ``registry``."""

    def __init__(
        self,
        registry: EtcdRegistry,
        here: str,
        *,
        interval: float = READ_SECONDS,
        tenure: Tenure | None = None,
    ):
        self.registry = registry
        self.here = here
        self.interval = interval
        self.tenure = tenure
        self.moved: Callable[[Owners], object] | None = None
        self._owners = Owners(here)
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def current(self) -> Owners:
        return self._owners

    def fence(self, host: str, now: float) -> float:
        return 0.0 if self.tenure is None else self.tenure.wait(host, now)

    def joined(self, now: float) -> None:
        if self.tenure is not None:
            self.tenure.joined(now)

    async def read(self) -> None:
        """One read of the registry (``EtcdUnavailable`` when etcd does not answer)."""
        records = await self.registry.nodes()
        before = self._owners
        self._owners = Owners.read(self.here, placeable(pair_views(records).values()))
        if self.tenure is not None and self._owners.pairs is not None:
            self.tenure.read(self._owners.pairs, time.monotonic())
        if self.moved is not None and before.pairs is not None and before != self._owners:
            self.moved(self._owners)

    async def start(self) -> None:
        """The first read (bounded; a failure leaves ``Owners.unknown``), then the loop."""
        with contextlib.suppress(EtcdUnavailable):
            await self.read()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"owners-{self.here}")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.read()
                self._failing = False
            except EtcdUnavailable as e:
                if not self._failing:
                    log.info("cluster %s: who owns which host stays as last read: %s",
                             self.registry.cluster, e)  # fmt: skip
                self._failing = True

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.registry.close()
