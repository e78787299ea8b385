"""Page generation for the demo site: the text, the link graph and the rendered HTML.

This module owns how the seed turns into pages: which articles exist in which
section, how pages link to each other (nav, listings, inline links, prev/next
chains, related links, links to the failing, redirecting and ``/private/`` paths,
the calendar in every footer), how each link is spelled (root-relative, relative,
absolute, ``index.html`` forms, fragments) and the HTML each page renders to.
``generate_pages`` is its entry point; ``pagesift.demo.site.build_site``
turns its result into the manifest and the served application.
"""

from __future__ import annotations

import html
import posixpath
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pagesift.demo.layout import (
    BIG_PATH,
    BRAND,
    CALENDAR_ENTRY,
    JSON_PATH,
    LOOP_PATH,
    MISSING_PATH,
    ORIGIN,
    PDF_PATH,
    PRIVATE_PATHS,
    REDIRECT_CHAINS,
    SECTION_LANG,
    SECTION_TITLES,
    SECTIONS,
    SERVER_ERROR_PATH,
    SLOW_PATH,
    PageInfo,
)

LINKS_PER_SPECIAL = 2
INDEX_LISTS = 5  # articles a section index links to directly


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


def generate_pages(pages: int, seed: int) -> tuple[dict[str, str], dict[str, PageInfo]]:
    """Generate the site's HTML pages: path -> rendered HTML, and path -> ``PageInfo``.

    Paths are as served (a section index is ``/docs/``); ``ORIGIN`` in the HTML
    stands for the scheme and host the page is served under.
    """
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
    return rendered, infos
