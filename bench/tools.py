"""Install-if-missing for the tools the benchmarks need, saying what it does on stdout.

- Debian packages (``nginx``, the crawl sites ``python-django-doc``, ``postgresql-doc-15``,
  ``python3.11-doc``): checked with ``dpkg-query``; missing ones are installed with
  ``apt-get update`` then ``apt-get install`` (root only). A site's HTML root is read from
  ``dpkg -L`` (``doc_root``), never guessed.
- Scrapy (pinned in ``SCRAPY_VERSION``) lives in its own virtualenv, ``bench/.venv-scrapy``,
  so the project's ``.venv`` never sees it; ``py-spy`` (for ``--profile``) and
  scrapy-playwright + playwright (the render section's peer) go there too.
  The venv gets a ``.gitignore`` of ``*`` so git, ruff and friends skip it.
- Crawlee (the render section's other peer, ``bench/crawlee/crawl.mjs``): ``npm ci`` in
  ``bench/crawlee`` from its committed ``package.json`` and ``package-lock.json`` (crawlee
  and playwright pinned there) when ``node_modules`` is missing or holds other versions;
  ``PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1``: it drives Debian's chromium-headless-shell.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.common import BENCH_DIR, run_checked, say

SCRAPY_VERSION = "2.19.0"  # what `pip install scrapy` gave on 2026-11-29; bump deliberately
PY_SPY_VERSION = "0.4.3"
# the render section's peer (bench/render_peer.py), in the same venv: it drives Debian's
# chromium-headless-shell (no browser download); playwright pinned to the node's version
SCRAPY_PLAYWRIGHT_VERSION = "0.0.48"
PLAYWRIGHT_VERSION = "1.65.2"
SCRAPY_VENV = BENCH_DIR / ".venv-scrapy"
DJANGO_DOC_PACKAGE = "python-django-doc"
POSTGRES_DOC_PACKAGE = "postgresql-doc-15"  # root /usr/share/doc/postgresql-doc-15/html
PYTHON_DOC_PACKAGE = "python3.11-doc"  # root /usr/share/doc/python3.11/html
# the crawl section's sites (``--site``): name -> (what it is, the Debian package of its HTML)
DOC_SITES = {
    "django": ("Django docs", DJANGO_DOC_PACKAGE),
    "postgres": ("PostgreSQL 15 docs", POSTGRES_DOC_PACKAGE),
    "python": ("Python 3.11 docs", PYTHON_DOC_PACKAGE),
}
CRAWLEE_DIR = BENCH_DIR / "crawlee"
APT_TIMEOUT = 900.0
PIP_TIMEOUT = 900.0


def _dpkg_installed(package: str) -> bool:
    res = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return res.returncode == 0 and "install ok installed" in res.stdout


def ensure_apt(packages: Sequence[str]) -> None:
    """Install the missing ones among ``packages`` with apt-get (after ``apt-get update``)."""
    missing = [p for p in packages if not _dpkg_installed(p)]
    for p in packages:
        if p not in missing:
            say(f"apt package {p}: installed")
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(
            f"missing Debian packages {missing}; run: sudo apt-get install -y {' '.join(missing)}"
        )
    say(f"apt packages missing: {' '.join(missing)}; installing with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run_checked(["apt-get", "update", "-q"], timeout=APT_TIMEOUT, env=env)
    run_checked(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        timeout=APT_TIMEOUT,
        env=env,
    )
    still = [p for p in missing if not _dpkg_installed(p)]
    if still:
        raise RuntimeError(f"apt-get did not install {still}")


def doc_root(package: str) -> Path:
    """The HTML root of a documentation package: the shallowest directory with an
    ``index.html`` among the files ``dpkg -L`` lists (not guessed)."""
    listing = run_checked(["dpkg", "-L", package], timeout=60).splitlines()
    roots = sorted(
        (Path(line).parent for line in listing if line.endswith("/index.html")),
        key=lambda p: len(p.parts),
    )
    for root in roots:
        if (root / "index.html").is_file():
            say(f"{package} HTML root: {root}")
            return root
    raise RuntimeError(f"no index.html in `dpkg -L {package}`")


def django_docs_root() -> Path:
    """The HTML root of python-django-doc (``doc_root``)."""
    return doc_root(DJANGO_DOC_PACKAGE)


def _venv_python() -> Path:
    return SCRAPY_VENV / "bin" / "python"


def _pip_version(python: Path, dist: str) -> str | None:
    res = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return res.stdout.strip() if res.returncode == 0 else None


def ensure_scrapy_venv(with_py_spy: bool = False, extra: dict[str, str] | None = None) -> Path:
    """``bench/.venv-scrapy`` with Scrapy (and optionally py-spy, and the ``extra``
    distributions: name -> version) pinned; returns its python."""
    python = _venv_python()
    if not python.exists():
        base = Path(os.path.realpath(sys.executable))
        say(f"creating {SCRAPY_VENV.relative_to(BENCH_DIR.parent)} with {base}")
        run_checked([str(base), "-m", "venv", str(SCRAPY_VENV)], timeout=300)
    # Keep git (and ruff, which honours .gitignore) out of the venv, as Python 3.13+ venvs do.
    gitignore = SCRAPY_VENV / ".gitignore"
    if not gitignore.exists():
        gitignore.write_text("# created by bench.tools\n*\n")
    wanted = {"scrapy": SCRAPY_VERSION}
    if with_py_spy:
        wanted["py-spy"] = PY_SPY_VERSION
    wanted.update(extra or {})
    todo = []
    for dist, version in wanted.items():
        have = _pip_version(python, dist)
        if have == version:
            say(f"{dist}=={version}: installed in {SCRAPY_VENV.name}")
        else:
            todo.append(f"{dist}=={version}")
    if todo:
        say(f"installing {' '.join(todo)} into {SCRAPY_VENV.name}")
        run_checked(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *todo],
            timeout=PIP_TIMEOUT,
        )
    return python


def ensure_render_peer() -> Path:
    """``bench/.venv-scrapy`` with scrapy-playwright and playwright pinned as well."""
    return ensure_scrapy_venv(
        extra={"scrapy-playwright": SCRAPY_PLAYWRIGHT_VERSION, "playwright": PLAYWRIGHT_VERSION}
    )


def py_spy_path() -> Path:
    return SCRAPY_VENV / "bin" / "py-spy"


def _npm_pins() -> dict[str, str]:
    """The dependencies ``bench/crawlee/package.json`` pins (name -> exact version)."""
    deps = json.loads((CRAWLEE_DIR / "package.json").read_text())["dependencies"]
    return {str(k): str(v) for k, v in deps.items()}


def crawlee_versions() -> dict[str, str | None]:
    """The versions installed in ``bench/crawlee/node_modules`` of the pinned packages."""
    have: dict[str, str | None] = {}
    for name in _npm_pins():
        manifest = CRAWLEE_DIR / "node_modules" / name / "package.json"
        try:
            have[name] = str(json.loads(manifest.read_text())["version"])
        except (OSError, ValueError, KeyError):
            have[name] = None
    return have


def ensure_crawlee() -> Path:
    """``bench/crawlee/node_modules`` as the lock file says (``npm ci`` when missing or
    other versions); returns the node executable to run ``crawl.mjs`` with."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise RuntimeError("the Crawlee peer needs node and npm: apt-get install nodejs npm")
    pins = _npm_pins()
    if crawlee_versions() == pins:
        say(f"crawlee peer: {', '.join(f'{k}@{v}' for k, v in pins.items())} installed")
        return Path(node)
    say(f"crawlee peer: npm ci in {CRAWLEE_DIR.relative_to(BENCH_DIR.parent)}")
    env = {**os.environ, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"}
    run_checked(
        [npm, "ci", "--prefix", str(CRAWLEE_DIR), "--no-audit", "--no-fund", "--loglevel=error"],
        timeout=PIP_TIMEOUT,
        env=env,
    )
    have = crawlee_versions()
    if have != pins:
        raise RuntimeError(f"npm ci left {have} in bench/crawlee, not {pins}")
    return Path(node)
