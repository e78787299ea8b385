"""Child processes: the one launcher of ``pagesift serve`` (and etcd, and shell commands)
for the drill, the tests and the bench. Each child runs in its own process group and is
stopped for sure.

Owns ``Child`` (one command line run in a NEW session, so its process group holds it
and everything it forks -- a node's extraction workers, a shell's children -- and a
group signal reaches all of them at once, and nothing else), ``serve_argv`` (the one
spelling of a ``pagesift serve`` command line), ``free_port`` and the registry of live
children that ``kill_leftovers`` empties.

Guarantees: ``kill`` is SIGKILL to the group (a crash of the machine: no handler
runs); ``crash`` is SIGKILL to the node process alone (its workers are left to notice
their parent is gone, as after a real crash of that process); ``frozen`` SIGSTOPs the
node process for a block (alive, sockets open, unreachable); ``stop`` is SIGTERM (to the
group, or with ``term_group=False`` to the node process alone, which then stops its
own workers), at most ``grace`` seconds, then SIGKILL to the group. Every wait is
bounded. A child is only ever signalled through the process its own ``Popen`` created,
so no caller signals a process it did not start. ``kill_leftovers`` is the last resort
of the ``pagesift drill`` command (after the event loop is gone, e.g. a second Ctrl-C
during cleanup): it SIGKILLs every group still registered.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

_LIVE: set[Child] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` right now (the OS picks it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def serve_argv(*args: str) -> list[str]:
    """``pagesift serve ARGS`` run by this interpreter (the venv the caller runs in)."""
    return [sys.executable, "-m", "pagesift.cli", "serve", *args]


class Child:
    """One command line, started in its own session, output appended to ``log``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        *,
        env: dict[str, str] | None = None,
        shell: bool = False,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.env = env
        self.shell = shell
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def __hash__(self) -> int:
        return id(self)

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is running already")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        argv = ["/bin/sh", "-c", self.argv[0]] if self.shell else self.argv
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,  # its own process group: pgid == pid
            )
        _LIVE.add(self)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None if still running after ``timeout`` seconds."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _signal_leader(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the whole group and reap the leader (bounded)."""
        self._signal_group(signal.SIGKILL)
        self.wait(timeout)
        self._signal_group(signal.SIGKILL)  # anything the leader forked meanwhile
        _LIVE.discard(self)

    def crash(self, timeout: float = 10.0) -> None:
        """SIGKILL the leader alone and reap it (bounded); what it forked stays in the
        group (``stop`` or ``kill`` still reach it)."""
        if not self.alive:
            raise RuntimeError(f"{self.name} is not running")
        self._signal_leader(signal.SIGKILL)
        self.wait(timeout)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """SIGSTOP the leader for the block, SIGCONT after: alive but unreachable (a
        partition from every peer at once), with its sockets open."""
        if not self.alive:
            raise RuntimeError(f"{self.name} is not running")
        self._signal_leader(signal.SIGSTOP)
        try:
            yield
        finally:
            self._signal_leader(signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM the leader and return at once (``stop`` waits)."""
        self._signal_leader(signal.SIGTERM)

    def stop(self, grace: float = 10.0, *, term_group: bool = True) -> None:
        """SIGTERM the group (or, ``term_group=False``, the leader alone, which stops its
        own children), then SIGKILL the group after ``grace`` seconds (bounded)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            if term_group:
                self._signal_group(signal.SIGTERM)
            else:
                self.terminate()
            self.wait(grace)
        self.kill(timeout=5.0)

    def forget(self) -> None:
        """Leave the group alone from now on (a command that returned: what it started
        in the background is no longer the drill's to stop)."""
        _LIVE.discard(self)

    def tail(self, lines: int = 20) -> str:
        """The last lines of the log (for an error message)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def kill_leftovers() -> int:
    """SIGKILL every child still registered; returns how many there were."""
    left = list(_LIVE)
    for child in left:
        child.kill(timeout=5.0)
    return len(left)
