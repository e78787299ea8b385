"""Invariant 1: nothing writes RocksDB except the store's one write path.

Only ``pagesift.core.store.db`` may import rocksdict or reach the database handle;
everything else writes through ``Store.write`` / ``Store.apply`` (one group = one
atomic WriteBatch = one log entry). ``WriteGroup`` (``pagesift.core.store.groups``)
is no exception: it reads through the point read ``Store`` hands it and holds no handle.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = [ROOT / "shared", ROOT / "primary", ROOT / "standby"]
STORE = ROOT / "shared" / "pagesift" / "core" / "store" / "db.py"


def test_only_the_store_module_touches_rocksdb() -> None:
    # the one exemption is the module that opens RocksDB, not a path left behind by a move
    assert re.search(r"^from rocksdict import", STORE.read_text(), re.M)
    offenders = []
    for base in CODE:
        for path in base.rglob("*.py"):
            if path == STORE or "/v1/" in path.as_posix():
                continue
            text = path.read_text()
            if re.search(r"^\s*(import|from)\s+rocksdict", text, re.M) or "._db" in text:
                offenders.append(path.relative_to(ROOT).as_posix())
    assert offenders == []
