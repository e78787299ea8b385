"""The browser's processes as /proc shows them: its tree, its memory, its leftovers.

Owns the pure-ish readers ``BrowserPool`` uses: ``descendants`` of a process in a
table, ``browser_roots`` (the browser main processes below the node), ``tree_pss`` (the
PSS of a process tree, shared pages counted once), ``tree_rss``, ``sweep_profiles`` (the
``playwright_chromiumdev_profile-*`` folders a killed node left in the temp dir), and the
cheap readers the page-memory watcher polls (``pagememory``): ``children`` (from
``/proc/PID/task/TID/children``, no scan of /proc), ``process_type`` and ``rss``
(``/proc/PID/statm``).

Why it is safe: every read tolerates a process that ended meanwhile (skipped); a sweep
spares any folder a running process names and any folder younger than ``min_age`` (one
being created for a launch).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "PROFILE_PREFIX", "browser_roots", "children", "descendants", "process_type", "rss",
    "sweep_profiles", "tree_pss", "tree_rss",
]  # fmt: skip

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

PROFILE_PREFIX = "playwright_chromiumdev_profile-"
PROFILE_MIN_AGE = 60.0  # seconds: a younger profile folder may belong to a launch


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, exe) of every readable process."""
    table: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            exe = os.readlink(Path(entry.path, "exe"))
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry.name)] = (ppid, exe)
    return table


def descendants(root: int, table: Mapping[int, tuple[int, str]]) -> set[int]:
    """``root`` and every process below it in ``table``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def browser_roots(executable: str, under: int) -> set[int]:
    """Browser main processes (``executable`` whose parent is not) below ``under``."""
    table = _proc_table()
    real = os.path.realpath(executable)
    mine = descendants(under, table)
    return {
        pid
        for pid, (ppid, exe) in table.items()
        if pid in mine and exe == real and table.get(ppid, (0, ""))[1] != real
    }


def tree_pss(root: int) -> int:
    """Bytes of PSS of ``root`` and its descendants (smaps_rollup); 0 if unreadable."""
    total = 0
    for pid in descendants(root, _proc_table()):
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
    return total


def tree_rss(root: int) -> int:
    """Bytes of RSS of ``root`` and its descendants (``statm``; shared pages counted in
    each process, so above the PSS); 0 if unreadable."""
    return sum(rss(pid) for pid in descendants(root, _proc_table()))


def children(pid: int) -> set[int]:
    """The child processes of ``pid`` (every thread's ``children`` file); empty when it
    is gone."""
    found: set[int] = set()
    with contextlib.suppress(OSError, ValueError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                found.update(
                    int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                )
    return found


def process_type(pid: int) -> bytes | None:
    """The Chromium process type ``pid``'s command line names (``b"renderer"``,
    ``b"zygote"``, ...; ``b""`` when it names none), or None when it is gone. Chromium
    rewrites its title, so the whole line is searched; a renderer the zygote has just
    forked still reads ``zygote`` until it renames itself."""
    try:
        line = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    at = line.find(b"--type=")
    if at < 0:
        return b""
    rest = line[at + len(b"--type=") :]
    end = min((i for i in (rest.find(b" "), rest.find(b"\0")) if i >= 0), default=len(rest))
    return rest[:end]


def rss(pid: int) -> int:
    """Bytes resident of ``pid`` (``statm``'s second field); 0 when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


def _live_profiles() -> set[str]:
    live: set[str] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for arg in Path(entry.path, "cmdline").read_bytes().split(b"\0"):
                if PROFILE_PREFIX.encode() in arg:
                    live.add(os.path.basename(arg.decode(errors="replace").split("=", 1)[-1]))
    return live


def sweep_profiles(
    tmpdir: str | None = None,
    live: Iterable[str] | None = None,
    *,
    min_age: float = PROFILE_MIN_AGE,
    now: float | None = None,
) -> list[str]:
    """Remove ``playwright_chromiumdev_profile-*`` folders of ``tmpdir`` that no running
    process names (``live``: their base names; read from /proc when None) and that are
    at least ``min_age`` seconds old (one being created for a launch is spared)."""
    base = tmpdir or tempfile.gettempdir()
    keep = set(_live_profiles() if live is None else live)
    at = time.time() if now is None else now
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            if not entry.name.startswith(PROFILE_PREFIX) or entry.name in keep:
                continue
            with contextlib.suppress(OSError):
                if at - entry.stat(follow_symlinks=False).st_mtime < min_age:
                    continue
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed
