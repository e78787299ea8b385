"""Ed25519 for the registry: a pair's signing key, and the check of a record's signature.

What it owns
------------
- ``RecordSigner``: a pair's private key, read from a PEM file (PKCS#8, as
  ``openssl genpkey -algorithm ed25519`` writes it; config key
  ``cluster_signing_key_file``), with its raw public key and ``key_id``; ``sign(message)``.
- ``verify_signature(public_key, message, signature)``: whether ``signature`` is
  ``public_key``'s over ``message`` (the ``verify`` that ``registry.open_record`` takes).
- ``new_private_key_pem()``: a fresh key as PEM (tests, and operators without openssl).

The library is ``cryptography`` (OpenSSL's Ed25519): the ``cluster`` and ``server``
extras install it, and only cluster code imports this module (a client imports it when
it reads a registry, as it imports aetcd), so a plain client install never needs it.

Why it is safe
--------------
Ed25519 signatures are deterministic and verification is strict (RFC 8032, no
malleable encodings accepted by OpenSSL); a key file that is not an Ed25519 private key
is refused with ``ValueError`` naming the file, never used as something else.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from pagesift.core.cluster.members import key_id

__all__ = ["RecordSigner", "new_private_key_pem", "verify_signature"]


class RecordSigner:
    """A pair's Ed25519 private key (see the module docstring)."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.key_id = key_id(self.public_key)

    @classmethod
    def from_pem(cls, pem: bytes, where: str = "signing key") -> RecordSigner:
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: not a PEM private key without a password: {e}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{where}: is a {type(key).__name__}, not an Ed25519 private key")
        return cls(key)

    @classmethod
    def from_file(cls, path: str | Path) -> RecordSigner:
        try:
            pem = Path(path).read_bytes()
        except OSError as e:
            raise ValueError(f"signing key {path}: {e}") from None
        return cls.from_pem(pem, f"signing key {path}")

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``public_key``'s (raw Ed25519) over ``message``."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def new_private_key_pem() -> bytes:
    """A fresh Ed25519 private key, PEM (PKCS#8, unencrypted)."""
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
