"""Bearer tokens with roles, checked before any route runs.

Every request needs a token except a short public list (the dashboard's static files, which hold
no data, and ``/metrics`` when configured public). ``GET`` and ``HEAD`` need the ``read`` role
(the OpenAPI document too: it lists every path); every other method needs ``admin``. The rule is
by method, not by route, so a new mutating route cannot be left open, and it runs before routing
and body parsing, so a caller without a token learns nothing (not even which paths exist, whether
a pool exists or a body is malformed). A refused request's body is never read: when one is on
the way, the answer closes the connection instead of draining it.

Tokens are kept as SHA-256 hashes and compared in constant time against every stored hash. They
are never logged; a refused request's body says why without echoing the token.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from dnslb.asgi import ASGIApp, Receive, Scope, Send, bearer_token, has_body
from dnslb.tokens import token_hash

SAFE_METHODS = frozenset({"GET", "HEAD"})
PUBLIC_PATHS = frozenset({"/"})
PUBLIC_PREFIXES = ("/dashboard/",)


class Role(StrEnum):
    READ = "read"  # every GET: views, events, plan, costs, metrics
    ADMIN = "admin"  # also every change

    def allows(self, needed: Role) -> bool:
        return self is Role.ADMIN or needed is Role.READ


@dataclass(frozen=True, slots=True)
class ApiAuth:
    """The API's tokens (as hashes) and what is public."""

    hashes: tuple[tuple[str, Role], ...] = ()
    metrics_public: bool = False

    @classmethod
    def from_tokens(
        cls, tokens: Iterable[tuple[str, Role | str]], *, metrics_public: bool = False
    ) -> ApiAuth:
        """From ``(token, role)`` pairs; only the tokens' hashes are kept."""
        return cls(
            hashes=tuple((token_hash(token), Role(role)) for token, role in tokens),
            metrics_public=metrics_public,
        )

    def role_of(self, token: str) -> Role | None:
        """The role ``token`` holds, or None; compares with every stored hash in constant time."""
        presented = token_hash(token)
        found: Role | None = None
        for stored, role in self.hashes:
            if hmac.compare_digest(presented, stored) and found is None:
                found = role
        return found

    def needed(self, method: str, path: str) -> Role | None:
        """The role a request needs, or None when it is public."""
        if method not in SAFE_METHODS:
            return Role.ADMIN
        if path in PUBLIC_PATHS or path == "/dashboard" or path.startswith(PUBLIC_PREFIXES):
            return None
        if path == "/metrics" and self.metrics_public:
            return None
        return Role.READ


class BearerAuth:
    """ASGI middleware refusing requests without the role they need (401, 403)."""

    def __init__(self, app: ASGIApp, auth: ApiAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        needed = self.auth.needed(scope["method"], scope["path"])
        if needed is None:
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        close = has_body(scope)
        if token is None:
            await _refuse(send, 401, "missing bearer token (Authorization: Bearer TOKEN)", close)
            return
        role = self.auth.role_of(token)
        if role is None:
            await _refuse(send, 401, "token not valid for the API", close)
            return
        if not role.allows(needed):
            await _refuse(
                send,
                403,
                f"{scope['method']} needs the {needed.value} role; this token has {role.value}",
                close,
            )
            return
        await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, message: str, close: bool) -> None:
    payload = json.dumps({"error": message, "problems": []}).encode("utf-8")
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode("ascii")),
    ]
    if close:  # its body is still on the way: not worth reading
        headers.append((b"connection", b"close"))
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="dnslb"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
