"""The store's primitives and its one write path, on real RocksDB."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.core.store.layout import local_key
from pagesift.v1 import store_pb2


def test_kv_lists_and_sets_read_back_what_a_group_wrote(store: Store) -> None:
    def group(g: WriteGroup) -> list[int]:
        g.put("job/a", b"meta")
        seqs = [g.push("job/a/pages", bytes([i])) for i in range(3)]
        assert g.get("job/a") == b"meta"  # a group reads its own writes
        assert g.insert("job/a/done", b"x") is True
        assert g.insert("job/a/done", b"x") is False
        return seqs

    commit = store.write(group)
    assert commit.result == [0, 1, 2]
    assert commit.offset == 0  # no replication log on this store
    kinds = [op.WhichOneof("op") for op in commit.ops]
    assert kinds == ["kv_put"] + ["list_push"] * 3 + ["set_insert"]
    assert store.get("job/a") == b"meta"
    assert store.list_range("job/a/pages") == [b"\x00", b"\x01", b"\x02"]
    assert store.list_range("job/a/pages", 1, 1) == [b"\x01"]
    assert store.list_len("job/a/pages") == 3
    assert store.set_members("job/a/done") == [b"x"]
    assert store.set_len("job/a/done") == 1
    assert store.keys("job/") == ["job/a"]


def test_trim_front_drops_a_consumed_prefix_and_nothing_past_the_end(store: Store) -> None:
    store.write(lambda g: [g.push("q", item) for item in (b"a", b"b", b"c", b"d")])
    assert store.write(lambda g: g.trim_front("q", 2)).result == 2
    assert store.list_bounds("q") == (2, 4) and store.list_items("q", 0, 10) == [
        (2, b"c"),
        (3, b"d"),
    ]
    assert store.write(lambda g: g.trim_front("q", 1)).result == 0  # already gone
    assert store.write(lambda g: g.trim_front("q", 99)).result == 2  # never past the end
    assert store.list_bounds("q") == (4, 4) and store.list_len("q") == 0
    assert store.write(lambda g: g.push("q", b"e")).result == 4


def test_pop_front_and_clear_keep_sequence_numbers_rising(store: Store) -> None:
    store.write(lambda g: [g.push("q", b"a"), g.push("q", b"b")])
    popped = store.write(lambda g: g.pop_front("q")).result
    assert popped == (0, b"a")
    store.write(lambda g: g.clear_list("q"))
    assert store.list_len("q") == 0
    seq = store.write(lambda g: g.push("q", b"c")).result
    assert seq == 2
    assert store.list_items("q") == [(2, b"c")]


def test_a_group_that_raises_writes_nothing(store: Store) -> None:
    def bad(g: WriteGroup) -> None:
        g.put("k", b"v")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        store.write(bad)
    assert store.get("k") is None


def test_node_local_keys_are_neither_replicated_nor_digested(store: Store) -> None:
    before = store.digest()
    store.apply([], local={local_key("applied"): b"7"})
    assert store.get_local(local_key("applied")) == b"7"
    assert store.digest() == before
    assert list(store.replicated_items()) == []


# --- property: replaying the ops of any groups rebuilds the same store ----------

KEYS = st.sampled_from(["a", "b", "job/x"])
LISTS = st.sampled_from(["L1", "L2"])
SETS = st.sampled_from(["S1", "S2"])
VALUES = st.binary(max_size=4)

ACTIONS = st.one_of(
    st.tuples(st.just("put"), KEYS, VALUES),
    st.tuples(st.just("delete"), KEYS),
    st.tuples(st.just("push"), LISTS, VALUES),
    st.tuples(st.just("pop"), LISTS),
    st.tuples(st.just("clear_list"), LISTS),
    st.tuples(st.just("drop_list"), LISTS),
    st.tuples(st.just("trim"), LISTS, st.integers(min_value=0, max_value=8)),
    st.tuples(st.just("insert"), SETS, VALUES),
    st.tuples(st.just("remove"), SETS, VALUES),
    st.tuples(st.just("clear_set"), SETS),
)
GROUPS = st.lists(st.lists(ACTIONS, min_size=1, max_size=6), min_size=1, max_size=12)


def run_action(g: WriteGroup, action: tuple[object, ...]) -> None:
    name, *args = action
    if name == "put":
        g.put(str(args[0]), bytes(args[1]))  # type: ignore[call-overload]
    elif name == "delete":
        g.delete(str(args[0]))
    elif name == "push":
        g.push(str(args[0]), bytes(args[1]))  # type: ignore[call-overload]
    elif name == "pop":
        g.pop_front(str(args[0]))
    elif name == "clear_list":
        g.clear_list(str(args[0]))
    elif name == "drop_list":
        g.clear_list(str(args[0]), drop=True)
    elif name == "trim":
        g.trim_front(str(args[0]), int(args[1]))  # type: ignore[call-overload]
    elif name == "insert":
        g.insert(str(args[0]), bytes(args[1]))  # type: ignore[call-overload]
    elif name == "remove":
        g.remove(str(args[0]), bytes(args[1]))  # type: ignore[call-overload]
    else:
        g.clear_set(str(args[0]))


def contents(s: Store) -> list[tuple[bytes, bytes]]:
    return list(s.replicated_items())


@settings(max_examples=60, deadline=None)
@given(groups=GROUPS, cut=st.integers(min_value=0, max_value=12))
def test_replaying_groups_once_twice_or_after_a_partial_replay_rebuilds_the_source(
    groups: list[list[tuple[object, ...]]], cut: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Store(Path(tmp) / "src")
        logged: list[list[store_pb2.Op]] = []
        for actions in groups:

            def group(g: WriteGroup, actions: list[tuple[object, ...]] = actions) -> None:
                for a in actions:
                    run_action(g, a)

            ops = src.write(group).ops
            # ops travel as bytes: round-trip them like the log does
            logged.append([store_pb2.Op.FromString(op.SerializeToString()) for op in ops])
        expected = contents(src)
        plans = {
            "once": logged,
            "twice": logged + logged,
            "partial": logged[: min(cut, len(logged))] + logged,
        }
        for label, plan in plans.items():
            dst = Store(Path(tmp) / label)
            for ops in plan:
                dst.apply(ops)
            assert contents(dst) == expected, label
            assert dst.digest() == src.digest(), label
            dst.close()
        src.close()


def test_apply_rejects_unknown_ops_and_bad_names_and_writes_nothing(store: Store) -> None:
    with pytest.raises(ValueError):
        store.apply([store_pb2.Op(kv_put=store_pb2.KvPut(key="a", value=b"1")), store_pb2.Op()])
    bad = store_pb2.Op(set_insert=store_pb2.SetInsert(set="s\x00", member=b"m", size=1))
    with pytest.raises(ValueError):
        store.apply([bad])
    sizeless = store_pb2.Op(set_insert=store_pb2.SetInsert(set="s", member=b"m"))
    with pytest.raises(ValueError, match="size"):
        store.apply([sizeless])
    assert list(store.replicated_items()) == []


def test_apply_op_one_by_one_matches_apply(tmp_path: Path) -> None:
    src = Store(tmp_path / "src")

    def group(g: WriteGroup) -> None:
        g.put("k", b"v")
        g.push("L", b"a")
        g.push("L", b"b")
        g.pop_front("L")
        g.insert("S", b"x")
        g.insert("S", b"y")
        g.remove("S", b"x")
        g.clear_set("T")
        g.clear_list("M", drop=True)
        g.delete("gone")

    ops = src.write(group).ops
    one, many = Store(tmp_path / "one"), Store(tmp_path / "many")

    def one_by_one(g: WriteGroup) -> None:
        for op in ops:
            g.apply_op(op)

    one.write(one_by_one)
    group_many = many.apply(ops)
    assert group_many.ops == ops
    assert list(one.replicated_items()) == list(many.replicated_items())
    assert list(many.replicated_items()) == list(src.replicated_items())
    for s in (src, one, many):
        s.close()
