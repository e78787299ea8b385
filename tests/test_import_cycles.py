"""No import cycle among pagesift's modules: Tarjan's strongly connected components.

The graph has an edge ``a -> b`` for every import in ``a`` that names module ``b`` or an
attribute of it (``tests/importscan.py``): module-level imports, imports inside
functions (a lazy import is still a dependency; it only hides the cycle until the
function runs), relative ones and literal ``import_module`` calls. Imports under
``if TYPE_CHECKING`` count too: a module that names another's types depends on it, and
a type-only import is the usual way a cycle gets hidden rather than broken.

A package's ``__init__`` is not an edge of its children: importing ``pagesift.client.aio``
runs ``pagesift/client/__init__.py`` first, but that order is Python's, not a
dependency, so ``client/__init__`` re-exporting ``client.aio`` is not a cycle.

A strongly connected component of more than one module (or a module importing itself)
is a cycle; the test fails naming its members.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.importscan import Import, imports_by_module, imports_of, module_of


def graph(imports: Mapping[str, Sequence[Import]]) -> dict[str, set[str]]:
    """module -> the modules it imports (only modules of the scan)."""
    modules = set(imports)
    out: dict[str, set[str]] = {name: set() for name in modules}
    for name, found in imports.items():
        for imp in found:
            target = module_of(imp.target, modules)
            if target is not None:
                out[name].add(target)
    return out


def strongly_connected(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative, so a deep import chain cannot hit the recursion
    limit): the graph's strongly connected components, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(edges.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    return sorted(
        c for c in strongly_connected(edges) if len(c) > 1 or c[0] in edges.get(c[0], set())
    )


def test_no_import_cycle_among_pagesift_modules() -> None:
    found = cycles(graph(imports_by_module()))
    assert not found, "import cycles (each line one strongly connected component):\n  " + (
        "\n  ".join(" <-> ".join(c) for c in found)
    )


def test_tarjan_finds_each_cycle_and_only_cycles() -> None:
    edges = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},  # a -> b -> c -> a
        "d": {"e"},
        "e": set(),
        "f": {"f"},  # a module importing itself
        "g": {"h"},
        "h": {"g", "e"},
    }
    assert cycles(edges) == [["a", "b", "c"], ["f"], ["g", "h"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_a_lazy_import_planted_in_a_module_closes_a_reported_cycle(tmp_path: Path) -> None:
    imports = imports_by_module()
    planted = tmp_path / "settings.py"
    # schema never imports settings; a function-level import that did would be a cycle
    planted.write_text("def load():\n    from pagesift.core.config import settings\n")
    name = "pagesift.core.config.schema"
    imports[name] = [*imports[name], *imports_of(name, planted)]
    found = cycles(graph(imports))
    assert ["pagesift.core.config.schema", "pagesift.core.config.settings"] in found
