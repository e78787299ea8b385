"""Child processes the drill starts: each in its own process group, each stopped for sure.

Owns ``Child`` (one command line run in a NEW session, so its process group holds it
and everything it forks -- a node's extraction workers, a shell's children -- and a
kill reaches all of them at once, and nothing else), ``free_port`` and the registry
of live children that ``kill_leftovers`` empties.

Guarantees: ``kill`` is SIGKILL to the group (a crash: no handler runs); ``stop`` is
SIGTERM to the group, at most ``grace`` seconds, then SIGKILL; every wait is bounded.
A child is only ever signalled through the group its own ``Popen`` created, so the
drill never signals a process it did not start. ``kill_leftovers`` is the last resort
of the ``pagesift drill`` command (after the event loop is gone, e.g. a second Ctrl-C
during cleanup): it SIGKILLs every group still registered.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

_LIVE: set[Child] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` right now (the OS picks it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


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
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.env = env
        self.shell = shell
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

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the whole group and reap the leader (bounded)."""
        self._signal_group(signal.SIGKILL)
        self.wait(timeout)
        self._signal_group(signal.SIGKILL)  # anything the leader forked meanwhile
        _LIVE.discard(self)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the group, then SIGKILL after ``grace`` seconds (bounded)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
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
