#!/usr/bin/env python3
"""pagesift health probe, for Docker HEALTHCHECK and Kubernetes exec probes.

    python /opt/pagesift/healthcheck.py [SERVICE[,SERVICE...]]

Asks the node's standard grpc.health.v1 Check about each SERVICE ("" by default: the
process serves; "pagesift.primary": it takes writes now; "pagesift.replica": a standby
within replica_max_lag of its primary) and exits 0 as soon as one is SERVING, 1 when
none is (NOT_SERVING, unknown service, no answer). It prints one line either way.

Environment (nothing to replace in this file):
  PAGESIFT_HEALTH_ADDR     the node, HOST:PORT (default 127.0.0.1:50051)
  PAGESIFT_HEALTH_CA       the CA (PEM) that signed the node's certificate: speak TLS and
                           verify it; unset or empty: plaintext (a node without tls_cert)
  PAGESIFT_HEALTH_NAME     the name the certificate must carry (default localhost)
  PAGESIFT_HEALTH_TIMEOUT  seconds for the whole check (default 3)

Why a script: Kubernetes' built-in gRPC probe speaks plaintext only (TLS is alpha in
1.37, KEP-4939), and a pagesift node that is reachable off its host serves TLS.
It uses only grpcio and grpcio-health-checking, which the image already has.
"""

from __future__ import annotations

import os
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


def _channel(address: str) -> grpc.Channel:
    ca = os.environ.get("PAGESIFT_HEALTH_CA", "")
    if not ca:
        return grpc.insecure_channel(address)
    with open(ca, "rb") as fh:
        creds = grpc.ssl_channel_credentials(root_certificates=fh.read())
    name = os.environ.get("PAGESIFT_HEALTH_NAME") or "localhost"
    return grpc.secure_channel(address, creds, options=[("grpc.ssl_target_name_override", name)])


def check(services: list[str]) -> tuple[bool, str]:
    """(one of ``services`` is SERVING, what each answered)."""
    address = os.environ.get("PAGESIFT_HEALTH_ADDR") or "127.0.0.1:50051"
    deadline = time.monotonic() + float(os.environ.get("PAGESIFT_HEALTH_TIMEOUT") or 3)
    answers = []
    with _channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in services:
            label = repr(service)
            try:
                reply = stub.Check(
                    health_pb2.HealthCheckRequest(service=service),
                    timeout=max(0.1, deadline - time.monotonic()),
                )
            except grpc.RpcError as err:
                answers.append(f"{label}: {err.code().name}")
                continue
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            answers.append(f"{label}: {status}")
            if reply.status == SERVING:
                return True, f"{address} " + ", ".join(answers)
    return False, f"{address} " + ", ".join(answers)


def main(argv: list[str]) -> int:
    services = argv[1].split(",") if len(argv) > 1 else [""]
    try:
        ok, line = check(services)
    except (OSError, ValueError) as err:  # an unreadable CA file, a bad timeout
        ok, line = False, f"health check not run: {err}"
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
