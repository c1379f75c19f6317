"""The load test's pure parts: a client's resolver cache, address choice, the step load, the
locust command line, the experiments' cases (locust itself runs in tests/integration)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from pathlib import Path

import pytest

from dnslb.config import parse_config, problems_of
from dnslb.errors import ConfigError
from dnslb.policy import PoolPolicy
from lab.experiments import CASES, NEVER, ExperimentPlan, plain
from lab.loadtest.resolver import Answer, CachingResolver, LookupFailed, choose, server_address
from lab.loadtest.run import LoadTest, run_loadtest
from lab.loadtest.shape import StepLoad


class FakeDns:
    def __init__(self, answers: list[Answer | None]) -> None:
        self.answers = answers
        self.asked = 0

    def __call__(self, name: str) -> Answer:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        if answer is None:
            raise LookupFailed("SERVFAIL")
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_answer_is_reused_for_its_ttl_then_asked_again() -> None:
    dns = FakeDns([Answer(("10.0.0.1",), 30), Answer(("10.0.0.2",), 5)])
    clock = Clock()
    resolver = CachingResolver(dns, clock)
    assert resolver.resolve("www") == (Answer(("10.0.0.1",), 30), True)
    clock.now = 29.9
    assert resolver.resolve("www") == (Answer(("10.0.0.1",), 30), False)
    clock.now = 30.0
    assert resolver.resolve("www") == (Answer(("10.0.0.2",), 5), True)
    assert dns.asked == 2


def test_a_client_ignoring_ttls_holds_its_answer() -> None:
    dns = FakeDns([Answer(("10.0.0.1",), 5), Answer(("10.0.0.2",), 5)])
    clock = Clock()
    resolver = CachingResolver(dns, clock, hold=600)
    resolver.resolve("www")
    clock.now = 599
    assert resolver.resolve("www")[1] is False
    clock.now = 600
    assert resolver.resolve("www")[0].addresses == ("10.0.0.2",)


def test_ttl_zero_asks_every_time_and_a_failure_is_not_cached() -> None:
    dns = FakeDns([Answer(("10.0.0.1",), 0), None, Answer(("10.0.0.3",), 60)])
    resolver = CachingResolver(dns, Clock())
    assert resolver.resolve("www")[1] is True
    with pytest.raises(LookupFailed):
        resolver.resolve("www")
    assert resolver.resolve("www")[0].addresses == ("10.0.0.3",)
    resolver.forget("www")
    assert resolver.cached("www") is None


def test_the_client_connects_to_the_first_or_a_random_address() -> None:
    rng = random.Random(1)
    addresses = ("a", "b", "c")
    assert {choose(addresses, "first", rng) for _ in range(20)} == {"a"}
    assert {choose(addresses, "random", rng) for _ in range(60)} == {"a", "b", "c"}
    with pytest.raises(LookupFailed):
        choose((), "first", rng)
    with pytest.raises(ValueError, match="first or random"):
        choose(addresses, "last", rng)


def test_the_step_load_rises_in_steps_and_holds() -> None:
    load = StepLoad(start=10, step=5, every=30, count=3, hold=20)
    assert load.peak == 25 and load.duration == 140
    wanted = [(0, 10), (29.9, 10), (30, 15), (60, 20), (90, 25), (139, 25), (140, None)]
    assert [(t, load.users_at(t)) for t, _ in wanted] == wanted
    assert problems_of(StepLoad(start=0, step=0, every=0, count=1)) == [
        "every: must be above 0, not 0",
        "the load never has a user",
    ]
    assert problems_of(StepLoad(start=-1)) == ["start: must be at least 0, not -1"]


def test_the_locust_command_carries_every_option(tmp_path: Path) -> None:
    test = LoadTest(
        dns_server="127.0.0.1:5301",
        lb_name="www.lab.test",
        http_port=8081,
        objects=50,
        load=StepLoad(start=2, step=3, every=4, count=5, hold=6),
        out=tmp_path,
        connect="random",
        seed=7,
    )
    command = test.command()
    pairs = dict(itertools.pairwise(command))
    assert pairs["--dns-server"] == "127.0.0.1:5301" and pairs["--http-port"] == "8081"
    assert pairs["--start-users"] == "2" and pairs["--steps"] == "5" and pairs["--hold"] == "6"
    assert pairs["--connect"] == "random" and pairs["--seed"] == "7"
    assert pairs["--csv"] == str(tmp_path / "locust")
    assert "--headless" in command
    assert problems_of(test) == []
    bad = LoadTest(
        dns_server="x",
        lb_name="x",
        http_port=1,
        objects=1,
        load=dataclasses.replace(test.load, every=0),
        out=tmp_path,
        ignore_ttl=2.0,
        think_time=-1,
    )
    assert problems_of(bad) == [
        "load: every: must be above 0, not 0",
        "think_time: must be at least 0, not -1",
        "ignore_ttl: must be at most 1, not 2.0",
        "dns_server: 'x' is not ADDRESS:PORT",
    ]
    with pytest.raises(ConfigError, match="4 problems"):
        run_loadtest(bad)
    assert list(tmp_path.iterdir()) == []  # refused before anything is written


def test_every_experiment_case_is_a_valid_policy() -> None:
    assert len({case.key for case in CASES}) == len(CASES)
    for case in CASES:
        document = {**case.policy}
        policy = parse_config(str(document).replace("'", '"'), PoolPolicy)
        assert isinstance(policy, PoolPolicy)
        assert set(case.tables) <= {"1", "2", "3", "4"}
    assert plain(60, NEVER)["ttl_min"] == plain(60, NEVER)["ttl_max"] == 60


def test_the_experiments_step_load_fills_the_case() -> None:
    plan = ExperimentPlan(out=Path("/tmp/x"), case_duration=240, peak_users=105)
    load = plan.load
    assert load.duration == 240 and load.peak == 105 and load.every == 30


@pytest.mark.parametrize(
    ("server", "address"),
    [
        pytest.param("127.0.0.1", "127.0.0.1", id="ipv4"),
        pytest.param("[::1]", "::1", id="ipv6-bracketed"),
        pytest.param("localhost", "127.0.0.1", id="name"),  # the compose lab's "dns"
    ],
)
def test_the_dns_server_may_be_named(server: str, address: str) -> None:
    assert server_address(server) == address


def test_results_print_as_one_table_in_the_cases_order(tmp_path: Path) -> None:
    from evaluation.columns import CaseResult  # noqa: PLC0415
    from lab.experiments import read_results, results_table  # noqa: PLC0415

    def result(requests: int) -> CaseResult:
        return CaseResult(
            name="x",
            cost=100.0,
            total_response=requests * 0.5,
            requests=requests,
            mean_response=0.5,
            requests_per_cost=requests / 100,
            under_3=1.0,
            from_3_to_9=0.0,
            from_9_to_60=0.0,
            mean_ttl=42.0,
            busiest_over_mean=1.2,
            saturated_seconds=0.0,
            failed=0,
            p50=0.4,
            p99=2.0,
            dns_queries=10,
            peak_servers=2,
        )

    document = {
        "cases": {"t3-c": {**result(300).as_dict(), "duration": 5.0}, "t1-a": result(200).as_dict()}
    }
    (tmp_path / "results.json").write_text(json.dumps(document))
    text = results_table(read_results(tmp_path))
    lines = text.splitlines()
    assert lines[0].startswith("case")
    assert lines[1].startswith("T1 A TTL 60, no pause (plain DNS RR)")
    assert lines[2].startswith("T3 C = T4 product: variable TTL, k=4")
    assert " 300 " in lines[2] and "42.0" in lines[2]
