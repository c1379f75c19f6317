"""Scenario files: the shipped ones load, cases merge over the base, problems say their line;
the metrics and the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cli.main import main
from dnslb.errors import ConfigError
from evaluation.columns import ResponseStats, busiest_over_mean, overloaded_seconds
from sim.runner import SUITES
from sim.scenario import (
    SCENARIO_DIR,
    LoadConfig,
    LoadStep,
    Staircase,
    load_scenarios,
    parse_scenarios,
)

SHIPPED = sorted(SCENARIO_DIR.glob("*.yaml"))


def test_scenarios_are_shipped() -> None:
    assert len(SHIPPED) >= 8


@pytest.mark.parametrize("path", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_every_shipped_scenario_loads(path: Path) -> None:
    file = load_scenarios(path)
    assert file.scenarios
    assert len({scenario.name for scenario in file.scenarios}) == len(file.scenarios)


def test_every_suite_names_shipped_files() -> None:
    for names in SUITES.values():
        for name in names:
            assert (SCENARIO_DIR / name).exists(), name


BASE = """title: A table
name: base
duration: 100
load: {steps: [{at: 0, clients: 10}]}
dns: {policy: {k: 4, ttl_max: 60}}
"""


def test_cases_merge_over_the_base() -> None:
    file = parse_scenarios(
        BASE
        + """cases:
  - name: one
    dns: {policy: {k: 1}}
  - name: two
    duration: 50
"""
    )
    one, two = file.scenarios
    assert file.title == "A table"
    assert (one.dns.policy.k, one.dns.policy.ttl_max, one.duration) == (1, 60, 100)
    assert (two.dns.policy.k, two.duration) == (4, 50)


def test_unknown_keys_are_rejected_with_their_line() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenarios(
            BASE
            + """cases:
  - name: one
    dns: {policy: {kk: 1}}
  - name: two
    servers: {max_concurency: 5}
""",
            source="t.yaml",
        )
    problems = caught.value.problems
    assert any(
        "t.yaml, line 8: dns.policy.kk: unknown key (did you mean 'k'?)" in p for p in problems
    )
    assert any("line 10: servers.max_concurency: unknown key" in p for p in problems)


def test_a_scenario_needs_its_load_and_servers() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenarios("name: x\nduration: 10\nservers: {initial: 0}\n", source="x.yaml")
    text = "\n".join(caught.value.problems)
    assert "load: missing" in text


def test_load_staircase_and_steps_add_up() -> None:
    load = LoadConfig(
        steps=(LoadStep(at=0, clients=100), LoadStep(at=50, clients=0)),
        staircase=Staircase(start=10, step=5, every=20, count=3),
    )
    assert [load.clients_at(t) for t in (0, 19, 20, 49, 50, 60, 1000)] == [
        110,
        110,
        115,
        120,
        20,
        25,
        25,
    ]
    assert load.changes(100) == [20, 40, 50, 60]
    assert load.peak(100) == 120


def test_response_bands_and_percentiles() -> None:
    histogram = [0] * 6002
    for seconds, count in ((0.5, 90), (4.0, 6), (30.0, 3), (60.0, 1)):
        histogram[int(seconds * 100)] += count
    stats = ResponseStats.from_histogram(histogram, total=0.5 * 90 + 24 + 90 + 60)
    assert (stats.count, stats.under_3, stats.from_3_to_9, stats.from_9) == (100, 90, 6, 4)
    assert stats.percentile(0.5) == pytest.approx(0.51)
    assert stats.percentile(0.99) == pytest.approx(30.01)


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param({"a": [(0, 0.5), (1, 0.5)], "b": [(0, 0.5), (1, 0.5)]}, 1.0, id="even"),
        pytest.param({"a": [(0, 0.9)], "b": [(0, 0.3)]}, 1.5, id="uneven"),
        pytest.param({"a": [(0, 0.02)], "b": [(0, 0.0)]}, 1.0, id="idle-is-not-uneven"),
        pytest.param(
            {"a": [(0, 1.0), (5, 0.0)], "b": [(0, 0.0), (5, 1.0)]}, 1.0, id="noise-averages-out"
        ),
    ],
)
def test_busiest_over_mean(samples: dict[str, list[tuple[float, float]]], expected: float) -> None:
    assert busiest_over_mean(samples, window=10, until=10) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("points", "until", "expected"),
    [
        pytest.param([(0, 1.6), (5, 1.6), (10, 1.0)], 20, 0.0, id="10-s-is-not-more"),
        pytest.param([(0, 1.6), (5, 1.6), (10, 1.6), (12, 1.0)], 20, 2.0, id="past-the-grace"),
        pytest.param([(0, 2.0), (4, 2.0), (8, 2.0), (12, 2.0)], 14, 4.0, id="to-the-end"),
        pytest.param([(0, 1.5), (5, 1.5), (10, 1.5), (15, 1.0)], 30, 0.0, id="at-the-level"),
        pytest.param(
            [(0, 1.6), (5, 1.6), (6, 1.0), (7, 1.6), (12, 1.6), (15, 1.0)], 20, 0.0, id="apart"
        ),
        pytest.param([(0, 1.6), (30, 1.6), (40, 1.0)], 40, 0.0, id="a-gap-ends-a-spell"),
        pytest.param([(0, 1.6), (5, math.nan), (10, 1.6), (15, 1.6)], 20, 0.0, id="nan-ends-it"),
    ],
)
def test_overloaded_seconds(
    points: list[tuple[float, float]], until: float, expected: float
) -> None:
    assert overloaded_seconds({"a": points}, until) == pytest.approx(expected)
    both = overloaded_seconds({"a": points, "b": points}, until)
    assert both == pytest.approx(2 * expected)


def test_command_writes_results_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(
        """title: Tiny
name: base
duration: 60
load: {steps: [{at: 0, clients: 50}]}
servers: {initial: 2}
cases:
  - name: product
  - name: round-robin
    dns: {all_addresses: true, policy: {weight_function: equal}}
"""
    )
    out = tmp_path / "out"
    status = main(["sim", str(scenario), "--out", str(out), "--jobs", "1", "--seed", "3"])
    assert status == 0
    printed = capsys.readouterr().out
    assert "Tiny" in printed and "round-robin" in printed
    result = json.loads((out / "tiny" / "product" / "result.json").read_text())
    assert result["seed"] == 3 and result["requests"] > 0
    for plot in ("utilization.png", "pool.png", "ttl.png", "response.png"):
        assert (out / "tiny" / "round-robin" / plot).read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "results.json").read_text())[0]["title"] == "Tiny"


def test_command_refuses_an_unknown_suite(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--suite", "nope"]) == 2
    assert "unknown suite" in capsys.readouterr().err


def test_command_reports_a_bad_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nduration: 10\nload: {steps: []}\nbogus: 1\n")
    assert main(["sim", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.yaml, line 4: bogus: unknown key" in err
