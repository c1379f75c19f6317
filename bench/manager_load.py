"""Manager benchmark: tick CPU by fleet size, and report ingest rate over HTTP on one core.

Run: ``.venv/bin/python bench/manager_load.py`` (``--quick`` for a shorter run;
``--state postgres`` keeps the state in a throwaway PostgreSQL cluster, started with ``initdb``
and reached over a unix socket, instead of SQLite: tick and start-up only, with the leadership
lease and every write fenced as with two managers).

1. **Tick CPU** at 100 / 1,000 / 10,000 servers (pools of 100): every server gets a fresh report
   with a different utilization before each tick, so every tick folds a new sample per server,
   rebuilds the whole plan and publishes it. The load drifts as real load does (few servers
   pause or resume per tick); a "steady" load that wavers by one request in progress (weights
   move a little, answers do not, so no pool is published again) and a harsh "churning" load
   where a fifth of the servers flip each tick (each flip an event in the database) are
   measured at 10,000 too. CPU time of the tick
   (``time.process_time``), min and median over several ticks. Goal: <= 100 ms at 10,000.
2. **Report ingest** over real HTTP: ``dnslb manager`` pinned to one core (``taskset``), ``wrk``
   on the other posting valid reports (increasing seq per server) over keep-alive connections.
   Goal: >= 5,000 reports/s. The in-process rate (no HTTP) is printed beside it.

Nothing is asserted: the script prints figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from daemons.process import http_answers, spawn
from dnslb.clock import FakeClock
from manager.command import tune_collector
from manager.config import load_manager_config
from manager.service import Manager

TOKEN = "bench-agent-token"
TUNE_COLLECTOR = True  # --default-collector: the interpreter's settings, for comparison
PER_POOL = 100


def write_config(
    directory: Path,
    servers: int,
    port: int = 8799,
    state_url: str | None = None,
    hold_within: float = 0.0,
) -> Path:
    pools = []
    policy = f"    policy: {{hold_within: {hold_within}}}\n" if hold_within else ""
    for p in range(max(1, servers // PER_POOL)):
        members = "\n".join(
            f"      - {{id: s{p}-{i}, address: 10.{p // 250}.{p % 250}.{i + 1}}}"
            for i in range(min(PER_POOL, servers))
        )
        pools.append(f"  - name: p{p}\n    zone: example.test\n{policy}    members:\n{members}")
    path = directory / "manager.yaml"
    path.write_text(
        "zones: [{name: example.test, ns: [ns1.example.test]}]\n"
        "auth: {agent_token: env:DNSLB_BENCH_TOKEN}\n"
        f"http: {{port: {port}}}\n"
        "down_after: 3600\n"
        + (f"state: {{url: '{state_url}'}}\n" if state_url else "")
        + "pools:\n"
        + "\n".join(pools)
        + "\n"
    )
    return path


def drift(index: int, round_: int) -> int:
    """Load that moves a little every second, as real load does: few pauses flip per tick."""
    return int(40 + 30 * math.sin(index + round_ / 10))


def steady(index: int, round_: int) -> int:
    """Load that only wavers, by one request in progress either way: every utilization and
    weight still moves a little at every tick, while the answers do not (the manager then
    publishes no pool again)."""
    return 40 + (index * 7 + round_) % 3


def churn(index: int, round_: int) -> int:
    """Load that jumps every second: about a fifth of the servers pause or resume each tick,
    each an event written to the database. A harsh worst case."""
    return (index * 7 + round_ * 13) % 95


def tick_cpu(
    servers: int,
    ticks: int,
    load: Callable[[int, int], int],
    state_url: str | None = None,
    hold_within: float = 0.0,
) -> tuple[float, float, float, float]:
    """(min ms, median ms, in-process ingest reports/s, pools published per tick) for one
    fleet size."""
    with tempfile.TemporaryDirectory() as tmp:
        clock = FakeClock()
        if state_url is not None:
            reset_database(state_url)
        path = write_config(Path(tmp), servers, state_url=state_url, hold_within=hold_within)
        config = load_manager_config(path)
        started = time.perf_counter()
        manager = Manager(config, clock=clock)
        print(f"  ({servers} servers: start-up {time.perf_counter() - started:.2f} s)")
        threshold = gc.get_threshold()
        if TUNE_COLLECTOR:
            tune_collector()  # as `dnslb manager` does once its state is loaded
        if manager.leadership is not None:
            manager.leadership.step()  # its renewal loop runs from here on
        ids = list(manager.fleet.servers)
        seq = 0

        def report_all(round_: int) -> float:
            nonlocal seq
            seq += 1
            started = time.perf_counter()
            for index, server in enumerate(ids):
                body = {
                    "server_id": server,
                    "seq": seq,
                    "time": clock.time(),
                    "in_progress": load(index, round_),
                    "max_concurrency": 100,
                }
                manager.ingest.accept(TOKEN, json.dumps(body).encode())
            return len(ids) / (time.perf_counter() - started)

        rate = report_all(0)
        clock.advance(1)
        manager.tick()
        samples = []
        published = 0
        pools = manager.plan.pools if manager.plan is not None else ()
        for round_ in range(1, ticks + 1):
            report_all(round_)
            clock.advance(1)
            # wall time with PostgreSQL: the database's share is another process's CPU
            started = time.perf_counter() if state_url else time.process_time()
            plan = manager.tick()
            ended = time.perf_counter() if state_url else time.process_time()
            samples.append((ended - started) * 1000)
            # a steady load changes no answer: the manager publishes nothing new then
            assert plan is not None or load is steady or hold_within, "no plan published"
            if manager.plan is not None:
                published += sum(
                    new is not old for new, old in zip(manager.plan.pools, pools, strict=False)
                )
                pools = manager.plan.pools
            if manager.leadership is not None:
                manager.leadership.step()  # as its renewal loop would, between ticks
        if manager.leadership is not None:
            manager.leadership.close()
        manager.store.close()
        gc.unfreeze()  # the next fleet size starts as this one did
        gc.set_threshold(*threshold)
        return min(samples), statistics.median(samples), rate, published / ticks


def reset_database(url: str) -> None:
    from manager.postgres import drop_tables  # noqa: PLC0415 (the postgres extra: only here)

    drop_tables(url)


WRK_SCRIPT = """
local servers = {servers}
local counter = 0
local thread_id = 0
local threads = {{}}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
function init(args)
  seq = math.floor(os.time() * 1000)
end
request = function()
  counter = counter + 1
  seq = seq + 1
  local server = "s" .. (tid % 100) .. "-" .. (counter % {per_pool})
  local body = string.format(
    '{{"server_id":"%s","seq":%d,"time":%d,"in_progress":%d,"max_concurrency":100}}',
    server, seq, os.time(), counter % 90)
  return wrk.format("POST", "/v1/reports", {{
    ["Authorization"] = "Bearer {token}",
    ["Content-Type"] = "application/json"}}, body)
end
"""


def ingest_http(seconds: int, connections: int) -> tuple[float, str]:
    """Reports/s accepted by a real manager on one core, and wrk's summary of errors."""
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        return 0.0, "wrk or taskset missing (apt-get install wrk util-linux)"
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        port = 8799
        config = write_config(directory, 1000, port)
        env = {**os.environ, "DNSLB_BENCH_TOKEN": TOKEN}
        manager = spawn(
            [
                "taskset",
                "-c",
                "0",
                sys.executable,
                "-m",
                "cli",
                "manager",
                "--config",
                str(config),
                "--log-level",
                "warning",
            ],
            name="manager",
            ready=lambda _: http_answers(f"http://127.0.0.1:{port}/healthz"),
            log=directory / "manager.log",
            timeout=20,
            env=env,
        )
        try:
            script = directory / "report.lua"
            # One wrk thread: each thread's seq is its own, and a server must only ever see
            # increasing seq; servers are spread over the thread's requests.
            script.write_text(WRK_SCRIPT.format(servers=1000, per_pool=PER_POOL, token=TOKEN))
            result = subprocess.run(
                [
                    "taskset",
                    "-c",
                    "1",
                    "wrk",
                    "-t1",
                    f"-c{connections}",
                    f"-d{seconds}s",
                    "-s",
                    str(script),
                    f"http://127.0.0.1:{port}/v1/reports",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        finally:
            os.killpg(manager.pid, signal.SIGTERM)
            manager.wait(10)
        rate = 0.0
        errors = "no non-2xx responses"
        for line in result.stdout.splitlines():
            if line.startswith("Requests/sec:"):
                rate = float(line.split()[1])
            if "Non-2xx" in line:
                errors = line.strip()
        return rate, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer ticks, shorter load")
    parser.add_argument(
        "--state",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="where the state is kept (postgres: a throwaway cluster; ticks only, no HTTP)",
    )
    parser.add_argument(
        "--default-collector",
        action="store_true",
        help="leave the garbage collector as the interpreter sets it (dnslb manager tunes it)",
    )
    args = parser.parse_args()
    global TUNE_COLLECTOR  # noqa: PLW0603 (a switch for the whole run)
    TUNE_COLLECTOR = not args.default_collector
    ticks = 3 if args.quick else 7
    os.environ["DNSLB_BENCH_TOKEN"] = TOKEN
    if args.state == "postgres":
        from daemons.postgres import throwaway_cluster, unavailable_reason  # noqa: PLC0415

        reason = unavailable_reason()
        if reason is not None:
            sys.exit(f"--state postgres: {reason}")
        with throwaway_cluster() as cluster:
            print("PostgreSQL state (wall time per tick, the database's work included):")
            for servers in (100, 1_000, 10_000):
                low, median, rate, _ = tick_cpu(servers, ticks, drift, cluster.url)
                print(
                    f"  {servers:>6} servers, drifting load: min {low:7.1f} ms  "
                    f"median {median:7.1f} ms  (ingest in process {rate:,.0f} reports/s)"
                )
            for hold in (0.05, 0.1):
                low, median, _, published = tick_cpu(
                    10_000, ticks, drift, cluster.url, hold_within=hold
                )
                print(
                    f"   10000 servers, drifting load, hold_within {hold}: min {low:7.1f} ms  "
                    f"median {median:7.1f} ms  ({published:.0f} pools published per tick)"
                )
            low, median, _, _ = tick_cpu(10_000, ticks, steady, cluster.url)
            print(f"   10000 servers, steady load: min {low:7.1f} ms  median {median:7.1f} ms")
            low, median, _, _ = tick_cpu(10_000, ticks, churn, cluster.url)
            print(f"   10000 servers, churning load: min {low:7.1f} ms  median {median:7.1f} ms")
        return
    print("tick CPU (process time per tick, every server with a fresh report):")
    rows = []
    for servers in (100, 1_000, 10_000):
        low, median, rate, published = tick_cpu(servers, ticks, drift)
        rows.append((servers, low, median, rate))
        print(
            f"  {servers:>6} servers, drifting load: min {low:7.1f} ms  median {median:7.1f} ms"
            f"  ({published:.0f} pools published per tick)"
        )
    for hold in (0.05, 0.1):
        low, median, _, published = tick_cpu(10_000, ticks, drift, hold_within=hold)
        print(
            f"   10000 servers, drifting load, hold_within {hold}: min {low:7.1f} ms  "
            f"median {median:7.1f} ms  ({published:.0f} pools published per tick)"
        )
    steady_low, steady_median, _, _ = tick_cpu(10_000, ticks, steady)
    print(
        f"   10000 servers, steady load: min {steady_low:7.1f} ms  median {steady_median:7.1f} ms"
    )
    churn_low, churn_median, _, _ = tick_cpu(10_000, ticks, churn)
    print(
        f"   10000 servers, churning load: min {churn_low:7.1f} ms  median {churn_median:7.1f} ms"
    )
    seconds = 5 if args.quick else 15
    http_rate, errors = ingest_http(seconds, connections=32)
    in_process = max(rate for *_, rate in rows)
    print("\nreport ingest:")
    print(f"  in process (parse + validate + record): {in_process:,.0f} reports/s")
    print(f"  over HTTP, manager on one core:         {http_rate:,.0f} reports/s ({errors})")
    at_10k = rows[-1][2]
    print("\nsummary (goal, measured, met):")
    tick_met = "yes" if at_10k <= 100 else "no"
    ingest_met = "yes" if http_rate >= 5000 else "no"
    print(f"  tick at 10,000 servers   <= 100 ms     {at_10k:8.1f} ms   {tick_met}")
    print(f"  ingest over HTTP         >= 5,000/s    {http_rate:8,.0f}/s   {ingest_met}")


if __name__ == "__main__":
    main()
