"""Simulator benchmark: how long the full paper replay and the 1,000-server run take.

Run: ``.venv/bin/python bench/simulator.py`` (``--quick`` skips the big run).

1. **Paper replay**: every case of the paper's tables 1-4 (``dnslb sim --suite paper``, no
   plots), on all CPUs as the command does. Goal: < 60 s.
2. **Scale**: ``sim/scenarios/big.yaml``, 1,000 servers and 100,000 users for 300 simulated
   seconds, in one process. Goal: < 3 minutes.

Both run the product's own manager and pipe backend (:mod:`sim.product`): a tick of the manager
at 1,000 servers, its plan checked, published and compiled, is part of the figure.

Nothing is asserted: the script prints figures (wall seconds, simulated requests, microseconds
per request).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# Run as a script, this directory comes first on the path, and its pipe_backend.py (a benchmark)
# would hide the pipe_backend package the simulator runs.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

from sim.engine import simulate
from sim.runner import SUITES, run_files
from sim.scenario import SCENARIO_DIR, load_scenarios


def paper_replay() -> None:
    files = [load_scenarios(SCENARIO_DIR / name) for name in SUITES["paper"]]
    jobs = os.cpu_count() or 1
    started = time.perf_counter()
    report = run_files(files, seed=None, repeat=1, out=None, jobs=jobs, plots=False)
    elapsed = time.perf_counter() - started
    rows = [row for _, table_rows in report for row in table_rows]
    requests = sum(row.requests for row in rows)
    verdict = "met" if elapsed < 60 else "MISSED"
    print(
        f"paper replay: {len(rows)} cases ({requests:,} requests) in {elapsed:.1f} s "
        f"on {jobs} processes; goal < 60 s: {verdict}"
    )


def big_run() -> None:
    scenario = load_scenarios(SCENARIO_DIR / "big.yaml").scenarios[0]
    started = time.perf_counter()
    result = simulate(scenario)
    elapsed = time.perf_counter() - started
    print(
        f"scale: {scenario.servers.initial:,} servers, {scenario.load.peak(scenario.duration):,} "
        f"users, {scenario.duration:g} s simulated: {elapsed:.1f} s wall in one process, "
        f"{result.requests:,} requests ({elapsed / max(1, result.requests) * 1e6:.1f} us each), "
        f"busiest/mean {result.busiest_over_mean:.2f}, mean response {result.mean_response:.3f} s; "
        f"goal < 180 s: {'met' if elapsed < 180 else 'MISSED'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the paper replay only")
    args = parser.parse_args()
    paper_replay()
    if not args.quick:
        big_run()


if __name__ == "__main__":
    main()
