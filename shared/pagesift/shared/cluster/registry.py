"""The cluster's registry in etcd: its key layout, a pair's record, and who takes new work.

Layout (one cluster = one prefix ``C`` = ``/pagesift-cluster/{name}``)
------------------------------------------------------------------------
::

    C/nodes/{pair}/{node}    -> NodeRecord as JSON, attached to that node's own lease:
                                etcd deletes it when the node is gone, so a pair whose
                                nodes are all gone drops out of placement by itself,
                                and a pair whose primary died still shows its standby.
    C/slots/{account}/{i}    -> a job id, under the lease of the pair running it: one
                                of the account's ``max_concurrent_jobs`` slots (``budgets``).
    C/pages/{account}/{day}  -> pages drawn from the account's daily allowance, an
                                integer changed only by compare-and-swap (``budgets``).

The records
-----------
Every node of every pair writes its own ``NodeRecord`` every ``REFRESH_SECONDS``: its
advertised client address, role, epoch, lag, load and capacity. ``updated`` is the
writer's wall clock, read only to show staleness; liveness is the lease's.
``pair_views`` merges a pair's node records into one ``PairView``: the primary is the
node that says it is primary with the highest epoch (a deposed primary that has not
noticed yet has a lower one), the standby is another node.

Guarantees
----------
- ``decode_record`` refuses a record that is too large, not JSON, or has a field of the
  wrong type or out of range (``ValueError``), so a bad record cannot steer placement.
- ``placeable`` is the set of pairs with a primary that accepts new work, by name
  order; placement (``placement.owner``) over it is the same on every client.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pagesift.shared.cluster.ids import check_pair_name

__all__ = [
    "MAX_RECORD_BYTES", "REFRESH_SECONDS", "Load", "NodeRecord", "PairView", "cluster_prefix",
    "decode_record", "encode_record", "node_key", "nodes_prefix", "pages_key", "pair_views",
    "parse_cluster_url", "placeable", "problems", "slot_key",
]  # fmt: skip

MAX_RECORD_BYTES = 8 * 1024
REFRESH_SECONDS = 2.0
_ROOT = "/pagesift-cluster"


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


def cluster_prefix(cluster: str) -> str:
    return f"{_ROOT}/{check_pair_name(cluster)}"


def nodes_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}/nodes/"


def node_key(cluster: str, pair: str, node: str) -> str:
    if not node or "/" in node or len(node) > 128:
        raise ValueError(f"node id {node[:40]!r} cannot be a key segment")
    return f"{nodes_prefix(cluster)}{check_pair_name(pair)}/{node}"


def slot_key(cluster: str, account: str, index: int) -> str:
    return f"{cluster_prefix(cluster)}/slots/{_account(account)}/{index}"


def pages_key(cluster: str, account: str, day: str) -> str:
    return f"{cluster_prefix(cluster)}/pages/{_account(account)}/{day}"


def _account(account: str) -> str:
    """An account name as one key segment ("" = anonymous)."""
    if "/" in account or len(account) > 128:
        raise ValueError(f"account {account[:40]!r} cannot be a key segment")
    return account or "-"


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
    return NodeRecord(
        pair=check_pair_name(_typed(raw, "pair", str, "")),
        node=node,
        address=_typed(raw, "address", str, ""),
        role=role,
        epoch=_typed(raw, "epoch", int, 0),
        lag=_typed(raw, "lag", int, 0),
        capacity=_typed(raw, "capacity", int, 0),
        accepting=_typed(raw, "accepting", bool, True),
        load=Load(
            running_jobs=_typed(load, "running_jobs", int, 0),
            queued_pages=_typed(load, "queued_pages", int, 0),
            pages_per_s=_typed(load, "pages_per_s", float, 0.0),
            cpu=_typed(load, "cpu", float, 0.0),
        ),
        updated=_typed(raw, "updated", float, 0.0),
    )


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
