"""The scrapy-playwright side of the render benchmark: render a list of URLs, check markers.

Runs under ``bench/.venv-scrapy/bin/python`` (Scrapy, scrapy-playwright and Playwright are
not in the project's venv), e.g.::

    bench/.venv-scrapy/bin/python bench/render_peer.py --pages pages.json --concurrency 4 \\
        --selector '#content' --stats stats.json [--browser PATH] [--sync-out FD --sync-in FD]

``--pages`` is a JSON object ``{url: marker}``. Every URL is requested once through
scrapy-playwright (Debian's chromium-headless-shell, ``CONCURRENT_REQUESTS`` and the pages
per context = ``--concurrency``), waiting for ``--selector`` before the response is read; a
page counts as correct when its marker is in ``response.text`` (the rendered DOM). When the
spider closes it writes ``--stats``: Scrapy's stats, pages seen and correct, and the window
measured inside the process (spider_opened -> spider_closed): wall time, and the CPU of
this process and every live descendant (the Playwright driver and the browser's processes:
``utime+stime+cutime+cstime`` from ``/proc``, so reaped renderers count too).

With ``--sync-out``/``--sync-in`` (two pipe fds from the bench, ``bench.proctree.WindowPipe``)
the window's edges are told to the bench: ``open`` is written when the spider opens and
``close`` when it closes, each waiting for the bench's ``go`` (its CPU snapshots of the whole
tree), so the bench measures this crawler's tree exactly as it measures the others. The wall
time runs from the ``go`` at the open to just before the ``close``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scrapy import Request, Spider, signals  # type: ignore[import-not-found]
from scrapy.crawler import CrawlerProcess  # type: ignore[import-not-found]
from scrapy.http import Response  # type: ignore[import-not-found]
from scrapy_playwright.page import PageMethod  # type: ignore[import-not-found]

BROWSER = "/usr/lib/chromium/chromium-headless-shell"  # Debian's; --browser overrides
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def sync(fds: tuple[int, int] | None, word: str) -> None:
    """Tell the bench ``word`` and wait for its ``go`` (bounded: 120 s)."""
    if fds is None:
        return
    out, inp = fds
    os.write(out, word.encode() + b"\n")
    deadline = time.monotonic() + 120
    got = b""
    while b"\n" not in got:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no go from the bench after {word}")
        ready, _, _ = select.select([inp], [], [], 1.0)
        if ready:
            data = os.read(inp, 64)
            if not data:
                raise RuntimeError("the bench closed the window pipe")
            got += data


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants, reaped children included."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = (entry / "stat").read_text()
            rest = raw[raw.rindex(")") + 2 :].split()
            parents[int(entry.name)] = int(rest[1])
            times[int(entry.name)] = sum(int(x) for x in rest[11:15]) / _CLK_TCK
    tree, todo = {root}, [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p and c not in tree]
        tree.update(kids)
        todo += kids
    return sum(times.get(p, 0.0) for p in tree)


class RenderSpider(Spider):  # type: ignore[misc]
    """One playwright request per URL; one item per page with whether its marker was seen."""

    name = "render"

    def __init__(
        self,
        pages: dict[str, str],
        selector: str,
        stats_path: str,
        sync_fds: tuple[int, int] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.pages = pages
        self.selector = selector
        self.stats_path = stats_path
        self.sync_fds = sync_fds
        self.seen = 0
        self.correct = 0
        self.t_open = 0.0
        self.cpu_open = 0.0

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> RenderSpider:
        spider: RenderSpider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_opened, signal=signals.spider_opened)
        return spider

    def on_opened(self, spider: Spider) -> None:
        sync(self.sync_fds, "open")
        self.t_open = time.monotonic()
        self.cpu_open = tree_cpu_seconds(os.getpid())

    async def start(self) -> Any:
        for url in self.pages:
            yield Request(
                url,
                meta={
                    "playwright": True,
                    "playwright_page_methods": [PageMethod("wait_for_selector", self.selector)],
                },
                callback=self.parse,
                dont_filter=True,
            )

    def parse(self, response: Response) -> Iterator[dict[str, Any]]:
        marker = self.pages.get(response.url, "")
        ok = bool(marker) and marker in response.text
        self.seen += 1
        self.correct += ok
        yield {"url": response.url, "marker": ok}

    def closed(self, reason: str) -> None:
        wall = time.monotonic() - self.t_open
        cpu = tree_cpu_seconds(os.getpid()) - self.cpu_open
        sync(self.sync_fds, "close")
        out = {
            "reason": reason,
            "pages": self.seen,
            "correct": self.correct,
            "crawl_wall_s": wall,
            "crawl_cpu_s": cpu,
            "scrapy_stats": {k: str(v) for k, v in self.crawler.stats.get_stats().items()},
        }
        Path(self.stats_path).write_text(json.dumps(out, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", required=True, help="JSON file: {url: marker}")
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--selector", required=True)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--browser", default=BROWSER, help="the Chromium executable")
    ap.add_argument("--sync-out", type=int, help="fd: window edges to the bench")
    ap.add_argument("--sync-in", type=int, help="fd: the bench's go")
    args = ap.parse_args()
    pages: dict[str, str] = json.loads(Path(args.pages).read_text())
    handler = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
    settings = {
        "DOWNLOAD_HANDLERS": {"http": handler, "https": handler},
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
        "PLAYWRIGHT_BROWSER_TYPE": "chromium",
        "PLAYWRIGHT_LAUNCH_OPTIONS": {"executable_path": args.browser, "headless": True},
        "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT": args.concurrency,
        "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT": 30_000,
        "CONCURRENT_REQUESTS": args.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": args.concurrency,
        "CLOSESPIDER_TIMEOUT": args.timeout,
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
    }
    process = CrawlerProcess(settings)
    fds = None if args.sync_out is None else (args.sync_out, args.sync_in)
    process.crawl(
        RenderSpider, pages=pages, selector=args.selector, stats_path=args.stats, sync_fds=fds
    )
    process.start()


if __name__ == "__main__":
    main()
