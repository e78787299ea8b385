"""The pairs a cluster should have, from a file kept outside etcd: the registry's trust anchor.

What it owns
------------
``Members`` (every pair that should exist) and ``PairMember`` (one pair: its name, the
Ed25519 public key its nodes sign their registry records with, the addresses its nodes
serve clients at, and optionally the TLS server name its certificates carry), parsed
from TOML by ``parse_members`` / ``load_members`` (config key ``cluster_members``).

Layout
------
::

    # /etc/pagesift/members.toml
    [pairs.a]
    public_key = "6r1C...="          # base64 of the raw 32-byte Ed25519 public key
    nodes = ["10.0.0.11:50051", "10.0.0.12:50051"]
    tls_name = "pair-a.pagesift.internal"   # optional: the name the nodes' certificates carry

    [pairs.b]
    ...

A pair's key (PEM, PKCS#8) and the ``public_key`` line to list (docs/operations.md)::

    openssl genpkey -algorithm ed25519 -out pair-a.key
    openssl pkey -in pair-a.key -pubout -outform DER | tail -c 32 | base64

Guarantees
----------
- Pure: parsing reads no clock and does no I/O but ``load_members``' one file read.
- A file that is not TOML, a pair name that is not one (``ids.check_pair_name``), a key
  that is not 32 bytes of base64, a node address that is not ``HOST:PORT``, an address
  listed under two pairs, a key shared by two pairs, an unknown field: ``ValueError``
  naming the field (``pairs.a.nodes[1]``), so a typo never widens what is trusted.
- ``key_id`` is the first 8 bytes of the key's SHA-256, hex: the name a signed record
  gives the key it was signed with (``registry.seal_record``).

Why it is safe
--------------
The file is the trust anchor: whoever can write etcd cannot change it, so a record in
etcd is believed only when it verifies against a key listed here and names an address
listed here for that pair (``registry.open_record``). Addresses are compared as written
(the host lowercased): list them exactly as the nodes advertise them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagesift.core.cluster.ids import check_pair_name

__all__ = [
    "MAX_NODES_PER_PAIR", "PUBLIC_KEY_BYTES", "Members", "PairMember", "key_id", "load_members",
    "members_of", "normal_address", "parse_members",
]  # fmt: skip

PUBLIC_KEY_BYTES = 32  # an Ed25519 public key, raw
MAX_NODES_PER_PAIR = 16
_PAIR_FIELDS = frozenset({"public_key", "nodes", "tls_name"})


def key_id(public_key: bytes) -> str:
    """The short name of ``public_key``: its SHA-256's first 8 bytes, hex."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def normal_address(address: str) -> str:
    """``HOST:PORT`` with the host lowercased; ``ValueError`` when it is not one."""
    host, colon, port = address.strip().rpartition(":")
    bare = host.strip("[]")
    if not colon or not bare or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address[:80]!r} is not HOST:PORT")
    if any(c.isspace() or c in "/@" for c in host):
        raise ValueError(f"{address[:80]!r} is not HOST:PORT")
    return f"{host.lower()}:{int(port)}"


@dataclass(frozen=True, slots=True)
class PairMember:
    """One pair that should exist (see the module docstring)."""

    name: str
    public_key: bytes  # raw Ed25519, PUBLIC_KEY_BYTES long
    nodes: tuple[str, ...]  # its nodes' client addresses, ``normal_address`` form
    tls_name: str = ""  # the server name its certificates carry ("" = the address's host)

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)

    def lists(self, address: str) -> bool:
        """Whether ``address`` is one of this pair's nodes."""
        try:
            return normal_address(address) in self.nodes
        except ValueError:
            return False


@dataclass(frozen=True, slots=True)
class Members:
    """Every pair of the cluster, by name."""

    pairs: Mapping[str, PairMember]

    def get(self, name: str) -> PairMember | None:
        return self.pairs.get(name)

    @property
    def names(self) -> list[str]:
        return sorted(self.pairs)


def _public_key(text: Any, where: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{where}: must be a string (base64 of 32 bytes)")
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: is not base64") from None
    if len(raw) != PUBLIC_KEY_BYTES:
        raise ValueError(f"{where}: is {len(raw)} bytes, an Ed25519 public key is 32")
    return raw


def _nodes(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: must be a non-empty list of HOST:PORT")
    if len(value) > MAX_NODES_PER_PAIR:
        raise ValueError(f"{where}: {len(value)} nodes, at most {MAX_NODES_PER_PAIR}")
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(f"{where}[{i}]: must be a string HOST:PORT")
        try:
            address = normal_address(item)
        except ValueError as e:
            raise ValueError(f"{where}[{i}]: {e}") from None
        if address in out:
            raise ValueError(f"{where}[{i}]: {address} is listed twice")
        out.append(address)
    return tuple(out)


def _member(name: str, table: Any) -> PairMember:
    where = f"pairs.{name}"
    try:
        check_pair_name(name)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if not isinstance(table, dict):
        raise ValueError(f"{where}: must be a table")
    unknown = sorted(set(table) - _PAIR_FIELDS)
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown field")
    for required in ("public_key", "nodes"):
        if required not in table:
            raise ValueError(f"{where}.{required}: missing")
    tls_name = table.get("tls_name", "")
    if not isinstance(tls_name, str) or len(tls_name) > 253 or any(c.isspace() for c in tls_name):
        raise ValueError(f"{where}.tls_name: must be a DNS name")
    return PairMember(
        name=name,
        public_key=_public_key(table["public_key"], f"{where}.public_key"),
        nodes=_nodes(table["nodes"], f"{where}.nodes"),
        tls_name=tls_name.lower(),
    )


def members_of(pairs: Iterable[PairMember]) -> Members:
    """``Members`` of ``pairs``, refusing a name, an address or a key used twice."""
    by_name: dict[str, PairMember] = {}
    owner_of_address: dict[str, str] = {}
    owner_of_key: dict[bytes, str] = {}
    for pair in pairs:
        if pair.name in by_name:
            raise ValueError(f"pairs.{pair.name}: listed twice")
        for i, address in enumerate(pair.nodes):
            other = owner_of_address.setdefault(address, pair.name)
            if other != pair.name:
                raise ValueError(f"pairs.{pair.name}.nodes[{i}]: {address} is pair {other}'s")
        other = owner_of_key.setdefault(pair.public_key, pair.name)
        if other != pair.name:
            raise ValueError(f"pairs.{pair.name}.public_key: pair {other} has the same key")
        by_name[pair.name] = pair
    return Members(pairs=dict(sorted(by_name.items())))


def parse_members(text: str) -> Members:
    """The members file's text as ``Members``; ``ValueError`` naming the field."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"members file: not TOML: {e}") from None
    unknown = sorted(set(doc) - {"pairs"})
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field (the members file has [pairs.NAME])")
    pairs = doc.get("pairs", {})
    if not isinstance(pairs, dict) or not pairs:
        raise ValueError("pairs: the members file lists no pair ([pairs.NAME])")
    return members_of(_member(name, table) for name, table in pairs.items())


def load_members(path: str | Path) -> Members:
    """``parse_members`` of the file at ``path``; ``ValueError`` names the file too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"members file {path}: {e}") from None
    try:
        return parse_members(text)
    except ValueError as e:
        raise ValueError(f"members file {path}: {e}") from None
