"""Part 1 of the replication bench, the raw limits: what the hardware allows, no pagesift.

(a) ``raw_rocksdb``: ``rocksdict`` ``WriteBatch`` commits straight on an ``Rdict`` (the
store's options), each batch shaped like a page group (``workload``); once with the data
keys only and once with a log-entry-sized extra value (what the primary's batch carries).
(b) ``raw_stream``: a ``grpc.aio`` bidi stream on loopback between two processes; the client
streams ~1 MB batches of payloads sized like serialized page-group ``LogEntry`` messages,
the server (``raw_server``, started as ``python -m bench.replication raw-server ADDR``)
walks each batch and acks its running entry count.
"""

from __future__ import annotations

import asyncio
import signal
import struct
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import grpc

from bench.common import LOOPBACK, MB, free_port
from bench.replication.procs import READY_TIMEOUT, spawn, stop
from bench.replication.workload import LINKS_PER_PAGE, OPS_PER_GROUP, PageGen

BATCH_BYTES = 1 << 20  # ReplicationServicer.batch_bytes default
RAW_METHOD = "/bench.Raw/Stream"
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")

# ============================================================================ 1a: raw RocksDB


def raw_rocksdb(seconds: float, with_entry: bool, gen: PageGen) -> dict[str, Any]:
    """WriteBatch commits/s of page-shaped batches straight on an Rdict (no pagesift)."""
    from rocksdict import Rdict, WriteBatch, WriteOptions

    from pagesift.core.store.db import rocksdb_options

    with tempfile.TemporaryDirectory(prefix="bench-raw-rocks-") as tmp:
        db = Rdict(str(Path(tmp) / "db"), rocksdb_options())  # the store's options
        wopts = WriteOptions()
        wopts.sync = False  # ServerConfig.fsync default
        job = b"job/00000000-0000-0000-0000-000000000000/"
        pages, done, seen, frontier = (job + w for w in (b"pages", b"done", b"seen", b"frontier"))
        pages_ = [gen.page(n) for n in range(256)]
        entries = [gen.entry_bytes(n) for n in range(64)] if with_entry else []

        def item(name: bytes, seq: int) -> bytes:
            return b"l" + name + b"\x00" + _U64.pack(seq)

        n = 0
        nbytes = 0
        t0 = time.monotonic()
        deadline = t0 + seconds
        while n < 10_000_000:
            doc, key, links = pages_[n % 256]
            key = key + str(n).encode()
            batch = WriteBatch(raw_mode=True)
            batch.put(item(pages, n), doc)
            batch.put(b"m" + pages, _U64X2.pack(0, n + 1))
            batch.put(b"s" + done + b"\x00" + key, b"")
            batch.put(b"c" + done, _U64.pack(n + 1))
            nbytes += len(doc) + len(key)
            for i, (link, entry) in enumerate(links):
                link = link + str(n).encode()
                batch.put(b"s" + seen + b"\x00" + link, b"")
                batch.put(item(frontier, n * LINKS_PER_PAGE + i), entry)
                nbytes += len(link) + len(entry)
            batch.put(b"m" + frontier, _U64X2.pack(0, (n + 1) * LINKS_PER_PAGE))
            batch.put(b"c" + seen, _U64.pack((n + 1) * LINKS_PER_PAGE))
            if with_entry:
                data = entries[n % 64]
                batch.put(b"_repl/log/" + _U64.pack(n + 1), data)
                batch.put(b"_repl/tail", _U64X2.pack(n + 1, 1))
                nbytes += len(data)
            db.write(batch, wopts)
            n += 1
            if n % 64 == 0 and time.monotonic() >= deadline:
                break
        elapsed = time.monotonic() - t0
        db.close()
    return {
        "variant": "data + log entry" if with_entry else "data keys",
        "commits": n,
        "seconds": elapsed,
        "commits_per_s": n / elapsed,
        "ops_per_s": n * OPS_PER_GROUP / elapsed,
        "mb_per_s": nbytes / MB / elapsed,
    }


# ============================================================================ 1b: raw gRPC stream


async def raw_server(listen: str) -> None:
    """A trivial bidi server: walk each framed batch, ack the running entry count."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 16 * MB)])

    async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        total = 0
        async for frame in requests:
            pos, end = 0, len(frame)
            while pos < end:
                (size,) = _U32.unpack_from(frame, pos)
                pos += 4 + size
                total += 1
            yield _U64.pack(total)

    handler = grpc.method_handlers_generic_handler(
        "bench.Raw", {"Stream": grpc.stream_stream_rpc_method_handler(stream)}
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(listen)
    await server.start()
    stop_ev = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_ev.set)
    await stop_ev.wait()
    await server.stop(grace=1.0)


def _frames(entries: list[bytes]) -> list[tuple[bytes, int, int]]:
    """8 prebuilt batches: (frame, entries, payload bytes), each cut like ``Log.read``'s."""
    frames: list[tuple[bytes, int, int]] = []
    i = 0
    while len(frames) < 8:
        parts: list[bytes] = []
        size = 0
        while not parts or size < BATCH_BYTES:  # Log.read's rule: >= 1 entry, then up to 1 MB
            e = entries[i % len(entries)]
            parts.append(_U32.pack(len(e)) + e)
            size += len(e)
            i += 1
        frames.append((b"".join(parts), len(parts), size))
    return frames


async def _stream_frames(
    addr: str, frames: list[tuple[bytes, int, int]], seconds: float
) -> tuple[int, int, int, int, float]:
    """Stream ``frames`` round-robin for ``seconds``; (messages, entries, payload bytes,
    entries acked, seconds until the last ack)."""
    channel = grpc.aio.insecure_channel(addr)
    try:
        await asyncio.wait_for(channel.channel_ready(), READY_TIMEOUT)
        call = cast(Any, channel.stream_stream(RAW_METHOD, None, None))()
        acked = 0
        t_last = 0.0

        async def reader() -> None:
            nonlocal acked, t_last
            async for ack in call:
                acked = _U64.unpack(cast(bytes, ack))[0]
                t_last = time.monotonic()

        task = asyncio.create_task(reader())
        sent = msgs = nbytes = 0
        t0 = time.monotonic()
        while msgs < 10_000_000 and time.monotonic() - t0 < seconds:
            frame, count, size = frames[msgs % len(frames)]
            await call.write(frame)
            msgs += 1
            sent += count
            nbytes += size
        await call.done_writing()
        await asyncio.wait_for(task, 30)
        elapsed = t_last - t0
    finally:
        await channel.close(grace=None)
    return msgs, sent, nbytes, acked, elapsed


async def raw_stream(seconds: float, gen: PageGen) -> dict[str, Any]:
    """Client side: stream prebuilt ~1 MB batches of entry-sized payloads for ``seconds``."""
    entries = [gen.entry_bytes(n) for n in range(512)]
    frames = _frames(entries)
    port = free_port()
    addr = f"{LOOPBACK}:{port}"
    proc = spawn(
        "raw-server", [sys.executable, "-m", "bench.replication", "raw-server", addr], addr
    )
    try:
        msgs, sent, nbytes, acked, elapsed = await _stream_frames(addr, frames, seconds)
    finally:
        stop(proc)
    if acked != sent:
        raise RuntimeError(f"raw stream: sent {sent} entries, server acked {acked}")
    return {
        "messages": msgs,
        "entries": sent,
        "seconds": elapsed,
        "messages_per_s": msgs / elapsed,
        "entries_per_s": sent / elapsed,
        "ops_per_s": sent * OPS_PER_GROUP / elapsed,
        "mb_per_s": nbytes / MB / elapsed,
        "entry_bytes_mean": sum(len(e) for e in entries) / len(entries),
        "entries_per_message": sent / msgs,
    }
