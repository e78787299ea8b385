"""A generated demo website on loopback, with a manifest that says what a crawl must return.

This module owns the site the test suite crawls (crawl correctness, crash and
replication tests) and that ``make run`` serves as a demo. ``build_site`` makes
an ``aiohttp`` application and, from the same generator, a manifest; the site is
deterministic for a given ``seed`` (only absolute links carry the ``Host`` the
client used). ``serve_site`` binds it to a free loopback port.

What the site contains (paths are fixed; only article slugs depend on the seed):

- ``/`` (also served at ``/index.html``), four sections ``/docs/``, ``/guides/``,
  ``/blog/``, ``/reference/`` (also at ``/<section>/index.html``; ``/docs``
  answers 301 -> ``/docs/`` like a real server), ``pages`` articles
  ``/<section>/<slug>.html`` and ``/about.html``. Every page has a head (title,
  meta description, ``html lang``), header/nav, a main article with paragraphs,
  a list, a code block and a table, an aside and a footer. Links come
  root-relative, relative (``../x/y.html``, ``./y.html``), absolute, with
  ``#fragments``, pure ``#fragment``, ``index.html`` variants, and to things a
  crawler must ignore (``mailto:``, an external ``https://example.invalid`` host).
  A section index lists its first articles; articles chain with prev/next, so
  link depths vary.
- ``/robots.txt``: ``Disallow: /private/``, ``Crawl-delay: <crawl_delay>`` and a
  ``Sitemap:`` line. ``/private/admin.html`` and ``/private/reports/2025.html``
  exist (200) and are linked from articles.
- ``/sitemap.xml``: the home page, the section indexes (one in its
  ``index.html`` form), the about page, about half the articles and the
  ``/landing/*.html`` pages, which nothing links to (``sitemap_only_urls``).
- Redirects: ``/old/launch.html`` 301 -> ``/archive/launch-2019.html``;
  ``/go/roadmap`` 302 -> ``/old/roadmap.html`` 301 -> ``/archive/roadmap-2020.html``;
  ``/news/latest`` 302 -> ``/archive/news-2021.html``. The targets and the middle
  hop are linked from nowhere and absent from the sitemap, so a crawl meets each
  target only through its redirect.
- Failures, each linked from two articles: ``/missing.html`` (404),
  ``/server-error.html`` (500), ``/slow.html`` (headers at once, then the body
  only after ``slow_seconds``), ``/files/big.html`` (``big_bytes`` of HTML,
  chunked, no Content-Length), ``/files/report.pdf`` (application/pdf),
  ``/data.json`` (application/json), ``/loop/a`` (302 -> ``/loop/b`` 302 ->
  ``/loop/a``).
- A calendar trap linked from every footer: ``/calendar/2026/11`` links to the
  previous and next month, forever (years 1..9999).

The crawl contract (``Site.expected_documents`` / ``Site.expected_errors``):

- URLs are page keys: ``normalize_url`` is the crawler's own
  ``pagesift.shared.urls.normalize`` (lower-case scheme and host, no default
  port, no fragment, no ``index.html``, no trailing slash but on ``/``: so
  ``/docs/``, ``/docs/index.html`` and ``/docs`` are one key ``.../docs``). A
  crawl returns each key at most once. Manifest paths are as served (``/docs/``);
  ``Site.url(root, path)`` gives the key.
- They describe a crawl from ``/`` with default request settings (same host
  only, query kept, sitemap ``include``, no limit) plus an exclude pattern for
  the calendar (``CALENDAR_EXCLUDE``); without it the crawl is unbounded and
  only ``limit``/``max_depth`` stop it (``exclude_calendar=False`` raises).
  Arguments state the other settings: ``sitemap`` (include | skip | only: only
  the sitemap's URLs, no link following), ``max_depth`` (link hops; the start
  URL is depth 0 and sitemap URLs depth 1, as the crawler seeds them; 0 or None
  is unlimited, as in the request), ``allow_non_html``.
- They assume the crawler's read timeout is below ``slow_seconds`` and its body
  cap below ``big_bytes`` (``slow_times_out``/``big_too_large`` say otherwise:
  the page is then a document), that it fetches links whatever their extension
  (so ``.pdf``/``.json`` fail as ``unsupported_content``), and that it respects
  robots.txt: each linked ``/private/`` URL is an error ``robots_disallowed``
  (``robots_disallowed_urls`` lists them, the ``robots_blocked`` of
  GetJobErrors). A 404/500 is ``http_status``, the loop ``redirect_loop``.
- A redirect source is a document whose ``url`` is the source and whose
  ``final_url`` is the target (``redirect_sources``); the target's own URL is
  never a document.

``Site.hits`` counts requests per path and ``Site.requests`` logs
``(time.monotonic(), path)``, so tests can check that a page was fetched once or
that Crawl-delay was honoured.
"""

from __future__ import annotations

import asyncio
import html
import posixpath
import random
import re
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, TypedDict, Unpack
from urllib.parse import urlsplit

from aiohttp import web

from pagesift.shared import urls

__all__ = [
    "BIG_PATH",
    "CALENDAR_ENTRY",
    "CALENDAR_EXCLUDE",
    "SECTIONS",
    "SLOW_PATH",
    "Manifest",
    "PageInfo",
    "Site",
    "build_site",
    "normalize_url",
    "serve_site",
]

MiB = 1024 * 1024
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


def _redirect_hops() -> dict[str, tuple[int, str, str]]:
    """Path -> (status, target, Location form) for every redirecting path."""
    hops: dict[str, tuple[int, str, str]] = {}
    forms = ("absolute", "root", "relative")
    for n, (src, chain) in enumerate(REDIRECT_CHAINS.items()):
        at = src
        for i, (status, target) in enumerate(chain):
            hops[at] = (status, target, forms[(n + i) % len(forms)])
            at = target
    for src, target in LOOP_HOPS.items():
        hops[src] = (302, target, "root")
    return hops


REDIRECT_HOPS = _redirect_hops()
SPECIAL_ERRORS: dict[str, str] = {
    MISSING_PATH: "http_status",
    SERVER_ERROR_PATH: "http_status",
    SLOW_PATH: "timeout",
    BIG_PATH: "too_large",
    PDF_PATH: "unsupported_content",
    JSON_PATH: "unsupported_content",
    LOOP_PATH: "redirect_loop",
}
LINKS_PER_SPECIAL = 2
INDEX_LISTS = 5  # articles a section index links to directly
_CALENDAR_RE = re.compile(r"^/calendar/(\d{4})/(\d{2})$")

SitemapMode = Literal["include", "skip", "only"]


def normalize_url(url: str) -> str:
    """The crawl's page key of ``url``: ``pagesift.shared.urls.normalize`` (no trailing
    slash but on ``/``, no ``index.html``, no fragment, no default port)."""
    return urls.normalize(url)


def _origin(root_url: str) -> str:
    parts = urlsplit(normalize_url(root_url))
    return f"{parts.scheme}://{parts.netloc}"


def _served_path(path: str) -> str:
    """A manifest path in its served form: ``/docs/index.html`` -> ``/docs/``."""
    return path.removesuffix("index.html") if path.endswith("/index.html") else path


def _key_path(path: str) -> str:
    """The path part of a manifest path's page key: ``/docs/`` -> ``/docs``."""
    return urlsplit(normalize_url("http://h" + path)).path


# ---------------------------------------------------------------- manifest


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


# ---------------------------------------------------------------- text generation

_VERBS = (
    "Configuring", "Deploying", "Scaling", "Monitoring", "Debugging", "Securing",
    "Tuning", "Migrating", "Testing", "Observing", "Automating", "Understanding",
)  # fmt: skip
_ADJS = (
    "durable", "distributed", "incremental", "resilient", "concurrent", "streaming",
    "replicated", "idempotent", "bounded", "lazy", "cached", "sharded",
)  # fmt: skip
_NOUNS = (
    "workers", "queues", "crawlers", "sitemaps", "snapshots", "indexes", "pipelines",
    "schedulers", "caches", "webhooks", "exporters", "parsers", "sessions", "leases",
)  # fmt: skip
_WORDS = (
    "the", "job", "runtime", "keeps", "every", "page", "in", "a", "log", "so", "that",
    "restarts", "never", "lose", "work", "each", "request", "carries", "an", "idempotency",
    "key", "and", "server", "answers", "with", "same", "result", "when", "client", "retries",
    "after", "timeout", "documents", "are", "stored", "order", "of", "completion", "while",
    "standby", "follows", "primary", "through", "stream", "batch", "crawl", "limits",
    "depth", "politeness", "delay", "host", "robots", "rules", "apply", "before", "fetch",
)  # fmt: skip
_OPTIONS = ("max_depth", "limit", "delay", "concurrency", "timeout", "retries", "ttl", "formats")


def _sentence(rng: random.Random, lo: int = 8, hi: int = 16) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize() + "."


def _paragraph(rng: random.Random, sentences: int = 3) -> str:
    return " ".join(_sentence(rng) for _ in range(sentences))


def _slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# ---------------------------------------------------------------- link rendering


@dataclass(frozen=True)
class _Link:
    target: str  # normalized path
    text: str
    style: str = "root"  # root | relative | absolute
    index_form: bool = False  # write a directory target as .../index.html
    fragment: str = ""
    rel: str = ""


def _href(src: str, link: _Link) -> str:
    """The href text for ``link`` on the page served at ``src`` (absolute: ORIGIN placeholder)."""
    target = link.target
    is_dir = target.endswith("/")
    path = target + "index.html" if is_dir and link.index_form else target
    if link.style == "absolute":
        href = ORIGIN + path
    elif link.style == "relative":
        base = src if src.endswith("/") else posixpath.dirname(src) + "/"
        rel = posixpath.relpath(path, base)
        if is_dir and not link.index_form:
            rel = "./" if rel == "." else rel + "/"
        elif "/" not in rel and not rel.startswith("."):
            rel = "./" + rel if len(link.text) % 2 else rel  # both "x.html" and "./x.html"
        href = rel
    else:
        href = path
    return href + (f"#{link.fragment}" if link.fragment else "")


def _a(src: str, link: _Link) -> str:
    rel = f' rel="{link.rel}"' if link.rel else ""
    return f'<a href="{html.escape(_href(src, link))}"{rel}>{html.escape(link.text)}</a>'


# ---------------------------------------------------------------- page plans


@dataclass
class _Plan:
    path: str
    kind: str
    section: str
    short_title: str
    description: str
    lang: str
    inline: list[_Link] = field(default_factory=list)
    related: list[_Link] = field(default_factory=list)
    resources: list[_Link] = field(default_factory=list)
    listing: list[_Link] = field(default_factory=list)
    prev: _Link | None = None
    next: _Link | None = None
    rng_seed: int = 0

    @property
    def self_links(self) -> bool:
        """Whether the page links to itself (``#top``): a redirect target must not, or a
        crawl would discover its URL there and fetch the page a second time."""
        return self.kind != "archive"

    @property
    def title(self) -> str:
        return f"{self.short_title} · {BRAND}"


def _style(rng: random.Random) -> tuple[str, bool, str]:
    style = rng.choices(("root", "relative", "absolute"), weights=(5, 4, 2))[0]
    index_form = rng.random() < 0.4
    fragment = rng.choice(("", "", "", "overview", "example", "options"))
    return style, index_form, fragment


def _link(rng: random.Random, target: str, text: str, rel: str = "") -> _Link:
    style, index_form, fragment = _style(rng)
    return _Link(target, text, style, index_form, fragment, rel)


class _Generator:
    def __init__(self, pages: int, seed: int) -> None:
        if pages < 2 * len(SECTIONS):
            raise ValueError(f"pages must be at least {2 * len(SECTIONS)}")
        self.rng = random.Random(seed)
        self.pages = pages
        self.plans: dict[str, _Plan] = {}
        self.articles: dict[str, list[str]] = {s: [] for s in SECTIONS}

    def _new(self, path: str, kind: str, section: str, title: str, lang: str = "en") -> _Plan:
        desc = f"{title}: {_sentence(self.rng, 10, 14)[:-1].lower()}."
        plan = _Plan(path, kind, section, title, desc, lang, rng_seed=self.rng.getrandbits(32))
        self.plans[path] = plan
        return plan

    def build(self) -> None:
        rng = self.rng
        self._new("/", "home", "", "Welcome")
        self._new("/about.html", "about", "", "About Northwind")
        for s in SECTIONS:
            self._new(f"/{s}/", "section", s, SECTION_TITLES[s], SECTION_LANG[s])
        used: set[str] = set()
        for i in range(self.pages):
            s = SECTIONS[i % len(SECTIONS)]
            title = f"{rng.choice(_VERBS)} {rng.choice(_ADJS)} {rng.choice(_NOUNS)}"
            slug = _slugify(title)
            n = 2
            while f"{s}/{slug}" in used:
                slug = f"{_slugify(title)}-{n}"
                n += 1
            used.add(f"{s}/{slug}")
            path = f"/{s}/{slug}.html"
            self._new(path, "article", s, title, SECTION_LANG[s])
            self.articles[s].append(path)
        for name in ("spring-launch", "partner-program", "enterprise-trial"):
            self._new(f"/landing/{name}.html", "landing", "landing", name.replace("-", " ").title())
        for chain in REDIRECT_CHAINS.values():
            target = chain[-1][1]
            stem = posixpath.basename(target).removesuffix(".html")
            self._new(target, "archive", "archive", f"Archive: {stem.replace('-', ' ')}")
        for p in PRIVATE_PATHS:
            self._new(p, "private", "private", f"Internal {posixpath.basename(p)}")
        self._wire()

    def _wire(self) -> None:
        rng = self.rng
        all_articles = [p for s in SECTIONS for p in self.articles[s]]
        home = self.plans["/"]
        home.listing = [_link(rng, f"/{s}/", SECTION_TITLES[s]) for s in SECTIONS] + [
            _link(rng, p, self.plans[p].short_title) for p in rng.sample(all_articles, 6)
        ]
        for s in SECTIONS:
            idx = self.plans[f"/{s}/"]
            idx.listing = [
                _link(rng, p, self.plans[p].short_title) for p in self.articles[s][:INDEX_LISTS]
            ]
            arts = self.articles[s]
            for i, p in enumerate(arts):
                plan = self.plans[p]
                if i > 0:
                    plan.prev = _link(rng, arts[i - 1], "Previous", "prev")
                if i + 1 < len(arts):
                    plan.next = _link(rng, arts[i + 1], "Next", "next")
                plan.inline = [
                    _link(rng, t, self.plans[t].short_title.lower())
                    for t in rng.sample(all_articles, 3)
                ]
                plan.related = [
                    _link(rng, t, self.plans[t].short_title) for t in rng.sample(all_articles, 3)
                ] + [_link(rng, f"/{s}/", f"All {SECTION_TITLES[s].lower()}")]
        about = self.plans["/about.html"]
        about.listing = [_link(rng, p, self.plans[p].short_title) for p in all_articles[:3]]
        for plan in self.plans.values():
            if plan.kind in ("landing", "archive", "private"):
                plan.listing = [
                    _link(rng, t, self.plans[t].short_title) for t in rng.sample(all_articles, 3)
                ]
        # failing and robots-disallowed targets, each linked from a few articles
        labels = {
            MISSING_PATH: "Legacy installer",
            SERVER_ERROR_PATH: "Live status",
            SLOW_PATH: "Full benchmark report",
            BIG_PATH: "Complete changelog",
            PDF_PATH: "Annual report (PDF)",
            JSON_PATH: "Raw metrics (JSON)",
            LOOP_PATH: "Mirror",
            **{p: "Admin area" for p in PRIVATE_PATHS},
            **{src: "Earlier announcement" for src in REDIRECT_CHAINS},
        }
        for target, label in labels.items():
            for host in rng.sample(all_articles, LINKS_PER_SPECIAL):
                self.plans[host].resources.append(_Link(target, label, "root"))

    # -------------------------------------------------------- rendering

    def render(self, plan: _Plan) -> str:
        rng = random.Random(plan.rng_seed)
        src = plan.path
        esc = html.escape
        nav_links = [
            _Link("/", "Home", rng.choice(("root", "relative", "absolute")), rng.random() < 0.5)
        ]
        nav_links += [
            _Link(f"/{s}/", SECTION_TITLES[s], rng.choice(("root", "relative")), rng.random() < 0.3)
            for s in SECTIONS
        ]
        nav = "".join(f"<li>{_a(src, link)}</li>" for link in nav_links)
        parts = [
            "<!DOCTYPE html>",
            f'<html lang="{plan.lang}">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(plan.title)}</title>",
            f'<meta name="description" content="{esc(plan.description)}">',
            "<style>body{font-family:system-ui,sans-serif;max-width:60rem;margin:auto}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem}</style>",
            "</head>",
            "<body>",
            '<header class="site-header">',
            f'<a class="brand" href="{esc(_href(src, _Link("/", BRAND)))}">{BRAND}</a>',
            f'<nav aria-label="Main"><ul>{nav}</ul></nav>',
            "</header>",
            "<main>",
        ]
        if plan.section in SECTIONS and plan.kind == "article":
            crumb = _Link(f"/{plan.section}/", SECTION_TITLES[plan.section], "relative")
            parts.append(
                f'<nav class="breadcrumbs">{_a(src, crumb)} &rsaquo; {esc(plan.short_title)}</nav>'
            )
        parts += [
            "<article>",
            f'<h1 id="top">{esc(plan.short_title)}</h1>',
            f'<p class="lead">{esc(plan.description)}</p>',
        ]
        if plan.self_links:
            parts.append(
                '<nav class="toc"><a href="#overview">Overview</a> · '
                '<a href="#example">Example</a> · <a href="#options">Options</a></nav>'
            )
        parts += [
            '<h2 id="overview">Overview</h2>',
        ]
        inline = list(plan.inline)
        for _ in range(3):
            text = esc(_paragraph(rng))
            if inline:
                text += f" See {_a(src, inline.pop())} for more."
            parts.append(f"<p>{text}</p>")
        if plan.listing:
            items = "".join(f"<li>{_a(src, link)}</li>" for link in plan.listing)
            parts.append(f'<ul class="listing">{items}</ul>')
        steps = "".join(f"<li>{esc(_sentence(rng, 4, 8))}</li>" for _ in range(rng.randint(3, 5)))
        parts += [
            f"<ol>{steps}</ol>",
            '<h2 id="example">Example</h2>',
            '<pre><code class="language-python">',
            esc(
                f'client = JobClient(["127.0.0.1:50051"])\n'
                f"job = await client.start_crawl(url, limit={rng.randint(10, 500)})\n"
                f"if job.completed < {rng.randint(2, 9)} and job.failed > 0:\n"
                f'    print("retry & wait")'
            ),
            "</code></pre>",
            '<h2 id="options">Options</h2>',
            "<table><thead><tr><th>Option</th><th>Default</th><th>Meaning</th></tr></thead><tbody>",
        ]
        for opt in rng.sample(_OPTIONS, 3):
            parts.append(
                f"<tr><td><code>{opt}</code></td><td>{rng.randint(0, 100)}</td>"
                f"<td>{esc(_sentence(rng, 4, 7))}</td></tr>"
            )
        parts.append("</tbody></table>")
        if plan.prev or plan.next:
            pager = " ".join(_a(src, link) for link in (plan.prev, plan.next) if link)
            parts.append(f'<p class="pager">{pager}</p>')
        if plan.self_links:
            parts.append('<p><a href="#top">Back to top</a></p>')
        parts.append("</article>")
        if plan.related or plan.resources:
            parts.append('<aside class="related"><h2>Related</h2><ul>')
            parts += [f"<li>{_a(src, link)}</li>" for link in plan.related]
            parts.append("</ul>")
            if plan.resources:
                parts.append("<h3>Resources</h3><ul>")
                parts += [f"<li>{_a(src, link)}</li>" for link in plan.resources]
                parts.append("</ul>")
            parts.append("</aside>")
        parts += [
            "</main>",
            '<footer class="site-footer"><p>© 2026 Northwind Labs · ',
            f"{_a(src, _Link('/about.html', 'About', 'relative'))} · ",
            f"{_a(src, _Link(CALENDAR_ENTRY, 'Events'))} · ",
            '<a href="https://example.invalid/status">Status</a> · ',
            '<a href="mailto:docs@example.invalid">Contact</a> · ',
            "<a>Top</a></p></footer>",
            "</body>",
            "</html>",
            "",
        ]
        return "\n".join(parts)

    def links_of(self, plan: _Plan) -> tuple[str, ...]:
        """Normalized same-site targets of a plan, as rendered (nav, body, footer)."""
        seen: dict[str, None] = {}
        for link in self._all_links(plan):
            seen.setdefault(link, None)
        return tuple(seen)

    def _all_links(self, plan: _Plan) -> Iterable[str]:
        yield "/"
        yield from (f"/{s}/" for s in SECTIONS)
        if plan.section in SECTIONS and plan.kind == "article":
            yield f"/{plan.section}/"
        if plan.self_links:
            yield plan.path  # "#overview" etc. resolve to the page itself
        yield from (link.target for link in plan.inline[::-1])
        yield from (link.target for link in plan.listing)
        yield from (link.target for link in (plan.prev, plan.next) if link)
        yield from (link.target for link in plan.related)
        yield from (link.target for link in plan.resources)
        yield "/about.html"
        yield CALENDAR_ENTRY


# ---------------------------------------------------------------- the site


class CrawlSettings(TypedDict, total=False):
    """The crawl settings ``Site.outcomes`` takes (see its defaults)."""

    sitemap: SitemapMode
    max_depth: int | None
    allow_non_html: bool
    slow_times_out: bool
    big_too_large: bool
    exclude_calendar: bool


@dataclass
class Site:
    """The application, its manifest, and request counters; see the module docstring."""

    app: web.Application
    manifest: Manifest
    hits: Counter[str] = field(default_factory=Counter)
    requests: list[tuple[float, str]] = field(default_factory=list)
    _by_key: dict[str, str] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------ URL helpers

    def url(self, root_url: str, path: str) -> str:
        """The normalized URL of ``path`` on the site served at ``root_url``."""
        return normalize_url(_origin(root_url) + path)

    def sitemap_only_urls(self, root_url: str) -> set[str]:
        return {self.url(root_url, p) for p in self.manifest.sitemap_only_paths}

    def sitemap_urls(self, root_url: str) -> set[str]:
        """Normalized URLs /sitemap.xml lists."""
        return {self.url(root_url, p) for p in self.manifest.sitemap_paths}

    def redirect_sources(self, root_url: str) -> dict[str, str]:
        """Redirect source URL -> the final URL its document must carry."""
        m = self.manifest
        return {self.url(root_url, s): self.url(root_url, t) for s, t in m.redirects.items()}

    def robots_disallowed_urls(self, root_url: str) -> set[str]:
        """Linked URLs under /private/ (a robots-respecting crawl never fetches them)."""
        return {self.url(root_url, p) for p in self.manifest.private_paths}

    def page_of(self, url: str) -> PageInfo:
        """The page a document URL (any spelling) ends at, following redirects."""
        m = self.manifest
        if not self._by_key:
            self._by_key.update({_key_path(p): p for p in m.pages})
            self._by_key.update({_key_path(s): t for s, t in m.redirects.items()})
        return m.pages[self._by_key[urlsplit(normalize_url(url)).path]]

    def title_of(self, url: str) -> str:
        """The ``<title>`` of the page a document URL ends at (follows redirects)."""
        return self.page_of(url).title

    # ------------------------------------------------------ the contract

    def outcomes(
        self,
        root_url: str,
        *,
        sitemap: SitemapMode = "include",
        max_depth: int | None = None,
        allow_non_html: bool = False,
        slow_times_out: bool = True,
        big_too_large: bool = True,
        exclude_calendar: bool = True,
    ) -> dict[str, str]:
        """Every URL the crawl must report -> ``"document"`` or its error code."""
        if not exclude_calendar:
            raise ValueError(
                "a crawl that does not exclude /calendar/ is unbounded; "
                f"pass exclude_paths=[{CALENDAR_EXCLUDE!r}] to the crawl"
            )
        m = self.manifest
        errors = dict(m.special_errors)
        if allow_non_html:
            errors = {p: c for p, c in errors.items() if c != "unsupported_content"}
        if not slow_times_out:
            errors.pop(m.slow_path, None)
        if not big_too_large:
            errors.pop(m.big_path, None)
        errors.update({p: "robots_disallowed" for p in m.private_paths})

        result: dict[str, str] = {}
        depth: dict[str, int] = {}
        if sitemap != "only":
            depth["/"] = 0  # the start URL, then the sitemap's URLs at depth 1
        if sitemap != "skip":
            for p in m.sitemap_paths:
                depth.setdefault(_served_path(p), 1)
        queue = deque(depth)
        while queue:
            path = queue.popleft()
            if re.search(CALENDAR_EXCLUDE, path):
                continue
            if path in errors:
                result[path] = errors[path]
                continue
            final = m.redirects.get(path, path)
            if final not in m.pages and path not in m.special_errors:
                raise AssertionError(f"demosite links to an unknown path {path}")
            result[path] = "document"
            if sitemap == "only" or final not in m.pages:
                continue
            if max_depth and depth[path] >= max_depth:
                continue
            for nxt in m.pages[final].links:
                if nxt not in depth:
                    depth[nxt] = depth[path] + 1
                    queue.append(nxt)
        return {self.url(root_url, p): v for p, v in result.items()}

    def expected_documents(self, root_url: str, **settings: Unpack[CrawlSettings]) -> set[str]:
        """Normalized URLs a crawl from ``/`` returns as documents (see the module docstring)."""
        out = self.outcomes(root_url, **settings)
        return {u for u, v in out.items() if v == "document"}

    def expected_errors(self, root_url: str, **settings: Unpack[CrawlSettings]) -> dict[str, str]:
        """Normalized URL -> error code for every page that crawl reports as failed."""
        out = self.outcomes(root_url, **settings)
        return {u: v for u, v in out.items() if v != "document"}


# ---------------------------------------------------------------- handlers

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _origin_of(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


def _html_response(body: str, request: web.Request, status: int = 200) -> web.Response:
    return web.Response(
        text=body.replace(ORIGIN, _origin_of(request)),
        status=status,
        content_type="text/html",
        charset="utf-8",
    )


def _simple_page(title: str, text: str) -> str:
    t = html.escape(title)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>{t}</title>'
        f"</head>\n<body><main><h1>{t}</h1><p>{html.escape(text)}</p>"
        f'<p><a href="/">Home</a></p></main></body>\n</html>\n'
    )


def _calendar_page(year: int, month: int) -> str:
    prev_y, prev_m = (year, month - 1) if month > 1 else (year - 1, 12)
    next_y, next_m = (year, month + 1) if month < 12 else (year + 1, 1)
    t = f"Events in {year:04d}-{month:02d} · {BRAND}"
    rows = "".join(
        f"<tr><td>{year:04d}-{month:02d}-{d:02d}</td><td>Office hours</td></tr>"
        for d in (3, 10, 17, 24)
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>{t}</title>'
        f'<meta name="description" content="Events calendar"></head>\n<body>'
        f'<header><nav><a href="/">Home</a></nav></header><main><article><h1>{t}</h1>'
        f"<table><tbody>{rows}</tbody></table>"
        f'<p><a rel="prev" href="/calendar/{prev_y:04d}/{prev_m:02d}">Previous month</a> '
        f'<a rel="next" href="../{next_y:04d}/{next_m:02d}">Next month</a></p>'
        "</article></main></body>\n</html>\n"
    )


def _make_app(
    site_pages: dict[str, str],
    manifest: Manifest,
    hits: Counter[str],
    requests: list[tuple[float, str]],
) -> web.Application:
    filler = ("pagesift demo filler text for a deliberately oversized page " * 64).encode()

    @web.middleware
    async def count(request: web.Request, handler: _Handler) -> web.StreamResponse:
        hits[request.path] += 1
        requests.append((time.monotonic(), request.path))
        return await handler(request)

    async def robots(request: web.Request) -> web.StreamResponse:
        text = (
            "# Northwind demo site\n"
            "User-agent: *\n"
            "Disallow: /private/\n"
            f"Crawl-delay: {manifest.crawl_delay:g}\n"
            "\n"
            f"Sitemap: {_origin_of(request)}/sitemap.xml\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def sitemap(request: web.Request) -> web.StreamResponse:
        origin = _origin_of(request)
        urls = "".join(
            f"  <url><loc>{html.escape(origin + p)}</loc><lastmod>2026-10-01</lastmod></url>\n"
            for p in manifest.sitemap_paths
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
            f"{urls}</urlset>\n"
        )
        return web.Response(text=body, content_type="application/xml")

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
        await resp.prepare(request)
        await resp.write(b'<!DOCTYPE html>\n<html lang="en">\n<head><title>Slow page')
        await asyncio.sleep(manifest.slow_seconds)
        await resp.write(b"</title></head><body><p>Finally.</p></body></html>\n")
        await resp.write_eof()
        return resp

    async def big(request: web.Request) -> web.StreamResponse:
        head = b'<!DOCTYPE html>\n<html lang="en">\n<head><title>Complete changelog</title>'
        head += b"</head>\n<body><p>"
        tail = b"</p></body>\n</html>\n"
        remaining = manifest.big_bytes - len(head) - len(tail)
        resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            await resp.write(head)
            while remaining > 0:
                chunk = filler[:remaining]
                await resp.write(chunk)
                remaining -= len(chunk)
            await resp.write(tail)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the client stopped reading at its cap
        return resp

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path
        origin = _origin_of(request)
        page = site_pages.get(path)
        if page is not None:
            return _html_response(page, request)
        if path + "/" in site_pages:  # a directory asked for without its slash
            return web.Response(status=301, headers={"Location": origin + path + "/"})
        hop = REDIRECT_HOPS.get(path)
        if hop is not None:
            status, target, form = hop
            if form == "absolute":
                location = origin + target
            elif form == "relative":
                location = posixpath.relpath(target, posixpath.dirname(path) + "/")
            else:
                location = target
            return web.Response(status=status, headers={"Location": location})
        if path == "/robots.txt":
            return await robots(request)
        if path == "/sitemap.xml":
            return await sitemap(request)
        if path == manifest.slow_path:
            return await slow(request)
        if path == manifest.big_path:
            return await big(request)
        if path == PDF_PATH:
            pdf = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n"
            pdf += b"trailer << /Root 1 0 R >>\n%%EOF\n"
            return web.Response(body=pdf, content_type="application/pdf")
        if path == JSON_PATH:
            return web.json_response({"pages": len(manifest.pages), "seed": manifest.seed})
        if path == SERVER_ERROR_PATH:
            oops = _simple_page("Internal Server Error", "Something broke.")
            return _html_response(oops, request, status=500)
        m = _CALENDAR_RE.match(path)
        if m and 1 <= int(m.group(1)) <= 9999 and 1 <= int(m.group(2)) <= 12:
            return _html_response(_calendar_page(int(m.group(1)), int(m.group(2))), request)
        return _html_response(_simple_page("Not Found", f"No page at {path}."), request, 404)

    app = web.Application(middlewares=[count])
    app.router.add_get("/{tail:.*}", handle)
    return app


def build_site(
    pages: int = 300,
    *,
    seed: int = 1,
    crawl_delay: float = 0.0,
    slow_seconds: float = 3.0,
    big_bytes: int = 3 * MiB,
) -> Site:
    """Generate the site: ``pages`` articles (at least 8) spread over the four sections.

    ``crawl_delay`` goes to robots.txt's Crawl-delay; ``/slow.html`` holds its body
    back ``slow_seconds``; ``/files/big.html`` is exactly ``big_bytes`` long.
    """
    if big_bytes < 1024:
        raise ValueError("big_bytes must be at least 1024")
    gen = _Generator(pages, seed)
    gen.build()
    rendered = {path: gen.render(plan) for path, plan in gen.plans.items()}
    infos = {
        path: PageInfo(
            path=path,
            kind=plan.kind,
            section=plan.section,
            title=plan.title,
            description=plan.description,
            lang=plan.lang,
            links=gen.links_of(plan),
        )
        for path, plan in gen.plans.items()
    }
    aliases = {p + "index.html": p for p in infos if p.endswith("/")}
    served = dict(rendered)
    served.update({alias: rendered[p] for alias, p in aliases.items()})

    rng = random.Random(seed ^ 0x5EED)
    articles = [p for p, i in infos.items() if i.kind == "article"]
    listed = sorted(rng.sample(articles, len(articles) // 2))
    landing = [p for p, i in infos.items() if i.kind == "landing"]
    sections = [f"/{s}/" for s in SECTIONS]
    sections[1] += "index.html"  # the sitemap needs normalizing too
    sitemap_paths = ("/", *sections, "/about.html", *listed, *landing)

    manifest = Manifest(
        seed=seed,
        pages=infos,
        sitemap_paths=sitemap_paths,
        sitemap_only_paths=frozenset(landing),
        redirects={src: chain[-1][1] for src, chain in REDIRECT_CHAINS.items()},
        redirect_chains=dict(REDIRECT_CHAINS),
        private_paths=frozenset(PRIVATE_PATHS),
        special_errors=dict(SPECIAL_ERRORS),
        aliases=aliases,
        calendar_entry=CALENDAR_ENTRY,
        slow_path=SLOW_PATH,
        slow_seconds=slow_seconds,
        big_path=BIG_PATH,
        big_bytes=big_bytes,
        crawl_delay=crawl_delay,
    )
    hits: Counter[str] = Counter()
    requests: list[tuple[float, str]] = []
    app = _make_app(served, manifest, hits, requests)
    return Site(app=app, manifest=manifest, hits=hits, requests=requests)


async def serve_site(
    site: Site, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve ``site`` on ``host:port`` (0: a free port); returns the runner and root URL.

    The root URL ends in ``/``. Call ``await runner.cleanup()`` to stop; handlers
    are cancelled when their client goes away, so cleanup never waits on
    ``/slow.html``.
    """
    runner = web.AppRunner(
        site.app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None
    )
    await runner.setup()
    tcp = web.TCPSite(runner, host, port)
    await tcp.start()
    bound = runner.addresses[0]
    actual_port = int(bound[1])
    shown = f"[{host}]" if ":" in host else host
    return runner, f"http://{shown}:{actual_port}/"
