"""The autoscaler's decisions: when to launch servers and which one to drain. Pure functions.

Every tick the manager (and the simulator) records a :class:`PoolSample` of the pool (requests in
progress and capacity of its active servers, plus the capacity still booting) and asks
:func:`decide`:

- **Scale out** when the capacity-weighted mean utilization of the active servers over ``window``
  seconds is above ``th_high``. Servers launching or warming count as capacity already, so another
  launch happens only if utilization would still be above ``th_high`` with them. Because booting
  is the known weak spot of DNS-based scaling, demand is projected ``boot_time`` seconds ahead at
  its current rate of rise, and as many servers as that projection needs are launched at once
  (at most ``max_step``).
- **Scale in** when the mean over the longer ``scale_in_window`` is below ``th_low``, nothing is
  booting, the last scale event is at least ``scale_in_window`` old, and the pool would stay below
  the midpoint of ``th_low`` and ``th_high`` without the server (so that it does not flap back
  out). One server at a time: the one with the fewest requests in progress (it drains fastest),
  the newest of equals (older cache servers hold warmer caches).
- Never below ``min_servers`` nor above ``max_servers``.

With ``target_wait`` set, the pool is sized for a waiting-time target instead of the two
thresholds (:func:`servers_for`): each server is an M/M/c queue of its worker slots (Erlang C),
offered an equal share of the pool's requests in progress, with the mean service time measured
from the agents' served counters (Little's law). It scales out when the load projected
``boot_time`` ahead (the mean over ``window``, and the rate of rise of busy worker slots, or of
requests in progress once the pool is saturated: :func:`_demand_rise`) needs more servers than
the pool has (booting ones included), as many as it needs; and in, with the same guards as
above, when one server fewer would still meet the target at a load ``SCALE_IN_HEADROOM`` times
the mean over ``scale_in_window``, the next scale-in ``window`` later while two fewer would
still meet it; both with the pool's imbalance measured (:func:`imbalance`), unless
``target_imbalance`` is off (sized as if the pool were even).
Each server queues on its own, so the pool's size does not pool waiting: what lets a server run
hotter than ``th_high`` at the same wait is its number of worker slots and the wait allowed
against the service time. Until the agents' served counters give a service time, the
thresholds decide.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from dnslb.config import setting


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """When a pool grows and shrinks."""

    min_servers: int = setting(1, help="never fewer servers (active, warming or launching)", min=0)
    max_servers: int = setting(
        10,
        help="never more servers launching, warming or active (draining, down or disabled ones "
        "are not counted: the pool replaces them)",
        min=1,
    )
    th_high: float = setting(0.7, help="launch when mean utilization is above this", min=0.0)
    th_low: float = setting(0.3, help="drain one when mean utilization is below this", min=0.0)
    window: float = setting(
        20.0,
        help="seconds of history behind a scale-out (20 s: as fast as 10 s under a flash crowd, "
        "fewer launches on a noisy rise; docs/simulation.md)",
        min=0.0,
    )
    scale_in_window: float = setting(
        60.0,
        help="seconds below th_low before a scale-in, and between scale-ins (with target_wait, "
        "window between them while two servers fewer would still meet the target)",
        min=0.0,
    )
    boot_time: float = setting(
        30.0,
        help="expected seconds from launch to serving: how far ahead demand is projected",
        min=0.0,
    )
    max_step: int = setting(3, help="most servers launched at once", min=1)
    server_capacity: int | None = setting(
        None, help="max concurrency a new server adds (default: the mean of the active ones)", min=1
    )
    target_wait: float | None = setting(
        None,
        help="size the pool for waiting instead of th_high/th_low: at most 1 - target_quantile "
        "of requests wait longer than this for a worker slot, seconds, by a queueing model of "
        "each server (null: the paper's thresholds)",
        min=0.0,
        max=3600.0,
    )
    target_quantile: float = setting(
        0.99, help="share of requests that wait less than target_wait", min=0.5, max=0.99999
    )
    target_imbalance: bool = setting(
        True,
        help="size for the pool's imbalance as measured (false: as if DNS spread the load "
        "evenly; cheaper, the busiest servers then wait longer than target_wait; "
        "docs/simulation.md)",
    )

    def config_problems(self) -> Iterator[str]:
        if self.th_low >= self.th_high:
            yield f"th_low ({self.th_low}) must be below th_high ({self.th_high})"
        if self.min_servers > self.max_servers:
            yield (
                f"min_servers ({self.min_servers}) must not exceed max_servers ({self.max_servers})"
            )


@dataclass(frozen=True, slots=True)
class ServerLoadView:
    """What the autoscaler needs to know about one server."""

    id: str
    active: bool  # serving (or paused), as opposed to booting
    in_progress: int
    max_concurrency: int
    started_at: float  # when it was launched or configured: newer servers drain first
    served: int = 0  # requests it served so far (a counter that only grows)

    @property
    def busy(self) -> int:
        """Worker slots busy: requests in progress up to its own slots (the rest wait)."""
        return max(0, min(self.in_progress, self.max_concurrency))


@dataclass(frozen=True, slots=True)
class PoolSample:
    """The pool at one moment."""

    at: float
    in_progress: int  # summed over active servers
    capacity: int  # max concurrency summed over active servers
    booting: int  # max concurrency still launching or warming
    served: int = 0  # requests served so far, as :func:`sample_pool` counts them
    busy: int = 0  # worker slots busy, each server's at most its own
    # Sum over active servers of in_progress x utilization: over in_progress, the utilization
    # of the server a request in progress is on, on average (the pool's, when it is even).
    weighted: float = 0.0
    # Each server's served counter to count from at the next sample: its counter here, less
    # what the cap held back (:func:`served_between`). The newest sample's only: the history
    # drops them from older samples.
    counters: Mapping[str, int] | None = None

    @property
    def utilization(self) -> float:
        return self.in_progress / self.capacity if self.capacity else 0.0


@dataclass(slots=True)
class ScalingHistory:
    """Samples of one pool and when it last scaled; the autoscaler's memory."""

    samples: list[PoolSample] = field(default_factory=list)
    last_scale_out: float = float("-inf")
    last_scale_in: float = float("-inf")

    def add(self, sample: PoolSample, keep: float) -> None:
        if self.samples and self.samples[-1].counters is not None:
            self.samples[-1] = dataclasses.replace(self.samples[-1], counters=None)
        self.samples.append(sample)
        cutoff = sample.at - keep
        while self.samples and self.samples[0].at < cutoff:
            self.samples.pop(0)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do now: launch ``launch`` servers, or drain ``drain``; ``reason`` says why."""

    launch: int = 0
    drain: str | None = None
    reason: str = ""


def sample_pool(
    servers: Sequence[ServerLoadView],
    at: float,
    previous: PoolSample | None = None,
    *,
    count_served: bool = False,
) -> PoolSample:
    """The pool at ``at``; with ``count_served`` (a waiting-time target needs it), the requests
    served since ``previous`` (the history's newest sample) too (:func:`served_between`)."""
    active = [server for server in servers if server.active]
    served = 0
    counters: dict[str, int] | None = None
    if count_served:
        if previous is not None and previous.counters is not None:
            counted, counters = served_between(previous.counters, servers)
            served = previous.served + counted
        else:
            counters = {server.id: server.served for server in servers}
    return PoolSample(
        at=at,
        in_progress=sum(server.in_progress for server in active),
        capacity=sum(server.max_concurrency for server in active),
        booting=sum(server.max_concurrency for server in servers if not server.active),
        served=served,
        busy=sum(server.busy for server in active),
        weighted=sum(
            server.in_progress * server.in_progress / server.max_concurrency
            for server in active
            if server.max_concurrency > 0
        ),
        counters=counters,
    )


SERVED_SPREAD = 4.0  # no server counts as serving more per busy slot than this x the median


def served_between(
    before: Mapping[str, int], servers: Sequence[ServerLoadView]
) -> tuple[int, dict[str, int]]:
    """The requests ``servers`` served since their counters were ``before``, and the counters
    to count from next time. A counter that is new or went back counts nothing, and no server
    counts more requests per busy worker slot than ``SERVED_SPREAD`` times the median of the
    servers that were busy. A server's agent holds a token and may lie: an inflated counter
    would make the service time look short and the pool too small for everyone
    (:func:`_service_time`); capped, it moves the pool's figure by at most its share.

    What the cap holds back is not lost but counted later: a server's next counter to count
    from is what it had plus what was counted. Agents report on their own clocks, so between
    two ticks most servers may have no new report (the median is then 0 and nothing counts)
    while a few report a second's worth. Dropping theirs lost 24 % of a lab run's requests, most
    of some 10 s windows, and made the service time look up to 4 times as long."""
    deltas: list[tuple[str, int, int, int]] = []  # (id, counter before, served since, busy now)
    following: dict[str, int] = {}
    for server in servers:
        was = before.get(server.id)
        if was is None or server.served < was:
            following[server.id] = server.served
        else:
            deltas.append((server.id, was, server.served - was, server.busy))
    rates = [served / busy for _, _, served, busy in deltas if busy > 0]
    cap = SERVED_SPREAD * statistics.median_low(rates) if rates else None  # None: nobody busy
    total = 0
    for server_id, was, served, busy in deltas:
        counted = served if cap is None else min(served, math.ceil(cap * max(1, busy)))
        following[server_id] = was + counted
        total += counted
    return total, following


def _window(history: ScalingHistory, now: float, seconds: float) -> list[PoolSample]:
    return [sample for sample in history.samples if sample.at >= now - seconds]


def _mean_utilization(samples: Sequence[PoolSample]) -> float:
    demand = sum(sample.in_progress for sample in samples)
    capacity = sum(sample.capacity for sample in samples)
    return demand / capacity if capacity else 0.0


def _rise_rate(samples: Sequence[PoolSample], *, busy: bool = False) -> float:
    """Least-squares slope of requests in progress (with ``busy``, of busy worker slots) per
    second; 0 when falling or flat."""
    if len(samples) < 2:
        return 0.0
    times = [sample.at for sample in samples]
    demands = [float(sample.busy if busy else sample.in_progress) for sample in samples]
    mean_t = sum(times) / len(times)
    mean_d = sum(demands) / len(demands)
    spread = sum((t - mean_t) ** 2 for t in times)
    if spread == 0:
        return 0.0
    slope = sum((t - mean_t) * (d - mean_d) for t, d in zip(times, demands, strict=True)) / spread
    return max(0.0, slope)


def decide(
    history: ScalingHistory,
    servers: Sequence[ServerLoadView],
    policy: ScalingPolicy,
    now: float,
) -> Decision:
    """The decision for a pool at ``now``; ``history`` already holds this tick's sample."""
    count = len(servers)
    active = [server for server in servers if server.active]
    booting = count - len(active)
    if count < policy.min_servers:
        missing = policy.min_servers - count
        reason = f"{count} servers, min_servers is {policy.min_servers}"
        return Decision(launch=missing, reason=reason)
    if not history.samples or not active:
        return Decision()
    current = history.samples[-1]
    unit = policy.server_capacity or max(1, round(current.capacity / len(active)))
    if policy.target_wait is not None:
        decision = _decide_for_target(history, active, policy, now, count=count, unit=unit)
        if decision is not None:
            return decision

    recent = _window(history, now, policy.window)
    mean = _mean_utilization(recent)
    if (
        mean > policy.th_high
        and count < policy.max_servers
        and _covers(history.samples, now, policy.window)
    ):
        projected = current.in_progress + _rise_rate(recent) * policy.boot_time
        capacity = current.capacity + current.booting
        if projected / capacity > policy.th_high:
            needed = _servers_needed(projected, capacity, unit, policy.th_high)
            launch = min(needed, policy.max_step, policy.max_servers - count)
            if launch > 0:
                booting_text = f", {booting} already booting" if booting else ""
                return Decision(
                    launch=launch,
                    reason=(
                        f"mean utilization {mean:.2f} over {policy.window:g} s > th_high "
                        f"{policy.th_high:g}; {projected:.0f} requests expected in "
                        f"{policy.boot_time:g} s for capacity {capacity}{booting_text}"
                    ),
                )

    long = _window(history, now, policy.scale_in_window)
    if (
        booting == 0
        and count > policy.min_servers
        and len(active) > 1
        and _covers(history.samples, now, policy.scale_in_window)
        and now - max(history.last_scale_in, history.last_scale_out) >= policy.scale_in_window
    ):
        long_mean = _mean_utilization(long)
        victim = min(active, key=lambda server: (server.in_progress, -server.started_at, server.id))
        remaining = current.capacity - victim.max_concurrency
        after = current.in_progress / remaining if remaining else float("inf")
        midpoint = (policy.th_low + policy.th_high) / 2
        if long_mean < policy.th_low and after < midpoint:
            return Decision(
                drain=victim.id,
                reason=(
                    f"mean utilization {long_mean:.2f} over {policy.scale_in_window:g} s < th_low "
                    f"{policy.th_low:g}; {after:.2f} without it. Chose {victim.id}: fewest "
                    f"requests in progress ({victim.in_progress}), so it drains fastest"
                ),
            )
    return Decision()


SCALE_IN_HEADROOM = 1.25  # a scale-in leaves room for this much more load than the recent mean
SATURATED = 1.5  # requests in progress over worker slots past which busy slots hide the demand


def _demand_rise(samples: Sequence[PoolSample]) -> float:
    """The rise a waiting-time target projects: of busy worker slots, while the pool is not
    saturated. A burst (users that start together, a resolver's batch) queues beyond the slots
    and drains by itself within a service time or two: projected ``boot_time`` ahead, its
    queue launched servers that were drained again a minute later (docs/simulation.md). Once
    requests in progress pass ``SATURATED`` times the slots, the slots are all busy and cannot
    show how fast demand rises; the queue does, and requests in progress are projected."""
    if not samples:
        return 0.0
    current = samples[-1]
    queued = _rise_rate(samples)
    if current.in_progress > SATURATED * current.capacity:
        return queued
    return min(queued, _rise_rate(samples, busy=True))


def _decide_for_target(
    history: ScalingHistory,
    active: Sequence[ServerLoadView],
    policy: ScalingPolicy,
    now: float,
    *,
    count: int,
    unit: int,
) -> Decision | None:
    """:func:`decide` for a waiting-time target (``policy.target_wait`` set); None while the
    service time is unknown (nothing served in ``scale_in_window``: agents that do not report
    a served counter), and the thresholds decide."""
    assert policy.target_wait is not None
    late_goal = 1.0 - policy.target_quantile
    long = _window(history, now, policy.scale_in_window)
    long_service = _service_time(long)
    if long_service is None:
        return None
    recent = _window(history, now, policy.window)
    service = _service_time(recent)
    if (
        service is not None
        and count < policy.max_servers
        and _covers(history.samples, now, policy.window)
    ):
        demand = sum(sample.in_progress for sample in recent) / len(recent)
        uneven = imbalance(recent) if policy.target_imbalance else 1.0
        projected = demand + _demand_rise(recent) * policy.boot_time
        needed = servers_for(projected, unit, service, policy, uneven)
        if needed > count:
            launch = min(needed - count, policy.max_step, policy.max_servers - count)
            late = late_share(unit, demand * uneven / count, policy.target_wait, service)
            return Decision(
                launch=launch,
                reason=(
                    f"{late:.1%} of requests would wait over {policy.target_wait:g} s (target "
                    f"{late_goal:.1%}) with {demand:.0f} in progress over {policy.window:g} s "
                    f"on {count} servers of {unit} slots (service {service:.3g} s, imbalance "
                    f"{uneven:.2f}); {needed} needed for {projected:.0f} expected in "
                    f"{policy.boot_time:g} s"
                ),
            )

    service = long_service
    since_in = now - history.last_scale_in
    if (
        count == len(active)
        and count > policy.min_servers
        and len(active) > 1
        and _covers(history.samples, now, policy.scale_in_window)
        and now - history.last_scale_out >= policy.scale_in_window
        and since_in >= min(policy.window, policy.scale_in_window)
    ):
        demand = sum(sample.in_progress for sample in long) / len(long)
        uneven = imbalance(long) if policy.target_imbalance else 1.0
        needed = servers_for(demand * SCALE_IN_HEADROOM, unit, service, policy, uneven)
        # After a flash crowd the pool is many servers too big: one drain every
        # scale_in_window kept them for many minutes. While two fewer would still meet the
        # target, the next scale-in waits only window.
        if needed < count and (since_in >= policy.scale_in_window or needed < count - 1):
            victim = min(
                active, key=lambda server: (server.in_progress, -server.started_at, server.id)
            )
            load = demand * SCALE_IN_HEADROOM * uneven / (count - 1)
            late = late_share(unit, load, policy.target_wait, service)
            return Decision(
                drain=victim.id,
                reason=(
                    f"{count - 1} servers would meet the target ({late:.2%} of requests waiting "
                    f"over {policy.target_wait:g} s) with {SCALE_IN_HEADROOM:g} x the "
                    f"{demand:.0f} in progress over {policy.scale_in_window:g} s. Chose "
                    f"{victim.id}: fewest requests in progress ({victim.in_progress}), so it "
                    "drains fastest"
                ),
            )
    return Decision()


def _service_time(samples: Sequence[PoolSample]) -> float | None:
    """The mean service time over ``samples`` (Little's law): requests in service (at most
    each server's own worker slots: what queues on a hot server is waiting, even while others
    have slots free) over requests served per second; None when nothing was served. A counter
    that went back (a server left the pool) counts as nothing served in that interval."""
    if len(samples) < 2:
        return None
    served = sum(max(0, b.served - a.served) for a, b in itertools.pairwise(samples))
    elapsed = samples[-1].at - samples[0].at
    if served <= 0 or elapsed <= 0:
        return None
    # busy slots over time (the manager ticks again soon after an urgent change: samples are
    # not evenly spaced), over the requests served in that time
    busy = sum(b.busy * (b.at - a.at) for a, b in itertools.pairwise(samples))
    return max(1e-6, busy / served)


def imbalance(samples: Sequence[PoolSample]) -> float:
    """How much more loaded than the pool's mean the server of a request in progress is: 1 in
    an even pool (at most 4); per sample, averaged over ``samples`` by their requests in
    progress (a pool that grew within them is not uneven). Servers that DNS loads unevenly make
    requests wait at a lower mean utilization; sizing the pool for an even one would run its
    busiest servers past the target."""
    total = 0.0
    in_progress = 0
    for sample in samples:
        if sample.in_progress > 0 and sample.capacity > 0:
            mean = sample.in_progress / sample.capacity
            total += sample.weighted / mean  # in_progress x (weighted / in_progress) / mean
            in_progress += sample.in_progress
    if in_progress <= 0:
        return 1.0
    return min(4.0, max(1.0, total / in_progress))


def erlang_c(slots: int, load: float) -> float:
    """The probability that a request waits for one of ``slots`` worker slots offered ``load``
    Erlangs (M/M/c); 1 at or past capacity. Erlang B by its stable recursion, then C."""
    if load <= 0:
        return 0.0
    if load >= slots:
        return 1.0
    blocking = 1.0
    for k in range(1, slots + 1):
        blocking = load * blocking / (k + load * blocking)
    return slots * blocking / (slots - load * (1.0 - blocking))


MODEL_SLOTS = 1024  # larger servers are modelled as this many slots at the same utilization


def late_share(slots: int, load: float, wait: float, service: float) -> float:
    """The share of requests that wait longer than ``wait`` seconds at a server of ``slots``
    worker slots offered ``load`` Erlangs with a mean service time of ``service`` seconds.

    Erlang C takes time in the number of slots, which an agent reports (up to a billion): a
    server of more than ``MODEL_SLOTS`` is modelled as ``MODEL_SLOTS`` at its utilization, which
    makes it wait a little longer than it would (more servers, never a stalled tick)."""
    if slots > MODEL_SLOTS:
        load, slots = load * MODEL_SLOTS / slots, MODEL_SLOTS
    if load >= slots:
        return 1.0
    return erlang_c(slots, load) * math.exp(-(slots - load) * wait / service)


def servers_for(
    demand: float, unit: int, service: float, policy: ScalingPolicy, imbalance: float = 1.0
) -> int:
    """The fewest servers of ``unit`` worker slots that meet ``policy``'s waiting target with
    ``demand`` requests in progress shared among them, each request on a server ``imbalance``
    times as loaded as the mean (:func:`imbalance`); at least one, at most a million."""
    assert policy.target_wait is not None
    goal = 1.0 - policy.target_quantile
    load = demand * imbalance

    def meets(servers: int) -> bool:
        return late_share(unit, load / servers, policy.target_wait or 0.0, service) <= goal

    low = max(1, math.floor(load / unit))  # below it every server is past capacity
    if meets(low):
        return low
    high = low
    while not meets(high):
        if high >= 1_000_000:
            return high
        low, high = high, min(1_000_000, high * 2)
    while high - low > 1:  # meets(high), not meets(low)
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle
    return high


def _covers(samples: Sequence[PoolSample], now: float, seconds: float) -> bool:
    """True when the history reaches back (nearly) a whole window: no decisions on a short
    history. All of it is looked at, not the window's samples alone: with ticks a sixth of the
    window apart, the oldest sample inside the window was never 0.9 of it old, and a 3 s window
    on 0.5 s ticks never scaled out."""
    return bool(samples) and now - samples[0].at >= seconds * 0.9


def _servers_needed(demand: float, capacity: int, unit: int, th_high: float) -> int:
    """Fewest servers of ``unit`` capacity that bring ``demand / capacity`` to th_high or below."""
    needed = 0
    while demand / (capacity + needed * unit) > th_high and needed < 1000:
        needed += 1
    return needed


def record(history: ScalingHistory, decision: Decision, now: float) -> None:
    """Remember that ``decision`` was carried out at ``now``."""
    if decision.launch:
        history.last_scale_out = now
    if decision.drain:
        history.last_scale_in = now
