"""The manager's tick, this tree against another revision, tick by tick.

Run: ``.venv/bin/python -m bench.tick_ab --baseline REV`` (``--servers``, ``--ticks``,
``--load steady|drift``, ``--cpu``).

On this VM the speed of a CPU wanders by up to 2 x within minutes, so two benchmark runs one
after the other cannot settle a difference of 10 %. Here one worker process per tree (this one
and a ``git worktree`` of ``REV``) holds a manager of ``--servers`` servers in pools of 100, on
a fake clock and in-process reports, as ``bench/manager_load.py`` does; both are pinned to the
same CPU, and the parent sends both the same reports (``manager_load.py``'s loads and
configuration) and asks for one tick at a time, in turn (which goes first alternates each
round). Each pair of ticks ran within a second of each other: the median of the pairs'
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

from bench.manager_load import TOKEN, drift, steady, write_config
from bench.redis_outage import worktree

LOADS = {"steady": steady, "drift": drift}

WORKER = r"""
import json, sys, time
from dnslb.clock import FakeClock
from manager.config import load_manager_config
from manager.service import Manager

config, token = sys.argv[1], sys.argv[2]
clock = FakeClock()
manager = Manager(load_manager_config(config), clock=clock)
try:
    from manager.command import tune_collector
    tune_collector()
except ImportError:
    pass
ids = list(manager.fleet.servers)
seq = 0
def report_all(loads):
    global seq
    seq += 1
    for server, in_progress in zip(ids, loads):
        body = {"server_id": server, "seq": seq, "time": clock.time(),
                "in_progress": in_progress, "max_concurrency": 100}
        manager.ingest.accept(token, json.dumps(body).encode())
report_all(json.loads(sys.stdin.readline()))
clock.advance(1)
manager.tick()
print("ready", flush=True)
for line in sys.stdin:
    report_all(json.loads(line))
    clock.advance(1)
    started = time.process_time()
    manager.tick()
    print((time.process_time() - started) * 1000, flush=True)
manager.store.close()
"""


def start(tree: Path, config: Path, cpu: int, loads: list[int]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "DNSLB_BENCH_TOKEN": TOKEN}
    worker = subprocess.Popen(
        ["taskset", "-c", str(cpu), sys.executable, "-c", WORKER, str(config), TOKEN],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdin is not None
    assert worker.stdout is not None
    worker.stdin.write(json.dumps(loads) + "\n")
    worker.stdin.flush()
    ready = worker.stdout.readline().strip()
    if ready != "ready":
        worker.kill()
        raise SystemExit(f"the worker for {tree} did not start (said {ready!r})")
    return worker


def tick(worker: subprocess.Popen[str], loads: list[int]) -> float:
    """One round's reports, then one tick; its process time in ms."""
    assert worker.stdin is not None
    assert worker.stdout is not None
    worker.stdin.write(json.dumps(loads) + "\n")
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
        load = LOADS[opts.load]

        def loads(round_: int) -> list[int]:
            return [load(index, round_) for index in range(opts.servers)]

        workers = {}
        for name, tree in (("this tree", here), (opts.baseline, there)):
            (temp / name).mkdir()
            config = write_config(temp / name, opts.servers)
            workers[name] = start(tree, config, opts.cpu, loads(0))
        for worker in workers.values():
            stack.callback(worker.kill)
        times: dict[str, list[float]] = {name: [] for name in workers}
        ratios = []
        names = list(workers)
        for round_ in range(opts.ticks):
            order = names if round_ % 2 == 0 else names[::-1]
            sent = loads(round_ + 1)
            for name in order:
                times[name].append(tick(workers[name], sent))
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
