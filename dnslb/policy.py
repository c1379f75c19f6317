"""The load policy: from utilization reports to pause flags, weights and TTLs. Pure functions.

Per server and tick (DESIGN section 4):

- :func:`update_load` folds the newest utilization sample into a time-aware exponential moving
  average, and :func:`judge_pause` decides *pause with hysteresis* once the pool's samples are
  in: a server pauses as soon as either the sample or the average is above its threshold (react
  to overload at once) and resumes only when both are below the threshold less ``hysteresis``
  (come back carefully). The threshold is ``th_over``, or higher in a warm pool, and none in a
  hot one (:func:`pause_threshold`).
- :func:`member_weight` grows with the spare capacity: ``max_concurrency * (1 - u) ** 2`` by
  default (``spare_squared``), never below a small floor, ramped up over ``slow_start`` seconds
  for a server just added.
- :func:`member_ttl` is ``ttl_max`` while the server is lightly loaded and falls (on a convex
  curve by default) to ``ttl_min`` as utilization approaches ``th_over``: clients of a busy
  server come back sooner, so a pause or a new server takes effect quickly, while lightly loaded
  servers keep long TTLs.

The simulator compares variants of these functions; :data:`TTL_FUNCTIONS` and
:data:`WEIGHT_FUNCTIONS` name them, and a pool picks one in its policy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from dnslb.config import setting
from dnslb.plan import MAX_K, MAX_WEIGHT, Fallback


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """How a pool's answers follow its servers' load."""

    k: int = setting(4, help="addresses per answer (the research found 4 best)", min=1, max=64)
    k_coverage: float = setting(
        3.0,
        help="answers held by resolvers cover the pool at least this many times: with few "
        "resolvers, k rises up to every active server and the TTL floor falls toward 1 s (the "
        "pipe backends count the resolvers holding an answer); 0: k and the floor fixed",
        min=0.0,
        max=1000.0,
    )
    ttl_max: int = setting(60, help="TTL of a lightly loaded server, seconds", min=0)
    ttl_min: int = setting(5, help="TTL of a server at th_over; also the TTL floor", min=0)
    th_over: float = setting(0.8, help="utilization above which a server is paused", min=0.01)
    pause: bool = setting(
        True,
        help="leave a server above th_over out of answers until it cools down (false: never "
        "pause; TTLs still fall towards th_over)",
    )
    hysteresis: float = setting(
        0.1, help="a paused server resumes below its threshold - hysteresis", min=0.0, max=1.0
    )
    pause_relative: float = setting(
        1.25,
        help="a server pauses only above th_over and above this multiple of its pool's mean "
        "utilization, and none pauses while the pool's mean is at th_over or above (the "
        "autoscaler carries a hot pool); 0: th_over alone, whatever the pool (the paper)",
        min=0.0,
        max=100.0,
    )
    pause_dwell: float = setting(
        30.0,
        help="seconds a resumed server serves at least before it can pause again (without it, "
        "servers flipped between paused and resumed every few seconds); 0: none (the paper)",
        min=0.0,
        max=3600.0,
    )
    ttl_knee: float = setting(
        0.5, help="fraction of th_over up to which the TTL stays at ttl_max", min=0.0, max=1.0
    )
    slow_start: float = setting(
        30.0, help="seconds over which a new server's weight ramps up to full", min=0.0
    )
    smoothing: float = setting(
        1.0, help="time constant of the utilization average, seconds (0: no smoothing)", min=0.0
    )
    weight_floor: float = setting(
        0.05, help="a serving server keeps at least this fraction of its weight", min=0.0, max=1.0
    )
    share_gain: float = setting(
        0.1,
        help="the share correction's gain, per second and per unit of utilization a server is "
        "above (below) its pool's mean: its weight falls (rises) by that fraction a second, so "
        "servers that resolvers or clients skew come back to the pool's mean; 0: off (and with "
        "weight_function equal)",
        min=0.0,
        max=10.0,
    )
    share_bound: float = setting(
        4.0,
        help="the share correction multiplies a weight by at most this, and divides it by at "
        "most this",
        min=1.0,
        max=100.0,
    )
    hold_within: float = setting(
        0.0,
        help="a pool's published answers stay while its members keep their states and, in "
        "each address family, at most this fraction of the answers would go to other servers "
        "and the TTLs moved by at most this fraction (share-weighted): fewer plans for pdns to "
        "compile, at that much balance; 0: published again at every change of the answers",
        min=0.0,
        max=1.0,
    )
    fallback: Fallback = setting(
        Fallback.FAIL_OPEN,
        help="answer when no server is eligible: fail_open, least_loaded, nodata",
    )
    ttl_function: str = setting(
        "convex",
        help="TTL curve from ttl_max at the knee to ttl_min at th_over: linear or convex "
        "(convex keeps TTLs long until the load is near th_over; chosen by docs/simulation.md)",
    )
    weight_function: str = setting(
        "spare_squared",
        help="weight from utilization u: spare (1 - u), spare_squared ((1 - u)^2, favours idle "
        "servers more; chosen by docs/simulation.md) or equal (plain round-robin)",
    )

    @property
    def corrects_shares(self) -> bool:
        """Whether weights carry a share correction (:func:`correct_shares`): a gain above 0,
        and weights that follow load (plain round-robin's ``equal`` weights stay equal)."""
        return self.share_gain > 0 and self.weight_function != "equal"

    def config_problems(self) -> Iterator[str]:
        if self.ttl_min > self.ttl_max:
            yield f"ttl_min ({self.ttl_min}) must not exceed ttl_max ({self.ttl_max})"
        if self.hysteresis >= self.th_over:
            yield f"hysteresis ({self.hysteresis}) must be below th_over ({self.th_over})"
        if self.ttl_function not in TTL_FUNCTIONS:
            yield f"ttl_function must be one of {', '.join(TTL_FUNCTIONS)}"
        if self.weight_function not in WEIGHT_FUNCTIONS:
            yield f"weight_function must be one of {', '.join(WEIGHT_FUNCTIONS)}"


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """What the policy remembers about one server between ticks."""

    utilization: float  # the moving average
    sample: float  # the newest sample
    paused: bool
    at: float  # monotonic time of the newest sample
    resumed_at: float | None = None  # monotonic time it last resumed


def capacity_limit(capacities: list[int], spread: float) -> int | None:
    """The most max concurrency a server's (or node's) own report may count for: ``spread``
    times the lower median of ``capacities`` (those of its pool or cluster), rounded up; None
    when there are none. Sorts ``capacities`` in place.

    A weight is max concurrency times spare capacity, so an agent claiming 10^9 would draw
    nearly every answer (or connection). The lower median is what most say, which a minority,
    one of two included, cannot raise.
    """
    if not capacities:
        return None
    capacities.sort()
    return math.ceil(capacities[(len(capacities) - 1) // 2] * spread)


def smooth(previous: float, sample: float, elapsed: float, time_constant: float) -> float:
    """Exponential moving average over time: the weight of the past decays as exp(-t / tau)."""
    if time_constant <= 0 or elapsed <= 0:
        return sample if elapsed > 0 or time_constant <= 0 else previous
    alpha = 1.0 - math.exp(-elapsed / time_constant)
    return previous + alpha * (sample - previous)


def update_load(
    previous: ServerLoad | None, sample: float, at: float, policy: PoolPolicy
) -> ServerLoad:
    """Fold a utilization ``sample`` taken at monotonic time ``at`` into a server's load; the
    pause verdict stays as it was until :func:`judge_pause` gives the next one."""
    if previous is None:
        return ServerLoad(sample, sample, False, at)
    return ServerLoad(  # positional, in the order of the fields: made for every report
        smooth(previous.utilization, sample, at - previous.at, policy.smoothing),
        sample,
        previous.paused,
        at,
        previous.resumed_at,
    )


def judge_pause(
    load: ServerLoad, policy: PoolPolicy, threshold: float, now: float, *, room: bool = True
) -> ServerLoad:
    """The server's load with its pause verdict at monotonic time ``now`` against ``threshold``
    (its pool's :func:`pause_threshold`, with every server's newest sample folded in): it
    pauses as soon as either its newest sample or its average is above it (react to overload
    at once), and resumes only when both are below it less ``hysteresis`` (come back
    carefully).

    It pauses only when its pool has ``room`` (:func:`pause_room`) for its clients, and not
    within ``pause_dwell`` seconds of resuming: a server just resumed gets new clients with its
    low utilization, so it would be above the threshold again as soon as they come, and flip.
    (Holding a paused server out for a dwell time too left capacity idle: the autoscaler
    launched more, docs/simulation.md.)"""
    paused = is_paused(load.paused, max(load.sample, load.utilization), policy, threshold)
    if paused == load.paused:
        return load
    if not paused:
        return dataclasses.replace(load, paused=False, resumed_at=now)
    if not room or (load.resumed_at is not None and now - load.resumed_at < policy.pause_dwell):
        return load
    return dataclasses.replace(load, paused=True)


def pause_room(policy: PoolPolicy, pool_load: float, unpaused: int) -> bool:
    """Whether a pool whose servers' utilizations add up to ``pool_load`` (the paused ones'
    included: their clients are still leaving them) has room to pause one of its ``unpaused``
    servers: the others could take the whole load and stay below ``th_over``. Always, with the
    paper's rule (``pause_relative`` 0).

    Pausing moves whole resolvers' clients. Without room, the servers that took them went
    above the threshold in turn: at 90 % of a pool's capacity servers flipped between paused
    and resumed hundreds of times an hour, with a worse mean response and balance than never
    pausing (the simulator; docs/simulation.md). In a large pool this is the hot pool's rule
    (:func:`pause_threshold`); in a small one it stops pausing sooner."""
    if policy.pause_relative <= 0:
        return True
    return unpaused > 1 and pool_load / (unpaused - 1) < policy.th_over


def pause_threshold(policy: PoolPolicy, pool_mean: float | None) -> float:
    """The utilization above which a server of a pool whose mean is ``pool_mean`` pauses:
    ``th_over``, or ``pause_relative`` times the pool's mean when that is higher; none (inf)
    while the pool's mean is at ``th_over`` or above.

    Pausing moves new clients from a server to the others, which must have room for them. In
    a hot pool every server is above ``th_over``: pausing them in turns sent every new resolver
    to the few not paused, for a whole TTL, and those were next (the lab and the simulator);
    even pausing only the servers at 2 or 3 times the pool's mean left capacity idle while the
    rest queued (the simulator; docs/simulation.md). There the autoscaler carries the load, and
    the weights (all at their floor) share it evenly. ``pause_relative`` 0 is the paper's rule:
    ``th_over`` alone, whatever the pool.
    """
    if pool_mean is None or policy.pause_relative <= 0:
        return policy.th_over
    if pool_mean >= policy.th_over:
        return math.inf
    return max(policy.th_over, policy.pause_relative * pool_mean)


def is_paused(was_paused: bool, utilization: float, policy: PoolPolicy, threshold: float) -> bool:
    """Pause above ``threshold`` (:func:`pause_threshold`); once paused, stay paused until below
    ``threshold - hysteresis`` (never, when the policy does not pause)."""
    if not policy.pause:
        return False
    if was_paused:
        return utilization >= threshold - policy.hysteresis - 1e-9  # 0.8 - 0.1 > 0.7
    return utilization > threshold


def _spare(utilization: float) -> float:
    return max(0.0, 1.0 - utilization)


def _spare_squared(utilization: float) -> float:
    return max(0.0, 1.0 - utilization) ** 2


def _equal(utilization: float) -> float:
    return 1.0


WEIGHT_FUNCTIONS: dict[str, Callable[[float], float]] = {
    "spare": _spare,
    "spare_squared": _spare_squared,
    "equal": _equal,  # plain round-robin: every serving server alike, whatever its load
}


def member_weight(
    utilization: float,
    max_concurrency: int,
    serving_for: float,
    policy: PoolPolicy,
    correction: float = 0.0,
) -> float:
    """A serving server's weight: its spare capacity, ramped up after it starts serving, times
    its share correction (``exp(correction)``, :func:`correct_shares`).

    ``serving_for`` is how long the server has been in the answers (seconds). The slow start
    begins at ``1 / 20`` of the weight, so a new server gets some traffic at once.
    """
    spare = max(WEIGHT_FUNCTIONS[policy.weight_function](utilization), policy.weight_floor)
    ramp = 1.0
    if policy.slow_start > 0 and serving_for < policy.slow_start:
        ramp = max(0.05, serving_for / policy.slow_start)
    return max_concurrency * spare * ramp * share_factor(correction, policy)


def share_factor(correction: float, policy: PoolPolicy) -> float:
    """The factor a share ``correction`` (:func:`correct_shares`) puts on a weight: between
    ``1 / share_bound`` and ``share_bound``; 1 while the pool corrects no shares."""
    if not correction or not policy.corrects_shares:
        return 1.0
    bound = math.log(policy.share_bound)
    return math.exp(min(bound, max(-bound, correction)))


def inferred_correction(
    weight: float,
    utilization: float,
    max_concurrency: int,
    serving_for: float,
    policy: PoolPolicy,
) -> float | None:
    """The share correction (:func:`correct_shares`) a published ``weight`` was made with by
    :func:`member_weight` from the rest, within the pool's bounds; None when the weight cannot
    tell: the pool corrects no shares, the server was still in its slow start, or the weight is
    under 1 (a plan rounds weights to hundredths) or at ``MAX_WEIGHT`` (cut there).

    A manager that takes over, or starts again, reads its share corrections back from the plan
    last published this way, instead of learning them again from nothing while order-keeping
    resolvers skew the pool (``utilization`` is the plan's, rounded as the weight was made)."""
    if not policy.corrects_shares or not 1.0 <= weight < MAX_WEIGHT or max_concurrency < 1:
        return None
    if policy.slow_start > 0 and serving_for < policy.slow_start:
        return None
    spare = max(WEIGHT_FUNCTIONS[policy.weight_function](utilization), policy.weight_floor)
    if not spare > 0:
        return None
    bound = math.log(policy.share_bound)
    return min(bound, max(-bound, math.log(weight / (max_concurrency * spare))))


SHARE_STEP = 5.0
"""Longest time, in seconds, one share correction integrates over (a tick held up for a minute
must not move the weights by a minute's worth at once)."""
SHARE_UTILIZATION = 2.0
"""Utilization counted at most in a share correction: a queue ten times a server's slots is
not ten times the reason to move its clients (and a report may say anything)."""


def correct_shares(
    corrections: Sequence[float], utilizations: Sequence[float], elapsed: float, policy: PoolPolicy
) -> list[float]:
    """The share corrections (natural logarithms of weight factors) of a pool's answered servers
    after ``elapsed`` seconds at ``utilizations``: the integral of how far each server is above
    its pool's mean utilization, times ``-share_gain``, at most ``log(share_bound)`` either way.

    The weights (:func:`member_weight`) follow each server's spare capacity at once, but the
    load a weight brings depends on who resolves: a resolver that keeps the answer's order
    sends all its users to the first address for a whole TTL, clients that ignore TTLs stay,
    and a slower server is busier at the same share. What remains after the weights have acted
    is a bias that persists, and an integral term removes it: a server that stays above its
    pool's mean loses weight until it is not. The corrections are centred (their mean is 0:
    only ratios of weights matter), and a correction at its bound stops there (anti-windup:
    it comes back as soon as the error turns). Fewer than two servers: nothing to correct.
    """
    count = len(corrections)
    if count < 2 or not policy.corrects_shares or elapsed <= 0:
        return list(corrections)
    loads = [min(SHARE_UTILIZATION, max(0.0, u)) for u in utilizations]
    mean = sum(loads) / count
    step = policy.share_gain * min(elapsed, SHARE_STEP)
    moved = [c - step * (load - mean) for c, load in zip(corrections, loads, strict=True)]
    centre = sum(moved) / count
    bound = math.log(policy.share_bound)
    return [min(bound, max(-bound, c - centre)) for c in moved]


def _linear(fraction: float) -> float:
    return fraction


def _convex(fraction: float) -> float:
    return fraction * fraction


TTL_FUNCTIONS: dict[str, Callable[[float], float]] = {"linear": _linear, "convex": _convex}


def member_ttl(utilization: float, policy: PoolPolicy) -> int:
    """A server's TTL: ``ttl_max`` up to ``ttl_knee * th_over``, down to ``ttl_min`` at th_over.

    The curve between is ``ttl_function`` of how far the load has gone from the knee to
    ``th_over`` (convex by default: it stays long, then drops near th_over); at or above
    ``th_over`` the TTL is ``ttl_min``.
    """
    knee = policy.ttl_knee * policy.th_over
    if utilization <= knee:
        return policy.ttl_max
    if utilization >= policy.th_over:
        return policy.ttl_min
    fraction = (utilization - knee) / (policy.th_over - knee)
    drop = TTL_FUNCTIONS[policy.ttl_function](fraction)
    return round(policy.ttl_max - drop * (policy.ttl_max - policy.ttl_min))


class MemberValues(NamedTuple):
    """What the plan carries for one member: utilization, weight and TTL, rounded as published.
    (A named tuple: the planner makes one for every server at every tick, and a frozen
    dataclass takes twice as long to make.)"""

    utilization: float
    weight: float
    ttl: int


def member_values(
    utilization: float | None,
    max_concurrency: int | None,
    serving_for: float,
    policy: PoolPolicy,
    *,
    answered: bool,
    pool_serving: int | None = None,
    correction: float = 0.0,
) -> MemberValues:
    """A member's plan values, as the manager's planner builds them.

    ``utilization`` is the smoothed average (None before the first report) and is rounded to
    thousandths before weight and TTL are computed from it, so a plan read back gives the same
    values. A member that is not ``answered`` (paused, down, draining) gets weight 0 and the
    TTL floor ``ttl_min``; an answered one its :func:`member_weight` (rounded to hundredths, as
    plans carry it) and :func:`member_ttl`, at most :func:`answer_ttl_cap` of its pool's
    ``pool_serving`` servers. A server that has not said its max concurrency counts as 1.
    """
    rounded = round(utilization, 3) if utilization is not None else 0.0
    if not answered:
        return MemberValues(rounded, 0.0, policy.ttl_min)
    weight = member_weight(rounded, max_concurrency or 1, serving_for, policy, correction)
    ttl = member_ttl(rounded, policy)
    if pool_serving is not None and pool_serving < policy.k:
        ttl = min(ttl, answer_ttl_cap(policy, pool_serving))
    return MemberValues(rounded, min(MAX_WEIGHT, round(weight, 2)), ttl)


def covering_k(policy: PoolPolicy, active: int, holders: float | None) -> int:
    """Addresses per answer for a pool of ``active`` answered servers whose answers about
    ``holders`` resolvers hold at a time (None: not known): ``k``, or more when so few
    resolvers hold answers that their ``holders * k`` addresses cover the pool fewer than
    ``k_coverage`` times, up to every active server.

    Each resolver sends its users to the few addresses it holds: the first one if it keeps the
    answer's order, each in turn if it rotates. With 4 resolvers, 4 addresses each cover 16
    places for 10 servers, and whichever servers they name carry the load while the others
    idle; more addresses spread each resolver's users over more servers (the simulator on the
    lab's load: 26 % faster than plain round-robin with 4 resolvers keeping the order, where
    k = 4 was 10 %; docs/simulation.md). With many resolvers the weights spread the load and
    ``k`` stays as configured."""
    k = policy.k
    if policy.k_coverage <= 0 or holders is None or active <= k:
        return k
    need = math.ceil(policy.k_coverage * active / max(1.0, holders))
    return min(need, active, MAX_K) if need > k else k


def covering_ttl_min(policy: PoolPolicy, active: int, holders: float | None) -> int:
    """The TTL floor for a pool of ``active`` answered servers whose answers about ``holders``
    resolvers hold at a time (None: not known): ``ttl_min``, or shorter in proportion while
    fewer than ``k_coverage`` resolvers per server hold them, down to 1 s.

    All the users of a resolver that keeps the answer's order go to its first address, and they
    move only when its answer expires: with 4 resolvers for 10 servers, four lumps that k
    cannot split. Shorter TTLs move them more often, which spreads them over time (the
    simulator on the lab's load past capacity: 1.27 s against 1.54 s with the floor at 5 s,
    and 2.15 s for plain round-robin; docs/simulation.md). The queries the floor costs
    (``holders`` over it) stay within those of ``k_coverage`` resolvers per server at
    ``ttl_min``; with many resolvers the floor is the policy's, and a fixed TTL (``ttl_min``
    equal to ``ttl_max``, as plain round-robin) stays fixed."""
    floor = policy.ttl_min
    if policy.k_coverage <= 0 or holders is None or active <= 0 or not 1 < floor < policy.ttl_max:
        return floor
    wanted = policy.k_coverage * active
    if holders >= wanted:
        return floor
    return max(1, round(floor * max(0.0, holders) / wanted))


def answer_ttl_cap(policy: PoolPolicy, serving: int | None) -> int:
    """The longest TTL of a pool of ``serving`` servers: ``ttl_max`` from ``k`` servers on,
    down in proportion to ``ttl_min`` with fewer (None: no cap).

    An answer of fewer than ``k`` addresses holds the whole pool: every resolver gets the same
    few servers, and a server the autoscaler adds takes users only as those answers expire.
    With one idle server a 60 s TTL kept a step load on it for a minute while five new servers
    waited (docs/simulation.md).
    """
    if serving is None or serving >= policy.k:
        return policy.ttl_max
    return policy.ttl_min + (policy.ttl_max - policy.ttl_min) * serving // policy.k
