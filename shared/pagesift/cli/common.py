"""What every ``pagesift`` subcommand shares: exit statuses, the JSON line, error lines.

Owns the exit statuses (the one table of them: ``EXIT_*`` below, and docs/cli.md's
"Exit codes"), the two handler signatures, ``dump`` (the one JSON object a ``--json``
command prints on stdout), ``enum_name`` (how a proto enum value is spelled in
output), and the one way a command reports an error:

- ``fail(message, exit=..., code=...)`` reports a failure of the command itself
  (a usage error by default);
- ``report(err)`` reports an exception, classified by ``describe``: a gRPC status
  from a server is ``EXIT_REFUSED`` (``EXIT_UNREACHABLE`` for UNAVAILABLE and
  DEADLINE_EXCEEDED), ``Unreachable`` (the connect timeout) is ``EXIT_UNREACHABLE``,
  anything else ``EXIT_FAILED``.

Both print ``error: <message>`` on stderr (a gRPC failure as ``error: <CODE>:
<details>``, ``format_rpc_error``), or, while the command runs with ``--json``
(``json_errors``), the one object ``{"error": {"code", "message", "exit"}}`` on
stdout instead, so that stdout holds exactly one JSON object whether the command
succeeded or not.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import grpc
from google.protobuf.descriptor import EnumDescriptor

from pagesift.client import JobClient, Unreachable
from pagesift.client.errors import reason_of

# The exit statuses, by class (docs/cli.md, "Exit codes"; a test pins the numbers).
EXIT_OK = 0
#: the command ran and its answer is no: a waited/watched job ended failed or
#: cancelled, ``verify`` found different digests, a drill run failed
EXIT_NO = 1
EXIT_JOB_NOT_COMPLETED = EXIT_NO
EXIT_DIGESTS_DIFFER = EXIT_NO
#: the command line is wrong: argparse, flags that do not go together, a bad
#: ``serve`` config, an output path that cannot be used as given
EXIT_USAGE = 2
#: a server answered with an error status (INVALID_ARGUMENT, UNAUTHENTICATED,
#: PERMISSION_DENIED, NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ...)
EXIT_REFUSED = 3
#: no server could be reached within ``--connect-timeout`` (or a call ended
#: UNAVAILABLE / DEADLINE_EXCEEDED)
EXIT_UNREACHABLE = 4
#: the command could not finish for another reason: a local file, a server that
#: broke the protocol, ``verify`` with no common offset, a drill that could not set up
EXIT_FAILED = 5
EXIT_INTERRUPTED = 130  # 128 + SIGINT (Ctrl-C; SIGTERM for drill)
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports it

#: gRPC codes that mean "no server answered", not "a server said no"
UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

ClientHandler = Callable[[argparse.Namespace, JobClient], Awaitable[int]]
SyncHandler = Callable[[argparse.Namespace], int]

_json_errors: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "pagesift_json_errors", default=False
)


@contextmanager
def json_errors(on: bool) -> Iterator[None]:
    """Within the block, ``fail``/``report`` print the JSON error object (``--json``)."""
    token = _json_errors.set(on)
    try:
        yield
    finally:
        _json_errors.reset(token)


def dump(obj: dict[str, Any]) -> None:
    """Print ``obj`` as the command's one JSON object (one line on stdout)."""
    print(json.dumps(obj, ensure_ascii=False, sort_keys=False), flush=True)


def enum_name(enum: EnumDescriptor, value: int, prefix: str) -> str:
    """``JOB_STATE_COMPLETED`` -> ``"completed"`` (``"unspecified"`` for an unknown value)."""
    known = enum.values_by_number.get(value)
    return known.name.removeprefix(prefix).lower() if known is not None else "unspecified"


def _rpc_code_details(err: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    code_fn = getattr(err, "code", None)
    details_fn = getattr(err, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    return (code if isinstance(code, grpc.StatusCode) else None), details or ""


def format_rpc_error(err: grpc.RpcError) -> str:
    """``error: NOT_FOUND: no job abc`` (the one line a gRPC failure prints)."""
    code, details = _rpc_code_details(err)
    name = code.name if code is not None else "UNKNOWN"
    return f"error: {name}: {details}".rstrip()


@dataclass(frozen=True)
class Failure:
    """What a failed command reports: ``code`` (a gRPC status name, or USAGE, FAILED,
    INTERRUPTED), a message, and the exit status."""

    code: str
    message: str
    exit: int

    def json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "exit": self.exit}}


def exit_for_rpc(err: grpc.RpcError) -> int:
    """``EXIT_UNREACHABLE`` for UNAVAILABLE/DEADLINE_EXCEEDED that no server sent (no
    pagesift ErrorInfo: the transport's), else ``EXIT_REFUSED`` (a server answered,
    e.g. UNAVAILABLE for a Scrape whose page timed out)."""
    code, _ = _rpc_code_details(err)
    if code in UNREACHABLE_CODES and reason_of(err) is None:
        return EXIT_UNREACHABLE
    return EXIT_REFUSED


def describe(err: BaseException) -> Failure:
    """The class of an exception a command ended with (see the module docstring)."""
    if isinstance(err, grpc.RpcError):
        code, details = _rpc_code_details(err)
        return Failure(code.name if code else "UNKNOWN", details, exit_for_rpc(err))
    if isinstance(err, Unreachable):
        return Failure("UNAVAILABLE", str(err), EXIT_UNREACHABLE)
    if isinstance(err, KeyboardInterrupt):
        return Failure("INTERRUPTED", "interrupted", EXIT_INTERRUPTED)
    if isinstance(err, OSError) and err.strerror:
        where = f"{err.filename}: " if err.filename else ""
        return Failure("FAILED", f"{where}{err.strerror}", EXIT_FAILED)
    return Failure("FAILED", str(err) or type(err).__name__, EXIT_FAILED)


def emit(failure: Failure, text: str = "") -> int:
    """Print ``failure``: the JSON object on stdout under ``--json``, else ``text``
    (default ``error: <message>``) on stderr; returns its exit status."""
    if _json_errors.get():
        dump(failure.json())
    else:
        print(text or f"error: {failure.message}", file=sys.stderr)
    return failure.exit


def fail(message: str, *, exit: int = EXIT_USAGE, code: str = "") -> int:
    """Report ``message`` as the command's error; returns ``exit`` (a usage error by
    default). ``code`` defaults to USAGE for ``EXIT_USAGE`` and FAILED otherwise."""
    name = code or ("USAGE" if exit == EXIT_USAGE else "FAILED")
    return emit(Failure(name, message, exit))


def server_extra_missing(command: str) -> str | None:
    """Why ``command`` (serve, drill: a node) cannot run here: the distributions of
    pagesift's ``server`` extra that are not installed (a client-only ``pip install
    pagesift``), as an error message; None when all are (or pagesift is not installed
    as a distribution: a source tree)."""
    try:
        requires = metadata.requires("pagesift") or []
    except metadata.PackageNotFoundError:
        return None
    missing = []
    for requirement in requires:
        if not re.search(r"""extra\s*==\s*["']server["']""", requirement):
            continue
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        if name is None:
            continue
        try:
            metadata.version(name.group(0))
        except metadata.PackageNotFoundError:
            missing.append(name.group(0))
    if not missing:
        return None
    return (
        f"{command} runs a node, which needs the server extra "
        f"(missing {', '.join(missing)}): pip install './pagesift[server]' "
        "-c pagesift/constraints.txt from a checkout (README, Install)"
    )


def report(err: BaseException) -> int:
    """Report an exception as the command's error (a gRPC failure's text line is
    ``format_rpc_error``); returns its exit status."""
    text = format_rpc_error(err) if isinstance(err, grpc.RpcError) else ""
    return emit(describe(err), text)
