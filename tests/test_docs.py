"""The docs stay true: their links resolve, the names they cite exist, no history talk.

- Every relative link in README.md, CHANGELOG.md and docs/*.md names a file or folder of
  the repository, and its ``#anchor`` (if any) is a heading of the target as GitHub
  renders it (``github_slugs``: lower case, punctuation dropped, spaces to hyphens, a
  repeated heading numbered).
- Every dotted ``pagesift.…`` name written in README.md and docs/*.md resolves: a module
  that imports, an attribute of one, a protobuf name of ``pagesift.v1`` (services and
  messages), or a string the code spells (``"pagesift.replica"``, a health service; a
  logger; a span attribute). A refactor that moves a name fails here until the docs
  follow. CHANGELOG.md names old paths on purpose and is left out of this check.
- The receiver code docs/webhooks.md gives verifies what the server signs.
- Code and docs describe what is, not how it came to be: ``HISTORY_PHRASES`` may not
  appear in the project's sources or docs (CHANGELOG.md, whose job is history, and the
  generated ``pagesift.v1`` are exempt).
"""

from __future__ import annotations

import ast
import importlib
import re
import time
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = [*DOCS, ROOT / "CHANGELOG.md"]
THIS = Path(__file__).resolve()
#: where code and docs live (generated code, virtualenvs and caches are skipped)
SCANNED = ["shared", "primary", "standby", "tests", "bench", "deploy", "docs", "README.md"]
SKIPPED_PARTS = {"v1", "__pycache__", ".venv-scrapy", "node_modules", "secrets"}
SCANNED_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".service", ".sh", ".env", ""}

#: phrases that describe history instead of the code: each is specific enough that the
#: project's own present-tense text never needs it (a bare "used to" or "no longer"
#: is too broad: "the key used to sign", "the lease is no longer ours")
HISTORY_PHRASES = [
    r"\bas before\b",
    r"\bfor one (?:more )?release\b",
    r"\bkept for compatibility\b",
    r"\bused to be\b",
    r"\bpreviously\b",
    r"\b(?:until|before|since) this release\b",
    r"\bchanged default\b",
    r"\bthe old (?:way|behaviou?r)\b",
]
HISTORY = re.compile("|".join(HISTORY_PHRASES), re.IGNORECASE)

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_DOTTED = re.compile(r"(?<![\w./-])pagesift(?:\.[A-Za-z_]\w*)+")
#: a dotted word ending in one of these is a file name (``pagesift.toml``), not a name
_FILE_SUFFIXES = {"toml", "py", "md", "yaml", "yml", "json", "service", "token", "pem", "key"}


# ---------------------------------------------------------------- reading markdown


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    inside = False
    for n, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield n, line


def code_blocks(text: str) -> Iterator[tuple[str, str]]:
    """(info string, body) of every fenced code block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        info = lines[i].strip()[3:].strip()
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(m.group(1)):
            body.append(lines[i])
            i += 1
        yield info, "\n".join(body)
        i += 1


def github_slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: the rendered text in lower case, every
    character but letters, digits, ``_``, ``-`` and spaces dropped, spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_ " or cat[0] in "LN" or cat == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def github_slugs(text: str) -> set[str]:
    """Every anchor a markdown file's headings make (a repeat gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    slugs = set()
    for _, line in prose_lines(text):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        slugs.add(slug if count == 0 else f"{slug}-{count}")
    return slugs


def relative_links(path: Path) -> Iterator[tuple[int, str]]:
    """(line, target) of every link in ``path`` that is not to another site."""
    for n, line in prose_lines(path.read_text()):
        for m in _LINK.finditer(_CODE_SPAN.sub("", line)):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            yield n, target


def link_problem(source: Path, target: str) -> str | None:
    """Why ``target`` (written in ``source``) does not resolve, or None."""
    file_part, _, anchor = target.partition("#")
    dest = (source.parent / file_part).resolve() if file_part else source
    if not dest.exists():
        return f"no file {file_part}"
    if ROOT not in dest.parents and dest != ROOT:
        return f"{file_part} is outside the repository"
    if anchor:
        if dest.is_dir() or dest.suffix != ".md":
            return f"#{anchor} on a file that is not markdown"
        if anchor not in github_slugs(dest.read_text()):
            return f"no heading #{anchor} in {dest.relative_to(ROOT)}"
    return None


# ---------------------------------------------------------------- resolving names


@cache
def _code_strings() -> frozenset[str]:
    """Every ``pagesift.…`` string literal in the project's code."""
    found: set[str] = set()
    for folder in ("shared", "primary", "standby"):
        for path in (ROOT / folder).rglob("*.py"):
            if "v1" in path.parts:
                continue
            found.update(re.findall(r"[\"'](pagesift(?:\.\w+)+)", path.read_text()))
    return frozenset(found)


@cache
def _proto_pool() -> descriptor_pool.DescriptorPool:
    for name in ("jobs_pb2", "store_pb2", "replication_pb2"):
        importlib.import_module(f"pagesift.v1.{name}")
    return descriptor_pool.Default()


def _is_proto_name(name: str) -> bool:
    pool = _proto_pool()
    for find in (pool.FindServiceByName, pool.FindMessageTypeByName, pool.FindEnumTypeByName):
        try:
            find(name)
            return True
        except KeyError:
            continue
    return False


def resolves(name: str) -> bool:
    """``name`` is a module, an attribute of one, a protobuf name or a string the code
    spells (module ``pagesift.shared.client`` warns when imported: it is never cited)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: object = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            missing = e.name or ""
            if module_name != missing and not module_name.startswith(missing + "."):
                raise  # the module exists but one of its own imports is missing
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                break
            obj = getattr(obj, attr)
        else:
            return True
        break
    return _is_proto_name(name) or name in _code_strings()


def cited_names(path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every ``pagesift.…`` name in ``path``: in prose, in code
    spans and code blocks, and each name a Python block imports from such a module."""
    text = path.read_text()
    for n, line in enumerate(text.splitlines(), start=1):
        for m in _DOTTED.finditer(line):
            name = m.group(0)
            if name.rsplit(".", 1)[1] not in _FILE_SUFFIXES:
                yield n, name
    for info, body in code_blocks(text):
        if info != "python":
            continue
        for node in ast.walk(ast.parse(body)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pagesift"):
                for alias in node.names:
                    yield 0, f"{node.module}.{alias.name}"


# ---------------------------------------------------------------- the tests


def test_the_docs_exist_and_the_readme_stays_a_first_read() -> None:
    names = {p.name for p in DOCS}
    for page in ("architecture.md", "api.md", "operations.md", "configuration.md"):
        assert page in names, page
    assert {"security.md", "scaling.md"} <= names
    assert (ROOT / "CHANGELOG.md").exists()
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = [
        f"{path.relative_to(ROOT)}:{n}: {target}: {problem}"
        for n, target in relative_links(path)
        if (problem := link_problem(path, target)) is not None
    ]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_name_in_the_docs_resolves(path: Path) -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)}:{n}: {name}"
        for n, name in cited_names(path)
        if not resolves(name)
    )
    assert not missing, "names the code does not have:\n" + "\n".join(missing)


def _scanned_files() -> Iterator[Path]:
    """The files ``test_no_code_or_doc_describes_history`` reads (not this one: its
    list and its own examples name the phrases)."""
    for entry in SCANNED:
        top = ROOT / entry
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            rel = path.relative_to(ROOT)
            if not path.is_file() or SKIPPED_PARTS & set(rel.parts) or path == THIS:
                continue
            if path.suffix in SCANNED_SUFFIXES:
                yield path


def test_no_code_or_doc_describes_history() -> None:
    hits = []
    for path in _scanned_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), start=1):
            m = HISTORY.search(line)
            if m:
                hits.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r}: {line.strip()}")
    assert not hits, "history-relative phrases (say what is; history goes to CHANGELOG.md):\n" + (
        "\n".join(hits)
    )


def test_the_webhook_docs_verification_accepts_what_the_server_signs() -> None:
    """The receiver code docs/webhooks.md gives, run as written, against the server's
    own signature (``outbox.sign``): a fresh delivery passes, a changed body, an old
    timestamp or another secret does not."""
    from pagesift.primary.webhooks.outbox import sign

    text = (ROOT / "docs" / "webhooks.md").read_text()
    (code,) = [
        body for info, body in code_blocks(text) if info == "python" and "def verify" in body
    ]
    space: dict[str, object] = {}
    exec(compile(code, "docs/webhooks.md", "exec"), space)
    verify = space["verify"]
    assert callable(verify)
    secret, body = "s3cret-s3cret-s3cret", b'{"id":"j","seq":1}'
    ts = str(int(time.time()))
    assert verify(secret, ts, body, sign(secret, ts, body)) is True
    assert verify(secret, ts, body + b" ", sign(secret, ts, body)) is False
    old = str(int(time.time()) - 3600)
    assert verify(secret, old, body, sign(secret, old, body)) is False
    assert verify("another-secret-here", ts, body, sign(secret, ts, body)) is False


# ---------------------------------------------------------------- the checks can fail


def test_the_slugs_follow_githubs_rules() -> None:
    text = "# Install (clients and servers)\n## Rehearse a failover: `pagesift drill`\n"
    text += "## Notes\n## Notes\n```sh\n# not a heading\n```\n"
    assert github_slugs(text) == {
        "install-clients-and-servers",
        "rehearse-a-failover-pagesift-drill",
        "notes",
        "notes-1",
    }


def test_a_broken_link_and_a_missing_anchor_are_reported(tmp_path: Path) -> None:
    page = ROOT / "docs" / "api.md"
    assert link_problem(page, "architecture.md#data-flow-one-crawled-page") is None
    assert link_problem(page, "nowhere.md") == "no file nowhere.md"
    assert link_problem(page, "architecture.md#no-such-heading") is not None
    assert link_problem(page, "#no-such-heading") is not None
    assert link_problem(page, "../shared/pagesift/core/api/service.py") is None


def test_a_moved_name_is_reported() -> None:
    assert resolves("pagesift.client.JobClient")
    assert resolves("pagesift.v1.JobService")  # a protobuf service
    assert resolves("pagesift.replica")  # a health service name the code spells
    assert not resolves("pagesift.core.jobservice")
    assert not resolves("pagesift.client.NoSuchClient")


def test_a_history_phrase_is_caught_and_present_tense_is_not() -> None:
    assert HISTORY.search("errors are judged by their code, as before")
    assert HISTORY.search("sent alongside the details for one more release")
    assert not HISTORY.search("the key used to sign the body")
    assert not HISTORY.search("the leader key is no longer ours")
