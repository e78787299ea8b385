"""docs/gateway.md's "Firecrawl fields" tables against the code that takes the fields.

The tables list every field of every request model (and the format names and action
types); a cell starting "refused" says a value other than the default is a 400. These
tests fail when a model field has no row or a row no field, when the table says
"refused" for a field the code maps or the reverse (the code's refusals are
``translate.REFUSED`` per model and ``options.REFUSED_WHOLE`` for whole models), and,
through real translations, when a field said mapped is refused or one said refused
is not (``SINKS`` set every mapped field, ``REFUSALS`` each refused one).

Another API version's tables are one more ``Api`` line in ``APIS`` (its section title,
its request models, its refusal tables).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from pagesift.gateway import options, translate
from pagesift.gateway.httperrors import HttpError
from pagesift.gateway.models import (
    BatchScrapeRequest,
    CrawlParamsPreviewRequest,
    CrawlRequest,
    FormatObject,
    MapRequest,
    ScrapeRequest,
)
from pagesift.gateway.optionmodels import ACTION_MODELS
from pagesift.v1 import jobs_pb2
from tests.firecrawlerrors import named

DOC = Path(__file__).resolve().parent.parent / "docs" / "gateway.md"
URL = "https://example.com/"


@dataclass(frozen=True)
class Api:
    """One API version's field tables: the docs section, its request models, and the
    code's refusals (per model: attribute -> (Firecrawl name, why); whole models)."""

    section: str
    roots: tuple[type[BaseModel], ...]
    refused: Mapping[type[Any], Mapping[str, tuple[str, str]]]
    whole: Mapping[type[BaseModel], str] = field(default_factory=dict)
    #: heading key -> (every name, the refused names) for the name lists
    names: Mapping[str, tuple[set[str], set[str]]] = field(default_factory=dict)


V2 = Api(
    "Firecrawl fields",
    (ScrapeRequest, BatchScrapeRequest, CrawlRequest, MapRequest, CrawlParamsPreviewRequest),
    translate.REFUSED,
    options.REFUSED_WHOLE,
    {
        "formats[].type": (
            set(translate.FORMATS) | set(translate.UNSUPPORTED_FORMATS),
            set(translate.UNSUPPORTED_FORMATS),
        ),
        "actions[].type": (set(ACTION_MODELS), set(options.UNSUPPORTED_ACTIONS)),
    },
)
APIS = [V2]


# ---------------------------------------------------------------- the docs' tables


def doc_tables(section: str) -> dict[str, dict[str, bool]]:
    """``### ... (`KEY`)`` -> {row name: the cell says refused} in ``## section``."""
    text = DOC.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    tables: dict[str, dict[str, bool]] = {}
    rows: dict[str, bool] | None = None
    for line in body.splitlines():
        if line.startswith("### "):
            keys = re.findall(r"`([^`]+)`", line)
            assert keys, f"heading {line!r} names no model in backticks"
            assert keys[-1] not in tables, f"two tables for {keys[-1]}"
            rows = tables[keys[-1]] = {}
        elif line.startswith("| `") and rows is not None:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)]
            name, verdict = cells[1].strip("`"), cells[2]
            assert name not in rows, f"two rows for {name}"
            rows[name] = verdict.startswith("refused")
    return tables


# ---------------------------------------------------------------- the models


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in get_args(annotation):
        yield from _models_in(arg)


def aliases(model: type[BaseModel]) -> dict[str, str]:
    """attribute -> its Firecrawl name."""
    return {n: f.alias or n for n, f in model.model_fields.items()}


def tabled(api: Api) -> list[type[BaseModel]]:
    """Every model with fields reachable from the API's request models, with the bases
    that bring fields (``ScrapeOptions``, ``_Job``)."""
    seen: list[type[BaseModel]] = []
    todo = list(api.roots)
    while todo:
        model = todo.pop(0)
        if model in seen or not model.model_fields:
            continue
        seen.append(model)
        todo += [b for b in model.__mro__[1:] if isinstance(b, type) and issubclass(b, BaseModel)]
        for f in model.model_fields.values():
            todo += list(_models_in(f.annotation))
    return seen


def own(model: type[BaseModel], models: list[type[BaseModel]]) -> set[str]:
    """``model``'s Firecrawl names that no tabled base of it declares."""
    inherited = {a for b in model.__mro__[1:] if b in models for a in aliases(b).values()}
    return set(aliases(model).values()) - inherited


def refused_in_code(api: Api, model: type[BaseModel]) -> set[str]:
    if model in api.whole:
        return set(aliases(model).values())
    table = api.refused.get(model, {})
    names = aliases(model)
    for attr, (name, why) in table.items():
        assert names.get(attr) == name, f"{model.__name__}: refusal of {attr} names {name}"
        assert why, f"{model.__name__}.{attr}: a refusal says why"
    return {name for name, _ in table.values()}


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.section)
def test_every_model_field_has_a_row_and_every_row_a_field(api: Api) -> None:
    tables = doc_tables(api.section)
    models = tabled(api)
    expected = {m.__name__ for m in models} | set(api.names)
    assert set(tables) == expected, "tables without a model / models without a table"
    for model in models:
        rows = set(tables[model.__name__])
        fields = own(model, models)
        assert rows == fields, (
            f"{model.__name__}: fields without a row {sorted(fields - rows)}, "
            f"rows without a field {sorted(rows - fields)}"
        )


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.section)
def test_the_table_says_refused_exactly_where_the_code_refuses(api: Api) -> None:
    tables = doc_tables(api.section)
    models = tabled(api)
    for model in models:
        said = {name for name, refused in tables[model.__name__].items() if refused}
        code = refused_in_code(api, model) & own(model, models)
        assert said == code, (
            f"{model.__name__}: said refused but mapped {sorted(said - code)}, "
            f"refused but said mapped {sorted(code - said)}"
        )
    assert not set(api.refused) - set(models), "a refusal table of a model no request uses"


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.section)
def test_the_name_lists_are_the_codes_with_the_same_refusals(api: Api) -> None:
    tables = doc_tables(api.section)
    for key, (every, refused) in api.names.items():
        assert set(tables[key]) == every, key
        assert {n for n, r in tables[key].items() if r} == refused, key


# ---------------------------------------------------------------- through translate


def _batch(r: BatchScrapeRequest) -> Any:
    if r.append_to_id is not None:
        return translate.append_arguments(r, "key-1")
    return translate.batch_request(r)


TRANSLATE: dict[type[BaseModel], Callable[[Any], Any]] = {
    ScrapeRequest: translate.scrape_request,
    BatchScrapeRequest: _batch,
    CrawlRequest: translate.crawl_request,
    MapRequest: translate.map_arguments,
    CrawlParamsPreviewRequest: lambda r: jobs_pb2.PreviewCrawlParamsRequest(
        url=r.url, prompt=r.prompt
    ),  # the route's whole mapping (v2.preview_crawl)
}

WEBHOOK = {"url": "https://hooks.example/x", "headers": {"A": "b"}, "metadata": {"k": "v"},
           "events": ["completed"]}  # fmt: skip
ACTIONS = [
    {"type": "wait", "milliseconds": 100}, {"type": "wait", "selector": "#done"},
    {"type": "click", "selector": "a"}, {"type": "write", "text": "x"},
    {"type": "press", "key": "Enter"}, {"type": "scroll", "direction": "up"},
    {"type": "executeJavascript", "script": "return 1"},
    {"type": "screenshot", "fullPage": True, "quality": 50},
]  # fmt: skip
SCRAPE = {
    "formats": [
        "markdown", "html", "rawHtml", "links", "images",
        {"type": "screenshot", "fullPage": True, "quality": 80,
         "viewport": {"width": 800, "height": 600}},
        {"type": "changeTracking", "modes": ["git-diff"]},
        {"type": "json", "schema": {"type": "object"}, "prompt": "x", "systemPrompt": "s"},
        "summary", {"type": "attributes", "selectors": [{"selector": "a", "attribute": "href"}]},
    ],
    "headers": {"X-A": "b"}, "includeTags": ["main"], "excludeTags": ["nav"],
    "onlyMainContent": False, "timeout": 30000, "waitFor": 1000, "mobile": True,
    "skipTlsVerification": True, "removeBase64Images": False, "maxAge": 1000,
    "storeInCache": True, "blockAds": False, "proxy": "basic", "actions": ACTIONS,
    "location": {"languages": ["fr"]}, "parsers": [{"type": "pdf", "mode": "fast", "maxPages": 5}],
    "changeTrackingOptions": {"modes": ["git-diff"]},
    "zeroDataRetention": False, "integration": "tag", "origin": "api",
    "__experimental_omce": True, "__experimental_engpicker": True, "__forceFirePDF": True,
}  # fmt: skip

#: pagesift's own selectors format: a SelectorSchema in protobuf's JSON mapping
SELECTORS = {"baseSelector": "li", "fields": [
    {"name": "title", "selector": "a"},
    {"name": "link", "selector": "a", "source": "SELECTOR_SOURCE_ATTRIBUTE", "attribute": "href"},
]}  # fmt: skip

#: bodies that set every mapped field, each translated without a refusal
SINKS: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (ScrapeRequest, {"url": URL, **SCRAPE}),
    (BatchScrapeRequest, {"urls": [URL], "ignoreInvalidURLs": True, "maxConcurrency": 2,
                          "webhook": WEBHOOK, **SCRAPE}),
    (BatchScrapeRequest, {"urls": [URL], "appendToId": "3f0f5f43-7a6b-4d1e-9c1e-1b2a3c4d5e6f"}),
    (ScrapeRequest, {"url": URL, "formats": [{"type": "selectors", "schema": SELECTORS}]}),
    (CrawlRequest, {
        "url": URL, "includePaths": ["^/docs"], "excludePaths": ["^/old"],
        "maxDiscoveryDepth": 2, "sitemap": "skip", "ignoreQueryParameters": True, "limit": 10,
        "crawlEntireDomain": True, "allowExternalLinks": True, "allowSubdomains": True,
        "ignoreRobotsTxt": True, "delay": 0.5, "maxConcurrency": 2,
        "deduplicateSimilarURLs": False, "regexOnFullURL": True,
        "scrapeOptions": {"formats": ["markdown"], "integration": "tag", "origin": "py"},
        "webhook": WEBHOOK, "integration": "tag", "origin": "api", "prompt": "docs only",
    }),
    (MapRequest, {"url": URL, "search": "docs", "includePaths": ["^/a"], "excludePaths": ["^/b"],
                  "includeSubdomains": False, "ignoreQueryParameters": False, "limit": 10,
                  "sitemap": "only", "timeout": 5000, "filterByPath": True,
                  "maxDiscoveryDepth": 2, "crawlEntireDomain": True, "ignoreCache": True,
                  "useMock": "x", "deduplicateSimilarURLs": True}),
    (CrawlParamsPreviewRequest, {"url": URL, "prompt": "docs only", "origin": "api",
                                 "integration": "tag"}),
]  # fmt: skip

TRACKED = ["markdown", "changeTracking"]
#: (request model, body, the field path its 400 names): one per refused field at least
REFUSALS: list[tuple[type[BaseModel], dict[str, Any], str]] = [
    (ScrapeRequest, {"fastMode": True}, "fastMode"),
    (ScrapeRequest, {"minAge": 1000}, "minAge"),
    (ScrapeRequest, {"useMock": "x"}, "useMock"),
    (ScrapeRequest, {"redactPII": True}, "redactPII"),
    (ScrapeRequest, {"checkPromptInjection": True}, "checkPromptInjection"),
    (ScrapeRequest, {"threatProtection": {"mode": "x"}}, "threatProtection"),
    (ScrapeRequest, {"auditMetadata": {"k": "v"}}, "auditMetadata"),
    (ScrapeRequest, {"zeroDataRetention": True}, "zeroDataRetention"),
    (ScrapeRequest, {"onlyCleanContent": True}, "onlyCleanContent"),
    (ScrapeRequest, {"lockdown": True}, "lockdown"),
    (ScrapeRequest, {"profile": {"name": "shop", "saveChanges": True}}, "profile"),
    (ScrapeRequest, {"safeMode": True}, "safeMode"),
    (ScrapeRequest, {"domainTools": True}, "domainTools"),
    (ScrapeRequest, {"toolDetail": "full"}, "toolDetail"),
    (ScrapeRequest, {"__searchPreviewToken": "t"}, "__searchPreviewToken"),
    (ScrapeRequest, {"__experimental_omceDomain": "d"}, "__experimental_omceDomain"),
    (ScrapeRequest, {"__agentInterop": {"auth": "x"}}, "__agentInterop"),
    (BatchScrapeRequest, {"__agentInterop": {"auth": "x"}}, "__agentInterop"),
    (MapRequest, {"headers": {"A": "b"}}, "headers"),
    (MapRequest, {"allowExternalLinks": True}, "allowExternalLinks"),
    (MapRequest, {"allowSubdomains": True}, "allowSubdomains"),
    (MapRequest, {"ignoreRobotsTxt": True}, "ignoreRobotsTxt"),
    (MapRequest, {"robotsUserAgent": "acme"}, "robotsUserAgent"),
    (MapRequest, {"deduplicateSimilarURLs": False}, "deduplicateSimilarURLs"),
    (MapRequest, {"regexOnFullURL": True}, "regexOnFullURL"),
    (MapRequest, {"delay": 1}, "delay"),
    (CrawlRequest, {"robotsUserAgent": "acme"}, "robotsUserAgent"),
    (MapRequest, {"location": {"languages": ["fr"]}}, "location"),
    (MapRequest, {"useIndex": True}, "useIndex"),
    (MapRequest, {"threatProtection": {"mode": "x"}}, "threatProtection"),
    (MapRequest, {"auditMetadata": {"k": "v"}}, "auditMetadata"),
    (ScrapeRequest, {"actions": [{"type": "click", "selector": "a", "all": True}]},
     "actions[0].all"),
    (ScrapeRequest, {"actions": [{"type": "scroll", "selector": "#list"}]}, "actions[0].selector"),
    (ScrapeRequest, {"actions": [{"type": "screenshot", "viewport": {"width": 9, "height": 9}}]},
     "actions[0].viewport"),
    (ScrapeRequest, {"actions": [{"type": "scrape"}]}, "actions[0]"),
    (ScrapeRequest, {"actions": [{"type": "pdf", "landscape": True, "scale": 2, "format": "A4"}]},
     "actions[0]"),
    (ScrapeRequest, {"location": {"country": "DE"}}, "location.country"),
    (ScrapeRequest, {"parsers": [{"type": "pdf", "pages": True}]}, "parsers[0].pages"),
    (ScrapeRequest, {"parsers": [{"type": "pdf", "pageMarkdown": True}]},
     "parsers[0].pageMarkdown"),
    (ScrapeRequest, {"parsers": [{"type": "pdf", "blocks": True}]}, "parsers[0].blocks"),
    (ScrapeRequest, {"parsers": [{"type": "pdf", "pageMarkers": True}]}, "parsers[0].pageMarkers"),
    (ScrapeRequest, {"parsers": ["pdf", {"type": "image"}]}, "parsers[1]"),
    (ScrapeRequest, {"formats": TRACKED, "changeTrackingOptions": {"prompt": "x"}},
     "changeTrackingOptions.prompt"),
    (ScrapeRequest, {"formats": TRACKED, "changeTrackingOptions": {"schema": {}}},
     "changeTrackingOptions.schema"),
    (ScrapeRequest, {"formats": TRACKED, "changeTrackingOptions": {"tag": "daily"}},
     "changeTrackingOptions.tag"),
    (ScrapeRequest, {"formats": ["markdown", {"type": "changeTracking", "tag": "x"}]},
     "formats[1].tag"),
]  # fmt: skip

#: a format object's mapped keys on a format that takes none of them: (body, path of its 400).
#: prompt and schema are the json format's (gateway.structured), refused on changeTracking
#: as its LLM comparison (options.change_tracking); not in REFUSED: mapped elsewhere
MISPLACED: list[tuple[dict[str, Any], str]] = [
    ({"formats": ["markdown", {"type": "changeTracking", "prompt": "x"}]}, "formats[1].prompt"),
    ({"formats": ["markdown", {"type": "changeTracking", "schema": {}}]}, "formats[1].schema"),
    ({"formats": ["markdown", {"type": "changeTracking", "systemPrompt": "s"}]}, "formats[1]"),
    ({"formats": [{"type": "markdown", "selectors": [{"selector": "a", "attribute": "href"}]}]},
     "formats[0]"),
    ({"formats": [{"type": "json", "prompt": "x", "selectors": []}]}, "formats[0].selectors"),
    ({"formats": [{"type": "summary", "prompt": "x"}]}, "formats[0].prompt"),
    ({"formats": [{"type": "attributes", "schema": {"type": "object"},
                   "selectors": [{"selector": "a", "attribute": "href"}]}]}, "formats[0].schema"),
    ({"formats": [{"type": "attributes", "systemPrompt": "s",
                   "selectors": [{"selector": "a", "attribute": "href"}]}]},
     "formats[0].systemPrompt"),
    ({"formats": [{"type": "selectors", "prompt": "x", "schema": SELECTORS}]},
     "formats[0].prompt"),
]  # fmt: skip


def _base(model: type[BaseModel]) -> dict[str, Any]:
    return {"urls": [URL]} if model is BatchScrapeRequest else {"url": URL}


def fields_set(value: Any, models: list[type[BaseModel]]) -> set[tuple[type[BaseModel], str]]:
    """(the tabled model that owns it, Firecrawl name) of every field ``value`` sets."""
    out: set[tuple[type[BaseModel], str]] = set()
    if isinstance(value, BaseModel):
        names = aliases(type(value))
        for attr in value.model_fields_set:
            name = names[attr]
            owner = next(b for b in type(value).__mro__ if b in models and name in own(b, models))
            out.add((owner, name))
            out |= fields_set(getattr(value, attr), models)
    elif isinstance(value, list | tuple):
        for item in value:
            out |= fields_set(item, models)
    elif isinstance(value, dict):
        for item in value.values():
            out |= fields_set(item, models)
    return out


def refused_pairs(api: Api, models: list[type[BaseModel]]) -> set[tuple[type[BaseModel], str]]:
    return {(m, n) for m in models for n in refused_in_code(api, m) & own(m, models)}


def test_every_mapped_field_is_set_by_a_body_that_translates_without_a_refusal() -> None:
    models = tabled(V2)
    covered: set[tuple[type[BaseModel], str]] = set()
    for model, body in SINKS:
        request = model.model_validate(body)
        TRANSLATE[model](request)  # raises HttpError on a refusal
        covered |= fields_set(request, models)
    mapped = {(m, n) for m in models for n in own(m, models)} - refused_pairs(V2, models)
    missing = sorted(f"{m.__name__}.{n}" for m, n in mapped - covered)
    assert not missing, f"mapped fields no SINKS body sets: {missing}"


def test_every_refused_field_is_a_400_naming_it_through_translate() -> None:
    models = tabled(V2)
    refused = refused_pairs(V2, models)
    covered: set[tuple[type[BaseModel], str]] = set()
    for model, extra, path in REFUSALS:
        request = model.model_validate({**_base(model), **extra})
        hits = fields_set(request, models) & refused
        assert hits, f"{extra} sets no refused field"
        covered |= hits
        with pytest.raises(HttpError) as err:
            TRANSLATE[model](request)
        assert err.value.status == 400 and named(err.value.details[0]) == path, extra
    missing = sorted(f"{m.__name__}.{n}" for m, n in refused - covered)
    assert not missing, f"refused fields no REFUSALS body sets: {missing}"


def test_a_format_key_on_a_format_that_takes_none_is_a_400_naming_it() -> None:
    models = tabled(V2)
    refused = refused_pairs(V2, models)
    for extra, path in MISPLACED:
        request = ScrapeRequest.model_validate({"url": URL, **extra})
        given = fields_set(request, models)
        assert any(m is FormatObject for m, _ in given), extra
        assert not given & refused, f"{extra} sets a field REFUSED refuses anywhere"
        with pytest.raises(HttpError) as err:
            translate.scrape_request(request)
        assert err.value.status == 400 and named(err.value.details[0]) == path, extra
