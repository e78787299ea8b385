"""Shared test plumbing: free ports, in-process nodes, server subprocesses, a demo site.

Everything listens on 127.0.0.1 only; every wait is bounded in time.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from pagesift.node import grpcserver
from pagesift.node.node import Node
from pagesift.shared import tls
from pagesift.shared.config import ServerConfig
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

TERMINAL = {
    jobs_pb2.JOB_STATE_COMPLETED,
    jobs_pb2.JOB_STATE_FAILED,
    jobs_pb2.JOB_STATE_CANCELLED,
}


def _pair_token_file() -> Path:
    """One replication token for every pair this test run starts (the file outlives
    the server processes that read it, and is removed at exit)."""
    folder = Path(tempfile.mkdtemp(prefix="pagesift-test-token-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "replication.token"
    tls.write_new_token(path)
    return path


PAIR_TOKEN_FILE = _pair_token_file()
PAIR_TOKEN = PAIR_TOKEN_FILE.read_text().strip()
#: Promote's credential on nodes without an [admin] key: the pair's token as the key.
PROMOTE_MD = (("authorization", f"Bearer {PAIR_TOKEN}"),)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RunningNode:
    address: str
    channel: grpc.aio.Channel
    stub: jobs_pb2_grpc.JobServiceAsyncStub
    config: ServerConfig
    node: Node


def node_config(data: Path, **overrides: Any) -> ServerConfig:
    values: dict[str, Any] = {
        "listen": f"127.0.0.1:{free_port()}",
        "data": data,
        "allow_private_networks": True,
        "read_timeout": 1.0,
        "connect_timeout": 1.0,
        "max_body_bytes": 1024 * 1024,
        "replication_token_file": str(PAIR_TOKEN_FILE),
    }
    values.update(overrides)
    return ServerConfig(**values)


@contextlib.asynccontextmanager
async def in_process_node(data: Path, **overrides: Any) -> AsyncIterator[RunningNode]:
    """A real node (gRPC server + store + engine) inside the test's event loop."""
    config = node_config(data, **overrides)
    stop = asyncio.Event()
    started: asyncio.Future[Node] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(grpcserver.run(config, stop, started))
    channel = grpc.aio.insecure_channel(config.listen)
    try:
        node = await asyncio.wait_for(asyncio.shield(started), 10)
        await asyncio.wait_for(channel.channel_ready(), 10)
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        yield RunningNode(config.listen, channel, stub, config, node)
    finally:
        await channel.close(None)
        stop.set()
        await asyncio.wait_for(task, 15)


async def wait_terminal(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str, timeout: float = 60.0
) -> jobs_pb2.GetJobResponse:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp = await stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, limit=1))
        if resp.state in TERMINAL:
            return resp
        await asyncio.sleep(0.05)
    raise TimeoutError(f"job {job_id} did not finish in {timeout} s")


async def all_documents(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str
) -> list[jobs_pb2.Document]:
    docs: list[jobs_pb2.Document] = []
    skip = 0
    for _ in range(10_000):
        resp = await stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=100))
        docs.extend(resp.documents)
        if not resp.HasField("next_skip") or resp.next_skip == skip:
            break
        skip = resp.next_skip
    return docs


def start_server_process(config_args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``pagesift serve`` as a real child process (killed with SIGKILL by crash tests)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pagesift.node.cli", "serve", *config_args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


async def wait_ready(address: str, timeout: float = 20.0) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout)


# ---------------------------------------------------------------- server processes

SERVE_CONFIG: dict[str, Any] = {
    "read_timeout": 1.0,
    "connect_timeout": 1.0,
    "max_body_bytes": 1024 * 1024,
    "extract_processes": 1,  # two cores for two nodes, the site and the test
    "replication_token_file": str(PAIR_TOKEN_FILE),
}


def _toml(values: Mapping[str, Any]) -> str:
    lines = ["[server]"]
    for key, value in values.items():
        lines.append(f"{key} = {json.dumps(value)}")  # ints, floats, bools, strings
    return "\n".join(lines) + "\n"


class ServeProc:
    """One ``pagesift serve`` child that can be SIGKILLed, stopped and restarted.

    Its data directory, log and TOML file are ``tmp/name``, ``tmp/name.log`` and
    ``tmp/name.toml``; the ``[server]`` table is ``base`` updated with ``config``
    (``base={}`` for exactly ``config``), kept as ``settings``.
    """

    def __init__(
        self,
        tmp: Path,
        name: str,
        *,
        role: str = "primary",
        primary: str = "",
        config: Mapping[str, Any] | None = None,
        extra: tuple[str, ...] = (),
        base: Mapping[str, Any] = SERVE_CONFIG,
    ) -> None:
        self.name = name
        self.address = f"127.0.0.1:{free_port()}"
        self.data = tmp / name
        self.log = tmp / f"{name}.log"
        self.config = tmp / f"{name}.toml"
        self.settings: dict[str, Any] = {**base, **(config or {})}
        self.config.write_text(_toml(self.settings))
        self.role = role
        self.primary = primary
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        out = ["--role", self.role, "--listen", self.address, "--data", str(self.data)]
        if self.role == "standby":
            out += ["--primary", self.primary]
        return [*out, "--allow-private-networks", "--config", str(self.config), *self.extra]

    def launch(self, *, role: str | None = None, primary: str | None = None) -> None:
        """Start the child and return at once (a standby starts following before it
        serves: ``start`` would miss what happens meanwhile)."""
        self.role = role or self.role
        self.primary = primary if primary is not None else self.primary
        self.stop()
        self.proc = start_server_process(self.args(), self.log)

    async def start(self, *, role: str | None = None, primary: str | None = None) -> None:
        self.launch(role=role, primary=primary)
        await wait_ready(self.address)

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is flushed but what is already durable."""
        assert self.proc is not None and self.proc.poll() is None, f"{self.name} is not running"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """SIGSTOP for the block, SIGCONT after: alive but unreachable (a partition
        from every peer at once), with its sockets open."""
        assert self.proc is not None and self.proc.poll() is None, f"{self.name} is not running"
        pid = self.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


NodeFactory = Callable[..., ServeProc]


@contextlib.contextmanager
def serve_procs(tmp: Path) -> Iterator[NodeFactory]:
    """Makes ``ServeProc``\\ s (``make(name, **kwargs)``); every one is stopped at the
    end, whatever happened. The body of a test module's ``nodes`` fixture."""
    made: list[ServeProc] = []

    def make(name: str, **kwargs: Any) -> ServeProc:
        node = ServeProc(tmp, name, **kwargs)
        made.append(node)
        return node

    try:
        yield make
    finally:
        for node in made:  # all at once: each may wait for its grace period
            if node.proc is not None and node.proc.poll() is None:
                node.proc.terminate()
        for node in made:
            node.stop()
