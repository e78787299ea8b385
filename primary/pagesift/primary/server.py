"""The pagesift server process: one node, primary or standby, on one gRPC port.

``serve(config)`` opens the store, attaches its observers (job watch events, and
the replication log once replication is wired), registers the public
``JobService``, the standard health service and server reflection, and runs the
role: a primary resumes its jobs and runs new ones. SIGTERM/SIGINT stop it
gracefully; SIGKILL at any instant is safe because every durable change is one
atomic store group.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from pagesift.primary.fetch import HttpEngine
from pagesift.primary.jobs import Jobs
from pagesift.shared.config import ServerConfig
from pagesift.shared.events import JobEvents
from pagesift.shared.jobservice import JobRuntime, JobService
from pagesift.shared.store import Store
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

log = logging.getLogger("pagesift.server")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class Node:
    """The running node: its store, its role, and (as primary) its job runtime."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.events = JobEvents()
        self._store = Store(config.data / "store", fsync=config.fsync)
        self._store.add_observer(self.events)
        self.jobs: Jobs | None = None
        self.engine: HttpEngine | None = None

    def store(self) -> Store:
        return self._store

    def runtime(self) -> JobRuntime | None:
        return self.jobs

    def primary_hint(self) -> str:
        return self.config.primary or "(unknown)"

    def read_metadata(self) -> Sequence[tuple[str, str]]:
        return ()

    async def become_primary(self) -> None:
        self.engine = HttpEngine(self.config)
        self.jobs = Jobs(self._store, self.engine, self.config, on_visible=self.events.notify)
        await self.jobs.start()

    async def close(self) -> None:
        if self.jobs is not None:
            await self.jobs.close()
        if self.engine is not None:
            await self.engine.close()
        self._store.close()


def _setup_logging(fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":

        class JsonFormatter(logging.Formatter):
            def format(self, record: logging.LogRecord) -> str:
                return json.dumps(
                    {
                        "time": self.formatTime(record),
                        "level": record.levelname,
                        "logger": record.name,
                        "message": record.getMessage(),
                    }
                )

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


async def run(
    config: ServerConfig, stop: asyncio.Event, started: asyncio.Future[Node] | None = None
) -> None:
    """Serve until ``stop`` is set; ``started`` gets the node once it serves."""
    node = Node(config)
    node.events.bind(asyncio.get_running_loop())
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", 4 * MAX_MESSAGE_BYTES),
        ]
    )
    jobs_pb2_grpc.add_JobServiceServicer_to_server(JobService(node), server)
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    services = (
        jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(services, server)
    port = server.add_insecure_port(config.listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {config.listen}")
    if config.role == "primary":
        await node.become_primary()
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("pagesift.v1.JobService", health_pb2.HealthCheckResponse.SERVING)
    log.info("pagesift %s serving on %s (data %s)", config.role, config.listen, config.data)
    if started is not None:
        started.set_result(node)
    try:
        await stop.wait()
    finally:
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace=2.0)
        await node.close()
        log.info("stopped")


def serve(config: ServerConfig) -> int:
    """Run a node until SIGTERM or SIGINT; returns the process exit status."""
    _setup_logging(config.log_format)
    if config.allow_private_networks:
        log.warning("--allow-private-networks: URLs on loopback and private networks are allowed")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(config, stop)

    asyncio.run(main())
    return 0
