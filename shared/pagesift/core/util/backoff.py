"""How long to wait before trying again: the one capped, jittered exponential backoff.

What it owns
------------
Every retry loop of pagesift sleeps through this module: the client's failover
rounds (``pagesift.client.retry``), the standby's reconnects
(``pagesift.standby.follower``), the fencing hellos of a promoted node
(``pagesift.standby.fencing``) and webhook deliveries (``pagesift.primary.webhooks.outbox``).

- ``backoff_delay(attempt, base=, cap=, jitter=)``: the delay before retry number
  ``attempt`` (0 = the first retry): ``base * 2**attempt``, never more than ``cap``,
  then shortened by up to half by ``jitter`` ("equal jitter": between half and all of
  the capped delay), so that many callers that failed together do not retry in step,
  and none of them retries at once.
- ``budgeted_delays(budget, base=, cap=, rng=)``: the whole schedule of a loop that may
  sleep ``budget`` seconds in all: jittered delays, the last one trimmed so that they
  sum to exactly ``budget``.

Why it is safe
--------------
Both are pure: the randomness is a value (``jitter``) or a source (``rng``) handed in
by the caller, so tests pin exact delays with a fixed draw. The un-jittered delay never
decreases with ``attempt`` and never exceeds ``cap``; a jittered one lies in
``[delay / 2, delay]``, so it is never zero for a positive ``base``. The exponent is
clamped, so a loop that has failed for days does not overflow.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["backoff_delay", "budgeted_delays"]

_MAX_SHIFT = 30  # 2**30 times any sane base is far beyond any cap


def backoff_delay(attempt: int, *, base: float, cap: float, jitter: float = 0.0) -> float:
    """The delay before retry ``attempt`` (0-based): ``min(cap, base * 2**attempt)``
    times ``1 - jitter / 2``; ``jitter`` is a draw from [0, 1] (0: no jitter)."""
    if not 0.0 <= jitter <= 1.0:
        raise ValueError(f"jitter must lie in [0, 1], not {jitter!r}")
    delay = min(cap, base * float(1 << min(max(attempt, 0), _MAX_SHIFT)))
    return delay * (1.0 - 0.5 * jitter)


def budgeted_delays(
    budget: float, *, base: float, cap: float, rng: Callable[[], float]
) -> list[float]:
    """The sleeps of a retry loop allowed ``budget`` seconds of sleep in all:
    ``backoff_delay`` of attempts 0, 1, ... with a jitter drawn from ``rng`` each, the
    last one trimmed to fit, so they sum to ``budget`` (none for a budget <= 0)."""
    delays: list[float] = []
    total = 0.0
    attempt = 0
    while total < budget - 1e-9:
        delay = backoff_delay(attempt, base=base, cap=cap, jitter=rng())
        if delay <= 0:
            break
        step = min(delay, budget - total)
        delays.append(step)
        total += step
        attempt += 1
    return delays
