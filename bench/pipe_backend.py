"""Benchmark of the dnslb pipe backend: figures printed side by side from one run on this machine.

What it measures:

1. **QPS ceiling.** dnsperf against ``pdns_server`` + the dnslb pipe backend, and against
   ``pdns_server`` + the bind backend serving the same zone (the pool's addresses as static A
   records, same TTL, same response size), both with pdns's caches off (``cache-ttl=0``,
   ``query-cache-ttl=0``, ``negquery-cache-ttl=0``) and the same thread counts. The servers run
   side by side and dnsperf visits them in interleaved short rounds, so that this noisy machine's
   drift falls on both alike; the figure is the median QPS of each and the ratio pipe/bind. A
   third server, pdns + pipe with pdns's caches as :func:`daemons.pdns.render_config` deploys them,
   is measured in the same rounds for information. pdns's own counters give the backend queries
   per DNS query (``backend-queries`` / ``udp-queries``: pipe round trips for a pipe backend), and
   /proc the CPU that pdns_server and its coprocesses spent per DNS query.
2. **Latency at a fixed rate.** dnsperf ``-Q 2000 -v`` (the verbose mode prints each response's
   latency; this dnsperf has no histogram option); p50 and p99 computed here, a lost query counted
   as slower than any answer.
3. **The bare backend.** ``python -m pipe_backend`` reading N realistic ABI 5 request lines
   (HELO, then Q lines for the pool name and the apex: A, ANY, SOA, NS, mixed letter case) from a
   pipe and writing to a pipe; its time with a HELO-only input (interpreter start, imports, plan
   load and compile) is subtracted, giving microseconds per line. Then the same lines one at a
   time, each reply awaited before the next request (ping-pong, as pdns drives a coprocess), beside
   a trivial Python responder that answers ``END`` to every line: the floor of a round trip
   through two pipes on this machine. Both again pinned to one CPU, and the trivial one across
   two CPUs: on a virtual machine a wake-up on another virtual CPU can cost several times the
   whole round trip on one, which is what pdns pays per pipe round trip.

The bare backend runs first, before any server is up; then the QPS rounds, then the latency rounds.

Run it from the repository root with the project's virtualenv (Debian's python)::

    .venv/bin/python bench/pipe_backend.py            # about two minutes
    .venv/bin/python bench/pipe_backend.py --quick    # about forty seconds

Needs ``pdns_server`` with the pipe and bind backends, ``pdns_control`` and ``dnsperf``
(apt-get install pdns-server pdns-backend-pipe pdns-backend-bind dnsperf). It listens on loopback
ports from 5440 up (``--port``) and stops every process it starts, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from daemons.pdns import PdnsServer, PdnsSettings, process_settings, render_config
from daemons.process import port_free
from dnslb.errors import DnslbError
from dnslb.plan import Member, MemberState, Plan, Pool, Record, Soa, Zone, plan_to_json
from dnslb.selection import answer_ttl
from evaluation.percentile import percentile

ZONE = "bench.test"
POOL = f"www.{ZONE}"

QPS_GOAL = 0.85  # pipe/bind ceiling ratio
P99_GOAL_MS = 0.35
LINE_GOAL_US = 3.0
FIXED_QPS = 2000

NO_CACHES = "cache-ttl=0\nquery-cache-ttl=0\n"  # negquery-cache-ttl comes from PdnsSettings

# Answers END to every request line, as fast as a Python coprocess can: the ping-pong floor.
TRIVIAL_RESPONDER = """\
import os
while True:
    data = os.read(0, 65536)
    if not data:
        break
    os.write(1, b"END\\n" * data.count(b"\\n"))
"""


@dataclass(frozen=True, slots=True)
class Options:
    rounds: int
    round_seconds: float
    latency_rounds: int
    latency_seconds: float  # per round
    lines: int
    repeats: int
    pingpong_lines: int
    clients: int
    pdns_threads: int
    port: int
    keep: bool


def parse_options(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (~40 s)")
    parser.add_argument("--rounds", type=int, help="QPS rounds per server (default 5, quick 3)")
    parser.add_argument("--round-seconds", type=float, help="seconds per QPS round (4, quick 2)")
    parser.add_argument("--latency-seconds", type=float, help="seconds per latency round (2.5)")
    parser.add_argument("--lines", type=int, help="request lines for the bulk timing (200000)")
    parser.add_argument("--clients", type=int, default=4, help="dnsperf -c (default 4)")
    parser.add_argument("--pdns-threads", type=int, default=2, help="distributor-threads (2)")
    parser.add_argument("--port", type=int, default=5440, help="first loopback port to try")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    quick = args.quick
    return Options(
        rounds=args.rounds or (3 if quick else 5),
        round_seconds=args.round_seconds or (2.0 if quick else 4.0),
        latency_rounds=2 if quick else 4,
        latency_seconds=args.latency_seconds or 2.5,
        lines=args.lines or (50_000 if quick else 200_000),
        repeats=3 if quick else 5,
        pingpong_lines=5_000 if quick else 20_000,
        clients=args.clients,
        pdns_threads=args.pdns_threads,
        port=args.port,
        keep=args.keep,
    )


# -- what is served ------------------------------------------------------------------------------


def bench_plan() -> Plan:
    """One zone and one pool whose k covers all 4 members: both servers answer 4 A records."""
    members = tuple(
        Member(id=f"cache-{i}", address=f"127.0.1.{i}", weight=float(5 - i), ttl=60)
        for i in range(1, 5)
    )
    zone = Zone(
        name=ZONE,
        soa=Soa(mname=f"ns1.{ZONE}", rname=f"hostmaster.{ZONE}", serial=1),
        ns=(f"ns1.{ZONE}",),
        records=(Record(name=f"ns1.{ZONE}", type="A", ttl=3600, content="127.0.0.1"),),
    )
    return Plan(version=1, zones=(zone,), pools=(Pool(name=POOL, members=members, k=4),))


def zone_file(plan: Plan) -> str:
    """The plan as a zone file for the bind backend: pools become static A/AAAA records."""
    lines: list[str] = []
    for zone in plan.zones:
        soa = zone.soa
        lines.append(
            f"{zone.name}. {soa.ttl} IN SOA {soa.mname}. {soa.rname}. {soa.serial} "
            f"{soa.refresh} {soa.retry} {soa.expire} {soa.minimum}"
        )
        lines += [f"{zone.name}. {zone.ns_ttl} IN NS {ns}." for ns in zone.ns]
        for record in zone.records:
            if record.type not in ("A", "AAAA"):
                raise ValueError(f"zone_file: {record.type} records are not written")
            lines.append(f"{record.name}. {record.ttl} IN {record.type} {record.content}")
    for pool in plan.pools:
        active = [member for member in pool.members if member.state is MemberState.ACTIVE]
        ttl = answer_ttl(active, pool, stale=False)  # the TTL of an answer holding them all
        for member in active:
            rtype = "AAAA" if member.ipv6 else "A"
            lines.append(f"{pool.name}. {ttl} IN {rtype} {member.address}")
    return "\n".join(lines) + "\n"


def bind_config(settings: PdnsSettings, workdir: Path, named_conf: Path) -> str:
    """A pdns.conf for the bind backend with the same threads, caches off, as the pipe one."""
    return f"""\
launch=bind
bind-config={named_conf}
cache-ttl=0
query-cache-ttl=0
negquery-cache-ttl=0
zone-cache-refresh-interval=0
consistent-backends=no
no-shuffle=yes
distributor-threads={settings.threads}
{process_settings(settings, workdir)}"""


def free_port(address: str, start: int, taken: set[int]) -> int:
    """The first port from ``start`` (below 5500) free for UDP and TCP on ``address``: the same
    ports run after run, so that a bench's figures are comparable."""
    for port in range(start, 5500):
        if port not in taken and port_free(address, port, "udp") and port_free(address, port):
            taken.add(port)
            return port
    raise RuntimeError(f"no free loopback port between {start} and 5499")


@dataclass(slots=True)
class Target:
    """A running pdns_server under test and what was measured on it."""

    label: str
    server: PdnsServer
    qps: list[float] = field(default_factory=list)
    response_size: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds; inf for a lost query
    round_p99s: list[float] = field(default_factory=list)
    backend_queries: int = 0
    udp_queries: int = 0
    pdns_cpu: float = 0.0  # seconds of CPU used by pdns_server during the QPS rounds
    backend_cpu: float = 0.0  # ... by its backend coprocesses

    @property
    def port(self) -> int:
        return self.server.settings.port

    def cpu(self) -> tuple[float, dict[int, float]]:
        """CPU seconds so far of pdns_server and of each of its child processes, by pid."""
        assert self.server.process is not None
        pid = self.server.process.pid
        children: dict[int, float] = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    with contextlib.suppress(OSError):  # it may have just exited
                        children[int(child)] = process_cpu(int(child))
        return process_cpu(pid), children

    def counters(self) -> tuple[int, int]:
        """pdns's ``backend-queries`` and ``udp-queries`` so far."""
        output = run(
            ["pdns_control", f"--config-dir={self.server.workdir}", "show", "*"], timeout=10
        )
        values = dict(item.split("=", 1) for item in output.strip().strip(",").split(","))
        return int(values["backend-queries"]), int(values["udp-queries"])


def process_cpu(pid: int) -> float:
    """CPU seconds a process's live threads have run, user and system.

    From schedstat (nanoseconds) rather than stat's clock ticks: a short round or a few thousand
    ping-pongs use only a few ticks.
    """
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def start_servers(
    stack: contextlib.ExitStack, opts: Options, workdir: Path, plan_path: Path
) -> list[Target]:
    """pdns + pipe (caches off), pdns + bind (caches off), pdns + pipe (caches as deployed)."""
    zone_path = workdir / f"{ZONE}.zone"
    zone_path.write_text(zone_file(bench_plan()))
    named_conf = workdir / "named.conf"
    named_conf.write_text(f'zone "{ZONE}" {{ type master; file "{zone_path}"; }};\n')

    taken: set[int] = set()

    def settings(negative_ttl: int = 60) -> PdnsSettings:
        return PdnsSettings(
            plan=str(plan_path),
            port=free_port("127.0.0.1", opts.port, taken),
            threads=opts.pdns_threads,
            negative_ttl=negative_ttl,
            python=sys.executable,
            state_dir=str(workdir / "pipe-backend"),
        )

    pipe_settings = settings(negative_ttl=0)
    pipe_dir = workdir / "pdns-pipe"
    bind_settings = settings()
    bind_dir = workdir / "pdns-bind"
    servers = [
        (
            "pipe",
            PdnsServer(
                pipe_settings, pipe_dir, config=render_config(pipe_settings, pipe_dir) + NO_CACHES
            ),
        ),
        (
            "bind",
            PdnsServer(
                bind_settings, bind_dir, config=bind_config(bind_settings, bind_dir, named_conf)
            ),
        ),
        ("pipe, caches on", PdnsServer(settings(), workdir / "pdns-pipe-cached")),
    ]
    targets = []
    for label, server in servers:
        stack.callback(server.stop)
        server.start(probe_name=ZONE)
        targets.append(Target(label=label, server=server))
    return targets


# -- dnsperf ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DnsperfRun:
    qps: float
    sent: int
    completed: int
    response_size: int
    rcodes: str
    latencies: list[float]  # only with verbose


def dnsperf(
    port: int,
    datafile: Path,
    seconds: float,
    clients: int,
    *,
    rate: int | None = None,
    verbose: bool = False,
    dnssec_ok: bool = False,
) -> DnsperfRun:
    command = ["dnsperf", "-s", "127.0.0.1", "-p", str(port), "-d", str(datafile)]
    command += ["-l", f"{seconds:g}", "-c", str(clients), "-t", "2"]
    if dnssec_ok:
        command.append("-D")  # EDNS with the DO bit: a signed zone's answers carry RRSIGs
    if rate is not None:
        command += ["-Q", str(rate)]
    if verbose:
        command.append("-v")
    output = run(command, timeout=seconds + 20)

    def figure(label: str) -> str:
        match = re.search(rf"^\s*{label}:\s*(\S+)", output, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"dnsperf printed no {label!r}:\n{output[-2000:]}")
        return match.group(1)

    latencies: list[float] = []
    if verbose:
        # "> NOERROR www.bench.test A 0.000212"; "> T ..." a timed-out query, "> I ..." one
        # still in flight when the time limit stopped the run (neither answered nor lost).
        for line in output.splitlines():
            fields = line.split()
            if len(fields) < 2 or fields[0] != ">":
                continue
            if fields[1] == "T":
                latencies.append(math.inf)
            elif fields[1] != "I":
                latencies.append(float(fields[-1]))
    sizes = re.search(r"Average packet size:\s*request \d+, response (\d+)", output)
    rcodes = re.search(r"Response codes:\s*(.+)", output)
    return DnsperfRun(
        qps=float(figure("Queries per second")),
        sent=int(figure("Queries sent")),
        completed=int(figure("Queries completed")),
        response_size=int(sizes.group(1)) if sizes else 0,
        rcodes=rcodes.group(1).strip() if rcodes else "none",
        latencies=latencies,
    )


def dnsperf_datafile(path: Path) -> None:
    """Queries for the pool's A records, in the letter cases clients use."""
    names = [POOL, POOL.upper(), "Www.Bench.Test", "www.BENCH.test"]
    path.write_text("".join(f"{name} A\n" for name in names * 25))


def measure_ceiling(targets: list[Target], opts: Options, datafile: Path) -> None:
    for round_index in range(opts.rounds):
        # Rotating the order keeps any one server from always following the same neighbour.
        shift = round_index % len(targets)
        for target in targets[shift:] + targets[:shift]:
            before, cpu_before = target.counters(), target.cpu()
            result = dnsperf(target.port, datafile, opts.round_seconds, opts.clients)
            after, cpu_after = target.counters(), target.cpu()
            target.backend_queries += after[0] - before[0]
            target.udp_queries += after[1] - before[1]
            target.pdns_cpu += cpu_after[0] - cpu_before[0]
            target.backend_cpu += sum(
                used - cpu_before[1].get(pid, 0.0) for pid, used in cpu_after[1].items()
            )
            target.qps.append(result.qps)
            target.response_size = result.response_size
            if result.rcodes != f"NOERROR {result.completed} (100.00%)":
                raise RuntimeError(f"{target.label}: unexpected response codes {result.rcodes}")
            lost = result.sent - result.completed
            say(
                f"  round {round_index + 1}: {target.label:<16} {result.qps:>9,.0f} QPS"
                + (f", {lost} lost" if lost else "")
            )


def measure_latency(targets: list[Target], opts: Options, datafile: Path) -> None:
    for round_index in range(opts.latency_rounds):
        for target in targets:
            result = dnsperf(
                target.port,
                datafile,
                opts.latency_seconds,
                opts.clients,
                rate=FIXED_QPS,
                verbose=True,
            )
            target.latencies += result.latencies
            target.round_p99s.append(percentile(result.latencies, 0.99))
            say(
                f"  round {round_index + 1}: {target.label:<16} {result.qps:>6,.0f} QPS, "
                f"p99 {target.round_p99s[-1] * 1e3:.3f} ms"
            )


# -- the bare backend -----------------------------------------------------------------------------


def request_lines(count: int, rng: random.Random) -> list[bytes]:
    """``count`` Q lines (ABI 5) of the kinds pdns sends for the bench zone."""
    apex_cases = [ZONE, ZONE.upper(), "Bench.Test"]
    pool_cases = [POOL, POOL.upper(), "Www.Bench.Test", "www.BENCH.test"]
    # (weight, name choices, qtype, zone id): with consistent-backends=no pdns asks ANY for the
    # answer; SOA and NS lookups (zone id -1 for SOA) are how it finds the zone and delegations.
    kinds = [
        (40, pool_cases, "ANY", "1"),
        (15, pool_cases, "A", "1"),
        (15, apex_cases, "SOA", "-1"),
        (10, pool_cases, "SOA", "-1"),
        (10, pool_cases, "NS", "1"),
        (10, apex_cases, "ANY", "1"),
    ]
    weights = [kind[0] for kind in kinds]
    lines = []
    for choice in rng.choices(kinds, weights, k=count):
        _, names, qtype, zone_id = choice
        remote = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        local = "127.0.0.1"
        line = f"Q\t{rng.choice(names)}\tIN\t{qtype}\t{zone_id}\t{remote}\t{local}\t{remote}/32\n"
        lines.append(line.encode("ascii"))
    return lines


HELO = b"HELO\t5\n"


@contextlib.contextmanager
def killed_after(processes: Sequence[subprocess.Popen[bytes]], seconds: float) -> Iterator[None]:
    """Kill ``processes`` if the block takes longer than ``seconds``; always reap them."""

    def kill_all() -> None:
        for process in processes:
            process.kill()

    timer = threading.Timer(seconds, kill_all)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()


def time_bulk(command: list[str], input_path: Path, log: Path) -> tuple[float, bytes]:
    """Seconds from the backend's start to its exit, input from ``cat`` through a pipe."""
    with open(log, "ab") as log_file:
        feeder = subprocess.Popen(["cat", str(input_path)], stdout=subprocess.PIPE)
        assert feeder.stdout is not None
        started = time.perf_counter()
        backend = subprocess.Popen(
            command, stdin=feeder.stdout, stdout=subprocess.PIPE, stderr=log_file
        )
    feeder.stdout.close()
    assert backend.stdout is not None
    chunks = []
    with killed_after([feeder, backend], 120):
        fd = backend.stdout.fileno()
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        backend.wait()
        elapsed = time.perf_counter() - started
    backend.stdout.close()
    if backend.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {backend.returncode}; see {log}")
    return elapsed, b"".join(chunks)


@dataclass(frozen=True, slots=True)
class BulkResult:
    us_per_line: float
    startup_s: float


def measure_bulk(
    command: list[str], lines: list[bytes], opts: Options, workdir: Path
) -> BulkResult:
    empty = workdir / "helo-only.txt"
    empty.write_bytes(HELO)
    full = workdir / "requests.txt"
    full.write_bytes(HELO + b"".join(lines))
    log = workdir / "bulk-backend.log"
    startups, totals = [], []
    for _ in range(opts.repeats):
        startups.append(time_bulk(command, empty, log)[0])
        elapsed, output = time_bulk(command, full, log)
        totals.append(elapsed)
        replies = output.count(b"END\n")
        if replies != len(lines) or b"FAIL" in output:
            raise RuntimeError(f"expected {len(lines)} END replies, got {replies}; see {log}")
    startup = statistics.median(startups)
    per_line = (statistics.median(totals) - startup) / len(lines)
    return BulkResult(us_per_line=per_line * 1e6, startup_s=startup)


def ping_pong(
    command: list[str], lines: list[bytes], warm: int, log: Path, cpus: tuple[int, int] | None
) -> tuple[list[float], float]:
    """Seconds of each request's round trip, one request in flight at a time (as pdns does),
    and the responder's CPU seconds, both without the first ``warm`` requests.

    ``cpus`` pins this driver to the first CPU and the responder to the second.
    """
    if cpus is not None:
        command = ["taskset", "-c", str(cpus[1]), *command]
    with open(log, "ab") as log_file:
        backend = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file
        )
    affinity = os.sched_getaffinity(0)
    if cpus is not None:
        os.sched_setaffinity(0, {cpus[0]})
    try:
        return _drive(backend, lines, warm, log)
    finally:
        os.sched_setaffinity(0, affinity)


def _drive(
    backend: subprocess.Popen[bytes], lines: list[bytes], warm: int, log: Path
) -> tuple[list[float], float]:
    assert backend.stdin is not None
    assert backend.stdout is not None
    to_backend, from_backend = backend.stdin.fileno(), backend.stdout.fileno()
    clock = time.perf_counter
    samples = []
    cpu_before = 0.0
    with killed_after([backend], 120):
        os.write(to_backend, HELO)
        os.read(from_backend, 65536)  # OK banner (the trivial responder says END)
        for index, line in enumerate(lines):
            if index == warm:
                cpu_before = process_cpu(backend.pid)
            started = clock()
            os.write(to_backend, line)
            reply = os.read(from_backend, 65536)
            while not reply.endswith((b"END\n", b"FAIL\n")):
                more = os.read(from_backend, 65536)
                if not more:
                    raise RuntimeError(f"the responder closed its output mid-reply; see {log}")
                reply += more
            samples.append(clock() - started)
        cpu = process_cpu(backend.pid) - cpu_before
        backend.stdin.close()
    backend.stdout.close()
    return samples[warm:], cpu


@dataclass(slots=True)
class PingPong:
    samples: list[float] = field(default_factory=list)
    cpu: float = 0.0

    @property
    def mean_us(self) -> float:
        return statistics.fmean(self.samples) * 1e6

    @property
    def p50_us(self) -> float:
        return percentile(self.samples, 0.50) * 1e6

    @property
    def cpu_us(self) -> float:
        return self.cpu / len(self.samples) * 1e6


DNSLB, TRIVIAL = "dnslb backend", "trivial responder"
DNSLB_SAME, TRIVIAL_SAME, TRIVIAL_ACROSS = "dnslb, same CPU", "trivial, same CPU", "trivial, 2 CPUs"


def measure_ping_pong(
    backend_command: list[str], lines: list[bytes], opts: Options, log: Path
) -> dict[str, PingPong]:
    """Round trips to the dnslb backend and to a trivial responder, placed by the scheduler and
    pinned: on this VM a wake-up across virtual CPUs costs several times a round trip on one."""
    trivial = [sys.executable, "-c", TRIVIAL_RESPONDER]
    variants: list[tuple[str, list[str], tuple[int, int] | None]] = [
        (DNSLB, backend_command, None),
        (TRIVIAL, trivial, None),
    ]
    cpus = sorted(os.sched_getaffinity(0))
    variants += [(DNSLB_SAME, backend_command, (cpus[0], cpus[0]))]
    variants += [(TRIVIAL_SAME, trivial, (cpus[0], cpus[0]))]
    if len(cpus) > 1:
        variants.append((TRIVIAL_ACROSS, trivial, (cpus[0], cpus[1])))
    results = {label: PingPong() for label, _, _ in variants}
    # Alternating slices, each in a fresh process, so that a busy spell of this shared machine
    # falls on every variant; the first requests of each process (first-use costs) are left out.
    slices = 4
    size = opts.pingpong_lines // slices
    warm = size // 10
    for index in range(slices):
        part = lines[index * size : (index + 1) * size + warm]
        for label, command, pinned in variants:
            samples, cpu = ping_pong(command, part, warm, log, pinned)
            results[label].samples += samples
            results[label].cpu += cpu
    return results


# -- the run ---------------------------------------------------------------------------------------


def say(text: str) -> None:
    print(text, flush=True)


def run(command: list[str], timeout: float) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{command[0]} exited with {result.returncode}:\n{result.stderr}")
    return result.stdout + result.stderr


def versions() -> str:
    pdns = subprocess.run(
        ["pdns_server", "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    pdns_version = re.search(r"Authoritative Server (\S+)", pdns.stdout + pdns.stderr)
    perf = subprocess.run(
        ["dnsperf", "-h"], capture_output=True, text=True, timeout=10, check=False
    )
    perf_version = re.search(r"Version (\S+)", perf.stdout + perf.stderr)
    return (
        f"pdns {pdns_version.group(1) if pdns_version else '?'}, "
        f"dnsperf {perf_version.group(1) if perf_version else '?'}, "
        f"python {sys.version.split()[0]} ({sys.executable}), {os.cpu_count()} CPUs"
    )


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_options(argv)
    for tool in ("pdns_server", "pdns_control", "dnsperf"):
        if shutil.which(tool) is None and not os.access(f"/usr/sbin/{tool}", os.X_OK):
            say(
                f"{tool} not found: apt-get install pdns-server pdns-backend-pipe "
                "pdns-backend-bind dnsperf"
            )
            return 1
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="dnslb-bench-"))
    started_in = Path.cwd()
    # Every child (pdns_server and so its coprocesses) inherits this directory, where
    # `python -m pipe_backend` puts the current directory first on sys.path: run from bench/, this
    # script's own name would hide the pipe_backend package from the coprocess.
    os.chdir(workdir)
    try:
        return _run(opts, workdir)
    except KeyboardInterrupt:
        say("interrupted; every process stopped")
        return 130
    except (DnslbError, RuntimeError, subprocess.TimeoutExpired) as exc:
        say(f"benchmark failed: {exc}")
        return 1
    finally:
        os.chdir(started_in)
        if opts.keep:
            say(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(opts: Options, workdir: Path) -> int:
    began = time.monotonic()
    # Other work on the machine skews every figure; the load average tells a reader how much.
    load_before = os.getloadavg()[0]
    say(f"dnslb pipe backend benchmark: {versions()}")
    plan_path = workdir / "plan.json"
    plan_path.write_text(plan_to_json(bench_plan()))
    backend_command = [sys.executable, "-m", "pipe_backend", "--plan", str(plan_path)]
    backend_command += ["--state-dir", str(workdir / "pipe-backend")]
    lines = request_lines(opts.lines, random.Random(1))

    say(f"\n[1/3] bare backend: {opts.lines:,} request lines through pipes, {opts.repeats} repeats")
    bulk = measure_bulk(backend_command, lines, opts, workdir)
    say(f"  startup (HELO only) {bulk.startup_s * 1e3:.0f} ms, {bulk.us_per_line:.2f} us/line")
    say(f"  ping-pong: {opts.pingpong_lines:,} requests, one at a time, per responder")
    pings = measure_ping_pong(backend_command, lines, opts, workdir / "pingpong.log")
    for label, ping in pings.items():
        say(
            f"  {label:<22} mean {ping.mean_us:6.1f} us, p50 {ping.p50_us:6.1f} us, "
            f"p99 {percentile(ping.samples, 0.99) * 1e6:6.1f} us per round trip; "
            f"its CPU {ping.cpu_us:.1f} us per request"
        )

    datafile = workdir / "queries.txt"
    dnsperf_datafile(datafile)
    with contextlib.ExitStack() as stack:
        targets = start_servers(stack, opts, workdir, plan_path)
        say(
            f"\n[2/3] QPS ceiling: {opts.rounds} interleaved rounds of {opts.round_seconds:g} s, "
            f"dnsperf -c {opts.clients}, pdns distributor-threads={opts.pdns_threads}"
        )
        for target in targets:
            say(f"  {target.label}: 127.0.0.1:{target.port}, pdns config {target.server.workdir}")
            dnsperf(target.port, datafile, 1, opts.clients)  # warm-up: coprocesses start lazily
        measure_ceiling(targets, opts, datafile)
        say(
            f"\n[3/3] latency at {FIXED_QPS} QPS: {opts.latency_rounds} interleaved rounds of "
            f"{opts.latency_seconds:g} s (dnsperf -Q {FIXED_QPS} -v)"
        )
        measure_latency(targets, opts, datafile)

    pipe, bind, cached = targets
    say(
        "\nper server: QPS median over rounds; backend queries and CPU per DNS query over all QPS"
        f" rounds; latency over every response of the {FIXED_QPS} QPS rounds, and the median of"
        " the rounds' p99s"
    )
    say(
        f"  {'server':<16} {'QPS':>9} {'response':>9} {'backend q/query':>16} "
        f"{'pdns CPU':>9} {'backend CPU':>12} {'p50 ms':>8} {'p99 ms':>8} {'rounds p99':>11} "
        f"{'lost':>5}"
    )
    for target in targets:
        lost = sum(1 for value in target.latencies if math.isinf(value))
        queries = max(target.udp_queries, 1)
        say(
            f"  {target.label:<16} {statistics.median(target.qps):>9,.0f} "
            f"{target.response_size:>7} B "
            f"{target.backend_queries / queries:>16.2f} "
            f"{target.pdns_cpu / queries * 1e6:>6.1f} us "
            f"{target.backend_cpu / queries * 1e6:>9.1f} us "
            f"{percentile(target.latencies, 0.50) * 1e3:>8.3f} "
            f"{percentile(target.latencies, 0.99) * 1e3:>8.3f} "
            f"{statistics.median(target.round_p99s) * 1e3:>11.3f} {lost:>5}"
        )

    pipe_qps, bind_qps = statistics.median(pipe.qps), statistics.median(bind.qps)
    ratio = pipe_qps / bind_qps
    p99_ms = percentile(pipe.latencies, 0.99) * 1e3
    cached_p99_ms = percentile(cached.latencies, 0.99) * 1e3
    rows = [
        (
            "QPS ceiling, pipe/bind, caches off",
            f"{ratio:.2f} ({pipe_qps:,.0f} / {bind_qps:,.0f} QPS)",
            f">= {QPS_GOAL}",
            ratio >= QPS_GOAL,
        ),
        (
            f"p99 at {FIXED_QPS} QPS, pipe, caches off",
            f"{p99_ms:.3f} ms (bind {percentile(bind.latencies, 0.99) * 1e3:.3f} ms)",
            f"<= {P99_GOAL_MS} ms",
            p99_ms <= P99_GOAL_MS,
        ),
        (
            f"p99 at {FIXED_QPS} QPS, pipe, caches on",
            f"{cached_p99_ms:.3f} ms",
            f"<= {P99_GOAL_MS} ms",
            cached_p99_ms <= P99_GOAL_MS,
        ),
        (
            "bare backend, bulk through pipes",
            f"{bulk.us_per_line:.2f} us/line",
            f"<= {LINE_GOAL_US:g} us/line",
            bulk.us_per_line <= LINE_GOAL_US,
        ),
        (
            "bare backend, ping-pong round trip",
            f"mean {pings[DNSLB].mean_us:.1f} us, p50 {pings[DNSLB].p50_us:.1f} us "
            f"(trivial responder {pings[TRIVIAL].mean_us:.1f}, {pings[TRIVIAL].p50_us:.1f})",
            "none (info)",
            None,
        ),
        (
            "  same CPU: dnslb vs trivial, p50",
            f"{pings[DNSLB_SAME].p50_us:.1f} us vs {pings[TRIVIAL_SAME].p50_us:.1f} us",
            "none (info)",
            None,
        ),
    ]
    if TRIVIAL_ACROSS in pings:
        rows.append(
            (
                "  trivial, same CPU vs 2 CPUs, p50",
                f"{pings[TRIVIAL_SAME].p50_us:.1f} us vs {pings[TRIVIAL_ACROSS].p50_us:.1f} us",
                "none (info)",
                None,
            )
        )
    say(
        f"\nsummary (run took {time.monotonic() - began:.0f} s; 1-minute load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after):"
    )
    widths = [max(len(str(row[i])) for row in rows) for i in range(3)]
    for figure, measured, goal, met in rows:
        verdict = "-" if met is None else ("met" if met else "MISSED")
        say(f"  {figure:<{widths[0]}}  {measured:<{widths[1]}}  {goal:<{widths[2]}}  {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
