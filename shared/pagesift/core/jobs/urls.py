"""URL functions shared by the primary and the standby: the host parser, page keys,
validation.

Crawl scope (origins) lives in ``pagesift.core.jobs.scope``; caller regexes in
``pagesift.core.jobs.patterns``; which addresses no fetch may reach in
``pagesift.core.jobs.blockedaddresses``.

Everything here is pure and deterministic. The guarantees:

- **One host parser**, ``canonical_host``, used by ``normalize``, ``validate``,
  ``host_of``, ``fetch_url`` and the address guard (``blockedaddresses``): WHATWG URL
  Standard host parsing for http(s). Percent-decoding, then UTS 46 mapping (the ``idna``
  package, IDNA 2008, non-transitional: full-width and other Unicode digits become
  ASCII, ideographic and full-width dots become label separators, ``faß.de`` stays
  ``faß``), IDNA 2008 A-labels for non-ASCII labels, then the WHATWG IPv4 parser for a
  host that ends in a number (``0177.0.0.1``, ``0x7f.1``, ``127.1``, ``2130706433`` all
  become ``127.0.0.1``) and canonical IPv6 text (``[::ffff:7f00:1]``). Trailing dots are
  dropped. A host it cannot parse raises ``ValueError`` and is refused everywhere (fail
  closed). The HTTP client is only ever given ``fetch_url`` output, whose host is this
  canonical text, so the address the guard judges is the one connected to.
- ``normalize`` maps every spelling of one page to one key, and is idempotent:
  ``normalize(normalize(u)) == normalize(u)``. The canonical form has a lowercase
  scheme, the canonical host, no default port, no fragment, **no userinfo** (credentials
  are never part of a key, so never stored),
  RFC 3986 dot segments removed, uppercase percent escapes (unreserved characters
  decoded, reserved ones never decoded, unsafe characters encoded as UTF-8), a
  trailing ``index.html``/``index.htm`` removed and **no trailing slash** except for
  the root path ``/``. So ``/docs``, ``/docs/`` and ``/docs/index.html`` are one key,
  ``/docs``. Query parameters keep their order (or are dropped with ``ignore_query``).
  Fetching a key whose server wants a trailing slash costs one redirect hop; the
  engine follows it and resolves links against the final URL, so nothing is lost.
- ``page_key`` is a crawl's identity of a URL: ``normalize`` plus, per job, the
  optional ``strip_tracking`` (tracking query parameters dropped: ``utm_*`` and the
  click ids in ``TRACKING_PARAMETERS``) and ``similar_key`` (Firecrawl's permutations
  made one: ``www.`` prefixes dropped, ``http`` and ``https`` one scheme when the port
  is the default, any ``/index.<ext>`` dropped, on top of what ``normalize`` already
  folds: trailing slash, ``index.html``). All three are pure and idempotent, and a
  key is always a fixed point of ``normalize`` (tests/test_url_identity.py, hypothesis).
- ``validate`` accepts only absolute http(s) URLs with a host ``canonical_host`` can
  parse and no userinfo (credentials in a URL are refused: they belong in request
  headers), within a length limit. Links and redirects met while crawling are not
  refused but stripped (``strip_userinfo``; ``fetch_url`` and ``normalize`` drop it).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from re import Pattern
from urllib.parse import SplitResult, quote, unquote_to_bytes, urlsplit, urlunsplit

import idna

__all__ = [
    "canonical_host",
    "fetch_url",
    "host_of",
    "is_loopback_name",
    "normalize",
    "page_key",
    "similar_key",
    "strip_tracking",
    "strip_userinfo",
    "validate",
]

_DEFAULT_PORTS = {"http": 80, "https": 443}

# Characters left as they are: RFC 3986 unreserved + sub-delims + ":" "@" "/" (and "?"
# in a query) and "%" (escapes are repaired separately).
_PATH_SAFE = "!$&'()*+,;=:@/~-._%"
_QUERY_SAFE = _PATH_SAFE + "?"
_CLEAN_PATH = re.compile(r"[A-Za-z0-9!$&'()*+,;=:@/~\-._]*")
_CLEAN_QUERY = re.compile(r"[A-Za-z0-9!$&'()*+,;=:@/?~\-._]*")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_INDEX_FILES = ("/index.html", "/index.htm")


def _fix_escape(m: re.Match[str]) -> str:
    code = int(m.group(1), 16)
    if code in _UNRESERVED:
        return chr(code)
    return "%" + m.group(1).upper()


def _encode(part: str, safe: str, clean: Pattern[str]) -> str:
    """Percent-encoding normalized: unsafe chars encoded, escapes uppercase, unreserved decoded."""
    has_escape = "%" in part
    if not has_escape and clean.fullmatch(part):
        return part  # the common case: nothing to do
    if has_escape:
        part = _BAD_PERCENT.sub("%25", part)
    part = quote(part, safe=safe, errors="replace")
    return _ESCAPE.sub(_fix_escape, part) if has_escape else part


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4, for an absolute path."""
    if "/." not in path:
        return path
    segments = path.split("/")
    if "." not in segments and ".." not in segments:
        return path
    out: list[str] = []
    for seg in segments[1:]:
        if seg == ".":
            continue
        if seg == "..":
            if out:
                out.pop()
            continue
        out.append(seg)
    if segments[-1] in (".", ".."):
        out.append("")  # "/a/b/.." is the directory "/a/"
    return "/" + "/".join(out)


# --- the host parser (WHATWG URL Standard "host parser", special schemes) --------------

# WHATWG "forbidden domain code points": C0 controls, space, "#%/:<>?@[\]^|", DEL.
_FORBIDDEN_DOMAIN = frozenset([chr(c) for c in range(0x21)] + list("#%/:<>?@[\\]^|\x7f"))
_DECIMAL = re.compile(r"[0-9]+")  # ASCII digits only ([0-9] is a code point range)
_OCTAL = re.compile(r"[0-7]+")
_HEX = re.compile(r"[0-9A-Fa-f]*")


def _ipv4_number(part: str) -> int | None:
    """The WHATWG IPv4 number parser: ``0x``/``0X`` hex, leading-``0`` octal, decimal."""
    if part[:2] in ("0x", "0X"):
        digits = part[2:]
        if not _HEX.fullmatch(digits):
            return None
        return int(digits, 16) if digits else 0
    if len(part) > 1 and part[0] == "0":
        return int(part[1:], 8) if _OCTAL.fullmatch(part[1:]) else None
    return int(part) if _DECIMAL.fullmatch(part) else None


def _ends_in_number(domain: str) -> bool:
    last = domain.rpartition(".")[2]
    if _DECIMAL.fullmatch(last):
        return True
    return last[:2] in ("0x", "0X") and _HEX.fullmatch(last[2:]) is not None


def _parse_ipv4(domain: str) -> str:
    """The WHATWG IPv4 parser (1 to 4 parts, the last one filling the rest): dotted text."""
    parts = domain.split(".")
    if len(parts) > 4:
        raise ValueError(f"{domain!r}: an IPv4 address has at most four parts")
    numbers: list[int] = []
    for part in parts:
        number = _ipv4_number(part)
        if number is None:
            raise ValueError(f"{domain!r}: {part!r} is not an IPv4 number")
        numbers.append(number)
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise ValueError(f"{domain!r}: IPv4 address out of range")
    value = numbers[-1]
    for i, number in enumerate(numbers[:-1]):
        value += number << (8 * (3 - i))
    return str(ipaddress.IPv4Address(value))


def _ipv6_text(ip: ipaddress.IPv6Address) -> str:
    """WHATWG IPv6 serialization: lowercase hex, the first longest run (>= 2) of zero
    pieces compressed, embedded IPv4 as hex (the same on every Python version)."""
    packed = ip.packed
    pieces = [packed[i] << 8 | packed[i + 1] for i in range(0, 16, 2)]
    start, length, i = -1, 1, 0
    while i < 8:
        j = i
        while j < 8 and pieces[j] == 0:
            j += 1
        if j - i > length:
            start, length = i, j - i
        i = max(j, i + 1)
    texts = [format(p, "x") for p in pieces]
    if start < 0:
        return ":".join(texts)
    return ":".join(texts[:start]) + "::" + ":".join(texts[start + length :])


def _parse_ipv6(text: str) -> str:
    if not text.isascii() or "%" in text:  # zone ids are not URL hosts
        raise ValueError(f"{text!r} is not an IPv6 address")
    return f"[{_ipv6_text(ipaddress.IPv6Address(text))}]"  # AddressValueError: ValueError


@functools.lru_cache(maxsize=16_384)
def canonical_host(host: str) -> str:
    """The canonical text of a URL host, as the WHATWG URL Standard parses it.

    ``host`` is the host part of a URL's authority (no userinfo, no port; IPv6 with
    or without its brackets). Returns an IPv4 address in dotted decimal, an IPv6
    address in brackets (``[::1]``), or a lowercase ASCII domain (A-labels) without
    trailing dots. Raises ``ValueError`` when the host cannot be parsed: callers
    refuse the URL (fail closed).
    """
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"{host!r}: unclosed IPv6 bracket")
        return _parse_ipv6(host[1:-1])
    if ":" in host:  # an IPv6 address whose brackets urlsplit removed
        return _parse_ipv6(host)
    if "%" in host:
        host = unquote_to_bytes(host).decode("utf-8")  # UnicodeDecodeError is a ValueError
    if host.isascii():
        domain = host.lower()
    else:
        try:  # UTS 46 mapping, non-transitional, STD3 rules off (as WHATWG asks)
            domain = idna.uts46_remap(host, std3_rules=False, transitional=False)
        except idna.IDNAError as exc:
            raise ValueError(f"{host!r}: not a valid host name ({exc})") from None
    domain = domain.rstrip(".")
    if not domain:
        raise ValueError(f"{host!r}: empty host")
    if not _FORBIDDEN_DOMAIN.isdisjoint(domain):
        raise ValueError(f"{host!r}: forbidden character in host")
    if not domain.isascii() or "xn--" in domain:
        labels: list[str] = []
        for label in domain.split("."):
            try:
                if not label.isascii():
                    label = idna.alabel(label).decode("ascii")
                elif label.startswith("xn--"):
                    idna.ulabel(label)  # must be the Punycode of a valid label
            except idna.IDNAError as exc:
                raise ValueError(f"{host!r}: not a valid host name ({exc})") from None
            labels.append(label)
        domain = ".".join(labels)
    if _ends_in_number(domain):
        return _parse_ipv4(domain)
    return domain


def _raw_host(netloc: str) -> str:
    """The host part of an authority as written (urlsplit's split, brackets kept)."""
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        return hostport.partition("]")[0] + "]"
    return hostport.partition(":")[0]


def is_loopback_name(host: str) -> bool:
    """``localhost`` and ``*.localhost`` (RFC 6761: always loopback, never asked of DNS)."""
    return host == "localhost" or host.endswith(".localhost")


def _normalize_path(path: str) -> str:
    if not path:
        return "/"
    if path[0] != "/":
        path = "/" + path
    path = _remove_dot_segments(_encode(path, _PATH_SAFE, _CLEAN_PATH))
    while True:  # "/a/index.html/" -> "/a/index.html" -> "/a/" -> "/a"
        if path[-1] == "/" and len(path) > 1:
            path = path.rstrip("/") or "/"
        if path[-4:] in (".htm", "html") and path.endswith(_INDEX_FILES):
            path = path[: path.rindex("/") + 1]
            continue
        return path


def _netloc(parts: SplitResult, scheme: str) -> str:
    """Canonical host and non-default port; userinfo dropped. ValueError when unparsable
    ("" for a URL without authority, e.g. ``mailto:``, which has no host to parse)."""
    if not parts.netloc:
        return ""
    netloc = canonical_host(_raw_host(parts.netloc))
    port = parts.port  # raises ValueError for a bad port
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        netloc = f"{netloc}:{port}"
    return netloc


# Fast path: "scheme://host[:port]/path?query#fragment" with a plain lowercase ASCII host
# and no characters urlsplit would strip; anything else takes the urlsplit path. A host
# whose last label starts with a digit (an IPv4 spelling like 127.1 or 0x7f.1 maybe) or
# with an "xn--" label goes through canonical_host (cached) even here. Both
# paths give the same result; the fast one is ~2x quicker (links of every page go here).
_FAST_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://([^/?#]*)([^?#]*)(?:\?([^#]*))?")
_PLAIN_NETLOC = re.compile(r"[a-z0-9\-]+(?:\.[a-z0-9\-]+)*(?::([0-9]{1,5}))?")


def _normalize_fast(url: str, ignore_query: bool) -> str | None:
    m = _FAST_URL.match(url)
    if m is None or "\t" in url or "\n" in url or "\r" in url:
        return None
    scheme = m.group(1).lower()
    default_port = _DEFAULT_PORTS.get(scheme)
    netloc = m.group(2)
    n = _PLAIN_NETLOC.fullmatch(netloc)
    if default_port is None or n is None:
        return None
    port_text = n.group(1)
    host = netloc if port_text is None else netloc[: n.start(1) - 1]
    if host[host.rfind(".") + 1] in "0123456789" or "xn--" in host:
        host = canonical_host(host)  # maybe an IPv4 spelling (127.1), or Punycode to check
    netloc = host
    if port_text is not None:
        port = int(port_text)
        if port > 65535:
            return None
        if port != default_port:
            netloc = f"{host}:{port}"
    path = _normalize_path(m.group(3))
    query = m.group(4)
    if query and not ignore_query:
        return f"{scheme}://{netloc}{path}?{_encode(query, _QUERY_SAFE, _CLEAN_QUERY)}"
    return f"{scheme}://{netloc}{path}"


def normalize(url: str, *, ignore_query: bool = False) -> str:
    """The page key of ``url`` (see the module docstring for the canonical form).

    Raises ``ValueError`` for a URL ``urlsplit`` cannot take (e.g. a bad port);
    run ``validate`` first on untrusted input. Cached: the pages of one site
    repeat most of their links (navigation, footer), so most calls are a lookup.
    """
    return _normalize_cached(url, ignore_query)


@functools.lru_cache(maxsize=131_072)
def _normalize_cached(url: str, ignore_query: bool) -> str:
    url = url.strip()
    fast = _normalize_fast(url, ignore_query)
    if fast is not None:
        return fast
    return _normalize_slow(url, ignore_query)


def _normalize_slow(url: str, ignore_query: bool) -> str:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    query = "" if ignore_query else _encode(parts.query, _QUERY_SAFE, _CLEAN_QUERY)
    return urlunsplit((scheme, _netloc(parts, scheme), _normalize_path(parts.path), query, ""))


# Query parameters that only say where a click came from (names compared lowercase).
TRACKING_PARAMETERS = frozenset(
    {
        "gclid", "gclsrc", "dclid", "gbraid", "wbraid", "fbclid", "msclkid", "yclid",
        "twclid", "ttclid", "li_fat_id", "igshid", "mc_cid", "mc_eid", "_ga", "_gl",
        "_hsenc", "_hsmi", "mkt_tok", "vero_id", "oly_anon_id", "oly_enc_id",
        "rb_clickid", "s_cid", "srsltid", "ref_src",
    }
)  # fmt: skip
_TRACKING_PREFIXES = ("utm_",)


def _is_tracking(param: str) -> bool:
    name = param.partition("=")[0]
    if "%" in name or "+" in name:
        name = unquote_to_bytes(name.replace("+", " ")).decode("utf-8", "replace")
    name = name.strip().lower()
    return name in TRACKING_PARAMETERS or name.startswith(_TRACKING_PREFIXES)


def strip_tracking(url: str) -> str:
    """``url`` without its tracking query parameters (``utm_*``, ``TRACKING_PARAMETERS``);
    every other parameter kept in its order and spelling, the fragment kept. Idempotent."""
    base, sep, rest = url.partition("?")
    if not sep:
        return url
    query, hash_sep, fragment = rest.partition("#")
    params = query.split("&")
    kept = [p for p in params if not _is_tracking(p)]
    if len(kept) == len(params):
        return url
    query = "&".join(kept)
    return base + ("?" + query if query else "") + hash_sep + fragment


_INDEX_ANY = re.compile(r"/index\.[A-Za-z0-9]{1,8}$")


def similar_key(key: str) -> str:
    """The key every "similar" spelling of a page shares (``dedupe_similar_urls``):
    ``key`` (a ``normalize`` result) with its leading ``www.`` labels dropped, scheme
    ``https`` when the port is the default one, and any trailing ``/index.<ext>``
    (``index.php``, ``index.asp``...) dropped like ``index.html``. Still a URL, and a
    fixed point of ``normalize``; idempotent."""
    scheme, sep, rest = key.partition("://")
    if not sep or scheme not in _DEFAULT_PORTS:
        return key
    end = len(rest)
    for c in "/?":
        i = rest.find(c)
        if i != -1 and i < end:
            end = i
    netloc, tail = rest[:end], rest[end:]
    path, qsep, query = tail.partition("?")
    while netloc.startswith("www.") and "." in netloc[4:].partition(":")[0].strip("."):
        netloc = netloc[4:]
    if not netloc.startswith("[") and ":" not in netloc:
        scheme = "https"  # no port in a key = the scheme's default port
    elif netloc.startswith("[") and "]:" not in netloc:
        scheme = "https"
    while (m := _INDEX_ANY.search(path)) is not None:
        path = path[: m.start()] or "/"
        if len(path) > 1:
            path = path.rstrip("/") or "/"
    return f"{scheme}://{netloc}{path or '/'}{qsep}{query}"


def page_key(
    url: str, *, ignore_query: bool = False, strip_tracking_params: bool = False,
    similar: bool = False,
) -> str:  # fmt: skip
    """A crawl's identity of ``url``: ``normalize``, after ``strip_tracking`` when
    asked, then ``similar_key`` when asked. ``ValueError`` as ``normalize``."""
    if strip_tracking_params:
        url = strip_tracking(url)
    key = normalize(url, ignore_query=ignore_query)
    return similar_key(key) if similar else key


USERINFO_REFUSED = "credentials in the URL are not accepted; send them as request headers"


def validate(url: str, max_length: int) -> str | None:
    """None when ``url`` is an absolute http(s) URL with a parsable host and no
    userinfo, else why not (human text)."""
    if len(url) > max_length:
        return f"longer than {max_length} characters"
    try:
        parts = urlsplit(url.strip())
        if parts.scheme.lower() not in _DEFAULT_PORTS:
            return "scheme must be http or https"
        if "@" in parts.netloc:
            return USERINFO_REFUSED
        if not parts.hostname:
            return "no host"
        _ = parts.port  # a bad port raises ValueError here
    except ValueError as exc:
        return f"unparsable: {exc}"
    if any(c in parts.hostname for c in " \t\r\n<>\\^`{|}"):
        return "unparsable: invalid character in host"
    try:
        canonical_host(_raw_host(parts.netloc))
    except ValueError as exc:
        return f"unparsable: invalid host: {exc}"
    return None


def host_of(url: str) -> str:
    """The canonical host of ``url`` (``canonical_host``) without brackets; "" when it
    has none or it cannot be parsed."""
    try:
        host = canonical_host(_raw_host(urlsplit(url).netloc))
    except ValueError:
        return ""
    return host[1:-1] if host[0] == "[" else host


def fetch_url(url: str) -> str:
    """The form of ``url`` handed to the HTTP client: lowercase scheme, canonical host,
    no userinfo, no default port, no fragment; path and query as written (so fetching
    it costs no redirect). ``ValueError`` when it is not an http(s) URL with a
    parsable host: such a URL is never fetched."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"scheme {scheme!r} is not http or https")
    netloc = _netloc(parts, scheme)
    if not netloc:
        raise ValueError("no host")
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


def strip_userinfo(url: str) -> str:
    """``url`` without the ``user:password@`` of its authority; otherwise unchanged."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if i != -1 and i < end:
            end = i
    if "@" not in rest[:end]:
        return url
    return f"{scheme}://{rest[:end].rpartition('@')[2]}{rest[end:]}"
