"""A throw-away nginx serving a static directory on 127.0.0.1, for the crawl benchmarks.

The config is generated into a temp dir (pid file, error log and every temp path live
there), nginx runs in the foreground (``daemon off``) as our child with one worker so it
leaves CPU for the crawlers, ``access_log off`` so logging is not measured -- unless
``Nginx(root, log_requests=True)``: then each request is one line of an access log in the
temp dir (status, body bytes, bytes sent with headers, the request's If-None-Match and
If-Modified-Since, request line; tab-separated), which
``Nginx.requests()`` reads, for sections that count what the server saw and sent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from bench.common import LOOPBACK, free_port, say, stop_process, tree_cpu_seconds, wait_for_port

# one line per request, tab-separated: status, body bytes, bytes sent (headers included),
# the request's If-None-Match and If-Modified-Since ("" when absent), request line
_LOG_FORMAT = (
    "log_format bench '$status\\t$body_bytes_sent\\t$bytes_sent\\t"
    "$http_if_none_match\\t$http_if_modified_since\\t$request';"
)


@dataclass(frozen=True)
class LoggedRequest:
    """One line of the access log (``Nginx(log_requests=True)``)."""

    status: int
    body_bytes: int
    bytes_sent: int  # headers + body
    request: str  # "GET /path HTTP/1.1"
    if_none_match: str = ""
    if_modified_since: str = ""

    @property
    def conditional(self) -> bool:
        return bool(self.if_none_match or self.if_modified_since)

    @property
    def path(self) -> str:
        parts = self.request.split(" ")
        return parts[1] if len(parts) >= 2 else self.request


_CONF = """\
{user}
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    include {mime_types};
    default_type application/octet-stream;
    {access_log}
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen {host}:{port};
        server_name localhost;
        root {root};
        index index.html;
    }}
}}
"""


class Nginx:
    """``with Nginx(root) as site: ... site.url ...`` — started on enter, stopped on exit."""

    def __init__(self, root: Path, binary: str = "nginx", log_requests: bool = False) -> None:
        self.root = root
        self.log_requests = log_requests
        self.binary = shutil.which(binary) or "/usr/sbin/nginx"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/"

    def cpu_seconds(self) -> float:
        """CPU of master + worker so far."""
        return tree_cpu_seconds(self.proc.pid) if self.proc is not None else 0.0

    @property
    def access_log(self) -> Path | None:
        if not self.log_requests or self._tmp is None:
            return None
        return Path(self._tmp.name) / "access.log"

    def log_offset(self) -> int:
        """Where the access log ends now: pass it to ``requests`` to read what follows."""
        path = self.access_log
        return path.stat().st_size if path is not None and path.exists() else 0

    def requests(self, since: int = 0) -> list[LoggedRequest]:
        """The requests logged after byte ``since`` of the access log (nginx writes a line
        when a response is finished, unbuffered: a client that has its answers is logged)."""
        path = self.access_log
        if path is None:
            raise RuntimeError("Nginx(log_requests=True) is needed to count requests")
        if not path.exists():
            return []
        with path.open("rb") as fh:
            fh.seek(since)
            lines = fh.read().decode(errors="replace").splitlines()
        out: list[LoggedRequest] = []
        for line in lines:
            status, body, sent, inm, ims, request = [*line.split("\t", 5), *[""] * 6][:6]
            if status.isdigit() and body.isdigit() and sent.isdigit():
                out.append(
                    LoggedRequest(
                        int(status),
                        int(body),
                        int(sent),
                        request,
                        "" if inm == "-" else inm,
                        "" if ims == "-" else ims,
                    )
                )
        return out

    def __enter__(self) -> Nginx:
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-nginx-")
        tmp = Path(self._tmp.name)
        self.port = free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(
            _CONF.format(
                user="user root;" if os.geteuid() == 0 else "",
                tmp=tmp,
                access_log=(
                    f"{_LOG_FORMAT} access_log {tmp}/access.log bench;"
                    if self.log_requests
                    else "access_log off;"
                ),
                mime_types="/etc/nginx/mime.types",
                host=LOOPBACK,
                port=self.port,
                root=self.root,
            )
        )
        cmd = [self.binary, "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(conf)]
        say(f"starting nginx on {self.url} serving {self.root}")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        try:
            wait_for_port(LOOPBACK, self.port, timeout=15, proc=self.proc)
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None:
            # SIGTERM is nginx's fast shutdown; SIGQUIT would wait for keep-alive clients.
            code = stop_process(self.proc, grace=10)
            say(f"nginx stopped (exit {code})")
            self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
