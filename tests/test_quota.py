"""Quotas: rolling-day usage in a real store (charge, window, reset, prune, replication)
and the limit checks with their messages."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesift.core.jobs import quota, records
from pagesift.core.jobs.accounts import Account
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup

H = 3600
T0 = 1_800_000_000.0 - (1_800_000_000 % H)  # an hour boundary


def charge(store: Store, account: str, pages: int, now: float) -> None:
    store.write(lambda g: quota.charge(g, account, pages, now))


def test_usage_is_the_sum_of_the_last_24_hour_buckets(store: Store) -> None:
    charge(store, "acme", 5, T0 + 10)  # hour 0
    charge(store, "acme", 3, T0 + 20)  # same bucket
    charge(store, "acme", 7, T0 + 5 * H + 1)  # hour 5
    charge(store, "beta", 100, T0 + 30)  # another account
    assert store.get(quota.bucket_key("acme", int(T0 // H))) == b"8"
    assert quota.used_today(store, "acme", T0 + 5 * H + 2) == 15
    assert quota.used_today(store, "beta", T0 + 5 * H + 2) == 100
    # hour 0 counts until hour 24 starts, then leaves the window
    assert quota.used_today(store, "acme", T0 + 24 * H - 1) == 15
    assert quota.used_today(store, "acme", T0 + 24 * H) == 7
    assert quota.used_today(store, "acme", T0 + 29 * H) == 0
    assert quota.used_today(store, "nobody", T0) == 0


def test_resets_at_names_when_usage_drops(store: Store) -> None:
    charge(store, "acme", 5, T0 + 10)
    charge(store, "acme", 7, T0 + 5 * H + 1)
    now = T0 + 6 * H
    assert quota.resets_at(store, "acme", now) == T0 + 24 * H  # the oldest bucket leaves
    assert quota.resets_at(store, "acme", now, limit=12) == T0 + 24 * H  # 12 -> 7 < 12
    assert quota.resets_at(store, "acme", now, limit=6) == T0 + 29 * H  # 7 >= 6 until then
    assert quota.resets_at(store, "acme", now, limit=13) is None  # already below
    assert quota.resets_at(store, "nobody", now) is None


def test_usage_survives_a_restart_and_replicates(tmp_path: Path) -> None:
    primary = Store(tmp_path / "p")
    standby = Store(tmp_path / "s")
    try:
        for i in range(3):

            def group(g: WriteGroup, i: int = i) -> None:
                g.put(f"page/{i}", b"doc")  # the page this charge belongs to
                quota.charge(g, "acme", 1, T0 + i)

            ops = primary.write(group).ops
            standby.apply(ops)  # what the replication stream does with a group
        assert quota.used_today(standby, "acme", T0 + 60) == 3
    finally:
        primary.close()
        standby.close()
    reopened = Store(tmp_path / "p")
    try:
        assert quota.used_today(reopened, "acme", T0 + 60) == 3
    finally:
        reopened.close()


def test_a_failed_group_charges_nothing(store: Store) -> None:
    def group(g: WriteGroup) -> None:
        quota.charge(g, "acme", 1, T0)
        raise RuntimeError("the page write failed")

    with pytest.raises(RuntimeError):
        store.write(group)
    assert quota.used_today(store, "acme", T0) == 0


def test_prune_deletes_only_buckets_outside_the_window(store: Store) -> None:
    for hour in (0, 1, 30, 40):
        charge(store, "acme", 1, T0 + hour * H)
    charge(store, "beta", 1, T0)
    now = T0 + 40 * H + 5
    # charging at hour 40 already removed the bucket of hour 40 - 24 = 16 (none)
    removed = store.write(lambda g: quota.prune(g, "acme", now)).result
    assert removed == 2  # hours 0 and 1
    assert quota.used_today(store, "acme", now) == 2  # hours 30 and 40
    assert sorted(store.keys("usage/acme/")) == sorted(
        quota.bucket_key("acme", int(T0 // H) + h) for h in (30, 40)
    )
    assert quota.prune_all(store, now) == 1  # beta's hour 0
    assert store.keys("usage/beta/") == []
    assert quota.prune_all(store, now) == 0


def test_charge_removes_the_bucket_that_just_left(store: Store) -> None:
    charge(store, "acme", 4, T0)
    charge(store, "acme", 1, T0 + 24 * H)
    assert store.keys("usage/acme/") == [quota.bucket_key("acme", int(T0 // H) + 24)]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 60 * H), st.integers(1, 50)), min_size=0, max_size=30),
    st.integers(0, 70 * H),
)
def test_used_today_matches_a_model(charges: list[tuple[int, int]], at: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        s = Store(Path(tmp) / "s")
        try:
            for offset, pages in sorted(charges):
                charge(s, "acme", pages, T0 + offset)
            now = T0 + at
            hour = int(now // H)
            # model: only charges made up to `now` exist in the real system, but
            # charging past buckets is allowed; the window is hours hour-23..hour
            expected = sum(
                p
                for o, p in charges
                if hour - 23 <= int((T0 + o) // H) <= hour
                and not _removed_by_later_charge(int((T0 + o) // H), charges)
            )
            assert quota.used_today(s, "acme", now) == expected
        finally:
            s.close()


def _removed_by_later_charge(bucket: int, charges: list[tuple[int, int]]) -> bool:
    """A charge at hour h deletes bucket h-24 (already outside h's window)."""
    return any(int((T0 + o) // H) - 24 == bucket for o, _ in charges)


def test_page_limit_hit_stops_exactly_at_the_limit(store: Store) -> None:
    acme = Account("acme", pages_per_day=5)
    recorded = 0
    stopped: quota.LimitExceeded | None = None
    for i in range(8):

        def group(g: WriteGroup, i: int = i) -> quota.LimitExceeded | None:
            hit = quota.page_limit_hit(g, acme, T0 + i)
            if hit is not None:
                return hit  # record nothing
            g.put(f"page/{i}", b"doc")
            quota.charge(g, "acme", 1, T0 + i)
            return None

        hit = store.write(group).result
        if hit is not None:
            stopped = hit
            break
        recorded += 1
    assert recorded == 5
    assert stopped is not None and stopped.limit_name == "pages_per_day"
    assert stopped.resets_at == T0 + 24 * H
    assert "pages_per_day" in stopped.message and "kept" in stopped.message
    assert quota.rfc3339(T0 + 24 * H) in stopped.message
    assert quota.used_today(store, "acme", T0 + 10) == 5
    assert quota.page_limit_hit(store, Account("free"), T0) is None


def test_check_start_names_the_limit_and_when_it_resets() -> None:
    acme = Account(
        "acme", max_concurrent_jobs=2, pages_per_day=100, max_batch_urls=10, max_crawl_limit=50
    )
    quota.check_start(acme, 1, 99, "batch", batch_urls=10)
    quota.check_start(acme, 1, 0, "crawl", crawl_limit=50)
    quota.check_start(acme, 5, 0, "scrape")  # a single page is not a job
    cases = [
        (dict(active_jobs=0, usage=0, kind="batch", batch_urls=11), "max_batch_urls"),
        (dict(active_jobs=0, usage=0, kind="crawl", crawl_limit=51), "max_crawl_limit"),
        (dict(active_jobs=2, usage=0, kind="crawl", crawl_limit=5), "max_concurrent_jobs"),
        (dict(active_jobs=0, usage=100, kind="batch", batch_urls=1), "pages_per_day"),
        (dict(active_jobs=0, usage=100, kind="scrape"), "pages_per_day"),
    ]
    for kwargs, name in cases:
        with pytest.raises(quota.LimitExceeded) as info:
            quota.check_start(acme, resets_at=T0 + 3 * H, **kwargs)  # type: ignore[arg-type]
        assert info.value.limit_name == name
        assert name in info.value.message and "acme" in info.value.message
        md = dict(info.value.trailing_metadata())
        assert md["pagesift-limit"] == name
        if name == "pages_per_day":
            assert info.value.resets_at == T0 + 3 * H
            assert quota.rfc3339(T0 + 3 * H) in info.value.message
            assert md["pagesift-limit-resets-at"] == quota.rfc3339(T0 + 3 * H)
        elif name == "max_concurrent_jobs":
            assert "finishes" in info.value.message
        else:
            assert "does not reset" in info.value.message
    unlimited = Account("free")
    quota.check_start(unlimited, 10_000, 10**9, "batch", batch_urls=10**6)


def test_crawl_limit_for_caps_the_default_at_the_account_limit() -> None:
    assert quota.crawl_limit_for(Account("a", max_crawl_limit=50), 0, 10_000) == 50
    assert quota.crawl_limit_for(Account("a", max_crawl_limit=50), 70, 10_000) == 70
    assert quota.crawl_limit_for(Account("a"), 0, 10_000) == 10_000


def test_active_jobs_counts_the_owners_running_jobs(store: Store) -> None:
    ids = itertools.count()
    for owner, state in [
        ("acme", "scraping"),
        ("acme", "scraping"),
        ("acme", "completed"),
        ("beta", "scraping"),
    ]:
        meta = records.JobMeta(
            id=f"j{next(ids)}",
            kind="batch",
            state=state,
            owner=owner,
            created_ms=0,
            expires_ms=0,
        )

        def group(g: WriteGroup, meta: records.JobMeta = meta) -> None:
            g.put(records.JobKeys(meta.id).meta, meta.encode())
            g.insert(records.JOBS_SET, meta.id.encode())

        store.write(group)
    assert quota.active_jobs(store, "acme") == 2
    assert quota.active_jobs(store, "beta") == 1
    assert quota.active_jobs(store, "gamma") == 0
