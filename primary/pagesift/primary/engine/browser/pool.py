"""The node's browser: launched lazily, shared fairly, replaced when worn or gone.

Owns ``BrowserPool``: one Chromium per node (``async_playwright`` over a pipe, so the
browser exits when the node dies), ``max_browser_pages`` pages at once (0: 2 per CPU,
at most one per 256 MiB of memory) handed out by ``FairSlots``, and the browser's life:

- fairness: a free slot goes to the waiting owner (account) with the fewest pages in
  flight, ties to the longest waiting; an owner at its own limit
  (``Account.max_browser_pages``) is passed over. One account's queue therefore never
  holds another's first page beyond one slot;
- recycling: after ``browser_recycle_pages`` pages, or when the PSS of the browser's
  process tree (``/proc/PID/smaps_rollup``) passes ``browser_memory_limit``, new pages
  go to a fresh browser; the old one closes when its last page ends;
- a browser that disconnects (crash, SIGKILL) is dropped and the next page relaunches
  one; a page in flight on it fails ``RENDER_FAILED`` with ``worker_lost`` set (the
  runtime counts it toward quarantine like a lost extraction worker; the retry policy
  retries it);
- bounded pages: a renderer past ``browser_page_memory_limit`` is killed while its page
  runs (``pagememory.PageMemoryWatch``, one thread per browser) and that page fails
  ``TOO_LARGE`` naming the cap, the others go on; popups and new windows are refused
  at launch (``BOUND_LAUNCH_ARGS``); every render keeps its ``render_timeout``;
- ``playwright_chromiumdev_profile-*`` folders left in the temp dir by a killed node are
  swept at start, except those a running process still names (``procs``);
- a job's pages (``scope``: an object alive as long as the job) with the same options
  share one context, made with the job's first proxy credentials; the key holds the
  owner, the scope's identity and the options, and a hit also needs the scope's weak
  reference to be that very object, so two jobs never share one. A context whose page
  failed takes no new page; unused ones close after ``CONTEXT_IDLE`` or once their job
  is gone, their credentials released then. Within a job's context a page that ended
  well waits for the job's next page (``idlepages.IdlePages``: ``PAGE_IDLE`` at most,
  closed with its context), so the job's pages reuse a renderer instead of each
  starting one.

Why it is safe: every page holds a slot for its whole render and releases it in
``finally``; each render is bounded by ``render_timeout``; ``available()`` says why
rendering is off ("" or a missing executable) so callers fall back to HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.browser import actions
from pagesift.primary.engine.browser.guardproxy import GUARD_LAUNCH_ARGS
from pagesift.primary.engine.browser.idlepages import IdlePages
from pagesift.primary.engine.browser.pagememory import PageMemoryWatch, too_large
from pagesift.primary.engine.browser.procs import (  # the /proc readers, still pool's names
    _live_profiles as _live_profiles,
)
from pagesift.primary.engine.browser.procs import (
    _proc_table as _proc_table,
)
from pagesift.primary.engine.browser.procs import (
    browser_roots,
    sweep_profiles,
    tree_pss,
)
from pagesift.primary.engine.browser.procs import (
    descendants as descendants,
)
from pagesift.primary.engine.browser.render import (
    BrowserGone,
    Rendered,
    blocks_heavy,
    context_options,
    new_context,
    render_in,
    render_page,
)
from pagesift.v1 import jobs_pb2

__all__ = [
    "BOUND_LAUNCH_ARGS",
    "LAUNCH_ARGS",
    "Availability",
    "BrowserPool",
    "FairSlots",
    "default_pages",
    "descendants",
    "sweep_profiles",
    "tree_pss",
]

logger = logging.getLogger(__name__)

# a page opens no window: window.open returns null, target=_blank opens nothing (100
# popups took a browser to 1.1 GB); always part of the launch, like the guard's flags
BOUND_LAUNCH_ARGS: tuple[str, ...] = ("--block-new-web-contents",)
# no background traffic of the browser's own; the guard's flags (WebRTC's UDP only
# through the proxy, no QUIC) are always part of it
LAUNCH_ARGS: tuple[str, ...] = tuple(
    dict.fromkeys(
        (
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            *GUARD_LAUNCH_ARGS,
            *BOUND_LAUNCH_ARGS,
        )
    )
)
PAGE_MEMORY = 256 << 20
MEMORY_CHECK_EVERY = 1.0  # seconds between two PSS readings
LAUNCH_TIMEOUT = 30.0
CONTEXT_IDLE = 20.0  # seconds a job's unused context is kept for its next page
CONTEXT_CLOSE_TIMEOUT = 5.0


@dataclass(frozen=True)
class Availability:
    """Whether this node can render; ``reason`` says why not. Truthy when it can."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def default_pages(cpus: int, memory: int) -> int:
    """``max_browser_pages`` 0: 2 per CPU, at most one per 256 MiB, at least 1."""
    return max(1, min(2 * max(cpus, 1), memory // PAGE_MEMORY))


def _memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 4 << 30


class FairSlots:
    """``total`` slots; a freed slot goes to the eligible owner with the fewest in use
    (ties: who waited longest). ``limit`` None: only the total bounds an owner."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.in_use: dict[str, int] = {}
        self._waiting: deque[tuple[str, int | None, asyncio.Future[None]]] = deque()

    @property
    def used(self) -> int:
        return sum(self.in_use.values())

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def acquire(self, owner: str, limit: int | None = None) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((owner, limit, fut))
        self._dispatch()
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(owner)  # granted as we were cancelled
            else:
                fut.cancel()
                self._waiting = deque(w for w in self._waiting if w[2] is not fut)
            raise

    def release(self, owner: str) -> None:
        n = self.in_use.get(owner, 0) - 1
        if n > 0:
            self.in_use[owner] = n
        else:
            self.in_use.pop(owner, None)
        self._dispatch()

    def _dispatch(self) -> None:
        while self.used < self.total:
            best = None
            for pos, (owner, limit, fut) in enumerate(self._waiting):
                if fut.done():
                    continue
                n = self.in_use.get(owner, 0)
                if limit is not None and n >= max(limit, 1):
                    continue
                if best is None or n < self.in_use.get(self._waiting[best][0], 0):
                    best = pos
            if best is None:
                return
            owner, _, fut = self._waiting[best]
            del self._waiting[best]
            self.in_use[owner] = self.in_use.get(owner, 0) + 1
            fut.set_result(None)


@dataclass
class _Context:
    """A job's context: only pages of the live ``scope`` (the job) with the same
    options use it; ``release`` frees the proxy credentials it was made with."""

    context: Any
    scope: weakref.ref[object]
    release: Callable[[], object] | None
    in_flight: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    broken: bool = False  # a render on it failed: no new page goes to it
    pages: IdlePages = field(default_factory=IdlePages)  # its pages between renders

    def reusable(self, scope: object) -> bool:
        return not self.broken and self.scope() is scope


@dataclass
class _Browser:
    browser: Any
    pid: int | None
    pages: int = 0  # pages started on it
    in_flight: int = 0
    retiring: bool = False
    dead: bool = False
    next_check: float = field(default_factory=time.monotonic)  # of its memory
    contexts: dict[tuple[str, int, str], _Context] = field(default_factory=dict)
    orphans: list[_Context] = field(default_factory=list)  # replaced, pages in flight
    watch: PageMemoryWatch | None = None  # its renderers' memory cap


class BrowserPool:
    """The node's browser and its page slots (module docstring)."""

    def __init__(
        self,
        config: ServerConfig,
        proxy: Mapping[str, str] | None = None,
        *,
        launch_args: Sequence[str] = LAUNCH_ARGS,
    ) -> None:
        self.config = config
        self.proxy = dict(proxy) if proxy else None
        self.launch_args = list(dict.fromkeys((*launch_args, *GUARD_LAUNCH_ARGS,
                                               *BOUND_LAUNCH_ARGS)))  # fmt: skip
        total = config.max_browser_pages or default_pages(len(os.sched_getaffinity(0)), _memory())
        self.slots = FairSlots(total)
        self.bounds = actions.Bounds.of(config)
        self.restarts = 0
        self.launches = 0
        self.pages_rendered = 0
        self.renderers_killed = 0  # of browsers gone; the current one's: its watch
        self.swept: list[str] = []
        self._playwright: Any = None
        self._current: _Browser | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._old: set[asyncio.Task[None]] = set()
        self._contexts_lock = asyncio.Lock()
        self._sweeper: asyncio.Task[None] | None = None

    # availability and stats ----------------------------------------------------------
    def available(self) -> Availability:
        exe = self.config.browser_executable
        if not exe:
            return Availability(False, "browser_executable is empty: rendering is off")
        if not os.path.isfile(exe) or not os.access(exe, os.X_OK):
            return Availability(False, f"browser_executable {exe} is missing or not executable")
        return Availability(True)

    def stats(self) -> dict[str, int]:
        cur = self._current
        watch = cur.watch if cur is not None else None
        return {
            "in_use": self.slots.used,
            "waiting": self.slots.waiting,
            "capacity": self.slots.total,
            "restarts": self.restarts,
            "launches": self.launches,
            "pages_rendered": self.pages_rendered,
            "browser_pid": (cur.pid or 0) if cur and not cur.dead else 0,
            "contexts": self.contexts(),
            "renderers_killed": self.renderers_killed + (watch.kills if watch else 0),
            "renderer_peak_rss": watch.peak if watch else 0,  # the current browser's
        }

    def browser_pid(self) -> int | None:
        """The running browser's main process, if any."""
        cur = self._current
        return cur.pid if cur is not None and not cur.dead else None

    # the browser's life --------------------------------------------------------------
    async def _launch(self) -> _Browser:
        ok = self.available()
        if not ok:
            raise PageError(ErrorCode.RENDER_FAILED, ok.reason)
        if self._playwright is None:
            from playwright.async_api import async_playwright

            self.swept = await asyncio.to_thread(sweep_profiles)
            self._playwright = await async_playwright().start()
        exe = self.config.browser_executable
        before = await asyncio.to_thread(browser_roots, exe, os.getpid())
        try:
            async with asyncio.timeout(LAUNCH_TIMEOUT):
                browser = await self._playwright.chromium.launch(
                    executable_path=exe,
                    args=self.launch_args,
                    proxy=self.proxy,
                    handle_sigint=False,
                    handle_sigterm=False,
                    handle_sighup=False,
                )
        except Exception as e:
            raise PageError(ErrorCode.RENDER_FAILED, f"browser launch: {actions.reason(e)}") from e
        pids = await asyncio.to_thread(browser_roots, exe, os.getpid()) - before
        b = _Browser(browser, min(pids) if len(pids) == 1 else None)
        limit = self.config.browser_page_memory_limit
        if limit and b.pid:
            b.watch = PageMemoryWatch(b.pid, limit, lambda: b.in_flight > 0).start()
        browser.on("disconnected", lambda _: self._disconnected(b))
        self.launches += 1
        return b

    def _disconnected(self, b: _Browser) -> None:
        if not b.dead and not self._closed and not b.retiring:
            self.restarts += 1
            logger.warning("browser %s disconnected; the next page relaunches it", b.pid)
        self._stop_watch(b)
        if self._current is b:
            self._current = None
        self._forget_contexts(b)

    async def _browser(self) -> _Browser:
        async with self._lock:
            if self._closed:
                raise PageError(ErrorCode.RENDER_FAILED, "the browser pool is closed")
            cur = self._current
            if cur is None or cur.dead or cur.retiring or not cur.browser.is_connected():
                if cur is not None and not cur.dead and cur.in_flight == 0:
                    self._close_later(cur)
                cur = self._current = await self._launch()
            cur.pages += 1
            cur.in_flight += 1
            limit = self.config.browser_recycle_pages
            if limit and cur.pages >= limit:
                cur.retiring = True  # this page is its last
            return cur

    def _close_later(self, b: _Browser) -> None:
        b.retiring = True
        task = asyncio.create_task(self._close_browser(b))
        self._old.add(task)
        task.add_done_callback(self._old.discard)

    async def _close_browser(self, b: _Browser) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(10):
                await b.browser.close()
        self._stop_watch(b)
        self._forget_contexts(b)

    def _stop_watch(self, b: _Browser) -> None:
        """The browser is gone: its watch ends, its kills counted once."""
        b.dead = True
        watch, b.watch = b.watch, None
        if watch is not None:
            watch.stop()
            self.renderers_killed += watch.kills

    # jobs' contexts ------------------------------------------------------------------
    @staticmethod
    def _forget_contexts(b: _Browser) -> None:
        """The browser went or closed (its contexts with it): free their credentials."""
        entries = [*b.contexts.values(), *b.orphans]
        b.contexts.clear()
        b.orphans.clear()
        for e in entries:
            e.pages.drop()
            _release(e)

    async def _job_context(
        self,
        b: _Browser,
        scope: object,
        owner: str,
        options: jobs_pb2.ScrapeOptions,
        heavy: bool,
        headers: Mapping[str, str] | None,
        user_agent: str | None,
        proxy: Mapping[str, str] | None,
        release: Callable[[], object] | None,
    ) -> tuple[_Context, bool]:
        """The context of ``scope`` for these options (made, and adopting ``proxy``'s
        credentials, when it has none live); ``(entry, adopted)``; one page counted."""
        kw = context_options(options, headers=headers or {}, user_agent=user_agent, proxy=None)
        server = (proxy or {}).get("server", "")
        key = (owner, id(scope), repr(sorted(kw.items())) + f"|{heavy}|{server}")
        async with self._contexts_lock:
            self._sweep(b)
            entry = b.contexts.get(key)
            if entry is not None and entry.reusable(scope):
                entry.in_flight += 1
                return entry, False
            context = await new_context(
                b.browser, options, block_heavy=heavy, headers=headers,
                user_agent=user_agent, proxy=proxy,
            )  # fmt: skip
            if entry is not None:  # its job is gone (id reused) or it broke
                b.orphans.append(entry)
            entry = b.contexts[key] = _Context(context, weakref.ref(scope), release, 1)
            self._arm_sweep()
            return entry, True

    def _sweep(self, b: _Browser, now: float | None = None) -> None:
        """Close the contexts no page uses whose job is gone, that broke, or idle past
        ``CONTEXT_IDLE``."""
        at = time.monotonic() if now is None else now
        for key, e in list(b.contexts.items()):
            if e.in_flight == 0 and (
                e.broken or e.scope() is None or at - e.idle_since >= CONTEXT_IDLE
            ):
                del b.contexts[key]
                self._close_context(e)
        for e in [e for e in b.orphans if e.in_flight == 0]:
            b.orphans.remove(e)
            self._close_context(e)

    def _close_context(self, e: _Context) -> None:
        e.pages.close()

        async def close() -> None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CONTEXT_CLOSE_TIMEOUT):
                    await e.context.close()
            _release(e)

        task = asyncio.create_task(close())
        self._old.add(task)
        task.add_done_callback(self._old.discard)

    def _arm_sweep(self) -> None:
        """A sweep later, so an idle job's context closes with no page to come."""
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep_later())

    async def _sweep_later(self) -> None:
        while not self._closed:
            await asyncio.sleep(CONTEXT_IDLE / 2)
            b = self._current
            if b is None or b.dead or not (b.contexts or b.orphans):
                return  # a retired browser's contexts close with it
            self._sweep(b)

    def contexts(self) -> int:
        """Jobs' contexts open on the running browser."""
        cur = self._current
        return len(cur.contexts) + len(cur.orphans) if cur is not None else 0

    async def _after(self, b: _Browser) -> None:
        b.in_flight -= 1
        limit = self.config.browser_memory_limit
        if limit and not b.retiring and b.pid and time.monotonic() >= b.next_check:
            b.next_check = time.monotonic() + MEMORY_CHECK_EVERY
            pss = await asyncio.to_thread(tree_pss, b.pid)
            if pss > limit:
                logger.info("browser %s at %d bytes PSS: replaced", b.pid, pss)
                b.retiring = True
        if b.retiring and b.in_flight == 0 and not b.dead:
            if self._current is b:
                self._current = None
            self._close_later(b)

    # one page ------------------------------------------------------------------------
    async def render(
        self,
        url: str,
        options: jobs_pb2.ScrapeOptions,
        *,
        owner: str,
        owner_limit: int | None = None,
        headers: Mapping[str, str] | None = None,
        user_agent: str | None = None,
        cookies: Sequence[Mapping[str, Any]] = (),
        proxy: Mapping[str, str] | None = None,
        timeout: float | None = None,
        scope: object | None = None,
        release: Callable[[], object] | None = None,
    ) -> Rendered:
        """Render ``url`` for ``owner`` (an account) within one page slot.

        ``options`` gives the browser fields (wait_for, wait_until, actions, viewport,
        mobile, locale, timezone, screenshot, formats); request control comes from the
        caller's profile: ``headers`` (extra HTTP headers), ``user_agent`` (else
        ``options.user_agent``, else the browser's or the mobile one), ``cookies``
        (Playwright cookie dicts: name, value, domain or url, path...), ``proxy``
        (Playwright's per-context proxy dict). ``owner_limit``: the account's
        max_browser_pages (None: only the pool's total). ``timeout``: seconds for the
        whole render (default ``render_timeout``). ``scope``: the job the page is for
        (an object alive as long as the job, e.g. its ``RequestProfile``): its pages with
        the same options share one context (cookies, storage, cache), never another
        job's; None: a fresh context for this page alone. ``release``: called exactly
        once when ``proxy``'s credentials are no longer in use (after this render, or
        when the job's context made with them closes). Raises ``PageError``: the page's
        own failure, ``RENDER_FAILED`` (no browser; or a crash, with ``worker_lost``)."""
        adopted = False
        try:
            heavy = blocks_heavy(options, self.bounds)  # refuses before any network
            await self.slots.acquire(owner, owner_limit)
            try:
                b = await self._browser()
                started, watch = time.monotonic(), b.watch
                entry: _Context | None = None
                try:
                    limits: dict[str, Any] = {
                        "bounds": self.bounds,
                        "timeout": timeout or self.config.render_timeout,
                        "max_html_bytes": self.config.max_body_bytes or (64 << 20),
                    }
                    if scope is None:
                        got = await render_page(
                            b.browser, url, options, headers=headers, user_agent=user_agent,
                            cookies=cookies, proxy=proxy, **limits,
                        )  # fmt: skip
                    else:
                        entry, adopted = await self._job_context(
                            b, scope, owner, options, heavy, headers, user_agent, proxy, release
                        )
                        got = await render_in(
                            b.browser, entry.context, url, options, cookies=cookies,
                            idle=entry.pages, **limits,
                        )  # fmt: skip
                except BrowserGone as e:
                    if entry is not None:
                        entry.broken = True
                    kill = watch.killed_since(started) if watch is not None else None
                    if watch is not None and kill is not None:  # its renderer, killed
                        raise too_large(kill, watch.limit, url) from e
                    if not b.browser.is_connected():
                        self._disconnected(b)
                    raise PageError(
                        ErrorCode.RENDER_FAILED,
                        f"the browser or the page's renderer crashed while rendering {url}: {e}",
                        worker_lost=True,
                    ) from e
                except BaseException:
                    if entry is not None:
                        entry.broken = True  # a failed page's context takes no new one
                    raise
                finally:
                    if entry is not None:
                        entry.in_flight -= 1
                        entry.idle_since = time.monotonic()
                        if entry.in_flight == 0 and (entry.broken or b.dead):
                            self._sweep(b)
                    await self._after(b)
                self.pages_rendered += 1
                return got
            finally:
                self.slots.release(owner)
        finally:
            if release is not None and not adopted:
                release()

    async def close(self) -> None:
        """Close the browser and the Playwright driver; later renders fail."""
        async with self._lock:
            self._closed = True
            cur, self._current = self._current, None
        if self._sweeper is not None:
            self._sweeper.cancel()
        if cur is not None and not cur.dead:
            await self._close_browser(cur)
        for task in list(self._old):
            with contextlib.suppress(Exception):
                await task
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await self._playwright.stop()
            self._playwright = None


def _release(e: _Context) -> None:
    """Free a context's proxy credentials, once."""
    release, e.release = e.release, None
    if release is not None:
        with contextlib.suppress(Exception):
            release()
