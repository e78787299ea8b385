"""Loading and checking ``ServerConfig``: the file, ``PAGESIFT_*`` variables, the flags.

``ServerConfig`` stays a plain dataclass (every caller builds it with keyword
arguments and copies it with ``dataclasses.replace``, neither of which checks
anything); this module checks the values that come from outside, with a
pydantic-settings model generated from the dataclass's fields (their types, defaults
and ``Doc`` bounds). Each source is read and checked on its own, so an error names
where the bad value came from:

- the TOML file's ``[server]`` table (``[server.proxies]`` for the proxy pool):
  TOML types as they are (strict: ``fsync = "false"`` is an error, ``read_timeout =
  5`` is fine, ``max_retries = 3.0`` is not);
- ``PAGESIFT_<KEY>`` (any case): a bool is true/false/1/0, an int is digits, a float
  any number, a path or string as given, and ``PAGESIFT_PROXIES`` a JSON object
  (``{"eu": "http://proxy.example:3128"}``). An unknown ``PAGESIFT_*`` variable is an
  error, except those the other tools read (``OTHER_VARIABLES``);
- the ``serve`` flags (``overrides``; argparse has typed them, their bounds are checked
  here too).

Later sources win, per key. ``config_table_markdown`` renders docs/configuration.md's table of every
key from the same fields.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, create_model
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from pagesift.core.config.schema import ConfigError, Doc, ServerConfig

ENV_PREFIX = "PAGESIFT_"
#: ``PAGESIFT_*`` variables that are not server keys: the client's keys, the drill's
#: webhook secret, the health probe's settings (the container images set some of them),
#: the fault tests' write trace (``pagesift.core.replication.writetrace``)
OTHER_VARIABLES = frozenset(
    {
        "PAGESIFT_API_KEY",
        "PAGESIFT_ADMIN_KEY",
        "PAGESIFT_WEBHOOK_SECRET",
        "PAGESIFT_HEALTH_ADDR",
        "PAGESIFT_HEALTH_CA",
        "PAGESIFT_HEALTH_NAME",
        "PAGESIFT_HEALTH_TIMEOUT",
        "PAGESIFT_WRITE_TRACE",
    }
)
#: keys that are HOST:PORT when set (``listen`` always); a bad one would fail at bind
ADDRESS_KEYS = frozenset(
    {"listen", "advertise", "primary", "metrics_listen", "http_listen", "replication_listen"}
)


def _key_types() -> dict[str, tuple[Any, Doc]]:
    hints = typing.get_type_hints(ServerConfig, include_extras=True)
    out: dict[str, tuple[Any, Doc]] = {}
    for f in dataclasses.fields(ServerConfig):
        base, *extras = typing.get_args(hints[f.name])
        docs = [e for e in extras if isinstance(e, Doc)]
        if len(docs) != 1:
            raise TypeError(f"ServerConfig.{f.name}: needs Annotated[type, Doc(...)]")
        out[f.name] = (base, docs[0])
    return out


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


@cache
def settings_model() -> type[BaseSettings]:
    """The pydantic-settings model of ``ServerConfig``: strict, no unknown keys."""
    types = _key_types()
    definitions: dict[str, Any] = {}
    for f in dataclasses.fields(ServerConfig):
        base, doc = types[f.name]
        extra: dict[str, Any] = {"strict": False} if base is Path else {}
        if doc.ge is not None:
            extra["ge"] = doc.ge
        definitions[f.name] = (
            base,
            Field(default_factory=lambda f=f: _default(f), description=doc.text, **extra),
        )
    model: type[BaseSettings] = create_model(  # type: ignore[call-overload]
        "ServerSettings",
        __base__=BaseSettings,
        __config__=None,
        **definitions,
    )
    model.model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX.lower(),
        case_sensitive=False,
        extra="forbid",
        strict=True,
        validate_default=False,
    )
    model.model_rebuild(force=True)
    return model


# ---------------------------------------------------------------- messages


def _shown(value: Any) -> str:
    """A value as it was written: TOML/JSON syntax (``"false"``, ``true``, ``1.5``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return json.dumps(value)
    if isinstance(value, Path):
        return json.dumps(str(value))
    try:
        shown = json.dumps(value, default=str)
    except (TypeError, ValueError):
        shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _expected(key: str, details: ErrorDetails, env: bool) -> str:
    kind = details["type"]
    ctx = details.get("ctx") or {}
    if kind in ("greater_than_equal", "greater_than"):
        op = ">=" if kind == "greater_than_equal" else ">"
        return f"a number {op} {ctx.get('ge', ctx.get('gt')):g}"
    if kind == "dict_type":
        return (
            'a JSON object of name: URL, e.g. {"eu": "http://proxy:3128"}'
            if env
            else f"a [server.{key}] table of name = string"
        )
    if kind in ("path_type", "path_parsing"):
        return "a path (a string)"
    if kind == "bool_type":
        return "true, false, 1 or 0" if env else "true or false"
    if kind in ("int_type", "int_from_float", "int_parsing"):
        return "an integer"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return "a number"
    if kind == "string_type":
        return "a string"
    return str(details["msg"]).lower()


def _fail(key: str, source: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{key} ({source}): expected {expected}, got {_shown(value)}")


def _unknown(key: str, source: str, known: list[str]) -> ConfigError:
    near = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return ConfigError(
        f"{key} ({source}): unknown key, expected one of docs/configuration.md{hint}"
    )


# ---------------------------------------------------------------- checking


def _address_problem(value: str) -> bool:
    host, sep, port = value.strip().rpartition(":")
    return not sep or not host or not port.isdigit() or not 0 < int(port) < 65536


def _check(
    values: dict[str, Any], source_of: Mapping[str, str], raw: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``values`` validated by the model: the checked values of the keys given (``raw``:
    the ``PAGESIFT_*`` strings they were read from, quoted in errors)."""
    model = settings_model()
    for key in values:
        if key not in model.model_fields:
            raise _unknown(key, source_of[key], sorted(model.model_fields))
    try:
        checked = model.model_validate(values)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        loc = [str(part) for part in first["loc"]]
        key = loc[0] if loc else "?"
        return_key = ".".join(loc) if loc else key
        shown = raw[key] if raw is not None and len(loc) == 1 else first["input"]
        expected = _expected(key, first, env=raw is not None)
        raise _fail(return_key, source_of.get(key, "?"), expected, shown) from None
    out = {key: getattr(checked, key) for key in values}
    for key in ADDRESS_KEYS & set(out):
        if (out[key] or key == "listen") and _address_problem(out[key]):
            raise _fail(key, source_of[key], "HOST:PORT (a port 1-65535)", out[key])
    return out


def _read_file(file: Path) -> dict[str, Any]:
    with file.open("rb") as fh:
        try:
            doc = tomllib.load(fh)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"file {file}: not TOML: {err}") from None
    table = doc.get("server", {})
    if not isinstance(table, dict):
        raise ConfigError(f"server (file {file}): expected a [server] table, got {_shown(table)}")
    return table


def _parse_env(key: str, base: Any, raw: str, name: str) -> Any:
    """A ``PAGESIFT_*`` string as the key's type (``ConfigError`` when it is not one)."""
    source = f"env {name}"
    text = raw.strip()
    if base is bool:
        if text.lower() in ("true", "1"):
            return True
        if text.lower() in ("false", "0"):
            return False
        raise _fail(key, source, "true, false, 1 or 0", raw)
    if base is int:
        if not re.fullmatch(r"[+-]?\d+", text):
            raise _fail(key, source, "an integer", raw)
        return int(text)
    if base is float:
        try:
            number = float(text)
        except ValueError:
            raise _fail(key, source, "a number", raw) from None
        if math.isnan(number):
            raise _fail(key, source, "a number", raw)
        return number
    return raw


def _read_env(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The ``PAGESIFT_*`` keys set in ``env``: typed, each key's variable, its string."""
    model = settings_model()
    known = sorted(model.model_fields)
    for name in sorted(env):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in OTHER_VARIABLES:
            continue
        key = upper[len(ENV_PREFIX) :].lower()
        if key not in model.model_fields:
            raise _unknown(key, f"env {name}", known)
    source = EnvSettingsSource(model)
    source.env_vars = {k.lower(): v for k, v in env.items()}
    names = {name.lower(): name for name in env}
    types = _key_types()
    values: dict[str, Any] = {}
    source_of: dict[str, str] = {}
    strings: dict[str, str] = {}
    for key, info in model.model_fields.items():
        raw, _, complex_value = source.get_field_value(info, key)
        if raw is None:
            continue
        name = names.get(ENV_PREFIX.lower() + key, ENV_PREFIX + key.upper())
        source_of[key] = f"env {name}"
        strings[key] = raw
        base = types[key][0]
        if typing.get_origin(base) is dict:
            try:
                values[key] = source.prepare_field_value(key, info, raw, complex_value)
            except ValueError:
                raise _fail(key, source_of[key], _expected(key, _DICT, True), raw) from None
        else:
            values[key] = _parse_env(key, base, raw, name)
    return values, source_of, strings


_DICT: ErrorDetails = {"type": "dict_type", "loc": (), "msg": "", "input": None}


def load_config(
    file: Path | None, overrides: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> ServerConfig:
    """Defaults, the file's ``[server]`` table, ``PAGESIFT_*`` (``env``, default
    ``os.environ``), then non-None ``overrides`` (the flags), each over the one before;
    ``ConfigError`` (or ``OSError`` for an unreadable file) on the first bad value."""
    merged: dict[str, Any] = {}
    if file is not None:
        table = _read_file(file)
        merged.update(_check(table, dict.fromkeys(table, f"file {file}")))
    env_values, env_sources, env_strings = _read_env(os.environ if env is None else env)
    merged.update(_check(env_values, env_sources, env_strings))
    flags = {k: v for k, v in overrides.items() if v is not None}
    merged.update(_check(flags, dict.fromkeys(flags, "command line")))
    return ServerConfig(**merged)


# ---------------------------------------------------------------- docs/configuration.md


def _type_name(base: Any) -> str:
    if typing.get_origin(base) is dict:
        return "table of strings"
    return {bool: "bool", int: "integer", float: "number", str: "string", Path: "path"}[base]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, dict):
        return "{}" if not value else json.dumps(value)
    return str(value)


def config_table_markdown() -> str:
    """docs/configuration.md's table: every ``[server]`` key, its type, default and meaning."""
    types = _key_types()
    rows = [
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for f in dataclasses.fields(ServerConfig):
        base, doc = types[f.name]
        meaning = doc.text.replace("|", "\\|")
        if doc.ge is not None:
            meaning += f" (>= {doc.ge:g})"
        rows.append(f"| `{f.name}` | {_type_name(base)} | `{_toml(_default(f))}` | {meaning} |")
    return "\n".join(rows) + "\n"
