"""The import floors between pagesift's packages, held by a test instead of by convention.

``pagesift.node`` is the composition root: the one package that wires a node (role
state, the gRPC server, the admin service, the CLI, ``serve``, the demo) and the only
one allowed to import both roles. Below it:

- ``pagesift.shared`` and ``pagesift.v1`` import no role and not the root;
- ``pagesift.primary`` imports nothing from ``pagesift.standby`` or the root;
- ``pagesift.standby`` imports nothing from ``pagesift.primary`` or the root.

Every ``import``/``from … import`` anywhere in a module counts (inside functions, under
``if TYPE_CHECKING``, in ``try`` blocks), relative imports are resolved, and so are
``importlib.import_module("…")`` / ``__import__("…")`` calls with a literal name.

The pure state machines (``PURE``) import, transitively, only each other and modules
that do no I/O and read no clock (``IO_MODULES`` lists what they must never reach).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the card's code folders; each holds part of the one ``pagesift`` namespace
CODE_DIRS = ("shared", "primary", "standby")

#: package -> the packages it must never import (a package is a prefix of module names)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "pagesift.shared": ("pagesift.primary", "pagesift.standby", "pagesift.node"),
    "pagesift.v1": ("pagesift.primary", "pagesift.standby", "pagesift.node"),
    "pagesift.primary": ("pagesift.standby", "pagesift.node"),
    "pagesift.standby": ("pagesift.primary", "pagesift.node"),
}


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    importer: str  # the importing module's dotted name
    target: str  # the dotted name imported (a module, or a module's attribute)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def module_files() -> Iterator[tuple[str, Path]]:
    """(dotted module name, file) for every .py of the pagesift namespace."""
    for folder in CODE_DIRS:
        base = ROOT / folder
        for path in sorted((base / "pagesift").rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute name of ``from <level dots><module> import …`` in ``importer``."""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    if level > 1:
        package = package[: len(package) - (level - 1)]
    return ".".join([*package, module] if module else package)


def imports_of(name: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, name, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = (
                _resolve(name, is_package, node.level, node.module)
                if node.level
                else node.module or ""
            )
            for alias in node.names:
                # ``from pagesift import primary`` imports the package pagesift.primary
                yield Import(path, node.lineno, name, f"{base}.{alias.name}")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            first = node.args[0]
            if (
                called in ("import_module", "__import__")
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                yield Import(path, node.lineno, name, first.value)


def all_imports() -> list[Import]:
    return [imp for name, path in module_files() for imp in imports_of(name, path)]


def violations(imports: list[Import]) -> list[str]:
    out = []
    for imp in imports:
        for package, banned in FORBIDDEN.items():
            if not _within(imp.importer, package):
                continue
            for floor in banned:
                if _within(imp.target, floor):
                    where = (
                        imp.file.relative_to(ROOT) if imp.file.is_relative_to(ROOT) else imp.file
                    )
                    out.append(f"{where}:{imp.line}: {imp.importer} imports {imp.target}")
    return out


def test_every_layer_is_found() -> None:
    """The scan sees every package (so the floors below cannot pass by seeing nothing)."""
    names = {name for name, _ in module_files()}
    for package in (*FORBIDDEN, "pagesift.node"):
        assert any(_within(n, package) for n in names), f"no module of {package} found"
    # the composition root is the shared folder's: nothing else defines pagesift.node
    node_files = {p for n, p in module_files() if _within(n, "pagesift.node")}
    assert all(p.is_relative_to(ROOT / "shared" / "pagesift" / "node") for p in node_files)


def test_no_package_imports_below_its_floor() -> None:
    bad = violations(all_imports())
    assert not bad, (
        "imports across the layers (only pagesift.node may import both roles; "
        "pagesift.shared imports no role):\n  " + "\n  ".join(bad)
    )


def test_the_scan_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_text(
        "import importlib\n"
        "def f():\n"
        "    from pagesift.primary.engine.protocol import PageError\n"
        "    from ..standby import follower\n"
        "    importlib.import_module('pagesift.node.cli')\n"
    )
    found = {(i.line, i.target) for i in imports_of("pagesift.shared.mod", src)}
    assert (3, "pagesift.primary.engine.protocol.PageError") in found
    assert (4, "pagesift.standby.follower") in found
    assert (5, "pagesift.node.cli") in found
    assert len(violations(list(imports_of("pagesift.shared.mod", src)))) == 3


#: the decision modules: events and ``now`` in, actions out (their shells do the I/O)
PURE = (
    "pagesift.shared.ha.rolestate",
    "pagesift.shared.ha.election",
    "pagesift.shared.ha.elector",
    "pagesift.shared.replication.protocol",
    "pagesift.shared.replication.sender",
    "pagesift.shared.replication.follower",
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
    "pagesift.primary",
    "pagesift.standby",
)


def impure_reach(module: str, imports: dict[str, list[Import]], modules: set[str]) -> list[str]:
    """The chains by which ``module`` reaches an I/O module (empty when it is pure)."""
    found: list[str] = []
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(module, (module,))]
    while todo:
        name, chain = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for imp in imports.get(name, []):
            target = imp.target
            if any(_within(target, io) for io in IO_MODULES):
                found.append(" -> ".join((*chain, target)))
            elif target in modules:
                todo.append((target, (*chain, target)))
            elif target.rsplit(".", 1)[0] in modules:  # ``from pkg.mod import name``
                todo.append((target.rsplit(".", 1)[0], (*chain, target.rsplit(".", 1)[0])))
    return found


def test_the_pure_machines_reach_no_io_module() -> None:
    files = dict(module_files())
    imports = {name: list(imports_of(name, path)) for name, path in files.items()}
    for machine in PURE:
        assert machine in files, f"{machine} not found"
    bad = [chain for machine in PURE for chain in impure_reach(machine, imports, set(files))]
    assert not bad, "a pure machine reaches an I/O module:\n  " + "\n  ".join(bad)


def test_the_purity_scan_follows_imports_through_other_modules(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from pagesift.shared import b\n")
    b.write_text("def f():\n    import asyncio\n")
    imports = {
        "pagesift.shared.a": list(imports_of("pagesift.shared.a", a)),
        "pagesift.shared.b": list(imports_of("pagesift.shared.b", b)),
    }
    modules = set(imports)
    assert impure_reach("pagesift.shared.a", imports, modules) == [
        "pagesift.shared.a -> pagesift.shared.b -> asyncio"
    ]
    b.write_text("import json\n")
    imports["pagesift.shared.b"] = list(imports_of("pagesift.shared.b", b))
    assert impure_reach("pagesift.shared.a", imports, modules) == []
