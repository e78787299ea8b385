"""The engine: how a URL becomes a ``Page``; job code sees only ``interface.Engine``.

- ``interface``: the ``Engine`` contract, ``FetchPolicy`` and ``Page``.
- ``rendering``: ``RenderingEngine``, the ``Engine`` every job sees, choosing HTTP or the
  browser per page; ``autorender``: AUTO's decision (does a page need a browser?).
- ``http``: ``HttpEngine``, the HTTP engine's facade (a scrape, sitemaps, robots checks).
- ``browser``: the browser engine (a headless Chromium behind the guard proxy).
- ``admission``: the one step every outgoing request passes before it is sent.
- ``sessions``: the aiohttp sessions, proxies, and how each hop is sent.
- ``hops``: the redirect chain: address guard, robots.txt, politeness, one response.
- ``pages``: what a response is and how it becomes a ``Page`` (extraction in workers).
- ``workers`` / ``workerproc``: the extraction worker pool / one worker process.
- ``netguard``: the address guard (resolver and socket factory).
- ``politeness``, ``retrypolicy``: per-host slots; retry and throttle decisions (pure).
- ``robots``, ``sitemaps``, ``content``: robots.txt, sitemap parsing, body sniffing.
- ``reqprofile``, ``cookiejar``: what a job's requests send; its cookie jar.
- ``cookierecords``: what the cookie jar stores, one record per cookie, and its budget.
"""
