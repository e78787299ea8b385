"""The node process's logs: plain text, or one JSON object per line (``log_format``).

A JSON line (python-json-logger's ``JsonFormatter``) has ``time`` (RFC 3339, UTC,
milliseconds, ``Z``: ``2026-05-01T12:00:00.123Z``), ``level``, ``logger`` and
``message``; then every field a call passes in ``extra=`` (job events: ``job`` and
``account``); ``exc_info`` with the formatted traceback for ``logger.exception`` (and
any record logged with ``exc_info``); and, when tracing is on and a span is current,
``trace_id`` and ``span_id`` (hex, as trace backends show them). Text lines are
unchanged.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from pagesift.core.util import tracing

__all__ = ["JsonLogFormatter", "rfc3339", "setup_logging"]


def rfc3339(created: float) -> str:
    """``created`` (a ``LogRecord.created``) as ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class JsonLogFormatter(JsonFormatter):
    """One JSON object per line; job events add their ``job`` and ``account``."""

    def __init__(self) -> None:
        super().__init__(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return rfc3339(record.created)

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        ids = tracing.current_ids()
        if ids is not None:
            log_data["trace_id"], log_data["span_id"] = ids


def setup_logging(fmt: str) -> None:
    """Send every logger's records to stderr, as ``fmt`` ("json" or "text") says."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
