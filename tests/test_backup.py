"""``pagesift backup`` and restore: online copies of a node's store, started as nodes.

Real processes on loopback (``pagesift serve`` children, the CLI as a child or through
``cli.amain``), real RocksDB, the demo site. A backup is taken while a crawl writes;
the copy then starts a new primary (which finishes the crawl, every page exactly
once, on a history of its own) or seeds a standby (which continues from its primary's
backlog instead of a full resync). Bad input leaves nothing behind. Every wait is
bounded; every child is stopped at the end (the ``nodes`` fixture).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from pagesift import cli
from pagesift.cli.backup import MANIFEST_FILE
from pagesift.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from pagesift.client import JobClient
from pagesift.core.replication.slot import open_slot
from pagesift.core.store.groups import WriteGroup
from pagesift.demo.site import CALENDAR_EXCLUDE, Site, normalize_url
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2_grpc
from pagesift.v1 import replication_pb2 as pb
from tests.helpers import (
    ADMIN_KEY,
    ADMIN_MD,
    PAIR_TOKEN,
    NodeFactory,
    SiteSpec,
    all_documents,
    eventually,
    finished,
    get_job,
    in_process_node,
    pages_done,
    role,
    until,
    write_accounts,
)

MiB = 1024 * 1024
PAGES = 150
PACE = 0.05  # seconds between two request starts to the site: the crawl lasts ~9 s
TOKEN_KEY = (f"--admin-key={PAIR_TOKEN}",)  # no [admin] key: the pair's token is the key


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=PAGES, slow_seconds=1.5, big_bytes=2 * MiB)


# ---------------------------------------------------------------- helpers


def pagesift(*argv: str) -> tuple[int, str, str]:
    """The real ``pagesift`` command line, as a child process."""
    proc = subprocess.run(
        [sys.executable, "-m", "pagesift.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout, proc.stderr


async def start_crawl(address: str, root: str) -> str:
    req = jobs_pb2.StartCrawlRequest(
        url=root, exclude_paths=[CALENDAR_EXCLUDE], max_concurrency=8, delay=PACE
    )
    async with JobClient(address) as client:
        return await client.start_crawl(req)


async def offset_past(address: str, offset: int) -> int | None:
    got = (await role(address)).applied_offset
    return got if got > offset else None


async def documents(address: str, job_id: str) -> list[jobs_pb2.Document]:
    async with grpc.aio.insecure_channel(address) as ch:
        return await all_documents(jobs_pb2_grpc.JobServiceStub(ch), job_id)


def assert_every_page_once(docs: list[jobs_pb2.Document], s: Site, root: str) -> None:
    urls = [normalize_url(d.url) for d in docs]
    duplicates = sorted({u for u in urls if urls.count(u) > 1})
    assert not duplicates, f"pages in the results twice: {duplicates[:5]}"
    assert set(urls) == s.expected_documents(root)


async def caught_up(primary: str, standby: str) -> int | None:
    p, s = await role(primary), await role(standby)
    same = s.applied_offset == p.applied_offset and s.history_id == p.history_id
    return p.applied_offset if same and p.applied_offset > 0 else None


async def verify_equal(primary: str, standby: str) -> dict[str, Any]:
    """``pagesift verify`` (a child process) once the standby stands at the primary's
    offset: its JSON object, after checking it says equal."""
    await eventually(lambda: caught_up(primary, standby), "the standby to catch up", 60)
    code, out, err = await asyncio.to_thread(
        pagesift, "verify", "--primary", primary, "--standby", standby, "--json"
    )
    result: dict[str, Any] = json.loads(out)
    assert code == EXIT_OK and result["equal"] is True, (result, err)
    return result


def put_blob(key: str, blob: bytes, group: WriteGroup) -> None:
    group.put(key, blob)


def leftovers(folder: Path) -> list[str]:
    """Half-written backups a client or a server left in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name or "backup-" in p.name)


# ---------------------------------------------------------------- (1) restore as a primary


@pytest.mark.system
async def test_a_backup_taken_mid_crawl_starts_a_primary_that_finishes_the_crawl_once_per_page(
    nodes: NodeFactory, site: tuple[Site, str], tmp_path: Path
) -> None:
    s, root = site
    source = nodes("source")
    await source.start()
    job_id = await start_crawl(source.address, root)
    await eventually(lambda: pages_done(source.address, job_id, 20), "20 pages on the source")

    out = tmp_path / "restored"  # the data directory of the node started below
    code, text, err = await asyncio.to_thread(
        pagesift, "backup", "--server", source.address, "--out", str(out), *TOKEN_KEY, "--json"
    )
    assert code == EXIT_OK, err
    assert text.count("\n") == 1  # exactly one JSON object on stdout
    made = json.loads(text)
    src = await role(source.address)
    assert (made["epoch"], made["history_id"], made["role"]) == (1, src.history_id, "primary")
    assert made["source_node_id"] == src.node_id and made["bytes"] > 0
    # writers kept going: the crawl went on writing during and after the copy
    assert (await get_job(source.address, job_id)).state == jobs_pb2.JOB_STATE_SCRAPING
    assert 0 < made["offset"] <= src.applied_offset
    await eventually(
        lambda: offset_past(source.address, made["offset"]), "the source to write past the backup"
    )
    # a data directory: CURRENT and the store, the manifest, and no NODE_ID
    assert sorted(p.name for p in out.iterdir()) == ["CURRENT", MANIFEST_FILE, "db"]
    info = json.loads((out / MANIFEST_FILE).read_text())
    assert info["offset"] == made["offset"] and info["history_id"] == src.history_id
    assert leftovers(tmp_path) == [] and leftovers(source.data) == []

    killed_at = (await role(source.address)).applied_offset
    source.kill()  # gone for good (until it rejoins below)
    restored = nodes("restored")
    assert restored.data == out
    await restored.start()
    r = await role(restored.address)
    # a backup started as a primary branches off: epoch + 1, a history of its own
    assert r.role == pb.NODE_ROLE_PRIMARY and r.epoch == 2
    assert r.history_id != src.history_id and r.node_id != src.node_id
    assert r.applied_offset >= made["offset"]
    assert "started from a backup of history" in restored.log_text()
    job = await finished(restored.address, job_id, timeout=120)
    assert job.state == jobs_pb2.JOB_STATE_COMPLETED, job.note
    assert_every_page_once(await documents(restored.address, job_id), s, root)

    # the old source holds more of the old history than the backup: rejoining the
    # restored node, it resyncs (dropping its tail) instead of continuing over it
    await source.start(role="standby", primary=restored.address)
    st = await eventually(
        lambda: _resynced(source.address), "the old source to resync from the restored node"
    )
    assert st.discarded >= killed_at - made["offset"] > 0  # its writes past the backup
    await verify_equal(restored.address, source.address)


async def _resynced(address: str) -> pb.RoleResponse | None:
    st = await role(address)
    return st if st.connected and st.full_resyncs == 1 else None


# ---------------------------------------------------------------- (2) seed a standby


@pytest.mark.system
async def test_a_standby_seeded_from_a_backup_continues_from_the_backlog(
    nodes: NodeFactory, site: tuple[Site, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s, root = site
    primary = nodes("primary")
    await primary.start()
    job_id = await start_crawl(primary.address, root)
    await eventually(lambda: pages_done(primary.address, job_id, 15), "15 pages on the primary")

    out = tmp_path / "standby"
    capsys.readouterr()
    code = await cli.amain(
        ["backup", "--server", primary.address, "--out", str(out), *TOKEN_KEY, "--json"]
    )
    made = json.loads(capsys.readouterr().out)
    assert code == EXIT_OK, made
    assert made["files"] >= 3 and made["checkpoint_seconds"] < 5

    # the primary writes on: the seeded standby will need entries from its backlog
    await eventually(
        lambda: offset_past(primary.address, made["offset"] + 10), "writes past the backup"
    )
    standby = nodes("standby", role="standby", primary=primary.address)
    assert standby.data == out
    await standby.start()

    async def connected() -> pb.RoleResponse | None:
        st = await role(standby.address)
        return st if st.connected else None

    st = await eventually(connected, "the seeded standby to connect")
    assert (st.continues, st.full_resyncs) == (1, 0), standby.log_text()[-2000:]
    assert "continuing from" in standby.log_text()
    pr = await role(primary.address)
    assert (pr.continues, pr.full_resyncs) == (1, 0)
    assert st.history_id == pr.history_id and st.epoch == pr.epoch == made["epoch"]
    assert st.node_id != pr.node_id  # a new node: the backup carried no NODE_ID

    assert (await finished(primary.address, job_id)).state == jobs_pb2.JOB_STATE_COMPLETED
    await verify_equal(primary.address, standby.address)
    assert_every_page_once(await documents(standby.address, job_id), s, root)


# ---------------------------------------------------------------- (3) bad input, one at a time


async def test_a_non_empty_out_and_a_wrong_admin_key_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml")
    async with in_process_node(tmp_path / "node", accounts_file=str(accounts)) as node:
        server = ["--server", node.address]
        # a non-empty directory is refused before the server is asked
        full = tmp_path / "full"
        full.mkdir()
        (full / "keep.txt").write_text("mine")
        code = await cli.amain(["backup", *server, "--out", str(full), "--admin-key", ADMIN_KEY])
        assert code == EXIT_USAGE
        assert "is not empty" in capsys.readouterr().err
        assert [p.name for p in full.iterdir()] == ["keep.txt"]
        # a wrong key (and the pair's token, once an [admin] key exists) is refused
        out = tmp_path / "copy"
        for key in ("psk_wrong_key_0123456789", PAIR_TOKEN):
            code = await cli.amain(["backup", *server, "--out", str(out), f"--admin-key={key}"])
            assert code == EXIT_REFUSED
            err = capsys.readouterr().err
            assert "PERMISSION_DENIED" in err and "Backup needs the admin key" in err, err
            assert not out.exists()
        # an empty directory is fine; the copy is the node's store exactly
        out.mkdir()
        code = await cli.amain(["backup", *server, "--out", str(out), "--admin-key", ADMIN_KEY])
        assert code == EXIT_OK
        line = capsys.readouterr().out
        assert line.startswith(f"backup of {node.address} in {out}: offset ")
        digest = await replication_pb2_grpc.AdminServiceStub(node.channel).Digest(
            pb.DigestRequest(), metadata=ADMIN_MD
        )
        assert leftovers(tmp_path) == [] and leftovers(tmp_path / "node") == []
    assert not (out / "NODE_ID").exists()
    slot = open_slot(out)
    try:
        assert slot.store.digest() == digest.digest
        assert slot.log.last_offset == digest.offset
        assert slot.log.persisted_role is not None and slot.log.persisted_role.value == "primary"
    finally:
        slot.close()


async def test_a_second_backup_is_refused_while_one_runs_and_a_cancelled_one_cleans_up(
    tmp_path: Path,
) -> None:
    async with in_process_node(tmp_path / "node") as node:
        data = tmp_path / "node"
        log = node.node.slot.log
        for i in range(32):  # 64 MiB with the backlog: more than any flow-control window
            log.write(partial(put_blob, f"bulk/{i}", os.urandom(MiB)))
        admin = replication_pb2_grpc.AdminServiceStub(node.channel)
        md = (("authorization", f"Bearer {PAIR_TOKEN}"),)
        first = admin.Backup(pb.BackupRequest(), metadata=md)
        msg = await first.read()
        assert isinstance(msg, pb.BackupResponse) and msg.chunk.path == "CURRENT"
        # the first one holds (its reader stalls): its checkpoint directory is there
        assert len(leftovers(data)) == 1

        second = admin.Backup(pb.BackupRequest(), metadata=md)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await second.read()
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "already running" in (e.value.details() or "")

        first.cancel()  # the client goes away mid-stream: the server removes its copy
        await until(lambda: leftovers(data) == [], "the cancelled backup's copy to go")
        out = tmp_path / "after"
        code = await cli.amain(["backup", "--server", node.address, "--out", str(out), *TOKEN_KEY])
        assert code == EXIT_OK  # the gate is free again
        assert leftovers(data) == [] and leftovers(tmp_path) == []
        assert (out / "db").is_dir()
