"""The write checker (``tests/writechecker.py``) on synthetic traces, and the trace itself.

Hand-made histories a correct pair can produce (a clean hand-over, a killed primary's
discarded tail, a node that comes back at a higher epoch) must pass; the split-brain
shapes (two writers interleaved, one writer inside another's interval, a deposed primary
writing later at its old epoch, an acknowledged page missing at the end) must be flagged.
The last test writes through a real ``Log`` with ``PAGESIFT_WRITE_TRACE`` set and reads
the lines back with the checker's parser.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from pagesift.core.replication import writetrace
from pagesift.core.replication.log import Log
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from tests.writechecker import Write, check, parse

S = 1_000_000_000  # one second in ns


def reign(node: str, epoch: int, start_s: float, end_s: float, first: int, n: int) -> list[Write]:
    """``n`` writes of ``node`` at ``epoch`` spread over [start_s, end_s], offsets from
    ``first``."""
    step = (end_s - start_s) / max(1, n - 1)
    return [Write(int((start_s + i * step) * S), node, epoch, first + i) for i in range(n)]


def test_a_clean_hand_over_passes() -> None:
    writes = reign("a", 5, 0, 10, 1, 50) + reign("b", 6, 14, 20, 51, 30)
    verdict = check(writes, {"j": ["u1", "u2"]}, {"j": ["u1", "u2", "u3"]})
    assert verdict.ok, verdict.explain()
    assert [t.label() for t in verdict.tenures] == ["a@5", "b@6"]
    assert verdict.discarded == 0 and verdict.lost_pages == 0


def test_a_killed_primarys_unreplicated_tail_is_discarded_not_a_violation() -> None:
    # a wrote offsets 1..50; b had applied 1..45 and writes from 46 on
    writes = reign("a", 5, 0, 10, 1, 50) + reign("b", 6, 14, 20, 46, 10)
    verdict = check(writes)
    assert verdict.ok and verdict.discarded == 5


def test_a_node_back_at_a_higher_epoch_is_a_new_tenure() -> None:
    writes = (
        reign("a", 5, 0, 5, 1, 10) + reign("b", 6, 8, 12, 11, 10) + reign("a", 7, 15, 18, 21, 5)
    )
    verdict = check(writes)
    assert verdict.ok, verdict.explain()
    assert [t.label() for t in verdict.tenures] == ["a@5", "b@6", "a@7"]


def test_two_interleaved_writers_overlap() -> None:
    writes = reign("a", 5, 0, 10, 1, 50) + reign("b", 6, 8, 20, 40, 30)
    verdict = check(writes)
    assert not verdict.ok
    assert [(x.label(), y.label()) for x, y in verdict.overlaps] == [("a@5", "b@6")]
    assert "overlapping writers: a@5" in verdict.explain()


def test_a_writer_inside_anothers_interval_overlaps() -> None:
    # b wrote once, at 5 s, while a wrote from 0 to 10 s: a never wrote inside b's
    # one-instant interval, yet both were accepting writes at 5 s
    writes = [*reign("a", 5, 0, 10, 1, 20), Write(5 * S, "b", 6, 7)]
    assert len(check(writes).overlaps) == 1


def test_a_deposed_primary_writing_later_at_its_old_epoch_is_stale() -> None:
    writes = reign("a", 5, 0, 5, 1, 10) + reign("b", 6, 7, 9, 11, 5) + reign("a", 5, 12, 13, 11, 2)
    verdict = check(writes)
    # a@5 is one tenure [0, 13], so it overlaps b@6 as well
    assert not verdict.ok and verdict.overlaps
    later = reign("b", 6, 7, 9, 11, 5) + reign("c", 4, 12, 13, 11, 2)
    verdict = check(later)
    assert [t.label() for t in verdict.stale] == ["c@4"] and not verdict.overlaps


def test_a_page_acknowledged_and_missing_at_the_end_is_lost() -> None:
    verdict = check([], {"j": ["u1", "u2", "u3"], "k": ["v1"]}, {"j": ["u1"]})
    assert not verdict.ok
    assert dict(verdict.lost) == {"j": ("u2", "u3"), "k": ("v1",)}
    assert verdict.lost_pages == 3


def test_parse_reads_the_trace_and_refuses_a_torn_line() -> None:
    assert parse("10 a 5 1\n\n20 b 6 2\n") == [Write(10, "a", 5, 1), Write(20, "b", 6, 2)]
    with pytest.raises(ValueError, match="line 2"):
        parse("10 a 5 1\n20 b 6\n")


def test_a_primarys_committed_writes_are_traced_when_the_variable_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "writes.trace"
    data = tmp_path / "node"
    data.mkdir()
    (data / "NODE_ID").write_text("n1\n")
    monkeypatch.setenv(writetrace.ENV, str(trace))
    store = Store(data / "store-x")
    log = Log(store)
    try:
        log.open_for_writes()
        for key in ("k0", "k1", "k2"):
            log.write(functools.partial(WriteGroup.put, key=key, value=b"v"))
        epoch = log.epoch
    finally:
        log.close()
        store.close()
    writes = parse(trace.read_text())
    assert [(w.node, w.epoch, w.offset) for w in writes] == [
        ("n1", epoch, 1),
        ("n1", epoch, 2),
        ("n1", epoch, 3),
    ]
    assert writes == sorted(writes, key=lambda w: w.ns)


def test_without_the_variable_nothing_is_traced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(writetrace.ENV, raising=False)
    assert writetrace.from_env(tmp_path / "store-x") is None
