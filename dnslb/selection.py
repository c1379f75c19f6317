"""Which addresses a load-balanced name answers with: weighted round-robin over k distinct members.

All of the work is done once per plan, not per query. A pool's active members get integer shares
of a cycle (:func:`quantize`), the cycle spreads each member's slots evenly (:func:`interleave`,
WF2Q: any stretch of the cycle holds each member within two slots of its share), and every
position of the cycle gets its answer: the first ``k`` distinct members met from there on
(:func:`windows`). A query then only takes the next precomputed answer. The first address of the
answers follows the weights exactly over a cycle; appearances follow them as far as ``k`` distinct
addresses per answer allows (a member can appear at most once per answer).

:func:`rotation` walks the cycle; each lap starts at a random offset, so that separate processes
(pdns runs one pipe backend per thread) do not move in lockstep and a caller that consumes every
second answer still sees every position over time.

The pipe backend and the simulator both answer through :func:`pool_answers`.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dnslb.plan import Fallback, Member, MemberState, Pool

DEFAULT_RESOLUTION = 240
"""Slots a cycle is divided into (before reduction by the common divisor); weights are kept to
about 1/240 of the total, far finer than utilization is measured."""

_T = TypeVar("_T")


def quantize(weights: Sequence[float], resolution: int = DEFAULT_RESOLUTION) -> list[int]:
    """Integer slot counts proportional to ``weights`` (about ``resolution`` in all).

    Every positive weight gets at least one slot; zero weights get none. The counts are divided
    by their greatest common divisor, so equal weights give one slot each.
    """
    total = sum(weights)
    if total <= 0:
        return [0] * len(weights)
    counts = [
        0 if weight <= 0 else max(1, round(weight * resolution / total)) for weight in weights
    ]
    divisor = math.gcd(*counts)
    return [count // divisor for count in counts]


def interleave(counts: Sequence[int]) -> list[int]:
    """A cycle in which index ``i`` appears ``counts[i]`` times, each index evenly spread.

    Worst-case fair weighted fair queueing (WF2Q): slot ``j`` of index ``i`` may start at virtual
    time ``j / counts[i]`` and finishes at ``(j + 1) / counts[i]``; each step serves, among the
    slots that may start, the one finishing first (ties to the lower index). Every prefix of the
    cycle then holds each index within one slot of its exact share, so every stretch of it
    holds each index within two. ``O(L log n)`` for a cycle of ``L`` slots over ``n`` indices.
    Equal counts give plain round-robin ``0, 1, 2, ...``.
    """
    length = sum(counts)
    waiting = [(0.0, index) for index, count in enumerate(counts) if count > 0]
    heapq.heapify(waiting)
    ready: list[tuple[float, int]] = []
    served = [0] * len(counts)
    cycle: list[int] = []
    for step in range(length):
        now = step / length + 1e-12
        while waiting and waiting[0][0] <= now:
            _, index = heapq.heappop(waiting)
            heapq.heappush(ready, ((served[index] + 1) / counts[index], index))
        _, index = heapq.heappop(ready)
        cycle.append(index)
        served[index] += 1
        if served[index] < counts[index]:
            heapq.heappush(waiting, (served[index] / counts[index], index))
    return cycle


def windows(cycle: Sequence[int], k: int) -> list[tuple[int, ...]]:
    """For every position of ``cycle``, the first ``k`` distinct indices from there on (wrapping).

    Runs backwards over two laps: the answer at a position is its own index followed by the answer
    of the next position without that index. ``O(len(cycle) * k)``.
    """
    length = len(cycle)
    result: list[tuple[int, ...]] = [()] * length
    current: tuple[int, ...] = ()
    for position in range(2 * length - 1, -1, -1):
        index = cycle[position % length]
        current = (index, *(other for other in current if other != index))[:k]
        if position < length:
            result[position] = current
    return result


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
    v4 = [member for member in pool.members if not member.ipv6]
    v6 = [member for member in pool.members if member.ipv6]
    return PoolAnswers(
        v4=family_answers(v4, pool, stale=stale, resolution=resolution),
        v6=family_answers(v6, pool, stale=stale, resolution=resolution),
    )


def family_answers(
    members: Sequence[Member], pool: Pool, *, stale: bool, resolution: int = DEFAULT_RESOLUTION
) -> tuple[Answer, ...]:
    """The answer cycle over ``members`` (one address family of ``pool``)."""
    active = [member for member in members if member.state is MemberState.ACTIVE]
    if not active:
        chosen = fallback_members(members, pool.fallback, pool.k)
        return (Answer(members=chosen, ttl=pool.ttl_floor, fallback=True),)
    weights = [member.weight for member in active]
    if sum(weights) <= 0:  # only zero weights left: they are still healthy, share alike
        weights = [1.0] * len(active)
    cycle = interleave(quantize(weights, resolution))
    answers: list[Answer] = []
    for window in windows(cycle, pool.k):
        chosen = tuple(active[index] for index in window)
        answers.append(Answer(members=chosen, ttl=answer_ttl(chosen, pool, stale=stale)))
    return tuple(answers)


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
