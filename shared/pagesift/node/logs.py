"""The node process's logs: plain text, or one JSON object per line (``log_format``)."""

from __future__ import annotations

import json
import logging
import sys


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line; job events add their ``job`` and ``account``."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("job", "account"):
            if hasattr(record, key):
                line[key] = getattr(record, key)
        return json.dumps(line)


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
