"""The pagesift server process: one node, primary or standby.

``serve(config)`` opens the store slot (store + replication log), registers the
public ``JobService``, ``ReplicationService``, ``AdminService``, the standard
health service and server reflection on one gRPC port (TLS with ``tls_cert``),
and runs the role: a primary resumes its jobs and webhook outboxes and runs new
ones; a standby follows its primary. Interceptors count every call (metrics) and
guard admin calls (admin key) and the replication stream (shared token; or mTLS
on a port of its own, ``replication_listen``). Prometheus metrics are served on
``metrics_listen``. SIGTERM/SIGINT stop it gracefully; SIGKILL at any instant is
safe because every durable change is one atomic store group.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from pagesift.primary import webhooks
from pagesift.primary.fetch import HttpEngine
from pagesift.primary.jobs import Jobs
from pagesift.primary.replication import ReplicationServicer
from pagesift.shared import tls
from pagesift.shared.accounts import Accounts, bearer_token
from pagesift.shared.config import ServerConfig
from pagesift.shared.events import JobEvents
from pagesift.shared.interceptors import MalformedRequests
from pagesift.shared.jobservice import JobRuntime, JobService
from pagesift.shared.metrics import Metrics, ReplicationFigures, start_http
from pagesift.shared.replog import Fenced, open_slot
from pagesift.shared.store import Store
from pagesift.standby.admin import AdminServicer
from pagesift.standby.fencing import fence_former_primary
from pagesift.standby.follower import Follower, hello_message
from pagesift.standby.promotion import Promoter
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2, replication_pb2_grpc

log = logging.getLogger("pagesift.server")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class StartRefused(RuntimeError):
    """The data directory does not allow the role asked for (see ``Node.start``)."""


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
        self.accounts = Accounts.load(Path(config.accounts_file) if config.accounts_file else None)
        for warning in self.accounts.warnings:
            log.warning("%s", warning)
        self.replication_token = _read_token(config.replication_token_file)
        self.slot = open_slot(config.data, fsync=config.fsync, backlog_bytes=config.backlog_bytes)
        self.slot.store.add_observer(self.events)
        self.slot.add_listener(lambda store, _log: store.add_observer(self.events))
        self.metrics = Metrics()
        self.metrics.jobs_store = lambda: self.slot.store
        self.metrics.webhook_queue_depth = lambda: webhooks.queue_depth(self.slot.store)
        self.metrics.replication = self._replication_figures
        self.replication = ReplicationServicer(
            self.slot,
            node_id=self.node_id,
            mode=config.replication_mode,
            sync_timeout=config.sync_timeout,
            on_fenced=self._on_fenced,
            address=_advertised(config.listen),
        )
        self.follower: Follower | None = None
        self.promoter: Promoter | None = None
        self.jobs: Jobs | None = None
        self.engine: HttpEngine | None = None
        self.role = config.role
        self._watchdog: asyncio.Task[None] | None = None
        self._fencer: asyncio.Task[str] | None = None
        self.deposed_by = ""  # fenced: where the node that deposed us serves, if it said
        # how this node reaches the primary it follows (reused to fence it after a promotion)
        self._peer_credentials: grpc.ChannelCredentials | None = None
        self._peer_metadata: tuple[tuple[str, str], ...] = (
            tls.token_metadata(self.replication_token) if self.replication_token else ()
        )

    def store(self) -> Store:
        return self.slot.store

    def runtime(self) -> JobRuntime | None:
        return self.jobs

    def primary_hint(self) -> str:
        if self.role == "fenced":
            where = self.deposed_by or "the promoted node"
            return f"{where} (this one was deposed by a higher epoch)"
        told = self.follower.primary_address if self.follower is not None else ""
        return self.config.primary_public or told or self.config.primary or "(unknown)"

    def read_metadata(self) -> Sequence[tuple[str, str]]:
        if self.follower is None or self.role != "standby":
            return (("pagesift-role", self.role),)
        st = self.follower.status()
        return (
            ("pagesift-role", self.role),
            ("pagesift-applied-offset", str(st.applied_offset)),
            ("pagesift-lag-offsets", str(st.lag_offsets)),
            ("pagesift-lag-seconds", f"{st.lag_seconds:.3f}"),
        )

    async def start(self) -> None:
        if not replication_credential(self.config):
            if self.role == "standby":
                raise StartRefused(
                    "a standby needs a replication credential: replication_token_file "
                    "(the same file on both nodes) or replication_ca + replication_cert + "
                    "replication_key (mTLS)"
                )
            log.warning(
                "no replication credential (replication_token_file or mTLS): this node "
                "serves its log to nobody, so no standby can follow it"
            )
        if self.role == "primary":
            if self.slot.log.persisted_role == "standby":
                raise StartRefused(
                    "this data directory belongs to a standby: promote it (pagesift promote) "
                    "or start it with --role standby; starting it as a primary would fork "
                    "its primary's history"
                )
            try:
                self.slot.log.open_for_writes()
            except Fenced as e:
                raise StartRefused(f"refusing to start as a primary: {e}") from None
            await self._start_jobs()
        else:
            cfg = self.config
            if cfg.replication_ca or cfg.replication_cert:
                self._peer_credentials = tls.channel_credentials(
                    cfg.replication_ca or None,
                    cfg.replication_cert or None,
                    cfg.replication_key or None,
                )
            self.follower = Follower(
                self.slot,
                cfg.primary,
                node_id=self.node_id,
                credentials=self._peer_credentials,
                metadata=self._peer_metadata,
            )
            self.promoter = Promoter(
                self.slot, stop_follower=self.follower.stop, on_promoted=self._promoted
            )
            self.follower.start()
            if cfg.auto_promote_after > 0:
                self._watchdog = asyncio.create_task(self._auto_promote(cfg.auto_promote_after))

    async def _auto_promote(self, after: float) -> None:
        """``--auto-promote-after``: promote once the primary has been silent that long.

        UNSAFE without an outside witness: a primary that is alive but cut off from
        this standby keeps serving, and both accept writes until it is fenced.
        """
        silent_since: float | None = None
        while self.role == "standby" and self.follower is not None:
            await asyncio.sleep(min(0.5, after / 4))
            st = self.follower.status()
            if st.connected:
                silent_since = None
                continue
            now = time.monotonic()
            silent_since = silent_since or now
            if now - silent_since >= after and self.slot.log.history_id and self.promoter:
                log.warning(
                    "the primary has been silent for %.1f s: auto-promoting (unsafe without "
                    "an outside witness)",
                    now - silent_since,
                )
                await self.promoter.promote()
                return

    async def _promoted(self) -> None:
        self.role = "primary"
        await self._start_jobs()
        if self.config.primary:
            self._fencer = asyncio.create_task(
                fence_former_primary(
                    self.config.primary,
                    self._fencing_hello,
                    still_primary=lambda: self.role == "primary",
                    on_deposed=self.replication.step_down,
                    credentials=self._peer_credentials,
                    metadata=self._peer_metadata,
                ),
                name="fence-former-primary",
            )

    def _fencing_hello(self) -> replication_pb2.Hello:
        return hello_message(self.slot.log.hello(self.node_id), self.replication.address)

    async def _start_jobs(self) -> None:
        cfg = self.config
        self.engine = HttpEngine(cfg, metrics=self.metrics)
        deliverer = webhooks.Deliverer(
            lambda: self.slot.store,
            None,
            secret_for=self.accounts.webhook_secret,
            allow_private_networks=cfg.allow_private_networks,
            max_attempts=cfg.webhook_max_attempts,
            base_delay=cfg.webhook_base_delay,
            max_delay=cfg.webhook_max_delay,
            timeout=cfg.webhook_timeout,
            metrics=self.metrics,
            # sync mode: POST an event only once the standby holds it, as GetJob shows pages
            wait_replicated=(lambda: self.wait_replicated(None))
            if cfg.replication_mode == "sync"
            else None,
        )
        sync = cfg.replication_mode == "sync"
        self.jobs = Jobs(
            self.slot.store,
            self.engine,
            cfg,
            accounts=self.accounts,
            deliverer=deliverer,
            metrics=self.metrics,
            wait_replicated=self.wait_replicated if sync else None,
            on_visible=self.events.notify,
        )
        await self.jobs.start()

    async def wait_replicated(self, offset: int | None) -> bool:
        """Sync mode: wait for the standby to apply ``offset`` (None: all so far)."""
        target = self.slot.log.last_offset if offset is None else offset
        return await self.replication.wait_replicated(target)

    def _replication_figures(self) -> ReplicationFigures:
        log = self.slot.log
        if self.follower is not None and self.role == "standby":
            st = self.follower.status()
            return ReplicationFigures(
                role=self.role,
                epoch=log.epoch,
                applied_offset=st.applied_offset,
                primary_offset=st.primary_offset,
                acked_offset=st.applied_offset,
                lag_seconds=st.lag_seconds,
                connected=st.connected,
                backlog_bytes=log.backlog_bytes,
                full_resyncs=st.full_resyncs,
                sync_degraded=0,
            )
        ps = self.replication.status()
        return ReplicationFigures(
            role=self.role,
            epoch=log.epoch,
            applied_offset=ps.last_offset,
            primary_offset=ps.last_offset,
            acked_offset=ps.acked_offset,
            lag_seconds=ps.lag_seconds,
            connected=ps.connected,
            backlog_bytes=log.backlog_bytes,
            full_resyncs=self.replication.full_resyncs,
            sync_degraded=self.replication.sync_degraded_total,
        )

    async def _on_fenced(self, epoch: int, by: str) -> None:
        log.warning(
            "fenced by epoch %d: this primary stops writing; restart it with --role standby "
            "--primary %s to rejoin",
            epoch,
            by or "<the promoted node>",
        )
        self.deposed_by = by
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
        for task in (self._watchdog, self._fencer):
            if task is not None:
                task.cancel()
        if self.follower is not None:
            await self.follower.stop()
        await self._stop_jobs()
        self.slot.close()


#: The shortest replication token accepted (``secrets.token_urlsafe(32)`` gives 43).
MIN_TOKEN_CHARS = 16


def _read_token(file: str) -> str:
    """The replication token in ``file`` ("" without one); refuses a short one."""
    if not file:
        return ""
    try:
        token = Path(file).read_text().strip()
    except OSError as e:
        raise StartRefused(f"replication_token_file {file}: {e.strerror or e}") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise StartRefused(
            f"replication_token_file {file}: the token has {len(token)} characters, "
            f"fewer than {MIN_TOKEN_CHARS} (make one: pagesift token new FILE)"
        )
    return token


def _advertised(listen: str) -> str:
    """``listen`` as an address peers can hand to clients; "" for a wildcard host."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    return "" if host in ("", "0.0.0.0", "::") else listen


def _node_id(data: Path) -> str:
    """A stable id for this data directory (replication peers tell nodes apart by it)."""
    data.mkdir(parents=True, exist_ok=True)
    path = data / "NODE_ID"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(uuid.uuid4().hex[:16])
        tmp.replace(path)
    return path.read_text().strip()


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line; job events add their ``job`` and ``account``."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("job", "account"):
            if hasattr(record, key):
                line[key] = getattr(record, key)
        return json.dumps(line)


def _setup_logging(fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


REPLICATION_METHODS = "/pagesift.v1.ReplicationService/"
PROMOTE_METHOD = "/pagesift.v1.AdminService/Promote"


def replication_credential(config: ServerConfig) -> str:
    """What this node's replication stream trusts ("token", "mtls"), or "" for nothing."""
    if config.replication_token_file:
        return "token"
    if config.replication_listen or config.replication_ca or config.replication_cert:
        return "mtls"
    return ""


def _guards(node: Node) -> tls.MetadataGuard:
    """Who may call what, checked before any handler runs (first matching rule wins).

    - ``ReplicationService`` (the log stream: a snapshot of every account's data, and
      a Hello whose higher epoch fences this node): only with the pair's token. With
      mTLS it is served on its own port, where the handshake is the credential, and
      refused on this one. With neither, nobody: a node never serves its log, or
      steps down, for an unauthenticated peer, loopback included.
    - ``AdminService/Promote`` (changes the role): the admin key; with no ``[admin]``
      key, the pair's replication token as the key.
    - ``AdminService`` reads: the admin key (open in anonymous mode without one).
    - ``JobService``: a valid API key, before the request is looked at (so a caller
      without one learns nothing from validation or from a standby's redirect).
    """
    cfg, accounts = node.config, node.accounts
    token = node.replication_token
    if token:
        repl = tls.GuardRule(
            REPLICATION_METHODS,
            lambda md: tls.token_ok(md, token),
            "replication needs the shared token (replication_token_file)",
        )
    elif cfg.replication_listen:
        repl = tls.GuardRule(
            REPLICATION_METHODS,
            lambda md: False,
            f"replication is served with mTLS on {cfg.replication_listen}",
            grpc.StatusCode.PERMISSION_DENIED,
        )
    else:
        repl = tls.GuardRule(
            REPLICATION_METHODS,
            lambda md: False,
            "replication is refused: this node has no replication token or mTLS configured",
            grpc.StatusCode.PERMISSION_DENIED,
        )

    def may_promote(md: tls.Metadata) -> bool:
        if accounts.has_admin_key:
            return accounts.carries_admin_key(md)
        return tls.secret_ok([bearer_token(md) or ""], token)

    promote = tls.GuardRule(
        PROMOTE_METHOD,
        may_promote,
        "Promote needs the admin key (authorization: Bearer ADMIN_KEY); without an [admin] "
        "key, the pair's replication token is the admin key",
        grpc.StatusCode.PERMISSION_DENIED,
    )
    admin = tls.GuardRule(
        "/pagesift.v1.AdminService/",
        accounts.is_admin,
        "admin calls need the admin key (authorization: Bearer ADMIN_KEY)",
        grpc.StatusCode.PERMISSION_DENIED,
    )
    jobs = tls.GuardRule(
        "/pagesift.v1.JobService/",
        accounts.is_caller,
        "a valid API key is needed (metadata 'authorization: Bearer KEY')",
    )
    return tls.MetadataGuard([promote, admin, repl, jobs])


def _bind(server: grpc.aio.Server, listen: str, creds: grpc.ServerCredentials | None) -> None:
    port = server.add_secure_port(listen, creds) if creds else server.add_insecure_port(listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {listen}")


async def run(
    config: ServerConfig, stop: asyncio.Event, started: asyncio.Future[Node] | None = None
) -> None:
    """Serve until ``stop`` is set; ``started`` gets the node once it serves."""
    node = Node(config)
    node.events.bind(asyncio.get_running_loop())
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", 4 * MAX_MESSAGE_BYTES),
    ]
    server = grpc.aio.server(
        interceptors=[node.metrics.interceptor(), _guards(node), MalformedRequests()],
        options=options,
    )
    try:
        await node.start()
    except BaseException:
        await node.close()
        raise
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
    public_creds = None
    if config.tls_cert:
        public_creds = tls.server_credentials(config.tls_cert, config.tls_key)
    _bind(server, config.listen, public_creds)
    servers = [server]
    if config.replication_listen:
        # mTLS needs a port of its own: gRPC Python cannot make client certificates
        # optional on one port, and the public port must not demand them.
        repl_server = grpc.aio.server(
            interceptors=[node.metrics.interceptor(), MalformedRequests()], options=options
        )
        replication_pb2_grpc.add_ReplicationServiceServicer_to_server(node.replication, repl_server)
        creds = tls.server_credentials(
            config.tls_cert, config.tls_key, client_ca_file=config.replication_ca
        )
        _bind(repl_server, config.replication_listen, creds)
        servers.append(repl_server)
    metrics_runner = None
    if config.metrics_listen:
        host, _, port = config.metrics_listen.rpartition(":")
        metrics_runner = await start_http(node.metrics, host.strip("[]"), int(port))
    for srv in servers:
        await srv.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("pagesift.v1.JobService", health_pb2.HealthCheckResponse.SERVING)
    log.info("pagesift %s serving on %s (data %s)", node.role, config.listen, config.data)
    if started is not None:
        started.set_result(node)
    try:
        await stop.wait()
    finally:
        await health_servicer.enter_graceful_shutdown()
        for srv in servers:
            await srv.stop(grace=2.0)
        if metrics_runner is not None:
            await metrics_runner.cleanup()
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

    try:
        asyncio.run(main())
    except StartRefused as e:
        log.error("%s", e)
        return 2
    return 0
