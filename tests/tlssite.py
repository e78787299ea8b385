"""A loopback HTTPS site with a self-signed certificate, for the TLS tests.

``tls_site(routes)`` serves ``routes`` (path -> (status, content type, body)) over
HTTPS on 127.0.0.1 with a certificate made here with ``cryptography`` (EC P-256, its
subject alternative name 127.0.0.1, signed by itself), so no client that verifies
certificates accepts it: a request that skips verification is the only way in. It
records each path asked (``TlsSite.asked``), so a test can tell that robots.txt or a
sitemap was really read. Only loopback, nothing written outside ``tmp``.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["Route", "TlsSite", "self_signed", "tls_site"]

Route = tuple[int, str, str]  # (status, content type, body)


def self_signed(d: Path) -> tuple[Path, Path]:
    """``d/cert.pem`` and ``d/key.pem``: a certificate for 127.0.0.1 signed by its own key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pagesift self-signed test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = d / "cert.pem", d / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass
class TlsSite:
    root: str  # https://127.0.0.1:PORT/
    asked: list[str] = field(default_factory=list)  # the paths requested, in order


@contextlib.asynccontextmanager
async def tls_site(tmp: Path, routes: Mapping[str, Route]) -> AsyncIterator[TlsSite]:
    """``routes`` over HTTPS with a self-signed certificate; any other path is a 404."""
    cert, key = self_signed(tmp)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    site: TlsSite | None = None

    async def handler(request: web.Request) -> web.StreamResponse:
        assert site is not None
        site.asked.append(request.path)
        status, kind, body = routes.get(request.path, (404, "text/plain", "not here"))
        return web.Response(status=status, text=body, content_type=kind)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handler)
    runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await tcp.start()
    site = TlsSite(f"https://127.0.0.1:{runner.addresses[0][1]}/")
    try:
        yield site
    finally:
        await runner.cleanup()
