"""The CLI and client send API and admin keys, so they work against a node with accounts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagesift import cli
from pagesift.cli.common import EXIT_REFUSED
from pagesift.core.jobs.accounts import hash_key
from tests.helpers import in_process_node

API_KEY = "psk_test_account_key_0123456789"
ADMIN_KEY = "psk_test_admin_key_0123456789"


def accounts_file(tmp_path: Path) -> Path:
    path = tmp_path / "accounts.toml"
    path.write_text(
        f'[admin]\nkey_sha256 = "{hash_key(ADMIN_KEY)}"\n\n'
        f'[[account]]\nname = "acme"\nkey_sha256 = "{hash_key(API_KEY)}"\n'
    )
    return path


async def test_the_cli_sends_the_api_key_and_the_admin_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accounts = accounts_file(tmp_path)
    async with in_process_node(tmp_path / "node", accounts_file=str(accounts)) as node:
        server = ["--server", node.address]
        assert await cli.amain(["jobs", "--json", *server]) == EXIT_REFUSED
        assert json.loads(capsys.readouterr().out)["error"]["code"] == "UNAUTHENTICATED"
        assert await cli.amain(["jobs", "--json", "--api-key", API_KEY, *server]) == 0
        assert json.loads(capsys.readouterr().out) == {"jobs": []}
        assert await cli.amain(["role", "--json", "--api-key", API_KEY, *server]) == EXIT_REFUSED
        assert json.loads(capsys.readouterr().out)["error"]["code"] == "PERMISSION_DENIED"
        assert await cli.amain(["role", "--json", "--admin-key", ADMIN_KEY, *server]) == 0
        assert json.loads(capsys.readouterr().out)["role"] == "primary"
