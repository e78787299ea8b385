"""A job context's pages between renders: the page a render leaves, for the job's next.

Owns ``IdlePages``: per job context (``pool``), the pages whose last render ran no
actions and ended well, each waiting for the job's next render in the same context,
which navigates it instead of opening a page (a new page is a new renderer process
and DevTools target: about 40 % of a rendered page's CPU). ``render.render_in`` takes
and puts them.

Invariants and why they are safe:
- a page never leaves its context, so isolation is the context's (one job's pages);
- a kept page waits ``PAGE_IDLE`` seconds at most (then closes), serves ``PAGE_USES``
  renders at most, and is never handed out once it crashed or closed;
- before a kept page serves again its renderer runs a full garbage collection
  (``collected``): V8 collects lazily, so a reused renderer would carry the garbage of
  every document it showed (about 3 MB a navigation; at 8 pages at once, 320 MB of
  renderers against 215 MB collected). A page whose collection fails is not reused;
- closing is bounded (``CLOSE_TIMEOUT``) and runs in the background; ``drop`` forgets
  the pages of a browser that is gone without touching them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

__all__ = ["CLOSE_TIMEOUT", "GC_TIMEOUT", "PAGE_IDLE", "PAGE_USES", "IdlePages", "collected"]

CLOSE_TIMEOUT = 5.0  # seconds a page's close may take
GC_TIMEOUT = 5.0  # seconds a kept page's garbage collection may take
PAGE_IDLE = 2.0  # seconds a job's page waits for the job's next render, then closes
PAGE_USES = 10  # renders one page serves at most, then it starts afresh


async def collected(context: Any, page: Any) -> bool:
    """Whether the renderer of ``page`` (of ``context``) ran a full garbage collection:
    DevTools ``HeapProfiler.collectGarbage`` on a session of its own, detached after,
    all within ``GC_TIMEOUT``. False (the page is not to be reused) on any failure."""
    try:
        async with asyncio.timeout(GC_TIMEOUT):
            session = await context.new_cdp_session(page)
            try:
                await session.send("HeapProfiler.collectGarbage")
            finally:
                await session.detach()
    except Exception:
        return False
    return True


@dataclass(eq=False)
class _Kept:
    """A page between two renders: its uses so far, its expiry, whether it crashed."""

    page: Any
    uses: int
    timer: asyncio.TimerHandle | None = None
    crashed: bool = False

    def mark(self, _: object = None) -> None:
        self.crashed = True


class IdlePages:
    """One job context's pages between renders (module docstring): ``take`` one (or
    None), ``put`` it back after a render that may leave it. Each page waits ``idle``
    seconds at most, then closes; ``close`` closes them all (the context is going)."""

    def __init__(self, idle: float = PAGE_IDLE, uses: int = PAGE_USES) -> None:
        self.idle = idle
        self.uses = uses
        self._kept: list[_Kept] = []
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._kept)

    def take(self) -> tuple[Any, int] | None:
        """A kept page that is still whole, and its uses so far (the others close)."""
        while self._kept:
            kept = self._kept.pop()
            self._unkeep(kept)
            if not kept.crashed and not kept.page.is_closed():
                return kept.page, kept.uses
            self._close(kept.page)
        return None

    def put(self, page: Any, uses: int) -> None:
        """Keep ``page`` (``uses`` renders so far) for the next render, or close it when
        it served its last."""
        if uses >= self.uses or page.is_closed():
            self._close(page)
            return
        kept = _Kept(page, uses)
        page.on("crash", kept.mark)
        kept.timer = asyncio.get_running_loop().call_later(self.idle, self._expire, kept)
        self._kept.append(kept)

    def discard(self, page: Any) -> None:
        """Close ``page``, taken and not to be kept (bounded, in the background)."""
        self._close(page)

    def close(self) -> None:
        """Close every kept page (bounded, in the background)."""
        kept, self._kept = self._kept, []
        for k in kept:
            self._unkeep(k)
            self._close(k.page)

    def drop(self) -> None:
        """Forget every kept page without closing it (its browser is gone)."""
        kept, self._kept = self._kept, []
        for k in kept:
            self._unkeep(k)

    def _expire(self, kept: _Kept) -> None:
        if kept in self._kept:
            self._kept.remove(kept)
            self._unkeep(kept)
            self._close(kept.page)

    @staticmethod
    def _unkeep(kept: _Kept) -> None:
        if kept.timer is not None:
            kept.timer.cancel()
        with contextlib.suppress(Exception):
            kept.page.remove_listener("crash", kept.mark)

    def _close(self, page: Any) -> None:
        async def close() -> None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await page.close()

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
