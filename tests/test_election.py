"""The witness's rules (``election``), pure: ``may_campaign``, the deadline arithmetic,
the records and the witness URL take their inputs and return a verdict. The log's side
of the deadline is tested with the log (``test_replog.py``)."""

from __future__ import annotations

import pytest

from pagesift.core.ha import election
from pagesift.core.ha.election import Candidate, Holder, PairState, may_campaign

STATE = PairState(primary="A", history_id="h1", epoch=7, offset=100, mode="async")


def test_an_empty_node_lets_a_node_with_data_go_first() -> None:
    empty = Candidate("B", "", 0)
    assert not may_campaign(empty, None, vacant_for=0.0).ok
    grace = election.EMPTY_NODE_GRACE
    assert not may_campaign(empty, None, vacant_for=grace - 0.1).ok
    assert may_campaign(empty, None, vacant_for=grace).ok
    assert may_campaign(Candidate("B", "h0", 3), None, vacant_for=0.0).ok


def test_a_node_of_another_history_never_takes_over_a_pair_with_state() -> None:
    for history in ("", "h0"):
        verdict = may_campaign(Candidate("B", history, 500), STATE, vacant_for=1e9)
        assert not verdict.ok and "latest (h1)" in verdict.reason


def test_in_async_mode_a_standby_of_the_latest_history_campaigns_and_says_how_far_behind() -> None:
    verdict = may_campaign(Candidate("B", "h1", 60), STATE, vacant_for=0.0)
    assert verdict.ok and verdict.behind == 40
    ahead = may_campaign(Candidate("B", "h1", 130), STATE, vacant_for=0.0)
    assert ahead.ok and ahead.behind == 0


def test_in_sync_mode_only_the_synchronous_standby_or_the_old_primary_campaigns() -> None:
    sync = PairState("A", "h1", 7, 100, "sync", sync_standby="B")
    assert may_campaign(Candidate("B", "h1", 100), sync, vacant_for=0.0).ok
    other = may_campaign(Candidate("C", "h1", 100), sync, vacant_for=0.0)
    assert not other.ok and "synchronous standby" in other.reason
    degraded = PairState("A", "h1", 7, 100, "sync", sync_standby="")
    assert not may_campaign(Candidate("B", "h1", 100), degraded, vacant_for=0.0).ok
    assert may_campaign(Candidate("A", "h1", 100), degraded, vacant_for=0.0).ok


def test_the_write_deadline_ends_a_margin_before_the_earliest_expiry() -> None:
    assert election.write_deadline(100.0, 5.0) == pytest.approx(104.5)
    assert election.write_deadline(100.0, 2.0) == pytest.approx(101.75)
    assert election.keepalive_interval(6.0) == 2.0  # three tries before the deadline


def test_records_round_trip_and_tolerate_garbage() -> None:
    holder = Holder("A", "a:1", "a:2", 9)
    assert Holder.parse(holder.value(), 9) == holder
    assert Holder.parse(b'{"node_id": "A", "address": "a:1"}', 3).replication == "a:1"
    assert PairState.parse(STATE.value()) == STATE
    assert PairState.parse(b"not json") == PairState("", "", 0, 0, "async")


def test_witness_urls_name_every_endpoint_or_are_refused() -> None:
    assert election.parse_witness("etcd://a:1,b:2") == [("a", 1), ("b", 2)]
    assert election.parse_witness("etcd://[::1]:2379") == [("::1", 2379)]
    for bad in ("http://a:1", "etcd://a", "etcd://a:x", "a:1"):
        with pytest.raises(ValueError):
            election.parse_witness(bad)
