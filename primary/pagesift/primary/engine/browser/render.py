"""One page's render on a Playwright browser: a context in, ``Rendered`` out.

Owns ``render_page`` (a fresh context for one page) and ``new_context`` + ``render_in``
(the pool's per-job contexts, a new page each). A context holds the viewport, phone
emulation, locale, time zone, user agent, extra headers, a per-context proxy and the
request's TLS choice (``skip_tls_verification``: Playwright's ``ignore_https_errors``;
the browser does TLS itself, end to end through the guard proxy's tunnel); a page
gets the job's cookies, ``goto`` with ``wait_until``, the request's ``wait_for`` and actions
(``actions.run_actions``), then the HTML, the final URL, the main response's status and
headers, a screenshot when ``FORMAT_SCREENSHOT`` asks, and the context's cookies (the
caller merges them into the job's jar). ``BrowserPool.render`` is the entry point; the
module's only state is what each live context's pages need (a weak map).

Invariants and why they are safe:
- isolation: a context (cookies, localStorage, cache) serves one page or one job's
  pages (``pool``); pages and fresh contexts are closed in ``finally`` (bounded);
  service workers blocked, downloads refused;
- images, media and fonts are refused unless a screenshot is asked: each page of a
  context made with ``block_heavy`` gets its own DevTools session whose ``Fetch``
  interception pauses only those resource types (Chromium matches them, so no other
  request makes a round trip to this process) and fails them ``BlockedByClient``
  before any byte is asked of the network; its handler never raises (a paused request
  left unanswered would hang) and continues anything else it is handed. It covers the
  page's frames and their workers (one renderer: no out-of-process frames in the
  headless shell, ``pagememory``);
- the guard proxy's credentials: the context is given the proxy's server only, and
  ``new_context`` has a first page ask ``guardproxy.PRIME_URL`` with its session
  answering the proxy's 407 (only the proxy's, once per request); the browser keeps
  them in the context's own auth cache and sends them on every later connection
  unasked, so no request waits on an interception (Playwright, given credentials,
  pauses every request to answer 407s and turns the HTTP cache off). A context whose
  credentials are refused is closed and fails ``RENDER_FAILED`` before any page is
  rendered; a connection that came without them would get 407 (fail closed). Every
  connection still goes through the guard proxy: the context's proxy server is what
  routes it, not the credentials;
- the whole render runs under ``timeout`` (TIMEOUT past it); navigation errors map to
  the HTTP engine's codes (``DNS``, ``CONNECT``, ``TLS``, ``TIMEOUT``); a browser or
  page that went away raises ``BrowserGone`` for the pool to turn into a retryable
  ``RENDER_FAILED`` (or ``TOO_LARGE`` when its memory watch killed the page's renderer,
  ``pagememory``); the HTML is refused past ``max_body_bytes`` (TOO_LARGE); a
  ``wait_for`` that never shows is TIMEOUT (``actions.wait_for``);
- popups: the browser opens none (``pool.BOUND_LAUNCH_ARGS``); one that came anyway
  would be closed with the page;
- a job's pages (``idlepages.IdlePages``): a render that ran no actions and ended well leaves its
  page to the job's next render in the same context, which navigates it instead of
  opening a page (a new page is a new renderer process and target: about 40% of a
  page's CPU). Isolation is the context's: the page never leaves its job's
  context. A kept page waits ``PAGE_IDLE`` at most (then closes), serves ``PAGE_USES``
  renders at most, runs a full garbage collection before each (``idlepages.collected``;
  a page whose collection fails is replaced), and is never handed out once it crashed
  or closed; a render with actions (clicks, scripts, a ``beforeunload`` they could arm)
  or that failed closes its page.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.browser import actions
from pagesift.primary.engine.browser.guardproxy import PRIME_URL
from pagesift.primary.engine.browser.idlepages import CLOSE_TIMEOUT, IdlePages, collected
from pagesift.v1 import jobs_pb2

__all__ = [
    "MOBILE_UA", "BrowserGone", "Rendered", "blocks_heavy", "context_options", "new_context",
    "render_in", "render_page",
]  # fmt: skip

MOBILE_UA = (
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Mobile Safari/537.36"
)
BLOCKED_RESOURCES = frozenset({"image", "media", "font"})
# the DevTools Fetch patterns of BLOCKED_RESOURCES: only these requests pause
_HEAVY_PATTERNS = [
    {"urlPattern": "*", "resourceType": kind, "requestStage": "Request"}
    for kind in ("Image", "Media", "Font")
]
PRIME_TIMEOUT = 10.0  # seconds a new context may take to teach its proxy credentials
# asks PRIME_URL from the page (about:blank): its status, 0 when refused
_PRIME = "(url) => fetch(url, {cache: 'no-store'}).then((r) => r.status, () => 0)"


@dataclass(eq=False)
class _Setup:
    """What the pages of a context (``new_context``) need: the heavy-resource refusal,
    and the page that taught its proxy credentials, handed out first."""

    block_heavy: bool
    spare: Any = None


# the contexts made by ``new_context`` and what their pages need
_SETUP: weakref.WeakKeyDictionary[Any, _Setup] = weakref.WeakKeyDictionary()
_WAIT_UNTIL = {
    jobs_pb2.WAIT_UNTIL_UNSPECIFIED: "load",
    jobs_pb2.WAIT_UNTIL_LOAD: "load",
    jobs_pb2.WAIT_UNTIL_DOMCONTENTLOADED: "domcontentloaded",
    jobs_pb2.WAIT_UNTIL_NETWORKIDLE: "networkidle",
}
# net::ERR_* of a navigation to the HTTP engine's page error codes
_NET_ERRORS = (
    ("ERR_NAME_NOT_RESOLVED", ErrorCode.DNS),
    ("ERR_NAME_RESOLUTION_FAILED", ErrorCode.DNS),
    ("ERR_TIMED_OUT", ErrorCode.TIMEOUT),
    ("ERR_CONNECTION_TIMED_OUT", ErrorCode.TIMEOUT),
    ("ERR_CERT_", ErrorCode.TLS),
    ("ERR_SSL_", ErrorCode.TLS),
    ("ERR_TOO_MANY_REDIRECTS", ErrorCode.REDIRECT_LOOP),
    ("ERR_CONNECTION_", ErrorCode.CONNECT),
    ("ERR_EMPTY_RESPONSE", ErrorCode.CONNECT),
    ("ERR_ADDRESS_UNREACHABLE", ErrorCode.CONNECT),
    ("ERR_TUNNEL_CONNECTION_FAILED", ErrorCode.CONNECT),
    ("ERR_PROXY_CONNECTION_FAILED", ErrorCode.CONNECT),
)


class BrowserGone(Exception):
    """The browser (or the page's renderer) went away during the render."""


@dataclass
class Rendered:
    """A rendered page. ``cookies`` are the context's cookies at the end (Playwright's
    dicts: name, value, domain, path, expires, httpOnly, secure, sameSite)."""

    url: str
    final_url: str
    status: int
    headers: dict[str, str]
    html: bytes
    screenshot: jobs_pb2.Screenshot | None = None
    action_results: list[jobs_pb2.ActionResult] = field(default_factory=list)
    cookies: list[dict[str, Any]] = field(default_factory=list)


def context_options(
    options: jobs_pb2.ScrapeOptions,
    *,
    headers: Mapping[str, str],
    user_agent: str | None,
    proxy: Mapping[str, str] | None,
) -> dict[str, Any]:
    """``browser.new_context`` keywords for a request (pure)."""
    mobile = options.mobile
    width = options.viewport.width or (390 if mobile else 1280)
    height = options.viewport.height or (844 if mobile else 800)
    kw: dict[str, Any] = {
        "viewport": {"width": width, "height": height},
        "service_workers": "block",
        "accept_downloads": False,
        "java_script_enabled": True,
    }
    if mobile:
        kw.update(is_mobile=True, has_touch=True, device_scale_factor=3)
    agent = user_agent or options.user_agent or (MOBILE_UA if mobile else "")
    if agent:
        kw["user_agent"] = agent
    if options.locale:
        kw["locale"] = options.locale
    if options.timezone:
        kw["timezone_id"] = options.timezone
    if headers:
        kw["extra_http_headers"] = dict(headers)
    if proxy:
        kw["proxy"] = dict(proxy)
    if options.skip_tls_verification:
        kw["ignore_https_errors"] = True  # the request accepts any certificate
    return kw


async def _new_page(context: Any) -> Any:
    """A page of ``context``: the one that taught its credentials first, else a new
    one, refusing heavy resources when the context does."""
    setup = _SETUP.get(context)
    if setup is not None and setup.spare is not None:
        page, setup.spare = setup.spare, None
        if not page.is_closed():
            return page
    page = await context.new_page()
    if setup is not None and setup.block_heavy:
        try:
            await _session(context, page, block_heavy=True)
        except BaseException:
            await _close_page(page)
            raise
    return page


async def _close_page(page: Any) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CLOSE_TIMEOUT):
            await page.close()


async def _session(
    context: Any, page: Any, *, block_heavy: bool, proxy: Mapping[str, str] | None = None
) -> None:
    """The page's own DevTools session (module docstring): with ``block_heavy`` it
    fails BLOCKED_RESOURCES for the page's life; with ``proxy`` (a guard proxy
    registration) it first teaches the context its credentials: PRIME_URL asked from
    the page, the proxy's 407 answered with them (once per request, and only the
    proxy's), refused unless the proxy then answers 204. Its handlers never raise."""
    session = await context.new_cdp_session(page)
    answered: set[str] = set()
    server = (proxy or {}).get("server", "").rstrip("/")

    async def paused(event: dict[str, Any]) -> None:
        request = str(event.get("requestId", ""))
        kind = str(event.get("resourceType", "")).lower()
        url = str(event.get("request", {}).get("url", ""))
        refuse = {"requestId": request, "errorReason": "BlockedByClient"}
        try:
            if kind in BLOCKED_RESOURCES and url != PRIME_URL:
                await session.send("Fetch.failRequest", refuse)
            else:
                await session.send("Fetch.continueRequest", {"requestId": request})
        except Exception:
            with contextlib.suppress(Exception):
                await session.send("Fetch.failRequest", refuse)

    async def auth(event: dict[str, Any]) -> None:
        request = str(event.get("requestId", ""))
        challenge = event.get("authChallenge", {})
        ours = (
            proxy is not None
            and challenge.get("source") == "Proxy"
            and str(challenge.get("origin", "")).rstrip("/") == server
            and request not in answered
        )
        answered.add(request)
        answer: dict[str, str] = {"response": "CancelAuth"}
        if ours and proxy is not None:
            answer = {
                "response": "ProvideCredentials",
                "username": proxy.get("username", ""),
                "password": proxy.get("password", ""),
            }
        with contextlib.suppress(Exception):
            params = {"requestId": request, "authChallengeResponse": answer}
            await session.send("Fetch.continueWithAuth", params)

    session.on("Fetch.requestPaused", paused)
    session.on("Fetch.authRequired", auth)
    heavy = _HEAVY_PATTERNS if block_heavy else []
    if proxy is not None:
        prime = [*heavy, {"urlPattern": PRIME_URL, "requestStage": "Request"}]
        await session.send("Fetch.enable", {"handleAuthRequests": True, "patterns": prime})
        status = await page.evaluate(_PRIME, PRIME_URL)
        if status != 204:
            raise PageError(
                ErrorCode.RENDER_FAILED,
                f"the guard proxy refused the browser context's credentials ({status})",
            )
    if heavy:  # from here only the heavy types pause; no 407 is answered
        await session.send("Fetch.enable", {"patterns": heavy})
    else:
        await session.send("Fetch.disable")
        await session.detach()


def gone(exc: BaseException) -> bool:
    """Whether a Playwright error means the browser, context or page went away (or the
    page's renderer crashed)."""
    name = type(exc).__name__
    text = str(exc)
    return name == "TargetClosedError" or any(
        t in text for t in ("Target page, context or browser has been closed", "Target crashed")
    )


def _navigation_error(exc: BaseException, url: str) -> PageError | BrowserGone:
    text = actions.reason(exc)
    if gone(exc) or ("ERR_ABORTED" in text and "frame was detached" in text):
        return BrowserGone(text)
    if type(exc).__name__ == "TimeoutError":
        return PageError(ErrorCode.TIMEOUT, f"navigation to {url}: {text}")
    for needle, code in _NET_ERRORS:
        if needle in text:
            return PageError(code, text)
    return PageError(ErrorCode.RENDER_FAILED, text)


# page.content()'s serialization, refused in the page past the cap: a page that grew a
# huge DOM never sends it over the pipe
_CONTENT = """(max) => {
  const d = document.doctype ? new XMLSerializer().serializeToString(document.doctype) : "";
  const e = document.documentElement, h = e ? e.outerHTML : "";
  if (typeof d !== "string" || typeof h !== "string") return null;
  return d.length + h.length > max ? d.length + h.length : d + h;
}"""


async def _content(page: Any, max_bytes: int) -> bytes:
    """The rendered HTML, TOO_LARGE past ``max_bytes`` (checked in characters in the
    page, then in bytes here)."""
    got = await page.evaluate(_CONTENT, max_bytes)
    if isinstance(got, str):
        html = got.encode("utf-8", "replace")
        if len(html) <= max_bytes:
            return html
        got = len(html)
    if isinstance(got, int):
        raise PageError(
            ErrorCode.TOO_LARGE, f"rendered HTML of {got} characters, at most {max_bytes} bytes"
        )
    raise PageError(ErrorCode.RENDER_FAILED, "the page's HTML could not be read")


async def _renderer_crashed(page: Any, crashed: list[str]) -> bool:
    """Whether an aborted navigation was the renderer's death: its crash event, or a
    page that no longer evaluates (a bounded probe)."""
    if crashed:
        return True
    try:
        async with asyncio.timeout(2.0):
            await page.evaluate("1")
    except Exception as e:
        return bool(crashed) or gone(e)
    return bool(crashed)


def blocks_heavy(options: jobs_pb2.ScrapeOptions, bounds: actions.Bounds) -> bool:
    """Whether a render of ``options`` aborts images, media and fonts (no screenshot
    asked, neither by the format nor by an action). Refuses bad plans (``PageError``)."""
    steps = actions.plan(options, bounds)
    return steps.shot is None and not any(s.kind == "screenshot" for s in steps.steps)


async def new_context(
    browser: Any,
    options: jobs_pb2.ScrapeOptions,
    *,
    block_heavy: bool,
    headers: Mapping[str, str] | None = None,
    user_agent: str | None = None,
    proxy: Mapping[str, str] | None = None,
) -> Any:
    """A context for ``options`` (``context_options``) whose pages (``render_in``'s)
    refuse heavy resources when ``block_heavy``. ``proxy`` is the context's guard proxy
    registration (``ProxyCredentials.playwright``): the browser is given its server
    only, and a first page teaches it the credentials (``_session``), kept for the
    context's first render; Playwright, given none, intercepts no request to answer a
    407. ``BrowserGone`` when the browser went, else ``PageError``."""
    credentials = proxy if proxy and proxy.get("username") else None
    if credentials is not None:
        proxy = {k: v for k, v in credentials.items() if k not in ("username", "password")}
    ctx_kw = context_options(options, headers=headers or {}, user_agent=user_agent, proxy=proxy)
    try:
        context = await browser.new_context(**ctx_kw)
    except Exception as e:
        if gone(e) or not browser.is_connected():
            raise BrowserGone(actions.reason(e)) from e
        raise PageError(ErrorCode.RENDER_FAILED, f"new context: {actions.reason(e)}") from e
    setup = _SETUP[context] = _Setup(block_heavy)
    if credentials is None:
        return context
    try:
        async with asyncio.timeout(PRIME_TIMEOUT):
            page = await context.new_page()
            setup.spare = page
            await _session(context, page, block_heavy=block_heavy, proxy=credentials)
    except BaseException as e:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await context.close()
        if isinstance(e, PageError) or not isinstance(e, Exception):
            raise
        if gone(e) or not browser.is_connected():
            raise BrowserGone(actions.reason(e)) from e
        raise PageError(ErrorCode.RENDER_FAILED, f"new context: {actions.reason(e)}") from e
    return context


async def render_page(
    browser: Any,
    url: str,
    options: jobs_pb2.ScrapeOptions,
    *,
    bounds: actions.Bounds,
    timeout: float,
    max_html_bytes: int,
    headers: Mapping[str, str] | None = None,
    user_agent: str | None = None,
    cookies: Sequence[Mapping[str, Any]] = (),
    proxy: Mapping[str, str] | None = None,
) -> Rendered:
    """Render ``url`` in a new context of ``browser`` (module docstring), closed after.
    Raises ``PageError`` for the page's own failures, ``BrowserGone`` when the browser
    went."""
    heavy = blocks_heavy(options, bounds)  # refuses before any network is spent
    context = await new_context(
        browser, options, block_heavy=heavy, headers=headers, user_agent=user_agent, proxy=proxy
    )
    try:
        return await render_in(
            browser, context, url, options, bounds=bounds, timeout=timeout,
            max_html_bytes=max_html_bytes, cookies=cookies,
        )  # fmt: skip
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await context.close()


async def render_in(
    browser: Any,
    context: Any,
    url: str,
    options: jobs_pb2.ScrapeOptions,
    *,
    bounds: actions.Bounds,
    timeout: float,
    max_html_bytes: int,
    cookies: Sequence[Mapping[str, Any]] = (),
    idle: IdlePages | None = None,
) -> Rendered:
    """Render ``url`` on a page of ``context`` (made by ``new_context`` for these
    options): one of ``idle`` (the context's kept pages) or a new one; after, the page
    goes back to ``idle`` when the render ran no actions and ended well, else it is
    closed (bounded); errors as ``render_page``'s."""
    steps = actions.plan(options, bounds)
    crashed: list[str] = []  # the page's "crash" event: its renderer died
    pages: list[Any] = []
    keep = idle if idle is not None and not steps.steps else None

    def on_popup(popup: Any) -> None:
        pages.append(popup)  # none opens; if one did: closed

    def on_crash(_: object) -> None:
        crashed.append("crash")

    try:
        async with asyncio.timeout(timeout):
            got, uses = await _render(context, url, options, steps, bounds, timeout,
                                      max_html_bytes, cookies, crashed, pages, keep,
                                      on_popup, on_crash)  # fmt: skip
    except TimeoutError as e:
        if crashed:
            raise BrowserGone("the page's renderer crashed") from e
        raise PageError(ErrorCode.TIMEOUT, f"render took over {timeout:g} s") from e
    except PageError as e:
        if crashed:
            raise BrowserGone(f"the page's renderer crashed ({e.message})") from e
        raise
    except BrowserGone:
        raise
    except Exception as e:
        if gone(e) or not browser.is_connected():
            raise BrowserGone(actions.reason(e)) from e
        raise PageError(ErrorCode.RENDER_FAILED, actions.reason(e)) from e
    else:
        if keep is not None and len(pages) == 1 and not crashed:
            page = pages.pop()  # whole, no popup: the job's next render navigates it
            page.remove_listener("popup", on_popup)
            page.remove_listener("crash", on_crash)
            keep.put(page, uses + 1)
        return got
    finally:
        for page in pages:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await page.close()


async def _render(
    context: Any,
    url: str,
    options: jobs_pb2.ScrapeOptions,
    steps: actions.Plan,
    bounds: actions.Bounds,
    timeout: float,
    max_html_bytes: int,
    cookies: Sequence[Mapping[str, Any]],
    crashed: list[str],
    pages: list[Any],
    keep: IdlePages | None,
    on_popup: Callable[[Any], None],
    on_crash: Callable[[object], None],
) -> tuple[Rendered, int]:
    """The render on a kept page of ``keep`` or a new one; with the page's uses before."""
    if cookies:
        await context.add_cookies([dict(c) for c in cookies])
    # a URL with a fragment could be a same-document navigation of a kept page (its
    # old document would stay): such a render gets a new page
    taken = keep.take() if keep is not None and "#" not in url else None
    if keep is not None and taken is not None and not await collected(context, taken[0]):
        keep.discard(taken[0])  # its renderer is not answering: a new page instead
        taken = None
    page, uses = taken if taken is not None else (await _new_page(context), 0)
    pages.append(page)
    page.on("popup", on_popup)
    page.set_default_timeout(timeout * 1000)
    page.set_default_navigation_timeout(timeout * 1000)
    page.on("crash", on_crash)
    try:
        response = await page.goto(url, wait_until=_WAIT_UNTIL.get(options.wait_until, "load"))
    except Exception as e:
        failure = _navigation_error(e, url)
        if "ERR_ABORTED" in str(e) and await _renderer_crashed(page, crashed):
            failure = BrowserGone(f"the page's renderer crashed ({actions.reason(e)})")
        raise failure from e
    wait = bounds.max_render_wait if steps.wait_selector else steps.wait_seconds
    await actions.wait_for(page, steps.wait_selector, wait)
    results = await actions.run_actions(
        page,
        steps.steps,
        budget=bounds.max_actions_time,
        max_screenshot_bytes=bounds.max_screenshot_bytes,
    )
    html = await _content(page, max_html_bytes)
    shot = None
    if steps.shot is not None:
        shot = await actions.screenshot(page, steps.shot, bounds.max_screenshot_bytes)
    status, resp_headers = 200, {}
    if response is not None:
        status = response.status
        resp_headers = await response.all_headers()
    rendered = Rendered(
        url=url,
        final_url=page.url,
        status=status,
        headers=dict(resp_headers),
        html=html,
        screenshot=shot,
        action_results=results,
        cookies=[dict(c) for c in await context.cookies()],
    )
    return rendered, uses
