"""What both HTTP components (the manager's report listener and the REST API) read from an ASGI
request before deciding to read its body: the bearer token, the declared length, whether a body
is coming. Pure functions over the ASGI ``scope``; the types are ASGI's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def bearer_token(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


def declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length``, or None when it has none (the HTTP parser has already
    refused a malformed or repeated one)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            digits = value.strip().lstrip(b"0") or b"0"
            if not digits.isdigit():
                return None
            return int(digits) if len(digits) <= 18 else 10**18  # int() of 5,000 digits raises
    return None


def has_body(scope: Scope) -> bool:
    """True when a request declares a body (a length above zero, or chunks)."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.strip() not in (b"", b"0"):
            return True
        if name == b"transfer-encoding":
            return True
    return False
