"""Quiet logs for what an outsider can trigger: one line per reason per interval.

What it owns
------------
``ThrottledLog`` (a logger's lines through ``pagesift.core.util.logthrottle.Throttle``,
on the monotonic clock, each written line telling how many it stands for, and a flush
that tells the held-back ones when no later line comes), ``OUTSIDER_LOG`` (the one
process-wide table every listener's refusals and timeouts go through, on the
``pagesift.http`` logger), ``SERVER_LOG`` (the logger aiohttp's request handlers of every
listener write to, filtered: a bad request or a client gone mid-request is one line
without a traceback, a defect keeps its traceback, each once per reason per interval)
and ``quiet_accept_errors`` (the event loop's failed ``accept()`` of a listening socket:
asyncio logs each with a traceback, up to a backlog's worth a turn, which is where the
224,766 "Too many open files" lines of issue 28 came from).

The guarantee: a flood of any rate writes at most one line per reason per
``LOG_INTERVAL`` (60 s) here, plus one summary per reason; reasons are fixed words, never
an address, so the table stays small (and bounded anyway). Used by
``pagesift.core.util.listeners``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from pagesift.core.util.logthrottle import Throttle

__all__ = ["LOG_INTERVAL", "OUTSIDER_LOG", "SERVER_LOG", "ThrottledLog", "quiet_accept_errors"]

LOG_INTERVAL = 60.0  # seconds: one line per reason at most
_ACCEPT_ERRNOS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))


class ThrottledLog:
    """Lines of ``logger`` at most once per reason per ``interval`` (a shell over
    ``logthrottle.Throttle``, on ``clock``), each saying how many it stands for. Lines
    held back are told even when no later line of their reason comes: a flush on the
    running loop, ``interval`` after the first one held, writes one summary per reason
    (``Throttle.pending``)."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = LOG_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.clock = logger, clock
        self.throttle = Throttle(interval)
        self._flush: asyncio.TimerHandle | None = None
        self._flush_loop: asyncio.AbstractEventLoop | None = None

    def log(self, level: int, reason: str, msg: str, *args: object) -> bool:
        """Write ``msg % args`` unless ``reason`` was written within the interval;
        whether it was written."""
        emit, suppressed = self.throttle.allow(reason, self.clock())
        if emit:
            if suppressed:
                msg += " (and %d more like it in the last %g s, not logged)"
                args = (*args, suppressed, self.throttle.interval)
            self.logger.log(level, msg, *args)
        else:
            self._schedule_flush()
        return emit

    def held(self, reason: str) -> None:
        """A line of ``reason`` was held back by ``throttle`` directly (a filter)."""
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: the next line of the reason tells the count
            return
        if self._flush is not None and self._flush_loop is loop:
            return  # one flush pending on this loop (one of a closed loop never runs)
        self._flush_loop = loop
        self._flush = loop.call_later(self.throttle.interval, self.flush)

    def flush(self) -> None:
        """One line per reason whose held-back lines no later line has told."""
        self._flush = None
        for reason, count in self.throttle.pending(self.clock()):
            self.logger.warning(
                "%s: %d more like it in the last %g s, not logged",
                reason,
                count,
                self.throttle.interval,
            )


#: every listener's outsider-triggered lines (one process-wide table of reasons)
OUTSIDER_LOG = ThrottledLog(logging.getLogger("pagesift.http"))


class _AiohttpServerLog(logging.Filter):
    """aiohttp's "Error handling request" lines, through ``OUTSIDER_LOG``'s throttle: a
    bad request or a client gone mid-request is one line, no traceback; anything else
    (a defect) keeps its traceback, once per exception type per interval."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        outsider = isinstance(exc, HttpProcessingError | ConnectionError | TimeoutError)
        reason = f"aiohttp:{record.msg}:{type(exc).__name__}"
        emit, suppressed = OUTSIDER_LOG.throttle.allow(reason, OUTSIDER_LOG.clock())
        if not emit:
            OUTSIDER_LOG.held(reason)
            return False
        if outsider:
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = f"{record.msg}: %s"
            record.args = (*(record.args or ()), f"{type(exc).__name__}: {exc}")  # type: ignore[misc]
        if suppressed:
            record.msg = f"{record.msg} (and %d more like it in the last %g s, not logged)"
            record.args = (*(record.args or ()), suppressed, OUTSIDER_LOG.throttle.interval)  # type: ignore[misc]
        return True


#: the logger aiohttp's request handlers of every listener write to
SERVER_LOG = logging.getLogger("pagesift.http.server")
SERVER_LOG.addFilter(_AiohttpServerLog())

_QUIETED: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Route the loop's accept errors (asyncio logs each failed ``accept()`` of a
    listening socket, EMFILE among them, with a traceback: up to ``BACKLOG`` a turn)
    through ``OUTSIDER_LOG``; every other context goes to the handler there was.
    Idempotent per loop."""
    if loop in _QUIETED:
        return
    _QUIETED.add(loop)
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = str(context.get("message", ""))
        if "accept" in message and isinstance(exc, OSError) and exc.errno in _ACCEPT_ERRNOS:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            OUTSIDER_LOG.log(
                logging.ERROR,
                f"accept:{name}",
                "a listening socket cannot accept: %s (asyncio retries in 1 s)",
                exc,
            )
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
