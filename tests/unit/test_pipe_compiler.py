"""The pipe backend's compiler process (pipe_backend/compiler.py): pools' answer cycles computed
in a child at idle priority give exactly the replies the loader thread computes, and a compiler
that dies, hangs or is closed costs nothing but time: the loader compiles those pools itself."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest

from bench.fleet_plan import fleet_plan
from dnslb.plan import Plan, parse_plan
from dnslb.plan_store import FilePlanStore
from pipe_backend.answers import (
    AnswerTable,
    CycleParts,
    PartsJob,
    compile_plan,
    cycle_parts,
)
from pipe_backend.backend import PipeBackend
from pipe_backend.compiler import PartsCompiler
from tests.conftest import plan_doc, write_plan
from tests.unit.test_pipe_backend import q_line


def mixed_plan() -> Plan:
    """The suite's base plan (static records, paused and down members, an IPv6 pool), a
    dual-stack pool with a static TXT record at its name, and a pool with nothing to answer."""
    doc = plan_doc()
    doc["zones"][0]["records"].append(
        {"name": "dual.example.test", "type": "TXT", "ttl": 60, "content": '"at the pool"'}
    )
    doc["pools"] += [
        {
            "name": "dual.example.test",
            "k": 3,
            "members": [
                {"id": "d4", "address": "10.0.1.1", "weight": 2, "ttl": 30},
                {"id": "d6", "address": "2001:db8::9", "weight": 1, "ttl": 40},
                {"id": "d7", "address": "10.0.1.2", "weight": 1, "ttl": 50},
            ],
        },
        {
            "name": "empty.example.test",
            "fallback": "nodata",
            "members": [{"id": "e", "address": "10.0.2.1", "ttl": 9, "state": "paused"}],
        },
    ]
    return parse_plan(doc)


def replies(table: AnswerTable, count: int = 40) -> dict[tuple[bytes, bytes], list[object]]:
    """The first ``count`` replies of every cycle, and every fixed reply, by name and type."""
    drawn: dict[tuple[bytes, bytes], list[object]] = {}
    for name, by_type in table.names.items():
        for rtype, reply in by_type.items():
            if isinstance(reply, tuple):
                drawn[(name, rtype)] = [reply]
            else:
                assert isinstance(reply, Iterator)
                drawn[(name, rtype)] = list(islice(reply, count))
    return drawn


@pytest.fixture
def compiler() -> Iterator[PartsCompiler]:
    made = PartsCompiler()
    yield made
    made.close()


@pytest.mark.parametrize("stale", [False, True])
@pytest.mark.parametrize("abi", [1, 5])
def test_the_compiler_gives_the_replies_the_loader_computes(
    compiler: PartsCompiler, abi: int, stale: bool
) -> None:
    for plan in (mixed_plan(), fleet_plan(500, pool_size=50)):
        here = compile_plan(plan, abi, stale=stale, rng=random.Random(4))
        there = compile_plan(plan, abi, stale=stale, rng=random.Random(4), parts_of=compiler.parts)
        assert replies(there) == replies(here)
        assert there.transfers == here.transfers
        for key, pool in here.pools.items():
            assert [answers for answers, _ in there.pools[key].counters] == [
                answers for answers, _ in pool.counters
            ]
    assert compiler.jobs == 4 + 10  # every pool of both plans, none compiled here
    assert compiler.failures == 0


def test_the_compiler_runs_at_idle_priority(compiler: PartsCompiler) -> None:
    list(compiler.parts([PartsJob(5, mixed_plan().pools[0], 1, None, False)]))
    process = compiler._process
    assert process is not None
    assert os.sched_getscheduler(process.pid) == os.SCHED_IDLE


def test_a_dead_compiler_costs_only_time(compiler: PartsCompiler) -> None:
    plan = fleet_plan(300, pool_size=50)
    jobs = [PartsJob(5, pool, 1, None, False) for pool in plan.pools]
    made = compiler.parts(jobs)
    first = next(made)
    assert isinstance(first, CycleParts)
    assert first == cycle_parts(jobs[0])
    process = compiler._process
    assert process is not None
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert list(made) == [None] * (len(jobs) - 1)  # the loader compiles those
    assert compiler.failures == 1
    # Not restarted at once: a compiler that keeps dying must not cost a start per plan.
    assert list(compiler.parts(jobs[:1])) == [None]
    compiler.restart_after = 0.0
    assert list(compiler.parts(jobs[:1])) == [cycle_parts(jobs[0])]
    # Compiled with a dead compiler, the plan is the same plan.
    compiler.close()
    here = compile_plan(plan, 5, stale=False, rng=random.Random(2))
    there = compile_plan(plan, 5, stale=False, rng=random.Random(2), parts_of=compiler.parts)
    assert replies(there) == replies(here)


def test_a_hung_compiler_is_given_up_at_its_deadline() -> None:
    compiler = PartsCompiler(deadline=0.5)
    try:
        job = PartsJob(5, mixed_plan().pools[0], 1, None, False)
        assert list(compiler.parts([job])) == [cycle_parts(job)]
        process = compiler._process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)
        started = time.monotonic()
        assert list(compiler.parts([job])) == [None]
        assert time.monotonic() - started < 5
        assert compiler.failures == 1
        assert process.poll() is not None  # killed, not left stopped
    finally:
        compiler.close()


def test_closing_stops_the_child_and_leaves_later_jobs_to_the_loader() -> None:
    compiler = PartsCompiler()
    job = PartsJob(5, mixed_plan().pools[0], 1, None, False)
    assert list(compiler.parts([job])) == [cycle_parts(job)]
    process = compiler._process
    assert process is not None
    compiler.close()
    assert process.poll() is not None
    assert list(compiler.parts([job])) == [None]
    assert compiler.failures == 0  # closing is not a failure


def test_a_serving_backend_compiles_new_plans_in_its_compiler(tmp_path: Path) -> None:
    """The first plan is compiled on the loader (nothing is answered before it), the next ones'
    changed pools by the compiler process; closed with the loop."""
    path = tmp_path / "plan.json"
    write_plan(path, plan_doc())
    backend = PipeBackend(FilePlanStore(path), rng=random.Random(1))
    backend.handle(b"HELO\t5")
    backend.compiler = PartsCompiler()
    try:
        backend.poll(force=True)
        assert backend.compiler.jobs == 0
        write_plan(path, plan_doc(version=8))
        backend.poll(force=True)
        assert backend.plan is not None and backend.plan.version == 8
        # Both pools of the base plan are as before: nothing to compile again.
        assert backend.compiler.jobs == 0
        doc = plan_doc(version=9)
        doc["pools"][0]["members"][0]["weight"] = 9
        write_plan(path, doc)
        backend.poll(force=True)
        assert backend.compiler.jobs == 1
        assert "compiler process: 1 pools compiled, 0 failures" in backend.status()
        reply = backend.handle(q_line(5, "www.example.test", "A"))
        assert reply.count(b"\tA\t") == 2
    finally:
        backend.compiler.close()
