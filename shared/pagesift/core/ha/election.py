"""The witness's rules, pure: who may campaign, and until when a lease lets a primary write.

What it owns
------------
The records a pair keeps in its witness and the decisions taken over them. No I/O:
``pagesift.coord.witness`` talks to etcd, ``pagesift.core.ha.electorstate`` (the
elector's machine) applies these rules to what was read, and ``pagesift.node.elector``
is its shell (the I/O and ``time.monotonic()``).

Layout in the witness (one pair = one key prefix ``P``, so pairs can share an etcd)
------------------------------------------------------------------------------------
::

    P/leader -> Holder{node_id, address, replication} as JSON, attached to the holder's lease:
                etcd deletes it when the lease lapses. Its create revision is the
                holder's EPOCH (unique and increasing within one etcd).
    P/state  -> PairState as JSON, no lease (it outlives the primary); written only
                by the holder, in a transaction that checks P/leader's create
                revision is still the holder's epoch.

The guarantees, and why they hold
---------------------------------
* **No write after the lease could have ended.** etcd lets a lease lapse no sooner
  than ``ttl`` after it *received* the last keepalive, so no sooner than ``ttl``
  after the holder *sent* it. ``write_deadline`` is ``sent + ttl - margin``: the
  holder's log refuses writes from that instant (``Log.set_write_deadline``), on the
  monotonic clock, before any other node can take the key. The margin covers the
  commit of a write that passed the check just before it and the two clocks'
  rates (both are monotonic clocks of one host, or NTP-disciplined hosts).
* **Two primaries never share an epoch.** The epoch is the leader key's create
  revision, which etcd never hands out twice; a promotion takes at least it
  (``Log.promote(epoch=...)``), and fencing compares epochs as without a witness.
* **Sync mode loses no acknowledged write on takeover.** A node campaigns only when
  it holds everything a client was told is durable: it was the primary that
  published the state, or it is the standby the state names as synchronous. The
  primary clears that name (``PairState.sync_standby``) in the witness *before* it
  acknowledges a write its standby did not confirm (``Elector.record_out_of_sync``).
* **Failsafe grants bind.** A node that promised the primary not to campaign
  (``failsafe``) waits it out; while the pair state names the standbys the primary's
  failsafe counts on, no other node but the primary campaigns.
* **Async mode says what it lost.** A standby of the latest history may campaign;
  ``Eligibility.behind`` is how far it was behind the primary's last published
  offset, which the winner logs and exports.
* **A node of another history never wins** while the pair's state names a history:
  a deposed primary, or an empty node, cannot take over from a pair that has data.
  A node with no history campaigns only when no pair state exists and the leader key
  has been vacant for ``EMPTY_NODE_GRACE`` seconds: a running node with data, which
  looks every ``poll_interval`` (<= 0.25 s) and campaigns at once, goes first.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

#: The smallest lease etcd grants reliably (its default election timeout is 1 s).
MIN_TTL = 2
#: Seconds of vacancy an empty node waits before it campaigns for a new pair (eight
#: looks of a node with data at the longest ``poll_interval``).
EMPTY_NODE_GRACE = 2.0


def parse_witness(url: str) -> list[tuple[str, int]]:
    """``etcd://HOST:PORT[,HOST:PORT...]`` as (host, port) pairs; ``ValueError`` names
    what is wrong."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "etcd":
        raise ValueError(f"witness must look like etcd://HOST:PORT[,HOST:PORT...], not {url!r}")
    endpoints: list[tuple[str, int]] = []
    for part in rest.rstrip("/").split(","):
        split = urlsplit(f"//{part.strip()}")
        try:
            port = split.port
        except ValueError:
            port = None
        if not split.hostname or port is None:
            raise ValueError(f"witness endpoint {part!r}: expected HOST:PORT")
        endpoints.append((split.hostname, port))
    return endpoints


def lease_margin(ttl: float) -> float:
    """How long before the lease could end the holder stops writing."""
    return max(0.25, ttl / 10)


def write_deadline(sent_at: float, ttl: float) -> float:
    """The instant (monotonic) from which a holder whose last acknowledged keepalive
    (or grant) was sent at ``sent_at`` takes no write."""
    return sent_at + ttl - lease_margin(ttl)


def keepalive_interval(ttl: float) -> float:
    """How often the holder refreshes its lease: three tries per ttl."""
    return ttl / 3


def poll_interval(ttl: float) -> float:
    """How often a node that holds no lease looks at the leader key."""
    return min(0.25, ttl / 10)


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds the leader key: the node's id, where it serves clients (``address``)
    and its replication stream (``replication``, the same address unless it has an
    mTLS port of its own), with the key's create revision as epoch."""

    node_id: str
    address: str
    replication: str
    epoch: int = 0

    def value(self) -> bytes:
        doc = {"node_id": self.node_id, "address": self.address, "replication": self.replication}
        return json.dumps(doc).encode()

    @classmethod
    def parse(cls, raw: bytes, epoch: int) -> Holder:
        doc = _json_object(raw)
        address = str(doc.get("address", ""))
        return cls(
            str(doc.get("node_id", "")), address, str(doc.get("replication", address)), epoch
        )


@dataclass(frozen=True, slots=True)
class PairState:
    """What the holder last published: its history, epoch and last offset, the
    replication mode, (sync mode) the standby that holds every acknowledged write
    ("" when sync mode is degraded or no standby is in sync), and (failsafe) the
    standbys it streams to: the only nodes but itself that may campaign while named."""

    primary: str  # the publisher's node id
    history_id: str
    epoch: int
    offset: int
    mode: str  # "async" | "sync"
    sync_standby: str = ""
    standbys: tuple[str, ...] = ()  # failsafe: the standbys whose grants the primary needs

    def value(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def parse(cls, raw: bytes) -> PairState:
        doc = _json_object(raw)
        return cls(
            primary=str(doc.get("primary", "")),
            history_id=str(doc.get("history_id", "")),
            epoch=int(doc.get("epoch", 0)),
            offset=int(doc.get("offset", 0)),
            mode=str(doc.get("mode", "async")),
            sync_standby=str(doc.get("sync_standby", "")),
            standbys=_names(doc.get("standbys")),
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node that holds no lease, as it sees itself."""

    node_id: str
    history_id: str  # "" = never synced
    offset: int  # its last applied (or written) offset
    promised_until: float = float("-inf")  # failsafe: no campaign before (monotonic)


@dataclass(frozen=True, slots=True)
class Eligibility:
    ok: bool
    reason: str
    behind: int = 0  # entries behind the state's offset (async takeovers)


def may_campaign(
    me: Candidate, state: PairState | None, *, vacant_for: float, promised_for: float = 0.0
) -> Eligibility:
    """Whether ``me`` may try to take the vacant leader key (see the module docstring);
    ``promised_for``: seconds left of a failsafe promise not to (``failsafe``)."""
    if promised_for > 0:
        return Eligibility(
            False,
            f"this node promised the primary not to campaign for {promised_for:.1f} s more "
            "(a failsafe grant: the primary may still be writing)",
        )
    if state is None or not state.history_id:
        if me.history_id:
            return Eligibility(True, "no pair state yet: this node's history starts it")
        if vacant_for >= EMPTY_NODE_GRACE:
            return Eligibility(True, "no pair state and no node with data came forward")
        return Eligibility(False, "an empty node lets a node with data go first")
    if me.history_id != state.history_id:
        return Eligibility(
            False,
            f"this node's history {me.history_id or '(none)'} is not the pair's "
            f"latest ({state.history_id})",
        )
    behind = max(0, state.offset - me.offset)
    if me.node_id == state.primary:
        return Eligibility(True, "this node was the primary", behind)
    if state.standbys and me.node_id not in state.standbys:
        return Eligibility(
            False,
            f"the primary's failsafe counts on standbys {', '.join(state.standbys)}, not on "
            "this node: it may still be writing on their grants",
            behind,
        )
    if state.mode == "sync" and state.sync_standby != me.node_id:
        return Eligibility(
            False,
            "sync mode: the primary acknowledged writes this node was not confirmed "
            "to hold (it was not the synchronous standby)",
            behind,
        )
    return Eligibility(True, f"a standby of the latest history, {behind} entries behind", behind)


def _names(raw: object) -> tuple[str, ...]:
    """A JSON list of node ids (anything else, or a non-string in it, counts for none)."""
    return tuple(n for n in raw if isinstance(n, str)) if isinstance(raw, list) else ()


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
