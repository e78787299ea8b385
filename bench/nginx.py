"""A throw-away nginx serving a static directory on 127.0.0.1, for the crawl benchmarks.

The config is generated into a temp dir (pid file, error log and every temp path live
there), nginx runs in the foreground (``daemon off``) as our child with one worker so it
leaves CPU for the crawlers, ``access_log off`` so logging is not measured.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from bench.common import LOOPBACK, free_port, say, stop_process, tree_cpu_seconds, wait_for_port

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
    access_log off;
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

    def __init__(self, root: Path, binary: str = "nginx") -> None:
        self.root = root
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

    def __enter__(self) -> Nginx:
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-nginx-")
        tmp = Path(self._tmp.name)
        self.port = free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(
            _CONF.format(
                user="user root;" if os.geteuid() == 0 else "",
                tmp=tmp,
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
