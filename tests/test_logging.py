"""Log lines: JSON lines carry a job event's job id and account."""

from __future__ import annotations

import json
import logging

from pagesift.node.logs import JsonLogFormatter


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
