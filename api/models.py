"""The API's documents: pydantic models mirroring the frozen views of :mod:`dnslb.control`.

Each response model has exactly the fields of its view (a test holds them equal, and
``extra="forbid"`` makes a view with a new field fail loudly rather than lose it), so the OpenAPI
schema states precisely what a client gets.

What a view holds comes, in the end, from agents, pipe backends and clouds. The checks where it
entered bound it, and these models do not count on it: whatever a view holds, its document can be
written, so a bad value shows as a bounded one instead of turning the answer into a 500. Integers
are clamped to the signed 64-bit range (what JSON readers and Prometheus keep), other numbers to
the finite floats; NaN and what is not a number at all become null where the field may be null,
else 0; text with a lone surrogate (which UTF-8 cannot carry) has it replaced by U+FFFD.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from dnslb.control import (
    AdminAction,
    AnswerExample,
    Explanation,
    History,
    LocationLoad,
    ManagerStats,
    MemberExplanation,
    PoolSample,
    PoolView,
    ServerSample,
    ServerView,
)
from dnslb.model import Event, ServerState

_STRICT = ConfigDict(extra="forbid")

MAX_INT = 2**63 - 1
MIN_INT = -(2**63)
MAX_FLOAT = sys.float_info.max


def bounded_int(value: object) -> int | None:
    """``value`` as an integer in the signed 64-bit range (clamped), or None if not a number."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return None
        value = MAX_INT if value > MAX_INT else MIN_INT if value < MIN_INT else int(value)
    if not isinstance(value, int):
        return None
    return max(MIN_INT, min(MAX_INT, value))


def bounded_float(value: object) -> float | None:
    """``value`` as a finite float (clamped), or None when it is NaN or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        if value > MAX_FLOAT:
            return MAX_FLOAT
        if value < -MAX_FLOAT:
            return -MAX_FLOAT
        return float(value)
    if math.isnan(value):
        return None
    return max(-MAX_FLOAT, min(MAX_FLOAT, value))


def _printable(value: object) -> object:
    if isinstance(value, str) and not value.isascii():
        return "".join("\ufffd" if 0xD800 <= ord(char) <= 0xDFFF else char for char in value)
    return value


def _document(value: object) -> object:
    """A JSON document made writable: every number bounded, every text printable."""
    if isinstance(value, dict):
        return {str(_printable(key)): _document(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_document(item) for item in value]
    if isinstance(value, str):
        return _printable(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return bounded_int(value)
    if isinstance(value, float):
        return bounded_float(value)
    return value


def _count(value: object) -> int:
    bounded = bounded_int(value)
    return 0 if bounded is None else bounded


def _real(value: object) -> float:
    bounded = bounded_float(value)
    return 0.0 if bounded is None else bounded


def _counts(value: object) -> object:
    if isinstance(value, dict):
        return {str(_printable(key)): _count(item) for key, item in value.items()}
    return value


Count = Annotated[int, BeforeValidator(_count)]
MaybeCount = Annotated[int | None, BeforeValidator(bounded_int)]
Real = Annotated[float, BeforeValidator(_real)]
MaybeReal = Annotated[float | None, BeforeValidator(bounded_float)]
Text = Annotated[str, BeforeValidator(_printable)]
MaybeText = Annotated[str | None, BeforeValidator(_printable)]
Document = Annotated[dict[str, Any], BeforeValidator(_document)]
Counts = Annotated[dict[str, int], BeforeValidator(_counts)]


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
    id: Text
    pool: Text
    address: Text
    check_address: MaybeText
    origin: Text = Field(description='"static", or the provider that launched it')
    state: ServerState
    state_reason: Text
    state_since: Real = Field(description="unix seconds")
    created_at: Real = Field(description="unix seconds")
    utilization: MaybeReal = Field(description="smoothed; null before the first report")
    in_progress: MaybeCount
    max_concurrency: MaybeCount
    weight: MaybeReal = Field(description="in the last published plan; null when not answered")
    ttl: MaybeCount = Field(description="seconds, in the last published plan")
    paused: bool = Field(description="paused by the policy (utilization above th_over)")
    admin_paused: bool = Field(description="paused by an operator")
    report_age: MaybeReal = Field(description="seconds since its agent's last report")
    cost_seconds: Real = Field(description="server-seconds so far")
    served: Count = Field(description="requests served while known to this manager")
    answers: MaybeCount = Field(description="DNS answers that held it; null: not counted")
    why: Text = Field(description="why it is or is not in the published plan's answers")
    location: MaybeText = Field(None, description="its region or site; null: none")
    intended_share: MaybeReal = Field(
        None, description="its weight over its pool's in the plan: the share of answers for it"
    )
    delivered_share: MaybeReal = Field(
        None,
        description="its smoothed requests in progress over its pool's active servers': the "
        "share of the pool's load it carries",
    )
    share_correction: MaybeReal = Field(
        None, description="the factor the share correction puts on its weight; null: off"
    )

    @classmethod
    def of(cls, view: ServerView) -> Self:
        return cls(**_fields_of(view))


class PoolOut(BaseModel):
    """A pool as operators see it (:class:`dnslb.control.PoolView`)."""

    model_config = _STRICT
    name: Text
    dns_name: Text
    zone: Text
    source: Text = Field(description='"config" (the file; read-only here) or "api"')
    provider: MaybeText
    spec: Document = Field(description="the pool's configuration, as PUT accepts it")
    servers: Counts = Field(description="servers by state (terminated ones left out)")
    cost_seconds: Real = Field(description="server-seconds, terminated servers included")
    served: Count
    scale_events: Count
    mean_ttl: MaybeReal = Field(description="mean TTL of its answers in the last plan")
    answer_k: Count = Field(
        description="addresses per answer now: the policy's k, or more while few resolvers "
        "hold the pool's answers (k_coverage)"
    )
    ttl_floor: Count = Field(
        description="the TTL floor of its answers now: the policy's ttl_min, or shorter while "
        "few resolvers hold the pool's answers (k_coverage)"
    )
    holders: MaybeReal = Field(
        description="answers resolvers hold at a time, from the pipe backends' counts over the "
        "last minute (null: not counted yet)"
    )

    @classmethod
    def of(cls, view: PoolView) -> Self:
        fields = _fields_of(view)
        fields["spec"] = dict(view.spec)
        fields["servers"] = dict(view.servers)
        return cls(**fields)


class EventOut(BaseModel):
    """Something that happened, and why (:class:`dnslb.model.Event`)."""

    model_config = _STRICT
    id: MaybeCount
    time: Real = Field(description="unix seconds")
    kind: Text = Field(description="state, paused, resumed, scale_out, scale_in, admin_pause...")
    reason: Text = Field(description="why (a state change: why it changed)")
    pool: MaybeText
    server: MaybeText
    from_state: ServerState | None = Field(
        description="a state change (kind state): the state the server left; else null"
    )
    to_state: ServerState | None = Field(
        description="a state change (kind state): the state the server entered; else null"
    )

    @classmethod
    def of(cls, event: Event) -> Self:
        return cls(**_fields_of(event))


class EventPage(BaseModel):
    """Events newest first; ask for the next page with ``before_id=next_before_id``."""

    model_config = _STRICT
    events: list[EventOut]
    next_before_id: MaybeCount = Field(description="null on the last page")


class PlanOut(BaseModel):
    """The plan the pipe backends serve now (format: docs/plan.md)."""

    model_config = _STRICT
    version: Count
    published_at: Real = Field(description="unix seconds")
    age: Real = Field(description="seconds since it was published")
    stale: bool = Field(description="older than its stale_after: served with TTL floors")
    plan: Document


class StatsOut(BaseModel):
    """The manager process (:class:`dnslb.control.ManagerStats`)."""

    model_config = _STRICT
    plan_version: Count
    plan_age: MaybeReal
    tick_seconds: Real = Field(description="duration of the last tick")
    tick_errors: Count
    reports: Counts = Field(description="agent reports by outcome")
    ready: bool
    role: Literal["leader", "standby"] = Field(
        description="standby: another manager leads; this one serves reads only"
    )
    epoch: Count = Field(description="the leadership epoch it leads in (0: SQLite, no lease)")

    @classmethod
    def of(cls, stats: ManagerStats) -> Self:
        fields = _fields_of(stats)
        fields["reports"] = dict(stats.reports)
        return cls(**fields)


class LocationLoadOut(BaseModel):
    """The load of one pool's servers in one location (:class:`dnslb.control.LocationLoad`)."""

    model_config = _STRICT
    pool: Text
    location: Text
    servers: Count = Field(description="servers in the location, whatever their state")
    reporting: Count = Field(description="of them, those with a utilization")
    utilization: MaybeReal = Field(description="their mean smoothed utilization")

    @classmethod
    def of(cls, view: LocationLoad) -> Self:
        return cls(**_fields_of(view))


class StatusOut(BaseModel):
    """One look at the whole manager."""

    model_config = _STRICT
    manager: StatsOut
    pools: Count
    servers: Counts = Field(description="servers by state, every pool")
    paused: Count = Field(description="servers paused by the policy or an operator")
    locations: list[LocationLoadOut] = Field(
        default_factory=list, description="per pool and location, its servers' load"
    )


class ServerCost(BaseModel):
    model_config = _STRICT
    server: Text
    state: ServerState
    server_seconds: Real
    served: Count
    requests_per_cost: MaybeReal = Field(description="requests served per server-second")


class PoolCost(BaseModel):
    model_config = _STRICT
    pool: Text
    server_seconds: Real = Field(description="terminated servers included")
    served: Count
    requests_per_cost: MaybeReal = Field(description="requests served per server-second")
    servers: list[ServerCost] = Field(description="the servers it has now")


class CostReport(BaseModel):
    """Cost as the research counts it: server-seconds, and requests served per server-second."""

    model_config = _STRICT
    pools: list[PoolCost]
    server_seconds: Real
    served: Count
    requests_per_cost: MaybeReal


class MemberExplanationOut(BaseModel):
    """A server of the pool and its standing in the published plan."""

    model_config = _STRICT
    id: Text
    address: Text
    state: ServerState | None = Field(description="lifecycle state; null: no longer managed")
    plan_state: MaybeText = Field(description="its state in the published plan; null: not in it")
    in_answers: bool = Field(description="in at least one answer of the plan's rotation")
    weight: MaybeReal = Field(description="in the published plan")
    ttl: MaybeCount = Field(description="seconds, in the published plan")
    utilization: MaybeReal = Field(description="smoothed, now; null before the first report")
    first_share: Real = Field(description="share of its family's answers it comes first in")
    answer_share: Real = Field(description="share of its family's answers it is in")
    paused: bool = Field(description="paused by the policy (utilization above th_over)")
    admin_paused: bool = Field(description="paused by an operator")
    why: Text = Field(description="why it is or is not answered")

    @classmethod
    def of(cls, view: MemberExplanation) -> Self:
        return cls(**_fields_of(view))


class AnswerExampleOut(BaseModel):
    """One answer of the rotation: what a client may get now (each pipe backend walks the
    rotation from a random place)."""

    model_config = _STRICT
    family: Text = Field(description="A or AAAA")
    members: list[Text] = Field(description="server ids, in the answer's order")
    addresses: list[Text]
    ttl: Count
    fallback: bool = Field(description="chosen by the pool's fallback: no member is active")
    rotation: Count = Field(description="answers in the rotation it is one of")

    @classmethod
    def of(cls, view: AnswerExample) -> Self:
        fields = _fields_of(view)
        fields["members"] = list(view.members)
        fields["addresses"] = list(view.addresses)
        return cls(**fields)


class ExplanationOut(BaseModel):
    """Why a name answers as it does (:class:`dnslb.control.Explanation`)."""

    model_config = _STRICT
    name: Text = Field(description="the DNS name")
    pool: Text
    plan_version: Count
    plan_age: MaybeReal = Field(description="seconds since the plan was published")
    stale: bool = Field(description="older than its stale_after: answers carry the TTL floor")
    k: Count = Field(description="addresses per answer, at most")
    ttl_floor: Count
    fallback: Text
    th_over: Real = Field(description="the policy's th_over")
    pause_above: MaybeReal = Field(
        description="utilization above which the policy pauses a server now: th_over, or "
        "pause_relative x the pool's mean when higher; null while the pool's mean is at "
        "th_over or above (a hot pool pauses none)"
    )
    resume_below: MaybeReal = Field(
        description="a paused server resumes below this (pause_above - hysteresis; null: at "
        "its next report)"
    )
    members: list[MemberExplanationOut]
    answers: list[AnswerExampleOut] = Field(description="one answer per address family")

    @classmethod
    def of(cls, view: Explanation) -> Self:
        fields = _fields_of(view)
        fields["members"] = [MemberExplanationOut.of(member) for member in view.members]
        fields["answers"] = [AnswerExampleOut.of(answer) for answer in view.answers]
        return cls(**fields)


class ServerSampleOut(BaseModel):
    """One server over one interval (:class:`dnslb.control.ServerSample`)."""

    model_config = _STRICT
    id: Text
    state: ServerState = Field(description="at the end of the interval")
    utilization: MaybeReal = Field(description="mean over the interval's ticks")
    weight: MaybeReal = Field(description="in the plan at the end; null: not answered")
    ttl: MaybeCount
    paused: bool = Field(description="paused (policy or operator) at any tick of the interval")

    @classmethod
    def of(cls, view: ServerSample) -> Self:
        return cls(**_fields_of(view))


class PoolSampleOut(BaseModel):
    """One pool over one interval, ending at ``time`` (:class:`dnslb.control.PoolSample`)."""

    model_config = _STRICT
    time: Real = Field(description="unix seconds: the end of the interval")
    pool: Text
    servers: Counts = Field(description="servers by state at the end (terminated left out)")
    cost_seconds: Real = Field(description="the pool's server-seconds so far")
    members: list[ServerSampleOut]

    @classmethod
    def of(cls, view: PoolSample) -> Self:
        fields = _fields_of(view)
        fields["servers"] = dict(view.servers)
        fields["members"] = [ServerSampleOut.of(member) for member in view.members]
        return cls(**fields)


class HistoryOut(BaseModel):
    """The manager's recent past, oldest first (:class:`dnslb.control.History`)."""

    model_config = _STRICT
    resolution: Real = Field(description="seconds per sample")
    retention: Real = Field(description="seconds of history the manager keeps")
    samples: list[PoolSampleOut]

    @classmethod
    def of(cls, view: History) -> Self:
        return cls(
            resolution=view.resolution,
            retention=view.retention,
            samples=[PoolSampleOut.of(sample) for sample in view.samples],
        )


class ActionRequest(BaseModel):
    """An operator's action on a server; it wins over the policy until cleared."""

    model_config = _STRICT
    action: AdminAction = Field(
        description="pause/resume: out of answers, still measured; disable/enable: out whatever "
        "its health; drain: out of answers, then terminated if launched"
    )
    reason: str = Field("", max_length=500, description="kept in the event log")
