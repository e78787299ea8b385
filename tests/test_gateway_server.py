"""The gateway as a server: TLS on its port and to the pair, /metrics, a proxy's
Forwarded headers, /healthz, /v2/openapi.json, and ``pagesift serve --http-listen``.

Real parts throughout: certificates made by the openssl CLI (``tests.helpers.make_ca``),
a real node in-process (``grpcserver.run``, TLS on its gRPC port where the test says)
or as a ``pagesift serve`` child, the gateway on a free loopback port, aiohttp and the
firecrawl-py SDK as its clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pydantic
import pytest
from firecrawl import Firecrawl
from prometheus_client.parser import text_string_to_metric_families

from pagesift.cli import main
from pagesift.cli.common import EXIT_FAILED, EXIT_USAGE
from pagesift.core.util.children import free_port
from pagesift.demo.site import Site
from pagesift.gateway import openapi
from pagesift.gateway.app import make_app
from pagesift.gateway.clients import Clients
from pagesift.gateway.forwarded import origin
from pagesift.gateway.models import ScrapeRequest
from pagesift.gateway.server import Options, run
from pagesift.node import grpcserver
from pagesift.node.node import Node
from tests.helpers import NodeFactory, SiteSpec, in_process_node, make_ca, make_leaf, node_config

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture
def site_spec() -> SiteSpec:
    return SiteSpec(pages=8, slow_seconds=1.5, big_bytes=64 * 1024)


@contextlib.asynccontextmanager
async def gateway(
    addresses: list[str], options: Options | None = None, **app_kw: Any
) -> AsyncIterator[str]:
    """A gateway in front of ``addresses``; yields its bound ``host:port``."""
    stop = asyncio.Event()
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        run("127.0.0.1:0", addresses, stop, started, options=options, **app_kw)
    )
    try:
        yield await asyncio.wait_for(started, 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


@contextlib.asynccontextmanager
async def tls_node(data: Path, **overrides: Any) -> AsyncIterator[Node]:
    """A node whose gRPC port speaks TLS only (``in_process_node`` waits on plaintext)."""
    config = node_config(data, **overrides)
    stop = asyncio.Event()
    started: asyncio.Future[Node] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(grpcserver.run(config, stop, started))
    try:
        yield await asyncio.wait_for(asyncio.shield(started), 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI")
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_leaf(
        d, "server", "localhost",
        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )  # fmt: skip
    return d


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


async def get(url: str, ctx: ssl.SSLContext | None = None, **kw: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(url, ssl=ctx or False, **kw) as r:
        ctype = r.headers.get("Content-Type", "")
        return r.status, await (r.json() if "json" in ctype else r.text())


async def post(url: str, body: Any, ctx: ssl.SSLContext | None = None, **kw: Any) -> Any:
    async with aiohttp.ClientSession() as s, s.post(url, json=body, ssl=ctx or False, **kw) as r:
        return r.status, await r.json()


# ---------------------------------------------------------------- TLS


@needs_openssl
async def test_tls_gateway_port_and_tls_to_the_pair_with_the_client_flags(
    tmp_path: Path, pki: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    cert, key, ca = pki / "server.pem", pki / "server.key", pki / "ca.pem"
    tls = {"tls_cert": str(cert), "tls_key": str(key)}
    async with tls_node(tmp_path / "n", **tls) as node:
        address = node.config.listen
        opts = Options(tls_cert=str(cert), tls_key=str(key), tls_ca=str(ca))
        async with gateway([address], opts) as bound:
            base = f"https://{bound}"
            status, body = await get(f"{base}/healthz", trusting(ca))
            assert (status, body["primary"]) == (200, address)  # the probe spoke TLS
            status, body = await post(
                f"{base}/v2/scrape", {"url": root + "about.html"}, trusting(ca)
            )
            assert status == 200 and "About" in body["data"]["markdown"]
            status, body = await post(f"{base}/v2/crawl", {"url": root, "limit": 2}, trusting(ca))
            assert status == 200 and body["url"].startswith(f"https://{bound}/v2/crawl/")
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await get(f"{base}/healthz", ssl.create_default_context())  # not our CA
            with pytest.raises(aiohttp.ClientError):
                await get(f"http://{bound}/healthz")  # plaintext on the TLS port
        # without --tls-ca the gateway cannot reach a TLS-only pair: 503, no plaintext
        async with gateway([address], Options(tls_cert=str(cert), tls_key=str(key))) as bound:
            status, body = await get(f"https://{bound}/healthz", trusting(ca))
            assert (status, body["ok"]) == (503, False)


@needs_openssl
async def test_serve_http_listen_gateway_speaks_the_nodes_tls_and_reaches_a_tls_node(
    tmp_path: Path, pki: Path
) -> None:
    cert, key, ca = pki / "server.pem", pki / "server.key", pki / "ca.pem"
    http = f"127.0.0.1:{free_port()}"
    async with tls_node(tmp_path / "n", tls_cert=str(cert), tls_key=str(key), http_listen=http):
        status, body = await get(f"https://{http}/healthz", trusting(ca))
        assert status == 200 and body["ok"] is True
    with pytest.raises(aiohttp.ClientError):  # stopped with the node
        await get(f"https://{http}/healthz", trusting(ca), timeout=aiohttp.ClientTimeout(5))


def test_tls_flags_that_do_not_pair_are_refused_before_a_port_is_bound() -> None:
    with pytest.raises(ValueError, match="certificate and its key"):
        Options(tls_cert="cert.pem").ssl_context()
    with pytest.raises(ValueError, match="needs its key"):
        Options(client_cert="c.pem").channel_credentials()
    with pytest.raises(FileNotFoundError):
        Options(tls_cert="/nonexistent/c.pem", tls_key="/nonexistent/k.pem").ssl_context()


# ---------------------------------------------------------------- /metrics


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


async def test_metrics_count_requests_by_route_template_and_status_and_grpc_errors_by_code(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with in_process_node(tmp_path) as node, gateway([node.address]) as bound:
        base = f"http://{bound}"
        for _ in range(2):
            status, _ = await get(f"{base}/v2/crawl/0123456789abcdef0123456789abcdef")
            assert status == 404
        assert (await post(f"{base}/v2/scrape", {}))[0] == 400
        # a scrape of a page slower than the node's read timeout is in flight meanwhile
        slow = asyncio.create_task(post(f"{base}/v2/scrape", {"url": root + "slow.html"}))
        flight: list[float] = []
        for _ in range(100):
            _, text = await get(f"{base}/metrics")
            flight = [v for _, v in samples(text, "pagesift_gateway_requests_in_flight")]
            if flight == [2.0]:  # the scrape and this /metrics request
                break
            await asyncio.sleep(0.02)
        assert flight == [2.0]
        await asyncio.wait_for(slow, 30)
        _, text = await get(f"{base}/metrics")
    counts = {
        (lb["route"], lb["method"], lb["status"]): v
        for lb, v in samples(text, "pagesift_gateway_request_seconds_count")
    }
    assert counts[("/v2/crawl/{id}", "GET", "404")] == 2
    assert counts[("/v2/scrape", "POST", "400")] == 1
    assert not any("0123456789abcdef" in r for r, _, _ in counts)  # templates, not paths
    errors = {lb["code"]: v for lb, v in samples(text, "pagesift_gateway_grpc_errors_total")}
    assert errors.get("NOT_FOUND", 0) + errors.get("INVALID_ARGUMENT", 0) >= 2
    assert [v for _, v in samples(text, "pagesift_gateway_requests_in_flight")] == [1.0]


async def test_a_request_no_route_matches_is_counted_as_unmatched(tmp_path: Path) -> None:
    async with gateway(["127.0.0.1:1"]) as bound:
        assert (await get(f"http://{bound}/v2/nothing/here"))[0] == 404
        _, text = await get(f"http://{bound}/metrics")
    routes = {lb["route"] for lb, _ in samples(text, "pagesift_gateway_request_seconds_count")}
    assert "unmatched" in routes and not any("nothing" in r for r in routes)


# ---------------------------------------------------------------- Forwarded

FORWARDED_CASES = [
    # (headers, trust, expected origin)
    ({"X-Forwarded-Proto": "https", "X-Forwarded-Host": "api.example.com"}, False,
     "http://gw:3002"),
    ({"X-Forwarded-Proto": "https", "X-Forwarded-Host": "api.example.com"}, True,
     "https://api.example.com"),
    ({"Forwarded": 'for=1.2.3.4;proto=https;host="fw.example:8443"'}, True,
     "https://fw.example:8443"),
    ({"Forwarded": "proto=https;host=fw.example", "X-Forwarded-Host": "x.example"}, True,
     "https://fw.example"),  # Forwarded first
    ({"Forwarded": "host=evil.example, proto=https;host=near.example"}, True,
     "https://near.example"),  # the last element: the proxy next to the gateway
    ({"X-Forwarded-Host": "evil.example, near.example"}, True, "http://near.example"),
    ({"X-Forwarded-Proto": "javascript", "X-Forwarded-Host": "a.example/path"}, True,
     "http://gw:3002"),  # neither is a proto or a host: ignored
    ({"X-Forwarded-Host": "user@evil.example"}, True, "http://gw:3002"),
    ({"X-Forwarded-Host": "[::1]:8080"}, True, "http://[::1]:8080"),
    ({}, True, "http://gw:3002"),
]  # fmt: skip


@pytest.mark.parametrize(("headers", "trust", "expected"), FORWARDED_CASES)
def test_forwarded_origin_table(headers: dict[str, str], trust: bool, expected: str) -> None:
    assert origin(headers, "http", "gw:3002", trust) == expected


async def crawl_urls(base: str, root: str, headers: dict[str, str]) -> tuple[str, str]:
    """A crawl's ``url`` and, once done, its first status page's ``next``."""
    status, body = await post(f"{base}/v2/crawl", {"url": root, "limit": 3}, headers=headers)
    assert status == 200, body
    url = body["url"]
    for _ in range(300):
        status, page = await get(f"{base}/v2/crawl/{body['id']}?limit=1", headers=headers)
        if page["status"] != "scraping":
            break
        await asyncio.sleep(0.1)
    assert page["status"] == "completed" and page["completed"] > 1, page
    return url, page["next"]


PROXY = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "api.example.com"}


async def test_forwarded_headers_make_the_absolute_urls_when_trusted(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    trusted = Options(trust_forwarded=True)
    async with in_process_node(tmp_path) as node, gateway([node.address], trusted) as bound:
        url, next_url = await crawl_urls(f"http://{bound}", root, PROXY)
    assert url.startswith("https://api.example.com/v2/crawl/")
    assert next_url.startswith("https://api.example.com/v2/crawl/") and "skip=1" in next_url


async def test_forwarded_headers_are_ignored_unless_trusted(
    tmp_path: Path, site: tuple[Site, str]
) -> None:
    _, root = site
    async with in_process_node(tmp_path) as node, gateway([node.address]) as bound:
        url, next_url = await crawl_urls(f"http://{bound}", root, PROXY)
    assert url.startswith(f"http://{bound}/v2/crawl/")
    assert next_url.startswith(f"http://{bound}/v2/crawl/")


# ---------------------------------------------------------------- /healthz


async def test_healthz_is_200_while_the_primary_answers_and_503_once_it_is_down(
    tmp_path: Path,
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        node = await stack.enter_async_context(in_process_node(tmp_path))
        bound = await stack.enter_async_context(gateway([node.address]))
        status, body = await get(f"http://{bound}/healthz")
        assert (status, body) == (200, {"ok": True, "primary": node.address})
        await stack.pop_all().aclose()  # the node stops (the gateway with it)
    async with gateway([node.address]) as bound:
        status, body = await get(f"http://{bound}/healthz")
    assert (status, body) == (503, {"ok": False, "primary": None})


# ---------------------------------------------------------------- OpenAPI


async def openapi_doc(bound: str) -> dict[str, Any]:
    status, doc = await get(f"http://{bound}/v2/openapi.json")
    assert status == 200
    assert isinstance(doc, dict)
    return doc


async def test_openapi_lists_every_registered_route_with_its_request_model() -> None:
    registered = openapi.routes_of(make_app(Clients(["127.0.0.1:1"])))
    async with gateway(["127.0.0.1:1"]) as bound:
        doc = await openapi_doc(bound)
    assert doc["openapi"].startswith("3.1")
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert listed == set(registered)
    schemas = doc["components"]["schemas"]
    for method, path in registered:
        op = doc["paths"][path][method.lower()]
        if method not in openapi.BODY_METHODS:
            assert "requestBody" not in op
            continue
        model = openapi.REQUEST_MODELS.get((method, path))
        assert model is not None, f"{method} {path} takes a body: add its model to REQUEST_MODELS"
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.startswith("#/components/schemas/")
        schema = schemas[ref.rsplit("/", 1)[-1]]
        assert schema["title"] == model.__name__
        assert schema["additionalProperties"] is False
        assert set(schema["properties"]) == {
            f.alias or name for name, f in model.model_fields.items()
        }
        for p in (p for p in path.split("/") if p.startswith("{")):
            assert {"name": p.strip("{}"), "in": "path"}.items() <= op["parameters"][0].items()


async def test_each_tabled_model_is_the_one_its_route_validates_with() -> None:
    """Every property of the model REQUEST_MODELS names is a key the route knows (no
    'Unrecognized key' for any of them), and a key of no model is refused by name."""
    async with gateway(["127.0.0.1:1"]) as bound:
        for (method, path), model in openapi.REQUEST_MODELS.items():
            assert method == "POST"
            keys = {f.alias or name for name, f in model.model_fields.items()}
            status, body = await post(f"http://{bound}{path}", {key: [{}] for key in keys})
            assert status == 400, (path, body)
            top = [d["message"] for d in body["details"] if not d["path"]]  # top level
            assert not [m for m in top if m.startswith("Unrecognized key")], (path, top)
            status, body = await post(f"http://{bound}{path}", {"pagesiftNoSuchKey": 1})
            assert status == 400 and "pagesiftNoSuchKey" in body["error"] + str(body["details"])


def test_a_field_added_to_a_model_appears_in_the_document() -> None:
    grown = pydantic.create_model(
        "ScrapeRequest",
        __base__=ScrapeRequest,
        brand_new=(int | None, pydantic.Field(None, alias="brandNewField")),
    )
    routes = [("POST", "/v2/scrape")]
    before = openapi.document(routes, {("POST", "/v2/scrape"): ScrapeRequest})
    after = openapi.document(routes, {("POST", "/v2/scrape"): grown})
    props = after["components"]["schemas"]["ScrapeRequest"]["properties"]
    assert "brandNewField" in props
    assert "brandNewField" not in before["components"]["schemas"]["ScrapeRequest"]["properties"]


# ---------------------------------------------------------------- serve --http-listen


@pytest.mark.system  # a real pagesift serve process
async def test_serve_http_listen_runs_the_gateway_in_the_node_and_stops_with_it(
    nodes: NodeFactory, site: tuple[Site, str]
) -> None:
    _, root = site
    http = f"127.0.0.1:{free_port()}"
    node = nodes("p", extra=("--http-listen", http))
    await node.start()
    for _ in range(100):  # the gateway starts just after the gRPC port
        with contextlib.suppress(aiohttp.ClientError):
            if (await get(f"http://{http}/healthz"))[0] == 200:
                break
        await asyncio.sleep(0.1)
    sdk = Firecrawl(api_key="anonymous", api_url=f"http://{http}")
    doc = await asyncio.wait_for(asyncio.to_thread(sdk.scrape, root + "about.html"), 60)
    assert doc.markdown and "About" in doc.markdown
    assert "Firecrawl gateway on http://" in node.log_text()
    node.stop()
    assert node.proc is not None and node.proc.returncode == 0, node.log_text()[-2000:]
    with pytest.raises(aiohttp.ClientError):
        await get(f"http://{http}/healthz", timeout=aiohttp.ClientTimeout(5))


# ---------------------------------------------------------------- the gateway command


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--client-key", "k.pem"], "--client-cert and --client-key go together"),
    ],
)
def test_gateway_command_refuses_tls_flags_that_do_not_pair(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gateway", "--listen", "127.0.0.1:1", *flags]) == EXIT_USAGE
    assert message in capsys.readouterr().err


@needs_openssl
async def test_gateway_command_serves_tls_and_reaches_a_tls_pair_with_tls_ca(
    tmp_path: Path, pki: Path
) -> None:
    cert, key, ca = pki / "server.pem", pki / "server.key", pki / "ca.pem"
    async with tls_node(tmp_path / "n", tls_cert=str(cert), tls_key=str(key)) as node:
        http = f"127.0.0.1:{free_port()}"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pagesift.cli", "gateway", "--listen", http,
            "--server", node.config.listen, "--tls-cert", str(cert), "--tls-key", str(key),
            "--tls-ca", str(ca),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            answer: tuple[int, Any] = (0, None)
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    answer = await get(f"https://{http}/healthz", trusting(ca))
                    break
                await asyncio.sleep(0.05)
            assert answer == (200, {"ok": True, "primary": node.config.listen})
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)
        assert proc.returncode == 0, await proc.stderr.read() if proc.stderr else b""


async def test_gateway_command_with_an_unreadable_certificate_fails_with_exit_5(
    tmp_path: Path,
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pagesift.cli", "gateway",
        "--listen", f"127.0.0.1:{free_port()}",
        "--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(tmp_path / "none.key"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == EXIT_FAILED
    assert b"none.pem" in err or b"No such file" in err
