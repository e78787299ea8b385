"""Accounts: who is calling, what they may do, and who is an administrator.

What it owns
------------
The API keys and per-account limits read from a TOML file (``--accounts FILE``), the
admin key, and the mapping from a call's metadata (``authorization: Bearer KEY``) to
an ``Account``. Nothing here touches the store: accounts are configuration, and both
nodes of a pair must be given the same file (the standby needs the same keys to
serve reads, and the same webhook secrets to sign deliveries after a promotion).

The file::

    [admin]
    key_sha256 = "<hex sha256 of the admin key>"    # or a list, to rotate

    [[account]]
    name = "acme"                                    # [A-Za-z0-9][A-Za-z0-9._-]{0,63}
    key_sha256 = "<hex sha256 of the API key>"       # or a list, to rotate
    # key = "plain text"                             # local demos only (a warning is logged)
    max_concurrent_jobs = 4                          # every limit is optional: absent = unlimited
    pages_per_day = 50000
    max_batch_urls = 1000
    max_crawl_limit = 10000
    max_concurrent_streams = 16                      # open WatchJob streams (absent: the
                                                     # server's max_concurrent_streams)
    webhook_secret = "<random string>"               # signs this account's webhooks
    allow_ignore_robots = false                      # may set options.ignore_robots_txt
    allow_proxy_url = false                          # may set options.proxy_url (own proxy)
    allow_execute_javascript = false                 # may send execute_javascript actions
    max_browser_pages = 2                            # pages this account renders at once
    allow_model = false                              # may use the model formats (json,
                                                     # summary, extract, crawl prompts)
    model_tokens_per_day = 200000                    # model tokens (in + out) a rolling day

    [anonymous]                                      # only without [[account]] tables:
    pages_per_day = 1000                             # limits and webhook secret of the
    webhook_secret = "..."                           # single anonymous account

Without a file, or with a file without ``[[account]]`` tables, there is a single
account named ``anonymous`` that every call maps to (``Accounts.warnings`` says so
loudly; the server logs it at start-up).

Guarantees
----------
- A key is never kept in plain text: only its SHA-256 is held (a plain ``key`` from
  the file is hashed at load time).
- ``authenticate`` hashes the presented key once and compares it with EVERY
  configured hash using ``hmac.compare_digest`` without stopping at a match, so the
  time taken reveals neither which account matched nor how much of a hash did.
- A malformed file is refused as a whole (``AccountsError`` naming the table and
  field), never half-loaded: duplicate names or key hashes, unknown fields, limits
  that are not positive integers.
- Admin calls: with an ``[admin]`` key, ``is_admin`` is true only for that key. With
  no ``[admin]`` table, admin calls are OPEN in anonymous mode (local demos) and
  REFUSED in accounts mode; both cases are announced in ``warnings``. Open mode covers
  the read-only calls only: the server asks ``carries_admin_key`` (or the pair's
  replication token) for ``Promote``, which changes a node's role.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import re
import secrets
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ANONYMOUS",
    "LIMIT_FIELDS",
    "PERMISSION_FIELDS",
    "Account",
    "Accounts",
    "AccountsError",
    "NewKey",
    "Unauthenticated",
    "bearer_token",
    "hash_key",
    "new_key",
]

ANONYMOUS = "anonymous"
AUTH_HEADER = "authorization"
LIMIT_FIELDS = (
    "max_concurrent_jobs",
    "pages_per_day",
    "max_batch_urls",
    "max_crawl_limit",
    "max_concurrent_streams",
    "max_browser_pages",
    "model_tokens_per_day",
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
PERMISSION_FIELDS = (
    "allow_ignore_robots",
    "allow_proxy_url",
    "allow_execute_javascript",
    "allow_model",
)
_ACCOUNT_FIELDS = {"name", "key_sha256", "key", "webhook_secret", *LIMIT_FIELDS, *PERMISSION_FIELDS}
_ANONYMOUS_FIELDS = {"webhook_secret", *LIMIT_FIELDS, *PERMISSION_FIELDS}
_ADMIN_FIELDS = {"key_sha256", "key"}
_TOP_LEVEL = {"account", "admin", "anonymous"}

Metadata = Sequence[tuple[str, str | bytes]] | None


class AccountsError(ValueError):
    """The accounts file is malformed; the message names the table and field."""


class Unauthenticated(Exception):
    """No API key, or one no account has; maps to gRPC UNAUTHENTICATED."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Account:
    """One caller. Each limit is None when unlimited (``max_concurrent_streams``: None
    means the server's default cap, see ``pagesift.core.api.streams``)."""

    name: str
    max_concurrent_jobs: int | None = None
    pages_per_day: int | None = None
    max_batch_urls: int | None = None
    max_crawl_limit: int | None = None
    max_concurrent_streams: int | None = None
    # rendered pages in flight at once (None: the server's max_browser_pages, shared)
    max_browser_pages: int | None = None
    # model tokens (input and output) charged in the rolling day, as pages are
    model_tokens_per_day: int | None = None
    webhook_secret: str = ""
    # Permissions (all off unless the accounts file grants them): ignoring robots.txt,
    # sending the account's requests through a proxy URL of its own choosing, and
    # running its own JavaScript in rendered pages (execute_javascript actions), and
    # using the server's model endpoint (the model formats, extract, crawl prompts).
    allow_ignore_robots: bool = False
    allow_proxy_url: bool = False
    allow_execute_javascript: bool = False
    allow_model: bool = False

    def limit(self, name: str) -> int | None:
        """The value of the limit called ``name`` (one of ``LIMIT_FIELDS``)."""
        if name not in LIMIT_FIELDS:
            raise KeyError(name)
        value: int | None = getattr(self, name)
        return value


def hash_key(key: str) -> str:
    """The hex SHA-256 of an API key, as stored in the accounts file."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random API key (256 bits, URL-safe)."""
    return "psk_" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class NewKey:
    """A new account's key, its hash and a webhook secret: what ``pagesift keys new``
    (and ``python -m pagesift.core.jobs.accounts new-key``) print."""

    name: str
    key: str
    key_sha256: str
    webhook_secret: str

    @classmethod
    def make(cls, name: str) -> NewKey:
        key = new_key()
        return cls(name, key, hash_key(key), secrets.token_urlsafe(32))

    def text(self) -> str:
        """The key, its sha256, then an accounts-file snippet that holds only the hash."""
        return (
            f"key:        {self.key}\n"
            f"key_sha256: {self.key_sha256}\n"
            "\n"
            "# accounts file snippet (give the key to the caller, keep only the hash here)\n"
            "[[account]]\n"
            f'name = "{self.name}"\n'
            f'key_sha256 = "{self.key_sha256}"\n'
            f'webhook_secret = "{self.webhook_secret}"'
        )


def bearer_token(metadata: Metadata) -> str | None:
    """The token of the first ``authorization: Bearer TOKEN`` entry, or None."""
    for entry in metadata or ():
        key, value = entry[0], entry[1]
        if key.lower() != AUTH_HEADER:
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


def _compare_all(digest: bytes, hashes: Sequence[tuple[bytes, int]]) -> int | None:
    """Index attached to the matching hash; every hash is compared, match or not."""
    found: int | None = None
    for candidate, index in hashes:
        if hmac.compare_digest(digest, candidate) and found is None:
            found = index
    return found


class Accounts:
    """The loaded accounts file (or the anonymous default). Immutable once loaded."""

    def __init__(
        self,
        accounts: Sequence[Account],
        key_hashes: Sequence[tuple[str, str]],
        admin_hashes: Sequence[str],
        *,
        anonymous: Account | None = None,
        warnings: Sequence[str] = (),
    ) -> None:
        self._accounts = {a.name: a for a in accounts}
        self._by_index = list(accounts)
        index = {a.name: i for i, a in enumerate(accounts)}
        self._hashes = [(bytes.fromhex(h), index[name]) for name, h in key_hashes]
        self._admin = [(bytes.fromhex(h), 0) for h in admin_hashes]
        self._anonymous = anonymous if not accounts else None
        if not accounts and self._anonymous is None:
            self._anonymous = Account(ANONYMOUS)
        self.warnings: list[str] = list(warnings)

    # loading --------------------------------------------------------------------------
    @classmethod
    def load(cls, path: Path | None) -> Accounts:
        """Read the accounts file; ``None`` gives the single anonymous account."""
        if path is None:
            return cls(
                [],
                [],
                [],
                warnings=[_ANON_WARNING + " (no accounts file)", _OPEN_ADMIN_WARNING],
            )
        try:
            with Path(path).open("rb") as fh:
                doc = tomllib.load(fh)
        except OSError as e:
            raise AccountsError(f"{path}: cannot read: {e}") from e
        except tomllib.TOMLDecodeError as e:
            raise AccountsError(f"{path}: not valid TOML: {e}") from e
        return cls.from_dict(doc, source=str(path))

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, source: str = "accounts") -> Accounts:
        """Build from a parsed TOML document (``load`` without the file)."""
        warnings: list[str] = []
        _unknown(doc, _TOP_LEVEL, source)
        tables = doc.get("account", [])
        if not isinstance(tables, list):
            raise AccountsError(f"{source}: 'account' must be an array of tables ([[account]])")
        accounts: list[Account] = []
        key_hashes: list[tuple[str, str]] = []
        seen_hashes: set[str] = set()
        for i, table in enumerate(tables):
            where = f"{source}: account[{i}]"
            if not isinstance(table, dict):
                raise AccountsError(f"{where}: must be a table")
            _unknown(table, _ACCOUNT_FIELDS, where)
            name = table.get("name")
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise AccountsError(
                    f"{where}.name: required, 1-64 characters of A-Z a-z 0-9 . _ - "
                    "(starting with a letter or digit)"
                )
            where = f"{source}: account[{i}] ({name})"
            if name in {a.name for a in accounts}:
                raise AccountsError(f"{where}.name: duplicate account name")
            if name == ANONYMOUS:
                raise AccountsError(f"{where}.name: {ANONYMOUS!r} is reserved")
            hashes = _key_hashes(table, where, warnings)
            if not hashes:
                raise AccountsError(f"{where}: needs key_sha256 (or key)")
            for h in hashes:
                if h in seen_hashes:
                    raise AccountsError(f"{where}.key_sha256: the same key is used twice")
                seen_hashes.add(h)
                key_hashes.append((name, h))
            accounts.append(_account(name, table, where))
        admin = doc.get("admin", {})
        if not isinstance(admin, dict):
            raise AccountsError(f"{source}: 'admin' must be a table ([admin])")
        _unknown(admin, _ADMIN_FIELDS, f"{source}: admin")
        admin_hashes = _key_hashes(admin, f"{source}: admin", warnings)
        if set(admin_hashes) & seen_hashes:
            raise AccountsError(f"{source}: admin: the admin key is also an account's key")
        anonymous: Account | None = None
        anon_table = doc.get("anonymous")
        if anon_table is not None:
            if not isinstance(anon_table, dict):
                raise AccountsError(f"{source}: 'anonymous' must be a table ([anonymous])")
            if accounts:
                raise AccountsError(
                    f"{source}: anonymous: only allowed without [[account]] tables "
                    "(with accounts, every call needs a key)"
                )
            _unknown(anon_table, _ANONYMOUS_FIELDS, f"{source}: anonymous")
            anonymous = _account(ANONYMOUS, anon_table, f"{source}: anonymous")
        if not accounts:
            warnings.insert(0, _ANON_WARNING + f" ({source} has no [[account]] table)")
        if not admin_hashes:
            warnings.append(_OPEN_ADMIN_WARNING if not accounts else _CLOSED_ADMIN_WARNING)
        return cls(accounts, key_hashes, admin_hashes, anonymous=anonymous, warnings=warnings)

    # queries ----------------------------------------------------------------------------
    @property
    def anonymous(self) -> bool:
        """True when every call maps to the single anonymous account."""
        return self._anonymous is not None

    @property
    def names(self) -> list[str]:
        if self._anonymous is not None:
            return [self._anonymous.name]
        return [a.name for a in self._by_index]

    def get(self, name: str) -> Account | None:
        """The account called ``name`` (the anonymous one in anonymous mode)."""
        if self._anonymous is not None:
            return self._anonymous if name == self._anonymous.name else None
        return self._accounts.get(name)

    def webhook_secret(self, name: str) -> str | None:
        """The account's webhook signing secret; None when it has none (or is unknown)."""
        account = self.get(name)
        return account.webhook_secret if account is not None and account.webhook_secret else None

    def authenticate(self, metadata: Metadata) -> Account:
        """The calling account; raises ``Unauthenticated`` for a missing or unknown key."""
        if self._anonymous is not None:
            return self._anonymous
        token = bearer_token(metadata)
        if token is None:
            raise Unauthenticated(
                "missing API key: send the metadata 'authorization: Bearer <key>'"
            )
        index = _compare_all(hashlib.sha256(token.encode()).digest(), self._hashes)
        if index is None:
            raise Unauthenticated("unknown API key")
        return self._by_index[index]

    def is_caller(self, metadata: Metadata) -> bool:
        """True when ``authenticate`` would accept the call (for the server's guard)."""
        try:
            self.authenticate(metadata)
        except Unauthenticated:
            return False
        return True

    @property
    def admin_open(self) -> bool:
        """True when admin calls need no key (anonymous mode without an [admin] key)."""
        return not self._admin and self._anonymous is not None

    @property
    def has_admin_key(self) -> bool:
        """True when the file has an ``[admin]`` key."""
        return bool(self._admin)

    def is_admin(self, metadata: Metadata) -> bool:
        """True when the call carries the admin key (or admin calls are open)."""
        return self.admin_open or self.carries_admin_key(metadata)

    def carries_admin_key(self, metadata: Metadata) -> bool:
        """True only when the call carries a configured admin key (open mode or not)."""
        token = bearer_token(metadata)
        if token is None or not self._admin:
            return False
        return _compare_all(hashlib.sha256(token.encode()).digest(), self._admin) is not None


_ANON_WARNING = (
    "NO API KEYS CONFIGURED: every caller is the single 'anonymous' account and can see, "
    "watch and cancel every job"
)
_OPEN_ADMIN_WARNING = (
    "NO ADMIN KEY CONFIGURED: admin reads (Role, Digest) are open to every caller; "
    "Promote takes the pair's replication token as its key"
)
_CLOSED_ADMIN_WARNING = (
    "no [admin] key in the accounts file: admin calls (Promote, Role, Digest) are refused"
)


def _unknown(table: dict[str, Any], known: set[str], where: str) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise AccountsError(f"{where}: unknown field(s): {', '.join(extra)}")


def _key_hashes(table: dict[str, Any], where: str, warnings: list[str]) -> list[str]:
    raw = table.get("key_sha256", [])
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(h, str) for h in items):
        raise AccountsError(f"{where}.key_sha256: a hex string or a list of them")
    hashes: list[str] = []
    for h in items:
        h = h.strip().lower()
        if not _HEX64.fullmatch(h):
            raise AccountsError(f"{where}.key_sha256: {h[:12]!r}... is not 64 hex digits")
        hashes.append(h)
    plain = table.get("key")
    if plain is not None:
        if not isinstance(plain, str) or len(plain) < 8:
            raise AccountsError(f"{where}.key: a string of at least 8 characters")
        warnings.append(
            f"{where}: plain-text 'key' in the accounts file; use key_sha256 "
            "(pagesift keys hash) outside local demos"
        )
        hashes.append(hash_key(plain))
    if len(set(hashes)) != len(hashes):
        raise AccountsError(f"{where}.key_sha256: the same key is listed twice")
    return hashes


def _account(name: str, table: dict[str, Any], where: str) -> Account:
    limits: dict[str, int | None] = {}
    for field in LIMIT_FIELDS:
        value = table.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise AccountsError(f"{where}.{field}: must be a positive integer")
        if value is not None and value <= 0:
            raise AccountsError(f"{where}.{field}: must be a positive integer (omit it: unlimited)")
        limits[field] = value
    allowed: dict[str, bool] = {}
    for field in PERMISSION_FIELDS:
        value = table.get(field, False)
        if not isinstance(value, bool):
            raise AccountsError(f"{where}.{field}: must be true or false")
        allowed[field] = value
    secret = table.get("webhook_secret", "")
    if not isinstance(secret, str):
        raise AccountsError(f"{where}.webhook_secret: must be a string")
    if secret and len(secret) < 16:
        raise AccountsError(f"{where}.webhook_secret: at least 16 characters")
    return Account(
        name=name,
        max_concurrent_jobs=limits["max_concurrent_jobs"],
        pages_per_day=limits["pages_per_day"],
        max_batch_urls=limits["max_batch_urls"],
        max_crawl_limit=limits["max_crawl_limit"],
        max_concurrent_streams=limits["max_concurrent_streams"],
        max_browser_pages=limits["max_browser_pages"],
        model_tokens_per_day=limits["model_tokens_per_day"],
        webhook_secret=secret,
        allow_ignore_robots=allowed["allow_ignore_robots"],
        allow_proxy_url=allowed["allow_proxy_url"],
        allow_execute_javascript=allowed["allow_execute_javascript"],
        allow_model=allowed["allow_model"],
    )


# CLI ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pagesift.core.jobs.accounts new-key [--name N] | hash-key``: kept for
    scripts; ``pagesift keys new|hash`` is the command (both print ``NewKey.text`` and
    ``hash_key``)."""
    parser = argparse.ArgumentParser(prog="python -m pagesift.core.jobs.accounts")
    sub = parser.add_subparsers(dest="command", required=True)
    nk = sub.add_parser("new-key", help="print a random API key, its sha256 and a TOML snippet")
    nk.add_argument("--name", default="my-team", help="account name for the snippet")
    sub.add_parser("hash-key", help="read a key from stdin and print its sha256")
    args = parser.parse_args(argv)
    if args.command == "new-key":
        print(NewKey.make(args.name).text())
        return 0
    key = sys.stdin.readline().strip()
    if not key:
        print("hash-key: no key on stdin", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
