"""Single-IP clusters, manager side: node reports in, versioned dispatch tables out.

One :class:`ClusterController` per cluster. The manager feeds it every report of the cluster's
nodes (:meth:`~ClusterController.observe`), calls :meth:`~ClusterController.tick` often (every
50-100 ms: failover speed is detection + one tick + one push), and reads the cluster's
:meth:`~ClusterController.utilization` for the DNS plan. The controller never sleeps and reads time
only from the clock it is given, so tests drive it with a fake clock and a fake pusher.

What it decides, each tick:

* **Alive**: a node is alive while its last heartbeat is younger than ``failover_after`` and the
  heartbeat says it serves (no ``error``). A node never heard from is not alive.
* **Weights** from spare capacity: ``max_concurrency * max(weight_floor, 1 - u)``, with ``u`` the
  node's utilization smoothed over heartbeats (exponential, factor ``smoothing``). The floor keeps
  a trickle of new connections on a loaded node, so that its utilization stays measured and it
  comes back smoothly; a node at ``u = 1`` keeps ``weight_floor`` of a free node's share.
* **Failover** at once: when a node of the table is no longer alive, its buckets go to their
  backups (:func:`dnslb.dispatch.failover`); no other bucket moves.
* **Joins** (a node not in the table, alive for ``join_after`` seconds, so that a flapping
  node does not pull buckets back and forth) and **weight changes** rebuild the table with the
  fewest moves (:func:`dnslb.dispatch.build_table`), but only when no push is still pending, at
  most once per ``min_rebuild_interval``, and for weight changes only when the rebuild would move
  at least ``rebalance_threshold`` of the buckets (hysteresis: small wobbles move nothing).
* **Pushes** go to every live node that does not hold the table yet, as background tasks (a slow
  node never delays a tick). A node that *gains* buckets is pushed only after every live node that
  still holds one of those buckets has released it (holds a table where it is not theirs): if
  both accepted the same bucket, both would answer a SYN. Failed pushes are retried after
  ``retry_after``. A node reporting a version newer than ours (a manager restart) makes the
  controller reissue its table above that version.

Limits: a node that is alive but cut off from the manager is failed over while it still accepts
its buckets (both answer) until it is reachable again; a manager restart does not know the
contents of the tables nodes hold, so its first push is not ordered.
"""

from __future__ import annotations

import asyncio
import logging
import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from dnslb.dispatch import (
    DEFAULT_BUCKET_COUNT,
    MAX_BUCKETS,
    BucketTable,
    build_table,
    failover,
    quotas,
    table_to_json,
)
from dnslb.errors import ConfigError, ProtocolError
from dnslb.report import Report

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """A node of a cluster: its id in tables, its agent's base URL and its bearer token."""

    node_id: str
    agent_url: str
    token: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """A cluster's configuration, as the manager's config gives it."""

    name: str
    vip: str
    nodes: tuple[ClusterNode, ...]
    seed: int
    bucket_count: int = DEFAULT_BUCKET_COUNT
    failover_after: float = 0.3  # seconds without a heartbeat before a node's buckets move
    weight_floor: float = 0.05  # a fully loaded node keeps this share of a free node's weight
    smoothing: float = 0.3  # weight of the newest utilization sample (1 = no smoothing)
    rebalance_threshold: float = 0.05  # fraction of buckets a weight change must move
    min_rebuild_interval: float = 1.0  # seconds between rebuilds for joins and weights
    join_after: float = 1.0  # a node (back) in service must stay alive this long to join
    push_timeout: float = 1.0
    retry_after: float = 0.2  # seconds before a failed push to a node is tried again

    def __post_init__(self) -> None:
        problems: list[str] = []
        ids = [node.node_id for node in self.nodes]
        if not self.nodes:
            problems.append("nodes: at least one")
        if len(set(ids)) != len(ids):
            problems.append("nodes: node ids must be unique")
        if not 0 <= self.seed <= 0xFFFFFFFF:
            problems.append("seed: must be 0..2^32-1")
        if not 1 <= self.bucket_count <= MAX_BUCKETS:
            problems.append(f"bucket_count: must be 1..{MAX_BUCKETS}")
        if not 0 < self.failover_after <= 60:
            problems.append("failover_after: must be more than 0 and at most 60 seconds")
        if not 0 < self.weight_floor <= 1:
            problems.append("weight_floor: must be more than 0 and at most 1")
        if not 0 < self.smoothing <= 1:
            problems.append("smoothing: must be more than 0 and at most 1")
        if not 0 <= self.rebalance_threshold <= 1:
            problems.append("rebalance_threshold: must be 0..1")
        for name in ("min_rebuild_interval", "join_after", "push_timeout", "retry_after"):
            if not getattr(self, name) >= 0:
                problems.append(f"{name}: must be >= 0")
        if problems:
            raise ConfigError(f"cluster {self.name}", problems)


@dataclass(frozen=True, slots=True)
class PushResult:
    """What a node agent answered to a push: the status and the version it holds now."""

    status: int
    held_version: int | None
    error: str | None = None


class TablePusher(ABC):
    """Delivers a table to one node agent."""

    @abstractmethod
    async def push(self, node: ClusterNode, body: bytes) -> PushResult:
        """Send ``body`` (a table's JSON); never raises for network trouble, returns status 0."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, nothing to close by default
        """Release connections."""


class HttpTablePusher(TablePusher):
    """``POST {agent_url}/v1/table`` with the node's bearer token, over pooled connections."""

    def __init__(self, timeout: float = 1.0, client: httpx.AsyncClient | None = None) -> None:
        self._client = client or httpx.AsyncClient(timeout=timeout)

    async def push(self, node: ClusterNode, body: bytes) -> PushResult:
        url = node.agent_url.rstrip("/") + "/v1/table"
        headers = {"Authorization": f"Bearer {node.token}", "Content-Type": "application/json"}
        try:
            response = await self._client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return PushResult(0, None, f"{type(exc).__name__}: {exc}")
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        held = answer.get("version") if isinstance(answer, dict) else None
        held = held if isinstance(held, int) and not isinstance(held, bool) else None
        error = answer.get("error") if isinstance(answer, dict) else None
        if response.status_code >= 300 and not error:
            error = f"HTTP {response.status_code}"
        return PushResult(response.status_code, held, error if isinstance(error, str) else None)

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """Something the controller did, and why."""

    at: float
    what: str
    why: str
    version: int | None = None


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node as the controller sees it now."""

    node_id: str
    alive: bool
    utilization: float | None
    weight: float
    held_version: int | None
    active_buckets: int
    error: str | None


@dataclass
class _Node:
    node: ClusterNode
    last_heard: float | None = None
    last_seq: int = -1
    last_time: float = -math.inf
    utilization: float | None = None
    in_progress: int = 0
    max_concurrency: int = 0
    error: str | None = None
    held_version: int | None = None
    pushing: bool = False
    retry_at: float = -math.inf
    alive_since: float | None = None


class ClusterController:
    """Keeps one cluster's dispatch table right and on its nodes (see the module docstring)."""

    def __init__(
        self,
        settings: ClusterSettings,
        pusher: TablePusher,
        clock: Clock,
        max_events: int = 1000,
    ) -> None:
        self.settings = settings
        self.pusher = pusher
        self.clock = clock
        self._nodes = {node.node_id: _Node(node) for node in settings.nodes}
        self._table: BucketTable | None = None
        self._tables: dict[int, BucketTable] = {}  # versions nodes may still hold
        self._newest_seen = 0
        self._conflict = False  # a node refused our version as held with other contents
        self._first_heard: float | None = None
        self._last_rebuild = -math.inf
        self._tasks: set[asyncio.Task[None]] = set()
        self.events: deque[ClusterEvent] = deque(maxlen=max_events)

    # --- inputs ----------------------------------------------------------------------------

    def observe(self, report: Report, now: float | None = None) -> None:
        """Take a node's heartbeat. Raises :class:`ProtocolError` for a node not in the cluster
        or a report of another cluster's table; a replayed (older) report is ignored."""
        state = self._nodes.get(report.server_id)
        if state is None:
            raise ProtocolError(f"{report.server_id!r} is not a node of {self.settings.name}")
        if report.table is not None and report.table.cluster != self.settings.name:
            raise ProtocolError(
                f"{report.server_id!r} holds a table of cluster {report.table.cluster!r}"
            )
        if report.seq <= state.last_seq and report.time <= state.last_time:
            return
        state.last_seq, state.last_time = report.seq, report.time
        state.last_heard = self.clock() if now is None else now
        if self._first_heard is None:
            self._first_heard = state.last_heard
        state.error = report.error
        state.held_version = report.table.version if report.table is not None else None
        self._newest_seen = max(self._newest_seen, state.held_version or 0)
        sample = report.utilization
        if sample is None:
            state.utilization = None
            return
        sample = min(1.0, max(0.0, sample))
        alpha = self.settings.smoothing
        previous = state.utilization
        state.utilization = sample if previous is None else alpha * sample + (1 - alpha) * previous
        state.in_progress = report.in_progress or 0
        state.max_concurrency = report.max_concurrency or 0

    # --- reading -----------------------------------------------------------------------------

    @property
    def table(self) -> BucketTable | None:
        """The table the controller wants the nodes to hold."""
        return self._table

    def alive(self, now: float) -> list[str]:
        """Ids of the nodes alive at ``now``, sorted."""
        limit = self.settings.failover_after
        return sorted(
            node_id
            for node_id, state in self._nodes.items()
            if state.last_heard is not None
            and now - state.last_heard < limit
            and state.error is None
            and state.utilization is not None
        )

    def weights(self, now: float) -> dict[str, float]:
        """Dispatch weights of the live nodes: spare capacity with a floor."""
        floor = self.settings.weight_floor
        result: dict[str, float] = {}
        for node_id in self.alive(now):
            state = self._nodes[node_id]
            spare = max(floor, 1.0 - (state.utilization or 0.0))
            result[node_id] = max(1, state.max_concurrency) * spare
        return result

    def load(self, now: float | None = None) -> tuple[int, int] | None:
        """(connections in progress, capacity) summed over the live nodes; None when none is."""
        now = self.clock() if now is None else now
        states = [self._nodes[node_id] for node_id in self.alive(now)]
        capacity = sum(state.max_concurrency for state in states)
        if not capacity:
            return None
        return sum(state.in_progress for state in states), capacity

    def utilization(self, now: float | None = None) -> float | None:
        """Connections in progress over capacity, over the live nodes; None when none is alive."""
        load = self.load(now)
        return None if load is None else load[0] / load[1]

    def status(self, now: float | None = None) -> list[NodeStatus]:
        """Every node, for the API and the dashboard."""
        now = self.clock() if now is None else now
        alive = set(self.alive(now))
        weights = self.weights(now)
        shares = self._table.shares() if self._table is not None else {}
        return [
            NodeStatus(
                node_id=node_id,
                alive=node_id in alive,
                utilization=state.utilization,
                weight=weights.get(node_id, 0.0),
                held_version=state.held_version,
                active_buckets=shares.get(node_id, 0),
                error=state.error,
            )
            for node_id, state in sorted(self._nodes.items())
        ]

    # --- the tick ----------------------------------------------------------------------------

    async def tick(self, now: float | None = None) -> None:
        """Decide (failover, join, rebalance) and start the pushes that are due. Never waits on
        the network: pushes run as tasks and report back through :meth:`_push_done`."""
        now = self.clock() if now is None else now
        alive = self.alive(now)
        for node_id, state in self._nodes.items():
            if node_id not in alive:
                state.alive_since = None
            elif state.alive_since is None:
                state.alive_since = now
        if alive:
            self._decide(now, alive)
        self._start_pushes(now, alive)

    def _decide(self, now: float, alive: list[str]) -> None:
        table = self._table
        if table is None:
            # Wait a moment for every node's first heartbeat rather than build for the first
            # node and move buckets again a second later.
            waited = now - (self._first_heard if self._first_heard is not None else now)
            if len(alive) == len(self._nodes) or waited >= self.settings.failover_after:
                first = self._build(self.weights(now), None)
                self._install(now, first, "first table", f"nodes {', '.join(alive)}")
            return
        if self._newest_seen > table.version or self._conflict:
            self._conflict = False
            version = max(self._newest_seen, table.version) + 1
            reissued = BucketTable(table.cluster, version, table.seed, table.buckets)
            self._install(now, reissued, "reissue", f"a node holds v{self._newest_seen}")
            return
        gone = [node for node in table.nodes if node not in alive]
        if gone:
            failed = failover(table, gone, self.weights(now), version=table.version + 1)
            self._install(
                now, failed, "failover", f"{', '.join(gone)}: no heartbeat or not serving"
            )
            return
        if self._pending(alive) or now - self._last_rebuild < self.settings.min_rebuild_interval:
            return
        members = set(table.nodes)
        eligible = {
            node: weight
            for node, weight in self.weights(now).items()
            if node in members
            or now - (self._nodes[node].alive_since or now) >= self.settings.join_after
        }
        joined = sorted(set(eligible) - members)
        if joined:
            self._install(now, self._build(eligible, table), "join", ", ".join(joined))
            return
        target = quotas(eligible, table.bucket_count)
        shares = table.shares()
        moving = sum(max(0, count - target.get(node, 0)) for node, count in shares.items())
        if moving >= self.settings.rebalance_threshold * table.bucket_count and moving > 0:
            rebuilt = self._build(eligible, table)
            self._install(now, rebuilt, "rebalance", f"{moving} buckets follow the weights")

    def _build(self, weights: dict[str, float], previous: BucketTable | None) -> BucketTable:
        version = max(self._newest_seen, previous.version if previous else 0) + 1
        return build_table(
            self.settings.name,
            weights,
            version=version,
            seed=self.settings.seed,
            bucket_count=self.settings.bucket_count,
            previous=previous,
        )

    def _install(self, now: float, table: BucketTable, what: str, why: str) -> None:
        self._table = table
        self._tables[table.version] = table
        if what != "failover":
            self._last_rebuild = now
        for state in self._nodes.values():
            state.retry_at = -math.inf  # a new version is worth trying at once
        self.events.append(ClusterEvent(now, what, why, table.version))
        log.info("cluster %s: %s -> v%d (%s)", self.settings.name, what, table.version, why)
        self._prune()

    def _prune(self) -> None:
        keep = {state.held_version for state in self._nodes.values()}
        if self._table is not None:
            keep.add(self._table.version)
        for version in [version for version in self._tables if version not in keep]:
            del self._tables[version]

    def _pending(self, alive: list[str]) -> list[str]:
        """Live nodes of the table that do not hold it yet."""
        table = self._table
        if table is None:
            return []
        members = set(table.nodes)
        return [
            node
            for node in alive
            if node in members and self._nodes[node].held_version != table.version
        ]

    def _held_active(self, node_id: str) -> set[int] | None:
        """Buckets ``node_id`` accepts now, or None when the content of its table is unknown."""
        version = self._nodes[node_id].held_version
        if version is None:
            return set()  # fenced: an agent without a table accepts nothing
        held = self._tables.get(version)
        return None if held is None else set(held.active_buckets(node_id))

    def _may_push(self, node_id: str, alive: list[str]) -> bool:
        """True unless ``node_id`` would gain a bucket another live node still accepts."""
        table = self._table
        assert table is not None
        held = self._held_active(node_id) or set()
        gains = set(table.active_buckets(node_id)) - held
        if not gains:
            return True
        for other in alive:
            if other == node_id or self._nodes[other].held_version == table.version:
                continue
            theirs = self._held_active(other)
            if theirs is not None and gains & theirs:
                return False
        return True

    def _start_pushes(self, now: float, alive: list[str]) -> None:
        table = self._table
        if table is None:
            return
        # Live nodes outside the table get it too: it fences them and tells us what they hold.
        pending = [node for node in alive if self._nodes[node].held_version != table.version]
        if not pending:
            return
        movable = [node for node in pending if self._may_push(node, alive)]
        unordered = not movable
        if unordered:
            # Every pending node waits for another: only chained changes (a failover during a
            # rebalance) can get here. Pushing all at once beats never converging.
            movable = pending
        ready = [
            node
            for node in movable
            if not self._nodes[node].pushing and now >= self._nodes[node].retry_at
        ]
        if not ready:
            return
        if unordered:
            self.events.append(ClusterEvent(now, "unordered push", "nodes wait on each other"))
        body = table_to_json(table)
        for node_id in ready:
            state = self._nodes[node_id]
            state.pushing = True
            task = asyncio.create_task(self._push(node_id, table.version, body))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _push(self, node_id: str, version: int, body: bytes) -> None:
        state = self._nodes[node_id]
        try:
            result = await self.pusher.push(state.node, body)
        finally:
            state.pushing = False
        self._push_done(node_id, version, result)

    def _push_done(self, node_id: str, version: int, result: PushResult) -> None:
        state = self._nodes[node_id]
        now = self.clock()
        if result.held_version is not None:
            state.held_version = result.held_version
            self._newest_seen = max(self._newest_seen, result.held_version)
        if 200 <= result.status < 300:
            return
        if result.status == 409:
            self._conflict = True
        state.retry_at = now + self.settings.retry_after
        self.events.append(
            ClusterEvent(now, "push failed", f"{node_id}: {result.error or result.status}", version)
        )
        log.warning(
            "cluster %s: push of v%d to %s failed: %s",
            self.settings.name,
            version,
            node_id,
            result.error or result.status,
        )

    async def settle(self) -> None:
        """Wait for the pushes in flight (tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Finish pushes in flight and close the pusher."""
        await self.settle()
        await self.pusher.aclose()

    def describe(self) -> Mapping[str, Any]:
        """A JSON-able summary: table version, shares, nodes."""
        table = self._table
        return {
            "cluster": self.settings.name,
            "vip": self.settings.vip,
            "version": table.version if table else None,
            "shares": table.shares() if table else {},
            "utilization": self.utilization(),
            "nodes": [
                {
                    "node_id": status.node_id,
                    "alive": status.alive,
                    "utilization": status.utilization,
                    "weight": status.weight,
                    "held_version": status.held_version,
                    "active_buckets": status.active_buckets,
                    "error": status.error,
                }
                for status in self.status()
            ],
        }
