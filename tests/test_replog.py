"""The replication log on real RocksDB: offsets, backlog bound, restarts, cuts."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagesift.core.replication.backlog import BacklogLost
from pagesift.core.replication.framing import (
    entries_message,
    ops_from_pairs,
    snapshot_chunks,
    snapshot_messages,
    split_entries_message,
)
from pagesift.core.replication.identity import Fenced, NotWritable
from pagesift.core.replication.log import Log
from pagesift.core.replication.slot import open_slot
from pagesift.core.store.cuts import OffsetPassed, replicated_pairs, view_digest
from pagesift.core.store.db import Store
from pagesift.core.store.groups import WriteGroup
from pagesift.v1 import replication_pb2


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[Log]:
    store = Store(tmp_path / "p")
    log = Log(store, max_bytes=1 << 20)
    log.open_for_writes()
    yield log
    log.close()
    store.close()


def put(log: Log, key: str, value: bytes = b"v") -> int:
    offset = log.write(lambda g: g.put(key, value)).offset
    return offset


def test_offsets_follow_write_order_and_entries_carry_the_groups_ops(primary: Log) -> None:
    assert primary.epoch == 1 and primary.history_id
    offsets = [put(primary, f"k{i}", bytes([i])) for i in range(5)]
    assert offsets == [1, 2, 3, 4, 5]
    entries = primary.read(1)
    assert [e.offset for e in entries] == offsets
    assert all(e.epoch == 1 for e in entries)
    assert [e.ops[0].kv_put.key for e in entries] == [f"k{i}" for i in range(5)]
    assert [e.offset for e in primary.read(4)] == [4, 5]
    assert primary.read(6) == []


def test_a_group_that_fails_or_writes_nothing_takes_no_offset(primary: Log) -> None:
    put(primary, "a")

    def bad(g: WriteGroup) -> None:
        g.put("b", b"x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        primary.write(bad)
    assert primary.write(lambda g: g.get("a")).offset == 1
    assert put(primary, "c") == 2
    assert primary.store.get("b") is None


def test_a_node_that_is_not_the_primary_rejects_writes_atomically(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    log = Log(store)
    with pytest.raises(NotWritable):
        store.write(lambda g: g.put("k", b"v"))
    assert store.get("k") is None and log.last_offset == 0
    log.close()
    store.close()


def test_a_restart_keeps_the_backlog_offsets_epoch_and_history(tmp_path: Path) -> None:
    store = Store(tmp_path / "p")
    log = Log(store)
    log.open_for_writes()
    history = log.history_id
    for i in range(10):
        put(log, f"k{i}")
    log.close()
    store.close()

    store = Store(tmp_path / "p")
    log = Log(store)
    assert (log.first_offset, log.last_offset) == (1, 10)
    assert (log.epoch, log.history_id, log.persisted_role) == (1, history, "primary")
    assert not log.writable  # the server decides; nothing writes before it says so
    log.open_for_writes()
    assert log.history_id == history
    assert put(log, "next") == 11
    assert [e.offset for e in log.read(1)] == list(range(1, 12))
    log.close()
    store.close()


def test_the_byte_bound_trims_the_oldest_entries_through_the_write_path(tmp_path: Path) -> None:
    store = Store(tmp_path / "p")
    log = Log(store, max_bytes=2_000)
    log.open_for_writes()
    for i in range(50):
        put(log, f"k{i}", b"x" * 100)
    assert log.last_offset == 50
    assert log.backlog_bytes <= 2_000
    assert 1 < log.first_offset <= 50 - 10
    first = log.first_offset
    assert [e.offset for e in log.read(first)] == list(range(first, 51))
    with pytest.raises(BacklogLost):
        log.read(first - 1)
    log.close()
    store.close()

    store = Store(tmp_path / "p")  # the trimmed state is what survives
    log = Log(store, max_bytes=2_000)
    assert (log.first_offset, log.last_offset) == (first, 50)
    assert log.backlog_bytes <= 2_000
    log.close()
    store.close()


def test_the_newest_entry_stays_even_when_alone_it_exceeds_the_bound(tmp_path: Path) -> None:
    store = Store(tmp_path / "p")
    log = Log(store, max_bytes=100)
    log.open_for_writes()
    put(log, "a", b"y" * 500)
    put(log, "b", b"y" * 500)
    assert (log.first_offset, log.last_offset) == (2, 2)
    assert [e.offset for e in log.read(2)] == [2]
    log.close()
    store.close()


def entries_of(log: Log) -> list[replication_pb2.LogEntry]:
    return log.read(log.first_offset, max_bytes=1 << 30)


def test_a_standby_applies_each_entry_once_and_logs_it_at_the_same_offset(
    primary: Log, tmp_path: Path
) -> None:
    for i in range(6):

        def group(g: WriteGroup, i: int = i) -> None:
            g.push("L", bytes([i]))
            g.insert("S", bytes([i % 2]))

        primary.write(group)
    store = Store(tmp_path / "s")
    standby = Log(store)
    entries = entries_of(primary)
    assert standby.append_replicated(entries[:4], primary_epoch=1) == 4
    # replaying an overlapping batch skips what is applied and applies the rest once
    assert standby.append_replicated(entries[2:], primary_epoch=1) == 6
    assert standby.append_replicated(entries, primary_epoch=1) == 6
    assert store.digest() == primary.store.digest()
    assert store.list_range("L") == [bytes([i]) for i in range(6)]
    assert [(e.offset, e.epoch) for e in entries_of(standby)] == [
        (e.offset, e.epoch) for e in entries
    ]
    with pytest.raises(NotWritable):
        store.write(lambda g: g.put("k", b"v"))
    standby.close()
    store.close()


def test_promotion_and_fencing_are_durable(tmp_path: Path) -> None:
    store = Store(tmp_path / "n")
    log = Log(store)
    log.adopt("h1", 3)
    p = log.promote(new_history_id="h2")
    assert (p.epoch, p.history_id, p.prev_history_id, p.switch_offset) == (4, "h2", "h1", 0)
    assert log.writable and put(log, "k") == 1
    assert log.read(1)[0].epoch == 4
    assert log.fence(5) is True
    with pytest.raises(NotWritable):
        put(log, "k2")
    log.close()
    store.close()

    store = Store(tmp_path / "n")
    log = Log(store)
    assert (log.epoch, log.history_id, log.prev_history_id, log.switch_offset) == (4, "h2", "h1", 0)
    assert log.role == "fenced"
    with pytest.raises(Fenced):
        log.open_for_writes()
    log.adopt("h5", 5)  # following the primary of epoch 5 lifts the fence
    assert log.role == "standby"
    log.close()
    store.close()


def test_an_iterator_taken_under_the_lock_is_a_point_in_time_cut(primary: Log) -> None:
    for i in range(200):
        put(primary, f"k{i:03}", b"old")
    expected = primary.store.digest()
    view = primary.view()
    for i in range(0, 200, 2):
        primary.write(functools.partial(WriteGroup.delete, key=f"k{i:03}"))
    for i in range(200, 260):
        put(primary, f"k{i:03}", b"new")
    assert view.offset == 200
    assert view_digest(view) == expected != primary.store.digest()


async def test_a_pinned_view_is_taken_inside_the_commit_of_its_offset(primary: Log) -> None:
    put(primary, "a")
    pinned = asyncio.ensure_future(primary.view_at(3, within=5))
    await asyncio.sleep(0)

    def writer() -> None:
        for i in range(6):
            put(primary, f"w{i}")

    digests: dict[int, str] = {}
    # record the digest at every offset from the writer thread, under the lock
    primary.store.add_observer(_DigestAt(primary.store, digests))
    await asyncio.to_thread(writer)
    view = await pinned
    assert view.offset == 3
    assert view_digest(view) == digests[3]
    with pytest.raises(OffsetPassed):
        await primary.view_at(3, within=1)
    assert (await primary.view_at(0, within=1)).offset == 7
    with pytest.raises(TimeoutError):
        await primary.view_at(9, within=0.05)


class _DigestAt:
    def __init__(self, store: Store, out: dict[int, str]) -> None:
        self.store, self.out = store, out

    def stage(self, group: WriteGroup) -> None:
        pass

    def committed(self, group: WriteGroup) -> None:
        if group.offset:  # set by the log, which stages before us
            self.out[group.offset] = self.store.digest()


async def test_waiters_wake_on_commits_made_by_another_thread(primary: Log) -> None:
    assert await primary.wait_for(1, within=0.01) is False
    t = threading.Timer(0.02, lambda: put(primary, "k"))
    t.start()
    assert await primary.wait_for(1, within=5) is True
    t.join()


# --- snapshots rebuild the same store ------------------------------------------------

NAMES = st.sampled_from(["a", "b", "job/x"])
ACTIONS = st.one_of(
    st.tuples(st.just("put"), NAMES, st.binary(max_size=3)),
    st.tuples(st.just("delete"), NAMES, st.just(b"")),
    st.tuples(st.just("push"), NAMES, st.binary(max_size=3)),
    st.tuples(st.just("pop"), NAMES, st.just(b"")),
    st.tuples(st.just("clear_list"), NAMES, st.just(b"")),
    st.tuples(st.just("insert"), NAMES, st.binary(max_size=3)),
    st.tuples(st.just("remove"), NAMES, st.binary(max_size=3)),
    st.tuples(st.just("clear_set"), NAMES, st.just(b"")),
)


def act(g: WriteGroup, action: tuple[str, str, bytes]) -> None:
    name, key, value = action
    if name == "put":
        g.put(key, value)
    elif name == "delete":
        g.delete(key)
    elif name == "push":
        g.push(key, value)
    elif name == "pop":
        g.pop_front(key)
    elif name == "clear_list":
        g.clear_list(key)
    elif name == "insert":
        g.insert(key, value)
    elif name == "remove":
        g.remove(key, value)
    else:
        g.clear_set(key)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(groups=st.lists(st.lists(ACTIONS, min_size=1, max_size=5), max_size=10))
def test_a_snapshot_as_ops_rebuilds_the_same_store_and_lists_keep_their_sequence(
    tmp_path_factory: pytest.TempPathFactory, groups: list[list[tuple[str, str, bytes]]]
) -> None:
    root = tmp_path_factory.mktemp("snap")
    src, dst = Store(root / "src"), Store(root / "dst")
    for actions in groups:

        def group(g: WriteGroup, actions: list[tuple[str, str, bytes]] = actions) -> None:
            for action in actions:
                act(g, action)

        src.write(group)
    log = Log(src)
    for chunk in snapshot_chunks(log.view(), chunk_bytes=16):
        dst.apply(chunk)
    assert list(dst.replicated_items()) == list(src.replicated_items())
    assert_snapshot_encoding(log, chunk_bytes=16)
    # and the rebuilt lists continue with the same sequence numbers
    log.close()
    for name in ["a", "b", "job/x"]:
        seq = dst.write(functools.partial(WriteGroup.push, name=name, item=b"z")).result
        assert seq == src.list_bounds(name)[1]
    src.close()
    dst.close()


def test_a_resync_switch_is_atomic_and_leftovers_are_removed(tmp_path: Path) -> None:
    slot = open_slot(tmp_path / "data")
    slot.log.open_for_writes()
    put(slot.log, "old")
    fresh = slot.fresh_store()
    fresh.apply([], local=Log.snapshot_locals(offset=9, tail_epoch=2, history_id="h", epoch=2))
    fresh.write(lambda g: None)
    unfinished = slot.fresh_store()  # a resync that never completed
    unfinished.close()
    log = slot.install(fresh)
    assert slot.store is fresh and slot.log is log
    assert (log.last_offset, log.first_offset, log.history_id, log.epoch) == (9, 10, "h", 2)
    assert (tmp_path / "data" / "CURRENT").read_text().strip() == fresh.path.name
    assert not (tmp_path / "data" / "db").exists()
    slot.close()

    slot = open_slot(tmp_path / "data")
    assert slot.store.path == fresh.path and slot.log.last_offset == 9
    assert not unfinished.path.exists()
    slot.close()


# --- the wire encoders agree with the protobuf runtime ------------------------------


def assert_snapshot_encoding(log: Log, chunk_bytes: int) -> None:
    """The hand-encoded snapshot messages parse to exactly the ops ``ops_from_pairs``
    makes, in order, with ``last`` on the final message only."""
    expected = list(ops_from_pairs(replicated_pairs(log.view())))
    msgs = [
        replication_pb2.StreamResponse.FromString(m)
        for m in snapshot_messages(log.view(), chunk_bytes)
    ]
    assert msgs and all(m.WhichOneof("msg") == "snapshot_chunk" for m in msgs)
    assert [m.snapshot_chunk.last for m in msgs] == [False] * (len(msgs) - 1) + [True]
    got = [op for m in msgs for op in m.snapshot_chunk.ops]
    assert got == expected
    # byte-exact too: the same encoding the protobuf runtime produces
    for m in msgs:
        again = replication_pb2.StreamResponse(snapshot_chunk=m.snapshot_chunk)
        assert again.SerializeToString() == m.SerializeToString()
    assert [op for chunk in snapshot_chunks(log.view(), chunk_bytes) for op in chunk] == expected


def test_snapshot_encoding_of_large_values_names_and_sequence_numbers(tmp_path: Path) -> None:
    store = Store(tmp_path / "p")

    def group(g: WriteGroup) -> None:
        g.put("", b"")  # empty key and value: omitted fields
        g.put("k\u00e9y/\u2603", b"v" * 20_000)  # non-ASCII name, 3-byte length varint
        for i in range(300):  # sequence numbers past one varint byte
            g.push("job/\u00fc/pages", b"x" * (i % 3))
        g.pop_front("job/\u00fc/pages")
        for i in range(200):
            g.insert("s\u00e9t", bytes([i, 0, 255]))  # members with NUL and high bytes
        g.insert("s\u00e9t", b"")
        g.push("big", b"b" * (3 << 20))  # a row larger than a chunk
        g.clear_list("cleared")
        g.push("cleared", b"after")

    store.write(group)
    log = Log(store)
    assert_snapshot_encoding(log, chunk_bytes=1 << 20)
    assert_snapshot_encoding(log, chunk_bytes=100)
    dst = Store(tmp_path / "d")
    for m in snapshot_messages(log.view(), 4096):
        dst.apply(list(replication_pb2.StreamResponse.FromString(m).snapshot_chunk.ops))
    assert list(dst.replicated_items()) == list(store.replicated_items())
    log.close()
    store.close()
    dst.close()


def test_an_empty_store_is_one_empty_last_chunk(tmp_path: Path) -> None:
    store = Store(tmp_path / "p")
    log = Log(store)
    msgs = list(snapshot_messages(log.view()))
    assert len(msgs) == 1
    chunk = replication_pb2.StreamResponse.FromString(msgs[0]).snapshot_chunk
    assert chunk.last and not chunk.ops
    log.close()
    store.close()


def test_entry_batches_are_framed_and_split_without_parsing(primary: Log) -> None:
    for i in range(5):
        put(primary, f"k{i}", bytes([i]) * (i * 9000))  # sizes across varint widths
    raws = primary.read_raw(1)
    entries = [replication_pb2.LogEntry.FromString(r) for r in raws]
    expected = replication_pb2.StreamResponse(
        entries=replication_pb2.EntryBatch(entries=entries)
    ).SerializeToString()
    assert entries_message(raws) == expected
    assert split_entries_message(expected) == raws
    empty = replication_pb2.StreamResponse(entries=replication_pb2.EntryBatch())
    assert split_entries_message(empty.SerializeToString()) == []
    # anything else is left to the ordinary parser
    beat = replication_pb2.StreamResponse(heartbeat=replication_pb2.Heartbeat(primary_offset=3))
    assert split_entries_message(beat.SerializeToString()) is None
    assert split_entries_message(b"") is None
    assert split_entries_message(expected[:-1]) is None  # truncated
    assert split_entries_message(expected + b"\x22\x00") is None  # a second field


def test_the_standby_logs_the_bytes_it_received(primary: Log, tmp_path: Path) -> None:
    for i in range(4):
        put(primary, f"k{i}")
    raws = primary.read_raw(1)
    entries = [replication_pb2.LogEntry.FromString(r) for r in raws]
    store = Store(tmp_path / "s")
    standby = Log(store)
    with pytest.raises(ValueError):
        standby.append_replicated(entries, primary_epoch=1, raw=raws[:2])
    assert standby.append_replicated(entries[:2], primary_epoch=1, raw=raws[:2]) == 2
    assert standby.append_replicated(entries, primary_epoch=1, raw=raws) == 4  # overlap skipped
    assert standby.read_raw(1) == raws
    standby.close()
    standby = Log(store)  # and from RocksDB after a restart
    assert standby.read_raw(1) == raws
    assert store.digest() == primary.store.digest()
    standby.close()
    store.close()


def test_recent_entries_in_memory_never_outlive_the_backlog(tmp_path: Path) -> None:
    store = Store(tmp_path / "p")
    log = Log(store, max_bytes=2_000)
    log.open_for_writes()
    for i in range(60):
        put(log, f"k{i}", b"x" * 100)
        first = log.first_offset
        assert [e.offset for e in log.read(first)] == list(range(first, log.last_offset + 1))
        if first > 1:
            with pytest.raises(BacklogLost):
                log.read(first - 1)
    memory = log.read_raw(log.first_offset)

    def no_disk(key: bytes) -> bytes | None:
        raise AssertionError("the newest entry is read from memory")

    store.get_local = no_disk  # type: ignore[method-assign]
    assert log.read_raw(log.last_offset) == memory[-1:]
    del store.get_local
    log.close()
    log = Log(store, max_bytes=2_000)  # same bytes from RocksDB
    assert log.read_raw(log.first_offset) == memory
    log.close()
    store.close()


# ---------------------------------------------------------------- a witness's write deadline


def test_a_primary_takes_no_write_at_or_after_its_deadline(primary: Log) -> None:
    primary.set_write_deadline(time.monotonic() + 60)
    assert primary.write(lambda g: g.put("a", b"1")).offset == 1
    primary.set_write_deadline(time.monotonic())  # now: "not an instant after"
    with pytest.raises(NotWritable, match="lease"):
        primary.write(lambda g: g.put("b", b"2"))
    assert primary.store.get("b") is None and primary.last_offset == 1
    primary.set_write_deadline(None)  # no witness: no deadline
    assert primary.write(lambda g: g.put("b", b"2")).offset == 2


def test_a_step_down_stops_writes_and_fences_by_a_higher_epoch(primary: Log) -> None:
    primary.step_down(primary.epoch)  # not higher: simply no more writes
    with pytest.raises(NotWritable):
        primary.write(lambda g: g.put("a", b"1"))
    assert primary.fenced_epoch == 0
    primary.step_down(primary.epoch + 5)
    assert primary.fenced_epoch == primary.epoch + 5


def test_a_promotion_takes_the_witness_epoch_when_it_is_higher(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    log = Log(store, max_bytes=1 << 20)
    try:
        assert log.promote(epoch=42).epoch == 42
    finally:
        log.close()
        store.close()
