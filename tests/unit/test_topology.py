"""Topology: the network table and its ECS scopes, the spill-over shares, the plan's fields,
and the pipe backend answering by the client subnet of ABI 3+ request lines."""

from __future__ import annotations

import bisect
import random
from collections import Counter
from typing import Any

import pytest

from dnslb.errors import PlanError
from dnslb.plan import (
    MAX_NETWORKS,
    Member,
    MemberState,
    Network,
    Pool,
    parse_plan,
    parse_plan_json,
    plan_to_json,
)
from dnslb.selection import pool_answers
from dnslb.topology import NetworkTable, located_pool, location_shares
from pipe_backend.answers import MAX_SEEN_SUBNETS, Located, compile_plan
from pipe_backend.backend import PipeBackend
from tests.conftest import plan_doc

TABLE = NetworkTable(
    [
        Network("10.0.0.0/8", "eu"),
        Network("10.1.0.0/16", "us"),
        Network("172.16.0.0/12", "us"),
        Network("2001:db8::/32", "eu"),
    ]
)


@pytest.mark.parametrize(
    ("subnet", "location", "scope"),
    [
        pytest.param(b"10.1.2.0/24", "us", 16, id="longest-prefix-wins"),
        pytest.param(b"10.9.0.0/24", "eu", 13, id="scope-keeps-the-hole-out"),
        pytest.param(b"10.0.5.0/24", "eu", 16, id="below-the-hole"),
        pytest.param(b"172.20.1.7/32", "us", 12, id="whole-network"),
        pytest.param(b"11.0.0.1/32", None, 8, id="no-match-next-to-a-network"),
        pytest.param(b"203.0.113.0/24", None, 2, id="no-match-far-away"),
        pytest.param(b"2001:db8:5::/48", "eu", 32, id="ipv6"),
        pytest.param(b"2001:db9::/48", None, 32, id="ipv6-no-match"),
        pytest.param(b"0.0.0.0/0", None, 0, id="source-prefix-zero"),
        pytest.param(b"not-an-address/24", None, 0, id="unreadable"),
    ],
)
def test_lookup_gives_the_location_and_the_prefix_that_decided(
    subnet: bytes, location: str | None, scope: int
) -> None:
    index, found = TABLE.lookup_subnet(subnet)
    assert (TABLE.locations[index] if index >= 0 else None, found) == (location, scope)


def test_a_family_without_networks_has_scope_zero() -> None:
    table = NetworkTable([Network("10.0.0.0/8", "eu")])
    assert table.lookup_subnet(b"2001:db8::/56") == (-1, 0)


def test_adjacent_networks_of_one_location_count_as_one() -> None:
    table = NetworkTable([Network("10.0.0.0/9", "eu"), Network("10.128.0.0/9", "eu")])
    assert table.lookup_subnet(b"10.1.0.0/24") == (0, 8)


def test_the_scope_is_the_shortest_prefix_of_one_location() -> None:
    rng = random.Random(7)
    networks = [Network("10.0.0.0/8", "a"), Network("10.64.0.0/10", "b")]
    networks += [Network(f"10.{rng.randrange(256)}.{n}.0/24", "c") for n in range(20)]
    table = NetworkTable(dict.fromkeys(networks))  # a random one may repeat: once each
    for _ in range(500):
        address = (10 << 24) | rng.getrandbits(24) if rng.random() < 0.8 else rng.getrandbits(32)
        location, scope = table.lookup(address, False)
        size = 1 << (32 - scope)
        assert _locations_in(table, address // size * size, size) == {location}
        if scope:  # one bit less would take in another location
            wider = size * 2
            assert len(_locations_in(table, address // wider * wider, wider)) > 1


def _locations_in(table: NetworkTable, low: int, size: int) -> set[int]:
    """The locations of the IPv4 addresses from ``low`` to ``low + size - 1``."""
    starts, locations = table._v4.starts, table._v4.locations
    at = bisect.bisect_right(starts, low) - 1
    found = set()
    while at < len(starts) and starts[at] < low + size:
        found.add(locations[at])
        at += 1
    return found


def _pool(utilization: dict[str, float], states: dict[str, MemberState] | None = None) -> Pool:
    states = states or {}
    members = []
    for number, (location, weight) in enumerate([("eu", 10.0), ("eu", 10.0), ("us", 30.0)]):
        member_id = f"{location}-{number}"
        members.append(
            Member(
                id=member_id,
                address=f"192.0.2.{number + 1}",
                weight=weight,
                ttl=60,
                state=states.get(member_id, MemberState.ACTIVE),
                utilization=utilization[location],
                location=location,
            )
        )
    return Pool(name="www.example.test", members=tuple(members), k=1)


def test_a_location_with_spare_capacity_keeps_its_clients() -> None:
    shares = location_shares(_pool({"eu": 0.5, "us": 0.1}))
    assert shares == {"eu": {"eu": 1.0}, "us": {"us": 1.0}}


@pytest.mark.parametrize(
    ("utilization", "local"), [(0.75, 1.0), (0.8, 0.8), (0.9, 0.4), (1.2, 0.0)]
)
def test_an_overloaded_location_spills_over_gradually(utilization: float, local: float) -> None:
    shares = location_shares(_pool({"eu": utilization, "us": 0.1}))["eu"]
    assert shares.get("eu", 0.0) == pytest.approx(local)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_the_excess_goes_to_the_others_by_spare_capacity() -> None:
    pool = _pool({"eu": 0.9, "us": 0.1})
    members = (*pool.members, Member("ap-9", "192.0.2.9", 10.0, 60, location="ap"))
    shares = location_shares(Pool(name=pool.name, members=members))["eu"]
    assert shares["us"] == pytest.approx(3 * shares["ap"])  # weights 30 and 10


def test_a_regional_outage_sends_every_client_elsewhere() -> None:
    paused = {"eu-0": MemberState.PAUSED, "eu-1": MemberState.DOWN}
    shares = location_shares(_pool({"eu": 1.0, "us": 0.1}, paused))
    assert shares["eu"] == {"us": 1.0}


def test_a_location_with_nowhere_to_go_keeps_its_clients() -> None:
    shares = location_shares(_pool({"eu": 1.0, "us": 1.0}, {"us-2": MemberState.DOWN}))
    assert shares["eu"] == {"eu": 1.0}


def test_located_pool_answers_first_by_the_shares() -> None:
    pool = located_pool(_pool({"eu": 0.9, "us": 0.1}), {"eu": 0.4, "us": 0.6})
    answers = pool_answers(pool).v4
    firsts = Counter(answer.members[0].location for answer in answers)
    assert firsts["eu"] / len(answers) == pytest.approx(0.4, abs=0.01)


def _doc(**pool: Any) -> dict[str, Any]:
    doc = plan_doc()
    doc["pools"][0].update(pool)
    return doc


def test_plan_round_trips_locations_and_networks() -> None:
    doc = _doc(networks=[{"network": "2001:DB8::/32", "location": "eu"}])
    doc["pools"][0]["members"][0]["location"] = "eu"
    plan = parse_plan(doc)
    assert plan.pools[0].networks == (Network("2001:db8::/32", "eu"),)
    assert parse_plan_json(plan_to_json(plan)) == plan
    assert '"location"' not in plan_to_json(parse_plan(plan_doc()))  # old readers still read it


@pytest.mark.parametrize(
    ("networks", "message"),
    [
        pytest.param([{"network": "10.0.0.1/8", "location": "eu"}], "host bits", id="host-bits"),
        pytest.param([{"network": "10.0.0.0", "location": "eu"}], "prefix length", id="no-len"),
        pytest.param([{"network": "10.0.0.0/8", "location": "EU!"}], "a-z", id="bad-location"),
        pytest.param([{"network": "10.0.0.0/8"}], "missing", id="missing-location"),
        pytest.param(
            [{"network": "10.0.0.0/8", "location": "eu"}] * 2, "duplicate", id="duplicate"
        ),
        pytest.param(
            [{"network": "10.0.0.0/8", "location": "eu"}] * (MAX_NETWORKS + 1),
            "at most",
            id="too-many",
        ),
    ],
)
def test_bad_networks_are_refused_with_their_path(networks: Any, message: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan(_doc(networks=networks))
    assert any("pools[0].networks" in p and message in p for p in caught.value.problems)


def test_bad_member_location_is_refused() -> None:
    doc = plan_doc()
    doc["pools"][0]["members"][0]["location"] = "x" * 33
    with pytest.raises(PlanError, match=r"members\[0\]\.location"):
        parse_plan(doc)


def _backend(abi: int) -> PipeBackend:
    doc = _doc(
        networks=[
            {"network": "10.0.0.0/8", "location": "eu"},
            {"network": "10.1.0.0/16", "location": "us"},
        ],
        k=1,
    )
    for number, member in enumerate(doc["pools"][0]["members"]):
        member["location"] = "eu" if number % 2 == 0 else "us"
        member["state"] = "active"
    plan = parse_plan(doc)
    backend = PipeBackend(store=None)  # type: ignore[arg-type]
    backend.abi = abi
    backend.handle(b"HELO\t%d" % abi)
    table = compile_plan(plan, abi, stale=False, rng=random.Random(1))
    backend.table, backend._names, backend.plan = table, table.names, plan
    return backend


def _members(reply: bytes) -> set[tuple[str, str]]:
    """(scope bits, address) of each DATA line of an ABI 3+ reply."""
    lines = [line.split("\t") for line in reply.decode().splitlines() if line.startswith("DATA")]
    return {(fields[1], fields[-1]) for fields in lines}


def test_the_pipe_backend_answers_by_the_client_subnet_with_its_scope() -> None:
    backend = _backend(5)
    name = backend.plan.pools[0].name.encode()  # type: ignore[union-attr]
    eu = {a.address for a in backend.plan.pools[0].members if a.location == "eu"}  # type: ignore[union-attr]
    seen = set()
    for _ in range(20):
        q = b"Q\t%s\tIN\tA\t-1\t192.0.2.53\t192.0.2.1\t10.9.0.0/24" % name
        seen |= _members(backend.handle(q))
    assert seen == {("13", address) for address in eu if ":" not in address}
    no_ecs = b"Q\t%s\tIN\tA\t-1\t10.1.0.53\t192.0.2.1\t10.1.0.53/32" % name
    scopes = {scope for scope, _ in _members(backend.handle(no_ecs))}
    assert scopes == {"1"}  # without ECS: never 0, which pdns would cache for everyone


def test_abi_2_answers_without_regard_to_location() -> None:
    backend = _backend(2)
    name = backend.plan.pools[0].name.encode()  # type: ignore[union-attr]
    seen = set()
    for _ in range(40):
        reply = backend.handle(b"Q\t%s\tIN\tA\t-1\t10.9.0.53\t192.0.2.1" % name)
        seen |= {line.split("\t")[-1] for line in reply.decode().splitlines() if "DATA" in line}
    active = {m.address for m in backend.plan.pools[0].members if ":" not in m.address}  # type: ignore[union-attr]
    assert seen == active


def test_a_default_network_covers_every_address_of_its_family() -> None:
    table = NetworkTable([Network("0.0.0.0/0", "eu"), Network("10.0.0.0/8", "us")])
    assert table.locations == ("eu", "us")
    assert table.lookup_subnet(b"192.0.2.0/24") == (0, 1)
    assert table.lookup_subnet(b"10.2.0.0/16") == (1, 8)
    assert table.lookup_subnet(b"2001:db8::/48") == (-1, 0)


def test_the_pipe_backend_remembers_a_bounded_number_of_subnets() -> None:
    backend = _backend(5)
    name = backend.plan.pools[0].name.encode()  # type: ignore[union-attr]
    located = backend._names[name][b"A"]
    assert isinstance(located, Located)
    for number in range(MAX_SEEN_SUBNETS + 10):
        subnet = b"10.%d.%d.0/24" % (number >> 8 & 255, number & 255)
        backend.handle(b"Q\t%s\tIN\tA\t-1\t192.0.2.53\t192.0.2.1\t%s" % (name, subnet))
    assert 0 < len(located.seen) <= MAX_SEEN_SUBNETS
