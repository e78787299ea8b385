"""TLS: certificates made by the openssl CLI, real grpc.aio servers on 127.0.0.1 (server TLS,
mTLS), the replication token and the metadata guard."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagesift.core.api import tls
from pagesift.core.api.guard import GuardRule, MetadataGuard
from pagesift.v1 import replication_pb2 as pb
from pagesift.v1 import replication_pb2_grpc
from tests.helpers import make_ca, make_leaf

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")

REQ = health_pb2.HealthCheckRequest()


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA the servers do not trust
    rogue_cert: Path  # a client certificate signed by other_ca
    rogue_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other")
    make_leaf(
        d, "server", "localhost",
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )  # fmt: skip
    client_ext = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"
    make_leaf(d, "client", "standby-1", client_ext)
    make_leaf(d, "rogue", "rogue", client_ext, ca="other")
    return Pki(
        d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
        d / "other.pem", d / "rogue.pem", d / "rogue.key",
    )  # fmt: skip


class Health(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.peers: list[str | None] = []
        self.calls = 0

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        self.calls += 1
        self.peers.append(tls.peer_common_name(context))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        self.calls += 1
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


ServerFactory = Callable[..., Any]


@pytest.fixture
async def serve() -> AsyncIterator[ServerFactory]:
    servers: list[grpc.aio.Server] = []

    async def start(
        creds: grpc.ServerCredentials | None, interceptors: list[Any] | None = None
    ) -> tuple[int, Health]:
        server = grpc.aio.server(interceptors=interceptors)
        health = Health()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        if creds is None:
            port = server.add_insecure_port("127.0.0.1:0")
        else:
            port = server.add_secure_port("127.0.0.1:0", creds)
        await server.start()
        servers.append(server)
        return port, health

    try:
        yield start
    finally:
        for s in servers:
            await s.stop(None)


async def check(port: int, creds: grpc.ChannelCredentials | None, **kw: Any) -> None:
    target = f"127.0.0.1:{port}"
    channel = (
        grpc.aio.insecure_channel(target)
        if creds is None
        else grpc.aio.secure_channel(target, creds)
    )
    async with channel:
        await health_pb2_grpc.HealthStub(channel).Check(REQ, timeout=5, **kw)


async def test_a_tls_server_answers_a_tls_client(pki: Pki, serve: ServerFactory) -> None:
    port, health = await serve(tls.server_credentials(pki.server_cert, pki.server_key))
    await check(port, tls.channel_credentials(pki.ca))
    assert health.peers == [None]  # no client certificate on a plain TLS port
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await check(port, None)  # plaintext to a TLS port
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await check(port, tls.channel_credentials(pki.other_ca))  # server not trusted
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert health.calls == 1


async def test_an_mtls_server_refuses_a_client_without_a_certificate(
    pki: Pki, serve: ServerFactory
) -> None:
    creds = tls.server_credentials(pki.server_cert, pki.server_key, client_ca_file=pki.ca)
    port, health = await serve(creds)
    await check(port, tls.channel_credentials(pki.ca, pki.client_cert, pki.client_key))
    assert health.peers == ["standby-1"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await check(port, tls.channel_credentials(pki.ca))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as info:  # a client certificate from another CA
        await check(port, tls.channel_credentials(pki.ca, pki.rogue_cert, pki.rogue_key))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert health.calls == 1


def test_the_token_check() -> None:
    assert tls.token_ok([(tls.TOKEN_HEADER, "s3cret-token")], "s3cret-token")
    assert tls.token_ok([("x", "y"), (tls.TOKEN_HEADER, b"s3cret-token ")], "s3cret-token")
    assert tls.token_ok(list(tls.token_metadata("abc")), "abc")
    assert not tls.token_ok([(tls.TOKEN_HEADER, "s3cret-tokeN")], "s3cret-token")
    assert not tls.token_ok([(tls.TOKEN_HEADER, "s3cret")], "s3cret-token")
    assert not tls.token_ok([("authorization", "Bearer s3cret-token")], "s3cret-token")
    assert not tls.token_ok(None, "s3cret-token")
    assert not tls.token_ok([(tls.TOKEN_HEADER, "")], "")  # an empty token never passes


async def test_the_guard_refuses_calls_without_the_token(serve: ServerFactory) -> None:
    guard = MetadataGuard(
        [
            GuardRule(
                "/grpc.health.v1.Health/",
                lambda md: tls.token_ok(md, "s3cret-token"),
                "the replication stream needs pagesift-replication-token",
            )
        ]
    )
    port, health = await serve(None, [guard])
    good = tls.token_metadata("s3cret-token")
    await check(port, None, metadata=good)
    for md in [(), ((tls.TOKEN_HEADER, "wrong"),)]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await check(port, None, metadata=md)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "pagesift-replication-token" in (info.value.details() or "")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Watch(REQ, timeout=5):
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert len([r async for r in stub.Watch(REQ, timeout=5, metadata=good)]) == 1
    assert health.calls == 2  # the refused calls never reached the handler


def test_unusable_files_are_named(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(tls.TlsConfigError, match=r"certificate .*nope\.pem"):
        tls.server_credentials(tmp_path / "nope.pem", pki.server_key)
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(tls.TlsConfigError, match="not a PEM"):
        tls.server_credentials(pki.server_cert, junk)
    with pytest.raises(tls.TlsConfigError, match="needs its key"):
        tls.channel_credentials(pki.ca, cert_file=pki.client_cert)


class Echo(replication_pb2_grpc.ReplicationServiceServicer):
    async def Stream(  # type: ignore[override]
        self, request_iterator: AsyncIterator[pb.StreamRequest], context: Any
    ) -> AsyncIterator[pb.StreamResponse]:
        async for _ in request_iterator:
            yield pb.StreamResponse()


async def test_a_refused_stream_reports_the_refusal_even_while_the_client_is_writing() -> None:
    guard = MetadataGuard(
        [GuardRule("/pagesift.v1.ReplicationService/", lambda md: False, "needs the token")]
    )
    server = grpc.aio.server(interceptors=[guard])
    replication_pb2_grpc.add_ReplicationServiceServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    codes: list[grpc.StatusCode] = []
    try:
        # As the follower does: a fresh channel, then the hello written at once. Ending
        # the call under that write used to fail it with INTERNAL in ~5% of sessions.
        for _ in range(200):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = replication_pb2_grpc.ReplicationServiceStub(channel).Stream()  # type: ignore[call-arg]
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call.write(pb.StreamRequest(hello=pb.Hello(node_id="s")))
                    await call.read()
                codes.append(info.value.code())
    finally:
        await server.stop(None)
    assert set(codes) == {grpc.StatusCode.UNAUTHENTICATED}
