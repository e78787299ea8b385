"""Which key each call carries, and the client's TLS files (``pagesift.client.auth``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from pagesift.client.auth import auth_interceptors, bearer_key, tls_credentials

JOBS = "/pagesift.v1.JobService/"
ADMIN = "/pagesift.v1.AdminService/"


def test_job_calls_carry_the_api_key_and_admin_calls_the_admin_key() -> None:
    assert bearer_key(JOBS + "StartCrawl", "api", "adm") == "api"
    assert bearer_key(JOBS + "CancelJob", "api", "adm") == "api"  # the owner cancels
    assert bearer_key(ADMIN + "Role", "api", "adm") == "adm"
    assert bearer_key(ADMIN + "Role", "api", "") == "api"  # no admin key: the api key


def test_without_an_api_key_the_admin_key_stops_or_resumes_any_job_and_nothing_else() -> None:
    assert bearer_key(JOBS + "CancelJob", "", "adm") == "adm"
    assert bearer_key(JOBS + "ResumeJob", "", "adm") == "adm"
    assert bearer_key(JOBS + "StartCrawl", "", "adm") == ""
    assert bearer_key(JOBS + "GetJob", "", "") == ""


def details(method: str | bytes, metadata: Any = None) -> grpc.aio.ClientCallDetails:
    return grpc.aio.ClientCallDetails(method, None, metadata, None, None)  # type: ignore[arg-type]


async def test_the_interceptors_add_the_key_as_a_bearer_header_to_unary_and_stream_calls() -> None:
    assert auth_interceptors("", "") == []
    unary, stream = auth_interceptors("api", "adm")
    seen: list[grpc.aio.ClientCallDetails] = []

    async def continuation(call: grpc.aio.ClientCallDetails, request: object) -> str:
        seen.append(call)
        return "answered"

    job = details(JOBS.encode() + b"GetJob", [("x-trace", "1")])
    assert await unary.intercept_unary_unary(continuation, job, object()) == "answered"
    await stream.intercept_unary_stream(continuation, details(ADMIN + "Role"), object())
    assert list(seen[0].metadata or ()) == [("x-trace", "1"), ("authorization", "Bearer api")]
    assert list(seen[1].metadata or ()) == [("authorization", "Bearer adm")]


async def test_a_call_without_a_key_gets_no_authorization_header() -> None:
    (unary, _) = auth_interceptors("", "adm")
    seen: list[grpc.aio.ClientCallDetails] = []

    async def continuation(call: grpc.aio.ClientCallDetails, request: object) -> None:
        seen.append(call)

    job = details(JOBS + "GetJob")
    await unary.intercept_unary_unary(continuation, job, object())
    assert seen == [job]


def test_tls_needs_a_certificate_and_its_key_together(tmp_path: Path) -> None:
    assert tls_credentials("", "", "") is None  # plaintext
    with pytest.raises(ValueError, match="needs its key"):
        tls_credentials("", str(tmp_path / "c.pem"), "")
    with pytest.raises(ValueError, match="needs its key"):
        tls_credentials("", "", str(tmp_path / "k.pem"))
    with pytest.raises(OSError, match=r"ca\.pem"):
        tls_credentials(str(tmp_path / "ca.pem"), "", "")
    (tmp_path / "ca.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    assert isinstance(tls_credentials(str(tmp_path / "ca.pem"), "", ""), grpc.ChannelCredentials)
