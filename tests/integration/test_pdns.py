"""A real pdns_server with the dnslb pipe backend, queried over UDP and TCP with dnspython."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import dns.zone
import pytest

from daemons.pdns import PdnsServer, PdnsSettings
from daemons.process import free_port, live_group_members
from tests.conftest import plan_doc, write_plan

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("pdns_server") is None and not Path("/usr/sbin/pdns_server").exists(),
        reason="pdns_server is not installed (apt-get install pdns-server pdns-backend-pipe)",
    ),
]

TTLS = {"10.0.0.1": 60, "10.0.0.2": 60, "10.0.0.3": 30, "10.0.0.4": 20}


@dataclass
class Dns:
    server: PdnsServer
    plan_path: Path
    port: int

    def query(self, name: str, rtype: str, *, tcp: bool = False) -> dns.message.Message:
        request = dns.message.make_query(name, rtype)
        ask = dns.query.tcp if tcp else dns.query.udp
        return ask(request, "127.0.0.1", port=self.port, timeout=3)

    def addresses(self, name: str = "www.example.test", rtype: str = "A") -> tuple[list[str], int]:
        reply = self.query(name, rtype)
        assert reply.rcode() == dns.rcode.NOERROR
        rrsets = [r for r in reply.answer if r.rdtype == dns.rdatatype.from_text(rtype)]
        if not rrsets:
            return [], 0
        return [str(rdata) for rdata in rrsets[0]], rrsets[0].ttl


def start_pdns(tmp_path: Path, doc: dict[str, Any], abi: int = 5, explain: bool = False) -> Dns:
    plan_path = tmp_path / "plan.json"
    write_plan(plan_path, doc)
    port = free_port()
    settings = PdnsSettings(plan=str(plan_path), port=port, abi=abi, explain=explain)
    server = PdnsServer(settings, tmp_path / "pdns")
    server.start(probe_name="example.test")
    return Dns(server=server, plan_path=plan_path, port=port)


@pytest.fixture
def pdns(tmp_path: Path) -> Iterator[Dns]:
    running = start_pdns(tmp_path, plan_doc())
    yield running
    running.server.stop()


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_apex_soa_and_ns(pdns: Dns, tcp: bool) -> None:
    soa = pdns.query("example.test", "SOA", tcp=tcp)
    assert soa.rcode() == dns.rcode.NOERROR
    assert str(soa.answer[0][0]) == (
        "ns1.example.test. hostmaster.example.test. 7 10800 3600 604800 60"
    )
    ns = pdns.query("example.test", "NS", tcp=tcp)
    assert sorted(str(r) for r in ns.answer[0]) == ["ns1.example.test.", "ns2.example.test."]


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_a_and_aaaa_of_load_balanced_names(pdns: Dns, tcp: bool) -> None:
    a = pdns.query("www.example.test", "A", tcp=tcp)
    assert a.rcode() == dns.rcode.NOERROR
    assert len(a.answer[0]) == 2
    assert {str(r) for r in a.answer[0]} <= set(TTLS)
    six = pdns.query("v6.example.test", "AAAA", tcp=tcp)
    assert sorted(str(r) for r in six.answer[0]) == ["2001:db8::1", "2001:db8::2"]
    assert six.answer[0].ttl == 40


def test_any_query_and_nodata(pdns: Dns) -> None:
    truncated = pdns.query("example.test", "ANY")  # pdns's any-to-tcp: ANY over UDP -> TC
    assert truncated.flags & dns.flags.TC
    every = pdns.query("example.test", "ANY", tcp=True)
    types = {dns.rdatatype.to_text(rrset.rdtype) for rrset in every.answer}
    assert {"SOA", "NS", "MX", "TXT"} <= types
    nodata = pdns.query("www.example.test", "AAAA")  # only IPv4 members
    assert nodata.rcode() == dns.rcode.NOERROR
    assert not nodata.answer
    assert nodata.authority and nodata.authority[0].rdtype == dns.rdatatype.SOA


def test_a_pool_with_nothing_to_answer_is_nodata_not_nxdomain(tmp_path: Path) -> None:
    # All members draining (as while the first servers boot, or all paused with fallback
    # nodata): the name exists, it just has no address now. NXDOMAIN would say it does not
    # exist at all, and resolvers would cache that for every type and every name below it.
    doc = plan_doc()
    doc["pools"][0]["fallback"] = "nodata"
    for member in doc["pools"][0]["members"]:
        member["state"] = "draining"
    running = start_pdns(tmp_path, doc)
    try:
        for rtype in ("A", "AAAA"):
            reply = running.query("www.example.test", rtype)
            assert reply.rcode() == dns.rcode.NOERROR, rtype
            assert not reply.answer
            assert reply.authority and reply.authority[0].rdtype == dns.rdatatype.SOA
        below = running.query("x.www.example.test", "A")
        assert below.rcode() == dns.rcode.NXDOMAIN  # a name below the pool: still none
    finally:
        running.server.stop()


def test_unknown_name_is_nxdomain_and_outside_names_are_refused(pdns: Dns) -> None:
    assert pdns.query("nope.example.test", "A").rcode() == dns.rcode.NXDOMAIN
    assert pdns.query("www.example.org", "A").rcode() == dns.rcode.REFUSED


def test_mixed_case_names_are_answered(pdns: Dns) -> None:
    reply = pdns.query("WwW.ExAmPlE.TeSt", "A")
    assert reply.rcode() == dns.rcode.NOERROR
    assert len(reply.answer[0]) == 2


def test_answers_rotate_and_follow_the_weights(pdns: Dns) -> None:
    firsts: Counter[str] = Counter()
    distinct = set()
    queries = 400
    for _ in range(queries):
        addresses, _ = pdns.addresses()
        firsts[addresses[0]] += 1
        distinct.add(tuple(addresses))
    print(f"first addresses over {queries} queries: {dict(firsts)}; {len(distinct)} answers")
    assert len(distinct) >= 4  # pdns's caches do not freeze the rotation
    # Weights 4:3:2:1 over 400 queries; tolerance 0.1 absolute share (two coprocesses, each
    # starting its laps at random places).
    for address, weight in zip(TTLS, (4, 3, 2, 1), strict=True):
        assert abs(firsts[address] / queries - weight / 10) < 0.1, firsts


def test_paused_member_never_appears_and_ttl_is_the_minimum(pdns: Dns) -> None:
    seen: Counter[str] = Counter()
    for _ in range(300):
        addresses, ttl = pdns.addresses()
        seen.update(addresses)
        assert ttl == min(TTLS[a] for a in addresses)
    assert "10.0.0.5" not in seen  # paused
    assert "10.0.0.6" not in seen  # down
    assert set(seen) == set(TTLS)


def test_a_plan_change_is_visible_within_one_second(pdns: Dns) -> None:
    doc = plan_doc(version=8)
    doc["pools"][0]["members"] = [{"id": "new", "address": "10.7.7.7", "ttl": 33}]
    started = time.monotonic()
    write_plan(pdns.plan_path, doc)
    seen_after = None
    while time.monotonic() - started < 3:
        addresses, ttl = pdns.addresses()
        if addresses == ["10.7.7.7"]:
            seen_after = time.monotonic() - started
            assert ttl == 33
            break
        time.sleep(0.02)
    print(f"plan change visible after {seen_after} s")
    assert seen_after is not None and seen_after < 1.0
    # One second after the change every coprocess has it, not only the first to answer.
    time.sleep(max(0.0, started + 1.0 - time.monotonic()))
    assert all(pdns.addresses()[0] == ["10.7.7.7"] for _ in range(20))


def test_a_corrupt_plan_leaves_the_last_good_plan_served(pdns: Dns) -> None:
    pdns.plan_path.write_text('{"format": 1, "version": 99, "zones": [')
    time.sleep(0.6)
    for _ in range(20):
        addresses, _ = pdns.addresses()
        assert len(addresses) == 2 and set(addresses) <= set(TTLS)
    assert "not loaded" in pdns.server.log_tail(200)
    # The coprocesses keep their copy in their state directory, nothing beside the plan.
    [kept] = (pdns.server.workdir / "pipe-backend").iterdir()
    assert kept.name.startswith("last-good-")
    assert sorted(path.name for path in pdns.plan_path.parent.iterdir()) == ["pdns", "plan.json"]


def test_zone_transfer_lists_the_zone(pdns: Dns) -> None:
    zone = dns.zone.from_xfr(dns.query.xfr("127.0.0.1", "example.test", port=pdns.port, timeout=5))
    names = {str(name) for name in zone.nodes}
    assert {"@", "www", "v6", "ns1"} <= names
    www = zone.find_rdataset("www", "A")
    assert {str(r) for r in www} == set(TTLS)


def test_backend_cmd_reports_plan_version_and_age(pdns: Dns) -> None:
    result = subprocess.run(
        ["pdnsutil", f"--config-dir={pdns.server.workdir}", "backend-cmd", "pipe", "status"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "plan version: 7" in result.stdout
    assert "plan age: unknown" in result.stdout  # a hand-written plan has no generated_at


@pytest.mark.parametrize("abi", [1, 2, 3, 4, 5])
def test_every_abi_version_works_with_real_pdns(tmp_path: Path, abi: int) -> None:
    running = start_pdns(tmp_path, plan_doc(), abi=abi)
    try:
        assert running.query("example.test", "SOA").rcode() == dns.rcode.NOERROR
        addresses, ttl = running.addresses()
        assert len(addresses) == 2 and ttl == min(TTLS[a] for a in addresses)
        assert running.query("nope.example.test", "A").rcode() == dns.rcode.NXDOMAIN
        six, _ = running.addresses("v6.example.test", "AAAA")
        assert sorted(six) == ["2001:db8::1", "2001:db8::2"]
    finally:
        running.server.stop()


def test_stale_plan_is_served_with_the_ttl_floor(tmp_path: Path) -> None:
    running = start_pdns(tmp_path, plan_doc(generated_at=time.time() - 100, stale_after=30))
    try:
        addresses, ttl = running.addresses()
        assert len(addresses) == 2
        assert ttl == 5
    finally:
        running.server.stop()


def test_stopping_leaves_no_process_behind(tmp_path: Path) -> None:
    running = start_pdns(tmp_path, plan_doc())
    process = running.server.process
    assert process is not None
    pgid = process.pid
    running.server.stop()
    # Live members only: a coprocess that outlived pdns by a moment is an orphan, and its zombie
    # waits for init to reap it, which may be slow on a busy host (pgrep lists zombies).
    assert live_group_members(pgid) == []


EXPLAIN = "_dnslb-explain.www.example.test"


def test_the_explain_txt_is_off_by_default(pdns: Dns) -> None:
    assert pdns.query(EXPLAIN, "TXT").rcode() == dns.rcode.NXDOMAIN


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_the_explain_txt_says_what_is_served(tmp_path: Path, tcp: bool) -> None:
    running = start_pdns(tmp_path, plan_doc(), explain=True)
    try:
        request = dns.message.make_query(EXPLAIN, "TXT", use_edns=True, payload=4096)
        ask = dns.query.tcp if tcp else dns.query.udp
        reply = ask(request, "127.0.0.1", port=running.port, timeout=3)
        assert reply.rcode() == dns.rcode.NOERROR
        [rrset] = reply.answer
        assert rrset.ttl == 0
        texts = sorted(b"".join(rdata.strings).decode() for rdata in rrset)
        assert any(text.startswith("dnslb plan v7 ") for text in texts), texts
        assert "a 10.0.0.1 active w=4 ttl=60 u=0.00 first=40% in=80%" in texts
        assert len(texts) == 7  # the header and six members
        # The A answers go on as before.
        assert len(running.addresses()[0]) == 2
    finally:
        running.server.stop()
