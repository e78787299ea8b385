"""The docs' account of the packages follows the tree: a package added, moved or renamed
fails here until the docs say so.

- docs/architecture.md's package table is ``package_table_markdown``'s output, pasted
  between its ``package-table`` markers: one row per package, from the package's own
  docstring (``pagesift.core.config.packagetable``).
- README.md's Layout table names every package in the row of the folder that holds it
  (its dotted name, or its last part in backquotes in its parent's row).
- A package docstring that lists its modules (a bullet list whose first item opens with
  ````name``:``) lists every module and subpackage of its folder, and names nothing as a
  module that the folder does not hold. A listed name is a "head": a ````name```` that a
  colon follows, alone or in a run (````a``, ````b``:``, ````a`` / ````b``:``). Every
  package has such a list but ``pagesift.v1`` (generated) and ``pagesift.shared`` (the
  deprecated shim), so a new package without one fails too.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from pagesift.core.config.packagetable import ROOTS, package_table_markdown, packages, summary

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"

_TABLE = re.compile(r"<!-- package-table:begin -->\n(.*?)<!-- package-table:end -->", re.DOTALL)
#: one head run of a module list: ``a``: / ``a``, ``b``: / ``a`` / ``b`` and ``c``:
_HEAD_RUN = re.compile(r"``\w+``(?:\s*(?:,|/|,?\s+and)\s*``\w+``)*\s*:")
_BULLET = re.compile(r"^- ")
_LIST_OPENS = re.compile(r"^- ``\w+``(?:\s*(?:,|/)\s*``\w+``)*\s*:")
#: the files a folder holds that are not modules a docstring describes
NOT_LISTED = {"__init__", "__main__"}


# ---------------------------------------------------------------- module lists


def module_lists(doc: str) -> list[str]:
    """The text of every bullet list in ``doc`` whose first item opens with a head."""
    found: list[str] = []
    current: list[str] | None = None
    for line in doc.splitlines():
        if _BULLET.match(line):
            if current is None:
                current = []
            current.append(line)
        elif current is not None and line.startswith("  ") and line.strip():
            current.append(line)
        else:
            if current is not None and _LIST_OPENS.match(current[0]):
                found.append("\n".join(current))
            current = None
    if current is not None and _LIST_OPENS.match(current[0]):
        found.append("\n".join(current))
    return found


def listed_modules(doc: str) -> set[str] | None:
    """The modules a package docstring lists, or None when it has no module list."""
    lists = module_lists(doc)
    if not lists:
        return None
    names: set[str] = set()
    for text in lists:
        for run in _HEAD_RUN.finditer(text):
            names.update(re.findall(r"``(\w+)``", run.group(0)))
    return names


def folder_modules(folder: Path) -> set[str]:
    """The modules (``*.py``) and subpackages a package folder holds."""
    names = {p.stem for p in folder.glob("*.py")} - NOT_LISTED
    names |= {d.name for d in folder.iterdir() if (d / "__init__.py").is_file()}
    return names


def module_list_problems(folder: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    listed = listed_modules(doc)
    if listed is None:
        return []
    there = folder_modules(folder)
    rel = folder.relative_to(ROOT) if ROOT in folder.parents else folder
    problems = [f"{rel}: {m} is not in the docstring's list" for m in sorted(there - listed)]
    problems += [f"{rel}: {m} is listed but not in the folder" for m in sorted(listed - there)]
    return problems


def _package_params() -> list[object]:
    return [pytest.param(folder, id=name) for name, folder in packages(ROOT)]


@pytest.mark.parametrize("folder", _package_params())
def test_a_package_docstrings_module_list_matches_its_folder(folder: Path) -> None:
    problems = module_list_problems(folder)
    assert not problems, "\n".join(problems)


def test_every_package_but_the_generated_one_and_the_shim_lists_its_modules() -> None:
    with_lists = {
        name
        for name, folder in packages(ROOT)
        if listed_modules(ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or "")
        is not None
    }
    # every package says what its modules are, but the generated code and the shim
    assert set(dict(packages(ROOT))) - with_lists == {"pagesift.v1", "pagesift.shared"}


# ---------------------------------------------------------------- docs/architecture.md


def test_the_architecture_doc_has_the_generated_package_table() -> None:
    found = _TABLE.findall(ARCHITECTURE.read_text())
    assert len(found) == 1, "docs/architecture.md needs one package-table:begin/end marker pair"
    assert found[0] == package_table_markdown(ROOT), (
        "docs/architecture.md's package table is stale: paste the output of "
        "`python -m pagesift.core.config.packagetable` (run at the repository's root)"
    )


def test_every_package_has_a_row_with_its_own_words() -> None:
    table = package_table_markdown(ROOT)
    names = [name for name, _ in packages(ROOT)]
    assert {"pagesift.core", "pagesift.core.api", "pagesift.primary.engine.browser"} <= set(names)
    assert {"pagesift.standby", "pagesift.cli", "pagesift.drill", "pagesift.v1"} <= set(names)
    for name, folder in packages(ROOT):
        words = summary(folder / "__init__.py")
        assert words, f"{name} has no docstring"
        assert f"| `{name}` | [`{folder.relative_to(ROOT).as_posix()}/`]" in table
        assert f" | {words} |\n" in table


# ---------------------------------------------------------------- README.md's layout


def layout_rows(text: str) -> dict[str, str]:
    """README.md's Layout table: folder -> the row's text."""
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        m = re.match(r"^\| \[`([^`]+)`\]\([^)]*\) \|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def layout_problems(text: str, root: Path) -> list[str]:
    rows = layout_rows(text)
    problems = []
    for name, folder in packages(root):
        rel = folder.relative_to(root).as_posix() + "/"
        holders = [f for f in rows if rel.startswith(f)]
        if not holders:
            problems.append(f"{name}: no Layout row holds {rel}")
            continue
        row = rows[max(holders, key=len)]
        if rel == max(holders, key=len):
            continue  # the row is the package's own folder
        if f"`{name}`" not in row and f"`{name.rsplit('.', 1)[1]}`" not in row:
            problems.append(f"{name}: not named in the Layout row of {max(holders, key=len)}")
    return problems


def test_the_readme_layout_names_every_package() -> None:
    assert set(layout_rows(README.read_text())) >= {f"{r}/" for r in ROOTS[:1]}
    problems = layout_problems(README.read_text(), ROOT)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- the checks can fail


def _tree(tmp_path: Path) -> Path:
    """A copy of the package folders' ``__init__.py`` files and module names."""
    for top in ROOTS:
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            dest = tmp_path / path.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if path.name == "__init__.py":
                shutil.copyfile(path, dest)
            else:
                dest.write_text("")
    return tmp_path


def test_a_new_package_stales_the_table_and_the_layout(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    before = package_table_markdown(root)
    assert before == package_table_markdown(ROOT)
    (root / "shared/pagesift/core/newroom").mkdir()
    (root / "shared/pagesift/core/newroom/__init__.py").write_text('"""A new room."""\n')
    after = package_table_markdown(root)
    assert after != before and "| `pagesift.core.newroom` |" in after
    assert "| A new room. |" in after
    (root / "shared/pagesift/zzz").mkdir()
    (root / "shared/pagesift/zzz/__init__.py").write_text('"""Z."""\n')
    already = set(layout_problems(README.read_text(), ROOT))  # the real test's business
    assert [p for p in layout_problems(README.read_text(), root) if p not in already] == [
        "pagesift.core.newroom: not named in the Layout row of shared/pagesift/",
        "pagesift.zzz: not named in the Layout row of shared/pagesift/",
    ]
    assert layout_problems("# R\n## Layout\n\n| path | what |\n", root)[0] == (
        "pagesift.cli: no Layout row holds shared/pagesift/cli/"
    )


def test_a_reworded_docstring_stales_the_table(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    init = root / "standby/pagesift/standby/__init__.py"
    init.write_text('"""The standby | and more."""\n')
    table = package_table_markdown(root)
    assert "| The standby \\| and more. |" in table
    assert table != package_table_markdown(ROOT)


def test_a_module_list_out_of_step_with_its_folder_is_reported(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        '"""A package.\n\nModules:\n\n- ``alpha``: the first;\n'
        "- ``beta`` / ``gamma``: two, with ``delta`` in passing;\n"
        '- ``gone``, ``epsilon`` and ``zeta``: three.\n"""\n'
    )
    for name in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "new", "__main__"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "sub").mkdir()
    (pkg / "sub" / "__init__.py").write_text("")
    assert module_list_problems(pkg) == [
        f"{pkg}: delta is not in the docstring's list",
        f"{pkg}: new is not in the docstring's list",
        f"{pkg}: sub is not in the docstring's list",
        f"{pkg}: gone is listed but not in the folder",
    ]


def test_a_docstring_without_a_module_list_is_not_read_as_one() -> None:
    prose = "Text.\n\n- ``main(argv)`` returns 0;\n- Every command: ``--json``."
    assert listed_modules(prose) is None
    assert listed_modules("The store (``db``): ``groups``, ``cuts``.") is None
    assert listed_modules("- ``a``: x; ``b``: y; ``c`` is z, ``d``: w\n- ``e``, ``f``: v") == {
        "a",
        "b",
        "d",
        "e",
        "f",
    }
