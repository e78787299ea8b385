"""The event-loop lag monitor: how late the node's event loop runs what is due.

What it owns
------------
``LoopLagMonitor`` is one task per node, whatever its role (primary, standby, fenced,
or waiting for a witness), started by ``Node.start`` and stopped by ``Node.close``.
It sleeps ``loop_lag_interval`` seconds (0.25 by default) and measures how late it
woke: ``lag = now - (when it slept + interval)``. Anything that holds the loop (a
parse of untrusted bytes, a long synchronous store call) delays every RPC by as
much, and shows here. Each measurement is observed into
``pagesift_event_loop_lag_seconds`` (a histogram, 1 ms .. 60 s, ``LAG_BUCKETS``) and
``pagesift_event_loop_lag_max_seconds`` (the largest since the process started), so
``make bench`` can read p99 (``quantile``, from the scraped buckets) and max.

Past ``loop_lag_warn_seconds`` (0.5 by default; 0 = never) it logs a WARNING on the
``pagesift.looplag`` logger, with structured fields (``lag_seconds``,
``threshold_seconds``, ``suppressed``, ``worst_seconds``: a JSON log line carries
them), at most one line per ``LOG_EVERY`` seconds: the lags in between are counted
and their worst is reported with the next line, so a node stuck in a bad state does
not flood its log.

Layout
------
``lag`` and ``LagLog.step`` are pure (they take the expected and actual wake times,
and ``now``), tested with a fake clock; ``LoopLagMonitor`` is the thin asyncio shell.

Why it is safe
--------------
The monitor only sleeps and observes: it takes no lock, touches no store, and a
failure inside it is logged and ends only the monitor. It measures on the loop's own
clock (``loop.time()``), the one ``asyncio.sleep`` schedules by.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pagesift.core.api.metrics import LAG_BUCKETS, Metrics

__all__ = ["LOG_EVERY", "LagLine", "LagLog", "LoopLagMonitor", "lag", "lag_buckets", "quantile"]

logger = logging.getLogger("pagesift.looplag")

LOG_EVERY = 10.0  # seconds between two lag lines at most one


def lag(expected: float, now: float) -> float:
    """How late a timer due at ``expected`` ran at ``now`` (never negative)."""
    return max(0.0, now - expected)


@dataclass(frozen=True)
class LagLine:
    """A WARNING to log: this lag, and the lags over the threshold it stood for."""

    lag: float
    threshold: float
    suppressed: int  # lags over the threshold since the last line, not logged
    worst: float  # the worst of those and this one

    def message(self) -> str:
        text = (
            f"event loop lagged {self.lag:.3f} s (threshold {self.threshold:g} s): "
            "something held the loop, every RPC of this node waited as long"
        )
        if self.suppressed:
            text += f"; {self.suppressed} more since the last line, worst {self.worst:.3f} s"
        return text

    def fields(self) -> dict[str, float | int]:
        return {
            "lag_seconds": round(self.lag, 6),
            "threshold_seconds": self.threshold,
            "suppressed": self.suppressed,
            "worst_seconds": round(self.worst, 6),
        }


@dataclass
class LagLog:
    """Which lags become a log line: over ``threshold`` (0: none), one per ``every`` s."""

    threshold: float
    every: float = LOG_EVERY
    last_logged: float | None = None
    suppressed: int = 0
    worst: float = 0.0

    def step(self, lagged: float, now: float) -> LagLine | None:
        if self.threshold <= 0 or lagged < self.threshold:
            return None
        worst = max(self.worst, lagged)
        if self.last_logged is not None and now - self.last_logged < self.every:
            self.suppressed += 1
            self.worst = worst
            return None
        line = LagLine(lagged, self.threshold, self.suppressed, worst)
        self.last_logged, self.suppressed, self.worst = now, 0, 0.0
        return line


class LoopLagMonitor:
    """The task that measures the running loop's lag into ``metrics``."""

    def __init__(self, metrics: Metrics, interval: float, threshold: float) -> None:
        self.metrics = metrics
        self.interval = interval
        self.log = LagLog(threshold)
        self.max_lag = 0.0
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="pagesift-looplag")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def record(self, lagged: float, now: float) -> LagLine | None:
        """One measurement: the metrics, and the line to log if one is due."""
        self.metrics.event_loop_lag.observe(lagged)
        if lagged > self.max_lag:
            self.max_lag = lagged
            self.metrics.event_loop_lag_max.set(lagged)
        return self.log.step(lagged, now)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                expected = loop.time() + self.interval
                await asyncio.sleep(self.interval)
                now = loop.time()
                line = self.record(lag(expected, now), now)
                if line is not None:
                    logger.warning("%s", line.message(), extra=line.fields())
        except asyncio.CancelledError:
            raise
        except Exception:  # never silently: the node would lose its lag figures
            logger.exception("the event-loop lag monitor failed; lag is no longer measured")


def quantile(buckets: Mapping[float, float], q: float) -> float:
    """The ``q`` quantile (0..1) of a histogram given as cumulative counts by upper
    bound (``le``, ``math.inf`` last, as ``/metrics`` shows ``_bucket``): the upper
    bound of the first bucket that holds it (an upper estimate; ``math.inf`` when it
    is past the last finite bound; 0.0 for an empty histogram)."""
    bounds = sorted(buckets)
    if not bounds:
        return 0.0
    total = buckets[bounds[-1]]
    if total <= 0:
        return 0.0
    rank = q * total
    for le in bounds:
        if buckets[le] >= rank:
            return le
    return math.inf


def lag_buckets(sample: Callable[[str, dict[str, str]], float | None]) -> dict[float, float]:
    """``pagesift_event_loop_lag_seconds``' cumulative buckets, by upper bound, read
    through ``sample(name, labels)`` (e.g. a registry's ``get_sample_value``)."""
    out: dict[float, float] = {}
    for le in (*LAG_BUCKETS, math.inf):
        label = "+Inf" if le == math.inf else repr(float(le))
        value = sample("pagesift_event_loop_lag_seconds_bucket", {"le": label})
        out[le] = value or 0.0
    return out
