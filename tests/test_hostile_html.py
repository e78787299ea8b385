"""Hostile HTML (issue 19, finding 5): a page nested past ``MAX_HTML_DEPTH`` or holding
more than ``MAX_HTML_ELEMENTS`` is refused by ``extract.check_shape`` before lexbor
parses it (lexbor's time grows with tags x depth: 200,000 nested ``<div>`` took 169 s
in a worker on the code of the finding), and the scan's depth is lexbor's own on the
markup real pages use (implied end tags, void elements, raw text, comments, SVG).
"""

from __future__ import annotations

import pickle

import pytest
from selectolax.lexbor import LexborHTMLParser

from pagesift.primary import extract
from pagesift.primary.extract import TooLarge, check_shape
from pagesift.shared.demopages import generate_pages
from tests.hostile import html as hostile_html


def lexbor_depth(html: str) -> int:
    """The depth of lexbor's tree for ``html`` (elements only, ``<html>`` is 1)."""
    root = LexborHTMLParser(html).root
    assert root is not None
    best = 0
    todo = [(root, 1)]
    while todo:
        node, depth = todo.pop()
        best = max(best, depth)
        child = node.child
        while child is not None:
            if not (child.tag or "-").startswith(("-", "_", "!")):
                todo.append((child, depth + 1))
            child = child.next
    return best


def test_a_page_nested_past_max_html_depth_is_refused_before_it_is_parsed() -> None:
    page = hostile_html.deep_divs(200_000)  # the finding's page: 1 MB
    with pytest.raises(TooLarge, match=r"deeper than 1000 \(MAX_HTML_DEPTH\)"):
        extract.extract(page, "https://example.com/")
    with pytest.raises(TooLarge, match="MAX_HTML_DEPTH"):
        extract.extract_compact(page, "https://example.com/", extract.Wanted(), False)


def test_a_page_past_max_html_elements_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extract, "MAX_HTML_ELEMENTS", 10_000)
    with pytest.raises(TooLarge, match=r"more than 10000 elements \(MAX_HTML_ELEMENTS\)"):
        extract.extract(hostile_html.many_elements(10_000), "https://example.com/")
    got = extract.extract(hostile_html.many_elements(9_000), "https://example.com/")
    assert got.title == "hostile"


def test_a_page_just_under_the_depth_cap_is_extracted() -> None:
    depth = extract.MAX_HTML_DEPTH - 10
    page = (
        "<html><body>"
        + "<div>" * depth
        + '<p>deep text <a href="/next">next</a></p>'
        + "</div>" * depth
        + "</body></html>"
    )
    got = extract.extract(page, "https://example.com/")
    assert "deep text" in got.markdown
    assert got.links == ["https://example.com/next"]


CAP = 40  # the depth cap these cases run under
SHAPES = {
    # markup real pages use, that nests far less than its tag count suggests
    "unclosed-paragraphs": "<div>" + "<p>text" * 500 + "</div>",
    "unclosed-list-items": "<ul>" + "<li>item" * 500 + "</ul>",
    "unclosed-cells": "<table>" + "<tr><td>a<td>b<th>c" * 300 + "</table>",
    "definition-lists": "<dl>" + "<dt>term<dd>definition" * 300 + "</dl>",
    "void-elements": "<div>" + "<br><img src=x><input><hr><meta charset=utf-8>" * 200 + "</div>",
    "svg-self-closing": "<svg>" + '<path d="M0 0"/><circle r="1" />' * 300 + "</svg>",
    "script-with-tags": "<script>" + "var s = '<div>';" * 500 + "</script><p>after</p>",
    "style-and-textarea": "<style>"
    + "<b>" * 300
    + "</style><textarea>"
    + "<i>" * 300
    + "</textarea>",
    "comments-with-tags": "<!--" + "<div>" * 500 + "--><p>after</p>",
    "closed-siblings": "<div><span>x</span></div>" * 500,
    "uppercase-closed": "<DIV><SPAN>x</span></Div>" * 500,
    "options": "<select>" + "<option>o" * 300 + "</select>",
    # markup that does nest past the cap, as lexbor builds it
    "nested-divs": "<div>" * 60,
    "html-self-closing-divs": "<div/>" * 60,  # not self-closing outside SVG: they nest
    "unclosed-bold": "<b>x" * 60,
    "uppercase-nested": "<DIV>" * 60,
    "nested-lists": "<ul><li>" * 40,
    "nested-svg-groups": "<svg>" + "<g>" * 60 + "</svg>",
    "deep-after-comment": "<!-- <div> -->" + "<section>" * 60,
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_shape_scan_refuses_exactly_what_lexbor_nests_past_the_cap(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(extract, "MAX_HTML_DEPTH", CAP)
    page = "<!doctype html><html><head><title>t</title></head><body>" + SHAPES[name]
    page += "</body></html>"
    deep = lexbor_depth(page) > CAP
    try:
        check_shape(page)
        refused = False
    except TooLarge:
        refused = True
    assert refused == deep, (name, lexbor_depth(page))


def test_every_demo_site_page_passes_the_shape_check() -> None:
    pages, _ = generate_pages(300, 7)
    for html in pages.values():
        check_shape(html)
    assert len(pages) >= 300


def test_too_large_crosses_a_process_boundary_with_its_reason() -> None:
    exc = pickle.loads(pickle.dumps(TooLarge("past (MAX_HTML_DEPTH)")))
    assert isinstance(exc, TooLarge) and exc.reason == "past (MAX_HTML_DEPTH)"
