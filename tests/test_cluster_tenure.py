"""The tenure rule (``pagesift.core.cluster.tenure``), driven deterministically.

Each test feeds the registrar's and the registry reads' events with explicit instants
and asks ``wait``; the hosts are picked by rendezvous hashing over the pair names used,
so which pair owns which host is computed, not assumed.
"""

from __future__ import annotations

import pytest

from pagesift.core.cluster import placement
from pagesift.core.cluster.tenure import MARGIN, RECHECK, Tenure

TTL, SETTLE = 5.0, 3.0
PAIRS = ("alpha", "beta")


def _host(*owners: tuple[tuple[str, ...], str]) -> str:
    """A host whose owner among each ``pairs`` is the pair named beside it."""
    for k in range(5000):
        host = f"h{k}.test"
        if all(placement.owner(placement.site_key(host), ps) == p for ps, p in owners):
            return host
    raise AssertionError("no such host")


def _host_of(pair: str) -> str:
    return _host((PAIRS, pair))


def _registered(now: float = 0.0, here: str = "alpha") -> Tenure:
    t = Tenure(here, ttl=TTL, settle=SETTLE, stall=TTL)
    t.round_began(now)
    t.granted(now, lapsed=False)
    t.read(PAIRS, now)
    return t


def test_a_node_holds_nothing_before_its_first_lease() -> None:
    t = Tenure("alpha", ttl=TTL, settle=SETTLE, stall=TTL)
    t.read(PAIRS, 0.0)
    assert not t.holds(0.0)
    assert t.wait(_host_of("alpha"), 0.0) == RECHECK


def test_a_confirmed_lease_holds_until_its_ttl_from_when_the_round_was_sent() -> None:
    t = Tenure("alpha", ttl=TTL, settle=SETTLE, stall=TTL)
    t.round_began(10.0)
    t.granted(10.8, lapsed=False)  # the answer came late: the deadline counts from 10.0
    assert t.held_until == pytest.approx(10.0 + TTL * (1 - MARGIN))
    assert t.wait(_host_of("alpha"), 11.0) == 0.0


def test_past_its_deadline_a_node_that_keeps_trying_holds_on_in_failsafe() -> None:
    t = _registered()
    host = _host_of("alpha")
    # etcd answers nobody: every round fails, at the registrar's pace
    for k in range(1, 40):
        t.failed(k * 1.7)
        assert t.wait(host, k * 1.7 + 0.5) == 0.0
    assert t.holds(39 * 1.7 + 1)


def test_a_node_that_was_frozen_past_its_deadline_holds_nothing_until_etcd_answers() -> None:
    t = _registered()
    host = _host_of("alpha")
    t.round_began(1.7)
    t.kept(1.7)
    # SIGSTOP for 20 s: the first reading after it comes before any round
    assert t.wait(host, 22.0) == RECHECK
    t.round_began(22.1)
    t.failed(22.5)  # etcd does not answer the first round after the gap
    assert t.wait(host, 23.0) == RECHECK and not t.holds(30.0)
    t.round_began(24.0)
    t.kept(24.1)  # the lease survived (etcd was down all along): nobody took over
    assert t.wait(host, 24.2) == 0.0


def test_a_lease_that_lapsed_makes_the_pair_wait_the_handover_for_hosts_others_took() -> None:
    t = _registered()
    host = _host_of("alpha")
    t.round_began(25.0)
    t.granted(25.1, lapsed=True)  # frozen, the lease ran out, a new one
    assert t.wait(host, 25.2) == pytest.approx(25.1 + SETTLE - 25.2)
    assert t.wait(host, 25.1 + SETTLE) == 0.0


def test_a_lone_pair_has_nobody_to_hand_over_from() -> None:
    t = Tenure("alpha", ttl=TTL, settle=SETTLE, stall=TTL)
    t.round_began(0.0)
    t.granted(0.0, lapsed=False)
    t.read(("alpha",), 0.0)
    t.joined(0.1)
    assert t.wait("anything.test", 0.2) == 0.0


def test_a_host_that_came_with_a_read_waits_the_handover_and_one_that_stayed_does_not() -> None:
    t = Tenure("alpha", ttl=TTL, settle=SETTLE, stall=TTL)
    t.round_began(0.0)
    t.granted(0.0, lapsed=False)
    three = ("alpha", "beta", "gamma")
    t.read(three, 0.0)
    came_from_gamma = _host((three, "gamma"), (PAIRS, "alpha"))
    stayed = _host((three, "alpha"), (PAIRS, "alpha"))
    t.read(PAIRS, 2.0)  # gamma left: its hosts split between alpha and beta
    assert t.wait(came_from_gamma, 2.5) == pytest.approx(2.0 + SETTLE - 2.5)
    assert t.wait(stayed, 2.5) == 0.0
    assert t.wait(came_from_gamma, 2.0 + SETTLE) == 0.0


def test_becoming_primary_waits_the_handover_for_every_host_another_pair_would_own() -> None:
    t = _registered()
    host = _host_of("alpha")
    t.joined(1.0)
    assert t.wait(host, 1.0) == pytest.approx(SETTLE)
    assert t.wait(host, 1.0 + SETTLE) == 0.0


def test_views_older_than_the_handover_are_forgotten() -> None:
    t = _registered()
    for k in range(1, 200):  # a pair flapping in and out
        t.read(PAIRS if k % 2 else ("alpha",), k * 10.0)
    assert len(t._past) <= 1
