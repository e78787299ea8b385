"""CPU and memory of a whole process tree: a crawler and every process below it.

A browser crawler is many processes (the crawler, the Playwright driver, the browser, its
GPU/network/utility processes and one renderer per page), so one process's ``VmHWM`` says
little. Read from ``/proc``:

- ``tree_cpu_seconds``: ``utime+stime+cutime+cstime`` over the live tree; the ``c`` fields
  hold the children each process has reaped, so renderers that exited still count.
- ``tree_memory``: summed ``Pss`` (shared pages split among their users, so the sum is the
  tree's real footprint) and summed ``Rss`` (counts shared pages once per process) from
  ``smaps_rollup``.
- ``CpuByKind``: the tree's CPU over a window split by process kind (``KINDS``: the
  browser's main process, its renderers, its other processes, the Playwright driver, the
  crawler's own process and its other children). Protocol: ``open()`` snapshots every
  process of the tree (``/proc/PID/stat``: own ``utime+stime``, reaped ``cutime+cstime``,
  start time; kind from ``cmdline`` and ``exe``), ``sample()`` (any number, e.g. every
  0.25 s) keeps each process's latest reading, ``close()`` snapshots again and adds up.
  Why the split holds: a process seen in the window counts its own CPU since ``open``
  (or since birth) up to its last reading; what its reaped children used after their
  last reading (or in a life too short to be seen) is the growth of its reaped counters
  less the readings already counted, and goes to the kind of those children (a zygote
  reaps renderers; a parent read before it reaped its last children passes the
  shortfall to its own parent). A process whose parent died (a browser closed before its
  zygote: the zygote goes to init) is followed outside the tree while it lives, so its
  CPU still counts, where ``tree_cpu_seconds`` loses it and all its children reaped;
  only its use after its last reading is lost (``unreaped``: what no process of the tree
  reaped), unless the measuring process is a child subreaper (``become_subreaper``) and
  the window is made with ``adopt=True``: then orphans are reparented to it, a child of
  it started inside the window is the tree's too (the bench starts none itself while a
  window is open), and an adopted process that exits stays a zombie until read once
  more (its final own and reaped counters, so the children it reaped, seen or not, are
  counted) and then reaped here (``os.waitpid`` on that pid only). With no orphan the
  kinds add up to the tree's ``tree_cpu_seconds`` difference; how fine the sampling
  is only decides how much of a child's CPU is attributed through its parent
  (``via_parent``). Processes are keyed by (pid, start time), so a reused pid is a new
  process.
- ``TreeSampler``: the peaks of ``tree_memory``, sampled in a thread every ``interval`` s
  for at most an hour, and the samples of a ``CpuByKind`` window (``open_window`` /
  ``close_window``) on the same thread's ticks.
- ``WindowPipe``: the crawl window of a child that measures its own window (a peer opens
  it when its crawl starts, closes it when the crawl ends): the child writes ``open`` or
  ``close`` on one pipe and waits for ``go`` on the other, so the parent's snapshots land
  exactly at the window's edges. Every read is bounded by a timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PR_SET_CHILD_SUBREAPER = 36

KINDS = ("browser", "renderer", "chromium-other", "driver", "crawler", "crawler-other")
KIND_LABELS = {
    "browser": "chromium browser process",
    "renderer": "chromium renderers (--type=renderer)",
    "chromium-other": "other chromium (zygote, gpu, utility)",
    "driver": "Playwright driver (node)",
    "crawler": "the crawler's own process",
    "crawler-other": "the crawler's other children",
}


def _scan() -> dict[int, list[str]]:
    """pid -> the ``/proc/PID/stat`` fields after the command name (one scan)."""
    table: dict[int, list[str]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = Path(entry.path, "stat").read_text()
                table[int(entry.name)] = raw[raw.rindex(")") + 2 :].split()
    return table


def become_subreaper() -> None:
    """Make this process the child subreaper of its descendants (``prctl``): a process
    orphaned below it is reparented here instead of to init (``CpuByKind(adopt=True)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _descendants(root: int, table: dict[int, list[str]]) -> list[int]:
    """``root`` and every descendant in ``table`` (bounded)."""
    children: dict[int, list[int]] = {}
    for pid, rest in table.items():
        with contextlib.suppress(ValueError, IndexError):
            children.setdefault(int(rest[1]), []).append(pid)
    tree, todo = [root], [root]
    while todo and len(tree) < 100_000:
        kids = children.get(todo.pop(), [])
        tree += kids
        todo += kids
    return tree


def _tree(root: int) -> list[int]:
    """``root`` and every live descendant (one scan of ``/proc``)."""
    return _descendants(root, _scan())


def _ticks_since_boot() -> int:
    """Now, in the unit of ``/proc/PID/stat``'s start time (clock ticks since boot)."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * _CLK_TCK)


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


def process_kind(cmdline: list[str], exe: str, *, is_root: bool, browser: str = "") -> str:
    """The ``KINDS`` entry of one process: ``exe`` (its ``/proc/PID/exe`` target) and
    ``cmdline``; ``browser`` is the browser's executable (resolved here)."""
    if is_root:
        return "crawler"
    first = os.path.basename(cmdline[0]) if cmdline else ""
    real = os.path.realpath(browser) if browser else ""
    is_chromium = (real and exe == real) or "chrom" in os.path.basename(exe) or "chrom" in first
    if is_chromium:
        # a forked child (a zygote's renderer) rewrites its title as ONE string, spaces
        # and no NUL between the arguments: look at its words
        words = [w for a in cmdline for w in (a.split() if " " in a else [a])]
        kind = next((w.split("=", 1)[1] for w in words if w.startswith("--type=")), "")
        if not kind:
            return "browser"
        return "renderer" if kind == "renderer" else "chromium-other"
    if "run-driver" in cmdline:
        return "driver"
    return "crawler-other"


@dataclass(frozen=True, slots=True)
class _Reading:
    """One process at one snapshot: its parent's key, own and reaped CPU seconds."""

    parent: tuple[int, int] | None
    own: float
    reaped: float


@dataclass
class CpuSplit:
    """A window's CPU seconds by kind; ``via_parent``: the part attributed through a
    parent's reaped counters; ``unreaped``: readings of children no process of the tree
    reaped (orphans that died unseen: not taken off any kind); ``total``: the kinds
    added up."""

    seconds: dict[str, float]
    via_parent: float
    unreaped: float
    processes: int  # distinct processes seen in the window
    by_kind_processes: dict[str, int]

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


class CpuByKind:
    """The CPU of ``root``'s tree over one window, by process kind (module docstring)."""

    def __init__(self, root: int, browser: str = "", *, adopt: bool = False) -> None:
        self.root = root
        self.browser = browser
        self.adopt = adopt
        self._opened_at = 0  # clock ticks since boot, as /proc/PID/stat's start time
        self._lock = threading.Lock()
        self._first: dict[tuple[int, int], _Reading] = {}  # at open
        self._last: dict[tuple[int, int], _Reading] = {}
        self._kind: dict[tuple[int, int], str] = {}
        self._open = False

    @property
    def is_open(self) -> bool:
        return self._open

    def _snapshot(self) -> dict[tuple[int, int], _Reading]:
        table = _scan()
        tree = _descendants(self.root, table)
        keys: dict[int, tuple[int, int]] = {}
        for pid in tree:
            with contextlib.suppress(ValueError, IndexError, KeyError):  # root gone: none
                keys[pid] = (pid, int(table[pid][19]))
        # a process seen in this window whose parent died is reparented outside the
        # tree (init, a subreaper): still followed while it lives, with no parent here
        for pid, start in list(self._last):
            if pid not in keys and pid in table:
                with contextlib.suppress(ValueError, IndexError):
                    if int(table[pid][19]) == start:
                        keys[pid] = (pid, start)
        if self.adopt:  # orphans born unseen, reparented to this subreaper
            me = os.getpid()
            for pid, rest in table.items():
                with contextlib.suppress(ValueError, IndexError):
                    if pid not in keys and int(rest[1]) == me and int(rest[19]) >= self._opened_at:
                        keys[pid] = (pid, int(rest[19]))
        now: dict[tuple[int, int], _Reading] = {}
        for pid, key in keys.items():
            rest = table[pid]
            try:
                own = (int(rest[11]) + int(rest[12])) / _CLK_TCK
                reaped = (int(rest[13]) + int(rest[14])) / _CLK_TCK
                ppid = int(rest[1])
            except (ValueError, IndexError):
                continue
            now[key] = _Reading(keys.get(ppid), own, reaped)
            self._classify(key)
            if self.adopt and rest[0] == "Z" and ppid == os.getpid() and pid != self.root:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # its final counters are read
        return now

    def _classify(self, key: tuple[int, int]) -> None:
        """Read the kind again while the process lives (a zygote's fork renames itself
        only after the fork: the latest reading wins)."""
        pid = key[0]
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            self._kind.setdefault(key, "crawler" if pid == self.root else "crawler-other")
            return
        args = [a.decode("utf-8", "replace") for a in cmd if a]
        self._kind[key] = process_kind(args, exe, is_root=pid == self.root, browser=self.browser)

    def open(self) -> None:
        with self._lock:
            self._kind.clear()
            self._opened_at = _ticks_since_boot()
            self._first = self._snapshot()
            self._last = dict(self._first)
            self._open = True

    def sample(self) -> None:
        with self._lock:
            if self._open:
                self._last.update(self._snapshot())

    def close(self) -> CpuSplit:
        with self._lock:
            end = self._snapshot()
            self._last.update(end)
            self._open = False
            return self._split(end)

    def _depth(self, key: tuple[int, int]) -> int:
        """How far below the root ``key`` is, among the processes seen (bounded)."""
        depth, at = 0, self._last.get(key)
        while at is not None and at.parent is not None and depth < 1000:
            depth, at = depth + 1, self._last.get(at.parent)
        return depth

    def _split(self, end: dict[tuple[int, int], _Reading]) -> CpuSplit:
        zero = _Reading(None, 0.0, 0.0)
        seconds = dict.fromkeys(KINDS, 0.0)
        reaped_growth: dict[tuple[int, int], float] = {}
        for key, last in self._last.items():
            first = self._first.get(key, zero)
            seconds[self._kind.get(key, "crawler-other")] += last.own - first.own
            reaped_growth[key] = last.reaped - first.reaped
        # children gone before the end: their CPU after their last reading (and that of
        # children never seen at all) is in their parent's reaped counters
        gone: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for key, last in self._last.items():
            if key not in end and last.parent is not None:
                gone.setdefault(last.parent, []).append(key)
        kids_ever: dict[tuple[int, int], Counter[str]] = {}
        for key, last in self._last.items():
            if last.parent is not None:
                kids_ever.setdefault(last.parent, Counter())[self._kind.get(key, "")] += 1
        rest: dict[tuple[int, int], float] = {}
        for parent, growth in reaped_growth.items():
            counted = sum(self._last[k].own + self._last[k].reaped for k in gone.get(parent, []))
            rest[parent] = growth - counted
        # a parent gone before the end may have been read before it reaped its last
        # children: its rest is short by what they had shown (negative), and that same
        # CPU sits in the rest of ITS parent, which reaped it: move the shortfall up,
        # deepest first, so it is taken off there instead of off the children's kind
        for parent in sorted(rest, key=self._depth, reverse=True):
            up = self._last[parent].parent
            if rest[parent] < 0 and parent not in end and up is not None and up in rest:
                rest[up] += rest[parent]
                rest[parent] = 0.0
        # what is still short was reaped by no process of the tree: children orphaned
        # between two readings (their readings count; what they used after is lost)
        unreaped = sum(max(0.0, -left) for left in rest.values())
        via = 0.0
        for parent, left in rest.items():
            if left < 1e-9:
                continue
            kinds = Counter(self._kind.get(k, "") for k in gone.get(parent, [])) or kids_ever.get(
                parent, Counter()
            )
            kind = kinds.most_common(1)[0][0] if kinds else ""
            seconds[kind or self._kind.get(parent, "crawler-other")] += left
            via += left
        counts = Counter(self._kind.get(k, "crawler-other") for k in self._last)
        return CpuSplit(seconds, via, unreaped, len(self._last), dict(counts))


@dataclass
class TreeSampler:
    """Peak summed PSS/RSS of a process tree, sampled every ``interval`` s in a thread;
    with ``browser`` given, ``open_window``/``close_window`` split a window's CPU by kind."""

    root: int
    interval: float = 0.25
    browser: str = ""
    adopt: bool = False  # CpuByKind's: this process is a subreaper (become_subreaper)
    peak_pss: int = 0
    peak_rss: int = 0
    peak_procs: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _cpu: CpuByKind | None = None

    def start(self) -> TreeSampler:
        self._cpu = CpuByKind(self.root, self.browser, adopt=self.adopt)
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
            if self._cpu is not None:
                self._cpu.sample()
            self._stop.wait(self.interval)

    def open_window(self) -> None:
        assert self._cpu is not None, "start() first"
        self._cpu.open()

    def close_window(self) -> CpuSplit:
        assert self._cpu is not None, "start() first"
        return self._cpu.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


class WindowPipe:
    """The parent's end of a child's window handshake (module docstring). Give the child
    ``child_fds`` (``pass_fds``) and ``child_args``; after starting it call ``started``;
    then ``expect("open", on_open)`` and ``expect("close", on_close)``."""

    def __init__(self) -> None:
        self._from_child, self._child_w = os.pipe()
        self._child_r, self._to_child = os.pipe()
        self._buf = b""

    @property
    def child_fds(self) -> tuple[int, int]:
        return (self._child_w, self._child_r)

    def child_args(self) -> list[str]:
        return ["--sync-out", str(self._child_w), "--sync-in", str(self._child_r)]

    def started(self) -> None:
        """Close the child's ends here, so its exit reads as end of file."""
        for fd in (self._child_w, self._child_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def expect(self, word: str, timeout: float, action: object = None) -> None:
        """Wait (at most ``timeout`` s) for ``word`` from the child, run ``action`` (a
        callable) and answer ``go``. ``RuntimeError`` when the child ends or says else."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no {word!r} from the child in {timeout:.0f}s")
            ready, _, _ = select.select([self._from_child], [], [], min(left, 1.0))
            if ready:
                data = os.read(self._from_child, 256)
                if not data:
                    raise RuntimeError(f"the child ended before saying {word!r}")
                self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        if line.decode("ascii", "replace").strip() != word:
            raise RuntimeError(f"the child said {line!r}, not {word!r}")
        if callable(action):
            action()
        os.write(self._to_child, b"go\n")

    def close(self) -> None:
        for fd in (self._from_child, self._to_child):
            with contextlib.suppress(OSError):
                os.close(fd)
