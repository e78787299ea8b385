"""Section ``modeljobs``: the model formats through a node — calls and tokens a page, and
what a SIGKILL mid-batch sends to the model again.

Parts, each on a fresh ``pagesift serve`` primary (anonymous mode, ``allow_model``)
whose ``model_url`` is a ``tests.modelserver.ProxyProcess`` in front of llama.cpp's
server with SmolLM2-135M (``tests.modelserver.ModelServer``; ``make model-deps``). The
pages are ``--model-pages`` small product pages served by the standard library's HTTP
server on loopback, scraped as one batch with FORMAT_JSON under a two-field schema, at
concurrency 2 (``model_concurrency`` 2):

- ``clean``: the batch runs to its end; the figures are the proxy's count of chat
  calls (every request the node sent, retries included) per page, the job's
  ``model_usage`` tokens in and out per page, pages with a valid ``json`` and wall time;
- ``sigkill``: the same batch, the node SIGKILLed once the proxy has seen
  ``--model-kill-after`` calls, restarted on the same data directory, run to its end.
  ``re-sent`` is the calls past those of ``clean`` (answers at temperature 0 are the
  same, so ``clean``'s count is what the pages need): the bound is the calls in flight
  at the kill, at most ``model_concurrency`` times (1 + ``model_retries``).

Results: ``bench/out/modeljobs.json`` and ``.md``, with the machine's load average.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from bench.common import (
    LOOPBACK,
    OUT_DIR,
    free_port,
    machine_facts,
    markdown_table,
    say,
    start_serve,
    stop_serve,
    wait_for_grpc,
    write_json,
)
from pagesift.core.util.children import Child
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.modelserver import MODEL, PRODUCT_SCHEMA, ModelServer, ProxyProcess

PAGE = (
    "<html><head><title>{name}</title></head><body><main><h1>{name}</h1>"
    "<p>The {name} costs {price} dollars and ships in {days} days.</p></main></body></html>"
)
CONCURRENCY = 2
RETRIES = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-pages", type=int, default=10, help="pages of the batch")
    parser.add_argument(
        "--model-kill-after", type=int, default=4, help="model calls before the SIGKILL"
    )


@contextlib.contextmanager
def _site(root: Path, pages: int) -> Iterator[list[str]]:
    for i in range(pages):
        name = f"Widget {i}"
        (root / f"p{i}.html").write_text(PAGE.format(name=name, price=f"{i + 1}.50", days=i % 5))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: Any) -> None:
            super().__init__(*a, directory=str(root))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        yield [f"http://{LOOPBACK}:{port}/p{i}.html" for i in range(pages)]
    finally:
        server.shutdown()
        server.server_close()


def _config(tmp: Path, model_url: str) -> Path:
    accounts = tmp / "accounts.toml"
    accounts.write_text("[anonymous]\nallow_model = true\n")
    config = tmp / "serve.toml"
    config.write_text(
        "[server]\n"
        f'accounts_file = "{accounts}"\nmodel_url = "{model_url}"\nmodel_name = "{MODEL}"\n'
        'model_response_format = "json_object"\nmodel_bypass_address_guard = true\n'
        f"model_timeout = 300.0\nmodel_concurrency = {CONCURRENCY}\n"
        f"model_retries = {RETRIES}\nrespect_robots = false\nstorage_reserve_bytes = 0\n"
    )
    return config


def _serve(tmp: Path, config: Path, target: str) -> tuple[Child, Any]:
    args = ["--role", "primary", "--listen", target, "--data", str(tmp / "data")]
    args += ["--allow-private-networks", "--config", str(config)]
    child = start_serve("pagesift server", args, tmp / "serve.log", append=True)
    assert child.proc is not None
    channel = grpc.insecure_channel(target)
    stub = jobs_pb2_grpc.JobServiceStub(channel)
    wait_for_grpc(channel, lambda: stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=2), 60)
    return child, stub


def _request(urls: list[str]) -> jobs_pb2.StartBatchScrapeRequest:
    opts = jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_JSON])
    opts.json.schema = json.dumps(PRODUCT_SCHEMA)
    opts.json.prompt = "The product's name and its price."
    return jobs_pb2.StartBatchScrapeRequest(
        urls=urls, options=opts, max_concurrency=CONCURRENCY, idempotency_key="bench"
    )


def _wait(stub: Any, job_id: str, timeout: float) -> jobs_pb2.GetJobResponse:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, limit=1000), timeout=30)
        if got.state in (jobs_pb2.JOB_STATE_COMPLETED, jobs_pb2.JOB_STATE_FAILED):
            return got  # type: ignore[no-any-return]
        time.sleep(0.5)
    raise TimeoutError(f"job {job_id} did not end within {timeout:g} s")


def _chat_calls(proxy: ProxyProcess) -> int:
    return sum(1 for r in proxy.requests() if r.get("path") == "/v1/chat/completions")


def _part(server: ModelServer, urls: list[str], kill_after: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-modeljobs-") as name:
        tmp = Path(name)
        proxy = ProxyProcess(tmp, server.url).start()
        target = f"{LOOPBACK}:{free_port()}"
        child: Child | None = None
        try:
            child, stub = _serve(tmp, _config(tmp, proxy.base_url), target)
            started = time.monotonic()
            job = stub.StartBatchScrape(_request(urls), timeout=30).id
            killed_at = None
            if kill_after is not None:
                deadline = time.monotonic() + 1800
                while _chat_calls(proxy) < kill_after and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert child.proc is not None
                child.proc.kill()
                child.proc.wait(30)
                killed_at = _chat_calls(proxy)
                say(f"modeljobs: SIGKILL after {killed_at} model calls")
                child, stub = _serve(tmp, _config(tmp, proxy.base_url), target)
            got = _wait(stub, job, 3600)
            seconds = time.monotonic() - started
            docs = list(got.documents)
            return {
                "pages": len(urls),
                "stored": len(docs),
                "valid_json": sum(1 for d in docs if d.json),
                "format_errors": sum(len(d.format_errors) for d in docs),
                "calls": _chat_calls(proxy),
                "job_calls": got.model_usage.calls,
                "input_tokens": got.model_usage.input_tokens,
                "output_tokens": got.model_usage.output_tokens,
                "killed_after_calls": killed_at,
                "seconds": seconds,
            }
        finally:
            if child is not None:
                stop_serve(child)
            proxy.stop()


def run(args: argparse.Namespace) -> None:
    pages = getattr(args, "model_pages", 10)
    kill_after = getattr(args, "model_kill_after", 4)
    with (
        tempfile.TemporaryDirectory(prefix="bench-modelsrv-") as sname,
        _site(Path(tempfile.mkdtemp(prefix="bench-modelsite-")), pages) as urls,
    ):
        server = ModelServer(Path(sname)).start()
        try:
            clean = _part(server, urls, None)
            say(f"modeljobs: clean {clean}")
            killed = _part(server, urls, kill_after)
            say(f"modeljobs: sigkill {killed}")
        finally:
            server.stop()
    resent = killed["calls"] - clean["calls"]
    bound = CONCURRENCY * (1 + RETRIES)
    rows = [
        [
            name,
            part["stored"],
            part["valid_json"],
            part["calls"],
            f"{part['calls'] / part['pages']:.2f}",
            f"{part['input_tokens'] / part['pages']:.0f}",
            f"{part['output_tokens'] / part['pages']:.0f}",
            f"{part['seconds']:.0f}",
        ]
        for name, part in (("clean", clean), ("sigkill", killed))
    ]
    table = markdown_table(
        ["run", "stored", "valid json", "model calls", "calls/page", "tokens in/page",
         "tokens out/page", "seconds"],
        rows,
    )  # fmt: skip
    summary = (
        f"re-sent across the SIGKILL: {resent} calls (bound: {bound} = model_concurrency "
        f"{CONCURRENCY} x (1 + model_retries {RETRIES})); killed after "
        f"{killed['killed_after_calls']} calls"
    )
    say(summary)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    write_json(
        OUT_DIR / "modeljobs.json",
        {"clean": clean, "sigkill": killed, "resent": resent, "bound": bound,
         "machine": machine_facts()},
    )  # fmt: skip
    (OUT_DIR / "modeljobs.md").write_text(f"{table}\n\n{summary}\n")
    if resent > bound or killed["stored"] != len(urls):
        raise AssertionError(summary)
