"""Request control per job: headers, cookies, user agent, timeout, TLS, proxies, robots.

Validation is tested on ``validate.request_control`` (every bad field named); the
pool, the jar and the engine against real loopback sites, a real (minimal) HTTP
forward proxy and a real self-signed HTTPS site; the durable side with a real
``pagesift serve`` killed with SIGKILL mid-crawl behind a login cookie.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
import pytest
from aiohttp import web
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2

from pagesift.client.errors import details_of, status_of
from pagesift.core.api import rpcerrors
from pagesift.core.config.schema import ServerConfig
from pagesift.core.jobs import validate
from pagesift.core.jobs.accounts import Account, Accounts, AccountsError
from pagesift.core.jobs.pageerrors import ErrorCode, PageError
from pagesift.primary.engine.cookiejar import JobCookies
from pagesift.primary.engine.http import HttpEngine
from pagesift.primary.engine.interface import FetchPolicy
from pagesift.primary.engine.netguard import AddressGuard
from pagesift.primary.engine.reqprofile import ProxyPool, RequestProfile
from pagesift.v1 import jobs_pb2, jobs_pb2_grpc
from tests.helpers import (
    Acct,
    EngineMaker,
    MapResolver,
    ServeProc,
    eventually,
    in_process_node,
    make_ca,
    make_leaf,
    serve_handler,
    wait_terminal,
    write_accounts,
)

CONFIG = ServerConfig(allow_private_networks=True, read_timeout=2.0, connect_timeout=1.0)
PLAIN = Account("plain")
TRUSTED = Account("trusted", allow_ignore_robots=True, allow_proxy_url=True)


def opts(**kw: object) -> jobs_pb2.ScrapeOptions:
    return jobs_pb2.ScrapeOptions(**kw)  # type: ignore[arg-type]


async def refused(
    options: jobs_pb2.ScrapeOptions, account: Account = PLAIN, config: ServerConfig = CONFIG
) -> str:
    with pytest.raises((validate.InvalidArgument, validate.PermissionDenied)) as info:
        await validate.request_control(options, account, config)
    return str(info.value)


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(validate.DENIED_HEADERS))
async def test_each_hop_by_hop_framing_or_owned_header_is_refused_naming_it(name: str) -> None:
    message = await refused(opts(headers={name.title(): "x"}))
    assert message.startswith(f"options.headers[{name.title()!r}]")


async def test_header_names_values_and_totals_are_checked() -> None:
    assert "control character" in await refused(opts(headers={"X-A": "a\r\nHost: evil"}))
    assert "not a valid header name" in await refused(opts(headers={"X A": "a"}))
    many = {f"X-{i}": "v" for i in range(validate.MAX_HEADERS + 1)}
    assert await refused(opts(headers=many)) == "options.headers: 51 headers, at most 50"
    big = {f"X-{i}": "v" * 4000 for i in range(5)}
    assert "bytes, at most" in await refused(opts(headers=big))
    await validate.request_control(opts(headers={"Authorization": "Bearer t"}), PLAIN, CONFIG)


async def test_cookie_names_and_values_are_rfc_6265() -> None:
    assert "valid cookie name" in await refused(opts(cookies={"a b": "1"}))
    assert "valid cookie value" in await refused(opts(cookies={"a": "x;y"}))
    many = {f"c{i}": "1" for i in range(validate.MAX_COOKIES + 1)}
    assert "cookies, at most" in await refused(opts(cookies=many))


async def test_user_agent_and_timeout_are_bounded() -> None:
    assert (await refused(opts(user_agent="bot\n"))).startswith("options.user_agent")
    assert (await refused(opts(user_agent="x" * 513))).startswith("options.user_agent")
    too_long = Duration(seconds=int(CONFIG.max_request_timeout) + 1)
    assert (await refused(opts(timeout=too_long))).startswith("options.timeout")
    assert (await refused(opts(timeout=Duration()))).startswith("options.timeout")
    await validate.request_control(opts(timeout=Duration(nanos=500_000_000)), PLAIN, CONFIG)


async def test_a_proxy_must_be_one_of_the_pool_and_pool_needs_one() -> None:
    assert "the server has no proxy pool" in await refused(opts(proxy="pool"))
    pooled = replace(CONFIG, proxies={"eu": "http://203.0.113.9:3128"})
    message = await refused(opts(proxy="us"), config=pooled)
    assert message == "options.proxy: no proxy 'us' (the server has: eu)"
    await validate.request_control(opts(proxy="eu"), PLAIN, pooled)
    await validate.request_control(opts(proxy="pool"), PLAIN, pooled)


async def test_proxy_url_and_ignoring_robots_are_account_permissions() -> None:
    with pytest.raises(validate.PermissionDenied, match=r"^options\.proxy_url: "):
        await validate.request_control(opts(proxy_url="http://203.0.113.9:8080"), PLAIN, CONFIG)
    with pytest.raises(validate.PermissionDenied, match=r"^options\.ignore_robots_txt: "):
        await validate.request_control(opts(ignore_robots_txt=True), PLAIN, CONFIG)
    good = opts(proxy_url="http://user:pw@203.0.113.9:8080", ignore_robots_txt=True)
    await validate.request_control(good, TRUSTED, CONFIG)
    guarded = replace(CONFIG, allow_private_networks=False)
    message = await refused(opts(proxy_url="http://127.0.0.1:3128"), TRUSTED, guarded)
    assert message.startswith("options.proxy_url: http://127.0.0.1:3128 is refused")
    message = await refused(opts(proxy_url="socks5://203.0.113.9:1080"), TRUSTED)
    assert message == "options.proxy_url: scheme must be http or https"


def test_permissions_are_read_from_the_accounts_file_and_default_off() -> None:
    doc = {"account": [{"name": "a", "key": "k" * 20, "allow_proxy_url": True}]}
    accounts = Accounts.from_dict(doc)
    a = accounts.get("a")
    assert a is not None and a.allow_proxy_url and not a.allow_ignore_robots
    with pytest.raises(AccountsError, match="allow_ignore_robots: must be true or false"):
        Accounts.from_dict({"account": [{"name": "a", "key": "k" * 20, "allow_ignore_robots": 1}]})


# --- the proxy pool ---------------------------------------------------------------------------


def test_the_pool_is_checked_at_start_naming_the_key() -> None:
    bad = [
        ({"pool": "http://203.0.113.1:1"}, "proxies.pool"),
        ({"p": "ftp://203.0.113.1:1"}, "proxies.p: scheme must be http or https"),
        ({"p": 3}, "proxies.p: must be a URL string"),
    ]
    for proxies, message in bad:
        with pytest.raises(ValueError, match=message):
            ProxyPool.from_config(replace(CONFIG, proxies=proxies))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="proxy_rotation"):
        ProxyPool.from_config(replace(CONFIG, proxy_rotation="random"))
    with pytest.raises(ValueError, match="default_proxy"):
        ProxyPool.from_config(replace(CONFIG, default_proxy="nope"))


def test_pool_choice_is_sticky_per_host_or_rotates_per_request() -> None:
    proxies = {f"p{i}": f"http://203.0.113.{i}:3128" for i in range(4)}
    sticky = ProxyPool.from_config(replace(CONFIG, proxies=proxies))
    hosts = [f"h{i}.example" for i in range(40)]
    first = [sticky.choose("pool", h, turn) for turn, h in enumerate(hosts)]
    again = [sticky.choose("pool", h, turn + 7) for turn, h in enumerate(hosts)]
    assert first == again  # the turn does not matter: a host keeps its proxy
    assert len(set(first)) == 4  # and the hosts spread over the pool
    rotating = ProxyPool.from_config(replace(CONFIG, proxies=proxies, proxy_rotation="per_request"))
    assert [rotating.choose("pool", "h", t) for t in range(8)] == list(proxies.values()) * 2
    assert sticky.choose("p2", "h", 0) == proxies["p2"]
    assert sticky.choose("", "h", 0) is None  # no default: direct
    defaulted = ProxyPool.from_config(replace(CONFIG, proxies=proxies, default_proxy="p1"))
    assert defaulted.choose("", "h", 0) == proxies["p1"]


# --- the cookie jar ---------------------------------------------------------------------------


async def test_request_cookies_are_host_only_for_the_hosts_the_request_names() -> None:
    jar = JobCookies()
    jar.seed({"sid": "1"}, ["https://a.example/x", "http://b.example:8080/"])
    assert jar.header("https://a.example/other") == "sid=1"
    assert jar.header("http://b.example/") == "sid=1"  # cookies ignore ports (RFC 6265)
    assert jar.header("https://sub.a.example/") is None
    assert jar.header("https://c.example/") is None


def pairs(header: str | None) -> set[str]:
    """A Cookie header's name=value pairs (the jar's order is its own)."""
    return set() if header is None else set(header.split("; "))


async def test_set_cookie_is_scoped_like_a_browser_and_its_records_rebuild_the_jar() -> None:
    jar = JobCookies()
    jar.absorb("https://www.shop.example/login", [
        "session=abc; Path=/; HttpOnly",
        "wide=1; Domain=shop.example; Path=/",
        "cart=2; Path=/cart",
        "safe=3; Secure; Path=/",
        "evil=4; Domain=other.example",  # another site: rejected
    ])  # fmt: skip
    assert jar.dirty
    cart = "https://www.shop.example/cart/x"
    assert pairs(jar.header(cart)) == {"session=abc", "wide=1", "cart=2", "safe=3"}
    assert pairs(jar.header("http://www.shop.example/")) == {"session=abc", "wide=1"}  # Secure
    assert pairs(jar.header("https://img.shop.example/")) == {"wide=1"}
    assert jar.header("https://other.example/") is None
    jar.absorb("https://www.shop.example/logout", ["session=; Max-Age=0; Path=/"])
    assert pairs(jar.header(cart)) == {"wide=1", "cart=2", "safe=3"}

    changes = jar.changes()
    assert changes is not None and not changes.deletes  # the session never reached the store
    jar.committed(changes)
    assert jar.changes() is None
    rebuilt = JobCookies()
    rebuilt.load([*changes.puts, (7, b"not json")], changes.slots or 0)  # damaged: skipped
    assert rebuilt.changes() is None  # what it loaded is what the store holds
    for url in (cart, "http://www.shop.example/", "https://img.shop.example/"):
        assert pairs(rebuilt.header(url)) == pairs(jar.header(url))


# --- the engine against real sites ------------------------------------------------------------


@dataclass
class Echo:
    """A site that records every request's headers and answers by path."""

    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    other: int = 0  # the port of a second origin (cross-origin redirects)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path, dict(request.headers)))
        path = request.path
        if path == "/robots.txt":
            return web.Response(text="User-agent: picky\nDisallow: /\n\nUser-agent: *\nAllow: /\n")
        if path == "/hop":
            raise web.HTTPFound("/page")
        if path == "/away":
            raise web.HTTPFound(f"http://127.0.0.1:{self.other}/page")
        if path == "/login":
            response = web.HTTPFound("/secret")
            response.set_cookie("session", "s3cret", path="/")
            raise response
        if path.startswith("/secret") and request.cookies.get("session") != "s3cret":
            raise web.HTTPForbidden()
        if path == "/slow":
            await asyncio.sleep(1.0)
        return web.Response(
            text="<html><title>ok</title><p>hi</p></html>", content_type="text/html"
        )

    def requests(self, path: str) -> list[dict[str, str]]:
        return [h for p, h in self.seen if p == path]


@contextlib.asynccontextmanager
async def echo_sites() -> AsyncIterator[tuple[Echo, int, Echo, int]]:
    a, b = Echo(), Echo()
    async with serve_handler(a.handle) as port_a, serve_handler(b.handle) as port_b:
        a.other = port_b
        yield a, port_a, b, port_b


async def scrape(
    engine: HttpEngine, url: str, options: jobs_pb2.ScrapeOptions
) -> jobs_pb2.Document:
    profile = RequestProfile.build(options, [url], may_ignore_robots=True, may_use_proxy_url=True)
    return (await engine.scrape(url, options, FetchPolicy(request=profile))).document


async def failure(engine: HttpEngine, url: str, options: jobs_pb2.ScrapeOptions) -> PageError:
    with pytest.raises(PageError) as info:
        await scrape(engine, url, options)
    return info.value


async def test_job_headers_agent_and_cookies_go_with_every_hop(make_engine: EngineMaker) -> None:
    engine = await make_engine(CONFIG)
    options = opts(
        headers={"X-Team": "data", "Authorization": "Bearer t"},
        cookies={"pref": "dark"},
        user_agent="acme-bot/2.0",
    )
    async with echo_sites() as (site, port, _, _):
        await scrape(engine, f"http://127.0.0.1:{port}/hop", options)
    hops = site.requests("/hop") + site.requests("/page")
    assert len(hops) == 2
    for headers in hops:
        assert headers["X-Team"] == "data"
        assert headers["Authorization"] == "Bearer t"
        assert headers["User-Agent"] == "acme-bot/2.0"
        assert headers["Cookie"] == "pref=dark"
    robots = site.requests("/robots.txt")
    assert robots and robots[0]["User-Agent"] == CONFIG.user_agent  # one cache, server agent
    assert "X-Team" not in robots[0] and "Cookie" not in robots[0]


async def test_authorization_and_host_only_cookies_stay_on_their_origin(
    make_engine: EngineMaker,
) -> None:
    engine = await make_engine(CONFIG)
    options = opts(headers={"Authorization": "Bearer t", "X-Team": "data"}, cookies={"c": "1"})
    async with echo_sites() as (site, port, other, _):
        doc = await scrape(engine, f"http://127.0.0.1:{port}/away", options)
    assert doc.final_url.endswith("/page")
    assert site.requests("/away")[0]["Authorization"] == "Bearer t"
    landed = other.requests("/page")[0]
    assert "Authorization" not in landed
    assert landed["X-Team"] == "data"
    # both origins are 127.0.0.1: cookies are per host, not per port (as in browsers)
    assert landed["Cookie"] == "c=1"


async def test_a_cookie_set_by_a_login_redirect_opens_the_rest_of_the_site(
    make_engine: EngineMaker,
) -> None:
    engine = await make_engine(CONFIG)
    async with echo_sites() as (site, port, _, _):
        assert (await failure(engine, f"http://127.0.0.1:{port}/secret/1", opts())).status == 403
        options = opts()
        profile = RequestProfile.build(
            options, [], may_ignore_robots=False, may_use_proxy_url=False
        )
        policy = FetchPolicy(request=profile)
        login = await engine.scrape(f"http://127.0.0.1:{port}/login", options, policy)
        other = await engine.scrape(f"http://127.0.0.1:{port}/secret/2", options, policy)
    assert login.document.final_url.endswith("/secret")
    assert other.document.title == "ok"
    assert site.requests("/secret/2")[0]["Cookie"] == "session=s3cret"
    assert profile.cookies.dirty  # the job runtime persists it with the next page


async def test_robots_groups_follow_the_jobs_user_agent_and_may_be_ignored_when_allowed(
    make_engine: EngineMaker,
) -> None:
    engine = await make_engine(CONFIG)
    async with echo_sites() as (_, port, _, _):
        url = f"http://127.0.0.1:{port}/page"
        assert (await scrape(engine, url, opts())).title == "ok"
        err = await failure(engine, url, opts(user_agent="Picky/1.0 (+https://x.example)"))
        assert err.code == ErrorCode.ROBOTS_DISALLOWED
        ignored = opts(user_agent="picky/1.0", ignore_robots_txt=True)
        assert (await scrape(engine, url, ignored)).title == "ok"
        no_permission = RequestProfile.build(
            ignored, [url], may_ignore_robots=False, may_use_proxy_url=False
        )
        with pytest.raises(PageError, match="robots"):
            await engine.scrape(url, ignored, FetchPolicy(request=no_permission))


async def test_a_job_timeout_fails_a_page_the_server_timeouts_would_wait_for(
    make_engine: EngineMaker,
) -> None:
    engine = await make_engine(CONFIG)
    async with echo_sites() as (_, port, _, _):
        url = f"http://127.0.0.1:{port}/slow"
        err = await failure(engine, url, opts(timeout=Duration(nanos=200_000_000)))
        assert err.code == ErrorCode.TIMEOUT and "0.2" in err.message
        assert (await scrape(engine, url, opts())).title == "ok"


async def test_skip_tls_verification_accepts_a_self_signed_site_that_fails_as_tls_without(
    tmp_path: Path, make_engine: EngineMaker
) -> None:
    make_ca(tmp_path, "ca")
    make_leaf(tmp_path, "site", "127.0.0.1", "subjectAltName=IP:127.0.0.1\n")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "site.pem", tmp_path / "site.key")
    app = web.Application()
    app.router.add_get("/{tail:.*}", Echo().handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tls_site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await tls_site.start()
    port = int(runner.addresses[0][1])
    engine = await make_engine(replace(CONFIG, respect_robots=False))
    try:
        url = f"https://127.0.0.1:{port}/page"
        err = await failure(engine, url, opts())
        assert err.code == ErrorCode.TLS and "skip_tls_verification" in err.message
        assert (await scrape(engine, url, opts(skip_tls_verification=True))).title == "ok"
    finally:
        await runner.cleanup()


# --- proxies ------------------------------------------------------------------------------------


@dataclass
class Proxy:
    """A minimal HTTP/1.1 forward proxy on loopback: absolute-form GETs only, every
    request sent to ``backend`` (whatever host it names), one request per connection."""

    backend: int
    port: int = 0
    seen: list[tuple[str, str]] = field(default_factory=list)  # (target, Proxy-Authorization)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            line, *fields = head.decode("latin-1").split("\r\n")
            method, target, _ = line.split(" ", 2)
            headers = dict(f.split(": ", 1) for f in fields if ": " in f)
            self.seen.append((target, headers.get("Proxy-Authorization", "")))
            path = "/" + target.split("://", 1)[1].split("/", 1)[1]
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backend)
            kept = {k: v for k, v in headers.items() if not k.lower().startswith("proxy-")}
            kept["Connection"] = "close"
            request = f"{method} {path} HTTP/1.1\r\n" + "".join(
                f"{k}: {v}\r\n" for k, v in kept.items()
            )
            up_writer.write(request.encode("latin-1") + b"\r\n")
            await up_writer.drain()
            writer.write(await asyncio.wait_for(up_reader.read(), 5))
            await writer.drain()
            up_writer.close()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def proxies(backend: int, n: int) -> AsyncIterator[list[Proxy]]:
    made = [Proxy(backend) for _ in range(n)]
    servers = []
    for proxy in made:
        server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        proxy.port = server.sockets[0].getsockname()[1]
        servers.append(server)
    try:
        yield made
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()


async def test_pool_proxies_by_name_sticky_per_host_and_rotating_per_request(
    make_engine: EngineMaker,
) -> None:
    async with echo_sites() as (site, port, _, _), proxies(port, 2) as (p0, p1):
        pool = {"p0": f"http://127.0.0.1:{p0.port}", "p1": f"http://127.0.0.1:{p1.port}"}
        sticky = await make_engine(replace(CONFIG, respect_robots=False, proxies=pool))
        rotating = await make_engine(
            replace(CONFIG, respect_robots=False, proxies=pool, proxy_rotation="per_request")
        )
        await scrape(sticky, f"http://127.0.0.1:{port}/named", opts(proxy="p1"))
        assert [t for t, _ in p1.seen] == [f"http://127.0.0.1:{port}/named"]
        assert p0.seen == []
        for i in range(4):
            await scrape(sticky, f"http://127.0.0.1:{port}/s{i}", opts(proxy="pool"))
        one_host = [len(p0.seen), len(p1.seen) - 1]
        assert sorted(one_host) == [0, 4]  # all four through one proxy
        before = len(p0.seen) + len(p1.seen)
        for i in range(4):
            await scrape(rotating, f"http://127.0.0.1:{port}/r{i}", opts(proxy="pool"))
        assert len(p0.seen) + len(p1.seen) == before + 4
        assert all(len(p.seen) >= 2 for p in (p0, p1))  # turns alternate
        await scrape(sticky, f"http://127.0.0.1:{port}/direct", opts())
    assert site.requests("/direct") and all("/direct" not in t for p in (p0, p1) for t, _ in p.seen)


async def test_an_accounts_own_proxy_url_gets_its_credentials_as_proxy_authorization(
    make_engine: EngineMaker,
) -> None:
    engine = await make_engine(replace(CONFIG, respect_robots=False))
    async with echo_sites() as (site, port, _, _), proxies(port, 1) as (proxy,):
        options = opts(proxy_url=f"http://user:pw@127.0.0.1:{proxy.port}")
        assert (await scrape(engine, f"http://127.0.0.1:{port}/mine", options)).title == "ok"
    assert proxy.seen == [(f"http://127.0.0.1:{port}/mine", "Basic dXNlcjpwdw==")]
    assert "Proxy-Authorization" not in site.requests("/mine")[0]
    with pytest.raises(PermissionError):
        RequestProfile.build(options, [], may_ignore_robots=False, may_use_proxy_url=False)


async def test_the_guard_judges_proxied_targets_and_no_page_reaches_a_pool_proxy_directly(
    make_engine: EngineMaker,
) -> None:
    names = MapResolver({"public.example": "93.184.216.34", "inside.example": "10.1.2.3"})
    async with echo_sites() as (_, port, _, _), proxies(port, 1) as (proxy,):
        config = replace(
            CONFIG,
            allow_private_networks=False,
            respect_robots=False,
            proxies={"corp": f"http://127.0.0.1:{proxy.port}"},
            default_proxy="corp",
        )
        engine = await make_engine(config, guard=AddressGuard(), resolver=names)
        doc = await scrape(engine, "http://public.example/page", opts())
        assert doc.title == "ok"  # the pool proxy on loopback is allowed, as a proxy
        inside = await failure(engine, "http://inside.example/page", opts())
        assert inside.code == ErrorCode.BLOCKED_ADDRESS and "10.1.2.3" in inside.message
        direct = await failure(engine, f"http://127.0.0.1:{proxy.port}/", opts())
        assert direct.code == ErrorCode.BLOCKED_ADDRESS
        own = opts(proxy_url=f"http://127.0.0.1:{proxy.port}")
        assert (await failure(engine, "http://public.example/x", own)).code == (
            ErrorCode.BLOCKED_ADDRESS
        )  # an account's own proxy gets no exemption
    assert [t for t, _ in proxy.seen] == ["http://public.example/page"]


# --- through the API, and across a SIGKILL ----------------------------------------------------


async def test_the_api_names_the_refused_field_and_the_missing_permission(tmp_path: Path) -> None:
    plain = Acct("plain")
    accounts = write_accounts(tmp_path / "accounts.toml", [plain], admin_key=None)
    async with in_process_node(tmp_path / "n", accounts_file=str(accounts)) as node:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: node.stub.Scrape(
                jobs_pb2.ScrapeRequest(
                    url="http://127.0.0.1:1/", options=opts(headers={"Host": "x"})
                ),
                metadata=plain.md,
            ),
            lambda: node.stub.StartCrawl(
                jobs_pb2.StartCrawlRequest(url="http://127.0.0.1:1/", options=opts(proxy="nope")),
                metadata=plain.md,
            ),
            lambda: node.stub.StartBatchScrape(
                jobs_pb2.StartBatchScrapeRequest(
                    urls=["http://127.0.0.1:1/"], options=opts(ignore_robots_txt=True)
                ),
                metadata=plain.md,
            ),
        ]
        expected = [
            (grpc.StatusCode.INVALID_ARGUMENT, "options.headers['Host']"),
            (grpc.StatusCode.INVALID_ARGUMENT, "options.proxy: no proxy 'nope'"),
            (grpc.StatusCode.PERMISSION_DENIED, "options.ignore_robots_txt: account 'plain'"),
        ]
        for call, (code, start) in zip(calls, expected, strict=True):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call()
            assert info.value.code() == code
            assert (info.value.details() or "").startswith(start)
            # the details name the field too: a BadRequest for INVALID_ARGUMENT, the
            # ErrorInfo (PERMISSION_DENIED_FIELD, field and account) for a permission
            named = start.split(":", 1)[0]
            status = status_of(info.value)
            (error,) = details_of(status, error_details_pb2.ErrorInfo)
            assert error.metadata["field"] == named
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                assert error.reason == rpcerrors.Reason.INVALID_FIELD
                (bad,) = details_of(status, error_details_pb2.BadRequest)
                assert [v.field for v in bad.field_violations] == [named]
            else:
                assert error.reason == rpcerrors.Reason.PERMISSION_DENIED_FIELD
                assert error.metadata["account"] == "plain"
        listed = await node.stub.ListJobs(jobs_pb2.ListJobsRequest(), metadata=plain.md)
        assert not listed.jobs  # nothing was stored


@dataclass
class Members:
    """A site behind a login: /login sets the session cookie; every other page needs
    it and the job's header, and links on (a chain, so a kill lands mid-crawl)."""

    pages: int = 40
    requests: list[tuple[str, str, str, str]] = field(default_factory=list)  # path, UA, X, cookie
    served: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/robots.txt":
            raise web.HTTPNotFound()
        self.requests.append((
            path, request.headers.get("User-Agent", ""), request.headers.get("X-Team", ""),
            request.cookies.get("session", ""),
        ))  # fmt: skip
        if path == "/":
            response = web.Response(text='<a href="/m/0">in</a>', content_type="text/html")
            response.set_cookie("session", "member", path="/")
            return response
        if request.cookies.get("session") != "member" or request.headers.get("X-Team") != "data":
            raise web.HTTPForbidden()
        await asyncio.sleep(0.05)
        n = int(path.rsplit("/", 1)[1])
        more = f'<a href="/m/{n + 1}">next</a>' if n + 1 < self.pages else ""
        self.served += 1
        return web.Response(text=f"<title>m{n}</title>{more}", content_type="text/html")


@pytest.mark.system
async def test_a_crawl_behind_a_login_cookie_resumes_after_sigkill_with_its_jar_and_headers(
    tmp_path: Path,
) -> None:
    site = Members()
    async with serve_handler(site.handle) as port:
        server = ServeProc(tmp_path, "server", config={"extract_processes": 0})
        try:
            await server.start()
            root = f"http://127.0.0.1:{port}/"
            request = jobs_pb2.StartCrawlRequest(
                url=root,
                options=opts(headers={"X-Team": "data"}, user_agent="members-bot/1.0"),
                max_concurrency=1,
            )
            async with grpc.aio.insecure_channel(server.address) as ch:
                job = await jobs_pb2_grpc.JobServiceStub(ch).StartCrawl(request)

            async def mid_crawl() -> bool | None:
                return True if site.served >= 10 else None

            await eventually(mid_crawl, "ten member pages", timeout=30)
            server.kill()
            killed_at = len(site.requests)
            await server.start()
            async with grpc.aio.insecure_channel(server.address) as ch:
                stub = jobs_pb2_grpc.JobServiceStub(ch)
                final = await wait_terminal(stub, job.id, timeout=60)
                got = await stub.GetJob(jobs_pb2.GetJobRequest(id=job.id, limit=1000))
                errors = await stub.GetJobErrors(jobs_pb2.GetJobErrorsRequest(id=job.id))
        finally:
            server.stop()
    assert final.state == jobs_pb2.JOB_STATE_COMPLETED, final.note
    assert not errors.errors, [(e.url, e.message) for e in errors.errors]
    urls = [d.url for d in got.documents]
    assert len(urls) == len(set(urls)) == site.pages + 1
    after = site.requests[killed_at:]
    assert after and all(r[0] != "/" for r in after)  # the login page is not fetched again
    assert all(r[1:] == ("members-bot/1.0", "data", "member") for r in after)
