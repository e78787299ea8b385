"""``pagesift.core.jobs.urls``: page keys, validation, site scope, path filters, the guard."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesift.core.jobs import blockedaddresses, urls


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("HTTP://Example.COM", "http://example.com/"),
        ("http://example.com:80/a", "http://example.com/a"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("https://example.com:8443/a", "https://example.com:8443/a"),
        ("http://example.com/a#frag", "http://example.com/a"),
        ("http://example.com/docs/", "http://example.com/docs"),
        ("http://example.com/docs/index.html", "http://example.com/docs"),
        ("http://example.com/docs/index.htm", "http://example.com/docs"),
        ("http://example.com/index.html", "http://example.com/"),
        ("http://example.com/a/index.html/", "http://example.com/a"),
        ("http://example.com/a//", "http://example.com/a"),
        ("http://example.com/a/./b/../c", "http://example.com/a/c"),
        ("http://example.com/%7euser/%2f%3a", "http://example.com/~user/%2F%3A"),
        ("http://example.com/caf\u00e9 menu", "http://example.com/caf%C3%A9%20menu"),
        ("http://example.com/100%", "http://example.com/100%25"),
        ("http://example.com/a?b=2&a=1", "http://example.com/a?b=2&a=1"),
        ("http://example.com/a?q=caf\u00e9", "http://example.com/a?q=caf%C3%A9"),
        ("http://example.com/a?", "http://example.com/a"),
        ("http://b\u00fccher.example/", "http://xn--bcher-kva.example/"),
        ("http://[2001:DB8::1]:80/x", "http://[2001:db8::1]/x"),
        ("http://user:pw@example.com/", "http://example.com/"),  # credentials never kept
        ("  http://example.com/a  ", "http://example.com/a"),
    ],
)
def test_normalize_maps_every_spelling_to_one_key(raw: str, key: str) -> None:
    assert urls.normalize(raw) == key


def test_normalize_can_drop_the_query() -> None:
    assert urls.normalize("http://e.com/a/?x=1#f", ignore_query=True) == "http://e.com/a"


def test_a_directory_and_its_index_page_share_a_key() -> None:
    a = urls.normalize("https://e.com/docs/")
    assert (
        a == urls.normalize("https://e.com/docs/index.html") == urls.normalize("https://e.com/docs")
    )


_label = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789-\u00e9\u00fc", min_size=1, max_size=8
)
_host = st.lists(_label, min_size=1, max_size=3).map(".".join)
_chunk = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="#?"), max_size=20
)


@st.composite
def _urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "hTTps"]))
    host = draw(_host)
    if draw(st.booleans()):
        host = host.upper()
    port = draw(st.sampled_from(["", ":80", ":443", ":8080", ":0"]))
    path = "/".join(
        draw(
            st.lists(
                st.one_of(
                    _chunk, st.sampled_from([".", "..", "index.html", "%2e", "%7E", "%zz", ""])
                ),
                max_size=5,
            )
        )
    )
    query = draw(st.one_of(st.none(), _chunk))
    frag = draw(st.one_of(st.none(), _chunk))
    url = f"{scheme}://{host}{port}/{path}"
    if query is not None:
        url += "?" + query
    if frag is not None:
        url += "#" + frag
    return url


@settings(max_examples=400, deadline=None)
@given(_urls(), st.booleans())
def test_normalize_is_idempotent(url: str, ignore_query: bool) -> None:
    if urls.validate(url, 10_000) is not None:
        return
    try:
        once = urls.normalize(url, ignore_query=ignore_query)
    except ValueError:
        return
    assert urls.normalize(once, ignore_query=ignore_query) == once
    assert urls.normalize(once) == urls.normalize(once, ignore_query=False)
    assert urls.validate(once, 10_000) is None


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://example.com/", None),
        ("https://example.com:8443/a?b", None),
        ("ftp://example.com/", "scheme must be http or https"),
        ("javascript:alert(1)", "scheme must be http or https"),
        ("example.com/page", "scheme must be http or https"),
        ("http:///path", "no host"),
        ("http://", "no host"),
        ("http://example.com:99999/", "unparsable"),
        ("http://exa mple.com/", "unparsable"),
        ("http://[::1/", "unparsable"),
        ("http://example.com/" + "a" * 100, "longer than 50 characters"),
    ],
)
def test_validate_explains_what_is_wrong(url: str, message: str | None) -> None:
    got = urls.validate(url, 50)
    if message is None:
        assert got is None
    else:
        assert got is not None and got.startswith(message)


@pytest.mark.parametrize(
    ("ip", "blocked"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("10.0.0.1", True),
        ("172.16.5.4", True),
        ("192.168.1.1", True),
        ("169.254.1.1", True),
        ("169.254.169.254", True),
        ("100.64.0.1", True),
        ("100.127.255.254", True),
        ("0.0.0.0", True),
        ("224.0.0.251", True),
        ("240.0.0.1", True),
        ("255.255.255.255", True),
        ("::1", True),
        ("::", True),
        ("fe80::1", True),
        ("fe80::1%eth0", True),
        ("fc00::1", True),
        ("fd00:ec2::254", True),
        ("ff02::1", True),
        ("::ffff:127.0.0.1", True),
        ("::ffff:10.1.2.3", True),
        ("::ffff:169.254.169.254", True),
        ("::ffff:100.64.0.1", True),
        ("::ffff:7f00:1", True),
        ("64:ff9b::7f00:1", True),
        ("2002:7f00:1::", True),
        ("not an ip", True),
        ("8.8.8.8", False),
        ("93.184.216.34", False),
        ("100.63.255.255", False),
        ("::ffff:8.8.8.8", False),
        ("2606:4700:4700::1111", False),
    ],
)
def test_is_blocked_ip(ip: str, blocked: bool) -> None:
    assert blockedaddresses.is_blocked_ip(ip) is blocked


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://localhost/",
        "http://LOCALHOST./x",
        "http://app.localhost/",
    ],
)
async def test_blocked_reason_names_loopback_and_private_targets(url: str) -> None:
    assert await blockedaddresses.blocked_reason(url) is not None


async def test_blocked_reason_allows_a_public_literal_address() -> None:
    assert await blockedaddresses.blocked_reason("http://8.8.8.8/") is None


async def test_blocked_reason_leaves_a_dns_failure_to_the_fetch() -> None:
    assert await blockedaddresses.blocked_reason("http://no-such-host.invalid/") is None


@settings(max_examples=300, deadline=None)
@given(_urls())
def test_the_fast_path_of_normalize_agrees_with_urlsplit(url: str) -> None:
    if urls.validate(url, 10_000) is not None:
        return
    try:
        slow = urls._normalize_slow(url.strip(), False)
    except ValueError:
        return
    assert urls.normalize(url) == slow
