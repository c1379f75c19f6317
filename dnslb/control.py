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
    why: str  # why it is or is not in the published plan's answers (as explain says it)
    location: str | None = None  # its region or site (docs/topology.md)
    # Its weight over its pool's in the published plan: the share of new answers meant for it
    intended_share: float | None = None
    # Its smoothed requests in progress over its pool's active servers': the share it carries
    delivered_share: float | None = None
    # The factor its share correction puts on its weight (None: the pool corrects no shares)
    share_correction: float | None = None


@dataclass(frozen=True, slots=True)
class LocationLoad:
    """The load of one pool's servers in one location (docs/topology.md)."""

    pool: str
    location: str
    servers: int  # servers in the location, whatever their state
    reporting: int  # of them, those with a utilization
    utilization: float | None  # their mean smoothed utilization; None: none reports


def location_loads(servers: Sequence[ServerView]) -> list[LocationLoad]:
    """Per pool and location (sorted), how loaded its servers are; servers without a location
    are left out."""
    found: dict[tuple[str, str], list[ServerView]] = {}
    for server in servers:
        if server.location is not None:
            found.setdefault((server.pool, server.location), []).append(server)
    loads = []
    for (pool, location), members in sorted(found.items()):
        values = [s.utilization for s in members if s.utilization is not None]
        mean = sum(values) / len(values) if values else None
        loads.append(LocationLoad(pool, location, len(members), len(values), mean))
    return loads


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
    answer_k: int  # addresses per answer now (k, or more while few resolvers hold answers)
    ttl_floor: int  # the answers' TTL floor now (ttl_min, or shorter while few hold answers)
    holders: float | None  # answers resolvers hold at a time (None: not counted yet)


@dataclass(frozen=True, slots=True)
class PlanView:
    plan: Plan
    published_at: float  # unix seconds
    age: float


@dataclass(frozen=True, slots=True)
class MemberExplanation:
    """One server of a pool in the published plan, and why it is or is not answered."""

    id: str
    address: str
    state: ServerState | None  # its lifecycle state; None: in the plan, no longer managed
    plan_state: str | None  # its state in the published plan; None: not in it
    in_answers: bool  # in at least one answer of the published plan's rotation
    weight: float | None  # in the published plan
    ttl: int | None
    utilization: float | None  # smoothed, now
    first_share: float  # share of its family's answers it comes first in (0 to 1)
    answer_share: float  # share of its family's answers it is in (0 to 1)
    paused: bool  # by the policy (above th_over)
    admin_paused: bool
    why: str


@dataclass(frozen=True, slots=True)
class AnswerExample:
    """One answer of a pool's rotation (one address family), as a client gets it."""

    family: str  # "A" or "AAAA"
    members: tuple[str, ...]  # server ids, in the answer's order
    addresses: tuple[str, ...]
    ttl: int
    fallback: bool  # chosen by the pool's fallback (no member of the family is active)
    rotation: int  # answers in the rotation this one is taken from


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a load-balanced name answers as it does: its members and an answer of now."""

    name: str  # the DNS name
    pool: str
    plan_version: int
    plan_age: float | None
    stale: bool  # older than its stale_after: answers carry the TTL floor
    k: int
    ttl_floor: int
    fallback: str
    th_over: float
    pause_above: float | None  # th_over, or higher for a warm pool; None: a hot pool pauses none
    resume_below: float | None  # pause_above - hysteresis
    members: tuple[MemberExplanation, ...]
    answers: tuple[AnswerExample, ...]


@dataclass(frozen=True, slots=True)
class ServerSample:
    """One server over one interval of the history."""

    id: str
    state: ServerState  # at the end of the interval
    utilization: float | None  # mean of the ticks' smoothed utilization; None: no report
    weight: float | None  # in the plan at the end of the interval; None: not answered
    ttl: int | None
    paused: bool  # paused (policy or operator) at any tick of the interval


@dataclass(frozen=True, slots=True)
class PoolSample:
    """One pool over one interval of the history, ending at ``time``."""

    time: float  # unix seconds
    pool: str
    servers: Mapping[str, int]  # servers by state at the end (terminated left out)
    cost_seconds: float  # the pool's server-seconds so far
    members: tuple[ServerSample, ...]


@dataclass(frozen=True, slots=True)
class History:
    """The manager's recent past, oldest first: a bounded ring of samples per pool."""

    resolution: float  # seconds per sample
    retention: float  # seconds the ring holds
    samples: tuple[PoolSample, ...]


@dataclass(frozen=True, slots=True)
class ManagerStats:
    """Process-level figures for the metrics."""

    plan_version: int
    plan_age: float | None
    tick_seconds: float  # duration of the last tick
    tick_errors: int
    reports: Mapping[str, int]  # report outcomes: accepted, bad_token, stale_seq...
    ready: bool
    role: str = "leader"  # "leader" or "standby" (managers in active/standby)
    epoch: int = 0  # the leadership epoch this manager leads in (0: no lease: SQLite)


@dataclass(frozen=True, slots=True)
class PoolTelemetry:
    """One pool's figures for the alerting rules (``deploy/prometheus/dnslb.rules.yml``)."""

    name: str
    plan_members: Mapping[str, int]  # members of the published plan by plan state; {}: no plan
    left_out: int  # servers left out of the plan for data a pipe backend would refuse
    launches: int | None  # launches asked of its provider since the manager started; None: none
    launch_failures: int | None
    launch_backoff: bool  # launching paused after too many failures in a row


@dataclass(frozen=True, slots=True)
class ClusterTelemetry:
    """One single-IP cluster's figures for the alerting rules."""

    name: str
    failovers: int  # tables installed by failover since the manager started
    tick_errors: Mapping[str, int]  # parts of its controller's ticks that failed, by part
    nodes_alive: Mapping[str, bool]  # node id -> alive (heard from within failover_after)


@dataclass(frozen=True, slots=True)
class Telemetry:
    """Figures that only ``/metrics`` shows, for the alerting rules. Counts run since the
    manager started."""

    plan_refresh: float  # seconds: an unchanged plan is republished this often
    plan_stale_after: float  # seconds: pipe backends answer with TTL floors past this age
    plan_refused: bool  # the newest plan is not published: a pipe backend would refuse it
    plans_refused: int
    publish_errors: int  # publications the plan store refused or did not answer
    store_up: bool | None  # the last publication succeeded; None: none tried yet
    tick_part_errors: Mapping[str, int]  # parts of ticks that failed, by part
    first_answers: Mapping[str, int]  # server id -> answers it came first in (pipe backends)
    pools: tuple[PoolTelemetry, ...]
    clusters: tuple[ClusterTelemetry, ...]


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

    def telemetry(self) -> Telemetry: ...

    def explain(self, name: str) -> Explanation:
        """Why ``name`` (a pool's name or DNS name) answers as it does, from the published plan;
        :class:`NotFound` for no such pool or no plan yet."""
        ...

    def history(self, *, pool: str | None = None, since: float | None = None) -> History:
        """Samples newer than ``since`` (unix seconds), oldest first."""
        ...
