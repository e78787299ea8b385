"""pagesift.primary.extract: one parse per page, metadata, links, cleaned html and markdown."""

from __future__ import annotations

from pagesift.primary import extract
from pagesift.v1 import jobs_pb2

PAGE = """<!doctype html>
<html lang="en-GB">
<head>
  <meta charset="utf-8">
  <title> The Page Title </title>
  <meta name="Description" content=" What this page is about. ">
  <meta property="og:description" content="OG text">
  <style>body { color: red }</style>
  <script>var tracking = "SCRIPT-TEXT";</script>
</head>
<body>
  <header><h2>Site header HEADER-TEXT</h2>
    <nav><a href="/">Home</a> <a href="/docs/">Docs</a></nav>
  </header>
  <div role="navigation"><a href="/menu">Menu ROLE-NAV-TEXT</a></div>
  <main>
    <h1>Main heading</h1>
    <p>Body text with <a href="guide.html#part">a guide</a> and
       <a href="https://Other.example:443/x/../y?q=1">elsewhere</a>.</p>
    <p><a href="mailto:a@b.c">mail</a> <a href="javascript:void(0)">js</a>
       <a href="#top">top</a> <a href="tel:123">tel</a> <a href="">empty</a>
       <a href="ftp://files.example/f">ftp</a> <a href="/docs/index.html">docs again</a></p>
    <noscript>NOSCRIPT-TEXT</noscript>
    <template><p>TEMPLATE-TEXT</p></template>
    <svg><text>SVG-TEXT</text></svg>
    <iframe src="/frame"></iframe>
    <ul><li>one</li><li>two</li></ul>
  </main>
  <aside>ASIDE-TEXT <a href="/related">related</a></aside>
  <footer>FOOTER-TEXT <a href="/contact">contact</a></footer>
</body>
</html>"""

BASE = "https://site.example/section/page"


def test_metadata_is_read_from_the_head() -> None:
    got = extract.extract(PAGE, BASE)
    assert got.title == "The Page Title"
    assert got.description == "What this page is about."
    assert got.language == "en-GB"


def test_og_description_is_the_fallback_description() -> None:
    page = '<html><head><meta property="og:description" content="From OG"></head></html>'
    assert extract.extract(page, BASE).description == "From OG"


def test_links_are_absolute_http_only_one_per_page_key_in_document_order() -> None:
    got = extract.extract(PAGE, BASE)
    # the written form is kept (no redirect to fetch /docs/); /docs/index.html is the same key
    assert got.links == [
        "https://site.example/",
        "https://site.example/docs/",
        "https://site.example/menu",
        "https://site.example/section/guide.html",
        "https://Other.example:443/x/../y?q=1",  # absolute: as written (fetched the same)
        "https://site.example/related",
        "https://site.example/contact",
    ]


def test_base_href_changes_how_relative_links_resolve() -> None:
    page = (
        '<html><head><base href="https://cdn.example/root/"></head>'
        '<body><a href="a/b">x</a></body></html>'
    )
    assert extract.extract(page, BASE).links == ["https://cdn.example/root/a/b"]


def test_a_relative_base_href_is_resolved_against_the_page_url() -> None:
    page = '<head><base href="/other/"></head><a href="x">x</a><a href="../up">u</a>'
    links = extract.extract(page, BASE).links
    assert links == ["https://site.example/other/x", "https://site.example/up"]


def test_cleaned_html_drops_scripts_styles_and_embedded_content() -> None:
    got = extract.extract(PAGE, BASE, want=extract.Wanted(markdown=True, html=True))
    for marker in ("SCRIPT-TEXT", "color: red", "NOSCRIPT-TEXT", "TEMPLATE-TEXT", "SVG-TEXT"):
        assert marker not in got.html
        assert marker not in got.markdown
    assert "<iframe" not in got.html
    assert "HEADER-TEXT" in got.html and "FOOTER-TEXT" in got.html


def test_only_main_content_keeps_main_and_drops_navigation() -> None:
    got = extract.extract(
        PAGE, BASE, want=extract.Wanted(markdown=True, html=True), only_main_content=True
    )
    assert "Main heading" in got.html
    for marker in ("HEADER-TEXT", "FOOTER-TEXT", "ASIDE-TEXT", "ROLE-NAV-TEXT"):
        assert marker not in got.html
        assert marker not in got.markdown
    # the crawler still gets the navigation links
    assert "https://site.example/menu" in got.links


def test_only_main_content_uses_a_single_article_when_there_is_no_main() -> None:
    page = "<body><div>OUTSIDE</div><article><p>INSIDE</p></article></body>"
    got = extract.extract(page, BASE, only_main_content=True)
    assert "INSIDE" in got.markdown and "OUTSIDE" not in got.markdown


def test_only_main_content_without_main_or_article_strips_page_chrome() -> None:
    page = "<body><nav>NAV</nav><p>TEXT</p><footer>FOOT</footer></body>"
    got = extract.extract(page, BASE, only_main_content=True)
    assert "TEXT" in got.markdown and "NAV" not in got.markdown and "FOOT" not in got.markdown


def test_markdown_has_structure_and_absolute_links() -> None:
    md = extract.extract(PAGE, BASE, only_main_content=True).markdown
    assert "# Main heading" in md
    assert "- one" in md
    assert "(https://site.example/section/guide.html#part)" in md


def test_links_only_skips_markdown_and_html() -> None:
    got = extract.extract(PAGE, BASE, want=extract.Wanted(markdown=False))
    assert got.markdown == "" and got.html == ""
    assert len(got.links) == 7


def _doc(
    formats: list[jobs_pb2.Format.ValueType], *, only_main_content: bool = False
) -> tuple[jobs_pb2.Document, list[str]]:
    doc = jobs_pb2.Document(url=BASE)
    options = jobs_pb2.ScrapeOptions(formats=formats, only_main_content=only_main_content)
    links = extract.fill_document(doc, PAGE, BASE, options)
    return doc, links


def test_no_formats_means_markdown_only() -> None:
    doc, links = _doc([])
    assert doc.markdown and not doc.html and not doc.raw_html and not doc.links
    assert doc.title == "The Page Title"
    assert len(links) == 7


def test_only_the_requested_formats_are_filled() -> None:
    doc, links = _doc([jobs_pb2.FORMAT_HTML, jobs_pb2.FORMAT_LINKS])
    assert not doc.markdown and not doc.raw_html
    assert "Main heading" in doc.html
    assert list(doc.links) == links


def test_raw_html_is_the_page_as_received() -> None:
    doc, _ = _doc([jobs_pb2.FORMAT_RAW_HTML, jobs_pb2.FORMAT_MARKDOWN])
    assert doc.raw_html == PAGE
    assert doc.markdown and not doc.html


def test_page_links_are_returned_even_when_links_format_is_not_requested() -> None:
    doc, links = _doc([jobs_pb2.FORMAT_MARKDOWN], only_main_content=True)
    assert not doc.links
    assert "https://site.example/contact" in links


def test_broken_html_still_yields_text_and_links() -> None:
    page = "<p>unclosed <b>bold <a href='/x'>link<div></p></span>tail"
    got = extract.extract(page, BASE)
    assert got.links == ["https://site.example/x"]
    assert "tail" in got.markdown


def test_empty_document_yields_empty_fields() -> None:
    got = extract.extract("", BASE)
    assert got.title == "" and got.links == [] and got.markdown.strip() == ""


def test_markdown_without_only_main_content_keeps_header_nav_and_footer() -> None:
    md = extract.extract(PAGE, BASE).markdown
    assert "HEADER-TEXT" in md and "FOOTER-TEXT" in md
    assert "[Docs](https://site.example/docs/)" in md
