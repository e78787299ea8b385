"""A node's elector, wired: the witness built from the node's configuration, and what
the node tells the elector about itself.

What it owns
------------
- ``witness_of(config)``: the etcd witness under the pair's key prefix (the cluster's
  name first), with its password read from ``witness_password_file``;
- ``holder_of(config, node_id)``: the addresses peers reach this node at, its client
  address and its replication address (the replication port when it listens apart);
- ``pair_state(config, node_id, log, sender, epoch)``: what this primary publishes (history,
  offset, and in sync mode the standby holding every acknowledged write);
- ``witness_gauges(elector, sender, promise)``: the witness series of the metrics.

``pagesift.node.node.Node`` calls these when its role machine asks for an election
(``StartElection``) and when the elector or a metrics scrape asks; the elector's loop
itself is ``pagesift.node.elector``'s, its decisions ``pagesift.core.ha.electorstate``'s.

Why it is safe
--------------
Every configuration problem is a ``StartRefused`` raised before any elector runs: a
wildcard ``--listen`` without ``--advertise`` (peers could not reach the winner), an
unreadable password file, a witness address etcd's client refuses. ``pair_state``
names a synchronous standby only while the sender reports it connected, not degraded,
and within ``sync_timeout`` of the primary: a standby that may lack an acknowledged
write is never published as one that holds them all.
"""

from __future__ import annotations

import time
from pathlib import Path

from pagesift.coord import keys
from pagesift.coord.witness import EtcdWitness
from pagesift.core.api.metricsources import WitnessGauges
from pagesift.core.config.schema import ServerConfig
from pagesift.core.ha.election import Holder, PairState
from pagesift.core.ha.failsafe import StandbyPromise
from pagesift.core.replication.log import Log
from pagesift.node.elector import Elector
from pagesift.node.startup import StartRefused, advertised
from pagesift.primary.replication import ReplicationServicer


def holder_of(config: ServerConfig, node_id: str) -> Holder:
    """This node as the witness's key names it: its id, client and replication address."""
    address = config.advertise or advertised(config.listen)
    if not address:
        raise StartRefused(
            "with a witness, --advertise HOST:PORT must say where peers reach this node "
            f"(--listen {config.listen} is a wildcard)"
        )
    replication = address
    if config.replication_listen:
        port = config.replication_listen.rsplit(":", 1)[1]
        replication = f"{address.rsplit(':', 1)[0]}:{port}"
    return Holder(node_id, address, replication)


def witness_of(config: ServerConfig) -> EtcdWitness:
    """The pair's witness in etcd (under the cluster's name when there is one)."""
    password = ""
    if config.witness_password_file:
        try:
            password = Path(config.witness_password_file).read_text().strip()
        except OSError as e:
            raise StartRefused(f"witness_password_file: {e.strerror or e}") from None
    try:
        prefix = keys.witness_pair(config.pair, config.cluster)
        return EtcdWitness(config.witness, prefix, user=config.witness_user, password=password)
    except ValueError as e:
        raise StartRefused(f"witness: {e}") from None


def pair_state(
    config: ServerConfig, node_id: str, log: Log, sender: ReplicationServicer, epoch: int
) -> PairState:
    """What this primary publishes: its history and offset, and in sync mode the
    standby that holds every acknowledged write ("" when none is known to)."""
    st = sender.status()
    in_sync = (
        config.replication_mode == "sync"
        and st.connected
        and not st.sync_degraded
        and (st.lag_offsets == 0 or st.lag_seconds < config.sync_timeout)
    )
    return PairState(
        primary=node_id,
        history_id=log.history_id,
        epoch=max(log.epoch, epoch),
        offset=log.last_offset,
        mode=config.replication_mode,
        sync_standby=st.peer if in_sync else "",
        standbys=sender.standbys() if config.witness_failsafe else (),
    )


def witness_gauges(
    elector: Elector | None, sender: ReplicationServicer, promise: StandbyPromise
) -> WitnessGauges | None:
    """The witness series (None without a witness)."""
    if elector is None:
        return None
    f = elector.figures
    return WitnessGauges(
        f.up,
        f.lease_remaining(time.monotonic()),
        f.takeover_behind,
        f.failsafe,
        sender.grant_requests,
        sender.grants_confirmed,
        promise.given,
    )
