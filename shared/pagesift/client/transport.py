"""The channel of one node address: the TLS identity it must prove, the keys it may carry.

What it owns
------------
``Transport``: how a ``JobClient`` opens the channel of each address (``open``), the
one place a client's channel is made (``SyncJobClient`` runs a ``JobClient``, and a
cluster client's pairs are ``JobClient``s: one builder for all three). It holds the
credentials (TLS, ``pagesift.client.auth.tls_credentials``), the interceptors that add
the bearer keys (``auth.auth_interceptors``), the channel options, and two rules:

- ``tls_name``: the server name the node's certificate must carry. Given, it is gRPC's
  ``grpc.ssl_target_name_override`` (over any the caller set), so the handshake checks
  the certificate against it instead of the address's host; ``""`` keeps gRPC's own
  check of the address's host. A cluster client gives each pair's from the members
  file (``ClusterView.tls_name``, ``PairMember.tls_name``). Only a TLS channel checks it.
- ``plaintext_keys``: whether a key may travel without TLS to an address that is not
  loopback (``is_loopback``: ``localhost``, ``127.0.0.0/8``, ``::1``, read from the
  address as written, never from DNS). When not, such a channel is never opened: the
  call fails with FAILED_PRECONDITION, reason ``PLAINTEXT_KEY_REFUSED`` (domain
  ``CLUSTER_DOMAIN``, metadata ``address``), before any connection. A client given
  addresses allows it (its caller named the nodes); a cluster client refuses it unless
  ``insecure_keys=True`` (the registry named them).

Why it is safe
--------------
The keys are call metadata, and gRPC sends a call's headers only on a connection whose
TLS handshake passed: the certificate chain against the trusted CA, then its names
against ``tls_name`` (or the host). A server whose certificate lacks the pinned name,
even one signed by the same CA and reached at an address the registry (or a hijacked
DNS name) points to, fails the handshake: it receives no request and no key, and the
call is UNAVAILABLE like a node that is down. Without TLS nothing proves who answers,
so outside loopback a key goes there only when the caller said so.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from google.rpc import error_details_pb2

from pagesift.client.pairs import CLUSTER_DOMAIN, rpc_error
from pagesift.core.util.channels import open_channel

__all__ = ["CHANNEL_OPTIONS", "NAME_OVERRIDE", "PLAINTEXT_KEY_REFUSED", "Transport", "is_loopback"]

#: the client's defaults under every channel's options (the caller's go over them)
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # a restarted server is found within ~1 s, not after grpc's default 1..120 s backoff
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
NAME_OVERRIDE = "grpc.ssl_target_name_override"
PLAINTEXT_KEY_REFUSED = "PLAINTEXT_KEY_REFUSED"


def is_loopback(address: str) -> bool:
    """Whether ``HOST:PORT``'s host is this machine's loopback, as written (no lookup)."""
    host = address.rpartition(":")[0].strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Transport:
    """How a client's channels are made (see the module docstring)."""

    credentials: grpc.ChannelCredentials | None
    interceptors: tuple[Any, ...] = ()  # the keys' (auth.auth_interceptors); () = no key
    options: tuple[tuple[str, Any], ...] = ()  # the caller's, over CHANNEL_OPTIONS
    tls_name: str = ""
    plaintext_keys: bool = True

    @classmethod
    def of(
        cls,
        credentials: grpc.ChannelCredentials | None,
        interceptors: Sequence[Any],
        options: Sequence[tuple[str, Any]] = (),
        *,
        tls_name: str = "",
        plaintext_keys: bool = True,
    ) -> Transport:
        """The transport with the client's defaults under ``options`` and, with TLS,
        ``tls_name`` pinned over any override among them."""
        merged = {**dict(CHANNEL_OPTIONS), **dict(options)}
        if tls_name and credentials is not None:
            merged[NAME_OVERRIDE] = tls_name
        return cls(
            credentials, tuple(interceptors), tuple(merged.items()), tls_name, plaintext_keys
        )

    def refusal(self, address: str) -> str | None:
        """Why a channel to ``address`` is not opened (None: it may be)."""
        if self.credentials is not None or not self.interceptors or self.plaintext_keys:
            return None
        if is_loopback(address):
            return None
        return (
            f"refusing to send a key without TLS to {address[:120]} (not loopback): give "
            "the client tls_ca (the nodes' CA), or insecure_keys=True to send it in plaintext"
        )

    def open(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address``; FAILED_PRECONDITION ``PLAINTEXT_KEY_REFUSED`` (an
        ``AioRpcError``, before any connection) when ``refusal`` says why not."""
        why = self.refusal(address)
        if why is not None:
            info = error_details_pb2.ErrorInfo(
                reason=PLAINTEXT_KEY_REFUSED, domain=CLUSTER_DOMAIN, metadata={"address": address}
            )
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, why, info=info)
        return open_channel(
            address,
            self.credentials,
            options=self.options,
            interceptors=list(self.interceptors) or None,
        )
