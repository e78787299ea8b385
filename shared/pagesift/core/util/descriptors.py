"""A process's file descriptors: its RLIMIT_NOFILE raised, and a reserve HTTP cannot take.

What it owns
------------
``raise_soft_limit`` (the soft RLIMIT_NOFILE up to the hard one, at start) and ``plan``,
the pure arithmetic of a process's descriptor budget::

    reserve = sum(parts)                       # what the process needs besides HTTP
    slack   = listeners x 2 x BACKLOG          # sockets accepted before the gate resets them
    http    = limit - reserve - slack          # every HTTP listener's connections together

A process (``pagesift serve``: ``pagesift.node.fdreserve``; ``pagesift gateway``) names
its parts, each a bound of what that part holds (the store's ``max_open_files``, the
gRPC port's connections, the workers' pipes...), and gives its HTTP listeners caps whose
sum is at most ``http`` (``Budget.split``). The guarantee: HTTP connections, counted at
accept by ``pagesift.core.util.listeners.ConnectionGate``, plus the sockets an accept
turn takes before the gate has reset them, never reach into the reserve, so no count of
HTTP connections can starve the parts (``Budget.line`` states the arithmetic; the
process logs it at start).

Why the slack: asyncio accepts up to ``BACKLOG`` sockets per readiness of a listening
socket, and the gate sees them one loop turn later; refused ones are freed in the turn
after. Two turns' worth per listener covers it.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Mapping
from dataclasses import dataclass

from pagesift.core.util.connlimits import BACKLOG

__all__ = ["Budget", "plan", "raise_soft_limit"]

#: where the soft limit is raised to when the hard limit is unlimited
UNLIMITED_TARGET = 1 << 20


def raise_soft_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (``UNLIMITED_TARGET`` if that is
    unlimited); the (soft, hard) in force after. A refusal leaves the soft limit as is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def soft_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return UNLIMITED_TARGET if soft == resource.RLIM_INFINITY else soft


@dataclass(frozen=True)
class Budget:
    """A process's descriptors: ``limit`` (the soft RLIMIT_NOFILE), the ``parts`` of the
    reserve, the accept ``slack`` and what is left for HTTP connections (``http``)."""

    limit: int
    parts: tuple[tuple[str, int], ...]
    slack: int

    @property
    def reserve(self) -> int:
        return sum(n for _, n in self.parts)

    @property
    def http(self) -> int:
        return max(0, self.limit - self.reserve - self.slack)

    def split(self, wanted: Mapping[str, int]) -> dict[str, int]:
        """Each listener's cap: what it ``wanted`` when together they fit ``http``;
        else shared out smallest first (a small listener, ``/metrics``, keeps its cap; the
        largest takes what is left). Each keeps at least 1, and the sum never passes
        ``http`` unless ``http`` is smaller than the number of listeners."""
        caps: dict[str, int] = {}
        left = self.http
        order = sorted(wanted.items(), key=lambda item: item[1])
        for i, (name, n) in enumerate(order):
            caps[name] = max(1, min(n, left // (len(order) - i)))
            left = max(0, left - caps[name])
        return {name: caps[name] for name in wanted}

    def line(self) -> str:
        """The arithmetic, for the start-up log line."""
        parts = " + ".join(f"{name} {n}" for name, n in self.parts)
        return (
            f"descriptors: limit {self.limit} - reserve {self.reserve} ({parts}) - "
            f"accept slack {self.slack} = {self.http} for HTTP connections"
        )


def plan(limit: int, parts: Mapping[str, int], listeners: int) -> Budget:
    """The budget of a process with ``limit`` descriptors, the reserve ``parts`` and
    ``listeners`` HTTP listening sockets (module docstring)."""
    if any(n < 0 for n in parts.values()):
        raise ValueError("a reserve part must not be negative")
    return Budget(limit, tuple(parts.items()), listeners * 2 * BACKLOG)
