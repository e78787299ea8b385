"""``pip install pagesift`` is a client other services can install.

The project is built into a wheel (pip, from a copy of its sources: nothing is written
into the working tree) and installed into a fresh venv with ONLY its own dependencies
(no extra; the package index / pip's cache, at constraints.txt's versions). There:

- none of the node's dependencies is importable (the ``server`` extra);
- ``pagesift --version`` runs, and the client commands (``pagesift jobs``) talk to a
  real node started from the main venv; ``pagesift serve`` says what to install;
- ``SyncJobClient`` scrapes a page through that node;
- a consumer's ``mypy --strict`` (the main venv's mypy, ``--python-executable`` the
  fresh venv) sees the typed messages and clients (py.typed, the generated .pyi) and
  reports a deliberate type error.

One venv is shared by the module's tests (a module-scoped fixture): ~10-20 s with a
warm pip cache, most of it the venv and the wheel.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from tests.helpers import in_process_node, serve_handler

ROOT = Path(__file__).resolve().parent.parent

#: the node's dependencies (the ``server`` extra), never needed by a client
SERVER_ONLY = (
    "rocksdict",
    "cryptography",
    "lxml",
    "defusedxml",
    "aiohttp",
    "selectolax",
    "pypdfium2",
    "pydantic",
    "pydantic_settings",
    "html_to_markdown",
    "protego",
    "prometheus_client",
    "re2",
    "aetcd",
    "opentelemetry",
    "pythonjsonlogger",
    "grpc_health",
    "grpc_reflection",
    "grpc_tools",
    "playwright",  # the browser engine, and what it brings
    "greenlet",
)


@dataclass(frozen=True)
class ClientVenv:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def pagesift(self) -> Path:
        return self.root / "bin" / "pagesift"


def _run(*cmd: str | Path, cwd: Path | None = None, timeout: float = 300) -> str:
    out = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _sources(dest: Path) -> Path:
    """What the wheel is built from, copied (setuptools writes build/ and egg-info)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for folder in ("shared", "primary", "standby"):
        shutil.copytree(ROOT / folder, dest / folder, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientVenv]:
    base = tmp_path_factory.mktemp("packaging")
    (base / "src").mkdir()
    src = _sources(base / "src")
    wheels = base / "wheels"
    # without build isolation when the main venv has setuptools (no download)
    has_setuptools = importlib.util.find_spec("setuptools") is not None
    isolation = ["--no-build-isolation"] if has_setuptools else []
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", wheels, src)
    (wheel,) = wheels.glob("pagesift-*.whl")
    venv = ClientVenv(base / "venv")
    # no pip of its own (ensurepip alone takes ~8 s): the main venv's pip installs into it
    _run(sys.executable, "-m", "venv", "--without-pip", venv.root)
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv.python,
        "install",
        "-q",
        "-c",
        ROOT / "constraints.txt",
        wheel,
    )
    yield venv


@pytest.mark.system
def test_the_client_install_has_no_server_dependency(client_venv: ClientVenv) -> None:
    code = (
        "import importlib.util, json, sys\n"
        f"print(json.dumps([m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m)]))\n"
    )
    assert json.loads(_run(client_venv.python, "-c", code)) == []
    # ...and yet the client, the generated code and the CLI import
    _run(
        client_venv.python,
        "-c",
        "import pagesift.v1.jobs_pb2, pagesift.client, pagesift.cli",
    )


@pytest.mark.system
def test_a_cluster_client_without_aetcd_names_the_extra(client_venv: ClientVenv) -> None:
    code = (
        "from pagesift.client import ClusterUnavailable, JobClient\n"
        "from pagesift.core.cluster import ids\n"  # the cluster's rules ship with the client
        "try:\n"
        "    JobClient(cluster='etcd://127.0.0.1:2379/prod')\n"
        "except ClusterUnavailable as e:\n"
        "    print(e)\n"
    )
    assert "pip install 'pagesift[cluster]'" in _run(client_venv.python, "-c", code)


@pytest.mark.system
def test_the_wheel_ships_the_type_information(client_venv: ClientVenv) -> None:
    code = (
        "import importlib.util, pathlib\n"
        "for pkg in ('pagesift.v1', 'pagesift.core', 'pagesift.node'):\n"
        "    d = pathlib.Path(importlib.util.find_spec(pkg).origin).parent\n"
        "    print(pkg, (d / 'py.typed').is_file(), sorted(p.name for p in d.glob('*.pyi')))\n"
    )
    lines = _run(client_venv.python, "-c", code).splitlines()
    assert all(" True " in line for line in lines), lines
    assert "'jobs_pb2.pyi', 'jobs_pb2_grpc.pyi'" in lines[0]


@pytest.mark.system
def test_the_cli_runs_and_serve_asks_for_the_server_extra(client_venv: ClientVenv) -> None:
    out = _run(client_venv.pagesift, "--version")
    assert out.startswith("pagesift 0.1.0 ")
    serve = subprocess.run(
        [str(client_venv.pagesift), "serve", "--json"], capture_output=True, text=True
    )
    assert serve.returncode == 5, serve
    error = json.loads(serve.stdout)["error"]
    assert "pip install './pagesift[server]' -c pagesift/constraints.txt" in error["message"]
    assert "rocksdict" in error["message"]


async def _page(request: web.Request) -> web.Response:
    return web.Response(
        text="<html><head><title>Packaged</title></head><body><p>hi</p></body></html>",
        content_type="text/html",
    )


@pytest.mark.system
async def test_the_installed_client_talks_to_a_node(
    client_venv: ClientVenv, tmp_path: Path
) -> None:
    async with serve_handler(_page) as port, in_process_node(tmp_path / "node") as node:
        jobs = await asyncio.create_subprocess_exec(
            str(client_venv.pagesift),
            "jobs",
            "--server",
            node.address,
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(jobs.communicate(), 60)
        assert jobs.returncode == 0, stderr.decode()
        assert isinstance(json.loads(stdout), dict)

        script = textwrap.dedent(
            f"""
            import grpc
            from pagesift.client import RetryPolicy, SyncJobClient

            with SyncJobClient(["{node.address}"], retry=RetryPolicy(budget=1.0)) as c:
                doc = c.scrape("http://127.0.0.1:{port}/page")
                print(doc.title)
                try:
                    c.get_job("no-such-job")
                except grpc.RpcError as err:
                    print(err.code().name)
            """
        )
        sync = await asyncio.create_subprocess_exec(
            str(client_venv.python),
            "-c",
            script,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(sync.communicate(), 60)
        assert sync.returncode == 0, stderr.decode()
        title, code = stdout.decode().split()
        assert title == "Packaged"
        assert code in ("NOT_FOUND", "INVALID_ARGUMENT")  # the node's refusal of that id


CONSUMER = """\
from pagesift.client import JobClient, RetryPolicy, SyncJobClient
from pagesift.v1 import jobs_pb2


async def scrape_title(client: JobClient) -> str:
    doc = await client.scrape("https://example.com/")
    return doc.title


def job_total(client: SyncJobClient) -> int:
    return client.get_job("abc", status_only=True).total


reveal_type(jobs_pb2.Document().title)
reveal_type(SyncJobClient.scrape)
policy = RetryPolicy(budget=2.0)
wrong: int = jobs_pb2.Document().title
"""


@pytest.mark.system
def test_a_consumers_mypy_sees_the_types(client_venv: ClientVenv, tmp_path: Path) -> None:
    mypy = Path(sys.executable).parent / "mypy"
    if not mypy.exists():
        pytest.skip("mypy is not installed in this venv (the dev extra)")
    (tmp_path / "consumer.py").write_text(CONSUMER)
    out = subprocess.run(
        [
            str(mypy),
            "--strict",
            "--python-executable",
            str(client_venv.python),
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "consumer.py",
        ],
        cwd=tmp_path,  # no project config: a consumer's own settings
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "MYPYPATH"},
        timeout=300,
    )
    lines = out.stdout.splitlines()
    # mypy 1.x spells it "builtins.str", 2.x "str"
    assert any(
        line.startswith("consumer.py:14:")
        and re.search(r'Revealed type is "(builtins\.)?str"', line)
        for line in lines
    ), out.stdout
    assert any(
        line.startswith("consumer.py:15:")
        and "url: str, options: pagesift.v1.jobs_pb2.ScrapeOptions | None" in line
        and line.endswith('-> pagesift.v1.jobs_pb2.Document"')
        for line in lines
    ), out.stdout
    errors = [line for line in lines if ": error:" in line]
    assert len(errors) == 1, out.stdout
    assert "consumer.py:17: error: Incompatible types in assignment" in errors[0]
    assert '(expression has type "str", variable has type "int")' in errors[0]


# ---------------------------------------------------------------- the client's knobs (main venv)


def test_the_retry_policy_and_channel_options_are_injectable(tmp_path: Path) -> None:
    from pagesift.client import JobClient, RetryPolicy

    policy = RetryPolicy(budget=1.5, first=0.2, cap=0.4, rng=lambda: 0.0)
    assert policy.delays() == pytest.approx([0.2, 0.4, 0.4, 0.4, 0.1])
    assert JobClient("a:1", retry=policy).retry is policy
    # retry_budget, when given, replaces the policy's budget
    client = JobClient("a:1", retry=policy, retry_budget=0.5)
    assert (client.retry_budget, client.retry.first) == (0.5, 0.2)
    assert JobClient("a:1").retry == RetryPolicy(budget=10.0)

    options = dict(
        JobClient(
            "a:1",
            channel_options=[
                ("grpc.keepalive_time_ms", 30000),
                ("grpc.max_reconnect_backoff_ms", 5),
            ],
        )._channel_options
    )
    assert options["grpc.keepalive_time_ms"] == 30000
    assert options["grpc.max_reconnect_backoff_ms"] == 5  # over the client's own default
    assert options["grpc.max_receive_message_length"] == 64 * 1024 * 1024

    with pytest.raises(ValueError, match="tls_key"):
        JobClient("a:1", tls_cert=str(tmp_path / "cert.pem"))
    with pytest.raises(OSError):
        JobClient("a:1", tls_ca=str(tmp_path / "missing.pem"))
