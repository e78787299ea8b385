"""Where ``pagesift export --dir`` puts a page: a safe relative path per URL, pure.

Safe paths (``page_path``): every component comes from the URL through one escape
(``%XX`` for ``% < > : " / \\ | ? *``, control and format characters, a leading
``.``/space and a trailing ``.``/space), so no component is ``.``, ``..``, empty,
hidden, or names a Windows device (CON, NUL, COM1, ...: its first letter is escaped);
the path is relative, each component at most ``MAX_COMPONENT_BYTES`` and the whole at
most ``MAX_PATH_BYTES`` UTF-8 bytes (longer ones are cut and carry a hash of the URL).
Percent-escapes in the URL's path are decoded (UTF-8, then NFC) so non-ASCII names read
as they are; ``%2F`` never makes a directory, ``%2e%2e`` is a plain name. The query
stays part of the file name (``search%3Fq=a.md``), so query variants are distinct
files. A file name always ends with the export's extension and a directory name never
ends with one, so a file never meets a directory of its name.

Collisions (``PathAllocator``): two URLs whose paths are equal when case-folded (``/A``
and ``/a`` on a case-insensitive file system, ``http`` and ``https``, ``/a/`` and
``/a/index``) get distinct files: the later one, in index order, gets ``~<hash of its
URL>`` (then ``-2``, ``-3``, ... should that be taken too) before the extension. The
rule is deterministic, so a resumed export gives every page the path an unbroken one
would have.

Nothing here touches the file system: ``pagesift.cli.export`` writes the files.
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

#: the file formats of ``--dir`` and their extensions
EXTENSIONS: dict[str, str] = {
    "markdown": ".md",
    "html": ".html",
    "raw_html": ".html",
    "links": ".txt",
    "images": ".txt",
    "json": ".json",
    "screenshot": ".png",  # .jpg for a JPEG screenshot (IMAGE_EXTENSIONS)
}
#: a screenshot's extension by its content type (``screenshot``'s files)
IMAGE_EXTENSIONS: dict[str, str] = {"image/png": ".png", "image/jpeg": ".jpg"}
#: a directory name never ends with one of these (case-folded), so no file meets a
#: directory of its own name; .jsonl: DIR/index.jsonl
_FILE_SUFFIXES = (*sorted({*EXTENSIONS.values(), *IMAGE_EXTENSIONS.values()}), ".jsonl")
MAX_COMPONENT_BYTES = 100  # ext4/xfs allow 255 bytes, NTFS 255 UTF-16 units
MAX_PATH_BYTES = 240  # below Windows' 260 (MAX_PATH) with a short --dir
_HASH_CHARS = 12
#: room kept in a name and a path for what ``PathAllocator`` may add: ``~<hash>-N``
#: (N below 10**10: more pages than any job holds)
_RESERVE = 1 + _HASH_CHARS + 11
_UNSAFE = frozenset('%<>:"/\\|?*')
_WINDOWS_DEVICES = frozenset(
    ["con", "prn", "aux", "nul", "conin$", "conout$"]
    + [f"{p}{n}" for p in ("com", "lpt") for n in ("0123456789¹²³")]
)


def _escaped(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))


def _needs_escape(ch: str) -> bool:
    # Cc: controls; Cf: format (bidi overrides, zero-width); Cs: lone surrogates;
    # Zl/Zp: line and paragraph separators
    return ch in _UNSAFE or unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp")


def _tokens(text: str, *, directory: bool = False) -> list[str]:
    """``text`` as a safe file-name component, one token per character (a character
    or its ``%XX`` escapes), so that truncation never cuts an escape in two."""
    out = [_escaped(ch) if _needs_escape(ch) else ch for ch in text]
    if not out:
        return out
    if out[0] in (".", " "):
        out[0] = _escaped(out[0])
    if out[-1] in (".", " "):
        out[-1] = _escaped(out[-1])
    stem = "".join(out).split(".", 1)[0].rstrip(" ").casefold()
    if stem in _WINDOWS_DEVICES:
        out[0] = _escaped(out[0])
    if directory and "".join(out).casefold().endswith(_FILE_SUFFIXES):
        dot = len(out) - 1 - out[::-1].index(".")
        out[dot] = _escaped(".")
    return out


def _cut(tokens: list[str], limit: int, *, directory: bool = False) -> tuple[str, bool]:
    """The tokens joined, at most ``limit`` UTF-8 bytes; True when some were dropped.
    A cut name loses its trailing dots and spaces (and, for a directory, the end of a
    file suffix it now ends with), so that the cut keeps ``_tokens``' rules."""
    size, kept = 0, list[str]()
    for tok in tokens:
        size += len(tok.encode("utf-8", "surrogatepass"))
        if size > limit:
            break
        kept.append(tok)
    else:
        return "".join(kept), False
    while kept and (
        kept[-1] in (".", " ") or (directory and "".join(kept).casefold().endswith(_FILE_SUFFIXES))
    ):
        kept.pop()
    return "".join(kept) or "_", True


def _decoded(segment: str) -> str:
    """A path segment with its %-escapes decoded (UTF-8, NFC); as it is if they are not
    UTF-8 (its ``%`` is then escaped like any other)."""
    try:
        text = unquote(segment, errors="strict")
    except UnicodeDecodeError:
        text = segment
    return unicodedata.normalize("NFC", text)


def url_hash(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def page_path(url: str, ext: str) -> str:
    """The relative POSIX path of ``url``'s file (``ext`` like ``.md``), before
    collisions are resolved (``PathAllocator``). See the module docstring."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # not a number: the netloc as it is, escaped
        port = None
    host = (parts.hostname or parts.netloc) + (f"_{port}" if port else "")
    host_name, lossy = _cut(
        _tokens(host or "_", directory=True), MAX_COMPONENT_BYTES, directory=True
    )
    segments = parts.path.split("/")
    leaf_raw = segments.pop() if segments else ""
    dirs: list[str] = []
    for seg in segments:
        if not seg:
            continue  # the leading "/" and "//"
        name, cut = _cut(
            _tokens(_decoded(seg), directory=True), MAX_COMPONENT_BYTES, directory=True
        )
        lossy |= cut
        dirs.append(name)
    leaf = _decoded(leaf_raw) or "index"
    if parts.query:
        leaf += "?" + parts.query  # kept as sent: decoding would merge q=a%26b and q=a&b
    room = MAX_COMPONENT_BYTES - _nbytes(ext) - _RESERVE
    name, cut = _cut(_tokens(leaf), room)
    lossy |= cut
    tag = "~" + url_hash(url)

    def fits(folders: list[str], leaf_name: str) -> bool:
        path = "/".join([host_name, *folders, leaf_name + ext])
        return _nbytes(path) + _RESERVE <= MAX_PATH_BYTES

    if not fits(dirs, name + (tag if lossy else "")):
        lossy = True
        kept: list[str] = []
        for d in dirs:
            if not fits([*kept, d], name + tag):
                break
            kept.append(d)
        dirs = kept
    if lossy:
        name += tag
    return "/".join([host_name, *dirs, name + ext])


def _key(path: str) -> str:
    """Two paths a case-insensitive (or normalising) file system takes for one."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", path).casefold())


@dataclass
class PathAllocator:
    """Gives each page its own path, in index order: ``page_path``, or, when that is
    taken (compared case-folded), ``~<url hash>`` then ``-2``, ``-3``, ... added."""

    ext: str
    taken: set[str] = field(default_factory=set)

    def reserve(self, path: str) -> None:
        self.taken.add(_key(path))

    def allocate(self, url: str) -> str:
        path = page_path(url, self.ext)
        stem = path.removesuffix(self.ext)
        tag = "~" + url_hash(url)
        tagged = stem if stem.endswith(tag) else stem + tag  # page_path tags a lossy name
        for candidate in (path, tagged + self.ext):
            if _key(candidate) not in self.taken:
                self.reserve(candidate)
                return candidate
        n = 2
        while _key(f"{tagged}-{n}{self.ext}") in self.taken:
            n += 1
        chosen = f"{tagged}-{n}{self.ext}"
        self.reserve(chosen)
        return chosen
