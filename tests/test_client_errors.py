"""The client reads what the server writes: ``pagesift.client.errors`` against ``rpcerrors``.

The client keeps its own copy of the wire constants (so it imports nothing of the
server's API package); these tests hold the two sides equal and read back errors the
server's own builder made.
"""

from __future__ import annotations

import grpc
import grpc.aio
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from pagesift.client import errors
from pagesift.core.api import rpcerrors
from pagesift.core.api.rpcerrors import Reason


def sent(status: object) -> grpc.aio.AioRpcError:
    """The error a client gets for the ``google.rpc.Status`` a server sent."""
    rich = rpc_status.to_status(status)  # type: ignore[arg-type]
    return grpc.aio.AioRpcError(
        rich.code, grpc.aio.Metadata(), grpc.aio.Metadata(*rich.trailing_metadata), "", None
    )


def test_the_wire_constants_equal_the_servers() -> None:
    assert errors.DOMAIN == rpcerrors.DOMAIN
    assert errors.DETAILS_KEY == rpcerrors.DETAILS_KEY
    assert {Reason.NOT_PRIMARY, Reason.FENCED} == errors.SEND_ELSEWHERE


def test_the_reason_metadata_and_details_a_server_sends_are_read_back() -> None:
    status = rpcerrors.rich_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        "bad url",
        Reason.INVALID_FIELD,
        {"field": "url", "skipped": None},
        [rpcerrors.bad_request([("url", "not absolute"), ("limit", "negative")])],
    )
    err = sent(status)
    assert errors.reason_of(err) == "INVALID_FIELD"
    info = errors.error_info_of(err)
    assert info is not None and dict(info.metadata) == {"field": "url"}
    (bad,) = errors.details_of(errors.status_of(err), error_details_pb2.BadRequest)
    assert [v.field for v in bad.field_violations] == ["url", "limit"]
    assert errors.details_of(errors.status_of(err), error_details_pb2.RetryInfo) == []


def test_an_error_without_readable_details_has_no_reason() -> None:
    empty = grpc.aio.Metadata()
    transport = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, empty, empty, "", None)
    assert errors.status_of(transport) is None
    assert errors.reason_of(transport) is None
    assert errors.details_of(None, error_details_pb2.ErrorInfo) == []
    garbage = grpc.aio.Metadata((errors.DETAILS_KEY, b"\xff\xff not a status"))
    broken = grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, empty, garbage, "", None)
    assert errors.status_of(broken) is None and errors.reason_of(broken) is None


def test_an_error_info_of_another_domain_is_not_a_pagesift_reason() -> None:
    status = rpcerrors.rich_status(grpc.StatusCode.INTERNAL, "x", "SOMETHING")
    status.details[0].Pack(error_details_pb2.ErrorInfo(reason="OTHER", domain="example.com"))
    assert errors.reason_of(sent(status)) is None


def test_unreachable_names_the_addresses_and_the_timeout() -> None:
    err = errors.Unreachable(["a:1", "b:2"], 1.5)
    assert (err.addresses, err.timeout) == (["a:1", "b:2"], 1.5)
    assert str(err) == "cannot reach a:1, b:2 (connect timeout 1.5 s)"
