"""Section ``streams``: what a node holds for slow WatchJob readers and for one large request.

Against a real ``pagesift serve`` child (loopback only) and the bundled demo site served
by this process:

1. A batch job of ``--stream-docs`` demo articles (markdown + html + raw html, about
   10-20 KB per document) runs to completion; one full WatchJob read warms the store.
2. ``--stream-channels`` connections are opened and used once (so their cost is in the
   baseline), then ``--streams`` WatchJob streams on the finished job are spread over
   them. Each reads ONE message and then never reads again (a slow reader). Once the
   server's RSS settles, ``(RSS after - RSS before) / streams`` is the memory each such
   stream holds. The streams are then cancelled and the RSS read again.
3. A StartBatchScrape of ``--request-mb`` of URLs (long query strings on the demo site)
   is sent, the job cancelled at once, and the RSS that stays once it settles is
   reported: what a finished large request leaves behind.

RSS is ``VmRSS`` from ``/proc/<pid>/status``. Results go to ``bench/out/streams.json``
and ``bench/out/streams.md``. The account cap on streams is raised to ``--streams`` for
the run (when the server knows ``max_concurrent_streams``), so no stream is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.common import (
    LOOPBACK,
    MB,
    OUT_DIR,
    free_port,
    machine_facts,
    markdown_table,
    memory_bytes,
    say,
    start_serve,
    stop_serve,
    write_json,
)
from pagesift.core.util.tasks import cancel_and_wait

READY_TIMEOUT = 30.0
JOB_TIMEOUT = 300.0
SETTLE_TIMEOUT = 20.0
CLIENT_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * MB),
    ("grpc.max_send_message_length", 64 * MB),
    ("grpc.use_local_subchannel_pool", 1),  # one connection per channel
]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("streams section")
    g.add_argument("--streams", type=int, default=100, help="slow WatchJob streams (100)")
    g.add_argument("--stream-docs", type=int, default=1000, help="documents in the job (1000)")
    g.add_argument("--stream-channels", type=int, default=10, help="connections (10)")
    g.add_argument("--request-mb", type=float, default=16.0, help="batch request size (16)")


def run(args: argparse.Namespace) -> None:
    result = asyncio.run(_run(args))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    write_json(OUT_DIR / "streams.json", {"machine": machine_facts(), **result})
    rows = [
        ["documents in the job", result["documents"]],
        ["mean document size (KB)", f"{result['doc_kb']:.1f}"],
        ["slow streams / connections", f"{result['streams']} / {result['channels']}"],
        ["RSS before streams (MB)", f"{result['rss_before_mb']:.1f}"],
        ["RSS with streams open (MB)", f"{result['rss_streams_mb']:.1f}"],
        ["RSS growth per stream (MB)", f"{result['per_stream_mb']:.3f}"],
        ["RSS after streams closed (MB)", f"{result['rss_closed_mb']:.1f}"],
        ["documents held by the server, all streams", result["read_ahead"]],
        ["batch request size (MB)", f"{result['request_mb']:.1f}"],
        ["RSS before request (MB)", f"{result['rss_before_request_mb']:.1f}"],
        ["RSS peak during request (MB)", f"{result['rss_request_peak_mb']:.1f}"],
        ["RSS held after request (MB)", f"{result['rss_after_request_mb']:.1f}"],
        ["held by the request (MB)", f"{result['request_held_mb']:.1f}"],
    ]
    text = "# streams\n\n" + markdown_table(["measure", "value"], rows) + "\n"
    text += f"\nserver: `{result['command']}`\n"
    (OUT_DIR / "streams.md").write_text(text)
    print(text, flush=True)


def _rss_mb(pid: int) -> float:
    return memory_bytes(pid)[0] / MB


async def _settle(pid: int, timeout: float = SETTLE_TIMEOUT) -> float:
    """RSS once two readings 1 s apart differ by under 0.5 MB (or at the deadline)."""
    deadline = time.monotonic() + timeout
    last = _rss_mb(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = _rss_mb(pid)
        if abs(now - last) < 0.5:
            return now
        last = now
    return last


def _server_config(tmp: Path, streams: int) -> Path:
    from pagesift.core.config.schema import ServerConfig

    lines = ["[server]", "extract_processes = 1", "max_batch_urls = 100000"]
    known = ServerConfig.__dataclass_fields__
    if "max_concurrent_streams" in known:  # absent before the stream caps existed
        lines.append(f"max_concurrent_streams = {streams + 8}")
    if "max_total_streams" in known:
        lines.append(f"max_total_streams = {streams + 64}")
    conf = tmp / "server.toml"
    conf.write_text("\n".join(lines) + "\n")
    return conf


async def _read_ahead(metrics_url: str) -> str:
    """The server's ``pagesift_watch_documents_buffered`` gauge, if it has one."""
    import aiohttp

    try:
        async with aiohttp.ClientSession() as s, s.get(metrics_url) as r:
            body = await r.text()
    except aiohttp.ClientError:
        return "n/a"
    for line in body.splitlines():
        if line.startswith("pagesift_watch_documents_buffered "):
            return str(int(float(line.split()[1])))
    return "n/a"


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from pagesift.demo.site import build_site, serve_site
    from pagesift.v1 import jobs_pb2, jobs_pb2_grpc

    site = build_site(args.stream_docs)
    runner, root = await serve_site(site)
    articles = sorted(p for p, i in site.manifest.pages.items() if i.kind == "article")
    urls = [root.rstrip("/") + p for p in articles][: args.stream_docs]
    with tempfile.TemporaryDirectory(prefix="bench-streams-") as tmpname:
        tmp = Path(tmpname)
        target = f"{LOOPBACK}:{free_port()}"
        metrics = f"{LOOPBACK}:{free_port()}"
        serve_args = [
            "--role", "primary", "--listen", target, "--data", str(tmp / "data"),
            "--allow-private-networks", "--config", str(_server_config(tmp, args.streams)),
            "--metrics-listen", metrics,
        ]  # fmt: skip
        child = await asyncio.to_thread(
            start_serve, "pagesift server", serve_args, OUT_DIR / "streams-server.log"
        )
        assert child.proc is not None
        proc = child.proc
        channels = [
            grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS)
            for _ in range(max(1, args.stream_channels))
        ]
        calls: list[Any] = []
        try:
            stubs = [jobs_pb2_grpc.JobServiceStub(c) for c in channels]
            stub = stubs[0]
            for c in channels:
                await asyncio.wait_for(c.channel_ready(), READY_TIMEOUT)
            started = await stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(
                    urls=urls,
                    options=jobs_pb2.ScrapeOptions(
                        formats=[
                            jobs_pb2.FORMAT_MARKDOWN,
                            jobs_pb2.FORMAT_HTML,
                            jobs_pb2.FORMAT_RAW_HTML,
                        ]
                    ),
                ),
                timeout=30,
            )
            deadline = time.monotonic() + JOB_TIMEOUT
            while True:
                job = await stub.GetJob(jobs_pb2.GetJobRequest(id=started.id, status_only=True))
                if job.state not in (jobs_pb2.JOB_STATE_SCRAPING, jobs_pb2.JOB_STATE_UNSPECIFIED):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the batch job did not finish")
                await asyncio.sleep(0.5)
            say(f"job {started.id}: {job.completed} documents, {job.failed} failed")
            # warm-up: one full read, and every connection used once
            nbytes = ndocs = 0
            async for ev in stub.WatchJob(jobs_pb2.WatchJobRequest(id=started.id), timeout=120):
                if ev.HasField("document"):
                    ndocs += 1
                    nbytes += ev.document.document.ByteSize()
            for s in stubs:
                await s.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
            before = await _settle(proc.pid)
            say(f"RSS before streams: {before:.1f} MB")
            for i in range(args.streams):
                call = stubs[i % len(stubs)].WatchJob(jobs_pb2.WatchJobRequest(id=started.id))
                await asyncio.wait_for(call.read(), 30)  # started; then never read again
                calls.append(call)
            with_streams = await _settle(proc.pid)
            ahead = await _read_ahead(f"http://{metrics}/metrics")
            per_stream = (with_streams - before) / max(1, args.streams)
            say(f"RSS with {args.streams} slow streams: {with_streams:.1f} MB")
            say(f"  = {per_stream:.3f} MB per stream; documents read ahead: {ahead}")
            for call in calls:
                call.cancel()
            calls.clear()
            closed = await _settle(proc.pid)
            say(f"RSS after the streams closed: {closed:.1f} MB")

            # one large request
            pad = "x" * 1500
            per_url = len(f"{root}missing.html?n=00000&pad={pad}") + 3  # tag + length
            n = max(1, int((args.request_mb * MB - 64 * 1024) / per_url))  # under the cap
            big = jobs_pb2.StartBatchScrapeRequest(
                urls=[f"{root}missing.html?n={i}&pad={pad}" for i in range(n)]
            )
            size = big.ByteSize() / MB
            before_req = await _settle(proc.pid)
            peak = [before_req]

            async def sample() -> None:
                while True:
                    peak[0] = max(peak[0], _rss_mb(proc.pid))
                    await asyncio.sleep(0.05)

            sampler = asyncio.create_task(sample())
            try:
                resp = await stub.StartBatchScrape(big, timeout=120)
                del big
                await stub.CancelJob(jobs_pb2.CancelJobRequest(id=resp.id), timeout=30)
                await asyncio.sleep(1.0)
            finally:
                await cancel_and_wait(sampler)  # a Ctrl-C meanwhile still ends the bench
            after_req = await _settle(proc.pid)
            say(
                f"request {size:.1f} MB ({n} URLs): RSS {before_req:.1f} -> peak {peak[0]:.1f} "
                f"-> {after_req:.1f} MB held after"
            )
        finally:
            for call in calls:
                call.cancel()
            for c in channels:
                await c.close(None)
            code = await asyncio.to_thread(stop_serve, child, 20.0)
            await runner.cleanup()
            say(f"pagesift server stopped (exit {code})")
    return {
        "documents": ndocs,
        "doc_kb": nbytes / max(1, ndocs) / 1024,
        "streams": args.streams,
        "channels": len(channels),
        "rss_before_mb": before,
        "rss_streams_mb": with_streams,
        "per_stream_mb": per_stream,
        "rss_closed_mb": closed,
        "read_ahead": ahead,
        "request_mb": size,
        "request_urls": n,
        "rss_before_request_mb": before_req,
        "rss_request_peak_mb": peak[0],
        "rss_after_request_mb": after_req,
        "request_held_mb": after_req - before_req,
        "command": shlex.join(child.argv),
    }
