"""The usual member's short way (``dnslb.plan._usual_member``) accepts only what the long way
(``_parse_member_in_full``, which words every problem) accepts, and reads it the same.

Both read every member of every plan a pipe backend loads and the manager checks, so the short
way is a second statement of the same rules: these tests hold it to the first, on members near
every rule's edge (hypothesis, derandomized in the suite's profile)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fleet_plan import fleet_plan
from dnslb.plan import (
    MAX_ID_LENGTH,
    MAX_TTL,
    MAX_UTILIZATION,
    MAX_WEIGHT,
    Member,
    MemberState,
    _parse_member,
    _parse_member_in_full,
    _Reader,
    _usual_member,
    parse_plan_json,
    plan_to_json,
)

TEXTS = st.one_of(
    st.text(max_size=4),
    st.sampled_from(
        ["s1", "a" * MAX_ID_LENGTH, "a" * (MAX_ID_LENGTH + 1), "x\ty", "x\u2028", "\ud800", "é"]
    ),
)
ADDRESSES = st.sampled_from(
    ["10.0.0.1", "2001:DB8::1", "2001:db8::1", "fe80::1%eth0", "010.0.0.1", "1.2.3", "", "::"]
)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1e-300, MAX_WEIGHT, MAX_WEIGHT * 1.000001, 1e9 + 1, 2**63]),
    st.integers(min_value=-5, max_value=2**64),
    st.booleans(),
    st.none(),
    st.text(max_size=2),
)
TTLS = st.one_of(
    st.integers(min_value=-2, max_value=MAX_TTL + 2), st.floats(), st.booleans(), st.none()
)
STATES = st.one_of(st.sampled_from([*(s.value for s in MemberState), "ACTIVE", ""]), NUMBERS)
LOCATIONS = st.one_of(
    st.none(), st.sampled_from(["eu", "us-east_1", "EU", "-eu", "a" * 32, "a" * 33, "", "e u"])
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "id": TEXTS,
    "address": ADDRESSES,
    "weight": NUMBERS,
    "ttl": TTLS,
    "state": STATES,
    "utilization": NUMBERS,
    "location": LOCATIONS,
    "extra": NUMBERS,
}


@st.composite
def members(draw: st.DrawFn) -> object:
    chosen = draw(st.sets(st.sampled_from(sorted(FIELDS)), min_size=0, max_size=len(FIELDS)))
    item = {name: draw(FIELDS[name]) for name in sorted(chosen)}
    return draw(st.one_of(st.just(item), st.just([item]), st.just(None)))


def in_full(item: object) -> tuple[Member | None, list[str]]:
    reader = _Reader()
    return _parse_member_in_full(reader, item, "m"), reader.problems


@settings(max_examples=3000)
@given(members())
def test_the_short_way_accepts_only_what_the_long_way_accepts_and_reads_it_alike(
    item: object,
) -> None:
    usual = _usual_member(item)
    full, problems = in_full(item)
    if usual is not None:
        assert problems == []
        assert full == usual
        assert all(type(getattr(usual, f)) is type(getattr(full, f)) for f in ("weight", "ttl"))
    # Whichever way it goes, the reader's answer is the long way's.
    reader = _Reader()
    assert _parse_member(reader, item, "m") == full
    assert reader.problems == (problems if usual is None else [])


def test_members_as_the_manager_writes_them_take_the_short_way() -> None:
    member = Member(
        id="s1",
        address="2001:db8::1",
        weight=12.5,
        ttl=30,
        state=MemberState.PAUSED,
        utilization=0.93,
        location="eu",
    )
    item = {"id": "s1", "address": "2001:db8::1", "weight": 12.5, "ttl": 30}
    item |= {"state": "paused", "utilization": 0.93, "location": "eu"}
    assert _usual_member(item) == member
    # An integer weight is valid but not what a writer gives: the long way reads it.
    assert _usual_member(item | {"weight": 12}) is None
    assert in_full(item | {"weight": 12})[0] == dataclasses.replace(member, weight=12.0)
    # Each rule's edge is refused by both ways.
    for bad in (
        {"weight": math.nan},
        {"weight": math.inf},
        {"utilization": MAX_UTILIZATION * 2},
        {"ttl": MAX_TTL + 1},
        {"ttl": True},
        {"state": "ACTIVE"},
        {"id": ""},
        {"id": "s\t1"},
        {"address": "fe80::1%eth0"},
        {"location": "EU"},
        {"unknown": 1},
    ):
        assert _usual_member(item | bad) is None
        assert in_full(item | bad)[1] != []  # a problem (an unknown field still reads a member)


def test_a_writers_whole_plan_reads_back_equal_through_the_short_way() -> None:
    plan = fleet_plan(1000)
    assert parse_plan_json(plan_to_json(plan)) == plan
