"""Module names that explain themselves: no module imports two modules of one name.

A reader who meets ``protocol`` twice in one file (the replication protocol and the
engine's interface) has to look up which is which; two modules with the same file name
and different jobs must never be imported side by side. The check reads the static
import graph (``tests/importscan.py``): for every module, the pagesift modules it
imports (a ``from module import name`` counts as importing ``module``), grouped by their
last name; a group of two or more is reported, the module itself counted as met.

One convention is exempt, and said here: ``pagesift.cli``'s modules are named for the
subcommand they implement (``pagesift.cli.drill`` is ``pagesift drill`` and calls
``pagesift.drill``), so a command module may meet the package it drives. Packages are
not modules: ``pagesift.core.jobs`` (the job domain's rules) and ``pagesift.primary.jobs``
(the job runtime) are folders a reader enters, not names in one file.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tests.importscan import Import, imports_by_module, imports_of, module_files, module_of

#: the command line's modules, named for their subcommands
SUBCOMMANDS = "pagesift.cli."


def _modules() -> tuple[dict[str, Path], set[str]]:
    files = dict(module_files())
    packages = {name for name, path in files.items() if path.name == "__init__.py"}
    return files, packages


def clashes(imports: dict[str, list[Import]], modules: set[str], packages: set[str]) -> list[str]:
    """``importer: leaf -> the modules of that name it meets``, for every clash."""
    out: list[str] = []
    for importer, found in sorted(imports.items()):
        met: dict[str, set[str]] = defaultdict(set)
        if importer not in packages:
            met[importer.rsplit(".", 1)[-1]].add(importer)
        for imp in found:
            target = module_of(imp.target, modules)
            if target is None or target in packages or target == importer:
                continue
            met[target.rsplit(".", 1)[-1]].add(target)
        for leaf, names in sorted(met.items()):
            if len(names) < 2:
                continue
            if importer.startswith(SUBCOMMANDS) and importer in names:
                others = names - {importer}
                if all(not n.startswith(SUBCOMMANDS) for n in others) and len(others) == 1:
                    continue
            out.append(f"{importer}: {leaf} -> {', '.join(sorted(names))}")
    return out


def test_no_module_meets_two_modules_of_one_name() -> None:
    files, packages = _modules()
    found = clashes(imports_by_module(), set(files), packages)
    assert not found, "modules of one name met in one file (rename one):\n  " + "\n  ".join(found)


def test_a_planted_clash_is_reported(tmp_path: Path) -> None:
    files, packages = _modules()
    src = tmp_path / "planted.py"
    src.write_text(
        "from pagesift.core.replication import protocol\n"
        "from pagesift.core.store.errors import StorageUnavailable\n"
        "from pagesift.client.errors import ClientError\n"
    )
    name = "pagesift.node.planted"
    imports = {name: list(imports_of(name, src))}
    assert clashes(imports, set(files) | {name}, packages) == [
        f"{name}: errors -> pagesift.client.errors, pagesift.core.store.errors"
    ]


def test_a_subcommand_may_meet_the_package_it_drives_but_not_a_second_namesake(
    tmp_path: Path,
) -> None:
    files, packages = _modules()
    src = tmp_path / "backup.py"
    src.write_text("from pagesift.core.replication.backup import BackupSource\n")
    name = "pagesift.cli.backup"
    assert clashes({name: list(imports_of(name, src))}, set(files), packages) == []
    src.write_text(
        "from pagesift.core.replication.backup import BackupSource\n"
        "from pagesift.node.backup import Other\n"
    )
    modules = set(files) | {"pagesift.node.backup"}
    assert clashes({name: list(imports_of(name, src))}, modules, packages) == [
        f"{name}: backup -> pagesift.cli.backup, pagesift.core.replication.backup, "
        "pagesift.node.backup"
    ]
