"""Which addresses a load-balanced name answers with: weighted round-robin over k distinct members.

All of the work is done once per plan, not per query. A pool's active members get integer shares
of a cycle (:func:`quantize`), and every position of the cycle gets its answer of ``k`` distinct
members (:func:`cycle_answers`). Over a cycle, each member comes first in exactly its share of
the answers, and appears in exactly its share of ``k`` addresses per answer (as far as ``k``
distinct addresses allow: a member can be at most in every answer, and its excess goes to the
others in proportion, :func:`appearance_targets`). Both are spread evenly over the cycle. A query
then only takes the next precomputed answer.

:func:`rotation` walks the cycle; each lap starts at a random offset, so that separate processes
(pdns runs one pipe backend per thread) do not move in lockstep and a caller that consumes every
second answer still sees every position over time.

The pipe backend and the simulator both answer through :func:`pool_answers`.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dnslb.plan import Fallback, Member, MemberState, Pool

DEFAULT_RESOLUTION = 240
"""Slots a cycle is divided into (before reduction by the common divisor); weights are kept to
about 1/240 of the total, far finer than utilization is measured."""

_T = TypeVar("_T")


def quantize(weights: Sequence[float], resolution: int = DEFAULT_RESOLUTION) -> list[int]:
    """Integer slot counts proportional to ``weights`` (about ``resolution`` in all).

    Every positive weight gets at least one slot; zero, negative and non-finite weights get
    none. The counts are divided by their greatest common divisor, so equal weights give one
    slot each. Weights are scaled by the largest first, so no sum of them can overflow.
    """
    usable = [weight if math.isfinite(weight) and weight > 0 else 0.0 for weight in weights]
    top = max(usable, default=0.0)
    if top <= 0:
        return [0] * len(weights)
    scaled = [weight / top for weight in usable]
    total = sum(scaled)  # at most len(weights): finite
    counts = [0 if weight <= 0 else max(1, round(weight * resolution / total)) for weight in scaled]
    divisor = math.gcd(*counts)
    return [count // divisor for count in counts]


def _capped(counts: Sequence[int], k: int) -> tuple[int, list[int], list[int], int, int]:
    """``(width, capped, free, slots, weight)``: answers have ``width`` indices; ``capped`` ones
    are in every answer; ``free`` ones share ``slots`` appearances by count (``weight`` in all).
    """
    length = sum(counts)
    active = [index for index, count in enumerate(counts) if count > 0]
    width = min(k, len(active))
    capped: list[int] = []
    while True:
        free = [index for index in active if index not in capped]
        slots = (width - len(capped)) * length
        weight = sum(counts[index] for index in free)
        over = [index for index in free if counts[index] * slots >= length * weight]
        if not over:
            return width, capped, free, slots, weight
        capped += over


def appearance_targets(counts: Sequence[int], k: int) -> list[int]:
    """How many positions of a cycle of ``sum(counts)`` positions each index should appear in.

    Each position holds ``min(k, indices with a count)`` distinct indices, so the targets add
    up to that many per position. They are proportional to ``counts`` except that no index can
    be in more than every position: such indices are capped and their excess is shared among
    the others in proportion (largest remainders, ties to the lower index).
    """
    length = sum(counts)
    _, capped, free, slots, weight = _capped(counts, k)
    targets = [0] * len(counts)
    for index in capped:
        targets[index] = length
    for index in free:
        targets[index] = counts[index] * slots // weight
    extra = slots - sum(targets[index] for index in free)
    by_remainder = sorted(free, key=lambda index: (-(counts[index] * slots % weight), index))
    for index in by_remainder[:extra]:
        targets[index] += 1
    return targets


MAX_CYCLE = 4 * DEFAULT_RESOLUTION
"""Longest cycle :func:`cycle_answers` lengthens a short one to, so that appearance shares that
do not divide it evenly come out exact (or within ``1 / MAX_CYCLE``)."""


def cycle_scale(counts: Sequence[int], k: int, max_length: int = MAX_CYCLE) -> int:
    """The factor to repeat ``counts`` by so that :func:`appearance_targets` are exact shares.

    Appearance shares are fractions with the free indices' total count as denominator; a cycle
    of ``sum(counts)`` positions may not hold them exactly (weights 4:3:2:1:1:1 with ``k = 4``
    ask for 0.8 of the answers for the third: 9.6 of 12). The factor is the smallest that makes
    every share whole, capped so the cycle stays within ``max_length`` (never below 1).
    """
    length = sum(counts)
    _, _, free, slots, weight = _capped(counts, k)
    if not free:
        return 1  # every index in every answer: nothing to round
    common = math.gcd(*(counts[index] for index in free))
    needed = weight // math.gcd(weight, slots * common)
    return max(1, min(needed, max_length // length))


Pace = Callable[[], None] | None
"""Called every :data:`PACE_STEPS` positions while a cycle is computed, if given: where a caller
on a thread may rest (the pipe backend's loader rests so that its host's CPUs stay free for
answering; a pool's cycle takes milliseconds)."""

PACE_STEPS = 16


def cycle_answers(counts: Sequence[int], k: int, pace: Pace = None) -> list[tuple[int, ...]]:
    """The answers of a cycle of ``sum(counts)`` positions: at each, ``min(k, n)`` distinct
    indices (``n`` indices with a count), the first one listed first.

    Over the cycle, index ``i`` comes first in exactly ``counts[i]`` answers and appears in
    exactly :func:`appearance_targets` of them: both follow the weights, as far as ``k``
    distinct indices per answer allows. Both are spread evenly: which indices appear is
    scheduled like WF2Q on ``width`` servers (an index's ``j``-th appearance may start at
    virtual time ``j / target`` of the cycle and should finish by ``(j + 1) / target``; each
    position serves the ``width`` earliest finishing, one appearance per index), with any index
    that needs every remaining position taken first, which makes the counts exact. The first
    of each answer is chosen the same way over ``counts``, and the others follow in the order
    they come first next (equal weights give plain rotation); the rare answer where that greedy
    choice misses is put right by moving firsts along an augmenting path (a transfer of one
    first place at a time from an index that has too many to one that has too few).
    ``O(L k log n)`` for a cycle of ``L`` positions.
    """
    sets = _appearance_sets(counts, appearance_targets(counts, k), pace)
    answers = _order_firsts(sets, counts, pace)
    _repair_firsts(answers, counts)
    return [tuple(answer) for answer in answers]


def _appearance_sets(
    counts: Sequence[int], targets: Sequence[int], pace: Pace = None
) -> list[list[int]]:
    length = sum(counts)
    width = sum(targets) // length if length else 0
    served = [0] * len(targets)
    remaining = list(targets)
    # Entries carry the served count they were made at: a later count makes them stale.
    waiting = [(0.0, 0, index) for index, target in enumerate(targets) if target]
    ready: list[tuple[float, int, int]] = []
    urgent = [(length - target, target, index) for index, target in enumerate(targets) if target]
    heapq.heapify(waiting)
    heapq.heapify(urgent)
    sets: list[list[int]] = []
    for step in range(length):
        if pace is not None and not step % PACE_STEPS:
            pace()
        now = step + 1e-9
        while waiting and waiting[0][0] <= now:
            _, count, index = heapq.heappop(waiting)
            if count == served[index]:
                heapq.heappush(ready, ((count + 1) * length / targets[index], count, index))
        chosen: list[int] = []
        taken: set[int] = set()
        # An index whose remaining appearances fill every remaining position must be in this
        # one; there are never more of them than ``width`` (their sum would exceed the slots).
        while urgent and urgent[0][0] <= step:
            _, left, index = heapq.heappop(urgent)
            if left == remaining[index] and index not in taken:
                chosen.append(index)
                taken.add(index)
        for queue in (ready, waiting):
            while len(chosen) < width and queue:
                _, count, index = heapq.heappop(queue)
                if count == served[index] and index not in taken:
                    chosen.append(index)
                    taken.add(index)
        for index in chosen:
            served[index] += 1
            remaining[index] -= 1
            if remaining[index]:
                start = served[index] * length / targets[index]
                heapq.heappush(waiting, (start, served[index], index))
                heapq.heappush(urgent, (length - remaining[index], remaining[index], index))
        sets.append(chosen)
    return sets


def _order_firsts(
    sets: list[list[int]], counts: Sequence[int], pace: Pace = None
) -> list[list[int]]:
    length = len(sets)
    firsts_left = list(counts)
    appearances_left = [0] * len(counts)
    for chosen in sets:
        for index in chosen:
            appearances_left[index] += 1
    firsts = [0] * len(counts)
    answers: list[list[int]] = []
    for step, chosen in enumerate(sets):
        if pace is not None and not step % PACE_STEPS:
            pace()
        candidates = [index for index in chosen if firsts_left[index]] or chosen
        must = [index for index in candidates if firsts_left[index] >= appearances_left[index]]
        started = [index for index in candidates if firsts[index] * length <= step * counts[index]]
        pool = must or started or candidates
        best = min(pool, key=lambda index: ((firsts[index] + 1) / counts[index], index))
        firsts_left[best] -= 1
        firsts[best] += 1
        for index in chosen:
            appearances_left[index] -= 1
        # The others in the order they come first next: equal weights give plain rotation.
        rest = sorted(
            (index for index in chosen if index != best),
            key=lambda index: ((firsts[index] + 1) / counts[index], index),
        )
        answers.append([best, *rest])
    return answers


def _repair_firsts(answers: list[list[int]], counts: Sequence[int]) -> None:
    firsts = [0] * len(counts)
    holding: list[set[int]] = [set() for _ in counts]  # positions an index is in, not first
    for position, answer in enumerate(answers):
        firsts[answer[0]] += 1
        for index in answer[1:]:
            holding[index].add(position)
    short = [index for index, count in enumerate(counts) if firsts[index] < count]
    while short:
        start = short[-1]
        # Breadth-first: ``index`` may take the first place at ``position`` from its holder.
        parent: dict[int, tuple[int, int] | None] = {start: None}
        queue = collections.deque([start])
        found = None
        while queue and found is None:
            index = queue.popleft()
            for position in sorted(holding[index]):
                holder = answers[position][0]
                if holder in parent:
                    continue
                parent[holder] = (index, position)
                if firsts[holder] > counts[holder]:
                    found = holder
                    break
                queue.append(holder)
        if found is None:
            return  # cannot happen for sets from _appearance_sets; never loop on it
        firsts[found] -= 1
        firsts[start] += 1
        link = parent[found]
        while link is not None:
            index, position = link
            answer = answers[position]
            holder = answer[0]
            answer.remove(index)
            answer.insert(0, index)
            holding[index].discard(position)
            holding[holder].add(position)
            link = parent[index]
        if firsts[start] == counts[start]:
            short.pop()


@dataclass(frozen=True, slots=True)
class Answer:
    """The addresses of one answer (one address family) and the TTL it carries."""

    members: tuple[Member, ...]
    ttl: int
    fallback: bool = False  # True when the pool's fallback policy chose these


@dataclass(frozen=True, slots=True)
class PoolAnswers:
    """Every answer a pool gives per address family, in cycle order (never empty)."""

    v4: tuple[Answer, ...]
    v6: tuple[Answer, ...]


def pool_answers(
    pool: Pool, *, stale: bool = False, resolution: int = DEFAULT_RESOLUTION
) -> PoolAnswers:
    """The answer cycle of each address family of ``pool``.

    ``stale`` (the plan is older than its ``stale_after``) gives every answer the TTL floor, so
    clients come back soon once the manager is back.
    """
    return PoolAnswers(
        v4=family_answers(
            family_members(pool, ipv6=False), pool, stale=stale, resolution=resolution
        ),
        v6=family_answers(
            family_members(pool, ipv6=True), pool, stale=stale, resolution=resolution
        ),
    )


def family_members(pool: Pool, *, ipv6: bool) -> list[Member]:
    """``pool``'s members of one address family, in the pool's order."""
    return [member for member in pool.members if member.ipv6 == ipv6]


def family_answers(
    members: Sequence[Member],
    pool: Pool,
    *,
    stale: bool,
    resolution: int = DEFAULT_RESOLUTION,
    pace: Pace = None,
) -> tuple[Answer, ...]:
    """The answer cycle over ``members`` (one address family of ``pool``); ``pace`` as for
    :func:`cycle_answers`."""
    active = [member for member in members if member.state is MemberState.ACTIVE]
    if not active:
        chosen = fallback_members(members, pool.fallback, pool.k)
        return (Answer(members=chosen, ttl=pool.ttl_floor, fallback=True),)
    counts = _slots(active, resolution)
    scale = cycle_scale(counts, pool.k)
    answers: list[Answer] = []
    for step, indices in enumerate(
        cycle_answers([count * scale for count in counts], pool.k, pace)
    ):
        if pace is not None and not step % PACE_STEPS:
            pace()
        chosen = tuple(active[index] for index in indices)
        answers.append(Answer(members=chosen, ttl=answer_ttl(chosen, pool, stale=stale)))
    return tuple(answers)


def _slots(active: Sequence[Member], resolution: int) -> list[int]:
    weights = [member.weight for member in active]
    if sum(weights) <= 0:  # only zero weights left: they are still healthy, share alike
        weights = [1.0] * len(active)
    return quantize(weights, resolution)


FamilyKey = tuple[object, ...]


def family_key(
    members: Sequence[Member], pool: Pool, *, stale: bool, resolution: int = DEFAULT_RESOLUTION
) -> FamilyKey:
    """Everything :func:`family_answers` over ``members`` depends on, as one value: two calls
    with equal keys give the same cycle (the same ids, addresses and TTLs at every position).

    A weight counts only as the slots it quantizes to, and a utilization only where it orders
    a fallback: the manager moves both a little at every tick, and a pool whose cycle did not
    change is then not computed again (the pipe backend keeps cycles by this key).
    """
    active = [member for member in members if member.state is MemberState.ACTIVE]
    shape = tuple((m.id, m.address, m.state, m.ttl) for m in members)
    common = (pool.k, pool.ttl_floor, stale, resolution, shape)
    if not active:
        return (*common, pool.fallback, tuple(m.utilization for m in members))
    return (*common, tuple(_slots(active, resolution)))


def answers_key(pool: Pool, *, resolution: int = DEFAULT_RESOLUTION) -> FamilyKey | None:
    """Everything ``pool``'s answers depend on, fresh or stale, as one value: the pool but for
    its members, the members' locations, and each address family's :func:`family_key` (where
    a weight counts only as its slots in the cycle and a utilization only where it orders a
    fallback). None for a pool with client networks or a GeoIP database: its locations' shares
    follow the weights and utilizations themselves."""
    if pool.networks or pool.geoip is not None:
        return None
    families = tuple(
        family_key(family_members(pool, ipv6=ipv6), pool, stale=False, resolution=resolution)
        for ipv6 in (False, True)
    )
    locations = tuple(member.location for member in pool.members)
    return (dataclasses.replace(pool, members=()), locations, families)


def answer_ttl(members: Sequence[Member], pool: Pool, *, stale: bool) -> int:
    """An answer's TTL: the lowest of its members', never below the pool's floor."""
    if stale or not members:
        return pool.ttl_floor
    return max(pool.ttl_floor, min(member.ttl for member in members))


def fallback_members(members: Sequence[Member], policy: Fallback, k: int) -> tuple[Member, ...]:
    """Whom to answer when no member is active, least loaded first (ties by id).

    ``least_loaded`` and ``fail_open`` answer paused members; with none paused, ``fail_open``
    answers the down ones (a health checker that sees everything down is more likely broken
    than the whole pool). Draining and disabled members are never answered.
    """
    if policy is Fallback.NODATA:
        return ()
    states = [MemberState.PAUSED]
    if policy is Fallback.FAIL_OPEN:
        states.append(MemberState.DOWN)
    for state in states:
        candidates = sorted(
            (member for member in members if member.state is state),
            key=lambda member: (member.utilization, member.id),
        )
        if candidates:
            return tuple(candidates[:k])
    return ()


def rotation(
    items: Sequence[_T], rng: random.Random, counts: list[int] | None = None
) -> Iterator[_T]:
    """Endless laps over ``items``, each lap starting at a random offset.

    With ``counts`` (one slot per item), each item given out is counted: what the pipe backend
    reports as the answers it actually gave.
    """
    size = len(items)
    if counts is None:
        if size == 1:
            while True:
                yield items[0]
        while True:
            offset = rng.randrange(size)
            yield from items[offset:]
            yield from items[:offset]
    while True:
        offset = rng.randrange(size)
        for index in range(offset, size):
            counts[index] += 1
            yield items[index]
        for index in range(offset):
            counts[index] += 1
            yield items[index]


def answer_counts(answers: Sequence[Answer], counts: Sequence[int]) -> dict[str, tuple[int, int]]:
    """Per member id: (answers it came first in, answers it was in), from per-position counts."""
    totals: dict[str, list[int]] = {}
    for answer, count in zip(answers, counts, strict=True):
        if not count:
            continue
        for place, member in enumerate(answer.members):
            slot = totals.setdefault(member.id, [0, 0])
            slot[1] += count
            if place == 0:
                slot[0] += count
    return {member: (first, seen) for member, (first, seen) in totals.items()}


def answers_held(answers: Sequence[Answer], counts: Sequence[int]) -> tuple[int, int]:
    """``(given, held)``: the answers with addresses given out, from per-position counts, and
    the seconds they were held for, their TTLs added up. Over a window, ``held`` divided by
    its length is how many resolvers held an answer at a time (Little's law)."""
    given = held = 0
    for answer, count in zip(answers, counts, strict=True):
        if count and answer.members:
            given += count
            held += count * answer.ttl
    return given, held


def answer_shares(answers: PoolAnswers) -> dict[str, tuple[float, float]]:
    """Per member id: the share of its address family's answers it comes first in and the
    share it is in (each 0 to 1), over one rotation. Fallback answers count like any other."""
    shares: dict[str, tuple[float, float]] = {}
    for family in (answers.v4, answers.v6):
        if not family:
            continue
        for member, (first, seen) in answer_counts(family, [1] * len(family)).items():
            shares[member] = (first / len(family), seen / len(family))
    return shares


def answers_near(pool: Pool, published: Pool, hold: float) -> bool:
    """Whether ``pool`` may be answered as ``published`` is: the same pool and members (ids,
    addresses, states, locations, in the same order), and in each address family

    * an active member (where none is, utilizations order the fallback: only equal
      :func:`answers_key` values may hold it);
    * shares of the cycle near the published ones: half the sum of the differences between
      each active member's share of the weight, new and published, at most ``hold`` (that is
      the fraction of answers that would go to other servers);
    * TTLs near the published ones: each active member's relative change of TTL, weighted by
      its published share, adds up to at most ``hold``.

    Pools with client networks or a GeoIP database never are (their locations' shares follow
    each weight).

    Weights and TTLs follow every report, so under a load that moves a little every second,
    every pool's answers moved a little at every tick, and every pipe backend compiled every
    pool again (docs/pdns.md, Big plans)."""
    if hold <= 0 or pool.networks or pool.geoip is not None:
        return False
    members, before = pool.members, published.members
    if len(members) != len(before):
        return False
    if dataclasses.replace(pool, members=()) != dataclasses.replace(published, members=()):
        return False
    present = [False, False]  # a member of the family (IPv4, IPv6)
    active: list[list[tuple[Member, Member]]] = [[], []]
    for member, old in zip(members, before, strict=True):
        state = member.state
        if (
            member.id != old.id
            or member.address != old.address
            or state is not old.state
            or member.location != old.location
        ):
            return False
        ipv6 = ":" in member.address
        present[ipv6] = True
        if state is MemberState.ACTIVE:
            active[ipv6].append((member, old))
    return all(
        _family_near(pairs, hold) for here, pairs in zip(present, active, strict=True) if here
    )


def _family_near(pairs: Sequence[tuple[Member, Member]], hold: float) -> bool:
    """:func:`answers_near` for one address family's active members, (new, published)."""
    if not pairs:
        return False
    total = sum(member.weight for member, _ in pairs)
    before = sum(old.weight for _, old in pairs)
    if not (0 < total < math.inf and 0 < before < math.inf):  # a NaN is not either
        return False
    moved = 0.0
    ttls = 0.0
    for member, old in pairs:
        share = old.weight / before
        moved += abs(member.weight / total - share)
        ttls += share * abs(member.ttl - old.ttl) / max(1, old.ttl)
    return moved / 2 <= hold and ttls <= hold
