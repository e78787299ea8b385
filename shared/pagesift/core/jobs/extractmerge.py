"""An extract job's pages merged into one object (``merge``; pure).

What it owns
------------
The rule GetExtract answers by (docs/structured.md, "Extract"): the pages' FORMAT_JSON
objects are taken in batch order (the order of the job's URLs, not the order pages
finished), and for each key:

- two lists are concatenated, an item already present (the same JSON) left out;
- two objects are merged key by key, by these same rules;
- any other value is the first page's that has one (not null, "" or an empty list or
  object): a later page fills only what earlier ones left empty.

``sources`` names, for each top-level key, every page that gave it a value (in batch
order), so a reader can check a fact against the page it came from.

Guarantee
---------
The merge is a pure function of the stored pages and the job's URL order, so every
node (a standby from its replica, a primary after a failover) answers the same object
for the same pages, and nothing about it needs to be stored or replicated.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = ["merge"]


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _merge_value(old: Any, new: Any) -> tuple[Any, bool]:
    """``old`` and ``new`` merged, and whether ``new`` added to it."""
    if _empty(new):
        return old, False
    if _empty(old):
        return new, True
    if isinstance(old, list) and isinstance(new, list):
        seen = {_key(item) for item in old}
        added = [item for item in new if _key(item) not in seen]
        return (old + added, True) if added else (old, False)
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        changed = False
        for k, v in new.items():
            out[k], grew = _merge_value(out.get(k), v)
            changed = changed or grew
        return out, changed
    return old, False


def merge(pages: Iterable[tuple[str, Any]]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """``(url, object)`` of the pages in batch order -> the merged object, and for
    each of its keys the URLs that gave it a value. A page whose value is not an
    object is merged under the key ``"items"`` (a list of such values)."""
    merged: dict[str, Any] = {}
    sources: dict[str, list[str]] = {}
    for url, value in pages:
        obj = value if isinstance(value, dict) else {"items": [value]}
        for k, v in obj.items():
            merged[k], added = _merge_value(merged.get(k), v)
            if added:
                sources.setdefault(k, []).append(url)
            elif k not in merged:
                merged[k] = v
    return merged, sources
