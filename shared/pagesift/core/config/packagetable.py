"""docs/architecture.md's package table, generated from the packages' own docstrings.

Every package of a checkout (a folder with an ``__init__.py`` under ``shared/pagesift``,
``primary/pagesift`` or ``standby/pagesift``, subpackages included) gets one row: its
dotted name, its folder linked from ``docs/``, and the first paragraph of its
``__init__.py`` docstring, which is where a package says what it owns. The docstring is
the one source: a package added, moved or re-described changes the table, and
``tests/test_doc_packages.py`` fails until the doc holds ``package_table_markdown``'s
output again (the way ``settings.config_table_markdown`` keeps docs/configuration.md's).

The files are parsed (``ast``), never imported, so the table can be built without the
``server`` extra and without running any package's import-time code; it reads only
files under the root it is given.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

#: the folders that hold the ``pagesift`` namespace, relative to a checkout's root
ROOTS = ("shared/pagesift", "primary/pagesift", "standby/pagesift")

_RST_CODE = re.compile(r"``(.+?)``")


def packages(root: Path) -> list[tuple[str, Path]]:
    """(dotted name, folder) of every package under ``ROOTS``, by dotted name.

    A folder is a package when it and every folder between it and its root hold an
    ``__init__.py`` (``pagesift`` itself is a namespace and has none)."""
    found: list[tuple[str, Path]] = []
    for top in ROOTS:
        base = root / top
        for init in base.rglob("__init__.py"):
            folder = init.parent
            parts = folder.relative_to(base).parts
            if not parts or "__pycache__" in parts:
                continue
            chain = [base.joinpath(*parts[:i]) for i in range(1, len(parts) + 1)]
            if all((d / "__init__.py").is_file() for d in chain):
                found.append((".".join(("pagesift", *parts)), folder))
    return sorted(found)


def summary(init: Path) -> str:
    """The first paragraph of a package's docstring, on one line, as markdown."""
    doc = ast.get_docstring(ast.parse(init.read_text(), str(init))) or ""
    first = doc.strip().split("\n\n", 1)[0]
    text = " ".join(line.strip() for line in first.splitlines())
    return _RST_CODE.sub(r"`\1`", text).replace("|", "\\|")


def package_table_markdown(root: Path) -> str:
    """docs/architecture.md's table: every package, its folder, what it owns."""
    rows = [
        "| package | folder | what it owns |",
        "|---|---|---|",
    ]
    for name, folder in packages(root):
        rel = folder.relative_to(root).as_posix() + "/"
        rows.append(f"| `{name}` | [`{rel}`](../{rel}) | {summary(folder / '__init__.py')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    # python -m pagesift.core.config.packagetable [ROOT]: print the table to paste
    sys.stdout.write(package_table_markdown(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
