"""The static import graph of the pagesift namespace, for the tests that hold its shape.

``test_layers`` (the floors between packages), ``test_import_cycles`` (no cycle) and
``test_module_size`` read the tree through this module, so all three see the same
modules and the same imports.

Every ``import``/``from … import`` anywhere in a module counts (inside functions, under
``if TYPE_CHECKING``, in ``try`` blocks), relative imports are resolved, and so are
``importlib.import_module("…")`` / ``__import__("…")`` calls with a literal name. A
target is a dotted name as written: a module, or a module's attribute
(``module_of`` finds the module).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the code folders; each holds part of the one ``pagesift`` namespace
CODE_DIRS = ("shared", "primary", "standby")


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    importer: str  # the importing module's dotted name
    target: str  # the dotted name imported (a module, or a module's attribute)

    def where(self) -> str:
        shown = self.file.relative_to(ROOT) if self.file.is_relative_to(ROOT) else self.file
        return f"{shown}:{self.line}"


def within(name: str, package: str) -> bool:
    """``name`` is ``package`` or a module below it (a package is a prefix of names)."""
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


def imports_by_module() -> dict[str, list[Import]]:
    return {name: list(imports_of(name, path)) for name, path in module_files()}


def module_of(target: str, modules: Iterable[str] | set[str]) -> str | None:
    """The module a target names: itself, or (``from pkg.mod import name``) its parent."""
    known = modules if isinstance(modules, set) else set(modules)
    if target in known:
        return target
    parent = target.rsplit(".", 1)[0]
    return parent if parent in known else None


def reach(
    module: str,
    imports: dict[str, list[Import]],
    bad: Callable[[str], bool],
) -> list[str]:
    """The chains ``a -> b -> … -> target`` by which ``module`` imports, directly or
    through other modules of the scan, a target that ``bad`` refuses (empty when none)."""
    modules = set(imports)
    found: list[str] = []
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(module, (module,))]
    while todo:
        name, chain = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for imp in imports.get(name, []):
            if bad(imp.target):
                found.append(" -> ".join((*chain, imp.target)))
                continue
            inner = module_of(imp.target, modules)
            if inner is not None:
                todo.append((inner, (*chain, inner)))
    return sorted(found)
