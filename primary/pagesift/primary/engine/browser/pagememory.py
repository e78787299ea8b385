"""The per-page memory cap, enforced while the page runs: a renderer past it is killed.

Owns ``PageMemoryWatch``, one daemon thread per browser (``BrowserPool`` starts it with
the browser when ``browser_page_memory_limit`` is set, stops it when the browser goes).
Every ``EVERY`` seconds while a page is in flight (``IDLE_EVERY`` otherwise) it lists
the browser's renderer processes, the children of its zygotes (found once; read from
``/proc/PID/task/TID/children``, never a scan of /proc; a child is classed by its
command line, and one that still reads ``--type=zygote`` is a fork not yet renamed,
read again at the next reading, never set aside), reads each one's RSS
(``statm``) and sends SIGKILL to any past the limit (``over_limit``, the pure decision),
through a pidfd opened on it and checked to still be the zygote's child, so a pid
reused meanwhile is never hit. Each kill is recorded (``Kill``: when, pid, bytes).

How a kill maps to its page. Chromium binds a renderer process to one browser context
(a ``RenderProcessHost`` serves one ``BrowserContext``: ``IsSuitableHost`` refuses any
other), and the pool gives each one-off page its own context and each job its own
(``pool``), so a renderer holds the pages of one job at most, never another account's.
A page's frames stay in its renderer (the headless shell runs no site-per-process:
``tests/test_browser_bounds.py`` measures it) and popups are refused at launch
(``--block-new-web-contents``: ``window.open`` returns null, ``target=_blank`` opens
nothing), so one renderer is the whole page. The killed renderer's pages get
Playwright's ``crash`` event and the render raises ``BrowserGone``; the pool turns a
crash on a browser whose watch killed a renderer since that render began
(``killed_since``) into ``TOO_LARGE`` naming the cap (``too_large``). Pages of other
contexts run in other processes and go on.

Why it is safe: the thread only reads /proc and signals processes below the browser's
zygotes whose command line says ``--type=renderer``; it never raises (a process that
ended is skipped); it stops when told (``stop``) or when the browser's process is gone.
What it leaves: memory outside the renderers (the browser process, its GPU and network
services) is bounded after the fact by ``browser_memory_limit``'s replacement; a page
can outgrow the cap by what it allocates in one ``EVERY`` (measured by
``bench/browserbounds.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.browser.procs import children, process_type, rss

__all__ = ["EVERY", "Kill", "PageMemoryWatch", "over_limit", "too_large"]

EVERY = 0.05  # seconds between two readings while a page is in flight
IDLE_EVERY = 0.5  # ... while none is
_KILLS_KEPT = 64


@dataclass(frozen=True)
class Kill:
    """A renderer the watch killed: when (monotonic), its pid, its RSS then."""

    at: float
    pid: int
    rss: int


def over_limit(sizes: Mapping[int, int], limit: int) -> list[int]:
    """The pids whose bytes pass ``limit`` (0: none ever), largest first (pure)."""
    if limit <= 0:
        return []
    return sorted((p for p, n in sizes.items() if n > limit), key=lambda p: -sizes[p])


def too_large(kill: Kill, limit: int, url: str) -> PageError:
    """The page error of a page whose renderer the watch killed."""
    return PageError(
        ErrorCode.TOO_LARGE,
        f"the page's renderer passed browser_page_memory_limit ({limit} bytes) while "
        f"rendering {url}: killed at {kill.rss} bytes",
    )


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _kill(pid: int, parent: int) -> bool:
    """SIGKILL ``pid`` if it is still ``parent``'s child (through a pidfd: no reuse)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if _parent(pid) != parent:
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class PageMemoryWatch:
    """Kills the renderers of the browser ``pid`` past ``limit`` bytes (module
    docstring); ``busy()`` says whether a page is in flight (the fast interval)."""

    def __init__(self, pid: int, limit: int, busy: Callable[[], bool] = lambda: True) -> None:
        self.pid = pid
        self.limit = limit
        self.busy = busy
        self.peak = 0  # the largest renderer RSS read
        self.kills = 0
        self._recent: deque[Kill] = deque(maxlen=_KILLS_KEPT)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._zygotes: set[int] = set()
        self._renderers: dict[int, int] = {}  # pid -> its parent, known renderers
        self._others: set[int] = set()  # children that are not renderers
        self._thread = threading.Thread(target=self._run, name=f"page-memory-{pid}", daemon=True)

    def start(self) -> PageMemoryWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def killed_since(self, since: float) -> Kill | None:
        """The latest kill at or after ``since`` (monotonic), or None."""
        with self._lock:
            return next((k for k in reversed(self._recent) if k.at >= since), None)

    def check(self) -> list[Kill]:
        """One reading: kill the renderers past the limit; the kills made."""
        sizes: dict[int, int] = {}
        parents: dict[int, int] = {}
        seen: set[int] = set()
        for parent in self._parents():
            for pid in children(parent):
                seen.add(pid)
                if pid in self._others:
                    continue
                if pid not in self._renderers:
                    kind = process_type(pid)
                    if kind == b"zygote":
                        continue  # just forked, not yet renamed: read it again next time
                    if kind != b"renderer":
                        self._others.add(pid)
                        continue
                    self._renderers[pid] = parent
                parents[pid] = parent
                sizes[pid] = rss(pid)
        for gone in set(self._renderers) - set(parents):
            del self._renderers[gone]
        self._others &= seen  # only live children are remembered
        if sizes:
            self.peak = max(self.peak, max(sizes.values()))
        made = []
        for pid in over_limit(sizes, self.limit):
            if _kill(pid, parents[pid]):
                made.append(Kill(time.monotonic(), pid, sizes[pid]))
        if made:
            with self._lock:
                self._recent.extend(made)
                self.kills += len(made)
        return made

    def _parents(self) -> set[int]:
        """The zygotes (found once), or the browser itself when it has none."""
        if not self._zygotes:
            self._zygotes = {c for c in children(self.pid) if process_type(c) == b"zygote"}
        return self._zygotes or {self.pid}

    def _run(self) -> None:
        while not self._stop.is_set() and os.path.exists(f"/proc/{self.pid}"):
            with contextlib.suppress(Exception):  # a reading never ends the watch
                self.check()
            self._stop.wait(EVERY if self.busy() else IDLE_EVERY)
