"""The lab's experiment cases in the simulator, with overrides: what a change would do on the lab.

``dnslb calibrate --sim-only`` runs the cases of ``dnslb experiments`` as the lab has them. This
runs them with any of the scenario's parts changed, one line of figures a variant (the mean
over the seeds, and the lowest and highest run's mean response)::

    .venv/bin/python -m bench.lab_variants t1-a t3-c
    .venv/bin/python -m bench.lab_variants --held 110 --servers 4 --seeds 3 \\
        't1-a {"resolvers": {"count": 12}}' 't3-c {"resolvers": {"count": 12}}' \\
        't3-c {"resolvers": {"count": 12}, "policy": {"ttl_min": 60}}'

A variant is a case's key, then optionally a JSON object whose keys are parts of the simulator's
scenario (``policy``: the pool's DNS policy; ``dns``, ``resolvers``, ``servers``, ``scaling``,
``clients``: those sections), each an object of the settings to change (docs/simulation.md).
``--held N`` holds N users from start to end instead of the step load (``--peak N``: the step
load up to N users instead of 160), and ``--servers N`` fixes the pool at N servers. Nothing
is asserted: it prints figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.calibrate import scenario_for
from lab.experiments import HEADLINE, ExperimentPlan, experiment_lab, select_cases
from sim.engine import Simulation
from sim.scenario import Scenario

SECTIONS = ("dns", "resolvers", "servers", "scaling", "clients")


def variant_scenario(scenario: Scenario, changes: dict[str, Any]) -> Scenario:
    """``scenario`` with ``changes`` (see the module docstring); unknown parts raise
    ``ValueError``, unknown settings ``TypeError`` (from ``dataclasses.replace``)."""
    unknown = set(changes) - {"policy", *SECTIONS}
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}: policy, {', '.join(SECTIONS)}")
    if "policy" in changes:
        policy = dataclasses.replace(scenario.dns.policy, **changes["policy"])
        scenario = dataclasses.replace(
            scenario, dns=dataclasses.replace(scenario.dns, policy=policy)
        )
    for section in SECTIONS:
        if section in changes:
            part = dataclasses.replace(getattr(scenario, section), **changes[section])
            scenario = dataclasses.replace(scenario, **{section: part})
    return scenario


def plan_for(
    held: int | None, servers: int | None, duration: float, peak: int = 160
) -> ExperimentPlan:
    """The full preset's plan (runs of ``duration`` seconds, the step load up to ``peak``
    users), held and fixed as asked."""
    lab = experiment_lab()
    if servers is not None:
        scaling = dataclasses.replace(lab.scaling, min_servers=servers, max_servers=servers)
        lab = dataclasses.replace(lab, scaling=scaling)
    return ExperimentPlan(
        out=Path("."),
        lab=lab,
        case_duration=duration,
        peak_users=held if held is not None else peak,
        constant_load=held is not None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", default=list(HEADLINE), help="KEY [JSON]")
    parser.add_argument("--seeds", type=int, default=5, help="runs of each, seeds 1 to N (5)")
    parser.add_argument("--held", type=int, help="users held from start to end")
    parser.add_argument("--servers", type=int, help="a fixed pool of this many servers")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds a run (300)")
    parser.add_argument("--peak", type=int, default=160, help="the step load's peak users (160)")
    args = parser.parse_args(argv)
    plan = plan_for(args.held, args.servers, args.duration, args.peak)
    cases = {case.key: case for case in select_cases()}
    for text in args.variants:
        key, _, body = text.strip().partition(" ")
        if key not in cases:
            parser.error(f"unknown case {key!r}: one of {', '.join(sorted(cases))}")
        changes = json.loads(body) if body.strip() else {}
        scenario = variant_scenario(scenario_for(plan, cases[key]), changes)
        runs = [Simulation(scenario, seed).run() for seed in range(1, args.seeds + 1)]
        responses = [run.mean_response for run in runs]

        def mean(name: str) -> float:
            return statistics.fmean(getattr(run, name) for run in runs)  # noqa: B023 (used here)

        print(
            f"{text:60.60} mean resp {mean('mean_response'):.3f} s "
            f"({min(responses):.3f}-{max(responses):.3f})  3-9 s {100 * mean('from_3_to_9'):.2f} %"
            f"  busiest/mean {mean('busiest_over_mean'):.2f}  TTL {mean('mean_ttl'):.1f} s"
            f"  cost {mean('cost'):.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
