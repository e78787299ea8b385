"""The browser engine: JavaScript-rendered pages through a headless Chromium.

Modules:

- ``guardproxy``: the in-node forward proxy every browser request goes through (the
  address rules of the HTTP engine applied to the exact address connected to), and
  the browser's launch arguments and context options that keep traffic on it.
- ``proxyhead``: the guard proxy's HTTP/1.x heads (request and response heads read
  strictly, the heads sent on).
- ``proxybody``: its message bodies (where each ends: one length, chunks, the close)
  and one request/response exchange relayed by them.
- ``proxyroute``: where one of its requests may go (the checked addresses, the
  upstream proxy).
- ``upstream``: its origin connections (dialled to checked addresses, kept idle per
  browser context for the next request).
- ``pool``: ``BrowserPool``, one lazily launched browser per node, a semaphore of
  pages with per-account fair limits, recycling, relaunch after a crash, the sweep of
  leftover profile folders.
- ``render``: one page's render in a fresh context (viewport, mobile, locale, time
  zone, headers, cookies in and out, waits, actions, screenshot) into ``Rendered``.
- ``idlepages``: a job context's pages between renders, reused by the job's next.
- ``pagememory``: the per-page memory cap, enforced while the page runs.
- ``procs``: the browser's processes as /proc shows them (its tree, memory, leftovers).
- ``actions``: the pure checks of waits and actions against the server's bounds, and
  the executor that runs them on a page within the actions' time budget.
"""
