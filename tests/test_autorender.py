"""AUTO's decision (``engine.autorender``): which real-world page shapes need a browser,
the per-host memory, and the bounded scan on hostile bytes."""

from __future__ import annotations

import time

import pytest

from pagesift.primary.engine.autorender import RICH_TEXT, HostMemory, needs_render
from pagesift.primary.engine.rendering import browser_asked
from pagesift.v1 import jobs_pb2

PROSE = " ".join(["Reading the manual explains every option of the tool in detail."] * 40)

CRA = b"""<!doctype html><html lang="en"><head><meta charset="utf-8"/>
<title>React App</title><script defer="defer" src="/static/js/main.8c1d.js"></script>
<link href="/static/css/main.css" rel="stylesheet"></head><body>
<noscript>You need to enable JavaScript to run this app.</noscript>
<div id="root"></div></body></html>"""
VUE = b"""<!DOCTYPE html><html><head><title>shop</title>
<script type="module" crossorigin src="/assets/index-4f2a.js"></script></head>
<body><div id='app'>
  <!-- mounted by Vue -->
</div></body></html>"""
ANGULAR = b"""<!doctype html><html><head><base href="/"><title>Admin</title></head>
<body><app-root></app-root><script src="runtime.js" type="module"></script>
<script src="main.js" type="module"></script></body></html>"""
NG_VERSION = b"""<html><body><my-app ng-version="17.3.0"></my-app>
<script src="main.js"></script></body></html>"""
NEXT_EMPTY = b"""<html><head><script src="/_next/static/chunks/main.js" defer></script></head>
<body><div id="__next"></div><script id="__NEXT_DATA__" type="application/json">
{"props":{"pageProps":{}},"page":"/"}</script></body></html>"""
NEXT_SSR = (
    b'<html><head><script src="/_next/static/chunks/main.js" defer></script></head>'
    b'<body><div id="__next"><main><h1>Pricing</h1><p>'
    + PROSE.encode()
    + b"</p></main></div></body></html>"
)
DOCS = (
    b"<html><head><script src='/search.js'></script><script>window.dataLayer=[]</script>"
    b"<style>body{margin:0}</style></head><body><nav id='app'></nav><article>"
    + PROSE.encode()
    + b"</article><script src='/nav.js'></script></body></html>"
)
STATIC = b"""<html><head><title>About</title></head><body><h1>About us</h1>
<p>We make small tools.</p><a href="/contact">Contact</a></body></html>"""
NOSCRIPT_ONLY = (
    b"<html><body><header>Acme Portal</header><p>"
    + b"Sign in to continue to your dashboard and see your reports. " * 4
    + b"</p><noscript><div class='warn'>Please <b>enable   JavaScript</b> in your browser."
    b"</div></noscript></body></html>"
)
SCRIPTS_LITTLE_TEXT = b"""<html><head><script src="/bundle.js"></script></head>
<body><div class="spinner">Loading...</div></body></html>"""
SCRIPT_TEXT_INSIDE = (  # a page whose only "text" is inside scripts and styles
    b"<html><head><style>" + b"a{color:red}" * 500 + b"</style></head><body><div id='mount'>"
    b"</div><script>var s='" + b"x" * 5000 + b"';</script></body></html>"
)


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        (CRA, "text/html; charset=utf-8", "empty app root #root"),
        (VUE, "text/html", "empty app root #app"),
        (ANGULAR, "text/html", "empty app root app-root"),
        (NG_VERSION, "text/html", "empty app root [ng-version]"),
        (NEXT_EMPTY, "", "empty app root #__next"),
        (NEXT_SSR, "text/html", None),
        (DOCS, "text/html", None),
        (STATIC, "text/html", None),
        (NOSCRIPT_ONLY, "text/html", "noscript asks for JavaScript"),
        (SCRIPTS_LITTLE_TEXT, "text/html", "scripts and little text"),
        (SCRIPT_TEXT_INSIDE, "application/xhtml+xml", "scripts and little text"),
        (CRA, "application/json", None),
        (CRA.decode(), "text/html", "empty app root #root"),
    ],
    ids=[
        "react-cra", "vue", "angular-app-root", "ng-version", "next-empty", "next-ssr",
        "docs-scripts-lots-of-text", "static", "noscript", "scripts-little-text",
        "text-only-in-scripts", "not-html", "str-body",
    ],
)  # fmt: skip
def test_needs_render_names_the_reason_a_page_shape_needs_a_browser(
    body: bytes | str, content_type: str, reason: str | None
) -> None:
    assert needs_render(body, content_type) == reason


@pytest.mark.parametrize(
    "hostile",
    [
        b"<" * 4_000_000,
        b"<script>" * 500_000,
        b"<!--<style><noscript>" * 200_000,
        b"<div id='root'><!--" + b"-" * 3_000_000,
        b"<a " + b"x" * 4_000_000,
    ],
    ids=["lt-run", "unclosed-scripts", "nested-openers", "root-comment", "open-tag"],
)
def test_needs_render_is_bounded_on_hostile_bytes(hostile: bytes) -> None:
    # this thread's CPU time, not the wall clock: other processes on a loaded box do not
    # count (about 5 ms here; a scan that went quadratic would take seconds)
    started = time.thread_time()
    needs_render(hostile, "text/html")
    assert time.thread_time() - started < 0.5


def test_a_huge_text_page_stops_counting_early() -> None:
    body = b"<html><body>" + b"<p>word word word</p>" * 2_000_000 + b"<div id='root'></div>"
    started = time.thread_time()  # CPU time (2 ms here): counting all 42 MB takes far more
    assert needs_render(body, "text/html") is None
    assert time.thread_time() - started < 0.05
    assert RICH_TEXT < 10_000


def test_host_memory_renders_first_after_threshold_needed_pages() -> None:
    memory = HostMemory(capacity=8, threshold=2)
    assert not memory.render_first("acct", "spa.test")
    memory.record("acct", "spa.test", needed=True)
    assert not memory.render_first("acct", "spa.test")
    memory.record("acct", "spa.test", needed=True)
    assert memory.render_first("acct", "spa.test")
    assert not memory.render_first("other", "spa.test")  # accounts apart


def test_host_memory_does_not_render_first_a_host_that_mostly_serves_html() -> None:
    memory = HostMemory(threshold=2, ratio=0.75)
    for needed in (True, False, True, False, False):
        memory.record("", "mixed.test", needed)
    assert not memory.render_first("", "mixed.test")


def test_host_memory_is_bounded_and_drops_the_least_recently_used() -> None:
    memory = HostMemory(capacity=3, threshold=1)
    for host in ("a", "b", "c"):
        memory.record("", host, needed=True)
    assert memory.render_first("", "a")  # a is now the most recently used
    memory.record("", "d", needed=True)
    assert len(memory) == 3
    assert not memory.render_first("", "b")
    assert memory.render_first("", "a") and memory.render_first("", "d")


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (jobs_pb2.ScrapeOptions(), None),
        (jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_MARKDOWN]), None),
        (jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_SCREENSHOT]), "screenshot"),
        (jobs_pb2.ScrapeOptions(wait_for=jobs_pb2.WaitFor(selector="#a")), "wait_for"),
        (jobs_pb2.ScrapeOptions(wait_until=jobs_pb2.WAIT_UNTIL_NETWORKIDLE), "wait_until"),
        (jobs_pb2.ScrapeOptions(actions=[jobs_pb2.Action()]), "actions"),
        (jobs_pb2.ScrapeOptions(viewport=jobs_pb2.Viewport(width=800)), "viewport"),
        (jobs_pb2.ScrapeOptions(mobile=True), "mobile"),
        (jobs_pb2.ScrapeOptions(locale="fr-FR"), "locale"),
        (jobs_pb2.ScrapeOptions(timezone="Europe/Paris"), "timezone"),
    ],
)
def test_auto_renders_at_once_whatever_only_a_browser_honours(
    options: jobs_pb2.ScrapeOptions, reason: str | None
) -> None:
    """AUTO never fetches over HTTP a request whose options an HTTP fetch would ignore."""
    assert browser_asked(options) == reason
