"""``pagesift export``, the ``--export``/``--jsonl`` of crawl and batch, and the one
document JSON of the CLI (issue 18, point 2).

- ``page_path``/``PathAllocator`` (pure) against hostile URLs, by example and by
  hypothesis: every path relative, inside the export directory, each component safe on
  every file system and bounded, the whole bounded, distinct pages distinct files even
  on a case-insensitive file system.
- Every field of ``Document`` set to a non-default value comes back, equal, from
  ``scrape --json``, ``status --json --full``, ``watch --json --full`` and ``export
  --jsonl`` (a small JobService serves the message; the JSON is parsed back into a
  ``Document`` and compared with it).
- A crawl of the demo site on a real in-process node, exported both ways: every page
  once, content equal to GetJob's; a resumed export equals an unbroken one.
- A batch of hostile URLs (``tests/hostile/paths.py``) exported with ``--export``: one
  file per page, all inside the directory.
"""

from __future__ import annotations

import json
import os
import string
import sys
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pagesift.cli import amain, build_parser
from pagesift.cli.exportpaths import (
    _FILE_SUFFIXES,
    _WINDOWS_DEVICES,
    MAX_COMPONENT_BYTES,
    MAX_PATH_BYTES,
    PathAllocator,
    page_path,
)
from pagesift.cli.jobview import document_dict, document_json
from pagesift.demo.site import CALENDAR_EXCLUDE, Site
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests import hostile
from tests.helpers import SiteSpec, all_documents, in_process_node
from tests.hostile import paths as hostile_paths

WINDOWS_FORBIDDEN = set('<>:"/\\|?*') | {chr(c) for c in range(32)}


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=30, slow_seconds=0.05, big_bytes=64 * 1024)


# ---------------------------------------------------------------- paths (pure)


def assert_safe(path: str, ext: str) -> None:
    """What every export path must be, on every file system."""
    assert _nbytes(path) <= MAX_PATH_BYTES, path
    assert not path.startswith("/") and "\\" not in path and "\0" not in path, path
    parts = path.split("/")
    assert parts[-1].endswith(ext), path
    for i, part in enumerate(parts):
        assert part and part not in (".", ".."), path
        assert _nbytes(part) <= MAX_COMPONENT_BYTES, path
        assert not part.startswith((".", " ")) and not part.endswith((".", " ")), path
        assert not (set(part) & WINDOWS_FORBIDDEN), path
        assert not any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in part), path
        assert part.split(".")[0].rstrip(" ").casefold() not in _WINDOWS_DEVICES, path
        if i < len(parts) - 1:  # a directory never looks like a file of the export
            assert not part.casefold().endswith(_FILE_SUFFIXES), path
    # and it stays inside any directory it is joined to
    root = Path("/x/export")
    assert os.path.normpath(root.joinpath(*parts)).startswith(str(root) + os.sep)


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8080/", "127.0.0.1_8080/index.md"),
        ("http://h/docs/intro", "h/docs/intro.md"),
        ("http://h/../../etc/passwd", "h/%2E%2E/%2E%2E/etc/passwd.md"),
        ("http://h/%2e%2e/%2E%2E/x", "h/%2E%2E/%2E%2E/x.md"),
        ("http://h/..%2F..%2Fetc", "h/%2E.%2F..%2Fetc.md"),
        ("http://h/..%5C..%5Cwin", "h/%2E.%5C..%5Cwin.md"),
        ("http://h/a/b?q=1&x=%2F", "h/a/b%3Fq=1&x=%252F.md"),
        ("http://h/caf%C3%A9", "h/café.md"),
        ("http://h/cafe%CC%81", "h/café.md"),  # NFD spelled NFC: the allocator separates
        ("http://h/CON", "h/%43ON.md"),
        ("http://h/nul.txt", "h/%6Eul.txt.md"),
        ("http://h/index.md/child", "h/index%2Emd/child.md"),
        ("http://h/.env", "h/%2Eenv.md"),
        ("http://h/name.", "h/name%2E.md"),
        ("http://h/%E2%80%AEgpj.exe", "h/%E2%80%AEgpj.exe.md"),
        ("http://h/a%00b", "h/a%00b.md"),
        ("http://h/%FF", "h/%25FF.md"),  # not UTF-8: kept as sent, its % escaped
        ("http://[::1]:9/x", "%3A%3A1_9/x.md"),
    ],
)
def test_page_path_maps_hostile_urls_to_safe_relative_paths(url: str, expected: str) -> None:
    assert page_path(url, ".md") == expected
    assert_safe(expected, ".md")


def test_long_and_deep_paths_are_cut_to_the_bounds_and_keep_their_url_apart() -> None:
    long_name = page_path("http://h/" + "x" * 1000, ".md")
    deep = page_path("http://h/" + "/".join(["d" * 90] * 20) + "/leaf", ".md")
    wide = page_path("http://h/" + "é" * 500 + "?" + "q" * 500, ".html")
    for path, ext in ((long_name, ".md"), (deep, ".md"), (wide, ".html")):
        assert_safe(path, ext)
        assert "~" in path.rsplit("/", 1)[1]  # cut: the URL's hash keeps it distinct
    assert page_path("http://h/" + "x" * 1001, ".md") != long_name


def test_the_allocator_gives_each_page_its_own_file_deterministically() -> None:
    urls = [
        "http://h/A",
        "http://h/a",
        "https://h/a",
        "http://h/caf%C3%A9",
        "http://h/cafe%CC%81",
        "http://h/x/",
        "http://h/x/index",
        "http://h/q?x=1",
        "http://h/q?x=2",
        "http://h/Q?X=1",
    ]
    first = [PathAllocator(".md").allocate(u) for u in [urls[0]]]
    alloc = PathAllocator(".md")
    got = [alloc.allocate(u) for u in urls]
    again = PathAllocator(".md")
    assert [again.allocate(u) for u in urls] == got  # the same order, the same paths
    assert got[0] == first[0] == "h/A.md"
    keys = {unicodedata.normalize("NFC", p.casefold()) for p in got}
    assert len(keys) == len(urls), got
    assert got[1].startswith("h/a~") and got[2].startswith("h/a~") and got[1] != got[2]
    for path in got:
        assert_safe(path, ".md")
    # resuming: paths reserved from index.jsonl push the next page on the same way
    resumed = PathAllocator(".md")
    for p in got[:5]:
        resumed.reserve(p)
    assert [resumed.allocate(u) for u in urls[5:]] == got[5:]


_segment = st.text(alphabet=st.characters(codec="utf-8"), min_size=0, max_size=80)
_escaped_segment = st.builds(
    lambda raw, pct: raw if not pct else "".join(f"%{b:02X}" for b in raw.encode("utf-8")),
    _segment,
    st.booleans(),
)
_url = st.builds(
    lambda host, segs, query, trailing: (
        f"http://{host}/"
        + "/".join(segs)
        + ("/" if trailing else "")
        + (f"?{query}" if query is not None else "")
    ),
    st.sampled_from(["h", "example.com:8443", "[::1]", "xn--caf-dma.example"]),
    st.lists(
        st.one_of(_escaped_segment, st.sampled_from(["..", ".", "%2e%2e", "CON", ""])), max_size=12
    ),
    st.one_of(st.none(), st.text(alphabet=string.printable, max_size=120)),
    st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(urls=st.lists(_url, min_size=1, max_size=12), ext=st.sampled_from([".md", ".html", ".txt"]))
# a lossy (already tagged) name taken twice: once tagged twice and past the name cap
@example(urls=["http://h/?\x80/%F0%90%80%80/.//?\x80//..//../.././"] * 3, ext=".md")
@example(urls=["http://h/" + "a" * 300] * 12, ext=".html")
def test_any_url_set_gets_safe_distinct_paths(urls: list[str], ext: str) -> None:
    alloc = PathAllocator(ext)
    got = [alloc.allocate(u) for u in urls]
    for path in got:
        assert_safe(path, ext)
    keys = [unicodedata.normalize("NFC", unicodedata.normalize("NFC", p).casefold()) for p in got]
    assert len(set(keys)) == len(keys)
    # no file is a directory of another page's path
    dirs = {k.rsplit("/", 1)[0] + "/" for k in keys}
    assert not any(k + "/" in dirs for k in keys)
    assert PurePosixPath(got[0]).parts[0] == got[0].split("/")[0]


def test_resuming_reads_what_is_kept_one_line_at_a_time(tmp_path: Path) -> None:
    import tracemalloc

    from pagesift.cli.export import ResumeError, keep_first_lines

    big = tmp_path / "job.jsonl"
    line = json.dumps({"markdown": "x" * 100_000}) + "\n"
    with big.open("w") as f:
        for _ in range(150):  # 15 MB of documents
            f.write(line)
        f.write('{"markdown": "torn')
    tracemalloc.start()
    try:
        keep_first_lines(big, 120, "job.jsonl")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, peak  # not the 12 MB kept
    assert big.stat().st_size == 120 * len(line)
    with pytest.raises(ResumeError, match="resume with --from-index 120"):
        keep_first_lines(big, 121, "job.jsonl")


# ---------------------------------------------------------------- one document JSON


def _fill(message: Message, descriptor: Descriptor, seed: int = 1) -> None:
    """Set every field of ``message`` to a non-default value (recursively)."""
    for n, field in enumerate(descriptor.fields, start=seed):
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value[f"key-{n}"] = f"value-{n}"
        elif field.is_repeated:
            for k in range(2):
                if field.message_type is not None:
                    _fill(value.add(), field.message_type, seed + 10 * k)
                else:
                    value.append(f"{field.name}-{k}")
        elif field.message_type is not None:
            _fill(value, field.message_type, seed + n)
        elif field.type == FieldDescriptor.TYPE_STRING:
            setattr(message, field.name, f"{field.name} ✓ {n}")
        elif field.type == FieldDescriptor.TYPE_BOOL:
            setattr(message, field.name, True)
        elif field.type == FieldDescriptor.TYPE_BYTES:  # JSON: base64
            setattr(message, field.name, b"\x89PNG\x00\xff" + bytes([n]))
        elif field.enum_type is not None:
            setattr(message, field.name, field.enum_type.values[-1].number)
        elif field.cpp_type in (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_INT64):
            setattr(message, field.name, 1000 + n)
        else:
            raise AssertionError(f"no filler for {field.full_name} (type {field.type})")
        if not field.is_repeated and field.has_presence:
            assert message.HasField(field.name), field.full_name


def full_document() -> jobs_pb2.Document:
    doc = jobs_pb2.Document()
    _fill(doc, jobs_pb2.Document.DESCRIPTOR)
    for field in jobs_pb2.Document.DESCRIPTOR.fields:  # every field is set
        value = getattr(doc, field.name)
        assert (len(value) > 0) if field.is_repeated else value != field.default_value
    return doc


def assert_is_the_document(got: dict[str, Any], doc: jobs_pb2.Document) -> None:
    names = [f.name for f in jobs_pb2.Document.DESCRIPTOR.fields]
    assert list(got) == names  # every field, in the proto's order
    back = json_format.ParseDict(got, jobs_pb2.Document())
    assert back == doc
    assert got["change_status"] == jobs_pb2.ChangeStatus.Name(doc.change_status)


def test_document_dict_holds_every_field_of_the_message() -> None:
    doc = full_document()
    assert_is_the_document(document_dict(doc), doc)
    assert document_json(doc, full=True) == document_dict(doc)
    empty = document_dict(jobs_pb2.Document())
    assert empty["fetched_at"] is None and empty["markdown"] == "" and empty["links"] == []
    assert empty["change_status"] == "CHANGE_STATUS_UNSPECIFIED" and empty["cache_hit"] is False


class OneDocument(jobs_pb2_grpc.JobServiceServicer):
    """Scrape, GetJob and WatchJob of one finished job ``j`` whose 3 documents are
    ``full_document()`` with their url changed."""

    def __init__(self) -> None:
        self.docs = []
        for i in range(3):
            doc = full_document()
            doc.url = f"http://h/page{i}"
            self.docs.append(doc)
        #: what the client had printed on stdout when each GetJob after the first came
        self.printed_before: dict[int, str] = {}

    async def Scrape(self, request: Any, context: Any) -> jobs_pb2.ScrapeResponse:
        return jobs_pb2.ScrapeResponse(document=self.docs[0])

    async def GetJob(self, request: Any, context: Any) -> jobs_pb2.GetJobResponse:
        getvalue = getattr(sys.stdout, "getvalue", None)  # capsys's buffer (same process)
        if request.skip and getvalue is not None:
            self.printed_before[request.skip] = getvalue()
        limit = request.limit or 2
        resp = jobs_pb2.GetJobResponse(
            id="j",
            state=jobs_pb2.JOB_STATE_COMPLETED,
            total=3,
            completed=3,
            documents=self.docs[request.skip : request.skip + limit],
        )
        if request.skip + limit < len(self.docs):
            resp.next_skip = request.skip + limit
        return resp

    async def StartBatchScrape(
        self, request: Any, context: Any
    ) -> jobs_pb2.StartBatchScrapeResponse:
        return jobs_pb2.StartBatchScrapeResponse(id="j")

    async def WatchJob(
        self, request: Any, context: Any
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        for i, doc in enumerate(self.docs):
            yield jobs_pb2.WatchJobResponse(
                document=jobs_pb2.IndexedDocument(index=i, document=doc)
            )
        yield jobs_pb2.WatchJobResponse(
            state=jobs_pb2.StateChange(state=jobs_pb2.JOB_STATE_COMPLETED, total=3, completed=3)
        )


@pytest.fixture
async def one_document() -> AsyncIterator[tuple[OneDocument, str]]:
    service = OneDocument()  # type: ignore[abstract]  # the calls the CLI makes here
    server = grpc.aio.server()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield service, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_every_document_json_of_the_cli_is_the_whole_message(
    one_document: tuple[OneDocument, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    service, address = one_document
    server = ["--server", address]
    assert await amain(["scrape", "http://h/page0", "--json", *server]) == 0
    assert_is_the_document(json.loads(capsys.readouterr().out), service.docs[0])

    for flags in (["--all"], []):
        assert await amain(["status", "j", "--json", "--full", *flags, *server]) == 0
        got = json.loads(capsys.readouterr().out)
        expected = service.docs if flags else service.docs[:2]
        assert len(got["documents"]) == len(expected)
        for d, doc in zip(got["documents"], expected, strict=True):
            assert_is_the_document(d, doc)

    assert await amain(["watch", "j", "--json", "--full", *server]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for line, doc in zip(lines[:3], service.docs, strict=True):
        assert_is_the_document(line["document"], doc)

    assert await amain(["export", "j", "--jsonl", *server]) == 0
    out = capsys.readouterr()
    lines = [json.loads(line) for line in out.out.splitlines()]
    assert len(lines) == 3
    for line, doc in zip(lines, service.docs, strict=True):
        assert_is_the_document(line, doc)
    assert "exported 3 documents" in out.err

    # the default shapes stay small
    assert await amain(["status", "j", "--json", "--all", *server]) == 0
    got = json.loads(capsys.readouterr().out)
    last = service.docs[2]
    assert got["documents"][2] == {
        "url": last.url,
        "final_url": last.final_url,
        "title": last.title,
    }
    assert got["next_skip"] is None and got["completed"] == 3
    assert await amain(["watch", "j", "--json", *server]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert set(first["document"]) == {"url", "final_url", "title"}


async def test_batch_jsonl_prints_only_the_documents_on_stdout(
    one_document: tuple[OneDocument, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    service, address = one_document
    assert await amain(["batch", "http://h/page0", "--jsonl", "--server", address]) == 0
    out = capsys.readouterr()
    lines = [json.loads(line) for line in out.out.splitlines()]
    assert len(lines) == 3  # the documents, nothing else (--jsonl implies --wait)
    for line, doc in zip(lines, service.docs, strict=True):
        assert_is_the_document(line, doc)
    assert out.err.startswith("j\n") and "j: completed" in out.err  # the id and summary
    argv = ["batch", "http://h/page0", "--export", str(tmp_path / "d"), "--json"]
    assert await amain([*argv, "--server", address]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["state"] == "completed" and got["export"]["documents"] == 3
    assert len(_index(tmp_path / "d")) == 3


@pytest.mark.parametrize("full", [[], ["--full"]])
async def test_status_all_prints_each_page_before_it_asks_for_the_next(
    full: list[str], one_document: tuple[OneDocument, str], capsys: pytest.CaptureFixture[str]
) -> None:
    service, address = one_document
    for json_flag in (["--json"], []):
        service.printed_before.clear()
        argv = ["status", "j", "--all", *json_flag, *full, "--server", address]
        assert await amain(argv) == 0
        out = capsys.readouterr().out
        # when the second page was asked for, the first page's documents were out
        before = service.printed_before[2]
        assert "http://h/page0" in before and "http://h/page1" in before
        assert "http://h/page2" not in before and "http://h/page2" in out
        if json_flag:
            assert len(json.loads(out)["documents"]) == 3


def test_status_and_watch_help_say_what_the_default_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command in ("status", "watch"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--full" in text and "url, final_url and title" in text, text


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "j"],  # neither --dir nor --jsonl
        ["export", "j", "--dir", "d", "--jsonl"],
        ["export", "j", "--dir", "d", "--out", "f"],
        ["export", "j", "--jsonl", "--json"],
        ["crawl", "http://h/", "--export", "d", "--jsonl"],
    ],
)
async def test_export_flags_that_do_not_go_together_are_usage_errors(
    argv: list[str],
    one_document: tuple[OneDocument, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, address = one_document
    monkeypatch.chdir(tmp_path)
    assert await amain([*argv, "--server", address]) == 2
    assert not (tmp_path / "d").exists()


# ---------------------------------------------------------------- the demo site, end to end


def _index(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "index.jsonl").read_text().splitlines()]


def _files(directory: Path) -> set[str]:
    return {
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and p.name != "index.jsonl"
    }


async def test_a_demo_crawl_exported_both_ways_has_every_page_once_as_getjob_gives_it(
    site: tuple[Site, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, root = site
    pages = tmp_path / "pages"
    async with in_process_node(tmp_path / "node", max_response_bytes=64 * 1024) as node:
        server = ["--server", node.address]
        argv = ["crawl", root, "--exclude", CALENDAR_EXCLUDE, "--export", str(pages), *server]
        assert await amain(argv) == 0
        out = capsys.readouterr().out.splitlines()
        job_id = out[0]
        assert out[1].startswith(f"{job_id}: completed")
        docs = await all_documents(node.stub, job_id)
        assert len(docs) >= 20

        index = _index(pages)
        assert [e["index"] for e in index] == list(range(len(docs)))
        assert [e["url"] for e in index] == [d.url for d in docs]
        assert len({e["url"] for e in index}) == len(docs)  # every page once
        for entry, doc in zip(index, docs, strict=True):
            assert (entry["final_url"], entry["title"], entry["status"]) == (
                doc.final_url,
                doc.title,
                doc.status_code,
            )
            assert (pages / entry["path"]).read_text(encoding="utf-8") == doc.markdown
            assert_safe(entry["path"], ".md")
        assert _files(pages) == {e["path"] for e in index}
        assert any(e["path"].endswith("/index.md") for e in index)

        # JSON Lines to a file, in small pages (the export pages through GetJob)
        jsonl = tmp_path / "job.jsonl"
        argv = ["export", job_id, "--jsonl", "--out", str(jsonl), "--page-size", "7", *server]
        assert await amain(argv) == 0
        assert capsys.readouterr().out.startswith(f"exported {len(docs)} documents of {job_id}")
        lines = jsonl.read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == [document_dict(d) for d in docs]

        # resumed after a crash: the first 9 documents kept (a torn 10th line dropped)
        full_index = (pages / "index.jsonl").read_bytes()
        before = {p: (pages / p).read_bytes() for p in _files(pages)}
        head = b"".join(full_index.splitlines(keepends=True)[:9])
        (pages / "index.jsonl").write_bytes(head + b'{"index": 9, "url": "ht')
        for entry in index[9:]:
            (pages / entry["path"]).unlink()
        argv = ["export", job_id, "--dir", str(pages), "--from-index", "9", "--json", *server]
        assert await amain(argv) == 0
        summary = json.loads(capsys.readouterr().out)
        assert (summary["from_index"], summary["next_index"]) == (9, len(docs))
        assert (pages / "index.jsonl").read_bytes() == full_index
        assert {p: (pages / p).read_bytes() for p in _files(pages)} == before

        jsonl.write_text("\n".join(lines[:4]) + "\n" + lines[4][:10], encoding="utf-8")
        argv = ["export", job_id, "--jsonl", "--out", str(jsonl), "--from-index", "4", *server]
        assert await amain(argv) == 0
        assert jsonl.read_text(encoding="utf-8").splitlines() == lines

        # a resume past what is there is refused, and says where to resume
        argv = ["export", job_id, "--dir", str(tmp_path / "empty"), "--from-index", "5", *server]
        assert await amain(argv) == 2
        assert "resume with --from-index 0" in capsys.readouterr().err


async def test_hostile_urls_land_inside_the_export_directory_one_file_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner, root = await hostile.serve(hostile_paths.ROUTES)
    out = tmp_path / "out"
    try:
        async with in_process_node(tmp_path / "node") as node:
            urls = [root + rel for rel in hostile_paths.HOSTILE]
            argv = [
                "batch",
                *urls,
                "--export",
                str(out),
                "--format",
                "html",
                "--server",
                node.address,
            ]
            assert await amain(argv) == 0, capsys.readouterr()
            job_id = capsys.readouterr().out.splitlines()[0]
            docs = await all_documents(node.stub, job_id)
    finally:
        await runner.cleanup()
    assert len(docs) == len(urls)  # every hostile page was fetched and exported
    index = _index(out)
    assert [e["url"] for e in index] == [d.url for d in docs]
    files = _files(out)
    assert files == {e["path"] for e in index}  # one file per page, no other
    assert len({unicodedata.normalize("NFC", f).casefold() for f in files}) == len(docs)
    real_out = out.resolve()
    for path in out.rglob("*"):
        assert path.resolve().is_relative_to(real_out), path
    for entry, doc in zip(index, docs, strict=True):
        assert_safe(entry["path"], ".html")
        assert (out / entry["path"]).read_text(encoding="utf-8") == doc.html
    assert not (tmp_path / "etc").exists() and not (out.parent / "passwd").exists()
