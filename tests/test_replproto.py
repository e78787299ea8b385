"""The replication protocol's decisions, without sockets or disk."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagesift.core.ha.fencingrules import (
    FencingVerdict,
    fencing_verdict,
    may_accept_writes,
    must_fence,
)
from pagesift.core.replication.protocol import (
    Continue,
    EntryMeta,
    Full,
    Hello,
    PrimaryState,
    ProtocolError,
    Refuse,
    StalePrimary,
    StepDown,
    check_batch,
    check_primary_epoch,
    decide,
    plan_promotion,
)

PRIMARY = PrimaryState(
    writable=True,
    epoch=2,
    history_id="h2",
    prev_history_id="h1",
    switch_offset=100,
    first_offset=50,
    last_offset=180,
)


def hello(history: str, applied: int, epoch: int = 2) -> Hello:
    return Hello("standby", history, applied, epoch)


def test_same_history_within_the_backlog_continues_from_the_next_offset() -> None:
    assert decide(hello("h2", 120), PRIMARY) == Continue(121, "same history")
    assert decide(hello("h2", 49), PRIMARY) == Continue(50, "same history")


def test_a_caught_up_standby_continues_with_nothing_to_send_yet() -> None:
    d = decide(hello("h2", 180), PRIMARY)
    assert isinstance(d, Continue) and d.from_offset == 181


def test_an_offset_older_than_the_backlog_needs_a_full_resync() -> None:
    d = decide(hello("h2", 48), PRIMARY)
    assert isinstance(d, Full) and d.discarded == 0


def test_a_standby_ahead_of_the_primary_in_its_own_history_resyncs() -> None:
    assert isinstance(decide(hello("h2", 181), PRIMARY), Full)


def test_a_new_or_unknown_history_resyncs_in_full() -> None:
    assert isinstance(decide(hello("", 0, epoch=0), PRIMARY), Full)
    assert isinstance(decide(hello("elsewhere", 120), PRIMARY), Full)


def test_the_previous_history_continues_up_to_the_switch_offset() -> None:
    assert decide(hello("h1", 100, epoch=1), PRIMARY) == Continue(
        101, "previous history, within the switch offset"
    )
    assert isinstance(decide(hello("h1", 70, epoch=1), PRIMARY), Continue)


def test_writes_past_the_switch_offset_are_discarded_by_a_full_resync() -> None:
    d = decide(hello("h1", 107, epoch=1), PRIMARY)
    assert isinstance(d, Full) and d.discarded == 7


def test_the_previous_history_outside_the_backlog_resyncs_without_discarding() -> None:
    d = decide(hello("h1", 20, epoch=1), PRIMARY)
    assert isinstance(d, Full) and d.discarded == 0


def test_a_peer_of_a_higher_epoch_makes_the_primary_step_down() -> None:
    d = decide(hello("h3", 10, epoch=3), PRIMARY)
    assert isinstance(d, StepDown) and d.peer_epoch == 3
    assert must_fence(2, 3) and not must_fence(3, 3) and not must_fence(3, 2)


def test_a_node_that_is_not_a_writable_primary_refuses() -> None:
    standby = PrimaryState(False, 2, "h2", "", 0, 1, 10)
    assert isinstance(decide(hello("h2", 5), standby), Refuse)
    # a higher epoch too: a standby takes no writes, there is nothing to fence
    assert isinstance(decide(hello("h3", 5, epoch=3), standby), Refuse)


@given(
    applied=st.integers(0, 300),
    history=st.sampled_from(["", "h1", "h2", "x"]),
    epoch=st.integers(0, 2),
)
def test_continue_is_only_ever_offered_when_the_backlog_holds_the_next_entry(
    applied: int, history: str, epoch: int
) -> None:
    d = decide(hello(history, applied, epoch), PRIMARY)
    if isinstance(d, Continue):
        assert d.from_offset == applied + 1
        assert PRIMARY.first_offset <= d.from_offset <= PRIMARY.last_offset + 1
        assert history == "h2" or (history == "h1" and applied <= PRIMARY.switch_offset)


def test_a_standby_never_follows_a_primary_of_a_lower_epoch() -> None:
    check_primary_epoch(3, 3)
    check_primary_epoch(3, 4)
    with pytest.raises(StalePrimary):
        check_primary_epoch(3, 2)


def metas(*pairs: tuple[int, int]) -> list[EntryMeta]:
    return [EntryMeta(o, e) for o, e in pairs]


def test_a_contiguous_batch_is_accepted_and_a_leading_overlap_skipped() -> None:
    assert check_batch(metas((11, 1), (12, 1)), applied=10, tail_epoch=1, primary_epoch=1) == 0
    assert (
        check_batch(metas((9, 1), (10, 1), (11, 1)), applied=10, tail_epoch=1, primary_epoch=1) == 2
    )
    assert check_batch([], applied=10, tail_epoch=1, primary_epoch=1) == 0


def test_a_gap_or_a_reordered_batch_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        check_batch(metas((12, 1)), applied=10, tail_epoch=1, primary_epoch=1)
    with pytest.raises(ProtocolError):
        check_batch(metas((11, 1), (13, 1)), applied=10, tail_epoch=1, primary_epoch=1)
    with pytest.raises(ProtocolError):
        check_batch(metas((11, 1), (10, 1)), applied=10, tail_epoch=1, primary_epoch=1)


def test_epochs_may_rise_inside_a_batch_but_never_fall_or_pass_the_primary() -> None:
    # the previous history's entries (epoch 1) then the new primary's (epoch 2)
    assert check_batch(metas((11, 1), (12, 2)), applied=10, tail_epoch=1, primary_epoch=2) == 0
    with pytest.raises(ProtocolError):
        check_batch(metas((11, 2), (12, 1)), applied=10, tail_epoch=1, primary_epoch=2)
    with pytest.raises(ProtocolError):
        check_batch(metas((11, 1)), applied=10, tail_epoch=2, primary_epoch=2)
    with pytest.raises(ProtocolError):
        check_batch(metas((11, 3)), applied=10, tail_epoch=1, primary_epoch=2)


def test_promotion_raises_the_epoch_and_remembers_where_the_old_history_ends() -> None:
    p = plan_promotion(epoch=4, history_id="old", applied_offset=77, new_history_id="new")
    assert (p.epoch, p.history_id, p.prev_history_id, p.switch_offset) == (5, "new", "old", 77)
    with pytest.raises(ValueError):
        plan_promotion(epoch=4, history_id="old", applied_offset=77, new_history_id="old")


def test_a_fenced_node_writes_again_only_after_adopting_the_fencing_epoch() -> None:
    assert may_accept_writes(epoch=3, fenced_epoch=0)
    assert not may_accept_writes(epoch=3, fenced_epoch=4)
    assert may_accept_writes(epoch=4, fenced_epoch=4)


def test_a_fencing_hello_is_done_once_refused_and_deposes_us_only_for_a_higher_epoch() -> None:
    assert fencing_verdict(2, refused=True, decision_epoch=None) is FencingVerdict.DONE
    assert fencing_verdict(2, refused=True, decision_epoch=3) is FencingVerdict.DONE
    assert fencing_verdict(2, refused=False, decision_epoch=None) is FencingVerdict.RETRY
    assert fencing_verdict(2, refused=False, decision_epoch=3) is FencingVerdict.DEPOSED
    assert fencing_verdict(2, refused=False, decision_epoch=2) is FencingVerdict.CONFLICT
    assert fencing_verdict(2, refused=False, decision_epoch=1) is FencingVerdict.CONFLICT
    # one typed verdict, still readable as the word it logs
    assert str(FencingVerdict.DONE) == "done" and f"{FencingVerdict.STOPPED}" == "stopped"


@given(
    our=st.integers(0, 5),
    refused=st.booleans(),
    answer=st.one_of(st.none(), st.integers(0, 7)),
)
def test_a_fencing_verdict_deposes_us_only_for_an_answer_of_a_higher_epoch(
    our: int, refused: bool, answer: int | None
) -> None:
    verdict = fencing_verdict(our, refused=refused, decision_epoch=answer)
    assert verdict is not FencingVerdict.STOPPED  # the shell's word, never a judgement
    assert (verdict is FencingVerdict.DEPOSED) == (
        not refused and answer is not None and answer > our
    )
    assert (verdict is FencingVerdict.DONE) == refused
