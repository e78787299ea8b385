"""The cluster's registry in etcd: its key layout, a pair's record, and who takes new work.

Layout (one cluster = one prefix ``C`` = ``/pagesift-cluster/{name}``)
------------------------------------------------------------------------
::

    C/pairs/{pair}           -> PairRecord as JSON, attached to the pair's registration
                                lease: etcd deletes it when every node of the pair is
                                gone, so a dead pair drops out of placement by itself.
    C/slots/{account}/{i}    -> a job id, under the lease of the pair running it: one
                                of the account's ``max_concurrent_jobs`` slots (``budgets``).
    C/pages/{account}/{day}  -> pages drawn from the account's daily allowance, an
                                integer changed only by compare-and-swap (``budgets``).

The record
----------
Written by the pair's primary (the witness's holder) every ``REFRESH_SECONDS``: its
advertised addresses, epoch, load and capacity. ``updated`` is the writer's wall clock,
read only to show staleness; liveness is the lease's.

Guarantees
----------
- ``decode_record`` refuses a record that is too large, not JSON, or has a field of the
  wrong type or out of range (``ValueError``), so a bad record cannot steer placement.
- ``placeable`` is the set of pairs with a primary and room for new work, by name order;
  placement (``placement.owner``) over it is therefore the same on every client.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pagesift.shared.cluster.ids import check_pair_name

__all__ = [
    "MAX_RECORD_BYTES",
    "REFRESH_SECONDS",
    "Load",
    "PairRecord",
    "cluster_prefix",
    "decode_record",
    "encode_record",
    "pages_key",
    "pair_key",
    "placeable",
    "slot_key",
]  # fmt: skip

MAX_RECORD_BYTES = 8 * 1024
REFRESH_SECONDS = 2.0
_ROOT = "/pagesift-cluster"


def cluster_prefix(cluster: str) -> str:
    return f"{_ROOT}/{check_pair_name(cluster)}"


def pair_key(cluster: str, pair: str) -> str:
    return f"{cluster_prefix(cluster)}/pairs/{check_pair_name(pair)}"


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
class PairRecord:
    """A pair's registration (``C/pairs/{pair}``)."""

    pair: str
    primary: str  # host:port of the node that takes writes ("" while none does)
    standby: str = ""  # host:port of its standby ("" when none is attached)
    epoch: int = 0
    lag: int = 0  # log entries the standby is behind
    capacity: int = 0  # pages it fetches at once at most (max_concurrency)
    accepting: bool = True  # False while draining: no new work
    load: Load = field(default_factory=Load)
    updated: float = 0.0  # the writer's wall clock, seconds


def encode_record(record: PairRecord) -> bytes:
    data = json.dumps(asdict(record), sort_keys=True, separators=(",", ":")).encode()
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"a pair record of {len(data)} bytes is over {MAX_RECORD_BYTES}")
    return data


def _typed(raw: Mapping[str, Any], name: str, kind: type, default: Any) -> Any:
    value = raw.get(name, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"pair record: {name} must be {kind.__name__}")
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        raise ValueError(f"pair record: {name} must not be negative")
    if isinstance(value, str) and len(value) > 300:
        raise ValueError(f"pair record: {name} is too long")
    return value


def decode_record(data: bytes) -> PairRecord:
    """A record read from etcd; ``ValueError`` for anything but a well-formed one."""
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"pair record of {len(data)} bytes")
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("pair record is not JSON") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("load", {}), dict):
        raise ValueError("pair record must be a JSON object")
    load = raw.get("load", {})
    return PairRecord(
        pair=check_pair_name(_typed(raw, "pair", str, "")),
        primary=_typed(raw, "primary", str, ""),
        standby=_typed(raw, "standby", str, ""),
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


def placeable(records: Iterable[PairRecord]) -> list[str]:
    """The pairs that take new work: a primary named, accepting; sorted by name."""
    return sorted(r.pair for r in records if r.primary and r.accepting)
