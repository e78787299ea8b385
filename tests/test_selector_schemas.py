"""Selector schemas (FORMAT_SELECTORS): validation at submission, the evaluation's rules,
and the format end to end.

- Validation: every bound of ``pagesift.core.jobs.selectorschemas`` refused with the
  field's path, checked through ``validate.options`` and through a real node's Scrape
  and StartCrawl over gRPC (nothing registered).
- Evaluation (``pagesift.primary.extract.selectors`` through ``html.extract``, the one
  parse): text, attributes (href/src absolute, ``<base href>`` applied), outer HTML,
  nested objects, ``all`` lists, value types, missing -> null / [], base lists in
  document order, the item itself, the same bytes every time.
- End to end against a real aiohttp shop on 127.0.0.1: Scrape and a crawl over a real
  node, the extraction in worker processes; a PDF gets a ``not_html`` format error;
  a hostile page (200,000 matches, a quadratic outer-HTML schema) stays within
  ``MAX_ITEMS`` and ``MAX_SELECTED_BYTES`` in the worker, the rest of its document
  kept; a browser-rendered page is selected from its rendered HTML (marked browser).
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import grpc
import pytest
from aiohttp import web

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import selectorschemas, validate
from pagesift.primary.extract import html as extract
from pagesift.primary.extract import selectors
from pagesift.v1 import jobs_pb2
from tests.helpers import EngineMaker, all_documents, in_process_node, serve_handler, wait_terminal
from tests.pdfmaker import text_pdf

F = jobs_pb2.SelectorField
TEXT, ATTRIBUTE, HTML, NESTED = (
    jobs_pb2.SELECTOR_SOURCE_TEXT,
    jobs_pb2.SELECTOR_SOURCE_ATTRIBUTE,
    jobs_pb2.SELECTOR_SOURCE_HTML,
    jobs_pb2.SELECTOR_SOURCE_NESTED,
)
NUMBER, INTEGER, BOOLEAN = (
    jobs_pb2.VALUE_TYPE_NUMBER,
    jobs_pb2.VALUE_TYPE_INTEGER,
    jobs_pb2.VALUE_TYPE_BOOLEAN,
)
SELECTORS = jobs_pb2.FORMAT_SELECTORS
EXE = "/usr/lib/chromium/chromium-headless-shell"


def options(
    fields: list[jobs_pb2.SelectorField], base: str = "", *formats: jobs_pb2.Format.ValueType
) -> jobs_pb2.ScrapeOptions:
    return jobs_pb2.ScrapeOptions(
        formats=[SELECTORS, *formats],
        selectors=jobs_pb2.SelectorSchema(base_selector=base, fields=fields),
    )


SHOP = """<html lang="en"><head><title>Shop</title>{base}</head><body>
<nav><a href="/">Home</a></nav>
<h1>Catalogue&nbsp;&amp; offers</h1>
<div class="product" data-sku="A-1" data-stock="yes">
  <h2 class="name">Widget <b>Pro</b></h2>
  <span class="price">$1,299.50</span>
  <a class="more" href="/item/1?ref=list#top">Details</a>
  <img src="img/widget.png" alt="A widget">
  <ul class="tags"><li>metal</li><li>blue</li></ul>
  <div class="specs"><p>Weight: <em>2 kg</em></p><p>Size:<br>small</p>
    <script>var hidden = 1;</script></div>
  <div class="reviews">
    <div class="review"><span class="by">Ann</span><span class="stars">4.5</span></div>
    <div class="review"><span class="by">Bo</span><span class="stars">3</span></div>
  </div>
</div>
<div class="product" data-sku="B-2" data-stock="OFF">
  <h2 class="name">Gadget</h2>
  <span class="price">price on request</span>
  <a class="more" href="https://other.example/g">Details</a>
</div>
<div class="product" data-sku="C-3" data-stock="0">
  <h2 class="name">Gizmo</h2><span class="price">-12 EUR</span>
</div>
<footer><p>Page {page} of 2</p>{next}</footer>
</body></html>"""

PRODUCT_FIELDS = [
    F(name="sku", source=ATTRIBUTE, attribute="data-sku"),
    F(name="name", selector=".name"),
    F(name="price", selector=".price", type=NUMBER),
    F(name="cents", selector=".price", type=INTEGER),
    F(name="in_stock", source=ATTRIBUTE, attribute="DATA-STOCK", type=BOOLEAN),
    F(name="url", selector="a.more", source=ATTRIBUTE, attribute="href"),
    F(name="image", selector="img", source=ATTRIBUTE, attribute="src"),
    F(name="alt", selector="img", source=ATTRIBUTE, attribute="alt"),
    F(name="tags", selector=".tags li", all=True),
    F(name="specs", selector=".specs"),
    F(name="first_tag_html", selector=".tags li", source=HTML),
    F(
        name="reviews",
        selector=".review",
        source=NESTED,
        all=True,
        fields=[F(name="by", selector=".by"), F(name="stars", selector=".stars", type=NUMBER)],
    ),
    F(
        name="top_review",
        selector=".review",
        source=NESTED,
        fields=[F(name="by", selector=".by")],
    ),
    F(name="missing", selector=".nothing-here"),
    F(name="missing_all", selector=".nothing-here", all=True),
]


def shop(page: int = 1, base: str = "") -> str:
    nxt = '<a href="/shop?page=2">next</a>' if page == 1 else ""
    return SHOP.format(base=base, page=page, next=nxt)


def run(html: str, opts: jobs_pb2.ScrapeOptions, url: str = "http://shop.test/list/") -> Any:
    got = extract.extract(html, url, want=extract.wanted(opts))
    assert got.selected_error == ("", "")
    return json.loads(got.selected)


# ---------------------------------------------------------------- validation


def _refused(opts: jobs_pb2.ScrapeOptions) -> str:
    with pytest.raises(validate.InvalidArgument) as info:
        validate.options(opts, ServerConfig())
    return info.value.field


def _deep(levels: int) -> jobs_pb2.SelectorField:
    field = F(name="leaf", selector="p")
    for _ in range(levels - 1):
        field = F(name="n", selector="div", source=NESTED, fields=[field])
    return field


BAD: list[tuple[str, jobs_pb2.ScrapeOptions]] = [
    ("options.selectors", jobs_pb2.ScrapeOptions(formats=[SELECTORS])),
    (
        "options.selectors",
        jobs_pb2.ScrapeOptions(selectors=jobs_pb2.SelectorSchema(fields=[F(name="a")])),
    ),
    ("options.selectors.fields", options([])),
    ("options.selectors.fields", options([F(name=f"f{i}") for i in range(101)])),
    ("options.selectors.base_selector", options([F(name="a")], "div[")),
    ("options.selectors.base_selector", options([F(name="a")], "p" * 1025)),
    ("options.selectors.fields[1].selector", options([F(name="a"), F(name="b", selector="::x")])),
    ("options.selectors.fields[0].selector", options([F(name="a", selector="a" * 1025)])),
    ("options.selectors.fields[0].name", options([F(name="")])),
    ("options.selectors.fields[0].name", options([F(name="n" * 101)])),
    ("options.selectors.fields[1].name", options([F(name="a"), F(name="a", selector="p")])),
    ("options.selectors.fields[0].attribute", options([F(name="a", source=ATTRIBUTE)])),
    ("options.selectors.fields[0].attribute", options([F(name="a", attribute="href")])),
    (
        "options.selectors.fields[0].attribute",
        options([F(name="a", source=ATTRIBUTE, attribute="da ta")]),
    ),
    (
        "options.selectors.fields[0].attribute",
        options([F(name="a", source=ATTRIBUTE, attribute="x" * 257)]),
    ),
    ("options.selectors.fields[0].fields", options([F(name="a", source=NESTED)])),
    ("options.selectors.fields[0].fields", options([F(name="a", fields=[F(name="b")])])),
    ("options.selectors.fields[0].source", options([F(name="a", source=9)])),  # type: ignore[arg-type]
    ("options.selectors.fields[0].type", options([F(name="a", type=9)])),  # type: ignore[arg-type]
    ("options.selectors.fields[0].type", options([F(name="a", source=HTML, type=NUMBER)])),
    (
        "options.selectors.fields[2].fields[0].selector",
        options(
            [
                F(name="a"),
                F(name="b"),
                F(name="c", source=NESTED, fields=[F(name="d", selector="p[")]),
            ]
        ),
    ),
    (
        "options.selectors.fields[0].fields[0].fields[0].fields[0].fields[0].fields",
        options([_deep(6)]),  # the fifth level's NESTED field may not open a sixth
    ),
    (
        "options.selectors.fields[9].fields",  # 10 + 10 x 100 = 1,010 fields in all
        options(
            [
                F(name=f"o{i}", source=NESTED, fields=[F(name=f"f{j}") for j in range(100)])
                for i in range(11)
            ]
        ),
    ),
]


@pytest.mark.parametrize(("field", "opts"), BAD, ids=[f"{i}:{f}" for i, (f, _) in enumerate(BAD)])
def test_each_bound_is_refused_naming_its_field(field: str, opts: jobs_pb2.ScrapeOptions) -> None:
    assert _refused(opts) == field


def test_the_bounds_admit_what_they_name() -> None:
    config = ServerConfig()
    at_most = options(
        [
            F(name="n" * 100, selector="a" * 1024),
            F(name="u", selector="a", source=ATTRIBUTE, attribute="x" * 256),
            _deep(5),
            *[F(name=f"f{i}") for i in range(97)],
        ],
        "p" * 1024,
    )
    validate.options(at_most, config)
    nine_hundred = options(
        [
            F(name=f"o{i}", source=NESTED, fields=[F(name=f"f{j}") for j in range(99)])
            for i in range(9)
        ]
    )
    validate.options(nine_hundred, config)  # 9 + 891 = 900 fields in all
    validate.options(options([F(name="t", selector="", type=BOOLEAN)]), config)
    assert selectorschemas.MAX_DEPTH == 5 and selectorschemas.MAX_FIELDS == 100


async def test_a_node_refuses_a_bad_schema_naming_the_field_and_registers_nothing(
    tmp_path: Path,
) -> None:
    async with in_process_node(tmp_path) as node:
        for field, opts in BAD:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await node.stub.Scrape(
                    jobs_pb2.ScrapeRequest(url="http://127.0.0.1:9/", options=opts)
                )
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert (info.value.details() or "").startswith(field + ": "), (field, info.value)
        bad = options([F(name="a"), F(name="b", source=NESTED, fields=[F(name="c", type=9)])])  # type: ignore[arg-type]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await node.stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url="http://127.0.0.1:9/", options=bad)
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith("options.selectors.fields[1].fields[0].type")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await node.stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(
                    urls=["http://127.0.0.1:9/"],
                    options=jobs_pb2.ScrapeOptions(formats=[SELECTORS]),
                )
            )
        assert (info.value.details() or "").startswith("options.selectors: ")
        assert not (await node.stub.ListJobs(jobs_pb2.ListJobsRequest())).jobs


# ---------------------------------------------------------------- evaluation


def test_a_product_list_becomes_one_object_per_item_in_document_order() -> None:
    got = run(shop(), options(PRODUCT_FIELDS, ".product"))
    assert [p["sku"] for p in got] == ["A-1", "B-2", "C-3"]
    first, second, third = got
    assert list(first) == [f.name for f in PRODUCT_FIELDS]  # schema order
    assert first == {
        "sku": "A-1",
        "name": "Widget Pro",
        "price": 1299.5,
        "cents": 1299,
        "in_stock": True,
        "url": "http://shop.test/item/1?ref=list#top",
        "image": "http://shop.test/list/img/widget.png",
        "alt": "A widget",
        "tags": ["metal", "blue"],
        "specs": "Weight: 2 kg Size: small",
        "first_tag_html": "<li>metal</li>",
        "reviews": [{"by": "Ann", "stars": 4.5}, {"by": "Bo", "stars": 3.0}],
        "top_review": {"by": "Ann"},
        "missing": None,
        "missing_all": [],
    }
    assert second["price"] is None and second["cents"] is None
    assert second["in_stock"] is False  # "OFF"
    assert second["url"] == "https://other.example/g"
    assert second["image"] is None and second["tags"] == [] and second["reviews"] == []
    assert second["top_review"] is None
    assert third["price"] == -12.0 and third["cents"] == -12 and third["in_stock"] is False


def test_without_a_base_selector_the_whole_page_is_one_object() -> None:
    fields = [
        F(name="heading", selector="h1"),
        F(name="lang", source=ATTRIBUTE, attribute="lang"),  # the item itself: <html>
        F(name="title", selector="title"),
        F(name="names", selector=".product .name", all=True),
        F(name="prices", selector=".price", all=True, type=NUMBER),
        F(name="links", selector="a", source=ATTRIBUTE, attribute="href", all=True),
    ]
    got = run(shop(base='<base href="https://cdn.example/base/">'), options(fields))
    assert got == {
        "heading": "Catalogue & offers",
        "lang": "en",
        "title": "Shop",
        "names": ["Widget Pro", "Gadget", "Gizmo"],
        "prices": [1299.5, None, -12.0],
        "links": [  # <base href> applied
            "https://cdn.example/",
            "https://cdn.example/item/1?ref=list#top",
            "https://other.example/g",
            "https://cdn.example/shop?page=2",
        ],
    }


def test_fields_match_under_the_item_never_the_item_itself() -> None:
    page = '<div class="box" id="outer"><div class="box" id="inner"><p>x</p></div></div>'
    fields = [
        F(name="ids", selector="div", source=ATTRIBUTE, attribute="id", all=True),
        F(name="self", source=ATTRIBUTE, attribute="id"),
        F(name="self_all", source=ATTRIBUTE, attribute="id", all=True),
        F(name="boxes", selector=".box", source=ATTRIBUTE, attribute="id"),
    ]
    got = run(page, options(fields, ".box"))
    assert got == [  # nested matches are items too, each in document order
        {"ids": ["inner"], "self": "outer", "self_all": ["outer"], "boxes": "inner"},
        {"ids": [], "self": "inner", "self_all": ["inner"], "boxes": None},
    ]


def test_text_collapses_whitespace_and_skips_scripts_but_a_selected_script_is_read() -> None:
    page = """<article><h3>Title</h3><p>one
    two</p><p>three<br>four</p><style>p{}</style><template>t</template>
    <span>in</span><span>line</span>&nbsp;end</article>
    <script type="application/ld+json">{"@type": "Product"}</script>"""
    got = run(
        page,
        options([F(name="text", selector="article"), F(name="ld", selector="script")]),
    )
    assert got == {"text": "Title one two three four inline end", "ld": '{"@type": "Product"}'}


BASES = ["http://h.test/a/b.html?q=1#f", "https://h.test", "http://h.test/dir/",
         "http://[::1]:8080/x/y", "http://u:p@h.test/a/"]  # fmt: skip
HREFS = [
    "/x", "x", "../x", "./x", "x/./y", "http://o/x", "HTTP://O/x", "//cdn/x", "?q=2", "#top",
    "mailto:a@b", "data:image/png;base64,AA", "javascript:void(0)", "  /sp ace ", "a:b/c",
    "x/..", ".", "..", "", "a\\b", "/a\tb", "c?d=../e", "/p#../q", "img/w.png",
]  # fmt: skip


def test_href_and_src_resolve_exactly_as_urljoin_does() -> None:
    fields = [F(name="a", selector="a", source=ATTRIBUTE, attribute="href", all=True),
              F(name="i", selector="img", source=ATTRIBUTE, attribute="src", all=True)]  # fmt: skip
    page = "".join(f'<a href="{html.escape(h)}">x</a><img src="{html.escape(h)}">' for h in HREFS)
    for base in BASES:
        want = [urljoin(base, h.strip()) for h in HREFS]
        assert run(page, options(fields), base) == {"a": want, "i": want}, base


@pytest.mark.parametrize(
    ("raw", "number", "integer"),
    [
        ("$1,299.50", 1299.5, 1299),
        ("1299.50 €", 1299.5, 1299),
        ("\u22123 °C", -3.0, -3),  # U+2212, the minus sign
        ("SKU-42", 42.0, 42),
        ("Price: -7.9", -7.9, -7),
        (".5 l", 0.5, 0),
        ("12,34", 12.0, 12),
        ("1,2345", 1.0, 1),
        ("v2.0.1", 2.0, 2),
        ("no digits", None, None),
        ("", None, None),
        ("9" * 400, None, None),
        ("9" * 19, 1e19, None),
        ("9223372036854775807", 9.223372036854776e18, 9223372036854775807),
    ],
)
def test_number_and_integer_read_the_first_number(
    raw: str, number: float | None, integer: int | None
) -> None:
    assert selectors.convert(raw, NUMBER) == number
    assert selectors.convert(raw, INTEGER) == integer


@pytest.mark.parametrize(
    ("raw", "value"),
    [("", False), ("0", False), ("False", False), (" NO ", False), ("off", False),
     ("yes", True), ("1", True), ("true", True), ("nope", True), ("00", True)],
)  # fmt: skip
def test_boolean_is_false_only_for_the_false_words(raw: str, value: bool) -> None:
    assert selectors.convert(raw, BOOLEAN) is value


def test_the_same_page_and_schema_give_the_same_bytes() -> None:
    opts = options(PRODUCT_FIELDS, ".product")
    outs = {extract.extract(shop(), "http://shop.test/list/", want=extract.wanted(opts)).selected
            for _ in range(5)}  # fmt: skip
    assert len(outs) == 1
    text = outs.pop()
    assert text == json.dumps(json.loads(text), ensure_ascii=False)  # compact, keys as read
    unicode = run("<p class=x>café — 東京</p>", options([F(name="p", selector=".x")]))
    assert unicode == {"p": "café — 東京"}
    raw = extract.extract(
        "<p class=x>café</p>",
        "http://a.test/",
        want=extract.wanted(options([F(name="p", selector="p")])),
    ).selected
    assert raw == '{"p": "café"}'  # not \\u escapes


def test_only_what_is_asked_is_made() -> None:
    opts = options([F(name="h", selector="h1")])
    want = extract.wanted(opts)
    assert not want.markdown and want.selectors  # FORMAT_SELECTORS alone: no markdown
    got = extract.extract(shop(), "http://shop.test/", want=want)
    assert got.markdown == "" and got.links  # links always (the crawler needs them)
    plain = extract.wanted(jobs_pb2.ScrapeOptions(selectors=opts.selectors))
    assert plain.selectors == b""  # a schema without the format is not run
    doc = jobs_pb2.Document()
    extract.apply(doc, extract.extract(shop(), "http://shop.test/", want=plain), plain, "")
    assert doc.selected == "" and not doc.format_errors


# ---------------------------------------------------------------- end to end


async def _shop_site(request: web.Request) -> web.StreamResponse:
    if request.path == "/doc.pdf":
        return web.Response(body=text_pdf([["PDF text"]]), content_type="application/pdf")
    if request.path == "/huge":
        items = "".join(f"<li class=i>{i}</li>" for i in range(200_000))
        return web.Response(text=f"<html><body><ul>{items}</ul></body></html>",
                            content_type="text/html")  # fmt: skip
    if request.path == "/nested":  # every div's outer HTML holds all the deeper ones
        body = "<div>" + "x" * 2000
        return web.Response(text="<html><body>" + body * 600 + "</body></html>",
                            content_type="text/html")  # fmt: skip
    page = int(request.query.get("page", "1"))
    return web.Response(text=shop(page), content_type="text/html")


async def test_scrape_and_a_crawl_over_a_node_fill_selected_in_the_workers(
    tmp_path: Path,
) -> None:
    opts = options(PRODUCT_FIELDS, ".product", jobs_pb2.FORMAT_MARKDOWN)
    async with (
        serve_handler(_shop_site) as port,
        in_process_node(
            tmp_path,
            extract_processes=1,
            max_body_bytes=8 << 20,
            respect_robots=False,
            browser_executable="",  # over HTTP: the rendered path has a test of its own below
        ) as node,
    ):
        origin = f"http://127.0.0.1:{port}"
        resp = await node.stub.Scrape(jobs_pb2.ScrapeRequest(url=origin + "/shop", options=opts))
        doc = resp.document
        expected = run(shop(), opts, origin + "/shop")
        assert json.loads(doc.selected) == expected
        assert expected[0]["url"] == origin + "/item/1?ref=list#top"
        assert "# Catalogue" in doc.markdown and not doc.format_errors
        again = await node.stub.Scrape(jobs_pb2.ScrapeRequest(url=origin + "/shop", options=opts))
        assert again.document.selected == doc.selected  # byte for byte

        crawl_opts = options([F(name="footer", selector="footer p"),
                              F(name="names", selector=".name", all=True)])  # fmt: skip
        job = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(
                url=origin + "/shop", include_paths=["^/shop"], options=crawl_opts
            )
        )
        done = await wait_terminal(node.stub, job.id)
        assert done.state == jobs_pb2.JOB_STATE_COMPLETED, done.note
        docs = {d.url: d for d in await all_documents(node.stub, job.id)}
        assert set(docs) == {origin + "/shop", origin + "/shop?page=2"}
        for page, url in ((1, origin + "/shop"), (2, origin + "/shop?page=2")):
            assert json.loads(docs[url].selected) == {
                "footer": f"Page {page} of 2",
                "names": ["Widget Pro", "Gadget", "Gizmo"],
            }
            assert docs[url].markdown == ""  # FORMAT_SELECTORS alone

        pdf = await node.stub.Scrape(
            jobs_pb2.ScrapeRequest(url=origin + "/doc.pdf", options=options([F(name="a")]))
        )
        assert pdf.document.selected == ""
        [error] = pdf.document.format_errors
        assert (error.format, error.code) == (SELECTORS, "not_html")
        assert "PDF text" not in pdf.document.markdown  # markdown was not asked for


async def test_a_hostile_page_stays_within_the_caps_in_the_worker(make_engine: EngineMaker) -> None:
    engine = await make_engine(
        ServerConfig(allow_private_networks=True, respect_robots=False, extract_processes=1)
    )
    async with serve_handler(_shop_site) as port:
        origin = f"http://127.0.0.1:{port}"
        many = options([F(name="n", type=INTEGER)], "li", jobs_pb2.FORMAT_MARKDOWN)
        doc = (await engine.scrape(origin + "/huge", many)).document
        items = json.loads(doc.selected)
        assert len(items) == selectors.MAX_ITEMS
        assert items[0] == {"n": 0} and items[-1] == {"n": selectors.MAX_ITEMS - 1}
        assert "199999" in doc.markdown  # the page itself is whole
        flat = options([F(name="all", selector=".i", all=True, type=INTEGER)])
        values = json.loads((await engine.scrape(origin + "/huge", flat)).document.selected)
        assert values == {"all": list(range(selectors.MAX_ITEMS))}

        quadratic = options([F(name="d", selector="div", source=HTML, all=True)], "",
                            jobs_pb2.FORMAT_LINKS)  # fmt: skip
        doc = (await engine.scrape(origin + "/nested", quadratic)).document
        assert doc.selected == ""
        [error] = doc.format_errors
        assert (error.format, error.code) == (SELECTORS, "too_large")
        assert "MAX_SELECTED_BYTES" in error.message
        assert doc.status_code == 200  # the document stands


async def _js_shop(request: web.Request) -> web.StreamResponse:
    script = """<script>
    const names = ["Alpha", "Beta"];
    document.addEventListener("DOMContentLoaded", () => {
      for (const n of names) {
        const d = document.createElement("div"); d.className = "product";
        d.innerHTML = '<h2 class="name">' + n + '</h2><a href="/p/' + n + '">x</a>';
        document.body.appendChild(d);
      }
    });</script>"""
    return web.Response(text=f"<html><head>{script}</head><body></body></html>",
                        content_type="text/html")  # fmt: skip


@pytest.mark.browser
@pytest.mark.skipif(not os.access(EXE, os.X_OK), reason="chromium-headless-shell missing")
async def test_a_rendered_page_is_selected_from_its_rendered_html() -> None:
    from pagesift.primary.engine.http import HttpEngine
    from pagesift.primary.engine.rendering import RenderingEngine

    config = ServerConfig(
        allow_private_networks=True, respect_robots=False, extract_processes=1, max_browser_pages=1
    )
    engine = RenderingEngine(HttpEngine(config))
    fields = [F(name="name", selector=".name"),
              F(name="url", selector="a", source=ATTRIBUTE, attribute="href")]  # fmt: skip
    try:
        async with serve_handler(_js_shop) as port:
            url = f"http://127.0.0.1:{port}/"
            http = options(fields, ".product")
            http.engine = jobs_pb2.FETCH_ENGINE_HTTP
            assert (await engine.scrape(url, http)).document.selected == "[]"
            rendered = options(fields, ".product")
            rendered.engine = jobs_pb2.FETCH_ENGINE_BROWSER
            doc = (await engine.scrape(url, rendered)).document
            assert doc.engine == jobs_pb2.FETCH_ENGINE_BROWSER
            base = f"http://127.0.0.1:{port}"
            assert json.loads(doc.selected) == [
                {"name": "Alpha", "url": base + "/p/Alpha"},
                {"name": "Beta", "url": base + "/p/Beta"},
            ]
    finally:
        await engine.close()
