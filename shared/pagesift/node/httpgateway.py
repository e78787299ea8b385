"""``serve --http-listen``: the Firecrawl gateway run inside a node, for one-box setups.

What it owns
------------
``bind_local(server)``: a plaintext gRPC port on 127.0.0.1 (port 0: a free one) on the
node's own server, the gateway's way in; ``start(config, address, limits)``: the gateway
(``pagesift.gateway.server.start``) on ``http_listen`` in the node's event loop, in
front of that address, with the node's TLS certificate on its HTTP port. The node
(``pagesift.node.grpcserver.run``) stops it first when it stops.

Why a loopback port of its own: the public port may be TLS with a certificate for a
name the node cannot check itself by, and ``listen`` may be a wildcard; the loopback
port serves the same services behind the same guards (every call still needs its API
key), so it opens no path around them. A standby's gateway follows the primary its
refusals name, as any client does (over plaintext: with a TLS pair, run ``pagesift
gateway --tls-ca`` in front of the pair instead).
"""

from __future__ import annotations

import logging

import grpc
from aiohttp import web

from pagesift.core.config.schema import ServerConfig
from pagesift.core.util.connlimits import ListenerLimits

__all__ = ["bind_local", "start"]

logger = logging.getLogger("pagesift.server")


def bind_local(server: grpc.aio.Server) -> str:
    """Bind a plaintext loopback port on ``server``; its ``host:port``."""
    port = server.add_insecure_port("127.0.0.1:0")
    if port == 0:
        raise SystemExit("cannot bind the gateway's loopback port on 127.0.0.1")
    return f"127.0.0.1:{port}"


async def start(config: ServerConfig, address: str, limits: ListenerLimits) -> web.AppRunner:
    """The gateway on ``config.http_listen`` in front of ``address``, under ``limits``
    (the ``http_*`` keys, caps fitted to the descriptor budget: ``pagesift.node.fdreserve``);
    stop it with ``cleanup()``. A port that cannot be bound is ``SystemExit`` (as the
    gRPC ports)."""
    from pagesift.gateway.server import Options
    from pagesift.gateway.server import start as start_gateway

    options = Options(
        tls_cert=config.tls_cert,
        tls_key=config.tls_key,
        trust_forwarded=config.http_trust_forwarded,
        limits=limits,
    )
    try:
        runner, bound = await start_gateway(config.http_listen, [address], options=options)
    except OSError as err:
        raise SystemExit(f"cannot listen on {config.http_listen}: {err.strerror or err}") from err
    scheme = "https" if config.tls_cert else "http"
    logger.info(
        "Firecrawl gateway on %s://%s (in front of this node; %d connections, %d per client)",
        scheme, bound, limits.max_connections, limits.max_per_client,
    )  # fmt: skip
    return runner
