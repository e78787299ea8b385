"""Transport security: TLS/mTLS credentials and the replication token.

What it owns
------------
- ``server_credentials`` / ``channel_credentials``: gRPC credentials from PEM files.
  The public port uses server TLS (``--tls-cert``/``--tls-key``). Given a client CA,
  ``server_credentials`` REQUIRES and verifies a client certificate (mTLS): gRPC
  Python has no "verify if offered" mode, so mTLS applies to a whole port; that is
  why the replication stream gets its own port when mTLS is used.
- ``token_ok``: the shared-token alternative for the replication stream (metadata
  ``pagesift-replication-token: TOKEN``), compared in constant time;
  ``write_new_token`` makes one (``pagesift token new FILE``).
- ``Handler`` / ``ServerInterceptor``: the typing aliases every grpc.aio interceptor
  of pagesift uses (``guard``, ``interceptors``, ``metricsgrpc``, the storage guard).

Guarantees
----------
- PEM files are read once at start-up; a missing or unreadable file is a
  ``TlsConfigError`` naming the flag's file, never a silently insecure port.
- ``token_ok`` compares SHA-256 digests with ``hmac.compare_digest`` (no early exit
  on a prefix, no length leak), and is always False for an empty configured token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

# Typing aliases for grpc.aio interceptors.
if TYPE_CHECKING:  # grpc-stubs makes these generic; at run time they are plain classes
    Handler = grpc.RpcMethodHandler[Any, Any]
    ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    ServerInterceptor = grpc.aio.ServerInterceptor

__all__ = [
    "TOKEN_HEADER",
    "Handler",
    "Metadata",
    "ServerInterceptor",
    "TlsConfigError",
    "channel_credentials",
    "peer_common_name",
    "read_pem",
    "secret_ok",
    "server_credentials",
    "token_metadata",
    "token_ok",
    "write_new_token",
]

TOKEN_HEADER = "pagesift-replication-token"

Metadata = Sequence[tuple[str, str | bytes]] | None


class TlsConfigError(ValueError):
    """A certificate, key or CA file is missing, unreadable or not PEM."""


def read_pem(path: Path | str, what: str) -> bytes:
    """The bytes of a PEM file; ``TlsConfigError`` naming ``what`` when it is unusable."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TlsConfigError(f"{what} {path}: cannot read: {e.strerror or e}") from e
    if b"-----BEGIN " not in data:
        raise TlsConfigError(f"{what} {path}: not a PEM file")
    return data


def server_credentials(
    cert_file: Path | str, key_file: Path | str, client_ca_file: Path | str | None = None
) -> grpc.ServerCredentials:
    """Server TLS; with ``client_ca_file``, mTLS: clients must present a certificate
    signed by that CA or the handshake fails."""
    cert = read_pem(cert_file, "certificate")
    key = read_pem(key_file, "private key")
    if client_ca_file is None:
        return grpc.ssl_server_credentials([(key, cert)])
    ca = read_pem(client_ca_file, "client CA")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(
    ca_file: Path | str | None = None,
    cert_file: Path | str | None = None,
    key_file: Path | str | None = None,
) -> grpc.ChannelCredentials:
    """Client TLS: trust ``ca_file`` (None: the system roots); with a certificate and
    key, present them (mTLS client)."""
    if (cert_file is None) != (key_file is None):
        raise TlsConfigError("a client certificate needs its key, and a key its certificate")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(ca_file, "CA") if ca_file is not None else None,
        private_key=read_pem(key_file, "client key") if key_file is not None else None,
        certificate_chain=read_pem(cert_file, "client certificate")
        if cert_file is not None
        else None,
    )


def _values(metadata: Metadata, key: str) -> list[str]:
    out: list[str] = []
    for entry in metadata or ():
        if entry[0].lower() == key:
            value = entry[1]
            out.append(value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
    return out


def secret_ok(candidates: Sequence[str], secret: str) -> bool:
    """True when one of ``candidates`` is ``secret`` (every one compared, in constant
    time); always False for an empty ``secret``."""
    if not secret:
        return False
    want = hashlib.sha256(secret.encode()).digest()
    ok = False
    for value in candidates:
        got = hashlib.sha256(value.strip().encode()).digest()
        ok = hmac.compare_digest(got, want) or ok
    return ok


def token_ok(metadata: Metadata, token: str) -> bool:
    """True when the metadata carries ``pagesift-replication-token: <token>``."""
    return secret_ok(_values(metadata, TOKEN_HEADER), token)


def write_new_token(path: Path) -> str:
    """Create ``path`` holding a new random replication token, readable by its owner
    only; ``FileExistsError`` when it exists (a pair's token is never replaced by
    accident: both nodes must hold the same one)."""
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


def token_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata a follower sends on the replication stream."""
    return ((TOKEN_HEADER, token),)


def peer_common_name(context: Any) -> str | None:
    """The verified client certificate's common name on an mTLS port (for logs)."""
    try:
        names = context.auth_context().get("x509_common_name") or []
    except Exception:
        return None
    for name in names:
        return bytes(name).decode("utf-8", "replace")
    return None
