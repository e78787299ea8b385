"""The event-loop lag monitor (issue 19, build point 1): how late the node's loop
wakes a periodic timer, as a histogram and a rate-limited WARNING, on every role."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from pathlib import Path

import pytest

from pagesift.core.api.metrics import LAG_BUCKETS
from pagesift.node.logs import JsonLogFormatter
from pagesift.node.looplag import LagLine, LagLog, lag, lag_buckets, quantile
from tests.helpers import free_port, in_process_node, until

# ---------------------------------------------------------------- the pure parts


def test_lag_is_how_late_the_timer_ran_never_negative() -> None:
    assert lag(10.0, 10.75) == pytest.approx(0.75)
    assert lag(10.0, 9.999) == 0.0


def test_a_lag_line_is_logged_past_the_threshold_at_most_once_per_period() -> None:
    log = LagLog(threshold=0.5, every=10.0)
    assert log.step(0.2, now=100.0) is None  # under the threshold
    first = log.step(0.8, now=100.0)
    assert first == LagLine(0.8, 0.5, suppressed=0, worst=0.8)
    assert log.step(3.0, now=101.0) is None  # within the period: counted
    assert log.step(0.6, now=105.0) is None
    second = log.step(0.7, now=110.0)
    assert second == LagLine(0.7, 0.5, suppressed=2, worst=3.0)
    assert "2 more since the last line, worst 3.000 s" in second.message()
    assert log.step(0.9, now=115.0) is None  # the period restarts at each line
    assert LagLog(threshold=0).step(60.0, now=0.0) is None  # 0: never logs


def test_quantile_reads_the_upper_bound_of_the_bucket_holding_it() -> None:
    cumulative = {0.001: 90.0, 0.01: 98.0, 0.5: 99.0, 1.0: 100.0, math.inf: 100.0}
    assert quantile(cumulative, 0.5) == 0.001
    assert quantile(cumulative, 0.99) == 0.5
    assert quantile(cumulative, 1.0) == 1.0
    assert quantile({0.001: 0.0, math.inf: 0.0}, 0.99) == 0.0
    assert quantile({0.001: 0.0, math.inf: 4.0}, 0.99) == math.inf


# ---------------------------------------------------------------- a real node


async def test_a_blocked_loop_shows_in_the_histogram_and_in_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pagesift.looplag")
    async with in_process_node(
        tmp_path / "n", loop_lag_interval=0.05, loop_lag_warn_seconds=0.3
    ) as node:
        registry = node.node.metrics.registry

        def count() -> float:
            return registry.get_sample_value("pagesift_event_loop_lag_seconds_count") or 0.0

        await until(lambda: count() >= 3, "the monitor to measure")
        assert not [r for r in caplog.records if r.name == "pagesift.looplag"]

        loop = asyncio.get_running_loop()
        loop.call_soon(time.sleep, 0.7)  # something holds the loop for 0.7 s
        loop.call_soon(time.sleep, 0.4)  # ... and once more, right after
        await until(
            lambda: (registry.get_sample_value("pagesift_event_loop_lag_max_seconds") or 0) >= 0.6,
            "the lag to be measured",
        )
        await asyncio.sleep(0.3)  # a few more measurements
        buckets = lag_buckets(registry.get_sample_value)
        assert set(buckets) == {*LAG_BUCKETS, math.inf}
        assert buckets[math.inf] == count()
        assert buckets[math.inf] - buckets[0.5] >= 1  # the 0.7 s+ wake
        assert quantile(buckets, 1.0) >= 1.0  # its bucket's upper bound

        lines = [r for r in caplog.records if r.name == "pagesift.looplag"]
        assert len(lines) == 1, [r.getMessage() for r in lines]  # one line, rate-limited
        (line,) = lines
        assert line.levelno == logging.WARNING
        assert "event loop lagged" in line.getMessage()
        assert line.__dict__["lag_seconds"] >= 0.6
        fields = json.loads(JsonLogFormatter().format(line))  # the structured line
        assert fields["level"] == "WARNING" and fields["logger"] == "pagesift.looplag"
        assert fields["threshold_seconds"] == 0.3 and fields["lag_seconds"] >= 0.6


async def test_a_standby_measures_its_loop_too(tmp_path: Path) -> None:
    """No primary answers at the address it follows: the standby still runs the monitor."""
    async with in_process_node(
        tmp_path / "s",
        role="standby",
        primary=f"127.0.0.1:{free_port()}",
        loop_lag_interval=0.05,
    ) as node:
        assert node.node.role.value == "standby"
        registry = node.node.metrics.registry
        await until(
            lambda: (registry.get_sample_value("pagesift_event_loop_lag_seconds_count") or 0) >= 3,
            "the standby's monitor to measure",
        )
    assert not node.node.looplag.running  # stopped with the node
