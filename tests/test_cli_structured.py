"""The CLI's structured-data flags and subcommands (``pagesift.cli.structured``).

- ``--selectors FILE`` (protobuf's JSON mapping of ``SelectorSchema``), ``--json-schema
  FILE``, ``--json-prompt``, ``--json-system-prompt``, ``--format json|summary|selectors``
  and a crawl's ``--prompt`` as the requests of scrape, batch and crawl; a file that
  cannot be read or parsed is a usage error naming it.
- ``scrape --format selectors --selectors FILE`` against a real in-process node and an
  aiohttp site: the document's ``selected`` printed, and ``--json``'s ``selected``; a bad
  schema the server refuses is exit 3 naming the field.
- ``extract`` (StartExtract, GetExtract polled until the job ends) and
  ``crawl-preview`` against a JobService on 127.0.0.1 that answers those calls as the
  proto says (the real ones need a model server: their end-to-end tests are the model
  suite's).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from aiohttp import web

from pagesift.cli import amain, build_parser
from pagesift.cli.common import EXIT_NO, EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from pagesift.cli.jobs import batch_request, crawl_request, scrape_options
from pagesift.cli.structured import extract_request
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import in_process_node, serve_handler

SCHEMA_JSON = {
    "baseSelector": ".product",
    "fields": [
        {"name": "name", "selector": "h2"},
        {"name": "price", "selector": ".price", "type": "VALUE_TYPE_NUMBER"},
        {"name": "url", "selector": "a", "source": "SELECTOR_SOURCE_ATTRIBUTE",
         "attribute": "href"},
        {"name": "tags", "selector": "li", "all": True},
        {"name": "seller", "selector": ".seller", "source": "SELECTOR_SOURCE_NESTED",
         "fields": [{"name": "id", "source": "SELECTOR_SOURCE_ATTRIBUTE",
                     "attribute": "data-id", "type": "VALUE_TYPE_INTEGER"}]},
    ],
}  # fmt: skip
JSON_SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {
        "selectors": tmp_path / "shop.json",
        "schema": tmp_path / "schema.json",
        "bad_json": tmp_path / "bad.json",
        "not_schema": tmp_path / "unknown.json",
        "array": tmp_path / "array.json",
    }
    out["selectors"].write_text(json.dumps(SCHEMA_JSON))
    out["schema"].write_text(json.dumps(JSON_SCHEMA, indent=1))
    out["bad_json"].write_text("{not json")
    out["not_schema"].write_text(json.dumps({"baseSelector": "p", "colour": "blue"}))
    out["array"].write_text("[1, 2]")
    return out


def test_selectors_and_model_flags_build_the_options_of_scrape_batch_and_crawl(
    files: dict[str, Path],
) -> None:
    flags = [
        "--format", "markdown,selectors", "--format", "json,summary",
        "--selectors", str(files["selectors"]), "--json-schema", str(files["schema"]),
        "--json-prompt", "the page's title", "--json-system-prompt", "be terse",
    ]  # fmt: skip
    expected = jobs_pb2.SelectorSchema(
        base_selector=".product",
        fields=[
            jobs_pb2.SelectorField(name="name", selector="h2"),
            jobs_pb2.SelectorField(name="price", selector=".price",
                                   type=jobs_pb2.VALUE_TYPE_NUMBER),
            jobs_pb2.SelectorField(name="url", selector="a", attribute="href",
                                   source=jobs_pb2.SELECTOR_SOURCE_ATTRIBUTE),
            jobs_pb2.SelectorField(name="tags", selector="li", all=True),
            jobs_pb2.SelectorField(
                name="seller", selector=".seller", source=jobs_pb2.SELECTOR_SOURCE_NESTED,
                fields=[jobs_pb2.SelectorField(name="id", attribute="data-id",
                                               source=jobs_pb2.SELECTOR_SOURCE_ATTRIBUTE,
                                               type=jobs_pb2.VALUE_TYPE_INTEGER)],
            ),
        ],
    )  # fmt: skip
    parser = build_parser()
    for opts in (
        scrape_options(parser.parse_args(["scrape", "http://a/", *flags])),
        batch_request(parser.parse_args(["batch", "http://a/", "http://b/", *flags])).options,
        crawl_request(parser.parse_args(["crawl", "http://a/", *flags])).options,
    ):
        assert list(opts.formats) == [
            jobs_pb2.FORMAT_MARKDOWN,
            jobs_pb2.FORMAT_SELECTORS,
            jobs_pb2.FORMAT_JSON,
            jobs_pb2.FORMAT_SUMMARY,
        ]
        assert opts.selectors == expected
        assert json.loads(opts.json.schema) == JSON_SCHEMA
        assert opts.json.schema == files["schema"].read_text()  # the file's text, as written
        assert (opts.json.prompt, opts.json.system_prompt) == ("the page's title", "be terse")
    plain = scrape_options(parser.parse_args(["scrape", "http://a/"]))
    assert not plain.HasField("selectors") and not plain.HasField("json")
    prompt_only = scrape_options(parser.parse_args(["scrape", "http://a/", "--json-prompt", "x"]))
    assert prompt_only.json == jobs_pb2.JsonOptions(prompt="x")


def test_a_crawl_takes_its_prompt() -> None:
    parser = build_parser()
    req = crawl_request(parser.parse_args(["crawl", "http://a/", "--prompt", "only the blog"]))
    assert req.prompt == "only the blog"
    assert crawl_request(parser.parse_args(["crawl", "http://a/"])).prompt == ""


@pytest.mark.parametrize(
    ("flag", "name", "words"),
    [
        ("--selectors", "bad_json", "is not a selector schema"),
        ("--selectors", "not_schema", "colour"),
        ("--selectors", "missing", "cannot read the selector schema"),
        ("--json-schema", "bad_json", "is not JSON"),
        ("--json-schema", "array", "holds no JSON object"),
        ("--json-schema", "missing", "cannot read the JSON schema"),
    ],
)
async def test_a_file_that_cannot_be_used_is_a_usage_error_naming_it(
    files: dict[str, Path],
    flag: str,
    name: str,
    words: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = files.get(name, files["selectors"].parent / "nowhere.json")
    argv = ["scrape", "http://a/", "--format", "selectors", flag, str(path)]
    assert await amain(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert str(path) in err and words in err, err


def test_extract_builds_its_request_from_the_same_flags(files: dict[str, Path]) -> None:
    argv = [
        "extract", "http://a/", "https://b.example/docs/*", "--json-schema", str(files["schema"]),
        "--json-prompt", "titles", "--limit", "20", "--ignore-invalid", "--engine", "http",
        "--header", "X-Team: data",
    ]  # fmt: skip
    args = build_parser().parse_args(argv)
    req = extract_request(args, scrape_options(args))
    assert list(req.urls) == ["http://a/", "https://b.example/docs/*"]
    assert json.loads(req.json.schema) == JSON_SCHEMA and req.json.prompt == "titles"
    assert req.limit == 20 and req.ignore_invalid_urls
    assert req.idempotency_key  # a fresh one: a retried StartExtract registers one job
    assert not req.options.HasField("json") and not req.options.formats
    assert req.options.engine == jobs_pb2.FETCH_ENGINE_HTTP
    assert dict(req.options.headers) == {"X-Team": "data"}
    keyed = build_parser().parse_args([*argv, "--idempotency-key", "k1"])
    assert extract_request(keyed, scrape_options(keyed)).idempotency_key == "k1"


# ---------------------------------------------------------------- against a real node

SHOP = """<html><body>
<div class="product"><h2>Widget</h2><span class="price">$1,299.50</span><a href="/w">w</a>
<ul><li>metal</li><li>blue</li></ul><div class="seller" data-id="77">Acme</div></div>
<div class="product"><h2>Gadget</h2><span class="price">n/a</span></div>
</body></html>"""


async def _shop(request: web.Request) -> web.StreamResponse:
    return web.Response(text=SHOP, content_type="text/html")


async def test_scrape_prints_what_the_selectors_selected_from_a_real_node(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    async with (
        serve_handler(_shop) as port,
        in_process_node(tmp_path, respect_robots=False, browser_executable="") as node,
    ):
        url = f"http://127.0.0.1:{port}/shop"
        base = ["scrape", url, "--server", node.address, "--format", "selectors"]
        assert await amain([*base, "--selectors", str(files["selectors"])]) == EXIT_OK
        expected = [
            {"name": "Widget", "price": 1299.5, "url": f"http://127.0.0.1:{port}/w",
             "tags": ["metal", "blue"], "seller": {"id": 77}},
            {"name": "Gadget", "price": None, "url": None, "tags": [], "seller": None},
        ]  # fmt: skip
        captured = capsys.readouterr()
        assert json.loads(captured.out) == expected
        assert f"200 {url}" in captured.err
        argv = [*base, "--format", "markdown", "--selectors", str(files["selectors"]), "--json"]
        assert await amain(argv) == EXIT_OK
        doc = json.loads(capsys.readouterr().out)
        assert json.loads(doc["selected"]) == expected and "Widget" in doc["markdown"]
        assert doc["format_errors"] == []

        argv = [*base, "--format", "change_tracking", "--selectors", str(files["selectors"])]
        assert await amain(argv) == EXIT_OK
        out = capsys.readouterr().out  # each format under its name; change tracking by name
        assert out.startswith("==> selectors <==\n") and out.endswith(
            "==> change_tracking <==\nnew\n"
        )
        assert json.loads(out.split("\n")[1]) == expected

        bad = tmp_path / "bad_selector.json"
        bad.write_text(json.dumps({"fields": [{"name": "a"}, {"name": "b", "selector": "p["}]}))
        assert await amain([*base, "--selectors", str(bad)]) == EXIT_REFUSED
        err = capsys.readouterr().err
        assert err.startswith("error: INVALID_ARGUMENT: options.selectors.fields[1].selector")
        assert await amain(base) == EXIT_REFUSED  # the format without a schema
        assert "options.selectors: FORMAT_SELECTORS needs" in capsys.readouterr().err


# ---------------------------------------------------------------- extract, crawl-preview


class ExtractService(jobs_pb2_grpc.JobServiceServicer):
    """StartExtract / GetExtract / PreviewCrawlParams as the proto describes them: an
    extract job that finishes after ``polls`` GetExtract calls, ending ``final``."""

    def __init__(
        self, polls: int = 3, final: jobs_pb2.JobState.ValueType = jobs_pb2.JOB_STATE_COMPLETED
    ) -> None:
        self.polls, self.final = polls, final
        self.started: list[jobs_pb2.StartExtractRequest] = []
        self.gets = 0

    async def StartExtract(
        self, request: jobs_pb2.StartExtractRequest, context: object
    ) -> jobs_pb2.StartExtractResponse:
        self.started.append(request)
        return jobs_pb2.StartExtractResponse(
            id="ex-1", urls=[u for u in request.urls if u != "bad"], invalid_urls=["bad"]
        )

    async def GetExtract(
        self, request: jobs_pb2.GetExtractRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> jobs_pb2.GetExtractResponse:
        if request.id != "ex-1":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.id}")
        self.gets += 1
        done = self.gets >= self.polls
        return jobs_pb2.GetExtractResponse(
            id="ex-1",
            state=self.final if done else jobs_pb2.JOB_STATE_SCRAPING,
            data=json.dumps({"title": "Docs", "pages": self.gets}) if done else "{}",
            sources=[jobs_pb2.ExtractSource(key="title", urls=["http://a/"])] if done else [],
            total=2,
            completed=2 if done else 1,
            note="the model endpoint failed" if done and self.final != 2 else "",
        )

    async def PreviewCrawlParams(
        self, request: jobs_pb2.PreviewCrawlParamsRequest, context: object
    ) -> jobs_pb2.PreviewCrawlParamsResponse:
        crawl = jobs_pb2.StartCrawlRequest(url=request.url, include_paths=["^/blog/"], limit=50)
        usage = jobs_pb2.ModelUsage(input_tokens=120, output_tokens=30, calls=1)
        return jobs_pb2.PreviewCrawlParamsResponse(request=crawl, model_usage=usage)


@pytest.fixture
async def extracts() -> AsyncIterator[tuple[ExtractService, str]]:
    service = ExtractService()  # type: ignore[abstract]  # the other calls: UNIMPLEMENTED
    server = grpc.aio.server()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield service, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_extract_waits_for_the_job_and_prints_its_merged_object(
    extracts: tuple[ExtractService, str], files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    service, address = extracts
    argv = ["extract", "http://a/", "bad", "--json-schema", str(files["schema"]),
            "--server", address]  # fmt: skip
    assert await amain(argv) == EXIT_OK
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"title": "Docs", "pages": 3}
    assert service.gets == 3  # polled until the job ended, no further
    assert "ex-1" in captured.err and "skipped invalid URL: bad" in captured.err
    assert "ex-1: 2/2 pages" in captured.err
    [req] = service.started
    assert json.loads(req.json.schema) == JSON_SCHEMA and req.idempotency_key

    service.gets = 0
    assert await amain([*argv, "--json"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "completed" and out["data"] == {"title": "Docs", "pages": 3}
    assert out["sources"] == [{"key": "title", "urls": ["http://a/"]}]
    assert out["invalid_urls"] == ["bad"] and out["total"] == "2"  # int64: a JSON string

    assert await amain([*argv, "--no-wait"]) == EXIT_OK
    assert capsys.readouterr().out == "ex-1\n"
    assert await amain([*argv, "--no-wait", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == {
        "id": "ex-1", "urls": ["http://a/"], "invalid_urls": ["bad"]
    }  # fmt: skip

    service.gets, service.final = 0, jobs_pb2.JOB_STATE_FAILED
    assert await amain(argv) == EXIT_NO
    err = capsys.readouterr().err
    assert "ex-1 failed: the model endpoint failed" in err


async def test_extract_needs_a_schema_or_a_prompt_and_sets_the_formats_itself(
    extracts: tuple[ExtractService, str], capsys: pytest.CaptureFixture[str]
) -> None:
    service, address = extracts
    assert await amain(["extract", "http://a/", "--server", address]) == EXIT_USAGE
    assert "--json-schema FILE or --json-prompt" in capsys.readouterr().err
    argv = ["extract", "http://a/", "--json-prompt", "x", "--format", "html", "--server", address]
    assert await amain(argv) == EXIT_USAGE
    assert not service.started


async def test_crawl_preview_prints_the_request_the_words_describe(
    extracts: tuple[ExtractService, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, address = extracts
    argv = ["crawl-preview", "http://a/", "--prompt", "the blog, 50 pages", "--server", address]
    assert await amain(argv) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == {
        "url": "http://a/", "limit": 50, "include_paths": ["^/blog/"]
    }  # fmt: skip
    assert await amain([*argv, "--json"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["request"]["include_paths"] == ["^/blog/"]
    assert out["model_usage"] == {
        "input_tokens": "120", "output_tokens": "30", "calls": 1, "cached": 0
    }  # fmt: skip
    assert await amain(["crawl-preview", "http://a/", "--server", address]) == EXIT_USAGE
