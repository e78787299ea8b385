"""The render bench's process-tree CPU split (``bench.proctree``) on real processes.

A root process (the "crawler") burns CPU and starts a fake browser (a Python process
whose ``argv[0]`` names chromium, so ``process_kind`` calls it the browser), which burns
CPU and runs short-lived "renderers" (``--type=renderer``) one after another, each burning
a known amount and reaped by the fake browser. Most renderers live between two samples
or without any sample at all, so their CPU is only in the browser's reaped counters: the
split must put it under ``renderer`` all the same, and the kinds must add up to the
tree's CPU; and what an orphan never seen in the tree did is counted when the measuring
process is a child subreaper, and lost when not. Also the window handshake
(``WindowPipe``) with a child that opens and closes its own window, and the kind of each
process from its command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench.proctree import (
    CpuByKind,
    CpuSplit,
    TreeSampler,
    WindowPipe,
    process_kind,
    tree_cpu_seconds,
)

REPO = Path(__file__).resolve().parent.parent

BURN = textwrap.dedent(
    """
    import time
    def burn(s):
        t = time.process_time() + s
        while time.process_time() < t:
            pass
    """
)
RENDERERS = 6
RENDERER_CPU = 0.15

BROWSER = BURN + textwrap.dedent(
    f"""
    import subprocess, sys
    burn(0.2)
    child = {BURN!r} + "burn({RENDERER_CPU})"
    for _ in range({RENDERERS}):
        subprocess.run(["chromium-fake", "-c", child, "--type=renderer"],
                       executable={sys.executable!r}, check=True, timeout=60)
    print("renderers done", flush=True)
    sys.stdin.readline()
    """
)

ROOT = BURN + textwrap.dedent(
    f"""
    import subprocess, sys
    sys.stdin.readline()  # the window is open
    burn(0.2)
    browser = subprocess.Popen(["chromium-fake", "-c", {BROWSER!r}], executable={sys.executable!r},
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert browser.stdout.readline().strip() == "renderers done"
    print("done", flush=True)
    sys.stdin.readline()  # the window is closed
    browser.stdin.write("bye\\n"); browser.stdin.flush(); browser.wait(timeout=60)
    """
)


def _run_tree(sample_every: float | None) -> tuple[dict[str, float], float, float]:
    """The split of one run, its ``via_parent`` part and the tree's own CPU difference."""
    root = subprocess.Popen(
        [sys.executable, "-c", ROOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert root.stdin is not None and root.stdout is not None
    try:
        sampler = TreeSampler(root.pid, interval=sample_every or 3600).start()
        time.sleep(0.2)
        cpu0 = tree_cpu_seconds(root.pid)
        split_of = sampler if sample_every else CpuByKind(root.pid)
        if isinstance(split_of, TreeSampler):
            split_of.open_window()
        else:
            split_of.open()
        root.stdin.write("go\n")
        root.stdin.flush()
        assert root.stdout.readline().strip() == "done"
        split = split_of.close_window() if isinstance(split_of, TreeSampler) else split_of.close()
        cpu = tree_cpu_seconds(root.pid) - cpu0
        sampler.stop()
        root.stdin.write("end\n")
        root.stdin.flush()
        assert root.wait(timeout=60) == 0
    finally:
        if root.poll() is None:
            root.kill()
            root.wait(timeout=30)
    return split.seconds, split.via_parent, cpu


def test_the_split_puts_reaped_renderers_under_renderer_and_adds_up() -> None:
    seconds, via_parent, tree = _run_tree(0.05)
    # each renderer burned RENDERER_CPU (plus its interpreter's start), all reaped, most
    # of it after their last sample: through the browser's counters, under their kind
    assert seconds["renderer"] >= RENDERERS * RENDERER_CPU * 0.95
    assert 0.2 * 0.95 <= seconds["browser"] < 0.2 + RENDERER_CPU
    assert seconds["crawler"] >= 0.2 * 0.95
    assert seconds["driver"] == 0.0
    assert via_parent > 0.0
    # the kinds add up to the tree's CPU (clock ticks: 10 ms each, a few per process)
    assert abs(sum(seconds.values()) - tree) < 0.1


def test_without_samples_the_unseen_children_still_count_through_their_parent() -> None:
    seconds, via_parent, tree = _run_tree(None)
    # no renderer was ever seen: their CPU is all via the browser, whose kind it takes
    assert via_parent >= RENDERERS * RENDERER_CPU * 0.95
    assert seconds["browser"] >= 0.2 + RENDERERS * RENDERER_CPU * 0.95
    assert abs(sum(seconds.values()) - tree) < 0.1


# a browser that ends right after its renderer: read last before it reaped the renderer
SHORT_BROWSER = textwrap.dedent(
    f"""
    import subprocess
    child = {BURN!r} + "burn(0.4)"
    subprocess.run(["chromium-fake", "-c", child, "--type=renderer"],
                   executable={sys.executable!r}, check=True, timeout=60)
    """
)
SHORT_ROOT = textwrap.dedent(
    f"""
    import subprocess, sys
    sys.stdin.readline()  # the window is open
    subprocess.run(["chromium-fake", "-c", {SHORT_BROWSER!r}], executable={sys.executable!r},
                   check=True, timeout=60)
    print("done", flush=True)
    sys.stdin.readline()  # the window is closed
    """
)


def _window_over(root_code: str, line: str, settle: float = 0.0) -> tuple[CpuSplit, float]:
    """Run ``root_code`` (it waits for "go", prints ``line`` once its children's work is
    done, then waits for "end") with a sampler's window open around its work; the
    window's split and the tree's own CPU counters' delta over it."""
    root = subprocess.Popen(
        [sys.executable, "-c", root_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert root.stdin is not None and root.stdout is not None
    try:
        sampler = TreeSampler(root.pid, interval=0.05).start()
        time.sleep(0.2)
        cpu0 = tree_cpu_seconds(root.pid)
        sampler.open_window()
        root.stdin.write("go\n")
        root.stdin.flush()
        assert root.stdout.readline().strip() == line
        time.sleep(settle)
        split = sampler.close_window()
        cpu = tree_cpu_seconds(root.pid) - cpu0
        sampler.stop()
        root.stdin.write("end\n")
        root.stdin.flush()
        assert root.wait(timeout=60) == 0
    finally:
        if root.poll() is None:
            root.kill()
            root.wait(timeout=30)
    return split, cpu


def test_a_parent_gone_before_its_last_reading_caught_up_keeps_its_childrens_kind() -> None:
    split, cpu = _window_over(SHORT_ROOT, "done")
    # the renderer's burn stays its own, nothing goes negative, and it all adds up
    assert split.seconds["renderer"] >= 0.4 * 0.8
    assert min(split.seconds.values()) >= 0.0
    assert abs(split.total - cpu) < 0.1


# a browser that leaves its renderer behind (seen in the tree first): the renderer burns
# on once its parent is gone, reparented outside the tree
ORPHANING_BROWSER = textwrap.dedent(
    f"""
    import subprocess, time
    child = {BURN!r} + "time.sleep(0.6); burn(0.4); print('renderer done', flush=True)"
    subprocess.Popen(["chromium-fake", "-c", child, "--type=renderer"],
                     executable={sys.executable!r})
    time.sleep(0.3)
    """
)
ORPHAN_ROOT = textwrap.dedent(
    f"""
    import subprocess, sys
    sys.stdin.readline()  # the window is open
    subprocess.run(["chromium-fake", "-c", {ORPHANING_BROWSER!r}], executable={sys.executable!r},
                   check=True, timeout=60)
    sys.stdin.readline()  # the window is closed
    """
)


def test_a_child_orphaned_by_its_parent_still_counts() -> None:
    # the renderer inherited the root's stdout: its line comes once its burn is over;
    # 0.2 s more and it has exited (and init reaped it)
    split, lost = _window_over(ORPHAN_ROOT, "renderer done", settle=0.2)
    # the tree's counters never see the orphan; the split follows it
    assert lost < 0.4 * 0.5
    assert split.seconds["renderer"] >= 0.4 * 0.8
    assert min(split.seconds.values()) >= 0.0


def test_process_kinds_from_the_command_line() -> None:
    shell = "/usr/lib/chromium/chromium-headless-shell"
    assert process_kind(["python"], "/usr/bin/python3.11", is_root=True) == "crawler"
    assert process_kind([shell, "--headless"], shell, is_root=False, browser=shell) == "browser"
    renderer = [shell, "--type=renderer", "--lang=en"]
    assert process_kind(renderer, shell, is_root=False, browser=shell) == "renderer"
    # a zygote's fork rewrites its title as one string (no NUL between arguments)
    retitled = [f"{shell} --type=renderer --headless=old --no-sandbox"]
    assert process_kind(retitled, shell, is_root=False, browser=shell) == "renderer"
    for other in ("zygote", "gpu-process", "utility"):
        cmd = [shell, f"--type={other}"]
        assert process_kind(cmd, shell, is_root=False, browser=shell) == "chromium-other"
    driver = ["/x/playwright/driver/node", "/x/package/cli.js", "run-driver"]
    assert process_kind(driver, "/x/playwright/driver/node", is_root=False) == "driver"
    worker = ["/venv/bin/python", "-m", "pagesift.primary.engine.workerproc"]
    assert process_kind(worker, "/usr/bin/python3.11", is_root=False) == "crawler-other"


CHILD = textwrap.dedent(
    """
    import os, sys, time
    out, inp = int(sys.argv[1]), int(sys.argv[2])
    def sync(word):
        os.write(out, word.encode() + b"\\n")
        assert os.read(inp, 64) == b"go\\n"
    sync("open")
    t = time.process_time() + 0.3
    while time.process_time() < t:
        pass
    sync("close")
    """
)


def test_the_window_pipe_measures_between_the_childs_edges() -> None:
    pipe = WindowPipe()
    out, inp = pipe.child_fds
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(out), str(inp)], pass_fds=pipe.child_fds
    )
    pipe.started()
    try:
        sampler = TreeSampler(child.pid).start()
        pipe.expect("open", 60, sampler.open_window)
        got: list[float] = []
        pipe.expect("close", 60, lambda: got.append(sampler.close_window().seconds["crawler"]))
        sampler.stop()
        assert child.wait(timeout=60) == 0
    finally:
        pipe.close()
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    # the burn inside the window, not the interpreter's start before it
    assert 0.3 * 0.95 <= got[0] < 0.3 + 0.15


def test_a_child_that_dies_before_its_window_is_an_error() -> None:
    pipe = WindowPipe()
    child = subprocess.Popen([sys.executable, "-c", "pass"], pass_fds=pipe.child_fds)
    pipe.started()
    try:
        with pytest.raises(RuntimeError, match="ended before"):
            pipe.expect("open", 60)
    finally:
        pipe.close()
        child.wait(timeout=30)


# a browser that starts its zygote and exits at once; the zygote, orphaned, runs one
# renderer and reaps it: none of it is ever seen inside the tree (no sample in between)
ZYGOTE = textwrap.dedent(
    f"""
    import subprocess, sys, time
    time.sleep(0.3)
    subprocess.run(["chromium-fake", "-c", {BURN!r} + "burn(0.4)", "--type=renderer"],
                   executable={sys.executable!r}, check=True, timeout=60)
    print("renderer done", flush=True)
    """
)
LEAVING_BROWSER = textwrap.dedent(
    f"""
    import subprocess
    subprocess.Popen(["chromium-fake", "-c", {ZYGOTE!r}, "--type=zygote"],
                     executable={sys.executable!r})
    """
)
MEASURER = textwrap.dedent(
    f"""
    import json, os, subprocess, sys, time
    from bench.proctree import CpuByKind, become_subreaper
    adopt = sys.argv[1] == "adopt"
    if adopt:
        become_subreaper()
    root_code = "import subprocess, sys\\n" \\
        "sys.stdin.readline()\\n" \\
        "subprocess.run(['chromium-fake', '-c', " + repr({LEAVING_BROWSER!r}) + "], " \\
        "executable=sys.executable, check=True, timeout=60)\\n" \\
        "sys.stdin.readline()\\n"
    root = subprocess.Popen([sys.executable, "-c", root_code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    cpu = CpuByKind(root.pid, adopt=adopt)
    time.sleep(0.2)
    cpu.open()
    root.stdin.write("go\\n"); root.stdin.flush()
    assert root.stdout.readline().strip() == "renderer done"
    time.sleep(0.3)  # the zygote has exited
    split = cpu.close()
    me = str(os.getpid())
    zombies = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            rest = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        zombies += rest[0] == "Z" and rest[1] == me and int(pid) != root.pid
    root.stdin.write("end\\n"); root.stdin.flush()
    assert root.wait(timeout=60) == 0
    print(json.dumps({{"total": split.total, "zombies": zombies}}))
    """
)


def _measure_orphans(mode: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", MEASURER, mode], capture_output=True, text=True, timeout=120,
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, float] = json.loads(done.stdout)
    return result


def test_a_subreaper_counts_what_an_orphan_unseen_did_and_reaps_it() -> None:
    adopted = _measure_orphans("adopt")
    assert adopted["total"] >= 0.4 * 0.8  # the renderer, through the zygote's zombie
    assert adopted["zombies"] == 0
    # the same tree measured without: the orphan went to init, its CPU with it
    assert _measure_orphans("plain")["total"] < 0.4 * 0.5
