"""Hostile URL paths: pages whose URLs try to escape or collide in ``pagesift export --dir``.

Every path under ``/paths/`` answers 200 with a small HTML page naming the exact path
and query it was asked for (so each URL's document is distinguishable). ``HOSTILE``
lists the URLs (relative to the site's root) that survive the node's URL
normalisation and still look hostile to a file system: encoded dot-dot with encoded
separators, backslashes, names differing only in case, query variants, NFC/NFD
spellings of one name, a bidi override, Windows device names, trailing dots and
spaces, hidden names, very long and very deep paths, a directory named like a file.
"""

from __future__ import annotations

import html

from aiohttp import web

from tests.hostile import Routes

__all__ = ["HOSTILE", "ROUTES"]

HOSTILE: list[str] = [
    "paths/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "paths/..%5C..%5Cwindows%5Csystem32%5Cconfig",
    "paths/Case",
    "paths/case",
    "paths/CASE",
    "paths/q?x=1",
    "paths/q?x=2",
    "paths/q?x=1&y=%2F..%2F",
    "paths/caf%C3%A9",
    "paths/cafe%CC%81",
    "paths/%E2%80%AEgpj.exe",
    "paths/CON",
    "paths/nul.txt",
    "paths/Aux",
    "paths/trailing.",
    "paths/%20spaced%20",
    "paths/.htaccess",
    "paths/" + "L" * 300,
    "paths/" + "/".join(["d" * 60] * 8) + "/leaf",
    "paths/index.md/child",
    "paths/index",
    "paths/dir/",
    "paths/dir/index",
    "paths/a:b*c|d",
    "paths/%E6%97%A5%E6%9C%AC%E8%AA%9E/%D0%BF%D1%80%D0%B8%D0%B2%D0%B5%D1%82",
]


async def _page(request: web.Request) -> web.Response:
    asked = html.escape(request.raw_path)
    return web.Response(
        text=f"<html><head><title>{asked}</title></head><body><p>page {asked}</p></body></html>",
        content_type="text/html",
    )


ROUTES: Routes = [("/paths/{tail:.*}", _page)]
