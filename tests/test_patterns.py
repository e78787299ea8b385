"""Caller regexes: RE2 only, bounded, refused with the field and index, never slow."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest

from pagesift.core.jobs import patterns
from pagesift.core.jobs.patterns import Limits, PathFilter, PatternError, compile_patterns
from pagesift.v1 import jobs_pb2
from tests.helpers import in_process_node

OK = "http://127.0.0.1:9/"


def test_path_filter_includes_and_excludes_by_path_and_query() -> None:
    f = PathFilter(include=[r"^/blog/"], exclude=[r"draft", r"page=\d{2,}"])
    assert f.allows("https://e.com/blog/post-1")
    assert not f.allows("https://e.com/about")
    assert not f.allows("https://e.com/blog/draft-2")
    assert f.allows("https://e.com/blog/?page=3")
    assert not f.allows("https://e.com/blog/?page=12")
    assert PathFilter().allows("https://e.com/anything")


def test_a_catastrophic_pattern_matches_a_long_path_at_once() -> None:
    # Python's re takes ~2**n steps here; RE2 is linear. No timing assertion: with a
    # backtracking engine this call would not return within the test's timeout.
    f = PathFilter(include=[r"^/(a+)+$"])
    assert not f.allows("https://e.com/" + "a" * 100_000 + "b")
    assert f.allows("https://e.com/" + "a" * 100_000)


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        (r"(a)\1", "invalid escape sequence"),  # backreference
        (r"(?=a)", "invalid perl operator"),  # lookahead
        (r"(?<!a)b", "invalid perl operator"),  # lookbehind
        ("a{4294967296}", "repetition count 4294967296 exceeds 1000"),
        ("a{2,1001}", "repetition count 1001 exceeds 1000"),
        ("(" * 101 + ")" * 101, "nested deeper than 100"),
        ("(unclosed", "missing )"),
        (r"\pL{1000}", "too large for the regex memory budget"),
    ],
)
def test_what_re2_cannot_run_in_linear_time_is_refused(pattern: str, words: str) -> None:
    with pytest.raises(PatternError, match="pattern 1: ") as e:
        compile_patterns([r"^/ok", pattern])
    assert e.value.index == 1
    assert words in e.value.reason


@pytest.mark.parametrize(
    "pattern",
    [r"\{1000000\}", r"[{]9999999}", r"\Qa{99999}\E", r"[(]" * 200, r"[[:alpha:]{]5000}"],
)
def test_escaped_or_classed_braces_and_parens_are_literals(pattern: str) -> None:
    assert len(compile_patterns([pattern])) == 1


def test_bounds_are_checked_before_compiling() -> None:
    with pytest.raises(PatternError, match="3 patterns exceed the cap of 2") as e:
        compile_patterns(["a", "b", "c"], Limits(count=2))
    assert e.value.index is None
    with pytest.raises(PatternError, match="pattern 0: 11 characters exceed the cap of 10"):
        compile_patterns(["a" * 11], Limits(length=10))


def test_the_filter_names_the_side_of_a_bad_pattern() -> None:
    with pytest.raises(PatternError) as e:
        PathFilter(include=["ok"], exclude=["fine", "(?=x)"])
    assert (e.value.which, e.value.index) == ("exclude", 1)


async def test_the_async_filter_agrees_with_the_blocking_one() -> None:
    f = await patterns.compile_filter([r"^/docs/"], [r"\.pdf$"])
    urls = ["http://h/docs/a", "http://h/docs/a.pdf", "http://h/blog", "http://h/docs/?q=1"]
    assert await f.allowed(urls) == [f.allows(u) for u in urls] == [True, False, False, True]
    assert await (await patterns.compile_filter([], [])).allowed(urls) == [True] * 4


REFUSED: list[tuple[str, jobs_pb2.StartCrawlRequest, str]] = [
    (
        "backreference",
        jobs_pb2.StartCrawlRequest(url=OK, include_paths=["ok", r"(a)\1"]),
        "include_paths[1]",
    ),
    ("lookahead", jobs_pb2.StartCrawlRequest(url=OK, exclude_paths=["(?=a)"]), "exclude_paths[0]"),
    (
        "huge count",
        jobs_pb2.StartCrawlRequest(url=OK, include_paths=["a{4294967296}"]),
        "include_paths[0]",
    ),
    (
        "too long",
        jobs_pb2.StartCrawlRequest(url=OK, exclude_paths=["x", "a" * 1001]),
        "exclude_paths[1]",
    ),
    (
        "too many",
        jobs_pb2.StartCrawlRequest(url=OK, include_paths=["a"] * 65),
        "include_paths",
    ),
    (
        "deep nesting",
        jobs_pb2.StartCrawlRequest(url=OK, include_paths=["(" * 10_000 + ")" * 10_000]),
        "include_paths[0]",
    ),
    (
        "deep nesting within the length bound",
        jobs_pb2.StartCrawlRequest(url=OK, include_paths=["(" * 400 + "a" + ")" * 400]),
        "include_paths[0]",
    ),
]


async def test_bad_patterns_are_invalid_argument_naming_field_and_index(tmp_path: Path) -> None:
    async with in_process_node(tmp_path) as node:
        for label, request, field in REFUSED:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await node.stub.StartCrawl(request)
            details = e.value.details() or ""
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (label, details)
            assert details.startswith(field + ":"), (label, details)
            assert len(details) < 400, (label, details)
        assert list(node.node.store().replicated_items()) == [], "a rejected call wrote"


async def test_the_regex_bounds_come_from_the_config(tmp_path: Path) -> None:
    async with in_process_node(tmp_path, max_regexes=2, max_regex_length=5) as node:
        for request, words in (
            (jobs_pb2.StartCrawlRequest(url=OK, include_paths=["a"] * 3), "cap of 2"),
            (jobs_pb2.StartCrawlRequest(url=OK, exclude_paths=["abcdef"]), "cap of 5"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await node.stub.StartCrawl(request)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert words in (e.value.details() or "")


@pytest.mark.parametrize(
    "url",
    [
        "http://h/",
        "http://h",
        "http://h?x=1",
        "http://h/a/b?x=1&y=2",
        "http://h/a?",
        "https://h:8443/%7Ea/b;c?q=%20",
        "http://h/a#frag",
        "http://h/a b",
        "http://h/é?ü",
        "/relative/path?x",
        "http://h//double",
    ],
)
def test_the_fast_target_is_the_urlsplit_one(url: str) -> None:
    parts = urlsplit(url)
    want = f"{parts.path or '/'}?{parts.query}" if parts.query else (parts.path or "/")
    assert patterns._target(url) == want


def test_several_patterns_answer_as_each_would_alone() -> None:
    include = [r"(?i)^/DOCS/", r"a|b$", r"^/x/\Qa.b", r"^/y\d{2}$", ""]
    urls = ["http://h/docs/1", "http://h/zzb", "http://h/x/a.b", "http://h/x/axb", "http://h/y12"]
    together = PathFilter(include=include[:4])
    assert len(together.include) == 4  # \Q cannot be wrapped: kept apart
    joined = PathFilter(include=[include[0], include[1], include[3]])
    assert len(joined.include) == 1  # one alternation, one pass
    for u in urls:
        alone = [PathFilter(include=[p]).allows(u) for p in include[:4]]
        assert together.allows(u) is any(alone), u
        assert joined.allows(u) is any(alone[i] for i in (0, 1, 3)), u
    assert PathFilter(include=["", "zzz"]).allows("http://h/anything")
