"""The model formats of a page: FORMAT_JSON and FORMAT_SUMMARY (``ModelFormats.apply``).

What it owns
------------
The step between a page's fetch and its write group: for each model format a request
asks for, the page's markdown (``onlyMainContent`` already applied by the extractor,
cut to ``model_input_tokens``: ``prompts.cut_markdown``) and the task go to the model
endpoint; the answer is judged against the schema (``answers.judge``) and asked again
at most ``model_retries`` times with the reason; then the document carries the value
(``Document.json``, ``Document.summary``) or a ``FormatError`` saying why not
(``invalid_answer``, ``model_unavailable``, ``tokens_exhausted``), and
``Document.model_usage`` counts the calls and the tokens the server reported. The
rest of the document stands whatever the model does.

The model cache
---------------
An answer is named by ``answer_digest`` (SHA-256 of the format, the markdown sent,
the schema, the prompts and the model's name), so the same content asked the same
question is the same answer whatever URL or fetch it came from. With ``max_age`` set
(the page cache's rule) a fresh answer is taken from the account's cache
(``cached``) instead of a call, and fresh answers are handed to the page's write group
(``Page.model_answers``), which keeps them beside the page cache
(``pagecache.remember``) and ages them out with it (``page_cache_ttl``).

Why it is safe (durability)
---------------------------
The answers are part of the page's document, so they are written in the page's one
group: replicated with it, returned by every read, and never asked again once the
page is recorded (a done page is not fetched again after a restart or a failover).
Only pages in flight at a crash are asked again: at most the running jobs' page
concurrency, each for at most (1 + ``model_retries``) calls per model format. The
account's day of tokens is checked before every call (``quota.token_limit_hit``) and
charged in the page's group; calls in flight at once can pass it by at most their
own tokens (``model_concurrency`` calls).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pagesift.core.jobs import quota
from pagesift.core.jobs.accounts import Accounts
from pagesift.core.jobs.modelrequests import parse_schema
from pagesift.primary.engine.interface import Page
from pagesift.primary.models import prompts
from pagesift.primary.models.answers import Invalid, judge
from pagesift.primary.models.endpoint import Answer, ModelEndpoint, ModelUnavailable
from pagesift.v1 import jobs_pb2

__all__ = ["ModelFormats", "Task", "answer_digest"]

Reader = Callable[[str], bytes | None]


@dataclass(frozen=True)
class Task:
    """One question to the model: its messages, the schema of its answer, its name."""

    fmt: int
    messages: list[dict[str, str]]
    schema: Mapping[str, Any]
    digest: str


def answer_digest(fmt: int, markdown: str, *parts: str) -> str:
    h = hashlib.sha256(f"{fmt}\0".encode())
    h.update(hashlib.sha256(markdown.encode()).digest())
    for part in parts:
        h.update(b"\0" + part.encode())
    return h.hexdigest()


@dataclass
class _Outcome:
    value: Any = None
    error: jobs_pb2.FormatError | None = None


class ModelFormats:
    def __init__(self, endpoint: ModelEndpoint, accounts: Accounts, read: Reader) -> None:
        self.endpoint = endpoint
        self.accounts = accounts
        self._read = read  # the store's get: the account's token day

    @property
    def settings_model(self) -> str:
        return self.endpoint.settings.model

    def tasks(self, doc: jobs_pb2.Document, options: jobs_pb2.ScrapeOptions) -> list[Task]:
        """The questions ``options`` asks of ``doc``, in format order."""
        markdown, _ = prompts.cut_markdown(doc.markdown, self.endpoint.settings.input_tokens)
        out: list[Task] = []
        url = doc.final_url or doc.url
        for fmt in options.formats:
            if fmt == jobs_pb2.FORMAT_JSON:
                schema = parse_schema(options.json.schema, "options.json.schema")
                messages = prompts.json_messages(
                    url, markdown, options.json.prompt, schema, options.json.system_prompt
                )
                canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"))
                digest = answer_digest(
                    fmt, markdown, canonical, options.json.prompt,
                    options.json.system_prompt, self.settings_model,
                )  # fmt: skip
                out.append(Task(fmt, messages, schema, digest))
            elif fmt == jobs_pb2.FORMAT_SUMMARY:
                messages = prompts.summary_messages(url, markdown)
                digest = answer_digest(fmt, markdown, self.settings_model)
                out.append(Task(fmt, messages, prompts.SUMMARY_SCHEMA, digest))
        return out

    async def apply(
        self,
        page: Page,
        options: jobs_pb2.ScrapeOptions,
        owner: str,
        cached: Reader | None = None,
    ) -> None:
        """Fill ``page``'s model formats (above); ``cached`` reads the account's model
        cache by digest (None: no cache, the request set no ``max_age``)."""
        if page.not_modified or page.cache:
            return  # no document, or the cached one with its answers
        tasks = self.tasks(page.document, options)
        if not tasks:
            return
        doc = page.document
        usage = jobs_pb2.ModelUsage()
        for task in tasks:
            record = cached(task.digest) if cached is not None else None
            outcome = _from_record(record) if record is not None else None
            if outcome is not None:
                usage.cached += 1
            else:
                outcome = await self._ask(owner, task, usage)
                if outcome.error is None:
                    page.model_answers.append((task.digest, _record(outcome.value)))
            if outcome.error is not None:
                outcome.error.format = task.fmt  # type: ignore[assignment]
                doc.format_errors.append(outcome.error)
            elif task.fmt == jobs_pb2.FORMAT_JSON:
                doc.json = json.dumps(outcome.value, ensure_ascii=False, separators=(",", ":"))
            else:
                doc.summary = str(outcome.value["summary"])
        doc.model_usage.CopyFrom(usage)

    async def _ask(self, owner: str, task: Task, usage: jobs_pb2.ModelUsage) -> _Outcome:
        messages = task.messages
        reason = ""
        for _ in range(1 + self.endpoint.settings.retries):
            spent = self._tokens_spent(owner)
            if spent is not None:
                return _Outcome(error=_error("tokens_exhausted", spent))
            try:
                answer: Answer = await self.endpoint.complete(owner, messages, schema=task.schema)
            except ModelUnavailable as e:
                return _Outcome(error=_error("model_unavailable", e.reason))
            usage.calls += 1
            usage.input_tokens += answer.input_tokens
            usage.output_tokens += answer.output_tokens
            judged = judge(answer.text, task.schema)
            if not isinstance(judged, Invalid):
                return _Outcome(value=judged)
            self.endpoint.count_invalid()
            reason = judged.reason
            messages = prompts.retry_messages(task.messages, answer.text, reason)
        calls = 1 + self.endpoint.settings.retries
        return _Outcome(
            error=_error("invalid_answer", f"no answer valid under the schema in {calls} "
                         f"call(s); the last: {reason}")
        )  # fmt: skip

    def _tokens_spent(self, owner: str) -> str | None:
        account = self.accounts.get(owner)
        if account is None:
            return None
        hit = quota.token_limit_hit(_ReaderView(self._read), account, time.time())
        return None if hit is None else hit.message


class _ReaderView:
    def __init__(self, read: Reader) -> None:
        self.get = read


def _error(code: str, message: str) -> jobs_pb2.FormatError:
    return jobs_pb2.FormatError(code=code, message=message)


def _record(value: Any) -> bytes:
    return json.dumps({"value": value, "stored_ms": int(time.time() * 1000)}).encode()


def _from_record(raw: bytes) -> _Outcome | None:
    try:
        return _Outcome(value=json.loads(raw)["value"])
    except (ValueError, KeyError, TypeError):
        return None  # an unreadable record is asked again, never trusted
