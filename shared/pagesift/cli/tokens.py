"""``pagesift token new FILE``: write a new replication token for a pair.

Owns the ``token`` command. The file is written with mode 600 and an existing
file is never replaced (a pair keeps its token: a usage error, exit 2; a file that
cannot be written is exit 5). ``--json`` prints ``{"file", "mode"}``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pagesift.cli.common import EXIT_FAILED, EXIT_OK, dump, fail
from pagesift.core.api import tls


def _cmd_token_new(args: argparse.Namespace) -> int:
    try:
        tls.write_new_token(args.file)
    except FileExistsError:
        return fail(f"{args.file} exists; a pair keeps its token")
    except OSError as err:
        return fail(f"{args.file}: {err.strerror or err}", exit=EXIT_FAILED)
    if args.json:
        dump({"file": str(args.file), "mode": "600"})
        return EXIT_OK
    print(
        f"wrote a new replication token to {args.file} (mode 600); give both nodes of the "
        f"pair the same file: --replication-token-file {args.file}"
    )
    return EXIT_OK


def add_token_command(sub: Any) -> None:
    p = sub.add_parser("token", help="replication tokens")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    new = actions.add_parser("new", help="write a new random replication token to FILE")
    new.add_argument("file", type=Path, metavar="FILE")
    new.add_argument("--json", action="store_true", help="print one JSON object")
    new.set_defaults(handler=_cmd_token_new, uses_client=False)
