"""What every ``pagesift`` subcommand shares: exit statuses, the JSON line, error lines.

Owns the exit-status constants (what each means is stated once, in
``pagesift.node.cli``), the two handler signatures, ``dump`` (the one JSON object a
``--json`` command prints on stdout), ``enum_name`` (how a proto enum value is
spelled in output), and the one way a command reports an error: ``fail`` prints
``error: <message>`` on stderr and returns ``EXIT_ERROR``; ``report`` does so for an
exception, a gRPC failure as ``error: <CODE>: <details>`` (``format_rpc_error``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import EnumDescriptor

from pagesift.shared.client import JobClient

EXIT_OK = 0
EXIT_JOB_NOT_COMPLETED = 1
EXIT_DIGESTS_DIFFER = 1  # verify: both digests taken at one offset, and they differ
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports it

ClientHandler = Callable[[argparse.Namespace, JobClient], Awaitable[int]]
SyncHandler = Callable[[argparse.Namespace], int]


def dump(obj: dict[str, Any]) -> None:
    """Print ``obj`` as the command's one JSON object (one line on stdout)."""
    print(json.dumps(obj, ensure_ascii=False, sort_keys=False))


def enum_name(enum: EnumDescriptor, value: int, prefix: str) -> str:
    """``JOB_STATE_COMPLETED`` -> ``"completed"`` (``"unspecified"`` for an unknown value)."""
    known = enum.values_by_number.get(value)
    return known.name.removeprefix(prefix).lower() if known is not None else "unspecified"


def format_rpc_error(err: grpc.RpcError) -> str:
    """``error: NOT_FOUND: no job abc`` (the one line a gRPC failure prints)."""
    code_fn = getattr(err, "code", None)
    details_fn = getattr(err, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    return f"error: {name}: {details or ''}".rstrip()


def fail(message: str) -> int:
    """Print ``error: <message>`` on stderr; returns ``EXIT_ERROR``."""
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


def report(err: BaseException) -> int:
    """Print an exception as the command's error line on stderr; returns ``EXIT_ERROR``."""
    if isinstance(err, grpc.RpcError):
        print(format_rpc_error(err), file=sys.stderr)
        return EXIT_ERROR
    return fail(str(err))
