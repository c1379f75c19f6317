"""Fuzz harness for plan documents: whatever an operator or a broken manager writes at the plan's
location, :func:`~dnslb.plan.parse_plan_json` either refuses it with a :class:`PlanError` or
returns a plan that every reader can serve.

Contract checked per input: no exception but ``PlanError``; an accepted plan reads back equal
from its own JSON; every text a pipe backend puts on a protocol line is ASCII without tabs or
newlines; every pool's answers can be computed (at most ``k`` distinct members each, TTLs at or
above the floor, only active members unless it is a fallback answer).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import random
from typing import Any

from dnslb.errors import PlanError
from dnslb.fuzzing import Finding, Harness, deep_json, json_text, mutate_document
from dnslb.plan import (
    Fallback,
    MemberState,
    Plan,
    Pool,
    PoolCache,
    parse_plan_json,
    plan_to_json,
)
from dnslb.selection import PoolAnswers, pool_answers
from dnslb.topology import NetworkTable, located_pool, location_shares

_TYPES = ("A", "AAAA", "CNAME", "MX", "NS", "TXT", "SRV", "CAA", "PTR")


def _address(rng: random.Random, ipv6: bool) -> str:
    if ipv6:
        return f"2001:db8::{rng.randrange(1, 0xFFFF):x}"
    return f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"


def _content(rng: random.Random, rtype: str, zone: str) -> str:
    return {
        "A": _address(rng, False),
        "AAAA": _address(rng, True),
        "CNAME": f"target.{zone}",
        "MX": f"{rng.randrange(100)} mx.{zone}",
        "NS": f"ns9.{zone}",
        "TXT": rng.choice(('"hello"', '"v=spf1 -all"', "plain")),
        "SRV": f"10 5 {rng.randrange(1, 65536)} sip.{zone}",
        "CAA": '0 issue "letsencrypt.org"',
        "PTR": f"host.{zone}",
    }[rtype]


_LOCATIONS = ("eu", "us-east", "dc2", "a")


def _networks(rng: random.Random) -> list[dict[str, str]]:
    """Client networks, nested and overlapping, of both families, once each."""
    networks: dict[str, str] = {}
    for _ in range(rng.randint(0, 12)):
        network: ipaddress.IPv4Network | ipaddress.IPv6Network
        if rng.random() < 0.3:
            length = rng.choice((0, 8, 32, 48, 64, 128))
            network = ipaddress.IPv6Network((rng.getrandbits(128), length), strict=False)
        else:
            length = rng.choice((0, 1, 8, 12, 16, 24, 31, 32))
            network = ipaddress.IPv4Network((rng.getrandbits(32), length), strict=False)
        networks[str(network)] = rng.choice(_LOCATIONS)
    return [{"network": network, "location": name} for network, name in networks.items()]


def random_plan_document(rng: random.Random) -> dict[str, Any]:
    """A plan document that is valid most of the time: zones with static records, pools with
    members of both families, every state, weights and TTLs over their whole ranges."""
    zones = []
    pools: list[dict[str, Any]] = []
    for z in range(rng.randint(1, 3)):
        zone = f"zone{z}.test" if rng.random() < 0.8 else f"sub.zone{z}.test"
        records = []
        for r in range(rng.randint(0, 5)):
            rtype = rng.choice(_TYPES)
            name = rng.choice((zone, f"r{r}.{zone}", f"*.{zone}"))
            records.append(
                {
                    "name": name,
                    "type": rtype,
                    "ttl": rng.choice((0, 60, 3600, 2**31 - 1)),
                    "content": _content(rng, rtype, zone),
                }
            )
        zones.append(
            {
                "name": zone,
                "ns": [f"ns1.{zone}", f"ns2.{zone}"][: rng.randint(1, 2)],
                "records": records,
            }
        )
        for p in range(rng.randint(0, 3)):
            members = []
            for m in range(rng.randint(0, 12)):
                members.append(
                    {
                        "id": f"m{m}",
                        "address": _address(rng, rng.random() < 0.3),
                        "weight": rng.choice((0, 0.001, 1, 3.5, 100, 1e6, 1e9)),
                        "ttl": rng.choice((0, 1, 5, 60, 2**31 - 1)),
                        "state": rng.choice(list(MemberState)).value,
                        "utilization": rng.choice((0.0, 0.5, 0.95, 3.0, 1e9)),
                    }
                )
                if rng.random() < 0.5:
                    members[-1]["location"] = rng.choice(_LOCATIONS)
            pools.append(
                {
                    "name": f"pool{p}.{zone}",
                    "k": rng.choice((1, 2, 4, 8, 64)),
                    "ttl_floor": rng.choice((0, 5, 30)),
                    "fallback": rng.choice(list(Fallback)).value,
                    "members": members,
                }
            )
            if rng.random() < 0.5:
                pools[-1]["networks"] = _networks(rng)
            if rng.random() < 0.2:  # never opened here: the plan only names it
                codes = {"FR": "eu", "US": "us-east", "US-CA": "a"}
                pools[-1]["geoip"] = {"database": "/var/lib/geoip/City.mmdb", "locations": codes}
    document: dict[str, Any] = {
        "format": 1,
        "version": rng.choice((0, 1, 7, 2**63 - 1)),
        "generated_at": rng.choice((None, 1.7e9)),
        "stale_after": rng.choice((None, 30, 0.5)),
        "zones": zones,
        "pools": pools,
    }
    if rng.random() < 0.5:  # absent means 0
        document["epoch"] = rng.choice((0, 1, 3, 2**53))
    return document


def hostile_plan_text(rng: random.Random) -> bytes:
    """Plan text as anyone might write it: valid, mutated in its values, or broken as text."""
    return hostile_plan_texts(rng)[1]


def hostile_plan_texts(rng: random.Random) -> tuple[bytes, bytes]:
    """A valid plan's text, and the hostile text :func:`hostile_plan_text` makes of it (most of
    its pools' texts unchanged when the mutation fell elsewhere)."""
    choice = rng.random()
    if choice < 0.03:
        return b"", deep_json(rng.choice((100, 10_000, 200_000))).encode()
    document = random_plan_document(rng)
    base = json.dumps(document).encode()
    if choice < 0.75:
        document = mutate_document(document, rng, mutations=rng.choice((1, 1, 2, 4)))
    return base, json_text(document, rng)


def check_plan(plan: Plan) -> None:
    """Raise :class:`Finding` when an accepted plan could not be served as it reads."""
    again = parse_plan_json(plan_to_json(plan))
    if again != plan:
        raise Finding("the plan does not read back equal from its own JSON")
    texts = [zone.name for zone in plan.zones]
    for zone in plan.zones:
        texts += [zone.soa.content(), *zone.ns]
        texts += [f"{record.name} {record.type} {record.content}" for record in zone.records]
    for pool in plan.pools:
        texts.append(pool.name)
        texts += [member.address for member in pool.members]
    for text in texts:
        if not text.isascii() or any(char in text for char in "\t\n\r\0"):
            raise Finding(f"text a DATA line would carry is not clean: {text[:80]!r}")
    for pool in plan.pools:
        _check_answers(pool, pool_answers(pool))
        if pool.networks:
            _check_topology(pool)


def _check_topology(pool: Pool) -> None:
    table = NetworkTable(pool.networks)
    shares = location_shares(pool)
    for location in table.locations:
        share = shares.get(location, {})
        if share and abs(sum(share.values()) - 1.0) > 1e-9:
            raise Finding(f"pool {pool.name}: {location}'s shares add up to {sum(share.values())}")
        _check_answers(pool, pool_answers(located_pool(pool, share)))
    for network in pool.networks:
        address = int(ipaddress.ip_network(network.network).network_address)
        found, scope = table.lookup(address, ":" in network.network)
        width = 128 if ":" in network.network else 32
        if found < 0 or not 0 <= scope <= width:
            raise Finding(f"pool {pool.name}: {network.network} looked up as {found}, /{scope}")


def _check_answers(pool: Pool, answers: PoolAnswers) -> None:
    for family in (answers.v4, answers.v6):
        if not family:
            raise Finding(f"pool {pool.name}: an address family without any answer")
        for answer in family:
            ids = [member.id for member in answer.members]
            if len(ids) > pool.k or len(set(ids)) != len(ids):
                raise Finding(f"pool {pool.name}: answer {ids} breaks k={pool.k} distinct")
            if answer.ttl < pool.ttl_floor:
                raise Finding(f"pool {pool.name}: TTL {answer.ttl} below the floor")
            if not answer.fallback and any(
                member.state is not MemberState.ACTIVE for member in answer.members
            ):
                raise Finding(f"pool {pool.name}: a member that is not active is answered")


class PlanHarness(Harness):
    name = "plan"
    boundary = "plan documents at the plan's location (file or Redis), as a pipe backend reads"
    suite_inputs = 3000
    # Mutations repeat lists 50-fold, twice: a 6 MB plan of 10,000 pools takes seconds to refuse
    # (linear in its size: about 20 us a member), which is slow, not a hang.
    deadline = 10.0

    def one(self, rng: random.Random) -> str:
        base, text = hostile_plan_texts(rng)
        try:
            plan = parse_plan_json(text)
        except PlanError as exc:
            _check_cached(base, text, exc)
            return "refused"
        _check_cached(base, text, plan)
        check_plan(plan)
        return "accepted"


def _check_cached(base: bytes, text: bytes, expected: Plan | PlanError) -> None:
    """Read ``text`` after ``base`` through one :class:`PoolCache`: the pools it reuses must
    give the same plan, or the same problems, as reading ``text`` alone."""
    cache = PoolCache()
    with contextlib.suppress(PlanError):
        parse_plan_json(base, cache=cache)
    try:
        got: Plan | PlanError = parse_plan_json(text, cache=cache)
    except PlanError as exc:
        got = exc
    if isinstance(expected, PlanError):
        if not isinstance(got, PlanError) or got.problems != expected.problems:
            raise Finding("a plan read with a pool cache is not refused as read alone")
    elif got != expected:
        raise Finding("a plan read with a pool cache differs from the plan read alone")


__all__ = [
    "PlanHarness",
    "check_plan",
    "hostile_plan_text",
    "hostile_plan_texts",
    "random_plan_document",
]
