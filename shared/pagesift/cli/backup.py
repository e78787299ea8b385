"""``pagesift backup --server ADDR --out DIR``: a consistent copy of a node's store,
written as a new data directory.

What it owns
------------
The ``backup`` flags and handler, ``write_backup`` (an ``AdminService.Backup`` stream
into a directory) and the ``backup_json`` shape ``--json`` prints. The server side is
``pagesift.core.replication.backup``; this module imports no store and no role.

Protocol
--------
1. ``--out`` must be a new path or an empty directory, in a directory that exists;
   otherwise the command fails before it calls the server.
2. The stream is written into a hidden sibling, ``.{DIR name}.partial-{hex}``, created
   at the first chunk. Every chunk's path is checked (relative, ``/``-separated, at
   most two parts, no ``..``, never ``NODE_ID`` nor ``backup.json``) and every
   file's chunks must follow each other exactly (``offset``); a file sent twice is
   refused.
3. At the manifest, the files received must be exactly the files listed, with the
   listed sizes and SHA-256. Then ``backup.json`` (the manifest, for operators) is
   written, every file and directory is fsynced, and the temporary directory is
   renamed to ``DIR`` (replacing the empty directory, if there was one); the parent
   is fsynced.

The guarantee
-------------
``DIR`` appears complete and verified, or not at all: any error, a wrong key, a
stream that ends before its manifest, a cancel (Ctrl-C) removes the temporary
directory and leaves ``DIR`` as it was. A SIGKILL can leave a ``.DIR.partial-*``
directory behind, never something named ``DIR``. ``pagesift serve --data DIR`` starts
from the copy (docs/operations.md, "Backup and restore": a primary branches off a new
history; a standby continues from its primary's backlog).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterable
from pathlib import Path, PurePosixPath
from typing import IO, Any

from pagesift.cli.admin import role_name
from pagesift.cli.args import client_parent, server_addresses
from pagesift.cli.common import EXIT_FAILED, EXIT_OK, dump, fail
from pagesift.client import JobClient
from pagesift.core.util.fsync import fsync_dir
from pagesift.v1 import replication_pb2 as pb

#: Written into the backup directory beside the store: where the copy came from.
MANIFEST_FILE = "backup.json"


class BackupError(Exception):
    """The stream is not a valid backup, or the directory cannot take it."""


def check_out(out: Path) -> str:
    """Why ``out`` cannot receive a backup ("" when it can)."""
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            return f"{out} exists and is not a directory"
        if any(out.iterdir()):
            return f"{out} is not empty: a backup goes into a new or empty directory"
    elif not out.parent.is_dir():
        return f"{out.parent} does not exist"
    return ""


def _safe_path(name: str) -> PurePosixPath:
    parts = name.split("/")
    if (
        not name
        or len(parts) > 2
        or any(p in ("", ".", "..") for p in parts)
        or "\\" in name
        or "\x00" in name
    ):
        raise BackupError(f"the server sent a bad file path {name!r}")
    if parts[0] == "NODE_ID":
        raise BackupError("the server sent a NODE_ID: a backup must not carry one")
    if name == MANIFEST_FILE:
        raise BackupError(f"the server sent a {MANIFEST_FILE}: that name is the client's")
    return PurePosixPath(name)


class _Receiver:
    """Writes the chunks of one stream under ``tmp`` and checks them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.done: dict[str, tuple[int, str]] = {}  # path -> (size, sha256)
        self._path = ""
        self._fh: IO[bytes] | None = None
        self._sha = hashlib.sha256()
        self._size = 0

    def chunk(self, c: pb.BackupChunk) -> None:
        if c.path != self._path:
            self._close()
            rel = _safe_path(c.path)
            if c.path in self.done:
                raise BackupError(f"the server sent {c.path} twice")
            target = self.tmp.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            self._fh = target.open("xb")
            self._path, self._sha, self._size = c.path, hashlib.sha256(), 0
        if c.offset != self._size:
            raise BackupError(f"{c.path}: chunk at {c.offset}, expected {self._size}")
        assert self._fh is not None
        self._fh.write(c.data)
        self._sha.update(c.data)
        self._size += len(c.data)

    def _close(self) -> None:
        if self._fh is None:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        self.done[self._path] = (self._size, self._sha.hexdigest())

    def finish(self, m: pb.BackupManifest) -> None:
        """Check every file against the manifest."""
        self._close()
        listed = {f.path: (f.size, f.sha256) for f in m.files}
        if set(listed) != set(self.done):
            missing = sorted(set(listed) - set(self.done))
            extra = sorted(set(self.done) - set(listed))
            raise BackupError(f"files differ from the manifest: missing {missing}, extra {extra}")
        for path, (size, sha) in listed.items():
            got_size, got_sha = self.done[path]
            if (got_size, got_sha) != (size, sha):
                raise BackupError(
                    f"{path}: got {got_size} bytes sha256 {got_sha}, "
                    f"the manifest says {size} bytes sha256 {sha}"
                )
        if "CURRENT" not in listed:
            raise BackupError("the backup has no CURRENT file: not a data directory")

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def manifest_json(m: pb.BackupManifest, server: str) -> dict[str, Any]:
    """The manifest as ``backup.json`` holds it."""
    return {
        "server": server,
        "source_node_id": m.node_id,
        "offset": m.offset,
        "tail_epoch": m.tail_epoch,
        "epoch": m.epoch,
        "history_id": m.history_id,
        "role": role_name(m.role),
        "taken_at_ms": m.taken_at_ms,
        "total_bytes": m.total_bytes,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in m.files],
    }


async def write_backup(
    messages: AsyncIterable[pb.BackupResponse], out: Path, *, server: str = ""
) -> pb.BackupManifest:
    """Write a Backup stream into ``out`` (see the module docstring); returns the
    manifest. ``BackupError`` for a bad stream or directory, and whatever the stream
    raises (a gRPC error): in every failure ``out`` is left as it was."""
    if problem := check_out(out):
        raise BackupError(problem)
    tmp = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    receiver = _Receiver(tmp)
    manifest: pb.BackupManifest | None = None
    try:
        async for msg in messages:
            if manifest is not None:
                raise BackupError("the server sent more after the manifest")
            kind = msg.WhichOneof("msg")
            if kind == "chunk":
                if not tmp.exists():
                    tmp.mkdir()
                receiver.chunk(msg.chunk)
            elif kind == "manifest":
                manifest = msg.manifest
            else:
                raise BackupError(f"unexpected message {kind!r} in the backup stream")
        if manifest is None:
            raise BackupError("the stream ended before the manifest: incomplete backup")
        receiver.finish(manifest)
        info = tmp / MANIFEST_FILE
        info.write_text(json.dumps(manifest_json(manifest, server), indent=1) + "\n")
        with info.open("rb") as fh:
            os.fsync(fh.fileno())
        for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, reverse=True):
            fsync_dir(d)
        if problem := check_out(out):  # something appeared there meanwhile
            raise BackupError(problem)
        os.replace(tmp, out)
        fsync_dir(out.parent)
        return manifest
    finally:
        receiver.abort()
        shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename: a no-op then


def backup_json(server: str, out: Path, m: pb.BackupManifest, seconds: float) -> dict[str, Any]:
    """What ``pagesift backup --json`` prints."""
    return {
        "server": server,
        "out": str(out),
        "offset": m.offset,
        "epoch": m.epoch,
        "history_id": m.history_id,
        "role": role_name(m.role),
        "source_node_id": m.node_id,
        "files": len(m.files),
        "bytes": m.total_bytes,
        "seconds": round(seconds, 3),
        "checkpoint_seconds": round(m.checkpoint_seconds, 4),
    }


async def _cmd_backup(args: argparse.Namespace, client: JobClient) -> int:
    addresses = server_addresses(args)  # exactly one (single_server)
    server, out = addresses[0], Path(args.out)
    if problem := check_out(out):
        return fail(problem)
    started = time.monotonic()
    # The key goes explicitly: grpc.aio registers JobClient's one interceptor object
    # for unary-unary calls only, so it would not reach this unary-stream call.
    md = (("authorization", f"Bearer {args.admin_key}"),) if args.admin_key else ()
    call = client.admin_stub(server).Backup(pb.BackupRequest(), metadata=md)
    try:
        m = await write_backup(call, out, server=server)
    except BackupError as err:
        call.cancel()
        return fail(f"backup failed, nothing written: {err}", exit=EXIT_FAILED)
    except BaseException:
        call.cancel()
        raise
    seconds = time.monotonic() - started
    if args.json:
        dump(backup_json(server, out, m, seconds))
    else:
        print(
            f"backup of {server} in {out}: offset {m.offset}, epoch {m.epoch}, "
            f"history {m.history_id}, {len(m.files)} files, {m.total_bytes} bytes "
            f"in {seconds:.2f} s (writes waited {m.checkpoint_seconds * 1000:.0f} ms)"
        )
    return EXIT_OK


def add_backup_command(sub: Any) -> None:
    """``backup --server ADDR --out DIR [--json]``."""
    p = sub.add_parser(
        "backup",
        parents=[client_parent(cluster=False)],
        help="copy a node's store, while it runs, into a new data directory",
    )
    p.add_argument(
        "--out", required=True, metavar="DIR", help="a new or empty directory for the copy"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_backup, uses_client=True, single_server="the node to copy")
