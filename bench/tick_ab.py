"""The manager's tick, this tree against another revision, tick by tick.

Run: ``.venv/bin/python -m bench.tick_ab --baseline REV`` (``--servers``, ``--ticks``,
``--load steady|drift``, ``--cpu``).

On this VM the speed of a CPU wanders by up to 2 x within minutes, so two benchmark runs one
after the other cannot settle a difference of 10 %. Here one worker process per tree (this one
and a ``git worktree`` of ``REV``) holds a manager of ``--servers`` servers in pools of 100, on
a fake clock and in-process reports, as ``bench/manager_load.py`` does; both are pinned to the
same CPU, and the parent asks them for one tick at a time, in turn (which goes first alternates
each round). Each pair of ticks ran within a second of each other: the median of the pairs'
ratios is what to read, beside each tree's median and minimum. The workers use only the
manager's public API (``Manager``, ``load_manager_config``, ``FakeClock``), so any revision
since the tick's API settled can be compared.

Nothing is asserted: the script prints figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.redis_outage import worktree

WORKER = r"""
import json, math, os, sys, time
from pathlib import Path
from dnslb.clock import FakeClock
from manager.config import load_manager_config
from manager.service import Manager

servers, load_name, tmp = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
os.environ["DNSLB_TICK_AB_TOKEN"] = "tick-ab-agent-token"
if load_name == "steady":  # wavers by one request in progress: no answer moves
    load = lambda i, r: 40 + (i * 7 + r) % 3
else:  # drifts as real load does: every pool's answers move a little
    load = lambda i, r: int(40 + 30 * math.sin(i + r / 10))
pools = []
for p in range(max(1, servers // 100)):
    members = "\n".join(
        f"      - {{id: s{p}-{i}, address: 10.{p // 250}.{p % 250}.{i + 1}}}"
        for i in range(min(100, servers))
    )
    pools.append(f"  - name: p{p}\n    zone: example.test\n    members:\n{members}")
path = tmp / "manager.yaml"
path.write_text(
    "zones: [{name: example.test, ns: [ns1.example.test]}]\n"
    "auth: {agent_token: env:DNSLB_TICK_AB_TOKEN}\n"
    "down_after: 3600\n"
    f"state: {{path: {tmp / 'state.db'}}}\n"
    "pools:\n" + "\n".join(pools) + "\n"
)
clock = FakeClock()
manager = Manager(load_manager_config(path), clock=clock)
try:
    from manager.command import tune_collector
    tune_collector()
except ImportError:
    pass
ids = list(manager.fleet.servers)
seq = 0
def report_all(round_):
    global seq
    seq += 1
    for index, server in enumerate(ids):
        body = {"server_id": server, "seq": seq, "time": clock.time(),
                "in_progress": load(index, round_), "max_concurrency": 100}
        manager.ingest.accept("tick-ab-agent-token", json.dumps(body).encode())
report_all(0)
clock.advance(1)
manager.tick()
print("ready", flush=True)
round_ = 0
for line in sys.stdin:
    round_ += 1
    report_all(round_)
    clock.advance(1)
    started = time.process_time()
    manager.tick()
    print((time.process_time() - started) * 1000, flush=True)
manager.store.close()
"""


def start(tree: Path, servers: int, load: str, cpu: int, workdir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    workdir.mkdir()
    worker = subprocess.Popen(
        [
            *("taskset", "-c", str(cpu), sys.executable, "-c", WORKER),
            *(str(servers), load, str(workdir)),
        ],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    ready = worker.stdout.readline().strip()
    if ready != "ready":
        worker.kill()
        raise SystemExit(f"the worker for {tree} did not start (said {ready!r})")
    return worker


def tick(worker: subprocess.Popen[str]) -> float:
    assert worker.stdin is not None
    assert worker.stdout is not None
    worker.stdin.write("tick\n")
    worker.stdin.flush()
    return float(worker.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument("--servers", type=int, default=10_000, help="servers (10,000)")
    parser.add_argument("--ticks", type=int, default=20, help="ticks per tree (20)")
    parser.add_argument("--load", choices=("steady", "drift"), default="steady")
    parser.add_argument("--cpu", type=int, default=0, help="the CPU both workers run on (0)")
    opts = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    with contextlib.ExitStack() as stack:
        there = stack.enter_context(worktree(opts.baseline))
        temp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        workers = {
            "this tree": start(here, opts.servers, opts.load, opts.cpu, temp / "this"),
            opts.baseline: start(there, opts.servers, opts.load, opts.cpu, temp / "baseline"),
        }
        for worker in workers.values():
            stack.callback(worker.kill)
        times: dict[str, list[float]] = {name: [] for name in workers}
        ratios = []
        names = list(workers)
        for round_ in range(opts.ticks):
            order = names if round_ % 2 == 0 else names[::-1]
            for name in order:
                times[name].append(tick(workers[name]))
            ratios.append(times[names[0]][-1] / times[names[1]][-1])
        print(
            f"{opts.servers:,} servers, {opts.load} load, {opts.ticks} ticks each, "
            f"alternating, CPU {opts.cpu} (process time per tick):"
        )
        for name in names:
            series = times[name]
            print(
                f"  {name:>12}: median {statistics.median(series):7.1f} ms  "
                f"min {min(series):7.1f} ms   {json.dumps([round(t) for t in series])}"
            )
        print(
            f"  this tree / {opts.baseline}, tick by tick: median ratio "
            f"{statistics.median(ratios):.3f} (quartiles {statistics.quantiles(ratios, n=4)[0]:.3f}"
            f"-{statistics.quantiles(ratios, n=4)[2]:.3f})"
        )


if __name__ == "__main__":
    main()
