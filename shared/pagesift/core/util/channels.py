"""Opening a gRPC channel to another pagesift node: the one place that does it.

What it owns
------------
``open_channel(target, credentials, options=, interceptors=)`` builds the
``grpc.aio`` channel of every outgoing connection: the client's channel per server
address (``pagesift.client.aio``), a standby's replication stream
(``pagesift.standby.follower``) and a promoted node's fencing hellos
(``pagesift.standby.fencing``). Credentials (TLS / mTLS from ``pagesift.core.api.tls``
on a node, ``pagesift.client.auth`` in the client) or ``None`` for plaintext pick a
secure or an insecure channel; the caller keeps its own channel options (message sizes,
reconnect timing) and per-call metadata.

Why it is safe
--------------
It only chooses between ``grpc.aio.secure_channel`` and ``grpc.aio.insecure_channel``
and passes everything through unchanged: a channel given credentials is never
plaintext, and one without them never pretends to be secure. Opening a channel does
no I/O; it connects on first use, and the caller owns (and closes) it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

__all__ = ["open_channel"]


def open_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None,
    *,
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
) -> grpc.aio.Channel:
    """A channel to ``target``: TLS with ``credentials``, plaintext with ``None``."""
    if credentials is not None:
        return grpc.aio.secure_channel(
            target, credentials, options=tuple(options), interceptors=interceptors
        )
    return grpc.aio.insecure_channel(target, options=tuple(options), interceptors=interceptors)
