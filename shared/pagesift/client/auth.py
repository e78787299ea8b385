"""Who the client says it is: bearer keys on every call, and TLS channel credentials.

What it owns
------------
- ``bearer_key(method, api_key, admin_key)``: the key a call carries as
  ``authorization: Bearer KEY``. The admin key goes on AdminService calls (when
  given), and on CancelJob/ResumeJob when no API key is given (an admin stopping or
  resuming any account's job); the account's API key on every other call.
- ``auth_interceptors``: the channel interceptors that add it. grpc.aio files an
  interceptor under ONE call type (its first matching base), so unary-unary and
  unary-stream calls (WatchJob, Map) each get their own.
- ``tls_credentials``: TLS from PEM files (a CA to trust, the system roots without
  one; a client certificate and key for mTLS), or None for plaintext.

Invariants
----------
A key is only ever sent as call metadata on the channel the caller configured (TLS
when credentials are given); no key means no ``authorization`` header at all (the
server then answers as an anonymous caller). ``bearer_key`` is pure, so which key
goes where is tested without a server (tests/test_client_auth.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import grpc.aio

__all__ = ["ADMIN_KEY_METHODS", "auth_interceptors", "bearer_key", "tls_credentials"]

#: JobService calls the server lets the admin key make on any account's job
ADMIN_KEY_METHODS = frozenset({"CancelJob", "ResumeJob"})


def bearer_key(method: str, api_key: str, admin_key: str) -> str:
    """The key the call to the full gRPC ``method`` name (``/pkg.Service/Method``)
    carries ("" for none)."""
    admin = "AdminService" in method or (
        not api_key and method.rsplit("/", 1)[-1] in ADMIN_KEY_METHODS
    )
    return admin_key if admin and admin_key else api_key


def _with_key(details: Any, api_key: str, admin_key: str) -> Any:
    """``details`` (a ``grpc.aio.ClientCallDetails``) with the call's bearer key added."""
    method = details.method.decode() if isinstance(details.method, bytes) else details.method
    key = bearer_key(method, api_key, admin_key)
    if not key:
        return details
    metadata = [*(details.metadata or ()), ("authorization", f"Bearer {key}")]
    return details._replace(metadata=metadata)


class _UnaryAuth(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, api_key: str, admin_key: str) -> None:
        self.api_key = api_key
        self.admin_key = admin_key

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_key(details, self.api_key, self.admin_key), request)


class _StreamAuth(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, api_key: str, admin_key: str) -> None:
        self.api_key = api_key
        self.admin_key = admin_key

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_key(details, self.api_key, self.admin_key), request)


def auth_interceptors(api_key: str, admin_key: str) -> list[Any]:
    """The interceptors that send the keys (none when neither key is given). Typed
    ``Any``: the grpc stubs' ``ClientInterceptor`` is a partial stub no class matches."""
    if not (api_key or admin_key):
        return []
    return [_UnaryAuth(api_key, admin_key), _StreamAuth(api_key, admin_key)]


def tls_credentials(ca: str, cert: str, key: str) -> grpc.ChannelCredentials | None:
    """TLS credentials from PEM files (None: plaintext, when none is given). A file
    that cannot be read raises OSError naming it."""
    if bool(cert) != bool(key):
        raise ValueError(
            "a client certificate (tls_cert) needs its key (tls_key), and a key its certificate"
        )
    if not (ca or cert):
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes() if ca else None,
        private_key=Path(key).read_bytes() if key else None,
        certificate_chain=Path(cert).read_bytes() if cert else None,
    )
