"""Fixtures shared by two or more test modules; plain helpers live in ``helpers.py``.

``site`` serves a demo site (``pagesift.demo.site``) on 127.0.0.1 for one test;
its size and speed come from the ``site_spec`` fixture, which a module overrides with
its own (a module-level fixture of the same name wins over this one). ``store`` is a
fresh RocksDB store under ``tmp_path``, closed at the end. ``make_engine`` builds
``HttpEngine``\\ s and closes them at the end. ``nodes`` makes ``pagesift serve``
children; ``etcd`` runs a real etcd for the witness tests.

Tiers: a test that kills, freezes or restarts real node processes, runs etcd, a drill,
a fresh venv, a tmpfs mount or promtool is marked ``system`` (``make test-fast`` runs
``-m "not system and not browser and not model"``; ``browser`` marks the tests that
drive a real headless browser, ``model`` those against a real model server,
``tests/modelserver.py``). Collection refuses a test that uses ``nodes`` or ``etcd`` from
here without that mark, so the fast tier cannot grow one by accident.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp.abc import AbstractResolver

from pagesift.core.api.metrics import Metrics
from pagesift.core.config.schema import ServerConfig
from pagesift.core.store.db import Store
from pagesift.demo.site import Site, build_site, serve_site
from pagesift.drill.fixture import Etcd
from pagesift.primary.engine.http import HttpEngine
from pagesift.primary.engine.netguard import AddressGuard
from tests.helpers import EngineMaker, NodeFactory, SiteSpec, serve_procs
from tests.modelserver import model_proxy, model_server, model_server_session  # noqa: F401

# Every ``pagesift serve`` child of the suite inherits this: no 64 MiB reserve file
# (``pagesift.core.api.storagewatch``) in each of hundreds of data directories. The tests of the
# reserve set it themselves (tests/test_disk_full.py).
os.environ.setdefault("PAGESIFT_STORAGE_RESERVE_BYTES", "0")

#: Fixtures of this file that start real processes: a test using one is a system test.
SYSTEM_FIXTURES = ("nodes", "etcd")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__)
    unmarked = []
    for item in items:
        if item.get_closest_marker("system") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        for name in SYSTEM_FIXTURES:
            # the last definition is the one the test gets (a module may define its own)
            if name in defs and Path(defs[name][-1].func.__code__.co_filename) == here:
                unmarked.append(f"{item.nodeid} (uses {name})")
    if unmarked:
        raise pytest.UsageError(
            "mark these @pytest.mark.system (they start real processes):\n  "
            + "\n  ".join(unmarked)
        )


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec()


@pytest.fixture
async def site(site_spec: SiteSpec) -> AsyncIterator[tuple[Site, str]]:
    """A demo site and its root URL, served until the test ends."""
    s = build_site(
        site_spec.pages, slow_seconds=site_spec.slow_seconds, big_bytes=site_spec.big_bytes
    )
    runner, root = await serve_site(s)
    try:
        yield s, root
    finally:
        await runner.cleanup()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """An empty store in ``tmp_path / "store"``, closed when the test ends."""
    s = Store(tmp_path / "store")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def make_engine() -> AsyncIterator[EngineMaker]:
    """Builds ``HttpEngine``\\ s (``await make(config, ...)``, the class's arguments) on the
    test's loop; every one it built is closed when the test ends, whatever happened."""
    async with contextlib.AsyncExitStack() as made:

        async def make(
            config: ServerConfig,
            *,
            metrics: Metrics | None = None,
            guard: AddressGuard | None = None,
            resolver: AbstractResolver | None = None,
        ) -> HttpEngine:
            engine = HttpEngine(config, metrics=metrics, guard=guard, resolver=resolver)
            made.push_async_callback(engine.close)
            return engine

        yield make


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[NodeFactory]:
    """Makes ``ServeProc``\\ s (``pagesift serve`` children under ``tmp_path``); every one
    is stopped at the end, whatever happened."""
    with serve_procs(tmp_path) as make:
        yield make


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[Etcd]:
    """A real etcd on loopback (Debian's etcd-server, which ``make test`` installs; the
    drill's own launcher), stopped at the end."""
    proc = Etcd(tmp_path)
    await proc.start()
    try:
        yield proc
    finally:
        proc.child.stop()
