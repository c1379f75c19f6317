"""Repeated experiment runs: the 95 % interval arithmetic, the table and the orderings report on
fixed data, the planning of cases x repeats and its ETA, the resolvers' configuration."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from dnslb.config import problems_of
from evaluation.columns import CaseResult
from lab.experiments import (
    HEADLINE,
    PRESETS,
    RUN_OVERHEAD,
    ExperimentPlan,
    eta_text,
    ordering_lines,
    read_results,
    results_table,
    select_preset,
)
from lab.repeats import Interval, ci_table, interval, orderings, summarize, t975, verdict
from lab.resolvers import resolver_addresses, unbound_config
from lab.runner import LabInfo
from lab.settings import LabSettings


def result(mean: float, *, name: str = "x", slow: float = 0.0, requests: int = 1000) -> CaseResult:
    return CaseResult(
        name=name,
        cost=100.0,
        total_response=mean * requests,
        requests=requests,
        mean_response=mean,
        requests_per_cost=requests / 100.0,
        under_3=1.0 - slow,
        from_3_to_9=slow,
        from_9_to_60=0.0,
        mean_ttl=40.0,
        busiest_over_mean=1.5,
        saturated_seconds=10.0,
        failed=0,
        p50=0.5,
        p99=2.0,
        dns_queries=100,
        peak_servers=4,
    )


def test_t_quantiles_are_students() -> None:
    assert t975(1) == 12.706 and t975(4) == 2.776 and t975(30) == 2.042
    assert t975(60) == pytest.approx(2.000, abs=0.001)
    assert t975(120) == pytest.approx(1.980, abs=0.001)
    with pytest.raises(ValueError, match="at least 1"):
        t975(0)


def test_interval_of_fixed_data() -> None:
    # mean 3, sample sd sqrt(2.5), standard error sqrt(0.5), t(4) = 2.776
    got = interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert got.mean == 3.0 and got.n == 5
    assert got.half == pytest.approx(2.776 * math.sqrt(0.5))
    assert got.low == pytest.approx(3.0 - got.half)
    assert interval([2.0, 2.0, 2.0]).half == 0.0
    single = interval([7.0])
    assert single.mean == 7.0 and math.isnan(single.half)
    with pytest.raises(ValueError, match="no values"):
        interval([])


def test_summary_and_table_show_every_column_with_its_interval() -> None:
    runs = [result(0.5, slow=0.01), result(0.7, slow=0.03)]
    summary = summarize(runs)
    assert summary["mean_response"].mean == pytest.approx(0.6)
    assert summary["mean_response"].half == pytest.approx(12.706 * 0.1)
    assert summary["from_3_to_9"].mean == pytest.approx(2.0)  # a percentage
    text = ci_table({"T1 A": runs, "one run": [result(0.4)]})
    header, first, second = text.splitlines()
    assert header.split()[:3] == ["case", "cost", "total"] and header.split()[-1] == "n"
    assert "0.600 ±1.271" in first and "2.00 ±12.71" in first and first.endswith("2")
    assert "±" not in second and "0.400" in second and second.endswith("1")


def test_verdicts_say_whether_an_ordering_holds() -> None:
    assert verdict(Interval(1.0, 0.1, 5), Interval(2.0, 0.1, 5)) == "holds"
    assert verdict(Interval(1.0, 0.6, 5), Interval(2.0, 0.6, 5)).startswith("holds in the means")
    assert verdict(Interval(1.0, math.nan, 1), Interval(2.0, math.nan, 1)).startswith(
        "holds in the means"
    )
    assert verdict(Interval(2.0, 0.1, 5), Interval(1.0, 0.1, 5)) == "does not hold"


def test_orderings_report_the_paper_claims_on_fixed_data() -> None:
    results = {
        "t1-a": [result(1.0, slow=0.05), result(1.02, slow=0.06), result(0.98, slow=0.04)],
        "t2-c": [result(0.8), result(0.85), result(0.75)],
        "t3-c": [result(0.9), result(0.95), result(0.85)],  # slower than t2-c
    }
    lines = orderings({key: summarize(runs) for key, runs in results.items()})
    by_claim = {line.split(": ", 1)[1].rsplit(": ", 1)[0]: line for line in lines}
    assert by_claim["t3-c 0.9 < t2-c 0.8"].endswith("does not hold")
    assert by_claim["t2-c 0.8 < t1-a 1"].endswith(": holds")
    assert by_claim["t3-c 0.9 < t1-a 1"].endswith("(intervals overlap)")
    assert not any("t4-fixed" in line for line in lines)  # a case not run: no claim
    assert any(line.startswith("req/cost: t3-c 10 > t1-a 10: ") for line in lines)
    assert lines == ordering_lines(results)


def test_results_table_and_files_with_repeats(tmp_path: Path) -> None:
    runs = {"t1-a": [result(1.0), result(1.2)], "t3-c": [result(0.5), result(0.7)]}
    text = results_table(runs)
    assert text.splitlines()[1].startswith("T1 A TTL 60, no pause") and "1.100 ±1.271" in text
    assert results_table(runs, markdown=True).startswith("| case | cost |")
    single = results_table({"t1-a": [result(1.0)]})
    assert "±" not in single
    (tmp_path / "results.json").write_text(
        json.dumps({"cases": {k: [r.as_dict() for r in v] for k, v in runs.items()}})
    )
    assert read_results(tmp_path) == runs
    (tmp_path / "results.json").write_text(json.dumps({"cases": {"t1-a": result(1.0).as_dict()}}))
    assert read_results(tmp_path) == {"t1-a": [result(1.0)]}  # a file from before repeats
    older = {k: v for k, v in result(1.0).as_dict().items() if k != "pause_flips"}
    (tmp_path / "results.json").write_text(json.dumps({"cases": {"t1-a": [older]}}))
    assert read_results(tmp_path)["t1-a"][0].pause_flips == 0  # from before pause flips


def test_planning_cases_times_repeats_and_the_eta() -> None:
    plan = ExperimentPlan(out=Path("/x"), case_duration=100, repeats=5)
    assert plan.estimate(4) == 4 * 5 * (100 + RUN_OVERHEAD)
    assert eta_text(plan, 0, 20, 0.0) == f"ETA {20 * (100 + RUN_OVERHEAD) / 60:.1f} min"
    assert eta_text(plan, 5, 20, 600.0) == "ETA 30.0 min"  # 120 s a run so far, 15 left
    assert eta_text(plan, 20, 20, 2400.0) == "ETA 0.0 min"
    assert plan.lab.scaling.max_servers == 10
    quick = ExperimentPlan(
        out=Path("/x"),
        repeats=PRESETS["quick"]["repeats"],
        case_duration=PRESETS["quick"]["case_duration"],
    )
    full = ExperimentPlan(
        out=Path("/x"),
        repeats=PRESETS["full"]["repeats"],
        case_duration=PRESETS["full"]["case_duration"],
    )
    assert [case.key for case in select_preset("quick")] == list(HEADLINE)
    assert quick.estimate(len(HEADLINE)) <= 20 * 60
    assert full.estimate(len(HEADLINE)) <= 120 * 60
    assert problems_of(quick) == [] and problems_of(dataclasses.replace(quick, repeats=0)) != []


def test_the_step_load_outgrows_the_first_servers_quickly() -> None:
    plan = ExperimentPlan(out=Path("/x"), case_duration=240, peak_users=160)
    load = plan.load
    assert load.duration == 240 and load.peak == 160 and load.every == 30
    assert (load.start, load.step, load.count) == (32, 32, 4)


def test_a_constant_load_holds_the_peak_for_the_whole_run() -> None:
    plan = ExperimentPlan(out=Path("/x"), case_duration=600, peak_users=100, constant_load=True)
    load = plan.load
    assert load.duration == 600 and load.peak == 100
    assert [load.users_at(t) for t in (0, 299, 599, 600)] == [100, 100, 100, None]
    assert load.spawn_rate == 100  # all of them within a second, as in the simulator
    assert ExperimentPlan(out=Path("/x"), peak_users=160).load.spawn_rate == 32


def test_unbound_config_keeps_or_rotates_and_asks_the_labs_pdns(tmp_path: Path) -> None:
    text = unbound_config(
        directory=tmp_path,
        address="127.0.2.3",
        port=5300,
        zone="lab.test",
        upstream_port=5300,
        rrset_roundrobin=True,
    )
    assert "interface: 127.0.2.3\n" in text and "stub-addr: 127.0.0.1@5300" in text
    assert "rrset-roundrobin: yes" in text and "do-not-query-localhost: no" in text
    assert "control-enable: no" in text and f'logfile: "{tmp_path}/unbound.log"' in text
    kept = unbound_config(
        directory=tmp_path,
        address="127.0.2.3",
        port=5300,
        zone="lab.test",
        upstream_port=5300,
        rrset_roundrobin=False,
    )
    assert "rrset-roundrobin: no" in kept
    assert resolver_addresses("127.0.2", 3) == ["127.0.2.1", "127.0.2.2", "127.0.2.3"]


def test_resolver_settings_and_what_users_ask() -> None:
    assert problems_of(LabSettings(resolver_network="127.0.1")) != []  # the servers' network
    assert problems_of(LabSettings(resolver_network="10.0.2")) != []
    assert problems_of(LabSettings(resolvers=17)) != []
    assert problems_of(LabSettings(resolvers=0, resolver_network="nonsense")) == []
    info = LabInfo(
        workdir="/x",
        pid=1,
        started_at=0.0,
        dns_address="127.0.0.1",
        dns_port=5300,
        dns_name="www.lab.test",
        http_port=8080,
        network="127.0.1",
        manager_url="http://127.0.0.1:8700",
        token_file="/x/api.token",
        objects={"count": 1},
        settings={},
        resolvers=["127.0.2.1:5300", "127.0.2.2:5300"],
    )
    assert info.dns_servers() == "127.0.2.1:5300,127.0.2.2:5300"
    assert info.dns_servers(direct=True) == "127.0.0.1:5300"
    assert dataclasses.replace(info, resolvers=[]).dns_servers() == "127.0.0.1:5300"
