"""What a local drill starts: the demo site, etcd, and a pair of ``pagesift serve`` children.

Owns ``DemoSite`` (the bundled demo site served in the drill's own event loop, with
the page set a crawl of it must return), ``DrillKeys`` and the files a local pair
reads (a replication token, an accounts file with an ``[admin]`` key and one
``drill`` account whose webhook secret signs the deliveries, one ``[server]`` TOML per
node), ``Etcd`` (Debian's ``/usr/bin/etcd``, one member on loopback) and ``LocalPair``.

``LocalPair`` starts two nodes as plain ``python -m pagesift.cli serve``
children, exactly as production runs them:

- manual: ``serve --role primary|standby [--primary P] --listen A --data D --config F``;
- ``auto``: ``serve --witness etcd://127.0.0.1:P --pair NAME --witness-ttl T --listen A
  --advertise A --data D --config F``, no role (the witness's lease decides), and a
  killed node is restarted with the SAME command line.

Everything lives under one working directory the caller owns and removes; every
child is its own process group (``procs.Child``), killed with SIGKILL by ``kill`` and
stopped (TERM, then KILL) by ``close``; ports are loopback ports picked free. The
nodes allow private networks (they crawl the demo site on loopback) and nothing else
is loosened: tokens and keys are fresh random secrets of this drill.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from pagesift.core.api.tls import write_new_token
from pagesift.core.jobs.accounts import hash_key, new_key
from pagesift.core.util.children import Child, free_port, serve_argv
from pagesift.demo.site import BIG_PATH, CALENDAR_EXCLUDE, SLOW_PATH, build_site, serve_site

ETCD = "/usr/bin/etcd"
WITNESS = "witness"  # the kill target and node label of etcd
MiB = 1024 * 1024

#: the nodes' [server] table besides the files and the mode: short timeouts so the demo
#: site's slow page times out and its big page is too large, one extraction worker each
#: (two nodes, the site and the drill share the machine), fast webhook retries
NODE_SETTINGS: dict[str, Any] = {
    "allow_private_networks": True,
    "read_timeout": 1.0,
    "connect_timeout": 1.0,
    "max_body_bytes": MiB,
    "extract_processes": 1,
    "webhook_base_delay": 0.05,
    "webhook_max_delay": 0.5,
    "webhook_max_attempts": 100,
}


class SetupError(Exception):
    """Something the drill starts (or is given) did not come up: exit 2."""


# ---------------------------------------------------------------- the demo site


class DemoSite:
    """The bundled demo site on ``host`` (a free port), served by the drill's loop."""

    def __init__(self, pages: int, seed: int, host: str = "127.0.0.1") -> None:
        # /slow.html answers after 1.5 s and /files/big.html is 2 MiB: above the local
        # nodes' read timeout and body cap (either outcome is accepted for them)
        self.site = build_site(pages, seed=seed, slow_seconds=1.5, big_bytes=2 * MiB)
        self.host = host
        self.root = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        self._runner, self.root = await serve_site(self.site, host=self.host)
        return self.root

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def required(self) -> frozenset[str]:
        """Page keys a crawl of the root must return as documents."""
        return frozenset(self.site.expected_documents(self.root))

    def optional(self) -> frozenset[str]:
        """Page keys that are documents or errors depending on the nodes' limits."""
        return frozenset(self.site.url(self.root, p) for p in (SLOW_PATH, BIG_PATH))

    @property
    def exclude(self) -> list[str]:
        return [CALENDAR_EXCLUDE]

    @property
    def probe_url(self) -> str:
        return self.root + "about.html"


# ---------------------------------------------------------------- keys and files


@dataclass(frozen=True)
class DrillKeys:
    """The credentials a drill uses: its account's API key, the admin key, the
    account's webhook secret (empty: signatures are not checked)."""

    api_key: str = ""
    admin_key: str = ""
    webhook_secret: str = ""

    @classmethod
    def fresh(cls) -> DrillKeys:
        return cls(new_key(), new_key(), secrets.token_urlsafe(24))


def write_accounts(path: Path, keys: DrillKeys) -> Path:
    path.write_text(
        "[admin]\n"
        f'key_sha256 = "{hash_key(keys.admin_key)}"\n\n'
        "[[account]]\n"
        'name = "drill"\n'
        f'key_sha256 = "{hash_key(keys.api_key)}"\n'
        f'webhook_secret = "{keys.webhook_secret}"\n'
    )
    return path


def write_server_toml(path: Path, values: Mapping[str, Any]) -> Path:
    lines = ["[server]", *(f"{k} = {json.dumps(v)}" for k, v in values.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------- etcd


class Etcd:
    """One etcd member on loopback (``--kill witness`` kills it; ``start`` again
    restarts it on the same data directory)."""

    def __init__(self, workdir: Path) -> None:
        if not Path(ETCD).exists():
            raise SetupError(f"--auto needs etcd at {ETCD} (Debian: apt-get install etcd-server)")
        self.client_port, self.peer_port = free_port(), free_port()
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.child = Child(
            "etcd",
            [ETCD, "--name", "drill", "--data-dir", str(workdir / "etcd"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"drill={peer}"],
            workdir / "etcd.log",
        )  # fmt: skip
        self.health_url = f"{client}/health"

    @property
    def endpoint(self) -> str:
        return f"etcd://127.0.0.1:{self.client_port}"

    async def start(self, timeout: float = 20.0) -> None:
        self.child.start()
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as http:
            while time.monotonic() < deadline:
                if not self.child.alive:
                    raise SetupError(f"etcd exited:\n{self.child.tail()}")
                try:
                    async with http.get(self.health_url) as resp:
                        body = json.loads(await resp.text())  # served as text/plain
                        if resp.status == 200 and body.get("health") == "true":
                            return
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    pass
                await asyncio.sleep(0.1)
        raise SetupError(f"etcd not healthy after {timeout:g} s:\n{self.child.tail()}")


# ---------------------------------------------------------------- the pair


@dataclass
class LocalNode:
    name: str
    address: str
    data: Path
    config: Path
    child: Child


class LocalPair:
    """Two ``pagesift serve`` children (and etcd with ``auto``) under ``workdir``."""

    def __init__(
        self,
        workdir: Path,
        keys: DrillKeys,
        *,
        mode: str,
        auto: bool,
        witness_ttl: float,
        settings: Mapping[str, Any] = NODE_SETTINGS,
        etcd: Etcd | None = None,
        pair_name: str = "",
        cluster: str = "",
    ) -> None:
        """``etcd`` (with ``auto``): a witness shared with other pairs, which this pair
        neither starts, kills nor stops; ``cluster``: the nodes register in it as pair
        ``pair_name`` (``serve --cluster``)."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.auto = auto
        self.witness_ttl = witness_ttl
        token = workdir / "replication.token"
        write_new_token(token)
        accounts = write_accounts(workdir / "accounts.toml", keys)
        table = {
            **settings,
            "replication_mode": mode,
            "replication_token_file": str(token),
            "accounts_file": str(accounts),
        }
        self.shared_etcd = etcd is not None
        self.etcd = etcd if etcd is not None else Etcd(workdir) if auto else None
        self.pair_name = pair_name or f"drill-{secrets.token_hex(4)}"
        self.cluster = cluster
        self.nodes: dict[str, LocalNode] = {}
        for name in ("a", "b"):
            address = f"127.0.0.1:{free_port()}"
            config = write_server_toml(workdir / f"{name}.toml", table)
            child = Child(f"node {name}", [], workdir / f"{name}.log")
            self.nodes[address] = LocalNode(name, address, workdir / name, config, child)

    @property
    def addresses(self) -> list[str]:
        return list(self.nodes)

    def label(self, address: str) -> str:
        node = self.nodes.get(address)
        return f"node {node.name}" if node else address

    def _argv(self, node: LocalNode, role: str, primary: str) -> list[str]:
        argv = serve_argv()
        if self.etcd is not None:
            argv += ["--witness", self.etcd.endpoint, "--pair", self.pair_name,
                     "--witness-ttl", f"{self.witness_ttl:g}", "--listen", node.address,
                     "--advertise", node.address]  # fmt: skip
            if self.cluster:
                argv += ["--cluster", self.cluster]
        else:
            argv += ["--role", role, "--listen", node.address]
            if role == "standby":
                argv += ["--primary", primary]
        return [*argv, "--data", str(node.data), "--config", str(node.config)]

    def _launch(self, node: LocalNode, role: str, primary: str) -> None:
        node.child.argv = self._argv(node, role, primary)
        with node.child.log.open("a") as log:
            log.write(f"\n### drill: {' '.join(node.child.argv)}\n")
        node.child.start()

    async def start(self) -> None:
        """etcd (``auto``), then the nodes: ``a`` primary and ``b`` its standby, or
        both on the witness."""
        if self.etcd is not None and not self.shared_etcd:
            await self.etcd.start()
        a, b = self.nodes.values()
        self._launch(a, "primary", "")
        self._launch(b, "standby", a.address)

    async def kill(self, target: str) -> None:
        """SIGKILL the node at ``target`` (or etcd for ``WITNESS``)."""
        if target == WITNESS:
            if self.etcd is None:
                raise SetupError("no witness to kill (run with --auto)")
            await asyncio.to_thread(self.etcd.child.kill)
            return
        await asyncio.to_thread(self.nodes[target].child.kill)

    async def restart(self, target: str, *, role: str, primary: str) -> None:
        """Start the killed node again: with ``auto`` on the same command line, else
        as ``role`` (following ``primary`` as a standby)."""
        if target == WITNESS:
            if self.etcd is None:
                raise SetupError("no witness to restart")
            await self.etcd.start()
            return
        self._launch(self.nodes[target], role, primary)

    def check_alive(self) -> None:
        """SetupError naming a node that exited on its own (with its log's tail)."""
        for node in self.nodes.values():
            if node.child.proc is not None and not node.child.alive:
                raise SetupError(
                    f"{self.label(node.address)} exited with status "
                    f"{node.child.proc.returncode}:\n{node.child.tail()}"
                )

    def log_tail(self, address: str, lines: int = 20) -> str:
        node = self.nodes.get(address)
        return node.child.tail(lines) if node is not None else ""

    async def close(self) -> None:
        """Stop every child at once (TERM, bounded grace, KILL)."""
        children = [n.child for n in self.nodes.values()]
        if self.etcd is not None and not self.shared_etcd:
            children.append(self.etcd.child)
        await asyncio.gather(*(asyncio.to_thread(c.stop, 10.0) for c in children))


def remove_workdir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
