"""How often a log line an outsider can trigger may be written: one per reason per interval.

What it owns
------------
``Throttle``, a pure decision: ``allow(reason, now) -> (emit, suppressed)``. The first
line of a reason is written (``emit`` True) and opens a window of ``interval`` seconds;
the lines of that reason inside the window are counted and not written; the first line
after the window is written again, carrying the count of the lines it stood for
(``suppressed``), and opens the next window. ``now`` is the caller's clock (monotonic
seconds), so the rule is tested without sleeping.

The guarantee: whatever the rate of the lines of one reason, at most one is written per
``interval`` seconds, and no line is lost without being counted in the next written one
(``pending`` hands out the counts of windows that ended with nothing written after them).
The reasons are the caller's few fixed words (never an address or anything an outsider
chooses); the table is bounded all the same: at ``max_reasons`` reasons, new ones share
the ``OVERFLOW`` reason, so a flood of distinct reasons is one line per interval too.

Why it is safe: no I/O, no clock, no lock (one event loop calls it); the shells
(``pagesift.core.util.listeners``) read the clock and write the lines.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OVERFLOW", "Throttle"]

#: the reason of lines whose own reason found the table full
OVERFLOW = "other"


@dataclass
class _Window:
    opened: float  # when the last written line of this reason was written
    suppressed: int = 0  # lines since then, counted and not written


class Throttle:
    """At most one line per reason per ``interval`` seconds (module docstring)."""

    def __init__(self, interval: float, *, max_reasons: int = 256) -> None:
        if interval < 0:
            raise ValueError("interval must not be negative")
        if max_reasons < 1:
            raise ValueError("max_reasons must be at least 1")
        self.interval = interval
        self.max_reasons = max_reasons
        self._windows: dict[str, _Window] = {}

    def allow(self, reason: str, now: float) -> tuple[bool, int]:
        """Whether a line of ``reason`` at ``now`` is written, and how many lines of it
        were suppressed since the last one written (0 unless ``emit``)."""
        window = self._windows.get(reason)
        if window is None:
            if len(self._windows) >= self.max_reasons:
                self._forget_closed(now)
            if len(self._windows) >= self.max_reasons and reason != OVERFLOW:
                return self.allow(OVERFLOW, now)
            self._windows[reason] = _Window(now)
            return True, 0
        if now - window.opened < self.interval:
            window.suppressed += 1
            return False, 0
        suppressed, window.opened, window.suppressed = window.suppressed, now, 0
        return True, suppressed

    def pending(self, now: float) -> list[tuple[str, int]]:
        """The reasons whose window has ended with lines suppressed and none written
        since, with their counts (each handed out once: a caller writes one summary line
        for each). Their windows start again at ``now``."""
        out: list[tuple[str, int]] = []
        for reason, window in self._windows.items():
            if window.suppressed and now - window.opened >= self.interval:
                out.append((reason, window.suppressed))
                window.opened, window.suppressed = now, 0
        return out

    def _forget_closed(self, now: float) -> None:
        """Drop the windows that have ended with nothing to report."""
        closed = [
            reason
            for reason, w in self._windows.items()
            if not w.suppressed and now - w.opened >= self.interval
        ]
        for reason in closed:
            del self._windows[reason]
