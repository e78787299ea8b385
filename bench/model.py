"""Section ``model``: the raw cost of one model call, before any node is involved.

``tests.modelserver.ModelServer`` runs llama.cpp's OpenAI-compatible server with
SmolLM2-135M-Instruct on loopback (``make model-deps`` builds ``.venv-llm``; the section
fails naming it when that is missing). Each call is one ``POST /v1/chat/completions``
with ``temperature 0``, ``max_tokens`` ``--model-max-tokens`` and the response_format the
server holds answers to (``json_object_format(SCHEMA)``, constrained decoding), on pages
of two sizes, one call after the other (the server runs one at a time):

- ``article``: one demo-site article (``pagesift.demo.pages``) as the node's own
  markdown (``pagesift.primary.extract.html.extract``, main content), about 2 KB;
- ``long``: three articles joined, about 6 KB, what a documentation page gives.

Every prompt is a different page, so llama.cpp's reuse of the previous prompt's prefix
does not flatter the figures. Per call: wall seconds, ``usage.prompt_tokens`` and
``completion_tokens`` from the answer, whether the answer is RFC 8259 JSON
(``strict_json``: the schema's grammar lets raw newlines into strings, which a strict
``json.loads`` refuses) and whether, parsed with ``strict=False``, the schema accepts it
(``valid``, ``jsonschema``). Figures: per size the median, p90 and worst latency, median
tokens in and out, prompt tokens per second (prompt_tokens / latency: a floor, the
decode's time is in it), those two counts and the answers ``max_tokens`` cut; also the
server's start time. The section fails when an answer the model ended itself is not
schema-valid. Results:
``bench/out/model.json`` and ``bench/out/model.md``. The machine's load average goes
with them (``machine_facts``): on a busy box llama.cpp's threads wait for cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from bench.common import OUT_DIR, machine_facts, markdown_table, say, write_json
from pagesift.demo.pages import generate_pages
from pagesift.primary.extract.html import Wanted, extract
from tests.modelserver import MODEL, ModelServer, json_object_format

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "summary": {"type": "string", "maxLength": 400},
        "topics": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    },
    "required": ["title", "summary", "topics"],
    "additionalProperties": False,
}
SYSTEM = "Read the page and answer with JSON: its title, a two-sentence summary, its topics."
SIZES = {"article": 1, "long": 3}  # articles per page
ORIGIN = "http://demo.test"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("model")
    g.add_argument("--model-calls", type=int, default=8, help="calls per page size (default 8)")
    g.add_argument("--model-max-tokens", type=int, default=256, help="max_tokens per call")
    g.add_argument("--model-threads", type=int, default=None, help="llama.cpp threads")


@dataclass
class Call:
    size: str
    page_chars: int
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    strict_json: bool  # RFC 8259 JSON (json.loads as it is)
    valid: bool  # parsed with strict=False, valid against SCHEMA
    content: str  # kept when not strict_json or not valid (at most 600 characters)


def article_markdown() -> list[str]:
    """The demo site's articles as the node's markdown, in a fixed order."""
    rendered, infos = generate_pages(200, seed=1)
    out = []
    for path in sorted(p for p, info in infos.items() if info.kind == "article"):
        html = rendered[path].replace("ORIGIN", ORIGIN)
        md = extract(html, ORIGIN + path, want=Wanted(markdown=True), only_main_content=True)
        out.append(md.markdown)
    return out


def pages(articles: list[str], per_page: int, count: int, start: int) -> list[str]:
    """``count`` pages of ``per_page`` articles each, none shared, from ``start`` on."""
    need = per_page * count
    if start + need > len(articles):
        raise ValueError(f"{need} articles asked from {start}, the demo site has {len(articles)}")
    chunk = articles[start : start + need]
    return ["\n\n".join(chunk[i : i + per_page]) for i in range(0, need, per_page)]


def call_model(base_url: str, page: str, max_tokens: int, timeout: float = 300.0) -> dict[str, Any]:
    """One chat completion, its answer (raises on a non-200)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": page}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "response_format": json_object_format(SCHEMA),
    }
    req = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def measure(base_url: str, size: str, page: str, max_tokens: int) -> Call:
    t0 = time.monotonic()
    answer = call_model(base_url, page, max_tokens)
    seconds = time.monotonic() - t0
    choice, usage = answer["choices"][0], answer["usage"]
    content = str(choice["message"]["content"])
    strict = valid = True
    try:
        json.loads(content)
    except ValueError:
        strict = False
    try:
        valid = jsonschema.Draft202012Validator(SCHEMA).is_valid(json.loads(content, strict=False))
    except ValueError:
        valid = False
    return Call(
        size,
        len(page),
        seconds,
        int(usage["prompt_tokens"]),
        int(usage["completion_tokens"]),
        str(choice["finish_reason"]),
        strict,
        valid,
        "" if strict and valid else content[:600],
    )


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def figures(calls: list[Call]) -> dict[str, Any]:
    secs = [c.seconds for c in calls]
    return {
        "calls": len(calls),
        "page_chars_median": statistics.median(c.page_chars for c in calls),
        "latency_median_s": statistics.median(secs),
        "latency_p90_s": _p90(secs),
        "latency_worst_s": max(secs),
        "prompt_tokens_median": statistics.median(c.prompt_tokens for c in calls),
        "completion_tokens_median": statistics.median(c.completion_tokens for c in calls),
        "prompt_tokens_per_s": statistics.median(c.prompt_tokens / c.seconds for c in calls),
        "strict_json": sum(c.strict_json for c in calls),
        "valid": sum(c.valid for c in calls),
        "cut_by_max_tokens": sum(c.finish_reason == "length" for c in calls),
    }


def run(args: argparse.Namespace) -> None:
    articles = article_markdown()
    with tempfile.TemporaryDirectory(prefix="pagesift-bench-model-") as tmp:
        server = ModelServer(Path(tmp), threads=args.model_threads)
        t0 = time.monotonic()
        with server:
            started_s = time.monotonic() - t0
            say(f"model: llama.cpp server up in {started_s:.1f} s ({' '.join(server.argv[1:])})")
            measure(server.base_url, "warm-up", articles[-1], 8)  # first call maps the model
            calls: list[Call] = []
            start = 0
            for size, per_page in SIZES.items():
                for page in pages(articles, per_page, args.model_calls, start):
                    calls.append(measure(server.base_url, size, page, args.model_max_tokens))
                    c = calls[-1]
                    say(f"model {size}: {c.seconds:.2f} s, {c.prompt_tokens} in, "
                        f"{c.completion_tokens} out, {c.finish_reason}, "
                        f"strict_json={c.strict_json}, valid={c.valid}")  # fmt: skip
                start += per_page * args.model_calls
    sizes = {size: figures([c for c in calls if c.size == size]) for size in SIZES}
    results: dict[str, Any] = {
        "machine": machine_facts(),
        "server": {"argv": server.argv, "threads": server.threads, "start_s": started_s},
        "sizes": sizes,
        "calls": calls,
    }
    write_json(OUT_DIR / "model.json", results)
    rows = [
        [size, f["calls"], f["page_chars_median"], f"{f['latency_median_s']:.2f}",
         f"{f['latency_p90_s']:.2f}", f"{f['latency_worst_s']:.2f}", f["prompt_tokens_median"],
         f["completion_tokens_median"], f"{f['prompt_tokens_per_s']:.0f}",
         f"{f['strict_json']}/{f['calls']}", f"{f['valid']}/{f['calls']}",
         f["cut_by_max_tokens"]]
        for size, f in sizes.items()
    ]  # fmt: skip
    table = markdown_table(
        ["page", "calls", "chars", "median s", "p90 s", "worst s", "tokens in", "tokens out",
         "in tokens/s", "RFC JSON", "schema-valid", "cut"],
        rows,
    )  # fmt: skip
    (OUT_DIR / "model.md").write_text(table + "\n")
    for line in table.splitlines():
        say(line)
    invalid = [c for c in calls if not c.valid and c.finish_reason == "stop"]
    if invalid:
        raise RuntimeError(f"{len(invalid)} answers ended by the model but not schema-valid")
