"""Section ``documents``: PDF text extraction, pages/s and peak RSS per candidate library.

The candidates for ``pagesift.primary.extract.pdf`` (pypdfium2, which it uses; pypdf;
pdfminer.six) each extract the text of every page of the same PDFs, one library and
one file per fresh child process (``python -m bench.documents LIB PATH``), so each
peak RSS (the child's ``VmHWM``) is that library's alone. Figures: pages/s
(wall clock of the extraction, imports and interpreter start excluded), peak RSS,
and the RSS growth over the child's baseline after the import. A library that is
not installed is reported as such (pypdf and pdfminer.six are not project
dependencies: ``.venv/bin/pip install pypdf pdfminer.six`` to compare).

The PDFs: a generated text PDF of ``--doc-pages`` pages (written by fpdf2, a ``dev``
dependency, 40 lines a page; skipped with a note when fpdf2 is not installed:
``.venv/bin/pip install -e '.[dev]'``), plus any ``--doc-pdf PATH`` given, plus the
Debian manuals found on this machine (``/usr/share/doc``; real pdfTeX output with fonts,
ligatures and outlines). Writes ``bench/out/documents.json`` and ``bench/out/documents.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_DIR / "bench" / "out"  # bench.common's (not imported here: its grpc import
# would count in the children's memory)

LIBRARIES = ("pypdfium2", "pypdf", "pdfminer")
SYSTEM_PDFS = (
    Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf"),
    Path("/usr/share/doc/libtasn1-doc/libtasn1.pdf"),
)
CHILD_TIMEOUT = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("documents")
    group.add_argument("--doc-pages", type=int, default=300, help="pages of the generated PDF")
    group.add_argument(
        "--doc-pdf", action="append", default=[], help="another PDF to measure (repeatable)"
    )


def _rss_kb() -> int:
    """Peak resident set of this process (VmHWM, KiB). Not ``ru_maxrss``: Linux carries
    the forking parent's high-water mark across exec into it."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def say(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


def _extract(library: str, path: str) -> tuple[int, int]:
    """(pages, characters) of every page's text of ``path`` with ``library``."""
    chars = 0
    if library == "pypdfium2":
        import pypdfium2 as pdfium

        doc = pdfium.PdfDocument(path)
        pages = len(doc)
        for index in range(pages):
            page = doc[index]
            textpage = page.get_textpage()
            chars += len(textpage.get_text_range())
            textpage.close()
            page.close()
        doc.close()
        return pages, chars
    if library == "pypdf":
        import pypdf

        reader = pypdf.PdfReader(path)
        for page in reader.pages:
            chars += len(page.extract_text())
        return len(reader.pages), chars
    if library == "pdfminer":
        from pdfminer.high_level import extract_pages
        from pdfminer.layout import LTTextContainer

        pages = 0
        for layout in extract_pages(path):
            pages += 1
            for element in layout:
                if isinstance(element, LTTextContainer):
                    chars += len(element.get_text())
        return pages, chars
    raise ValueError(library)


def _child(library: str, path: str) -> None:
    module = "pdfminer" if library == "pdfminer" else library
    __import__(module)
    if library == "pdfminer":
        import pdfminer.high_level  # noqa: F401  (imports counted in the baseline)
    baseline = _rss_kb()
    t0 = time.perf_counter()
    pages, chars = _extract(library, path)
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "pages": pages,
                "chars": chars,
                "seconds": seconds,
                "peak_kb": _rss_kb(),
                "baseline_kb": baseline,
            }
        )
    )


def _version(library: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    dist = "pdfminer.six" if library == "pdfminer" else library
    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


def _generated_pdf(pages: int) -> bytes:
    """A text PDF of ``pages`` A4 pages of 40 Helvetica lines each, by fpdf2."""
    from fpdf import FPDF
    from fpdf.enums import XPos, YPos

    pdf = FPDF()
    pdf.set_title("pagesift bench")
    pdf.set_auto_page_break(False)
    pdf.set_font("helvetica", size=10)
    for p in range(1, pages + 1):
        pdf.add_page()
        for n in range(40):
            line = f"Page {p} line {n}: the quick brown fox jumps over the lazy dog, {p * n}"
            pdf.cell(h=6, text=line, new_x=XPos.LMARGIN, new_y=YPos.NEXT)
    return bytes(pdf.output())


def _corpus(args: argparse.Namespace) -> list[Path]:
    paths = [Path(p) for p in args.doc_pdf]
    if importlib.util.find_spec("fpdf") is None:
        say(
            "documents: fpdf2 is not installed (.venv/bin/pip install -e '.[dev]'), "
            "no generated PDF"
        )
    else:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        generated = OUT_DIR / f"documents-generated-{args.doc_pages}p.pdf"
        generated.write_bytes(_generated_pdf(args.doc_pages))
        paths.insert(0, generated)
    return paths + [p for p in SYSTEM_PDFS if p.exists()]


def run(args: argparse.Namespace) -> None:
    corpus = _corpus(args)
    rows: list[dict[str, object]] = []
    for path in corpus:
        for library in LIBRARIES:
            module = "pdfminer" if library == "pdfminer" else library
            if importlib.util.find_spec(module) is None:
                say(f"documents: {library} is not installed, skipped")
                continue
            proc = subprocess.run(
                [sys.executable, "-m", "bench.documents", library, str(path)],
                cwd=REPO_DIR,
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT,
                check=False,
            )
            if proc.returncode != 0:
                say(f"documents: {library} failed on {path.name}: {proc.stderr[-500:]}")
                continue
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            row = {
                "pdf": path.name,
                "bytes": path.stat().st_size,
                "library": f"{library} {_version(library)}",
                "pages": got["pages"],
                "chars": got["chars"],
                "seconds": round(got["seconds"], 3),
                "pages_per_s": round(got["pages"] / max(got["seconds"], 1e-9), 1),
                "peak_rss_mb": round(got["peak_kb"] / 1024, 1),
                "rss_growth_mb": round((got["peak_kb"] - got["baseline_kb"]) / 1024, 1),
            }
            rows.append(row)
            say(
                f"documents: {row['library']:<22} {path.name:<40} {row['pages']:>4} pages "
                f"{row['pages_per_s']:>8} pages/s  peak {row['peak_rss_mb']} MB"
            )
    header = "| PDF | library | pages | chars | s | pages/s | peak RSS MB | RSS growth MB |"
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['pdf']} | {r['library']} | {r['pages']} | {r['chars']} | {r['seconds']} "
            f"| {r['pages_per_s']} | {r['peak_rss_mb']} | {r['rss_growth_mb']} |"
        )
    table = "\n".join(lines)
    print(table, flush=True)
    facts = {"python": platform.python_version(), "machine": platform.machine()}
    (OUT_DIR / "documents.json").write_text(json.dumps({"facts": facts, "rows": rows}, indent=2))
    (OUT_DIR / "documents.md").write_text(table + "\n")


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
