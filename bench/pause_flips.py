"""Pause flips per server-hour on a fixed pool at a steady load (issue 17: pausing that never
flaps).

Run: ``.venv/bin/python bench/pause_flips.py`` (``--users 60 80 100``, ``--seeds 3``,
``--rotate`` for resolvers that rotate the answer's order, ``--policy '{"pause_dwell": 0}'`` to
try a policy against the product's default, ``--spread 0.6`` for servers of unequal speed).

The scenario is the lab's, as ``dnslb calibrate`` builds it (its measured service times, 12
worker slots per server, 12 resolvers, users thinking 1 s), on a fixed pool of 4 servers with a
constant number of users; the simulator runs the product's own manager. A flip is a ``paused``
or ``resumed`` event of the manager (``RunResult.pause_flips``). Printed per load, for the
default policy, the paper's rule (``pause_relative: 0``, ``pause_dwell: 0``) and no pausing:
flips per server-hour (of the run's cost: the fixed pool's) and after a warm-up of 120 s (the
users all arrive at once on an idle pool: most flips of a held load are in its first minute),
the pool's mean utilization after the warm-up; the server-seconds spent above utilization 1.5
beyond the first 10 s of each spell there (``overloaded_seconds``, as ``dnslb calibrate`` shows
it for the lab too), the mean response and busiest/mean of the whole run.

Nothing is asserted: the script prints figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

# Run as a script, this directory comes first on the path, and its pipe_backend.py (a benchmark)
# would hide the pipe_backend package the simulator runs.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

from cli.calibrate import scenario_for
from lab.experiments import Case, ExperimentPlan, experiment_lab
from sim.engine import Simulation
from sim.scenario import LoadConfig, Scenario, Staircase

SERVERS = 4
WARM_UP = 120.0
PAPER = {"pause_relative": 0.0, "pause_dwell": 0.0}


def scenario(users: int, policy: dict[str, Any], args: argparse.Namespace) -> Scenario:
    lab = experiment_lab()
    lab = dataclasses.replace(
        lab,
        resolvers=12,
        rrset_roundrobin=args.rotate,
        scaling=dataclasses.replace(lab.scaling, min_servers=SERVERS, max_servers=SERVERS),
    )
    plan = ExperimentPlan(
        out=Path("unused"), lab=lab, case_duration=args.duration, peak_users=users, repeats=1
    )
    built = scenario_for(plan, Case("flips", "flips", (), policy))
    return dataclasses.replace(
        built,
        load=LoadConfig(staircase=Staircase(start=users, step=0, every=1.0, count=0)),
        servers=dataclasses.replace(built.servers, speed_spread=args.spread),
    )


def measure(built: Scenario, seed: int) -> dict[str, float]:
    simulation = Simulation(built, seed)
    result = simulation.run()
    utilizations = [
        value
        for samples in simulation.series().utilization.values()
        for time, value in samples
        if time >= WARM_UP
    ]
    late = sum(1 for time in simulation.pause_flip_times if time >= WARM_UP)
    return {
        "flips": result.pause_flips_per_hour,
        "settled": late * 3600 / (SERVERS * (built.duration - WARM_UP)),
        "utilization": statistics.fmean(utilizations) if utilizations else 0.0,
        "response": result.mean_response,
        "balance": result.busiest_over_mean,
        "hot": result.overloaded_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, nargs="+", default=[60, 80, 90, 100])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--rotate", action="store_true", help="resolvers rotate the order")
    parser.add_argument("--spread", type=float, default=0.0, help="servers' speed spread")
    parser.add_argument("--policy", type=json.loads, default=None, help="another policy (JSON)")
    args = parser.parse_args()
    policies: dict[str, dict[str, Any]] = {
        "default": {},
        "paper": PAPER,
        "no pausing": {"pause": False},
    }
    if args.policy is not None:
        policies["--policy"] = args.policy
    order = "rotate" if args.rotate else "keep order"
    print(
        f"{SERVERS} servers, 12 resolvers ({order}), speed spread {args.spread:g}, "
        f"{args.duration:g} s, {args.seeds} seeds"
    )
    print(
        f"{'users':>5}  {'policy':<12} {'flips/server-h':>14} {'after 120 s':>13} {'mean u':>7} "
        f"{'response s':>10} "
        f"{'busiest/mean':>12} {'s >10 s above 1.5':>17}"
    )
    for users in args.users:
        for name, policy in policies.items():
            built = scenario(users, policy, args)
            runs = [measure(built, seed) for seed in range(1, args.seeds + 1)]

            def mean(key: str, runs: list[dict[str, float]] = runs) -> float:
                return statistics.fmean(run[key] for run in runs)

            print(
                f"{users:>5}  {name:<12} {mean('flips'):>14.1f} {mean('settled'):>13.1f} "
                f"{mean('utilization'):>7.2f} "
                f"{mean('response'):>10.3f} {mean('balance'):>12.2f} {mean('hot'):>17.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
