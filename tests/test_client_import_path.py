"""The client's public import path, and the deprecated one (it warns, then hands back the same
objects)."""

from __future__ import annotations

import importlib
import sys

import pytest

import pagesift.client


def test_the_old_client_path_warns_and_gives_the_same_objects() -> None:
    sys.modules.pop("pagesift.shared.client", None)
    with pytest.warns(DeprecationWarning, match="import from pagesift.client"):
        old = importlib.import_module("pagesift.shared.client")
    for name in pagesift.client.__all__:
        assert getattr(old, name) is getattr(pagesift.client, name), name


def test_the_public_path_names_exactly_what_it_exports() -> None:
    for name in pagesift.client.__all__:
        assert hasattr(pagesift.client, name), name
    assert {"JobClient", "SyncJobClient", "ClientError", "RetryPolicy"} <= set(
        pagesift.client.__all__
    )
