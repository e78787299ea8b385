"""``pagesift export JOB``: a job's documents, streamed to JSON Lines or to one file per page.

Owns the ``export`` command and the ``--export DIR`` / ``--jsonl`` flags that ``crawl``
and ``batch`` take (``add_export_flags``, ``export_after_wait``). The mapping from a
page's URL to a file path is ``pagesift.cli.exportpaths``.

Layout of ``--dir DIR``::

    DIR/index.jsonl                      one line per document, in index order:
                                         {"index", "url", "final_url", "title", "status", "path"}
    DIR/<host>[_<port>]/<path...>/<name>.<ext>
                                         one file per document: markdown (.md) by default,
                                         or --format html|raw_html (.html), links|images
                                         (.txt, one URL a line), json (.json, the whole document),
                                         screenshot (.png or .jpg, the image's bytes)

``--jsonl`` writes one line per document: the document's JSON as ``document_dict``
gives it (every field of the message), to stdout or ``--out FILE``.

Guarantees:

- Streaming: documents come one ``GetJob`` page at a time (``skip``/``next_skip``; the
  server caps a page by count and size) and each is written before the next page is
  asked for, so the process holds one page, never the job. What grows with the job is
  the set of paths already used (a short string per page) for ``--dir``.
- Every document once, in index order; ``index.jsonl``'s ``index`` is the document's
  index in the job.
- Resumable: ``--from-index N`` keeps what a previous export wrote for documents
  ``0..N-1`` (the first N lines of ``index.jsonl`` or of ``--out FILE``, an incomplete
  last line dropped) and continues with document N. Paths are allocated in index order
  by a deterministic rule, so a resumed export gives every page the path an unbroken
  one would have. Files are written to a temporary name and renamed, so a crash never
  leaves half a page under a page's name.
- Safe paths, and distinct ones for colliding URLs: ``exportpaths`` (pure).

Progress goes to stderr: a bar when stderr is a terminal, else a line every
``PROGRESS_EVERY`` seconds; stdout keeps the JSON Lines (or the summary).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from pagesift.cli.args import client_parent, nonneg_int
from pagesift.cli.common import EXIT_OK, dump, fail
from pagesift.cli.exportpaths import EXTENSIONS, IMAGE_EXTENSIONS, PathAllocator
from pagesift.cli.jobview import document_dict, state_name
from pagesift.cli.progress import TERMINAL_STATES, page_bar
from pagesift.client import ClientError, JobClient
from pagesift.v1 import jobs_pb2

__all__ = [
    "ExportResult",
    "add_export_command",
    "add_export_flags",
    "export_after_wait",
    "export_job",
    "page_content",
]

INDEX_NAME = "index.jsonl"
_TMP_NAME = ".export-tmp"  # no page component starts with "." (it is escaped)
PROGRESS_EVERY = 10.0


# ---------------------------------------------------------------- what a file holds


def page_content(doc: jobs_pb2.Document, fmt: str) -> str:
    """What ``--format fmt`` writes for ``doc``."""
    if fmt in ("links", "images"):
        urls = list(doc.links if fmt == "links" else doc.images)
        return "".join(f"{u}\n" for u in urls)
    if fmt == "json":
        return json.dumps(document_dict(doc), ensure_ascii=False) + "\n"
    text: str = getattr(doc, fmt)
    return text


def page_bytes(doc: jobs_pb2.Document, fmt: str) -> bytes:
    """The bytes ``--dir`` writes for ``doc``: the screenshot's image, or the text."""
    if fmt == "screenshot":
        return doc.screenshot.data
    return page_content(doc, fmt).encode("utf-8", "surrogatepass")


def index_entry(index: int, doc: jobs_pb2.Document, path: str) -> dict[str, Any]:
    return {
        "index": index,
        "url": doc.url,
        "final_url": doc.final_url,
        "title": doc.title,
        "status": doc.status_code,
        "path": path,
    }


# ---------------------------------------------------------------- resuming


class ResumeError(ValueError):
    """``--from-index N`` names more documents than the previous export wrote."""


def _complete_lines(f: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """(end offset, line) of each newline-terminated line of ``f``."""
    offset = 0
    for line in f:
        if not line.endswith(b"\n"):
            return  # a line cut short by a crash
        offset += len(line)
        yield offset, line


def keep_first_lines(
    path: Path, count: int, what: str, each: Callable[[int, bytes], None] | None = None
) -> None:
    """Truncate ``path`` after its first ``count`` complete lines, calling ``each(n,
    line)`` on each of them as it is read (one line in memory at a time: a JSON Lines
    file of whole documents can be large); ``count`` 0 empties (or creates) it."""
    if count == 0:
        path.write_bytes(b"")
        return
    seen = end = 0
    try:
        with path.open("rb") as f:
            for offset, line in _complete_lines(f):
                if each is not None:
                    each(seen, line)
                seen, end = seen + 1, offset
                if seen == count:
                    break
    except FileNotFoundError:
        pass
    if seen < count:
        raise ResumeError(
            f"{what} holds {seen} complete documents, not {count}: resume with --from-index {seen}"
        )
    os.truncate(path, end)


# ---------------------------------------------------------------- sinks


class Sink(Protocol):
    #: the index of the next document to write (what ``--from-index`` resumes from)
    next_index: int

    def write(self, index: int, doc: jobs_pb2.Document) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """One ``document_dict`` per line, to a stream (stdout, or ``--out FILE`` opened
    for appending after ``keep_first_lines``)."""

    def __init__(self, stream: IO[str], from_index: int, *, owned: bool) -> None:
        self.stream = stream
        self.owned = owned
        self.next_index = from_index

    def write(self, index: int, doc: jobs_pb2.Document) -> None:
        self.stream.write(json.dumps(document_dict(doc), ensure_ascii=False) + "\n")
        self.next_index = index + 1

    def close(self) -> None:
        self.stream.flush()
        if self.owned:
            self.stream.close()


class DirSink:
    """One file per document under ``root`` and a line in ``root/index.jsonl``."""

    def __init__(self, root: Path, fmt: str, from_index: int) -> None:
        self.root = root
        self.fmt = fmt
        self.next_index = from_index
        self.allocator = PathAllocator(EXTENSIONS[fmt])
        # a JPEG screenshot is a .jpg; one set of taken paths for both extensions
        self.jpeg = PathAllocator(IMAGE_EXTENSIONS["image/jpeg"], self.allocator.taken)
        self.empty = 0
        root.mkdir(parents=True, exist_ok=True)
        self._root_real = os.path.realpath(root)
        index = root / INDEX_NAME

        def reserve(n: int, line: bytes) -> None:
            entry = json.loads(line)
            if entry.get("index") != n or not isinstance(entry.get("path"), str):
                raise ResumeError(f"{index}: line {n + 1} is not document {n}'s entry")
            self.allocator.reserve(entry["path"])

        keep_first_lines(index, from_index, str(index), reserve)
        self.index = index.open("a", encoding="utf-8")

    def write(self, index: int, doc: jobs_pb2.Document) -> None:
        jpeg = self.fmt == "screenshot" and doc.screenshot.content_type == "image/jpeg"
        rel = (self.jpeg if jpeg else self.allocator).allocate(doc.url)
        target = self.root.joinpath(*rel.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        real = os.path.realpath(target.parent)
        if os.path.commonpath([real, self._root_real]) != self._root_real:
            raise OSError(f"{target}: outside {self.root} (a symbolic link in it?)")
        content = page_bytes(doc, self.fmt)
        if not content:
            self.empty += 1
        tmp = self.root / _TMP_NAME
        tmp.write_bytes(content)
        os.replace(tmp, target)
        self.index.write(json.dumps(index_entry(index, doc, rel), ensure_ascii=False) + "\n")
        self.next_index = index + 1

    def close(self) -> None:
        self.index.close()


# ---------------------------------------------------------------- the export


@dataclass
class ExportResult:
    job_id: str
    from_index: int
    next_index: int
    state: jobs_pb2.JobState.ValueType

    @property
    def documents(self) -> int:
        return self.next_index - self.from_index

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.job_id,
            "state": state_name(self.state),
            "from_index": self.from_index,
            "next_index": self.next_index,
            "documents": self.documents,
        }


Report = Callable[[int, int], None]


async def export_job(
    client: JobClient,
    job_id: str,
    sink: Sink,
    *,
    from_index: int = 0,
    page_size: int = 0,
    report: Report | None = None,
) -> ExportResult:
    """Write the job's documents from ``from_index`` to ``sink``, one GetJob page at a
    time; ``report(next_index, completed)`` after each page."""
    skip = from_index
    state: jobs_pb2.JobState.ValueType = jobs_pb2.JOB_STATE_UNSPECIFIED
    while True:
        page = await client.get_job(job_id, skip=skip, limit=page_size)
        state = page.state
        for offset, doc in enumerate(page.documents):
            sink.write(skip + offset, doc)
        end = skip + len(page.documents)
        if report is not None:
            report(end, int(page.completed))
        if not page.HasField("next_skip"):
            return ExportResult(job_id, from_index, end, state)
        if page.next_skip != end:
            raise ClientError(f"next_skip {page.next_skip} after documents {skip}..{end - 1}")
        skip = page.next_skip
        del page  # one page at a time


class _Progress:
    """The export's progress on stderr: a bar on a terminal, else a line now and then."""

    def __init__(self, job_id: str, from_index: int) -> None:
        self.job_id = job_id
        self.tty = sys.stderr.isatty()
        self.bar = page_bar(f"export {job_id[:8]}") if self.tty else None
        self.task = self.bar.add_task("", total=None) if self.bar is not None else None
        self.last = time.monotonic()
        self.from_index = from_index

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=done, total=max(total, done) or None)
            return
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY:
            self.last = now
            print(f"export {self.job_id}: {done}/{max(total, done)} documents", file=sys.stderr)


@dataclass(frozen=True)
class ExportTarget:
    """Where an export goes: ``--dir`` (with ``fmt``), or JSON Lines to ``out`` (None:
    stdout)."""

    directory: Path | None
    fmt: str
    out: Path | None

    @property
    def to_stdout(self) -> bool:
        return self.directory is None and self.out is None

    def open(self, from_index: int) -> Sink:
        if self.directory is not None:
            return DirSink(self.directory, self.fmt, from_index)
        if self.out is None:
            return JsonlSink(sys.stdout, from_index, owned=False)
        keep_first_lines(self.out, from_index, str(self.out))
        return JsonlSink(self.out.open("a", encoding="utf-8"), from_index, owned=True)

    def describe(self) -> str:
        if self.directory is not None:
            return f"{self.directory}/ ({self.fmt}, {INDEX_NAME})"
        return str(self.out) if self.out is not None else "stdout"


async def run_export(
    client: JobClient, job_id: str, target: ExportTarget, *, from_index: int, page_size: int = 0
) -> ExportResult | int:
    """Export with progress on stderr; the result, or an exit status after a usage
    error (a resume that does not fit what is there)."""
    try:
        sink = target.open(from_index)
    except ResumeError as err:
        return fail(str(err))
    try:
        with _Progress(job_id, from_index) as progress:
            result = await export_job(
                client, job_id, sink, from_index=from_index, page_size=page_size, report=progress
            )
    except BrokenPipeError:  # the reader went away (| head): nothing to resume
        raise
    except BaseException:
        done = sink.next_index - from_index
        written = f"documents {from_index}..{sink.next_index - 1} are" if done else "nothing"
        print(
            f"export of {job_id} stopped: {written} written; "
            f"resume with --from-index {sink.next_index}",
            file=sys.stderr,
        )
        raise
    finally:
        sink.close()
    if isinstance(sink, DirSink) and sink.empty:
        print(
            f"note: {sink.empty} documents had no {target.fmt} (the job did not ask for "
            f"that format: crawl with --format {target.fmt})",
            file=sys.stderr,
        )
    if result.state not in TERMINAL_STATES:
        print(
            f"note: job {job_id} is {state_name(result.state)}; more documents may come "
            f"(resume with --from-index {result.next_index})",
            file=sys.stderr,
        )
    return result


def _summary(result: ExportResult, target: ExportTarget) -> str:
    span = (
        f" ({result.from_index}..{result.next_index - 1})"
        if result.documents
        else f" (from {result.from_index})"
    )
    return f"exported {result.documents} documents of {result.job_id}{span} to {target.describe()}"


# ---------------------------------------------------------------- commands


def _target(args: argparse.Namespace, directory: Path | None, fmt: str) -> ExportTarget | int:
    out: Path | None = args.out
    if directory is None and not args.jsonl:
        return fail("give --dir DIR (one file per page) or --jsonl")
    if directory is not None and args.jsonl:
        return fail("--dir and --jsonl go to different places: give one")
    if out is not None and not args.jsonl:
        return fail("--out FILE goes with --jsonl")
    if args.jsonl and out is None and args.json:
        return fail("--jsonl to stdout and --json both print on stdout: add --out FILE")
    return ExportTarget(directory, fmt, out)


async def _cmd_export(args: argparse.Namespace, client: JobClient) -> int:
    target = _target(args, args.dir, args.file_format)
    if isinstance(target, int):
        return target
    result = await run_export(
        client, args.job, target, from_index=args.from_index, page_size=args.page_size
    )
    if isinstance(result, int):
        return result
    if args.json:
        dump({**result.as_json(), "to": target.describe()})
    elif target.to_stdout:
        print(_summary(result, target), file=sys.stderr)
    else:
        print(_summary(result, target))
    return EXIT_OK


def add_export_command(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        parents=[client_parent()],
        help="write a job's documents to files or JSON Lines",
        description="Stream a job's documents, one GetJob page at a time: --jsonl (every "
        "field of each document, one JSON object a line) or --dir DIR (one file per page "
        "at a path derived from its URL, and DIR/index.jsonl).",
    )
    p.add_argument("job")
    p.add_argument("--dir", type=Path, metavar="DIR", help="one file per page, and index.jsonl")
    p.add_argument(
        "--format",
        dest="file_format",
        choices=list(EXTENSIONS),
        default="markdown",
        help="with --dir: what each file holds (default markdown; json: the whole document)",
    )
    p.add_argument("--jsonl", action="store_true", help="one document's JSON a line")
    p.add_argument("--out", type=Path, metavar="FILE", help="with --jsonl: this file, not stdout")
    p.add_argument(
        "--from-index",
        type=nonneg_int,
        default=0,
        metavar="N",
        help="resume: keep what an earlier export wrote for documents 0..N-1, go on from N",
    )
    p.add_argument(
        "--page-size", type=nonneg_int, default=0, metavar="N", help="documents per GetJob call"
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(handler=_cmd_export, uses_client=True)


def add_export_flags(p: argparse.ArgumentParser) -> None:
    """``crawl``/``batch``: export the job once ``--wait`` ends (either flag implies it)."""
    p.add_argument(
        "--export",
        type=Path,
        metavar="DIR",
        help="then write one file per page under DIR (the first --format; implies --wait)",
    )
    p.add_argument(
        "--jsonl",
        action="store_true",
        help="then print every document as JSON Lines on stdout (implies --wait)",
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="with --jsonl: this file, not stdout")


def export_requested(args: argparse.Namespace) -> ExportTarget | int | None:
    """The export ``crawl``/``batch`` were asked for (None: none), or a usage error."""
    if args.export is None and not args.jsonl and args.out is None:
        return None
    formats = [f.strip() for v in (args.format or []) for f in v.split(",") if f.strip()]
    fmt = next((f for f in formats if f in EXTENSIONS), "markdown")
    return _target(args, args.export, fmt)


async def export_after_wait(
    args: argparse.Namespace, client: JobClient, job_id: str, target: ExportTarget
) -> dict[str, Any] | int:
    """Export a waited-for job; the summary for its ``--json`` object, or an exit status."""
    result = await run_export(client, job_id, target, from_index=0)
    if isinstance(result, int):
        return result
    if not args.json:
        print(_summary(result, target), file=sys.stderr if target.to_stdout else sys.stdout)
    return {**result.as_json(), "to": target.describe()}
