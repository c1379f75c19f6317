"""The pipe backend in process: every ABI version, every request kind, reloads and bad input."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.fleet_plan import fleet_plan
from daemons.pdns import pipe_command
from dnslb.plan import Pool
from dnslb.plan_store import FilePlanStore, last_good_store
from pipe_backend import answers as answers_module
from pipe_backend.answers import NO_ADDRESS, compile_plan
from pipe_backend.backend import PipeBackend
from pipe_backend.command import default_state_dir
from pipe_backend.protocol import MAX_LINE
from tests.conftest import plan_doc, write_plan

REMOTE = {1: "10.9.9.9", 2: "10.9.9.9\t127.0.0.1", 3: "10.9.9.9\t127.0.0.1\t10.9.9.0/24"}


def q_line(abi: int, qname: str, qtype: str, zone_id: int = -1) -> bytes:
    remote = REMOTE[min(abi, 3)]
    return f"Q\t{qname}\tIN\t{qtype}\t{zone_id}\t{remote}".encode()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def plan_path(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    write_plan(path, plan_doc())
    return path


def make_backend(path: Path, abi: int = 5, clock: Clock | None = None) -> PipeBackend:
    clock = clock or Clock()
    backend = PipeBackend(FilePlanStore(path), rng=random.Random(5), monotonic=clock, wall=clock)
    backend.poll(force=True)
    assert backend.handle(f"HELO\t{abi}".encode()).startswith(b"OK\tdnslb")
    return backend


def parse_reply(abi: int, reply: bytes) -> list[dict[str, Any]]:
    """DATA lines of a reply as dicts; asserts the reply is well formed and ends with END."""
    lines = reply.decode().split("\n")
    assert lines[-1] == ""
    assert lines[-2] == "END", reply
    records = []
    for line in lines[:-2]:
        fields = line.split("\t")
        assert fields[0] == "DATA", line
        if abi >= 3:
            scope, auth, *fields = fields[1:]
            assert auth == "1"
        else:
            scope, fields = "0", fields[1:]
        qname, qclass, qtype, ttl, zone_id, *content = fields
        assert qclass == "IN"
        records.append(
            {
                "scope": int(scope),
                "name": qname,
                "type": qtype,
                "ttl": int(ttl),
                "zone": int(zone_id),
                "content": " ".join(content),
                "fields": len(content),
            }
        )
    return records


@pytest.mark.parametrize("abi", [1, 2, 3, 4, 5])
def test_each_abi_version_answers_in_its_own_format(plan_path: Path, abi: int) -> None:
    backend = make_backend(plan_path, abi)
    soa = parse_reply(abi, backend.handle(q_line(abi, "example.test", "SOA")))
    assert [(r["type"], r["zone"], r["ttl"]) for r in soa] == [("SOA", 1, 3600)]
    assert soa[0]["content"] == ("ns1.example.test hostmaster.example.test 7 10800 3600 604800 60")
    www = parse_reply(abi, backend.handle(q_line(abi, "www.example.test", "A", 1)))
    assert len(www) == 2
    assert {r["type"] for r in www} == {"A"}
    # Non-zero scope bits (ABI 3+), which pdns never caches; 1: the location did not matter.
    expected_scope = 1 if abi >= 3 else 0
    assert {r["scope"] for r in www} == {expected_scope}
    assert {r["scope"] for r in soa} == {0}


@pytest.mark.parametrize("abi", [1, 3, 5])
def test_wrong_field_counts_fail_and_the_loop_goes_on(plan_path: Path, abi: int) -> None:
    backend = make_backend(plan_path, abi)
    too_few = b"Q\twww.example.test\tIN\tA"
    too_many = q_line(abi, "www.example.test", "A") + b"\textra"
    for line in (too_few, too_many):
        reply = backend.handle(line)
        assert reply.startswith(b"LOG\t") and reply.endswith(b"FAIL\n")
    assert parse_reply(abi, backend.handle(q_line(abi, "www.example.test", "A")))


def test_apex_answers_soa_ns_and_static_records(plan_path: Path) -> None:
    backend = make_backend(plan_path)
    ns = parse_reply(5, backend.handle(q_line(5, "example.test", "NS")))
    assert [r["content"] for r in ns] == ["ns1.example.test", "ns2.example.test"]
    every = parse_reply(5, backend.handle(q_line(5, "example.test", "ANY")))
    assert Counter(r["type"] for r in every) == {"SOA": 1, "NS": 2, "MX": 1, "TXT": 1}
    mx = next(r for r in every if r["type"] == "MX")
    assert (mx["content"], mx["fields"]) == ("10 mx.example.test", 2)  # priority apart
    glue = parse_reply(5, backend.handle(q_line(5, "ns1.example.test", "ANY")))
    assert [(r["type"], r["content"]) for r in glue] == [("A", "127.0.0.1")]


def test_pool_answers_a_aaaa_and_any(plan_path: Path) -> None:
    backend = make_backend(plan_path)
    a = parse_reply(5, backend.handle(q_line(5, "www.example.test", "A")))
    assert {r["type"] for r in a} == {"A"}
    assert parse_reply(5, backend.handle(q_line(5, "www.example.test", "AAAA"))) == []
    six = parse_reply(5, backend.handle(q_line(5, "v6.example.test", "ANY")))
    assert sorted(r["content"] for r in six) == ["2001:db8::1", "2001:db8::2"]
    assert {r["ttl"] for r in six} == {40}  # the lower of 40 and 50
    assert parse_reply(5, backend.handle(q_line(5, "v6.example.test", "MX"))) == []


@pytest.mark.parametrize("fallback", ["nodata", "least_loaded"])
def test_a_pool_with_nothing_to_answer_still_exists(tmp_path: Path, fallback: str) -> None:
    # Every member draining: no address to give, whatever the fallback. The ANY reply (what
    # pdns asks) holds the pool's TXT note, so that pdns answers NODATA, not NXDOMAIN.
    doc = plan_doc()
    doc["pools"][0]["fallback"] = fallback
    for member in doc["pools"][0]["members"]:
        member["state"] = "draining"
    path = tmp_path / "plan.json"
    write_plan(path, doc)
    backend = make_backend(path)
    assert parse_reply(5, backend.handle(q_line(5, "www.example.test", "A"))) == []
    for _ in range(3):
        records = parse_reply(5, backend.handle(q_line(5, "www.example.test", "ANY")))
        assert [(r["type"], r["content"]) for r in records] == [("TXT", NO_ADDRESS)]
    assert {
        r["type"] for r in parse_reply(5, backend.handle(q_line(5, "v6.example.test", "ANY")))
    } == {"AAAA"}


def test_mixed_family_pool_answers_both_families_for_any(tmp_path: Path) -> None:
    doc = plan_doc()
    doc["pools"][1]["members"].append({"id": "four", "address": "192.0.2.4", "ttl": 10})
    path = tmp_path / "plan.json"
    write_plan(path, doc)
    backend = make_backend(path)
    for _ in range(5):
        records = parse_reply(5, backend.handle(q_line(5, "v6.example.test", "ANY")))
        assert Counter(r["type"] for r in records) == {"AAAA": 2, "A": 1}
        assert {r["ttl"] for r in records if r["type"] == "A"} == {10}
        assert {r["ttl"] for r in records if r["type"] == "AAAA"} == {40}


def test_query_name_is_echoed_in_the_clients_letter_case(plan_path: Path) -> None:
    backend = make_backend(plan_path)
    records = parse_reply(5, backend.handle(q_line(5, "WwW.ExAmple.TEST", "ANY")))
    assert records and {r["name"] for r in records} == {"WwW.ExAmple.TEST"}


@pytest.mark.parametrize(
    ("qname", "qtype"),
    [
        ("nope.example.test", "ANY"),  # inside the zone: pdns turns this into NXDOMAIN
        ("www.example.test", "SOA"),  # SOA walk: not an apex
        ("example.org", "SOA"),  # outside every zone
        ("", "SOA"),
        (".", "SOA"),
        ("www.example.test", "BOGUS"),
    ],
)
def test_no_data_is_an_empty_answer(plan_path: Path, qname: str, qtype: str) -> None:
    assert make_backend(plan_path).handle(q_line(5, qname, qtype)) == b"END\n"


def test_paused_and_down_members_never_appear(plan_path: Path) -> None:
    backend = make_backend(plan_path)
    seen: Counter[str] = Counter()
    for _ in range(2000):
        for record in parse_reply(5, backend.handle(q_line(5, "www.example.test", "ANY"))):
            seen[record["content"]] += 1
    assert set(seen) == {"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}


def test_answer_ttl_is_the_minimum_of_the_chosen_members(plan_path: Path) -> None:
    ttls = {"10.0.0.1": 60, "10.0.0.2": 60, "10.0.0.3": 30, "10.0.0.4": 20}
    backend = make_backend(plan_path)
    seen_ttls = set()
    for _ in range(200):
        records = parse_reply(5, backend.handle(q_line(5, "www.example.test", "A")))
        expected = min(ttls[r["content"]] for r in records)
        assert {r["ttl"] for r in records} == {expected}
        seen_ttls.add(expected)
    assert seen_ttls == {60, 30, 20}


def test_axfr_lists_every_record_per_abi(plan_path: Path) -> None:
    for abi, request in (
        (3, b"AXFR\t1"),
        (4, b"AXFR\t1\texample.test"),
        (5, b"AXFR\t1\tEXAMPLE.test."),
    ):
        backend = make_backend(plan_path, abi)
        records = parse_reply(abi, backend.handle(request))
        kinds = Counter((r["name"], r["type"]) for r in records)
        assert records[0]["type"] == "SOA"
        assert kinds[("www.example.test", "A")] == 4  # active members only
        assert kinds[("v6.example.test", "AAAA")] == 2
        assert kinds[("example.test", "NS")] == 2
    backend = make_backend(plan_path, 5)
    assert backend.handle(b"AXFR\t9\texample.test").endswith(b"FAIL\n")
    assert backend.handle(b"AXFR\t1\texample.org").endswith(b"FAIL\n")
    assert backend.handle(b"AXFR\tone\texample.test").endswith(b"FAIL\n")
    assert backend.handle(b"AXFR\t1").endswith(b"FAIL\n")  # ABI 5 sends the zone name


def test_cmd_status_reports_plan_version_and_age(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan_doc(generated_at=990.0, stale_after=30))
    backend = make_backend(path)
    reply = backend.handle(b"CMD\tstatus").decode()
    assert reply.endswith("END\n")
    assert "plan version: 7\n" in reply
    assert "plan age: 10.0 s\n" in reply
    assert "plan stale: no\n" in reply
    assert "unknown command" in backend.handle(b"CMD\tfrobnicate").decode()
    assert backend.handle(b"CMD\treload").decode().startswith("reloaded\n")


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"\x00\xff\xfe binary",
        b"WHAT\tis this",
        b"HELO\t9",
        b"HELO",
        b"HELO\tfive",
        b"Q",
        b"\t\t\t\t\t\t\t",
        "Q\tw\u00e9b.example.test\tIN\tA\t-1\t1.2.3.4\t1.2.3.4\t1.2.3.4/32".encode()[:-1] + b"\xff",
    ],
)
def test_bad_input_gets_fail_and_the_backend_goes_on(plan_path: Path, line: bytes) -> None:
    backend = make_backend(plan_path)
    reply = backend.handle(line)
    assert reply.endswith((b"FAIL\n", b"END\n"))
    assert reply.count(b"\n") <= 2
    assert parse_reply(5, backend.handle(q_line(5, "www.example.test", "A")))


def test_q_before_helo_fails(plan_path: Path) -> None:
    backend = PipeBackend(FilePlanStore(plan_path))
    backend.poll(force=True)
    assert backend.handle(q_line(5, "example.test", "SOA")).endswith(b"FAIL\n")


def test_no_plan_yet_answers_nothing(tmp_path: Path) -> None:
    backend = PipeBackend(FilePlanStore(tmp_path / "missing.json"))
    backend.poll(force=True)
    assert backend.handle(b"HELO\t5").startswith(b"OK\t")
    assert backend.handle(q_line(5, "example.test", "SOA")) == b"END\n"


# -- reloads ------------------------------------------------------------------------------------


def test_a_new_plan_is_swapped_in_at_the_next_poll(plan_path: Path) -> None:
    clock = Clock()
    backend = make_backend(plan_path, clock=clock)
    doc = plan_doc(version=8)
    doc["pools"][0]["members"] = [{"id": "n", "address": "10.1.1.1", "ttl": 42}]
    write_plan(plan_path, doc)
    backend.poll()  # within poll_interval of the last check: not looked at yet
    old = parse_reply(5, backend.handle(q_line(5, "www.example.test", "A")))
    assert old[0]["content"] != "10.1.1.1"
    clock.now += 0.3
    backend.poll()
    new = parse_reply(5, backend.handle(q_line(5, "www.example.test", "A")))
    assert [(r["content"], r["ttl"]) for r in new] == [("10.1.1.1", 42)]
    assert backend.plan is not None and backend.plan.version == 8


def test_what_a_swap_lets_go_of_is_freed_by_the_loader(plan_path: Path) -> None:
    """The query loop's take() only hands the old table and plan over; the loader frees them,
    a pool at a time (freed at the swap, a 10,000-member table held the loop for 5 ms)."""
    clock = Clock()
    backend = make_backend(plan_path, clock=clock)
    old_table, old_plan = backend.table, backend.plan
    assert old_table is not None and old_plan is not None
    doc = plan_doc(version=8)
    doc["pools"][0]["members"][0]["weight"] = 9  # one pool changed, one kept
    write_plan(plan_path, doc)
    clock.now += 0.3
    backend.refresh()
    backend.take()
    assert backend.table is not old_table
    assert backend._retired == [old_plan, old_table]  # the query loop freed nothing
    kept = {name: c for name, c in backend.table.pools.items() if old_table.pools[name] is c}
    assert len(kept) == 1
    assert backend._dropped == [(old_table.pools["www.example.test"],)]  # counted by the loader
    clock.now += 0.3
    backend.refresh()  # the loader's next round frees them
    assert backend._retired == [] and backend._dropped == []
    assert old_table.pools == {} and old_table.names == {}
    assert backend.table.pools.items() >= kept.items()  # what the new table shares lives on
    reply = parse_reply(5, backend.handle(q_line(5, "www.example.test", "A")))
    assert len(reply) == 2


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: p.write_text('{"format": 1, "version": 9, "zo'), id="partial"),
        pytest.param(lambda p: p.write_text('{"format": 1, "version": 9, "zones": []}'), id="bad"),
        pytest.param(lambda p: p.write_bytes(b"\x00" * 100), id="binary"),
        pytest.param(lambda p: p.unlink(), id="missing"),
    ],
)
def test_a_broken_plan_keeps_the_last_good_one_logged_once(
    plan_path: Path, damage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    backend = make_backend(plan_path, clock=clock)
    before = parse_reply(5, backend.handle(q_line(5, "example.test", "SOA")))
    damage(plan_path)
    with caplog.at_level(logging.ERROR, logger="dnslb.pipe_backend"):
        for _ in range(10):
            clock.now += 0.3
            backend.poll()
            assert parse_reply(5, backend.handle(q_line(5, "example.test", "SOA"))) == before
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "serving plan v7" in errors[0].getMessage()
    write_plan(plan_path, plan_doc(version=10))  # repaired: picked up again
    clock.now += 0.3
    backend.poll()
    assert backend.plan is not None and backend.plan.version == 10


def test_a_stale_plan_is_served_with_the_ttl_floor(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    clock = Clock()
    write_plan(path, plan_doc(generated_at=clock.now, stale_after=30))
    backend = make_backend(path, clock=clock)
    assert parse_reply(5, backend.handle(q_line(5, "v6.example.test", "AAAA")))[0]["ttl"] == 40
    clock.now += 31
    backend.poll()
    assert backend.stale
    records = parse_reply(5, backend.handle(q_line(5, "v6.example.test", "AAAA")))
    assert {r["ttl"] for r in records} == {5}  # the pool's floor
    assert len(records) == 2  # still answered: never nothing because the manager is late
    write_plan(path, plan_doc(generated_at=clock.now, stale_after=30, version=8))
    clock.now += 0.3
    backend.poll()
    assert not backend.stale
    assert parse_reply(5, backend.handle(q_line(5, "v6.example.test", "AAAA")))[0]["ttl"] == 40


def test_an_unchanged_pool_keeps_its_compiled_replies(plan_path: Path) -> None:
    clock = Clock()
    backend = make_backend(plan_path, clock=clock)
    assert backend.table is not None
    before = backend.table.names[b"www.example.test"]
    write_plan(plan_path, plan_doc(version=8))  # same pools, newer version
    clock.now += 0.3
    backend.poll()
    assert backend.plan is not None and backend.plan.version == 8
    assert backend.table.names[b"www.example.test"] is before


def test_a_changed_pool_computes_again_only_what_its_change_reaches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The manager moves every weight and utilization a little at each tick: a pool whose
    weights still quantize to the same slots keeps its cycles, and the result is the same as
    compiling the plan from nothing."""
    plan = fleet_plan(300)  # three pools of 100
    first = compile_plan(plan, 5, stale=False, rng=random.Random(1))
    pools = list(plan.pools)
    pools[0] = dataclasses.replace(
        pools[0],
        members=tuple(
            dataclasses.replace(m, weight=m.weight * 1.0001, utilization=0.7)
            for m in pools[0].members
        ),
    )
    ttl_changed = dataclasses.replace(pools[1].members[0], ttl=7)
    pools[1] = dataclasses.replace(pools[1], members=(ttl_changed, *pools[1].members[1:]))
    later = dataclasses.replace(plan, version=2, pools=tuple(pools))
    computed: list[str] = []
    compute = answers_module.family_answers

    def counted(members: Any, pool: Any, **options: Any) -> Any:
        computed.append(pool.name)
        return compute(members, pool, **options)

    monkeypatch.setattr(answers_module, "family_answers", counted)
    second = compile_plan(later, 5, stale=False, rng=random.Random(2), previous=first)
    assert computed == [pools[1].name]  # its IPv4 cycle (it has no IPv6 member)

    monkeypatch.setattr(answers_module, "family_answers", compute)
    fresh = compile_plan(later, 5, stale=False, rng=random.Random(3))
    assert [c.transfer for c in second.pools.values()] == [c.transfer for c in fresh.pools.values()]
    for kept, anew in zip(second.pools.values(), fresh.pools.values(), strict=True):
        assert [f for _, f in kept.families.values()] == [f for _, f in anew.families.values()]
    kept_pools = list(second.pools.values())
    assert b"\t7\t" in b"".join(
        b"".join(fragment) for _, fs in kept_pools[1].families.values() for fragment in fs
    )
    assert kept_pools[0].transfer is next(iter(first.pools.values())).transfer


def test_a_kept_pool_is_found_without_hashing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools are looked up by name and compared (a pool the plan store kept is the same
    object): hashing a pool hashes every member in Python, and at 100 pools of 100 that cost
    more than compiling the few that changed."""
    plan = fleet_plan(300)
    first = compile_plan(plan, 5, stale=False, rng=random.Random(1))
    changed = dataclasses.replace(plan.pools[2], k=3)
    later = dataclasses.replace(plan, version=2, pools=(*plan.pools[:2], changed))

    def no_hash(self: object) -> int:
        raise AssertionError("a pool was hashed")

    monkeypatch.setattr(Pool, "__hash__", no_hash)
    second = compile_plan(later, 5, stale=False, rng=random.Random(2), previous=first)
    kept = [second.pools[pool.name] is first.pools[pool.name] for pool in later.pools]
    assert kept == [True, True, False]


# -- the loop over real pipes -------------------------------------------------------------------


def run_serve(backend: PipeBackend, data: bytes) -> bytes:
    """Feed ``data`` through real pipes into serve() and collect everything it writes."""
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    chunks: list[bytes] = []

    def collect() -> None:
        while chunk := os.read(out_read, 65536):
            chunks.append(chunk)

    reader = threading.Thread(target=collect)
    reader.start()
    server = threading.Thread(target=backend.serve, args=(in_read, out_write))
    server.start()
    view = memoryview(data)
    while view:
        view = view[os.write(in_write, view[:4096]) :]
    os.close(in_write)
    server.join(10)
    assert not server.is_alive()
    os.close(out_write)
    reader.join(10)
    os.close(in_read)
    os.close(out_read)
    return b"".join(chunks)


def test_serve_answers_every_line_and_exits_at_eof(plan_path: Path) -> None:
    backend = make_backend(plan_path)
    lines = [q_line(5, "www.example.test", "A") for _ in range(3000)]
    output = run_serve(backend, b"\n".join(lines) + b"\n")
    assert output.count(b"END\n") == 3000


def test_serve_survives_oversized_lines_and_garbage(plan_path: Path) -> None:
    backend = make_backend(plan_path)
    data = b"".join(
        [
            q_line(5, "example.test", "SOA") + b"\n",
            b"Q\t" + b"x" * (MAX_LINE * 5) + b"\n",  # oversized: one FAIL, the rest dropped
            bytes(range(256)).replace(b"\n", b"") + b"\n",
            q_line(5, "example.test", "SOA"),  # last line without newline, then EOF
        ]
    )
    replies = run_serve(backend, data).split(b"END\n")
    output = run_serve(make_backend(plan_path), data)
    assert output.count(b"FAIL\n") == 2
    assert output.count(b"\tSOA\t") == 2
    assert replies


def test_the_command_runs_as_a_coprocess(plan_path: Path, tmp_path: Path) -> None:
    lines = [b"HELO\t5", q_line(5, "www.example.test", "A"), b"CMD\tstatus", b"garbage"]
    # No --state-dir: the default under $XDG_STATE_HOME, nothing beside the plan.
    environ = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")}
    environ.pop("STATE_DIRECTORY", None)
    result = subprocess.run(
        [sys.executable, "-m", "pipe_backend", "--plan", str(plan_path)],
        input=b"\n".join(lines) + b"\n",
        capture_output=True,
        timeout=30,
        check=True,
        env=environ,
    )
    out = result.stdout.decode()
    assert out.startswith("OK\tdnslb")
    assert out.count("\tA\t") == 2
    assert "plan version: 7" in out
    assert out.endswith("FAIL\n")
    assert re.search(
        r"^dnslb pipe-backend\[\d+\]: INFO plan v7 loaded", result.stderr.decode(), re.M
    )
    assert sorted(path.name for path in plan_path.parent.iterdir()) == ["plan.json", "xdg"]
    [kept] = (tmp_path / "xdg" / "dnslb" / "pipe-backend").iterdir()
    assert FilePlanStore(kept).read().version == 7


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {"STATE_DIRECTORY": "/var/lib/a:/var/lib/b", "XDG_STATE_HOME": "/x"},
            "/var/lib/a",
            id="systemd-first-of-its-list",
        ),
        pytest.param({"XDG_STATE_HOME": "/x"}, "/x/dnslb/pipe-backend", id="xdg"),
        pytest.param(
            {"STATE_DIRECTORY": "", "HOME": "/home/pdns"},
            "/home/pdns/.local/state/dnslb/pipe-backend",
            id="home",
        ),
    ],
)
def test_the_default_state_directory(
    environ: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", environ.get("HOME", "/home/pdns"))
    assert default_state_dir(environ) == Path(expected)


def test_a_coprocess_started_while_the_plan_is_broken_serves_the_last_good_one(
    plan_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FilePlanStore(plan_path)
    last_good = last_good_store(store, plan_path.parent / "state")
    last_good.path.parent.mkdir()
    first = PipeBackend(store, last_good=last_good)
    first.poll(force=True)  # loads v7 and keeps a copy
    plan_path.write_text('{"format": 1, "vers')  # an editor half-way through saving
    later = PipeBackend(store, last_good=last_good)
    with caplog.at_level(logging.ERROR, logger="dnslb.pipe_backend"):
        later.poll(force=True)
    assert later.plan is not None and later.plan.version == 7
    assert "serving the last good plan v7" in caplog.text
    later.handle(b"HELO\t5")
    assert parse_reply(5, later.handle(q_line(5, "www.example.test", "A")))


def test_an_unwritable_last_good_place_is_logged_once_and_ignored(
    plan_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "no-such-dir-file"
    blocked.write_text("a file, so nothing can be created below it")
    clock = Clock()
    backend = PipeBackend(
        FilePlanStore(plan_path),
        last_good=FilePlanStore(blocked / "sub" / "last-good.json"),
        monotonic=clock,
        wall=clock,
    )
    with caplog.at_level(logging.WARNING, logger="dnslb.pipe_backend"):
        backend.poll(force=True)
        for version in (8, 9):
            write_plan(plan_path, plan_doc(version=version))
            clock.now += 0.3
            backend.poll()
    assert backend.plan is not None and backend.plan.version == 9
    assert caplog.text.count("cannot keep a last good plan") == 1


def test_the_coprocess_ignores_modules_in_its_working_directory(
    plan_path: Path, tmp_path: Path
) -> None:
    # pdns starts the coprocess in its own working directory; a stray pipe_backend.py there
    # must not shadow the package.
    (tmp_path / "pipe_backend.py").write_text("raise SystemExit('shadowed')\n")
    (tmp_path / "dnslb.py").write_text("raise SystemExit('shadowed')\n")
    result = subprocess.run(
        pipe_command(plan_path, state_dir=tmp_path / "state"),
        input=b"HELO\t5\n" + q_line(5, "example.test", "SOA") + b"\n",
        capture_output=True,
        timeout=30,
        check=True,
        cwd=tmp_path,
    )
    assert result.stdout.startswith(b"OK\tdnslb")
    assert b"\tSOA\t" in result.stdout


def test_answer_counts_are_exactly_what_was_answered(plan_path: Path) -> None:
    clock = Clock()
    backend = make_backend(plan_path, clock=clock)
    by_address = {m["address"]: m["id"] for m in plan_doc()["pools"][0]["members"]}
    first: Counter[str] = Counter()
    seen: Counter[str] = Counter()

    def ask(count: int, qtype: str) -> None:
        for _ in range(count):
            records = parse_reply(5, backend.handle(q_line(5, "www.example.test", qtype)))
            first[by_address[records[0]["content"]]] += 1
            seen.update(by_address[r["content"]] for r in records)

    ask(300, "A")
    ask(200, "ANY")
    doc = plan_doc(version=8)
    doc["pools"][0]["members"][0]["weight"] = 9  # a new plan: the old cycle's counts are kept
    write_plan(plan_path, doc)
    clock.now += 0.3
    backend.poll()
    ask(250, "ANY")
    # The old cycles' counts are added up by the loader's next round, not at the swap (which
    # the query loop makes): counted the same before that round and after it.
    for _ in range(2):
        counts = backend.answer_counts()["www.example.test"]
        assert {m: c[0] for m, c in counts.items()} == dict(first)
        assert {m: c[1] for m, c in counts.items()} == dict(seen)
        clock.now += 0.3
        backend.refresh()


def test_answer_counts_survive_plans_compiled_before_the_swap(plan_path: Path) -> None:
    clock = Clock()
    backend = make_backend(plan_path, clock=clock)
    for _ in range(40):
        backend.handle(q_line(5, "www.example.test", "A"))
    for version, weight in ((8, 9), (9, 7)):  # two loads, the query loop takes only the last
        doc = plan_doc(version=version)
        doc["pools"][0]["members"][0]["weight"] = weight
        write_plan(plan_path, doc)
        clock.now += 0.3
        backend.refresh()
    backend.take()
    assert backend.plan is not None
    assert backend.plan.version == 9
    counts = backend.answer_counts()["www.example.test"]
    assert sum(first for first, _ in counts.values()) == 40


def test_a_static_record_at_a_pools_name_reaches_its_reused_answers(plan_path: Path) -> None:
    clock = Clock()
    backend = make_backend(plan_path, clock=clock)
    doc = plan_doc(version=8)
    mx = {"name": "www.example.test", "type": "MX", "ttl": 300, "content": "10 mx.example.test"}
    doc["zones"][0]["records"].append(mx)  # the pool itself unchanged
    write_plan(plan_path, doc)
    clock.now += 0.3
    backend.poll()
    records = parse_reply(5, backend.handle(q_line(5, "www.example.test", "ANY")))
    assert "MX" in {record["type"] for record in records}


def test_answer_counts_are_published_beside_the_plan(plan_path: Path) -> None:
    clock = Clock()
    backend = make_backend(plan_path, clock=clock)
    backend.stats_interval = 5.0
    FilePlanStore(plan_path).open_stats()  # the manager does, when it publishes
    for _ in range(40):
        backend.handle(q_line(5, "www.example.test", "A"))
    backend.requests = 40
    clock.now += 6
    backend.poll()
    [document] = FilePlanStore(plan_path).read_stats()
    members = document["pools"]["www.example.test"]
    assert sum(first for first, _ in members.values()) == 40
    assert document["plan_version"] == 7


def test_answers_held_add_up_the_ttls_given_per_address_family(plan_path: Path) -> None:
    """The seconds of answers given (their TTLs added up) tell the manager how many resolvers
    hold a pool's answers at a time; answers of old plans count, and ANY (what pdns asks a
    backend for most queries) counts in the family of its addresses."""
    clock = Clock()
    backend = make_backend(plan_path, clock=clock)
    backend.stats_interval = 5.0
    FilePlanStore(plan_path).open_stats()
    given = 0
    held = 0

    def ask(count: int, qtype: str) -> None:
        nonlocal given, held
        for _ in range(count):
            records = parse_reply(5, backend.handle(q_line(5, "www.example.test", qtype)))
            addresses = [r for r in records if r["type"] == "A"]
            if addresses:
                given += 1
                held += min(r["ttl"] for r in addresses)

    ask(30, "A")
    ask(20, "ANY")
    doc = plan_doc(version=8)
    for member in doc["pools"][0]["members"]:
        member["ttl"] = 17
    write_plan(plan_path, doc)
    clock.now += 0.3
    backend.poll()
    ask(25, "A")
    assert given == 75
    assert held > 25 * 17
    assert backend.answers_held()["www.example.test"]["A"] == (given, held)
    backend.requests = 75
    clock.now += 6
    backend.poll()
    [document] = FilePlanStore(plan_path).read_stats()
    assert document["held"]["www.example.test"]["A"] == [given, held]


# -- hostile plans and stores (issue 14) -------------------------------------------------------


def test_a_plan_that_does_not_compile_is_never_kept_as_last_good(
    plan_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A plan the parser let through but the compiler refused was copied to .last-good before
    compiling: every coprocess pdns restarted then died on it."""
    import pipe_backend.backend as backend_module  # noqa: PLC0415

    store = FilePlanStore(plan_path)
    last_good = last_good_store(store, plan_path.parent)
    clock = Clock()
    backend = PipeBackend(store, last_good=last_good, monotonic=clock, wall=clock)
    backend.poll(force=True)
    backend.handle(b"HELO\t5")
    real = backend_module.compile_plan

    def refuse_v8(plan: Any, *args: Any, **kwargs: Any) -> Any:
        if plan.version == 8:
            raise OverflowError("cannot convert float infinity to integer")
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(backend_module, "compile_plan", refuse_v8)
    write_plan(plan_path, plan_doc(version=8))
    with caplog.at_level(logging.ERROR, logger="dnslb.pipe_backend"):
        for _ in range(5):
            clock.now += 0.3
            backend.poll()
        assert caplog.text.count("plan v8 cannot be compiled") == 1
    assert backend.plan is not None and backend.plan.version == 7
    assert parse_reply(5, backend.handle(q_line(5, "www.example.test", "A")))
    assert last_good.read().version == 7
    fresh = PipeBackend(store, last_good=last_good, monotonic=clock, wall=clock)
    fresh.poll(force=True)
    assert fresh.plan is not None and fresh.plan.version == 7
    assert fresh.handle(b"HELO\t5").startswith(b"OK")
    assert parse_reply(5, fresh.handle(q_line(5, "www.example.test", "A")))


def test_an_idle_coprocess_ends_up_on_the_newest_good_plan(plan_path: Path) -> None:
    """pdns's TCP coprocess, idle while v8 came and went, served v7 for good once the plan file
    was broken, while the busy ones served v8."""
    store = FilePlanStore(plan_path)
    last_good = last_good_store(store, plan_path.parent)
    clock = Clock()
    busy = PipeBackend(store, last_good=last_good, monotonic=clock, wall=clock)
    idle = PipeBackend(store, last_good=last_good, monotonic=clock, wall=clock)
    for backend in (busy, idle):
        backend.poll(force=True)
        backend.handle(b"HELO\t5")
    write_plan(plan_path, plan_doc(version=8))
    clock.now += 0.3
    busy.poll()
    plan_path.write_text('{"format": 1, "version": 9, "zo')
    clock.now += 0.3
    busy.poll()
    idle.poll()
    assert busy.plan is not None and busy.plan.version == 8
    assert idle.plan is not None and idle.plan.version == 8


class BlockingStore(FilePlanStore):
    """A plan store whose stamp hangs while ``blocked`` is set (a Redis that stopped answering)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.blocked = threading.Event()
        self.released = threading.Event()
        self.calls = 0

    def stamp(self) -> Any:
        self.calls += 1
        if self.blocked.is_set():
            self.released.wait(30)
        return super().stamp()


def test_a_hung_store_never_delays_an_answer(plan_path: Path) -> None:
    store = BlockingStore(plan_path)
    backend = PipeBackend(store, rng=random.Random(1), poll_interval=0.01)
    backend.poll(force=True)
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    server = threading.Thread(target=backend.serve, args=(in_read, out_write))
    server.start()
    try:
        os.write(in_write, b"HELO\t5\n")
        assert os.read(out_read, 65536).startswith(b"OK")
        store.blocked.set()
        calls = store.calls
        while store.calls == calls:  # the loader is now stuck in the store
            threading.Event().wait(0.01)
        for _ in range(50):
            os.write(in_write, q_line(5, "www.example.test", "A") + b"\n")
            reply = b""
            while not reply.endswith(b"END\n"):
                reply += os.read(out_read, 65536)
            assert len(parse_reply(5, reply)) == 2
        assert store.blocked.is_set() and not store.released.is_set()
    finally:
        store.released.set()
        os.close(in_write)
        server.join(10)
        os.close(in_read)
        os.close(out_write)
        os.close(out_read)
    assert not server.is_alive()


def test_a_request_that_raises_costs_one_fail_not_the_coprocess(
    plan_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = make_backend(plan_path)
    real = backend.handle

    def flaky(line: bytes) -> bytes:
        if b"boom" in line:
            raise RuntimeError("a bug")
        return real(line)

    monkeypatch.setattr(backend, "handle", flaky)
    lines = [q_line(5, "www.example.test", "A"), b"Q\tboom", q_line(5, "example.test", "SOA")]
    replies = run_serve(backend, b"\n".join(lines) + b"\n").split(b"END\n")
    assert b"internal error" in b"".join(replies)
    assert b"\tSOA\t" in replies[-2]
    assert len(parse_reply(5, replies[0] + b"END\n")) == 2
