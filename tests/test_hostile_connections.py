"""Connection floods against real HTTP listeners (issue 28, finding 1).

A caller without a key used to take a node down through ``--http-listen``: idle TCP
connections, never closed, took every descriptor; the gRPC port stopped answering
other accounts and asyncio logged each failed ``accept()`` with a traceback (100 MB a
minute). Here a ``pagesift serve --http-listen`` child runs with RLIMIT_NOFILE lowered
to ``NODE_LIMIT`` (``prlimit``: the same exhaustion without 20,000 sockets; ``make
bench``'s ``bench.flood`` does 20,000 at the default limit) and is flooded past it with
idle and slowloris connections from many loopback addresses, at the production
defaults (header timeout 10 s, caps fitted to the descriptor budget). What must hold:

- another account's ``ListJobs`` (on a fresh channel) and ``Scrape`` are answered while
  the flood is on;
- connections past the caps are ended at once (before any timeout could act), and the
  admitted idle and slowloris ones are ended by the server within the header timeout
  and generous slack: then the server holds none (its established sockets, from
  /proc/net/tcp: the client's side also has connections the kernel completed while the
  accept queue was full, which the server never held);
- the node's open descriptors (``/proc/PID/fd``), sampled through the flood, never pass
  its baseline plus the HTTP budget its start-up line states (``descriptors: limit ... =
  N for HTTP connections``), so the reserve stays untouched;
- the node's log grows by at most ``LOG_GROWTH`` bytes.

The standalone ``pagesift gateway`` (RLIMIT_NOFILE ``GATEWAY_LIMIT``) is flooded from a
few addresses: the per-client cap keeps the flood to a share, and another client's
scrape through the gateway is answered meanwhile. The last test sets the node's
``http_*`` keys short and sees each act.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from pagesift.core.util.children import Child, serve_argv
from pagesift.demo.site import build_site, serve_site
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import ALICE, BOB, NodeFactory, ServeProc, free_port, wait_ready, write_accounts
from tests.hostile.connections import Flood, fd_count, raise_own_limit, server_established

pytestmark = pytest.mark.system

NODE_LIMIT = 4096  # the node's RLIMIT_NOFILE (soft = hard)
GATEWAY_LIMIT = 2048
HEADER_TIMEOUT = 10.0  # the default http_header_timeout / --header-timeout
AT_ONCE = 5.0  # seconds: a refusal ends the connection well before any timeout (10 s)
SLACK = 25.0  # seconds past the header timeout by which every admitted one has ended
LOG_GROWTH = 8 * 1024  # bytes the log may grow by through a whole flood
BUDGET = re.compile(
    r"descriptors: limit (\d+) - reserve (\d+) .* - accept slack (\d+) = (\d+) for HTTP connections"
)


@pytest.fixture(autouse=True)
def own_descriptors() -> None:
    if raise_own_limit() < 2 * NODE_LIMIT:
        pytest.skip("this process cannot open enough sockets for the flood")
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is needed to lower the children's RLIMIT_NOFILE")


@pytest.fixture
async def page() -> AsyncIterator[str]:
    runner, root = await serve_site(build_site(8))
    try:
        yield root
    finally:
        await runner.cleanup()


def _launch_limited(node: ServeProc, limit: int) -> None:
    """Start ``node`` under ``prlimit --nofile=limit:limit`` (prlimit execs the node)."""
    node.stop()
    argv = ["prlimit", f"--nofile={limit}:{limit}", *serve_argv(*node.args())]
    node.child = Child(node.name, argv, node.log, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    node.child.start()


@contextlib.contextmanager
def _sampling(pid: int, peaks: list[int]) -> Iterator[None]:
    """Sample ``pid``'s descriptor count every 50 ms into ``peaks[0]`` (a thread: the
    test's loop is busy with the flood)."""
    import threading

    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peaks[0] = max(peaks[0], fd_count(pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)


async def _list_jobs(address: str) -> None:
    """BOB's ListJobs on a fresh channel (a new TCP connection to the node)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        await stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=BOB.md, timeout=15)


async def _scrape(address: str, url: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        resp = await stub.Scrape(jobs_pb2.ScrapeRequest(url=url), metadata=BOB.md, timeout=30)
        assert resp.document.status_code == 200


def _assert_flood_handled(flood: Flood, cap: int, held: int) -> None:
    """``held``: the server's established connections on the port after the flood."""
    # the client's "open" ones the server never held (accept queue full) are not refusals
    unseen = flood.open_now()
    refused = flood.ended_within(AT_ONCE)
    assert refused + unseen >= flood.attempts - cap - flood.local_errors(), (
        f"{refused} of {flood.attempts} ended at once; the cap is {cap}"
    )
    assert held == 0, f"the server still holds {held} flood connections"
    lasted = [d for c in flood.opened() if (d := c.lasted()) is not None]
    assert lasted and max(lasted) < HEADER_TIMEOUT + SLACK
    assert any(c.slow and c.ended for c in flood.opened()), "no slowloris was admitted"


async def _until_ended(flood: Flood, seconds: float) -> int:
    """Wait (at most ``seconds``) until the server holds none of the flood's connections
    and the client has seen them end; how many the server still holds."""
    for _ in range(int(seconds * 2) + 1):
        if not server_established(flood.port):
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)  # the client reads the last resets
    return server_established(flood.port)


async def test_a_flood_of_idle_and_slowloris_connections_leaves_the_node_serving(
    tmp_path: Path, nodes: NodeFactory, page: str
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    http = free_port()
    node = nodes(
        "flooded",
        config={
            "accounts_file": str(accounts),
            "http_listen": f"127.0.0.1:{http}",
            "browser_executable": "",
        },
    )
    _launch_limited(node, NODE_LIMIT)
    await wait_ready(node.address)
    assert node.proc is not None
    await _scrape(node.address, page)  # warm: the engine's sessions, the worker
    await asyncio.sleep(1.0)  # the gateway is up after the gRPC port
    baseline = fd_count(node.proc.pid)
    log_before = node.log.stat().st_size
    flood = Flood("127.0.0.1", http, attempts=NODE_LIMIT + 500, slow_share=0.1, sources=30)
    peaks = [0]
    with _sampling(node.proc.pid, peaks):
        flooding = asyncio.create_task(flood.start())
        try:
            for _ in range(1200):  # at most a minute: until half the flood is on
                if len(flood.conns) >= NODE_LIMIT // 2 or flooding.done():
                    break
                await asyncio.sleep(0.05)
            # BOB is served while the flood is on (the old node: DEADLINE_EXCEEDED)
            await asyncio.gather(_list_jobs(node.address), _scrape(node.address, page))
            await flooding
            await _list_jobs(node.address)
            held = await _until_ended(flood, HEADER_TIMEOUT + SLACK)
        finally:
            await flood.close()
    text = node.log_text()
    found = BUDGET.search(text)
    assert found, "the node logs its descriptor arithmetic at start"
    limit, reserve, slack, budget = (int(g) for g in found.groups())
    assert limit == NODE_LIMIT and reserve > 0
    cap = int(re.search(r"gateway cap (\d+)", text).group(1))  # type: ignore[union-attr]
    _assert_flood_handled(flood, cap, held)
    # HTTP's descriptors (its connections and an accept turn's sockets) stay in budget
    assert peaks[0] - baseline <= budget + slack, (peaks[0], baseline, budget)
    assert peaks[0] < limit - reserve + baseline
    grown = node.log.stat().st_size - log_before
    assert grown <= LOG_GROWTH, f"the log grew by {grown} bytes:\n{text[log_before:][:3000]}"


async def test_the_standalone_gateway_keeps_a_flood_to_its_share(
    tmp_path: Path, nodes: NodeFactory, page: str
) -> None:
    accounts = write_accounts(tmp_path / "accounts.toml", (ALICE, BOB))
    node = nodes("pair", config={"accounts_file": str(accounts), "browser_executable": ""})
    await node.start()
    http = free_port()
    log = tmp_path / "gateway.log"
    gateway = Child(
        "gateway",
        [
            "prlimit", f"--nofile={GATEWAY_LIMIT}:{GATEWAY_LIMIT}",
            sys.executable, "-m", "pagesift.cli", "gateway",
            "--listen", f"127.0.0.1:{http}", "--server", node.address,
        ],
        log,
    )  # fmt: skip
    gateway.start()
    try:
        # force_close: no keep-alive of ours left on the port when the flood is counted
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True)
        ) as session:
            base = f"http://127.0.0.1:{http}"
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{base}/healthz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.1)
            assert gateway.pid is not None
            baseline = fd_count(gateway.pid)
            log_before = log.stat().st_size
            # 5 addresses: the per-client cap (256) holds the flood to 5 x 256
            flood = Flood("127.0.0.1", http, attempts=GATEWAY_LIMIT + 500, sources=5)
            peaks = [0]
            with _sampling(gateway.pid, peaks):
                try:
                    await flood.start()
                    # another client, from its own address, is served meanwhile
                    conn = aiohttp.TCPConnector(local_addr=("127.0.0.99", 0))
                    async with (
                        aiohttp.ClientSession(connector=conn) as other,
                        other.post(
                            f"{base}/v2/scrape",
                            json={"url": page},
                            headers={"Authorization": f"Bearer {BOB.key}"},
                            timeout=aiohttp.ClientTimeout(total=30),
                        ) as resp,
                    ):
                        assert resp.status == 200, await resp.text()
                    held = await _until_ended(flood, HEADER_TIMEOUT + SLACK)
                finally:
                    await flood.close()
    finally:
        gateway.stop(10.0)
    _assert_flood_handled(flood, 5 * 256, held)
    assert peaks[0] - baseline <= 5 * 256 + 2 * 128, (peaks[0], baseline)
    grown = log.stat().st_size - log_before
    assert grown <= LOG_GROWTH, f"the gateway's log grew by {grown} bytes"


async def test_the_nodes_http_keys_set_its_gateways_discipline(
    tmp_path: Path, nodes: NodeFactory
) -> None:
    http = free_port()
    node = nodes(
        "keys",
        config={
            "http_listen": f"127.0.0.1:{http}",
            "browser_executable": "",
            "http_header_timeout": 5.0,
            "http_max_connections_per_client": 2,
        },
    )
    await node.start()
    for _ in range(100):  # the gateway starts after the gRPC port
        if "Firecrawl gateway on" in node.log_text():
            break
        await asyncio.sleep(0.1)
    flood = Flood("127.0.0.1", http, attempts=3, slow_share=0, sources=1)
    try:
        await flood.start()
        assert await _until_ended(flood, 5.0 + SLACK) == 0
    finally:
        await flood.close()
    lasted = sorted(d for c in flood.conns if (d := c.lasted()) is not None)
    assert len(lasted) == 3
    assert lasted[0] < 2.5  # the third, past the per-client cap of 2: at once
    assert all(4.5 <= d < 5.0 + SLACK for d in lasted[1:])  # the header timeout, 5 s
