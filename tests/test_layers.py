"""The import floors between pagesift's packages, held by a test instead of by convention.

``pagesift.node`` is the composition root: the one package that wires a node (role
state, the gRPC server and its services). It, and the two programs built on it
(``pagesift.cli``, the ``pagesift`` command; ``pagesift.drill``, the failover drill), are
the only packages allowed to import both roles; the root imports neither program. Below
them (``FLOORS``, each with its reason):

- ``pagesift.core`` and ``pagesift.v1`` import no role, not the root and neither program;
- ``pagesift.primary`` and ``pagesift.standby`` import neither each other nor the root,
  nor ``pagesift.demo`` (the demo site is for ``make run``, drills, tests and bench);
- ``pagesift.demo`` imports no role and not the root;
- ``pagesift.client`` imports only ``CLIENT_MAY_IMPORT`` (what ``pip install pagesift``
  must ship), directly or through those; ``pagesift.gateway`` (the HTTP gateway, a
  client of the pair) imports only those, itself and Firecrawl's document shape
  (``pagesift.core.jobs.firecrawlshape``, which imports only the wire code);
- inside ``pagesift.core``: ``replication`` and ``ha`` import nothing from ``jobs`` or
  ``api``, and ``ha`` nothing from ``replication`` (the log asks ``ha``'s role and
  fencing rules, never the other way); ``store`` and ``cluster`` import only ``util``;
- ``pagesift.coord`` (coordination: witness, registry, budgets) is the only package that
  imports ``aetcd``, and it imports no role, not the root, not the client nor the
  gateway; the client reaches its ``etcd``, ``keys`` and ``registry`` modules alone;
- inside ``pagesift.primary``: ``engine`` and ``extract`` import nothing from ``jobs`` or
  ``webhooks``; ``extract`` imports nothing from ``engine``; ``jobs`` sees the engine
  through ``engine.interface`` alone, plus the values it hands down (``ENGINE_FOR_JOBS``).

The pure state machines (``PURE``) import, transitively, only each other and modules
that do no I/O and read no clock (``IO_MODULES`` lists what they must never reach).
``tests/importscan.py`` reads the imports (lazy, relative, TYPE_CHECKING and literal
``import_module`` ones included). Every floor has a test that plants a violating import
and sees the check report it, so no floor passes by seeing nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.importscan import (
    ROOT,
    Import,
    all_imports,
    imports_by_module,
    imports_of,
    module_files,
    reach,
    within,
)


@dataclass(frozen=True)
class Floor:
    importer: str  # the package the floor holds (a prefix of module names)
    banned: tuple[str, ...]  # what its modules must never import
    why: str
    allowed: tuple[str, ...] = ()  # exceptions inside ``banned``
    spared: tuple[str, ...] = ()  # importers inside ``importer`` the floor does not hold

    def holds(self, importer: str) -> bool:
        return within(importer, self.importer) and not any(within(importer, s) for s in self.spared)

    def refuses(self, target: str) -> bool:
        return any(within(target, b) for b in self.banned) and not any(
            within(target, a) for a in self.allowed
        )


#: the roles, the composition root and the two programs built on it (the command line and
#: the failover drill): what the common code must never import
ROLES_AND_ROOT = (
    "pagesift.primary",
    "pagesift.standby",
    "pagesift.node",
    "pagesift.cli",
    "pagesift.drill",
)

#: the pagesift modules ``pagesift.client`` may import: the wire code and the small helpers
#: it runs on (backoff, channels). A new entry is a module ``pip install pagesift`` must ship.
CLIENT_MAY_IMPORT: tuple[str, ...] = (
    "pagesift.client",
    "pagesift.v1",
    "pagesift.core.util",
    "pagesift.core.cluster",  # the cluster's pure rules (ids, placement, merges)
    # the registry read of a cluster client, imported lazily (aetcd: the cluster extra)
    "pagesift.coord.etcd",
    "pagesift.coord.keys",
    "pagesift.coord.registry",
)

#: what job code may import of ``pagesift.primary.engine``: the ``Engine`` protocol, and
#: the values it builds and hands down (request profiles, cookie jars, retry decisions)
ENGINE_FOR_JOBS: tuple[str, ...] = (
    "pagesift.primary.engine.interface",
    "pagesift.primary.engine.reqprofile",
    "pagesift.primary.engine.cookiejar",
    "pagesift.primary.engine.retrypolicy",
    "pagesift.core.cluster.placement",
    "pagesift.core.cluster.budgetplans",
    "pagesift.core.cluster.registryrules",
)

FLOORS: tuple[Floor, ...] = (
    Floor("pagesift.core", ROLES_AND_ROOT, "shared code serves both roles"),
    Floor("pagesift.v1", ROLES_AND_ROOT, "generated wire code depends on nothing of ours"),
    Floor(
        "pagesift.primary",
        ("pagesift.standby", "pagesift.node", "pagesift.demo"),
        "a role knows neither the other role, the composition root nor the demo site",
    ),
    Floor(
        "pagesift.standby",
        ("pagesift.primary", "pagesift.node", "pagesift.demo"),
        "a role knows neither the other role, the composition root nor the demo site",
    ),
    Floor("pagesift.demo", ROLES_AND_ROOT, "the demo site is a plain web app any test can run"),
    Floor(
        "pagesift.client",
        ("pagesift",),
        "the installed client ships without the store, the roles and the demo",
        allowed=CLIENT_MAY_IMPORT,
    ),
    Floor(
        "pagesift.gateway",
        ("pagesift",),
        "the HTTP gateway is a client of the pair: it reaches the server only over gRPC",
        allowed=(*CLIENT_MAY_IMPORT, "pagesift.gateway", "pagesift.core.jobs.firecrawlshape"),
    ),
    Floor(
        "pagesift.core.jobs.firecrawlshape",
        ("pagesift",),
        "Firecrawl's shape is shared by the server's webhooks and the gateway: wire code alone",
        allowed=("pagesift.v1", "pagesift.core.jobs.firecrawlshape"),
    ),
    Floor(
        "pagesift.node",
        ("pagesift.cli", "pagesift.drill"),
        "the composition root wires a node; the command line and the drill are built on it",
    ),
    Floor(
        "pagesift.core.replication",
        ("pagesift.core.jobs", "pagesift.core.api"),
        "the log ships opaque writes; it knows no job or RPC",
    ),
    Floor(
        "pagesift.core.ha",
        ("pagesift.core.jobs", "pagesift.core.api", "pagesift.core.replication"),
        "role and election rules know no job, RPC or log: the log builds on them",
    ),
    Floor(
        "pagesift.core.cluster",
        ("pagesift",),
        "the cluster's rules are shared by clients and nodes: they build on util alone",
        allowed=("pagesift.core.util", "pagesift.core.cluster"),
    ),
    Floor(
        "pagesift",
        ("aetcd",),
        "etcd is spoken in one place: pagesift.coord's one client",
        spared=("pagesift.coord",),
    ),
    Floor(
        "pagesift.coord",
        (*ROLES_AND_ROOT, "pagesift.client", "pagesift.gateway", "pagesift.demo"),
        "coordination serves nodes and clients alike: it knows no role, root or client",
    ),
    Floor(
        "pagesift.core.store",
        ("pagesift.core",),
        "the store is the bottom of the house: it builds on util alone",
        allowed=("pagesift.core.util", "pagesift.core.store"),
    ),
    Floor(
        "pagesift.primary.engine",
        ("pagesift.primary.jobs", "pagesift.primary.webhooks"),
        "the engine fetches for jobs; it does not know them",
    ),
    Floor(
        "pagesift.primary.jobs",
        ("pagesift.primary.engine",),
        "job code sees the engine through protocol.Engine alone (tests run it on a fake)",
        allowed=ENGINE_FOR_JOBS,
    ),
    Floor(
        "pagesift.primary.extract",
        ("pagesift.primary.jobs", "pagesift.primary.webhooks", "pagesift.primary.engine"),
        "extraction turns bytes into documents; it neither fetches nor runs jobs",
    ),
)


def violations(imports: list[Import], floors: tuple[Floor, ...] = FLOORS) -> list[str]:
    return [
        f"{imp.where()}: {imp.importer} imports {imp.target} ({floor.why})"
        for imp in imports
        for floor in floors
        if floor.holds(imp.importer) and floor.refuses(imp.target)
    ]


def test_every_layer_is_found() -> None:
    """The scan sees every package (so the floors below cannot pass by seeing nothing)."""
    names = {name for name, _ in module_files()}
    for package in (*(f.importer for f in FLOORS), "pagesift.node"):
        assert any(within(n, package) for n in names), f"no module of {package} found"
    # the composition root is the shared folder's: nothing else defines pagesift.node
    node_files = {p for n, p in module_files() if within(n, "pagesift.node")}
    assert all(p.is_relative_to(ROOT / "shared" / "pagesift" / "node") for p in node_files)


def test_no_package_imports_below_its_floor() -> None:
    bad = violations(all_imports())
    assert not bad, "imports across the floors:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("floor", FLOORS, ids=lambda f: f"{f.importer}-x-{f.banned[-1]}")
def test_a_planted_import_below_each_floor_is_reported(floor: Floor, tmp_path: Path) -> None:
    src = tmp_path / "planted.py"
    importer = f"{floor.importer}.planted"
    for banned in floor.banned:
        target = f"{banned}.planted_target"
        src.write_text(f"def f():\n    import {target}\n")
        found = violations(list(imports_of(importer, src)))
        assert found == [f"{src}:2: {importer} imports {target} ({floor.why})"]
    for allowed in floor.allowed:
        src.write_text(f"import {allowed}.anything\n")
        assert violations(list(imports_of(importer, src))) == []
    for spared in floor.spared:
        src.write_text(f"import {floor.banned[0]}.anything\n")
        assert violations(list(imports_of(f"{spared}.planted", src)), (floor,)) == []


def test_the_scan_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_text(
        "import importlib\n"
        "def f():\n"
        "    from pagesift.primary.engine.interface import PageError\n"
        "    from ..standby import follower\n"
        "    importlib.import_module('pagesift.cli')\n"
    )
    found = {(i.line, i.target) for i in imports_of("pagesift.core.mod", src)}
    assert (3, "pagesift.primary.engine.interface.PageError") in found
    assert (4, "pagesift.standby.follower") in found
    assert (5, "pagesift.cli") in found
    assert len(violations(list(imports_of("pagesift.core.mod", src)))) == 3


def _client_strays(target: str) -> bool:
    return within(target, "pagesift") and not any(within(target, a) for a in CLIENT_MAY_IMPORT)


def test_the_client_reaches_only_what_it_ships() -> None:
    imports = imports_by_module()
    clients = [name for name in imports if within(name, "pagesift.client")]
    assert clients
    bad = [chain for name in clients for chain in reach(name, imports, _client_strays)]
    assert not bad, "the client reaches server code:\n  " + "\n  ".join(bad)


def test_the_client_reach_check_follows_imports(tmp_path: Path) -> None:
    helper = tmp_path / "backoff.py"
    helper.write_text("import math\n")
    name = "pagesift.core.util.backoff"
    imports = {
        "pagesift.client.planted": [Import(tmp_path / "c.py", 1, "pagesift.client.planted", name)],
        name: list(imports_of(name, helper)),
    }
    assert reach("pagesift.client.planted", imports, _client_strays) == []
    helper.write_text("def f():\n    from pagesift.core.store.db import Store\n")
    imports[name] = list(imports_of(name, helper))
    assert reach("pagesift.client.planted", imports, _client_strays) == [
        f"pagesift.client.planted -> {name} -> pagesift.core.store.db.Store"
    ]


#: the decision modules: events and ``now`` in, actions out (their shells do the I/O)
PURE = (
    "pagesift.core.ha.rolestate",
    "pagesift.core.ha.election",
    "pagesift.core.ha.electorstate",
    "pagesift.core.ha.fencingrules",
    "pagesift.core.replication.protocol",
    "pagesift.core.replication.senderstate",
    "pagesift.core.replication.followerstate",
    "pagesift.core.jobs.quarantine",
    "pagesift.primary.engine.retrypolicy",
    "pagesift.primary.engine.cookierecords",
    "pagesift.core.util.logthrottle",
    "pagesift.core.util.connlimits",
    "pagesift.core.util.machine",  # the machines' declarations of events and actions
)
#: what a pure machine must never import, directly or through another module
IO_MODULES = (
    "asyncio",
    "time",
    "socket",
    "selectors",
    "threading",
    "subprocess",
    "os",
    "pathlib",
    "grpc",
    "aetcd",
    "aiohttp",
    "rocksdict",
    "pagesift.v1",
    "pagesift.node",
    "pagesift.primary",  # role code (the primary's own pure modules import none either)
    "pagesift.standby",
)


def _is_io(target: str) -> bool:
    return any(within(target, io) for io in IO_MODULES)


def test_the_pure_machines_reach_no_io_module() -> None:
    imports = imports_by_module()
    for machine in PURE:
        assert machine in imports, f"{machine} not found"
    bad = [chain for machine in PURE for chain in reach(machine, imports, _is_io)]
    assert not bad, "a pure machine reaches an I/O module:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("machine", PURE)
def test_an_io_import_planted_in_each_pure_machine_is_reported(
    machine: str, tmp_path: Path
) -> None:
    imports = imports_by_module()
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    import asyncio\n")
    imports[machine] = [*imports[machine], *imports_of(machine, planted)]
    assert f"{machine} -> asyncio" in reach(machine, imports, _is_io)


def test_the_purity_scan_follows_imports_through_other_modules(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from pagesift.core import b\n")
    b.write_text("def f():\n    import asyncio\n")
    imports = {
        "pagesift.core.a": list(imports_of("pagesift.core.a", a)),
        "pagesift.core.b": list(imports_of("pagesift.core.b", b)),
    }
    assert reach("pagesift.core.a", imports, _is_io) == [
        "pagesift.core.a -> pagesift.core.b -> asyncio"
    ]
    b.write_text("import json\n")
    imports["pagesift.core.b"] = list(imports_of("pagesift.core.b", b))
    assert reach("pagesift.core.a", imports, _is_io) == []
