"""Topology on a real pdns_server: the client subnet picks the location, the ECS scope says why.

Queries carry an EDNS Client Subnet option made with dnspython; the plan is the example of
docs/topology.md.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.edns
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest

from tests.conftest import write_plan
from tests.integration.test_pdns import Dns, start_pdns
from tests.unit.test_geoip import write_database

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("pdns_server") is None and not Path("/usr/sbin/pdns_server").exists(),
        reason="pdns_server is not installed (apt-get install pdns-server pdns-backend-pipe)",
    ),
]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "topology.md"
EU = {"192.0.2.1", "192.0.2.2"}
US = {"198.51.100.1", "198.51.100.2"}


def example_plan() -> dict[str, Any]:
    """The plan of docs/topology.md's example, plus a pool without networks."""
    block = re.search(r"```json\n(.*?)```", DOCS.read_text(), re.S)
    assert block is not None, "docs/topology.md lost its example"
    doc: dict[str, Any] = json.loads(block.group(1))
    doc["pools"].append(
        {
            "name": "plain.example.test",
            "members": [
                {"id": "p-1", "address": "203.0.113.1", "location": "eu"},
                {"id": "p-2", "address": "203.0.113.2", "location": "us"},
            ],
        }
    )
    return doc


def ask(
    server: Dns, subnet: str | None, name: str = "www.example.test", rtype: str = "A"
) -> tuple[set[str], int | None]:
    """The answer's addresses and the scope of its ECS option (None: no option)."""
    options = []
    if subnet is not None:
        address, _, bits = subnet.partition("/")
        options.append(dns.edns.ECSOption(address, int(bits)))
    request = dns.message.make_query(name, rtype, use_edns=0, options=options)
    reply = dns.query.udp(request, "127.0.0.1", port=server.port, timeout=3)
    assert reply.rcode() == dns.rcode.NOERROR
    addresses = {
        str(rdata)
        for rrset in reply.answer
        if rrset.rdtype == dns.rdatatype.from_text(rtype)
        for rdata in rrset
    }
    scopes = [o.scopelen for o in reply.options if isinstance(o, dns.edns.ECSOption)]
    return addresses, scopes[0] if scopes else None


def union(
    server: Dns, subnet: str | None, queries: int = 12, **kwargs: str
) -> tuple[set[str], set[int | None]]:
    seen: set[str] = set()
    scopes: set[int | None] = set()
    for _ in range(queries):
        addresses, scope = ask(server, subnet, **kwargs)
        seen |= addresses
        scopes.add(scope)
    return seen, scopes


@pytest.fixture(scope="module")
def pdns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dns]:
    running = start_pdns(tmp_path_factory.mktemp("topology"), example_plan())
    yield running
    running.server.stop()


@pytest.mark.parametrize(
    ("subnet", "members", "scope"),
    [
        pytest.param("10.9.0.0/24", EU, 13, id="eu-inside-a-network-with-a-hole"),
        pytest.param("10.1.2.0/24", US, 16, id="us-more-specific"),
        pytest.param("172.20.1.0/24", US, 12, id="us"),
        pytest.param("2001:db8:5::/48", EU, 32, id="eu-ipv6"),
    ],
)
def test_the_client_subnet_picks_the_location_and_the_scope(
    pdns: Dns, subnet: str, members: set[str], scope: int
) -> None:
    seen, scopes = union(pdns, subnet)
    assert seen == members
    assert scopes == {scope}


def test_a_client_of_no_location_gets_every_member_and_the_separating_scope(pdns: Dns) -> None:
    seen, scopes = union(pdns, "203.0.113.0/24", queries=30)
    assert seen == EU | US
    assert scopes == {2}  # nothing in 192.0.0.0/2 is mapped: a resolver may reuse it there


def test_when_the_location_did_not_matter_the_scope_is_the_broadest_pdns_leaves_uncached(
    pdns: Dns,
) -> None:
    seen, scopes = union(pdns, "0.0.0.0/0", queries=30)  # the client asks for no subnet
    assert seen == EU | US  # still rotating: pdns cached none of it
    assert scopes == {1}  # not 0: pdns 4.7 would keep it in its query cache for everyone
    assert union(pdns, None, queries=30)[0] == EU | US
    assert union(pdns, "203.0.113.0/24", queries=30)[0] == EU | US


def test_a_pool_without_networks_answers_the_broad_scope(pdns: Dns) -> None:
    seen, scopes = union(pdns, "10.9.0.0/24", queries=20, name="plain.example.test")
    assert seen == {"203.0.113.1", "203.0.113.2"}
    assert scopes == {1}


def test_without_ecs_the_resolver_address_decides_and_no_option_is_returned(pdns: Dns) -> None:
    seen, scopes = union(pdns, None, queries=30)  # 127.0.0.1 is in no network
    assert seen == EU | US  # k = 2: not cached by pdns, the answer rotates
    assert scopes == {None}


def test_a_regional_outage_moves_the_location_s_clients_elsewhere(tmp_path: Path) -> None:
    doc = example_plan()
    running = start_pdns(tmp_path, doc)
    try:
        assert union(running, "10.9.0.0/24")[0] == EU
        outage = copy.deepcopy(doc)
        outage["version"] = 2
        for member in outage["pools"][0]["members"]:
            if member["location"] == "eu":
                member["state"] = "paused"
        write_plan(running.plan_path, outage)
        time.sleep(1.0)  # every coprocess re-reads the plan within 0.25 s
        seen, scopes = union(running, "10.9.0.0/24")
        assert seen == US
        assert scopes == {13}
    finally:
        running.server.stop()


def test_an_overloaded_location_sends_part_of_its_clients_elsewhere(tmp_path: Path) -> None:
    doc = example_plan()
    for member in doc["pools"][0]["members"]:
        if member["location"] == "eu":
            member["utilization"] = 0.9  # above 0.75: 40 % stay, 60 % go to us
    running = start_pdns(tmp_path, doc)
    try:
        seen, scopes = union(running, "10.9.0.0/24", queries=40)
        assert seen == EU | US
        assert scopes == {13}
        assert union(running, "172.20.1.0/24", queries=40)[0] == US  # us has room: stays
    finally:
        running.server.stop()


def test_a_maxmind_database_locates_the_clients_no_network_holds(tmp_path: Path) -> None:
    doc = example_plan()
    database = write_database(tmp_path / "test.mmdb")
    doc["pools"][0]["geoip"] = {"database": str(database), "locations": {"FR": "eu", "US": "us"}}
    running = start_pdns(tmp_path, doc)
    try:
        assert union(running, "198.51.100.0/24") == (EU, {24})  # France
        assert union(running, "203.0.113.128/26") == (US, {25})  # the US (New York)
        assert union(running, "10.1.2.0/24") == (US, {16})  # the networks come first
    finally:
        running.server.stop()
