"""Waits, actions and screenshots of a rendered page: the plan (pure) and its executor.

Owns ``plan`` (a request's ``wait_for``, ``actions`` and screenshot options checked
against the server's ``Bounds`` and turned into plain steps), ``run_actions`` (the
steps on a Playwright page, in order, within ``max_actions_time``), ``wait_for`` and
``screenshot`` (also used by ``render``). The API validates requests before they are
stored (``pagesift.core.jobs.renderoptions``, which defines the fixed bounds checked
here too: ``MAX_ACTIONS``, selector, text, key and script sizes, scroll steps);
``plan`` checks again because a stored request outlives a configuration change, and
it refuses before any network is spent.

Invariants:
- the request's ``wait_for`` selector that never shows is ``TIMEOUT`` (the page did
  not get there within ``max_render_wait``, like a render past its deadline);
- a failing step raises ``PageError(ACTION_FAILED, "action 3 (click '#more'): ...")``
  naming its index; the whole sequence past ``max_actions_time`` raises the same code
  naming the step it stopped at; Playwright's multi-line call logs are cut to a line;
- every wait is bounded: each step runs under the budget left (``asyncio.timeout``),
  a scroll ``until_end`` stops after ``max_steps`` or when the page stops growing;
- an ``execute_javascript`` value is serialized in the page and refused past 64 KiB
  before it crosses the pipe; the string received is checked again (length, JSON) as
  the page could have replaced ``JSON.stringify``;
- a screenshot is cut at its ``max_height`` (full page) and refused past
  ``max_screenshot_bytes`` (``TOO_LARGE``).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.core.jobs.renderoptions import (
    MAX_ACTIONS,
    MAX_KEY,
    MAX_SCRIPT_BYTES,
    MAX_SCROLL_STEPS,
    MAX_SELECTOR,
    MAX_WRITE_TEXT,
)
from pagesift.v1 import jobs_pb2

__all__ = [
    "MAX_JS_RESULT",
    "Bounds",
    "Plan",
    "Shot",
    "Step",
    "image_size",
    "plan",
    "run_actions",
    "screenshot",
    "wait_for",
]

MAX_JS_RESULT = 64 << 10
DEFAULT_SCROLL_STEPS = 20
SCROLL_SETTLE = 1.0  # seconds a scroll until_end waits for the page to grow
_REASON_CHARS = 300


@dataclass(frozen=True)
class Bounds:
    """The server's limits on waits, actions and screenshots."""

    max_render_wait: float
    max_actions_time: float
    max_screenshot_height: int
    max_screenshot_bytes: int

    @classmethod
    def of(cls, config: ServerConfig) -> Bounds:
        return cls(
            config.max_render_wait,
            config.max_actions_time,
            config.max_screenshot_height,
            config.max_screenshot_bytes,
        )


@dataclass(frozen=True)
class Shot:
    """One screenshot: viewport or full page (cut at ``max_height`` CSS pixels)."""

    full_page: bool
    jpeg: bool
    quality: int
    max_height: int


@dataclass(frozen=True)
class Step:
    """One planned action: ``kind`` and the fields that kind uses."""

    kind: str  # wait, click, write, press, scroll, execute_javascript, screenshot
    seconds: float = 0.0
    selector: str = ""
    text: str = ""  # write: the text; press: the key; execute_javascript: the script
    up: bool = False
    until_end: bool = False
    max_steps: int = 0
    shot: Shot | None = None

    def describe(self) -> str:
        if self.kind == "wait":
            return f"wait {self.selector!r}" if self.selector else f"wait {self.seconds:g} s"
        if self.kind == "click":
            return f"click {self.selector!r}"
        if self.kind == "press":
            return f"press {self.text!r}"
        if self.kind == "scroll":
            where = "up" if self.up else "down"
            return f"scroll {where} until end" if self.until_end else f"scroll {where}"
        return self.kind


@dataclass(frozen=True)
class Plan:
    """What a render does after navigation: its wait, steps and final screenshot."""

    wait_selector: str
    wait_seconds: float
    steps: tuple[Step, ...]
    shot: Shot | None  # FORMAT_SCREENSHOT


def _refuse(what: str, reason: str) -> PageError:
    return PageError(ErrorCode.ACTION_FAILED, f"{what}: {reason}")


def _seconds(d: Any) -> float:
    return float(d.seconds) + float(d.nanos) / 1e9


def _shot(opts: jobs_pb2.ScreenshotOptions, bounds: Bounds, what: str) -> Shot:
    jpeg = opts.format == jobs_pb2.IMAGE_FORMAT_JPEG
    if opts.quality and not jpeg:
        raise _refuse(what, "quality applies to JPEG only")
    if not 0 <= opts.quality <= 100:
        raise _refuse(what, f"quality {opts.quality} outside 1..100")
    if not 0 <= opts.max_height <= bounds.max_screenshot_height:
        raise _refuse(what, f"max_height {opts.max_height} above {bounds.max_screenshot_height}")
    return Shot(
        opts.full_page, jpeg, opts.quality or 80, opts.max_height or bounds.max_screenshot_height
    )


def _wait_seconds(seconds: float, bounds: Bounds, what: str) -> float:
    if not 0 <= seconds <= bounds.max_render_wait:
        raise _refuse(what, f"{seconds:g} s outside 0..{bounds.max_render_wait:g} s")
    return seconds


def _selector(sel: str, what: str) -> str:
    if not sel or len(sel) > MAX_SELECTOR:
        raise _refuse(what, f"a selector of 1..{MAX_SELECTOR} characters is needed")
    return sel


def _step(i: int, action: jobs_pb2.Action, bounds: Bounds) -> Step:
    kind = action.WhichOneof("action")
    what = f"action {i} ({kind})"
    if kind == "wait":
        w = action.wait
        if w.WhichOneof("condition") == "selector":
            return Step("wait", selector=_selector(w.selector, what))
        return Step("wait", seconds=_wait_seconds(_seconds(w.duration), bounds, what))
    if kind == "click":
        return Step("click", selector=_selector(action.click.selector, what))
    if kind == "write":
        if len(action.write.text) > MAX_WRITE_TEXT:
            raise _refuse(what, f"text over {MAX_WRITE_TEXT} characters")
        return Step("write", text=action.write.text)
    if kind == "press":
        if not action.press.key or len(action.press.key) > MAX_KEY:
            raise _refuse(what, f"a key of 1..{MAX_KEY} characters is needed")
        return Step("press", text=action.press.key)
    if kind == "scroll":
        s = action.scroll
        if not 0 <= s.max_steps <= MAX_SCROLL_STEPS:
            raise _refuse(what, f"max_steps {s.max_steps} outside 1..{MAX_SCROLL_STEPS}")
        return Step(
            "scroll",
            up=s.direction == jobs_pb2.SCROLL_DIRECTION_UP,
            until_end=s.until_end,
            max_steps=s.max_steps or DEFAULT_SCROLL_STEPS,
        )
    if kind == "execute_javascript":
        script = action.execute_javascript.script
        if not script or len(script.encode("utf-8", "surrogatepass")) > MAX_SCRIPT_BYTES:
            raise _refuse(what, f"a script of 1 byte..{MAX_SCRIPT_BYTES >> 10} KiB is needed")
        return Step("execute_javascript", text=script)
    if kind == "screenshot":
        return Step("screenshot", shot=_shot(action.screenshot, bounds, what))
    raise _refuse(f"action {i}", "no action set")


def plan(options: jobs_pb2.ScrapeOptions, bounds: Bounds) -> Plan:
    """The request's browser steps, checked against ``bounds`` (ACTION_FAILED naming the
    wait or action that is out of bounds)."""
    if len(options.actions) > MAX_ACTIONS:
        raise _refuse("actions", f"{len(options.actions)} actions, at most {MAX_ACTIONS}")
    sel, secs = "", 0.0
    if options.HasField("wait_for"):
        cond = options.wait_for.WhichOneof("condition")
        if cond == "selector":
            sel = _selector(options.wait_for.selector, "wait_for")
        elif cond == "duration":
            secs = _wait_seconds(_seconds(options.wait_for.duration), bounds, "wait_for")
    steps = tuple(_step(i, a, bounds) for i, a in enumerate(options.actions))
    shot = None
    if jobs_pb2.FORMAT_SCREENSHOT in options.formats:
        shot = _shot(options.screenshot, bounds, "screenshot")
    return Plan(sel, secs, steps, shot)


def reason(exc: BaseException) -> str:
    """An exception as one bounded line (Playwright appends a call log)."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line[:_REASON_CHARS]


async def wait_for(page: Any, selector: str, seconds: float) -> None:
    """The request's ``wait_for``: a visible selector (within ``max_render_wait``) or a
    pause; TIMEOUT when the selector did not show in time, ACTION_FAILED when it cannot
    be waited for (a selector the browser refuses)."""
    if selector:
        try:
            await _visible(page, selector, seconds * 1000)
        except Exception as e:  # a Playwright error of any kind
            if _closed(e):
                raise
            if type(e).__name__ == "TimeoutError":  # Playwright's own
                raise PageError(
                    ErrorCode.TIMEOUT,
                    f"wait_for {selector!r}: not visible within {seconds:g} s (max_render_wait)",
                ) from e
            raise _refuse(f"wait_for {selector!r}", reason(e)) from e
    elif seconds > 0:
        await asyncio.sleep(seconds)


async def _visible(page: Any, selector: str, timeout_ms: float) -> None:
    """Wait until the first element ``selector`` matches is visible, through a locator
    that returns nothing: ``page.wait_for_selector`` hands the element back, adopted
    into the page's main world (more DevTools calls, a handle the page then holds),
    which cost a render about a quarter more CPU (issue 30)."""
    await page.locator(selector).first.wait_for(state="visible", timeout=timeout_ms)


def _closed(exc: BaseException) -> bool:
    """The page, its context or the browser went away, or the renderer crashed: not the
    action's fault (the render reports it)."""
    return type(exc).__name__ == "TargetClosedError" or "Target crashed" in str(exc)


_JS_WRAP = """async () => {
  const __v = await (async () => { SCRIPT
  })();
  const __s = JSON.stringify(__v === undefined ? null : __v);
  if (typeof __s !== "string") return [false, "the value is not JSON"];
  if (__s.length > MAX) return [false, "the value is over KIB KiB serialized"];
  return [true, __s];
}"""


async def _javascript(page: Any, script: str) -> str:
    head, tail = _JS_WRAP.split("SCRIPT")
    tail = tail.replace("MAX", str(MAX_JS_RESULT)).replace("KIB", str(MAX_JS_RESULT >> 10))
    got = await page.evaluate(head + script + tail)
    if not (isinstance(got, list) and len(got) == 2 and isinstance(got[1], str)):
        raise ValueError("the page returned no JSON string")
    ok, text = bool(got[0]), str(got[1])
    if not ok:
        raise ValueError(text[:_REASON_CHARS])
    if len(text.encode()) > MAX_JS_RESULT:
        raise ValueError(f"the value is over {MAX_JS_RESULT >> 10} KiB serialized")
    json.loads(text)  # the page may have replaced JSON.stringify
    return text


async def _scroll(page: Any, step: Step, deadline: float) -> None:
    if not step.until_end:
        sign = -1 if step.up else 1
        await page.evaluate("(d) => window.scrollBy(0, d * window.innerHeight)", sign)
        return
    for _ in range(step.max_steps):
        height = await page.evaluate(
            "() => { const h = document.documentElement.scrollHeight;"
            " window.scrollTo(0, h); return h; }"
        )
        settle = min(SCROLL_SETTLE, deadline - time.monotonic())
        if settle <= 0:
            return
        try:
            grown = "(h) => document.documentElement.scrollHeight > h"
            await page.wait_for_function(grown, arg=height, timeout=settle * 1000)
        except Exception as e:
            if _closed(e):
                raise
            return  # the page stopped growing


async def _run(page: Any, i: int, step: Step, deadline: float, max_bytes: int) -> Any:
    left_ms = max(1.0, (deadline - time.monotonic()) * 1000)
    if step.kind == "wait":
        if step.selector:
            await _visible(page, step.selector, left_ms)
        else:
            await asyncio.sleep(step.seconds)
    elif step.kind == "click":
        await page.click(step.selector, timeout=left_ms)
    elif step.kind == "write":
        await page.keyboard.type(step.text)
    elif step.kind == "press":
        await page.keyboard.press(step.text)
    elif step.kind == "scroll":
        await _scroll(page, step, deadline)
    elif step.kind == "execute_javascript":
        return jobs_pb2.ActionResult(index=i, javascript_return=await _javascript(page, step.text))
    elif step.kind == "screenshot":
        assert step.shot is not None
        shot = await screenshot(page, step.shot, max_bytes)
        return jobs_pb2.ActionResult(index=i, screenshot=shot)
    return None


async def run_actions(
    page: Any, steps: tuple[Step, ...], *, budget: float, max_screenshot_bytes: int
) -> list[jobs_pb2.ActionResult]:
    """Run ``steps`` in order within ``budget`` seconds; the results of execute_javascript
    and screenshot steps, in order. A browser that went away propagates as is."""
    results: list[jobs_pb2.ActionResult] = []
    deadline = time.monotonic() + budget
    for i, step in enumerate(steps):
        what = f"action {i} ({step.describe()})"
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            async with asyncio.timeout(left):
                got = await _run(page, i, step, deadline, max_screenshot_bytes)
        except TimeoutError as e:
            raise _refuse(what, f"the actions ran past max_actions_time ({budget:g} s)") from e
        except PageError as e:
            raise PageError(e.code, f"{what}: {e.message}") from e
        except Exception as e:
            if _closed(e):
                raise
            if type(e).__name__ == "TimeoutError":  # Playwright's own, within the budget
                raise _refuse(what, f"the actions ran past max_actions_time ({budget:g} s)") from e
            raise _refuse(what, reason(e)) from e
        if got is not None:
            results.append(got)
    return results


async def screenshot(page: Any, shot: Shot, max_bytes: int) -> jobs_pb2.Screenshot:
    """The page as an image: the viewport, or the full page cut at ``shot.max_height``;
    TOO_LARGE past ``max_bytes``."""
    kind = "jpeg" if shot.jpeg else "png"
    width = (page.viewport_size or {"width": 1280})["width"]
    kwargs: dict[str, Any] = {"type": kind, "animations": "disabled"}
    if shot.jpeg:
        kwargs["quality"] = shot.quality
    if shot.full_page:
        full = await page.evaluate("() => document.documentElement.scrollHeight")
        height = max(1, min(int(full), shot.max_height))  # the viewport's width always
        kwargs.update(full_page=True, clip={"x": 0, "y": 0, "width": width, "height": height})
    data = await page.screenshot(**kwargs)
    if len(data) > max_bytes:
        raise PageError(
            ErrorCode.TOO_LARGE, f"screenshot of {len(data)} bytes, at most {max_bytes}"
        )
    pixels = image_size(data)
    if pixels is None:
        raise PageError(ErrorCode.RENDER_FAILED, f"the browser's {kind} screenshot is unreadable")
    return jobs_pb2.Screenshot(
        data=data, content_type=f"image/{kind}", width=pixels[0], height=pixels[1]
    )


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) in pixels of a PNG (IHDR) or a baseline/progressive JPEG (its SOF
    segment), read from the bytes, not from the page; None when neither."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker in _SOF:
            return int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(
                data[i + 5 : i + 7], "big"
            )
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None
