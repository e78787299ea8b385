"""The Scrapy side of the crawl benchmark: a generic same-host CrawlSpider, run standalone.

Runs under ``bench/.venv-scrapy/bin/python`` (Scrapy is not in the project's venv), e.g.::

    bench/.venv-scrapy/bin/python bench/scrapy_spider.py --url http://127.0.0.1:PORT/ \\
        --concurrency 16 --limit 0 --feed out.jsonl --stats stats.json

It follows every same-host link (``LinkExtractor`` with no deny rules), writes one
JSON line per HTML page (url, title, body length) to ``--feed`` and, when the spider
closes, writes ``--stats``: Scrapy's own stats plus the crawl window measured inside
the process (monotonic wall time and ``getrusage(RUSAGE_SELF)`` CPU from spider_opened to
spider_closed), so interpreter start-up and imports are not counted against Scrapy.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from scrapy import Spider, signals  # type: ignore[import-not-found]
from scrapy.crawler import CrawlerProcess  # type: ignore[import-not-found]
from scrapy.http import HtmlResponse, Response  # type: ignore[import-not-found]
from scrapy.linkextractors import LinkExtractor  # type: ignore[import-not-found]
from scrapy.spiders import CrawlSpider, Rule  # type: ignore[import-not-found]


def _cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class SiteSpider(CrawlSpider):  # type: ignore[misc]
    """Follow every link on the start URL's host; one item per HTML page."""

    name = "site"

    def __init__(self, start_url: str, stats_path: str, **kwargs: Any) -> None:
        parts = urlsplit(start_url)
        self.start_urls = [start_url]
        # OffsiteMiddleware matches host names; LinkExtractor's allow_domains matches the
        # netloc, port included: together they keep the crawl on exactly this host:port.
        self.allowed_domains = [parts.hostname or ""]
        self.rules = (
            Rule(LinkExtractor(allow_domains=[parts.netloc]), callback="parse_page", follow=True),
        )
        self.stats_path = stats_path
        self.t_open = 0.0
        self.cpu_open = 0.0
        super().__init__(**kwargs)  # compiles self.rules

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> SiteSpider:
        spider: SiteSpider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_opened, signal=signals.spider_opened)
        return spider

    def on_opened(self, spider: Spider) -> None:
        self.t_open = time.monotonic()
        self.cpu_open = _cpu_self()

    def parse_start_url(self, response: Response, **kwargs: Any) -> Iterator[dict[str, Any]]:
        return self.parse_page(response)

    def parse_page(self, response: Response) -> Iterator[dict[str, Any]]:
        if not isinstance(response, HtmlResponse):
            self.crawler.stats.inc_value("bench/non_html")
            return
        yield {
            "url": response.url,
            "title": (response.css("title::text").get() or "").strip(),
            "length": len(response.body),
        }

    def closed(self, reason: str) -> None:
        wall = time.monotonic() - self.t_open
        cpu = _cpu_self() - self.cpu_open
        ru = resource.getrusage(resource.RUSAGE_SELF)
        stats = {
            k: (v.isoformat() if hasattr(v, "isoformat") else v)
            for k, v in self.crawler.stats.get_stats().items()
        }
        out = {
            "reason": reason,
            "crawl_wall_s": wall,
            "crawl_cpu_s": cpu,
            "maxrss_bytes": ru.ru_maxrss * 1024,
            "scrapy_stats": stats,
        }
        with open(self.stats_path, "w") as fh:
            json.dump(out, fh, indent=2, default=str)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0, help="CLOSESPIDER_PAGECOUNT; 0 = no limit")
    ap.add_argument("--timeout", type=float, default=900.0, help="CLOSESPIDER_TIMEOUT (s)")
    ap.add_argument("--feed", required=True)
    ap.add_argument("--stats", required=True)
    args = ap.parse_args()
    host = urlsplit(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"refusing to crawl {args.url}: the benchmark only targets loopback")
    settings = {
        "BOT_NAME": "bench",
        "CONCURRENT_REQUESTS": args.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": args.concurrency,
        "ROBOTSTXT_OBEY": False,
        "LOG_LEVEL": "INFO",
        "AUTOTHROTTLE_ENABLED": False,
        "DOWNLOAD_DELAY": 0,
        "HTTPCACHE_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,  # no extra listening sockets
        "REMOTE_CONTROL_ENABLED": False,
        "CLOSESPIDER_PAGECOUNT": args.limit,
        "CLOSESPIDER_TIMEOUT": args.timeout,
        "FEEDS": {args.feed: {"format": "jsonlines", "encoding": "utf-8", "overwrite": True}},
    }
    process = CrawlerProcess(settings=settings)
    process.crawl(SiteSpider, start_url=args.url, stats_path=args.stats)
    process.start()


if __name__ == "__main__":
    main()
