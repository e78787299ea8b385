"""The model server the tests and the bench run (tests/modelserver.py), against itself.

- llama.cpp's server answers a chat completion whose ``response_format`` is
  ``json_object`` + schema with JSON that the schema accepts (``jsonschema``), with usage;
  it refuses OpenAI's ``json_schema`` shape, which the proxy's shim serves.
- ``CountingProxy`` counts every ``/v1`` request in order with its body and status;
  planted faults (a status, a hang, a schema-violating answer) hit the next requests
  only, in order; ``violating_json`` finds JSON a schema rejects.
- The proxy as a process (``ProxyProcess``) logs one line per request on arrival, so a
  client SIGKILLed mid-call is still counted, and takes faults over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest

from pagesift.core.util.children import Child
from tests.helpers import eventually, until
from tests.modelserver import (
    MODEL,
    CountingProxy,
    ModelServer,
    ProxyProcess,
    json_object_format,
    violating_json,
)

pytestmark = pytest.mark.model

PRODUCT = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "price": {"type": "number"},
        "in_stock": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    },
    "required": ["title", "price", "in_stock", "tags"],
    "additionalProperties": False,
}
PAGE = (
    "# Acme Anvil\n\nA heavy-duty anvil of forged steel, 50 kg. Price: $129.99. "
    "In stock: yes. Tags: tools, metal, heavy."
)
TIMEOUT = aiohttp.ClientTimeout(total=120)


def chat_body(response_format: dict[str, Any] | None, page: str = PAGE) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Extract the product on this page as JSON."},
            {"role": "user", "content": page},
        ],
        "temperature": 0,
        "max_tokens": 200,
    }
    if response_format is not None:
        body["response_format"] = response_format
    return body


async def post_chat(base_url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        http.post(f"{base_url}/chat/completions", json=body) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def answer_json(answer: Any) -> Any:
    """The answer's content as JSON (``strict=False``: the server's grammar lets raw
    control characters into strings; tests/modelserver.py says so)."""
    return json.loads(answer["choices"][0]["message"]["content"], strict=False)


OPENAI_SHAPE = {"type": "json_schema", "json_schema": {"name": "product", "schema": PRODUCT}}


# ---------------------------------------------------------------- the server


async def test_the_server_holds_its_answer_to_a_json_object_schema(
    model_server: ModelServer,
) -> None:
    status, answer = await post_chat(model_server.base_url, chat_body(json_object_format(PRODUCT)))
    assert status == 200, answer
    jsonschema.validate(answer_json(answer), PRODUCT)
    usage = answer["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert answer["choices"][0]["finish_reason"] == "stop"


async def test_the_server_refuses_openais_json_schema_shape(model_server: ModelServer) -> None:
    """What tests/modelserver.py's docstring says: a node that speaks OpenAI's shape to
    this server directly gets an error, not unconstrained text."""
    status, answer = await post_chat(model_server.base_url, chat_body(OPENAI_SHAPE))
    assert status >= 400
    assert "json_object" in answer["error"]["message"]


async def test_the_shim_serves_openais_shape_with_the_schema_held(
    model_server: ModelServer,
) -> None:
    async with CountingProxy(model_server.url, json_schema_shim=True) as proxy:
        status, answer = await post_chat(proxy.base_url, chat_body(OPENAI_SHAPE))
    assert status == 200, answer
    jsonschema.validate(answer_json(answer), PRODUCT)
    # the proxy records what the client sent, not its rewrite
    assert proxy.bodies()[0]["response_format"]["type"] == "json_schema"


# ---------------------------------------------------------------- the proxy


async def test_the_proxy_counts_every_request_in_order(model_proxy: CountingProxy) -> None:
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        http.get(f"{model_proxy.base_url}/models") as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["data"]
    first, second = chat_body(None, "page one"), chat_body(None, "page two")
    for body in (first, second):
        body["max_tokens"] = 5
        status, _ = await post_chat(model_proxy.base_url, body)
        assert status == 200
    assert model_proxy.total == 3
    assert model_proxy.by_path == {"/v1/models": 1, "/v1/chat/completions": 2}
    assert model_proxy.bodies() == [first, second]
    assert [(r.seq, r.method, r.status, r.fault) for r in model_proxy.requests] == [
        (1, "GET", 200, None),
        (2, "POST", 200, None),
        (3, "POST", 200, None),
    ]


async def test_planted_failures_hit_the_next_requests_only(model_proxy: CountingProxy) -> None:
    model_proxy.fail(2, status=503)
    body = chat_body(json_object_format(PRODUCT))
    statuses = []
    for _ in range(3):
        status, answer = await post_chat(model_proxy.base_url, body)
        statuses.append(status)
    assert statuses == [503, 503, 200]
    jsonschema.validate(answer_json(answer), PRODUCT)
    assert [r.fault for r in model_proxy.requests] == ["fail", "fail", None]


async def test_a_planted_hang_holds_the_answer_until_released(
    model_proxy: CountingProxy,
) -> None:
    model_proxy.hang(1, seconds=120)
    body = chat_body(None)
    body["max_tokens"] = 5
    call = asyncio.create_task(post_chat(model_proxy.base_url, body))
    await until(lambda: model_proxy.total == 1, "the hung request to arrive")
    await asyncio.sleep(0.3)
    assert not call.done() and model_proxy.requests[0].status is None
    model_proxy.release()
    status, answer = await asyncio.wait_for(call, 30)
    assert status == 504 and answer["error"]["type"] == "proxy_fault"
    status, _ = await post_chat(model_proxy.base_url, body)  # the queue is empty: forwarded
    assert status == 200
    assert [(r.fault, r.status) for r in model_proxy.requests] == [("hang", 504), (None, 200)]


async def test_a_planted_violation_is_json_the_schema_rejects(model_proxy: CountingProxy) -> None:
    model_proxy.violate(1)
    body = chat_body(OPENAI_SHAPE)
    body["response_format"] = json_object_format(PRODUCT)
    status, answer = await post_chat(model_proxy.base_url, body)
    assert status == 200
    bad = answer_json(answer)  # valid JSON ...
    with pytest.raises(jsonschema.ValidationError):  # ... that the schema rejects
        jsonschema.validate(bad, PRODUCT)
    assert answer["usage"]["completion_tokens"] > 0  # the upstream's real answer around it
    status, answer = await post_chat(model_proxy.base_url, body)
    jsonschema.validate(answer_json(answer), PRODUCT)


def test_violating_json_finds_a_value_each_schema_rejects() -> None:
    schemas: list[dict[str, Any]] = [
        PRODUCT,
        {"type": "array"},
        {"type": ["object", "array"]},
        {"type": "object", "properties": {"summary": {"type": "string"}}},
    ]
    for schema in schemas:
        found = violating_json(schema)
        assert found is not None, schema
        assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(found))
    assert violating_json({}) is None  # accepts everything


# ---------------------------------------------------------------- the proxy's process

CLIENT = """
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/chat/completions", data=sys.argv[2].encode(),
                             headers={"Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=300).read()
"""


async def test_the_proxy_process_counts_a_client_killed_mid_call(
    model_server: ModelServer, tmp_path: Path
) -> None:
    proxy = ProxyProcess(tmp_path, model_server.base_url).start()
    client = Child("client", [], tmp_path / "client.log")
    try:
        proxy.fault("hang", 1, seconds=120)
        body = chat_body(None, "a call its client never sees answered")
        client.argv = [sys.executable, "-c", CLIENT, proxy.base_url, json.dumps(body)]
        client.start()
        await eventually(
            lambda: asyncio.sleep(0.02, proxy.requests() or None), "the proxy's first line"
        )
        client.kill()  # SIGKILL, mid-call: the proxy has the request on record already
        proxy.release()
        proxy.fault("fail", 1, status=500)
        failed, _ = await post_chat(proxy.base_url, body)
        body["max_tokens"] = 5
        ok, _ = await post_chat(proxy.base_url, body)
        assert (failed, ok) == (500, 200)
        stats = proxy._call("GET", "/_proxy/stats")
    finally:
        client.kill()
        proxy.stop()
    lines = proxy.requests()
    assert [(x["seq"], x["path"], x["fault"]) for x in lines] == [
        (1, "/v1/chat/completions", "hang"),
        (2, "/v1/chat/completions", "fail"),
        (3, "/v1/chat/completions", None),
    ]
    assert lines[0]["body"]["messages"][1]["content"] == "a call its client never sees answered"
    assert stats["total"] == 3 and [r["status"] for r in stats["requests"]][1:] == [500, 200]
    assert not proxy.child.alive
