"""``htmlclean.to_markdown`` builds html_to_markdown's native options itself (no enum
lookups by name a call): they must be exactly what the library's public API builds from
its dataclasses for the same settings, attribute by attribute, and the Markdown the same
on pages that exercise headings, lists, tables, code, links and images. A library update
that changes a default, or an option this module stops setting, fails here."""

from __future__ import annotations

from typing import Any

import html_to_markdown
import html_to_markdown.api
import pytest

from pagesift.primary.extract import htmlclean

BASE = "https://docs.example/guide/page.html"


def _public_native(base_url: str) -> Any:
    """The binding's options as ``html_to_markdown.convert`` makes them from the public
    dataclasses with ``to_markdown``'s settings."""
    public = html_to_markdown.ConversionOptions(
        extract_metadata=False,
        preprocessing=html_to_markdown.PreprocessingOptions(enabled=False),
        base_url=base_url,
    )
    return html_to_markdown.api._to_rust_conversion_options(public)


def _attributes(options: Any) -> dict[str, str]:
    """Every public value of a native options object (a nested options object by its
    own values, compared separately)."""
    names = [n for n in dir(options) if not n.startswith("_")]
    values = {n: getattr(options, n) for n in names}
    return {
        n: repr(v)
        for n, v in values.items()
        if not callable(v) and not type(v).__name__.endswith("Options")
    }


def test_the_native_options_equal_the_public_apis_attribute_by_attribute() -> None:
    ours, public = htmlclean.native_options(BASE), _public_native(BASE)
    mine, theirs = _attributes(ours), _attributes(public)
    assert len(mine) > 30  # the whole option set, not an empty view
    assert mine == theirs
    pre_ours, pre_public = _attributes(ours.preprocessing), _attributes(public.preprocessing)
    assert pre_ours == pre_public
    assert ours.base_url == BASE and ours.extract_metadata is False
    assert ours.preprocessing.enabled is False


PAGES = [
    "<h1>Title</h1><p>Some <b>bold</b>, <i>em</i> and <code>code</code>.</p>",
    "<ul><li>one<ul><li>nested</li></ul></li><li>two</li></ul><ol><li>first</li></ol>",
    "<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>",
    "<pre><code class='language-py'>def f():\n    return 1\n</code></pre>",
    "<p><a href='other.html#x'>rel</a> <a href='/abs'>abs</a> <img src='i.png' alt='pic'></p>",
    "<nav><a href='/'>home</a></nav><header>h</header><form><input></form><p>kept</p>",
    "<blockquote><p>quoted</p></blockquote><dl><dt>term</dt><dd>def</dd></dl><hr>",
]


@pytest.mark.parametrize("html", PAGES)
def test_to_markdown_renders_what_the_public_convert_renders(html: str) -> None:
    public = html_to_markdown.convert(
        html,
        html_to_markdown.ConversionOptions(
            extract_metadata=False,
            preprocessing=html_to_markdown.PreprocessingOptions(enabled=False),
            base_url=BASE,
        ),
    )
    assert htmlclean.to_markdown(html, BASE) == (public.content or "")


def test_links_are_made_absolute_and_nothing_is_preprocessed_away() -> None:
    md = htmlclean.to_markdown(PAGES[4] + PAGES[5], BASE)
    assert "https://docs.example/guide/other.html#x" in md
    assert "https://docs.example/abs" in md
    assert "home" in md and "kept" in md  # nav and forms stay: this module cleans
