"""The rendering options' rules: engine, waits, actions, emulation and screenshots, pure.

What it owns: ``check`` (every field rule of ``ScrapeOptions``' rendering fields,
each violation named by its path: ``options.actions[3].click.selector``, all gathered
into one ``InvalidArgument``), ``permissions`` (``execute_javascript`` only for accounts
with ``allow_execute_javascript``: ``PermissionDenied``), ``unavailable`` (what a node
that cannot render refuses: ``RenderingUnavailable``, FAILED_PRECONDITION through the
error table) and ``browser_fields`` (which set fields only a browser honours; AUTO
renders a page whose request sets any).

Invariants: a field that needs a browser with ``engine`` HTTP is INVALID_ARGUMENT (the
request contradicts itself, wherever it is sent); the same request on a node without a
browser is FAILED_PRECONDITION (it is valid, and a node that renders accepts it). AUTO
and unspecified need no browser by themselves. Every bound is the proto's or the
server config's (``max_render_wait``, ``max_screenshot_height``).

Why it is safe: nothing here does I/O (the time zone list is read once and cached), so
``specs`` runs it before anything is written; whether the node can render is a flag the
caller passes, not a file-system check per request.
"""

from __future__ import annotations

import functools
import re
import zoneinfo
from collections.abc import Callable

from google.protobuf import duration_pb2

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.accounts import Account
from pagesift.core.jobs.validate import InvalidArgument, PermissionDenied
from pagesift.v1 import jobs_pb2

MAX_ACTIONS = 50
MAX_SELECTOR = 1024  # characters
MAX_WRITE_TEXT = 10_000  # characters
MAX_KEY = 64  # characters
MAX_SCROLL_STEPS = 100
MAX_SCRIPT_BYTES = 64 * 1024  # UTF-8
MAX_LOCALE = 35  # characters (BCP 47's longest well-formed tags stay below)
VIEWPORT_MIN, VIEWPORT_MAX = 100, 4096  # CSS pixels; 0 = the default
_LOCALE = re.compile(r"[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*")  # BCP 47-looking
_Refuse = Callable[[str, str], None]  # (field path, reason): one violation
ACTION_KINDS = ("wait", "click", "write", "press", "scroll", "execute_javascript", "screenshot")


class RenderingUnavailable(Exception):
    """The request needs a browser (``field`` is the first option that does) and this
    node cannot render; ``str()`` is ``"field: reason"``."""

    def __init__(self, field: str) -> None:
        self.field = field
        self.reason = "needs a browser engine, and this node cannot render pages (no browser)"
        super().__init__(f"{field}: {self.reason}")


def browser_fields(opts: jobs_pb2.ScrapeOptions, field: str = "options") -> list[str]:
    """The paths of the set fields only a browser honours, in the proto's order."""
    found = [f"{field}.wait_for"] if opts.HasField("wait_for") else []
    found += [f"{field}.wait_until"] if opts.wait_until else []
    found += [f"{field}.actions"] if opts.actions else []
    found += [
        f"{field}.formats[{i}]"
        for i, f in enumerate(opts.formats)
        if f == jobs_pb2.FORMAT_SCREENSHOT
    ]
    found += [f"{field}.viewport"] if opts.HasField("viewport") else []
    found += [f"{field}.mobile"] if opts.mobile else []
    found += [f"{field}.locale"] if opts.locale else []
    found += [f"{field}.timezone"] if opts.timezone else []
    found += [f"{field}.screenshot"] if opts.HasField("screenshot") else []
    return found


def unavailable(
    opts: jobs_pb2.ScrapeOptions, renders: bool, field: str = "options"
) -> RenderingUnavailable | None:
    """What a node refuses when it cannot render (``renders`` False): BROWSER, or AUTO /
    unspecified with an option only a browser honours. HTTP's conflicts are ``check``'s."""
    if renders or opts.engine == jobs_pb2.FETCH_ENGINE_HTTP:
        return None
    if opts.engine == jobs_pb2.FETCH_ENGINE_BROWSER:
        return RenderingUnavailable(f"{field}.engine")
    needs = browser_fields(opts, field)
    return RenderingUnavailable(needs[0]) if needs else None


def permissions(opts: jobs_pb2.ScrapeOptions, account: Account, field: str = "options") -> None:
    """``PermissionDenied`` naming the first ``execute_javascript`` action when
    ``account`` may not run its own JavaScript."""
    if account.allow_execute_javascript:
        return
    for i, action in enumerate(opts.actions[:MAX_ACTIONS]):
        if action.WhichOneof("action") == "execute_javascript":
            raise PermissionDenied(
                f"{field}.actions[{i}].execute_javascript",
                f"account {account.name!r} may not run JavaScript (allow_execute_javascript)",
            )


def check(opts: jobs_pb2.ScrapeOptions, config: ServerConfig, field: str = "options") -> None:
    """Every rendering field's rules; one ``InvalidArgument`` with every violation."""
    bad: list[InvalidArgument] = []

    def refuse(where: str, reason: str) -> None:
        bad.append(InvalidArgument(where, reason))

    if opts.engine not in jobs_pb2.FetchEngine.values():
        refuse(f"{field}.engine", f"unknown engine {opts.engine}")
    if opts.engine == jobs_pb2.FETCH_ENGINE_HTTP:
        for where in browser_fields(opts, field):
            refuse(where, "needs a browser engine (engine is HTTP: use AUTO or BROWSER)")
    if opts.wait_until not in jobs_pb2.WaitUntil.values():
        refuse(f"{field}.wait_until", f"unknown wait_until {opts.wait_until}")
    if opts.HasField("wait_for"):
        _wait(opts.wait_for, f"{field}.wait_for", config, refuse)
    if len(opts.actions) > MAX_ACTIONS:
        refuse(f"{field}.actions", f"{len(opts.actions)} actions, at most {MAX_ACTIONS}")
    else:
        for i, action in enumerate(opts.actions):
            _action(action, f"{field}.actions[{i}]", config, refuse)
    if opts.HasField("viewport"):
        for name in ("width", "height"):
            size = getattr(opts.viewport, name)
            if size != 0 and not VIEWPORT_MIN <= size <= VIEWPORT_MAX:
                refuse(
                    f"{field}.viewport.{name}",
                    f"{size} is outside {VIEWPORT_MIN}..{VIEWPORT_MAX} (0: the default)",
                )
    if opts.locale and (len(opts.locale) > MAX_LOCALE or not _LOCALE.fullmatch(opts.locale)):
        refuse(f"{field}.locale", f"{opts.locale[:64]!r} is not a BCP 47 language tag (fr-FR)")
    if opts.timezone and opts.timezone not in time_zones():
        refuse(f"{field}.timezone", f"{opts.timezone[:64]!r} is not an IANA time zone name")
    if opts.HasField("screenshot"):
        _screenshot(opts.screenshot, f"{field}.screenshot", config, refuse)
        if jobs_pb2.FORMAT_SCREENSHOT not in opts.formats:
            refuse(f"{field}.screenshot", "needs FORMAT_SCREENSHOT in formats")
    if bad:
        raise InvalidArgument.combined(bad)


@functools.cache
def time_zones() -> frozenset[str]:
    """The IANA names this machine knows (read once)."""
    return frozenset(zoneinfo.available_timezones())


def _selector(value: str, where: str, refuse: _Refuse) -> None:
    if not value.strip():
        refuse(where, "an empty selector")
    elif len(value) > MAX_SELECTOR:
        refuse(where, f"{len(value)} characters, at most {MAX_SELECTOR}")
    elif "\x00" in value:
        refuse(where, "holds a NUL character")


def _duration(
    value: duration_pb2.Duration, where: str, config: ServerConfig, refuse: _Refuse
) -> None:
    seconds = value.seconds + value.nanos / 1e9
    if not 0 < seconds <= config.max_render_wait:
        refuse(where, f"{seconds:g} s is outside (0, {config.max_render_wait:g}] (max_render_wait)")


def _wait(
    wait: jobs_pb2.WaitFor | jobs_pb2.WaitAction, where: str, config: ServerConfig, refuse: _Refuse
) -> None:
    which = wait.WhichOneof("condition")
    if which is None:
        refuse(where, "set a selector or a duration")
    elif which == "selector":
        _selector(wait.selector, f"{where}.selector", refuse)
    else:
        _duration(wait.duration, f"{where}.duration", config, refuse)


def _action(action: jobs_pb2.Action, where: str, config: ServerConfig, refuse: _Refuse) -> None:
    which = action.WhichOneof("action")
    if which is None:
        refuse(where, f"sets no action (one of {', '.join(ACTION_KINDS)})")
    elif which == "wait":
        _wait(action.wait, f"{where}.wait", config, refuse)
    elif which == "click":
        _selector(action.click.selector, f"{where}.click.selector", refuse)
    elif which == "write":
        text = action.write.text
        if not 0 < len(text) <= MAX_WRITE_TEXT:
            refuse(f"{where}.write.text", f"{len(text)} characters, 1..{MAX_WRITE_TEXT}")
    elif which == "press":
        key = action.press.key
        if not 0 < len(key) <= MAX_KEY or not key.isprintable():
            refuse(f"{where}.press.key", f"a key name is 1..{MAX_KEY} printable characters")
    elif which == "scroll":
        _scroll(action.scroll, f"{where}.scroll", refuse)
    elif which == "execute_javascript":
        size = len(action.execute_javascript.script.encode("utf-8", "surrogatepass"))
        if not 0 < size <= MAX_SCRIPT_BYTES:
            refuse(f"{where}.execute_javascript.script", f"{size} bytes, 1..{MAX_SCRIPT_BYTES}")
    else:
        _screenshot(action.screenshot, f"{where}.screenshot", config, refuse)


def _scroll(scroll: jobs_pb2.ScrollAction, where: str, refuse: _Refuse) -> None:
    if scroll.direction not in jobs_pb2.ScrollDirection.values():
        refuse(f"{where}.direction", f"unknown direction {scroll.direction}")
    elif scroll.until_end and scroll.direction == jobs_pb2.SCROLL_DIRECTION_UP:
        refuse(f"{where}.until_end", "scrolls down to the end: not with direction UP")
    if not 0 <= scroll.max_steps <= MAX_SCROLL_STEPS:
        refuse(f"{where}.max_steps", f"{scroll.max_steps} is outside 0..{MAX_SCROLL_STEPS}")
    elif scroll.max_steps and not scroll.until_end:
        refuse(f"{where}.max_steps", "only with until_end")


def _screenshot(
    shot: jobs_pb2.ScreenshotOptions, where: str, config: ServerConfig, refuse: _Refuse
) -> None:
    if shot.format not in jobs_pb2.ImageFormat.values():
        refuse(f"{where}.format", f"unknown image format {shot.format}")
    if not 0 <= shot.quality <= 100:
        refuse(f"{where}.quality", f"{shot.quality} is outside 0..100 (0: 80)")
    elif shot.quality and shot.format != jobs_pb2.IMAGE_FORMAT_JPEG:
        refuse(f"{where}.quality", "only for JPEG (format IMAGE_FORMAT_JPEG)")
    if not 0 <= shot.max_height <= config.max_screenshot_height:
        refuse(
            f"{where}.max_height",
            f"{shot.max_height} is outside 0..{config.max_screenshot_height} "
            "(max_screenshot_height; 0: that)",
        )
    elif shot.max_height and not shot.full_page:
        refuse(f"{where}.max_height", "only with full_page")
