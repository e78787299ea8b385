"""The nested Firecrawl v2 scrape options, as strict pydantic models: actions, location,
parsers, change tracking and the viewport.

What it owns
------------
``Action`` (a union discriminated by ``type``: ``wait``, ``click``, ``screenshot``,
``write``, ``press``, ``scroll``, ``scrape``, ``executeJavascript``, ``pdf``),
``Location``, ``Parser`` (``"pdf"``, ``"image"`` or their objects),
``ChangeTrackingOptions`` and ``Viewport``, with the camelCase names of Firecrawl's
``apps/api/src/controllers/v2/types.ts`` as aliases. ``pagesift.gateway.models`` uses
them in ``ScrapeOptions``; ``pagesift.gateway.options`` maps them onto pagesift.

Invariants
----------
- ``extra="forbid"``: an unknown key, or an unknown action ``type``, is a 400 naming it.
- Every field Firecrawl defines is declared, also those pagesift cannot honour (with a
  neutral default), so ``pagesift.gateway.options`` refuses them by name, never drops them.
- Bounds are Firecrawl's (a viewport up to 8K, quality 1..100, at most 50 actions), each
  integer also within its proto field (``pagesift.gateway.bounds``: a wait's
  milliseconds fit a Duration); pagesift's own, tighter ones are the node's to refuse,
  naming the proto field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from pagesift.gateway.bounds import proto_int, proto_millis

__all__ = [
    "ACTION_MODELS",
    "Action",
    "ChangeTrackingOptions",
    "ClickAction",
    "ExecuteJavascriptAction",
    "ImageParser",
    "Location",
    "Parser",
    "PdfAction",
    "PdfParser",
    "PressAction",
    "ScrapeAction",
    "ScreenshotAction",
    "ScrollAction",
    "Viewport",
    "WaitAction",
    "WriteAction",
]


#: integers bounded by their proto field (pagesift.gateway.bounds) and Firecrawl's bounds
Width = Annotated[
    int, proto_int("Viewport.width", low=1, high=7680)
]  # Firecrawl's 8K; the node's tighter
Height = Annotated[int, proto_int("Viewport.height", low=1, high=4320)]
Quality = Annotated[int, proto_int("ScreenshotOptions.quality", low=1, high=100)]
WaitMillis = Annotated[int, proto_millis("WaitAction.duration", low=1)]
MaxPages = Annotated[int, proto_int("ScrapeOptions.max_pages", low=1, high=10000)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False)


class Viewport(_Strict):
    width: Width
    height: Height


class WaitAction(_Strict):
    """Pause for ``milliseconds``, or until ``selector`` matches (one of the two)."""

    type: Literal["wait"]
    milliseconds: WaitMillis | None = None
    selector: str | None = None


class ClickAction(_Strict):
    type: Literal["click"]
    selector: str
    all: bool = False  # Firecrawl: click every match


class ScreenshotAction(_Strict):
    type: Literal["screenshot"]
    full_page: bool = Field(False, alias="fullPage")
    quality: Quality | None = None
    viewport: Viewport | None = None


class WriteAction(_Strict):
    type: Literal["write"]
    text: str


class PressAction(_Strict):
    type: Literal["press"]
    key: str


class ScrollAction(_Strict):
    type: Literal["scroll"]
    direction: Literal["up", "down"] = "down"
    selector: str | None = None  # Firecrawl: scroll this element


class ScrapeAction(_Strict):
    type: Literal["scrape"]


class ExecuteJavascriptAction(_Strict):
    type: Literal["executeJavascript"]
    script: str


PaperFormat = Literal[
    "A0", "A1", "A2", "A3", "A4", "A5", "A6", "Letter", "Legal", "Tabloid", "Ledger"
]


class PdfAction(_Strict):
    type: Literal["pdf"]
    landscape: bool = False
    scale: float = 1.0
    format: PaperFormat = "Letter"


_ACTIONS = (
    WaitAction,
    ClickAction,
    ScreenshotAction,
    WriteAction,
    PressAction,
    ScrollAction,
    ScrapeAction,
    ExecuteJavascriptAction,
    PdfAction,
)

#: Firecrawl action type -> its model (by the model's ``type`` literal)
ACTION_MODELS: dict[str, type[BaseModel]] = {
    get_args(m.model_fields["type"].annotation)[0]: m for m in _ACTIONS
}


def _tagged(models: dict[str, type[BaseModel]], what: str, names: Any = None) -> Any:
    """A union of ``models`` chosen by the body's ``type``, each tagged with its class
    name (the gateway leaves model names and ``str`` out of a 400's field path), an
    unknown type a 400 listing the known ones; ``names``: a string form (a Literal)."""

    def tag(value: Any) -> str | None:
        if names is not None and isinstance(value, str):
            return "str"
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        model = models.get(kind) if isinstance(kind, str) else None
        return model.__name__ if model is not None else None

    members: tuple[Any, ...] = tuple(Annotated[m, Tag(m.__name__)] for m in models.values())
    if names is not None:
        members += (Annotated[names, Tag("str")],)
    known = ", ".join(models)
    return Annotated[
        Union[members],  # noqa: UP007 (a tuple of members: only Union takes it)
        Discriminator(
            tag,
            custom_error_type=f"invalid_{what}",
            custom_error_message=(f"unknown {what} type: one of {known}"),
        ),
    ]


Action = _tagged(ACTION_MODELS, "action")


class Location(_Strict):
    """Where the request should appear to come from: ``country`` (ISO 3166-1 alpha-2)
    and the ``languages`` it prefers (BCP 47 tags, most preferred first)."""

    country: str | None = None
    languages: (
        list[Annotated[str, Field(pattern=r"^[A-Za-z]{1,8}(-[A-Za-z0-9]{1,8})*$")]] | None
    ) = None


class PdfParser(_Strict):
    type: Literal["pdf"]
    mode: Literal["fast", "auto", "ocr"] | None = None
    max_pages: MaxPages | None = Field(None, alias="maxPages")
    pages: bool | None = None
    page_markdown: bool | None = Field(None, alias="pageMarkdown")  # Firecrawl's old name of pages
    blocks: bool | None = None
    page_markers: bool | None = Field(None, alias="pageMarkers")


class ImageParser(_Strict):
    type: Literal["image"]


Parser = _tagged({"pdf": PdfParser, "image": ImageParser}, "parser", Literal["pdf", "image"])


class ChangeTrackingOptions(_Strict):
    """Change tracking's options (v2: the keys of the ``changeTracking`` format object;
    v1: ``changeTrackingOptions``)."""

    modes: list[Literal["git-diff", "json"]] | None = None
    prompt: str | None = None
    schema_: Any = Field(None, alias="schema")
    tag: str | None = None
