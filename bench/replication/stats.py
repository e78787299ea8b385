"""Statistics over the replication bench's samples: no I/O, no processes.

Owns ``pct``/``dist`` (nearest-rank percentiles), ``Samples`` (what ``procs.Sampler``
records: per round, each node's applied offset) and the lag figures derived from them
(``reach_times``, ``lag_stats``): lag in offsets (primary offset minus standby applied, same
round) and in ms (for each offset X, first round the standby had X minus first round the
primary had it; resolution one sampling period).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100.0 * len(ordered) + 0.5) - 1))
    return float(ordered[k])


def dist(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": float(len(values)),
        "p50": pct(values, 50),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "max": max(values) if values else float("nan"),
    }


@dataclass
class Samples:
    """Role rounds: time (monotonic, mid-round) and each node's applied offset (-1: no
    answer)."""

    names: list[str]
    t: list[float] = field(default_factory=list)
    applied: list[list[int]] = field(default_factory=list)  # per round, per node
    primary_offset: list[int] = field(default_factory=list)  # what node 0 reports

    def series(self, i: int) -> list[tuple[float, int]]:
        return [(t, row[i]) for t, row in zip(self.t, self.applied, strict=True) if row[i] >= 0]

    def at(self, i: int, when: float) -> int:
        """Node i's applied offset at the last round at or before ``when`` (0 if none)."""
        best = 0
        for t, v in self.series(i):
            if t > when:
                break
            best = v
        return best


def reach_times(series: Sequence[tuple[float, int]], lo: int, hi: int) -> list[float]:
    """For X in lo+1..hi: the first sample time at which the value was >= X."""
    out: list[float] = []
    x = lo + 1
    for t, v in series:
        while x <= hi and v >= x:
            out.append(t)
            x += 1
    return out


def lag_stats(s: Samples, t0: float, t1: float) -> dict[str, Any]:
    """Lag between node 0 (primary) and node 1 (standby) over rounds in [t0, t1]."""
    rounds = [
        (t, row[0], row[1])
        for t, row in zip(s.t, s.applied, strict=True)
        if t0 <= t <= t1 and row[0] >= 0 and row[1] >= 0
    ]
    offsets = [float(max(0, p - q)) for _, p, q in rounds]
    lo = s.at(0, t0)
    hi = max((p for _, p, _ in rounds), default=lo)
    prim = reach_times([(t, p) for t, p, _ in rounds], lo, hi)
    # the standby may apply after t1: look at every later sample too
    stby = reach_times([(t, v) for t, v in s.series(1) if t >= t0], lo, hi)
    n = min(len(prim), len(stby))
    ms = [max(0.0, (stby[k] - prim[k]) * 1000.0) for k in range(n)]
    periods = [b - a for a, b in zip(s.t, s.t[1:], strict=False) if t0 <= a <= t1]
    return {
        "rounds": len(rounds),
        "sample_period_ms_p50": pct(periods, 50) * 1000 if periods else float("nan"),
        "lag_offsets": dist(offsets),
        "lag_ms": dist(ms),
        "offsets_measured": n,
        "offsets_written": hi - lo,
    }
