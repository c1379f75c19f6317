"""The DNS path at fleet scale: answers while big plans load and change.

Two measurements, each beside the pipe backend of another git revision with ``--baseline REV``
(checked out in a temporary worktree, removed at the end):

1. Loading a big plan (``--load-members``, 100,000 by default, in pools of 100). A pipe backend
   coprocess (``python -P -m pipe_backend``, driven over pipes as pdns drives it: one request, its
   reply, the next) serves a small plan; the big plan is published, then the same plan with one
   pool in ten changed. Printed: the time from publishing until the new plan answers (it
   includes up to one poll interval, 0.25 s), the longest wait for one reply meanwhile (normally
   tens of microseconds: anything longer is the loader holding the interpreter), and the
   coprocess's RSS before and its peak RSS after.
2. p50/p99 at 2,000 QPS (dnsperf ``-Q 2000 -v``) through pdns + pipe backend (caches as deployed)
   serving a ``--members`` (10,000) plan that a publisher changes every second (version, age and
   one pool in ten, or ``--changed`` of them, at least one), against the same plan left static, in
   interleaved rounds; the queries ask the A records of random pools. Goal: p99 changing <= 1.5 x
   static.

    .venv/bin/python -m bench.fleet_plan                       # about 2 minutes
    .venv/bin/python -m bench.fleet_plan --baseline HEAD       # beside the committed backend

Needs pdns_server (pipe backend) and dnsperf; stops every process it starts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from bench.pipe_backend import dnsperf, free_port, say
from bench.redis_outage import python_for, worktree
from daemons.pdns import PdnsServer, PdnsSettings
from dnslb.plan import Member, Plan, Pool, Record, Soa, Zone
from dnslb.plan_store import FilePlanStore
from evaluation.percentile import percentile

ZONE = "fleet.test"
POOL_SIZE = 100
P99_GOAL = 1.5


def fleet_plan(members: int, version: int = 1, *, pool_size: int = POOL_SIZE) -> Plan:
    """``members`` members in pools of ``pool_size`` (k = 4), every address unique."""
    pools = []
    for index in range(max(1, members // pool_size)):
        base = index * pool_size
        pool_members = tuple(
            Member(
                id=f"m{base + i}",
                address=f"10.{(base + i) >> 16 & 255}.{(base + i) >> 8 & 255}.{(base + i) & 255}",
                weight=float(10 + i % 7),
                ttl=30,
                utilization=0.5,
            )
            for i in range(pool_size)
        )
        pools.append(Pool(name=f"p{index}.{ZONE}", members=pool_members, k=4))
    zone = Zone(
        name=ZONE,
        soa=Soa(mname=f"ns1.{ZONE}", rname=f"hostmaster.{ZONE}", serial=1),
        ns=(f"ns1.{ZONE}",),
        records=(Record(name=f"ns1.{ZONE}", type="A", ttl=3600, content="127.0.0.1"),),
    )
    return Plan(
        version=version,
        zones=(zone,),
        pools=tuple(pools),
        generated_at=time.time(),
        stale_after=60.0,
    )


CHURNS = ("reshuffle", "drift")
"""How a changed pool's members change: ``reshuffle`` draws new weights (1 to 19) and
utilizations, so every answer cycle changes (a load that swings: the manager under a noisy load
moves weights that much); ``drift`` moves each weight by up to 0.1 % and each utilization by up
to 0.002, as the manager does under a steady load (measured: weights move by hundredths,
utilizations by thousandths), so most cycles keep their slots."""


def changed(
    plan: Plan, version: int, fraction: float, rng: random.Random, churn: str = "reshuffle"
) -> Plan:
    """``plan`` a second later: a new version and age, ``fraction`` of its pools' members with
    new weights and utilizations (as the manager's reports move them, :data:`CHURNS`)."""
    pools = list(plan.pools)
    for index in rng.sample(range(len(pools)), max(1, round(len(pools) * fraction))):
        members = tuple(
            dataclasses.replace(
                member,
                weight=round(member.weight * (1 + rng.uniform(-0.001, 0.001)), 2),
                utilization=round(
                    min(1.0, max(0.0, member.utilization + rng.uniform(-2, 2) / 1e3)), 3
                ),
            )
            if churn == "drift"
            else dataclasses.replace(
                member, weight=float(rng.randrange(1, 20)), utilization=rng.random()
            )
            for member in pools[index].members
        )
        pools[index] = dataclasses.replace(pools[index], members=members)
    return dataclasses.replace(plan, version=version, pools=tuple(pools), generated_at=time.time())


# -- 1. loading a big plan, answers meanwhile ----------------------------------------------------


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


@dataclasses.dataclass(slots=True)
class Load:
    seconds: float
    longest_gap: float
    replies: int


def measure_load(python: str, workdir: Path, members: int, rng: random.Random) -> list[str]:
    path = workdir / "load-plan.json"
    store = FilePlanStore(path)
    store.publish(fleet_plan(POOL_SIZE), durable=False)
    command = [python, "-P", "-m", "pipe_backend", "--plan", str(path)]
    command += ["--state-dir", str(workdir / "load-state"), "--seed", "1"]
    log = (workdir / "load.log").open("wb")
    backend = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    assert backend.stdin is not None
    assert backend.stdout is not None
    to_backend, from_backend = backend.stdin.fileno(), backend.stdout.fileno()
    big = fleet_plan(members, version=2)
    last = big.pools[-1].name
    probe = f"Q\t{last}\tIN\tA\t1\t10.0.0.1\t127.0.0.1\t10.0.0.1/32\n".encode()

    def ask() -> bytes:
        os.write(to_backend, probe)
        reply = os.read(from_backend, 65536)
        while not reply.endswith((b"END\n", b"FAIL\n")):
            more = os.read(from_backend, 65536)
            if not more:
                raise RuntimeError(f"the pipe backend exited; see {workdir / 'load.log'}")
            reply += more
        return reply

    def until(served: Callable[[bytes], bool]) -> Load:
        gc.freeze()  # no collection of this driver's own plans may count as a wait
        started = time.perf_counter()
        previous = started
        gap = 0.0
        replies = 0
        while True:
            reply = ask()
            now = time.perf_counter()
            gap = max(gap, now - previous)
            previous = now
            replies += 1
            if served(reply):
                return Load(now - started, gap, replies)
            if now - started > 120:
                raise RuntimeError("the big plan was not served within 120 s")

    lines = []
    try:
        os.write(to_backend, b"HELO\t5\n")
        os.read(from_backend, 65536)
        for _ in range(2000):
            ask()
        before = memory_kib(backend.pid, "VmRSS")
        store.publish(big, durable=False)
        first = until(lambda reply: b"\tA\t" in reply)
        # Then the fleet's steady state: one pool in ten changed (and the queried pool).
        later = changed(big, 3, 0.1, rng)
        pools = list(later.pools)
        pools[-1] = dataclasses.replace(pools[-1], k=3)
        later = dataclasses.replace(later, pools=tuple(pools))
        store.publish(later, durable=False)
        again = until(lambda reply: reply.count(b"\tA\t") == 3)  # k was 4
        peak = memory_kib(backend.pid, "VmHWM")
        rss = memory_kib(backend.pid, "VmRSS")
        for label, load in (("first load", first), ("10% of pools changed", again)):
            lines.append(
                f"{label:<22} served after {load.seconds:6.2f} s, longest reply wait "
                f"{load.longest_gap * 1e3:7.1f} ms, {load.replies:,} replies meanwhile"
            )
        lines.append(
            f"{'memory':<22} RSS {before / 1024:.0f} MiB with 100 members, "
            f"{rss / 1024:.0f} MiB with {members:,}, peak {peak / 1024:.0f} MiB"
        )
    finally:
        backend.stdin.close()
        try:
            backend.wait(10)
        except subprocess.TimeoutExpired:
            backend.kill()
            backend.wait()
        backend.stdout.close()
        log.close()
    return lines


# -- 2. p99 at 2,000 QPS while the plan changes ---------------------------------------------------


@contextlib.contextmanager
def publisher(
    store: FilePlanStore, plan: Plan, fraction: float, churn: str, every: int = 1
) -> Iterator[list[int]]:
    """Publish ``plan`` every second until the block ends, with its pools changed every
    ``every`` seconds (a new version and age the other seconds); yields [plans published]."""
    stop = threading.Event()
    count = [0]

    def loop() -> None:
        rng = random.Random(7)
        current = plan
        while not stop.wait(1.0 - time.time() % 1.0):
            version = current.version + 1
            if count[0] % every == 0:
                current = changed(current, version, fraction, rng, churn)
            else:
                current = dataclasses.replace(current, version=version, generated_at=time.time())
            store.publish(current)
            count[0] += 1

    thread = threading.Thread(target=loop, name="publisher", daemon=True)
    thread.start()
    try:
        yield count
    finally:
        stop.set()
        thread.join()


def measure_qps(opts: argparse.Namespace, trees: list[tuple[str, Path]], workdir: Path) -> None:
    plan = fleet_plan(opts.members)
    datafile = workdir / "queries.txt"
    rng = random.Random(3)
    datafile.write_text(
        "".join(f"{rng.choice(plan.pools).name} A\n" for _ in range(1000)),
    )
    taken: set[int] = set()
    servers: list[tuple[str, str, PdnsServer, FilePlanStore]] = []
    decoys: dict[int, FilePlanStore] = {}
    with contextlib.ExitStack() as stack:
        for label, tree in trees:
            for condition in ("changing", "static"):
                where = workdir / f"pdns-{len(servers)}"
                where.mkdir()
                store = FilePlanStore(where / "plan.json")
                store.publish(plan)
                settings = PdnsSettings(
                    plan=str(store.path),
                    port=free_port("127.0.0.1", opts.port, taken),
                    python=python_for(tree, workdir),
                    # A coprocess loads and compiles the whole plan before its banner: seconds
                    # for a big plan on a busy machine (pdns's default wait is 2 s).
                    pipe_timeout_ms=10_000,
                )
                server = PdnsServer(settings, where)
                stack.callback(server.stop)
                server.start(probe_name=ZONE, timeout=60)
                servers.append((label, condition, server, store))
                decoys[settings.port] = FilePlanStore(where / "unread-plan.json")
        latencies: dict[tuple[str, str], list[float]] = {}
        rounds: dict[tuple[str, str], list[float]] = {}  # each round's p99
        say(
            f"\np50/p99 at 2,000 QPS, {opts.members:,} members in pools of {POOL_SIZE}, "
            f"{opts.rounds} interleaved rounds of {opts.seconds:g} s; the changing plan "
            f"republished every second with {opts.changed:.0%} of its pools changed "
            f"({opts.churn})" + (f" every {opts.every} s" if opts.every > 1 else "")
        )
        for round_index in range(opts.rounds):
            shift = round_index % len(servers)
            for label, condition, server, store in servers[shift:] + servers[:shift]:
                with contextlib.ExitStack() as changing:
                    # The publisher's own work (building and writing a plan a second, on these
                    # same 2 CPUs) runs in both conditions; only the changing server reads it.
                    target = store if condition == "changing" else decoys[server.settings.port]
                    count = changing.enter_context(
                        publisher(target, plan, opts.changed, opts.churn, opts.every)
                    )
                    result = dnsperf(
                        server.settings.port,
                        datafile,
                        opts.seconds,
                        4,
                        rate=2000,
                        verbose=True,
                    )
                # A loader still busy with the last plans must not spill into the next round.
                time.sleep(opts.settle)
                published = f", {count[0]} plans published" + (
                    "" if condition == "changing" else " (to a file nobody reads)"
                )
                latencies.setdefault((label, condition), []).extend(result.latencies)
                rounds.setdefault((label, condition), []).append(percentile(result.latencies, 0.99))
                say(
                    f"  round {round_index + 1}: {label:<10} {condition:<9} {result.qps:>6,.0f} "
                    f"QPS, p99 {percentile(result.latencies, 0.99) * 1e3:7.3f} ms, "
                    f"{result.sent - result.completed} lost{published}"
                )
        say(
            "\nsummary (every response of every round, a lost query slower than any; and the "
            "median of the rounds' p99s, which one disturbed round does not move):"
        )
        for label, _tree in trees:
            p99 = {}
            for condition in ("changing", "static"):
                values = latencies[(label, condition)]
                p99[condition] = statistics.median(rounds[(label, condition)])
                say(
                    f"  {label:<10} {condition:<9} p50 {percentile(values, 0.5) * 1e3:6.3f} ms, "
                    f"p99 {percentile(values, 0.99) * 1e3:7.3f} ms, "
                    f"median round p99 {p99[condition] * 1e3:7.3f} ms"
                )
            ratio = p99["changing"] / p99["static"]
            verdict = "met" if ratio <= P99_GOAL else "MISSED"
            say(
                f"  {label}: median round p99 changing / static = {ratio:.2f} "
                f"(goal <= {P99_GOAL}: {verdict})"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=10_000, help="members of the QPS plan")
    parser.add_argument("--load-members", type=int, default=100_000, help="of the big plan")
    parser.add_argument(
        "--changed", type=float, default=0.1, help="fraction of pools changed a second (>= 1)"
    )
    parser.add_argument(
        "--churn",
        choices=CHURNS,
        default="reshuffle",
        help="how a changed pool changes: new weights (reshuffle) or the manager's drift",
    )
    parser.add_argument(
        "--every",
        type=int,
        default=1,
        help="change the pools every N seconds only (the others: a new version and age), as "
        "the manager does with hold_within under a swinging load (1)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per condition (3)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per round (8)")
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds of rest after each round (3)"
    )
    parser.add_argument("--baseline", help="git revision whose pipe backend runs beside")
    parser.add_argument("--skip-load", action="store_true", help="only the QPS rounds")
    parser.add_argument("--skip-qps", action="store_true", help="only the big plan's load")
    parser.add_argument("--port", type=int, default=5480, help="first DNS port to try")
    opts = parser.parse_args(argv)
    if opts.every < 1:
        parser.error("--every must be at least 1")
    for program in ("pdns_server", "dnsperf"):
        if shutil.which(program) is None:
            print(f"{program} is not installed", file=sys.stderr)
            return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as temp:
        workdir = Path(temp)
        trees = [("this tree", Path(__file__).resolve().parent.parent)]
        if opts.baseline:
            trees.append((opts.baseline, stack.enter_context(worktree(opts.baseline))))
        if not opts.skip_load:
            say(f"loading a {opts.load_members:,}-member plan (pools of {POOL_SIZE}):")
            for index, (label, tree) in enumerate(trees):
                python = python_for(tree, workdir)
                # Each coprocess a directory of its own: one that found the last good copy of
                # the run before (the big plan, newer than its small one) served it at once.
                where = workdir / f"load-{index}"
                where.mkdir()
                for line in measure_load(python, where, opts.load_members, random.Random(5)):
                    say(f"  {label:<10} {line}")
        if not opts.skip_qps:
            measure_qps(opts, trees, workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
