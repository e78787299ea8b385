"""The typed server config: file < ``PAGESIFT_*`` < flags, strict types, one-line errors,
and docs/configuration.md's table generated from the same fields."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import types
from pathlib import Path

import pytest

from pagesift.cli import main
from pagesift.core.config.schema import ConfigError, ServerConfig
from pagesift.core.config.settings import OTHER_VARIABLES, config_table_markdown, load_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``PAGESIFT_*`` variable of the machine running the tests leaks in."""
    for name in list(os.environ):
        if name.upper().startswith("PAGESIFT_"):
            monkeypatch.delenv(name)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[ServerConfig]:
    """Replace ``pagesift.node.grpcserver`` by a module whose ``serve`` records its config."""
    seen: list[ServerConfig] = []

    def serve(config: ServerConfig) -> int:
        seen.append(config)
        return 0

    module = types.ModuleType("pagesift.node.grpcserver")
    module.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pagesift.node.grpcserver", module)
    return seen


def write_conf(tmp_path: Path, body: str) -> Path:
    conf = tmp_path / "c.toml"
    conf.write_text(body if body.startswith(("[server", "server =")) else "[server]\n" + body)
    return conf


# ---------------------------------------------------------------- bad values


UNKNOWN = "unknown key, expected one of docs/configuration.md"
JSON_OBJECT = 'expected a JSON object of name: URL, e.g. {"eu": "http://proxy:3128"}'
BAD = [
    # (file body or None, {PAGESIFT_* variables}, the message after "error: config: ")
    ('fsync = "false"', {}, 'fsync (file {conf}): expected true or false, got "false"'),
    ("fsync = 1", {}, "fsync (file {conf}): expected true or false, got 1"),
    ("max_retries = 3.0", {}, "max_retries (file {conf}): expected an integer, got 3.0"),
    ("max_retries = true", {}, "max_retries (file {conf}): expected an integer, got true"),
    ('max_retries = "3"', {}, 'max_retries (file {conf}): expected an integer, got "3"'),
    ('read_timeout = "5"', {}, 'read_timeout (file {conf}): expected a number, got "5"'),
    ("read_timeout = -1.0", {}, "read_timeout (file {conf}): expected a number >= 0, got -1.0"),
    ("listen = 5", {}, "listen (file {conf}): expected a string, got 5"),
    (
        'listen = "nohost"',
        {},
        'listen (file {conf}): expected HOST:PORT (a port 1-65535), got "nohost"',
    ),
    ("data = 5", {}, "data (file {conf}): expected a path (a string), got 5"),
    (
        "per_host_concurrency = 0",
        {},
        "per_host_concurrency (file {conf}): expected a number >= 1, got 0",
    ),
    (
        "proxies = 1",
        {},
        "proxies (file {conf}): expected a [server.proxies] table of name = string, got 1",
    ),
    ("[server.proxies]\neu = 1\n", {}, "proxies.eu (file {conf}): expected a string, got 1"),
    ("fsinc = true", {}, "fsinc (file {conf}): {unknown} (did you mean fsync?)"),
    ("server = 1", {}, "server (file {conf}): expected a [server] table, got 1"),
    (
        None,
        {"PAGESIFT_FSYNC": "yes"},
        'fsync (env PAGESIFT_FSYNC): expected true, false, 1 or 0, got "yes"',
    ),
    (
        None,
        {"PAGESIFT_MAX_RETRIES": "1.5"},
        'max_retries (env PAGESIFT_MAX_RETRIES): expected an integer, got "1.5"',
    ),
    (
        None,
        {"PAGESIFT_READ_TIMEOUT": "soon"},
        'read_timeout (env PAGESIFT_READ_TIMEOUT): expected a number, got "soon"',
    ),
    (
        None,
        {"PAGESIFT_WITNESS_TTL": "-1"},
        'witness_ttl (env PAGESIFT_WITNESS_TTL): expected a number >= 0, got "-1"',
    ),
    (None, {"PAGESIFT_NO_SUCH": "1"}, "no_such (env PAGESIFT_NO_SUCH): {unknown}"),
    (
        None,
        {"PAGESIFT_FSYNCC": "1"},
        "fsyncc (env PAGESIFT_FSYNCC): {unknown} (did you mean fsync?)",
    ),
    (None, {"PAGESIFT_PROXIES": "{eu"}, 'proxies (env PAGESIFT_PROXIES): {json}, got "{{eu"'),
    (
        None,
        {"PAGESIFT_PROXIES": '["eu"]'},
        'proxies (env PAGESIFT_PROXIES): {json}, got "[\\"eu\\"]"',
    ),
    (
        None,
        {"PAGESIFT_PROXIES": '{"eu": 1}'},
        "proxies.eu (env PAGESIFT_PROXIES): expected a string, got 1",
    ),
]


@pytest.mark.parametrize(("body", "env", "message"), BAD)
def test_bad_value_exits_2_with_one_line(
    served: list[ServerConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    body: str | None,
    env: dict[str, str],
    message: str,
) -> None:
    argv = ["serve"]
    conf = None
    if body is not None:
        conf = write_conf(tmp_path, body)
        argv += ["--config", str(conf)]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    expected = message.format(conf=conf, unknown=UNKNOWN, json=JSON_OBJECT)
    assert err == "error: config: " + expected + "\n"
    assert served == []


def test_bad_toml_is_one_line(
    served: list[ServerConfig], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = write_conf(tmp_path, "[server\n")
    assert main(["serve", "--config", str(conf)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: config: file {conf}: not TOML: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_other_tools_variables_are_not_server_keys(served: list[ServerConfig]) -> None:
    env = dict.fromkeys(OTHER_VARIABLES, "x")
    assert load_config(None, {}, env) == ServerConfig()


# ---------------------------------------------------------------- precedence


def test_defaults_are_the_dataclass_defaults() -> None:
    assert load_config(None, {}, {}) == ServerConfig()


def test_env_overrides_file(
    served: list[ServerConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = write_conf(tmp_path, 'fsync = false\nread_timeout = 5\nmax_retries = 2\ndata = "/f"\n')
    monkeypatch.setenv("PAGESIFT_FSYNC", "true")
    monkeypatch.setenv("PAGESIFT_READ_TIMEOUT", "7.5")
    monkeypatch.setenv("pagesift_data", "/e")  # any case
    monkeypatch.setenv("PAGESIFT_PROXIES", '{"eu": "http://proxy.example:3128"}')
    assert main(["serve", "--config", str(conf)]) == 0
    (cfg,) = served
    assert cfg.fsync is True
    assert cfg.read_timeout == 7.5
    assert cfg.max_retries == 2  # the file's, the environment does not name it
    assert cfg.data == Path("/e")
    assert cfg.proxies == {"eu": "http://proxy.example:3128"}


def test_flags_override_env(
    served: list[ServerConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = write_conf(tmp_path, 'listen = "127.0.0.1:7000"\njob_ttl_seconds = 10\n')
    monkeypatch.setenv("PAGESIFT_LISTEN", "127.0.0.1:7001")
    monkeypatch.setenv("PAGESIFT_JOB_TTL_SECONDS", "20")
    monkeypatch.setenv("PAGESIFT_FSYNC", "0")
    argv = ["serve", "--config", str(conf), "--listen", "127.0.0.1:7002", "--fsync"]
    assert main([*argv, "--data", str(tmp_path)]) == 0
    (cfg,) = served
    assert cfg.listen == "127.0.0.1:7002"
    assert cfg.fsync is True
    assert cfg.job_ttl_seconds == 20.0  # env over file, no flag
    assert cfg.data == tmp_path


def test_strict_but_not_petty(tmp_path: Path) -> None:
    """A float key takes an integer; ``data`` is a Path; the result is still a dataclass."""
    conf = write_conf(tmp_path, 'read_timeout = 5\ndata = "/srv/x"\n[server.proxies]\n')
    cfg = load_config(conf, {}, {"PAGESIFT_RESPECT_ROBOTS": "FALSE"})
    assert cfg.read_timeout == 5.0 and isinstance(cfg.read_timeout, float)
    assert cfg.data == Path("/srv/x")
    assert cfg.respect_robots is False
    assert dataclasses.replace(cfg, fsync=True).fsync


def test_flag_bounds_are_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"^per_host_concurrency \(command line\): "):
        load_config(None, {"per_host_concurrency": 0}, {})


# ---------------------------------------------------------------- docs/configuration.md


def test_the_configuration_doc_has_the_generated_config_table() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    found = re.findall(
        r"<!-- config-table:begin -->\n(.*?)<!-- config-table:end -->", doc, re.DOTALL
    )
    assert len(found) == 1, "docs/configuration.md needs one config-table:begin/end marker pair"
    assert found[0] == config_table_markdown(), (
        "docs/configuration.md's config table is stale: paste "
        "pagesift.core.config.settings.config_table_markdown()"
    )


def test_every_key_is_in_the_table() -> None:
    table = config_table_markdown()
    for f in dataclasses.fields(ServerConfig):
        assert f"| `{f.name}` |" in table
