"""Caller-supplied regexes (a crawl's ``include_paths``/``exclude_paths``), made safe to run.

Owns compiling and matching every regex a caller sends. The guarantees:

- Every pattern is compiled by RE2 (``google-re2``), a linear-time engine: matching a
  text of n characters costs O(n x program size), never exponential, whatever the
  pattern. There is no fallback to Python's ``re``: ``re2.compile`` with explicit
  ``re2.Options`` either builds an RE2 program or raises, so syntax RE2 lacks
  (backreferences, lookahead/lookbehind, possessive or atomic groups, ``\\Z``) is refused.
- Before RE2 sees a pattern, the list is bounded (``Limits.count`` patterns of at most
  ``Limits.length`` characters) and the pattern's shape is checked: counted repetitions
  above RE2's 1,000 are refused (RE2 would silently read ``a{4294967296}`` as the
  literal text ``a{4294967296}``) and so is group nesting deeper than ``MAX_NESTING``.
- Each compiled program, with its lazily built DFA cache, stays within ``Limits.memory``
  bytes (RE2's ``max_mem``); a pattern that needs more is refused ("too large"), and a
  DFA that fills its budget while matching falls back to RE2's NFA (slower, still linear).
- Errors are ``PatternError`` with the pattern's index and a one-line reason; RE2's own
  error logging is off (``log_errors``), so a bad pattern writes no log lines.

Why the event loop stays free: with these bounds one compile takes at most tens of
milliseconds (measured: ~15-20 ms for the worst 1,000-character patterns at a 1 MiB
budget, which RE2 then refuses), and ``compile_filter`` runs compiles on a small
thread pool. ``PathFilter.allowed`` matches on the filter's own thread (one per
running crawl); RE2 releases the GIL while it matches, so a slow match (linear, but
e.g. a 1,000-state NFA over an 8 KiB path) delays only that crawl, never the loop,
health checks, replication heartbeats or another job. Several patterns of one side
are also joined into one alternation when it fits one pattern's budget, so a link
costs one RE2 pass per side (plus a small per-filter memo of recent answers).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import re2

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_NESTING",
    "MAX_REPEAT",
    "Limits",
    "PathFilter",
    "PatternError",
    "compile_filter",
    "compile_patterns",
]

MAX_REPEAT = 1_000  # RE2's own bound on {n,m}; larger counts must not turn into literals
MAX_NESTING = 100  # groups deeper than this are no real path filter, only compile work


@dataclass(frozen=True)
class Limits:
    """Bounds on one list of patterns (defaults match ``ServerConfig``)."""

    count: int = 64
    length: int = 1_000
    memory: int = 1 << 20  # RE2 max_mem per pattern: program + DFA cache


DEFAULT_LIMITS = Limits()


class PatternError(ValueError):
    """A pattern list that cannot be accepted.

    ``index`` is None for the list as a whole (too many); ``which`` is "include" or
    "exclude" when a ``PathFilter`` raised it, "" otherwise.
    """

    def __init__(self, index: int | None, reason: str, which: str = "") -> None:
        super().__init__(reason if index is None else f"pattern {index}: {reason}")
        self.index = index
        self.reason = reason
        self.which = which


_MEMO_SIZE = 4_096  # per filter: the answers for the paths seen most recently

_COUNT = re.compile(r"\{([0-9]+)(?:,([0-9]*))?\}")  # a linear, fixed regex over bounded text


def _class_end(pattern: str, i: int) -> int:
    """Index just past the character class opening at ``pattern[i] == '['``."""
    n = len(pattern)
    j = i + 1
    if j < n and pattern[j] == "^":
        j += 1
    if j < n and pattern[j] == "]":
        j += 1  # a leading "]" is a literal
    while j < n:
        c = pattern[j]
        if c == "\\":
            j += 2
        elif c == "[" and pattern.startswith("[:", j):
            close = pattern.find(":]", j + 2)
            j = close + 2 if close >= 0 else j + 1
        elif c == "]":
            return j + 1
        else:
            j += 1
    return n  # unterminated: RE2 reports it


def _shape_problem(pattern: str) -> str | None:
    """Why the pattern's repetition counts or nesting are refused, or None.

    A single pass that skips escapes, ``\\Q...\\E`` literals and character classes the
    way RE2's parser does; RE2 itself stays the judge of everything else.
    """
    n = len(pattern)
    i = depth = 0
    while i < n:
        c = pattern[i]
        if c == "\\":
            if pattern.startswith("\\Q", i):
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
            else:
                i += 2
            continue
        if c == "[":
            i = _class_end(pattern, i)
            continue
        if c == "(":
            depth += 1
            if depth > MAX_NESTING:
                return f"groups nested deeper than {MAX_NESTING} levels"
        elif c == ")":
            depth = max(0, depth - 1)
        elif c == "{":
            m = _COUNT.match(pattern, i)
            if m is not None:
                for digits in m.groups():
                    if digits and (len(digits) > 4 or int(digits) > MAX_REPEAT):
                        return f"repetition count {digits[:20]} exceeds {MAX_REPEAT}"
                i = m.end()
                continue
        i += 1
    return None


def _options(limits: Limits) -> re2.Options:
    options = re2.Options()
    options.max_mem = limits.memory
    options.log_errors = False
    return options


def _re2_reason(exc: re2.error) -> str:
    raw = exc.args[0] if exc.args else ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if "pattern too large" in text:
        return "too large for the regex memory budget (simplify it, e.g. fewer counted repeats)"
    return f"not supported by the linear-time regex engine (RE2 syntax): {text}"


def compile_patterns(
    patterns: Sequence[str], limits: Limits = DEFAULT_LIMITS
) -> list[re2._Regexp[str]]:
    """RE2 programs for ``patterns``, or ``PatternError`` naming the first bad one.

    Checks the count, then each pattern's length and shape, then compiles it. Cheap
    for bounded patterns (see the module docstring); call ``compile_filter`` from
    async code to keep even that off the event loop.
    """
    if len(patterns) > limits.count:
        raise PatternError(None, f"{len(patterns)} patterns exceed the cap of {limits.count}")
    for i, pattern in enumerate(patterns):
        if len(pattern) > limits.length:
            raise PatternError(i, f"{len(pattern)} characters exceed the cap of {limits.length}")
    options = _options(limits)
    compiled: list[re2._Regexp[str]] = []
    for i, pattern in enumerate(patterns):
        problem = _shape_problem(pattern)
        if problem is not None:
            raise PatternError(i, problem)
        try:
            compiled.append(re2.compile(pattern, options))
        except re2.error as exc:
            raise PatternError(i, _re2_reason(exc)) from None
    return compiled


def _compile_side(which: str, patterns: Iterable[str], limits: Limits) -> list[re2._Regexp[str]]:
    """The side's patterns, each compiled (and so checked) on its own, then, when there
    are several, one alternation ``(?:p0)|(?:p1)|...`` that answers "any?" in one pass
    if it fits the budget of ONE pattern (so its compile stays as short as one's); else
    they stay apart. ``\\Q`` (literal to the end) cannot be wrapped."""
    listed = list(patterns)
    try:
        compiled = compile_patterns(listed, limits)
    except PatternError as e:
        raise PatternError(e.index, e.reason, which) from None
    if len(compiled) < 2 or any("\\Q" in p for p in listed):
        return compiled
    options = _options(limits)
    try:
        return [re2.compile("|".join(f"(?:{p})" for p in listed), options)]
    except re2.error:
        return compiled  # each fits on its own; keep them apart


def _target(url: str) -> str:
    """The path (``/`` when empty) plus ``?query`` when the query is not empty.

    Page keys (``scheme://host/path?query``) take a fast path; anything else,
    ``urlsplit``. Both give the same answer (tests/test_patterns.py).
    """
    start = url.find("://")
    if start > 0 and "#" not in url and url.isprintable() and " " not in url:
        slash = url.find("/", start + 3)
        query = url.find("?", start + 3)
        if slash >= 0 and (query < 0 or slash < query):
            return url[slash:-1] if url[-1] == "?" else url[slash:]
    parts = urlsplit(url)
    return f"{parts.path or '/'}?{parts.query}" if parts.query else (parts.path or "/")


class PathFilter:
    """Include/exclude RE2 patterns over a URL's path (plus ``?query`` when there is one),
    or over the whole URL as given (a crawl's ``regex_on_full_url``: callers pass
    normalized page keys) with ``full_url``.

    A URL passes when it matches (search, anywhere in the target) at least one include
    pattern (or there are none) and no exclude pattern.
    """

    __slots__ = ("_memo", "_thread", "exclude", "full_url", "include")

    def __init__(
        self,
        include: Iterable[str] = (),
        exclude: Iterable[str] = (),
        limits: Limits = DEFAULT_LIMITS,
        *,
        full_url: bool = False,
    ) -> None:
        self.include = _compile_side("include", include, limits)
        self.exclude = _compile_side("exclude", exclude, limits)
        self.full_url = full_url
        self._memo: dict[str, bool] = {}  # url -> answer: navigation links repeat
        self._thread: ThreadPoolExecutor | None = None  # this filter's own matcher

    @property
    def empty(self) -> bool:
        return not self.include and not self.exclude

    def allows(self, url: str) -> bool:
        """Blocking (RE2 matching, GIL released); ``allowed`` runs it off the loop."""
        if not self.include and not self.exclude:
            return True
        known = self._memo.get(url)
        if known is not None:
            return known
        target = url if self.full_url else _target(url)
        # RE2 matches UTF-8 bytes; handing it bytes skips the wrapper's per-call
        # character-offset bookkeeping for str (2.5x cheaper, same yes/no answer).
        data = target.encode("utf-8", "replace")
        ok = (not self.include or any(p.search(data) for p in self.include)) and not any(
            p.search(data) for p in self.exclude
        )
        if len(self._memo) >= _MEMO_SIZE:
            self._memo.clear()  # bounded; threads may race here, harmlessly
        self._memo[url] = ok
        return ok

    async def allowed(self, candidates: Sequence[str]) -> list[bool]:
        """``allows`` for each URL, on this filter's own thread (inline when there are
        no patterns). One thread per filter, i.e. per running crawl: a job whose
        patterns are slow to match (linear, but e.g. 1,000 NFA states x an 8 KiB path)
        slows only itself, never the loop nor another job. The thread ends when the
        filter is dropped (``ThreadPoolExecutor`` wakes idle workers on collection)."""
        if self.empty:
            return [True] * len(candidates)
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="pagesift-regex")
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, lambda: [self.allows(u) for u in candidates]
        )


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """Two threads compiling caller regexes, apart from the loop's default executor (DNS)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pagesift-regex")
    return _POOL


async def compile_filter(
    include: Sequence[str],
    exclude: Sequence[str],
    limits: Limits = DEFAULT_LIMITS,
    *,
    full_url: bool = False,
) -> PathFilter:
    """A ``PathFilter`` compiled on the pattern pool; ``PatternError`` as ``compile_patterns``."""
    if not include and not exclude:
        return PathFilter(full_url=full_url)
    return await asyncio.get_running_loop().run_in_executor(
        _pool(), lambda: PathFilter(include, exclude, limits, full_url=full_url)
    )
