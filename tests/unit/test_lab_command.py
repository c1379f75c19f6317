"""The lab's command lines: no option means the settings' own defaults (declared once, in the
dataclasses, the locustfile's options included), and a problem names the option."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dnslb.config import default_of
from dnslb.errors import ConfigError
from lab.command import (
    LAB_OPTIONS,
    LOAD_OPTIONS,
    LOADTEST_OPTIONS,
    add_experiments_arguments,
    add_lab_arguments,
    add_loadtest_arguments,
    add_origin_arguments,
    experiment_plan,
    lab_settings,
    load_test,
    named,
    origin_settings,
)
from lab.experiments import ExperimentPlan
from lab.loadtest.run import LoadTest
from lab.loadtest.shape import StepLoad
from lab.origin import OriginSettings
from lab.runner import LabInfo
from lab.settings import LabSettings

ROOT = Path(__file__).resolve().parents[2]


def parse(add: Callable[[argparse.ArgumentParser], None], *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add(parser)
    return parser.parse_args(argv)


def default_lab_info(workdir: Path) -> LabInfo:
    """What a lab of the default settings writes in its lab.json."""
    lab = LabSettings(workdir=workdir)
    return LabInfo(
        workdir=str(workdir),
        pid=1,
        started_at=0.0,
        dns_address="127.0.0.1",
        dns_port=lab.dns_port,
        dns_name=lab.dns_name,
        http_port=lab.http_port,
        network=lab.network,
        manager_url=lab.manager_url,
        token_file=str(workdir / "api.token"),
        objects={"count": lab.objects.count},
        settings={},
    )


def test_no_option_means_the_settings_defaults(tmp_path: Path) -> None:
    assert lab_settings(parse(add_lab_arguments)) == LabSettings()
    given = lab_settings(parse(add_lab_arguments, "--workdir", str(tmp_path)))
    assert given == LabSettings(workdir=tmp_path)
    out = tmp_path / "out"
    assert experiment_plan(parse(add_experiments_arguments, "--out", str(out))) == (
        ExperimentPlan(out=out)
    )
    assert origin_settings(parse(add_origin_arguments)) == OriginSettings()
    loadtest = parse(add_loadtest_arguments, "--out", str(out))
    assert load_test(loadtest, default_lab_info(tmp_path)) == LoadTest(out=out)


def test_the_lab_and_experiments_agree_on_the_labs_defaults() -> None:
    lab = parse(add_lab_arguments)
    experiments = parse(add_experiments_arguments)
    shared = ("dns_port", "api_port", "http_port", "origin_port", "boot_delay", "resolvers")
    for name in (*shared, "resolver_network", "rrset_roundrobin"):
        assert getattr(lab, name) == getattr(experiments, name), name
    # the experiments grow the pool up to the paper's 10 servers, the lab to 4
    assert (lab.max_servers, experiments.max_servers) == (4, 10)


def test_the_locustfiles_options_default_to_the_load_tests_fields() -> None:
    """Its parser, built as locust builds it (in a process of its own: locust patches the
    standard library when it is imported)."""
    script = (
        "import argparse, json\n"
        "from lab.loadtest.locustfile import _options\n"
        "parser = argparse.ArgumentParser()\n"
        "_options(parser)\n"
        "print(json.dumps(vars(parser.parse_args([]))))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=60,
    )
    options = json.loads(found.stdout.strip().splitlines()[-1])
    for field, option in LOAD_OPTIONS.items():
        assert options[option[2:].replace("-", "_")] == default_of(StepLoad, field), option
    fields = [*LOADTEST_OPTIONS, "dns_server", "lb_name", "http_port", "objects", "progress"]
    for field in fields:
        if field == "out":
            continue
        assert options[field] == default_of(LoadTest, field), field


@pytest.mark.parametrize(
    ("argv", "problems"),
    [
        pytest.param(
            ("--dns-port", "0", "--k", "0"),
            ["--dns-port: must be at least 1, not 0", "--k: must be at least 1, not 0"],
            id="bounds",
        ),
        pytest.param(
            ("--api-port", "5300"),
            ["--api-port 5300: the same port as --dns-port (both on 127.0.0.1)"],
            id="same-port",
        ),
        pytest.param(
            ("--boot-delay", "-1"),
            ["--boot-delay: must be at least 0.0, not -1.0"],  # once, for the two fields it fills
            id="scaling",
        ),
    ],
)
def test_a_problem_names_the_option(argv: tuple[str, ...], problems: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        lab_settings(parse(add_lab_arguments, *argv))
    assert caught.value.problems == problems


def test_a_load_test_problem_names_the_option(tmp_path: Path) -> None:
    args = parse(add_loadtest_arguments, "--step-time", "0", "--ignore-ttl", "2")
    with pytest.raises(ConfigError) as caught:
        load_test(args, default_lab_info(tmp_path))
    assert caught.value.problems == ["--step-time: must be above 0, not 0"]
    args = parse(add_loadtest_arguments, "--ignore-ttl", "2")
    with pytest.raises(ConfigError) as caught:
        load_test(args, default_lab_info(tmp_path))
    assert caught.value.problems == ["--ignore-ttl: must be at most 1, not 2.0"]


@pytest.mark.parametrize(
    ("problem", "shown"),
    [
        ("policy.k: must be at least 1, not 0", "--k: must be at least 1, not 0"),
        ("dns_ports: not a field", "dns_ports: not a field"),
        ("policy.k_max: not a field", "policy.k_max: not a field"),
        ("policy: ttl_min (100) must not exceed ttl_max (60)", None),
    ],
    ids=["path", "longer-word", "longer-path", "rule"],
)
def test_only_whole_field_paths_are_named_as_options(problem: str, shown: str | None) -> None:
    assert named(problem, LAB_OPTIONS) == (shown or problem)
