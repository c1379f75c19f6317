"""DNSSEC with the pipe backend: pdns signs the pipe's answers live with keys held by gsqlite3,
and a real validating resolver (Debian's unbound, trusting only the zone's DS) validates them.

One pdns (``launch=pipe,gsqlite3``, keys made by :func:`daemons.dnssec.secure_zone`) and one
unbound per module, on loopback ports of their own. The resolver caches nothing
(``cache-max-ttl: 0``), so every client query reaches pdns and sees the pool rotate.
"""

from __future__ import annotations

import copy
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import dns.dnssec
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.node
import dns.query
import dns.rcode
import dns.rdataclass
import dns.rdataset
import dns.rdatatype
import dns.rrset
import pytest

from daemons.dnssec import secure_zone
from daemons.pdns import PdnsServer, PdnsSettings, render_config
from daemons.process import free_port, log_tail, spawn, stop_group
from dnslb.errors import ConfigError
from tests.conftest import plan_doc, write_plan

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("pdns_server") is None and not Path("/usr/sbin/pdns_server").exists(),
        reason="pdns_server is not installed (apt-get install pdns-server pdns-backend-pipe)",
    ),
    pytest.mark.skipif(
        not Path("/usr/lib/x86_64-linux-gnu/pdns/libgsqlite3backend.so").exists()
        and not list(Path("/usr/lib").glob("*/pdns/libgsqlite3backend.so")),
        reason="pdns's gsqlite3 backend is not installed (apt-get install pdns-backend-sqlite3)",
    ),
    pytest.mark.skipif(
        shutil.which("unbound") is None and not Path("/usr/sbin/unbound").exists(),
        reason="unbound is not installed (apt-get install unbound)",
    ),
]

ZONE = "example.test"
POOL = "www.example.test"
ACTIVE = {"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}


@dataclass
class Resolver:
    """An unbound validating only ``ZONE``, from its DS, forwarding nothing else."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def query(
        self, name: str, rtype: str, *, tcp: bool = False, dnssec: bool = True
    ) -> dns.message.Message:
        request = dns.message.make_query(name, rtype, want_dnssec=dnssec)
        request.flags |= dns.flags.AD  # ask for the AD bit even without DO (RFC 6840)
        ask = dns.query.tcp if tcp else dns.query.udp
        return ask(request, "127.0.0.1", port=self.port, timeout=5)

    def failures(self) -> list[str]:
        """unbound's validation failures so far (val-log-level 2 logs each)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [line for line in text.splitlines() if "validation failure" in line]


def unbound_config(workdir: Path, port: int, upstream: int, anchors: list[str]) -> str:
    trust = "".join(f'  trust-anchor: "{anchor}"\n' for anchor in anchors)
    return f"""\
server:
  interface: 127.0.0.1@{port}
  port: {port}
  do-ip6: no
  do-daemonize: no
  chroot: ""
  username: ""
  directory: "{workdir}"
  pidfile: "{workdir}/unbound.pid"
  use-syslog: no
  logfile: ""
  verbosity: 1
  val-log-level: 2
  access-control: 127.0.0.0/8 allow
  do-not-query-localhost: no
  # test. is one of unbound's default local zones (RFC 6761): let the stub zone through.
  local-zone: "test." nodefault
  module-config: "validator iterator"
  # Nothing cached: every client query reaches pdns (and rotates); keys are fetched again too.
  cache-max-ttl: 0
  cache-max-negative-ttl: 0
{trust}remote-control:
  control-enable: no
stub-zone:
  name: "{ZONE}"
  stub-addr: 127.0.0.1@{upstream}
"""


def start_unbound(workdir: Path, upstream: int, anchors: list[str]) -> Resolver:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = workdir / "unbound.conf"
    config.write_text(unbound_config(workdir, port, upstream, anchors))
    log = workdir / "unbound.log"
    binary = shutil.which("unbound") or "/usr/sbin/unbound"

    def answers(_: object) -> bool:
        try:
            reply = dns.query.udp(
                dns.message.make_query(ZONE, "SOA"), "127.0.0.1", port=port, timeout=0.5
            )
        except (OSError, dns.exception.Timeout):
            return False
        return reply.rcode() in (dns.rcode.NOERROR, dns.rcode.SERVFAIL)

    process = spawn(
        [binary, "-d", "-c", str(config)], name="unbound", ready=answers, log=log, timeout=15
    )
    return Resolver(process=process, port=port, log=log)


@dataclass
class Signed:
    pdns: PdnsServer
    resolver: Resolver
    plan: Path
    ds: list[str]
    dnskey: dns.rrset.RRset


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signed]:
    workdir = tmp_path_factory.mktemp("dnssec")
    plan = workdir / "plan.json"
    write_plan(plan, plan_doc())
    pdns_dir = workdir / "pdns"
    pdns_dir.mkdir()
    settings = PdnsSettings(
        plan=str(plan),
        port=free_port(),
        state_dir=str(pdns_dir / "pipe-backend"),
        dnssec_database=str(workdir / "keys.sqlite3"),
    )
    config = render_config(settings, pdns_dir)
    (pdns_dir / "pdns.conf").write_text(config)
    ds = secure_zone(pdns_dir, ZONE)
    server = PdnsServer(settings, pdns_dir, config=config)
    resolver = None
    try:
        server.start(probe_name=ZONE)
        resolver = start_unbound(workdir / "unbound", settings.port, ds)
        keys = dns.query.udp(
            dns.message.make_query(ZONE, "DNSKEY", want_dnssec=True),
            "127.0.0.1",
            port=settings.port,
            timeout=3,
        )
        dnskey = keys.find_rrset(
            keys.answer, dns.name.from_text(ZONE), dns.rdataclass.IN, dns.rdatatype.DNSKEY
        )
        yield Signed(pdns=server, resolver=resolver, plan=plan, ds=ds, dnskey=dnskey)
    finally:
        if resolver is not None:
            stop_group(resolver.process)
        server.stop()


def test_setup_prints_the_ds_and_keeps_the_key_when_run_again(signed: Signed) -> None:
    assert signed.ds and all(line.startswith(f"{ZONE}. IN DS ") for line in signed.ds)
    command = [sys.executable, "-m", "cli", "pdns-dnssec-setup"]
    again = subprocess.run(
        [*command, "--config-dir", str(signed.pdns.workdir), ZONE],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert again.stdout.splitlines() == signed.ds
    # Narrow NSEC3 is what keeps pdns alive: with NSEC or broad NSEC3 its first NXDOMAIN for a
    # pipe zone calls getBeforeAndAfterNamesAbsolute, which aborts pdns_server (docs/pdns.md).
    database = signed.pdns.workdir.parent / "keys.sqlite3"
    with closing(sqlite3.connect(database)) as connection:
        metadata = dict(
            connection.execute(
                "SELECT kind, content FROM domainmetadata JOIN domains "
                "ON domains.id = domainmetadata.domain_id WHERE domains.name = ?",
                (ZONE,),
            ).fetchall()
        )
    assert metadata["NSEC3NARROW"] == "1"
    assert metadata["NSEC3PARAM"] == "1 0 0 -"


def test_setup_refuses_a_zone_the_plan_does_not_have(signed: Signed) -> None:
    with pytest.raises(ConfigError, match=r"nothere\.test: not a zone of the plan"):
        secure_zone(signed.pdns.workdir, "nothere.test")
    database = signed.pdns.workdir.parent / "keys.sqlite3"
    with closing(sqlite3.connect(database)) as connection:
        names = [row[0] for row in connection.execute("SELECT name FROM domains")]
    assert names == [ZONE]


def test_pdns_signs_the_pipe_answers(signed: Signed) -> None:
    """Straight from pdns: the pool's rotating A set carries an RRSIG that verifies against
    the zone's DNSKEY, for each of the sets it answers."""
    request = dns.message.make_query(POOL, "A", want_dnssec=True)
    keys: dict[dns.name.Name, dns.node.Node | dns.rdataset.Rdataset]
    keys = {dns.name.from_text(ZONE): signed.dnskey}
    answers = set()
    for _ in range(30):
        reply = dns.query.udp(request, "127.0.0.1", port=signed.pdns.settings.port, timeout=3)
        name = dns.name.from_text(POOL)
        rrset = reply.find_rrset(reply.answer, name, dns.rdataclass.IN, dns.rdatatype.A)
        rrsig = reply.find_rrset(
            reply.answer, name, dns.rdataclass.IN, dns.rdatatype.RRSIG, dns.rdatatype.A
        )
        dns.dnssec.validate(rrset, rrsig, keys)  # raises when it does not verify
        answers.add(frozenset(str(rdata) for rdata in rrset))
    assert len(answers) >= 2


def test_the_resolver_validates_rotating_answers_and_never_sees_a_paused_member(
    signed: Signed,
) -> None:
    seen: Counter[str] = Counter()
    answers = set()
    changes, previous = 0, frozenset[str]()
    for _ in range(60):
        reply = signed.resolver.query(POOL, "A")
        assert reply.rcode() == dns.rcode.NOERROR
        assert reply.flags & dns.flags.AD
        [rrset] = [r for r in reply.answer if r.rdtype == dns.rdatatype.A]
        addresses = [str(rdata) for rdata in rrset]
        assert len(addresses) == 2
        seen.update(addresses)
        answers.add(frozenset(addresses))
        changes += frozenset(addresses) != previous
        previous = frozenset(addresses)
    print(f"through the resolver: {dict(seen)}; {len(answers)} sets, {changes} changes")
    # The pool's laps give three sets here ({1,2} half the time); about 36 of 60 answers differ
    # from the one before.
    assert len(answers) >= 3
    assert changes >= 15
    assert set(seen) <= ACTIVE  # 10.0.0.5 paused and 10.0.0.6 down never appear
    assert signed.resolver.failures() == []


def test_a_member_paused_by_a_new_plan_never_appears_and_new_sets_validate(
    signed: Signed,
) -> None:
    """The plan pauses the heaviest member: the sets without it are new to pdns's signature
    cache, signed as they come, and validated; the paused address never appears."""
    doc = plan_doc(version=8)
    doc["pools"][0]["members"][0]["state"] = "paused"  # 10.0.0.1
    write_plan(signed.plan, doc)
    try:
        time.sleep(1.0)  # every coprocess serves a new plan within about 0.3 s (test_pdns.py)
        seen: Counter[str] = Counter()
        for _ in range(40):
            reply = signed.resolver.query(POOL, "A")
            assert reply.rcode() == dns.rcode.NOERROR
            assert reply.flags & dns.flags.AD
            [rrset] = [r for r in reply.answer if r.rdtype == dns.rdatatype.A]
            seen.update(str(rdata) for rdata in rrset)
        assert set(seen) == ACTIVE - {"10.0.0.1"}
        assert signed.resolver.failures() == []
    finally:
        write_plan(signed.plan, plan_doc(version=9))  # the first plan again, newer
        time.sleep(1.0)


def test_a_pool_with_no_address_is_a_validated_nodata(signed: Signed) -> None:
    """A pool whose members are all draining (a name never asked before, so that no resolver
    cache holds addresses for it): NODATA, signed and validated, never NXDOMAIN; the NSEC3
    proof shows the TXT note the name holds while it has no address."""
    doc = plan_doc(version=10)
    empty = copy.deepcopy(doc["pools"][0])
    empty["name"] = "empty.example.test"
    for number, member in enumerate(empty["members"]):
        member["id"] = f"empty-{number}"
        member["state"] = "draining"
    doc["pools"].append(empty)
    write_plan(signed.plan, doc)
    try:
        time.sleep(1.0)  # every coprocess serves a new plan within about 0.3 s (test_pdns.py)
        reply = signed.resolver.query("empty.example.test", "A")
        assert reply.rcode() == dns.rcode.NOERROR
        assert reply.flags & dns.flags.AD
        assert not reply.answer
        [proof] = nsec3_proofs(reply)
        types = {name for rdata in proof for name in rdata.to_text().split()[5:]}
        assert types == {"TXT", "RRSIG"}
        assert signed.resolver.failures() == []
    finally:
        write_plan(signed.plan, plan_doc(version=11))  # the first plan again, newer
        time.sleep(1.0)


def nsec3_proofs(reply: dns.message.Message) -> list[dns.rrset.RRset]:
    return [rrset for rrset in reply.authority if rrset.rdtype == dns.rdatatype.NSEC3]


def test_nxdomain_validates_with_nsec3(signed: Signed) -> None:
    reply = signed.resolver.query("nope.example.test", "A")
    assert reply.rcode() == dns.rcode.NXDOMAIN
    assert reply.flags & dns.flags.AD
    proofs = nsec3_proofs(reply)
    assert proofs  # narrow NSEC3: each covers only the hash it proves (next = hash + 1)
    assert all(rdata.flags == 0 and rdata.iterations == 0 for rrset in proofs for rdata in rrset)
    assert signed.resolver.failures() == []


def test_nodata_validates_with_nsec3(signed: Signed) -> None:
    reply = signed.resolver.query(POOL, "AAAA")  # the pool has IPv4 members only
    assert reply.rcode() == dns.rcode.NOERROR
    assert reply.flags & dns.flags.AD
    assert not reply.answer
    [proof] = nsec3_proofs(reply)
    types = {name for rdata in proof for name in rdata.to_text().split()[5:]}
    assert types == {"A", "RRSIG"}
    assert signed.resolver.failures() == []


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_aaaa_validates(signed: Signed, tcp: bool) -> None:
    reply = signed.resolver.query("v6.example.test", "AAAA", tcp=tcp)
    assert reply.rcode() == dns.rcode.NOERROR
    assert reply.flags & dns.flags.AD
    [rrset] = [r for r in reply.answer if r.rdtype == dns.rdatatype.AAAA]
    assert sorted(str(rdata) for rdata in rrset) == ["2001:db8::1", "2001:db8::2"]


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_the_pool_validates_over_either_transport(signed: Signed, tcp: bool) -> None:
    for _ in range(5):
        reply = signed.resolver.query(POOL, "A", tcp=tcp, dnssec=False)
        assert reply.rcode() == dns.rcode.NOERROR
        assert reply.flags & dns.flags.AD
        [rrset] = reply.answer  # no DO: no RRSIG for the client, validated all the same
        assert {str(rdata) for rdata in rrset} <= ACTIVE


def test_any_is_signed_set_by_set(signed: Signed) -> None:
    """ANY over TCP straight from pdns (over UDP pdns answers ANY with TC): every set of the
    apex, the pipe's and the synthesized DNSKEY and NSEC3PARAM alike, carries a valid RRSIG."""
    request = dns.message.make_query(ZONE, "ANY", want_dnssec=True)
    reply = dns.query.tcp(request, "127.0.0.1", port=signed.pdns.settings.port, timeout=3)
    keys: dict[dns.name.Name, dns.node.Node | dns.rdataset.Rdataset]
    keys = {dns.name.from_text(ZONE): signed.dnskey}
    signatures = {r.covers: r for r in reply.answer if r.rdtype == dns.rdatatype.RRSIG}
    rrsets = [r for r in reply.answer if r.rdtype != dns.rdatatype.RRSIG]
    types = {dns.rdatatype.to_text(rrset.rdtype) for rrset in rrsets}
    assert {"SOA", "NS", "MX", "TXT", "DNSKEY", "NSEC3PARAM"} <= types
    for rrset in rrsets:
        dns.dnssec.validate(rrset, signatures[rrset.rdtype], keys)


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_any_validates_through_the_resolver(signed: Signed, tcp: bool) -> None:
    """unbound may answer ANY from what it holds (its TTL-0 entries live out their second), so
    what it returns varies; each time it is validated. ns1 is asked nothing else here."""
    reply = signed.resolver.query("ns1.example.test", "ANY", tcp=tcp)
    assert reply.rcode() == dns.rcode.NOERROR
    assert reply.flags & dns.flags.AD
    types = {dns.rdatatype.to_text(rrset.rdtype) for rrset in reply.answer}
    assert {"A", "RRSIG"} <= types
    apex = signed.resolver.query(ZONE, "ANY", tcp=tcp)
    assert apex.rcode() == dns.rcode.NOERROR
    assert apex.flags & dns.flags.AD
    assert signed.resolver.failures() == []


def test_a_wrong_trust_anchor_makes_answers_bogus(signed: Signed, tmp_path: Path) -> None:
    """The control: AD above means validation, since a resolver trusting another key fails."""
    [first, *_] = signed.ds
    *head, digest = first.split()
    wrong = " ".join([*head, digest[:-4] + ("0000" if digest[-4:] != "0000" else "1111")])
    resolver = start_unbound(tmp_path / "unbound", signed.pdns.settings.port, [wrong])
    try:
        reply = resolver.query(POOL, "A")
        assert reply.rcode() == dns.rcode.SERVFAIL
        assert not reply.flags & dns.flags.AD
        assert resolver.failures()
    finally:
        stop_group(resolver.process)
        print(log_tail(resolver.log, 5))
