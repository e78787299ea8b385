"""The rendering flags of ``scrape``, ``batch`` and ``crawl``, and the screenshot file.

Owns ``--engine``, ``--wait-for``, ``--wait-until``, ``--action`` (repeatable),
``--mobile``, ``--viewport``, ``--locale``, ``--timezone``, ``--screenshot-full`` and
``--screenshot-jpeg[=QUALITY]`` (``add_render_flags``), how they fill a
``ScrapeOptions`` (``apply_render_flags``), and ``save_screenshot`` (``scrape --format
screenshot --out FILE`` writes the image's bytes).

The action syntax (``parse_action``, pure), one ``--action`` per step, in order::

    wait:500          pause 500 ms           wait:#sel     until #sel is visible
    click:#sel        click it               write:TEXT    type TEXT (the rest, colons too)
    press:Enter       press a key            scroll[:down] / scroll:up   one viewport
    scroll:end[:N]    down until the page stops growing (at most N steps)
    js:SCRIPT         run SCRIPT (a function body; the account needs the permission)
    screenshot[:full] a screenshot now (the viewport, or the whole page)

``--wait-for`` takes milliseconds (all digits) or a selector. A malformed value is a
usage error (exit 2) naming it; the bounds (durations, lengths, counts) are the
server's to check, so one place keeps them (``pagesift.core.jobs.renderoptions``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from google.protobuf import duration_pb2

from pagesift.v1 import jobs_pb2

ENGINES: dict[str, jobs_pb2.FetchEngine.ValueType] = {
    "auto": jobs_pb2.FETCH_ENGINE_AUTO,
    "http": jobs_pb2.FETCH_ENGINE_HTTP,
    "browser": jobs_pb2.FETCH_ENGINE_BROWSER,
}
WAIT_UNTIL: dict[str, jobs_pb2.WaitUntil.ValueType] = {
    "load": jobs_pb2.WAIT_UNTIL_LOAD,
    "domcontentloaded": jobs_pb2.WAIT_UNTIL_DOMCONTENTLOADED,
    "networkidle": jobs_pb2.WAIT_UNTIL_NETWORKIDLE,
}
ACTION_SYNTAX = (
    "wait:MS|wait:SEL|click:SEL|write:TEXT|press:KEY|scroll[:down|up]|scroll:end[:N]"
    "|js:SCRIPT|screenshot[:full]"
)
_SCROLLS = {"down": jobs_pb2.SCROLL_DIRECTION_DOWN, "up": jobs_pb2.SCROLL_DIRECTION_UP}


def _ms(value: str) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(int(value))
    return d


def parse_wait_for(value: str) -> jobs_pb2.WaitFor:
    """``--wait-for``: milliseconds when all digits (``1500``), else a CSS selector."""
    if not value.strip():
        raise argparse.ArgumentTypeError("--wait-for needs milliseconds or a selector")
    if value.isdigit():
        return jobs_pb2.WaitFor(duration=_ms(value))
    return jobs_pb2.WaitFor(selector=value)


def parse_action(spec: str) -> jobs_pb2.Action:
    """One ``--action`` (the module docstring's syntax) as an ``Action``."""
    kind, _, rest = spec.partition(":")

    def bad(why: str) -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"bad --action {spec[:80]!r}: {why} ({ACTION_SYNTAX})")

    if kind == "wait":
        if not rest:
            raise bad("wait needs milliseconds or a selector")
        if rest.isdigit():
            return jobs_pb2.Action(wait=jobs_pb2.WaitAction(duration=_ms(rest)))
        return jobs_pb2.Action(wait=jobs_pb2.WaitAction(selector=rest))
    if kind in ("click", "write", "press", "js") and not rest:
        raise bad(f"{kind} needs a value after the colon")
    if kind == "click":
        return jobs_pb2.Action(click=jobs_pb2.ClickAction(selector=rest))
    if kind == "write":
        return jobs_pb2.Action(write=jobs_pb2.WriteAction(text=rest))
    if kind == "press":
        return jobs_pb2.Action(press=jobs_pb2.PressAction(key=rest))
    if kind == "js":
        script = jobs_pb2.ExecuteJavascriptAction(script=rest)
        return jobs_pb2.Action(execute_javascript=script)
    if kind == "scroll":
        return jobs_pb2.Action(scroll=_scroll(rest, bad))
    if kind == "screenshot":
        if rest not in ("", "full"):
            raise bad("screenshot takes nothing or full")
        return jobs_pb2.Action(screenshot=jobs_pb2.ScreenshotOptions(full_page=rest == "full"))
    raise bad(f"unknown action {kind[:32]!r}")


def _scroll(rest: str, bad: Callable[[str], argparse.ArgumentTypeError]) -> jobs_pb2.ScrollAction:
    where, _, steps = rest.partition(":")
    if where in ("", "down", "up") and not steps:
        return jobs_pb2.ScrollAction(direction=_SCROLLS[where or "down"])
    if where != "end":
        raise bad("scroll takes down, up or end[:N]")
    if steps and not steps.isdigit():
        raise bad("scroll:end:N takes a number of steps")
    return jobs_pb2.ScrollAction(until_end=True, max_steps=int(steps or 0))


def parse_viewport(value: str) -> jobs_pb2.Viewport:
    """``--viewport 1280x800`` (CSS pixels)."""
    width, sep, height = value.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise argparse.ArgumentTypeError(f"--viewport takes WIDTHxHEIGHT, got {value!r}")
    return jobs_pb2.Viewport(width=int(width), height=int(height))


def _quality(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 100:
        raise argparse.ArgumentTypeError(f"a JPEG quality is 1..100, got {value!r}")
    return int(value)


def add_render_flags(parent: argparse.ArgumentParser) -> None:
    """The rendering flags (the module docstring), on the scrape options' parent."""
    g = parent.add_argument_group("rendering (docs/crawling.md, Rendering JavaScript)")
    g.add_argument(
        "--engine",
        choices=list(ENGINES),
        default=None,
        help="auto: HTTP, rendering only pages that need it (the default on a node with "
        "a browser); http: never render; browser: render every page",
    )
    g.add_argument(
        "--wait-for",
        type=parse_wait_for,
        default=None,
        metavar="SELECTOR_OR_MS",
        help="after the page loads, wait for a CSS selector, or this many milliseconds",
    )
    g.add_argument("--wait-until", choices=list(WAIT_UNTIL), default=None)
    g.add_argument(
        "--action",
        action="append",
        type=parse_action,
        default=[],
        metavar="SPEC",
        help=f"a browser step, in order (repeat): {ACTION_SYNTAX}",
    )
    g.add_argument("--mobile", action="store_true", help="emulate a phone")
    g.add_argument("--viewport", type=parse_viewport, default=None, metavar="WxH")
    g.add_argument("--locale", default="", metavar="TAG", help="e.g. fr-FR")
    g.add_argument("--timezone", default="", metavar="ZONE", help="e.g. Europe/Paris")
    g.add_argument(
        "--screenshot-full", action="store_true", help="with --format screenshot: the whole page"
    )
    g.add_argument(
        "--screenshot-jpeg",
        nargs="?",
        const=0,
        default=None,
        type=_quality,
        metavar="QUALITY",
        help="with --format screenshot: JPEG (quality 1..100, default 80; write "
        "--screenshot-jpeg=90) instead of PNG",
    )


def apply_render_flags(options: jobs_pb2.ScrapeOptions, args: argparse.Namespace) -> None:
    """Set ``options``' rendering fields from the flags (unset flags leave them unset)."""
    if args.engine is not None:
        options.engine = ENGINES[args.engine]
    if args.wait_for is not None:
        options.wait_for.CopyFrom(args.wait_for)
    if args.wait_until is not None:
        options.wait_until = WAIT_UNTIL[args.wait_until]
    options.actions.extend(args.action)
    if args.viewport is not None:
        options.viewport.CopyFrom(args.viewport)
    options.mobile = args.mobile
    options.locale = args.locale
    options.timezone = args.timezone
    if args.screenshot_full:
        options.screenshot.full_page = True
    if args.screenshot_jpeg is not None:
        options.screenshot.format = jobs_pb2.IMAGE_FORMAT_JPEG
        options.screenshot.quality = args.screenshot_jpeg


def screenshot_line(doc: jobs_pb2.Document) -> str:
    """``screenshot: image/png 1280x800, 51234 bytes`` (or that there is none)."""
    shot = doc.screenshot
    if not doc.HasField("screenshot") or not shot.data:
        return "screenshot: none (the page was not rendered)"
    return f"screenshot: {shot.content_type} {shot.width}x{shot.height}, {len(shot.data)} bytes"


def save_screenshot(doc: jobs_pb2.Document, path: Path) -> None:
    """Write ``doc``'s screenshot bytes to ``path`` (``OSError`` when it has none: the
    command fails, exit 5, rather than leave an empty image)."""
    if not doc.HasField("screenshot") or not doc.screenshot.data:
        raise OSError(f"{path}: not written, the document has no screenshot")
    path.write_bytes(doc.screenshot.data)
