"""Every etcd key pagesift reads or writes, in one place, with who uses it.

Layout
------
A pair's witness (``coord.witness``; the records are ``pagesift.core.ha.election``'s)::

    /pagesift/{pair}/leader            -> the holder of the pair's lease: the primary
    /pagesift/{pair}/state             -> the pair state, written only by the holder

where ``{pair}`` is the pair's name, or ``{cluster}/{pair}`` in a cluster
(``witness_pair``): two clusters sharing one etcd may reuse a pair name.

A cluster ``C`` = ``/pagesift-cluster/{name}`` (``cluster_prefix``)::

    C/nodes/{pair}/{node}    -> NodeRecord, under that node's lease: written by the node's
                                registrar (``coord.registry``), read by cluster clients
                                (``pagesift.client.registryview``), ``cluster status``,
                                the drill and the budgets (the pair count)
    C/slots/{account}/{i}    -> a job id, under the lease of the pair running it: one of
                                the account's ``max_concurrent_jobs`` slots
                                (``coord.budgets``, created and deleted by transactions)
    C/pages/{account}/{day}  -> pages drawn from the account's daily allowance, changed
                                only by compare-and-swap (``coord.budgets``)

Room is left under ``C`` for node-side ownership: ``C/owners/{host}`` (the pair that
owns a host's politeness, under its lease) belongs beside these when it lands, and
nothing else may be written under ``C/owners/``.

Guarantee
---------
Every segment is checked (a pair or cluster name by ``check_pair_name``, a node id or an
account as one segment without ``/``), so no name can reach into another's prefix.
"""

from __future__ import annotations

from pagesift.core.cluster.ids import check_pair_name

__all__ = [
    "CLUSTER_ROOT", "WITNESS_ROOT", "cluster_prefix", "leader_key", "node_key",
    "nodes_prefix", "pages_key", "slot_key", "slots_prefix", "state_key", "witness_pair",
]  # fmt: skip

WITNESS_ROOT = "/pagesift"
CLUSTER_ROOT = "/pagesift-cluster"
MAX_SEGMENT = 128


def witness_pair(pair: str, cluster: str = "") -> str:
    """The pair's path under ``WITNESS_ROOT``: ``{cluster}/{pair}`` in a cluster."""
    return f"{cluster}/{pair}" if cluster else pair


def leader_key(pair_path: str) -> str:
    return f"{WITNESS_ROOT}/{pair_path.strip('/')}/leader"


def state_key(pair_path: str) -> str:
    return f"{WITNESS_ROOT}/{pair_path.strip('/')}/state"


def cluster_prefix(cluster: str) -> str:
    return f"{CLUSTER_ROOT}/{check_pair_name(cluster)}"


def nodes_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}/nodes/"


def node_key(cluster: str, pair: str, node: str) -> str:
    if not node or "/" in node or len(node) > MAX_SEGMENT:
        raise ValueError(f"node id {node[:40]!r} cannot be a key segment")
    return f"{nodes_prefix(cluster)}{check_pair_name(pair)}/{node}"


def slots_prefix(cluster: str, account: str) -> str:
    """The prefix of the account's slot keys (``slot_key`` = this + the index)."""
    return f"{cluster_prefix(cluster)}/slots/{_account(account)}/"


def slot_key(cluster: str, account: str, index: int) -> str:
    return f"{slots_prefix(cluster, account)}{index}"


def pages_key(cluster: str, account: str, day: str) -> str:
    return f"{cluster_prefix(cluster)}/pages/{_account(account)}/{day}"


def _account(account: str) -> str:
    """An account name as one key segment ("" = anonymous)."""
    if "/" in account or len(account) > MAX_SEGMENT:
        raise ValueError(f"account {account[:40]!r} cannot be a key segment")
    return account or "-"
