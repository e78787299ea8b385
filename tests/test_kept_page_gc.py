"""A kept page's renderer collects its garbage before it serves again
(``idlepages.collected``), on a real chromium-headless-shell.

A page's script builds a large object graph and drops it: V8 collects lazily, so the
garbage stays in the renderer's heap (``Runtime.getHeapUsage``) until something asks.
``collected`` must free it, leave the page usable, and say False for a page it cannot
reach (closed), which the render path then replaces instead of reusing.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from playwright.async_api import Browser, async_playwright

from pagesift.primary.engine.browser import idlepages
from pagesift.primary.engine.browser.pool import LAUNCH_ARGS

EXE = "/usr/lib/chromium/chromium-headless-shell"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not os.access(EXE, os.X_OK), reason="chromium-headless-shell missing"),
]
MB = 1 << 20
# about 60 MB of small objects, reachable only from a local: garbage once it returns
LITTER = """() => {
  let junk = [];
  for (let i = 0; i < 600000; i++) junk.push({i, s: 'x'.repeat(40) + i});
  return junk.length;
}"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=EXE, args=list(LAUNCH_ARGS))
        try:
            yield b
        finally:
            await b.close()


async def _heap_used(context: object, page: object) -> int:
    session = await context.new_cdp_session(page)  # type: ignore[attr-defined]
    try:
        usage = await session.send("Runtime.getHeapUsage")
    finally:
        await session.detach()
    return int(usage["usedSize"])


async def test_a_kept_pages_garbage_is_collected_and_the_page_still_works(
    browser: Browser,
) -> None:
    context = await browser.new_context()
    try:
        page = await context.new_page()
        assert await page.evaluate(LITTER) == 600000
        littered = await _heap_used(context, page)
        assert littered > 40 * MB  # the garbage is still there: nothing collected it
        assert await idlepages.collected(context, page)
        cleared = await _heap_used(context, page)
        assert cleared < littered / 4, (littered, cleared)
        assert await page.evaluate("() => 6 * 7") == 42  # the page serves on
    finally:
        await context.close()


async def test_a_page_that_cannot_be_reached_is_not_collected(browser: Browser) -> None:
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await page.close()
        assert not await idlepages.collected(context, page)
    finally:
        await context.close()
