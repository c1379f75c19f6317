"""``dnslb calibrate``: the simulator's scenario is the lab's experiment, field by field, and the
comparison flags the judged columns that are more than 15 % apart."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cli.calibrate import GOAL, comparison, scenario_for, simulate, verdict
from cli.main import main
from evaluation.columns import CaseResult
from lab.experiments import CASES, ExperimentPlan, experiment_lab

PRODUCT = next(case for case in CASES if case.key == "t3-c")
PLAIN = next(case for case in CASES if case.key == "t1-a")


def test_the_scenario_is_the_labs_experiment(tmp_path: Path) -> None:
    lab = dataclasses.replace(experiment_lab(), resolvers=6, rrset_roundrobin=True, boot_delay=7)
    plan = ExperimentPlan(out=tmp_path, lab=lab, case_duration=160, peak_users=50)
    scenario = scenario_for(plan, PRODUCT)
    load = plan.load
    assert scenario.duration == load.duration == 160
    stairs = scenario.load.staircase
    assert stairs is not None
    assert (stairs.start, stairs.step, stairs.every, stairs.count) == (
        load.start,
        load.step,
        load.every,
        load.count,
    )
    assert scenario.load.peak(scenario.duration) == load.peak == 50
    assert (scenario.resolvers.count, scenario.resolvers.order) == (6, "cyclic")
    assert scenario.resolvers.staggered  # the lab warms its resolvers out of phase
    together = scenario_for(dataclasses.replace(plan, staggered=False), PRODUCT)
    assert not together.resolvers.staggered  # --together: every resolver starts empty
    assert scenario.servers.max_concurrency == lab.max_concurrency
    assert scenario.servers.boot_delay == 7
    assert scenario.servers.initial == lab.scaling.min_servers
    # 10,240-byte objects sent at 16,384 B/s in 2,048-byte chunks, the first at once
    assert scenario.servers.service.mean == pytest.approx(0.5625)
    assert scenario.scaling == lab.scaling
    assert scenario.dns.policy.k == 4
    plain = scenario_for(plan, PLAIN)
    assert plain.dns.policy.ttl_min == plain.dns.policy.ttl_max == 60
    assert plain.dns.policy.weight_function == "equal"
    kept = scenario_for(
        dataclasses.replace(plan, lab=dataclasses.replace(lab, rrset_roundrobin=False)), PLAIN
    )
    assert kept.resolvers.order == "fixed"
    no_resolvers = dataclasses.replace(plan, lab=dataclasses.replace(lab, resolvers=0))
    own = scenario_for(no_resolvers, PLAIN).resolvers
    assert own.count == 50  # each user its own cache, empty at the start as in the lab
    assert not own.staggered
    # A case's autoscaling, as its lab run has it (Case.settings): the pool sized for a wait.
    target = next(case for case in CASES if case.key == "t4-target")
    sized = scenario_for(plan, target)
    assert sized.scaling is not None
    assert sized.scaling == target.settings(lab).scaling != lab.scaling
    assert sized.scaling.target_wait == 2.0
    # A constant load on a fixed pool (how pausing behaves at a load held): both sides alike.
    fixed = dataclasses.replace(
        lab, scaling=dataclasses.replace(lab.scaling, min_servers=4, max_servers=4)
    )
    held = scenario_for(
        dataclasses.replace(plan, lab=fixed, constant_load=True, case_duration=600), PRODUCT
    )
    assert held.duration == 600 and held.servers.initial == 4
    assert [held.load.clients_at(t) for t in (0.0, 300.0, 599.0)] == [50, 50, 50]


def _row(mean_response: float, cost: float) -> CaseResult:
    return CaseResult(
        name="x",
        cost=cost,
        total_response=mean_response * 1000,
        requests=1000,
        mean_response=mean_response,
        requests_per_cost=1000 / cost,
        under_3=0.99,
        from_3_to_9=0.01,
        from_9_to_60=0.0,
        mean_ttl=30.0,
        busiest_over_mean=1.3,
        saturated_seconds=5.0,
        failed=0,
        p50=0.5,
        p99=2.5,
        dns_queries=200,
        peak_servers=4,
    )


def test_the_comparison_flags_what_is_more_than_15_percent_apart() -> None:
    lab = [_row(1.00, 800), _row(1.10, 820)]
    close = [_row(1.05, 830), _row(1.12, 790)]
    assert verdict(lab, close) == []
    far = [_row(0.70, 810), _row(0.75, 800)]  # mean response 30 % below the lab's
    assert verdict(lab, far) == ["mean_response"]
    text = comparison("t3-c", lab, far)
    line = next(line for line in text.splitlines() if line.startswith("mean response"))
    assert "1.050 ±0.635" in line  # the lab's mean and 95 % half-width (t = 12.706, n = 2)
    assert line.endswith("-31.0 % !")  # (0.725 - 1.050) / 1.050
    assert GOAL == 0.15


def test_the_simulator_side_runs_the_scenario_per_seed(tmp_path: Path) -> None:
    plan = ExperimentPlan(out=tmp_path, case_duration=40, peak_users=10, repeats=2)
    runs = simulate(plan, [PRODUCT])
    assert [run.name for run in runs["t3-c"]] == ["t3-c", "t3-c"]
    assert all(run.requests > 0 for run in runs["t3-c"])
    assert runs["t3-c"][0] != runs["t3-c"][1]  # seeds 1 and 2
    again = simulate(plan, [PRODUCT])
    assert again == runs  # same seeds, same figures


def test_the_command_compares_with_an_earlier_lab_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The lab's side from an earlier `dnslb experiments` run: its results.json, as that
    # command writes it (here the simulator's own figures, so every column agrees).
    plan = ExperimentPlan(out=tmp_path, case_duration=40, peak_users=10, repeats=2)
    runs = simulate(plan, [PRODUCT])
    results = {"cases": {"t3-c": [run.as_dict() for run in runs["t3-c"]]}}
    (tmp_path / "results.json").write_text(json.dumps(results))

    def calibrate(cases: str) -> int:
        return main(
            [
                "calibrate",
                "--cases",
                cases,
                "--repeats",
                "2",
                "--case-duration",
                "40",
                "--peak-users",
                "10",
                "--lab-results",
                str(tmp_path),
            ]
        )

    status = calibrate("t3-c")
    out = capsys.readouterr().out
    assert status == 0
    assert "all judged columns within 15 %" in out
    assert "+0.0 %" in out
    # A case the lab did not run is not called within 15 %.
    missing = calibrate("t3-c|t1-a")
    out = capsys.readouterr().out
    assert missing == 1
    assert "not compared (no lab run): t1-a" in out
    assert "all judged columns within 15 %" not in out
