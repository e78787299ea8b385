"""Accounts: the TOML file, key hashing, authentication, admin keys and the key CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pagesift.core.jobs.accounts import (
    ANONYMOUS,
    Accounts,
    AccountsError,
    Unauthenticated,
    bearer_token,
    hash_key,
    main,
    new_key,
)

ACME_KEY = "acme-key-0123456789"
ACME_OLD_KEY = "acme-old-key-0123456789"
BETA_KEY = "beta-key-0123456789"
ADMIN_KEY = "admin-key-0123456789"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "accounts.toml"
    path.write_text(text)
    return path


def sample(tmp_path: Path) -> Path:
    return write(
        tmp_path,
        f"""
[admin]
key_sha256 = "{hash_key(ADMIN_KEY)}"

[[account]]
name = "acme"
key_sha256 = ["{hash_key(ACME_KEY)}", "{hash_key(ACME_OLD_KEY).upper()}"]
max_concurrent_jobs = 2
pages_per_day = 1000
max_batch_urls = 50
max_crawl_limit = 500
webhook_secret = "acme-webhook-secret-0123"

[[account]]
name = "beta"
key = "{BETA_KEY}"
""",
    )


def md(key: str) -> list[tuple[str, str | bytes]]:
    return [("user-agent", "x"), ("authorization", f"Bearer {key}")]


def test_keys_map_to_their_accounts_with_their_limits(tmp_path: Path) -> None:
    accounts = Accounts.load(sample(tmp_path))
    assert not accounts.anonymous
    acme = accounts.authenticate(md(ACME_KEY))
    assert acme.name == "acme"
    assert (acme.max_concurrent_jobs, acme.pages_per_day) == (2, 1000)
    assert (acme.max_batch_urls, acme.max_crawl_limit) == (50, 500)
    assert acme.limit("pages_per_day") == 1000
    assert accounts.authenticate(md(ACME_OLD_KEY)).name == "acme"  # rotation: both keys
    beta = accounts.authenticate([("authorization", f"bearer {BETA_KEY}".encode())])
    assert beta.name == "beta"
    assert beta.pages_per_day is None and beta.max_concurrent_jobs is None  # unlimited
    assert accounts.webhook_secret("acme") == "acme-webhook-secret-0123"
    assert accounts.webhook_secret("beta") is None
    assert accounts.names == ["acme", "beta"]
    # the plain-text key is accepted but warned about
    assert any("plain-text" in w for w in accounts.warnings)


def test_missing_and_unknown_keys_are_unauthenticated(tmp_path: Path) -> None:
    accounts = Accounts.load(sample(tmp_path))
    with pytest.raises(Unauthenticated, match="missing API key"):
        accounts.authenticate([("user-agent", "x")])
    with pytest.raises(Unauthenticated, match="missing API key"):
        accounts.authenticate(None)
    with pytest.raises(Unauthenticated, match="missing API key"):
        accounts.authenticate([("authorization", f"Basic {ACME_KEY}")])
    with pytest.raises(Unauthenticated, match="unknown API key"):
        accounts.authenticate(md("not-a-key-at-all"))
    with pytest.raises(Unauthenticated, match="unknown API key"):
        accounts.authenticate(md(hash_key(ACME_KEY)))  # the hash is not the key
    with pytest.raises(Unauthenticated):
        accounts.authenticate(md(ADMIN_KEY))  # the admin key is not an account key


def test_admin_key(tmp_path: Path) -> None:
    accounts = Accounts.load(sample(tmp_path))
    assert accounts.is_admin(md(ADMIN_KEY))
    assert not accounts.is_admin(md(ACME_KEY))
    assert not accounts.is_admin(None)
    no_admin = Accounts.load(write(tmp_path, f'[[account]]\nname="a"\nkey="{ACME_KEY}"\n'))
    assert not no_admin.is_admin(md(ADMIN_KEY)) and not no_admin.admin_open
    assert any("refused" in w for w in no_admin.warnings)


def test_no_file_means_one_loudly_announced_anonymous_account(tmp_path: Path) -> None:
    accounts = Accounts.load(None)
    assert accounts.anonymous
    assert accounts.authenticate(None).name == ANONYMOUS
    assert accounts.authenticate(md("whatever")).name == ANONYMOUS
    assert accounts.admin_open and accounts.is_admin(None)
    assert any("NO API KEYS" in w for w in accounts.warnings)
    assert any("NO ADMIN KEY" in w for w in accounts.warnings)
    # a file with only [anonymous] limits and an admin key
    path = write(
        tmp_path,
        f'[admin]\nkey_sha256 = "{hash_key(ADMIN_KEY)}"\n'
        '[anonymous]\npages_per_day = 10\nwebhook_secret = "anon-secret-0123456"\n',
    )
    anon = Accounts.load(path)
    assert anon.anonymous and anon.authenticate(None).pages_per_day == 10
    assert anon.webhook_secret(ANONYMOUS) == "anon-secret-0123456"
    assert not anon.admin_open and anon.is_admin(md(ADMIN_KEY)) and not anon.is_admin(None)
    assert any("NO API KEYS" in w for w in anon.warnings)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('[[account]]\nname = "a"\n', "needs key_sha256"),
        ('[[account]]\nname = "a b"\nkey = "0123456789"\n', "name"),
        ('[[account]]\nname = "anonymous"\nkey = "0123456789"\n', "reserved"),
        ('[[account]]\nname = "a"\nkey_sha256 = "abc"\n', "64 hex"),
        ('[[account]]\nname = "a"\nkey = "0123456789"\npages_per_day = 0\n', "pages_per_day"),
        ('[[account]]\nname = "a"\nkey = "0123456789"\npages_per_day = true\n', "pages_per_day"),
        ('[[account]]\nname = "a"\nkey = "0123456789"\nmax_batch_urls = "9"\n', "max_batch"),
        ('[[account]]\nname = "a"\nkey = "0123456789"\ncolour = "red"\n', "unknown field"),
        ('[[account]]\nname = "a"\nkey = "0123456789"\nwebhook_secret = "short"\n', "16"),
        (
            '[[account]]\nname = "a"\nkey = "0123456789"\n'
            '[[account]]\nname = "a"\nkey = "9876543210"\n',
            "duplicate",
        ),
        (
            '[[account]]\nname = "a"\nkey = "0123456789"\n'
            '[[account]]\nname = "b"\nkey = "0123456789"\n',
            "same key",
        ),
        ('[admin]\nkey = "0123456789"\n[[account]]\nname = "a"\nkey = "0123456789"\n', "admin"),
        ('[[account]]\nname = "a"\nkey = "0123456789"\n[anonymous]\n', "anonymous"),
        ("[server]\nx = 1\n", "unknown field"),
        ("not toml ===", "not valid TOML"),
    ],
)
def test_malformed_files_are_refused_naming_the_field(
    tmp_path: Path, text: str, match: str
) -> None:
    with pytest.raises(AccountsError, match=match):
        Accounts.load(write(tmp_path, text))


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AccountsError, match="cannot read"):
        Accounts.load(tmp_path / "nope.toml")


def test_bearer_token_parsing() -> None:
    assert bearer_token([("Authorization", "Bearer  abc ")]) == "abc"
    assert bearer_token([("authorization", b"Bearer xyz")]) == "xyz"
    assert bearer_token([("authorization", "Bearer ")]) is None
    assert bearer_token([("authorization", "Token abc")]) is None
    assert bearer_token(None) is None


def test_new_keys_are_random_and_hash_to_their_sha256(capsys: pytest.CaptureFixture[str]) -> None:
    a, b = new_key(), new_key()
    assert a != b and len(a) > 40
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert main(["new-key", "--name", "acme"]) == 0
    out = capsys.readouterr().out
    key = out.split("key:", 1)[1].split()[0]
    assert f'key_sha256 = "{hash_key(key)}"' in out
    assert 'name = "acme"' in out


def test_the_cli_runs_as_a_module(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "pagesift.core.jobs.accounts", "hash-key"],
        input="abc\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert res.stdout.strip() == hash_key("abc")
    res = subprocess.run(
        [sys.executable, "-m", "pagesift.core.jobs.accounts", "new-key"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    # the printed snippet is a valid accounts file for the printed key
    key = res.stdout.split("key:", 1)[1].split()[0]
    snippet = res.stdout[res.stdout.index("[[account]]") :]
    accounts = Accounts.load(write(tmp_path, snippet))
    assert accounts.authenticate(md(key)).name == "my-team"
    assert accounts.webhook_secret("my-team")
