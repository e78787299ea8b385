"""Replication benchmark: raw limits, replicated throughput, lag, crawl cost, resync, promote.

Everything runs on 127.0.0.1 in one invocation (``python -m bench.run --section replication``)
and is written to ``bench/out/replication.{md,json}``. Parts, in order:

1. **Raw limits.** (a) ``rocksdict`` ``WriteBatch`` commits straight on an ``Rdict``, each batch
   shaped like a crawl page group (1 list push of ~16 KB + its bounds, 1 set insert + count,
   5 frontier pushes + 5 seen inserts), no pagesift code; once with the data keys only and
   once with a log-entry-sized extra value (what the primary's batch really carries).
   (b) a ``grpc.aio`` bidi stream on loopback between two processes: the client streams
   ~1 MB batches of byte payloads with exactly the sizes of serialized page-group
   ``LogEntry`` messages, the server walks each batch and acks its running entry count.
2. **Replicated throughput.** A primary *driver* process (this module, ``primary`` mode:
   ``open_slot`` + ``Log.open_for_writes`` + the real ``ReplicationServicer`` and
   ``AdminServicer`` on a grpc.aio server configured like ``pagesift serve``) writes page
   groups through the real write path (``slot.log.write``, on its event loop like the job
   runtime does) as fast as it can for ``--seconds``; the standby is a real
   ``pagesift serve --role standby``. Both nodes' ``AdminService.Role`` are sampled every
   20 ms: entries/s applied on the standby while the writer runs and while it drains.
3. **Lag during a crawl** and 4. **crawl throughput with/without a standby**: the crawl
   bench's site (Django docs on nginx), ``pagesift serve`` primary (+ standby), same
   concurrency as the crawl bench. Role sampled every 20 ms on every node in both
   configurations (same observer load on the primary). Lag in offsets (primary offset minus
   standby applied, same sampling round) and in ms (for each offset X: first round the
   standby had applied X minus first round the primary had written X; resolution = one
   sampling period).
5. **Full resync.** The driver's store is filled to ``--resync-mb`` of replicated data; a
   fresh standby joins; time from the primary's decision (its log line, same monotonic clock)
   to the standby's applied offset reaching the snapshot offset, then the live tail. A
   paced writer (``--writer-rate`` groups/s) on the primary records per-group latency idle
   (no standby) and during the resync.
6. **Promote.** ``AdminService.Promote`` on a caught-up standby, then ``StartCrawl`` until
   it is accepted: after a full resync, and after a crawl.

Also a module entry point for the helper processes: ``python -m bench.replication
primary|raw-server ...`` (started by the section itself).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shlex
import shutil
import signal
import string
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc

from bench.common import (
    LOOPBACK,
    MB,
    OUT_DIR,
    REPO_DIR,
    cpu_seconds,
    free_port,
    machine_facts,
    markdown_table,
    say,
    stop_process,
    subtree_cpu_seconds,
)
from pagesift.shared.tls import write_new_token

PAGE_BYTES = 16 * 1024
LINKS_PER_PAGE = 5
OPS_PER_GROUP = 2 + 2 * LINKS_PER_PAGE  # push + insert + 5 x (insert + push)
BATCH_BYTES = 1 << 20  # ReplicationServicer.batch_bytes default
SAMPLE_PERIOD = 0.02
READY_TIMEOUT = 60.0
RPC_TIMEOUT = 10.0
PARTS = ("raw", "throughput", "crawl", "resync")
GRPC_OPTIONS = [("grpc.max_receive_message_length", 256 * MB)]
DRIVER_METHOD = "/bench.Driver/Call"
RAW_METHOD = "/bench.Raw/Stream"
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("replication section")
    g.add_argument(
        "--seconds", type=float, default=8.0, help="writer burst for the throughput part (8)"
    )
    g.add_argument(
        "--resync-mb", type=int, default=256, help="replicated MB in the resynced store (256)"
    )
    g.add_argument("--raw-seconds", type=float, default=3.0, help="each raw-limit run (3)")
    g.add_argument(
        "--writer-rate",
        type=float,
        default=240.0,
        help="paced writer groups/s during the idle/resync latency runs (240 = crawl peak)",
    )
    g.add_argument("--idle-seconds", type=float, default=5.0, help="paced writer idle baseline (5)")
    g.add_argument("--crawl-runs", type=int, default=3, help="crawls per configuration (median; 3)")
    g.add_argument(
        "--repl-parts",
        default=",".join(PARTS),
        help=f"comma-separated subset of {','.join(PARTS)} (default all)",
    )


# ============================================================================ page groups


class PageGen:
    """Deterministic page-shaped groups: ~16 KB of Markdown-like text, a page key, and
    ``LINKS_PER_PAGE`` new links (seen key, frontier entry). Text is sliced from a 2 MB
    pool of pseudo-words so it compresses like prose, not like random bytes."""

    def __init__(self, seed: int = 7, prefix: str = "http://127.0.0.1:8000/") -> None:
        rng = random.Random(seed)
        vocab = [
            "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 11)))
            for _ in range(4000)
        ]
        lines: list[str] = []
        size = 0
        while size < 2 * MB:
            line = " ".join(rng.choice(vocab) for _ in range(rng.randint(4, 16)))
            if rng.random() < 0.1:
                line = "## " + line
            lines.append(line)
            size += len(line) + 1
        self.pool = "\n".join(lines).encode()
        self.prefix = prefix

    def page(self, n: int) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]]:
        size = PAGE_BYTES + (n * 7919) % 4097 - 2048
        off = (n * 104729) % (len(self.pool) - size)
        doc = self.pool[off : off + size]
        key = f"{self.prefix}ref/{n % 97}/page-{n}.html".encode()
        links = []
        for i in range(LINKS_PER_PAGE):
            link = f"{self.prefix}topics/{(n + i) % 89}/link-{n * LINKS_PER_PAGE + i}.html"
            links.append((link.encode(), f"2 {link}".encode()))
        return doc, key, links

    def entry_bytes(self, n: int, epoch: int = 1) -> bytes:
        """The serialized ``LogEntry`` the real write path logs for page ``n``."""
        from pagesift.v1 import replication_pb2, store_pb2

        doc, key, links = self.page(n)
        job = "job/00000000-0000-0000-0000-000000000000"
        ops = [
            store_pb2.Op(list_push=store_pb2.ListPush(list=f"{job}/pages", seq=n, item=doc)),
            store_pb2.Op(set_insert=store_pb2.SetInsert(set=f"{job}/done", member=key, size=n + 1)),
        ]
        for i, (seen, entry) in enumerate(links):
            seen_size = n * LINKS_PER_PAGE + i + 1
            ops.append(
                store_pb2.Op(
                    set_insert=store_pb2.SetInsert(set=f"{job}/seen", member=seen, size=seen_size)
                )
            )
            ops.append(
                store_pb2.Op(
                    list_push=store_pb2.ListPush(
                        list=f"{job}/frontier", seq=n * LINKS_PER_PAGE + i, item=entry
                    )
                )
            )
        return replication_pb2.LogEntry(epoch=epoch, offset=n + 1, ops=ops).SerializeToString()


# ============================================================================ statistics


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100.0 * len(ordered) + 0.5) - 1))
    return float(ordered[k])


def dist(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": float(len(values)),
        "p50": pct(values, 50),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "max": max(values) if values else float("nan"),
    }


@dataclass
class Samples:
    """Role rounds: time (monotonic, mid-round) and each node's applied offset (-1: no
    answer)."""

    names: list[str]
    t: list[float] = field(default_factory=list)
    applied: list[list[int]] = field(default_factory=list)  # per round, per node
    primary_offset: list[int] = field(default_factory=list)  # what node 0 reports

    def series(self, i: int) -> list[tuple[float, int]]:
        return [(t, row[i]) for t, row in zip(self.t, self.applied, strict=True) if row[i] >= 0]

    def at(self, i: int, when: float) -> int:
        """Node i's applied offset at the last round at or before ``when`` (0 if none)."""
        best = 0
        for t, v in self.series(i):
            if t > when:
                break
            best = v
        return best


def reach_times(series: Sequence[tuple[float, int]], lo: int, hi: int) -> list[float]:
    """For X in lo+1..hi: the first sample time at which the value was >= X."""
    out: list[float] = []
    x = lo + 1
    for t, v in series:
        while x <= hi and v >= x:
            out.append(t)
            x += 1
    return out


def lag_stats(s: Samples, t0: float, t1: float) -> dict[str, Any]:
    """Lag between node 0 (primary) and node 1 (standby) over rounds in [t0, t1]."""
    rounds = [
        (t, row[0], row[1])
        for t, row in zip(s.t, s.applied, strict=True)
        if t0 <= t <= t1 and row[0] >= 0 and row[1] >= 0
    ]
    offsets = [float(max(0, p - q)) for _, p, q in rounds]
    lo = s.at(0, t0)
    hi = max((p for _, p, _ in rounds), default=lo)
    prim = reach_times([(t, p) for t, p, _ in rounds], lo, hi)
    # the standby may apply after t1: look at every later sample too
    stby = reach_times([(t, v) for t, v in s.series(1) if t >= t0], lo, hi)
    n = min(len(prim), len(stby))
    ms = [max(0.0, (stby[k] - prim[k]) * 1000.0) for k in range(n)]
    periods = [b - a for a, b in zip(s.t, s.t[1:], strict=False) if t0 <= a <= t1]
    return {
        "rounds": len(rounds),
        "sample_period_ms_p50": pct(periods, 50) * 1000 if periods else float("nan"),
        "lag_offsets": dist(offsets),
        "lag_ms": dist(ms),
        "offsets_measured": n,
        "offsets_written": hi - lo,
    }


# ============================================================================ processes


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    addr: str


def spawn(name: str, cmd: list[str], addr: str) -> Proc:
    log = OUT_DIR / f"replication-{name}.log"
    say("$ " + shlex.join(cmd))
    with log.open("wb") as fh:
        popen = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_DIR
        )
    return Proc(name, popen, log, addr)


def stop(proc: Proc | None) -> None:
    if proc is not None:
        code = stop_process(proc.popen, grace=20)
        say(f"{proc.name} stopped (exit {code})")


def _serve_cmd(role: str, addr: str, data: Path, conf: Path, primary: str = "") -> list[str]:
    cmd = [sys.executable, "-m", "pagesift.shared.cli", "serve", "--role", role]
    cmd += [
        "--listen",
        addr,
        "--data",
        str(data),
        "--allow-private-networks",
        "--config",
        str(conf),
    ]
    if primary:
        cmd += ["--primary", primary]
    return cmd


def _server_config(tmp: Path, concurrency: int) -> Path:
    """The crawl bench's server config (per-host concurrency = the crawl's)."""
    tmp.mkdir(parents=True, exist_ok=True)
    conf = tmp / "server.toml"
    token = tmp / "replication.token"
    if not token.exists():
        write_new_token(token)
    lines = [
        "[server]",
        f"per_host_concurrency = {concurrency}",
        f'replication_token_file = "{token}"',
    ]
    if concurrency > 64:
        lines.append(f"max_concurrency = {concurrency}")
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _du(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                total += p.stat().st_size
    return total


# ============================================================================ gRPC clients


class Node:
    """Async clients for one node (admin + jobs, or the driver's control call)."""

    def __init__(self, proc: Proc) -> None:
        from pagesift.v1 import jobs_pb2_grpc, replication_pb2_grpc

        self.proc = proc
        self.channel = grpc.aio.insecure_channel(proc.addr, options=GRPC_OPTIONS)
        self.admin = replication_pb2_grpc.AdminServiceStub(self.channel)
        self.jobs = jobs_pb2_grpc.JobServiceStub(self.channel)
        self._call = self.channel.unary_unary(DRIVER_METHOD, None, None)

    async def role(self, timeout: float = 2.0) -> Any:
        from pagesift.v1 import replication_pb2 as pb

        return await self.admin.Role(pb.RoleRequest(), timeout=timeout)

    async def control(self, cmd: str, timeout: float = RPC_TIMEOUT, **kw: Any) -> dict[str, Any]:
        raw = await self._call(json.dumps({"cmd": cmd, **kw}).encode(), timeout=timeout)
        out: dict[str, Any] = json.loads(cast(bytes, raw))
        return out

    async def ready(self, timeout: float = READY_TIMEOUT) -> float:
        """Poll Role until it answers; returns seconds waited. Raises if the process died."""
        t0 = time.monotonic()
        last: Exception | None = None
        while time.monotonic() - t0 < timeout:
            if self.proc.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.proc.name} exited {self.proc.popen.returncode}; see {self.proc.log}"
                )
            try:
                await self.role(timeout=1.0)
                return time.monotonic() - t0
            except grpc.aio.AioRpcError as exc:
                last = exc
                await asyncio.sleep(0.05)
        raise TimeoutError(f"{self.proc.name} not serving after {timeout:.0f}s: {last!r}")

    async def close(self) -> None:
        await self.channel.close(grace=None)


async def until(
    pred: Callable[[], Awaitable[bool]], what: str, timeout: float, step: float = 0.02
) -> float:
    """Await ``pred()`` until true (bounded); returns the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(grpc.aio.AioRpcError):
            if await pred():
                return time.monotonic() - t0
        await asyncio.sleep(step)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class Sampler:
    """Role on every node every ``period`` s (concurrently per round) until stopped."""

    def __init__(self, nodes: Sequence[Node], period: float = SAMPLE_PERIOD, max_s: float = 600):
        self.nodes = list(nodes)
        self.period = period
        self.max_s = max_s
        self.samples = Samples([n.proc.name for n in nodes])
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Sampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> Samples:
        self._stop.set()
        if self._task is not None:
            await self._task
        return self.samples

    def last(self, i: int) -> int:
        for row in reversed(self.samples.applied):
            if row[i] >= 0:
                return row[i]
        return -1

    async def _run(self) -> None:
        t0 = time.monotonic()
        nxt = t0
        while not self._stop.is_set() and time.monotonic() - t0 < self.max_s:
            a = time.monotonic()
            res = await asyncio.gather(
                *(n.role(timeout=1.0) for n in self.nodes), return_exceptions=True
            )
            b = time.monotonic()
            row = [-1 if isinstance(r, BaseException) else int(r.applied_offset) for r in res]
            self.samples.t.append((a + b) / 2)
            self.samples.applied.append(row)
            first = res[0]
            self.samples.primary_offset.append(
                -1 if isinstance(first, BaseException) else int(first.primary_offset)
            )
            nxt += self.period
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
            if time.monotonic() - nxt > self.period:
                nxt = time.monotonic()  # fell behind (a slow round): do not burst


# ============================================================================ 1a: raw RocksDB


def raw_rocksdb(seconds: float, with_entry: bool, gen: PageGen) -> dict[str, Any]:
    """WriteBatch commits/s of page-shaped batches straight on an Rdict (no pagesift)."""
    from rocksdict import Rdict, WriteBatch, WriteOptions

    from pagesift.shared.store import rocksdb_options

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


async def _raw_server(listen: str) -> None:
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


async def raw_stream(seconds: float, gen: PageGen) -> dict[str, Any]:
    """Client side: stream prebuilt ~1 MB batches of entry-sized payloads for ``seconds``."""
    entries = [gen.entry_bytes(n) for n in range(512)]
    frames: list[tuple[bytes, int, int]] = []  # (frame, entries, payload bytes)
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
    port = free_port()
    addr = f"{LOOPBACK}:{port}"
    proc = spawn(
        "raw-server", [sys.executable, "-m", "bench.replication", "raw-server", addr], addr
    )
    try:
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


# ============================================================================ the primary driver


class Driver:
    """The primary side for parts 2, 5 and 6: the real store/log/replication code, with a
    control method (JSON over a generic unary gRPC call) to drive its writer."""

    def __init__(self, data: Path, backlog_bytes: int) -> None:
        from pagesift.primary.replication import ReplicationServicer
        from pagesift.shared.events import JobEvents
        from pagesift.shared.replog import open_slot

        self.slot = open_slot(data, backlog_bytes=backlog_bytes)
        self.events = JobEvents()  # the server's store observer (watch wake-ups), as in Node
        self.slot.store.add_observer(self.events)
        self.slot.log.open_for_writes()
        self.repl = ReplicationServicer(self.slot, node_id="bench-primary")
        self.gen = PageGen()
        self.n = 0  # pages written so far
        self.data_bytes = 0
        self.job = "job/11111111-2222-3333-4444-555555555555"
        self.hellos: list[tuple[float, str]] = []
        self._paced: asyncio.Task[dict[str, Any]] | None = None
        self._paced_stop = asyncio.Event()

    def write_one(self) -> int:
        from pagesift.shared.store import WriteGroup

        doc, key, links = self.gen.page(self.n)
        key += str(self.n).encode()
        job = self.job

        def group(g: WriteGroup) -> int:
            g.push(f"{job}/pages", doc)
            g.insert(f"{job}/done", key)
            for link, entry in links:
                if g.insert(f"{job}/seen", link + str(self.n).encode()):
                    g.push(f"{job}/frontier", entry)
            return len(g.ops)

        ops, _ = self.slot.log.write(group)
        self.data_bytes += len(doc) + len(key) + sum(len(a) + len(b) + 8 for a, b in links)
        self.n += 1
        return ops

    async def burst(self, seconds: float, max_groups: int = 10_000_000) -> dict[str, Any]:
        ops = groups = 0
        b0 = self.data_bytes
        first = self.slot.log.last_offset + 1
        t0 = time.monotonic()
        while groups < max_groups and time.monotonic() - t0 < seconds:
            ops += self.write_one()
            groups += 1
            await asyncio.sleep(0)  # let the stream, acks and Role run, as the job runtime does
        t1 = time.monotonic()
        return {
            "groups": groups,
            "ops": ops,
            "data_mb": (self.data_bytes - b0) / MB,
            "t0": t0,
            "t1": t1,
            "seconds": t1 - t0,
            "first_offset": first,
            "last_offset": self.slot.log.last_offset,
        }

    async def fill(self, mb: float, max_s: float) -> dict[str, Any]:
        t0 = time.monotonic()
        out = await self.burst(0.0, 0)
        target = mb * MB
        groups = 0
        while self.data_bytes < target and time.monotonic() - t0 < max_s:
            self.write_one()
            groups += 1
            if groups % 16 == 0:
                await asyncio.sleep(0)
        out.pop("ops", None)
        out.update(
            groups=groups,
            seconds=time.monotonic() - t0,
            data_mb=self.data_bytes / MB,
            last_offset=self.slot.log.last_offset,
        )
        return out

    async def _paced_run(self, rate: float, max_s: float) -> dict[str, Any]:
        period = 1.0 / rate
        call_ms: list[float] = []
        tick_ms: list[float] = []
        t0 = time.monotonic()
        i = 0
        while not self._paced_stop.is_set() and time.monotonic() - t0 < max_s:
            tick = t0 + i * period
            delay = tick - time.monotonic()
            await asyncio.sleep(max(0.0, delay))
            a = time.monotonic()
            self.write_one()
            b = time.monotonic()
            call_ms.append((b - a) * 1000)
            tick_ms.append((b - tick) * 1000)  # includes waiting for a busy event loop
            i += 1
        return {
            "groups": i,
            "seconds": time.monotonic() - t0,
            "rate": rate,
            "write_call_ms": dist(call_ms),
            "tick_to_commit_ms": dist(tick_ms),
        }

    def status(self) -> dict[str, Any]:
        log = self.slot.log
        return {
            "offset": log.last_offset,
            "first_offset": log.first_offset,
            "backlog_mb": log.backlog_bytes / MB,
            "data_mb": self.data_bytes / MB,
            "full_resyncs": self.repl.full_resyncs,
            "continues": self.repl.continues,
            "hellos": self.hellos,
            "now": time.monotonic(),
        }

    def scan(self) -> dict[str, Any]:
        t0 = time.monotonic()
        keys = nbytes = 0
        for k, v in self.slot.store.replicated_items():
            keys += 1
            nbytes += len(k) + len(v)
        return {"keys": keys, "mb": nbytes / MB, "seconds": time.monotonic() - t0}

    async def handle(self, raw: bytes, context: Any) -> bytes:
        req = json.loads(raw)
        cmd = req["cmd"]
        out: dict[str, Any]
        if cmd == "status":
            out = self.status()
        elif cmd == "burst":
            out = await self.burst(float(req["seconds"]), int(req.get("max_groups", 10**7)))
        elif cmd == "fill":
            out = await self.fill(float(req["mb"]), float(req.get("max_s", 300)))
        elif cmd == "scan":
            out = await asyncio.to_thread(self.scan)
        elif cmd == "paced_start":
            self._paced_stop.clear()
            self._paced = asyncio.create_task(
                self._paced_run(float(req["rate"]), float(req.get("max_s", 300)))
            )
            out = {"started": True}
        elif cmd == "paced_stop":
            self._paced_stop.set()
            out = await self._paced if self._paced is not None else {}
            self._paced = None
        else:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown command {cmd!r}")
        return json.dumps(out).encode()


class _HelloLog(logging.Handler):
    """Records when the primary decided a session (its 'standby X (peer): decision' line)."""

    def __init__(self, driver: Driver) -> None:
        super().__init__(logging.INFO)
        self.driver = driver

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith("standby "):
            self.driver.hellos.append((time.monotonic(), record.getMessage()))


async def _driver_main(listen: str, data: Path, backlog_mb: int) -> None:
    from pagesift.primary.server import MAX_MESSAGE_BYTES
    from pagesift.standby.admin import AdminServicer
    from pagesift.v1 import replication_pb2_grpc

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    driver = Driver(data, backlog_mb * MB)
    driver.events.bind(asyncio.get_running_loop())
    logging.getLogger("pagesift.primary.replication").addHandler(_HelloLog(driver))
    server = grpc.aio.server(
        options=[  # as pagesift.primary.server.run
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", 4 * MAX_MESSAGE_BYTES),
        ]
    )
    replication_pb2_grpc.add_ReplicationServiceServicer_to_server(driver.repl, server)
    admin = AdminServicer(driver.slot, node_id=driver.repl.node_id, replication=driver.repl)
    replication_pb2_grpc.add_AdminServiceServicer_to_server(admin, server)
    control = grpc.method_handlers_generic_handler(
        "bench.Driver", {"Call": grpc.unary_unary_rpc_method_handler(driver.handle)}
    )
    server.add_generic_rpc_handlers((control,))
    if server.add_insecure_port(listen) == 0:
        raise SystemExit(f"cannot listen on {listen}")
    await server.start()
    logging.info("bench primary driver serving on %s (data %s)", listen, data)
    stop_ev = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_ev.set)
    await stop_ev.wait()
    driver._paced_stop.set()
    await server.stop(grace=2.0)
    driver.slot.close()


def _start_driver(tmp: Path, backlog_mb: int = 512) -> Proc:
    addr = f"{LOOPBACK}:{free_port()}"
    cmd = [sys.executable, "-m", "bench.replication", "primary", addr, str(tmp / "primary")]
    return spawn("primary-driver", [*cmd, str(backlog_mb)], addr)


def _start_standby(name: str, data: Path, conf: Path, primary: str) -> Proc:
    addr = f"{LOOPBACK}:{free_port()}"
    return spawn(name, _serve_cmd("standby", addr, data, conf, primary), addr)


# ============================================================================ 2: throughput


async def part_throughput(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Live: writer burst with the standby attached. Catch-up: standby stopped, a backlog
    written, standby restarted (continue): entries/s with no writer competing."""
    conf = _server_config(tmp, 16)
    driver = standby = None
    nodes: list[Node] = []
    out: dict[str, Any] = {}
    try:
        driver = _start_driver(tmp)
        p = Node(driver)
        nodes.append(p)
        await p.ready()
        standby = _start_standby("standby-throughput", tmp / "s-throughput", conf, driver.addr)
        s = Node(standby)
        nodes.append(s)
        await s.ready()
        # empty store: the first session is a full resync of nothing, then the tail
        await until(lambda: _connected(s), "the standby to connect", READY_TIMEOUT)
        say(f"replication: writer burst for {args.seconds:.0f}s through the primary's write path")
        sampler = Sampler([p, s]).start()
        cpu0 = _pair_cpu(driver, standby)
        burst = await p.control("burst", seconds=args.seconds, timeout=args.seconds + 120)
        last = int(burst["last_offset"])
        say(
            f"replication: primary wrote {burst['groups']} groups "
            f"({burst['groups'] / burst['seconds']:.0f}/s); standby at {sampler.last(1)}"
        )
        drain_timeout = max(120.0, 10 * args.seconds)
        try:
            await until(lambda: _applied(s, last), f"the standby to apply {last}", drain_timeout)
            t_done = time.monotonic()
            cpu1 = _pair_cpu(driver, standby)
        finally:
            samples = await sampler.stop()
        out.update(_live_figures(burst, samples, t_done))
        out["cpu_us_per_entry_live"] = {
            k: (cpu1[k] - cpu0[k]) / max(1, int(burst["groups"])) * 1e6 for k in cpu0
        }
        say(
            f"replication: standby applied {out['replicated_entries_per_s_live']:.0f} entries/s "
            f"while the writer ran, lag {out['lag_at_burst_end']} at its end, "
            f"drained in {out['drain_seconds']:.2f}s"
        )

        # catch-up: the standby away, a backlog written (fits the 512 MiB backlog), back
        await nodes.pop().close()
        stop(standby)
        standby = None
        groups = min(int(burst["groups"]), 15_000)
        say(f"replication: standby stopped; writing {groups} groups with nobody attached")
        c0 = cpu_seconds(driver.popen.pid)
        alone = await p.control(
            "burst", seconds=4 * args.seconds, max_groups=groups, timeout=4 * args.seconds + 120
        )
        alone["cpu_us_per_group"] = (cpu_seconds(driver.popen.pid) - c0) / alone["groups"] * 1e6
        target = int(alone["last_offset"])
        t_launch = time.monotonic()
        standby = _start_standby("standby-catchup", tmp / "s-throughput", conf, driver.addr)
        s = Node(standby)
        nodes.append(s)
        await s.ready()
        cpu0 = _pair_cpu(driver, standby)  # standby start-up excluded (apply may have begun)
        sampler = Sampler([p, s]).start()
        try:
            await until(lambda: _applied(s, target), f"the standby to apply {target}", 300)
            t_done = time.monotonic()
            cpu1 = _pair_cpu(driver, standby)
        finally:
            samples = await sampler.stop()
        st = await p.control("status")
        cont = [t for t, msg in st["hellos"] if "Continue" in msg and t >= t_launch]
        caught = reach_times(samples.series(1), target - 1, target)
        t_hello = cont[0] if cont else float("nan")
        t_caught = min(caught[0], t_done) if caught else t_done
        n = target - last
        out["catchup"] = {
            "entries": n,
            "standby_launch_to_hello_s": t_hello - t_launch,
            "hello_to_caught_up_s": t_caught - t_hello,
            "entries_per_s": n / (t_caught - t_hello),
            "continues": st["continues"],
            "cpu_us_per_entry": {k: (cpu1[k] - cpu0[k]) / n * 1e6 for k in cpu0},
        }
        out["writer_alone"] = alone
        out["writer_alone_groups_per_s"] = alone["groups"] / alone["seconds"]
        out["primary_status"] = st
        say(
            f"replication: writer alone {out['writer_alone_groups_per_s']:.0f} groups/s; "
            f"standby caught up {n} entries by continue in {t_caught - t_hello:.2f}s "
            f"({out['catchup']['entries_per_s']:.0f} entries/s)"
        )
    finally:
        for node in nodes:
            await node.close()
        stop(standby)
        stop(driver)
    return out


def _pair_cpu(primary: Proc, standby: Proc) -> dict[str, float]:
    return {
        "primary": cpu_seconds(primary.popen.pid),
        "standby": subtree_cpu_seconds(standby.popen.pid),
    }


def _live_figures(burst: dict[str, Any], samples: Samples, t_done: float) -> dict[str, Any]:
    t0, t1 = float(burst["t0"]), float(burst["t1"])
    first, last = int(burst["first_offset"]) - 1, int(burst["last_offset"])
    s_t0, s_t1 = samples.at(1, t0), samples.at(1, t1)
    caught = reach_times(samples.series(1), last - 1, last)
    t_caught = min(caught[0], t_done) if caught else t_done
    live = (s_t1 - s_t0) / (t1 - t0)
    drained = last - s_t1
    drain_s = t_caught - t1
    return {
        "writer": burst,
        "writer_groups_per_s": burst["groups"] / burst["seconds"],
        "writer_ops_per_s": burst["ops"] / burst["seconds"],
        "standby_applied_during_burst": s_t1 - s_t0,
        "replicated_entries_per_s_live": live,
        "lag_at_burst_end": drained,
        "drain_seconds": drain_s,
        "drain_entries_per_s": drained / drain_s if drained > 0 and drain_s > 0 else None,
        "overall_entries_per_s": (last - first) / (t_caught - t0),
        "ops_per_entry": burst["ops"] / max(1, burst["groups"]),
        "lag_during_burst": lag_stats(samples, t0, t1),
    }


async def _connected(n: Node) -> bool:
    return bool((await n.role()).connected)


async def _applied(n: Node, offset: int) -> bool:
    return int((await n.role()).applied_offset) >= offset


# ============================================================================ 3+4(+6): crawl


async def crawl_once(
    site_url: str,
    tmp: Path,
    with_standby: bool,
    concurrency: int,
    limit: int,
    promote: bool,
    nginx_pid: int = 0,
) -> dict[str, Any]:
    from pagesift.v1 import jobs_pb2

    terminal = {
        jobs_pb2.JOB_STATE_COMPLETED,
        jobs_pb2.JOB_STATE_FAILED,
        jobs_pb2.JOB_STATE_CANCELLED,
    }
    run_dir = Path(tempfile.mkdtemp(prefix="crawl-", dir=tmp))
    conf = _server_config(run_dir, concurrency)
    tag = "with-standby" if with_standby else "alone"
    prim = stby = None
    nodes: list[Node] = []
    out: dict[str, Any] = {"with_standby": with_standby}
    try:
        addr = f"{LOOPBACK}:{free_port()}"
        prim = spawn(f"crawl-primary-{tag}", _serve_cmd("primary", addr, run_dir / "p", conf), addr)
        p = Node(prim)
        nodes.append(p)
        await p.ready()
        if with_standby:
            stby = _start_standby(f"crawl-standby-{tag}", run_dir / "s", conf, addr)
            s = Node(stby)
            nodes.append(s)
            await s.ready()
            await until(lambda: _connected(s), "the standby to connect", READY_TIMEOUT)
        await asyncio.sleep(0.5)  # let start-up work settle
        sampler = Sampler(nodes).start()
        cpu0 = _crawl_cpu(nodes, nginx_pid)
        t0 = time.monotonic()
        started = await p.jobs.StartCrawl(
            jobs_pb2.StartCrawlRequest(
                url=site_url,
                limit=limit,
                max_concurrency=concurrency,
                options=jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_MARKDOWN]),
            ),
            timeout=30,
        )
        job = None
        for _ in range(20_000):  # 50 ms polls: bounded by ~1000 s
            job = await _get_job(p, started.id)
            if job.state in terminal or time.monotonic() - t0 > 900:
                break
            await asyncio.sleep(0.05)
        t1 = time.monotonic()
        cpu1 = _crawl_cpu(nodes, nginx_pid)
        assert job is not None
        final = int((await p.role()).applied_offset)
        if with_standby:
            await until(lambda: _applied(nodes[1], final), f"standby to apply {final}", 120)
        samples = await sampler.stop()
        pages = int(job.completed)
        out.update(
            pages=pages,
            failed=int(job.failed),
            state=jobs_pb2.JobState.Name(job.state),
            wall_s=t1 - t0,
            pages_per_s=pages / (t1 - t0),
            final_offset=final,
            cpu_s={k: cpu1[k] - cpu0[k] for k in cpu0},
        )
        if with_standby:
            caught = reach_times(samples.series(1), final - 1, final)
            out["standby_caught_up_after_s"] = caught[0] - t1 if caught else None
            out["lag"] = lag_stats(samples, t0, t1)
            out["sample_rounds"] = len(samples.t)
            if promote:
                out["promote"] = await measure_promote(nodes[1], site_url, conf)
    finally:
        for n in nodes:
            await n.close()
        stop(stby)
        stop(prim)
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


def _crawl_cpu(nodes: Sequence[Node], nginx_pid: int) -> dict[str, float]:
    """CPU seconds so far: primary main process, its extraction workers, standby, nginx."""
    main = cpu_seconds(nodes[0].proc.popen.pid)
    out = {
        "primary": main,
        "primary_workers": subtree_cpu_seconds(nodes[0].proc.popen.pid) - main,
        "standby": subtree_cpu_seconds(nodes[1].proc.popen.pid) if len(nodes) > 1 else 0.0,
        "nginx": subtree_cpu_seconds(nginx_pid) if nginx_pid else 0.0,
    }
    return out


async def _get_job(n: Node, job_id: str) -> Any:
    from pagesift.v1 import jobs_pb2

    try:
        return await n.jobs.GetJob(
            jobs_pb2.GetJobRequest(id=job_id, skip=2**31 - 1, limit=1), timeout=30
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() not in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.INVALID_ARGUMENT):
            raise
        return await n.jobs.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=0, limit=1), timeout=30)


async def part_crawl(
    args: argparse.Namespace, site_url: str, tmp: Path, nginx_pid: int
) -> dict[str, Any]:
    concurrency = int(getattr(args, "concurrency", 16))
    limit = int(getattr(args, "limit", 0))
    runs: dict[str, list[dict[str, Any]]] = {"alone": [], "with_standby": []}
    n = max(1, min(10, args.crawl_runs))
    for i in range(n):
        order = [False, True] if i % 2 == 0 else [True, False]
        for with_standby in order:
            key = "with_standby" if with_standby else "alone"
            say(f"replication: crawl {i + 1}/{n} {key.replace('_', ' ')} of {site_url}")
            promote = with_standby and i == n - 1
            r = await crawl_once(
                site_url, tmp, with_standby, concurrency, limit, promote, nginx_pid
            )
            cpu = r["cpu_s"]
            msg = (
                f"replication: {r['pages']} pages in {r['wall_s']:.2f}s "
                f"({r['pages_per_s']:.1f}/s); "
                f"CPU s: primary {cpu['primary']:.2f} + workers {cpu['primary_workers']:.2f}, "
                f"standby {cpu['standby']:.2f}, nginx {cpu['nginx']:.2f}"
            )
            if with_standby:
                lag = r["lag"]
                msg += (
                    f", lag p50/p99 {lag['lag_ms']['p50']:.0f}/{lag['lag_ms']['p99']:.0f} ms, "
                    f"{lag['lag_offsets']['p50']:.0f}/{lag['lag_offsets']['p99']:.0f} offsets"
                )
            say(msg)
            runs[key].append(r)
    med = {k: _median(v) for k, v in runs.items()}
    ratio = med["with_standby"]["pages_per_s"] / med["alone"]["pages_per_s"]
    # lag over every run with a standby: pool the per-offset figures by taking the worst run
    lag_runs = [r["lag"] for r in runs["with_standby"]]
    promote = next((r["promote"] for r in runs["with_standby"] if "promote" in r), None)
    return {
        "concurrency": concurrency,
        "limit": limit,
        "runs": runs,
        "median": med,
        "with_over_alone": ratio,
        "lag_runs": lag_runs,
        "lag_median_run": med["with_standby"]["lag"],
        "lag_worst_p99_ms": max(r["lag_ms"]["p99"] for r in lag_runs),
        "promote": promote,
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: float(r["pages_per_s"]))
    return ordered[(len(ordered) - 1) // 2]


async def measure_promote(n: Node, url: str, conf: Path) -> dict[str, Any]:
    """Promote a caught-up standby; time the call and until a StartCrawl is accepted.
    ``conf`` is the node's config from ``_server_config`` (its token file beside it)."""
    from pagesift.v1 import jobs_pb2
    from pagesift.v1 import replication_pb2 as pb

    req = jobs_pb2.StartCrawlRequest(url=url, limit=1, max_concurrency=1)
    before = await n.role()
    refused = ""
    try:
        await n.jobs.StartCrawl(req, timeout=5)
        refused = "accepted before the promotion!"
    except grpc.aio.AioRpcError as exc:
        refused = exc.code().name
    t0 = time.monotonic()
    token = (conf.parent / "replication.token").read_text().strip()
    promote_md = (("authorization", f"Bearer {token}"),)  # no [admin] key: the pair's token
    resp = await n.admin.Promote(pb.PromoteRequest(), metadata=promote_md, timeout=60)
    t1 = time.monotonic()
    attempts = 0
    last = ""
    accepted = False
    while attempts < 2000 and time.monotonic() - t0 < 30:
        attempts += 1
        try:
            await n.jobs.StartCrawl(req, timeout=5)
            accepted = True
            break
        except grpc.aio.AioRpcError as exc:
            last = f"{exc.code().name}: {exc.details()}"
            await asyncio.sleep(0.005)
    t2 = time.monotonic()
    after = await n.role()
    out = {
        "applied_offset": int(before.applied_offset),
        "epoch_before": int(before.epoch),
        "epoch_after": int(resp.epoch),
        "switch_offset": int(resp.switch_offset),
        "role_after": pb.NodeRole.Name(after.role),
        "write_before_promote": refused,
        "promote_rpc_ms": (t1 - t0) * 1000,
        "first_write_ms": (t2 - t0) * 1000 if accepted else None,
        "write_attempts": attempts,
        "last_error": last,
    }
    say(
        f"replication: promote {out['promote_rpc_ms']:.1f} ms, first write accepted after "
        f"{out['first_write_ms'] or float('nan'):.1f} ms ({attempts} attempt(s))"
    )
    return out


# ============================================================================ 5(+6): resync


async def part_resync(args: argparse.Namespace, site_url: str, tmp: Path) -> dict[str, Any]:
    conf = _server_config(tmp, 16)
    driver = standby = None
    nodes: list[Node] = []
    out: dict[str, Any] = {}
    try:
        driver = _start_driver(tmp)
        p = Node(driver)
        nodes.append(p)
        await p.ready()
        say(f"replication: filling the primary to {args.resync_mb} MB of page groups")
        fill = await p.control("fill", mb=args.resync_mb, max_s=600, timeout=660)
        scan = await p.control("scan", timeout=300)
        out["fill"] = fill
        out["store"] = scan
        out["primary_dir_mb"] = _du(tmp / "primary") / MB
        say(
            f"replication: {fill['groups']} groups in {fill['seconds']:.1f}s "
            f"({fill['groups'] / fill['seconds']:.0f}/s); replicated data {scan['mb']:.0f} MB in "
            f"{scan['keys']} keys, {out['primary_dir_mb']:.0f} MB on disk with the backlog"
        )
        rate = args.writer_rate
        say(
            f"replication: idle baseline, paced writer {rate:.0f} groups/s for {args.idle_seconds}s"
        )
        await p.control("paced_start", rate=rate, max_s=args.idle_seconds + 60)
        await asyncio.sleep(args.idle_seconds)
        idle = await p.control("paced_stop", timeout=60)
        out["writer_idle"] = idle

        say("replication: a fresh standby joins (full resync) while the paced writer runs")
        await p.control("paced_start", rate=rate, max_s=600)
        o_launch = int((await p.control("status"))["offset"])
        t_launch = time.monotonic()
        standby = _start_standby("standby-resync", tmp / "s-resync", conf, driver.addr)
        s = Node(standby)
        nodes.append(s)
        sampler = Sampler([p, s]).start()
        try:
            await until(lambda: _applied(s, o_launch), "the snapshot to be installed", 300)
            t_installed = time.monotonic()

            async def caught_up() -> bool:
                a, b = await asyncio.gather(p.role(), s.role())
                return int(b.applied_offset) >= int(a.applied_offset) - 1

            await until(caught_up, "the standby to catch up", 120)
            t_caught = time.monotonic()
        finally:
            during = await p.control("paced_stop", timeout=60)
            samples = await sampler.stop()
        st = await p.control("status")
        final = int(st["offset"])
        await until(lambda: _applied(s, final), f"standby to apply {final}", 60)
        hello = [t for t, msg in st["hellos"] if "Full" in msg and t >= t_launch]
        t_hello = hello[0] if hello else float("nan")
        resync_s = t_installed - t_hello
        out.update(
            offset_at_launch=o_launch,
            standby_start_to_hello_s=t_hello - t_launch,
            hello_to_installed_s=resync_s,
            launch_to_installed_s=t_installed - t_launch,
            launch_to_caught_up_s=t_caught - t_launch,
            resync_mb_per_s=scan["mb"] / resync_s,
            writer_during_resync=during,
            full_resyncs=st["full_resyncs"],
            standby_dir_mb=_du(tmp / "s-resync") / MB,
            lag_during=lag_stats(samples, t_installed, t_caught),
        )
        say(
            f"replication: resync of {scan['mb']:.0f} MB in {resync_s:.2f}s "
            f"({out['resync_mb_per_s']:.1f} MB/s); caught up {t_caught - t_installed:.2f}s later; "
            f"writer p99 {during['tick_to_commit_ms']['p99']:.1f} ms vs idle "
            f"{idle['tick_to_commit_ms']['p99']:.1f} ms"
        )
        out["promote"] = await measure_promote(s, site_url, conf)
    finally:
        for n in nodes:
            await n.close()
        stop(standby)
        stop(driver)
    return out


# ============================================================================ the section


def run(args: argparse.Namespace) -> None:
    parts = [x.strip() for x in args.repl_parts.split(",") if x.strip()]
    bad = sorted(set(parts) - set(PARTS))
    if bad or not parts:
        raise SystemExit(f"--repl-parts: unknown {bad}; choose from {','.join(PARTS)}")
    if args.seconds <= 0 or args.seconds > 120 or not 1 <= args.resync_mb <= 4096:
        raise SystemExit("need 0 < --seconds <= 120 and 1 <= --resync-mb <= 4096")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    if load_before > 0.5:
        say(f"replication: note: 1-min load average is {load_before:.2f}; figures may be noisy")
    results: dict[str, Any] = {}
    t_start = time.monotonic()
    gen = PageGen()
    if "raw" in parts:
        say(f"replication: raw rocksdict WriteBatch, page-shaped groups, {args.raw_seconds}s each")
        results["raw_rocksdb"] = [
            raw_rocksdb(args.raw_seconds, with_entry, gen) for with_entry in (False, True)
        ]
        for r in results["raw_rocksdb"]:
            say(
                f"replication: rocksdict ({r['variant']}): {r['commits_per_s']:.0f} commits/s, "
                f"{r['ops_per_s']:.0f} ops/s, {r['mb_per_s']:.0f} MB/s"
            )
        say(f"replication: raw grpc.aio bidi stream on loopback, {args.raw_seconds}s")
        results["raw_stream"] = asyncio.run(raw_stream(args.raw_seconds, gen))
        r = results["raw_stream"]
        say(
            f"replication: raw stream: {r['messages_per_s']:.0f} msg/s, "
            f"{r['entries_per_s']:.0f} entries/s, {r['mb_per_s']:.0f} MB/s"
        )
    with tempfile.TemporaryDirectory(prefix="bench-repl-") as tmpname:
        tmp = Path(tmpname)
        for part in PARTS:
            (tmp / part).mkdir()
        if "throughput" in parts:
            results["throughput"] = asyncio.run(part_throughput(args, tmp / "throughput"))
        if "crawl" in parts or "resync" in parts:
            from bench.crawl import warm_page_cache
            from bench.nginx import Nginx
            from bench.tools import DJANGO_DOC_PACKAGE, django_docs_root, ensure_apt

            ensure_apt(["nginx", DJANGO_DOC_PACKAGE])
            docs = django_docs_root()
            warm_page_cache(docs)
            with Nginx(docs) as site:
                if "crawl" in parts:
                    results["crawl"] = asyncio.run(
                        part_crawl(args, site.url, tmp / "crawl", site.proc.pid if site.proc else 0)
                    )
                if "resync" in parts:
                    results["resync"] = asyncio.run(part_resync(args, site.url, tmp / "resync"))
    results["total_seconds"] = time.monotonic() - t_start
    report = build_report(args, results, load_before)
    from bench.common import write_json

    write_json(OUT_DIR / "replication.json", report["json"])
    (OUT_DIR / "replication.md").write_text(report["markdown"] + "\n")
    print(report["markdown"], flush=True)
    say(f"replication: wrote {OUT_DIR / 'replication.md'} and {OUT_DIR / 'replication.json'}")


# ============================================================================ report


def _f(x: Any, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "n/a"
    return f"{float(x):,.{digits}f}".replace(",", "")


def _goal(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**missed**")


def build_report(
    args: argparse.Namespace, res: dict[str, Any], load_before: float
) -> dict[str, Any]:
    facts = {**machine_facts(), "loadavg_1m_before": load_before}
    command = shlex.join([".venv/bin/python", "-m", "bench.run", *sys.argv[1:]])
    rows: list[list[str]] = []
    goals: list[list[str]] = []
    raw_stream_eps = None
    if "raw_rocksdb" in res:
        for r in res["raw_rocksdb"]:
            rows.append(
                [
                    f"raw rocksdict WriteBatch ({r['variant']})",
                    f"{_f(r['commits_per_s'])} commits/s, {_f(r['ops_per_s'])} ops/s, "
                    f"{_f(r['mb_per_s'])} MB/s",
                    "",
                    "",
                ]
            )
    if "raw_stream" in res:
        r = res["raw_stream"]
        raw_stream_eps = float(r["entries_per_s"])
        rows.append(
            [
                "raw grpc.aio bidi stream (loopback, ~1 MB batches)",
                f"{_f(r['messages_per_s'])} msg/s, {_f(r['entries_per_s'])} entries/s "
                f"({_f(r['ops_per_s'])} ops/s), {_f(r['mb_per_s'])} MB/s",
                "",
                "",
            ]
        )
    if "throughput" in res:
        t = res["throughput"]
        rocks = {r["variant"]: r for r in res.get("raw_rocksdb", [])}
        full = rocks.get("data + log entry", {}).get("commits_per_s")
        ope = float(t["ops_per_entry"])
        alone = float(t["writer_alone_groups_per_s"])
        attached = float(t["writer_groups_per_s"])
        rows.append(
            [
                "primary write path, no standby (Log.write on the event loop)",
                f"{_f(alone)} groups/s, {_f(alone * ope)} ops/s",
                "raw rocksdict (data + log entry)",
                _f(alone / full, 3) if full else "n/a",
            ]
        )
        rows.append(
            [
                f"primary write path, standby attached ({args.seconds:.0f}s burst)",
                f"{_f(attached)} groups/s, {_f(attached * ope)} ops/s",
                "no standby",
                _f(attached / alone, 3) if alone else "n/a",
            ]
        )
        live = float(t["replicated_entries_per_s_live"])
        rows.append(
            [
                "replicated during that burst (standby applied)",
                f"{_f(live)} entries/s, {_f(live * ope)} ops/s",
                "raw stream entries/s",
                _f(live / raw_stream_eps, 3) if raw_stream_eps else "n/a",
            ]
        )
        cu = t["catchup"]
        catch = float(cu["entries_per_s"])
        wa = t["writer_alone"]
        mb_per_entry = float(wa["data_mb"]) / max(1, int(wa["groups"]))
        rows.append(
            [
                f"replicated, catch-up by continue ({cu['entries']} entries, no writer)",
                f"{_f(catch)} entries/s, {_f(catch * ope)} ops/s, ~{_f(catch * mb_per_entry)} MB/s",
                "raw stream entries/s",
                _f(catch / raw_stream_eps, 3) if raw_stream_eps else "n/a",
            ]
        )
        cl, cc = t["cpu_us_per_entry_live"], cu["cpu_us_per_entry"]
        rows.append(
            [
                "CPU per entry (µs): primary / standby",
                f"writer alone {_f(wa['cpu_us_per_group'])} / -; burst attached "
                f"{_f(cl['primary'])} / {_f(cl['standby'])}; catch-up {_f(cc['primary'])} / "
                f"{_f(cc['standby'])}",
                "",
                "",
            ]
        )
        lag = t["lag_during_burst"]
        rows.append(
            [
                "lag during the burst (writer at max rate)",
                f"p50 {_f(lag['lag_ms']['p50'])} ms / p99 {_f(lag['lag_ms']['p99'])} ms; "
                f"p50 {_f(lag['lag_offsets']['p50'])} / p99 {_f(lag['lag_offsets']['p99'])} "
                f"offsets; {t['lag_at_burst_end']} behind at the end, drained in "
                f"{_f(t['drain_seconds'], 2)}s",
                "",
                "",
            ]
        )
        best = max(live, catch)
        if raw_stream_eps:
            ratio = best / raw_stream_eps
            goals.append(
                [
                    "replicated ops/s >= 50% of the raw stream",
                    f"{_f(best * ope)} vs {_f(raw_stream_eps * ope)} ops/s",
                    _f(ratio, 3),
                    _goal(ratio >= 0.5),
                ]
            )
            data_only = rocks.get("data keys", {}).get("commits_per_s")
            if data_only:
                # No standby can apply faster than its storage engine writes the data.
                goals.append(
                    [
                        "(the ceiling of that goal here: raw rocksdict, data keys only, "
                        "vs the raw stream)",
                        f"{_f(data_only * ope)} vs {_f(raw_stream_eps * ope)} ops/s",
                        _f(data_only / raw_stream_eps, 3),
                        "",
                    ]
                )
        if full:
            goals.append(
                [
                    "(restated) replicated ops/s >= 50% of raw rocksdict with the log copy",
                    f"{_f(best * ope)} vs {_f(full * ope)} ops/s",
                    _f(best / full, 3),
                    _goal(best / full >= 0.5),
                ]
            )
    if "crawl" in res:
        c = res["crawl"]
        a, w = c["median"]["alone"], c["median"]["with_standby"]
        lag = c["lag_median_run"]
        rows.append(
            [
                f"crawl pages/s without standby (median of {len(c['runs']['alone'])})",
                f"{_f(a['pages_per_s'], 1)} ({a['pages']} pages in {_f(a['wall_s'], 2)}s)",
                "",
                "",
            ]
        )
        rows.append(
            [
                f"crawl pages/s with standby (median of {len(c['runs']['with_standby'])})",
                f"{_f(w['pages_per_s'], 1)} ({w['pages']} pages in {_f(w['wall_s'], 2)}s)",
                "without standby",
                _f(c["with_over_alone"], 3),
            ]
        )
        ca, cw = a["cpu_s"], w["cpu_s"]
        rows.append(
            [
                "crawl CPU s (median runs): primary + extract workers, standby",
                f"alone {_f(ca['primary'], 2)} + {_f(ca['primary_workers'], 2)}; with standby "
                f"{_f(cw['primary'], 2)} + {_f(cw['primary_workers'], 2)}, standby "
                f"{_f(cw['standby'], 2)} ({_f(cw['standby'] / max(1, w['final_offset']) * 1e6)} "
                "µs/entry)",
                "",
                "",
            ]
        )
        rows.append(
            [
                "lag during the crawl (median run)",
                f"p50 {_f(lag['lag_ms']['p50'])} ms / p99 {_f(lag['lag_ms']['p99'])} ms; "
                f"p50 {_f(lag['lag_offsets']['p50'])} / p99 {_f(lag['lag_offsets']['p99'])} "
                f"offsets ({lag['offsets_measured']} offsets, sampled every "
                f"{_f(lag['sample_period_ms_p50'])} ms)",
                "",
                "",
            ]
        )
        goals.append(
            [
                "steady lag p99 < 100 ms at crawl load",
                f"{_f(lag['lag_ms']['p99'])} ms (worst run {_f(c['lag_worst_p99_ms'])} ms)",
                "",
                _goal(lag["lag_ms"]["p99"] < 100),
            ]
        )
        goals.append(
            [
                "crawl with standby >= 90% of without",
                f"{_f(w['pages_per_s'], 1)} vs {_f(a['pages_per_s'], 1)} pages/s",
                _f(c["with_over_alone"], 3),
                _goal(c["with_over_alone"] >= 0.9),
            ]
        )
        if c.get("promote"):
            pr = c["promote"]
            rows.append(
                [
                    f"promote after a crawl (offset {pr['applied_offset']})",
                    f"Promote {_f(pr['promote_rpc_ms'], 1)} ms; first write accepted at "
                    f"{_f(pr['first_write_ms'], 1)} ms",
                    "",
                    "",
                ]
            )
    if "resync" in res:
        r = res["resync"]
        rows.append(
            [
                f"full resync of {_f(r['store']['mb'])} MB ({r['store']['keys']} keys)",
                f"{_f(r['resync_mb_per_s'], 1)} MB/s ({_f(r['hello_to_installed_s'], 2)}s from "
                f"the decision to the installed snapshot; caught up "
                f"{_f(r['launch_to_caught_up_s'], 2)}s after the standby's launch)",
                "",
                "",
            ]
        )
        wi = r["writer_idle"]["tick_to_commit_ms"]
        wd = r["writer_during_resync"]["tick_to_commit_ms"]
        ci = r["writer_idle"]["write_call_ms"]
        cd = r["writer_during_resync"]["write_call_ms"]
        rows.append(
            [
                f"writer latency p99 at {_f(args.writer_rate)} groups/s, during resync",
                f"{_f(wd['p99'], 2)} ms tick-to-commit ({_f(cd['p99'], 2)} ms in the write call); "
                f"max {_f(wd['max'], 1)} ms",
                f"idle: {_f(wi['p99'], 2)} ms ({_f(ci['p99'], 2)} ms)",
                _f(wd["p99"] / wi["p99"], 2) if wi["p99"] else "n/a",
            ]
        )
        pr = r["promote"]
        rows.append(
            [
                f"promote after the resync (offset {pr['applied_offset']})",
                f"Promote {_f(pr['promote_rpc_ms'], 1)} ms; first write accepted at "
                f"{_f(pr['first_write_ms'], 1)} ms",
                "",
                "",
            ]
        )
    md = [
        "## Replication",
        "",
        markdown_table(["measure", "figure", "compared with", "ratio"], rows),
        "",
    ]
    if goals:
        md += [
            "Goals (issue point 13):",
            "",
            markdown_table(["goal", "measured", "ratio", "verdict"], goals),
            "",
        ]
    md += [
        "Page group = 1 list push of ~16 KB + 1 set insert + 5 seen inserts + 5 frontier pushes "
        f"({OPS_PER_GROUP} ops). Raw stream: two processes, ~1 MB messages of payloads sized like "
        "serialized page-group LogEntry messages, one ack per message. Replicated figures: a "
        "primary driver process running the real write path, Log and ReplicationServicer, and "
        "a `pagesift serve --role standby`; offsets from AdminService.Role sampled every 20 ms. "
        "Lag ms = for each offset, first sampling round the standby had it minus first round "
        "the primary had it (resolution one round). Writer latency: paced writer on the "
        "primary's event loop; tick-to-commit includes waiting for the loop.",
        "",
        f"Machine: {facts['nproc']} CPUs ({facts['cpu_model']}), {facts['mem_total_gb']} GB, "
        f"Linux {facts['kernel']}, Python {facts['python']}; {facts['date']}; load average "
        f"{load_before:.2f} before the run; section took {_f(res['total_seconds'])}s.",
        "",
        f"Command: `{command}`",
    ]
    data = {
        "section": "replication",
        "command": command,
        "machine": facts,
        "args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str)},
        "results": res,
    }
    return {"json": data, "markdown": "\n".join(md)}


# ============================================================================ helper processes


def _main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "raw-server":
        asyncio.run(_raw_server(argv[1]))
        return 0
    if len(argv) >= 3 and argv[0] == "primary":
        backlog = int(argv[3]) if len(argv) > 3 else 512
        asyncio.run(_driver_main(argv[1], Path(argv[2]), backlog))
        return 0
    print("usage: python -m bench.replication raw-server ADDR | primary ADDR DATA [BACKLOG_MB]")
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
