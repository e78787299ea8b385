"""Retry and adaptive-politeness decisions: pure functions and one state machine, no I/O.

Owns every decision the fetch path and the job runtime take about trying a page
again and about slowing down for a host. The I/O (sleeping, pausing a host's slot,
writing the attempt count) lives in ``hops``, ``politeness`` and ``jobs.runner``; this
module only decides, with the clock and the randomness handed in, so tests pin every
value.

- ``is_transient(err)``: connect errors, resets, read/connect timeouts and the
  statuses in ``TRANSIENT_STATUSES`` (408, 425, 429, 500, 502, 503, 504) and a browser
  that went away mid-render (``RENDER_FAILED`` with ``worker_lost``) are worth
  another try; everything else (404, 410, robots, a blocked address, too large,
  unsupported content, an invalid URL, DNS, a Retry-After beyond the maximum) is not.
- ``retry_delay(retry, base=, cap=, draw=)``: "full jitter" (AWS architecture blog,
  2015): a uniform draw from ``[0, min(cap, base * 2**retry)]``; many pages that failed
  together spread over the whole window instead of retrying in step.
- ``parse_retry_after(value, now)``: the header as delta-seconds or an HTTP date
  (RFC 9110 10.2.3), as seconds from ``now`` (wall clock); None when unparseable.
- ``HostThrottle``: the adaptive per-host delay (its docstring).

Why it is safe: no clock read, no global random; ``retry_delay`` lies in ``[0, cap]``,
the throttle's delay in ``[0, max_delay]``, and a Retry-After is clamped at 0 (a date
in the past means "now"). Nothing here can make a loop unbounded: the number of
retries is the caller's ``max_retries``, counted in the store (``jobs.runner``).
"""

from __future__ import annotations

import datetime
import email.utils
import math
from collections import OrderedDict
from dataclasses import dataclass

from pagesift.core.jobs.pageerrors import ErrorCode, PageError

__all__ = [
    "TRANSIENT_STATUSES",
    "HostThrottle",
    "cause_of",
    "is_transient",
    "parse_retry_after",
    "retry_delay",
]

TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
SLOW_DOWN_STATUSES = frozenset({429, 503})
_TRANSIENT_CODES = frozenset({ErrorCode.CONNECT, ErrorCode.TIMEOUT})
_MAX_SHIFT = 30


def is_transient(err: PageError) -> bool:
    """Whether another attempt may succeed (module docstring lists the cases)."""
    if err.code in _TRANSIENT_CODES:
        return True
    if err.code == ErrorCode.RENDER_FAILED:  # the browser went away mid-render (a crash)
        return err.worker_lost
    return err.code == ErrorCode.HTTP_STATUS and err.status in TRANSIENT_STATUSES


def cause_of(err: PageError) -> str:
    """A bounded label for a failure: ``http_503``, ``connect``, ``timeout``, ..."""
    if err.code == ErrorCode.HTTP_STATUS and err.status is not None:
        return f"http_{err.status}" if err.status in TRANSIENT_STATUSES else "http_other"
    return str(err.code)


def retry_delay(retry: int, *, base: float, cap: float, draw: float) -> float:
    """Seconds before retry number ``retry`` (0-based): ``draw`` (from [0, 1]) times
    ``min(cap, base * 2**retry)``: full jitter."""
    if not 0.0 <= draw <= 1.0:
        raise ValueError(f"draw must lie in [0, 1], not {draw!r}")
    window = min(cap, base * float(1 << min(max(retry, 0), _MAX_SHIFT)))
    return max(window, 0.0) * draw


def parse_retry_after(value: str | None, now: float) -> float | None:
    """The Retry-After header as seconds from ``now`` (Unix time): delta-seconds or an
    HTTP date; None when absent or unparseable, 0 for a date already past."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return float(int(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110: HTTP dates are GMT ("-0000" parses naive)
        when = when.replace(tzinfo=datetime.UTC)
    seconds = when.timestamp() - now
    return max(0.0, seconds) if math.isfinite(seconds) else None


@dataclass(slots=True)
class _HostState:
    delay: float = 0.0
    raised_at: float = float("-inf")  # when a 429/503 last doubled the delay
    refusing: bool = False  # the last answer was a 429/503 (no success since)


class HostThrottle:
    """The adaptive per-host delay (in the spirit of Scrapy's AutoThrottle and Crawlee's
    per-domain throttling); ``now`` is any monotonic clock. Per host a delay ``d``:

    * a 429 or 503 raises ``d`` to at least ``STEP``; one that follows another with
      no success in between (the host keeps refusing) doubles ``d``, at most once per
      ``d`` seconds (eight concurrent requests that all see the same 429 double it
      once, not 2**8 times), never above ``max_delay``. So a host that refuses
      everything is slowed exponentially, while one that refuses a request now and
      then (a flaky page among good ones) is only held at ``STEP``;
    * a success with latency ``L`` computes AutoThrottle's target ``L / concurrency``
      (the spacing at which ``concurrency`` requests keep the host exactly busy): a
      rising latency moves ``d`` half way up to it, otherwise ``d`` decays by
      ``DECAY`` toward it; below ``FLOOR`` the host is forgotten (delay 0);
    * other errors leave ``d`` alone (a 404 says nothing about load).

    The table is bounded: at most ``max_hosts`` hosts, the least recently updated
    dropped first (a dropped host simply starts again at 0), so memory and the
    ``pagesift_host_delay_seconds`` label set stay bounded however many hosts a node
    meets.
    """

    STEP = 0.05  # the first 429/503 delay, seconds
    DECAY = 0.5  # per success, toward the latency target
    FLOOR = 0.001  # below this a host is forgotten

    def __init__(self, *, concurrency: int, max_delay: float, max_hosts: int = 256) -> None:
        self.concurrency = max(1, concurrency)
        self.max_delay = max(0.0, max_delay)
        self.max_hosts = max(1, max_hosts)
        self._hosts: OrderedDict[str, _HostState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hosts)

    def delay(self, host: str) -> float:
        """The host's current adaptive delay (0 for a host not tracked)."""
        st = self._hosts.get(host)
        return 0.0 if st is None else st.delay

    def delays(self) -> dict[str, float]:
        """Every tracked host's delay, most recently updated last (for metrics)."""
        return {host: st.delay for host, st in self._hosts.items()}

    def slow_down(self, host: str, now: float) -> float:
        """A 429 or 503 from ``host``: double its delay (once per delay window)."""
        st = self._touch(host)
        if not st.refusing:
            st.delay = min(self.max_delay, max(self.STEP, st.delay))
            st.refusing = True
            st.raised_at = now
        elif now - st.raised_at >= st.delay:
            st.delay = min(self.max_delay, max(self.STEP, st.delay * 2.0))
            st.raised_at = now
        return st.delay

    def success(self, host: str, latency: float) -> float:
        """A response from ``host`` that took ``latency`` seconds: follow the target."""
        target = min(self.max_delay, max(0.0, latency) / self.concurrency)
        st = self._hosts.get(host)
        current = 0.0 if st is None else st.delay
        new = (current + target) / 2.0 if target > current else max(target, current * self.DECAY)
        if new < self.FLOOR:
            self._hosts.pop(host, None)
            return 0.0
        st = self._touch(host)
        st.delay = new
        st.refusing = False
        return new

    def _touch(self, host: str) -> _HostState:
        st = self._hosts.pop(host, None)
        if st is None:
            st = _HostState()
            while len(self._hosts) >= self.max_hosts:
                self._hosts.popitem(last=False)
        self._hosts[host] = st
        return st
