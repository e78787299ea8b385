"""pagesift.primary.extract.html: one parse per page, metadata, links, cleaned html and markdown."""

from __future__ import annotations

from pagesift.primary.extract import html as extract
from pagesift.primary.extract import htmllinks, metadata
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


# --- extraction controls -----------------------------------------------------------------------

CONTROLS_PAGE = """<html><head><title>T</title></head><body>
<nav>NAV-TEXT</nav>
<article class="post"><h1>Post title</h1><p>POST-BODY <span class="ad">AD-TEXT</span></p>
  <div class="post"><p>NESTED-POST</p></div></article>
<aside><p>ASIDE-TEXT</p></aside>
<section id="extra"><p>EXTRA-TEXT</p></section>
<p>OUTSIDE-TEXT <img src="data:image/png;base64,AAAA" alt="inline">
  <img src="/real.png" alt="real"></p>
</body></html>"""


def _controlled(**kw: object) -> extract.Extracted:
    want = extract.Wanted(markdown=True, html=True, **kw)  # type: ignore[arg-type]
    return extract.extract(CONTROLS_PAGE, BASE, want=want)


def test_include_tags_keep_only_the_matched_subtrees_in_document_order_once_each() -> None:
    got = _controlled(include_tags=(".post", "#extra"))
    assert "POST-BODY" in got.markdown and "EXTRA-TEXT" in got.markdown
    assert got.markdown.index("POST-BODY") < got.markdown.index("EXTRA-TEXT")
    assert got.markdown.count("NESTED-POST") == 1  # a match inside a match is not doubled
    for gone in ("NAV-TEXT", "ASIDE-TEXT", "OUTSIDE-TEXT"):
        assert gone not in got.markdown and gone not in got.html


def test_include_tags_matching_nothing_give_empty_content_but_keep_links_and_metadata() -> None:
    got = _controlled(include_tags=("table.none",))
    assert got.markdown.strip() == "" and got.title == "T"


def test_exclude_tags_remove_the_matched_elements_after_include() -> None:
    got = _controlled(include_tags=("article",), exclude_tags=(".ad", "div.post"))
    assert "POST-BODY" in got.markdown
    assert "AD-TEXT" not in got.markdown and "NESTED-POST" not in got.markdown
    got = _controlled(exclude_tags=("nav", "aside", "article"))
    assert "EXTRA-TEXT" in got.markdown and "OUTSIDE-TEXT" in got.markdown
    for gone in ("NAV-TEXT", "ASIDE-TEXT", "POST-BODY", "NESTED-POST"):
        assert gone not in got.html


def test_remove_base64_images_drops_data_uri_images_only() -> None:
    kept = _controlled()
    assert "data:image/png" in kept.markdown  # off by default
    got = _controlled(remove_base64_images=True)
    assert "data:image/png" not in got.markdown and "data:" not in got.html
    assert "https://site.example/real.png" in got.markdown


def test_extraction_controls_come_from_the_options_and_pickle_for_the_workers() -> None:
    import pickle

    options = jobs_pb2.ScrapeOptions(
        formats=[jobs_pb2.FORMAT_IMAGES],
        include_tags=["main"],
        exclude_tags=[".ad"],
        remove_base64_images=True,
    )
    want = extract.wanted(options)
    assert want.images and not want.markdown
    assert want.include_tags == ("main",) and want.exclude_tags == (".ad",)
    assert want.remove_base64_images
    assert pickle.loads(pickle.dumps(want)) == want
    assert extract.wanted(jobs_pb2.ScrapeOptions()) == extract.Wanted()


# --- images and link texts ---------------------------------------------------------------------

IMAGES_PAGE = """<html><head><base href="/assets/"></head><body>
<img src="a.png" srcset="a-2x.png 2x, /abs/b.png 640w,https://cdn.example/c,d.png 1x">
<img src="data:image/gif;base64,R0lGOD">
<picture><source srcset="pic.webp 1x, pic@2x.webp 2x" type="image/webp">
  <img src="pic.jpg"></picture>
<img src="./a.png#frag"> <img src="HTTPS://CDN.example:443/c,d.png"> <img src="javascript:x">
<img srcset="only-srcset.png">
</body></html>"""


def test_images_are_absolute_normalized_deduplicated_and_never_data_uris() -> None:
    got = extract.extract(IMAGES_PAGE, BASE, want=extract.Wanted(markdown=False, images=True))
    assert got.images == [
        "https://site.example/assets/a.png",
        "https://site.example/assets/a-2x.png",
        "https://site.example/abs/b.png",
        "https://cdn.example/c,d.png",  # a comma inside a srcset URL is part of it
        "https://site.example/assets/pic.webp",
        "https://site.example/assets/pic@2x.webp",
        "https://site.example/assets/pic.jpg",
        "https://site.example/assets/only-srcset.png",
    ]


def test_images_are_only_read_when_the_format_is_asked_for() -> None:
    assert extract.extract(IMAGES_PAGE, BASE).images == []


def test_link_details_pair_each_link_with_its_anchor_text() -> None:
    page = (
        """<body><a href="/a">  First
      <b>link</b> </a><a href="/a">second text ignored</a>
    <a href="/img"><img src="x.png" alt="An image"></a><a href="/t" title="Titled"></a>
    <a href="/long">"""
        + "x" * 600
        + """</a></body>"""
    )
    doc = jobs_pb2.Document()
    options = jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_LINKS])
    extract.fill_document(doc, page, BASE, options)
    details = [(d.url, d.text) for d in doc.link_details]
    assert details[:3] == [
        ("https://site.example/a", "First link"),
        ("https://site.example/img", "An image"),
        ("https://site.example/t", "Titled"),
    ]
    assert [d.url for d in doc.link_details] == list(doc.links)
    assert len(details[3][1]) == htmllinks.MAX_LINK_TEXT


def test_link_details_and_images_stay_empty_without_their_formats() -> None:
    doc, _ = _doc([])
    assert not doc.link_details and not doc.images


# --- metadata ----------------------------------------------------------------------------------

META_PAGE = """<html><head>
<title>Meta page</title>
<meta property="og:title" content="OG Title">
<meta property="og:image" content="https://img.example/og.png">
<meta property="og:image" content="https://img.example/second.png">
<meta name="twitter:card" content="summary_large_image">
<meta name="Twitter:Site" content="@pagesift">
<meta name="keywords" content="scraping, markdown">
<meta name="author" content="Ada Lovelace">
<meta name="date" content="2023-01-01">
<meta property="article:published_time" content="2024-03-01T10:00:00Z">
<meta property="article:modified_time" content="2024-03-02T11:00:00Z">
<meta name="robots" content="noindex, nofollow">
<meta name="pagesift" content="nofollow">
<link rel="canonical" href="/canonical/page#x">
<link rel="apple-touch-icon" href="/touch.png" sizes="180x180">
<link rel="icon" href="/small.png" sizes="16x16">
<link rel="shortcut icon" href="/big.png" sizes="32x32 64x64">
</head><body><p>text</p></body></html>"""


def test_every_metadata_key_is_read_from_the_page() -> None:
    got = extract.extract(META_PAGE, BASE)
    assert got.metadata == {
        "og:title": "OG Title",
        "og:image": "https://img.example/og.png",  # the first one wins
        "twitter:card": "summary_large_image",
        "Twitter:Site": "@pagesift",  # keys as written
        "keywords": "scraping, markdown",
        "author": "Ada Lovelace",
        "published": "2024-03-01T10:00:00Z",  # article:published_time outranks "date"
        "modified": "2024-03-02T11:00:00Z",
        "robots": "noindex, nofollow",
        "canonical": "https://site.example/canonical/page",
        "favicon": "https://site.example/big.png",  # rel=icon, the largest size
    }
    assert got.robots_meta == ["noindex, nofollow", "nofollow"]
    assert got.title == "Meta page"


def test_common_meta_names_give_the_times_when_article_tags_are_missing() -> None:
    page = (
        '<head><meta name="pubdate" content="2020-05-05"><meta itemprop="dateModified" '
        'content="2021-06-06"><meta name="dc.date" content="1999-01-01"></head>'
    )
    meta = extract.extract(page, BASE).metadata
    assert meta["published"] == "2020-05-05" and meta["modified"] == "2021-06-06"


def test_the_favicon_defaults_to_the_origin_favicon_ico_and_skips_data_uris() -> None:
    assert extract.extract("<p>x</p>", BASE).metadata == {
        "favicon": "https://site.example/favicon.ico"
    }
    page = '<head><link rel="icon" href="data:image/png;base64,AA"></head>'
    assert extract.extract(page, BASE).metadata["favicon"] == "https://site.example/favicon.ico"
    page = '<head><base href="https://cdn.example/s/"><link rel="icon" href="i.svg"></head>'
    assert extract.extract(page, BASE).metadata["favicon"] == "https://cdn.example/s/i.svg"


def test_metadata_values_and_key_count_are_bounded() -> None:
    many = "".join(f'<meta property="og:k{i}" content="v{i}">' for i in range(150))
    long = '<meta name="author" content="' + "a" * 5000 + '">'
    got = extract.extract(f"<head>{long}{many}</head>", BASE)
    assert len(got.metadata) == metadata.MAX_METADATA_KEYS
    assert len(got.metadata["author"]) == metadata.MAX_METADATA_VALUE
    doc = jobs_pb2.Document()
    metadata.add_metadata(doc.metadata, [("etag", '"x"')])
    metadata.add_metadata(doc.metadata, got.metadata.items())
    assert len(doc.metadata) == metadata.MAX_METADATA_KEYS and doc.metadata["etag"] == '"x"'


def test_response_headers_become_lowercase_metadata_keys() -> None:
    headers = {
        "ETag": '"abc"',
        "Last-Modified": "Wed, 21 Oct 2015 07:28:00 GMT",
        "Content-Language": "de",
        "Cache-Control": "max-age=60",
        "Server": "not kept",
    }
    assert dict(metadata.response_metadata(headers)) == {
        "etag": '"abc"',
        "last-modified": "Wed, 21 Oct 2015 07:28:00 GMT",
        "content-language": "de",
        "cache-control": "max-age=60",
    }
    assert metadata.response_metadata({"ETag": "x" * 3000})[0][1] == "x" * 1024
