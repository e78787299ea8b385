"""The fixed bounds of a request's actions are defined once, in the lower floor.

``pagesift.core.jobs.renderoptions`` defines them (``MAX_ACTIONS``, selector, text,
key and script sizes, scroll steps) and validates requests with them; the browser
engine's ``actions.plan`` imports them to check a stored request again. A second
definition could drift (validation accepting what the engine refuses), so no other
module of the code assigns one of these names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import renderoptions
from pagesift.core.jobs.pageerrors import PageError
from pagesift.core.jobs.validate import InvalidArgument
from pagesift.primary.engine.browser import actions
from pagesift.v1 import jobs_pb2

ROOT = Path(__file__).resolve().parents[1]
BOUNDS = (
    "MAX_ACTIONS",
    "MAX_SELECTOR",
    "MAX_WRITE_TEXT",
    "MAX_KEY",
    "MAX_SCROLL_STEPS",
    "MAX_SCRIPT_BYTES",
)
ENGINE_ALIASES = ("MAX_WRITE", "MAX_SCRIPT")  # other spellings of the same bounds


def _assigned(path: Path) -> set[str]:
    """The module-level names ``path`` assigns."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_each_action_bound_is_assigned_in_renderoptions_alone() -> None:
    owner = ROOT / "shared/pagesift/core/jobs/renderoptions.py"
    assert set(BOUNDS) <= _assigned(owner)
    others = []
    for folder in ("shared/pagesift", "primary/pagesift", "standby/pagesift"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == owner:
                continue
            again = _assigned(path) & {*BOUNDS, *ENGINE_ALIASES}
            if again:
                others.append(f"{path.relative_to(ROOT)}: {sorted(again)}")
    assert others == []


def _actions(n: int) -> jobs_pb2.ScrapeOptions:
    click = jobs_pb2.Action(click=jobs_pb2.ClickAction(selector="#more"))
    return jobs_pb2.ScrapeOptions(engine=jobs_pb2.FETCH_ENGINE_BROWSER, actions=[click] * n)


def test_validation_and_the_engine_draw_the_line_at_the_same_count() -> None:
    config = ServerConfig()
    bounds = actions.Bounds.of(config)
    most = _actions(renderoptions.MAX_ACTIONS)
    renderoptions.check(most, config)
    assert len(actions.plan(most, bounds).steps) == renderoptions.MAX_ACTIONS
    over = _actions(renderoptions.MAX_ACTIONS + 1)
    with pytest.raises(InvalidArgument):
        renderoptions.check(over, config)
    with pytest.raises(PageError, match=f"at most {renderoptions.MAX_ACTIONS}"):
        actions.plan(over, bounds)
