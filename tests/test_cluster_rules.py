"""The cluster's pure rules (``pagesift.core.cluster``): ids, placement, registry, budgets."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import pytest

from pagesift import cli
from pagesift.core.cluster import budgetplans, ids, placement, registryrules
from pagesift.core.cluster.registryrules import Load, NodeRecord
from pagesift.core.jobs import urls

U = "6f1c2a9e-3b4d-4e5f-8a7b-1c2d3e4f5a6b"


# ---------------------------------------------------------------- ids


@pytest.mark.parametrize("pair", ["a", "p1", "eu-west-2", "x" * 32, "0"])
def test_a_cluster_id_splits_back_into_its_pair_and_uuid(pair: str) -> None:
    assert ids.split_job_id(ids.cluster_job_id(pair, U)) == (pair, U)
    assert ids.pair_of(f"{pair}.{U}") == pair


def test_a_single_pairs_bare_uuid_has_no_pair() -> None:
    assert ids.split_job_id(U) == (None, U)
    assert ids.pair_of(U.upper()) is None


@pytest.mark.parametrize(
    "bad", ["", "p1", "p1.", f"P1.{U}", f"-p.{U}", f"p-.{U}", f"{'x' * 33}.{U}", f"a/b.{U}",
            f".{U}", "p1.not-a-uuid", f"a.b.{U}"],
)  # fmt: skip
def test_a_malformed_id_is_refused_not_guessed(bad: str) -> None:
    with pytest.raises(ValueError):
        ids.split_job_id(bad)


# ---------------------------------------------------------------- placement


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://Docs.Example.com/a?b", "docs.example.com"),
        ("http://example.com:8080/x", "example.com"),
        ("http://[::1]:9/x", "::1"),
        ("http://Example.COM.:8080/", "example.com"),
        ("http://bücher.test/", "xn--bcher-kva.test"),
    ],
)
def test_the_host_of_a_url_is_the_engines_slot_key(url: str, host: str) -> None:
    assert placement.host_of(url) == host == urls.host_of(url)


def test_a_host_and_its_www_twin_share_an_owner() -> None:
    # a crawl's scope takes them for one site: a redirect to the twin stays on its pair
    assert placement.host_of("https://www.Example.com/a") == "example.com"


def test_every_client_places_an_origin_on_the_same_pair_whatever_the_order() -> None:
    pairs = ["p1", "p2", "p3", "p4"]
    for i in range(200):
        key = f"https://site{i}.example:443"
        shuffled = random.Random(i).sample(pairs, len(pairs))
        assert placement.owner(key, pairs) == placement.owner(key, shuffled)


def test_a_pair_joining_moves_only_the_keys_it_wins() -> None:
    keys = [f"https://site{i}.example:443" for i in range(3000)]
    before = {k: placement.owner(k, ["p1", "p2", "p3"]) for k in keys}
    after = {k: placement.owner(k, ["p1", "p2", "p3", "p4"]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "p4" for k in moved)
    assert 0.18 < len(moved) / len(keys) < 0.32  # about a quarter
    shares = {p: sum(1 for v in after.values() if v == p) for p in ["p1", "p2", "p3", "p4"]}
    assert all(600 < n < 900 for n in shares.values()), shares


def test_a_pair_leaving_moves_only_the_keys_it_held() -> None:
    keys = [f"k{i}" for i in range(2000)]
    before = {k: placement.owner(k, ["a", "b", "c"]) for k in keys}
    after = {k: placement.owner(k, ["a", "c"]) for k in keys}
    assert all(before[k] == after[k] for k in keys if before[k] != "b")


def test_no_pair_means_no_placement() -> None:
    with pytest.raises(ValueError):
        placement.owner("k", [])


def test_a_batch_splits_by_host_keeping_each_urls_index_in_order() -> None:
    pairs = ["p1", "p2", "p3"]
    urls = [f"https://site{i % 7}.example/page{i}" for i in range(40)] + ["not a url"]
    parts = placement.split_by_host(urls, pairs)
    flat = sorted(x for part in parts.values() for x in part)
    assert flat == list(enumerate(urls))
    for pair, part in parts.items():
        assert [i for i, _ in part] == sorted(i for i, _ in part)
        for _, url in part:
            if url != "not a url":
                assert placement.owner_of_url(url, pairs) == pair
    hosts = {placement.host_of(u) for u in urls[:-1]}
    for host in hosts:  # one host, one pair
        assert len({p for p, part in parts.items() for _, u in part
                    if u != "not a url" and placement.host_of(u) == host}) == 1  # fmt: skip
    home = placement.owner_of_url(urls[0], pairs)
    assert (40, "not a url") in parts[home]


# ---------------------------------------------------------------- registry


def test_a_record_round_trips_and_bad_ones_are_refused() -> None:
    rec = NodeRecord("p1", "n-a", "10.0.0.1:50051", "primary", epoch=7, lag=0, capacity=64,
                     load=Load(running_jobs=2, queued_pages=40, pages_per_s=120.5, cpu=1.5),
                     updated=1.7e9)  # fmt: skip
    assert registryrules.decode_record(registryrules.encode_record(rec)) == rec
    good = json.loads(registryrules.encode_record(rec))
    changes: list[dict[str, object]] = [
        {"pair": "P1"}, {"epoch": -1}, {"epoch": "7"}, {"accepting": 1}, {"role": "leader"},
        {"node": ""}, {"node": "a/b"}, {"load": {"cpu": "x"}}, {"load": []},
        {"address": "x" * 400},
    ]  # fmt: skip
    for change in changes:
        with pytest.raises(ValueError):
            registryrules.decode_record(json.dumps({**good, **change}).encode())
    for raw in (b"[]", b"{", b"\xff", b"{}" + b" " * registryrules.MAX_RECORD_BYTES):
        with pytest.raises(ValueError):
            registryrules.decode_record(raw)


def node(pair: str, name: str, role: str, epoch: int = 1, **kw: object) -> NodeRecord:
    return NodeRecord(pair, name, f"{name}:1", role, epoch=epoch, **kw)  # type: ignore[arg-type]


def test_a_pairs_view_names_the_primary_with_the_highest_epoch() -> None:
    views = registryrules.pair_views([
        node("p1", "a", "primary", 3, load=Load(running_jobs=4)),
        node("p1", "b", "standby", 3, lag=12),
        node("p2", "c", "primary", 5), node("p2", "d", "primary", 9),  # d took over
        node("p3", "e", "standby", 2),  # its primary is gone
    ])  # fmt: skip
    assert views["p1"].primary == "a:1" and views["p1"].standbys == ("b:1",)
    assert views["p1"].lag == 12 and views["p1"].load.running_jobs == 4
    assert views["p2"].primary == "d:1" and views["p2"].standbys == ("c:1",)
    assert views["p3"].primary == "" and views["p3"].standbys == ("e:1",)
    assert registryrules.placeable(views.values()) == ["p1", "p2"]


def test_a_pairs_problems_are_named() -> None:
    now = 1000.0
    fresh: dict[str, Any] = {"updated": now - 1}
    views = registryrules.pair_views([
        node("ok", "a", "primary", **fresh), node("ok", "b", "standby", lag=5),
        node("solo", "c", "primary", **fresh),
        node("orphan", "d", "standby"),
        node("slow", "e", "primary", **fresh), node("slow", "f", "standby", lag=50_000),
        node("old", "g", "primary", updated=now - 60), node("old", "h", "standby"),
    ])  # fmt: skip
    said = {pair: registryrules.problems(v, now) for pair, v in views.items()}
    assert said["ok"] == []
    assert ["no standby" in x for x in said["solo"]] == [True]
    assert any("no primary" in x for x in said["orphan"])
    assert ["50000 entries behind" in x for x in said["slow"]] == [True]
    assert ["60 s old" in x for x in said["old"]] == [True]


def test_only_pairs_with_a_primary_that_accept_take_new_work() -> None:
    views = registryrules.pair_views([
        node("p3", "a", "primary"), node("p1", "b", "primary"), node("p2", "c", "standby"),
        node("p4", "d", "primary", accepting=False),
    ])  # fmt: skip
    assert registryrules.placeable(views.values()) == ["p1", "p3"]


def test_a_cluster_url_names_its_endpoints_and_cluster() -> None:
    got = registryrules.parse_cluster_url("etcd://127.0.0.1:2379,[::1]:2380/prod")
    assert got == ([("127.0.0.1", 2379), ("::1", 2380)], "prod")
    for bad in ("etcd://h:1", "http://h:1/prod", "etcd://h/prod", "etcd://h:0/prod",
                "etcd://h:1/Prod", "etcd:///prod"):  # fmt: skip
        with pytest.raises(ValueError):
            registryrules.parse_cluster_url(bad)


# ---------------------------------------------------------------- budgets


def test_the_free_slot_is_the_lowest_not_taken() -> None:
    assert budgetplans.free_slot({0, 1, 3}, 5) == 2
    assert budgetplans.free_slot({0, 1}, 2) is None
    assert budgetplans.free_slot(set(), 0) is None


def test_block_size_is_an_eighth_of_a_fair_share_within_bounds() -> None:
    assert budgetplans.block_size(50_000, 3) == 256
    assert budgetplans.block_size(1000, 3) == 41
    assert budgetplans.block_size(5, 3) == 1


class Counter:
    """etcd's compare-and-swap on one key, as the budget plans see it."""

    def __init__(self) -> None:
        self.value, self.revision = 0, 1

    def swap(self, draw: budgetplans.Draw) -> bool:
        if draw.revision != self.revision:
            return False
        self.value, self.revision = draw.value, self.revision + 1
        return True


@pytest.mark.parametrize("seed", range(5))
def test_pages_across_racing_pairs_never_exceed_the_allowance(seed: int) -> None:
    rng = random.Random(seed)
    allowance, pairs, day = 1000, 3, "d1"
    block = budgetplans.block_size(allowance, pairs)
    counter, ledgers = Counter(), [budgetplans.BlockLedger() for _ in range(pairs)]
    fetched, refused, writes = 0, 0, 0
    for _ in range(5000):
        p = rng.randrange(pairs)
        grant = ledgers[p].take("acme", day)
        if grant.ok:
            fetched += 1
            continue
        if not grant.draw:
            refused += 1
            continue
        seen = (counter.value, counter.revision)  # a read, then maybe a racing draw
        if rng.random() < 0.3:
            other = (p + 1) % pairs
            plan = budgetplans.plan_draw(counter.value, counter.revision, allowance, block)
            if plan and counter.swap(plan):
                writes += 1
                ledgers[other].drawn("acme", day, plan.granted)
        plan = budgetplans.plan_draw(seen[0], seen[1], allowance, block)
        if plan is None:
            ledgers[p].drawn("acme", day, 0)
        elif counter.swap(plan):
            writes += 1
            ledgers[p].drawn("acme", day, plan.granted)
    held = sum(ledger.held("acme") for ledger in ledgers)
    assert fetched + held == counter.value <= allowance
    assert allowance - fetched <= pairs * block  # unused: at most a block per pair
    assert refused > 0 and writes <= allowance // block + pairs
    for ledger in ledgers:  # returned blocks go back to the counter
        unused = ledger.release("acme", day)
        back = budgetplans.plan_return(counter.value, counter.revision, unused)
        if back:
            assert counter.swap(back)
    assert counter.value == fetched


def test_a_block_of_an_earlier_day_is_not_spent_today() -> None:
    ledger = budgetplans.BlockLedger()
    ledger.drawn("acme", "d1", 5)
    assert ledger.take("acme", "d1").ok
    assert ledger.take("acme", "d2") == budgetplans.Grant(ok=False, draw=True)
    assert ledger.release("acme", "d2") == 0
    ledger.drawn("acme", "d2", 0)
    assert ledger.take("acme", "d2") == budgetplans.Grant(ok=False, draw=False)


def test_a_pair_name_and_uuid_make_ids_unique_across_pairs() -> None:
    a = {ids.cluster_job_id("p1", str(uuid.uuid4())) for _ in range(100)}
    b = {ids.cluster_job_id("p2", str(uuid.uuid4())) for _ in range(100)}
    assert not a & b and all(ids.pair_of(x) == "p1" for x in a)


def test_serve_refuses_a_cluster_without_a_witness_or_with_a_bad_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = ["--data", str(tmp_path)]
    assert cli.main(["serve", "--cluster", "prod", *data]) == 2
    assert "--cluster needs --witness" in capsys.readouterr().err
    witness = ["--witness", "etcd://127.0.0.1:9"]
    assert cli.main(["serve", *witness, "--cluster", "Prod", *data]) == 2
    assert "not a pair name" in capsys.readouterr().err
    assert cli.main(["serve", *witness, "--cluster", "prod", "--pair", "a/b", *data]) == 2


# ---------------------------------------------------------------- cluster status


def test_cluster_status_names_a_listed_pair_without_records_as_missing() -> None:
    from pagesift.cli.cluster import MISSING, status_json
    from pagesift.coord.etcd import EndpointHealth

    now = 1_000.0
    recs = [
        NodeRecord("p1", "a", "127.0.0.1:1", "primary", epoch=2, updated=now),
        NodeRecord("p1", "b", "127.0.0.1:2", "standby", epoch=2, updated=now),
    ]
    healthy = EndpointHealth("127.0.0.1:2379", ok=True, member_id=7, leader_id=7)
    out = status_json("prod", registryrules.pair_views(recs), now, expected=["p1", "p2"],
                      etcd=[healthy])  # fmt: skip
    by_pair = {p["pair"]: p for p in out["pairs"]}
    assert by_pair["p1"]["problems"] == [] and by_pair["p2"]["problems"] == [MISSING]
    assert out["placeable"] == ["p1"] and out["etcd"][0]["problems"] == []
    assert status_json("prod", registryrules.pair_views(recs), now)["pairs"][0]["pair"] == "p1"


def test_cluster_status_counts_an_etcd_member_that_is_down_leaderless_or_alarmed() -> None:
    from pagesift.cli.cluster import etcd_problems
    from pagesift.coord.etcd import EndpointHealth

    assert etcd_problems(EndpointHealth("e1", ok=True, member_id=1, leader_id=1)) == []
    assert etcd_problems(EndpointHealth("e2", ok=False, error="TimeoutError"))[0].startswith(
        "does not answer"
    )
    assert etcd_problems(EndpointHealth("e3", ok=True, member_id=3)) == ["no raft leader"]
    alarmed = EndpointHealth("e4", ok=True, member_id=4, leader_id=1, alarms=("NOSPACE",))
    assert etcd_problems(alarmed) == ["alarm NOSPACE"]


def test_a_stalled_primary_record_is_a_problem() -> None:
    now = 1_000.0
    recs = [
        NodeRecord(
            "p1", "a", "127.0.0.1:1", "primary", updated=now - 4 * registryrules.REFRESH_SECONDS
        ),
        NodeRecord("p1", "b", "127.0.0.1:2", "standby"),
    ]
    (view,) = registryrules.pair_views(recs).values()
    assert any("old" in p for p in registryrules.problems(view, now))
