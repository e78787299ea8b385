"""The members file (``pagesift.core.cluster.members``): the pairs a cluster should have.

Pure: parsing, the refusals naming their field, and the lookups the registry's
verification relies on (``PairMember.lists``, ``key_id``).
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from pagesift.core.cluster.members import (
    Members,
    PairMember,
    key_id,
    load_members,
    normal_address,
    parse_members,
)

KEY_A = base64.b64encode(bytes(range(32))).decode()
KEY_B = base64.b64encode(bytes(range(1, 33))).decode()
A = f"[pairs.a]\npublic_key = '{KEY_A}'\n"  # pair a's table, its key given
B = f"[pairs.b]\npublic_key = '{KEY_B}'\n"

GOOD = f"""
[pairs.a]
public_key = "{KEY_A}"
nodes = ["127.0.0.1:50051", "Node-A2.internal:50052"]
tls_name = "Pair-A.pagesift.internal"

[pairs.b]
public_key = "{KEY_B}"
nodes = ["[::1]:50053"]
"""


def test_a_members_file_lists_each_pair_with_its_key_and_nodes() -> None:
    members = parse_members(GOOD)
    assert members.names == ["a", "b"]
    a = members.get("a")
    assert a == PairMember(
        name="a",
        public_key=bytes(range(32)),
        nodes=("127.0.0.1:50051", "node-a2.internal:50052"),
        tls_name="pair-a.pagesift.internal",
    )
    assert a.key_id == key_id(bytes(range(32))) and len(a.key_id) == 16
    b = members.get("b")
    assert b is not None and b.nodes == ("[::1]:50053",) and b.tls_name == ""
    assert members.get("c") is None


def test_a_pair_lists_only_its_own_addresses_as_written() -> None:
    a = parse_members(GOOD).get("a")
    assert a is not None
    assert a.lists("127.0.0.1:50051") and a.lists("NODE-a2.internal:50052")
    for other in ("127.0.0.1:50052", "127.0.0.2:50051", "[::1]:50053", "rogue", ""):
        assert not a.lists(other), other


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("not toml [", "not TOML"),
        ("", "pairs: the members file lists no pair"),
        ("cluster = 'x'\n[pairs.a]\n", "cluster: unknown field"),
        ("[pairs.A]\npublic_key = 'x'\nnodes = ['h:1']\n", "pairs.A: "),
        ("[pairs.a]\nnodes = ['h:1']\n", "pairs.a.public_key: missing"),
        (A, "pairs.a.nodes: missing"),
        ("[pairs.a]\npublic_key = 'not*base64'\nnodes = ['h:1']\n", "public_key: is not base64"),
        ("[pairs.a]\npublic_key = 'AAAA'\nnodes = ['h:1']\n", "pairs.a.public_key: is 3 bytes"),
        ("[pairs.a]\npublic_key = 7\nnodes = ['h:1']\n", "pairs.a.public_key: must be a string"),
        (A + "nodes = []\n", "pairs.a.nodes: must be a non-empty"),
        (A + "nodes = ['h:1', 'h']\n", "pairs.a.nodes[1]: 'h' is not"),
        (A + "nodes = ['h:99999']\n", "pairs.a.nodes[0]:"),
        (A + "nodes = ['u@h:1']\n", "pairs.a.nodes[0]:"),
        (A + "nodes = ['h:1', 'H:1']\n", "pairs.a.nodes[1]: h:1 is listed twice"),
        (A + "nodes = ['h:1']\nport = 1\n", "pairs.a.port: unknown field"),
        (A + "nodes = ['h:1']\ntls_name = 'a b'\n", "pairs.a.tls_name"),
        (A + "nodes = ['h:1']\n" + B + "nodes = ['h:1']\n", "pairs.b.nodes[0]: h:1 is pair a's"),
        (A + "nodes = ['h:1']\n" + A.replace("pairs.a", "pairs.b") + "nodes = ['h:2']\n",
         "pairs.b.public_key: pair a has the same key"),
    ],
)  # fmt: skip
def test_a_bad_members_file_is_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_members(text)
    assert field in str(caught.value), caught.value


def test_load_members_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "members.toml"
    path.write_text(GOOD)
    assert isinstance(load_members(path), Members)
    path.write_text("[pairs.a]\n")
    with pytest.raises(ValueError, match=rf"members file {path}: pairs.a.public_key: missing"):
        load_members(path)
    with pytest.raises(ValueError, match=r"members file .*absent"):
        load_members(tmp_path / "absent")


@pytest.mark.parametrize(
    ("address", "normal"),
    [("127.0.0.1:1", "127.0.0.1:1"), ("Host:0080", "host:80"), ("[::1]:5", "[::1]:5")],
)
def test_addresses_compare_in_one_form(address: str, normal: str) -> None:
    assert normal_address(address) == normal


def test_the_documented_openssl_lines_make_a_key_the_file_accepts(tmp_path: Path) -> None:
    key = tmp_path / "pair-a.key"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, timeout=30
    )
    der = subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-pubout", "-outform", "DER"],
        check=True,
        capture_output=True,
        timeout=30,
    ).stdout
    public = base64.b64encode(der[-32:]).decode()
    members = parse_members(f"[pairs.a]\npublic_key = '{public}'\nnodes = ['h:1']\n")
    assert members.get("a") is not None
