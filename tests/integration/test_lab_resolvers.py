"""The lab's caching resolvers (real unbound) in front of a real pdns with the pipe backend.

Answers come through them, are cached for their TTL (a second query within the TTL does not
reach pdns: pdns's own ``udp-queries`` counter says so) and asked for again after it, and
``rrset-roundrobin`` rotates a cached answer's order or keeps it, as the lab's option says.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.query
import dns.rdatatype
import pytest

from daemons.pdns import PdnsServer, PdnsSettings
from daemons.process import free_port, processes_mentioning
from lab.experiments import warm_resolvers
from lab.loadtest.resolver import dns_lookup
from lab.resolvers import Resolvers
from tests.conftest import plan_doc, write_plan

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("pdns_server") is None and not Path("/usr/sbin/pdns_server").exists(),
        reason="pdns_server is not installed (apt-get install pdns-server pdns-backend-pipe)",
    ),
    pytest.mark.skipif(
        shutil.which("unbound") is None and not Path("/usr/sbin/unbound").exists(),
        reason="unbound is not installed (apt-get install unbound)",
    ),
]

NAME = "www.example.test"
ADDRESSES = {"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}


@pytest.fixture
def pdns(tmp_path: Path) -> Iterator[PdnsServer]:
    doc = plan_doc()
    pool = doc["pools"][0]
    pool["ttl_floor"] = 1
    for member in pool["members"]:
        member["ttl"] = 3  # short, so that the test sees the answer expire
    plan = tmp_path / "plan.json"
    write_plan(plan, doc)
    server = PdnsServer(PdnsSettings(plan=str(plan), port=free_port()), tmp_path / "pdns")
    server.start(probe_name="example.test")
    yield server
    server.stop()


def pdns_queries(server: PdnsServer) -> int:
    """The UDP queries pdns has received (its own counter)."""
    result = subprocess.run(
        ["pdns_control", f"--config-dir={server.workdir}", "show", "udp-queries"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    return int(result.stdout.strip())


def ask(
    resolvers: Resolvers, number: int = 0, query_id: int | None = None
) -> tuple[list[str], int]:
    """The A records of NAME and their TTL from resolver ``number``; ``query_id`` fixes the
    query's id (unbound's rrset-roundrobin rotates by it), else a random one as stubs send."""
    query = dns.message.make_query(NAME, "A")
    if query_id is not None:
        query.id = query_id
    reply = dns.query.udp(
        query,
        resolvers.addresses[number],
        port=resolvers.port,
        timeout=3,
    )
    rrset = next(r for r in reply.answer if r.rdtype == dns.rdatatype.A)
    return [str(rdata) for rdata in rrset], rrset.ttl


def start_resolvers(
    tmp_path: Path, pdns: PdnsServer, network: str, *, rrset_roundrobin: bool, count: int = 1
) -> Resolvers:
    resolvers = Resolvers(
        tmp_path / f"resolvers-{network}",
        count=count,
        network=network,
        port=free_port(),
        zone="example.test",
        upstream_port=pdns.settings.port,
        rrset_roundrobin=rrset_roundrobin,
    )
    resolvers.start()
    return resolvers


def settle(server: PdnsServer) -> int:
    """pdns's query count once nothing more arrives (unbound's own lookups done)."""
    count = pdns_queries(server)
    while True:
        time.sleep(0.3)
        now = pdns_queries(server)
        if now == count:
            return count
        count = now


def test_answers_come_through_the_resolvers_and_are_cached_for_their_ttl(
    tmp_path: Path, pdns: PdnsServer
) -> None:
    resolvers = start_resolvers(tmp_path, pdns, "127.0.71", rrset_roundrobin=False, count=2)
    try:
        before = settle(pdns)
        addresses, ttl = ask(resolvers)
        assert set(addresses) <= ADDRESSES and len(addresses) == 2 and 0 < ttl <= 3
        after_first = settle(pdns)
        assert after_first > before  # the first query went through to pdns

        again, _ = ask(resolvers)  # within the TTL: from the resolver's cache
        assert again == addresses
        assert settle(pdns) == after_first

        other, _ = ask(resolvers, 1)  # another resolver has its own cache
        assert set(other) <= ADDRESSES
        after_other = settle(pdns)
        assert after_other > after_first

        time.sleep(3.5)  # the TTL runs out: the resolver asks pdns again
        ask(resolvers)
        assert settle(pdns) > after_other
    finally:
        resolvers.stop()
    assert processes_mentioning(str(tmp_path / "resolvers-127.0.71")) == []


@pytest.mark.parametrize("rotate", [False, True], ids=["keep-order", "rrset-roundrobin"])
def test_rrset_roundrobin_rotates_or_keeps_the_order(
    tmp_path: Path, pdns: PdnsServer, rotate: bool
) -> None:
    resolvers = start_resolvers(tmp_path, pdns, "127.0.72", rrset_roundrobin=rotate)
    try:
        before = settle(pdns)
        # unbound rotates by the query's id ("for speed and thread safety"): random ids left
        # all six answers in one order once in 32 runs; ids 0-5 rotate in turn
        orders = [tuple(ask(resolvers, query_id=query_id)[0]) for query_id in range(6)]
        fetched = settle(pdns) - before
    finally:
        resolvers.stop()
    if fetched > 1:
        pytest.skip("the answer expired between queries (a very slow machine): nothing to see")
    assert len({frozenset(order) for order in orders}) == 1  # one cached answer
    if rotate:
        assert len(set(orders)) == 2  # its two addresses, first in turn
    else:
        assert len(set(orders)) == 1  # pdns's order, kept for every client


def test_resolvers_start_out_of_phase_with_real_answers_preloaded(
    tmp_path: Path, pdns: PdnsServer
) -> None:
    """The experiments' warm-up (``staggered``): each resolver gets its own answer of pdns,
    with a TTL left drawn at random, and serves it from its cache (pdns is not asked again),
    in the order pdns gave it; the control sockets go when the resolvers stop."""
    resolvers = start_resolvers(tmp_path, pdns, "127.0.73", rrset_roundrobin=False, count=3)
    try:
        pdns_lookup = dns_lookup("127.0.0.1", pdns.settings.port)
        left = warm_resolvers(resolvers, NAME, pdns_lookup, random.Random(7))
        assert len(left) == 3 and all(1 <= ttl <= 3 for ttl in left)
        before = settle(pdns)
        for number, ttl in enumerate(left):
            addresses, served_ttl = ask(resolvers, number)
            assert set(addresses) <= ADDRESSES and len(addresses) == 2
            assert served_ttl <= ttl  # what was loaded, counting down
        assert settle(pdns) == before  # every answer came from a cache
        controls = resolvers.controls
        assert controls is not None and len(list(controls.iterdir())) == 3
    finally:
        resolvers.stop()
    assert not controls.exists()
    assert processes_mentioning(str(tmp_path / "resolvers-127.0.73")) == []


def test_a_preloaded_answer_keeps_its_order_for_every_client(
    tmp_path: Path, pdns: PdnsServer
) -> None:
    resolvers = start_resolvers(tmp_path, pdns, "127.0.74", rrset_roundrobin=False)
    try:
        resolvers.preload(NAME, [(("10.0.0.3", "10.0.0.1"), 30)])
        orders = {tuple(ask(resolvers, query_id=query_id)[0]) for query_id in range(4)}
        assert orders == {("10.0.0.3", "10.0.0.1")}
        assert 28 <= ask(resolvers)[1] <= 30
    finally:
        resolvers.stop()
