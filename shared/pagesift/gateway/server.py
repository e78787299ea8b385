"""Running the gateway: an aiohttp site on ``--listen`` in front of ``--server`` addresses.

What it owns
------------
``Options`` (TLS of the gateway's port, the credentials that reach the pair, whether a
proxy's ``Forwarded`` headers are trusted), ``start`` (the site up, with its bound
``host:port``: ``pagesift serve --http-listen`` runs it in the node's loop and cleans it
up with the node), ``run(listen, addresses, stop, started)`` (``start`` until ``stop``
is set; tests run it in-process) and ``serve_forever`` (``pagesift gateway``: ``run``
until SIGINT or SIGTERM, its RLIMIT_NOFILE raised and its connection cap kept clear of
its descriptor reserve, ``descriptor_budget``). Port 0 picks a free port.

Invariants
----------
- Stateless: the gateway keeps no job state, so stopping it loses nothing; its
  ``JobClient``s (one per API key) and the health probe are closed with the app.
- TLS files are read once, before the port is bound: a missing or bad file is an
  error at start (``OSError``/``ssl.SSLError``/``ValueError``), never a plaintext port.
- The ``JobClient``s and the ``/healthz`` probe use the same channel credentials.
- The port keeps ``Options.limits`` (``pagesift.core.util.listeners.start_site``):
  header, idle and body timeouts, requests per connection, connection caps in all and
  per client, refused at once; its outsider-triggered log lines are rate-limited.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from pagesift.client.auth import tls_credentials
from pagesift.core.cluster.members import load_members
from pagesift.core.util import descriptors
from pagesift.core.util.listeners import ListenerLimits, start_site
from pagesift.gateway.app import make_app
from pagesift.gateway.clients import MAX_CLIENTS, Clients

__all__ = ["SHUTDOWN_SECONDS", "Options", "descriptor_budget", "run", "serve_forever", "start"]

logger = logging.getLogger("pagesift.gateway")

SHUTDOWN_SECONDS = 5.0


@dataclass(frozen=True)
class Options:
    """``tls_cert``/``tls_key``: TLS on the gateway's port (PEM files, as ``serve``);
    ``tls_ca``, ``client_cert``/``client_key``: TLS (and mTLS) to reach the pair, as
    the client commands' ``--tls-ca``/``--tls-cert``/``--tls-key``, or ``credentials``
    made already (they win); ``trust_forwarded``: read a proxy's ``Forwarded`` /
    ``X-Forwarded-*`` for the answers' absolute URLs (``pagesift.gateway.forwarded``);
    ``cluster``: ``etcd://HOST:PORT[,...]/NAME``, a cluster of pairs in place of the
    addresses (its jobs placed and found by their ids, ``JobClient(cluster=...)``);
    ``cluster_members``: the members file its registry is verified against (a record
    that does not verify gets no call); ``cluster_user``/``cluster_password_file``: the
    etcd user the registry is read as;
    ``limits``: the port's connection discipline (``pagesift.core.util.listeners``)."""

    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    client_cert: str = ""
    client_key: str = ""
    credentials: grpc.ChannelCredentials | None = None
    trust_forwarded: bool = False
    cluster: str = ""
    cluster_members: str = ""
    cluster_user: str = ""
    cluster_password_file: str = ""
    limits: ListenerLimits = field(default_factory=ListenerLimits)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server TLS context of the gateway's port (None: plaintext)."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("the gateway's TLS needs both a certificate and its key")
        if not self.tls_cert:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx

    def view_options(self) -> dict[str, Any]:
        """The cluster view's members and etcd credentials (files read now: ``ValueError``
        or ``OSError`` naming one that cannot be)."""
        out: dict[str, Any] = {}
        if self.cluster_members:
            out["members"] = load_members(self.cluster_members)
        if self.cluster_user:
            out["user"] = self.cluster_user
            out["password"] = Path(self.cluster_password_file).read_text().strip()
        return out

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """The credentials of the channels to the pair (None: plaintext)."""
        if self.credentials is not None:
            return self.credentials
        return tls_credentials(self.tls_ca, self.client_cert, self.client_key)


def _bound(runner: web.AppRunner, host: str) -> str:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return f"{host}:{address[1]}"
    raise RuntimeError("the gateway is not listening")


async def start(
    listen: str, addresses: Sequence[str], *, options: Options | None = None, **app_kw: Any
) -> tuple[web.AppRunner, str]:
    """The gateway serving on ``listen``: its runner (stop it with ``cleanup()``) and
    the bound ``host:port``. ``app_kw``: ``make_app``'s paging bounds."""
    opts = options or Options()
    ctx = opts.ssl_context()
    clients = Clients(
        addresses,
        cluster=opts.cluster,
        view_kw=opts.view_options() if opts.cluster else None,
        credentials=opts.channel_credentials(),
    )
    app = make_app(clients, trust_forwarded=opts.trust_forwarded, **app_kw)
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    runner = await start_site(
        app,
        host,
        int(port),
        opts.limits,
        name="gateway",
        ssl_context=ctx,
        shutdown_timeout=SHUTDOWN_SECONDS,
    )
    try:
        return runner, _bound(runner, host)
    except BaseException:
        await runner.cleanup()
        raise


async def run(
    listen: str,
    addresses: Sequence[str],
    stop: asyncio.Event,
    started: asyncio.Future[str] | None = None,
    *,
    options: Options | None = None,
    **app_kw: Any,
) -> None:
    """Serve the gateway on ``listen`` until ``stop`` is set; ``started`` gets the bound
    ``host:port``."""
    runner, bound = await start(listen, addresses, options=options, **app_kw)
    try:
        if started is not None and not started.done():
            started.set_result(bound)
        await stop.wait()
    finally:
        await runner.cleanup()


def descriptor_budget(addresses: Sequence[str], limit: int) -> descriptors.Budget:
    """The standalone gateway's descriptors (``pagesift.core.util.descriptors``): the
    reserve is the process's own 64, for each pair address a channel per API key's
    client (``MAX_CLIENTS``) and the health probe's (a cluster's addresses are found at
    run time: 16 are counted), and the etcd channel."""
    reach = max(1, len(addresses)) if addresses else 16
    parts = {"process": 64, "channels": (MAX_CLIENTS + 1) * reach, "etcd": 16}
    return descriptors.plan(limit, parts, listeners=1)


def serve_forever(listen: str, addresses: Sequence[str], options: Options | None = None) -> None:
    """``run`` in a new event loop until SIGINT or SIGTERM, the soft RLIMIT_NOFILE raised
    first and the port's connection cap cut to what the reserve leaves
    (``descriptor_budget``)."""
    opts = options or Options()
    budget = descriptor_budget(addresses, descriptors.raise_soft_limit()[0])
    cap = budget.split({"gateway": opts.limits.max_connections})["gateway"]
    level = logging.INFO
    if cap < opts.limits.max_connections:
        per_client = min(opts.limits.max_per_client, cap) if opts.limits.max_per_client else 0
        limits = replace(opts.limits, max_connections=cap, max_per_client=per_client)
        opts, level = replace(opts, limits=limits), logging.WARNING
    logger.log(level, "%s (gateway cap %d)", budget.line(), cap)
    options = opts

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run(listen, addresses, stop, options=options)

    asyncio.run(main())
