"""Clients located with a MaxMind-format database that the test writes (mmdb-writer), read
by the real reader (maxminddb): locations, region over country, the network's prefix as the
scope, the CIDR table first, and a missing database leaving the networks alone."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

import pytest
from mmdb_writer import MMDBWriter
from netaddr import IPSet

from dnslb.errors import PlanError
from dnslb.geoip import GeoIpDatabase, GeoIpError
from dnslb.plan import GeoIp, Network, parse_plan, parse_plan_json, plan_to_json
from dnslb.topology import NetworkTable
from pipe_backend.answers import Located, compile_plan
from tests.conftest import plan_doc

CODES = (("FR", "eu"), ("US", "us"), ("US-CA", "us-west"))


def write_database(path: Path) -> Path:
    """A small City-like database: France, the US, California, IPv4 and IPv6."""
    writer = MMDBWriter(ip_version=6, ipv4_compatible=True, database_type="Test-City")
    writer.insert_network(IPSet(["198.51.100.0/24"]), {"country": {"iso_code": "FR"}})
    writer.insert_network(
        IPSet(["203.0.113.0/25"]),
        {"country": {"iso_code": "US"}, "subdivisions": [{"iso_code": "CA"}]},
    )
    writer.insert_network(
        IPSet(["203.0.113.128/25"]),
        {"country": {"iso_code": "US"}, "subdivisions": [{"iso_code": "NY"}]},
    )
    writer.insert_network(IPSet(["2001:db8:100::/40"]), {"country": {"iso_code": "DE"}})
    writer.to_db_file(str(path))
    return path


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return write_database(tmp_path / "test.mmdb")


@pytest.mark.parametrize(
    ("address", "location", "prefix"),
    [
        pytest.param("198.51.100.7", "eu", 24, id="country"),
        pytest.param("203.0.113.9", "us-west", 25, id="region-over-country"),
        pytest.param("203.0.113.200", "us", 25, id="country-of-an-unmapped-region"),
        pytest.param("2001:db8:1ff::1", None, 40, id="unmapped-country"),
        pytest.param("192.0.2.1", None, 6, id="not-in-the-database"),  # 192.0.0.0/6 is empty
    ],
)
def test_the_database_gives_location_and_prefix(
    database: Path, address: str, location: str | None, prefix: int
) -> None:
    assert GeoIpDatabase(str(database), CODES).lookup(address) == (location, prefix)


def test_the_table_comes_first_and_the_scope_keeps_its_networks_out(database: Path) -> None:
    geoip = GeoIpDatabase(str(database), CODES)
    table = NetworkTable([Network("198.51.100.128/25", "us")], geoip)
    assert table.locations == ("eu", "us", "us-west")
    assert table.lookup_subnet(b"198.51.100.200/32") == (1, 25)  # the table's network
    assert table.lookup_subnet(b"198.51.100.0/24") == (0, 25)  # the database; /24 would
    assert table.lookup_subnet(b"203.0.113.0/24") == (2, 25)  # take in the table's network
    assert table.lookup_subnet(b"0.0.0.0/0") == (-1, 0)


def test_a_missing_or_corrupt_database_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GeoIpError, match="cannot read"):
        GeoIpDatabase(str(tmp_path / "none.mmdb"), CODES)
    corrupt = tmp_path / "corrupt.mmdb"
    corrupt.write_bytes(random.Random(3).randbytes(4096))
    with pytest.raises(GeoIpError, match="cannot read"):
        GeoIpDatabase(str(corrupt), CODES)


def test_only_a_regular_file_of_bounded_size_is_opened(
    tmp_path: Path, database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plan names the file; the plan store's writer may be hostile. A FIFO would hold the
    # plan loader forever (opening one for reading blocks until a writer comes), a device or a
    # link to one is not a database.
    fifo = tmp_path / "fifo.mmdb"
    os.mkfifo(fifo)
    with pytest.raises(GeoIpError, match="not a regular file"):
        GeoIpDatabase(str(fifo), CODES)
    (tmp_path / "zero.mmdb").symlink_to("/dev/zero")
    with pytest.raises(GeoIpError, match="not a regular file"):
        GeoIpDatabase(str(tmp_path / "zero.mmdb"), CODES)
    with pytest.raises(GeoIpError, match=r"ending in \.mmdb"):
        GeoIpDatabase("/dev/zero", CODES)
    monkeypatch.setattr("dnslb.geoip.MAX_GEOIP_BYTES", database.stat().st_size - 1)
    with pytest.raises(GeoIpError, match="bytes, over"):
        GeoIpDatabase(str(database), CODES)


def test_the_pipe_backend_opens_a_database_once_and_again_when_replaced(database: Path) -> None:
    plan = parse_plan(_doc(str(database)))

    def opened() -> object:
        table = compile_plan(plan, 5, stale=False, rng=random.Random(1))
        reply = table.names[plan.pools[0].name.encode()][b"A"]
        assert isinstance(reply, Located)
        return reply.table.geoip

    first = opened()
    assert first is not None and opened() is first  # every plan: the same open database
    replacement = database.with_name("new.mmdb")
    write_database(replacement)
    replacement.replace(database)  # as geoipupdate replaces it: a new file under the name
    assert opened() is not first


def _doc(path: str, **geoip: Any) -> dict[str, Any]:
    doc = plan_doc()
    doc["pools"][0]["geoip"] = {"database": path, "locations": dict(CODES), **geoip}
    for number, member in enumerate(doc["pools"][0]["members"]):
        member["location"] = ("eu", "us", "us-west")[number % 3]
        member["state"] = "active"
    return doc


def test_the_plan_carries_the_database_and_its_map(database: Path) -> None:
    plan = parse_plan(_doc(str(database)))
    assert plan.pools[0].geoip == GeoIp(str(database), tuple(sorted(CODES)))
    assert parse_plan_json(plan_to_json(plan)) == plan


@pytest.mark.parametrize(
    ("geoip", "message"),
    [
        pytest.param({"database": "relative.mmdb"}, "absolute path", id="relative"),
        pytest.param({"database": "/dev/zero"}, "ending in .mmdb", id="device"),
        pytest.param({"database": "/proc/self/mem"}, "ending in .mmdb", id="proc"),
        pytest.param({"database": "/var/lib/../../x.mmdb"}, "'..'", id="dot-dot"),
        pytest.param({"database": "/var/lib/geo ip.mmdb"}, "letters, digits", id="space"),
        pytest.param({"database": "/" + "a" * 1100 + ".mmdb"}, "at most", id="long"),
        pytest.param({"locations": {"fr": "eu"}}, "upper case", id="lower-case-code"),
        pytest.param({"locations": {"FR": "Europe"}}, "a-z", id="bad-location"),
        pytest.param({"locations": ["FR"]}, "must be an object", id="not-a-map"),
    ],
)
def test_bad_geoip_is_refused_with_its_path(geoip: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan(_doc("/var/lib/geoip/City.mmdb", **geoip))
    assert any("pools[0].geoip" in p and message in p for p in caught.value.problems)


def test_the_pipe_backend_answers_by_the_database(database: Path) -> None:
    plan = parse_plan(_doc(str(database)))
    table = compile_plan(plan, 5, stale=False, rng=random.Random(1))
    reply = table.names[plan.pools[0].name.encode()][b"A"]
    assert isinstance(reply, Located)
    wanted = {m.address for m in plan.pools[0].members if m.location == "us-west"}
    wanted = {a for a in wanted if ":" not in a}
    seen: set[str] = set()
    scopes: set[str] = set()
    for _ in range(20):
        lines = reply.reply(b"www.example.test", b"203.0.113.0/26", True).decode().splitlines()
        for fields in (line.split("\t") for line in lines if line.startswith("DATA")):
            scopes.add(fields[1])
            seen.add(fields[-1])
    assert wanted and seen == wanted
    assert scopes == {"25"}


def test_an_unreadable_database_leaves_the_networks_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    doc = _doc(str(tmp_path / "missing.mmdb"))
    doc["pools"][0]["networks"] = [{"network": "10.0.0.0/8", "location": "eu"}]
    plan = parse_plan(doc)
    with caplog.at_level(logging.ERROR, logger="dnslb.pipe_backend"):
        table = compile_plan(plan, 5, stale=False, rng=random.Random(1))
    assert "locating its clients by its networks alone" in caplog.text
    reply = table.names[plan.pools[0].name.encode()][b"A"]
    assert isinstance(reply, Located)
    assert reply.table.lookup_subnet(b"10.1.0.0/16")[1] == 8
