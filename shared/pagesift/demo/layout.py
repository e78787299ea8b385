"""The demo site's fixed layout and the manifest types that describe a generated site.

This module owns what does not depend on the seed: the sections, the paths of the
special pages (slow, big, failing, non-HTML, redirect loop, ``/private/``, the
calendar trap), the redirect chains, the error code a crawl reports for each failing
path, and ``PageInfo``/``Manifest``, the generator's record of what it built. The
page generator (``pagesift.demo.pages``), the aiohttp application
(``pagesift.demo.app``) and the public surface (``pagesift.demo.site``)
all read it; it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

SECTIONS: tuple[str, ...] = ("docs", "guides", "blog", "reference")
SECTION_TITLES = {
    "docs": "Documentation",
    "guides": "Guides",
    "blog": "Blog",
    "reference": "API Reference",
}
SECTION_LANG = {"docs": "en", "guides": "en", "blog": "en-GB", "reference": "en-US"}
BRAND = "Northwind Docs"
ORIGIN = "\x00ORIGIN\x00"  # replaced by the request's scheme://host when a page is served

CALENDAR_ENTRY = "/calendar/2026/11"
CALENDAR_EXCLUDE = r"^/calendar/"
SLOW_PATH = "/slow.html"
BIG_PATH = "/files/big.html"
MISSING_PATH = "/missing.html"
SERVER_ERROR_PATH = "/server-error.html"
PDF_PATH = "/files/report.pdf"
JSON_PATH = "/data.json"
LOOP_PATH = "/loop/a"
PRIVATE_PATHS: tuple[str, ...] = ("/private/admin.html", "/private/reports/2025.html")
# source -> every hop after it; the last hop is the page that answers 200
REDIRECT_CHAINS: dict[str, tuple[tuple[int, str], ...]] = {
    "/old/launch.html": ((301, "/archive/launch-2019.html"),),
    "/go/roadmap": ((302, "/old/roadmap.html"), (301, "/archive/roadmap-2020.html")),
    "/news/latest": ((302, "/archive/news-2021.html"),),
}
LOOP_HOPS = {"/loop/a": "/loop/b", "/loop/b": "/loop/a"}

SPECIAL_ERRORS: dict[str, str] = {
    MISSING_PATH: "http_status",
    SERVER_ERROR_PATH: "http_status",
    SLOW_PATH: "timeout",
    BIG_PATH: "too_large",
    PDF_PATH: "parse_failed",  # a PDF without pages (a document the converter refuses)
    JSON_PATH: "unsupported_content",
    LOOP_PATH: "redirect_loop",
}


@dataclass(frozen=True)
class PageInfo:
    """One HTML page a crawl can return: ``title`` is the exact ``<title>`` text."""

    path: str
    kind: str  # home | section | article | about | landing | archive | private
    section: str
    title: str
    description: str
    lang: str
    links: tuple[str, ...]  # normalized same-site paths it links to (nav, body, footer)


@dataclass(frozen=True)
class Manifest:
    """Everything the generator decided, by path (independent of host and port)."""

    seed: int
    pages: dict[str, PageInfo]  # every 200 HTML page, redirect targets and /private/ included
    sitemap_paths: tuple[str, ...]  # <loc> paths as listed (one is an index.html form)
    sitemap_only_paths: frozenset[str]
    redirects: dict[str, str]  # source -> final target
    redirect_chains: dict[str, tuple[tuple[int, str], ...]]
    private_paths: frozenset[str]
    special_errors: dict[str, str]  # linked failing path -> error code
    aliases: dict[str, str]  # "/docs/index.html" -> "/docs/"
    calendar_entry: str
    slow_path: str
    slow_seconds: float
    big_path: str
    big_bytes: int
    crawl_delay: float
