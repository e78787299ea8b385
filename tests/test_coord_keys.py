"""Every etcd key path comes from ``pagesift.coord.keys`` (pure): the layout, and its checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pagesift.coord import keys


def test_cluster_keys_are_laid_out_under_the_clusters_prefix() -> None:
    assert keys.node_key("prod", "p1", "n1") == "/pagesift-cluster/prod/nodes/p1/n1"
    assert keys.node_key("prod", "p1", "n1").startswith(keys.nodes_prefix("prod"))
    assert keys.slot_key("prod", "", 3) == "/pagesift-cluster/prod/slots/-/3"
    assert keys.slot_key("prod", "acme", 0) == keys.slots_prefix("prod", "acme") + "0"
    assert keys.pages_key("prod", "acme", "2026-12-01").endswith("/pages/acme/2026-12-01")
    assert all(
        k.startswith(keys.cluster_prefix("prod") + "/")
        for k in (keys.nodes_prefix("prod"), keys.slots_prefix("prod", "a"))
    )


def test_a_pairs_witness_keys_sit_under_its_cluster_when_it_has_one() -> None:
    assert keys.leader_key(keys.witness_pair("p1")) == "/pagesift/p1/leader"
    assert keys.state_key(keys.witness_pair("p1", "prod")) == "/pagesift/prod/p1/state"


@pytest.mark.parametrize(
    "make",
    [
        lambda: keys.slot_key("prod", "a/b", 0),
        lambda: keys.pages_key("prod", "x" * 129, "2026-12-01"),
        lambda: keys.node_key("prod", "p1", "a/b"),
        lambda: keys.node_key("prod", "p1", ""),
        lambda: keys.node_key("Prod", "p1", "n"),
        lambda: keys.node_key("prod", "../p", "n"),
        lambda: keys.slots_prefix("a/b", "acme"),
    ],
)
def test_no_name_reaches_into_another_prefix(make: Callable[[], str]) -> None:
    with pytest.raises(ValueError):
        make()
