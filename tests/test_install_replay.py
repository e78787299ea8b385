"""Every instruction that installs a node, replayed in a fresh venv (issue 18, point 1).

No image can be built on these machines (no base-image registry), so this module stands
in for ``docker build -f deploy/Dockerfile``, and for every other place that tells
someone how to install a node: each ``pip install`` line in the shell blocks of
README.md and docs/*.md (the systemd recipe is in docs/operations.md) and in deploy/'s
files. Compose builds its
nodes from deploy/Dockerfile and the Kubernetes manifests run that image, so the
Dockerfile's replay is theirs (``test_compose_and_kubernetes_run_the_dockerfiles_image``).

- The Dockerfile is read, not copied: its ``WORKDIR``\\ s and ``COPY``\\ s up to the
  ``RUN`` that starts with ``pip install`` are applied to a scratch directory that
  plays the image's ``/`` (files copied from the repository, as the build context has
  them), then that ``RUN``'s commands run there, split at ``&&``.
- A README, docs or deploy line runs in a scratch directory holding ``pagesift/``, a copy of
  the repository's tracked files (a clone); absolute paths (``/opt/pagesift/.venv``)
  land under the scratch directory. A registry install is replayed as written: the
  name ``pagesift`` on the package index is an unrelated project (this module found
  ``pip install 'pagesift[server]'`` installing it), so the README installs from a
  checkout.

How a command is replayed: ``python3.11 -m venv DIR`` makes a venv without pip (the
main venv's pip installs into it, ``pip --python``: seconds instead of ``ensurepip``);
``pip install ARGS`` (or ``DIR/bin/pip``) installs into the instruction's venv with ARGS
as written, less ``--no-cache-dir`` (pip's cache only saves downloads; the package
index or the cache, at the same versions); ``python``/``pagesift`` run the venv's.
Any other command in an install line fails the test, naming it, until the replay
learns it.

Then, in the venv it made, every instruction must give a node: its own checks (the
Dockerfile's import check), ``pagesift serve --help``, no distribution of the
``server`` extra missing, and ``pagesift serve`` started from that venv answers a
``pagesift jobs`` from that venv. The one install line that is not a node's is the
README's client line (its comment says "a client", and it names no ``server`` extra):
tests/test_packaging.py replays the client.

Installs that are the same pip command (the same requirement of the same tree with
the same extras and constraints: the Dockerfile's and the systemd recipe's) share one
venv, built once for the module, so the module costs about one fresh install per
distinct command (~15-20 s each with a warm pip cache).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.helpers import PAIR_TOKEN_FILE, free_port
from tests.test_deploy_kit import Instruction, dockerfile

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
README = ROOT / "README.md"
#: the markdown whose shell blocks may tell someone how to install
MARKDOWN = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: pip options that take a value (the value is not a requirement)
_VALUED = {"-c", "--constraint", "-r", "--requirement", "-f", "--find-links", "-i"}
_VALUED |= {"--index-url", "--extra-index-url", "--python", "-t", "--target"}
#: pip options that change nothing about what is installed
_CACHE_ONLY = {"--no-cache-dir"}
_SHELL_REDIRECTS = {">", ">>", "2>", "2>&1", "&>"}


# ---------------------------------------------------------------- reading the instructions


@dataclass(frozen=True)
class Copy:
    source: str  # relative to the repository (the build context)
    dest: str  # absolute, in the image


@dataclass(frozen=True)
class InstallInstruction:
    """One place that says how to install: where, what to copy first (Dockerfile),
    where it runs, and its shell commands (split at ``&&``)."""

    where: str
    commands: tuple[tuple[str, ...], ...]
    copies: tuple[Copy, ...] = ()
    workdir: str = ""  # absolute, in the image/scratch root; "" = the clone's parent
    comment: str = ""  # the line's shell comment

    @property
    def pip_args(self) -> list[str]:
        found = [a for a in map(pip_install_args, self.commands) if a is not None]
        assert len(found) == 1, f"{self.where}: {len(found)} pip installs in one line"
        return found[0]


def split_commands(line: str) -> tuple[tuple[str, ...], ...]:
    """A shell line as commands (``&&``-separated), comments and redirections dropped."""
    tokens = shlex.split(line, comments=True)
    out: list[tuple[str, ...]] = []
    current: list[str] = []
    skip_next = False
    for tok in tokens:
        if skip_next:
            skip_next = False
            continue
        if tok == "&&":
            out.append(tuple(current))
            current = []
        elif tok in _SHELL_REDIRECTS:
            skip_next = tok not in ("2>&1",)
        else:
            current.append(tok)
    if current:
        out.append(tuple(current))
    return tuple(out)


def pip_install_args(command: tuple[str, ...]) -> list[str] | None:
    """The arguments after ``pip install`` (``pip``, ``DIR/bin/pip``, ``python -m pip``)."""
    if len(command) >= 2 and Path(command[0]).name in ("pip", "pip3") and command[1] == "install":
        return list(command[2:])
    if command[1:4] == ("-m", "pip", "install"):
        return list(command[4:])
    return None


def dockerfile_install(text: str | None = None) -> InstallInstruction:
    """The Dockerfile's install: WORKDIR and COPYs before its ``RUN pip install``
    (COPY as Docker does it: a directory's contents into the destination; files into a
    destination ending in ``/`` or shared by several sources, else as the destination)."""
    steps: list[Instruction] = dockerfile(text)
    workdir = "/"
    copies: list[Copy] = []
    for step in steps:
        if step.keyword == "WORKDIR":
            workdir = str(Path(workdir) / step.args)
        elif step.keyword == "COPY":
            *sources, dest = shlex.split(step.args)
            assert not any(s.startswith("--") for s in sources), f"COPY flags: {step.args}"
            base = dest if dest.startswith("/") else str(Path(workdir) / dest)
            into = dest.endswith("/") or len(sources) > 1
            for source in sources:
                is_file = (ROOT / source).is_file()
                target = str(Path(base) / Path(source).name) if into and is_file else base
                copies.append(Copy(source, target))
        elif step.keyword == "RUN" and step.args.startswith("pip install"):
            return InstallInstruction(
                "deploy/Dockerfile", split_commands(step.args), tuple(copies), workdir
            )
    raise AssertionError("deploy/Dockerfile has no RUN pip install")


def _shell_blocks(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line in a fenced ``sh``/``bash``/``console`` block."""
    inside = shell = False
    for n, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            inside = not inside
            shell = inside and stripped[3:].strip() in ("sh", "bash", "shell", "console")
            continue
        if inside and shell:
            yield n, line


def _comment(line: str) -> str:
    """The shell comment of ``line``: after the first ``#`` that starts a word outside
    quotes."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[i + 1 :].strip()
    return ""


def text_installs() -> list[InstallInstruction]:
    """Every ``pip install`` line in the shell blocks of README.md and docs/*.md and in
    deploy/'s files (outside the Dockerfile, whose install ``dockerfile_install`` reads)."""
    found: list[InstallInstruction] = []
    for doc in MARKDOWN:
        for n, line in _shell_blocks(doc.read_text()):
            if "pip install" in line:
                body = line.lstrip("$ ")
                comment = _comment(body)
                code = (
                    body[: len(body) - len(comment)].rstrip().removesuffix("#") if comment else body
                )
                where = f"{doc.relative_to(ROOT)}:{n}"
                found.append(InstallInstruction(where, split_commands(code), comment=comment))
    for path in sorted(DEPLOY.rglob("*")):
        if not path.is_file() or path.name == "Dockerfile" or "secrets" in path.parts:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), start=1):
            if "pip install" in line:
                body = line.strip().lstrip("#").strip()
                where = f"{path.relative_to(ROOT)}:{n}"
                found.append(InstallInstruction(where, split_commands(body)))
    return found


def requirements(args: list[str]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in _VALUED:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def is_client_install(instruction: InstallInstruction) -> bool:
    """A line whose comment says it installs a client, and that asks for no ``server``
    extra: tests/test_packaging.py replays the client. Every other install line must
    give a node (a line that says nothing is taken for a node's: the systemd recipe's
    ``pip install ./pagesift`` was one, and gave a node without its dependencies)."""
    says_client = "client" in instruction.comment.casefold()
    return says_client and not any("server" in r for r in requirements(instruction.pip_args))


def node_installs() -> list[InstallInstruction]:
    return [dockerfile_install()] + [i for i in text_installs() if not is_client_install(i)]


# ---------------------------------------------------------------- replaying them


def _run(
    argv: list[str | Path], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def _ok(out: subprocess.CompletedProcess[str], what: str) -> str:
    assert out.returncode == 0, f"{what}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _copy_tree(src: Path, dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    if src.is_dir():
        shutil.copytree(src, dest, ignore=ignore, dirs_exist_ok=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)


def _clone(dest: Path) -> Path:
    """The repository's tracked files (what a clone has), working-tree versions."""
    names = _ok(_run(["git", "ls-files", "-z"], ROOT), "git ls-files").split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


@dataclass
class Venv:
    root: Path
    checks: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def bin(self) -> Path:
        return self.root / "bin"


@dataclass
class Replayer:
    """Replays install instructions; one venv per distinct pip command (``key``)."""

    base: Path
    venvs: dict[str, Venv] = field(default_factory=dict)
    served: set[str] = field(default_factory=set)

    def _scratch(self, name: str) -> Path:
        path = (
            self.base / f"{len(list(self.base.iterdir()))}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"
        )
        path.mkdir(parents=True)
        return path

    def key(self, instruction: InstallInstruction, cwd: Path, rootfs: Path) -> str:
        """The pip command with its paths resolved: project trees by content of their
        pyproject, constraint files by content."""
        args = instruction.pip_args
        out, i = [], 0
        while i < len(args):
            arg = args[i]
            if arg in _CACHE_ONLY:
                i += 1
                continue
            if arg in ("-c", "--constraint") and i + 1 < len(args):
                text = self._path(args[i + 1], cwd, rootfs).read_bytes()
                out.append(f"constraints:{hashlib.sha256(text).hexdigest()[:16]}")
                i += 2
                continue
            m = re.match(r"^(.*?)(\[[^\]]*\])?$", arg)
            assert m is not None
            local = self._path(m.group(1), cwd, rootfs) if m.group(1) else None
            if local is not None and (local / "pyproject.toml").is_file():
                out.append(f"tree{m.group(2) or ''}")
            else:
                out.append(arg)
            i += 1
        return " ".join(out)

    @staticmethod
    def _path(arg: str, cwd: Path, rootfs: Path) -> Path:
        return rootfs / arg.lstrip("/") if arg.startswith("/") else cwd / arg

    def replay(self, instruction: InstallInstruction) -> Venv:
        scratch = self._scratch(instruction.where)
        rootfs = scratch / "root"
        if instruction.copies:  # the Dockerfile: the build context's files into the image
            for copy in instruction.copies:
                _copy_tree(ROOT / copy.source, rootfs / copy.dest.lstrip("/"))
            cwd = rootfs / instruction.workdir.lstrip("/")
        else:  # a recipe run next to a clone of the repository
            cwd = scratch / "home"
            _clone(cwd / "pagesift")
        cwd.mkdir(parents=True, exist_ok=True)
        key = self.key(instruction, cwd, rootfs)
        venv: Venv | None = self.venvs.get(key)
        for command in instruction.commands:
            args = pip_install_args(command)
            name = Path(command[0]).name
            if args is not None:
                if venv is None:
                    if Path(command[0]).name == command[0]:  # a bare pip: a fresh venv
                        target = scratch / "venv"
                    else:
                        target = self._path(str(Path(command[0]).parent.parent), cwd, rootfs)
                    venv = self._install(target, args, cwd, rootfs)
                    self.venvs[key] = venv
            elif re.fullmatch(r"python(3(\.\d+)?)?", name) and command[1:3] == ("-m", "venv"):
                continue  # the venv is made with the install (or shared: same command)
            elif name in ("python", "pagesift"):
                assert venv is not None, f"{instruction.where}: {command} before pip install"
                venv.checks.append(command)
                _ok(_run([venv.bin / name, *command[1:]], cwd), f"{instruction.where}: {command}")
            else:
                raise AssertionError(
                    f"{instruction.where}: the replay does not know {shlex.join(command)!r}"
                )
        assert venv is not None, f"{instruction.where}: no pip install"
        return venv

    def _install(self, target: Path, args: list[str], cwd: Path, rootfs: Path) -> Venv:
        _ok(_run([sys.executable, "-m", "venv", "--without-pip", target], cwd), "venv")
        pip_args = [a for a in args if a not in _CACHE_ONLY]
        for i, arg in enumerate(pip_args):  # absolute paths live under the scratch root
            if arg.startswith("/") and i and pip_args[i - 1] in _VALUED:
                pip_args[i] = str(self._path(arg, cwd, rootfs))
        argv: list[str | Path] = [
            sys.executable, "-m", "pip", "--python", target / "bin" / "python",
            "install", "-q", *pip_args,
        ]  # fmt: skip
        _ok(_run(argv, cwd, timeout=600), f"pip install {shlex.join(pip_args)}")
        return Venv(target)


@pytest.fixture(scope="module")
def replayer(tmp_path_factory: pytest.TempPathFactory) -> Replayer:
    return Replayer(tmp_path_factory.mktemp("install-replay"))


def _serves(venv: Venv, tmp: Path) -> None:
    """``pagesift serve`` from ``venv`` starts and answers ``pagesift jobs`` from it."""
    port = free_port()
    data = tmp / "data"
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen(
        [
            str(venv.bin / "pagesift"), "serve", "--role", "primary",
            "--listen", f"127.0.0.1:{port}", "--data", str(data),
            "--replication-token-file", str(PAIR_TOKEN_FILE),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            jobs = _run(
                [venv.bin / "pagesift", "jobs", "--server", f"127.0.0.1:{port}", "--json"],
                tmp,
                timeout=30,
            )
            if jobs.returncode == 0:
                assert isinstance(json.loads(jobs.stdout)["jobs"], list)
                return
            assert proc.poll() is None, (tmp / "serve.log").read_text()
            assert time.monotonic() < deadline, f"no answer: {jobs.stdout}{jobs.stderr}"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


# ---------------------------------------------------------------- the tests


def test_the_install_instructions_are_found_and_each_is_a_node_or_the_client() -> None:
    docker = dockerfile_install()
    assert docker.copies and docker.workdir == "/src"
    copied = {c.source for c in docker.copies}
    assert {"pyproject.toml", "README.md", "constraints.txt", "shared"} <= copied
    assert "--no-cache-dir" in docker.pip_args and "constraints.txt" in docker.pip_args
    where = [i.where for i in node_installs()]
    # the Dockerfile, README's `pip install 'pagesift[server]'`, and the systemd recipe
    assert len(where) >= 3, where
    texts = text_installs()
    assert sum(is_client_install(i) for i in texts) == 1  # README's client line
    for instruction in texts:
        assert instruction.pip_args  # every line found has a pip install the replay reads


#: deploy/Dockerfile's install before issue 18 (the image then failed to build)
OLD_DOCKERFILE_INSTALL = """\
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY primary ./primary
COPY standby ./standby
RUN pip install --no-cache-dir . \\
    && python -c "import pagesift.cli, grpc_health.v1.health_pb2"
"""


@pytest.mark.system
def test_the_replay_fails_the_dockerfile_that_installed_no_server_extra(
    replayer: Replayer,
) -> None:
    old = dockerfile_install(OLD_DOCKERFILE_INSTALL)
    assert old.pip_args == ["--no-cache-dir", "."]
    with pytest.raises(AssertionError, match="No module named 'grpc_health'"):
        replayer.replay(old)


def test_compose_and_kubernetes_run_the_dockerfiles_image() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    builds = [s["build"] for s in compose["services"].values() if "build" in s]
    builds += [compose["x-node"]["build"]] if "build" in compose.get("x-node", {}) else []
    assert builds and all(b["dockerfile"] == "deploy/Dockerfile" for b in builds)
    assert all((DEPLOY / b["context"]).resolve() == ROOT for b in builds)
    pods = [
        doc["spec"]["template"]["spec"]
        for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "StatefulSet" and doc["metadata"]["name"] == "pagesift"
    ]
    (pod,) = pods
    images = {c["image"].rsplit(":", 1)[0] for c in pod["containers"] if c["name"] == "pagesift"}
    assert images and all("pagesift" in i for i in images)  # the image built from it
    # neither installs anything itself
    for path in [DEPLOY / "compose.yaml", *sorted((DEPLOY / "k8s").glob("*.yaml"))]:
        assert "pip install" not in path.read_text() or any(
            i.where.startswith(str(path.relative_to(ROOT))) for i in text_installs()
        )


@pytest.mark.system
@pytest.mark.parametrize("instruction", node_installs(), ids=lambda i: i.where)
def test_each_node_install_instruction_gives_a_node_that_serves(
    instruction: InstallInstruction, replayer: Replayer, tmp_path: Path
) -> None:
    venv = replayer.replay(instruction)
    _ok(_run([venv.bin / "pagesift", "serve", "--help"], tmp_path), "pagesift serve --help")
    missing = _run(
        [
            venv.bin / "python",
            "-c",
            "from pagesift.cli.common import server_extra_missing as m; "
            "import sys; sys.exit(m('serve') or 0)",
        ],
        tmp_path,
    )
    _ok(missing, f"{instruction.where}: the server extra")
    if str(venv.root) not in replayer.served:  # one node start per venv
        _serves(venv, tmp_path)
        replayer.served.add(str(venv.root))
