"""The model endpoint client: one OpenAI-compatible chat-completions call (``ModelEndpoint``).

What it owns
------------
``complete(owner, messages, schema=...)``: one ``POST {base_url}/chat/completions``
(the interface vLLM, Ollama, llama.cpp's server, LM Studio and OpenAI all speak), its
answer's text and the token counts the server reports (``usage.prompt_tokens`` and
``completion_tokens``), with ``temperature`` 0. With a JSON schema it is sent as the
response format (``model_response_format``: OpenAI's ``json_schema``, or
``json_object`` with a ``schema``, which llama.cpp's server turns into a grammar), so a
server with constrained decoding can only answer in it; the answer is still checked by
the caller (``answers``), never trusted.

Protocol and bounds
-------------------
- Calls wait for one of ``model_concurrency`` slots, shared fairly between accounts
  (``fairslots``); ``model_timeout`` bounds a call from its slot on (connect, the
  whole answer); the answer's body is read up to ``MAX_ANSWER_BYTES``.
- Every failure (connection, timeout, a non-2xx status, a body that is not an
  OpenAI answer) is ``ModelUnavailable`` with a one-line reason; nothing else escapes
  but ``CancelledError``.
- Each call is a span (``model.complete``) and is counted in ``pagesift_model_calls``,
  ``pagesift_model_seconds`` and ``pagesift_model_tokens``.

Why it is safe
--------------
The connector is the address guard's (``netguard.guarded_connector``) unless the
operator exempted the endpoint (``ModelSettings.guarded``), so a model URL cannot be
turned into a way into the node's private network by anything but the operator's
own config. The key goes only in the ``Authorization`` header of these calls.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from pagesift.core.api.metrics import Metrics
from pagesift.core.util import tracing
from pagesift.primary.engine.netguard import AddressGuard, BlockedAddressError, guarded_connector
from pagesift.primary.models.fairslots import FairSlots
from pagesift.primary.models.settings import ModelSettings

__all__ = ["MAX_ANSWER_BYTES", "Answer", "ModelEndpoint", "ModelUnavailable"]

MAX_ANSWER_BYTES = 4 * 1024 * 1024
Message = Mapping[str, str]


class ModelUnavailable(Exception):
    """The endpoint gave no answer (down, slow, refusing, or speaking something else)."""

    def __init__(self, reason: str, *, timeout: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.timeout = timeout


@dataclass(frozen=True)
class Answer:
    text: str
    input_tokens: int
    output_tokens: int


def response_format(kind: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The request's ``response_format`` for a JSON schema, in the configured shape."""
    if kind == "json_object":
        return {"type": "json_object", "schema": dict(schema)}
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": dict(schema)}}


def read_answer(body: Any) -> Answer:
    """An OpenAI chat-completions body's first choice and usage; ``ModelUnavailable``
    when the body is not one."""
    try:
        text = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ModelUnavailable("the endpoint's answer has no choices[0].message.content") from None
    if not isinstance(text, str):
        raise ModelUnavailable("the endpoint's answer content is not text")
    usage = body.get("usage") if isinstance(body, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    tokens_in, tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return Answer(
        text,
        tokens_in if isinstance(tokens_in, int) and tokens_in >= 0 else 0,
        tokens_out if isinstance(tokens_out, int) and tokens_out >= 0 else 0,
    )


class ModelEndpoint:
    def __init__(self, settings: ModelSettings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.slots = FairSlots(settings.concurrency)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            guard = AddressGuard() if self.settings.guarded else None
            headers = {"Content-Type": "application/json"}
            if self.settings.key:
                headers["Authorization"] = f"Bearer {self.settings.key}"
            self._session = aiohttp.ClientSession(
                connector=guarded_connector(guard, limit=self.settings.concurrency),
                headers=headers,
            )
        return self._session

    async def complete(
        self,
        owner: str,
        messages: Sequence[Message],
        *,
        schema: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> Answer:
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": min(max_tokens or self.settings.max_tokens, self.settings.max_tokens),
            "temperature": 0,
            "stream": False,
        }
        if schema is not None:
            body["response_format"] = response_format(self.settings.response_format, schema)
        async with self.slots.slot(owner):
            started = time.monotonic()
            with tracing.span("model.complete", {"model": self.settings.model, "owner": owner}):
                try:
                    answer = await asyncio.wait_for(self._post(body), self.settings.timeout)
                except TimeoutError:
                    self._count("timeout", started)
                    raise ModelUnavailable(
                        f"the model endpoint did not answer within {self.settings.timeout:g} s"
                        " (model_timeout)",
                        timeout=True,
                    ) from None
                except ModelUnavailable:
                    self._count("failed", started)
                    raise
            self._count("ok", started, answer)
            return answer

    def count_invalid(self) -> None:
        """An answer came back but was not valid under the schema (``answers``)."""
        if self.metrics is not None:
            self.metrics.model_calls.labels("invalid_answer").inc()

    def _count(self, outcome: str, started: float, answer: Answer | None = None) -> None:
        if self.metrics is None:
            return
        tokens_in = answer.input_tokens if answer else 0
        tokens_out = answer.output_tokens if answer else 0
        self.metrics.model_called(outcome, time.monotonic() - started, tokens_in, tokens_out)

    async def _post(self, body: dict[str, Any]) -> Answer:
        url = f"{self.settings.base_url}/chat/completions"
        try:
            async with self._client().post(url, data=json.dumps(body)) as resp:
                raw = await resp.content.read(MAX_ANSWER_BYTES + 1)
                if resp.status // 100 != 2:
                    text = raw[:200].decode("utf-8", "replace").replace("\n", " ")
                    raise ModelUnavailable(f"the model endpoint answered {resp.status}: {text}")
        except aiohttp.ClientConnectorError as e:
            if isinstance(e.os_error, BlockedAddressError):  # nothing was sent
                raise ModelUnavailable(
                    f"the model endpoint is {e.os_error} (model_bypass_address_guard exempts "
                    "an operator's endpoint)"
                ) from None
            raise ModelUnavailable(f"the model endpoint failed: {e}") from None
        except aiohttp.ClientError as e:
            raise ModelUnavailable(f"the model endpoint failed: {e}") from None
        except OSError as e:  # the address guard's refusal included
            raise ModelUnavailable(f"the model endpoint failed: {e}") from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise ModelUnavailable(f"the model endpoint's answer is over {MAX_ANSWER_BYTES} bytes")
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise ModelUnavailable("the model endpoint's answer is not JSON") from None
        return read_answer(parsed)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
