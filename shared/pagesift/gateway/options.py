"""Pure mapping of Firecrawl's nested scrape options onto pagesift's ``ScrapeOptions``:
actions, location, parsers, change tracking, and a ``User-Agent`` header.

What it owns
------------
``apply(o, opts, prefix)``: the options of ``pagesift.gateway.optionmodels`` (and the
change-tracking keys of a format object, ``change_tracking``) written into the proto
``translate.scrape_options`` is building; ``REFUSED``: per nested model, the fields pagesift
cannot honour and why, and ``REFUSED_WHOLE``: the models refused whatever they say (the
``scrape`` and ``pdf`` actions, the ``image`` parser); docs/gateway.md's field table is
checked against both (tests/test_gateway_fields.py).

Invariants
----------
- No I/O: a function of its arguments (tests/test_gateway_translate.py, test_gateway_fields.py).
- A field pagesift cannot honour is a 400 naming its Firecrawl path
  (``actions[2].all``, ``scrapeOptions.location.country``), never dropped; an action
  type it has no step for is refused by index (``actions[1]``).
- Actions need a browser: a request with actions asks for the BROWSER engine, so a node
  that cannot render refuses it (RENDERING_UNAVAILABLE) instead of fetching without them.
- ``location.languages`` is an ``Accept-Language`` header on every engine and, when the
  page is rendered anyway, the browser's locale too; it never makes a page render.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import duration_pb2
from pydantic import BaseModel

from pagesift.gateway.httperrors import HttpError, bad_request, issue
from pagesift.gateway.models import FormatObject, ScrapeOptions
from pagesift.gateway.optionmodels import (
    ACTION_MODELS,
    ChangeTrackingOptions,
    ClickAction,
    ExecuteJavascriptAction,
    ImageParser,
    Location,
    PdfAction,
    PdfParser,
    PressAction,
    ScrapeAction,
    ScreenshotAction,
    ScrollAction,
    WaitAction,
    WriteAction,
)
from pagesift.v1 import jobs_pb2

__all__ = [
    "REFUSED",
    "REFUSED_WHOLE",
    "UNSUPPORTED_ACTIONS",
    "apply",
    "change_tracking",
    "refuse",
    "refuse_set",
    "renders",
]

_LLM = "an LLM comparison pagesift does not offer: it tracks changes as a git-diff of markdown"

#: nested model -> {attribute: (Firecrawl name, why it is refused when set)}
REFUSED: dict[type[BaseModel], dict[str, tuple[str, str]]] = {
    ClickAction: {"all": ("all", "pagesift clicks the first element the selector matches")},
    ScrollAction: {
        "selector": ("selector", "pagesift scrolls the page by a viewport, not one element")
    },
    ScreenshotAction: {
        "viewport": (
            "viewport",
            "pagesift sizes the window once per page: give the viewport on the screenshot format",
        )
    },
    Location: {
        "country": (
            "country",
            "pagesift's requests leave from the node or the server's proxy pool, which has "
            "no country to choose",
        )
    },
    PdfParser: {
        "pages": ("pages", "pagesift returns one markdown per document, not one per page"),
        "page_markdown": ("pageMarkdown", "pagesift returns one markdown per document"),
        "blocks": ("blocks", "pagesift reads no layout blocks"),
        "page_markers": (
            "pageMarkers",
            "pagesift always writes <!-- page N --> before each page, in its own form",
        ),
    },
    ChangeTrackingOptions: {
        "prompt": ("prompt", _LLM),
        "schema_": ("schema", _LLM),
        "tag": ("tag", "pagesift keeps one change history per URL and account, untagged"),
    },
}
# a format object: prompt and schema are json's (gateway.structured), refused on changeTracking
REFUSED[FormatObject] = {"tag": REFUSED[ChangeTrackingOptions]["tag"]}

#: nested models refused whole, whatever their fields say -> why
REFUSED_WHOLE: dict[type[BaseModel], str] = {
    ScrapeAction: "pagesift reads the page once, after its actions (no mid-action snapshot)",
    PdfAction: "pagesift prints no PDFs of a page",
    ImageParser: "pagesift has no OCR: an image URL is unsupported_content",
}
#: Firecrawl action type -> why pagesift has no step for it
UNSUPPORTED_ACTIONS: dict[str, str] = {
    kind: REFUSED_WHOLE[m] for kind, m in ACTION_MODELS.items() if m in REFUSED_WHOLE
}


def refuse(field: str, why: str) -> HttpError:
    """The 400 for a Firecrawl field (path ``field``) pagesift cannot honour: one zod-like
    ``custom`` issue at the field's path (``httperrors.issue``)."""
    return bad_request(f"{field}: {why}", [issue("custom", field, why)])


def refuse_set(model: Any, table: Mapping[str, tuple[str, str]], prefix: str) -> None:
    """Refuse the first field of ``table`` that ``model`` sets (not None, not False)."""
    for attr, (name, why) in table.items():
        if getattr(model, attr) not in (None, False):
            raise refuse(prefix + name, why)


def _millis(ms: int) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(ms)
    return d


def _action(a: Any, where: str) -> jobs_pb2.Action:
    if type(a) in REFUSED_WHOLE:
        raise refuse(where, f"action {a.type!r}: {REFUSED_WHOLE[type(a)]}")
    refuse_set(a, REFUSED.get(type(a), {}), where + ".")
    if isinstance(a, WaitAction):
        if (a.milliseconds is None) == (a.selector is None):
            raise refuse(where, "a wait takes milliseconds or selector, one of the two")
        if a.selector is not None:
            return jobs_pb2.Action(wait=jobs_pb2.WaitAction(selector=a.selector))
        return jobs_pb2.Action(wait=jobs_pb2.WaitAction(duration=_millis(a.milliseconds or 0)))
    if isinstance(a, ClickAction):
        return jobs_pb2.Action(click=jobs_pb2.ClickAction(selector=a.selector))
    if isinstance(a, WriteAction):
        return jobs_pb2.Action(write=jobs_pb2.WriteAction(text=a.text))
    if isinstance(a, PressAction):
        return jobs_pb2.Action(press=jobs_pb2.PressAction(key=a.key))
    if isinstance(a, ScrollAction):
        up = a.direction == "up"
        direction = jobs_pb2.SCROLL_DIRECTION_UP if up else jobs_pb2.SCROLL_DIRECTION_DOWN
        return jobs_pb2.Action(scroll=jobs_pb2.ScrollAction(direction=direction))
    if isinstance(a, ExecuteJavascriptAction):
        script = jobs_pb2.ExecuteJavascriptAction(script=a.script)
        return jobs_pb2.Action(execute_javascript=script)
    assert isinstance(a, ScreenshotAction), a  # the union's last kind pagesift takes
    shot = jobs_pb2.ScreenshotOptions(full_page=a.full_page)
    if a.quality is not None:
        shot.format, shot.quality = jobs_pb2.IMAGE_FORMAT_JPEG, a.quality
    return jobs_pb2.Action(screenshot=shot)


def change_tracking(
    o: ChangeTrackingOptions | FormatObject, opts: jobs_pb2.ScrapeOptions, where: str
) -> None:
    """Change tracking's keys: ``modes`` git-diff is ``change_tracking_diff``; json
    (an LLM's comparison), prompt, schema and tag are refused."""
    refuse_set(o, REFUSED[ChangeTrackingOptions], where + ".")  # FormatObject's too
    for i, mode in enumerate(o.modes or ()):
        if mode == "json":
            raise refuse(f"{where}.modes[{i}]", f"mode 'json' {_LLM}")
        opts.change_tracking_diff = True


def _parsers(parsers: Sequence[Any], opts: jobs_pb2.ScrapeOptions, prefix: str) -> None:
    pdf = False
    for i, p in enumerate(parsers):
        where = f"{prefix}parsers[{i}]"
        kind = p if isinstance(p, str) else p.type
        if kind == "image":
            raise refuse(where, REFUSED_WHOLE[ImageParser])
        pdf = True
        if isinstance(p, PdfParser):
            refuse_set(p, REFUSED[PdfParser], where + ".")
            if p.mode == "ocr":
                raise refuse(where + ".mode", "pagesift has no OCR; it reads the text layer")
            if p.max_pages is not None:
                opts.max_pages = p.max_pages
    if not pdf:
        why = "pagesift always converts PDFs to markdown: a list without 'pdf' cannot be honoured"
        raise refuse(prefix + "parsers", why)


def _accept_language(languages: Sequence[str]) -> str:
    """``["fr-CH", "fr", "en"]`` -> ``"fr-CH, fr;q=0.9, en;q=0.8"`` (q at least 0.1)."""
    parts = [
        lang if i == 0 else f"{lang};q={max(1, 10 - i) / 10:g}" for i, lang in enumerate(languages)
    ]
    return ", ".join(parts)


def _location(loc: Location, opts: jobs_pb2.ScrapeOptions, prefix: str) -> None:
    where = prefix + "location"
    refuse_set(loc, REFUSED[Location], where + ".")
    if not loc.languages:
        return
    if any(k.lower() == "accept-language" for k in opts.headers):
        raise refuse(where + ".languages", "headers already set Accept-Language")
    opts.headers["Accept-Language"] = _accept_language(loc.languages)
    if renders(opts):
        opts.locale = loc.languages[0]


def renders(opts: jobs_pb2.ScrapeOptions) -> bool:
    """Whether the node renders every page of ``opts`` (BROWSER, or an option only a
    browser honours: the node's ``rendering.browser_fields``, which a test holds equal)."""
    return opts.engine == jobs_pb2.FETCH_ENGINE_BROWSER or bool(
        opts.HasField("wait_for")
        or opts.wait_until
        or opts.actions
        or jobs_pb2.FORMAT_SCREENSHOT in opts.formats
        or opts.HasField("viewport")
        or opts.mobile
        or opts.locale
        or opts.timezone
        or opts.HasField("screenshot")
    )


def _user_agent(opts: jobs_pb2.ScrapeOptions) -> None:
    for name in [k for k in opts.headers if k.lower() == "user-agent"]:
        opts.user_agent = opts.headers.pop(name)


def apply(o: ScrapeOptions, opts: jobs_pb2.ScrapeOptions, prefix: str = "") -> None:
    """Write ``o``'s actions, parsers, change-tracking options, location and
    ``User-Agent`` header into ``opts`` (``prefix`` names them in a refusal)."""
    _user_agent(opts)
    for i, action in enumerate(o.actions or ()):
        opts.actions.append(_action(action, f"{prefix}actions[{i}]"))
    if o.actions:
        opts.engine = jobs_pb2.FETCH_ENGINE_BROWSER
    if o.parsers is not None:
        _parsers(o.parsers, opts, prefix)
    if o.change_tracking_options is not None:
        change_tracking(o.change_tracking_options, opts, prefix + "changeTrackingOptions")
    if o.location is not None:
        _location(o.location, opts, prefix)
