"""One tiny experiment case end to end: a fresh lab with its caching resolvers, a step load
through them, the report, two repeats summarised with their intervals, and no process left."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from daemons.process import free_port
from lab.experiments import CASES, ExperimentPlan, experiment_lab, run_experiments
from lab.records import DNS, read_records
from tests.integration.test_lab import processes_naming

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("unbound") is None and not Path("/usr/sbin/unbound").exists(),
        reason="unbound is not installed (apt-get install unbound)",
    ),
]


def test_one_tiny_case_twice_through_real_resolvers(tmp_path: Path) -> None:
    lab = experiment_lab()
    lab = dataclasses.replace(
        lab,
        dns_port=free_port(),
        api_port=free_port(),
        http_port=free_port(),
        origin_port=free_port(),
        network="127.0.7",
        resolver_network="127.0.107",
        resolvers=2,
        boot_delay=1.0,
        scaling=dataclasses.replace(lab.scaling, max_servers=2, boot_time=1.0),
    )
    plan = ExperimentPlan(out=tmp_path, lab=lab, case_duration=10, peak_users=5, repeats=2)
    case = next(case for case in CASES if case.key == "t3-c")
    assert run_experiments(plan, [case]) == 0

    document = json.loads((tmp_path / "results.json").read_text())
    runs = document["cases"]["t3-c"]
    assert len(runs) == 2 and all(run["requests"] > 0 for run in runs)
    assert document["plan"]["repeats"] == "2"
    text = (tmp_path / "results.txt").read_text()
    assert "±" in text and text.splitlines()[0].split()[-1] == "n"
    for repeat in (1, 2):
        records = read_records(tmp_path / "t3-c" / f"run-{repeat}" / "loadtest" / "requests.csv")
        asked = {record.address for record in records if record.kind == DNS}
        # every user asked one of the lab's resolvers, never pdns itself
        assert asked and asked <= {f"127.0.107.{n}:{lab.dns_port}" for n in (1, 2)}
    assert processes_naming(tmp_path) == []
