"""What the REST API, the metrics and the dashboard may ask of the manager, and what they get.

The API (package ``api``) is served by the manager's process but imports only this module: the
manager hands it an object implementing :class:`ManagerControl`. Reading is synchronous (the
manager's state is in memory); changes are ``async`` (they may wait for a provider). Views are
frozen snapshots; actions go through the manager (validated, persisted, reflected in the next
plan). Errors are
:class:`NotFound`, :class:`Conflict` and :class:`~dnslb.errors.ConfigError` (invalid input, with
every problem named), which the API maps to 404, 409 and 422.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from dnslb.errors import DnslbError
from dnslb.model import Event, ServerState
from dnslb.plan import Plan


class NotFound(DnslbError):
    """No pool or server by that name."""


class Conflict(DnslbError):
    """The request contradicts the current state (a pool that exists, a static pool to scale...)."""


class AdminAction(StrEnum):
    """What an operator can do to a server. Admin actions win over the policy until cleared."""

    PAUSE = "pause"  # out of answers, still healthy and measured; until resume
    RESUME = "resume"
    DISABLE = "disable"  # out of answers whatever its health; until enable
    ENABLE = "enable"  # back to warming: answered after a fresh healthy report
    DRAIN = "drain"  # out of answers; a launched server is then terminated


@dataclass(frozen=True, slots=True)
class ServerView:
    """One server as operators see it."""

    id: str
    pool: str
    address: str
    check_address: str | None
    origin: str  # "static" or the provider that launched it
    state: ServerState
    state_reason: str
    state_since: float  # unix seconds
    created_at: float
    utilization: float | None  # smoothed; None before the first report
    in_progress: int | None
    max_concurrency: int | None
    weight: float | None  # in the last published plan; None when not answered
    ttl: int | None
    paused: bool  # by the policy (above th_over)
    admin_paused: bool
    report_age: float | None  # seconds since its last report
    cost_seconds: float  # server-seconds so far
    served: int  # requests served while known to this manager
    answers: int | None  # answers that held it, counted by the pipe backends (None: unknown)


@dataclass(frozen=True, slots=True)
class PoolView:
    """One pool as operators see it."""

    name: str
    dns_name: str
    zone: str
    source: str  # "config" (from the file) or "api" (created at runtime)
    provider: str | None
    spec: Mapping[str, Any]  # the pool's configuration as a JSON-ready document
    servers: Mapping[str, int]  # servers by state
    cost_seconds: float  # including terminated servers
    served: int
    scale_events: int
    mean_ttl: float | None  # mean TTL of the answers in the last plan (by weight)


@dataclass(frozen=True, slots=True)
class PlanView:
    plan: Plan
    published_at: float  # unix seconds
    age: float


@dataclass(frozen=True, slots=True)
class ManagerStats:
    """Process-level figures for the metrics."""

    plan_version: int
    plan_age: float | None
    tick_seconds: float  # duration of the last tick
    tick_errors: int
    reports: Mapping[str, int]  # report outcomes: accepted, bad_token, stale_seq...
    ready: bool


class ManagerControl(Protocol):
    """The manager, as the API sees it."""

    def pools(self) -> Sequence[PoolView]: ...

    def pool(self, name: str) -> PoolView: ...

    async def create_pool(self, spec: Mapping[str, Any]) -> PoolView: ...

    async def update_pool(self, name: str, spec: Mapping[str, Any]) -> PoolView: ...

    async def delete_pool(self, name: str) -> None: ...

    def servers(self, pool: str | None = None) -> Sequence[ServerView]: ...

    def server(self, server_id: str) -> ServerView: ...

    async def add_member(self, pool: str, member: Mapping[str, Any]) -> ServerView: ...

    async def remove_member(self, server_id: str) -> None: ...

    async def act(self, server_id: str, action: AdminAction, reason: str) -> ServerView: ...

    def plan(self) -> PlanView | None: ...

    def events(
        self,
        *,
        pool: str | None = None,
        server: str | None = None,
        kinds: Sequence[str] = (),
        before_id: int | None = None,
        limit: int = 100,
    ) -> Sequence[Event]: ...

    def stats(self) -> ManagerStats: ...
