"""Single-IP clusters, manager side: node reports in, versioned dispatch tables out.

One :class:`ClusterController` per cluster. The manager feeds it every report of the cluster's
nodes (:meth:`~ClusterController.observe`), calls :meth:`~ClusterController.tick` often (every
50-100 ms: failover speed is detection + one tick + one push), and reads the cluster's
:meth:`~ClusterController.utilization` for the DNS plan. The controller never sleeps and reads time
only from the clock it is given, so tests drive it with a fake clock and a fake pusher.

What it decides, each tick:

* **Alive**: a node is alive while its last heartbeat is younger than ``failover_after`` and the
  heartbeat says it serves (no ``error``). A node never heard from is not alive.
* **Weights** from spare capacity: ``max_concurrency * max(weight_floor, 1 - u)`` (the capacity
  the node reports, at most its configured ``max_concurrency`` when one is), with ``u`` the
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
  controller reissue its table above that version (at most once per ``min_rebuild_interval``).

Hostile nodes. A node's agent holds that node's token; what it sends (heartbeats, answers to
pushes) is bounded where it enters, and a node that misbehaves loses only its own buckets:

* Every number of a heartbeat is checked in :meth:`~ClusterController.observe` even when the
  caller built the :class:`~dnslb.report.Report` itself: ``seq`` and table versions 0..2^63-1,
  ``time`` finite unix seconds, ``in_progress`` 0..10^9, ``max_concurrency`` 1..10^9 (else
  :class:`ProtocolError`, and the heartbeat does not count); utilization is clamped to 0..1;
  ``error`` is cut to 200 printable characters.
* **Version claims** (a heartbeat's table version, a push answer's version) above ours move our
  next version only when they are plausible: at most :data:`MAX_CLAIM_STEP` above the newest
  version we issued (before our first table, anything up to :data:`MAX_ADOPTED_VERSION`: a
  restarted manager must go above whatever its predecessor issued), and never above
  :data:`MAX_ADOPTED_VERSION` (2^62). The upper half of the version range is therefore ours
  alone: counting up by one per change, it lasts 2^62 changes, so no claim can wedge the
  controller at the top of the range. A node whose claim is refused cannot take our tables (it
  would refuse them as older): it is left out of the table until it claims a plausible version
  again (restarting its agent does that: a fresh agent holds nothing).
* A live node that has not taken the current table ``stuck_after`` seconds after we first pushed
  it (its pushes fail, or it answers or reports another version) is left out too, so that it
  cannot hold back joins and rebalances of the others by never acknowledging; it is still
  pushed, and comes back (after ``join_after``) once it holds our table.
* Push answers are read up to :data:`MAX_PUSH_ANSWER` bytes within ``push_timeout`` in all.
* Each part of a tick (failover, rebuilds, pushes) runs apart: an unexpected error in one is
  counted in ``tick_errors``, logged once per message, and the others still run. Failover comes
  first, and every new table (a failover too) gets a version above every claim adopted, so no
  claim can hold back failover.

Limits: a node that is alive but cut off from the manager (or left out as above) is failed over
while it still accepts its buckets (both answer) until it is reachable again; a manager restart
does not know the contents of the tables nodes hold, so its first push is not ordered. A
compromised node controls its own packet filter: it can accept any bucket whatever the table says.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import ssl
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from dnslb.config import checked, setting
from dnslb.dispatch import (
    DEFAULT_BUCKET_COUNT,
    MAX_BUCKETS,
    MAX_SEED,
    MAX_VERSION,
    BucketTable,
    build_table,
    failover,
    quotas,
    table_to_json,
)
from dnslb.errors import DnslbError, ProtocolError
from dnslb.plan import MAX_TIME, show, text_problem
from dnslb.policy import capacity_limit
from dnslb.report import MAX_COUNT, MAX_SEQ, Report, TableHeld, id_problem
from dnslb.tls import client_context, verification_failure

log = logging.getLogger(__name__)

Clock = Callable[[], float]

MAX_ADOPTED_VERSION = 2**62
"""Highest version a node's claim can make the controller issue above. Versions above it are
reached only by the controller counting up, one per table: 2^62 tables, never exhausted."""
MAX_CLAIM_STEP = 2**20
"""Once the controller has issued a table, a claimed version more than this above the newest it
issued is refused. Legitimate claims above ours come from a restarted manager (adopted before our
first table, unbounded up to :data:`MAX_ADOPTED_VERSION`) or another manager writing at the same
time (a few versions apart). A compromised node that keeps claiming just under the bound moves
our version by at most this much per reissue, and reissues come at most once per
``min_rebuild_interval``: 2^42 of them to cross 2^62."""
MAX_PUSH_ANSWER = 1024 * 1024
"""Bytes of a node agent's answer to a push that are read: its JSON lists the node's buckets, at
most 65,536 numbers (under 500 KiB); a longer answer is cut and counts as a failed push."""
MAX_ERROR_TEXT = 200
"""Characters kept of an error text a node sends (heartbeat ``error``, push answer ``error``)."""


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """A node of a cluster: its id in tables, its agent's base URL and its bearer token, and the
    most its reported capacity counts for (None: what its agent reports, up to 10^9)."""

    node_id: str
    agent_url: str
    token: str = field(repr=False)  # revealed from the manager's config (a Secret there)
    # A node's agent says how much it can take, and its weight follows: a compromised node
    # reporting 10^9 would draw nearly every new connection. Configured, this caps its share.
    max_concurrency: int | None = setting(
        None, help="the most its reported capacity counts for", min=1, max=MAX_COUNT
    )

    def config_problems(self) -> Iterator[str]:
        if problem := id_problem(self.node_id):
            yield f"node id {show(self.node_id)}: {problem}"


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """A cluster's configuration, as the manager's config gives it (``ClusterConfig.settings``);
    :class:`ClusterController` checks it (:func:`~dnslb.config.checked`)."""

    name: str = setting(help="cluster name")
    vip: str = setting(help="the shared address")
    nodes: tuple[ClusterNode, ...] = setting(help="the nodes")
    seed: int = setting(help="jhash seed", min=0, max=MAX_SEED)
    bucket_count: int = setting(
        DEFAULT_BUCKET_COUNT, help="buckets in the dispatch table", min=1, max=MAX_BUCKETS
    )
    failover_after: float = setting(
        0.3, help="seconds without a heartbeat before a node's buckets move", min=0.01, max=60.0
    )
    weight_floor: float = setting(
        0.05,
        help="a fully loaded node keeps this share of a free node's weight",
        min=0.001,
        max=1.0,
    )
    smoothing: float = setting(
        0.3, help="weight of the newest utilization sample (1: no smoothing)", min=0.001, max=1.0
    )
    rebalance_threshold: float = setting(
        0.05, help="fraction of buckets a weight change must move", min=0.0, max=1.0
    )
    min_rebuild_interval: float = setting(
        1.0, help="seconds between rebuilds for joins and weights", min=0.0, max=3600.0
    )
    join_after: float = setting(
        1.0, help="seconds a node (back) in service must stay alive to join", min=0.0, max=3600.0
    )
    push_timeout: float = setting(
        1.0, help="seconds a whole push (connect, send, answer) may take", min=0.01, max=3600.0
    )
    retry_after: float = setting(
        0.2, help="seconds before a failed push to a node is tried again", min=0.0, max=3600.0
    )
    capacity_spread: float = setting(
        4.0,
        help="a node's reported capacity counts for at most this multiple of the live nodes' "
        "median (a node with a configured max_concurrency is not bounded)",
        min=1.0,
        max=1e9,
    )
    stuck_after: float = setting(
        5.0, help="seconds a live node may go without taking our table", min=0.01, max=3600.0
    )

    def config_problems(self) -> Iterator[str]:
        if problem := id_problem(self.name):
            yield f"name: {problem}"
        ids = [node.node_id for node in self.nodes]
        if not self.nodes:
            yield "nodes: at least one"
        if len(set(ids)) != len(ids):
            yield "nodes: node ids must be unique"


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
    """``POST {agent_url}/v1/table`` with the node's bearer token, over pooled connections.

    The whole push (connect, send, read the answer) takes at most ``timeout`` seconds, and at
    most :data:`MAX_PUSH_ANSWER` bytes of the answer are read: a node agent that trickles or
    floods its answer costs one failed push, never a stuck task or the manager's memory.
    """

    def __init__(
        self,
        timeout: float = 1.0,
        client: httpx.AsyncClient | None = None,
        *,
        verify: ssl.SSLContext | None = None,
    ) -> None:
        """``verify``: how ``https://`` node agents are verified (default: the system's trust
        store; :func:`dnslb.tls.client_context` with the cluster's ``ca_file``)."""
        self._timeout = timeout
        self._client = client or httpx.AsyncClient(
            timeout=timeout, verify=verify or client_context(), trust_env=False
        )

    async def push(self, node: ClusterNode, body: bytes) -> PushResult:
        url = node.agent_url.rstrip("/") + "/v1/table"
        headers = {"Authorization": f"Bearer {node.token}", "Content-Type": "application/json"}
        try:
            async with asyncio.timeout(self._timeout):
                request = self._client.build_request("POST", url, content=body, headers=headers)
                response = await self._client.send(request, stream=True)
                try:
                    data = bytearray()
                    async for chunk in response.aiter_raw():
                        data += chunk
                        if len(data) > MAX_PUSH_ANSWER:
                            return PushResult(0, None, "answer larger than 1 MiB")
                finally:
                    await response.aclose()
        except TimeoutError:
            return PushResult(0, None, f"no answer within {self._timeout:g} s")
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
            reason = verification_failure(exc) or f"{type(exc).__name__}: {exc}"
            return PushResult(0, None, clean_text(reason))
        return parse_push_answer(response.status_code, bytes(data))

    async def aclose(self) -> None:
        await self._client.aclose()


def parse_push_answer(status: int, data: bytes) -> PushResult:
    """A node agent's answer, bounded: the version only when it is an integer 0..2^63-1, the
    error cut to :data:`MAX_ERROR_TEXT` printable characters; anything unreadable is no answer."""
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, invalid UTF-8, 5,000-digit numbers, nesting
        answer = None
    held = answer.get("version") if isinstance(answer, dict) else None
    if isinstance(held, bool) or not isinstance(held, int) or not 0 <= held <= MAX_VERSION:
        held = None
    error = answer.get("error") if isinstance(answer, dict) else None
    error = clean_text(error) if isinstance(error, str) and error else None
    if status >= 300 and not error:
        error = f"HTTP {status}"
    return PushResult(status, held, error)


def clean_text(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """``text`` cut to ``limit`` characters, control characters and lone surrogates replaced
    (a node's words go to logs, events, the API and a UTF-8 database)."""
    text = text[:limit]
    if text and text_problem(text) is None:
        return text
    return "".join("\ufffd" if text_problem(char) else char for char in text)


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
    error: str | None  # why it is not alive, when it was heard from
    push_failures: int = 0  # failed pushes since the controller started


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
    conflict: bool = False  # it holds held_version with other contents than ours
    pushing: bool = False
    retry_at: float = -math.inf
    alive_since: float | None = None
    refused_claim: str | None = None  # why its claimed version is not followed
    lagging_since: float | None = None  # first push it has not taken since it last held ours
    push_error: str | None = None  # the last push failure, said once until it changes
    push_failures: int = 0


class VersionsExhausted(DnslbError):
    """The controller has no version left to issue (2^62 tables after the last claim adopted)."""


class ClusterController:
    """Keeps one cluster's dispatch table right and on its nodes (see the module docstring)."""

    def __init__(
        self,
        settings: ClusterSettings,
        pusher: TablePusher,
        clock: Clock,
        max_events: int = 1000,
    ) -> None:
        self.settings = checked(settings, f"cluster {settings.name}")
        self.pusher = pusher
        self.clock = clock
        self._nodes = {node.node_id: _Node(node) for node in settings.nodes}
        self._table: BucketTable | None = None
        self._tables: dict[int, BucketTable] = {}  # versions nodes may still hold
        self._issued = 0  # the newest version this controller issued
        self._newest_seen = 0  # the newest version claimed by a node and adopted
        self._conflict = False  # a node refused our version as held with other contents
        self._first_heard: float | None = None
        self._last_rebuild = -math.inf
        self._last_reissue = -math.inf
        self._unordered_version: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.events: deque[ClusterEvent] = deque(maxlen=max_events)
        self.tick_errors: Counter[str] = Counter()  # parts of ticks that failed, by part
        self.failovers = 0  # tables installed by failover (for the metrics)
        self._tick_error_logged: dict[str, str] = {}

    # --- inputs ----------------------------------------------------------------------------

    def observe(self, report: Report, now: float | None = None) -> None:
        """Take a node's heartbeat. Raises :class:`ProtocolError` for a node not in the cluster,
        a report of another cluster's table, or a number out of its range (see the module
        docstring); a replayed (older) report is ignored. The report counts as a heartbeat only
        when it is taken whole."""
        node_id = report.server_id
        state = self._nodes.get(node_id) if isinstance(node_id, str) else None
        if state is None:
            raise ProtocolError(f"{show(node_id)} is not a node of {self.settings.name}")
        held = report.table
        if held is not None:
            if not isinstance(held, TableHeld):
                raise ProtocolError(f"{node_id!r}: table {show(held)} is not {{cluster, version}}")
            if held.cluster != self.settings.name:
                raise ProtocolError(f"{node_id!r} holds a table of cluster {show(held.cluster)}")
            if not _within(held.version, 0, MAX_VERSION):
                raise ProtocolError(f"{node_id!r}: table version {show(held.version)} out of range")
        if not _within(report.seq, 0, MAX_SEQ):
            raise ProtocolError(f"{node_id!r}: seq {show(report.seq)} out of range")
        when = report.time
        if isinstance(when, bool) or not isinstance(when, int | float):
            raise ProtocolError(f"{node_id!r}: time {show(when)} is not unix seconds")
        if isinstance(when, int) and not 0 <= when <= MAX_TIME:  # float() of 10**400 overflows
            raise ProtocolError(f"{node_id!r}: time {show(when)} is not unix seconds")
        if not (math.isfinite(when) and 0 <= when <= MAX_TIME):
            raise ProtocolError(f"{node_id!r}: time {show(when)} is not unix seconds")
        in_progress, max_concurrency = report.in_progress, report.max_concurrency
        if in_progress is not None and not _within(in_progress, 0, MAX_COUNT):
            raise ProtocolError(f"{node_id!r}: in_progress {show(in_progress)} out of range")
        if max_concurrency is not None and not _within(max_concurrency, 1, MAX_COUNT):
            raise ProtocolError(
                f"{node_id!r}: max_concurrency {show(max_concurrency)} out of range"
            )
        error = report.error
        if error is not None and not isinstance(error, str):
            raise ProtocolError(f"{node_id!r}: error {show(error)} is not text")
        if report.seq <= state.last_seq and when <= state.last_time:
            return
        now = self.clock() if now is None else now
        state.last_seq, state.last_time = report.seq, float(when)
        state.last_heard = now
        if self._first_heard is None:
            self._first_heard = now
        state.error = clean_text(error) if error else None
        self._claim(state, held.version if held is not None else None, now)
        if in_progress is None or max_concurrency is None:
            state.utilization = None
            return
        cap = state.node.max_concurrency
        capacity = max_concurrency if cap is None else min(cap, max_concurrency)
        # Both are at most 10^9: the ratio is finite; more in progress than capacity is full.
        sample = min(1.0, in_progress / capacity)
        alpha = self.settings.smoothing
        previous = state.utilization
        state.utilization = sample if previous is None else alpha * sample + (1 - alpha) * previous
        state.in_progress = in_progress
        state.max_concurrency = capacity

    def _claim(self, state: _Node, version: int | None, now: float) -> None:
        """Record the version ``state``'s node says it holds, adopting it as the newest seen
        when it is plausible (see :data:`MAX_CLAIM_STEP`) and leaving the node out otherwise."""
        if version != state.held_version:
            state.conflict = False
        state.held_version = version
        refusal: str | None = None
        if (
            version is not None
            and version > max(self._issued, self._newest_seen)
            and not self._stuck(state, now)  # left out already: its claims move nothing
        ):
            bound = MAX_ADOPTED_VERSION
            if self._issued:
                bound = min(bound, self._issued + MAX_CLAIM_STEP)
            if version > bound:
                refusal = (
                    f"claims table v{version}, beyond the versions this manager follows; "
                    "restart its node agent"
                )
            else:
                self._newest_seen = version
        was_refused = state.refused_claim is not None
        state.refused_claim = refusal
        if (refusal is not None) == was_refused:
            return  # said once per change, however the claims vary
        node_id = state.node.node_id
        if refusal is not None:
            self.events.append(ClusterEvent(now, "claim refused", f"{node_id}: {refusal}"))
            log.warning("cluster %s: node %s %s", self.settings.name, node_id, refusal)
        else:
            log.info(
                "cluster %s: node %s claims a version we follow again", self.settings.name, node_id
            )

    # --- reading -----------------------------------------------------------------------------

    @property
    def table(self) -> BucketTable | None:
        """The table the controller wants the nodes to hold."""
        return self._table

    def _serving(self, state: _Node, now: float) -> bool:
        """Heard from lately, serving, and following our versions: a node we push to."""
        return (
            state.last_heard is not None
            and now - state.last_heard < self.settings.failover_after
            and state.error is None
            and state.utilization is not None
            and state.refused_claim is None
        )

    def _stuck(self, state: _Node, now: float) -> bool:
        since = state.lagging_since
        return since is not None and now - since >= self.settings.stuck_after

    def alive(self, now: float) -> list[str]:
        """Ids of the nodes alive at ``now`` (those a table may give buckets to), sorted."""
        return sorted(
            node_id
            for node_id, state in self._nodes.items()
            if self._serving(state, now) and not self._stuck(state, now)
        )

    def _capacities(self, states: list[_Node]) -> list[int]:
        """What the nodes' capacities count for: a reported one at most ``capacity_spread``
        times the nodes' median (:func:`~dnslb.policy.capacity_limit`), a configured cap as
        configured."""
        capacities = [state.max_concurrency for state in states]
        limit = capacity_limit(capacities, self.settings.capacity_spread)
        return [
            state.max_concurrency
            if limit is None or state.node.max_concurrency is not None
            else min(limit, state.max_concurrency)
            for state in states
        ]

    def weights(self, now: float) -> dict[str, float]:
        """Dispatch weights of the live nodes: spare capacity with a floor."""
        floor = self.settings.weight_floor
        result: dict[str, float] = {}
        alive = self.alive(now)
        states = [self._nodes[node_id] for node_id in alive]
        for node_id, state, capacity in zip(alive, states, self._capacities(states), strict=True):
            spare = max(floor, 1.0 - (state.utilization or 0.0))
            result[node_id] = max(1, capacity) * spare
        return result

    def load(self, now: float | None = None) -> tuple[int, int] | None:
        """(connections in progress, capacity) summed over the live nodes, within a report's
        bounds (capacity at most 10^9, the ratio kept); None when no node is alive."""
        now = self.clock() if now is None else now
        states = [self._nodes[node_id] for node_id in self.alive(now)]
        capacities = self._capacities(states)
        capacity = sum(capacities)
        if not capacity:
            return None
        # A node counts as full at most: one node cannot make the cluster look busier than
        # all of its capacity being in use (the cluster is one DNS member, paused when busy).
        in_progress = sum(
            min(state.in_progress, bound) for state, bound in zip(states, capacities, strict=True)
        )
        if capacity > MAX_COUNT:  # the manager reports this for the cluster's DNS member
            in_progress, capacity = in_progress * MAX_COUNT // capacity, MAX_COUNT
        return in_progress, capacity

    def utilization(self, now: float | None = None) -> float | None:
        """Connections in progress over capacity, over the live nodes; None when none is alive."""
        load = self.load(now)
        return None if load is None else load[0] / load[1]

    def _why_out(self, state: _Node, now: float) -> str | None:
        if state.error is not None:
            return state.error
        if state.refused_claim is not None:
            return state.refused_claim
        if self._stuck(state, now):
            return f"has not taken our table for {now - (state.lagging_since or now):.1f} s" + (
                f": {state.push_error}" if state.push_error else ""
            )
        return None

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
                error=self._why_out(state, now),
                push_failures=state.push_failures,
            )
            for node_id, state in sorted(self._nodes.items())
        ]

    # --- the tick ----------------------------------------------------------------------------

    async def tick(self, now: float | None = None) -> None:
        """Decide (failover, join, rebalance) and start the pushes that are due. Never waits on
        the network: pushes run as tasks and report back through :meth:`_push_done`. Never
        raises: each part runs apart (see the module docstring)."""
        now = self.clock() if now is None else now
        alive = self.alive(now)
        for node_id, state in self._nodes.items():
            if node_id not in alive:
                state.alive_since = None
            elif state.alive_since is None:
                state.alive_since = now
            if not self._serving(state, now) or self._holds_ours(state):
                # Caught up, or away (and not pushed meanwhile): nothing waits on it.
                state.lagging_since = None
        if alive and self._isolated("failover", self._decide_failover, now, alive):
            self._isolated("rebuild", self._decide_rebuild, now, alive)
        self._isolated("push", self._start_pushes, now)

    def _isolated(self, part: str, step: Callable[..., bool | None], *args: object) -> bool:
        """Run one part of a tick; True when it ran and asks for the next part to run too. An
        unexpected error is counted, logged once per part and message, and the tick goes on."""
        try:
            result = step(*args)
        except Exception as exc:
            self.tick_errors[part] += 1
            message = f"{type(exc).__name__}: {exc}"[:300]
            if self._tick_error_logged.get(part) != message:
                self._tick_error_logged[part] = message
                log.exception(
                    "cluster %s: %s failed this tick (logged once)", self.settings.name, part
                )
            return True
        self._tick_error_logged.pop(part, None)
        return result is not False

    def _next_version(self) -> int:
        """The version of the next table: above ours and above every claim adopted."""
        version = max(self._issued, self._newest_seen) + 1
        if version > MAX_VERSION:
            raise VersionsExhausted(f"cluster {self.settings.name}: no table version left")
        return version

    def _decide_failover(self, now: float, alive: list[str]) -> bool:
        """The first table, or failover of members that are not alive; False when it changed
        the table (nothing else is decided in that tick)."""
        table = self._table
        if table is None:
            # Wait a moment for every node's first heartbeat rather than build for the first
            # node and move buckets again a second later.
            waited = now - (self._first_heard if self._first_heard is not None else now)
            if len(alive) == len(self._nodes) or waited >= self.settings.failover_after:
                first = self._build(self.weights(now), None)
                self._install(now, first, "first table", f"nodes {', '.join(alive)}")
            return False
        gone = [node for node in table.nodes if node not in alive]
        if not gone:
            return True
        why = ", ".join(
            f"{node}: {self._why_out(self._nodes[node], now) or 'no heartbeat'}"
            if node in self._nodes
            else node
            for node in gone
        )
        failed = failover(table, gone, self.weights(now), version=self._next_version())
        self._install(now, failed, "failover", why)
        self.failovers += 1
        return False

    def _decide_rebuild(self, now: float, alive: list[str]) -> None:
        """Reissue above a newer claim or a conflict, joins and rebalances."""
        table = self._table
        assert table is not None
        reissue = self._newest_seen > table.version or self._conflict
        if reissue and now - self._last_reissue >= self.settings.min_rebuild_interval:
            self._conflict = False
            self._last_reissue = now
            why = (
                f"a node holds v{self._newest_seen}"
                if self._newest_seen > table.version
                else f"a node holds v{table.version} with other contents"
            )
            reissued = BucketTable(table.cluster, self._next_version(), table.seed, table.buckets)
            self._install(now, reissued, "reissue", why)
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
        return build_table(
            self.settings.name,
            weights,
            version=self._next_version(),
            seed=self.settings.seed,
            bucket_count=self.settings.bucket_count,
            previous=previous,
        )

    def _install(self, now: float, table: BucketTable, what: str, why: str) -> None:
        self._table = table
        self._tables[table.version] = table
        self._issued = max(self._issued, table.version)
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

    def _holds_ours(self, state: _Node) -> bool:
        """Whether the node says it holds the table we want (by version, without conflict)."""
        table = self._table
        return table is not None and state.held_version == table.version and not state.conflict

    def _pending(self, alive: list[str]) -> list[str]:
        """Live nodes of the table that do not hold it yet."""
        table = self._table
        if table is None:
            return []
        members = set(table.nodes)
        return [
            node for node in alive if node in members and not self._holds_ours(self._nodes[node])
        ]

    def _held_active(self, node_id: str) -> set[int] | None:
        """Buckets ``node_id`` accepts now, or None when the content of its table is unknown."""
        state = self._nodes[node_id]
        version = state.held_version
        if version is None:
            return set()  # fenced: an agent without a table accepts nothing
        if state.conflict:
            return None
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
            if other == node_id or self._holds_ours(self._nodes[other]):
                continue
            theirs = self._held_active(other)
            if theirs is not None and gains & theirs:
                return False
        return True

    def _start_pushes(self, now: float) -> None:
        table = self._table
        if table is None:
            return
        alive = self.alive(now)
        # Live nodes outside the table get it too: it fences them and tells us what they hold.
        # So do nodes left out for not taking our tables: taking one brings them back.
        targets = [node_id for node_id, state in self._nodes.items() if self._serving(state, now)]
        pending = [node for node in targets if not self._holds_ours(self._nodes[node])]
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
        if unordered and self._unordered_version != table.version:
            self._unordered_version = table.version
            self.events.append(
                ClusterEvent(now, "unordered push", "nodes wait on each other", table.version)
            )
        body = table_to_json(table)
        for node_id in ready:
            state = self._nodes[node_id]
            state.pushing = True
            if state.lagging_since is None:
                state.lagging_since = now
            task = asyncio.create_task(self._push(node_id, table.version, body))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _push(self, node_id: str, version: int, body: bytes) -> None:
        state = self._nodes[node_id]
        try:
            result = await self.pusher.push(state.node, body)
        except Exception as exc:  # a pusher must not raise; if one does, the push failed
            log.exception("cluster %s: pushing to %s raised", self.settings.name, node_id)
            result = PushResult(0, None, f"{type(exc).__name__}: {exc}")
        finally:
            state.pushing = False
        self._push_done(node_id, version, result)

    def _push_done(self, node_id: str, version: int, result: PushResult) -> None:
        state = self._nodes[node_id]
        now = self.clock()
        held = result.held_version
        if isinstance(held, bool) or not isinstance(held, int) or not 0 <= held <= MAX_VERSION:
            held = None
        if held is not None:
            self._claim(state, held, now)
        status = result.status if isinstance(result.status, int) else 0
        if 200 <= status < 300 and held == version:
            state.conflict = False  # it took ours (or holds it unchanged)
            if state.push_error is not None:
                log.info("cluster %s: push to %s works again", self.settings.name, node_id)
            state.push_error = None
            return
        if status == 409 and held == version:
            # The same version, with other contents (another writer): go above it. A node that
            # keeps saying so is left out after stuck_after, and then moves nothing.
            state.conflict = True
            if not self._stuck(state, now):
                self._conflict = True
        error = clean_text(result.error) if isinstance(result.error, str) and result.error else ""
        if 200 <= status < 300:
            holds = f"v{held}" if held is not None else "no version"
            error = f"answered {status} but holds {holds}"
        message = error or f"HTTP {status}"
        state.retry_at = now + self.settings.retry_after
        state.push_failures += 1
        if message == state.push_error:
            return  # said once; the count goes on in push_failures
        state.push_error = message
        self.events.append(ClusterEvent(now, "push failed", f"{node_id}: {message}", version))
        log.warning(
            "cluster %s: push of v%d to %s failed: %s (said once until it changes)",
            self.settings.name,
            version,
            node_id,
            message,
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
            "tick_errors": sum(self.tick_errors.values()),
            "nodes": [
                {
                    "node_id": status.node_id,
                    "alive": status.alive,
                    "utilization": status.utilization,
                    "weight": status.weight,
                    "held_version": status.held_version,
                    "active_buckets": status.active_buckets,
                    "error": status.error,
                    "push_failures": status.push_failures,
                }
                for status in self.status()
            ],
        }


def _within(value: object, low: int, high: int) -> bool:
    """Whether ``value`` is an integer (not a bool) from ``low`` to ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
