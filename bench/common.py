"""Helpers shared by the benchmark sections: ports, readiness waits, process sampling, facts.

Nothing here measures on its own. What the samplers read, and how:

- CPU seconds of a process: ``utime + stime`` from ``/proc/<pid>/stat`` (all threads),
  divided by ``SC_CLK_TCK``. For a child that has exited, ``wait_rusage`` reaps it with
  ``os.wait4`` and returns the kernel's rusage for that one child.
- Memory: ``VmRSS`` (now) and ``VmHWM`` (peak resident set) from ``/proc/<pid>/status``.
- ``ProcessSampler`` reads both every ``interval`` seconds in a background thread, together
  with an optional progress counter, so a section can show RSS against progress.

Every loop here is bounded by a deadline; all network helpers use loopback addresses only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

# The node's launcher, shared with the drill and the tests (bench sections run in the
# same venv as the node).
from pagesift.core.util.children import Child, serve_argv
from pagesift.core.util.children import free_port as free_port

LOOPBACK = "127.0.0.1"
BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
OUT_DIR = BENCH_DIR / "out"
_CLK_TCK = os.sysconf("SC_CLK_TCK")
MB = 1024 * 1024


def say(msg: str) -> None:
    """Progress line on stdout, flushed (make shows it as it happens)."""
    print(f"[bench] {msg}", flush=True)


def wait_for_port(
    host: str, port: int, timeout: float, proc: subprocess.Popen[Any] | None = None
) -> None:
    """Poll until ``host:port`` accepts a TCP connection; raise on timeout or if ``proc`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{host}:{port} did not accept connections within {timeout:.0f}s")


def wait_for_grpc(
    channel: grpc.Channel,
    probe: Callable[[], object],
    timeout: float,
    proc: subprocess.Popen[Any] | None = None,
) -> float:
    """Poll ``probe`` (one cheap RPC) until it succeeds; return the seconds waited.

    Raises ``TimeoutError`` after ``timeout`` seconds and ``RuntimeError`` as soon as
    ``proc`` (the server, if given) has exited.
    """
    start = time.monotonic()
    deadline = start + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before serving gRPC")
        try:
            grpc.channel_ready_future(channel).result(timeout=0.5)
            probe()
            return time.monotonic() - start
        except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
            last = exc
            time.sleep(0.1)
    raise TimeoutError(f"gRPC server not ready within {timeout:.0f}s (last error: {last!r})")


# ---------------------------------------------------------------------------- /proc readers


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by ``pid`` (all its threads)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    # comm (field 2) may contain spaces/parens: split after the last ')'.
    rest = raw[raw.rindex(")") + 2 :].split()
    utime, stime = int(rest[11]), int(rest[12])  # fields 14 and 15 of stat(5)
    return (utime + stime) / _CLK_TCK


def memory_bytes(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of ``pid`` in bytes; ``(0, 0)`` for a zombie."""
    rss = hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return rss, hwm


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (scans ``/proc``; fine for a handful of processes)."""
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        if int(raw[raw.rindex(")") + 2 :].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` plus its live direct children (e.g. nginx master + workers)."""
    total = 0.0
    for p in [pid, *child_pids(pid)]:
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
    return total


@dataclass
class ChildUsage:
    """What the kernel reports for one reaped child (``os.wait4``)."""

    returncode: int
    cpu_s: float
    maxrss_bytes: int


def wait_rusage(proc: subprocess.Popen[Any], timeout: float) -> ChildUsage:
    """Wait (bounded) for ``proc`` and reap it with ``wait4`` to get its own rusage.

    On timeout the process is killed and ``TimeoutError`` raised.
    """
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(timeout=10)
            raise TimeoutError(f"pid {proc.pid} still running after {timeout:.0f}s; killed")
        time.sleep(0.05)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code  # Popen must not try to reap it again
    return ChildUsage(
        returncode=code,
        cpu_s=usage.ru_utime + usage.ru_stime,
        maxrss_bytes=usage.ru_maxrss * 1024,  # KiB on Linux
    )


def children_rusage() -> tuple[float, int]:
    """``(cpu_s, maxrss_bytes)`` of all reaped children of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024


# ---------------------------------------------------------------------------- sampling


@dataclass
class Sample:
    t: float  # seconds since the sampler started
    progress: int  # pages done so far (-1 if unknown)
    cpu_s: float
    rss_bytes: int


@dataclass
class ProcessSampler:
    """Sample CPU and RSS of ``pid`` every ``interval`` s in a thread, for at most ``max_s``.

    ``progress`` is called from the sampling thread; it must be cheap and thread-safe
    (reading an int an other thread writes is fine in CPython).
    """

    pid: int
    interval: float = 0.1
    max_s: float = 3600.0
    progress: Callable[[], int] | None = None
    samples: list[Sample] = field(default_factory=list)
    peak_rss_bytes: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0

    def start(self) -> ProcessSampler:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name=f"sampler-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample_once(time.monotonic() - self._t0)

    def sample_once(self, t: float) -> None:
        try:
            cpu = cpu_seconds(self.pid)
            rss, hwm = memory_bytes(self.pid)
        except (OSError, ValueError, IndexError):
            return  # gone
        if rss == 0:
            return  # zombie
        self.peak_rss_bytes = max(self.peak_rss_bytes, hwm, rss)
        prog = self.progress() if self.progress is not None else -1
        self.samples.append(Sample(t=t, progress=prog, cpu_s=cpu, rss_bytes=rss))

    def _loop(self) -> None:
        deadline = self._t0 + self.max_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.sample_once(time.monotonic() - self._t0)
            self._stop.wait(self.interval)

    def at_progress(self, fractions: Sequence[float]) -> list[dict[str, float]]:
        """RSS (MB) at the first sample reaching each fraction of the final progress."""
        usable = [s for s in self.samples if s.progress >= 0]
        if not usable:
            return []
        final = max(s.progress for s in usable)
        out: list[dict[str, float]] = []
        for frac in fractions:
            target = frac * final
            hit = next((s for s in usable if s.progress >= target), usable[-1])
            out.append(
                {
                    "fraction": frac,
                    "pages": float(hit.progress),
                    "t_s": round(hit.t, 3),
                    "rss_mb": round(hit.rss_bytes / MB, 1),
                }
            )
        return out


# ---------------------------------------------------------------------------- processes


def start_serve(name: str, args: Sequence[str], log: Path, *, append: bool = False) -> Child:
    """``pagesift serve ARGS`` from the repository directory, started, in its own process
    group (``pagesift.core.util.children.Child``), its output in ``log`` (emptied first, unless
    ``append``). Its ``proc`` is the server process: its pid for the samplers, ``poll``
    for the waits."""
    child = Child(name, serve_argv(*args), log, cwd=REPO_DIR)
    say("$ " + shlex.join(child.argv))
    if not append:
        log.unlink(missing_ok=True)
    child.start()
    return child


def stop_serve(child: Child, grace: float = 20.0) -> int | None:
    """SIGTERM the server (it stops its own workers), SIGKILL its group after ``grace``
    seconds. Returns the server's exit code."""
    child.stop(grace, term_group=False)
    return child.proc.returncode if child.proc is not None else None


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> int | None:
    """SIGTERM, wait up to ``grace`` s, then SIGKILL. Returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace)
    return proc.returncode


def run_checked(cmd: Sequence[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run ``cmd`` to completion (bounded), echoing it; return stdout; raise on failure."""
    say("$ " + shlex.join(cmd))
    res = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if res.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(cmd)} exited {res.returncode}:\n{res.stdout[-2000:]}{res.stderr[-4000:]}"
        )
    return res.stdout


# ---------------------------------------------------------------------------- facts/output


def machine_facts() -> dict[str, Any]:
    """Facts that make figures comparable: cores, CPU model, memory, kernel, date."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_total = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "mem_total_gb": round(mem_total / 1024**3, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "loadavg_1m": round(os.getloadavg()[0], 2),  # >0 before a run = a busy machine
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")


def _json_default(obj: object) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)  # type: ignore[call-overload]
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table; numbers right-aligned."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [all(_is_number(r[i]) for r in cells) and bool(cells) for i in range(len(headers))]
    head = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if n else ("-" * (w + 2))
            for w, n in zip(widths, numeric, strict=True)
        )
        + "|"
    )
    lines = [head, sep]
    for r in cells:
        lines.append(
            "| "
            + " | ".join(
                c.rjust(w) if n else c.ljust(w) for c, w, n in zip(r, widths, numeric, strict=True)
            )
            + " |"
        )
    return "\n".join(lines)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def descendant_pids(pid: int, max_depth: int = 4) -> list[int]:
    """Children, grandchildren... of ``pid`` (bounded depth; e.g. a forkserver's workers)."""
    out: list[int] = []
    level = [pid]
    for _ in range(max_depth):
        level = [c for p in level for c in child_pids(p)]
        if not level:
            break
        out += level
    return out


def subtree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` plus every live descendant (``descendant_pids``)."""
    total = 0.0
    for p in [pid, *descendant_pids(pid)]:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += cpu_seconds(p)
    return total


def subtree_peak_rss(pid: int) -> int:
    """Sum of the peak RSS (VmHWM) of ``pid`` and its live descendants, in bytes (an
    upper bound of the group's peak: the peaks need not coincide)."""
    total = 0
    for p in [pid, *descendant_pids(pid)]:
        with contextlib.suppress(OSError):
            total += memory_bytes(p)[1]
    return total
