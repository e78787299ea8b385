"""The cluster's registry in etcd: a pair's record, and who takes new work.

The keys (``C/nodes/{pair}/{node}``, the slots, the pages counters) are
``pagesift.coord.keys``'; a node's record sits under that node's own lease, so etcd
deletes it when the node is gone: a pair whose nodes are all gone drops out of
placement by itself, and a pair whose primary died still shows its standby.

The records
-----------
Every node of every pair writes its own ``NodeRecord`` every ``REFRESH_SECONDS``: its
advertised client address, role, epoch, lag, load, capacity and the per-host
concurrency limit it runs with (``per_host_concurrency``: what ``pagesift drill
--cluster`` judges politeness by; 0 in a record without the field, which decodes with
every other field intact). ``updated`` is the writer's wall clock, read only to show
staleness; liveness is the lease's.
``pair_views`` merges a pair's node records into one ``PairView``: the primary is the
node that says it is primary with the highest epoch (a deposed primary that has not
noticed yet has a lower one), the standby is another node.

Signed records
--------------
A node of a cluster with a members file (``members``) stores its record sealed
(``seal_record``)::

    {"key": KEY_ID, "record": "<the record's JSON, as a string>", "sig": BASE64}

where ``sig`` is the pair's Ed25519 signature over ``signed_message(cluster, record)``:
a fixed context, the cluster's name and the record's exact bytes (the string, so no
re-encoding stands between what was signed and what is checked). ``open_record`` is
what a reader believes: with members given, a record is refused (``RecordRejected``,
its ``reason`` one of ``REJECT_REASONS``) when it is malformed, unsigned, of a pair
the members file does not list, signed with another key or a bad signature, stored
under another pair's key, or names an address its pair's entry does not list. Without
members nothing is verified (the registry is then as trusted as etcd's access rules).

Replays: etcd write access lets a holder put back an old record it once read, validly
signed. Such a record can only name an address its pair lists (one of the pair's own
nodes) and state the pair's role, epoch, load, limit or ``accepting`` of that time: at worst
work placed on a stale or stopped node of the right pair, which fails or is followed
to the primary by the pair's own client. It cannot name another address, another pair,
another cluster (the name is signed), or survive a key rotation (the old key leaves the
members file). No key or call goes anywhere the members file does not list.

Guarantees
----------
- ``decode_record`` refuses a record that is too large, not JSON, or has a field of the
  wrong type or out of range (``ValueError``), so a bad record cannot steer placement.
  A field it does not know is ignored and a field it lacks takes its default, so nodes
  of two versions read each other's records (an older node's has no
  ``per_host_concurrency``: 0); a sealed record's new fields are signed like the rest.
- ``open_record`` with members returns only a record signed by its pair's listed key,
  stored under its own pair, whose address the pair lists.
- ``placeable`` is the set of pairs with a primary that accepts new work, by name
  order; placement (``placement.owner``) over it is the same on every client.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pagesift.core.cluster.ids import check_pair_name
from pagesift.core.cluster.members import Members

__all__ = [
    "MAX_PER_HOST_CONCURRENCY", "MAX_RECORD_BYTES", "MAX_SEALED_BYTES", "REFRESH_SECONDS",
    "REJECT_REASONS", "Load", "NodeRecord", "PairView", "RecordRejected", "decode_record",
    "encode_record", "open_record", "pair_views", "parse_cluster_url", "placeable", "problems",
    "seal_record", "signed_message",
]  # fmt: skip

MAX_RECORD_BYTES = 8 * 1024
#: the largest ``per_host_concurrency`` a record may state (a node running with more
#: publishes this: no host sees more requests at once than that, whatever the config)
MAX_PER_HOST_CONCURRENCY = 1_000_000
MAX_SEALED_BYTES = MAX_RECORD_BYTES * 2  # the record as a JSON string, and its signature
#: why ``open_record`` refuses a record (the ``reason`` of
#: ``pagesift_cluster_records_rejected_total``)
REJECT_REASONS = (
    "malformed", "unsigned", "unknown_pair", "wrong_key", "bad_signature", "misplaced",
    "unlisted_address",
)  # fmt: skip
_SIGNING_CONTEXT = b"pagesift node record v1\x00"
REFRESH_SECONDS = 2.0


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], str]:
    """``etcd://HOST:PORT[,HOST:PORT...]/NAME`` as (endpoints, cluster name);
    ``ValueError`` names what is wrong."""
    scheme, sep, rest = url.partition("://")
    endpoints_text, slash, name = rest.partition("/")
    if scheme != "etcd" or not sep or not slash or not endpoints_text:
        raise ValueError(
            f"cluster must look like etcd://HOST:PORT[,HOST:PORT...]/NAME, not {url!r}"
        )
    endpoints: list[tuple[str, int]] = []
    for part in endpoints_text.split(","):
        host, colon, port = part.strip().rpartition(":")
        host = host.strip("[]")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"cluster endpoint {part!r}: expected HOST:PORT")
        endpoints.append((host, int(port)))
    return endpoints, check_pair_name(name.strip("/"))


@dataclass(frozen=True, slots=True)
class Load:
    """What a pair reports of its work now."""

    running_jobs: int = 0
    queued_pages: int = 0  # pages waiting in running jobs' frontiers
    pages_per_s: float = 0.0
    cpu: float = 0.0  # the primary's CPU use, 0..cores


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One node's registration (``C/nodes/{pair}/{node}``)."""

    pair: str
    node: str
    address: str  # host:port clients reach this node's JobService at
    role: str  # "primary" or "standby"
    epoch: int = 0
    lag: int = 0  # log entries a standby is behind (0 on the primary)
    capacity: int = 0  # pages it fetches at once at most (max_concurrency)
    # requests at once to one host, its config's per_host_concurrency (0: not published,
    # a node older than the field)
    per_host_concurrency: int = 0
    accepting: bool = True  # False while draining: no new work
    load: Load = field(default_factory=Load)
    updated: float = 0.0  # the writer's wall clock, seconds


@dataclass(frozen=True, slots=True)
class PairView:
    """A pair as its node records show it."""

    pair: str
    primary: str  # the primary's address ("" while no node says it is primary)
    standbys: tuple[str, ...]  # the other nodes' addresses
    epoch: int
    lag: int
    capacity: int
    accepting: bool
    load: Load
    updated: float  # the primary's last record, by its wall clock (0: no primary)


def encode_record(record: NodeRecord) -> bytes:
    data = json.dumps(asdict(record), sort_keys=True, separators=(",", ":")).encode()
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"a node record of {len(data)} bytes is over {MAX_RECORD_BYTES}")
    return data


def _typed(raw: Mapping[str, Any], name: str, kind: type, default: Any) -> Any:
    value = raw.get(name, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"node record: {name} must be {kind.__name__}")
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        raise ValueError(f"node record: {name} must not be negative")
    if isinstance(value, str) and len(value) > 300:
        raise ValueError(f"node record: {name} is too long")
    return value


def decode_record(data: bytes) -> NodeRecord:
    """A record read from etcd; ``ValueError`` for anything but a well-formed one."""
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"node record of {len(data)} bytes")
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("node record is not JSON") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("load", {}), dict):
        raise ValueError("node record must be a JSON object")
    load = raw.get("load", {})
    role = _typed(raw, "role", str, "")
    if role not in ("primary", "standby"):
        raise ValueError("node record: role must be primary or standby")
    node = _typed(raw, "node", str, "")
    if not node or "/" in node:
        raise ValueError("node record: node must be a key segment")
    per_host = _typed(raw, "per_host_concurrency", int, 0)
    if per_host > MAX_PER_HOST_CONCURRENCY:
        raise ValueError(
            f"node record: per_host_concurrency must be at most {MAX_PER_HOST_CONCURRENCY}"
        )
    return NodeRecord(
        pair=check_pair_name(_typed(raw, "pair", str, "")),
        node=node,
        address=_typed(raw, "address", str, ""),
        role=role,
        epoch=_typed(raw, "epoch", int, 0),
        lag=_typed(raw, "lag", int, 0),
        capacity=_typed(raw, "capacity", int, 0),
        per_host_concurrency=per_host,
        accepting=_typed(raw, "accepting", bool, True),
        load=Load(
            running_jobs=_typed(load, "running_jobs", int, 0),
            queued_pages=_typed(load, "queued_pages", int, 0),
            pages_per_s=_typed(load, "pages_per_s", float, 0.0),
            cpu=_typed(load, "cpu", float, 0.0),
        ),
        updated=_typed(raw, "updated", float, 0.0),
    )


class RecordRejected(ValueError):
    """A record ``open_record`` does not believe; ``reason`` is one of ``REJECT_REASONS``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def signed_message(cluster: str, record: bytes) -> bytes:
    """What a pair's key signs: the context, the cluster's name and the record's bytes."""
    return _SIGNING_CONTEXT + check_pair_name(cluster).encode() + b"\x00" + record


def seal_record(
    record: NodeRecord, *, cluster: str, key_id: str, sign: Callable[[bytes], bytes]
) -> bytes:
    """``record`` as a signed envelope (see the module docstring); ``sign`` is the pair's
    private key's (``signing.RecordSigner.sign``)."""
    body = encode_record(record)
    signature = sign(signed_message(cluster, body))
    envelope = {"key": key_id, "record": body.decode(), "sig": base64.b64encode(signature).decode()}
    return json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode()


def _envelope(data: bytes) -> tuple[bytes, str, bytes] | None:
    """(record bytes, key id, signature) of a sealed record; None for a plain one."""
    if len(data) > MAX_SEALED_BYTES:
        raise RecordRejected("malformed", f"node record of {len(data)} bytes")
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise RecordRejected("malformed", "node record is not JSON") from None
    if not isinstance(raw, dict):
        raise RecordRejected("malformed", "node record must be a JSON object")
    if "sig" not in raw:
        return None
    body, key, sig = raw.get("record"), raw.get("key"), raw.get("sig")
    if set(raw) != {"key", "record", "sig"} or not all(
        isinstance(v, str) for v in (body, key, sig)
    ):
        raise RecordRejected("malformed", "a sealed record has string key, record and sig alone")
    try:
        signature = base64.b64decode(str(sig), validate=True)
    except (binascii.Error, ValueError):
        raise RecordRejected("malformed", "a sealed record's sig is not base64") from None
    return str(body).encode(), str(key), signature


def open_record(
    data: bytes,
    *,
    cluster: str,
    key_pair: str,
    members: Members | None,
    verify: Callable[[bytes, bytes, bytes], bool],
) -> NodeRecord:
    """The record stored under pair ``key_pair``'s key, if it is to be believed;
    ``RecordRejected`` naming the reason otherwise (see the module docstring).
    ``verify(public_key, message, signature)`` is ``signing.verify_signature``."""
    sealed = _envelope(data)
    body = data if sealed is None else sealed[0]
    try:
        record = decode_record(body)
    except ValueError as e:
        raise RecordRejected("malformed", str(e)) from None
    if members is None:
        return record
    where = f"the record of node {record.node[:40]!r} of pair {record.pair}"
    if record.pair != key_pair:
        raise RecordRejected("misplaced", f"{where} is stored under pair {key_pair[:40]!r}")
    member = members.get(record.pair)
    if member is None:
        raise RecordRejected("unknown_pair", f"{where}: the members file lists no such pair")
    if sealed is None:
        raise RecordRejected("unsigned", f"{where} is not signed")
    _, key, signature = sealed
    if key != member.key_id:
        raise RecordRejected("wrong_key", f"{where} is signed with key {key[:20]!r}, not its own")
    if not verify(member.public_key, signed_message(cluster, body), signature):
        raise RecordRejected("bad_signature", f"{where}: the signature does not verify")
    if not member.lists(record.address):
        raise RecordRejected(
            "unlisted_address", f"{where} names {record.address[:80]!r}, not one of its nodes"
        )
    return record


def pair_views(records: Iterable[NodeRecord]) -> dict[str, PairView]:
    """Each pair's view from its nodes' records (see the module docstring)."""
    by_pair: dict[str, list[NodeRecord]] = {}
    for r in records:
        by_pair.setdefault(r.pair, []).append(r)
    views: dict[str, PairView] = {}
    for pair, recs in sorted(by_pair.items()):
        primaries = [r for r in recs if r.role == "primary"]
        lead = max(primaries, key=lambda r: (r.epoch, r.node), default=None)
        others = tuple(sorted(r.address for r in recs if r is not lead))
        views[pair] = PairView(
            pair=pair,
            primary=lead.address if lead else "",
            standbys=others,
            epoch=lead.epoch if lead else max(r.epoch for r in recs),
            lag=max((r.lag for r in recs if r is not lead), default=0),
            capacity=lead.capacity if lead else 0,
            accepting=lead.accepting if lead else False,
            load=lead.load if lead else Load(),
            updated=lead.updated if lead else 0.0,
        )
    return views


def placeable(views: Iterable[PairView]) -> list[str]:
    """The pairs that take new work: a primary named, accepting; sorted by name."""
    return sorted(v.pair for v in views if v.primary and v.accepting)


def problems(view: PairView, now: float, *, max_lag: int = 10_000) -> list[str]:
    """What is unhealthy about a pair, in words (empty: nothing)."""
    out: list[str] = []
    if not view.primary:
        out.append("no primary: its jobs are read-only on the standby, new jobs go elsewhere")
    if not view.standbys:
        out.append("no standby: a failure of the primary loses the pair")
    if view.primary and not view.accepting:
        out.append("draining: takes no new work")
    if view.lag > max_lag:
        out.append(f"standby {view.lag} entries behind")
    if view.primary and now - view.updated > 3 * REFRESH_SECONDS:
        out.append(f"primary's record is {now - view.updated:.0f} s old")
    return out
