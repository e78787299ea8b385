"""Shared test plumbing: bounded waits, free ports, in-process nodes, server
subprocesses (``ServeProc``, on the drill's and the bench's launcher,
``pagesift.core.util.children``), accounts files, a webhook receiver, metrics scrapes, admin
RPCs and test certificates. Test modules import from here, from the small modules
beside it (``fakeengine``, ``importscan``, ``pdfmaker``, ``hostile``) and get fixtures
from ``conftest.py``; two reuse another test module's pieces (``test_freshness`` the
pair of ``test_failover``, ``test_install_replay`` the Dockerfile reader of
``test_deploy_kit``).

Everything listens on 127.0.0.1 only; every wait is bounded in time.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp
import grpc
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from prometheus_client.parser import text_string_to_metric_families

from pagesift.core.api import tls
from pagesift.core.api.metrics import Metrics
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.accounts import hash_key
from pagesift.core.util.children import Child, serve_argv
from pagesift.core.util.children import free_port as free_port
from pagesift.demo.site import CALENDAR_EXCLUDE, normalize_url
from pagesift.node import grpcserver
from pagesift.node.node import Node, http_engine
from pagesift.primary.engine.http import HttpEngine
from pagesift.primary.engine.interface import Engine
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.primary.webhooks import outbox
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc, replication_pb2_grpc
from pagesift.v1 import replication_pb2 as rpb

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]

TERMINAL = {
    jobs_pb2.JOB_STATE_COMPLETED,
    jobs_pb2.JOB_STATE_FAILED,
    jobs_pb2.JOB_STATE_CANCELLED,
}


def _pair_token_file() -> Path:
    """One replication token for every pair this test run starts (the file outlives
    the server processes that read it, and is removed at exit)."""
    folder = Path(tempfile.mkdtemp(prefix="pagesift-test-token-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "replication.token"
    tls.write_new_token(path)
    return path


PAIR_TOKEN_FILE = _pair_token_file()
PAIR_TOKEN = PAIR_TOKEN_FILE.read_text().strip()
#: Promote's credential on nodes without an [admin] key: the pair's token as the key.
PROMOTE_MD = (("authorization", f"Bearer {PAIR_TOKEN}"),)


# ---------------------------------------------------------------- bounded waits


async def eventually(
    check: Callable[[], Awaitable[T | None]], what: str, timeout: float = 30.0
) -> T:
    """``await check()`` until it returns something other than None, and return that;
    an AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


async def until(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll the synchronous ``cond()`` until it is true; bounded like ``eventually``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------- ports and nodes


@dataclass
class RunningNode:
    address: str
    channel: grpc.aio.Channel
    stub: jobs_pb2_grpc.JobServiceAsyncStub
    config: ServerConfig
    node: Node


# Retries stay on, one per page with a short backoff: the demo site's 500 page and its
# slow page (past read_timeout) are transient failures, retried in every crawl of it
# (tests/test_retries.py tests the defaults and the budgets).
QUICK_RETRIES: dict[str, Any] = {
    "max_retries": 1,
    "retry_base_delay": 0.02,
    "retry_max_delay": 0.1,
}


def node_config(data: Path, **overrides: Any) -> ServerConfig:
    values: dict[str, Any] = {
        "listen": f"127.0.0.1:{free_port()}",
        "data": data,
        "allow_private_networks": True,
        "read_timeout": 1.0,
        "connect_timeout": 1.0,
        "max_body_bytes": 1024 * 1024,
        "replication_token_file": str(PAIR_TOKEN_FILE),
        # no 64 MiB reserve file in each of the suite's data directories (tests/conftest.py
        # says the same to ``pagesift serve`` children; tests/test_disk_full.py sets one)
        "storage_reserve_bytes": 0,
        **QUICK_RETRIES,
    }
    values.update(overrides)
    return ServerConfig(**values)


@contextlib.asynccontextmanager
async def in_process_node(
    data: Path, *, engine: Engine | None = None, **overrides: Any
) -> AsyncIterator[RunningNode]:
    """A real node (gRPC server + store + engine) inside the test's event loop. Its jobs
    fetch with an ``HttpEngine``, or with ``engine`` when given (``tests/fakeengine.py``:
    for a test about what the job runtime does with pages, not about fetching)."""
    config = node_config(data, **overrides)
    stop = asyncio.Event()
    started: asyncio.Future[Node] = asyncio.get_running_loop().create_future()
    factory = http_engine if engine is None else (lambda _config, _metrics: engine)
    task = asyncio.create_task(grpcserver.run(config, stop, started, factory))
    channel = grpc.aio.insecure_channel(config.listen)
    try:
        node = await asyncio.wait_for(asyncio.shield(started), 10)
        await asyncio.wait_for(channel.channel_ready(), 10)
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        yield RunningNode(config.listen, channel, stub, config, node)
    finally:
        await channel.close(None)
        stop.set()
        await asyncio.wait_for(task, 15)


async def wait_terminal(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str, timeout: float = 60.0
) -> jobs_pb2.GetJobResponse:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp = await stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, limit=1))
        if resp.state in TERMINAL:
            return resp
        await asyncio.sleep(0.05)
    raise TimeoutError(f"job {job_id} did not finish in {timeout} s")


async def wait_done(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str, md: Metadata = (), timeout: float = 30
) -> jobs_pb2.GetJobResponse:
    """The job once it is in a terminal state (with ``md`` as the caller's credential)."""

    async def check() -> jobs_pb2.GetJobResponse | None:
        resp = await stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, limit=1), metadata=md)
        return resp if resp.state in TERMINAL else None

    return await eventually(check, f"job {job_id} to finish", timeout)


async def documents(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str, md: Metadata = ()
) -> list[jobs_pb2.Document]:
    """Every document of the job, page after page (with ``md`` as the credential)."""
    docs: list[jobs_pb2.Document] = []
    skip = 0
    for _ in range(1000):
        resp = await stub.GetJob(
            jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=100), metadata=md
        )
        docs.extend(resp.documents)
        if not resp.HasField("next_skip") or resp.next_skip == skip:
            break
        skip = resp.next_skip
    return docs


@dataclass(frozen=True)
class SiteSpec:
    """``build_site`` arguments: how many pages, how slow ``slow.html``, how big
    ``big.html``."""

    pages: int = 40
    slow_seconds: float = 1.2
    big_bytes: int = 2 * 1024 * 1024


def crawl(root: str, **kw: Any) -> jobs_pb2.StartCrawlRequest:
    """A crawl of the demo site that skips its endless calendar."""
    return jobs_pb2.StartCrawlRequest(url=root, exclude_paths=[CALENDAR_EXCLUDE], **kw)


async def all_documents(
    stub: jobs_pb2_grpc.JobServiceAsyncStub, job_id: str
) -> list[jobs_pb2.Document]:
    docs: list[jobs_pb2.Document] = []
    skip = 0
    for _ in range(10_000):
        resp = await stub.GetJob(jobs_pb2.GetJobRequest(id=job_id, skip=skip, limit=100))
        docs.extend(resp.documents)
        if not resp.HasField("next_skip") or resp.next_skip == skip:
            break
        skip = resp.next_skip
    return docs


def start_server_process(config_args: list[str], log: Path, wrapper: Sequence[str] = ()) -> Child:
    """``pagesift serve`` as a real child process (``pagesift.core.util.children``: its own
    process group, output appended to ``log``), started; ``wrapper`` is a command that
    execs it (``unshare --time --monotonic N``: its own clock)."""
    argv = [*wrapper, *serve_argv(*config_args)]
    child = Child(log.stem, argv, log, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    child.start()
    return child


#: Reconnect every 50-200 ms while a server starts: gRPC's default backoff (1 s, then
#: growing) would make each wait up to a second or two longer than the startup itself.
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 200),
]


async def wait_ready(address: str, timeout: float = 20.0) -> None:
    async with grpc.aio.insecure_channel(address, options=FAST_RECONNECT) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout)


# ---------------------------------------------------------------- server processes

SERVE_CONFIG: dict[str, Any] = {
    **QUICK_RETRIES,
    "read_timeout": 1.0,
    "connect_timeout": 1.0,
    "max_body_bytes": 1024 * 1024,
    "extract_processes": 1,  # two cores for two nodes, the site and the test
    "replication_token_file": str(PAIR_TOKEN_FILE),
}


def _toml(values: Mapping[str, Any]) -> str:
    lines = ["[server]"]
    for key, value in values.items():
        lines.append(f"{key} = {json.dumps(value)}")  # ints, floats, bools, strings
    return "\n".join(lines) + "\n"


class ServeProc:
    """One ``pagesift serve`` child that can be SIGKILLed, stopped and restarted.

    Its data directory, log and TOML file are ``tmp/name``, ``tmp/name.log`` and
    ``tmp/name.toml``; the ``[server]`` table is ``base`` updated with ``config``
    (``base={}`` for exactly ``config``), kept as ``settings``.
    """

    def __init__(
        self,
        tmp: Path,
        name: str,
        *,
        role: str = "primary",
        primary: str = "",
        config: Mapping[str, Any] | None = None,
        extra: tuple[str, ...] = (),
        base: Mapping[str, Any] = SERVE_CONFIG,
        wrapper: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.wrapper = list(wrapper)
        self.address = f"127.0.0.1:{free_port()}"
        self.data = tmp / name
        self.log = tmp / f"{name}.log"
        self.config = tmp / f"{name}.toml"
        self.settings: dict[str, Any] = {**base, **(config or {})}
        self.config.write_text(_toml(self.settings))
        self.role = role
        self.primary = primary
        self.extra = list(extra)
        self.child: Child | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The ``pagesift serve`` process (its pid, ``terminate``, ``wait``)."""
        return self.child.proc if self.child is not None else None

    def args(self) -> list[str]:
        out = ["--listen", self.address, "--data", str(self.data)]
        if self.role:  # "" with a witness: the lease decides
            out += ["--role", self.role]
        if self.role == "standby":
            out += ["--primary", self.primary]
        return [*out, "--allow-private-networks", "--config", str(self.config), *self.extra]

    def launch(self, *, role: str | None = None, primary: str | None = None) -> None:
        """Start the child and return at once (a standby starts following before it
        serves: ``start`` would miss what happens meanwhile)."""
        self.role = role or self.role
        self.primary = primary if primary is not None else self.primary
        self.stop()
        self.child = start_server_process(self.args(), self.log, self.wrapper)

    async def start(self, *, role: str | None = None, primary: str | None = None) -> None:
        self.launch(role=role, primary=primary)
        await wait_ready(self.address)

    def kill(self) -> None:
        """SIGKILL the node process: no handler runs, nothing is flushed but what is
        already durable; its extraction workers are left to notice, as after a crash."""
        assert self.child is not None, f"{self.name} was never started"
        self.child.crash(timeout=10)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """SIGSTOP for the block, SIGCONT after: alive but unreachable (a partition
        from every peer at once), with its sockets open."""
        assert self.child is not None, f"{self.name} was never started"
        with self.child.frozen():
            yield

    def stop(self) -> None:
        """SIGTERM the node (it stops its own workers), SIGKILL its group after 10 s."""
        if self.child is not None:
            self.child.stop(10.0, term_group=False)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


NodeFactory = Callable[..., ServeProc]


class EngineMaker(Protocol):
    """The ``make_engine`` fixture: ``await make(config, ...)`` builds an ``HttpEngine`` from
    the class's arguments on the running loop (its name resolver binds to it); the fixture
    closes every engine it made when the test ends."""

    async def __call__(
        self,
        config: ServerConfig,
        *,
        metrics: Metrics | None = None,
        guard: AddressGuard | None = None,
        resolver: AbstractResolver | None = None,
    ) -> HttpEngine: ...


@contextlib.contextmanager
def serve_procs(tmp: Path) -> Iterator[NodeFactory]:
    """Makes ``ServeProc``\\ s (``make(name, **kwargs)``); every one is stopped at the
    end, whatever happened. The body of the ``nodes`` fixture (``conftest.py``)."""
    made: list[ServeProc] = []

    def make(name: str, **kwargs: Any) -> ServeProc:
        node = ServeProc(tmp, name, **kwargs)
        made.append(node)
        return node

    try:
        yield make
    finally:
        for node in made:  # all at once: each may wait for its grace period
            if node.child is not None:
                node.child.terminate()
        for node in made:
            node.stop()


# ---------------------------------------------------------------- RPCs by address

UNLIMITED = [("grpc.max_receive_message_length", -1)]


def admin(channel: grpc.aio.Channel) -> replication_pb2_grpc.AdminServiceAsyncStub:
    return replication_pb2_grpc.AdminServiceStub(channel)


async def role(address: str, md: Metadata = ()) -> rpb.RoleResponse:
    async with grpc.aio.insecure_channel(address) as ch:
        resp: rpb.RoleResponse = await admin(ch).Role(rpb.RoleRequest(), metadata=md, timeout=5)
        return resp


async def get_job(address: str, job_id: str) -> jobs_pb2.GetJobResponse:
    # limit=1 still returns one document, and a document can be a 12 MB page
    async with grpc.aio.insecure_channel(address, options=UNLIMITED) as ch:
        stub = jobs_pb2_grpc.JobServiceStub(ch)
        resp: jobs_pb2.GetJobResponse = await stub.GetJob(
            jobs_pb2.GetJobRequest(id=job_id, limit=1), timeout=5
        )
        return resp


async def pages_done(address: str, job_id: str, at_least: int) -> int | None:
    """The pages the node at ``address`` has finished of the job (done or failed) once
    they are ``at_least``; None before, also while the job is not there yet (a standby
    the job has not been replicated to)."""
    try:
        job = await get_job(address, job_id)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise
    done = job.completed + job.failed
    return done if done >= at_least else None


async def finished(address: str, job_id: str, timeout: float = 60.0) -> jobs_pb2.GetJobResponse:
    """The job on the node at ``address`` once it is in a terminal state."""

    async def check() -> jobs_pb2.GetJobResponse | None:
        job = await get_job(address, job_id)
        return job if job.state in TERMINAL else None

    return await eventually(check, f"job {job_id} to finish on {address}", timeout)


# ---------------------------------------------------------------- accounts


@dataclass(frozen=True)
class Acct:
    """One account of the test accounts file; its API key is derived from its name."""

    name: str
    limits: dict[str, int] = field(default_factory=dict)
    secret: str = ""

    @property
    def key(self) -> str:
        return f"psk_test_{self.name}_0123456789"

    @property
    def md(self) -> Metadata:
        return (("authorization", f"Bearer {self.key}"),)


ADMIN_KEY = "psk_test_admin_0123456789"
ADMIN_MD: Metadata = (("authorization", f"Bearer {ADMIN_KEY}"),)
ALICE = Acct("alice", secret="alice-webhook-secret-0123456789")
BOB = Acct("bob", secret="bob-webhook-secret-0123456789abc")
SOLO = Acct("solo", {"max_concurrent_jobs": 1})
DAILY = Acct("daily", {"pages_per_day": 10})
SMALL = Acct("small", {"max_batch_urls": 3, "max_crawl_limit": 5})
NOSECRET = Acct("nosecret")
ACCOUNTS = (ALICE, BOB, SOLO, DAILY, SMALL, NOSECRET)


def write_accounts(
    path: Path, accounts: Sequence[Acct] = ACCOUNTS, admin_key: str | None = ADMIN_KEY
) -> Path:
    """An accounts file: only key hashes, as in production."""
    lines: list[str] = []
    if admin_key is not None:
        lines += ["[admin]", f'key_sha256 = "{hash_key(admin_key)}"', ""]
    for a in accounts:
        lines += ["[[account]]", f'name = "{a.name}"', f'key_sha256 = "{hash_key(a.key)}"']
        lines += [f"{k} = {v}" for k, v in a.limits.items()]
        if a.secret:
            lines.append(f'webhook_secret = "{a.secret}"')
        lines.append("")
    path.write_text("\n".join(lines))
    return path


# ---------------------------------------------------------------- a webhook receiver


@dataclass
class Hit:
    """One POST the receiver got."""

    job: str
    seq: int
    event: str
    data: dict[str, Any]
    signed: bool  # the signature verifies with the account's secret
    headers_ok: bool  # pagesift-event / pagesift-delivery match the body
    body: bytes
    timestamp: str
    signature: str
    status: int = 0  # what the receiver answered (0: no answer, e.g. the sender died)


Respond = Callable[[Hit], Awaitable[int]]


async def always_ok(hit: Hit) -> int:
    return 200


class Receiver:
    """An aiohttp webhook receiver on 127.0.0.1 that records every delivery."""

    def __init__(self, secret: str, respond: Respond = always_ok) -> None:
        self.secret = secret
        self.respond = respond
        self.hits: list[Hit] = []  # every request, in arrival order
        self.runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        doc = json.loads(body)
        h = request.headers
        timestamp, signature = h.get("pagesift-timestamp", ""), h.get("pagesift-signature", "")
        hit = Hit(
            job=str(doc["id"]),
            seq=int(doc["seq"]),
            event=str(doc["event"]),
            data=dict(doc["data"]),
            signed=outbox.verify_signature(self.secret, timestamp, body, signature),
            headers_ok=h.get("pagesift-event") == doc["event"]
            and h.get("pagesift-delivery") == f"{doc['id']}:{doc['seq']}"
            and h.get("content-type") == "application/json",
            body=body,
            timestamp=timestamp,
            signature=signature,
        )
        self.hits.append(hit)
        hit.status = await self.respond(hit)
        return web.Response(status=hit.status)

    async def start(self, port: int = 0) -> str:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}/hook"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def of(self, job: str) -> list[Hit]:
        return [x for x in self.hits if x.job == job]

    def acked(self, job: str) -> list[int]:
        """Seqs answered 2xx, in order."""
        return [x.seq for x in self.of(job) if 200 <= x.status < 300]


def check_event_stream(hits: Sequence[Hit], n: int) -> None:
    """Every event 0..n-1 exactly once, in order, signed; started first, a terminal last."""
    assert [x.seq for x in hits] == list(range(n))
    assert all(x.signed for x in hits), "a delivery with a bad signature"
    assert all(x.headers_ok for x in hits)
    assert hits[0].event == "started"
    assert hits[-1].event in ("completed", "failed", "cancelled")
    assert all(x.event in ("page", "page_failed") for x in hits[1:-1])


# ---------------------------------------------------------------- metrics

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape_metrics(address: str) -> Samples:
    """Every sample of the metrics endpoint at ``address`` (host:port)."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://{address}/metrics") as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def metric_names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


# ---------------------------------------------------------------- certificates (openssl CLI)


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    """``d/name.pem`` and ``d/name.key``: a self-signed CA."""
    _openssl(
        d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
        "-subj", f"/CN=pagesift test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip


def make_leaf(d: Path, name: str, cn: str, ext: str, ca: str = "ca") -> None:
    """``d/name.pem`` and ``d/name.key``: a certificate for ``cn`` with the extensions
    ``ext``, signed by the CA ``d/ca.pem``."""
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
    )  # fmt: skip
    _openssl(
        d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
    )  # fmt: skip


# ---------------------------------------------------------------- page checks


def assert_every_page_once(docs: Sequence[jobs_pb2.Document], expected: set[str]) -> None:
    """Each URL once, and exactly the ``expected`` (normalized) URLs."""
    urls = [normalize_url(d.url) for d in docs]
    duplicates = sorted({u for u in urls if urls.count(u) > 1})
    assert not duplicates, f"pages in the results twice: {duplicates[:5]}"
    assert set(urls) == expected


@contextlib.asynccontextmanager
async def serve_handler(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[int]:
    """A catch-all aiohttp site (``handler`` answers every GET) on 127.0.0.1:<free
    port>; yields the port."""
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handler)
    runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- a test resolver


class MapResolver(AbstractResolver):
    """Test DNS: resolves only the names it maps (name -> IPv4 address), and remembers
    what it was asked; any other name fails like an unknown host."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in self.names:
            raise OSError(f"{host} is not a test name")
        return [
            ResolveResult(
                hostname=host, host=self.names[host], port=port, family=socket.AF_INET,
                proto=0, flags=socket.AI_NUMERICHOST,
            )
        ]  # fmt: skip

    async def close(self) -> None:
        return None


@contextlib.asynccontextmanager
async def gateway_before(addresses: Sequence[str], **app_kw: Any) -> AsyncIterator[str]:
    """An in-process gateway (``pagesift.gateway.server.run``) in front of ``addresses``
    on a free loopback port; yields its base URL and stops it afterwards."""
    from pagesift.gateway.server import run

    stop = asyncio.Event()
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run("127.0.0.1:0", addresses, stop, started, **app_kw))
    try:
        yield f"http://{await asyncio.wait_for(started, 10)}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


@dataclass
class CookieCrawl:
    """What a crawl of the hostile cookie site left: the replication log's growth over
    it, its documents and the job's notes (``GetJobErrors`` entries without a URL)."""

    grown: int
    docs: list[jobs_pb2.Document]
    notes: list[jobs_pb2.PageError]


async def crawl_cookie_site(tmp: Path, kind: str, last: int, concurrency: int) -> CookieCrawl:
    """Crawl ``/cookies/{kind}/0..last`` of ``tests.hostile.cookies`` on an in-process
    node at ``concurrency``; the crawl must complete with every page a document."""
    from tests.hostile import cookies, serve

    runner, root = await serve(cookies.ROUTES)
    try:
        async with in_process_node(tmp, extract_processes=0) as node:
            log = node.node.slot.log
            before = log.backlog_bytes
            started = await node.stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(
                    url=f"{root}cookies/{kind}/0?last={last}",
                    sitemap=jobs_pb2.SITEMAP_MODE_SKIP,
                    crawl_entire_domain=True,
                    max_concurrency=concurrency,
                )
            )
            final = await wait_terminal(node.stub, started.id, timeout=120)
            grown = log.backlog_bytes - before
            docs = await all_documents(node.stub, started.id)
            errors = await node.stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=started.id))
    finally:
        await runner.cleanup()
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert len(docs) == last + 1
    return CookieCrawl(grown, docs, [e for e in errors.errors if not e.url])


@contextlib.asynccontextmanager
async def gateway_with_accounts(data: Path) -> AsyncIterator[str]:
    """A node with ``write_accounts``' accounts under ``data`` and a gateway in front of
    it; yields the gateway's base URL."""
    accounts = write_accounts(data / "accounts.toml")
    async with (
        in_process_node(data / "node", accounts_file=str(accounts)) as node,
        gateway_before([node.address]) as base,
    ):
        yield base
