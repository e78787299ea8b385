"""The bounded zip reading that every zip-based format (OOXML, ODF, EPUB) shares.

Owns ``Zip``: a zip file read under caps on its member count, each member's inflated
size and the total inflated size, with every failure of a bad file turned into
``DocumentError`` (or ``DocumentTooLarge``, its reason naming the cap). The XML parse
of the parts is ``xmlparts``'s, on top of this.

Invariants:

- At most ``MAX_ZIP_MEMBERS`` members; the central directory is read once, in
  ``Zip(...)``, and a file past the cap is refused before any member is inflated.
- The size caps count the bytes actually inflated, not the sizes the headers claim:
  a lying header does not help a zip bomb. ``MAX_MEMBER_BYTES`` bounds one member,
  ``MAX_UNZIPPED_BYTES`` all the members read from one file together.
- ``chunks`` yields a member 64 KiB at a time, counted as it comes, so a large part is
  never held whole; ``read`` holds at most ``MAX_MEMBER_BYTES + 1`` bytes.
- An OLE file (legacy binary Office, and password-protected OOXML, which is an OLE
  file too), an encrypted member and a corrupt stream raise ``DocumentError``; no
  zipfile, zlib, bz2 or lzma exception escapes.
- The caps are module globals read at each check, so a test may lower them.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator

from pagesift.primary.extract.converted import DocumentError, DocumentTooLarge

__all__ = [
    "MAX_MEMBER_BYTES",
    "MAX_SLIDES",
    "MAX_UNZIPPED_BYTES",
    "MAX_ZIP_MEMBERS",
    "ZIP_MAGIC",
    "Zip",
]

MAX_ZIP_MEMBERS = 10_000
MAX_MEMBER_BYTES = 32 * 1024 * 1024
MAX_UNZIPPED_BYTES = 128 * 1024 * 1024
MAX_SLIDES = MAX_ZIP_MEMBERS  # slide ids (PPTX), sheets (XLSX), spine items (EPUB): each
# names a part of its own, and a zip has at most MAX_ZIP_MEMBERS parts
ZIP_MAGIC = b"PK\x03\x04"
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"


class Zip:
    """A zip read under caps on member count, member size and total inflated bytes."""

    def __init__(self, body: bytes, kind: str) -> None:
        if body.startswith(_OLE_MAGIC):
            raise DocumentError(f"{kind}: an encrypted (password) or legacy OLE Office file")
        try:
            self.zf = zipfile.ZipFile(io.BytesIO(body))
            infos = self.zf.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
            raise DocumentError(f"{kind}: not a readable zip file: {exc}") from exc
        if len(infos) > MAX_ZIP_MEMBERS:
            raise DocumentTooLarge(
                f"{kind}: more than {MAX_ZIP_MEMBERS} zip members (MAX_ZIP_MEMBERS)"
            )
        self.kind = kind
        self.members = {info.filename: info for info in infos}
        self.inflated = 0

    def has(self, name: str) -> bool:
        return name in self.members

    def _info(self, name: str) -> zipfile.ZipInfo:
        info = self.members.get(name)
        if info is None:
            raise DocumentError(f"{self.kind}: the part {name} is missing")
        if info.flag_bits & 0x1:
            raise DocumentError(f"{self.kind}: the part {name} is encrypted")
        if info.file_size > MAX_MEMBER_BYTES:
            raise self._past_member_cap(name)
        return info

    def _past_member_cap(self, name: str) -> DocumentTooLarge:
        return DocumentTooLarge(
            f"{self.kind}: the part {name} inflates past the size cap "
            f"(MAX_MEMBER_BYTES={MAX_MEMBER_BYTES})"
        )

    def _count(self, name: str, got: int, part_total: int) -> None:
        if part_total > MAX_MEMBER_BYTES:
            raise self._past_member_cap(name)
        self.inflated += got
        if self.inflated > MAX_UNZIPPED_BYTES:
            raise DocumentTooLarge(
                f"{self.kind}: the file inflates past the total size cap "
                f"(MAX_UNZIPPED_BYTES={MAX_UNZIPPED_BYTES})"
            )

    def _broken(self, name: str, exc: Exception) -> DocumentError:
        if isinstance(exc, (zipfile.BadZipFile, ValueError, EOFError, OSError)):
            return DocumentError(f"{self.kind}: the part {name} is unreadable: {exc}")
        if isinstance(exc, NotImplementedError):
            return DocumentError(f"{self.kind}: the part {name} is unreadable: {exc}")
        # zlib.error, bz2/lzma errors: a corrupt stream
        return DocumentError(f"{self.kind}: the part {name} is corrupt: {exc}")

    def read(self, name: str) -> bytes:
        info = self._info(name)
        try:
            with self.zf.open(info) as f:
                data = f.read(MAX_MEMBER_BYTES + 1)
        except Exception as exc:  # see _broken: every failure of a bad stream
            raise self._broken(name, exc) from exc
        self._count(name, len(data), len(data))
        return data

    def chunks(self, name: str) -> Iterator[bytes]:
        """The part's inflated bytes in chunks of 64 KiB, counted against the size caps
        as they come (never the whole part in memory)."""
        info = self._info(name)
        total = 0
        try:
            f = self.zf.open(info)
        except Exception as exc:
            raise self._broken(name, exc) from exc
        with f:
            while True:
                try:
                    chunk = f.read(1 << 16)
                except Exception as exc:
                    raise self._broken(name, exc) from exc
                if not chunk:
                    return
                total += len(chunk)
                self._count(name, len(chunk), total)
                yield chunk
