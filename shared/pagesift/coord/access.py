"""Who may touch which etcd keys: one role per pair, one for readers, from the key layout.

What it owns
------------
``pair_grants(cluster, pair)``: the permissions of pair ``pair``'s etcd role, as
(permission, key prefix) pairs built from ``coord.keys``, so the deploy kit's roles
(``deploy/etcd-auth.sh``, checked against this by tests/test_deploy_cluster.py) and
the tests that run etcd with auth on (tests/test_registry_auth.py) grant the same.
``reader_grants(cluster)``: what a cluster client (the gateway) needs: the registry, read.

A pair's role, in cluster ``C`` (``/pagesift-cluster/C``)::

    readwrite  /pagesift/C/{pair}/              its witness: leader and state keys
    readwrite  /pagesift-cluster/C/nodes/{pair}/  its own nodes' records
    read       /pagesift-cluster/C/nodes/        every pair's records (budgets, status)
    readwrite  /pagesift-cluster/C/slots/        the accounts' job slots (shared)
    readwrite  /pagesift-cluster/C/pages/        the accounts' daily pages (shared)
    readwrite  /pagesift-cluster/C/owners/       hosts' politeness owners (shared)

A pair alone (no cluster) needs its witness prefix only, ``/pagesift/{pair}/``.

Guarantee, and what it does not cover
-------------------------------------
With these roles a pair's credential cannot write another pair's witness keys or
registry records (etcd answers PERMISSION_DENIED): a leaked credential cannot depose
another pair's primary or register records under another pair, and a record under a
new pair name is refused by readers (``registry.open_record``: no such member). The
shared prefixes (slots, pages, owners) are written by every pair by design: a leaked
credential can disturb the accounts' budgets and hosts' ownership, not direct a
client's key anywhere.
"""

from __future__ import annotations

from typing import Literal

from pagesift.coord.keys import WITNESS_ROOT, cluster_prefix, nodes_prefix, witness_pair
from pagesift.core.cluster.ids import check_pair_name

__all__ = ["Grant", "pair_grants", "prefix_range_end", "reader_grants"]

Permission = Literal["read", "readwrite"]
Grant = tuple[Permission, str]  # (permission, key prefix)


def pair_grants(cluster: str, pair: str) -> list[Grant]:
    """Pair ``pair``'s role (see the module docstring); ``cluster`` "" = a pair alone."""
    witness = f"{WITNESS_ROOT}/{witness_pair(check_pair_name(pair), cluster)}/"
    if not cluster:
        return [("readwrite", witness)]
    c = cluster_prefix(cluster)
    return [
        ("readwrite", witness),
        ("readwrite", f"{nodes_prefix(cluster)}{pair}/"),
        ("read", nodes_prefix(cluster)),
        ("readwrite", f"{c}/slots/"),
        ("readwrite", f"{c}/pages/"),
        ("readwrite", f"{c}/owners/"),
    ]


def reader_grants(cluster: str) -> list[Grant]:
    """A cluster client's role: every pair's records, read only."""
    return [("read", nodes_prefix(cluster))]


def prefix_range_end(prefix: bytes) -> bytes:
    """etcd's range end of every key starting with ``prefix`` (the last byte below
    0xff raised by one, what follows it dropped)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return b"\x00"  # every key
    return trimmed[:-1] + bytes([trimmed[-1] + 1])
