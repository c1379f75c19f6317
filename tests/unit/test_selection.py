"""Weighted round-robin selection: the cycle, its k-distinct answers, fallback, rotation."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from dnslb.plan import Fallback, Member, MemberState, Network, Pool
from dnslb.selection import (
    Answer,
    FamilyKey,
    answer_ttl,
    answers_key,
    answers_near,
    appearance_targets,
    cycle_answers,
    fallback_members,
    family_answers,
    family_key,
    pool_answers,
    quantize,
    rotation,
)


def member(
    name: str,
    weight: float = 1.0,
    ttl: int = 60,
    state: MemberState = MemberState.ACTIVE,
    utilization: float = 0.0,
    address: str | None = None,
) -> Member:
    index = sum(map(ord, name)) % 250 + 1
    return Member(
        id=name,
        address=address or f"10.0.{len(name)}.{index}",
        weight=weight,
        ttl=ttl,
        state=state,
        utilization=utilization,
    )


def pool(
    *members: Member, k: int = 2, floor: int = 5, fallback: Fallback = Fallback.FAIL_OPEN
) -> Pool:
    return Pool(name="www.example.test", members=members, k=k, ttl_floor=floor, fallback=fallback)


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        pytest.param([1, 1, 1], [1, 1, 1], id="equal"),
        pytest.param([4, 3, 2, 1], [4, 3, 2, 1], id="small-integers"),
        pytest.param([0.5, 0.25, 0.25], [2, 1, 1], id="fractions"),
        pytest.param([1, 0, 1], [1, 0, 1], id="zero-stays-zero"),
        pytest.param([1000, 1], [240, 1], id="tiny-weight-keeps-a-slot"),
        pytest.param([0, 0], [0, 0], id="all-zero"),
    ],
)
def test_quantize(weights: list[float], expected: list[int]) -> None:
    assert quantize(weights) == expected


CASES = [[1, 1, 1], [3, 1], [5, 3, 2], [7, 1, 1, 1], [13, 8, 5, 3, 2, 1, 1], [1] * 40, [100, 1]]
CASES += [[4, 3, 2, 1], [10, 1, 1], [1, 1], [5], [2, 2, 2, 2, 2, 2], [1, 2, 3, 4]]


def _worst_stretch(lanes: list[list[int]], shares: list[float]) -> float:
    """The largest gap, over every stretch of the cycle (wrapping), between how often an index
    is in the stretch and its share of it."""
    length = len(lanes)
    worst = 0.0
    doubled = lanes + lanes
    for start in range(length):
        seen = [0] * len(shares)
        for width in range(1, length + 1):
            for index in doubled[start + width - 1]:
                seen[index] += 1
            worst = max(worst, *(abs(seen[i] - width * share) for i, share in enumerate(shares)))
    return worst


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("counts", CASES, ids=str)
def test_cycle_answers_give_exact_firsts_and_appearances(counts: list[int], k: int) -> None:
    answers = cycle_answers(counts, k)
    length = sum(counts)
    assert len(answers) == length
    width = min(k, len(counts))
    assert all(len(set(answer)) == len(answer) == width for answer in answers)
    assert Counter(answer[0] for answer in answers) == dict(enumerate(counts))
    targets = appearance_targets(counts, k)
    assert Counter(i for answer in answers for i in answer) == dict(enumerate(targets))
    # Spread evenly: every stretch within 3 slots of its share (first places) and within 2
    # (appearances); measured worst over these cases and 300 random ones: 2.4 and 1.75.
    assert _worst_stretch([[a[0]] for a in answers], [c / length for c in counts]) < 3
    assert _worst_stretch([list(a) for a in answers], [t / length for t in targets]) < 2


def test_appearances_of_the_issue_reach_the_weights() -> None:
    """k = 2 and weights 1:2:3:4 gave appearances 0.2 / 0.4 / 0.7 / 0.7 (the heaviest member was
    repeated across the cycle's wrap); 0.2 / 0.4 / 0.6 / 0.8 is what the weights ask for."""
    answers = cycle_answers([1, 2, 3, 4], 2)
    seen = Counter(i for answer in answers for i in answer)
    assert [seen[i] / len(answers) for i in range(4)] == [0.2, 0.4, 0.6, 0.8]


@pytest.mark.parametrize(
    ("counts", "k", "expected"),
    [
        pytest.param([1, 2, 3, 4], 2, [2, 4, 6, 8], id="proportional"),
        pytest.param([6, 1, 1], 2, [8, 4, 4], id="capped-at-every-answer"),
        pytest.param([5, 3, 1, 1], 3, [10, 10, 5, 5], id="two-capped"),
        pytest.param([3, 1], 8, [4, 4], id="k-above-members"),
        pytest.param([1, 0, 1], 2, [2, 0, 2], id="zero-count"),
    ],
)
def test_appearance_targets(counts: list[int], k: int, expected: list[int]) -> None:
    assert appearance_targets(counts, k) == expected
    assert sum(expected) == sum(counts) * min(k, sum(1 for c in counts if c))


def test_cycle_answers_are_exact_for_many_weights() -> None:
    rng = random.Random(5)
    for _ in range(400):
        counts = [rng.choice([1, 1, 2, 3, 5, 8, 13, 40]) for _ in range(rng.randint(1, 12))]
        k = rng.randint(1, 8)
        answers = cycle_answers(counts, k)
        assert Counter(a[0] for a in answers) == dict(enumerate(counts)), (counts, k)
        targets = dict(enumerate(appearance_targets(counts, k)))
        assert Counter(i for a in answers for i in a) == targets, (counts, k)


def test_huge_and_non_finite_weights_never_overflow() -> None:
    assert quantize([4.6e306, 4.6e306, 1.0]) == [1, 1, 0] or quantize([4.6e306] * 2 + [1.0])[2] >= 0
    assert quantize([1.7e308, 1.7e308]) == [1, 1]
    assert quantize([float("inf"), 1.0]) == [0, 1]
    assert quantize([float("nan"), 2.0, 2.0]) == [0, 1, 1]


def test_answers_leave_out_members_that_are_not_active() -> None:
    answers = pool_answers(
        pool(
            member("a"),
            member("b"),
            member("paused", state=MemberState.PAUSED),
            member("down", state=MemberState.DOWN),
            member("drain", state=MemberState.DRAINING),
            member("off", state=MemberState.DISABLED),
            k=4,
        )
    )
    chosen = {m.id for answer in answers.v4 for m in answer.members}
    assert chosen == {"a", "b"}
    assert answers.v6[0].members == ()


def test_answer_ttl_is_the_lowest_of_its_members_with_the_floor() -> None:
    p = pool(member("a", ttl=60), member("b", ttl=20), member("c", ttl=2), k=3, floor=5)
    assert answer_ttl(p.members[:2], p, stale=False) == 20
    assert answer_ttl(p.members, p, stale=False) == 5
    assert answer_ttl(p.members[:1], p, stale=True) == 5
    for answer in pool_answers(p).v4:
        assert answer.ttl == max(5, min(m.ttl for m in answer.members))


def test_stale_plan_answers_with_the_floor() -> None:
    p = pool(member("a", ttl=60), member("b", ttl=50), floor=7)
    assert {answer.ttl for answer in pool_answers(p, stale=True).v4} == {7}


def test_zero_weights_alone_still_share_alike() -> None:
    p = pool(member("a", weight=0), member("b", weight=0), k=1)
    firsts = Counter(answer.members[0].id for answer in pool_answers(p).v4)
    assert firsts == {"a": 1, "b": 1}


def test_zero_weight_gets_nothing_beside_positive_weights() -> None:
    p = pool(member("a", weight=1), member("z", weight=0), k=1)
    assert {answer.members[0].id for answer in pool_answers(p).v4} == {"a"}


def test_families_are_answered_separately() -> None:
    p = pool(
        member("four", address="192.0.2.1"),
        member("six-a", address="2001:db8::a", ttl=30),
        member("six-b", address="2001:db8::b", ttl=40),
        k=4,
    )
    answers = pool_answers(p)
    assert {m.id for a in answers.v4 for m in a.members} == {"four"}
    assert all(len(a.members) == 2 for a in answers.v6)
    assert {a.ttl for a in answers.v6} == {30}


@pytest.mark.parametrize(
    ("policy", "states", "expected"),
    [
        pytest.param(Fallback.FAIL_OPEN, "PPD", ["p2", "p1"], id="open-paused-first"),
        pytest.param(Fallback.FAIL_OPEN, "DDD", ["d3", "d2"], id="open-all-down"),
        pytest.param(Fallback.LEAST_LOADED, "PPD", ["p2", "p1"], id="least-loaded"),
        pytest.param(Fallback.LEAST_LOADED, "DDX", [], id="least-loaded-all-down"),
        pytest.param(Fallback.NODATA, "PPD", [], id="nodata"),
        pytest.param(Fallback.FAIL_OPEN, "XXX", [], id="draining-never"),
    ],
)
def test_fallback_policies(policy: Fallback, states: str, expected: list[str]) -> None:
    kinds = {"P": MemberState.PAUSED, "D": MemberState.DOWN, "X": MemberState.DRAINING}
    prefix = {"P": "p", "D": "d", "X": "x"}
    members = [
        member(f"{prefix[s]}{i + 1}", state=kinds[s], utilization=[0.9, 0.8, 0.7][i])
        for i, s in enumerate(states)
    ]
    # Least loaded first (utilization 0.9, 0.8, 0.7 by position), at most k=2.
    assert [m.id for m in fallback_members(members, policy, 2)] == expected
    answers = pool_answers(pool(*members, k=2, floor=3, fallback=policy)).v4
    assert len(answers) == 1
    assert answers[0].fallback
    assert answers[0].ttl == 3
    assert [m.id for m in answers[0].members] == expected


# -- statistics ---------------------------------------------------------------------------------
# Seeded, so these are deterministic; the tolerances say how close "follows the weights" is.


def _draw(answers: tuple, draws: int, seed: int, step: int = 1) -> list:
    it = rotation(answers, random.Random(seed))
    return [answer for i, answer in enumerate(itertools.islice(it, draws * step)) if i % step == 0]


@pytest.mark.parametrize("step", [1, 2, 3], ids=["every", "every-second", "every-third"])
def test_first_position_follows_the_weights(step: int) -> None:
    weights = {"a": 5.0, "b": 3.0, "c": 1.5, "d": 0.5}
    p = pool(*(member(name, weight=w) for name, w in weights.items()), k=2)
    draws = 60_000
    firsts = Counter(a.members[0].id for a in _draw(pool_answers(p).v4, draws, seed=1, step=step))
    total = sum(weights.values())
    for name, weight in weights.items():
        # Tolerance: 0.01 absolute share (the cycle itself is exact; laps start at random places).
        assert abs(firsts[name] / draws - weight / total) < 0.01, (name, firsts)


def _capped_inclusion(weights: dict[str, float], k: int) -> dict[str, float]:
    """Ideal per-answer inclusion rates: k * share, capped at 1 with the excess spread on."""
    rates: dict[str, float] = {}
    left = dict(weights)
    slots = float(k)
    while left:
        total = sum(left.values())
        capped = {n for n, w in left.items() if slots * w / total >= 1}
        if not capped:
            rates.update({n: slots * w / total for n, w in left.items()})
            break
        for name in capped:
            rates[name] = 1.0
            del left[name]
            slots -= 1
    return rates


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_appearances_follow_the_weights_as_far_as_k_allows(k: int) -> None:
    weights = {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0, "e": 1.0, "f": 1.0}
    p = pool(*(member(name, weight=w) for name, w in weights.items()), k=k)
    draws = 60_000
    seen = Counter(m.id for a in _draw(pool_answers(p).v4, draws, seed=2) for m in a.members)
    ideal = _capped_inclusion(weights, k)
    for name in weights:
        # Tolerance: 0.01 absolute per-answer inclusion rate (the cycle itself is exact; laps
        # start at random places).
        assert abs(seen[name] / draws - ideal[name]) < 0.01, (name, seen, ideal)
    assert all(len({m.id for m in a.members}) == k for a in pool_answers(p).v4)


def test_separate_processes_do_not_move_in_lockstep() -> None:
    p = pool(*(member(str(i), weight=i + 1) for i in range(5)), k=2)
    answers = pool_answers(p).v4
    one = [a.members[0].id for a in _draw(answers, 200, seed=11)]
    two = [a.members[0].id for a in _draw(answers, 200, seed=12)]
    assert one != two
    agree = sum(x == y for x, y in zip(one, two, strict=True))
    assert agree < 150  # in lockstep they would agree 200 times


def test_rotation_visits_every_position_even_when_every_second_answer_is_taken() -> None:
    items = list(range(10))
    taken = _draw(tuple(items), 2_000, seed=3, step=2)
    assert set(taken) == set(items)


def test_rotation_of_one_item_repeats_it() -> None:
    assert list(itertools.islice(rotation(["only"], random.Random(0)), 3)) == ["only"] * 3


# -- family_key: what a cycle depends on (the pipe backend keeps cycles by it) -----------------

STATES = st.sampled_from(list(MemberState))


@st.composite
def moved_families(draw: st.DrawFn) -> tuple[Pool, Pool]:
    """A pool and the same pool a tick later: weights and utilizations moved a little (often
    not enough to change a slot), now and then a TTL or a state."""
    size = draw(st.integers(1, 12))
    members = []
    moved = []
    for index in range(size):
        weight = draw(st.sampled_from([0.0, 1.0, 7.5, 20.0, 99.0]) | st.floats(0.0, 100.0))
        state = draw(STATES)
        one = member(f"m{index}", weight, draw(st.integers(1, 60)), state, draw(st.floats(0, 1)))
        factor = 1.0 + draw(st.sampled_from([0.0, 0.0001, -0.001, draw(st.floats(-0.05, 0.05))]))
        other = dataclasses.replace(
            one,
            weight=min(100.0, one.weight * factor),
            utilization=draw(st.sampled_from([one.utilization, draw(st.floats(0, 1))])),
            ttl=draw(st.sampled_from([one.ttl] * 9 + [one.ttl + 1])),
            state=draw(st.sampled_from([state] * 9 + [draw(STATES)])),
        )
        members.append(one)
        moved.append(other)
    k = draw(st.integers(1, 4))
    fallback = draw(st.sampled_from(list(Fallback)))
    return pool(*members, k=k, fallback=fallback), pool(*moved, k=k, fallback=fallback)


def shown(answers: tuple[Answer, ...]) -> list[tuple[tuple[str, ...], tuple[str, ...], int, bool]]:
    """What a cycle's answers say (ids, addresses, TTL, fallback) at each position."""
    return [
        (
            tuple(m.id for m in answer.members),
            tuple(m.address for m in answer.members),
            answer.ttl,
            answer.fallback,
        )
        for answer in answers
    ]


@settings(max_examples=400)
@given(moved_families(), st.booleans())
def test_equal_family_keys_give_equal_cycles(pools: tuple[Pool, Pool], stale: bool) -> None:
    before, after = pools
    same_key = family_key(before.members, before, stale=stale) == family_key(
        after.members, after, stale=stale
    )
    same_cycle = shown(family_answers(before.members, before, stale=stale)) == shown(
        family_answers(after.members, after, stale=stale)
    )
    assert same_cycle or not same_key
    event("same key" if same_key else "another key")


def test_a_family_key_changes_with_what_an_answer_says() -> None:
    members = (member("a", 3.0, ttl=30), member("b", 1.0, ttl=40), member("c", 2.0))
    base = pool(*members)

    def key(*changed: Member, **fields: Any) -> FamilyKey:
        changed_pool = dataclasses.replace(base, members=changed or members, **fields)
        return family_key(changed_pool.members, changed_pool, stale=False)

    original = key()
    assert key(dataclasses.replace(members[0], weight=3.001), *members[1:]) == original
    assert key(dataclasses.replace(members[0], utilization=0.9), *members[1:]) == original
    changed_keys = [
        key(dataclasses.replace(members[0], weight=6.0), *members[1:]),  # other slots
        key(dataclasses.replace(members[0], ttl=29), *members[1:]),
        key(dataclasses.replace(members[0], address="10.1.1.1"), *members[1:]),
        key(dataclasses.replace(members[0], state=MemberState.PAUSED), *members[1:]),
        key(*members[:2]),
        key(k=3),
        key(ttl_floor=6),
    ]
    assert all(changed != original for changed in changed_keys)
    assert family_key(members, base, stale=True) != original
    # With nobody active, the fallback's order (by utilization) and policy count too.
    paused = tuple(dataclasses.replace(m, state=MemberState.PAUSED) for m in members)
    assert key(*paused) != key(dataclasses.replace(paused[0], utilization=0.5), *paused[1:])
    assert key(*paused) != key(*paused, fallback=Fallback.NODATA)


@settings(max_examples=300)
@given(moved_families())
def test_equal_answers_keys_mean_every_answer_the_same(pools: tuple[Pool, Pool]) -> None:
    before, after = pools
    if answers_key(before) == answers_key(after):
        for stale in (False, True):
            old, new = pool_answers(before, stale=stale), pool_answers(after, stale=stale)
            assert shown(old.v4) == shown(new.v4)
            assert shown(old.v6) == shown(new.v6)
        event("same answers")
    else:
        event("other answers")


def test_an_answers_key_looks_at_the_whole_pool() -> None:
    members = (member("a", 3.0), member("b", 1.0, address="2001:db8::1"))
    base = pool(*members)
    moved = tuple(
        dataclasses.replace(m, weight=m.weight * 1.0001, utilization=0.5) for m in members
    )
    original = answers_key(base)
    assert original is not None
    assert answers_key(dataclasses.replace(base, members=moved)) == original
    assert answers_key(dataclasses.replace(base, members=moved, k=1)) != original
    assert answers_key(dataclasses.replace(base, members=moved[:1])) != original
    located = (dataclasses.replace(members[0], location="east"), members[1])
    assert answers_key(dataclasses.replace(base, members=located)) != original
    # A pool with client networks has none: its locations' shares follow the weights themselves.
    networked = dataclasses.replace(
        base, networks=(Network(network="10.0.0.0/8", location="east"),)
    )
    assert answers_key(networked) is None


# -- answers near the published ones (hold_within) ---------------------------------------------

NEAR_BASE = pool(
    member("a", 60.0, 60),
    member("b", 30.0, 40),
    member("c", 0.0, 5, MemberState.PAUSED, utilization=0.9),
    member("d", 10.0, 20, address="2001:db8::1"),
)


def moved(base: Pool, name: str, **changes: Any) -> Pool:
    return dataclasses.replace(
        base,
        members=tuple(
            dataclasses.replace(m, **changes) if m.id == name else m for m in base.members
        ),
    )


@pytest.mark.parametrize(
    ("after", "near"),
    [
        pytest.param(NEAR_BASE, True, id="the-same"),
        # a and b share the IPv4 cycle 2:1; a's share 2/3 -> 65.9 / 95.9 = 0.687: 2 % moved
        pytest.param(moved(NEAR_BASE, "a", weight=65.9, utilization=0.2), True, id="shares-within"),
        pytest.param(moved(NEAR_BASE, "a", weight=45.1), True, id="shares-within-below"),
        pytest.param(moved(NEAR_BASE, "a", weight=120.0), False, id="shares-beyond"),  # 13 %
        pytest.param(moved(NEAR_BASE, "d", weight=99.0), True, id="alone-in-its-family"),
        pytest.param(moved(NEAR_BASE, "b", ttl=52), True, id="ttl-within"),  # 1/3 * 12/40
        pytest.param(moved(NEAR_BASE, "a", ttl=50), False, id="ttl-beyond"),  # 2/3 * 10/60
        pytest.param(moved(NEAR_BASE, "d", ttl=23), False, id="ttl-beyond-alone"),
        pytest.param(moved(NEAR_BASE, "c", utilization=0.1), True, id="paused-member-load"),
        pytest.param(moved(NEAR_BASE, "c", state=MemberState.ACTIVE), False, id="resumed"),
        pytest.param(moved(NEAR_BASE, "a", state=MemberState.PAUSED), False, id="paused"),
        pytest.param(moved(NEAR_BASE, "a", address="10.9.9.9"), False, id="address"),
        pytest.param(moved(NEAR_BASE, "a", location="eu"), False, id="location"),
        pytest.param(moved(NEAR_BASE, "d", weight=float("nan")), False, id="nan-weight"),
        pytest.param(
            dataclasses.replace(NEAR_BASE, members=NEAR_BASE.members[:3]), False, id="one-fewer"
        ),
        pytest.param(
            dataclasses.replace(NEAR_BASE, members=NEAR_BASE.members[::-1]), False, id="order"
        ),
        pytest.param(dataclasses.replace(NEAR_BASE, k=3), False, id="another-k"),
        pytest.param(
            dataclasses.replace(NEAR_BASE, networks=(Network("10.0.0.0/8", "eu"),)),
            False,
            id="client-networks",
        ),
    ],
)
def test_answers_near_the_published_ones(after: Pool, near: bool) -> None:
    assert answers_near(after, NEAR_BASE, 0.1) is near
    assert answers_near(after, NEAR_BASE, 0.0) is False  # off: only answers_key holds


def test_a_family_without_an_active_member_is_never_near() -> None:
    # Its fallback is ordered by utilization: only equal keys (answers_key) may hold it.
    alone = pool(
        member("a", 60.0, 60),
        member("d", 0.0, 5, MemberState.PAUSED, utilization=0.5, address="2001:db8::1"),
    )
    assert answers_near(alone, alone, 0.5) is False
    assert answers_near(pool(member("a", 60.0, 60)), pool(member("a", 61.0, 60)), 0.1)
