"""Bearer tokens: how they are stored (a hash, never the token) and compared (in constant time)."""

from __future__ import annotations

import hashlib
import hmac
import secrets


def new_token() -> str:
    """A fresh random token (192 bits, URL-safe)."""
    return secrets.token_urlsafe(24)


def token_hash(token: str) -> str:
    """The SHA-256 of a token, as stored in the state database and in cloud tags."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_matches(token: str, stored_hash: str | None) -> bool:
    """True when ``token`` hashes to ``stored_hash`` (compared in constant time)."""
    if stored_hash is None:
        return False
    return hmac.compare_digest(token_hash(token), stored_hash)
