"""The plan contract: parsing, defaults, every validation problem with its path, round trips."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from dnslb.errors import PlanError
from dnslb.plan import (
    Fallback,
    GeoIp,
    MemberState,
    Network,
    Plan,
    PlanEncoder,
    PoolCache,
    parse_plan,
    parse_plan_json,
    plan_to_dict,
    plan_to_json,
)
from tests.conftest import plan_doc

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plan.json"


def test_example_plan_is_valid() -> None:
    plan = parse_plan_json(EXAMPLE.read_bytes())
    assert plan.version == 1
    assert [pool.name for pool in plan.pools] == ["www.example.test"]


def test_base_plan_fields() -> None:
    plan = parse_plan(plan_doc())
    zone = plan.zones[0]
    assert zone.name == "example.test"
    assert zone.ns == ("ns1.example.test", "ns2.example.test")
    assert zone.soa.serial == 7  # defaults to the plan version
    assert zone.soa.minimum == 60
    www = plan.pools[0]
    assert www.k == 2
    assert www.fallback is Fallback.FAIL_OPEN
    assert [m.state for m in www.members][-2:] == [MemberState.PAUSED, MemberState.DOWN]
    assert plan.pools[1].members[0].ipv6


def test_minimal_hand_written_plan_gets_defaults() -> None:
    plan = parse_plan(
        {
            "format": 1,
            "version": 1,
            "zones": [{"name": "Example.ORG.", "ns": ["ns.example.org."]}],
            "pools": [
                {"name": "WWW.example.org.", "members": [{"id": "1", "address": "192.0.2.1"}]}
            ],
        }
    )
    zone, pool = plan.zones[0], plan.pools[0]
    assert zone.name == "example.org"
    assert zone.soa.mname == "ns.example.org"
    assert zone.soa.rname == "hostmaster.example.org"
    assert pool.name == "www.example.org"
    assert (pool.k, pool.ttl_floor, pool.fallback) == (4, 5, Fallback.FAIL_OPEN)
    member = pool.members[0]
    assert (member.weight, member.ttl, member.state) == (1.0, 60, MemberState.ACTIVE)
    assert plan.generated_at is None
    assert not plan.is_stale(1e12)


def test_round_trip_is_lossless() -> None:
    plan = parse_plan(plan_doc(generated_at=1000.5, stale_after=30))
    assert parse_plan(plan_to_dict(plan)) == plan
    assert parse_plan_json(plan_to_json(plan)) == plan


def test_the_encoder_writes_plan_to_json_s_bytes_and_reuses_the_pools_it_wrote() -> None:
    base = parse_plan(plan_doc())
    located = dataclasses.replace(
        base.pools[0],
        networks=(Network("10.0.0.0/8", "eu"),),
        geoip=GeoIp("/var/lib/GeoIP/City.mmdb", (("DE", "eu"),)),
    )
    plans = [
        parse_plan(plan_doc(generated_at=1000.5, stale_after=30)),
        base,
        dataclasses.replace(base, pools=(located, base.pools[1]), epoch=2),
        parse_plan_json(EXAMPLE.read_bytes()),
    ]
    encoder = PlanEncoder()
    for plan in plans:
        assert encoder.encode(plan) == plan_to_json(plan)
    first = plans[0]
    encoder.encode(first)
    calls = []
    original = json.dumps

    def counting(*args: Any, **kwargs: Any) -> str:
        calls.append(args[0])
        return original(*args, **kwargs)

    later = dataclasses.replace(
        first,
        version=8,
        generated_at=2000.0,
        epoch=3,
        pools=(first.pools[0], dataclasses.replace(first.pools[1], k=1)),
    )
    json.dumps = counting  # type: ignore[assignment]
    try:
        text = encoder.encode(later)
    finally:
        json.dumps = original  # type: ignore[assignment]
    assert text == plan_to_json(later)
    # The head and the changed pool were written; the same first pool object was not.
    assert [doc.get("name") for doc in calls] == [later.pools[1].name, None]
    assert encoder.encode(dataclasses.replace(later, pools=())) == plan_to_json(
        dataclasses.replace(later, pools=())
    )


def test_addresses_are_normalized() -> None:
    doc = plan_doc()
    doc["pools"][1]["members"][0]["address"] = "2001:DB8:0:0::1"
    assert parse_plan(doc).pools[1].members[0].address == "2001:db8::1"


def test_staleness_and_age() -> None:
    plan = parse_plan(plan_doc(generated_at=1000.0, stale_after=30))
    assert plan.age(1010.0) == 10.0
    assert not plan.is_stale(1030.0)
    assert plan.is_stale(1030.5)


def test_zone_of_picks_the_closest_zone() -> None:
    doc = plan_doc()
    doc["zones"].append({"name": "sub.example.test", "ns": ["ns1.example.test"]})
    plan = parse_plan(doc)
    assert plan.zone_of("www.example.test") == 1
    assert plan.zone_of("a.sub.example.test") == 2
    assert plan.zone_of("example.org") is None


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set a value at a dotted path with [index] parts; a value of ... deletes the key."""
    parts = path.replace("[", ".").replace("]", "").split(".")
    target: Any = doc
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last = parts[-1]
    key: Any = int(last) if last.isdigit() else last
    if value is ...:
        del target[key]
    else:
        target[key] = value


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        pytest.param(
            "pools[0].members[0].address",
            "10.0.0.300",
            "pools[0].members[0].address: not an IP address",
            id="bad-address",
        ),
        pytest.param(
            "pools[0].members[1].weight",
            -1,
            "pools[0].members[1].weight: must be between 0 and",
            id="negative-weight",
        ),
        pytest.param(
            "pools[0].members[1].weight",
            True,
            "pools[0].members[1].weight: must be a number",
            id="boolean-weight",
        ),
        pytest.param(
            "pools[0].members[2].ttl",
            1.5,
            "pools[0].members[2].ttl: must be an integer",
            id="float-ttl",
        ),
        pytest.param(
            "pools[0].members[0].state",
            "sleepy",
            "pools[0].members[0].state: must be one of",
            id="bad-state",
        ),
        pytest.param("pools[0].k", 0, "pools[0].k: must be between 1 and 64", id="k-zero"),
        pytest.param("pools[0].fallback", "pray", "pools[0].fallback: must be one of", id="fb"),
        pytest.param("pools[0].colour", "blue", "pools[0].colour: unknown field", id="unknown"),
        pytest.param("pools[0].members", ..., "pools[0].members: missing", id="no-members"),
        pytest.param(
            "pools[0].name",
            "www.example.org",
            "pools[0].name: 'www.example.org' is not inside",
            id="outside-zone",
        ),
        pytest.param(
            "pools[0].name",
            "bad_name-.example.test",
            "pools[0].name: 'bad_name-.example.test'",
            id="bad-label",
        ),
        pytest.param(
            "pools[0].members[1].id",
            "a",
            "pools[0].members[1].id: duplicate member id 'a'",
            id="duplicate-id",
        ),
        pytest.param(
            "pools[0].members[1].address",
            "10.0.0.1",
            "pools[0].members[1].address: duplicate",
            id="duplicate-address",
        ),
        pytest.param(
            "pools[1].name",
            "www.example.test",
            "pools[1].name: duplicate pool",
            id="duplicate-pool",
        ),
        pytest.param("zones[0].ns", [], "zones[0].ns: must name at least one", id="no-ns"),
        pytest.param(
            "zones[0].soa.serial", -1, "zones[0].soa.serial: must be between", id="serial"
        ),
        pytest.param(
            "zones[0].records[0].content",
            "not-an-ip",
            "zones[0].records[0].content: 'not-an-ip' is not an IPv4 address",
            id="record-a",
        ),
        pytest.param(
            "zones[0].records[1].content",
            "mx.example.test",
            "zones[0].records[1].content: MX content must be",
            id="record-mx",
        ),
        pytest.param(
            "zones[0].records[2].type",
            "SPF",
            "zones[0].records[2].type: must be one of",
            id="record-type",
        ),
        pytest.param(
            "zones[0].records[0].name",
            "ns1.example.org",
            "zones[0].records[0].name: 'ns1.example.org' is not inside",
            id="rec-out",
        ),
        pytest.param("zones", [], "zones: must hold at least one zone", id="no-zones"),
        pytest.param("zones", {}, "zones: must be a list, not an object", id="zones-type"),
        pytest.param("format", 2, "format: this dnslb reads plan format 1, not 2", id="format"),
        pytest.param("version", "7", "version: must be an integer, not a string", id="version"),
        pytest.param("stale_after", 0, "stale_after: must be between", id="stale-after"),
        pytest.param("generated_at", "now", "generated_at: must be a number", id="gen-at"),
    ],
)
def test_each_problem_is_reported_with_its_path(path: str, value: Any, problem: str) -> None:
    doc = plan_doc()
    _set(doc, path, value)
    with pytest.raises(PlanError) as caught:
        parse_plan(doc)
    assert any(p.startswith(problem) for p in caught.value.problems), caught.value.problems


def test_every_problem_is_reported_at_once() -> None:
    doc = plan_doc(version=-1)
    doc["pools"][0]["members"][0]["address"] = "nowhere"
    doc["pools"][1]["k"] = 100
    doc["zones"][0]["records"][0]["ttl"] = "long"
    with pytest.raises(PlanError) as caught:
        parse_plan(doc)
    paths = sorted(problem.split(":")[0] for problem in caught.value.problems)
    assert paths == [
        "pools[0].members[0].address",
        "pools[1].k",
        "version",
        "zones[0].records[0].ttl",
    ]
    assert "4 problems" in str(caught.value)


def test_a_pool_may_not_share_its_name_with_a_static_address_record() -> None:
    doc = plan_doc()
    doc["zones"][0]["records"].append(
        {"name": "www.example.test", "type": "CNAME", "content": "elsewhere.example.test"}
    )
    with pytest.raises(PlanError, match=r"zones\[0\]\.records\[3\]: CNAME record"):
        parse_plan(doc)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(b"{", "not valid JSON", id="truncated"),
        pytest.param(b"\xff\xfe garbage", "not valid JSON", id="binary"),
        pytest.param(b'{"format": 1, "format": 1}', "duplicate key 'format'", id="dup-key"),
        pytest.param(b"[]", "must be an object, not a list", id="list"),
        pytest.param(b"null", "must be an object, not null", id="null"),
    ],
)
def test_undecodable_documents(text: bytes, problem: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan_json(text)
    assert problem in str(caught.value)


def test_static_record_content_is_normalized() -> None:
    doc = plan_doc()
    doc["zones"][0]["records"] = [
        {"name": "Example.test.", "type": "MX", "content": "10   MX.Example.test."},
        {"name": "_sip._tcp.example.test", "type": "SRV", "content": "1 2 5060 sip.example.test."},
        {"name": "*.wild.example.test", "type": "A", "content": "192.0.2.9"},
    ]
    records = parse_plan(doc).zones[0].records
    assert [r.content for r in records] == [
        "10 mx.example.test",
        "1 2 5060 sip.example.test",
        "192.0.2.9",
    ]
    assert records[0].name == "example.test"


def test_plan_type_is_immutable() -> None:
    plan = parse_plan(plan_doc())
    with pytest.raises(AttributeError):
        plan.version = 8  # type: ignore[misc]
    assert isinstance(plan, Plan)
    assert json.loads(plan_to_json(plan))["version"] == 7


# -- hostile plans (issue 14): each of these once crashed a pipe backend or was let through --


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        pytest.param(
            "pools[0].members[0].weight", 4.6e306, "must be between 0 and 1e+09", id="huge-weight"
        ),
        pytest.param(
            "pools[0].members[0].weight", 10**400, "must be between 0 and 1e+09", id="int-weight"
        ),
        pytest.param(
            "pools[0].members[0].utilization", 10**400, "must be between", id="int-utilization"
        ),
        pytest.param("generated_at", 1e300, "must be between", id="far-future"),
        pytest.param(
            "pools[1].members[0].address", "fe80::1%\u00e9", "not an IP address", id="scope-utf8"
        ),
        pytest.param(
            "pools[1].members[0].address", "fe80::1%\nDATA", "not an IP address", id="scope-nl"
        ),
        pytest.param("pools[1].members[0].address", "fe80::1%eth0", "not an IP", id="scoped"),
        pytest.param("pools[0].members[0].id", "a\tb", "holds the control", id="id-tab"),
        pytest.param("pools[0].members[0].id", "a\ud800", "holds the control", id="surrogate"),
        pytest.param("pools[0].members[0].id", "a\u2028b", "holds the line", id="line-sep"),
        pytest.param("pools[0].members[0].id", "x" * 129, "must be at most 128", id="long-id"),
        pytest.param(
            "zones[0].records[2].content", '"caf\u00e9"', "holds the non-ASCII", id="txt-utf8"
        ),
        pytest.param(
            "zones[0].records[1].content", "99999 mx.example.test", "MX content", id="mx-range"
        ),
    ],
)
def test_hostile_values_are_refused(path: str, value: Any, problem: str) -> None:
    doc = plan_doc()
    _set(doc, path, value)
    with pytest.raises(PlanError) as caught:
        parse_plan(doc)
    assert any(path in p and problem in p for p in caught.value.problems), caught.value.problems


def test_deeply_nested_json_is_a_plan_error() -> None:
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        with pytest.raises(PlanError, match="nested too deeply"):
            parse_plan_json(text)


def test_deeply_nested_values_are_worded_without_recursion() -> None:
    nested: Any = "x"
    for _ in range(5000):
        nested = [nested]
    doc = plan_doc()
    doc["pools"][0]["fallback"] = nested
    doc["pools"][0]["members"][0]["state"] = nested
    with pytest.raises(PlanError) as caught:
        parse_plan(doc)
    assert all(len(problem) < 300 for problem in caught.value.problems)


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        pytest.param(
            {"name": "example.test", "type": "CNAME", "content": "elsewhere.test"},
            "a CNAME cannot be at the zone's apex",
            id="apex",
        ),
        pytest.param(
            {"name": "ns1.example.test", "type": "CNAME", "content": "elsewhere.test"},
            "a CNAME must be alone at 'ns1.example.test', which has A, CNAME",
            id="beside-a",
        ),
    ],
)
def test_cname_rules(record: dict[str, Any], problem: str) -> None:
    doc = plan_doc()
    doc["zones"][0]["records"].append(record)
    with pytest.raises(PlanError) as caught:
        parse_plan(doc)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_a_lone_cname_below_the_apex_is_fine() -> None:
    doc = plan_doc()
    doc["zones"][0]["records"].append(
        {"name": "alias.example.test", "type": "CNAME", "content": "www.example.test"}
    )
    assert parse_plan(doc).zones[0].records[-1].type == "CNAME"


# -- reading with a pool cache ----------------------------------------------------------------


def test_a_cache_reuses_pools_whose_text_is_unchanged() -> None:
    cache = PoolCache()
    first = parse_plan_json(json.dumps(plan_doc()), cache=cache)
    assert cache.reused == 0
    doc = plan_doc(version=8)
    doc["pools"][1]["k"] = 3
    second = parse_plan_json(json.dumps(doc), cache=cache)
    assert cache.reused == 1
    assert second.pools[0] is first.pools[0]  # taken, not read again
    assert second.pools[1].k == 3
    assert second == parse_plan_json(json.dumps(doc))


def test_a_cache_lets_its_reader_rest_after_each_pool_read_anew() -> None:
    """The pipe backend's loader paces itself while it reads a plan (PoolCache.pace): once
    after each pool's text is read, and once more when a changed pool is validated."""
    cache = PoolCache()
    rests: list[int] = []
    cache.pace = lambda: rests.append(1)
    parse_plan_json(json.dumps(plan_doc()), cache=cache)
    assert len(rests) == 2 * len(plan_doc()["pools"])
    rests.clear()
    doc = plan_doc(version=8)
    doc["pools"][1]["k"] = 3
    parse_plan_json(json.dumps(doc), cache=cache)
    assert cache.reused == len(doc["pools"]) - 1
    assert len(rests) == len(doc["pools"]) + 1


def test_a_cache_compares_the_pool_text_byte_for_byte() -> None:
    cache = PoolCache()
    parse_plan_json(json.dumps(plan_doc()), cache=cache)
    doc = plan_doc()
    doc["pools"][0]["k"] = True  # equal to 1 in Python: must be read (and refused) again
    with pytest.raises(PlanError) as raised:
        parse_plan_json(json.dumps(doc), cache=cache)
    assert raised.value.problems == ["pools[0].k: must be an integer, not a boolean"]
    # the same text reads the same with and without the cache, spaced or not
    text = json.dumps(plan_doc(), indent=2)
    assert parse_plan_json(text, cache=cache) == parse_plan_json(text)


def test_a_cached_pool_is_still_checked_against_the_plan_around_it() -> None:
    cache = PoolCache()
    parse_plan_json(json.dumps(plan_doc()), cache=cache)
    doc = plan_doc()
    doc["zones"][0]["name"] = "other.test"
    doc["zones"][0]["records"] = []
    with pytest.raises(PlanError) as raised:
        parse_plan_json(json.dumps(doc), cache=cache)
    assert cache.reused == 0 or raised.value.problems  # refused whatever was reused
    assert "pools[0].name: 'www.example.test' is not inside any zone of the plan" in (
        raised.value.problems
    )


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(b"\xef\xbb\xbf" + json.dumps(plan_doc()).encode(), id="utf-8-bom"),
        pytest.param(json.dumps(plan_doc()).encode("utf-16"), id="utf-16"),
        pytest.param(json.dumps(plan_doc()).replace("{", '{"version": 1, ', 1), id="dup-key"),
        pytest.param(json.dumps(plan_doc()) + " x", id="trailing"),
        pytest.param(json.dumps(plan_doc())[:-1], id="truncated"),
        pytest.param(json.dumps(plan_doc(pools=7)), id="pools-not-a-list"),
        pytest.param(json.dumps(plan_doc()).replace("}]}", "},]}"), id="trailing-comma"),
        pytest.param("[]", id="a-list"),
    ],
)
def test_a_cache_reads_odd_text_exactly_as_without(text: str | bytes) -> None:
    def outcome(cache: PoolCache | None) -> object:
        try:
            return parse_plan_json(text, cache=cache)
        except PlanError as exc:
            return exc.problems

    cache = PoolCache()
    parse_plan_json(json.dumps(plan_doc()), cache=cache)
    assert outcome(cache) == outcome(None)
