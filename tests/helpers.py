"""Shared test plumbing: free ports, in-process nodes, server subprocesses, a demo site.

Everything listens on 127.0.0.1 only; every wait is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from pagesift.primary import server
from pagesift.shared.config import ServerConfig
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

TERMINAL = {
    jobs_pb2.JOB_STATE_COMPLETED,
    jobs_pb2.JOB_STATE_FAILED,
    jobs_pb2.JOB_STATE_CANCELLED,
}


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
    node: server.Node


def test_config(data: Path, **overrides: Any) -> ServerConfig:
    values: dict[str, Any] = {
        "listen": f"127.0.0.1:{free_port()}",
        "data": data,
        "allow_private_networks": True,
        "read_timeout": 1.0,
        "connect_timeout": 1.0,
        "max_body_bytes": 1024 * 1024,
    }
    values.update(overrides)
    return ServerConfig(**values)


@contextlib.asynccontextmanager
async def in_process_node(data: Path, **overrides: Any) -> AsyncIterator[RunningNode]:
    """A real node (gRPC server + store + engine) inside the test's event loop."""
    config = test_config(data, **overrides)
    stop = asyncio.Event()
    started: asyncio.Future[server.Node] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(server.run(config, stop, started))
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
            [sys.executable, "-m", "pagesift.shared.cli", "serve", *config_args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


async def wait_ready(address: str, timeout: float = 20.0) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout)
