"""The API's documents: pydantic models mirroring the frozen views of :mod:`dnslb.control`.

Each response model has exactly the fields of its view (a test holds them equal, and
``extra="forbid"`` makes a view with a new field fail loudly rather than lose it), so the OpenAPI
schema states precisely what a client gets.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from dnslb.control import AdminAction, ManagerStats, PoolView, ServerView
from dnslb.model import Event, ServerState

_STRICT = ConfigDict(extra="forbid")


def _fields_of(view: Any) -> dict[str, Any]:
    return {field.name: getattr(view, field.name) for field in dataclasses.fields(view)}


class Problem(BaseModel):
    """One thing wrong with a request, with the field it concerns when there is one."""

    model_config = _STRICT
    field: str | None = Field(description="where: a JSON path (members[0].address) or a parameter")
    message: str


class ErrorBody(BaseModel):
    """Every error answer: what went wrong, and each problem when there are several."""

    model_config = _STRICT
    error: str
    problems: list[Problem] = Field(default_factory=list)


class ServerOut(BaseModel):
    """A server as operators see it (:class:`dnslb.control.ServerView`)."""

    model_config = _STRICT
    id: str
    pool: str
    address: str
    check_address: str | None
    origin: str = Field(description='"static", or the provider that launched it')
    state: ServerState
    state_reason: str
    state_since: float = Field(description="unix seconds")
    created_at: float = Field(description="unix seconds")
    utilization: float | None = Field(description="smoothed; null before the first report")
    in_progress: int | None
    max_concurrency: int | None
    weight: float | None = Field(description="in the last published plan; null when not answered")
    ttl: int | None = Field(description="seconds, in the last published plan")
    paused: bool = Field(description="paused by the policy (utilization above th_over)")
    admin_paused: bool = Field(description="paused by an operator")
    report_age: float | None = Field(description="seconds since its agent's last report")
    cost_seconds: float = Field(description="server-seconds so far")
    served: int = Field(description="requests served while known to this manager")
    answers: int | None = Field(description="DNS answers that held it; null: not counted")

    @classmethod
    def of(cls, view: ServerView) -> Self:
        return cls(**_fields_of(view))


class PoolOut(BaseModel):
    """A pool as operators see it (:class:`dnslb.control.PoolView`)."""

    model_config = _STRICT
    name: str
    dns_name: str
    zone: str
    source: str = Field(description='"config" (the file; read-only here) or "api"')
    provider: str | None
    spec: dict[str, Any] = Field(description="the pool's configuration, as PUT accepts it")
    servers: dict[str, int] = Field(description="servers by state (terminated ones left out)")
    cost_seconds: float = Field(description="server-seconds, terminated servers included")
    served: int
    scale_events: int
    mean_ttl: float | None = Field(description="mean TTL of its answers in the last plan")

    @classmethod
    def of(cls, view: PoolView) -> Self:
        fields = _fields_of(view)
        fields["spec"] = dict(view.spec)
        fields["servers"] = dict(view.servers)
        return cls(**fields)


class EventOut(BaseModel):
    """Something that happened, and why (:class:`dnslb.model.Event`)."""

    model_config = _STRICT
    id: int | None
    time: float = Field(description="unix seconds")
    kind: str = Field(description="state, paused, resumed, scale_out, scale_in, admin_pause...")
    reason: str
    pool: str | None
    server: str | None

    @classmethod
    def of(cls, event: Event) -> Self:
        return cls(**_fields_of(event))


class EventPage(BaseModel):
    """Events newest first; ask for the next page with ``before_id=next_before_id``."""

    model_config = _STRICT
    events: list[EventOut]
    next_before_id: int | None = Field(description="null on the last page")


class PlanOut(BaseModel):
    """The plan the pipe backends serve now (format: docs/plan.md)."""

    model_config = _STRICT
    version: int
    published_at: float = Field(description="unix seconds")
    age: float = Field(description="seconds since it was published")
    stale: bool = Field(description="older than its stale_after: served with TTL floors")
    plan: dict[str, Any]


class StatsOut(BaseModel):
    """The manager process (:class:`dnslb.control.ManagerStats`)."""

    model_config = _STRICT
    plan_version: int
    plan_age: float | None
    tick_seconds: float = Field(description="duration of the last tick")
    tick_errors: int
    reports: dict[str, int] = Field(description="agent reports by outcome")
    ready: bool

    @classmethod
    def of(cls, stats: ManagerStats) -> Self:
        fields = _fields_of(stats)
        fields["reports"] = dict(stats.reports)
        return cls(**fields)


class StatusOut(BaseModel):
    """One look at the whole manager."""

    model_config = _STRICT
    manager: StatsOut
    pools: int
    servers: dict[str, int] = Field(description="servers by state, every pool")
    paused: int = Field(description="servers paused by the policy or an operator")


class ServerCost(BaseModel):
    model_config = _STRICT
    server: str
    state: ServerState
    server_seconds: float
    served: int
    requests_per_cost: float | None = Field(description="requests served per server-second")


class PoolCost(BaseModel):
    model_config = _STRICT
    pool: str
    server_seconds: float = Field(description="terminated servers included")
    served: int
    requests_per_cost: float | None = Field(description="requests served per server-second")
    servers: list[ServerCost] = Field(description="the servers it has now")


class CostReport(BaseModel):
    """Cost as the research counts it: server-seconds, and requests served per server-second."""

    model_config = _STRICT
    pools: list[PoolCost]
    server_seconds: float
    served: int
    requests_per_cost: float | None


class ActionRequest(BaseModel):
    """An operator's action on a server; it wins over the policy until cleared."""

    model_config = _STRICT
    action: AdminAction = Field(
        description="pause/resume: out of answers, still measured; disable/enable: out whatever "
        "its health; drain: out of answers, then terminated if launched"
    )
    reason: str = Field("", max_length=500, description="kept in the event log")
