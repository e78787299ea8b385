"""Real etcd for the fault tests and the bench: one member or three, on loopback.

What it owns
------------
``EtcdCluster(workdir, members=1|3)`` runs Debian's ``/usr/bin/etcd`` (etcd-server),
each member a ``pagesift.core.util.children.Child`` (its own process group, output in
``workdir/etcd-<name>.log``, data in ``workdir/etcd-<name>``), client and peer ports
picked free on 127.0.0.1. Per member: ``kill`` (SIGKILL), ``freeze``/``thaw``
(SIGSTOP/SIGCONT, and ``frozen()`` for a block), ``restart`` (the same data directory
and flags, ``--initial-cluster-state existing`` once it has data). For the whole
cluster: ``outage()`` freezes every member for a block (the coordinator gone, its
sockets open: a stall as clients see it), ``endpoint`` (``etcd://a,b,c``, what
``--witness`` takes), ``endpoint_of(i)``, ``writes()`` (raft proposals committed,
from a member's own ``/metrics``: every put, txn, lease grant and revoke is one),
``close`` (SIGTERM, bounded, then SIGKILL: also the async context manager's exit).

``tests/helpers``' ``etcd`` fixture (one member, the drill's ``Etcd``) serves the
witness tests; this module adds the three-member quorum, per-member faults and the
write count, without changing that fixture.

Bounds
------
``start``/``restart`` wait for ``/health`` at most ``timeout`` seconds (a member of
three reports healthy only once the cluster has a leader, i.e. a quorum); a member
that exits meanwhile raises at once with its log's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import TracebackType

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pagesift.core.util.children import Child, free_port

ETCD = "/usr/bin/etcd"


class Member:
    """One etcd member: its name, ports, data directory and process."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.name = name
        self.client_port, self.peer_port = free_port(), free_port()
        self.data = workdir / f"etcd-{name}"
        self.child = Child(f"etcd {name}", [], workdir / f"etcd-{name}.log")

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"


class EtcdCluster:
    def __init__(self, workdir: Path, members: int = 1) -> None:
        if not Path(ETCD).exists():
            raise RuntimeError(f"etcd not found at {ETCD} (Debian: apt-get install etcd-server)")
        workdir.mkdir(parents=True, exist_ok=True)
        self.members = [Member(workdir, f"m{i}") for i in range(members)]
        self._initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoint(self) -> str:
        return "etcd://" + ",".join(m.address for m in self.members)

    def endpoint_of(self, i: int) -> str:
        return f"etcd://{self.members[i].address}"

    def _argv(self, m: Member) -> list[str]:
        state = "existing" if (m.data / "member").exists() else "new"
        return [
            ETCD, "--name", m.name, "--data-dir", str(m.data),
            "--listen-client-urls", m.client_url, "--advertise-client-urls", m.client_url,
            "--listen-peer-urls", m.peer_url, "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", self._initial, "--initial-cluster-state", state,
            "--initial-cluster-token", "pagesift-faults",
        ]  # fmt: skip

    async def start(self, timeout: float = 30.0) -> EtcdCluster:
        for m in self.members:  # all at once: a member of three waits for its peers
            m.child.argv = self._argv(m)
            m.child.start()
        for i in range(len(self.members)):
            await self.wait_healthy(i, timeout)
        return self

    async def wait_healthy(self, i: int, timeout: float = 30.0) -> None:
        m = self.members[i]
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as http:
            while time.monotonic() < deadline:
                if not m.child.alive:
                    raise RuntimeError(f"etcd {m.name} exited:\n{m.child.tail()}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with http.get(f"{m.client_url}/health") as resp:
                        body = json.loads(await resp.text())  # served as text/plain
                        if resp.status == 200 and body.get("health") == "true":
                            return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"etcd {m.name} not healthy after {timeout:g} s:\n{m.child.tail()}")

    # --- faults ----------------------------------------------------------------------
    def kill(self, i: int) -> None:
        self.members[i].child.kill()

    async def restart(self, i: int, timeout: float = 30.0) -> None:
        m = self.members[i]
        m.child.kill()  # a frozen or running member first goes for good
        m.child.argv = self._argv(m)
        m.child.start()
        await self.wait_healthy(i, timeout)

    def _signal(self, i: int, sig: signal.Signals) -> None:
        child = self.members[i].child
        if child.proc is not None and child.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.proc.pid, sig)

    def freeze(self, i: int) -> None:
        """SIGSTOP member ``i``: alive, its sockets open, answering nothing."""
        self._signal(i, signal.SIGSTOP)

    def thaw(self, i: int) -> None:
        self._signal(i, signal.SIGCONT)

    @contextlib.contextmanager
    def frozen(self, i: int) -> Iterator[None]:
        self.freeze(i)
        try:
            yield
        finally:
            self.thaw(i)

    @contextlib.asynccontextmanager
    async def outage(self) -> AsyncIterator[None]:
        """Every member SIGSTOPped for the block, SIGCONTed after (and healthy again)."""
        for i in range(len(self.members)):
            self.freeze(i)
        try:
            yield
        finally:
            for i in range(len(self.members)):
                self.thaw(i)
        for i in range(len(self.members)):
            await self.wait_healthy(i)

    # --- figures ---------------------------------------------------------------------
    async def writes(self, i: int = 0) -> int:
        """Raft proposals committed, as member ``i`` counts them (every write to etcd:
        puts, transactions, lease grants and revokes; keepalives are not proposals)."""
        timeout = aiohttp.ClientTimeout(total=5)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(f"{self.members[i].client_url}/metrics") as resp,
        ):
            text = await resp.text()
        for family in text_string_to_metric_families(text):
            if family.name == "etcd_server_proposals_committed_total":
                return int(family.samples[0].value)
        raise RuntimeError("etcd's /metrics has no etcd_server_proposals_committed_total")

    async def close(self) -> None:
        for i in range(len(self.members)):
            self.thaw(i)  # a stopped process would sit out its SIGTERM's grace
        await asyncio.gather(*(asyncio.to_thread(m.child.stop, 10.0) for m in self.members))

    async def __aenter__(self) -> EtcdCluster:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
