"""The manager's view of its servers in memory: durable records plus what reports and checks say.

:class:`Fleet` holds every pool and server. Durable facts live in each server's
:class:`~manager.state.ServerRecord` (saved on every change through :meth:`Fleet.transition` and
friends, each change also an event); fast-moving facts (the newest report, the policy's load, the
health check's verdict) stay in memory and are rebuilt from fresh reports after a restart.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field

from dnslb.config import Secret
from dnslb.model import Event, ServerState
from dnslb.policy import PoolPolicy, ServerLoad, capacity_limit
from dnslb.report import MAX_SERVED, Report
from dnslb.tokens import token_hash, token_matches
from manager.config import PoolConfig
from manager.state import ServerRecord, Store


@dataclass(slots=True)
class CheckStatus:
    """An active health check's running verdict (rise/fall counting)."""

    healthy: bool | None = None  # None until the check has decided once
    passes: int = 0
    failures: int = 0
    last_error: str = ""


@dataclass(slots=True)
class ServerRuntime:
    """One server: its durable record and what is known about it right now."""

    record: ServerRecord
    report: Report | None = None
    report_at: float | None = None  # monotonic time the newest report arrived
    load: ServerLoad | None = None
    folded_seq: int = -1  # seq of the newest report folded into ``load``
    check: CheckStatus = field(default_factory=CheckStatus)
    paused: bool = False  # the policy's verdict at the last tick
    answered_until: float | None = None  # wall time the last answer holding it expires
    served: int = 0  # requests served while known to this manager (from served_total)
    served_total_seen: int | None = None  # the agent's counter at its newest report
    # Its share correction: the log of the factor on its weight (dnslb.policy.correct_shares)
    share: float = 0.0
    # ((id, address), problems) of its plan member: see manager.planner._member_problems
    member_check: tuple[tuple[str, str], tuple[str, ...]] | None = None
    # The most max concurrency its reports count for (PoolConfig.capacity_spread times its
    # pool's median, set each tick by PoolRuntime.bound_capacities); None: no bound yet
    capacity_limit: int | None = None

    def count_served(self, total: int | None) -> None:
        """Fold an agent's ``served_total`` counter in; a counter that went back restarted."""
        if total is None:
            return
        previous = self.served_total_seen
        if previous is not None:
            added = total - previous if total >= previous else total
            # Capped: an agent may report any counter up to MAX_SERVED, over and over again.
            self.served = min(MAX_SERVED, self.served + added)
        self.served_total_seen = total

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def state(self) -> ServerState:
        return self.record.state

    @property
    def max_concurrency(self) -> int | None:
        """The max concurrency it counts for: configured (trusted), else reported, at most its
        ``capacity_limit`` (an agent may say anything, and weights and pool capacity follow it)."""
        if self.record.max_concurrency is not None:
            return self.record.max_concurrency
        reported = self.report.max_concurrency if self.report is not None else None
        limit = self.capacity_limit
        if reported is not None and limit is not None and reported > limit:
            return limit
        return reported

    @property
    def capacity_bounded(self) -> bool:
        """Whether its reported max concurrency counts for less than it says."""
        return (
            self.record.max_concurrency is None
            and self.report is not None
            and self.max_concurrency != self.report.max_concurrency
        )


HELD_WINDOW = 60.0
"""Seconds of answers over which the resolvers holding a pool's answers are counted."""
HELD_MIN_SPAN = 20.0
"""Seconds of answers counted at least before the count is used (the pipe backends write
their counts every 5 s)."""


class HeldAnswers:
    """How many resolvers hold a pool's answers at a time, from the seconds of answers the pipe
    backends gave (their TTLs added up, per address family, summed over the backends: each
    backend's since it started). Over a window, the seconds added divided by the window's
    length is the number held at a time (Little's law); the larger of ``A`` and ``AAAA``.

    A total that went down (a pipe backend restarted, or its counts were not read) starts the
    window again: until it spans :data:`HELD_MIN_SPAN` the count is not known. A backend that
    joins adds all it counted before: the count is too high for a window, and k stays lower,
    as it is with many resolvers."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: deque[tuple[float, dict[str, int]]] = deque()

    def observe(self, now: float, totals: dict[str, int]) -> None:
        """The pipe backends' totals at monotonic time ``now``."""
        samples = self.samples
        if samples:
            last = samples[-1][1]
            if any(totals.get(family, 0) < held for family, held in last.items()):
                samples.clear()
        samples.append((now, totals))
        while len(samples) > 2 and samples[1][0] <= now - HELD_WINDOW:
            samples.popleft()

    def holders(self) -> float | None:
        """Answers held at a time over the window (None: not known yet)."""
        if len(self.samples) < 2:
            return None
        (start, first), (end, last) = self.samples[0], self.samples[-1]
        span = end - start
        if span < HELD_MIN_SPAN:
            return None
        if not last:
            return None  # no pipe backend counted any: not known
        return max((held - first.get(family, 0)) / span for family, held in last.items())


@dataclass(slots=True)
class PoolRuntime:
    config: PoolConfig
    servers: dict[str, ServerRuntime] = field(default_factory=dict)
    # The static members' locations by id, for the config they were read from (looking each one
    # up in the members' tuple made every plan O(members squared)).
    _locations: tuple[PoolConfig, dict[str, str | None]] | None = None
    _clusters: tuple[PoolConfig, frozenset[str]] | None = None  # the same for cluster members
    # The mean utilization of its active servers at the last tick (None: none reported):
    # the pause threshold is relative to it (dnslb.policy.pause_threshold).
    mean_utilization: float | None = None
    serving: int = 0  # how many those are
    # Whether one more of its servers could pause after the last tick's verdicts
    # (dnslb.policy.pause_room): the explain view says why a hot server serves on.
    pause_room: bool = True
    shares_at: float | None = None  # monotonic time of the last share correction
    # How many resolvers hold its answers (from the pipe backends' counts), and the k and TTL
    # floor its answers have for that (dnslb.policy.covering_k, covering_ttl_min): set at each
    # tick.
    held: HeldAnswers = field(default_factory=HeldAnswers)
    answer_k: int | None = None
    answer_ttl_min: int | None = None
    _answer_policy: tuple[PoolPolicy, int, PoolPolicy] | None = None

    @property
    def answer_policy(self) -> PoolPolicy:
        """The policy its servers' plan values are computed with: its own, with the TTL floor
        of :attr:`answer_ttl_min` when that is shorter (made once per change)."""
        policy = self.config.policy
        floor = self.answer_ttl_min
        if floor is None or floor >= policy.ttl_min:
            return policy
        cached = self._answer_policy
        if cached is None or cached[0] is not policy or cached[1] != floor:
            cached = self._answer_policy = (
                policy,
                floor,
                dataclasses.replace(policy, ttl_min=floor),
            )
        return cached[2]

    @property
    def name(self) -> str:
        return self.config.name

    def server_location(self, server: ServerRuntime) -> str | None:
        """The location of one of its servers: a static member's own, else the pool's."""
        config = self.config
        if server.record.origin != "static":
            return config.location
        cached = self._locations
        if cached is None or cached[0] is not config:
            cached = self._locations = (config, {m.id: m.location for m in config.members})
        return cached[1].get(server.id)

    @property
    def policy(self) -> PoolPolicy:
        return self.config.policy

    def bound_capacities(self) -> int | None:
        """Bound what its servers' reports may claim as max concurrency
        (:func:`~dnslb.policy.capacity_limit` of its servers' capacities, configured or
        reported, and ``capacity_spread``); returns the bound (None: no server said one).

        Weights and the autoscaler's view of the pool's capacity follow the bounded value. A
        configured ``max_concurrency`` is the operator's word and is not bounded; a single-IP
        cluster's member neither (its capacity is its nodes', which its controller bounds).
        """
        clustered = self._clustered()
        capacities = []
        for server in self.servers.values():
            configured = server.record.max_concurrency
            if configured is not None:
                capacities.append(configured)
            elif server.id in clustered:
                continue
            elif server.report is not None and server.report.max_concurrency is not None:
                capacities.append(server.report.max_concurrency)
        limit = capacity_limit(capacities, self.config.capacity_spread)
        for server in self.servers.values():
            server.capacity_limit = None if server.id in clustered else limit
        return limit

    def _clustered(self) -> frozenset[str]:
        """Ids of its members that stand for a single-IP cluster (computed once per config)."""
        cached = self._clusters
        if cached is None or cached[0] is not self.config:
            members = frozenset(m.id for m in self.config.members if m.cluster is not None)
            cached = self._clusters = (self.config, members)
        return cached[1]


class Fleet:
    """Every pool and server, with their durable state kept in a :class:`~manager.state.Store`."""

    def __init__(self, store: Store, agent_token: Secret | None = None) -> None:
        self.store = store
        self.agent_token_hash = token_hash(agent_token.reveal()) if agent_token else None
        self.pools: dict[str, PoolRuntime] = {}
        self.servers: dict[str, ServerRuntime] = {}

    def add_pool(self, config: PoolConfig) -> PoolRuntime:
        pool = PoolRuntime(config=config)
        self.pools[config.name] = pool
        return pool

    def add_server(
        self, record: ServerRecord, *, event: str | None = None, now: float
    ) -> ServerRuntime:
        """Start tracking ``record`` (and store it); ``event`` says why it is new."""
        runtime = ServerRuntime(record=record)
        self.pools[record.pool].servers[record.id] = runtime
        self.servers[record.id] = runtime
        self.store.save_server(record)
        if event:
            self.log(now, "server_added", event, pool=record.pool, server=record.id)
        return runtime

    def adopt(self, record: ServerRecord) -> ServerRuntime:
        """Track a server read back from the store (no event: nothing changed)."""
        stored = record.data.get("served", 0)
        served = stored if type(stored) is int and 0 <= stored <= MAX_SERVED else 0
        runtime = ServerRuntime(record=record, served=served)
        if record.pool in self.pools:
            self.pools[record.pool].servers[record.id] = runtime
        self.servers[record.id] = runtime
        return runtime

    def forget(self, server: ServerRuntime) -> None:
        """Stop tracking a terminated server in memory (its record stays in the store)."""
        self.servers.pop(server.id, None)
        pool = self.pools.get(server.record.pool)
        if pool is not None:
            pool.servers.pop(server.id, None)

    def update(self, server: ServerRuntime, **changes: object) -> None:
        """Change durable fields of ``server`` and store them."""
        server.record = dataclasses.replace(server.record, **changes)  # type: ignore[arg-type]
        self.store.save_server(server.record)

    def transition(
        self, server: ServerRuntime, state: ServerState, reason: str, *, now: float
    ) -> None:
        """Move ``server`` to ``state`` (stored, and logged as an event with ``reason``)."""
        if server.state is state:
            return
        changes: dict[str, object] = {"state": state, "state_reason": reason, "state_since": now}
        if state is ServerState.ACTIVE:
            changes["serving_since"] = now
        if state is ServerState.TERMINATED:
            changes["terminated_at"] = now
        previous = server.state
        self.update(server, **changes)
        self.log(
            now,
            "state",
            reason,
            pool=server.record.pool,
            server=server.id,
            from_state=previous,
            to_state=state,
        )

    def log(
        self,
        now: float,
        kind: str,
        reason: str,
        *,
        pool: str | None = None,
        server: str | None = None,
        from_state: ServerState | None = None,
        to_state: ServerState | None = None,
    ) -> Event:
        return self.store.add_event(
            Event(
                time=now,
                kind=kind,
                reason=reason,
                pool=pool,
                server=server,
                from_state=from_state,
                to_state=to_state,
            )
        )

    def may_report(self, server: ServerRuntime, token: str) -> bool:
        """True when ``token`` is this server's own token, or the shared agent token it may use."""
        if server.record.token_hash is not None:
            return token_matches(token, server.record.token_hash)
        return token_matches(token, self.agent_token_hash)

    def is_agent_token(self, token: str) -> bool:
        """True for the shared agent token (lets a caller learn that a server id is unknown)."""
        return token_matches(token, self.agent_token_hash)
