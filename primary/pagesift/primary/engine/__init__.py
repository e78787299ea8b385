"""The engine: how a URL becomes a ``Page``; job code sees only ``protocol.Engine``.

- ``protocol``: the ``Engine`` contract, ``FetchPolicy`` and ``Page``.
- ``http``: ``HttpEngine``, the real engine's facade (a scrape, sitemaps, robots checks).
- ``sessions``: the aiohttp sessions, proxies, and how each hop is sent.
- ``hops``: the redirect chain: address guard, robots.txt, politeness, one response.
- ``pages``: what a response is and how it becomes a ``Page`` (extraction in workers).
- ``workers`` / ``workerproc``: the extraction worker pool / one worker process.
- ``netguard``: the address guard (resolver and socket factory).
- ``politeness``, ``retrypolicy``: per-host slots; retry and throttle decisions (pure).
- ``robots``, ``sitemaps``, ``content``: robots.txt, sitemap parsing, body sniffing.
- ``reqprofile``, ``cookiejar``: what a job's requests send; its cookie jar.
"""
