"""CPU and memory of a whole process tree: a crawler and every process below it.

A browser crawler is many processes (the crawler, the Playwright driver, the browser, its
GPU/network/utility processes and one renderer per page), so one process's ``VmHWM`` says
little. Read from ``/proc``:

- ``tree_cpu_seconds``: ``utime+stime+cutime+cstime`` over the live tree; the ``c`` fields
  hold the children each process has reaped, so renderers that exited still count.
- ``tree_memory``: summed ``Pss`` (shared pages split among their users, so the sum is the
  tree's real footprint) and summed ``Rss`` (counts shared pages once per process) from
  ``smaps_rollup``.
- ``TreeSampler``: their peaks, sampled in a thread every ``interval`` s, for at most an hour.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> list[int]:
    """``root`` and every live descendant (one scan of ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = (entry / "stat").read_text()
                ppid = int(raw[raw.rindex(")") + 2 :].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [root], [root]
    while todo and len(tree) < 100_000:
        kids = children.get(todo.pop(), [])
        tree += kids
        todo += kids
    return tree


def tree_cpu_seconds(root: int) -> float:
    """CPU of ``root`` and its live descendants, children they reaped included."""
    total = 0.0
    for p in _tree(root):
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = Path(f"/proc/{p}/stat").read_text()
            total += sum(int(x) for x in raw[raw.rindex(")") + 2 :].split()[11:15]) / _CLK_TCK
    return total


def tree_memory(root: int) -> tuple[int, int, int]:
    """``(summed PSS, summed RSS, processes)`` of the tree now, in bytes."""
    pss = rss = n = 0
    for p in _tree(root):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
            n += 1
    return pss, rss, n


@dataclass
class TreeSampler:
    """Peak summed PSS/RSS of a process tree, sampled every ``interval`` s in a thread."""

    root: int
    interval: float = 0.25
    peak_pss: int = 0
    peak_rss: int = 0
    peak_procs: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        deadline = time.monotonic() + 3600
        while not self._stop.is_set() and time.monotonic() < deadline:
            pss, rss, n = tree_memory(self.root)
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_procs = max(self.peak_procs, n)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
