"""The model endpoint's settings, read once from the server config (``ModelSettings``).

What it owns
------------
``ModelSettings.from_config``: the ``model_*`` keys of ``ServerConfig`` checked as a
whole and turned into what the endpoint client needs (base URL, model, key, bounds),
or None when ``model_url`` is empty (the node offers no model formats). A node calls
it at start-up, so a bad key refuses the start (``ConfigError`` naming the key)
instead of failing the first page that asks.

Why it is safe
--------------
- The key is read from a file (never from the config's text or the environment's
  value itself) and never logged; ``__repr__`` leaves it out.
- The endpoint is the operator's: it is exempt from the address guard only when
  ``model_bypass_address_guard`` says so (``guarded``); otherwise a model URL on a
  loopback or private address is refused at connect time like any page's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from pagesift.core.config.schema import ConfigError, ServerConfig

__all__ = ["RESPONSE_FORMATS", "ModelSettings"]

RESPONSE_FORMATS = ("json_schema", "json_object")


@dataclass(frozen=True)
class ModelSettings:
    base_url: str  # ends without "/": ``{base_url}/chat/completions`` is the call
    model: str
    key: str = field(default="", repr=False)
    timeout: float = 60.0
    max_tokens: int = 1_024
    input_tokens: int = 3_000
    concurrency: int = 4
    retries: int = 2
    response_format: str = "json_schema"
    guarded: bool = True  # False: the operator exempted the endpoint from the guard

    @classmethod
    def from_config(cls, config: ServerConfig) -> ModelSettings | None:
        if not config.model_url:
            return None
        try:
            parts = urlsplit(config.model_url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            _ = parts.port
        except ValueError:
            ok = False
        if not ok or parts.query or parts.fragment:
            raise ConfigError(
                f"model_url (config): expected an http(s):// base URL such as "
                f"http://127.0.0.1:8080/v1, got {config.model_url!r}"
            )
        if not config.model_name:
            raise ConfigError("model_name (config): expected the model's name with model_url")
        if config.model_response_format not in RESPONSE_FORMATS:
            raise ConfigError(
                f"model_response_format (config): expected one of {', '.join(RESPONSE_FORMATS)}"
                f", got {config.model_response_format!r}"
            )
        key = ""
        if config.model_key_file:
            try:
                key = Path(config.model_key_file).read_text().strip()
            except OSError as e:
                raise ConfigError(
                    f"model_key_file (config): cannot read {config.model_key_file}: {e.strerror}"
                ) from None
            if not key or any(c.isspace() for c in key):
                raise ConfigError(
                    f"model_key_file (config): {config.model_key_file} must hold one key"
                )
        return cls(
            base_url=config.model_url.rstrip("/"),
            model=config.model_name,
            key=key,
            timeout=config.model_timeout,
            max_tokens=config.model_max_tokens,
            input_tokens=config.model_input_tokens,
            concurrency=config.model_concurrency,
            retries=config.model_retries,
            response_format=config.model_response_format,
            guarded=not (config.model_bypass_address_guard or config.allow_private_networks),
        )
