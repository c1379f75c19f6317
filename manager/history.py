"""The manager's recent past, in memory: what the dashboard opens on.

Every tick the manager shows :class:`HistoryRing` its pools; the ring folds the ticks of each
:data:`RESOLUTION`-second interval (aligned on the wall clock) into one
:class:`~dnslb.control.PoolSample` per pool: per server the mean of its smoothed utilization over
the interval's ticks, whether it was paused at any of them, and its state, weight and TTL at the
end; per pool its servers by state and its server-seconds so far. An interval is closed by the
first tick after it, so the newest samples lag by at most one interval plus one tick.

Bounds, by count (nothing here grows with time or with what agents send):

- :data:`SAMPLES` samples per pool (one hour at 5 s), oldest dropped first;
- :data:`MAX_SERVERS` servers per sample (a pool's counts by state stay complete beyond it);
- a pool deleted or renamed keeps its samples until they are an hour old, then its ring goes.

A sample costs about 200 bytes plus about 150 per server: a pool of 20 servers holds about
2.3 MB for its hour. Events (scale decisions, pauses, state changes) are not copied here: they
are in the state database, and the dashboard reads them from ``/v1/events``.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dnslb.control import History, PoolSample, ServerSample
from dnslb.model import ServerState
from dnslb.plan import MemberState, Plan
from manager.fleet import PoolRuntime
from manager.state import Store

RESOLUTION = 5.0
"""Seconds per sample: finer than a scale decision's window, coarse enough for an hour."""
SAMPLES = 720
"""Samples kept per pool: an hour at :data:`RESOLUTION`."""
MAX_SERVERS = 256
"""Servers sampled per pool and interval; more are counted by state only."""


@dataclass(slots=True)
class _Running:
    """One server's figures over the open interval."""

    state: ServerState
    utilization_sum: float = 0.0
    utilization_ticks: int = 0
    paused: bool = False


@dataclass(slots=True)
class _OpenPool:
    servers: dict[str, _Running] = field(default_factory=dict)
    by_state: Counter[ServerState] = field(default_factory=Counter)


class HistoryRing:
    """Bounded samples per pool, built from ticks (see the module's docstring)."""

    def __init__(
        self,
        *,
        resolution: float = RESOLUTION,
        samples: int = SAMPLES,
        max_servers: int = MAX_SERVERS,
    ) -> None:
        self.resolution = resolution
        self.samples = samples
        self.max_servers = max_servers
        self._rings: dict[str, deque[PoolSample]] = {}
        self._interval: int | None = None
        self._open: dict[str, _OpenPool] = {}
        self._plan: Plan | None = None

    @property
    def retention(self) -> float:
        return self.resolution * self.samples

    def observe(
        self,
        wall: float,
        pools: Iterable[PoolRuntime],
        plan: Plan | None,
        cost: Callable[[str], float],
    ) -> None:
        """Fold one tick in: the pools as they are at ``wall`` (unix seconds), the published
        ``plan``; ``cost(pool)`` (a pool's server-seconds) is asked once per closed sample."""
        if not math.isfinite(wall):
            return
        interval = math.floor(wall / self.resolution)
        if self._interval is not None and interval != self._interval:
            self._close((self._interval + 1) * self.resolution, cost)
        self._interval = interval
        self._plan = plan  # read when the interval closes (every member: not every tick)
        for pool in pools:
            current = self._open.setdefault(pool.name, _OpenPool())
            current.by_state.clear()
            by_state = current.by_state
            running_of = current.servers
            for server in pool.servers.values():  # every server at every tick: kept cheap
                record = server.record
                state = record.state
                if state is ServerState.TERMINATED:
                    continue
                by_state[state] += 1
                running = running_of.get(record.id)
                if running is None:
                    if len(running_of) >= self.max_servers:
                        continue
                    running = running_of[record.id] = _Running(state=state)
                running.state = state
                load = server.load
                if load is not None and math.isfinite(load.utilization):
                    running.utilization_sum += load.utilization
                    running.utilization_ticks += 1
                if server.paused or record.admin_paused:
                    running.paused = True

    def _close(self, end: float, cost: Callable[[str], float]) -> None:
        plan = self._plan
        planned = {
            member.id: (member.weight, member.ttl)
            for pool in (plan.pools if plan is not None else ())
            for member in pool.members
            if member.state is MemberState.ACTIVE
        }
        for name, current in self._open.items():
            members = []
            for server_id, running in sorted(current.servers.items()):
                planned_here = planned.get(server_id)
                ticks = running.utilization_ticks
                members.append(
                    ServerSample(
                        id=server_id,
                        state=running.state,
                        utilization=running.utilization_sum / ticks if ticks else None,
                        weight=planned_here[0] if planned_here else None,
                        ttl=planned_here[1] if planned_here else None,
                        paused=running.paused,
                    )
                )
            sample = PoolSample(
                time=end,
                pool=name,
                servers={state.value: count for state, count in current.by_state.items()},
                cost_seconds=cost(name),
                members=tuple(members),
            )
            ring = self._rings.get(name)
            if ring is None:
                ring = self._rings[name] = deque(maxlen=self.samples)
            ring.append(sample)
        self._open = {}
        for name in [n for n, ring in self._rings.items() if ring[-1].time < end - self.retention]:
            del self._rings[name]

    def pools(self) -> set[str]:
        """The pools with samples."""
        return set(self._rings)

    def view(self, *, pool: str | None = None, since: float | None = None) -> History:
        """Samples newer than ``since`` (of ``pool``, or of every pool), oldest first."""
        if pool is None:
            rings: Iterable[deque[PoolSample]] = self._rings.values()
        else:
            rings = [self._rings[pool]] if pool in self._rings else []
        chosen = [
            sample
            for ring in rings
            for sample in ring
            if since is None or not sample.time <= since  # a NaN since takes everything
        ]
        chosen.sort(key=lambda sample: (sample.time, sample.pool))
        return History(resolution=self.resolution, retention=self.retention, samples=tuple(chosen))


def stored_cost(store: Store, wall: float) -> Callable[[str], float]:
    """A pool's server-seconds at ``wall``, terminated servers included (as ``/v1/pools``).

    The store adds them up for every pool at once (:meth:`~manager.state.Store.pool_costs`), on
    the first call: reading every server instead cost each closed sample 80 ms of the manager's
    loop at 10,000 servers, and once per pool, seconds (bench/manager_load.py)."""
    totals: dict[str, float] | None = None

    def cost(pool: str) -> float:
        nonlocal totals
        if totals is None:
            totals = store.pool_costs(wall)
        return totals.get(pool, 0.0)

    return cost
