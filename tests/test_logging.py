"""Log lines: JSON lines (python-json-logger) carry RFC 3339 times, the level, the
logger, a job event's job id and account, and an exception's traceback."""

from __future__ import annotations

import io
import json
import logging
import re
from datetime import UTC, datetime

from pagesift.node.logs import JsonLogFormatter, rfc3339

RFC3339_MS_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def test_a_json_log_line_carries_the_job_and_the_account() -> None:
    record = logging.LogRecord(
        "pagesift.jobs", logging.INFO, __file__, 1, "job %s started", ("j1",), None
    )
    record.job = "j1"
    record.account = "acme"
    line = json.loads(JsonLogFormatter().format(record))
    assert (line["message"], line["job"], line["account"], line["level"]) == (
        "job j1 started",
        "j1",
        "acme",
        "INFO",
    )
    assert line["logger"] == "pagesift.jobs"
    assert RFC3339_MS_Z.match(line["time"]), line["time"]
    parsed = datetime.fromisoformat(line["time"])
    assert parsed.tzinfo is not None
    assert abs(parsed.timestamp() - record.created) < 0.001


def test_rfc3339_is_utc_with_milliseconds() -> None:
    assert rfc3339(0.0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_700_000_000.1239) == "2023-11-14T22:13:20.123Z"
    now = datetime.now(UTC).timestamp()
    assert datetime.fromisoformat(rfc3339(now)).timestamp() == int(now * 1000) / 1000


def test_logger_exception_lines_parse_with_extra_fields_and_the_traceback() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonLogFormatter())
    log = logging.getLogger("pagesift.test_logging")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("job %s expired", "j2", extra={"job": "j2", "account": "acme"})
        try:
            raise ValueError("bad page")
        except ValueError:
            log.exception("job %s failed", "j3", extra={"job": "j3", "account": "bob"})
    finally:
        log.removeHandler(handler)
        log.propagate = True
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert (first["job"], first["account"], first["level"]) == ("j2", "acme", "WARNING")
    assert "exc_info" not in first
    assert (second["job"], second["account"], second["level"]) == ("j3", "bob", "ERROR")
    assert second["message"] == "job j3 failed"
    assert second["exc_info"].startswith("Traceback (most recent call last):")
    assert "ValueError: bad page" in second["exc_info"]
    assert all(RFC3339_MS_Z.match(line["time"]) for line in (first, second))


def test_text_lines_are_unchanged() -> None:
    from pagesift.node.logs import setup_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("text")
        fmt = root.handlers[0].formatter
        assert fmt is not None and not isinstance(fmt, JsonLogFormatter)
        assert fmt._fmt == "%(asctime)s %(levelname)s %(name)s %(message)s"
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
