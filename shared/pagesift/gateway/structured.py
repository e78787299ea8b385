"""Firecrawl's structured formats onto pagesift's model and selector formats, and back.

What it owns
------------
Requests: ``format_object(opts, fmt, field)``, the hook ``translate``'s format loop asks
first: Firecrawl's ``json`` (``{"type": "json", "schema", "prompt"}``, or the bare
string) is FORMAT_JSON with ``ScrapeOptions.json`` (the schema as JSON text),
``summary`` is FORMAT_SUMMARY, ``{"type": "attributes", "selectors": [{selector,
attribute}]}`` is FORMAT_SELECTORS with one field per selector (source ATTRIBUTE,
``all``), and pagesift's own ``{"type": "selectors", "schema": {baseSelector, fields}}``
is FORMAT_SELECTORS with that ``SelectorSchema`` (protobuf's JSON mapping). ``v1_formats``:
v1's ``json`` + ``jsonOptions`` and ``extract`` + ``extract`` as v2's json format object.
Answers: ``document(doc, options, json_key)``: ``firecrawlshape.document`` plus
``attributes`` (Firecrawl's ``[{selector, attribute, values}]``) or ``selectors`` (the
parsed ``Document.selected``), markdown dropped when ``options`` did not ask for it (the
node keeps it with the model formats), ``json`` under ``json_key`` (v1's ``extract``).

Layout
------
An attributes field is named ``ATTRIBUTES`` + the JSON text of ``[index, selector,
attribute]`` (at most the node's 100 characters of a name), so a document read back with
no request at hand (a crawl's status page) still says which selector gave which values.

Invariants
----------
- Pure: no I/O; every refusal is a 400 naming the Firecrawl path (``formats[1].selectors[0]``).
- One json format and one selector format a request (``ScrapeOptions`` has one of each).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format

from pagesift.core.jobs import firecrawlshape
from pagesift.gateway.models import FormatObject
from pagesift.gateway.options import refuse
from pagesift.v1 import jobs_pb2

__all__ = [
    "ATTRIBUTES",
    "FORMATS",
    "MAX_NAME",
    "STRUCTURED",
    "attributes_of",
    "document",
    "format_object",
    "v1_formats",
]

#: the prefix of an attributes format's field names (the module docstring, "Layout")
ATTRIBUTES = "@attributes"
MAX_NAME = 100  # the node's bound on a selector field's name (core.jobs.selectorschemas)
#: the format names this module maps -> the pagesift Format of each
FORMATS: dict[str, jobs_pb2.Format.ValueType] = {
    "json": jobs_pb2.FORMAT_JSON,
    "summary": jobs_pb2.FORMAT_SUMMARY,
    "attributes": jobs_pb2.FORMAT_SELECTORS,
    "selectors": jobs_pb2.FORMAT_SELECTORS,  # pagesift's own: a SelectorSchema
}
STRUCTURED = frozenset(FORMATS)
_OTHER_KEYS = ("full_page", "quality", "viewport", "modes", "tag")


def _json_text(value: Any, field: str) -> str:
    if not isinstance(value, dict):
        raise refuse(field, "a JSON Schema is an object")
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _json(opts: jobs_pb2.ScrapeOptions, fmt: str | FormatObject, field: str) -> None:
    if opts.HasField("json"):
        raise refuse(field, "one json format a request (pagesift asks one schema a page)")
    opts.json.SetInParent()
    if isinstance(fmt, FormatObject):
        if fmt.schema_ is not None:
            opts.json.schema = _json_text(fmt.schema_, field + ".schema")
        opts.json.prompt = fmt.prompt or ""
        opts.json.system_prompt = fmt.system_prompt or ""
    if fmt == "json" or not (opts.json.schema or opts.json.prompt):
        raise refuse(field, "the json format needs a schema or a prompt (or both)")


def _attribute_field(i: int, sel: dict[str, Any], field: str) -> jobs_pb2.SelectorField:
    where = f"{field}.selectors[{i}]"
    selector, attribute = sel.get("selector"), sel.get("attribute")
    if set(sel) != {"selector", "attribute"} or not (
        isinstance(selector, str) and isinstance(attribute, str)
    ):
        raise refuse(where, "an attributes selector is {selector, attribute}, two strings")
    name = ATTRIBUTES + json.dumps([i, selector, attribute], ensure_ascii=False)
    if len(name) > MAX_NAME:
        why = (
            f"pagesift names each value list by its selector and attribute: together at most "
            f"{MAX_NAME - len(ATTRIBUTES) - 12} characters"
        )
        raise refuse(where, why)
    return jobs_pb2.SelectorField(
        name=name,
        selector=selector,
        source=jobs_pb2.SELECTOR_SOURCE_ATTRIBUTE,
        attribute=attribute,
        all=True,
    )


def _selectors(opts: jobs_pb2.ScrapeOptions, fmt: str | FormatObject, field: str) -> None:
    if opts.HasField("selectors"):
        raise refuse(field, "one attributes or selectors format a request")
    if not isinstance(fmt, FormatObject):
        raise refuse(field, f"the {fmt} format is an object with its selectors")
    if fmt.type == "attributes":
        if not fmt.selectors:
            raise refuse(field + ".selectors", "at least one {selector, attribute}")
        fields = [_attribute_field(i, s, field) for i, s in enumerate(fmt.selectors)]
        opts.selectors.fields.extend(fields)
        return
    if not isinstance(fmt.schema_, dict):
        raise refuse(field + ".schema", "a selector schema {baseSelector, fields: [...]}")
    try:
        json_format.ParseDict(fmt.schema_, opts.selectors)
    except json_format.ParseError as exc:
        why = str(exc).splitlines()[0]
        raise refuse(field + ".schema", f"not a selector schema: {why}") from None


def format_object(opts: jobs_pb2.ScrapeOptions, fmt: str | FormatObject, field: str) -> bool:
    """Map ``fmt`` into ``opts`` when it is one of ``STRUCTURED`` (True), else False
    (``translate``'s own formats); a structured key on another format is refused."""
    name = fmt if isinstance(fmt, str) else fmt.type
    if name not in STRUCTURED:
        if isinstance(fmt, FormatObject) and (fmt.selectors is not None or fmt.system_prompt):
            raise refuse(field, f"format {name!r} takes no selectors or systemPrompt")
        return False
    if isinstance(fmt, FormatObject):
        given = [k for k in _OTHER_KEYS if getattr(fmt, k) not in (None, False)]
        wrong = {
            "json": given + (["selectors"] if fmt.selectors is not None else []),
            "summary": given + [k for k in ("prompt", "schema_", "selectors") if getattr(fmt, k)],
            "attributes": given + [k for k in ("prompt", "schema_") if getattr(fmt, k)],
            "selectors": given + [k for k in ("prompt", "selectors") if getattr(fmt, k)],
        }[name]
        if fmt.system_prompt and name != "json":
            wrong.append("systemPrompt")
        if wrong:
            key = wrong[0].rstrip("_")
            raise refuse(f"{field}.{key}", f"not a key of the {name} format")
    value = FORMATS[name]
    if name == "json":
        _json(opts, fmt, field)
    elif name in ("attributes", "selectors"):
        _selectors(opts, fmt, field)
    if value not in opts.formats:
        opts.formats.append(value)
    return True


# ---------------------------------------------------------------- v1


def _v1_options(given: Any, where: str) -> dict[str, Any]:
    """v1's ``jsonOptions`` / ``extract`` ({mode, schema, systemPrompt, prompt,
    temperature}) as v2's json format object."""
    if not isinstance(given, dict):
        raise refuse(where, "an object {schema, prompt, systemPrompt}")
    unknown = sorted(set(given) - {"mode", "schema", "systemPrompt", "prompt", "temperature"})
    if unknown:
        raise refuse(f"{where}.{unknown[0]}", "not a key of Firecrawl v1's json options")
    if given.get("mode", "llm") != "llm":
        raise refuse(f"{where}.mode", "Firecrawl v1's one mode is 'llm'")
    if given.get("temperature") is not None:
        why = "pagesift asks the model at the server's own settings (no temperature a request)"
        raise refuse(f"{where}.temperature", why)
    out: dict[str, Any] = {"type": "json"}
    out.update({k: given[k] for k in ("schema", "prompt", "systemPrompt") if given.get(k)})
    return out


def v1_formats(formats: list[Any], extract: Any, json_options: Any, prefix: str) -> list[Any]:
    """v1's formats (already v2's spelling, ``v1translate``) with ``json`` and
    ``extract`` made v2's json format object from ``jsonOptions`` and ``extract``
    (Firecrawl v1: a format and its options go together)."""
    out = list(formats)
    for name, options, key in (
        ("json", json_options, "jsonOptions"),
        ("extract", extract, "extract"),
    ):
        if name in out:
            if options is None:
                raise refuse(prefix + key, f"the {name} format needs {key} (as Firecrawl v1)")
            out[out.index(name)] = _v1_options(options, prefix + key)
        elif options is not None:
            raise refuse(prefix + key, f"{key} goes with the {name!r} format (as Firecrawl v1)")
    if "json" in formats and "extract" in formats:
        raise refuse(prefix + "formats", "json or extract, one of the two (one schema a page)")
    return out


# ---------------------------------------------------------------- answers


def attributes_of(selected: Any) -> list[dict[str, Any]] | None:
    """Firecrawl's ``attributes`` from an attributes format's ``Document.selected``
    (its field names, "Layout"), or None when ``selected`` is not one."""
    if not isinstance(selected, dict) or not selected:
        return None
    out: list[tuple[int, dict[str, Any]]] = []
    for name, values in selected.items():
        if not isinstance(name, str) or not name.startswith(ATTRIBUTES):
            return None
        try:
            index, selector, attribute = json.loads(name[len(ATTRIBUTES) :])
        except (ValueError, TypeError):
            return None
        kept = [v if isinstance(v, str) else json.dumps(v) for v in values or () if v is not None]
        out.append((index, {"selector": selector, "attribute": attribute, "values": kept}))
    return [entry for _, entry in sorted(out, key=lambda e: e[0])]


def document(
    doc: jobs_pb2.Document,
    options: jobs_pb2.ScrapeOptions | None = None,
    json_key: str = "json",
) -> dict[str, Any]:
    """``doc`` in Firecrawl's shape (the module docstring, "Answers"); ``options``: the
    request's, when known (markdown is then kept only when asked for)."""
    out = firecrawlshape.document(doc)
    if doc.selected:
        selected = json.loads(doc.selected)  # written by the node's worker: valid JSON
        found = attributes_of(selected)
        if found is not None:
            out["attributes"] = found
        else:
            out["selectors"] = selected
    asked = options is not None and options.formats
    if asked and jobs_pb2.FORMAT_MARKDOWN not in options.formats:  # type: ignore[union-attr]
        out.pop("markdown", None)
    if json_key != "json" and "json" in out:
        out[json_key] = out.pop("json")
    if "metadata" in out:
        out["metadata"] = out.pop("metadata")  # last, as firecrawlshape orders it
    return out
