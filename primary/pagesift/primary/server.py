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
import uuid
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from pagesift.primary.fetch import HttpEngine
from pagesift.primary.jobs import Jobs
from pagesift.primary.replication import ReplicationServicer
from pagesift.shared.config import ServerConfig
from pagesift.shared.events import JobEvents
from pagesift.shared.jobservice import JobRuntime, JobService
from pagesift.shared.replog import open_slot
from pagesift.shared.store import Store
from pagesift.standby.admin import AdminServicer
from pagesift.standby.follower import Follower
from pagesift.standby.promotion import Promoter
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2, replication_pb2_grpc

log = logging.getLogger("pagesift.server")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class Node:
    """The running node: its store slot, its role, and (as primary) its job runtime.

    Roles: ``primary`` (writable log, job runtime running), ``standby`` (a follower
    applies the primary's log; reads only), ``fenced`` (a higher epoch deposed this
    primary: job runtime stopped, reads only, until restarted as a standby).
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.node_id = _node_id(config.data)
        self.events = JobEvents()
        self.slot = open_slot(config.data, fsync=config.fsync, backlog_bytes=config.backlog_bytes)
        self.slot.store.add_observer(self.events)
        self.slot.add_listener(lambda store, _log: store.add_observer(self.events))
        self.replication = ReplicationServicer(
            self.slot,
            node_id=self.node_id,
            mode=config.replication_mode,
            sync_timeout=config.sync_timeout,
            on_fenced=self._on_fenced,
        )
        self.follower: Follower | None = None
        self.promoter: Promoter | None = None
        self.jobs: Jobs | None = None
        self.engine: HttpEngine | None = None
        self.role = config.role

    def store(self) -> Store:
        return self.slot.store

    def runtime(self) -> JobRuntime | None:
        return self.jobs

    def primary_hint(self) -> str:
        if self.role == "fenced":
            return "the promoted node (this one was deposed by a higher epoch)"
        return self.config.primary or "(unknown)"

    def read_metadata(self) -> Sequence[tuple[str, str]]:
        if self.follower is None:
            return (("pagesift-role", self.role),)
        st = self.follower.status()
        return (
            ("pagesift-role", self.role),
            ("pagesift-applied-offset", str(st.applied_offset)),
            ("pagesift-lag-offsets", str(st.lag_offsets)),
            ("pagesift-lag-seconds", f"{st.lag_seconds:.3f}"),
        )

    async def start(self) -> None:
        if self.role == "primary":
            self.slot.log.open_for_writes()  # raises Fenced if a higher epoch deposed us
            await self._start_jobs()
        else:
            self.follower = Follower(self.slot, self.config.primary, node_id=self.node_id)
            self.promoter = Promoter(
                self.slot, stop_follower=self.follower.stop, on_promoted=self._promoted
            )
            self.follower.start()

    async def _promoted(self) -> None:
        self.role = "primary"
        await self._start_jobs()

    async def _start_jobs(self) -> None:
        self.engine = HttpEngine(self.config)
        sync = self.config.replication_mode == "sync"
        self.jobs = Jobs(
            self.slot.store,
            self.engine,
            self.config,
            wait_replicated=self.replication.wait_replicated if sync else None,
            on_visible=self.events.notify,
        )
        await self.jobs.start()

    async def _on_fenced(self, epoch: int) -> None:
        log.warning(
            "fenced by epoch %d: this primary stops writing; restart it with --role standby "
            "--primary <the promoted node> to rejoin",
            epoch,
        )
        self.role = "fenced"
        await self._stop_jobs()

    async def _stop_jobs(self) -> None:
        jobs, self.jobs = self.jobs, None
        engine, self.engine = self.engine, None
        if jobs is not None:
            await jobs.close()
        if engine is not None:
            await engine.close()

    async def close(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
        await self._stop_jobs()
        self.slot.close()


def _node_id(data: Path) -> str:
    """A stable id for this data directory (replication peers tell nodes apart by it)."""
    data.mkdir(parents=True, exist_ok=True)
    path = data / "NODE_ID"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(uuid.uuid4().hex[:16])
        tmp.replace(path)
    return path.read_text().strip()


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
    await node.start()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(JobService(node), server)
    replication_pb2_grpc.add_ReplicationServiceServicer_to_server(node.replication, server)
    admin = AdminServicer(
        node.slot,
        node_id=node.node_id,
        replication=node.replication,
        follower=lambda: node.follower,
        promoter=node.promoter,
    )
    replication_pb2_grpc.add_AdminServiceServicer_to_server(admin, server)
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    services = (
        jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
        replication_pb2.DESCRIPTOR.services_by_name["ReplicationService"].full_name,
        replication_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(services, server)
    port = server.add_insecure_port(config.listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {config.listen}")
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
