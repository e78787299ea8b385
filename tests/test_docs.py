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
- Every name the docs tie to a file lives in that file, not merely imported there: a
  dotted ``pagesift.mod.Name`` is defined in ``mod`` (or is in its ``__all__``, the
  module's public re-exports); a ```Name``` (``Class``, ``Class.method``,
  ``module.function``) written right before a link to a .py file, or before a
  ```path.py``` span, is defined in that file (``defined_names``). An upper-case
  ```NAME``` there may instead be a gRPC status or a string the code spells (a
  reason such as ``FENCED``). A link whose text is a path names the file it links
  (``[`replication/log.py`](…/log.py)``, not another).
- The receiver code docs/webhooks.md gives verifies what the server signs.
- Code and docs describe what is, not how it came to be: ``HISTORY_PHRASES`` may not
  appear in the project's sources or docs (CHANGELOG.md, whose job is history, and the
  generated ``pagesift.v1`` are exempt).
"""

from __future__ import annotations

import ast
import importlib
import re
import shutil
import time
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import grpc
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


# ---------------------------------------------------------------- names in their files

#: a name in a code span: ``Name``, ``Class.method``, ``module.function`` (``()`` allowed)
_NAME_SPAN = r"`(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?`"
#: what may stand between the name and its file: ", ", " (", " in ", " (in "
_NEXT_TO = r"(?:,?\s*\(?|\s+\(?in\s+)"
_NAME_BY_LINK = re.compile(_NAME_SPAN + _NEXT_TO + r"\[[^\]]*\]\((?P<target>[^()\s#]+\.py)\)")
_NAME_BY_PATH = re.compile(_NAME_SPAN + _NEXT_TO + r"`(?P<path>[^`\s]+\.py)`")
_PATH_LINK = re.compile(
    r"\[`(?P<text>[\w.-]*/[\w./-]*|[\w.-]+\.(?:py|md|toml|ya?ml|sh|json))`\]"
    r"\((?P<target>[^()\s#]+)(?:#[^)]*)?\)"
)


def _bound_in(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a block of statements defines (defs, classes, assignments, also inside
    ``if``/``try`` blocks), each with its statement; imports define nothing here."""
    found: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        found[leaf.id] = node
        elif isinstance(node, ast.If | ast.Try):
            blocks = [node.body, node.orelse]
            if isinstance(node, ast.Try):
                blocks += [node.finalbody, *(h.body for h in node.handlers)]
            for block in blocks:
                found.update(_bound_in(block))
    return found


@cache
def defined_names(path: Path) -> frozenset[str]:
    """What ``path`` defines: its top-level names, ``Class.member`` for each class's own
    members, and ``stem.name`` for the top-level names (``specs.crawl`` in specs.py)."""
    top = _bound_in(ast.parse(path.read_text(), str(path)).body)
    names = set(top) | {f"{path.stem}.{name}" for name in top}
    for name, node in top.items():
        if isinstance(node, ast.ClassDef):
            names.update(f"{name}.{member}" for member in _bound_in(node.body))
    return frozenset(names)


def _resolve_py(source: Path, written: str) -> Path | None:
    """The file a ``path.py`` written in ``source`` means: relative to the doc, to the
    repository, or the one file of the code whose path ends with it."""
    for base in (source.parent, ROOT):
        candidate = (base / written).resolve()
        if candidate.is_file():
            return candidate
    matches = [
        p
        for folder in ("shared", "primary", "standby")
        for p in (ROOT / folder).rglob("*.py")
        if p.as_posix().endswith("/" + written.lstrip("./"))
    ]
    return matches[0] if len(matches) == 1 else None


def _is_vocabulary(name: str) -> bool:
    """An upper-case word the API speaks: a gRPC status, or a string the code spells."""
    if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
        return False
    return name in grpc.StatusCode.__members__ or name in _code_words()


@cache
def _code_words() -> frozenset[str]:
    found: set[str] = set()
    for folder in ("shared", "primary", "standby"):
        for path in (ROOT / folder).rglob("*.py"):
            found.update(re.findall(r"[\"']([A-Z][A-Z0-9_]*)[\"']", path.read_text()))
    return frozenset(found)


def _joined_prose(path: Path) -> str:
    """The prose of a doc with each line break as one space (a name and its link may be
    on two lines)."""
    return re.sub(
        r"[ \t]*\n[ \t]*", " ", "\n".join(line for _, line in prose_lines(path.read_text()))
    )


def names_beside_files(path: Path) -> Iterator[tuple[str, str, Path | None]]:
    """(name, the file as written, the file) for every ```Name``` the doc ties to a .py."""
    text = _joined_prose(path)
    for m in _NAME_BY_LINK.finditer(text):
        dest = (path.parent / m.group("target")).resolve()
        yield m.group("name"), m.group("target"), dest if dest.is_file() else None
    for m in _NAME_BY_PATH.finditer(text):
        yield m.group("name"), m.group("path"), _resolve_py(path, m.group("path"))


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if ROOT in path.parents else path.name


def _defines(dest: Path, name: str) -> bool:
    """``dest`` defines ``name``; a full ``pagesift.mod.Name`` counts when ``mod`` is the
    module whose file ``dest`` is."""
    if name in defined_names(dest) or _is_vocabulary(name):
        return True
    parts = name.split(".")
    if parts[0] != "pagesift":
        return False
    for cut in range(len(parts) - 1, 1, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        file = getattr(module, "__file__", None)
        return (
            file is not None
            and Path(file).resolve() == dest
            and (".".join(parts[cut:]) in defined_names(dest))
        )
    return False


def misplaced_names(path: Path) -> list[str]:
    """Names the doc puts in a file that does not define them."""
    wrong = []
    for name, written, dest in names_beside_files(path):
        if dest is None:
            wrong.append(f"{_shown(path)}: `{name}` next to {written}: no such file")
        elif not _defines(dest, name):
            wrong.append(f"{_shown(path)}: `{name}` is not defined in {written}")
    return wrong


def dotted_misplaced(name: str) -> str | None:
    """Why a dotted ``pagesift.mod.Name...`` names a thing ``mod`` only imports, or None
    (also None for a whole module and for names ``resolves`` handles otherwise)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        break
    else:
        return None
    rest = parts[cut:]
    file = getattr(module, "__file__", None)
    if not rest or file is None or not hasattr(module, rest[0]):
        return None
    if rest[0] in getattr(module, "__all__", ()) or rest[0] in defined_names(Path(file)):
        return None
    owner = getattr(getattr(module, rest[0]), "__module__", "another module")
    return f"{module.__name__} does not define {rest[0]} (it lives in {owner})"


def path_link_mismatches(path: Path) -> list[str]:
    """Links whose text is a path that is not the end of the path they link."""
    wrong = []
    for m in _PATH_LINK.finditer(_joined_prose(path)):
        text, target = m.group("text").rstrip("/"), m.group("target")
        dest = (path.parent / target).resolve()
        if dest.exists() and not dest.as_posix().endswith("/" + text.lstrip("./")):
            wrong.append(f"{_shown(path)}: [`{m.group('text')}`] links {target}")
    return wrong


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


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_a_doc_puts_in_a_file_is_defined_there(path: Path) -> None:
    wrong = misplaced_names(path)
    wrong += sorted(
        f"{path.relative_to(ROOT)}:{n}: {name}: {why}"
        for n, name in set(cited_names(path))
        if (why := dotted_misplaced(name)) is not None
    )
    assert not wrong, "names not where the docs say:\n" + "\n".join(wrong)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_links_path_is_the_path_it_links(path: Path) -> None:
    wrong = path_link_mismatches(path)
    assert not wrong, "\n".join(wrong)


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


def test_a_name_in_the_wrong_file_is_reported(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(
        "`Store.write`\n([`store/db.py`](store/db.py)), `Store`, [`store/db.py`](store/db.py);\n"
        "`db.Store` ([`store/db.py`](store/db.py)), `FENCED` ([`store/db.py`](store/db.py)),\n"
        "`Commit.nothing` ([`store/db.py`](store/db.py)), `WriteGroup`\n"
        "([`store/db.py`](store/db.py)), `Gone` in `pagesift/core/store/db.py`,\n"
        "`pagesift.core.store.db.Store` ([`db.py`](store/db.py)),\n"
        "`Nowhere` ([`store/no.py`](store/no.py)).\n"
    )
    (tmp_path / "store").mkdir()
    shutil.copyfile(ROOT / "shared/pagesift/core/store/db.py", tmp_path / "store" / "db.py")
    found = {(name, dest) for name, _, dest in names_beside_files(doc)}
    assert ("Store.write", (tmp_path / "store" / "db.py").resolve()) in found
    assert len(found) == 9
    assert misplaced_names(doc) == [
        "page.md: `Commit.nothing` is not defined in store/db.py",
        "page.md: `WriteGroup` is not defined in store/db.py",  # db.py imports it
        "page.md: `pagesift.core.store.db.Store` is not defined in store/db.py",  # a copy
        "page.md: `Nowhere` next to store/no.py: no such file",
        "page.md: `Gone` is not defined in pagesift/core/store/db.py",
    ]


def test_a_dotted_name_a_module_only_imports_is_reported() -> None:
    assert dotted_misplaced("pagesift.core.store.db.Store") is None
    assert dotted_misplaced("pagesift.client.JobClient") is None  # in pagesift.client.__all__
    assert dotted_misplaced("pagesift.core.store") is None  # a module
    why = dotted_misplaced("pagesift.core.store.db.WriteGroup")
    assert why is not None and "pagesift.core.store.groups" in why
    db = ROOT / "shared/pagesift/core/store/db.py"
    assert _defines(db, "pagesift.core.store.db.Store")
    assert not _defines(db, "pagesift.core.store.db.WriteGroup")


def test_a_link_whose_text_names_another_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "replication").mkdir()
    (tmp_path / "replication" / "senderstate.py").write_text("")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[`replication/sender.py`](../replication/senderstate.py)\n"
        "[`replication/senderstate.py`](../replication/senderstate.py),\n"
        "[`replication/`](../replication/), [`sender.py`](../replication/senderstate.py#x)"
    )
    assert path_link_mismatches(page) == [
        "page.md: [`replication/sender.py`] links ../replication/senderstate.py",
        "page.md: [`sender.py`] links ../replication/senderstate.py",
    ]
