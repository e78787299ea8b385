"""Liveness bounds that hold on a loaded machine (issue 28, finding 8).

A test that asserts "another account is still answered while the hostile input runs"
must fail for an outage, never for a busy box: the fixed 2 s bound of the hostile suite
failed at 2.40 s while other work loaded the two cores (load 5-9). So the bound is a
multiple of a *control* measured in the same test, on the same machine, moments
before: the same call, with nothing hostile running yet (``control``), and a floor:

    bound = max(floor, FACTOR x control)

Why it still catches what it is for: every regression these tests guard stalled the
node's event loop for seconds to minutes (BENCHMARKS.md, issue 19: 4.4 s for the
inline fallback of a killed worker, 39 s for an unclosed sitemap, 531 s for the robots
rules); the floors (``FLOOR``) sit above what load adds to a healthy node's answer and
below those. A loaded machine slows the control too, so the bound grows with the load,
while a stalled loop is a stall whatever the load. A call that fails counts as its
whole deadline (30 s) in the probes that use this.

The tight figures (ListJobs under 2 s, the event loop's lag p99) are speed figures:
``make bench`` measures them (``bench/hostile.py``), never a test assertion.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["FACTOR", "FLOOR", "bound", "control"]

#: the bound is this many times the control's slowest call ...
FACTOR = 20.0
#: ... and never under this many seconds
FLOOR = 4.0


async def control(
    call: Callable[[], Awaitable[object]], samples: int = 10, interval: float = 0.05
) -> float:
    """The slowest of ``samples`` calls of ``call()`` (s), one after another, ``interval``
    s apart: what this machine gives that call now, with nothing hostile running."""
    worst = 0.0
    for _ in range(samples):
        sent = time.monotonic()
        await call()
        worst = max(worst, time.monotonic() - sent)
        await asyncio.sleep(interval)
    return worst


def bound(control_s: float, floor: float = FLOOR, factor: float = FACTOR) -> float:
    """The most a probed call may take (s): ``factor`` x the control, at least ``floor``."""
    return max(floor, factor * control_s)
