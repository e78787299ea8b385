"""An authenticated registry (issue 29, finding 2): records are believed only when they verify.

Pure: ``registry.seal_record`` / ``open_record`` with ``signing`` (Ed25519) against a
members file: every forgery is refused with its reason, a replay into another cluster
does not verify, and a key file that is not an Ed25519 key is refused.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from pagesift.shared.cluster import registry
from pagesift.shared.cluster.members import Members, parse_members
from pagesift.shared.cluster.registry import NodeRecord, RecordRejected, open_record, seal_record
from pagesift.shared.cluster.signing import RecordSigner, new_private_key_pem, verify_signature

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
    assert caught.value.reason in registry.REJECT_REASONS
    return caught.value.reason


def test_a_record_signed_by_its_pair_at_a_listed_address_is_believed() -> None:
    assert opened(sealed(RECORD, SIGNER_A)) == RECORD
    standby = dataclasses.replace(RECORD, node="n2", address="127.0.0.1:50052", role="standby")
    assert opened(sealed(standby, SIGNER_A)) == standby


def test_every_forgery_is_refused_with_its_reason() -> None:
    foreign = dataclasses.replace(RECORD, address="127.0.0.1:6666")
    rogue = dataclasses.replace(RECORD, pair="rogue", address="127.0.0.1:6666")
    assert reason(sealed(rogue, ROGUE), key_pair="rogue") == "unknown_pair"
    assert reason(registry.encode_record(RECORD)) == "unsigned"  # the old, plain record
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
        b"x" * (registry.MAX_SEALED_BYTES + 1),
    ],
)
def test_a_malformed_envelope_is_refused(data: bytes) -> None:
    assert reason(data) == "malformed"


def test_without_members_records_are_read_as_before() -> None:
    assert opened(registry.encode_record(RECORD), members=None) == RECORD
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
