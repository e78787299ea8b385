"""The address guard against every spelling of a blocked address, and URL credentials.

Property tests (hypothesis) write loopback and private addresses every way a URL
parser may read them: Unicode digits (every code point NFKC maps to an ASCII digit),
ideographic and full-width dots, decimal/octal/hex/short IPv4 forms, percent-escapes,
IPv4-mapped, compatible and NAT64 IPv6, trailing dots, mixed case, and the names of
/etc/hosts that point at loopback. Each must be refused by the request validator and
by the engine's fetch path (``blocked_address``) without a connection being made: a
counting listener on loopback sees every TCP connection to the port the URLs name.

Only loopback addresses ever reach the engine (and the listener is the only thing
they could connect to); private and NAT64 spellings go through the pure parser and
the validator, and through the socket factory as a call, never a connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import blockedaddresses, urls, validate
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.http import HttpEngine
from pagesift.primary.engine.netguard import AddressGuard, BlockedAddressError
from pagesift.v1 import jobs_pb2
from tests.helpers import EngineMaker, all_documents, in_process_node, wait_terminal

GUARDED = ServerConfig(
    allow_private_networks=False,
    respect_robots=False,
    read_timeout=0.5,
    connect_timeout=1.0,
    max_redirects=4,
)
OPTS = jobs_pb2.ScrapeOptions()

# Every code point that NFKC maps to one ASCII digit: full-width, mathematical,
# circled, superscript, subscript... (100 of them in Unicode 15).
UNICODE_DIGITS: dict[str, list[str]] = {d: [] for d in "0123456789"}
for _cp in range(0x80, 0x20000):
    _n = unicodedata.normalize("NFKC", chr(_cp))
    if len(_n) == 1 and "0" <= _n <= "9":
        UNICODE_DIGITS[_n].append(chr(_cp))
# Full-width letters for the hex digits and the "x" of "0x".
UNICODE_LETTERS = {
    c: [chr(0xFF41 + ord(c) - ord("a")), chr(0xFF21 + ord(c) - ord("a"))] for c in "abcdefx"
}
DOTS = [".", "\u3002", "\uff0e", "\uff61"]  # ASCII, ideographic, full-width, half-width


@st.composite
def _spell_chars(draw: st.DrawFn, text: str) -> str:
    """``text`` with each character maybe in another Unicode form or percent-escaped."""
    out = []
    for c in text:
        kind = draw(st.sampled_from(["same", "same", "unicode", "case", "escape"]))
        if kind == "unicode" and c in UNICODE_DIGITS:
            out.append(draw(st.sampled_from(UNICODE_DIGITS[c])))
        elif kind == "unicode" and c.lower() in UNICODE_LETTERS:
            out.append(draw(st.sampled_from(UNICODE_LETTERS[c.lower()])))
        elif kind == "case":
            out.append(c.upper())
        elif kind == "escape" and c.isascii() and c.isalnum():
            out.append(f"%{ord(c):02X}")
        else:
            out.append(c)
    return "".join(out)


@st.composite
def _ipv4_number(draw: st.DrawFn, n: int) -> str:
    radix = draw(st.sampled_from(["dec", "oct", "hex"]))
    if radix == "dec":
        return str(n)
    zeros = "0" * draw(st.integers(0, 2))
    if radix == "oct":
        return "0" + zeros + format(n, "o")
    return draw(st.sampled_from(["0x", "0X"])) + zeros + format(n, draw(st.sampled_from("xX")))


@st.composite
def ipv4_spelling(draw: st.DrawFn, ip: str) -> str:
    """A WHATWG-valid spelling of the IPv4 address ``ip`` (1 to 4 parts, any radix)."""
    value = int.from_bytes(socket.inet_aton(ip), "big")
    parts = draw(st.integers(1, 4))
    head = [(value >> (24 - 8 * i)) & 0xFF for i in range(parts - 1)]
    tail = value & ((1 << (8 * (5 - parts))) - 1)
    numbers = [draw(_ipv4_number(n)) for n in [*head, tail]]
    text = draw(_spell_chars(".".join(numbers)))
    pieces = text.split(".")
    host = pieces[0]
    for piece in pieces[1:]:
        host += draw(st.sampled_from(DOTS)) + piece
    if draw(st.booleans()):
        host += draw(st.sampled_from(DOTS))
    return host


@st.composite
def ipv6_spelling(draw: st.DrawFn, ip: str) -> str:
    """A spelling of the IPv6 address ``ip``: any zero run compressed or not, groups
    with leading zeros, either case, the last 32 bits maybe dotted."""
    packed = socket.inet_pton(socket.AF_INET6, ip)
    groups = [int.from_bytes(packed[i : i + 2], "big") for i in range(0, 16, 2)]
    texts = [
        "0" * draw(st.integers(0, 4 - len(format(g, "x")))) + format(g, draw(st.sampled_from("xX")))
        for g in groups
    ]
    if draw(st.booleans()):
        texts[6:] = [f"{packed[12]}.{packed[13]}.{packed[14]}.{packed[15]}"]
    last = 6 if len(texts) == 7 else 8  # a dotted tail is never compressed
    zero_runs = [
        (i, j)
        for i in range(last)
        for j in range(i + 1, last + 1)
        if all(groups[k] == 0 for k in range(i, j))
    ]
    compress = draw(st.booleans())
    if zero_runs and compress:
        i, j = draw(st.sampled_from(zero_runs))
        return "[" + ":".join(texts[:i]) + "::" + ":".join(texts[j:]) + "]"
    return "[" + ":".join(texts) + "]"


def _etc_hosts_loopback_names() -> list[str]:
    names: list[str] = []
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        return names
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and (fields[0].startswith("127.") or fields[0] == "::1"):
            names.extend(f for f in fields[1:] if "." not in f or not f[-1].isdigit())
    return sorted(set(names))


LOOPBACK_NAMES = sorted({"localhost", "app.localhost", *_etc_hosts_loopback_names()})


@st.composite
def name_spelling(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(LOOPBACK_NAMES))
    text = draw(_spell_chars(name))
    # full-width letters (UTS 46 maps them to ASCII) on top of the case changes
    text = "".join(
        chr(0xFF21 + ord(c) - ord("a")) if "a" <= c <= "z" and draw(st.booleans()) else c
        for c in text
    )
    if draw(st.booleans()):
        text += draw(st.sampled_from(DOTS))
    return text


LOOPBACK_V4 = ["127.0.0.1", "127.0.0.2", "127.1.2.3", "127.255.255.254"]
PRIVATE_V4 = ["10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0"]

# (spelling, the address it names) -- loopback only: these may reach the engine.
loopback_hosts = st.one_of(
    st.sampled_from(LOOPBACK_V4).flatmap(lambda ip: ipv4_spelling(ip).map(lambda h: (h, ip))),
    ipv6_spelling("::1").map(lambda h: (h, "::1")),
    st.sampled_from(LOOPBACK_V4).flatmap(
        lambda ip: ipv6_spelling("::ffff:" + ip).map(lambda h: (h, "::ffff:" + ip))
    ),
)
# Never connected to: the pure parser, the validator and the socket factory only.
other_blocked_hosts = st.one_of(
    st.sampled_from(PRIVATE_V4).flatmap(lambda ip: ipv4_spelling(ip).map(lambda h: (h, ip))),
    st.sampled_from(LOOPBACK_V4 + PRIVATE_V4).flatmap(
        lambda ip: ipv6_spelling("64:ff9b::" + ip).map(lambda h: (h, "64:ff9b::" + ip))
    ),
    st.sampled_from(PRIVATE_V4).flatmap(
        lambda ip: ipv6_spelling("::ffff:" + ip).map(lambda h: (h, "::ffff:" + ip))
    ),
    ipv6_spelling("::127.0.0.1").map(lambda h: (h, "::127.0.0.1")),
    ipv6_spelling("fe80::1").map(lambda h: (h, "fe80::1")),
    ipv6_spelling("fd00:ec2::254").map(lambda h: (h, "fd00:ec2::254")),
)


def _canonical(ip: str) -> str:
    """The serialized host WHATWG gives the address ``ip`` (no brackets)."""
    if ":" not in ip:
        return ip
    packed = socket.inet_pton(socket.AF_INET6, ip)
    groups = [int.from_bytes(packed[i : i + 2], "big") for i in range(0, 16, 2)]
    best, best_len, i = -1, 1, 0
    while i < 8:
        j = i
        while j < 8 and groups[j] == 0:
            j += 1
        if j - i > best_len:
            best, best_len = i, j - i
        i = max(j, i + 1)
    if best < 0:
        return ":".join(format(g, "x") for g in groups)
    head = ":".join(format(g, "x") for g in groups[:best])
    tail = ":".join(format(g, "x") for g in groups[best + best_len :])
    return f"{head}::{tail}"


# --- the one host parser --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "canonical"),
    [
        ("\uff11\uff12\uff17.\uff10.\uff10.\uff11", "127.0.0.1"),
        ("\u2460\u2461\u2466.\u24ea.\u24ea.\u2460", "127.0.0.1"),
        ("127\u30020\u30020\u30021", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7F000001", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("%31%32%37.0.0.1", "127.0.0.1"),
        ("[::FFFF:127.0.0.1]", "[::ffff:7f00:1]"),
        ("[0:0:0:0:0:0:0:1]", "[::1]"),
        ("[64:ff9b::127.0.0.1]", "[64:ff9b::7f00:1]"),
        ("LOCALHOST.", "localhost"),
        ("\uff2c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54", "localhost"),
        ("Example.COM", "example.com"),
        ("b\u00fccher.example", "xn--bcher-kva.example"),
        ("fa\u00df.de", "xn--fa-hia.de"),  # IDNA 2008 / UTS 46 non-transitional, not fass.de
        ("my_host.example", "my_host.example"),
    ],
)
def test_canonical_host_is_the_whatwg_host(host: str, canonical: str) -> None:
    assert urls.canonical_host(host) == canonical
    assert urls.normalize(f"http://{host}:8080/x") == f"http://{canonical}:8080/x"


@pytest.mark.parametrize(
    "host",
    [
        "1.2.3.4.5",  # five parts
        "256.0.0.1",  # a part over 255
        "1.2.3.0x100",  # the last part over 255
        "foo.1",  # ends in a number but is no IPv4 address
        "09.0.0.1",  # not octal
        "4294967296",  # over 32 bits
        "[::1%25eth0]",  # zone ids are not URL hosts
        "[1::2::3]",
        "exa%mple.com",
        "%zz.example",
        "%ff.example",  # not UTF-8
        "a\u200db.example",  # ZWJ outside its context (IDNA 2008 CONTEXTJ)
        "\ufffd.example",
        "xn--a.example",  # not Punycode
        "\uff1a",  # full-width colon maps to a forbidden ":"
        "...",
    ],
)
def test_an_unparsable_host_is_refused(host: str) -> None:
    with pytest.raises(ValueError):
        urls.canonical_host(host)
    url = f"http://{host}/x"
    assert urls.validate(url, 1000) is not None
    with pytest.raises(ValueError):
        urls.normalize(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.1/a",
        "http://0x7f.1/a",
        "http://2130706433/a",
        "http://0177.0.0.1/a",
        "http://127.0.0.1/a",
        "http://10.0.0.01/a",
        "http://xn--bcher-kva.example/a",
    ],
)
def test_the_fast_path_never_keeps_a_numeric_or_punycode_host_raw(url: str) -> None:
    assert urls.normalize(url) == urls._normalize_slow(url, False)
    assert urls.normalize(url) == "http://" + urls.canonical_host(urls.host_of(url)) + "/a"


_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_SETTINGS
@given(st.one_of(loopback_hosts, other_blocked_hosts))
def test_every_spelling_of_a_blocked_address_is_that_address(spelling: tuple[str, str]) -> None:
    host, ip = spelling
    url = f"http://{host}:8080/secret"
    assert urls.host_of(url) == _canonical(ip), host
    assert blockedaddresses.block_class(urls.host_of(url)) is not None
    key = urls.normalize(url)
    want = _canonical(ip) if ":" not in ip else f"[{_canonical(ip)}]"
    assert key == f"http://{want}:8080/secret"
    assert urls.normalize(key) == key


@_SETTINGS
@given(st.one_of(loopback_hosts, other_blocked_hosts, name_spelling().map(lambda h: (h, ""))))
async def test_the_request_validator_refuses_every_spelling(spelling: tuple[str, str]) -> None:
    url = f"http://{spelling[0]}:8080/secret"
    with pytest.raises(validate.InvalidArgument, match="refused"):
        await validate.url(url, "url", GUARDED)


# --- the engine's fetch path: no connection is made -----------------------------------------


@dataclass
class Listener:
    """A TCP listener on 127.0.0.1 and ::1 (one port) that counts connections."""

    port: int = 0
    connections: int = 0
    servers: list[asyncio.Server] = field(default_factory=list)

    async def start(self) -> None:
        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        v4 = await asyncio.start_server(accepted, "127.0.0.1", 0)
        self.port = v4.sockets[0].getsockname()[1]
        self.servers.append(v4)
        # no IPv6 loopback here: a [::1] connection would be refused, and still counted 0
        with contextlib.suppress(OSError):
            self.servers.append(await asyncio.start_server(accepted, "::1", self.port))

    async def close(self) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    lst = Listener()
    await lst.start()
    yield lst
    await lst.close()


@pytest.fixture
async def guarded_engine(make_engine: EngineMaker) -> HttpEngine:
    return await make_engine(GUARDED)


@_SETTINGS
@given(st.one_of(loopback_hosts, name_spelling().map(lambda h: (h, ""))))
async def test_the_engine_refuses_every_loopback_spelling_without_connecting(
    listener: Listener, guarded_engine: HttpEngine, spelling: tuple[str, str]
) -> None:
    url = f"http://{spelling[0]}:{listener.port}/secret"
    with pytest.raises(PageError) as info:
        await guarded_engine.scrape(url, OPTS)
    assert info.value.code == ErrorCode.BLOCKED_ADDRESS, (url, info.value)
    assert listener.connections == 0, url


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "\uff11\uff12\uff17.\uff10.\uff10.\uff11",
        "\u2460\u2461\u2466.\u24ea.\u24ea.\u2460",
        "127\u30020\u30020\u30021",
        "[::ffff:127.0.0.1]",
        "[::1]",
    ],
)
async def test_the_engine_session_refuses_blocked_addresses_at_the_socket(
    listener: Listener, guarded_engine: HttpEngine, host: str
) -> None:
    """Past the per-hop check: the session itself (aiohttp skips the resolver for IP
    literals) must refuse to open the socket."""
    session = guarded_engine.sessions.direct()
    with pytest.raises(aiohttp.ClientConnectorError) as info:
        async with session.get(f"http://{host}:{listener.port}/secret"):
            pass
    assert isinstance(info.value.os_error, BlockedAddressError)
    assert listener.connections == 0


@_SETTINGS
@given(st.one_of(loopback_hosts, other_blocked_hosts))
def test_the_socket_factory_refuses_every_blocked_address(spelling: tuple[str, str]) -> None:
    ip = _canonical(spelling[1])
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    address = (ip, 80, 0, 0) if family == socket.AF_INET6 else (ip, 80)
    with pytest.raises(BlockedAddressError):
        AddressGuard().socket_factory((family, socket.SOCK_STREAM, 6, "", address)).close()


def test_the_guard_lets_an_exempt_endpoint_and_public_addresses_through() -> None:
    guard = AddressGuard(exempt=frozenset({("127.0.0.1", 8080)}))
    assert guard.refusal("127.0.0.1", 8080) is None
    assert guard.refusal("127.0.0.1", 8081) is not None
    assert guard.refusal("::ffff:127.0.0.1", 8080) is not None  # exact endpoints only
    assert guard.refusal("93.184.216.34", 80) is None
    sock = guard.socket_factory((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 80)))
    sock.close()  # created, never connected


# --- end to end: a redirect and a crawled link to a Unicode spelling -------------------------

SECRET_SPELLINGS = [
    "\uff11\uff12\uff17.\uff10.\uff10.\uff11",
    "\u2460\u2461\u2466.\u24ea.\u24ea.\u2460",
    "127\u30020\u30020\u30021",
    "0x7f.1",
    "2130706433",
    "0177.0.0.1",
    "[::ffff:127.0.0.1]",
    "127.0.0.1.",
]


@dataclass
class TwoSites:
    """A public-looking site (exempted from the guard by exact endpoint) and a secret
    one on another loopback port that nothing may reach."""

    site: TestServer
    secret: TestServer
    secret_hits: list[str]


@pytest.fixture
async def two_sites() -> AsyncIterator[TwoSites]:
    hits: list[str] = []

    async def secret(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="<html><body>secret</body></html>", content_type="text/html")

    secret_app = web.Application()
    secret_app.router.add_get("/{tail:.*}", secret)
    secret_server = TestServer(secret_app, host="127.0.0.1")
    await secret_server.start_server()
    port = secret_server.port

    def target(i: int) -> str:
        return f"http://{SECRET_SPELLINGS[i]}:{port}/secret/{i}"

    async def hop(request: web.Request) -> web.Response:
        raise web.HTTPFound(target(int(request.match_info["i"])))

    async def links(request: web.Request) -> web.Response:
        body = "".join(f'<a href="{target(i)}">{i}</a>' for i in range(len(SECRET_SPELLINGS)))
        return web.Response(text=f"<html><body>{body}</body></html>", content_type="text/html")

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="<html><body>fine</body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/hop/{i}", hop)
    app.router.add_get("/links", links)
    app.router.add_get("/ok", ok)
    site_server = TestServer(app, host="127.0.0.1")
    await site_server.start_server()
    try:
        yield TwoSites(site_server, secret_server, hits)
    finally:
        await site_server.close()
        await secret_server.close()


async def _exempting(make_engine: EngineMaker, sites: TwoSites) -> HttpEngine:
    assert sites.site.port is not None
    guard = AddressGuard(exempt=frozenset({("127.0.0.1", sites.site.port)}))
    return await make_engine(GUARDED, guard=guard)


async def test_a_redirect_to_any_spelling_of_loopback_is_refused(
    two_sites: TwoSites, make_engine: EngineMaker
) -> None:
    engine = await _exempting(make_engine, two_sites)
    page = await engine.scrape(str(two_sites.site.make_url("/ok")), OPTS)
    assert page.document.status_code == 200  # the exempt origin is reachable
    for i in range(len(SECRET_SPELLINGS)):
        with pytest.raises(PageError) as info:
            await engine.scrape(str(two_sites.site.make_url(f"/hop/{i}")), OPTS)
        assert info.value.code == ErrorCode.BLOCKED_ADDRESS, (i, info.value)
    assert two_sites.secret_hits == []
    # the control: unguarded, the same redirects do reach the secret site
    open_engine = await make_engine(replace(GUARDED, allow_private_networks=True))
    await open_engine.scrape(str(two_sites.site.make_url("/hop/0")), OPTS)
    assert two_sites.secret_hits == ["/secret/0"]


async def test_a_crawled_link_to_any_spelling_of_loopback_is_refused(
    two_sites: TwoSites, make_engine: EngineMaker
) -> None:
    engine = await _exempting(make_engine, two_sites)
    page = await engine.scrape(str(two_sites.site.make_url("/links")), OPTS)
    assert len(page.links) == len(SECRET_SPELLINGS)
    for link in page.links:  # what the crawl's frontier would fetch next
        with pytest.raises(PageError) as info:
            await engine.scrape(link, OPTS)
        assert info.value.code == ErrorCode.BLOCKED_ADDRESS, (link, info.value)
    assert two_sites.secret_hits == []


# --- credentials in URLs --------------------------------------------------------------------


def test_the_validator_refuses_credentials_in_the_url() -> None:
    for url in ("http://user:s3cret@example.com/", "http://user@example.com/", "http://@e.com/"):
        assert urls.validate(url, 1000) == (
            "credentials in the URL are not accepted; send them as request headers"
        )


def test_normalize_drops_credentials() -> None:
    assert urls.normalize("http://user:s3cret@Example.com:80/a") == "http://example.com/a"
    assert urls.normalize("http://a@b@example.com/") == "http://example.com/"


@dataclass
class CredSite:
    server: TestServer
    authorizations: list[tuple[str, str | None]]

    def url(self, path: str, userinfo: str = "user:s3cret@") -> str:
        return f"http://{userinfo}127.0.0.1:{self.server.port}{path}"


@pytest.fixture
async def cred_site() -> AsyncIterator[CredSite]:
    seen: list[tuple[str, str | None]] = []
    holder: list[CredSite] = []

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        seen.append((request.path, request.headers.get("Authorization")))
        return await handler(request)

    async def robots(request: web.Request) -> web.Response:
        return web.Response(text="User-agent: *\nAllow: /\n")

    async def creds(request: web.Request) -> web.Response:
        raise web.HTTPFound(holder[0].url("/landing"))

    async def landing(request: web.Request) -> web.Response:
        site = holder[0]
        body = (
            f'<a href="{site.url("/linked")}">a</a>'
            f'<a href="//x:y@127.0.0.1:{site.server.port}/other">b</a>'
        )
        return web.Response(text=f"<html><body>{body}</body></html>", content_type="text/html")

    async def leaf(request: web.Request) -> web.Response:
        return web.Response(text="<html><body>leaf</body></html>", content_type="text/html")

    app = web.Application(middlewares=[record])
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/creds", creds)
    app.router.add_get("/landing", landing)
    app.router.add_get("/linked", leaf)
    app.router.add_get("/other", leaf)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    holder.append(CredSite(server, seen))
    try:
        yield holder[0]
    finally:
        await server.close()


async def test_the_engine_never_sends_or_keeps_url_credentials(
    cred_site: CredSite, make_engine: EngineMaker
) -> None:
    engine = await make_engine(replace(GUARDED, allow_private_networks=True, respect_robots=True))
    page = await engine.scrape(cred_site.url("/creds"), OPTS)
    assert [p for p, _ in cred_site.authorizations] == ["/robots.txt", "/creds", "/landing"]
    assert [a for _, a in cred_site.authorizations] == [None, None, None]
    doc = page.document
    assert doc.url == cred_site.url("/creds", "") and doc.final_url == cred_site.url("/landing", "")
    assert page.links == [cred_site.url("/linked", ""), cred_site.url("/other", "")]


async def test_a_crawl_stores_no_credentials_and_sends_none(
    tmp_path: Path, cred_site: CredSite
) -> None:
    async with in_process_node(tmp_path) as node:
        with pytest.raises(Exception, match="credentials"):
            await node.stub.StartCrawl(jobs_pb2.StartCrawlRequest(url=cred_site.url("/landing")))
        root = cred_site.url("/landing", "")
        started = await node.stub.StartCrawl(
            jobs_pb2.StartCrawlRequest(url=root, limit=10, crawl_entire_domain=True)
        )
        final = await wait_terminal(node.stub, started.id)
        assert final.state == jobs_pb2.JOB_STATE_COMPLETED
        docs = await all_documents(node.stub, started.id)
        items = list(node.node.store().replicated_items())
    assert sorted(d.url for d in docs) == sorted(
        cred_site.url(p, "") for p in ("/landing", "/linked", "/other")
    )
    for d in docs:
        assert "@" not in d.url and "@" not in d.final_url
    # Frontier, seen set, keys, errors: no credential anywhere. (A document's markdown
    # keeps the links the page itself published, credentials included: content.)
    leaks = [k for k, v in items if b"s3cret" in k or (b"s3cret" in v and b"/pages" not in k)]
    assert not leaks, leaks[:3]
    assert all(a is None for _, a in cred_site.authorizations)
