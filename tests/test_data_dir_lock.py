"""One process per data directory: a second ``pagesift serve`` on a live node's data
directory refuses to start and touches nothing there (issue 28, finding 7).

The regression: the second process met RocksDB's LOCK, took it for a failing disk,
released the live node's disk reserve ("released the 67108864-byte reserve" in its
log) and tried again; before that, its ``open_slot`` had already deleted every
``backup-*``/``store-*`` directory CURRENT does not name, which on a live node are a
backup being streamed or a resync under way. Here real processes run: a live node,
then a second ``serve`` on the same directory while the live one is frozen (SIGSTOP:
what changes is the second's doing), and every file of the directory (mode, size,
inode, mtime) is compared before and after.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

from pagesift.core.api.storagewatch import RESERVE_FILE
from pagesift.node.startup import DATA_LOCK_FILE, StartRefused, lock_data_dir
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import NodeFactory, until

MIB = 1024 * 1024
#: What every entry of a directory looks like on disk; a touched entry differs.
Entry = tuple[int, int, int, int]  # (mode, size, inode, mtime in ns)


def entries(root: Path) -> dict[str, Entry]:
    """Every file and directory under ``root`` (``root`` itself included), by path."""
    out: dict[str, Entry] = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_mode, st.st_size, st.st_ino, st.st_mtime_ns)
    return out


def test_a_second_lock_on_a_data_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    """In one process too (``flock`` locks an open file, not a process): the second
    take is a ``StartRefused`` naming the directory and the holder's pid, and leaves
    the lock file as it was; once released, the directory can be taken again."""
    data = tmp_path / "data"
    held = lock_data_dir(data)
    try:
        before = entries(data)
        with pytest.raises(StartRefused, match=f"{data}.*in use by.*pid {os.getpid()}"):
            lock_data_dir(data)
        assert entries(data) == before
    finally:
        held.release()
    held.release()  # idempotent
    lock_data_dir(data).release()
    assert (data / DATA_LOCK_FILE).exists()


@pytest.mark.system
async def test_a_second_serve_on_a_live_data_directory_exits_and_touches_nothing(
    nodes: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGESIFT_STORAGE_RESERVE_BYTES", str(4 * MIB))  # the children's
    live = nodes("live")
    await live.start()
    reserve = live.data / RESERVE_FILE
    await until(
        lambda: reserve.exists() and reserve.stat().st_size == 4 * MIB, "the reserve made", 20
    )
    # a backup being streamed: a checkpoint directory that CURRENT does not name
    checkpoint = live.data / "backup-0123456789ab"
    checkpoint.mkdir()
    (checkpoint / "MANIFEST-000001").write_bytes(b"a checkpoint being streamed")
    async with grpc.aio.insecure_channel(live.address) as ch:
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        await stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
        # frozen (SIGSTOP) while the second runs: whatever changes is the second's doing
        with live.frozen():
            before = entries(live.data)
            second = nodes("second")
            second.data = live.data
            second.launch()
            assert second.proc is not None
            code = await asyncio.to_thread(second.proc.wait, 60)
            after = entries(live.data)
        log = second.log_text()
        changed = {p: (before.get(p), after.get(p)) for p in before.keys() | after.keys()}
        changed = {p: v for p, v in changed.items() if v[0] != v[1]}
        assert changed == {}, (changed, log[-2000:])  # the reserve, the checkpoint, the store
        assert reserve.stat().st_size == 4 * MIB
        assert "released" not in log, log[-2000:]
        assert code == 2, (code, log[-2000:])
        assert live.proc is not None
        assert f"in use by another pagesift process (pid {live.proc.pid})" in log, log[-2000:]
        # and the live node goes on serving
        await stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
    assert "released" not in live.log_text()
