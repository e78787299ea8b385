"""A cluster client checks the node's TLS identity before it sends a key (issue 29, point 3).

Real etcd, real signed records, real gRPC servers on loopback with certificates from one
test CA (``tests.helpers.make_ca`` / ``make_leaf``), each server recording the metadata
of every call it gets (a server interceptor). The members file pins pair ``a``'s name:

- a node whose certificate carries that name (and not the address's host) answers the
  asyncio and the blocking client, and receives the key;
- a server at pair ``a``'s listed address whose certificate, from the same CA, names the
  address's host and another pair, gets no call and no key (a plain client that trusts
  the address's host reaches it and hands it the key: that server is a real TLS server
  there, and only the pinned name stops the cluster client);
- without ``tls_name`` the address's host is what the certificate must carry;
- without TLS a cluster client refuses to send its key off loopback (``0.0.0.0``, which
  Linux delivers to loopback: the server really is reachable there) unless told
  ``insecure_keys=True``, and sends it on loopback.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from google.rpc import error_details_pb2

from pagesift.client import JobClient, SyncJobClient
from pagesift.client.errors import details_of, status_of
from pagesift.client.transport import PLAINTEXT_KEY_REFUSED, Transport, is_loopback
from pagesift.coord.registry import EtcdRegistry
from pagesift.core.api.tls import ServerInterceptor
from pagesift.core.cluster.members import Members, parse_members
from pagesift.core.cluster.registryrules import NodeRecord
from pagesift.core.cluster.signing import RecordSigner, new_private_key_pem
from pagesift.drill.fixture import Etcd
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import make_ca, make_leaf

CLUSTER = "prod"
KEY = "the-accounts-key"
NAME_A = "pair-a.pagesift.test"
NAME_B = "pair-b.pagesift.test"
SIGNERS = {p: RecordSigner.from_pem(new_private_key_pem()) for p in ("a", "b")}
SERVER_EXT = "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName={}\n"


@dataclasses.dataclass(frozen=True)
class Certs:
    ca: Path
    dir: Path

    def pair(self, name: str) -> tuple[bytes, bytes]:
        return (self.dir / f"{name}.key").read_bytes(), (self.dir / f"{name}.pem").read_bytes()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """One CA; ``pinned``: pair a's name only (not 127.0.0.1); ``host``: 127.0.0.1 and
    pair b's name, a valid certificate for the address, not for pair a."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI")
    d = tmp_path_factory.mktemp("certs")
    make_ca(d, "ca")
    make_leaf(d, "pinned", NAME_A, SERVER_EXT.format(f"DNS:{NAME_A}"))
    make_leaf(d, "host", NAME_B, SERVER_EXT.format(f"IP:127.0.0.1,DNS:{NAME_B}"))
    return Certs(d / "ca.pem", d)


class RecordingNode(jobs_pb2_grpc.JobServiceServicer):
    """A JobService on loopback that answers GetJob COMPLETED and records the
    ``authorization`` value of every call that reaches it (None: the call had none)."""

    def __init__(self, cert: tuple[bytes, bytes] | None) -> None:
        self.keys: list[str | None] = []
        self.server = grpc.aio.server(interceptors=[_Recorder(self.keys)])
        jobs_pb2_grpc.add_JobServiceServicer_to_server(self, self.server)
        if cert is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            creds = grpc.ssl_server_credentials([cert])
            self.port = self.server.add_secure_port("127.0.0.1:0", creds)
        self.address = f"127.0.0.1:{self.port}"

    async def GetJob(
        self, request: jobs_pb2.GetJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> jobs_pb2.GetJobResponse:
        return jobs_pb2.GetJobResponse(id=request.id, state=jobs_pb2.JOB_STATE_COMPLETED)


class _Recorder(ServerInterceptor):
    def __init__(self, keys: list[str | None]) -> None:
        self.keys = keys

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        found = dict(details.invocation_metadata or ()).get("authorization")
        self.keys.append(None if found is None else str(found))
        return await continuation(details)


def recording(cert: tuple[bytes, bytes] | None) -> RecordingNode:
    """A ``RecordingNode`` (it serves GetJob alone: the one call these tests make)."""
    return RecordingNode(cert)  # type: ignore[abstract]


def members_of(pairs: dict[str, tuple[str, str]]) -> Members:
    """Members: pair -> (its one node's address, its tls_name or "")."""
    out = []
    for pair, (address, tls_name) in pairs.items():
        key = base64.b64encode(SIGNERS[pair].public_key).decode()
        name = f"tls_name = '{tls_name}'\n" if tls_name else ""
        out.append(f"[pairs.{pair}]\npublic_key = '{key}'\nnodes = {json.dumps([address])}\n{name}")
    return parse_members("\n".join(out))


@contextlib.asynccontextmanager
async def cluster(
    etcd: Etcd, nodes: dict[str, RecordingNode], addresses: dict[str, str] | None = None
) -> AsyncIterator[str]:
    """The nodes serving, each pair's signed primary record in etcd (at ``addresses``'
    address when given, else its node's); the cluster's URL."""
    url = f"{etcd.endpoint}/{CLUSTER}"
    async with contextlib.AsyncExitStack() as stack:
        for node in nodes.values():
            await node.server.start()
            stack.push_async_callback(node.server.stop, None)
        for pair, node in nodes.items():
            registry = EtcdRegistry(url, signer=SIGNERS[pair])
            address = (addresses or {}).get(pair, node.address)
            record = NodeRecord(pair=pair, node=f"{pair}-1", address=address, role="primary")
            await registry.put(record, await registry.grant(120))
            await registry.close()
        yield url


def job(pair: str) -> str:
    return f"{pair}.{uuid.uuid4()}"


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def _sync_get(url: str, members: Members, pair: str, **kw: Any) -> int:
    """GetJob through a ``SyncJobClient`` (with ``KEY`` unless ``kw`` gives one): the
    job's state, or minus the error's code value."""
    kw.setdefault("api_key", KEY)
    with SyncJobClient(cluster=url, cluster_members=members, **kw) as client:
        try:
            return int(client.get_job(job(pair)).state)
        except grpc.aio.AioRpcError as err:
            return -int(err.code().value[0])


# ---------------------------------------------------------------- pure rules


def test_loopback_is_read_from_the_address_as_written() -> None:
    for address in ("127.0.0.1:1", "127.9.9.9:50051", "[::1]:2", "LOCALHOST:3"):
        assert is_loopback(address), address
    for address in ("0.0.0.0:1", "10.0.0.5:50051", "node-a:50051", "[::]:1", "localhost"):
        assert not is_loopback(address), address


def test_the_pinned_name_goes_over_the_callers_override_and_only_with_tls() -> None:
    creds = grpc.ssl_channel_credentials()
    theirs = [("grpc.ssl_target_name_override", "elsewhere"), ("grpc.keepalive_time_ms", 9)]
    pinned = dict(Transport.of(creds, [], theirs, tls_name=NAME_A).options)
    assert pinned["grpc.ssl_target_name_override"] == NAME_A
    assert pinned["grpc.keepalive_time_ms"] == 9
    plain = dict(Transport.of(None, [], tls_name=NAME_A).options)
    assert "grpc.ssl_target_name_override" not in plain
    assert dict(Transport.of(creds, [], theirs).options)["grpc.ssl_target_name_override"] == (
        "elsewhere"
    )  # no pin: the caller's options as given


def test_a_key_over_plaintext_off_loopback_is_refused_only_when_asked() -> None:
    keyed = [object()]  # an interceptor: a key is configured
    strict = Transport.of(None, keyed, plaintext_keys=False)
    assert strict.refusal("10.0.0.5:50051") and strict.refusal("0.0.0.0:1")
    assert strict.refusal("127.0.0.1:1") is None
    assert Transport.of(None, [], plaintext_keys=False).refusal("10.0.0.5:1") is None  # no key
    assert Transport.of(None, keyed).refusal("10.0.0.5:1") is None  # allowed
    tls = Transport.of(grpc.ssl_channel_credentials(), keyed, plaintext_keys=False)
    assert tls.refusal("10.0.0.5:1") is None


def test_a_cluster_client_takes_its_names_from_the_members_file_only() -> None:
    with pytest.raises(ValueError, match="no addresses and no tls_name"):
        JobClient(cluster=f"etcd://127.0.0.1:1/{CLUSTER}", tls_name=NAME_A)
    with pytest.raises(ValueError, match="no addresses"):
        JobClient(["127.0.0.1:1"], cluster=f"etcd://127.0.0.1:1/{CLUSTER}")


# ---------------------------------------------------------------- real servers


@pytest.mark.system
async def test_a_node_carrying_its_pairs_name_answers_and_gets_the_key(
    etcd: Etcd, certs: Certs
) -> None:
    node = recording(certs.pair("pinned"))  # not valid for 127.0.0.1: the pin is needed
    members = members_of({"a": (node.address, NAME_A)})
    async with cluster(etcd, {"a": node}) as url:
        async with JobClient(
            cluster=url, cluster_members=members, api_key=KEY, tls_ca=str(certs.ca)
        ) as client:
            resp = await client.get_job(job("a"))
            assert resp.state == jobs_pb2.JOB_STATE_COMPLETED and resp.id.startswith("a.")
        state = await asyncio.to_thread(_sync_get, url, members, "a", tls_ca=str(certs.ca))
        assert state == jobs_pb2.JOB_STATE_COMPLETED
    assert node.keys == [f"Bearer {KEY}"] * 2


@pytest.mark.system
async def test_a_certificate_for_another_name_at_the_pairs_address_gets_no_call(
    etcd: Etcd, certs: Certs
) -> None:
    impostor = recording(certs.pair("host"))  # same CA, valid for 127.0.0.1, not pair a
    members = members_of({"a": (impostor.address, NAME_A)})
    async with cluster(etcd, {"a": impostor}) as url:
        kw: dict[str, Any] = dict(api_key=KEY, tls_ca=str(certs.ca), retry_budget=0.5)
        async with JobClient(cluster=url, cluster_members=members, **kw) as client:
            err = await refused(client.get_job(job("a")))
        assert err.code() == grpc.StatusCode.UNAVAILABLE and "pair a" in (err.details() or "")
        code = await asyncio.to_thread(_sync_get, url, members, "a", **kw)
        assert code == -grpc.StatusCode.UNAVAILABLE.value[0]
        assert impostor.keys == []  # no call reached it: no key
        # a real TLS server there: a client checking only the address's host hands it the key
        async with JobClient([impostor.address], **kw) as plain:
            await plain.get_job(str(uuid.uuid4()))
    assert impostor.keys == [f"Bearer {KEY}"]


@pytest.mark.system
async def test_without_a_tls_name_the_addresses_host_is_checked(etcd: Etcd, certs: Certs) -> None:
    good = recording(certs.pair("host"))  # carries 127.0.0.1
    named_only = recording(certs.pair("pinned"))  # carries pair a's name, not the host
    members = members_of({"a": (good.address, ""), "b": (named_only.address, "")})
    async with cluster(etcd, {"a": good, "b": named_only}) as url:
        kw: dict[str, Any] = dict(api_key=KEY, tls_ca=str(certs.ca), retry_budget=0.5)
        async with JobClient(cluster=url, cluster_members=members, **kw) as client:
            assert (await client.get_job(job("a"))).state == jobs_pb2.JOB_STATE_COMPLETED
            err = await refused(client.get_job(job("b")))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert good.keys == [f"Bearer {KEY}"]
    assert named_only.keys == []


def _refusal_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    (info,) = details_of(status_of(err), error_details_pb2.ErrorInfo)
    return info


@pytest.mark.system
async def test_a_cluster_client_sends_no_key_in_plaintext_off_loopback(etcd: Etcd) -> None:
    far, near = recording(None), recording(None)
    wildcard = f"0.0.0.0:{far.port}"  # not a loopback address, but Linux delivers it there
    members = members_of({"a": (wildcard, ""), "b": (near.address, "")})
    async with cluster(etcd, {"a": far, "b": near}, addresses={"a": wildcard}) as url:
        async with JobClient(cluster=url, cluster_members=members, api_key=KEY) as client:
            err = await refused(client.get_job(job("a")))
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            info = _refusal_info(err)
            assert info.reason == PLAINTEXT_KEY_REFUSED and info.metadata["address"] == wildcard
            assert "insecure_keys=True" in (err.details() or "")
            # loopback: the key goes there without TLS
            assert (await client.get_job(job("b"))).state == jobs_pb2.JOB_STATE_COMPLETED
        code = await asyncio.to_thread(_sync_get, url, members, "a")
        assert code == -grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert far.keys == []
        async with JobClient(
            cluster=url, cluster_members=members, api_key=KEY, insecure_keys=True
        ) as opted:
            assert (await opted.get_job(job("a"))).state == jobs_pb2.JOB_STATE_COMPLETED
    assert far.keys == [f"Bearer {KEY}"]  # reachable there: only the refusal kept it away
    assert near.keys == [f"Bearer {KEY}"]
