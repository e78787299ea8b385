"""Entry point of ``make bench``: ``python -m bench.run [--section NAME|all]``.

A section is a module ``bench.<name>`` exposing ``run(args: argparse.Namespace) -> None``
and, optionally, ``add_arguments(parser)`` for its own flags. Sections run in the order of
``SECTIONS``; one whose module does not exist (yet) is skipped with a note, so a section
can be added by dropping in its module and naming it here. Each section writes its own
figures under ``bench/out/``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import cast

from bench.common import say

# the NAMEs, in order
SECTIONS = (
    "crawl",
    "replication",
    "streams",
    "failover",
    "misbehaving",
    "documents",
    "freshness",
    "map",
    "export",
    "hostile",
    "render",
    "gateway",
    "cluster",
    "flood",
    "browserbounds",
    "cookiechurn",
    "failsafe",
    "handover",
    "model",
    "modeljobs",
    "selectors",
)


def _load(name: str) -> ModuleType | None:
    module = f"bench.{name}"
    if importlib.util.find_spec(module) is None:
        return None
    return importlib.import_module(module)


def main(argv: list[str] | None = None) -> int:
    modules = {name: _load(name) for name in SECTIONS}
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--section",
        choices=[*SECTIONS, "all"],
        default="all",
        help="which benchmark to run (default all; missing sections are skipped)",
    )
    for mod in modules.values():
        add = getattr(mod, "add_arguments", None)
        if add is not None:
            cast(Callable[[argparse.ArgumentParser], None], add)(ap)
    args = ap.parse_args(argv)
    wanted = SECTIONS if args.section == "all" else (args.section,)
    failed: list[str] = []
    for name in wanted:
        mod = modules[name]
        if mod is None:
            say(f"section {name}: skipped (bench/{name}.py does not exist)")
            continue
        say(f"section {name}: start")
        t0 = time.monotonic()
        try:
            cast(Callable[[argparse.Namespace], None], mod.run)(args)
        except Exception as exc:  # one broken section must not hide the others' figures
            traceback.print_exc()
            say(f"section {name}: FAILED: {type(exc).__name__}: {exc}")
            failed.append(name)
            if args.section != "all":
                raise
        else:
            say(f"section {name}: done in {time.monotonic() - t0:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
