"""The one backoff (``pagesift.core.util.backoff``): pure, so every delay is pinned exactly."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagesift.core.util.backoff import backoff_delay, budgeted_delays


def test_the_delay_doubles_from_its_base_up_to_its_cap() -> None:
    delays = [backoff_delay(a, base=0.1, cap=2.0) for a in range(8)]
    assert delays[:5] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    assert delays[5:] == [2.0, 2.0, 2.0]
    assert backoff_delay(-3, base=0.1, cap=2.0) == pytest.approx(0.1)  # no shorter than base
    assert backoff_delay(10**9, base=0.1, cap=2.0) == 2.0  # days of failures: no overflow


def test_jitter_takes_at_most_half_off() -> None:
    assert backoff_delay(100, base=0.1, cap=2.0, jitter=0.99) == pytest.approx(1.01)
    assert backoff_delay(100, base=0.1, cap=2.0, jitter=1.0) == pytest.approx(1.0)
    assert backoff_delay(2, base=0.1, cap=2.0, jitter=0.5) == pytest.approx(0.3)
    for bad in (-0.01, 1.01):
        with pytest.raises(ValueError):
            backoff_delay(0, base=0.1, cap=2.0, jitter=bad)


@given(
    attempt=st.integers(min_value=0, max_value=200),
    base=st.floats(min_value=1e-3, max_value=10.0),
    cap=st.floats(min_value=1e-3, max_value=100.0),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)
def test_bounds_and_monotone_cap(attempt: int, base: float, cap: float, jitter: float) -> None:
    bare = backoff_delay(attempt, base=base, cap=cap)
    nxt = backoff_delay(attempt + 1, base=base, cap=cap)
    assert 0 < bare <= cap
    assert bare <= nxt  # never shrinks with more failures, and stays at the cap
    jittered = backoff_delay(attempt, base=base, cap=cap, jitter=jitter)
    assert bare / 2 <= jittered <= bare


def test_a_budget_is_spent_exactly_and_the_last_delay_trimmed() -> None:
    assert budgeted_delays(10.0, base=0.1, cap=2.0, rng=lambda: 0.0) == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 0.9]
    )
    assert budgeted_delays(0.25, base=0.1, cap=2.0, rng=lambda: 0.0) == pytest.approx([0.1, 0.15])
    assert budgeted_delays(0.0, base=0.1, cap=2.0, rng=lambda: 0.0) == []
    assert budgeted_delays(-1.0, base=0.1, cap=2.0, rng=lambda: 0.0) == []
    assert budgeted_delays(5.0, base=0.0, cap=2.0, rng=lambda: 0.0) == []  # no zero-sleep spin


def test_each_delay_draws_its_own_jitter() -> None:
    draws = itertools.cycle([1.0, 0.0])
    delays = budgeted_delays(1.0, base=0.1, cap=2.0, rng=lambda: next(draws))
    assert delays == pytest.approx([0.05, 0.2, 0.2, 0.55])


@given(budget=st.floats(min_value=0.0, max_value=60.0), seed=st.integers(0, 2**32))
def test_jittered_budgets_keep_their_bounds(budget: float, seed: int) -> None:
    delays = budgeted_delays(budget, base=0.1, cap=2.0, rng=random.Random(seed).random)
    assert sum(delays) == pytest.approx(budget, abs=1e-6)
    assert all(0 < d <= 2.0 for d in delays)
