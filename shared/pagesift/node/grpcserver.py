"""The pagesift server process: one node's gRPC server, ``run`` and ``serve``.

``grpc_server`` is the one assembly of a node's gRPC server: the ``ReplicationService``
and the ``AdminService`` over the node's ``ReplicationParts`` always; on the public port
also the ``JobService``, the standard health service and server reflection (v1 and
v1alpha, ``pagesift.node.reflection``). The server
(``run``), the tests and the bench build their servers with it.

``run(config)`` starts a ``Node``, serves it on one gRPC port (TLS with ``tls_cert``)
and runs the role: a primary resumes its jobs and webhook outboxes and runs new ones;
a standby follows its primary. Interceptors count every call (metrics) and guard
admin calls (admin key) and the replication stream (shared token; or mTLS on a port
of its own, ``replication_listen``). The health service answers per role
(``pagesift.node.grpchealth``: ``""``, ``pagesift.primary``, ``pagesift.replica``).
Prometheus metrics are served on ``metrics_listen``, the Firecrawl gateway on
``http_listen`` (``pagesift.node.httpgateway``), both under the listeners' discipline,
their caps fitted into what RLIMIT_NOFILE (its soft limit raised to the hard one by
``serve``) leaves past the node's descriptor reserve (``pagesift.node.fdreserve``: the
arithmetic is logged at start); OpenTelemetry traces are exported
when the standard ``OTEL_*`` environment asks for them (``pagesift.core.util.tracing``).
``serve`` runs it until SIGTERM/SIGINT; SIGKILL at any instant is safe because every
durable change is one atomic store group.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from pagesift.core.api import guard, tls
from pagesift.core.api.interceptors import MalformedRequests
from pagesift.core.api.metricsgrpc import MetricsInterceptor
from pagesift.core.api.metricshttp import start_http
from pagesift.core.api.service import MAX_SEND_MESSAGE_BYTES, JobService
from pagesift.core.api.storagewatch import StorageErrors
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.accounts import bearer_token
from pagesift.core.util import descriptors, tracing
from pagesift.node import fdreserve, httpgateway, reflection
from pagesift.node.admin import AdminServicer
from pagesift.node.grpchealth import HealthPublisher
from pagesift.node.logs import setup_logging
from pagesift.node.node import EngineFactory, Node, http_engine
from pagesift.node.replicationparts import ReplicationParts
from pagesift.node.startup import StartRefused
from pagesift.primary.replication import add_to_server
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2, replication_pb2_grpc

logger = logging.getLogger("pagesift.server")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),  # JobService refuses above it
)

REPLICATION_METHODS = "/pagesift.v1.ReplicationService/"
PROMOTE_METHOD = "/pagesift.v1.AdminService/Promote"
BACKUP_METHOD = "/pagesift.v1.AdminService/Backup"


def grpc_server(
    parts: ReplicationParts,
    *,
    admin: bool = True,
    jobs: JobService | None = None,
    health: HealthServicer | None = None,
    interceptors: Sequence[tls.ServerInterceptor] = (),
) -> grpc.aio.Server:
    """A gRPC server (not yet bound or started) carrying a node's services.

    Always the ``ReplicationService`` (``parts.sender``); with ``admin``, the
    ``AdminService`` over ``parts``; with ``jobs``, the ``JobService``; with ``health``,
    the health service and server reflection (the public port). ``interceptors`` run in
    order before every handler (metrics, guards).
    """
    server = grpc.aio.server(interceptors=list(interceptors), options=list(SERVER_OPTIONS))
    services = replication_pb2.DESCRIPTOR.services_by_name
    names = [services["ReplicationService"].full_name]
    add_to_server(parts.sender, server)
    if admin:
        replication_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(parts), server)
        names.append(services["AdminService"].full_name)
    if jobs is not None:
        jobs_pb2_grpc.add_JobServiceServicer_to_server(jobs, server)
        names.append(jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name)
    if health is not None:
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        names.append(health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable(names, server)  # grpc.reflection.v1 and v1alpha
    return server


def _guards(node: Node) -> guard.MetadataGuard:
    """Who may call what, checked before any handler runs (first matching rule wins).

    - ``ReplicationService`` (the log stream: a snapshot of every account's data, and
      a Hello whose higher epoch fences this node): only with the pair's token. With
      mTLS it is served on its own port, where the handshake is the credential, and
      refused on this one. With neither, nobody: a node never serves its log, or
      steps down, for an unauthenticated peer, loopback included.
    - ``AdminService/Promote`` (changes the role): the admin key; with no ``[admin]``
      key, the pair's replication token as the key. ``AdminService/Backup`` too: it
      hands out a copy of every account's data, as the log stream does.
    - ``AdminService`` reads: the admin key (open in anonymous mode without one).
    - ``JobService``: a valid API key, before the request is looked at (so a caller
      without one learns nothing from validation or from a standby's redirect).
      ``CancelJob`` and ``ResumeJob`` take the admin key too (any job's owner's power).
    """
    cfg, accounts = node.config, node.accounts
    token = node.replication_token
    if token:
        repl = guard.GuardRule(
            REPLICATION_METHODS,
            lambda md: tls.token_ok(md, token),
            "replication needs the shared token (replication_token_file)",
        )
    elif cfg.replication_listen:
        repl = guard.GuardRule(
            REPLICATION_METHODS,
            lambda md: False,
            f"replication is served with mTLS on {cfg.replication_listen}",
            grpc.StatusCode.PERMISSION_DENIED,
        )
    else:
        repl = guard.GuardRule(
            REPLICATION_METHODS,
            lambda md: False,
            "replication is refused: this node has no replication token or mTLS configured",
            grpc.StatusCode.PERMISSION_DENIED,
        )

    def may_promote(md: tls.Metadata) -> bool:
        if accounts.has_admin_key:
            return accounts.carries_admin_key(md)
        return tls.secret_ok([bearer_token(md) or ""], token)

    promote = guard.GuardRule(
        PROMOTE_METHOD,
        may_promote,
        "Promote needs the admin key (authorization: Bearer ADMIN_KEY); without an [admin] "
        "key, the pair's replication token is the admin key",
        grpc.StatusCode.PERMISSION_DENIED,
    )
    admin = guard.GuardRule(
        "/pagesift.v1.AdminService/",
        accounts.is_admin,
        "admin calls need the admin key (authorization: Bearer ADMIN_KEY)",
        grpc.StatusCode.PERMISSION_DENIED,
    )
    jobs = guard.GuardRule(
        "/pagesift.v1.JobService/",
        accounts.is_caller,
        "a valid API key is needed (metadata 'authorization: Bearer KEY')",
    )
    # the admin key may also cancel or resume any job (pagesift.core.api.service)
    job_control = [
        guard.GuardRule(
            f"/pagesift.v1.JobService/{method}",
            lambda md: accounts.is_caller(md) or accounts.carries_admin_key(md),
            "a valid API key (or the admin key) is needed (metadata 'authorization: Bearer KEY')",
        )
        for method in ("CancelJob", "ResumeJob")
    ]
    backup = guard.GuardRule(
        BACKUP_METHOD,
        may_promote,
        "Backup needs the admin key (authorization: Bearer ADMIN_KEY); without an [admin] "
        "key, the pair's replication token is the admin key",
        grpc.StatusCode.PERMISSION_DENIED,
    )
    return guard.MetadataGuard([promote, backup, admin, repl, *job_control, jobs])


def _bind(server: grpc.aio.Server, listen: str, creds: grpc.ServerCredentials | None) -> None:
    port = server.add_secure_port(listen, creds) if creds else server.add_insecure_port(listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {listen}")


async def run(
    config: ServerConfig,
    stop: asyncio.Event,
    started: asyncio.Future[Node] | None = None,
    engine_factory: EngineFactory = http_engine,
) -> None:
    """Serve until ``stop`` is set; ``started`` gets the node once it serves.
    ``engine_factory``: the job runtime's engine (``Node``)."""
    node = Node(config, engine_factory)
    node.events.bind(asyncio.get_running_loop())
    try:
        await node.start()
    except BaseException:
        await node.close()
        raise
    health_servicer = HealthServicer()
    server = grpc_server(
        node.parts,
        jobs=JobService(node),
        health=health_servicer,
        interceptors=[
            MetricsInterceptor(node.metrics),
            _guards(node),
            MalformedRequests(),
            StorageErrors(),  # a full or failed volume: UNAVAILABLE, no path
        ],
    )
    public_creds = None
    if config.tls_cert:
        public_creds = tls.server_credentials(config.tls_cert, config.tls_key)
    _bind(server, config.listen, public_creds)
    # --http-listen: the gateway's way in to this node (pagesift.node.httpgateway)
    local = httpgateway.bind_local(server) if config.http_listen else ""
    servers = [server]
    if config.replication_listen:
        # mTLS needs a port of its own: gRPC Python cannot make client certificates
        # optional on one port, and the public port must not demand them.
        repl_server = grpc_server(
            node.parts,
            admin=False,
            interceptors=[MetricsInterceptor(node.metrics), MalformedRequests(), StorageErrors()],
        )
        creds = tls.server_credentials(
            config.tls_cert, config.tls_key, client_ca_file=config.replication_ca
        )
        _bind(repl_server, config.replication_listen, creds)
        servers.append(repl_server)
    # role-aware health (``pagesift.node.grpchealth``): set before the server starts, so no
    # Watch sees SERVICE_UNKNOWN, then kept current as the role and the lag change
    health = HealthPublisher(node, health_servicer, replica_max_lag=config.replica_max_lag)
    await health.publish()
    # the descriptor reserve: the HTTP listeners' caps never reach into it (fdreserve)
    budget = fdreserve.node_budget(config, descriptors.soft_limit())
    gateway_limits, metrics_limits = fdreserve.http_limits(config, budget)
    caps = [f"gateway cap {gateway_limits.max_connections}"] if config.http_listen else []
    caps += [f"/metrics cap {metrics_limits.max_connections}"] if config.metrics_listen else []
    if caps:
        level = logging.INFO if budget.http >= 64 else logging.WARNING
        logger.log(level, "%s (%s)", budget.line(), ", ".join(caps))
    metrics_runner = None
    if config.metrics_listen:
        host, _, port = config.metrics_listen.rpartition(":")
        metrics_runner = await start_http(node.metrics, host.strip("[]"), int(port), metrics_limits)
    for srv in servers:
        await srv.start()
    health.start()
    role = (
        f"node of pair {config.pair!r} (the witness decides its role)"
        if config.witness
        else node.role
    )
    logger.info("pagesift %s serving on %s (data %s)", role, config.listen, config.data)
    gateway = None
    try:
        if local:
            gateway = await httpgateway.start(config, local, gateway_limits)
        if started is not None:
            started.set_result(node)
        await stop.wait()
    finally:
        if gateway is not None:  # first: it is a client of this node
            await gateway.cleanup()
        await health.stop()
        await health_servicer.enter_graceful_shutdown()
        for srv in servers:
            await srv.stop(grace=2.0)
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await node.close()
        logger.info("stopped")


def serve(config: ServerConfig) -> int:
    """Run a node until SIGTERM or SIGINT; returns the process exit status."""
    setup_logging(config.log_format)
    soft, hard = descriptors.raise_soft_limit()  # the reserve's arithmetic starts here
    logger.info("RLIMIT_NOFILE: soft %d, hard %d", soft, hard)
    if tracing.configure_from_env():  # OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_TRACES_EXPORTER
        logger.info("tracing: spans are exported (OpenTelemetry)")
    if config.allow_private_networks:
        logger.warning(
            "--allow-private-networks: URLs on loopback and private networks are allowed"
        )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(config, stop)

    try:
        asyncio.run(main())
    except StartRefused as e:
        logger.error("%s", e)
        return 2
    finally:
        tracing.shutdown()  # flushes the spans not yet exported
    return 0
