"""What a caller gets back when a call fails: the client's own errors, and a server's reason.

What it owns
------------
``ClientError`` and ``Unreachable`` (raised by the client itself), and the reading of
the rich details a pagesift server attaches to every error status: a serialized
``google.rpc.Status`` in the ``grpc-status-details-bin`` trailing metadata
(``DETAILS_KEY``), whose ``ErrorInfo`` of domain ``DOMAIN`` carries a stable ``reason``
and its metadata. ``status_of``, ``details_of``, ``error_info_of`` and ``reason_of``
read them; ``SEND_ELSEWHERE`` names the two reasons that mean "nothing was done here,
send it to the primary".

Invariants
----------
- The readers never raise: a transport error, a server without details or unreadable
  bytes give None (or no details), so a caller falls back to the status code.
- ``DOMAIN``, ``DETAILS_KEY`` and the reason names are wire constants: the server
  builds them in ``pagesift.core.api.rpcerrors`` and ``tests/test_client_errors.py``
  holds the two sides equal. They live here too so that the client reads errors
  without importing the server's API package (the client-only install; tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2

__all__ = [
    "BLOCKED_ADDRESS",
    "DETAILS_KEY",
    "DOMAIN",
    "SEND_ELSEWHERE",
    "ClientError",
    "Unreachable",
    "details_of",
    "error_info_of",
    "reason_of",
    "status_of",
]

DOMAIN = "pagesift.dev"
DETAILS_KEY = "grpc-status-details-bin"  # grpc_status's GRPC_DETAILS_METADATA_KEY

#: Reasons that mean "nothing was done here; the primary (metadata ``primary``) takes it":
#: a standby, or a deposed primary, refusing a write.
SEND_ELSEWHERE = frozenset({"NOT_PRIMARY", "FENCED"})

#: ``BadRequest.FieldViolation.reason`` of a URL the server's address guard refuses
#: (``pagesift.core.jobs.validate.BLOCKED_ADDRESS``; also on Scrape's ``blocked_address``)
BLOCKED_ADDRESS = "BLOCKED_ADDRESS"


class ClientError(Exception):
    """The server answered, but broke the API contract (e.g. a non-advancing next_skip)."""


class Unreachable(Exception):
    """``JobClient.wait_connected``: no channel (or not every one) became ready in time."""

    def __init__(self, addresses: Sequence[str], timeout: float) -> None:
        self.addresses = list(addresses)
        self.timeout = timeout
        super().__init__(f"cannot reach {', '.join(addresses)} (connect timeout {timeout:g} s)")


def status_of(err: Any) -> status_pb2.Status | None:
    """The ``google.rpc.Status`` an ``AioRpcError`` (or any ``grpc.Call``) carries, or
    None (a server without details, a transport error, unreadable bytes). Unlike
    ``grpc_status.rpc_status.from_call`` it never raises."""
    try:
        trailing = err.trailing_metadata()
    except Exception:  # an error object that cannot tell: no details
        return None
    for key, value in trailing or ():
        if key == DETAILS_KEY and isinstance(value, bytes):
            try:
                return status_pb2.Status.FromString(value)
            except DecodeError:
                return None
    return None


M = TypeVar("M", bound=Message)


def details_of(status: status_pb2.Status | None, kind: type[M]) -> list[M]:
    """The details of ``status`` that are a ``kind`` message, in order."""
    out: list[M] = []
    for any_ in status.details if status is not None else ():
        if any_.Is(kind.DESCRIPTOR):
            msg = kind()
            any_.Unpack(msg)
            out.append(msg)
    return out


def error_info_of(err: Any) -> Any:
    """The pagesift ``ErrorInfo`` (domain ``DOMAIN``) of an error, or None."""
    for info in details_of(status_of(err), error_details_pb2.ErrorInfo):
        if info.domain == DOMAIN:
            return info
    return None


def reason_of(err: Any) -> str | None:
    """The pagesift ``ErrorInfo.reason`` of an error, or None (no details)."""
    info = error_info_of(err)
    return str(info.reason) if info is not None else None
