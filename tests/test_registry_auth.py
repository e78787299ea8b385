"""An authenticated registry (issue 29, finding 2): records are believed only when they verify.

Pure: ``registry.seal_record`` / ``open_record`` with ``signing`` (Ed25519) against a
members file: every forgery is refused with its reason, a replay into another cluster
does not verify, a record's per-host limit is signed with the rest (and an older
node's record without it still reads), and a key file that is not an Ed25519 key is
refused. On a real etcd: a pair's credential cannot write another's records, real
nodes publish their per-host limit, ``pagesift cluster status --members`` believes
only signed records and names a listed pair without one as missing, and a forged
record receives no call and no key.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import aetcd
import grpc
import grpc.aio
import pytest

from pagesift.client import ClusterView, JobClient
from pagesift.coord import keys
from pagesift.coord.etcdauth import apply_auth, kit_users
from pagesift.coord.registry import EtcdRegistry, Registrar
from pagesift.core.cluster import registryrules
from pagesift.core.cluster.members import Members, parse_members
from pagesift.core.cluster.registryrules import NodeRecord, RecordRejected, open_record, seal_record
from pagesift.core.cluster.signing import RecordSigner, new_private_key_pem, verify_signature
from pagesift.core.ha.election import parse_witness
from pagesift.core.util.tasks import cancel_and_wait
from pagesift.demo.site import build_site, serve_site
from pagesift.drill.fixture import Etcd
from pagesift.gateway.app import make_app
from pagesift.gateway.clients import Clients
from pagesift.gateway.metrics import METRICS
from pagesift.node.clustering import LoadMeter, node_record
from tests.helpers import in_process_node

CLUSTER = "prod"
SIGNER_A = RecordSigner.from_pem(new_private_key_pem())
SIGNER_B = RecordSigner.from_pem(new_private_key_pem())
ROGUE = RecordSigner.from_pem(new_private_key_pem())


def members_file(**pairs: tuple[RecordSigner, list[str]]) -> str:
    out = []
    for name, (signer, nodes) in pairs.items():
        key = base64.b64encode(signer.public_key).decode()
        out.append(f"[pairs.{name}]\npublic_key = '{key}'\nnodes = {json.dumps(nodes)}\n")
    return "\n".join(out)


MEMBERS = parse_members(
    members_file(
        a=(SIGNER_A, ["127.0.0.1:50051", "127.0.0.1:50052"]),
        b=(SIGNER_B, ["127.0.0.1:50061", "127.0.0.1:50062"]),
    )
)
RECORD = NodeRecord(pair="a", node="n1", address="127.0.0.1:50051", role="primary", epoch=3)


def sealed(record: NodeRecord, signer: RecordSigner, cluster: str = CLUSTER) -> bytes:
    return seal_record(record, cluster=cluster, key_id=signer.key_id, sign=signer.sign)


def opened(data: bytes, key_pair: str = "a", members: Members | None = MEMBERS) -> NodeRecord:
    return open_record(
        data, cluster=CLUSTER, key_pair=key_pair, members=members, verify=verify_signature
    )


def reason(data: bytes, key_pair: str = "a") -> str:
    with pytest.raises(RecordRejected) as caught:
        opened(data, key_pair)
    assert caught.value.reason in registryrules.REJECT_REASONS
    return caught.value.reason


def test_a_record_signed_by_its_pair_at_a_listed_address_is_believed() -> None:
    assert opened(sealed(RECORD, SIGNER_A)) == RECORD
    standby = dataclasses.replace(RECORD, node="n2", address="127.0.0.1:50052", role="standby")
    assert opened(sealed(standby, SIGNER_A)) == standby


def test_every_forgery_is_refused_with_its_reason() -> None:
    foreign = dataclasses.replace(RECORD, address="127.0.0.1:6666")
    rogue = dataclasses.replace(RECORD, pair="rogue", address="127.0.0.1:6666")
    assert reason(sealed(rogue, ROGUE), key_pair="rogue") == "unknown_pair"
    assert reason(registryrules.encode_record(RECORD)) == "unsigned"  # the old, plain record
    assert reason(sealed(foreign, ROGUE)) == "wrong_key"
    assert reason(sealed(foreign, SIGNER_B)) == "wrong_key"  # another pair's key
    # a record under pair b's key that names pair a
    assert reason(sealed(RECORD, SIGNER_A), key_pair="b") == "misplaced"
    # pair a's own (leaked) key cannot send clients to an address pair a does not list
    assert reason(sealed(foreign, SIGNER_A)) == "unlisted_address"
    assert reason(sealed(dataclasses.replace(RECORD, address="127.0.0.1:50061"), SIGNER_A)) == (
        "unlisted_address"  # pair b's node
    )


def test_a_record_changed_after_signing_does_not_verify() -> None:
    envelope = json.loads(sealed(RECORD, SIGNER_A))
    envelope["record"] = envelope["record"].replace('"epoch":3', '"epoch":4')
    assert reason(json.dumps(envelope).encode()) == "bad_signature"
    # the key id of pair a over the rogue's signature
    forged = json.loads(sealed(RECORD, ROGUE))
    forged["key"] = SIGNER_A.key_id
    assert reason(json.dumps(forged).encode()) == "bad_signature"


def test_a_records_per_host_limit_is_signed_and_changing_it_breaks_the_signature() -> None:
    limited = dataclasses.replace(RECORD, per_host_concurrency=2)
    assert opened(sealed(limited, SIGNER_A)).per_host_concurrency == 2
    envelope = json.loads(sealed(limited, SIGNER_A))
    assert '"per_host_concurrency":2' in envelope["record"]
    envelope["record"] = envelope["record"].replace(
        '"per_host_concurrency":2', '"per_host_concurrency":64'
    )
    assert reason(json.dumps(envelope).encode()) == "bad_signature"
    # dropping the field (as if an older node wrote it) is a change too
    body = json.loads(json.loads(sealed(limited, SIGNER_A))["record"])
    del body["per_host_concurrency"]
    stripped = json.loads(sealed(limited, SIGNER_A))
    stripped["record"] = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert reason(json.dumps(stripped).encode()) == "bad_signature"


def test_a_record_without_a_per_host_limit_decodes_to_0_and_a_bad_one_is_refused() -> None:
    plain = json.loads(registryrules.encode_record(RECORD))
    assert plain["per_host_concurrency"] == 0  # the default: not published
    del plain["per_host_concurrency"]  # an older node's record, from before the field
    old = json.dumps(plain).encode()
    assert registryrules.decode_record(old) == RECORD
    assert opened(old, members=None).per_host_concurrency == 0
    # an older node signed its record without the field: it still verifies
    body = json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()
    signature = SIGNER_A.sign(registryrules.signed_message(CLUSTER, body))
    envelope = {"key": SIGNER_A.key_id, "record": body.decode(),
                "sig": base64.b64encode(signature).decode()}  # fmt: skip
    assert opened(json.dumps(envelope).encode()).per_host_concurrency == 0
    top = registryrules.MAX_PER_HOST_CONCURRENCY
    assert registryrules.decode_record(json.dumps({**plain, "per_host_concurrency": top}).encode())
    refused = [(-1, "must not be negative"), (top + 1, f"must be at most {top}"),
               ("2", "must be int"), (True, "must be int"), (2.0, "must be int")]  # fmt: skip
    for bad, why in refused:
        data = json.dumps({**plain, "per_host_concurrency": bad}).encode()
        with pytest.raises(ValueError, match=f"per_host_concurrency {why}"):
            registryrules.decode_record(data)
        assert reason(json.dumps({**plain, "per_host_concurrency": bad}).encode()) == "malformed"


def test_a_record_replayed_into_another_cluster_does_not_verify() -> None:
    assert reason(sealed(RECORD, SIGNER_A, cluster="staging")) == "bad_signature"


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[1]",
        b'{"sig": "AAAA", "key": "k"}',
        b'{"sig": "AAAA", "key": "k", "record": 7}',
        b'{"sig": "*", "key": "k", "record": "{}"}',
        b'{"sig": "AAAA", "key": "k", "record": "{}", "extra": 1}',
        b'{"sig": "AAAA", "key": "k", "record": "not json"}',
        b"x" * (registryrules.MAX_SEALED_BYTES + 1),
    ],
)
def test_a_malformed_envelope_is_refused(data: bytes) -> None:
    assert reason(data) == "malformed"


def test_without_members_records_are_read_as_before() -> None:
    assert opened(registryrules.encode_record(RECORD), members=None) == RECORD
    assert opened(sealed(RECORD, ROGUE), key_pair="x", members=None) == RECORD


def test_the_signing_key_file_is_an_ed25519_pem(tmp_path: Path) -> None:
    key = tmp_path / "pair-a.key"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, timeout=30
    )
    signer = RecordSigner.from_file(key)
    assert verify_signature(signer.public_key, b"m", signer.sign(b"m"))
    assert not verify_signature(signer.public_key, b"n", signer.sign(b"m"))
    assert not verify_signature(b"short", b"m", signer.sign(b"m"))
    rsa = tmp_path / "rsa.key"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "rsa", "-pkeyopt", "rsa_keygen_bits:1024",
         "-out", str(rsa)],
        check=True, timeout=60, capture_output=True,
    )  # fmt: skip
    with pytest.raises(ValueError, match="not an Ed25519 private key"):
        RecordSigner.from_file(rsa)
    with pytest.raises(ValueError, match=r"signing key .*absent"):
        RecordSigner.from_file(tmp_path / "absent")
    (tmp_path / "junk").write_text("junk")
    with pytest.raises(ValueError, match="not a PEM private key"):
        RecordSigner.from_file(tmp_path / "junk")


# ---------------------------------------------------------------- etcd with auth on

ROOT_PASSWORD = "root-secret"


async def enable_auth(etcd: Etcd, pairs: list[str]) -> dict[str, str]:
    """etcd's auth on as the deploy kit turns it on (``coord.etcdauth``): root, a user and
    a role per pair, the reader; every user's password."""
    grants = kit_users(CLUSTER, pairs)
    passwords = {name: f"{name}-password" for name in grants}
    users = {name: (passwords[name], g) for name, g in grants.items()}
    await apply_auth(parse_witness(etcd.endpoint), ROOT_PASSWORD, users)
    await apply_auth(parse_witness(etcd.endpoint), ROOT_PASSWORD, users)  # idempotent
    return passwords


async def put_as(etcd: Etcd, user: str, password: str, key: str, value: bytes) -> str:
    """Put ``key`` as ``user``: "ok", or the gRPC code etcd refused it with."""
    host, port = parse_witness(etcd.endpoint)[0]
    client = aetcd.Client(host=host, port=port, timeout=10, username=user, password=password)
    try:
        await client.put(key.encode(), value)
        return "ok"
    except aetcd.ClientError as e:
        cause = e.__cause__ or e.__context__
        code = cause.code() if isinstance(cause, grpc.aio.AioRpcError) else None
        return code.name if code is not None else f"{type(e).__name__}: {e}"
    finally:
        await client.close()


@pytest.mark.system
async def test_a_pairs_credential_cannot_create_another_pairs_records(etcd: Etcd) -> None:
    url = f"{etcd.endpoint}/{CLUSTER}"
    passwords = await enable_auth(etcd, ["a", "b"])
    value = sealed(RECORD, SIGNER_A)
    denied = {
        "pair b's record": keys.node_key(CLUSTER, "b", "r0"),
        "a new pair's record": keys.node_key(CLUSTER, "rogue", "r0"),
        "pair b's leader key": keys.leader_key(keys.witness_pair("b", CLUSTER)),
        "the cluster's root": keys.cluster_prefix(CLUSTER) + "/members",
    }
    for what, key in denied.items():
        assert await put_as(etcd, "a", passwords["a"], key, value) == "PERMISSION_DENIED", what
    assert await put_as(
        etcd, "reader", passwords["reader"], keys.node_key(CLUSTER, "a", "x"), value
    ) == ("PERMISSION_DENIED")
    # what a pair's role grants is what its node needs: its records, its witness keys, budgets
    own = [
        keys.node_key(CLUSTER, "a", "n1"),
        keys.leader_key(keys.witness_pair("a", CLUSTER)),
        keys.state_key(keys.witness_pair("a", CLUSTER)),
        keys.slot_key(CLUSTER, "acct", 0),
        keys.pages_key(CLUSTER, "acct", "2026-12-02"),
        keys.cluster_prefix(CLUSTER) + "/owners/example.com",
    ]
    for key in own:
        assert await put_as(etcd, "a", passwords["a"], key, value) == "ok", key
    # the registrar of pair a registers under its credential; the reader sees only a
    registryrules = EtcdRegistry(url, user="a", password=passwords["a"], signer=SIGNER_A)
    lease = await registryrules.grant(5)
    standby = dataclasses.replace(RECORD, node="n2", address="127.0.0.1:50052", role="standby")
    await registryrules.put(standby, lease)
    await registryrules.close()
    view = ClusterView(url, members=MEMBERS, user="reader", password=passwords["reader"])
    try:
        await view.ready()
        assert sorted(view.pairs) == ["a"] and view.pairs["a"].primary == RECORD.address
        assert view.pairs["a"].standbys == (standby.address,)
    finally:
        await view.close()


# ---------------------------------------------------------------- cluster status --members


async def _status(url: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    """``pagesift cluster status --cluster url …`` as a child: (exit, --json object, text)."""
    cmd = [sys.executable, "-m", "pagesift.cli", "cluster", "status", "--cluster", url]
    done = await asyncio.to_thread(
        subprocess.run, [*cmd, *extra, "--json"], capture_output=True, text=True, timeout=60
    )
    text = await asyncio.to_thread(
        subprocess.run, [*cmd, *extra], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == text.returncode, (done.stderr, text.stderr)
    return done.returncode, json.loads(done.stdout), text.stdout


@pytest.mark.system
async def test_cluster_status_with_members_believes_signed_records_and_names_a_missing_pair(
    etcd: Etcd, tmp_path: Path
) -> None:
    """A members file lists pairs a and b. Pair a's two nodes register records signed by
    its key: a is healthy. Pair b has no record: missing, exit 1. Records signed with
    the wrong key (one claiming a higher epoch for pair a, one for pair b) sit in etcd
    and are not believed: a keeps its honest primary, b stays missing. Once b's own
    nodes register signed records, the status is healthy, exit 0."""
    from pagesift.cli.cluster import MISSING

    url = f"{etcd.endpoint}/{CLUSTER}"
    a_nodes = ["127.0.0.1:50051", "127.0.0.1:50052"]
    b_nodes = ["127.0.0.1:50061", "127.0.0.1:50062"]
    members = tmp_path / "members.toml"
    members.write_text(members_file(a=(SIGNER_A, a_nodes), b=(SIGNER_B, b_nodes)))
    flag = ("--members", str(members))

    def node(pair: str, n: int, address: str) -> NodeRecord:
        role = "standby" if n else "primary"
        return NodeRecord(pair, f"{pair}-{n}", address, role, epoch=2, updated=time.time())

    def honest(pair: str, signer: RecordSigner, addresses: list[str]) -> list[Registrar]:
        return [
            Registrar(
                EtcdRegistry(url, signer=signer),
                partial(node, pair, n, address),
                ttl=30,
            )
            for n, address in enumerate(addresses)
        ]

    async def register(stack: contextlib.AsyncExitStack, registrars: list[Registrar]) -> None:
        """Each registrar running, as a node's does (its record refreshed every round)."""
        for r in registrars:
            stack.push_async_callback(r.close)
            task = asyncio.create_task(r.run())
            stack.push_async_callback(cancel_and_wait, task)
        for r in registrars:
            await asyncio.wait_for(r.registered.wait(), 30)

    async with contextlib.AsyncExitStack() as stack:
        await register(stack, honest("a", SIGNER_A, a_nodes))
        code, out, text = await _status(url, *flag)
        by_pair = {p["pair"]: p for p in out["pairs"]}
        assert code == 1 and sorted(by_pair) == ["a", "b"]
        assert by_pair["a"]["problems"] == [] and by_pair["a"]["primary"] == a_nodes[0]
        assert by_pair["a"]["standbys"] == [a_nodes[1]]
        assert by_pair["b"]["problems"] == [MISSING] and out["placeable"] == ["a"]
        assert f"b: {MISSING}" in text and f"a: primary {a_nodes[0]}, standby {a_nodes[1]}" in text

        # records signed with the wrong key, as a holder of etcd write access puts them
        hijack = NodeRecord("a", "a-x", a_nodes[1], "primary", epoch=9, updated=time.time())
        fake_b = NodeRecord("b", "b-x", b_nodes[0], "primary", epoch=9, updated=time.time())
        await _put(etcd, keys.node_key(CLUSTER, "a", "a-x"), sealed(hijack, SIGNER_B))
        await _put(etcd, keys.node_key(CLUSTER, "b", "b-x"), sealed(fake_b, ROGUE))
        code, out, text = await _status(url, *flag)
        by_pair = {p["pair"]: p for p in out["pairs"]}
        assert code == 1 and by_pair["b"]["problems"] == [MISSING]
        assert by_pair["a"]["primary"] == a_nodes[0] and by_pair["a"]["epoch"] == 2
        assert by_pair["a"]["problems"] == [] and out["placeable"] == ["a"]
        # without the members file the forged records are read as they are (they are there)
        _, unverified, _ = await _status(url)
        shown = {p["pair"]: p for p in unverified["pairs"]}
        assert shown["a"]["epoch"] == 9 and shown["b"]["primary"] == b_nodes[0]

        # pair b's own nodes register: believed, beside the rogue's record that is not
        await register(stack, honest("b", SIGNER_B, b_nodes))
        code, out, text = await _status(url, *flag)
        by_pair = {p["pair"]: p for p in out["pairs"]}
        assert code == 0, text
        assert [by_pair[p]["problems"] for p in ("a", "b")] == [[], []]
        assert by_pair["b"]["primary"] == b_nodes[0] and by_pair["b"]["epoch"] == 2
        assert out["placeable"] == ["a", "b"]


# ---------------------------------------------------------------- forged records, no call


class CountingServer:
    """A gRPC server on loopback that answers every method UNAVAILABLE and counts the
    calls it gets and the ``authorization`` values they carry: a rogue "node"."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.keys: list[str] = []
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers([self._Handler(self)])
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    class _Handler(grpc.GenericRpcHandler):  # type: ignore[type-arg]
        def __init__(self, outer: CountingServer) -> None:
            self.outer = outer

        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
            outer = self.outer
            outer.calls.append(details.method or "")
            for key, value in details.invocation_metadata or ():
                if key == "authorization":
                    outer.keys.append(str(value))

            async def refuse(_request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "rogue")
                return b""

            return grpc.unary_unary_rpc_method_handler(refuse)


async def _put(etcd: Etcd, key: str, value: bytes) -> None:
    host, port = parse_witness(etcd.endpoint)[0]
    client = aetcd.Client(host=host, port=port, timeout=10)
    try:
        await client.put(key.encode(), value)
    finally:
        await client.close()


@pytest.mark.system
async def test_a_forged_record_receives_no_call_and_no_key(etcd: Etcd, tmp_path: Path) -> None:
    """A pair's real node registers signed records; forged ones (another pair's key, a
    changed record, an unknown pair, a real pair's name at a foreign address with a higher
    epoch) sit beside it in etcd. The client places every scrape on the real node; the
    rogue servers see no call and no key, and the view counts each forgery."""
    url = f"{etcd.endpoint}/{CLUSTER}"
    async with contextlib.AsyncExitStack() as stack:
        roots = []
        for k in range(3):  # three hosts: placement over the forged pairs would spread them
            site = build_site(8)
            runner, root = await serve_site(site, host=f"127.0.0.{k + 1}")
            stack.push_async_callback(runner.cleanup)
            roots.append(root)
        node = await stack.enter_async_context(in_process_node(tmp_path / "a"))
        rogues = [CountingServer() for _ in range(3)]
        for r in rogues:
            await r.server.start()
            stack.push_async_callback(r.server.stop, None)
        members = parse_members(
            members_file(a=(SIGNER_A, [node.address]), b=(SIGNER_B, [rogues[1].address]))
        )
        honest = NodeRecord(pair="a", node="a-1", address=node.address, role="primary", epoch=1)
        registryrules = EtcdRegistry(url, signer=SIGNER_A)
        registrar = Registrar(
            registryrules, lambda: dataclasses.replace(honest, updated=time.time()), ttl=5
        )
        await registrar.step()
        stack.push_async_callback(registrar.close)
        # forgeries, as a process with write access to etcd would put them
        hijack = dataclasses.replace(honest, node="r0", address=rogues[0].address, epoch=99)
        changed = json.loads(sealed(dataclasses.replace(honest, node="r1"), SIGNER_A))
        changed["record"] = changed["record"].replace(node.address, rogues[0].address)
        forged = {
            keys.node_key(CLUSTER, "a", "r0"): sealed(hijack, ROGUE),  # wrong_key
            keys.node_key(CLUSTER, "a", "r1"): json.dumps(changed).encode(),  # bad_signature
            keys.node_key(CLUSTER, "a", "r2"): registry_plain(hijack, "r2"),  # unsigned
            keys.node_key(CLUSTER, "b", "b0"): sealed(  # a member's name, the rogue's key
                dataclasses.replace(hijack, pair="b", node="b0", address=rogues[1].address),
                ROGUE,
            ),
            keys.node_key(CLUSTER, "rogue", "r0"): sealed(  # a pair nobody listed
                dataclasses.replace(hijack, pair="rogue", address=rogues[2].address), ROGUE
            ),
        }
        for key, value in forged.items():
            await _put(etcd, key, value)
        view = ClusterView(url, members=members)
        stack.push_async_callback(view.close)
        async with JobClient(cluster=view, api_key="the-accounts-key") as client:
            for i in range(6):
                doc = await client.scrape(roots[i % 3])
                assert doc.status_code == 200
        assert sorted(view.pairs) == ["a"] and view.pairs["a"].primary == node.address
        assert [r.calls for r in rogues] == [[], [], []]
        assert [r.keys for r in rogues] == [[], [], []]
        for reason in ("wrong_key", "bad_signature", "unsigned", "unknown_pair"):
            assert view.rejected[reason] >= 1, (reason, view.rejected)


@pytest.mark.system
async def test_a_nodes_record_publishes_its_per_host_limit(etcd: Etcd, tmp_path: Path) -> None:
    """``clustering.node_record`` of real nodes states their config's
    ``per_host_concurrency`` (a limit past the record's bound as the bound); signed by
    the pair's key, put in etcd, it is read back verified with the limit."""
    url = f"{etcd.endpoint}/{CLUSTER}"
    top = registryrules.MAX_PER_HOST_CONCURRENCY
    async with contextlib.AsyncExitStack() as stack:
        strict = await stack.enter_async_context(
            in_process_node(tmp_path / "a", pair="a", per_host_concurrency=3)
        )
        loose = await stack.enter_async_context(
            in_process_node(tmp_path / "b", pair="a", per_host_concurrency=top + 5)
        )
        members = parse_members(members_file(a=(SIGNER_A, [strict.address, loose.address])))
        for running in (strict, loose):
            meter = LoadMeter(0.0, time.monotonic())
            registrar = Registrar(
                EtcdRegistry(url, signer=SIGNER_A),
                lambda n=running.node, m=meter: node_record(  # type: ignore[misc]
                    n, m, time.time(), time.monotonic()
                ),
                ttl=5,
            )
            await registrar.step()
            stack.push_async_callback(registrar.close)
        reader = EtcdRegistry(url, members=members)
        stack.push_async_callback(reader.close)
        limits = {r.address: r.per_host_concurrency for r in await reader.nodes()}
        assert limits == {strict.address: 3, loose.address: top}
        assert not reader.rejected


def registry_plain(record: NodeRecord, node: str) -> bytes:
    """An unsigned record, as pagesift wrote them before records were signed."""
    return registryrules.encode_record(dataclasses.replace(record, node=node))


async def test_the_gateway_exports_its_views_refusals_by_reason() -> None:
    """``pagesift_cluster_records_rejected_total{reason}`` is the gateway's view's count
    (the alert PagesiftRegistryRecordsRejected reads it)."""
    clients = Clients([], cluster=f"etcd://127.0.0.1:1/{CLUSTER}", view_kw={"members": MEMBERS})
    try:
        app = make_app(clients)
        assert clients.view is not None
        counts = clients.view._registry.rejected
        counts.update({"bad_signature": 3, "unknown_pair": 1})
        text = app[METRICS].exposition().decode()
        assert 'pagesift_cluster_records_rejected_total{reason="bad_signature"} 3.0' in text
        assert 'pagesift_cluster_records_rejected_total{reason="unknown_pair"} 1.0' in text
    finally:
        await clients.close()
