"""``pagesift keys new --name N`` and ``pagesift keys hash [KEY]``: API keys for the
accounts file.

Owns the ``keys`` command. ``new`` prints a fresh random key, its sha256 and an
accounts-file snippet that holds only the hash (``NewKey.text``; with ``--json`` the
object ``{"name", "key", "key_sha256", "webhook_secret"}``); ``hash`` prints the
sha256 of KEY (``{"key_sha256"}``), read from stdin when KEY is ``-`` or absent, so
that the key stays out of the shell history. The key material and its hash come
from ``pagesift.core.jobs.accounts`` (``NewKey``, ``hash_key``), which
``python -m pagesift.core.jobs.accounts new-key|hash-key`` prints the same way.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pagesift.cli.common import EXIT_OK, dump, fail
from pagesift.core.jobs.accounts import NewKey, hash_key


def _cmd_keys_new(args: argparse.Namespace) -> int:
    made = NewKey.make(args.name)
    if args.json:
        dump(
            {
                "name": made.name,
                "key": made.key,
                "key_sha256": made.key_sha256,
                "webhook_secret": made.webhook_secret,
            }
        )
    else:
        print(made.text())
    return EXIT_OK


def _cmd_keys_hash(args: argparse.Namespace) -> int:
    key = (sys.stdin.readline() if args.key in (None, "-") else args.key).strip()
    if not key:
        return fail("keys hash: no key (give KEY, or one line on stdin)")
    if args.json:
        dump({"key_sha256": hash_key(key)})
    else:
        print(hash_key(key))
    return EXIT_OK


def add_keys_command(sub: Any) -> None:
    p = sub.add_parser("keys", help="API keys for the accounts file")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    new = actions.add_parser(
        "new", help="print a random API key, its sha256 and an accounts-file snippet"
    )
    new.add_argument("--name", default="my-team", help="account name for the snippet")
    new.add_argument("--json", action="store_true", help="print one JSON object")
    new.set_defaults(handler=_cmd_keys_new, uses_client=False)
    hashed = actions.add_parser("hash", help="print the sha256 of KEY (stdin: - or none)")
    hashed.add_argument("key", nargs="?", metavar="KEY")
    hashed.add_argument("--json", action="store_true", help="print one JSON object")
    hashed.set_defaults(handler=_cmd_keys_hash, uses_client=False)
