"""The cluster client's pure rules: ids of jobs of parts, their order and state, and the
merged ListJobs (``pagesift.core.cluster.ids`` and ``merge``)."""

from __future__ import annotations

import random
import uuid

import pytest

from pagesift.core.cluster import ids, merge
from pagesift.core.cluster.merge import ListCursor, PairPage, Part


def _u(n: int) -> str:
    return str(uuid.UUID(int=n + 1))


# ---------------------------------------------------------------- ids of jobs of parts


def test_a_job_of_parts_id_splits_back_into_its_parts_in_order() -> None:
    parts = [("p2", _u(1)), ("a", _u(2)), ("eu-west-1", _u(3))]
    job_id = ids.composite_job_id(parts)
    assert job_id == f"p2.{_u(1)}_a.{_u(2)}_eu-west-1.{_u(3)}"
    assert ids.job_parts(job_id) == parts
    assert ids.job_parts(f"p1.{_u(1)}") == [("p1", _u(1))]
    assert ids.job_parts(_u(1)) == [(None, _u(1))]
    assert ids.composite_job_id([("p1", _u(1))]) == ids.cluster_job_id("p1", _u(1))


@pytest.mark.parametrize(
    "bad",
    [f"{_u(1)}_p1.{_u(2)}", f"p1.{_u(1)}_p1.{_u(2)}", f"p1.{_u(1)}_", f"_p1.{_u(1)}",
     "_".join(f"p{i}.{_u(i)}" for i in range(ids.MAX_PARTS + 1)), f"p1.{_u(1)}__p2.{_u(2)}"],
)  # fmt: skip
def test_a_malformed_id_of_parts_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        ids.job_parts(bad)


def test_a_job_of_parts_has_one_part_per_pair_and_a_bounded_count() -> None:
    with pytest.raises(ValueError):
        ids.composite_job_id([("p1", _u(1)), ("p1", _u(2))])
    with pytest.raises(ValueError):
        ids.composite_job_id([])
    most = [(f"p{i}", _u(i)) for i in range(ids.MAX_PARTS)]
    assert ids.job_parts(ids.composite_job_id(most)) == most


# ---------------------------------------------------------------- order and state


@pytest.mark.parametrize(
    ("states", "merged"),
    [
        (["completed", "scraping"], "scraping"),
        (["paused", "failed"], "paused"),
        (["completed", "failed", "cancelled"], "failed"),
        (["completed", "cancelled"], "cancelled"),
        (["completed", "completed"], "completed"),
    ],
)
def test_a_job_of_parts_scrapes_until_every_part_ends(states: list[str], merged: str) -> None:
    assert merge.merged_state(states) == merged


def test_documents_are_part_by_part_and_a_part_shows_once_those_before_it_end() -> None:
    ended = [Part(2, True), Part(0, True), Part(3, True)]
    where = [merge.locate(i, ended) for i in range(6)]
    assert where == [(0, 0), (0, 1), (2, 0), (2, 1), (2, 2), (2, 3)]  # 5: the end
    assert merge.locate(6, ended) is None
    running = [Part(2, True), Part(1, False), Part(4, False)]
    assert merge.locate(2, running) == (1, 0)
    assert merge.locate(9, running) == (1, 7)  # waits in the first running part
    assert merge.offset_of(1, running) == 2


@pytest.mark.parametrize("seed", range(20))
def test_every_index_of_an_ended_job_maps_to_one_document(seed: int) -> None:
    rng = random.Random(seed)
    parts = [Part(rng.randrange(0, 5), True) for _ in range(rng.randrange(1, 6))]
    flat = [(k, i) for k, p in enumerate(parts) for i in range(p.completed)]
    assert [merge.locate(n, parts) for n in range(len(flat))] == flat


def test_an_errors_token_names_its_part_and_refuses_others() -> None:
    assert merge.errors_untoken("", 3) == (0, "")
    token = merge.errors_token(2, "abc\0def")
    assert merge.errors_untoken(token, 3) == (2, "abc\0def")
    for bad in (token[:-2], "xyz", merge.errors_token(3, "")):
        with pytest.raises(ValueError):
            merge.errors_untoken(bad, 3)


def test_a_parts_idempotency_key_is_the_callers_per_pair() -> None:
    assert merge.part_key("k", "p1") == merge.part_key("k", "p1") != merge.part_key("k", "p2")


def test_a_parts_url_field_is_renumbered_as_the_callers() -> None:
    text = "urls[1]: blocked; urls[0] too; urls[9] unknown"
    assert merge.renumber_field(text, [4, 7]) == "urls[7]: blocked; urls[4] too; urls[9] unknown"


# ---------------------------------------------------------------- ListJobs


def test_a_listing_token_round_trips_and_refuses_garbage() -> None:
    cursor = ListCursor((1234, _u(5)), {"p1": "tok", "p2": None})
    assert merge.list_untoken(merge.list_token(cursor)) == cursor
    assert merge.list_untoken("") == ListCursor(None, {})
    for bad in ("m1!!", "x" + merge.list_token(cursor), "m1" + "A" * 10):
        with pytest.raises(ValueError):
            merge.list_untoken(bad)
    rng = random.Random(1)
    huge = ListCursor(None, {f"p{i}": rng.randbytes(1000).hex() for i in range(200)})
    with pytest.raises(ValueError):
        merge.list_token(huge)


class FakePair:
    """A pair's ListJobs over sorted keys: pages of a random size, token = offset."""

    def __init__(self, keys: list[tuple[int, str]], rng: random.Random) -> None:
        self.keys = sorted(keys, reverse=True)
        self.rng = rng

    def page(self, token: str) -> PairPage:
        start = int(token or 0)
        end = min(len(self.keys), start + self.rng.randrange(0, 4))
        return PairPage(token, self.keys[start:end], str(end) if end < len(self.keys) else "")


def _list(
    pairs: dict[str, FakePair], size: int, join: dict[int, tuple[str, FakePair]]
) -> tuple[list[tuple[int, str]], dict[int, int]]:
    """Every job listed, page after page; and how many were out before each join."""
    out: list[tuple[int, str]] = []
    before: dict[int, int] = {}
    cursor: ListCursor | None = ListCursor(None, {})
    for n in range(10_000):
        if n in join:
            pairs = {**pairs, join[n][0]: join[n][1]}
            before[n] = len(out)
        assert cursor is not None
        cursor = merge.list_untoken(merge.list_token(cursor))  # as the caller sends it back
        pages = {p: f.page(cursor.tokens.get(p) or "") for p, f in pairs.items()
                 if cursor.tokens.get(p, "") is not None}  # fmt: skip
        taken, cursor = merge.merge_lists(cursor, pages, size)
        assert len(taken) <= size
        out.extend(pages[p].keys[i] for p, i in taken)
        if cursor is None:
            return out, before
    raise AssertionError("the listing did not end")


@pytest.mark.parametrize("seed", range(30))
def test_a_merged_listing_hands_out_every_job_once_newest_first(seed: int) -> None:
    rng = random.Random(seed)
    pairs = {
        f"p{k}": FakePair([(rng.randrange(50), _u(rng.randrange(10**9))) for _ in range(n)], rng)
        for k, n in enumerate(rng.choices(range(0, 12), k=rng.randrange(1, 5)))
    }
    every = sorted((key for f in pairs.values() for key in f.keys), reverse=True)
    assert _list(pairs, rng.randrange(1, 6), {})[0] == every


def test_a_pair_that_joins_mid_listing_adds_only_jobs_past_the_cursor() -> None:
    rng = random.Random(7)
    old = FakePair([(t, _u(t)) for t in range(0, 40, 2)], rng)
    late = FakePair([(t, _u(1000 + t)) for t in range(1, 40, 2)], rng)
    listed, before = _list({"p1": old}, 3, {3: ("p2", late)})
    assert listed == sorted(listed, reverse=True) and len(set(listed)) == len(listed)
    assert set(old.keys) <= set(listed)
    assert before[3] > 0
    cursor = listed[before[3] - 1]  # the last job handed out before p2 joined
    assert [k for k in listed if k in late.keys] == [k for k in late.keys if k < cursor]
