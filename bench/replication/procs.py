"""Processes and clients of the replication bench: spawn, stop, talk to, and sample nodes.

Owns the node processes (``spawn``/``stop``, a ``pagesift serve`` primary or standby, the
primary driver of ``driver``), their config (``server_config``, the crawl bench's, plus
the pair's replication token), the async gRPC clients of one node (``Node``: admin, jobs,
the driver's control call), bounded polling (``until``, ``connected``, ``applied``) and
``Sampler``, which asks every node for its Role every 20 ms and records ``stats.Samples``.
Each process logs to ``bench/out/replication-<name>.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc

from bench.common import LOOPBACK, MB, OUT_DIR, REPO_DIR, free_port, say, stop_serve
from bench.replication.driver import DRIVER_METHOD
from bench.replication.stats import Samples
from pagesift.core.api.tls import write_new_token
from pagesift.core.util.children import Child, serve_argv

SAMPLE_PERIOD = 0.02
READY_TIMEOUT = 60.0
RPC_TIMEOUT = 10.0
GRPC_OPTIONS = [("grpc.max_receive_message_length", 256 * MB)]

# ============================================================================ processes


@dataclass
class Proc:
    name: str
    child: Child
    log: Path
    addr: str

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        assert self.child.proc is not None  # started by ``spawn``
        return self.child.proc


def spawn(name: str, cmd: list[str], addr: str) -> Proc:
    """``cmd`` from the repository directory (``pagesift.core.util.children.Child``: its own
    process group, stopped for sure), its output in a fresh ``replication-<name>.log``."""
    log = OUT_DIR / f"replication-{name}.log"
    say("$ " + shlex.join(cmd))
    log.unlink(missing_ok=True)
    child = Child(name, cmd, log, cwd=REPO_DIR)
    child.start()
    return Proc(name, child, log, addr)


def stop(proc: Proc | None) -> None:
    if proc is not None:
        code = stop_serve(proc.child, grace=20)
        say(f"{proc.name} stopped (exit {code})")


def serve_cmd(role: str, addr: str, data: Path, conf: Path, primary: str = "") -> list[str]:
    cmd = serve_argv("--role", role)
    cmd += [
        "--listen",
        addr,
        "--data",
        str(data),
        "--allow-private-networks",
        "--config",
        str(conf),
    ]
    if primary:
        cmd += ["--primary", primary]
    return cmd


def server_config(tmp: Path, concurrency: int) -> Path:
    """The crawl bench's server config (per-host concurrency = the crawl's)."""
    tmp.mkdir(parents=True, exist_ok=True)
    conf = tmp / "server.toml"
    token = tmp / "replication.token"
    if not token.exists():
        write_new_token(token)
    lines = [
        "[server]",
        f"per_host_concurrency = {concurrency}",
        f'replication_token_file = "{token}"',
    ]
    if concurrency > 64:
        lines.append(f"max_concurrency = {concurrency}")
    conf.write_text("\n".join(lines) + "\n")
    return conf


def start_driver(tmp: Path, backlog_mb: int = 512) -> Proc:
    """A primary driver process (``driver.serve``) on a free port, data in ``tmp/primary``."""
    addr = f"{LOOPBACK}:{free_port()}"
    cmd = [sys.executable, "-m", "bench.replication", "primary", addr, str(tmp / "primary")]
    return spawn("primary-driver", [*cmd, str(backlog_mb)], addr)


def start_primary(name: str, data: Path, conf: Path) -> Proc:
    addr = f"{LOOPBACK}:{free_port()}"
    return spawn(name, serve_cmd("primary", addr, data, conf), addr)


def start_standby(name: str, data: Path, conf: Path, primary: str) -> Proc:
    addr = f"{LOOPBACK}:{free_port()}"
    return spawn(name, serve_cmd("standby", addr, data, conf, primary), addr)


def du(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                total += p.stat().st_size
    return total


# ============================================================================ gRPC clients


class Node:
    """Async clients for one node (admin + jobs, or the driver's control call)."""

    def __init__(self, proc: Proc) -> None:
        from pagesift.v1 import jobs_pb2_grpc, replication_pb2_grpc

        self.proc = proc
        self.channel = grpc.aio.insecure_channel(proc.addr, options=GRPC_OPTIONS)
        self.admin = replication_pb2_grpc.AdminServiceStub(self.channel)
        self.jobs = jobs_pb2_grpc.JobServiceStub(self.channel)
        self._call = self.channel.unary_unary(DRIVER_METHOD, None, None)

    async def role(self, timeout: float = 2.0) -> Any:
        from pagesift.v1 import replication_pb2 as pb

        return await self.admin.Role(pb.RoleRequest(), timeout=timeout)

    async def control(self, cmd: str, timeout: float = RPC_TIMEOUT, **kw: Any) -> dict[str, Any]:
        """One command to a driver (``driver.Driver.handle``)."""
        raw = await self._call(json.dumps({"cmd": cmd, **kw}).encode(), timeout=timeout)
        out: dict[str, Any] = json.loads(cast(bytes, raw))
        return out

    async def ready(self, timeout: float = READY_TIMEOUT) -> float:
        """Poll Role until it answers; returns seconds waited. Raises if the process died."""
        t0 = time.monotonic()
        last: Exception | None = None
        while time.monotonic() - t0 < timeout:
            if self.proc.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.proc.name} exited {self.proc.popen.returncode}; see {self.proc.log}"
                )
            try:
                await self.role(timeout=1.0)
                return time.monotonic() - t0
            except grpc.aio.AioRpcError as exc:
                last = exc
                await asyncio.sleep(0.05)
        raise TimeoutError(f"{self.proc.name} not serving after {timeout:.0f}s: {last!r}")

    async def close(self) -> None:
        await self.channel.close(grace=None)


async def attach(proc: Proc, nodes: list[Node]) -> Node:
    """Clients for ``proc``, added to ``nodes`` (which the caller closes), once it serves."""
    node = Node(proc)
    nodes.append(node)
    await node.ready()
    return node


# ============================================================================ polling


async def until(
    pred: Callable[[], Awaitable[bool]], what: str, timeout: float, step: float = 0.02
) -> float:
    """Await ``pred()`` until true (bounded); returns the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(grpc.aio.AioRpcError):
            if await pred():
                return time.monotonic() - t0
        await asyncio.sleep(step)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


async def connected(n: Node) -> bool:
    return bool((await n.role()).connected)


async def applied(n: Node, offset: int) -> bool:
    return int((await n.role()).applied_offset) >= offset


class Sampler:
    """Role on every node every ``period`` s (concurrently per round) until stopped."""

    def __init__(self, nodes: Sequence[Node], period: float = SAMPLE_PERIOD, max_s: float = 600):
        self.nodes = list(nodes)
        self.period = period
        self.max_s = max_s
        self.samples = Samples([n.proc.name for n in nodes])
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Sampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> Samples:
        self._stop.set()
        if self._task is not None:
            await self._task
        return self.samples

    def last(self, i: int) -> int:
        for row in reversed(self.samples.applied):
            if row[i] >= 0:
                return row[i]
        return -1

    async def _run(self) -> None:
        t0 = time.monotonic()
        nxt = t0
        while not self._stop.is_set() and time.monotonic() - t0 < self.max_s:
            a = time.monotonic()
            res = await asyncio.gather(
                *(n.role(timeout=1.0) for n in self.nodes), return_exceptions=True
            )
            b = time.monotonic()
            row = [-1 if isinstance(r, BaseException) else int(r.applied_offset) for r in res]
            self.samples.t.append((a + b) / 2)
            self.samples.applied.append(row)
            first = res[0]
            self.samples.primary_offset.append(
                -1 if isinstance(first, BaseException) else int(first.primary_offset)
            )
            nxt += self.period
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
            if time.monotonic() - nxt > self.period:
                nxt = time.monotonic()  # fell behind (a slow round): do not burst
