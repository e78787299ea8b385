"""The render bench's JS site (``bench.render_site``): what a page loads and what the
server counts, fetched over loopback with a plain HTTP client (no browser).

Each page must cost three requests beyond its HTML (stylesheet, external script, JSON)
with per-page paths and ``no-store`` answers, so no crawler's cache saves one; the marker
must be only in the JSON; and ``/_counts`` must count each kind and the connections.
"""

from __future__ import annotations

import re
import urllib.request

from bench.render_site import SUBRESOURCES, counts, js_site, kind_of, marker, served_between


def _get(url: str) -> tuple[bytes, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as resp:
        return resp.read(), str(resp.headers.get("Cache-Control"))


def test_a_page_loads_three_subresources_and_the_site_counts_them() -> None:
    with js_site(5) as base:
        before = counts(base)
        html, cache = _get(f"{base}/p/3")
        assert cache == "no-store"
        text = html.decode()
        assert marker(3) not in text  # only a render sees it
        refs = re.findall(r'(?:href|src)="(/s/[^"]+)"', text)
        assert sorted(refs) == ["/s/3/app.js", "/s/3/site.css"]
        assert sorted(kind_of(r) for r in refs) == ["css", "js"]
        script = b""
        for ref in refs:
            body, cache = _get(base + ref)
            assert cache == "no-store"
            script = body if ref.endswith(".js") else script
        assert b"fetch('/api/' + id)" in script and b"'load'" in script
        data, cache = _get(f"{base}/api/3")
        assert cache == "no-store" and marker(3).encode() in data
        served = served_between(before, counts(base))
        assert {k: served[k] for k in ("html", *SUBRESOURCES)} == dict.fromkeys(
            ("html", *SUBRESOURCES), 1
        )
        assert served["other"] == 0
        # urllib opens one connection per request: four new ones
        assert served["connections"] == 4
