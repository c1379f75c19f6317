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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from dnslb.config import setting


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """When a pool grows and shrinks."""

    min_servers: int = setting(1, help="never fewer servers (active, warming or launching)", min=0)
    max_servers: int = setting(10, help="never more servers", min=1)
    th_high: float = setting(0.7, help="launch when mean utilization is above this", min=0.0)
    th_low: float = setting(0.3, help="drain one when mean utilization is below this", min=0.0)
    window: float = setting(
        20.0,
        help="seconds of history behind a scale-out (20 s: as fast as 10 s under a flash crowd, "
        "fewer launches on a noisy rise; docs/simulation.md)",
        min=0.0,
    )
    scale_in_window: float = setting(
        60.0, help="seconds below th_low before a scale-in, and between scale-ins", min=0.0
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


@dataclass(frozen=True, slots=True)
class PoolSample:
    """The pool at one moment."""

    at: float
    in_progress: int  # summed over active servers
    capacity: int  # max concurrency summed over active servers
    booting: int  # max concurrency still launching or warming

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


def sample_pool(servers: Sequence[ServerLoadView], at: float) -> PoolSample:
    active = [server for server in servers if server.active]
    return PoolSample(
        at=at,
        in_progress=sum(server.in_progress for server in active),
        capacity=sum(server.max_concurrency for server in active),
        booting=sum(server.max_concurrency for server in servers if not server.active),
    )


def _window(history: ScalingHistory, now: float, seconds: float) -> list[PoolSample]:
    return [sample for sample in history.samples if sample.at >= now - seconds]


def _mean_utilization(samples: Sequence[PoolSample]) -> float:
    demand = sum(sample.in_progress for sample in samples)
    capacity = sum(sample.capacity for sample in samples)
    return demand / capacity if capacity else 0.0


def _rise_rate(samples: Sequence[PoolSample]) -> float:
    """Least-squares slope of requests in progress per second (0 when falling or flat)."""
    if len(samples) < 2:
        return 0.0
    times = [sample.at for sample in samples]
    demands = [float(sample.in_progress) for sample in samples]
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
