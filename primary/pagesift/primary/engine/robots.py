"""Per-origin robots.txt cache (RFC 9309), shared by every job of the server.

Owns the rules of each origin (scheme://host:port). The guarantees:

- robots.txt is fetched at most once per origin and TLS choice per TTL; concurrent
  callers for one share that one fetch (a caller that is cancelled does not cancel it
  for the others).
- TLS: a caller that verifies certificates (the default) reads only a copy fetched
  with verification; one that skips it (``verify_tls=False``: a request with
  ``skip_tls_verification``) reads a fresh verified copy when there is one without a
  fetch error, else its own, fetched without verification and cached apart, so a
  certificate that fails verification never lets an unverified robots.txt decide a
  verifying job's pages.
- RFC 9309 outcomes: 2xx -> the parsed rules (first 512 KiB); 4xx (other than 429)
  or more than five redirects -> allow all; 5xx, 429 or unreachable -> disallow all,
  cached only for ``error_ttl`` seconds so the site is asked again soon, with the
  fetch error kept in ``Rules.error``. Following redirects (at most five hops, as the
  RFC asks) is the fetcher's business.
- Groups are matched with a product token (the user agent up to its first "/" or
  space, e.g. ``pagesift``), falling back to ``*``: the server's, or a job's own
  (``rules(url, agent)``: one cached file, read for each agent); ``Crawl-delay`` and
  ``Sitemap:`` lines are exposed. robots.txt itself is always fetched with the
  server's user agent, so one cached copy serves every job.
- Memory is bounded: at most ``max_origins`` entries, oldest dropped first.
- Matching is compiled once per origin and agent (off the loop) and bounded per URL
  (``Matcher``); ``HttpEngine.robots_allowed`` checks a batch (Map) on the loop in
  slices of at most ``SLICE_SECONDS``, yielding to the loop between slices.

``page_directives`` (pure) reads the page-level robots rules: ``<meta name="robots">``
(or ``name=<our token>``) contents and ``X-Robots-Tag`` header values, where a value
may be scoped to one agent (``googlebot: noindex``, ignored unless it is our token).
``none`` means both ``noindex`` and ``nofollow``. The job runtime applies them to
crawls (``jobs.runner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import urlparse, urlsplit

import re2
from protego import Protego
from protego._utils import _quote_path

__all__ = [
    "ALLOW_ALL",
    "DISALLOW_ALL",
    "Matcher",
    "RobotsCache",
    "RobotsFetcher",
    "Rules",
    "agent_token",
    "page_directives",
]

MAX_ROBOTS_BYTES = 512 * 1024  # RFC 9309 asks parsers to read at least 500 KiB
MAX_MATCH_CHARS = 16_384  # a longer URL is not allowed (the node's max_url_length is 8,192)
MAX_MATCH_WORK = 1_000_000  # characters wildcard rules may scan for one URL
SLICE_SECONDS = 0.01  # a batch of checks holds the loop this long at most between yields
_CANDIDATE_COST = 200  # MAX_MATCH_WORK charged per wildcard rule tried, beyond the URL

# Fetch robots.txt (its URL, whether to verify the site's TLS certificate): (status,
# body). Raise OSError/TimeoutError (or anything) when the server cannot be reached;
# status 0 also means unreachable.
RobotsFetcher = Callable[[str, bool], Awaitable[tuple[int, bytes]]]
_Key = tuple[str, bool]  # (origin, verify_tls)


def agent_token(user_agent: str) -> str:
    """The product token robots.txt groups are matched with: "pagesift/0.1 (...)" -> "pagesift"."""
    token = user_agent.strip().split("/", 1)[0].split(None, 1)
    return (token[0] if token else "*").lower()


def page_directives(meta: list[str], headers: list[str], agent: str) -> tuple[bool, bool]:
    """(noindex, nofollow) from meta robots contents and X-Robots-Tag header values.

    ``meta`` holds the contents of ``<meta name="robots">`` and ``<meta name=agent>``;
    a header value ``"bot: a, b"`` applies only when ``bot`` is ``agent`` (or ``*``)."""
    words: set[str] = set()
    for value in meta:
        words.update(w.strip().lower() for w in value.split(","))
    for value in headers:
        first, colon, rest = value.partition(":")
        scope = first.strip().lower()
        if colon and scope and " " not in scope and "," not in scope and scope not in (
            "unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"
        ):  # fmt: skip
            if scope not in (agent, "*"):
                continue
            value = rest
        words.update(w.strip().lower() for w in value.split(","))
    none = "none" in words
    return none or "noindex" in words, none or "nofollow" in words


class Matcher:
    """The rules of one robots.txt group, compiled for matching.

    Built from Protego's rule set for the group (its quoted patterns, priorities and
    fields, so parsing and quoting stay Protego's); ``allowed`` is Protego's
    ``can_fetch`` verdict for that group, within the work caps. Immutable once built;
    building costs one pass over the rules plus an RE2 set compile (run it off the
    loop: ``RobotsCache.rules`` does; Protego, pure Python, parses in a thread too).

    The cost per URL does not grow with the rule count: plain prefixes by length (a
    dict lookup per distinct length), ``$``-anchored literals in a dict, and wildcard
    rules behind an RE2 set of one literal "atom" per rule (its longest literal part:
    a rule whose atom is not in the URL cannot match), so only candidate rules are
    tried, highest priority first, and the first that matches decides. The verdict is
    Protego's (Google's): the longest matching rule wins, ``Allow`` on ties, ``*`` any
    run of characters, a trailing ``$`` the end, percent-encoding normalized
    (``test_hostile_discovery`` checks it against Protego on thousands of random rules
    and URLs). The work is capped: a URL longer than ``MAX_MATCH_CHARS``, or one that
    would need wildcard rules to scan more than ``MAX_MATCH_WORK`` characters (each
    rule tried is charged the URL's length plus 200, so at most 5,000 rules are tried
    for one URL), is not allowed: a robots.txt built to be expensive cannot cost more
    than that per URL, and refusing is the polite answer."""

    __slots__ = ("_always", "_atom_rules", "_atoms", "_exact", "_lengths", "_plain", "_wild")

    def __init__(self, rules: Sequence[tuple[str, int, bool, object]]) -> None:
        """``rules``: (quoted pattern, priority, is allow, Protego's _URLPattern)."""
        plain: dict[str, bool] = {}
        exact: dict[str, tuple[int, bool]] = {}
        wild: list[tuple[int, bool, object, str]] = []
        for pattern, priority, allow, url_pattern in rules:
            if "*" in pattern:
                parts = [p for p in pattern.rstrip("$").split("*") if p]
                atom = max(parts, key=len) if parts else ""
                wild.append((priority, allow, url_pattern, atom))
            elif pattern.endswith("$"):
                key = pattern[:-1]
                exact[key] = max(exact.get(key, (priority, allow)), (priority, allow))
            else:
                plain[pattern] = plain.get(pattern, False) or allow
        self._plain = plain
        self._lengths = sorted({len(p) for p in plain}, reverse=True)
        self._exact = exact
        wild.sort(key=lambda w: (w[0], w[1]), reverse=True)  # rank 0: the strongest
        self._wild = [(w[0], w[1], w[2]) for w in wild]
        always: list[int] = []
        atom_index: dict[str, int] = {}
        atom_rules: list[list[int]] = []
        for rank, (_, _, _, atom) in enumerate(wild):
            if not atom:
                always.append(rank)
                continue
            index = atom_index.setdefault(atom, len(atom_index))
            if index == len(atom_rules):
                atom_rules.append([])
            atom_rules[index].append(rank)
        self._atom_rules = atom_rules
        self._atoms = _atom_set(list(atom_index)) if atom_index else None
        if atom_index and self._atoms is None:  # RE2 refused it: every rule a candidate
            always = list(range(len(wild)))
        self._always = always

    @classmethod
    def of(cls, parser: Protego, agent: str) -> Matcher | None:
        """The matcher of the group ``parser`` applies to ``agent``; None: no group."""
        rule_set = parser._get_matching_rule_set(agent)
        if rule_set is None:
            return None
        return cls(
            [
                (r.value._pattern, r.value.priority, r.field == "allow", r.value)
                for r in rule_set._rules
            ]
        )

    def allowed(self, url: str) -> bool:
        if "/robots.txt" in url and urlparse(url).path == "/robots.txt":
            return True  # as Protego: robots.txt itself is always allowed
        if len(url) > MAX_MATCH_CHARS:
            return False
        path = _quote_path(url)
        best = (-1, True)  # (priority, allow) of the strongest match; none: allowed
        for length in self._lengths:  # plain prefixes, longest first
            if length <= len(path):
                allow = self._plain.get(path[:length])
                if allow is not None:
                    best = (length, allow)
                    break
        hit = self._exact.get(path)
        if hit is not None and hit > best:
            best = hit
        if not self._wild:
            return best[1]
        ranks = list(self._always)
        found = self._atoms.Match(path) if self._atoms is not None else None
        if isinstance(found, list):  # None: no atom in the URL
            for index in found:
                ranks.extend(self._atom_rules[index])
        ranks.sort()
        work = 0
        for rank in ranks:
            priority, allow, url_pattern = self._wild[rank]
            if (priority, allow) <= best:
                break  # no weaker candidate can change the verdict
            work += len(path) + _CANDIDATE_COST
            if work > MAX_MATCH_WORK:
                return False
            if url_pattern.match(path):  # type: ignore[attr-defined]
                return allow
        return best[1]


def _atom_set(atoms: list[str]) -> re2.Set | None:
    """An RE2 set searching for the literal ``atoms`` (one DFA pass over a URL);
    None when RE2 cannot build it within its memory budget."""
    options = re2.Options()
    options.literal = True  # type: ignore[attr-defined]  # (the stubs lack it)
    options.log_errors = False
    options.max_mem = min(64 << 20, (4 << 20) + 64 * sum(len(a) for a in atoms))
    atom_set = re2.Set.SearchSet(options)
    try:
        for atom in atoms:
            atom_set.Add(atom)
        atom_set.Compile()
    except re2.error:
        return None
    return atom_set


@dataclass(frozen=True, slots=True)
class Rules:
    """The robots.txt verdicts for one origin and one agent token."""

    parser: Protego | None = None
    allow_all: bool = True
    agent: str = "*"
    crawl_delay: float | None = None
    sitemaps: tuple[str, ...] = field(default_factory=tuple)
    # Why robots.txt could not be fetched (the fetcher's exception), when that is why
    # everything is disallowed; lets the engine report the real cause (dns, connect...).
    error: BaseException | None = None
    # Each agent's compiled group (None: no group applies), shared by the copies
    # ``for_agent`` makes of one cached file; filled by ``compile`` (off the loop).
    matchers: dict[str, Matcher | None] = field(default_factory=dict, compare=False, repr=False)

    def allowed(self, url: str) -> bool:
        if self.parser is None:
            return self.allow_all
        if self.agent not in self.matchers:
            self.compile()  # a caller that skipped RobotsCache.rules: compile here
        matcher = self.matchers[self.agent]
        return True if matcher is None else matcher.allowed(url)

    @property
    def compiled(self) -> bool:
        return self.parser is None or self.agent in self.matchers

    def compile(self) -> None:
        """Compile this agent's group (once; thread-safe enough: a race compiles twice
        and keeps one)."""
        if self.parser is not None and self.agent not in self.matchers:
            self.matchers[self.agent] = Matcher.of(self.parser, self.agent)

    def for_agent(self, agent: str) -> Rules:
        """The same robots.txt read for another agent token (a job's own user agent)."""
        if agent == self.agent or self.parser is None:
            return self
        delay = self.parser.crawl_delay(agent)
        return replace(
            self,
            agent=agent,
            crawl_delay=float(delay) if delay is not None and delay >= 0 else None,
        )


ALLOW_ALL = Rules(allow_all=True)
DISALLOW_ALL = Rules(allow_all=False)


def parse(body: bytes, agent: str) -> Rules:
    """Rules from a robots.txt body (undecodable bytes replaced; extra bytes ignored)."""
    text = body[:MAX_ROBOTS_BYTES].decode("utf-8", errors="replace")
    parser = Protego.parse(text)
    delay = parser.crawl_delay(agent)
    return Rules(
        parser=parser,
        agent=agent,
        crawl_delay=float(delay) if delay is not None and delay >= 0 else None,
        sitemaps=tuple(parser.sitemaps),
    )


def _compiled(body: bytes, agent: str) -> Rules:
    """``parse`` with ``agent``'s group compiled (for a worker thread)."""
    rules = parse(body, agent)
    rules.compile()
    return rules


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, lowercase, never with userinfo (robots.txt is
    fetched from, and cached under, the origin alone)."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}"


class RobotsCache:
    """robots.txt rules per origin, fetched once and cached (see module docstring)."""

    def __init__(
        self,
        fetch: RobotsFetcher,
        user_agent: str,
        *,
        ttl: float = 3600.0,
        error_ttl: float = 60.0,
        max_origins: int = 50_000,
    ) -> None:
        self._fetch = fetch
        self.agent = agent_token(user_agent)
        self._ttl = ttl
        self._error_ttl = error_ttl
        self._max = max_origins
        self._cache: dict[_Key, tuple[float, Rules]] = {}
        self._inflight: dict[_Key, asyncio.Task[Rules]] = {}
        self._compiling: dict[tuple[int, str], asyncio.Future[None]] = {}

    async def rules(self, url: str, agent: str | None = None, *, verify_tls: bool = True) -> Rules:
        """The rules for ``url``'s origin (fetching robots.txt when not cached), read
        for ``agent`` (a product token; default: the server's); ``verify_tls`` False:
        a caller that skips certificate verification (module docstring)."""
        origin = origin_of(url)
        rules = self._fresh((origin, True))
        if rules is not None and not verify_tls and rules.error is not None:
            rules = None  # a verified read that failed: this caller reads its own
        if rules is None and not verify_tls:
            rules = self._fresh((origin, False))
        if rules is None:
            key = (origin, verify_tls)
            task = self._inflight.get(key)
            if task is None:
                task = asyncio.ensure_future(self._load(key))
                self._inflight[key] = task
            rules = await asyncio.shield(task)
        if agent is not None:
            rules = rules.for_agent(agent)
        if not rules.compiled:
            await self._compile(rules)
        return rules

    def _fresh(self, key: _Key) -> Rules | None:
        hit = self._cache.get(key)
        return hit[1] if hit is not None and hit[0] > time.monotonic() else None

    async def _compile(self, rules: Rules) -> None:
        """Compile ``rules`` for its agent in a thread, once for concurrent callers."""
        key = (id(rules.matchers), rules.agent)
        pending = self._compiling.get(key)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(rules.compile))
            self._compiling[key] = pending
            pending.add_done_callback(lambda _: self._compiling.pop(key, None))
        with contextlib.suppress(Exception):  # never seen; ``allowed`` compiles inline then
            await asyncio.shield(pending)

    async def allowed(self, url: str) -> bool:
        return (await self.rules(url)).allowed(url)

    def forget(self, url: str) -> None:
        """Drop the cached rules of ``url``'s origin (both TLS choices)."""
        origin = origin_of(url)
        for verify in (True, False):
            self._cache.pop((origin, verify), None)

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        self._inflight.clear()
        self._cache.clear()

    async def _load(self, key: _Key) -> Rules:
        try:
            rules, ttl = await self._fetch_rules(*key)
            self._store(key, rules, ttl)
            return rules
        finally:
            self._inflight.pop(key, None)

    async def _fetch_rules(self, origin: str, verify_tls: bool) -> tuple[Rules, float]:
        try:
            status, body = await self._fetch(origin + "/robots.txt", verify_tls)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return Rules(allow_all=False, agent=self.agent, error=exc), self._error_ttl
        if 200 <= status < 300:
            try:  # Protego is pure Python: in a thread, the loop keeps its turns
                return await asyncio.to_thread(_compiled, body, self.agent), self._ttl
            except Exception:  # protego is lenient; be safe anyway: a broken file allows
                return ALLOW_ALL, self._ttl
        if 300 <= status < 500 and status != 429:  # 3xx here = more than 5 redirects
            return ALLOW_ALL, self._ttl
        return DISALLOW_ALL, self._error_ttl  # 5xx, 429, unreachable, too many redirects

    def _store(self, key: _Key, rules: Rules, ttl: float) -> None:
        cache = self._cache
        cache.pop(key, None)
        cache[key] = (time.monotonic() + ttl, rules)
        if len(cache) > self._max:
            now = time.monotonic()
            for key in [k for k, (exp, _) in cache.items() if exp <= now]:
                del cache[key]
            while len(cache) > self._max:
                del cache[next(iter(cache))]
