"""The opt-in write trace: one line per write a primary committed, for fault-injection checks.

What it owns
------------
``WriteTrace`` appends ``<CLOCK_MONOTONIC ns> <node id> <epoch> <offset>`` to the file
named by ``PAGESIFT_WRITE_TRACE`` each time ``Log.committed`` finishes a write group
that this node staged as the primary (never for entries a standby applies). ``from_env``
returns None when the variable is unset or empty: the default, and then the log pays
one ``is None`` check per write and nothing else.

Layout
------
One text line per committed group, space-separated, ``\\n``-terminated. The node id is
the data directory's ``NODE_ID`` (``pagesift.node.startup.node_id``: what
``AdminService.Role`` reports), or the data directory's path when there is none yet.
The checker (``tests/writechecker.py``) reads the lines of every node of a run from
one file.

The guarantee, and why it is safe
---------------------------------
Each line is written with ONE ``write(2)`` on a descriptor opened ``O_APPEND``: the
kernel positions each such write at the end of the file atomically, so lines of
several processes (both nodes of a pair, on one host) never interleave within a line,
and CLOCK_MONOTONIC is one clock for every process of the host, so the stamps of two
nodes compare. The stamp is taken after the group is durable (inside the store's
write section, which serialises one node's writes), so a node's stamps follow its
offsets. A failed trace write is dropped: the trace observes, it never fails a write.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: the environment variable naming the trace file (unset or empty: no trace)
ENV = "PAGESIFT_WRITE_TRACE"


class WriteTrace:
    """Appends one line per committed write of this node to ``path``."""

    def __init__(self, path: str, node: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._node = node

    def committed(self, epoch: int, offset: int) -> None:
        line = f"{time.monotonic_ns()} {self._node} {epoch} {offset}\n".encode()
        try:
            os.write(self._fd, line)
        except OSError:
            return  # an observer: a full disk must not turn into a failed write

    def close(self) -> None:
        os.close(self._fd)


def from_env(store_path: Path) -> WriteTrace | None:
    """The trace of the store at ``store_path`` (a data directory's ``store-*``), when
    ``PAGESIFT_WRITE_TRACE`` names a file."""
    path = os.environ.get(ENV, "")
    if not path:
        return None
    data = store_path.parent
    id_file = data / "NODE_ID"
    node = id_file.read_text().strip() if id_file.exists() else str(data)
    return WriteTrace(path, node)
