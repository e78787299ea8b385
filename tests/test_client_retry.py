"""Which calls the client repeats, and the sleeps between its rounds (``pagesift.client.retry``)."""

from __future__ import annotations

import pytest

from pagesift.client.retry import (
    CONTROL_WRITES,
    KEYED_WRITES,
    READ_METHODS,
    RetryPolicy,
    backoff_delays,
    is_retryable,
    with_idempotency_key,
)
from pagesift.v1 import jobs_pb2


def test_the_backoff_doubles_to_its_cap_and_sums_to_the_budget() -> None:
    delays = backoff_delays(rng=lambda: 0.0)  # no jitter: the bare schedule
    assert sum(delays) == pytest.approx(10.0)
    assert delays[:4] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert max(delays) <= 2.0
    assert len(delays) < 15
    assert sum(backoff_delays(0.25)) == pytest.approx(0.25)
    assert backoff_delays(0.0) == []


def test_the_backoff_is_jittered_within_the_same_bounds() -> None:
    halved = backoff_delays(rng=lambda: 1.0)  # the most jitter: every delay halved
    assert halved[:4] == pytest.approx([0.05, 0.1, 0.2, 0.4])
    assert sum(halved) == pytest.approx(10.0)
    assert max(halved) <= 1.0
    for _ in range(20):
        delays = backoff_delays()
        assert sum(delays) == pytest.approx(10.0)
        assert min(delays) > 0 and max(delays) <= 2.0


def test_a_policy_draws_a_fresh_schedule_from_its_own_knobs() -> None:
    draws = iter([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    policy = RetryPolicy(budget=1.0, first=0.2, cap=0.4, rng=lambda: next(draws))
    assert policy.delays() == pytest.approx([0.2, 0.2, 0.4, 0.2])
    assert RetryPolicy(budget=0.0).delays() == []


def test_reads_and_idempotent_writes_retry_and_keyed_writes_only_with_a_key() -> None:
    for method in (*READ_METHODS, *CONTROL_WRITES, "Scrape"):
        assert is_retryable(method), method
    for method in KEYED_WRITES:
        assert not is_retryable(method)
        assert is_retryable(method, "k")
    assert not is_retryable("SomeNewWrite", "k")  # unclassified: never repeated


def test_a_request_without_an_idempotency_key_gets_a_fresh_one_on_a_copy() -> None:
    req = jobs_pb2.StartCrawlRequest(url="http://x/", limit=3)
    keyed = with_idempotency_key(req)
    assert keyed is not req and req.idempotency_key == ""
    assert len(keyed.idempotency_key) == 36 and keyed.limit == 3
    assert with_idempotency_key(req).idempotency_key != keyed.idempotency_key
    assert with_idempotency_key(keyed) is keyed
    batch = with_idempotency_key(jobs_pb2.StartBatchScrapeRequest(urls=["http://x/"]))
    assert batch.idempotency_key and list(batch.urls) == ["http://x/"]
