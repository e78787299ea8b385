"""The page-memory watch on real processes shaped like Chromium's tree (no browser).

This test process stands for the browser; a child whose command line says
``--type=zygote`` stands for its zygote; the zygote forks, and the fork keeps reading
``--type=zygote`` for a while (as a renderer Chromium's zygote has just forked does,
until it renames itself) before it becomes a ``--type=renderer`` that allocates past
the cap. The watch must kill it: a fork read while it still looked like a zygote is
read again, never set aside for good (the flake CI met on a loaded box: a 2 GiB page
rendered under a 384 MiB cap).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from pagesift.primary.engine.browser import pagememory
from pagesift.primary.engine.browser.procs import children, process_type

MiB = 1 << 20

RENDERER = (
    "import time\n"
    "keep = b'x' * (160 << 20)\n"  # resident: a bytes object is written when made
    "time.sleep(60)\n"
)
# the fork stays a zygote-looking process (this line) for RENAME_AFTER seconds, then
# execs the renderer in place (same pid, new command line)
ZYGOTE = (
    "import os, sys, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    time.sleep(float(sys.argv[2]))\n"
    "    renderer = '--type' + '=renderer'  # split: this script's own line names one type\n"
    "    os.execv(sys.executable, [sys.executable, '-c', sys.argv[1], renderer])\n"
    "os.waitpid(pid, 0)\n"
)
RENAME_AFTER = 1.0


def test_process_type_reads_the_type_a_command_line_names() -> None:
    zygote = subprocess.Popen(
        [sys.executable, "-c", "import time; print(flush=True); time.sleep(30)", "--type=zygote"],
        stdout=subprocess.PIPE,
    )
    try:
        assert zygote.stdout is not None
        zygote.stdout.readline()  # it runs its own command line now (exec is done)
        assert process_type(zygote.pid) == b"zygote"
        assert process_type(os.getpid()) == b""
    finally:
        zygote.kill()
        zygote.wait()
    assert process_type(zygote.pid) is None


def test_a_fork_that_still_reads_zygote_is_watched_and_killed_once_it_grows() -> None:
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE, RENDERER, str(RENAME_AFTER), "--type=zygote"]
    )
    watch = pagememory.PageMemoryWatch(os.getpid(), 64 * MiB)
    try:
        deadline = time.monotonic() + 20
        fork = 0
        while not fork and time.monotonic() < deadline:
            fork = next(iter(children(zygote.pid)), 0)
            time.sleep(0.01)
        assert fork, "the zygote never forked"
        while process_type(fork) == b"zygote" and time.monotonic() < deadline:
            watch.check()  # reads the fork while it still looks like a zygote
            time.sleep(0.05)
        kills: list[pagememory.Kill] = []
        while not kills and time.monotonic() < deadline:
            kills = watch.check()
            time.sleep(0.05)
        assert [k.pid for k in kills] == [fork], (kills, process_type(fork))
        assert kills[0].rss > 64 * MiB
        assert watch.killed_since(kills[0].at) == kills[0]
        assert zygote.wait(timeout=20) == 0  # its child is gone: waitpid returned
    finally:
        watch.stop()
        zygote.kill()
        zygote.wait()
