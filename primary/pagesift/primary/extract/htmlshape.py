"""The shape check: a page's depth and element count, read in one linear pass before lexbor.

Owns ``check_shape`` (and ``shape``, the pass itself): it refuses a page that nests
deeper than ``MAX_HTML_DEPTH`` or holds more than ``MAX_HTML_ELEMENTS`` elements with
``TooLarge`` (the page error ``too_large``, its reason naming the cap), before lexbor
sees it.

Why: lexbor's tree builder searches its stack of open elements for every tag (HTML's
scope checks), so its time grows with tags x depth; under the caps a page costs it at
most elements x ``MAX_HTML_DEPTH`` steps (a few seconds for the worst page the caps
admit, ``tests.hostile.html.deep_and_wide``). The deadline and memory cap of the
worker process it runs in bound the rest.

Invariants: one pass over the text, a few possessive regex steps a tag (no
backtracking), stopping once either count passes its cap; ``TooLarge`` takes one
string argument, so it crosses a process boundary. The caps are module globals read
at each call, so a test may lower them. Nothing here does I/O.
"""

from __future__ import annotations

import re

__all__ = ["MAX_HTML_DEPTH", "MAX_HTML_ELEMENTS", "TooLarge", "check_shape", "shape"]

# Elements open at once: html_to_markdown drops whatever lies deeper than ~1,020 levels,
# and Blink's parser flattens past 512, so no page that renders needs more.
MAX_HTML_DEPTH = 1_000
MAX_HTML_ELEMENTS = 1_000_000  # elements in one page (a 10 MiB body of real HTML: ~200 K)


class TooLarge(Exception):
    """A page whose shape is past a cap (``reason`` names it): the page error
    ``too_large``. Plain (one string argument), so it crosses a process boundary."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# What may follow "<": a start or end tag's name, or markup that is no tag.
_TAG = re.compile(r"<(?:(/?)([A-Za-z][^\t\n\f\r />]*)|(!--)|(!\[CDATA\[)|[!?]|/)")
_WS = "\t\n\f\r "
# The rest of a tag as HTML's tokenizer reads it: attributes (a value is quoted only when
# the quote follows its "="; quoted values may hold ">" and "<"), then "/>" or ">".
# Possessive throughout: one pass, no backtracking.
_TAG_REST = re.compile(
    rf"(?:[{_WS}]++|/(?!>)|[^{_WS}/>][^{_WS}/>=]*+"
    rf"""(?:[{_WS}]*+=[{_WS}]*+(?:"[^"]*+"|'[^']*+'|[^{_WS}>]*+))?+)*+(/?)>"""
)
_COMMENT_END = re.compile(r"--!?>")
_VOID = frozenset((
    "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "image", "img",
    "input", "keygen", "link", "meta", "param", "source", "track", "wbr",
))  # fmt: skip
# Elements whose content is text up to their end tag, in HTML content.
_RAW_END = {
    name: re.compile(f"</{name}(?=[{_WS}/>])", re.IGNORECASE)
    for name in (
        "script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes", "plaintext",
    )
}  # fmt: skip
_BLOCKS = (
    "address", "article", "aside", "blockquote", "center", "details", "dialog", "dir", "div", "dl",
    "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6",
    "header", "hgroup", "main", "menu", "nav", "ol", "p", "pre", "section", "summary", "table",
    "ul",
)  # fmt: skip
# Start tags that close an open p (in button scope), and the open elements a start tag
# closes when they are the current node (HTML's implied end tags).
_CLOSES_P = frozenset((
    *_BLOCKS, "li", "dd", "dt", "hr", "listing", "plaintext", "search", "xmp", "form",
))  # fmt: skip
_IMPLIED: dict[str, frozenset[str]] = {
    "li": frozenset({"li", "p"}),
    "dt": frozenset({"dt", "dd", "p"}),
    "dd": frozenset({"dt", "dd", "p"}),
    "td": frozenset({"td", "th"}),
    "th": frozenset({"td", "th"}),
    "tr": frozenset({"tr", "td", "th"}),
    "thead": frozenset({"thead", "tbody", "tfoot", "tr", "td", "th"}),
    "tbody": frozenset({"thead", "tbody", "tfoot", "tr", "td", "th"}),
    "tfoot": frozenset({"thead", "tbody", "tfoot", "tr", "td", "th"}),
    "option": frozenset({"option"}),
    "optgroup": frozenset({"option", "optgroup"}),
    "rt": frozenset({"rt", "rp"}),
    "rp": frozenset({"rt", "rp"}),
}
# HTML's "special" elements: an end tag of any other element is ignored when one of them
# is open above its match.
_SPECIAL = frozenset((
    "address", "applet", "area", "article", "aside", "base", "basefont", "bgsound",
    "blockquote", "body", "br", "button", "caption", "center", "col", "colgroup", "dd",
    "details", "dir", "div", "dl", "dt", "embed", "fieldset", "figcaption", "figure", "footer",
    "form", "frame", "frameset", "h1", "h2", "h3", "h4", "h5", "h6", "head", "header", "hgroup",
    "hr", "html", "iframe", "img", "input", "keygen", "li", "link", "listing", "main",
    "marquee", "menu", "meta", "nav", "noembed", "noframes", "noscript", "object", "ol", "p",
    "param", "plaintext", "pre", "script", "search", "section", "select", "source", "style",
    "summary", "table", "tbody", "td", "template", "textarea", "tfoot", "th", "thead", "title",
    "tr", "track", "ul", "wbr", "xmp",
))  # fmt: skip
# Scope boundaries: an end tag of a special element closes nothing past one of these.
_SCOPE = frozenset((
    "applet", "caption", "html", "table", "td", "th", "marquee", "object", "template", "mi",
    "mo", "mn", "ms", "mtext", "annotation-xml", "foreignobject", "desc", "title",
))  # fmt: skip
_SCOPE_EXTRA = {"li": frozenset({"ol", "ul"}), "p": frozenset({"button"})}
# HTML elements that end SVG/MathML content, and the foreign elements whose children
# are HTML again (integration points).
_BREAKOUT = frozenset((
    "b", "big", "blockquote", "body", "br", "center", "code", "dd", "div", "dl", "dt", "em",
    "embed", "h1", "h2", "h3", "h4", "h5", "h6", "head", "hr", "i", "img", "li",
    "listing", "menu", "meta", "nobr", "ol", "p", "pre", "ruby", "s", "small", "span", "strong",
    "strike", "sub", "sup", "table", "tt", "u", "ul", "var",
))  # fmt: skip
_FONT_BREAKOUT = re.compile(r"[\t\n\f\r /](?:color|face|size)[\t\n\f\r /=>]", re.I)
_INTEGRATION = frozenset(("foreignobject", "desc", "title", "mi", "mo", "mn", "ms", "mtext"))
_FOREIGN_ROOTS = frozenset({"svg", "math"})
_FORMATTING = frozenset((
    "a", "b", "big", "code", "em", "font", "i", "nobr", "s", "small", "strike", "strong", "tt",
    "u",
))  # fmt: skip
_MARKERS = frozenset({"applet", "object", "marquee", "template", "td", "th", "caption"})
# Table parts: ignored in body, outside a table.
_IGNORED_IN_BODY = frozenset((
    "caption", "col", "colgroup", "frame", "head", "tbody", "td", "tfoot", "th", "thead", "tr",
))  # fmt: skip
_TABLE_PARTS = frozenset({"table", "tbody", "thead", "tfoot", "tr", "td", "th", "caption"})
# what a stack entry is: an HTML element, an SVG/MathML one, a formatting element in
# the parser's list of elements to reopen, or one its Noah's Ark dropped from the list
_HTML, _FOREIGN_EL, _FORMAT, _UNLISTED = 0, 1, 2, 3
# Start tags before which the parser does not reopen formatting elements.
_NO_REOPEN = frozenset((
    *_BLOCKS, "search", "listing", "form", "li", "dd", "dt", "plaintext", "table", "hr",
    "iframe", "noembed", "noscript", "rb", "rp", "rt", "rtc", "textarea", "param", "source",
    "track", "script", "style", "template", "title", "base", "basefont", "bgsound", "link",
    "meta", "caption", "col", "colgroup", "frame", "head", "tbody", "td", "tfoot", "th",
    "thead", "tr", "html", "body", "frameset",
))  # fmt: skip
_KEPT_OPEN = frozenset({"body", "html", "head"})  # their end tags close nothing
_CLOSE_SLOW = _KEPT_OPEN | {"form", "select"}
_TABLE_SECTIONS = frozenset({"table", "tbody", "thead", "tfoot"})
_END_SEARCH = 64  # an end tag closes a match this near the current node, else is ignored
_SHAPE_MIN_TAGS = 20_000  # pages with fewer "<" are not scanned (see check_shape)


def check_shape(html: str) -> None:
    """Raise ``TooLarge`` when ``html`` nests elements deeper than ``MAX_HTML_DEPTH`` or
    holds more than ``MAX_HTML_ELEMENTS``.

    lexbor's tree builder searches its stack of open elements for every tag (HTML's
    scope checks), so its time grows with tags x depth: 40,000 nested ``<div>`` take
    1.4 s, 200,000 take minutes. ``shape`` reads the text once, a few regex steps a
    tag, and under the caps lexbor's work is at most elements x ``MAX_HTML_DEPTH``.
    A page of at most ``_SHAPE_MIN_TAGS`` tags is not scanned: nested all the way down
    it costs lexbor ~0.3 s, and ordinary pages, nearly all that small, skip the scan's
    cost (it reads ~20 MB/s where lexbor parses ~100 MB/s)."""
    if html.count("<") <= max(MAX_HTML_DEPTH, _SHAPE_MIN_TAGS):
        return  # too few tags to cost lexbor much, or to pass the element cap
    depth, elements = shape(html, MAX_HTML_DEPTH, MAX_HTML_ELEMENTS)
    if elements > MAX_HTML_ELEMENTS:
        raise TooLarge(f"the page has more than {MAX_HTML_ELEMENTS} elements (MAX_HTML_ELEMENTS)")
    if depth > MAX_HTML_DEPTH:
        raise TooLarge(f"the page nests elements deeper than {MAX_HTML_DEPTH} (MAX_HTML_DEPTH)")


def shape(html: str, max_depth: int, max_elements: int) -> tuple[int, int]:
    """(the deepest nesting, the number of elements) of ``html`` as HTML's tree builder
    would make them, read in one pass that stops once either passes its cap.

    It keeps a stack of open elements the way the tree builder does for the markup that
    decides depth. Tokenizing follows the HTML tokenizer: attribute values quoted only
    after "=", comments ending at ``-->``/``--!>``/``<!-->``, bogus comments, CDATA in
    SVG/MathML, raw text of ``script``/``style``/... in HTML content; anything
    unterminated is read on as markup (the parser would take the rest as text). Tree
    building: void elements; implied end tags (``p``, ``li``, ``td``, ...) and the
    ``tbody``/``tr`` a row or cell implies; table parts outside a table, a select in a
    select and a form in a form ignored; ``</body>``/``</html>`` closing nothing and
    ``</form>`` only the form; ``<x/>`` closing itself only in SVG/MathML, which an
    HTML breakout tag ends and integration points leave; an end tag closing its match
    only if it is among the last ``_END_SEARCH`` open elements with no scope boundary
    (for a non-special element, no special element) above it; formatting elements
    (``b``, ``font``, ...) an end tag closes counted again, as the parser reopens them,
    three alike at most (its "Noah's Ark").

    On real pages this is the parser's depth (a 2,000-page sample of the Rust
    documentation: within one level). It is an estimate, not the parser: fuzzed
    against lexbor (15,000 random snippets of tag soup, each repeated 60 times), it
    is deeper on most, but lexbor's repairs (reopened formatting elements, foreign
    content, forms, selects, ...) still nest some up to ~3 times deeper than it says. So
    the cap bounds lexbor's work within such a factor for those, and the worker's
    deadline bounds whatever gets further; ``tests/test_hostile_html.py`` holds the
    cases it must agree with lexbor on."""
    stack: list[str] = []
    kinds: list[int] = []  # parallel to stack: _HTML, _FOREIGN_EL, _FORMAT, _UNLISTED
    idents: list[str] = []  # parallel to stack: a formatting element's attributes
    selects: list[int] = []  # stack positions of the open select elements
    form_open = False  # the parser's form element pointer is set
    pending: list[tuple[str, str]] = []  # formatting elements closed, to be reopened
    elements = deepest = 0
    pos = 0
    n = len(html)
    while pos < n:
        m = _TAG.search(html, pos)
        if m is None:
            break
        in_foreign = bool(kinds) and kinds[-1] == _FOREIGN_EL and stack[-1] not in _INTEGRATION
        if pending and not in_foreign and m.start() > pos:
            _reopen(stack, kinds, idents, pending)  # text (even white space) reopens them
        pos = m.end()
        slash, name, comment, cdata = m.group(1, 2, 3, 4)
        if name is None:
            if comment:  # "<!--": to "-->" or "--!>", or closed at once by "<!-->"
                if html.startswith(">", pos) or html.startswith("->", pos):
                    continue
                end = _COMMENT_END.search(html, pos)
                if end is not None:
                    pos = end.end()
            elif cdata and in_foreign:
                close = html.find("]]>", pos)
                if close >= 0:
                    pos = close + 3
            else:  # "<!x", "<?x", "</x": a bogus comment, to ">"
                if m.group(0) == "</" and html.startswith(">", pos):
                    pos += 1
                    continue
                close = html.find(">", pos)
                if close >= 0:
                    pos = close + 1
            continue
        if html.startswith(">", pos):  # most tags: no attributes
            tag_end = pos + 1
            self_closing = False
        else:
            rest = _TAG_REST.match(html, pos)
            if rest is None:
                continue  # a tag cut by the end of the page: read on (deep side)
            tag_end = rest.end()
            self_closing = bool(rest.group(1))
        name = name.lower()
        if slash:
            if in_foreign and name in ("br", "p"):  # they end SVG/MathML content
                while kinds and kinds[-1] == _FOREIGN_EL and stack[-1] not in _INTEGRATION:
                    stack.pop()
                    kinds.pop()
                    idents.pop()
            if name == "br":  # </br> is read as <br>, which reopens formatting elements
                if pending and not (kinds and kinds[-1] == _FOREIGN_EL):
                    _reopen(stack, kinds, idents, pending)
                pos = tag_end
                continue
            if stack and stack[-1] == name and name not in _CLOSE_SLOW:
                stack.pop()  # the common case: it closes the current node
                kinds.pop()
                idents.pop()
                pos = tag_end
                continue
            if name == "form":
                form_open = False
            _close(stack, kinds, idents, name, pending)
            while selects and selects[-1] >= len(stack):
                selects.pop()
            pos = tag_end
            continue
        elements += 1
        if elements > max_elements:
            break
        pos = tag_end
        if in_foreign and (
            name in _BREAKOUT
            or (name == "font" and _FONT_BREAKOUT.search(html, m.end(), tag_end) is not None)
        ):
            while kinds and kinds[-1] == _FOREIGN_EL and stack[-1] not in _INTEGRATION:
                stack.pop()
                kinds.pop()
                idents.pop()
            in_foreign = False
        if pending and not in_foreign and name not in _NO_REOPEN:
            _reopen(stack, kinds, idents, pending)
        if in_foreign:
            if not self_closing:  # <x/> closes itself in SVG/MathML
                stack.append(name)
                kinds.append(_FOREIGN_EL)
                idents.append("")
        elif name == "select" and selects:  # a select in a select ends the first
            _close(stack, kinds, idents, "select", pending)
            while selects and selects[-1] >= len(stack):
                selects.pop()
        elif (
            name in _VOID
            or (name == "form" and form_open)  # a form in a form is ignored
            or (name in _IGNORED_IN_BODY and not _in_table(stack))
        ):
            pass
        elif name in _FOREIGN_ROOTS:
            if not self_closing:
                stack.append(name)
                kinds.append(_FOREIGN_EL)
                idents.append("")
        else:
            if name in _CLOSES_P and "p" in stack[-_END_SEARCH:]:
                _close(stack, kinds, idents, "p", pending)  # p in button scope: closed
            raw = _RAW_END.get(name)
            if raw is not None:
                end = raw.search(html, pos)
                if end is not None:
                    pos = end.start()
                    continue
            implied = _IMPLIED.get(name)
            if implied is not None:
                while stack and stack[-1] in implied:
                    stack.pop()
                    kinds.pop()
                    idents.pop()
            if stack and stack[-1] in _TABLE_SECTIONS:  # the rows and sections implied
                if name in ("tr", "td", "th") and stack[-1] == "table":
                    stack.append("tbody")
                    kinds.append(_HTML)
                    idents.append("")
                if name in ("td", "th"):
                    stack.append("tr")
                    kinds.append(_HTML)
                    idents.append("")
            if name == "select":
                selects.append(len(stack))
            elif name == "form":
                form_open = True
            if name in _FORMATTING:
                ident = name + html[m.end() : tag_end]
                _noahs_ark(stack, kinds, idents, ident, pending)
                stack.append(name)
                kinds.append(_FORMAT)
                idents.append(ident)
            else:
                stack.append(name)
                kinds.append(_HTML)
                idents.append("")
        if len(stack) > deepest:
            deepest = len(stack)
            if deepest > max_depth:
                break
    return deepest, elements


def _in_table(stack: list[str]) -> bool:
    """Whether a table is open near the current node (table parts count there)."""
    return any(name in _TABLE_PARTS for name in stack[-_END_SEARCH:])


def _reopen(
    stack: list[str], kinds: list[int], idents: list[str], pending: list[tuple[str, str]]
) -> None:
    """The parser reopens the formatting elements an end tag closed (its "reconstruct
    the active formatting elements"), before text or an inline start tag."""
    for name, ident in pending:
        stack.append(name)
        kinds.append(_FORMAT)
        idents.append(ident)
    pending.clear()


def _noahs_ark(
    stack: list[str],
    kinds: list[int],
    idents: list[str],
    ident: str,
    pending: list[tuple[str, str]],
) -> None:
    """Before a formatting element ``ident`` opens: with three alike already in the
    parser's list (open near the current node since the last marker, or pending), the
    earliest leaves the list: it will not be reopened (an open one stays open)."""
    in_pending = [i for i, (_, pending_ident) in enumerate(pending) if pending_ident == ident]
    if len(in_pending) + idents[-_END_SEARCH:].count(ident) < 3:
        return
    alike: list[int] = []
    for i in range(len(stack) - 1, max(len(stack) - _END_SEARCH, 0) - 1, -1):
        if stack[i] in _MARKERS and kinds[i] == _HTML:
            break
        if idents[i] == ident and kinds[i] == _FORMAT:
            alike.append(i)
    if len(alike) + len(in_pending) < 3:
        return
    if alike:
        kinds[alike[-1]] = _UNLISTED
    else:
        del pending[in_pending[0]]


def _close(
    stack: list[str],
    kinds: list[int],
    idents: list[str],
    name: str,
    pending: list[tuple[str, str]],
) -> None:
    """Apply the end tag ``name`` to the open elements (see ``shape``); the formatting
    elements it closes above its match join ``pending`` (the parser reopens them)."""
    if name in _KEPT_OPEN:
        return
    special = name in _SPECIAL
    bounds = _SCOPE | _SCOPE_EXTRA.get(name, frozenset()) if special else _SPECIAL
    # from an SVG/MathML current node, the walk matches foreign elements until it meets
    # an HTML one; from there HTML's rules hold, which stop at integration points (also
    # those the foreign walk passed: HTML's scope checks start from the current node)
    foreign_walk = bool(kinds) and kinds[-1] == _FOREIGN_EL
    passed_boundary = False
    for i in range(len(stack) - 1, max(len(stack) - _END_SEARCH, 0) - 1, -1):
        open_name = stack[i]
        kind = kinds[i]
        boundary = kind == _FOREIGN_EL and (
            open_name in _INTEGRATION or open_name == "annotation-xml"
        )
        if kind == _FOREIGN_EL and not foreign_walk:
            if boundary:
                return
            continue
        if kind == _FOREIGN_EL:
            passed_boundary = passed_boundary or boundary
        else:
            if foreign_walk and passed_boundary:
                return
            foreign_walk = False
        if open_name == name:
            if name == "form":  # the form element alone leaves the stack
                del stack[i]
                del kinds[i]
                del idents[i]
                return
            if name in _MARKERS:  # a cell (or other marker) clears what it opened
                pending.clear()
            else:
                for j in range(i + 1, len(stack)):
                    if stack[j] in _MARKERS and kinds[j] == _HTML:
                        break
                    if kinds[j] == _FORMAT:
                        pending.append((stack[j], idents[j]))
            del stack[i:]
            del kinds[i:]
            del idents[i:]
            return
        if kind != _FOREIGN_EL and open_name in bounds:
            return
