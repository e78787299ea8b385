"""Property-based tests of the gateway's whole HTTP API from its own OpenAPI document.

schemathesis loads ``GET /v2/openapi.json`` from a real gateway (in front of a real
in-process node) and, for every operation it lists, generates requests from the
document: valid ones (positive) and ones that break it (negative: wrong types, values
past their bounds, missing or extra fields, odd headers). Every answer must hold:

- no 5xx, ever (``not_a_server_error``): a bad request is the caller's 4xx;
- every 4xx is Firecrawl's error body ``{success: false, error, code?, details?}``
  (``firecrawl_error_shape``), except the HTTP parser's own 400 for a request that is
  not HTTP (a header name that is no RFC 9110 token, a control character in a value),
  which never reaches the application.

A job start, a scrape or a map carries a key no account has: whatever the gateway lets
through reaches the node, which answers 401 before it runs anything, so no generated
URL is ever fetched (the node's own validation is tested over gRPC). The reads and
cancels (GET, DELETE), which fetch nothing, carry a real account's key, so the node's
answers to generated ids and pages go through the gateway's error table too. A case
that sends its own ``Authorization`` (a negative one) keeps it. Bounded and deterministic:
``EXAMPLES`` cases per operation and mode, derandomized, no example database, no
deadline (a loaded machine is slow, not wrong). A failure names the operation and the
curl command that reproduces it.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, CheckContext, GenerationMode, Response
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.errors import FailureGroup

from tests.helpers import ALICE, gateway_with_accounts

EXAMPLES = 40
UNKNOWN_KEY = "psk_test_nobody_0123456789"  # in no accounts file: the node's 401
#: the operations with nothing a negative case can break (no parameter, no body, no key)
OPEN_OPERATIONS = frozenset({"GET /healthz", "GET /metrics", "GET /v2/openapi.json"})
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 5.6.2
_NOT_FIELD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # RFC 9110 5.5


def not_http(case: Case[Any]) -> bool:
    """Whether ``case``'s headers are not HTTP (the parser refuses them, not the app)."""
    return any(
        not _TOKEN.fullmatch(name) or _NOT_FIELD_VALUE.search(str(value))
        for name, value in (case.headers or {}).items()
    )


@schemathesis.check
def firecrawl_error_shape(ctx: CheckContext, response: Response, case: Case[Any]) -> bool | None:
    """A 4xx answer is Firecrawl's error body ``{success: false, error, code?, details?}``."""
    if not 400 <= response.status_code < 500:
        return None
    if response.status_code == 400 and not_http(case):
        return None  # the HTTP parser's own answer: the app never saw the request
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"a {response.status_code} whose body is not JSON") from None
    if not (
        isinstance(body, dict)
        and body.get("success") is False
        and isinstance(body.get("error"), str)
        and body["error"]
        and isinstance(body.get("code", ""), str)
        and set(body) <= {"success", "error", "code", "details"}
    ):
        raise AssertionError(f"a {response.status_code} not in Firecrawl's error shape: {body}")
    return None


def fuzz(base: str, mode: GenerationMode) -> tuple[int, list[str]]:
    """Run ``EXAMPLES`` cases of ``mode`` against every operation of the gateway's own
    document (blocking: schemathesis calls with requests); the number of cases sent and
    each failing operation's first failure."""
    schema = schemathesis.openapi.from_url(f"{base}/v2/openapi.json", timeout=30)
    sent = 0
    failures: list[str] = []
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()  # the document is valid OpenAPI 3.1
        operations.append(result.ok())
    assert len(operations) > 30, [op.label for op in operations]
    for op in operations:
        if mode == GenerationMode.NEGATIVE and op.label in OPEN_OPERATIONS:
            continue

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
        )
        @given(case=op.as_strategy(generation_mode=mode))
        def check(case: Case[Any]) -> None:
            nonlocal sent
            sent += 1
            reads = case.method.upper() in ("GET", "DELETE")  # no fetch: a real key
            key = ALICE.key if reads else UNKNOWN_KEY
            given_key = "Authorization" in (case.headers or {})
            headers = {} if given_key else {"Authorization": f"Bearer {key}"}
            response = case.call(base_url=base, headers=headers, timeout=60)
            case.validate_response(response, checks=[not_a_server_error, firecrawl_error_shape])

        try:
            check()
        except hypothesis.errors.Unsatisfiable:  # nothing of this mode to generate
            continue
        except (Exception, FailureGroup) as exc:  # a check's failures are a group
            failures.append(f"{op.label} ({mode.value}): {exc}")
    return sent, failures


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
async def test_no_generated_request_gets_a_5xx_and_every_4xx_is_firecrawls_error(
    tmp_path: Path, mode: GenerationMode
) -> None:
    async with gateway_with_accounts(tmp_path) as base:
        sent, failures = await asyncio.to_thread(fuzz, base, mode)
    assert not failures, "\n\n".join(failures)
    assert sent > 20 * EXAMPLES, sent  # the document's operations were all exercised
