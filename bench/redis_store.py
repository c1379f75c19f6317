"""Benchmark of the Redis plan store: the RESP client's figures, and DNS latency while Redis
misbehaves, printed side by side from one run on this machine.

What it measures:

1. **The client against a real redis-server.** The stamp read a pipe backend polls (GET of a
   small key): median and p99 microseconds over many calls. The plan read of a 100,000-member
   plan (about 10 MB of JSON): the transfer (GET) alone and the read with parsing, median of
   several. Against a Redis that stops answering (SIGSTOP): how long a stamp read takes to
   fail (its deadline, 0.5 s) and how long the next calls take while backing off.
2. **DNS p99 at 2,000 QPS while Redis misbehaves.** ``pdns_server`` with the pipe backend as
   :func:`daemons.pdns.render_config` deploys it reads the plan from Redis through a TCP proxy
   that this script switches between *healthy* (passes bytes through), *silent* (accepts and
   reads, answers nothing: a Redis that stopped answering) and *trickle* (one byte every 0.3 s:
   the reply that used to stop every answer). dnsperf ``-Q 2000 -v`` runs the same length in
   each mode, in interleaved rounds; p50 and p99 over every response of all rounds, a lost
   query counted as slower than any answer. Goal: the p99 with Redis silent or trickling is
   that of a healthy Redis (the plan poll runs off the query path; the client fails fast).

Run it from the repository root with the project's virtualenv::

    .venv/bin/python bench/redis_store.py            # about two minutes
    .venv/bin/python bench/redis_store.py --quick    # about forty seconds

Needs ``redis-server``, ``pdns_server`` with the pipe backend and ``dnsperf`` (apt-get install
redis-server pdns-server pdns-backend-pipe dnsperf). It listens on loopback ports chosen by the
kernel and stops every process it starts, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from daemons.pdns import PdnsServer, PdnsSettings
from daemons.process import free_port, spawn, stop_group
from dnslb.errors import DnslbError
from dnslb.plan import Member, Plan, Pool, Soa, Zone
from dnslb.plan_store import RedisPlanStore
from dnslb.resp import RedisAddress, RedisError, redis_answers
from evaluation.percentile import percentile

ZONE = "bench.test"
POOL = f"www.{ZONE}"
FIXED_QPS = 2000
MODES = ("healthy", "silent", "trickle")


@dataclass(frozen=True, slots=True)
class Options:
    rounds: int
    seconds: float
    stamps: int
    plan_reads: int
    keep: bool


def parse_options(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one short round per mode")
    parser.add_argument("--rounds", type=int, help="dnsperf rounds per mode (default 3)")
    parser.add_argument("--seconds", type=float, help="seconds per dnsperf round (default 8)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    return Options(
        rounds=args.rounds or (1 if args.quick else 3),
        seconds=args.seconds or (5.0 if args.quick else 8.0),
        stamps=2000 if args.quick else 10_000,
        plan_reads=3 if args.quick else 5,
        keep=args.keep,
    )


def bench_plan(members: int = 4, version: int = 1) -> Plan:
    pool = Pool(
        name=POOL,
        members=tuple(
            Member(
                id=f"m{i}",
                address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                weight=1.0,
                ttl=30,
            )
            for i in range(members)
        ),
        k=4,
    )
    zone = Zone(
        name=ZONE,
        soa=Soa(mname=f"ns1.{ZONE}", rname=f"hostmaster.{ZONE}", serial=version),
        ns=(f"ns1.{ZONE}",),
    )
    return Plan(version=version, zones=(zone,), pools=(pool,))


# -- Redis, and a proxy in front of it that misbehaves on demand ----------------------------------


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = spawn(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", str(workdir)),
        ],
        name="redis-server",
        ready=lambda _: redis_answers(RedisAddress(port=port)),
        timeout=10,
    )
    return process, port


class Proxy:
    """A TCP proxy to Redis whose replies flow, stop, or trickle a byte every 0.3 s."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.mode = "healthy"
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), 2)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                server.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _down(self, server: socket.socket, client: socket.socket) -> None:
        held = bytearray()
        server.settimeout(0.05)
        try:
            while not self._stop.is_set():
                if self.mode == "healthy" and held:
                    client.sendall(held)
                    held.clear()
                elif self.mode == "trickle" and held:
                    client.sendall(held[:1])
                    del held[:1]
                    time.sleep(0.3)
                try:
                    data = server.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    return
                held += data
        except OSError:
            pass
        finally:
            client.close()
            server.close()


# -- 1. the client --------------------------------------------------------------------------------


def measure_client(redis: subprocess.Popen[bytes], port: int, opts: Options) -> None:
    store = RedisPlanStore(RedisAddress(port=port, key="bench:plan"))
    try:
        store.publish(bench_plan())
        times = []
        for _ in range(opts.stamps):
            started = time.perf_counter()
            store.stamp()
            times.append(time.perf_counter() - started)
        say(
            f"  stamp read (GET of a small key), {opts.stamps} calls: "
            f"median {statistics.median(times) * 1e6:.0f} us, "
            f"p99 {percentile(times, 0.99) * 1e6:.0f} us"
        )
        big = bench_plan(members=100_000)
        store.publish(big)
        text = store.connection.command("GET", "bench:plan", deadline=10, limits=store.plan_limits)
        size = len(text) if isinstance(text, bytes) else 0
        transfers, reads = [], []
        for _ in range(opts.plan_reads):
            started = time.perf_counter()
            store.connection.command("GET", "bench:plan", deadline=10, limits=store.plan_limits)
            transfers.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.read()
            reads.append(time.perf_counter() - started)
        transfer = statistics.median(transfers)
        say(
            f"  plan of 100,000 members ({size / 1e6:.1f} MB): GET {transfer * 1e3:.0f} ms "
            f"({size / transfer / 1e6:.0f} MB/s), read and parsed "
            f"{statistics.median(reads) * 1e3:.0f} ms (median of {opts.plan_reads})"
        )
        os.kill(redis.pid, signal.SIGSTOP)
        try:
            started = time.perf_counter()
            failure = _failure(store.stamp)
            first = time.perf_counter() - started
            started = time.perf_counter()
            again = [_failure(store.stamp) for _ in range(1000)]
            backing_off = (time.perf_counter() - started) / len(again)
        finally:
            os.kill(redis.pid, signal.SIGCONT)
        say(
            f"  Redis stopped (SIGSTOP): a stamp read failed after {first * 1e3:.0f} ms "
            f"({failure}); while backing off each call fails in {backing_off * 1e6:.1f} us"
        )
    finally:
        store.close()


def _failure(call: Callable[[], object]) -> str:
    try:
        call()
    except RedisError as exc:
        return type(exc).__name__
    return "no failure"


# -- 2. DNS latency while Redis misbehaves --------------------------------------------------------


def dnsperf_latencies(port: int, datafile: Path, seconds: float) -> tuple[list[float], int]:
    """Every response's latency (inf for a lost query) and the queries sent."""
    command = ["dnsperf", "-s", "127.0.0.1", "-p", str(port), "-d", str(datafile)]
    command += ["-l", f"{seconds:g}", "-c", "4", "-t", "2", "-Q", str(FIXED_QPS), "-v"]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 30, check=False
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise RuntimeError(f"dnsperf exited with {result.returncode}:\n{output[-2000:]}")
    latencies: list[float] = []
    for line in output.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0] != ">":
            continue
        if fields[1] == "T":
            latencies.append(math.inf)
        elif fields[1] != "I":
            latencies.append(float(fields[-1]))
    sent = re.search(r"Queries sent:\s*(\d+)", output)
    return latencies, int(sent.group(1)) if sent else 0


def measure_dns(port: int, proxy: Proxy, opts: Options, workdir: Path) -> dict[str, list[float]]:
    datafile = workdir / "queries"
    datafile.write_text("".join(f"{name} A\n" for name in [POOL, POOL.upper()] * 50))
    latencies: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_index in range(opts.rounds):
        for mode in MODES:
            proxy.mode = mode
            found, sent = dnsperf_latencies(port, datafile, opts.seconds)
            latencies[mode] += found
            lost = sum(1 for value in found if math.isinf(value))
            say(
                f"  round {round_index + 1}: Redis {mode:<8} {sent:>6} queries, "
                f"p99 {percentile(found, 0.99) * 1e3:.3f} ms, {lost} lost"
            )
        proxy.mode = "healthy"
    return latencies


# -- the run --------------------------------------------------------------------------------------


def say(text: str) -> None:
    print(text, flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_options(argv)
    for tool in ("redis-server", "pdns_server", "dnsperf"):
        if shutil.which(tool) is None and not os.access(f"/usr/sbin/{tool}", os.X_OK):
            say(
                f"{tool} not found: "
                "apt-get install redis-server pdns-server pdns-backend-pipe dnsperf"
            )
            return 1
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="dnslb-bench-redis-"))
    started_in = Path.cwd()
    os.chdir(workdir)  # see bench/pipe_backend.py: keep bench/ off the coprocesses' sys.path
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
    load_before = os.getloadavg()[0]
    say(f"dnslb Redis plan store benchmark: python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    redis, redis_port = start_redis(workdir)
    proxy: Proxy | None = None
    pdns: PdnsServer | None = None
    try:
        say("1. the RESP client against redis-server")
        measure_client(redis, redis_port, opts)

        say(f"2. DNS at {FIXED_QPS} QPS, the pipe backend reading the plan through a proxy")
        proxy = Proxy(redis_port)
        store = RedisPlanStore(RedisAddress(port=redis_port, key="bench:dns"))
        store.publish(bench_plan())
        store.close()
        url = f"redis://127.0.0.1:{proxy.port}/0?key=bench:dns"
        pdns = PdnsServer(PdnsSettings(plan=url, port=free_port()), workdir / "pdns")
        pdns.start(probe_name=ZONE)
        latencies = measure_dns(pdns.settings.port, proxy, opts, workdir)
        log = pdns.log_tail(10_000)
    finally:
        if pdns is not None:
            pdns.stop()
        if proxy is not None:
            proxy.close()
        stop_group(redis)

    say("")
    say(f"{'Redis':<10}{'responses':>10}{'lost':>7}{'p50 ms':>9}{'p99 ms':>9}")
    healthy = percentile(latencies["healthy"], 0.99)
    for mode in MODES:
        found = latencies[mode]
        lost = sum(1 for value in found if math.isinf(value))
        say(
            f"{mode:<10}{len(found):>10}{lost:>7}{percentile(found, 0.50) * 1e3:>9.3f}"
            f"{percentile(found, 0.99) * 1e3:>9.3f}"
        )
    worst = max(percentile(latencies[mode], 0.99) for mode in MODES[1:])
    verdict = "met" if worst <= 1.5 * healthy else "MISSED"
    say(
        f"p99 with Redis silent or trickling vs healthy: {worst * 1e3:.3f} ms vs "
        f"{healthy * 1e3:.3f} ms (goal: within 1.5x: {verdict})"
    )
    say(f"pipe backend log lines saying the plan store is unreachable: {log.count('unreachable')}")
    say(f"load average: {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
