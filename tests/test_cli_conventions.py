"""The conventions every ``pagesift`` command keeps: ``--version``, the exit statuses by
class, ``--json`` errors, the connect timeout, ``keys``, and shell completion.

The exit classes run against a real node (``in_process_node``) or a closed port. The
unreachable case is bounded with ``asyncio.wait_for`` at a multiple of the connect
timeout, far below the client's ~10.4 s retry budget it used to take.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pagesift import cli
from pagesift.cli import build_parser, main
from pagesift.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_JOB_NOT_COMPLETED,
    EXIT_NO,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from pagesift.cli.jobview import watch_json
from pagesift.cli.progress import JobProgress
from pagesift.core.jobs import accounts
from pagesift.core.jobs.accounts import Accounts, hash_key
from pagesift.v1 import jobs_pb2
from tests.helpers import free_port, in_process_node, serve_handler

ROOT = Path(__file__).resolve().parents[1]


def dead_address() -> str:
    return f"127.0.0.1:{free_port()}"


def json_error(out: str) -> dict[str, Any]:
    """The one JSON error object a failed ``--json`` command printed on stdout."""
    assert out.count("\n") == 1, out
    got = json.loads(out)
    assert set(got) == {"error"} and set(got["error"]) == {"code", "message", "exit"}, got
    error: dict[str, Any] = got["error"]
    return error


# ---------------------------------------------------------------- --version, the table


def test_version_names_the_distribution_python_and_grpc(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--version"]) == EXIT_OK
    line = capsys.readouterr().out
    assert line.count("\n") == 1
    m = re.fullmatch(r"pagesift (\S+) \(python (\d+\.\d+\.\d+\S*), grpcio (\S+)\)\n", line)
    assert m, line
    assert m[1] == metadata.version("pagesift")
    assert m[3] == metadata.version("grpcio")


def test_exit_statuses_are_distinct_by_class() -> None:
    table = {
        "ok": EXIT_OK,
        "no": EXIT_NO,
        "usage": EXIT_USAGE,
        "refused": EXIT_REFUSED,
        "unreachable": EXIT_UNREACHABLE,
        "failed": EXIT_FAILED,
        "interrupted": EXIT_INTERRUPTED,
        "broken pipe": EXIT_BROKEN_PIPE,
    }
    assert table == {
        "ok": 0,
        "no": 1,
        "usage": 2,
        "refused": 3,
        "unreachable": 4,
        "failed": 5,
        "interrupted": 130,
        "broken pipe": 141,
    }
    assert EXIT_JOB_NOT_COMPLETED == EXIT_NO


def test_every_command_takes_json() -> None:
    leaves = cli._leaf_parsers(build_parser())
    names = {p.prog.removeprefix("pagesift ") for p in leaves}
    assert {"jobs", "watch", "cancel", "serve", "token new", "keys new", "keys hash"} <= names
    for parser in leaves:
        assert "--json" in parser._option_string_actions, parser.prog


# ---------------------------------------------------------------- usage (2)


def test_a_usage_error_with_json_prints_the_error_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["jobs", "--server", "nohost", "--json"]) == EXIT_USAGE
    captured = capsys.readouterr()
    error = json_error(captured.out)
    assert error["code"] == "USAGE" and error["exit"] == EXIT_USAGE
    assert "expected HOST:PORT" in error["message"]
    assert "usage:" in captured.err  # the usage text still goes to stderr
    # without --json: the usage text and argparse's line, nothing on stdout
    assert main(["jobs", "--server", "nohost"]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and "expected HOST:PORT" in captured.err


def test_serve_reports_a_bad_config_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--role", "standby", "--json"]) == EXIT_USAGE  # no --primary
    error = json_error(capsys.readouterr().out)
    assert (error["code"], error["exit"]) == ("USAGE", EXIT_USAGE)


# ---------------------------------------------------------------- refused (3), no (1)


async def test_a_server_refusal_exits_3_in_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with in_process_node(tmp_path / "node") as node:
        server = ["--server", node.address]
        missing = str(uuid.uuid4())
        assert await cli.amain(["status", missing, *server]) == EXIT_REFUSED
        captured = capsys.readouterr()
        assert captured.err.startswith("error: NOT_FOUND: ") and captured.out == ""
        for argv in (["status", missing], ["cancel", missing], ["watch", missing]):
            assert await cli.amain([*argv, *server, "--json"]) == EXIT_REFUSED, argv
            captured = capsys.readouterr()
            error = json_error(captured.out)
            assert (error["code"], error["exit"]) == ("NOT_FOUND", EXIT_REFUSED), argv
            assert captured.err == ""
        assert await cli.amain(["status", "nope", *server, "--json"]) == EXIT_REFUSED
        error = json_error(capsys.readouterr().out)
        assert error == {
            "code": "INVALID_ARGUMENT",
            "message": "id: 'nope' is not a job id",
            "exit": EXIT_REFUSED,
        }


async def test_a_scrape_whose_page_times_out_is_refused_not_unreachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response(text="<p>late</p>", content_type="text/html")

    async with (
        serve_handler(slow) as port,
        in_process_node(
            tmp_path / "node", read_timeout=0.2, max_retries=0, respect_robots=False
        ) as node,
    ):
        argv = ["scrape", f"http://127.0.0.1:{port}/", "--server", node.address, "--json"]
        assert await cli.amain(argv) == EXIT_REFUSED  # the server answered: UNAVAILABLE
        error = json_error(capsys.readouterr().out)
        assert (error["code"], error["exit"]) == ("UNAVAILABLE", EXIT_REFUSED)
        assert "timeout" in error["message"]


async def test_a_job_that_fails_exits_1_with_its_own_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with in_process_node(tmp_path / "node") as node:
        job_id = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(url=f"http://{dead_address()}/", limit=5)
        )
        await node.stub.CancelJob(jobs_pb2.CancelJobRequest(id=job_id.id))
        argv = ["watch", job_id.id, "--server", node.address, "--json"]
        assert await cli.amain(argv) == EXIT_NO  # ran, and the job did not complete
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert lines[-1]["state"] == "cancelled"
        assert all("error" not in line for line in lines)


def test_watch_json_shapes() -> None:
    doc = jobs_pb2.Document(url="http://a/", final_url="http://a/", title="A")
    event = jobs_pb2.WatchJobResponse()
    event.document.index = 3
    event.document.document.CopyFrom(doc)
    assert watch_json(event) == {
        "index": 3,
        "document": {"url": "http://a/", "final_url": "http://a/", "title": "A"},
    }
    state = jobs_pb2.WatchJobResponse()
    state.state.state = jobs_pb2.JOB_STATE_FAILED
    state.state.total, state.state.completed, state.state.failed = 5, 3, 2
    assert watch_json(state) == {"state": "failed", "total": 5, "completed": 3, "failed": 2}
    progress = JobProgress("j")
    progress.update(state)
    assert progress.exit_code() == EXIT_NO


# ---------------------------------------------------------------- unreachable (4)


async def test_an_unreachable_server_fails_within_the_connect_timeout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dead = dead_address()
    argv = ["jobs", "--server", dead, "--connect-timeout", "1", "--json"]
    # the client's retry budget alone would take ~10.4 s; 2x the connect timeout here
    assert await asyncio.wait_for(cli.amain(argv), 2 * 1.0) == EXIT_UNREACHABLE
    error = json_error(capsys.readouterr().out)
    assert error == {
        "code": "UNAVAILABLE",
        "message": f"cannot reach {dead} (connect timeout 1 s)",
        "exit": EXIT_UNREACHABLE,
    }
    # text, both addresses of a pair named
    other = dead_address()
    argv = ["status", "j", "--server", f"{dead},{other}", "--connect-timeout", "0.5"]
    assert await asyncio.wait_for(cli.amain(argv), 2 * 0.5) == EXIT_UNREACHABLE
    captured = capsys.readouterr()
    assert captured.err == f"error: cannot reach {dead}, {other} (connect timeout 0.5 s)\n"
    assert captured.out == ""


async def test_the_default_connect_timeout_bounds_the_console_script(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dead = dead_address()
    code = await asyncio.wait_for(asyncio.to_thread(main, ["jobs", "--server", dead]), 2 * 3.0)
    assert code == EXIT_UNREACHABLE
    assert capsys.readouterr().err == f"error: cannot reach {dead} (connect timeout 3 s)\n"


async def test_a_dead_address_beside_a_live_one_still_fails_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with in_process_node(tmp_path / "node") as node:
        argv = ["jobs", "--json", "--connect-timeout", "1", "--server", dead_address()]
        argv += ["--server", node.address]
        assert await asyncio.wait_for(cli.amain(argv), 10) == EXIT_OK
        assert json.loads(capsys.readouterr().out) == {"jobs": []}


# ---------------------------------------------------------------- failed (5), interrupted


def test_a_local_failure_exits_5(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("")
    token = tmp_path / "a-file" / "sub" / "token"  # its parent cannot be made
    assert main(["token", "new", str(token), "--json"]) == EXIT_FAILED
    error = json_error(capsys.readouterr().out)
    assert (error["code"], error["exit"]) == ("FAILED", EXIT_FAILED)
    assert main(["token", "new", str(token)]) == EXIT_FAILED
    assert capsys.readouterr().err.startswith(f"error: {token}: ")


def test_an_interrupt_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run_client", interrupted)
    assert main(["jobs", "--json"]) == EXIT_INTERRUPTED
    error = json_error(capsys.readouterr().out)
    assert (error["code"], error["exit"]) == ("INTERRUPTED", EXIT_INTERRUPTED)


# ---------------------------------------------------------------- keys


def test_keys_new_prints_a_key_and_a_snippet_that_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "new", "--name", "acme"]) == EXIT_OK
    out = capsys.readouterr().out
    key = out.split("key:", 1)[1].split()[0]
    assert f"key_sha256: {hash_key(key)}\n" in out
    path = tmp_path / "accounts.toml"
    path.write_text(out[out.index("[[account]]") :])
    loaded = Accounts.load(path)
    assert loaded.webhook_secret("acme")
    # the module entry point prints the same lines (one function makes both)
    assert accounts.main(["new-key", "--name", "acme"]) == 0
    legacy = capsys.readouterr().out
    shape = [line.split(":")[0].split("=")[0] for line in out.splitlines()]
    assert shape == [line.split(":")[0].split("=")[0] for line in legacy.splitlines()]

    assert main(["keys", "new", "--name", "acme", "--json"]) == EXIT_OK
    made = json.loads(capsys.readouterr().out)
    assert set(made) == {"name", "key", "key_sha256", "webhook_secret"}
    assert made["name"] == "acme" and made["key_sha256"] == hash_key(made["key"])


def test_keys_hash_takes_the_key_or_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert main(["keys", "hash", "abc"]) == EXIT_OK
    assert capsys.readouterr().out == f"{abc}\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("abc\n"))
    assert main(["keys", "hash", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"key_sha256": abc}
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["keys", "hash", "-"]) == EXIT_USAGE
    assert "no key" in capsys.readouterr().err


# ---------------------------------------------------------------- completion


def _complete(line: str, tmp_path: Path) -> list[str]:
    """What argcomplete offers for ``line`` (cursor at its end), run as a shell would."""
    out = tmp_path / "completions"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "COMP_TYPE": "9",
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    subprocess.run(
        [sys.executable, "-m", "pagesift.cli"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=True,
    )
    return [c.strip() for c in out.read_text().split("\n") if c.strip()]


def test_argcomplete_completes_commands_and_flags(tmp_path: Path) -> None:
    assert _complete("pagesift sta", tmp_path) == ["status"]
    actions = {c for c in _complete("pagesift keys ", tmp_path) if not c.startswith("-")}
    assert actions == {"new", "hash"}
    assert "--connect-timeout" in _complete("pagesift jobs --conn", tmp_path)
