"""Turn etcd's auth on with one role per pair (``coord.access``): the deploy kit's bootstrap.

What it owns
------------
``apply_auth(endpoints, root_password, users)``: etcd's ``root`` user and role, then
for every user its role (named as the user) holding exactly its grants, then auth
enabled. ``main`` is the command the deploy kit runs once per etcd (the Kubernetes Job
``pagesift-etcd-auth``, the compose service ``etcd-auth``)::

    python -m pagesift.coord.etcdauth --etcd etcd://HOST:PORT[,...] --cluster NAME \\
        --pairs a,b,c --passwords DIR

``DIR`` holds one file per user, its password alone: ``root``, ``reader`` (a cluster's
clients: the gateway) and one per pair. ``--cluster ""`` is a pair alone (its witness
prefix only, no reader).

Protocol and guarantee
----------------------
Idempotent: run again (a pair added, a password changed) it authenticates as root when
auth is already on, adds what is missing, resets each listed user's password (root's
is the one it logged in with), and makes each role's permissions exactly its grants (a
permission no longer granted is revoked). Every call is bounded (``timeout``); the
first endpoint that answers is used. Safe because the grants are ``coord.access``' pure
lists, the same the tests run etcd with (tests/test_registry_auth.py), so the kit cannot
grant what the tests did not check.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
import grpc.aio
from aetcd import rpc

from pagesift.coord.access import Grant, pair_grants, prefix_range_end, reader_grants
from pagesift.coord.etcd import Endpoint, describe
from pagesift.core.cluster.ids import check_pair_name
from pagesift.core.ha.election import parse_witness

__all__ = ["READER", "ROOT", "apply_auth", "kit_users", "main", "parser"]

ROOT = "root"
READER = "reader"
_EXISTS = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS)


def kit_users(cluster: str, pairs: Sequence[str]) -> dict[str, list[Grant]]:
    """The users the kit makes: one per pair, and ``reader`` in a cluster."""
    users = {check_pair_name(p): pair_grants(cluster, p) for p in pairs}
    if cluster:
        users[READER] = reader_grants(cluster)
    return users


def _permission(grant: Grant) -> rpc.Permission:
    perm, prefix = grant
    kind = rpc.Permission.READWRITE if perm == "readwrite" else rpc.Permission.READ
    key = prefix.encode()
    return rpc.Permission(permType=kind, key=key, range_end=prefix_range_end(key))


class _Auth:
    """etcd's Auth service on one channel, as root once auth is on."""

    def __init__(self, channel: grpc.aio.Channel, timeout: float) -> None:
        self.stub = rpc.AuthStub(channel)
        self.timeout = timeout
        self.metadata: tuple[tuple[str, str], ...] = ()

    async def call(self, method: str, request: object, *, exists_ok: bool = False) -> object:
        try:
            return await getattr(self.stub, method)(
                request, timeout=self.timeout, metadata=self.metadata
            )
        except grpc.aio.AioRpcError as e:
            if exists_ok and e.code() in _EXISTS and "already exist" in (e.details() or ""):
                return None
            raise


Users = Mapping[str, tuple[str, list[Grant]]]  # user -> (password, grants)


async def _apply_on(endpoint: Endpoint, root_password: str, users: Users, timeout: float) -> None:
    host, port = endpoint
    async with grpc.aio.insecure_channel(f"{host}:{port}") as channel:
        auth = _Auth(channel, timeout)
        enabled = await _login(auth, root_password)
        await auth.call("RoleAdd", rpc.AuthRoleAddRequest(name=ROOT), exists_ok=True)
        for name, (password, grants) in {ROOT: (root_password, []), **users}.items():
            added = await auth.call(
                "UserAdd", rpc.AuthUserAddRequest(name=name, password=password), exists_ok=True
            )
            if added is None and name != ROOT:  # root's is the one just logged in with
                await auth.call(
                    "UserChangePassword",
                    rpc.AuthUserChangePasswordRequest(name=name, password=password),
                )
            role = name
            if name != ROOT:
                await auth.call("RoleAdd", rpc.AuthRoleAddRequest(name=role), exists_ok=True)
                await _set_permissions(auth, role, grants)
            await auth.call("UserGrantRole", rpc.AuthUserGrantRoleRequest(user=name, role=role))
        if not enabled:
            await auth.call("AuthEnable", rpc.AuthEnableRequest())


async def _login(auth: _Auth, root_password: str) -> bool:
    """Authenticate as root when auth is on (True), or find it off (False). etcd 3.4 has
    no AuthStatus: its Authenticate says when auth is not enabled."""
    request = rpc.AuthenticateRequest(name=ROOT, password=root_password)
    try:
        reply = await auth.call("Authenticate", request)
    except grpc.aio.AioRpcError as e:
        if "authentication is not enabled" in (e.details() or ""):
            return False
        raise
    auth.metadata = (("token", str(getattr(reply, "token", ""))),)
    return True


async def _set_permissions(auth: _Auth, role: str, grants: list[Grant]) -> None:
    wanted = [_permission(g) for g in grants]
    current = await auth.call("RoleGet", rpc.AuthRoleGetRequest(role=role))
    for perm in getattr(current, "perm", ()):
        if not any(perm.key == w.key and perm.range_end == w.range_end for w in wanted):
            await auth.call(
                "RoleRevokePermission",
                rpc.AuthRoleRevokePermissionRequest(
                    role=role, key=perm.key, range_end=perm.range_end
                ),
            )
    for perm in wanted:
        await auth.call(
            "RoleGrantPermission", rpc.AuthRoleGrantPermissionRequest(name=role, perm=perm)
        )


async def apply_auth(
    endpoints: Sequence[Endpoint],
    root_password: str,
    users: Users,
    *,
    timeout: float = 10.0,
) -> None:
    """Roles, users and auth on (see the module docstring), on the first endpoint that
    answers; ``RuntimeError`` naming every endpoint's error when none does."""
    errors = []
    for endpoint in endpoints:
        try:
            await _apply_on(endpoint, root_password, users, timeout)
            return
        except grpc.aio.AioRpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise RuntimeError(
                    f"etcd {describe([endpoint])}: {e.code().name}: {e.details()}"
                ) from None
            errors.append(f"{describe([endpoint])}: {e.code().name}")
    raise RuntimeError(f"no etcd endpoint answered: {'; '.join(errors)}")


def _password(folder: Path, name: str) -> str:
    try:
        text = (folder / name).read_text().strip()
    except OSError as e:
        raise SystemExit(f"etcd auth: the password of {name}: {e}") from None
    if not text:
        raise SystemExit(f"etcd auth: the password file {folder / name} is empty")
    return text


def parser() -> argparse.ArgumentParser:
    """The command's flags (the deploy kit's Job and compose service pass them)."""
    parser = argparse.ArgumentParser(
        prog="python -m pagesift.coord.etcdauth",
        description="etcd auth on, with one role per pair limited to its own keys",
    )
    parser.add_argument("--etcd", required=True, help="etcd://HOST:PORT[,HOST:PORT...]")
    parser.add_argument("--cluster", default="", help='the cluster name ("" = a pair alone)')
    parser.add_argument("--pairs", required=True, help="the pairs, comma-separated")
    parser.add_argument("--passwords", required=True, type=Path, help="one file per user")
    parser.add_argument("--timeout", type=float, default=10.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    grants = kit_users(args.cluster, pairs)
    users = {name: (_password(args.passwords, name), g) for name, g in grants.items()}
    root = _password(args.passwords, ROOT)
    try:
        asyncio.run(apply_auth(parse_witness(args.etcd), root, users, timeout=args.timeout))
    except (RuntimeError, ValueError) as e:
        print(f"etcd auth: {e}", file=sys.stderr)
        return 1
    for name, g in grants.items():
        print(f"etcd auth: user {name}: " + ", ".join(f"{p} {k}" for p, k in g))
    print("etcd auth: on")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
