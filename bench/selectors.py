"""Selector schemas' cost: CPU per page of the worker's call, markdown alone vs markdown + a schema.

The ``selectors`` section of ``python -m bench.run`` (``--section selectors``; alone:
``python -m bench.selectors``). It writes ``bench/out/selectors.md`` and ``.json``.

What it measures, in this process, with ``time.process_time`` around each call alone:
the function an extraction worker runs for an HTML page, ``html.extract_compact(text,
url, want, False)``, with ``want`` markdown only (the floor every crawl pays) and with
markdown plus FORMAT_SELECTORS and a schema; and ``selectors.select`` alone on a parsed
tree (the schema's own cost, no parse). A figure is the sum over the pages / the number
of pages, best of ``--selectors-passes`` passes (a busy machine only adds). The worker's
IPC (pickling the page, the reply) is left out: it is the same for both but for the
``selected`` text, and ``bench.crawlstages`` measures the hand-off.

The page sets, each with its schema (``SETS``):

- ``shop``: ``--selectors-shop-pages`` generated product-list pages of
  ``SHOP_ITEMS`` products each (name, price, link, image, rating, tags, stock, a nested
  seller): the format's own case, one object per product;
- a doc site (``--selectors-site``, default python; the crawl section's Debian packages,
  installed when missing, ``bench.tools.doc_root``): its first ``--selectors-files``
  ``.html`` files in path order, with a schema of the page's title, its sections (id,
  heading, links, code blocks), its API entries and every link.

Nothing here talks to a network or starts a process.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import json_format
from selectolax.lexbor import LexborHTMLParser

from bench.common import OUT_DIR, machine_facts, markdown_table, say, write_json
from bench.tools import DOC_SITES, doc_root, ensure_apt
from pagesift.primary.extract import html as extract_html
from pagesift.primary.extract import selectors as selection
from pagesift.v1 import jobs_pb2

SHOP_ITEMS = 48  # products on a generated shop page
BASE = "http://127.0.0.1/"

SHOP_SCHEMA: dict[str, Any] = {
    "baseSelector": "li.product",
    "fields": [
        {"name": "sku", "source": "SELECTOR_SOURCE_ATTRIBUTE", "attribute": "data-sku"},
        {"name": "name", "selector": "h3"},
        {"name": "price", "selector": ".price", "type": "VALUE_TYPE_NUMBER"},
        {"name": "url", "selector": "a", "source": "SELECTOR_SOURCE_ATTRIBUTE",
         "attribute": "href"},
        {"name": "image", "selector": "img", "source": "SELECTOR_SOURCE_ATTRIBUTE",
         "attribute": "src"},
        {"name": "rating", "selector": ".rating", "type": "VALUE_TYPE_NUMBER"},
        {"name": "tags", "selector": ".tags li", "all": True},
        {"name": "in_stock", "source": "SELECTOR_SOURCE_ATTRIBUTE", "attribute": "data-stock",
         "type": "VALUE_TYPE_BOOLEAN"},
        {"name": "seller", "selector": ".seller", "source": "SELECTOR_SOURCE_NESTED",
         "fields": [{"name": "name", "selector": ".seller-name"},
                    {"name": "id", "source": "SELECTOR_SOURCE_ATTRIBUTE",
                     "attribute": "data-id", "type": "VALUE_TYPE_INTEGER"}]},
    ],
}  # fmt: skip
DOC_SCHEMA: dict[str, Any] = {
    "fields": [
        {"name": "title", "selector": "h1"},
        {"name": "sections", "selector": "section, div.section", "all": True,
         "source": "SELECTOR_SOURCE_NESTED",
         "fields": [{"name": "id", "source": "SELECTOR_SOURCE_ATTRIBUTE", "attribute": "id"},
                    {"name": "heading", "selector": "h2, h3"},
                    {"name": "links", "selector": "a[href]", "all": True,
                     "source": "SELECTOR_SOURCE_ATTRIBUTE", "attribute": "href"},
                    {"name": "code", "selector": "pre", "all": True}]},
        {"name": "api", "selector": "dl.py, dl.function, dl.class, dl.method", "all": True,
         "source": "SELECTOR_SOURCE_NESTED",
         "fields": [{"name": "id", "selector": "dt", "source": "SELECTOR_SOURCE_ATTRIBUTE",
                     "attribute": "id"},
                    {"name": "signature", "selector": "dt"},
                    {"name": "summary", "selector": "dd > p"}]},
        {"name": "links", "selector": "a[href]", "all": True,
         "source": "SELECTOR_SOURCE_ATTRIBUTE", "attribute": "href"},
    ],
}  # fmt: skip


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--selectors-site",
        default="python",
        choices=list(DOC_SITES),
        help="selectors: the doc site whose pages are measured (default python)",
    )
    ap.add_argument(
        "--selectors-files",
        type=int,
        default=300,
        metavar="N",
        help="selectors: the doc site's first N .html files (0: all)",
    )
    ap.add_argument(
        "--selectors-shop-pages",
        type=int,
        default=200,
        metavar="N",
        help="selectors: generated product-list pages",
    )
    ap.add_argument("--selectors-passes", type=int, default=3, metavar="N",
                    help="selectors: passes over each set, the best one kept")  # fmt: skip


def shop_page(n: int, rng: random.Random) -> str:
    """A product-list page: a header, ``SHOP_ITEMS`` products, a footer."""
    items = []
    for i in range(SHOP_ITEMS):
        sku = f"{n:04d}-{i:02d}"
        tags = "".join(f"<li>{t}</li>" for t in rng.sample(["new", "eco", "sale", "pro"], 2))
        price = f"${rng.randint(1, 2999):,}.{rng.randint(0, 99):02d}"
        items.append(
            f'<li class="product" data-sku="{sku}" data-stock="{rng.choice(["yes", "no"])}">'
            f'<a href="/p/{sku}"><img src="/img/{sku}.jpg" alt="product {sku}"></a>'
            f"<h3>Product {sku} <small>model {i}</small></h3>"
            f'<span class="price">{price}</span><span class="rating">{rng.randint(10, 50) / 10}'
            f' of 5</span><ul class="tags">{tags}</ul><p>A short description of product '
            f"{sku}, which does what products do, with a few more words.</p>"
            f'<div class="seller" data-id="{rng.randint(1, 999)}"><span class="seller-name">'
            f"Seller {i % 7}</span></div></li>"
        )
    nav = "".join(f'<a href="/c/{c}">Category {c}</a>' for c in range(12))
    return (
        f"<!doctype html><html lang=en><head><title>Shop page {n}</title></head><body>"
        f"<header><nav>{nav}</nav></header><main><h1>Products, page {n}</h1>"
        f'<ul class="grid">{"".join(items)}</ul></main>'
        f'<footer><a href="/shop?page={n + 1}">next</a></footer></body></html>'
    )


def _schema(mapping: dict[str, Any]) -> jobs_pb2.SelectorSchema:
    return json_format.ParseDict(mapping, jobs_pb2.SelectorSchema())


def _best(passes: int, pages: Sequence[str], call: Callable[[str], object]) -> float:
    """CPU seconds per page of ``call``, best of ``passes`` passes over ``pages``."""
    best = float("inf")
    for _ in range(passes):
        spent = 0.0
        for text in pages:
            t0 = time.process_time()
            call(text)
            spent += time.process_time() - t0
        best = min(best, spent / len(pages))
    return best


def measure_set(
    name: str, pages: Sequence[str], schema: jobs_pb2.SelectorSchema, passes: int
) -> dict[str, Any]:
    """The figures of one page set (milliseconds of CPU a page)."""
    plain = extract_html.wanted(jobs_pb2.ScrapeOptions(formats=[jobs_pb2.FORMAT_MARKDOWN]))
    asked = jobs_pb2.ScrapeOptions(
        formats=[jobs_pb2.FORMAT_MARKDOWN, jobs_pb2.FORMAT_SELECTORS], selectors=schema
    )
    both = extract_html.wanted(asked)
    sizes = [len(extract_html.extract_compact(p, BASE, both, False).selected) for p in pages]
    errors = sum(
        1 for p in pages if extract_html.extract_compact(p, BASE, both, False).selected_error[0]
    )
    floor = _best(passes, pages, lambda t: extract_html.extract_compact(t, BASE, plain, False))
    with_sel = _best(passes, pages, lambda t: extract_html.extract_compact(t, BASE, both, False))
    trees = {id(p): LexborHTMLParser(p) for p in pages}
    alone = _best(passes, pages, lambda t: selection.select(trees[id(t)], BASE, both.selectors))
    return {
        "set": name,
        "pages": len(pages),
        "kib_per_page": round(sum(len(p.encode()) for p in pages) / len(pages) / 1024, 1),
        "markdown_ms": round(floor * 1e3, 3),
        "markdown_selectors_ms": round(with_sel * 1e3, 3),
        "added_ms": round((with_sel - floor) * 1e3, 3),
        "added_pct": round((with_sel / floor - 1) * 100, 1) if floor else None,
        "select_alone_ms": round(alone * 1e3, 3),
        "selected_kib_per_page": round(sum(sizes) / len(pages) / 1024, 1),
        "format_errors": errors,
    }


def _doc_pages(site: str, files: int) -> list[str]:
    package = DOC_SITES[site][1]
    ensure_apt([package])
    root = doc_root(package)
    paths = sorted(root.rglob("*.html"))
    if files:
        paths = paths[:files]
    return [p.read_text(encoding="utf-8", errors="replace") for p in paths]


def run(args: argparse.Namespace) -> None:
    passes = args.selectors_passes
    if not 1 <= passes <= 20 or args.selectors_shop_pages < 1 or args.selectors_files < 0:
        raise SystemExit("--selectors-passes 1..20, --selectors-shop-pages >= 1, files >= 0")
    rng = random.Random(7)
    shop = [shop_page(n, rng) for n in range(args.selectors_shop_pages)]
    site = args.selectors_site
    rows = [measure_set("shop", shop, _schema(SHOP_SCHEMA), passes)]
    say(f"selectors: shop {rows[0]}")
    docs = _doc_pages(site, args.selectors_files)
    rows.append(measure_set(site, docs, _schema(DOC_SCHEMA), passes))
    say(f"selectors: {site} {rows[1]}")
    report = {"machine": machine_facts(), "passes": passes, "sets": rows,
              "schemas": {"shop": SHOP_SCHEMA, site: DOC_SCHEMA}}  # fmt: skip
    table = markdown_table(
        ["set", "pages", "KiB/page", "markdown ms", "+ selectors ms", "added ms", "added %",
         "select alone ms", "selected KiB/page"],
        [[r["set"], r["pages"], r["kib_per_page"], r["markdown_ms"], r["markdown_selectors_ms"],
          r["added_ms"], r["added_pct"], r["select_alone_ms"], r["selected_kib_per_page"]]
         for r in rows],
    )  # fmt: skip
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    write_json(OUT_DIR / "selectors.json", report)
    (OUT_DIR / "selectors.md").write_text(
        f"# Selector schemas: CPU per page in the worker call\n\n{table}\n\n"
        f"machine: {json.dumps(report['machine'])}\n"
    )
    print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.selectors", description=__doc__)
    add_arguments(ap)
    run(ap.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
