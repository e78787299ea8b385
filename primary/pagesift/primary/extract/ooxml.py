"""OOXML (DOCX, PPTX, XLSX) -> markdown and metadata, read from the package's XML parts.

The text lives in a few well-specified XML parts, so no office library is used
(python-docx/-pptx/openpyxl build a whole object model and parse styles not needed
here): ``xmlparts.Package`` streams each part under its caps.

- DOCX: paragraphs in order, ``#`` headings from ``Heading N``/``Title`` styles, list
  items as ``-``, tables as markdown tables (a table in a cell flattened into it).
  The file has no pages, only the character budget bounds it.
- PPTX: slide text in slide order, each slide after ``<!-- slide N -->``.
- XLSX: each sheet under ``## name`` as a markdown table (shared and inline strings,
  raw cell values; no formula evaluation).
- Metadata from ``docProps/core.xml`` and ``docProps/app.xml``.

Invariants: at most ``max_pages`` slides or sheets are read (the rest never parsed);
slide ids and sheets at most ``zipguard.MAX_SLIDES``; XLSX rows are kept sparse (a
cell in a far column costs one entry), with ``MAX_SHEET_COLUMNS`` columns and
``MAX_SHEET_CELLS`` cells (and shared strings) at most; a table's size is counted
with its padding (every row as wide as the widest) against the character budget.
"""

from __future__ import annotations

import posixpath
import re
from xml.etree import ElementTree as ET

from pagesift.primary.extract.converted import Budget, Converted, DocumentTooLarge, finish
from pagesift.primary.extract.xmlparts import Package, child_text, local
from pagesift.primary.extract.zipguard import MAX_SLIDES

__all__ = ["MAX_SHEET_CELLS", "MAX_SHEET_COLUMNS", "read_docx", "read_pptx", "read_xlsx"]

MAX_SHEET_COLUMNS = 512  # XLSX cells right of this are dropped (a far "XFD1" cell)
MAX_SHEET_CELLS = 2_000_000  # cells read from one workbook (and shared strings)


# -- package parts every OOXML format reads -------------------------------------------


def _rels(z: Package, part: str) -> dict[str, str]:
    """Relationship id -> target part path (zip name) for ``part``."""
    folder, base = posixpath.split(part)
    rels_name = posixpath.join(folder, "_rels", base + ".rels")
    if not z.has(rels_name):
        return {}
    out: dict[str, str] = {}
    for el in z.xml(rels_name):
        target = el.get("Target", "")
        if el.get("TargetMode") == "External" or not target:
            continue
        path = target.lstrip("/") if target.startswith("/") else posixpath.join(folder, target)
        out[el.get("Id", "")] = posixpath.normpath(path)
    return out


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(rows: list[list[str]], max_chars: int) -> str:
    """``rows`` as a markdown table (``_sparse_table``: padded to the widest, cut after
    the row that passes ``max_chars``)."""
    return _sparse_table([list(enumerate(row)) for row in rows], max_chars)


def _ooxml_props(z: Package, conv: Converted) -> None:
    if z.has("docProps/core.xml"):
        core = z.xml("docProps/core.xml")
        conv.title = child_text(core, "title")
        conv.author = child_text(core, "creator")
        conv.created = child_text(core, "created")
        conv.modified = child_text(core, "modified")
        for tag, key in (
            ("subject", "subject"),
            ("keywords", "keywords"),
            ("description", "description"),
            ("lastModifiedBy", "last_modified_by"),
            ("language", "language"),
        ):
            conv.metadata[key] = child_text(core, tag)
    if z.has("docProps/app.xml"):
        app = z.xml("docProps/app.xml")
        conv.metadata["application"] = child_text(app, "Application")
        for tag in ("Pages", "Words", "Slides"):
            conv.metadata[tag.lower()] = child_text(app, tag)


def _main_part(z: Package, default: str) -> str:
    """The office document part the package relationships name (else ``default``)."""
    if z.has("_rels/.rels"):
        for el in z.xml("_rels/.rels"):
            target = el.get("Target", "").lstrip("/")
            if el.get("Type", "").endswith("/officeDocument") and z.has(target):
                return target
    return default


# -- DOCX ---------------------------------------------------------------------------

_HEADING = re.compile(r"^heading\s*(\d)$", re.IGNORECASE)
_DOCX_KEEP = frozenset({"p"})  # read whole at its end (_docx_paragraph)


def read_docx(body: bytes, budget: Budget) -> Converted:
    """The DOCX ``body``'s paragraphs and tables, and its metadata."""
    z = Package(body, "docx")
    conv = Converted(kind="docx", markdown="")
    _ooxml_props(z, conv)
    pages = conv.metadata.get("pages", "")
    conv.num_pages = int(pages) if pages.isdigit() else 0
    table: list[list[list[str]]] = []  # nested tables: a stack of row lists
    row: list[list[str]] = []
    cell: list[list[str]] = []
    pending = 0  # characters held in open tables, not yet in the budget
    for event, el in z.events(_main_part(z, "word/document.xml"), _DOCX_KEEP):
        if budget.full or pending > budget.left:
            budget.add("")
            budget.truncated = budget.truncated or "max_chars"
            break
        name = local(el.tag)
        if event == "start":
            if name == "tbl":
                table.append([])
            elif name == "tr":
                row.append([])
            elif name == "tc":
                cell.append([])
            continue
        if name == "p":
            text = _docx_paragraph(el)
            if cell:
                cell[-1].append(text)
                pending += len(text) + 1
            elif text:
                budget.add(text)
        elif name == "tc" and cell:
            done = " ".join(t for t in cell.pop() if t)
            if row:
                row[-1].append(done)
        elif name == "tr" and row:
            done_row = [str(c) for c in row.pop()]
            if table:
                table[-1].append(done_row)
        elif name == "tbl" and table:
            rendered = _table(table.pop(), budget.left)
            if cell:  # a table inside a cell: flatten into that cell
                cell[-1].append(rendered.replace("\n", " "))
                pending += len(rendered)
            else:
                pending = 0
                if rendered:
                    budget.add(rendered)
    return finish(conv, budget)


def _docx_paragraph(p: ET.Element) -> str:
    parts: list[str] = []
    style = ""
    numbered = False
    for el in p.iter():
        name = local(el.tag)
        if name == "t" and el.text:
            parts.append(el.text)
        elif name == "tab":
            parts.append("\t")
        elif name in ("br", "cr"):
            parts.append("\n")
        elif name == "pStyle":
            style = next((v for k, v in el.attrib.items() if local(k) == "val"), "")
        elif name == "numPr":
            numbered = True
    text = "".join(parts).strip()
    if not text:
        return ""
    heading = _HEADING.match(style)
    if heading:
        return "#" * min(int(heading.group(1)), 6) + " " + " ".join(text.split())
    if style.lower() == "title":
        return "# " + " ".join(text.split())
    if numbered:
        return "- " + text
    return text


# -- PPTX ---------------------------------------------------------------------------


def read_pptx(body: bytes, max_pages: int | None, budget: Budget) -> Converted:
    """The PPTX ``body``'s slide text (at most ``max_pages`` slides), and its metadata."""
    z = Package(body, "pptx")
    conv = Converted(kind="pptx", markdown="")
    _ooxml_props(z, conv)
    main = _main_part(z, "ppt/presentation.xml")
    rels = _rels(z, main)
    slides = [target for _, target in _listed(z, main, "sldId", "slide ids", rels)]
    conv.num_pages = len(slides)
    limit = len(slides) if max_pages is None else min(len(slides), max(max_pages, 0))
    for number, part in enumerate(slides[:limit], start=1):
        if budget.full:
            budget.add("")
            break
        paragraphs: list[str] = []
        size = 0
        for event, el in z.events(part, _PPTX_KEEP):
            if event == "end" and local(el.tag) == "p":
                text = "".join(t.text or "" for t in el.iter() if local(t.tag) == "t").strip()
                if text:
                    paragraphs.append(text)
                    size += len(text) + 2
                    if size > budget.left:  # the budget would cut it anyway
                        break
        budget.add(f"<!-- slide {number} -->\n\n" + "\n\n".join(paragraphs))
    return finish(conv, budget, "max_pages" if limit < len(slides) else "")


_PPTX_KEEP = frozenset({"p"})


def _listed(
    z: Package, part: str, tag: str, what: str, rels: dict[str, str]
) -> list[tuple[str, str]]:
    """(name attribute, target) of the ``tag`` elements of ``part`` whose ``r:id`` is
    in ``rels``, streamed, at most ``MAX_SLIDES`` of them (slide ids, sheets)."""
    out: list[tuple[str, str]] = []
    seen = 0
    for event, el in z.events(part):
        if event != "end" or local(el.tag) != tag:
            continue
        seen += 1
        if seen > MAX_SLIDES:
            raise DocumentTooLarge(
                f"{z.kind}: the part {part} lists more than {MAX_SLIDES} {what} (MAX_SLIDES)"
            )
        rid = next((v for k, v in el.attrib.items() if local(k) == "id" and "}" in k), "")
        if rels.get(rid):
            out.append((el.get("name", ""), rels[rid]))
    return out


# -- XLSX ---------------------------------------------------------------------------

_CELL_REF = re.compile(r"([A-Z]{1,3})")


def _column(ref: str) -> int:
    m = _CELL_REF.match(ref)
    if m is None:
        return -1
    col = 0
    for ch in m.group(1):
        col = col * 26 + (ord(ch) - 64)
    return col - 1


def read_xlsx(body: bytes, max_pages: int | None, budget: Budget) -> Converted:
    """The XLSX ``body``'s sheets as tables (at most ``max_pages``), and its metadata."""
    z = Package(body, "xlsx")
    conv = Converted(kind="xlsx", markdown="")
    _ooxml_props(z, conv)
    main = _main_part(z, "xl/workbook.xml")
    rels = _rels(z, main)
    shared: list[str] = []
    strings = next((t for t in rels.values() if t.endswith("sharedStrings.xml")), "")
    if strings and z.has(strings):
        for event, el in z.events(strings, _XLSX_STRING_KEEP):
            if event == "end" and local(el.tag) == "si":
                if len(shared) >= MAX_SHEET_CELLS:
                    raise DocumentTooLarge(
                        f"xlsx: more than {MAX_SHEET_CELLS} shared strings (MAX_SHEET_CELLS)"
                    )
                shared.append("".join(t.text or "" for t in el.iter() if local(t.tag) == "t"))
    sheets = _listed(z, main, "sheet", "sheets", rels)
    conv.num_pages = len(sheets)
    conv.metadata["sheets"] = ", ".join(name for name, _ in sheets)
    limit = len(sheets) if max_pages is None else min(len(sheets), max(max_pages, 0))
    cells = _CellCount()
    for name, part in sheets[:limit]:
        if budget.full:
            budget.add("")
            break
        rows, cut = _xlsx_rows(z, part, shared, budget.left, cells)
        budget.add(f"## {name}\n\n{_sparse_table(rows, budget.left)}".strip())
        if cut:
            budget.truncated = budget.truncated or "max_chars"
    return finish(conv, budget, "max_pages" if limit < len(sheets) else "")


_XLSX_STRING_KEEP = frozenset({"si"})
_XLSX_CELL_KEEP = frozenset({"c"})


class _CellCount:
    """Cells read from one workbook, against ``MAX_SHEET_CELLS``."""

    def __init__(self) -> None:
        self.n = 0

    def add(self) -> None:
        self.n += 1
        if self.n > MAX_SHEET_CELLS:
            raise DocumentTooLarge(f"xlsx: more than {MAX_SHEET_CELLS} cells (MAX_SHEET_CELLS)")


_Row = list[tuple[int, str]]  # (column, value) of the cells that hold something


def _xlsx_rows(
    z: Package, part: str, shared: list[str], max_chars: int, cells: _CellCount
) -> tuple[list[_Row], bool]:
    """The sheet's rows, sparse (a far column costs one entry, not the empties before
    it), and whether reading stopped because the table would pass ``max_chars``: the
    rendered size is counted with its padding (every row as wide as the widest)."""
    rows: list[_Row] = []
    row: _Row = []
    next_col = 0
    width = 0
    text = 0  # characters of cell values
    for event, el in z.events(part, _XLSX_CELL_KEEP):
        if event != "end":
            continue
        name = local(el.tag)
        if name == "c":
            cells.add()
            kind = el.get("t", "")
            value = ""
            for sub in el:
                if local(sub.tag) == "v":
                    value = sub.text or ""
                elif local(sub.tag) == "is":
                    value = "".join(t.text or "" for t in sub.iter() if local(t.tag) == "t")
            if kind == "s":
                value = shared[int(value)] if value.isdigit() and int(value) < len(shared) else ""
            elif kind == "b":
                value = "TRUE" if value == "1" else "FALSE"
            col = _column(el.get("r", "")) if el.get("r") else next_col
            if next_col <= col < MAX_SHEET_COLUMNS:
                next_col = col + 1
                if value:
                    row.append((col, value))
                    text += len(value)
        elif name == "row":
            rows.append(row)
            if row:
                width = max(width, row[-1][0] + 1)
            row = []
            next_col = 0
            # "| " + " | ".join(cells) + " |": 3 characters a cell and 2 a row at least
            if text + len(rows) * (3 * width + 2) > max_chars:
                return _trim(rows), True
    return _trim(rows), False


def _trim(rows: list[_Row]) -> list[_Row]:
    while rows and not rows[-1]:
        rows.pop()
    return rows


def _sparse_table(rows: list[_Row], max_chars: int) -> str:
    """Sparse rows as a markdown table, every row as wide as the widest, cut after the
    row that passes ``max_chars``."""
    width = max((r[-1][0] + 1 for r in rows if r), default=0)
    if width == 0:
        return ""
    lines = []
    size = 0
    for i, row in enumerate(rows):
        cells = [""] * width
        for col, value in row:
            cells[col] = _cell(value)
        lines.append("| " + " | ".join(cells) + " |")
        if i == 0:
            lines.append("|" + " --- |" * width)
        size += len(lines[-1]) + 1
        if size > max_chars:
            break
    return "\n".join(lines)
