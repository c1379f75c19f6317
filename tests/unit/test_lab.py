"""The lab's pure parts: objects, settings and the manager configuration they make, records, the
report's measures (the real lab runs in tests/integration/test_lab.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from dnslb.config import parse_config, problems_of
from dnslb.errors import ConfigError
from evaluation.columns import ResponseStats, paper_columns
from lab.objects import ObjectCatalog
from lab.origin import body_of
from lab.records import Record, RecordWriter, read_records
from lab.report import LabRun, ServerSpan, measure, series, state_at
from lab.runner import Lab, LabInfo
from lab.settings import LabSettings, manager_config, with_policy
from manager.config import ManagerConfig
from manager.providers.local import LocalProviderConfig


def test_object_sizes_are_fixed_with_the_asked_mean_and_floor() -> None:
    catalog = ObjectCatalog(count=200, mean_size=10000, min_size=2000)
    sizes = [catalog.size(i) for i in range(catalog.count)]
    assert sizes == [
        ObjectCatalog(count=200, mean_size=10000, min_size=2000).size(i) for i in range(200)
    ]
    assert min(sizes) >= 2000
    assert sum(sizes) / len(sizes) == pytest.approx(10000, rel=0.03)
    assert sizes == sorted(sizes)  # quantiles in order: object 0 is the smallest
    with pytest.raises(IndexError):
        catalog.size(200)


@pytest.mark.parametrize(
    ("path", "index"),
    [
        ("/objects/0", 0),
        ("/objects/99?x=1", 99),
        ("/objects/100", None),
        ("/objects/-1", None),
        ("/objects/", None),
        ("/object/1", None),
        ("/objects/1/2", None),
        ("/objects/0000000000001", None),
    ],
)
def test_object_paths(path: str, index: int | None) -> None:
    assert ObjectCatalog(count=100).index_of(path) == index


def test_bodies_have_their_size() -> None:
    assert [len(body_of(n)) for n in (0, 1, 94, 95, 10000)] == [0, 1, 94, 95, 10000]
    assert body_of(500) == body_of(500)


def settings(**changes: object) -> LabSettings:
    return dataclasses.replace(LabSettings(workdir=Path("/tmp/lab-x")), **changes)  # type: ignore[arg-type]


def test_default_settings_are_valid_and_calibrated() -> None:
    lab = settings()
    assert problems_of(lab) == []
    assert lab.mean_service_time == pytest.approx(0.5)
    assert lab.dns_name == "www.lab.test"


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"dns_port": 0}, "dns_port: must be at least 1, not 0"),
        ({"http_port": 65536}, "http_port: must be at most 65535, not 65536"),
        ({"api_port": 5300}, "api_port 5300: the same port as dns_port"),
        ({"network": "10.0.1"}, "network 10.0.1: must be on loopback"),
        ({"network": "127.0.0"}, "network 127.0.0: taken"),
        ({"network": "127.0"}, "network '127.0': must be three octets"),
        ({"boot_delay": -1.0}, "boot_delay: must be at least 0.0, not -1.0"),
        ({"capacity_rps": 0.0}, "capacity_rps 0: must be above 0"),
        ({"objects": ObjectCatalog(mean_size=1000)}, "object mean size 1000 must exceed"),
        ({"objects": ObjectCatalog(count=0)}, "objects.count: must be at least 1, not 0"),
    ],
    ids=[
        "port",
        "port-high",
        "same-port",
        "not-loopback",
        "lab-network",
        "octets",
        "boot",
        "capacity",
        "sizes",
        "catalog",
    ],
)
def test_bad_settings_name_the_field(changes: dict[str, object], problem: str) -> None:
    problems = problems_of(settings(**changes))
    assert any(p.startswith(problem) for p in problems), problems


def test_a_bad_policy_is_found_before_the_manager_starts() -> None:
    problems = problems_of(with_policy(settings(), ttl_min=100))
    assert problems == ["policy: ttl_min (100) must not exceed ttl_max (60)"]
    assert problems_of(with_policy(settings(), k=0)) == ["policy.k: must be at least 1, not 0"]
    with pytest.raises(ConfigError, match=r"policy\.k: must be at least 1"):
        Lab(with_policy(settings(), k=0), say=lambda text: None).start()


def test_the_generated_manager_config_loads_as_the_manager_loads_it(tmp_path: Path) -> None:
    lab = with_policy(settings(api_port=8799, http_port=8089, boot_delay=3.0), k=2, ttl_max=30)
    token = tmp_path / "api.token"
    token.write_text("a-lab-token-of-enough-length-0123456789\n")
    config = parse_config(manager_config(lab, api_token_file=token), ManagerConfig)
    (api_token,) = config.auth.api_tokens
    assert api_token.role == "admin"
    assert api_token.token.reveal() == "a-lab-token-of-enough-length-0123456789"
    assert "a-lab-token" not in manager_config(lab, api_token_file=token)  # a reference only
    pool = config.pools[0]
    assert (pool.name, pool.zone, pool.dns_name) == ("www", "lab.test", "www.lab.test")
    assert (pool.policy.k, pool.policy.ttl_max) == (2, 30)
    assert pool.scaling == lab.scaling
    provider = pool.provider
    assert isinstance(provider, LocalProviderConfig)
    assert (provider.port, provider.boot_delay, provider.network) == (8089, 3.0, "127.0.1")
    assert (provider.capacity_rps, provider.max_concurrency) == (20.0, 12)
    assert (provider.send_rate, provider.send_chunk) == (16384, 2048)
    assert provider.origin == "http://127.0.0.1:8000"
    assert (config.http.address, config.http.port) == ("127.0.0.1", 8799)
    assert pool.lifecycle.drain_timeout == 90.0  # the longest TTL handed out, and then some


def test_records_round_trip_and_a_cut_row_ends_the_file(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    first = Record(
        start=1.5, kind="DNS", name="www.lab.test", seconds=0.004, ok=True, ttl=60, length=2
    )
    second = Record(
        start=2.0,
        kind="GET",
        name="/objects/[n]",
        seconds=1.25,
        ok=False,
        address="127.0.1.1",
        error="ConnectionRefusedError: refused",
    )
    writer = RecordWriter(path)
    writer.write(first)
    writer.write(second)
    writer.close()
    with open(path, "a") as handle:
        handle.write("3.0,GET,/objects/[n],0.1")  # the writer was killed mid-row
    assert list(read_records(path)) == [first, second]


def span(server: str, created: float, states: list[tuple[float, str]], cost: float) -> ServerSpan:
    return ServerSpan(
        id=server,
        address=f"127.0.1.{server[-1]}",
        created_at=created,
        terminated_at=None,
        states=((created, "launching"), *states),
        cost=cost,
        served=0,
    )


def a_run() -> LabRun:
    info = LabInfo(
        workdir="/tmp/lab-x",
        pid=1,
        started_at=0.0,
        dns_address="127.0.0.1",
        dns_port=5300,
        dns_name="www.lab.test",
        http_port=8080,
        network="127.0.1",
        manager_url="http://127.0.0.1:8700",
        token_file="/tmp/lab-x/api.token",
        objects={"count": 100, "mean_size": 10240, "min_size": 2048},
        settings={},
    )
    records = [
        Record(start=100.0, kind="DNS", name="www.lab.test", seconds=0.01, ok=True, ttl=60),
        Record(start=101.0, kind="DNS", name="www.lab.test", seconds=0.01, ok=True, ttl=20),
        Record(start=100.5, kind="GET", name="o", seconds=0.5, ok=True, address="127.0.1.1"),
        Record(start=102.0, kind="GET", name="o", seconds=4.0, ok=True, address="127.0.1.1"),
        Record(start=103.0, kind="GET", name="o", seconds=12.0, ok=True, address="127.0.1.2"),
        Record(start=104.0, kind="GET", name="o", seconds=60.0, ok=False, address="127.0.1.2"),
    ]
    return LabRun(
        info=info,
        loadtest={},
        start=100.0,
        end=110.0,
        records=tuple(records),
        servers=(
            span("s1", 90.0, [(92.0, "active")], 10.0),
            span("s2", 104.0, [(105.0, "warming"), (106.0, "active")], 6.0),
        ),
        events=(),
        samples=(
            {"t": 100.2, "members": [["s1", "127.0.1.1", "active", 0.5, 1.0, 60]]},
            {
                "t": 107.2,
                "members": [
                    ["s1", "127.0.1.1", "paused", 1.2, 0.0, 5],
                    ["s2", "127.0.1.2", "active", 0.2, 1.0, 60],
                ],
            },
        ),
        users=((100.0, 5), (105.0, 10)),
    )


def test_a_run_is_measured_in_the_papers_columns() -> None:
    result = measure(a_run(), "case")
    assert result.cost == 16.0
    assert result.requests == 3 and result.failed == 1
    assert result.total_response == pytest.approx(16.5)
    assert result.mean_response == pytest.approx(5.5)
    assert result.requests_per_cost == pytest.approx(3 / 16)
    assert (result.under_3, result.from_3_to_9, result.from_9_to_60) == pytest.approx(
        (1 / 3, 1 / 3, 1 / 3)
    )
    assert result.mean_ttl == 40.0 and result.dns_queries == 2
    assert result.peak_servers == 2 and result.peak_users == 10
    assert result.duration == 10.0


def test_a_run_counts_its_pause_flips_and_the_time_servers_stayed_overloaded() -> None:
    run = dataclasses.replace(
        a_run(),
        events=(
            (101.0, "paused", "s1", "utilization 0.95"),
            (103.0, "resumed", "s1", "utilization 0.5"),
            (104.0, "server_added", "s2", ""),
            (105.0, "paused", "s2", "utilization 0.9"),
        ),
        samples=tuple(
            {"t": 100.0 + t, "members": [["s1", "127.0.1.1", "active", u, 1.0, 5]]}
            for t, u in enumerate([1.6] * 8 + [1.0] * 2)  # above 1.5 for 8 s: within the grace
        )
        + tuple(
            {"t": 100.0 + t, "members": [["s2", "127.0.1.2", "paused", 2.0, 0.0, 5]]}
            for t in range(10)  # above for the whole run (and before it): 10 s is not more
        ),
    )
    result = measure(run, "case")
    assert result.pause_flips == 3
    assert result.pause_flips_per_hour == pytest.approx(3 * 3600 / 16)
    assert result.overloaded_seconds == 0.0
    # a longer window: s2's last sample (at 9 s) stands 5 s at most, to 14 s: 4 s past the grace
    longer = dataclasses.replace(run, end=115.0)
    assert measure(longer, "case").overloaded_seconds == pytest.approx(4.0)


def test_server_states_over_time() -> None:
    s2 = a_run().servers[1]
    assert [state_at(s2, t) for t in (103.0, 104.5, 105.5, 109.0)] == [
        None,
        "launching",
        "warming",
        "active",
    ]
    data = series(a_run())
    assert len(data.times) == 10
    assert data.booting[4:7] == (1, 1, 0)
    assert data.serving[0] == 1 and data.paused[7] == 1 and data.serving[7] == 1
    assert data.users[0] == 5 and data.users[6] == 10
    assert data.answer_ttl[0] == 60 and math.isnan(data.answer_ttl[5])


def test_paper_columns_of_no_requests_are_zero() -> None:
    columns = paper_columns(ResponseStats.from_times([]), cost=0.0, ttl_total=0.0, answers=0)
    assert columns["mean_response"] == 0.0 and columns["requests_per_cost"] == 0.0
    assert columns["mean_ttl"] == 0.0


def test_the_docs_state_the_labs_calibration_as_the_defaults_are() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "lab.md").read_text()
    lab = settings()
    stated = [
        f"`capacity_rps` = {lab.capacity_rps:g} requests a second",
        f"`send_rate` = {lab.send_rate} bytes a second",
        f"`send_chunk` = {lab.send_chunk}-byte",
        f"above {lab.objects.min_size} bytes, mean {lab.objects.mean_size}",
        f"≈ {lab.max_concurrency}, so",
        f"`http://127.0.0.1:{lab.origin_port}`",
        f"`127.0.0.1:{lab.dns_port}` (UDP and TCP)",
        f"after `--boot-delay` ({lab.boot_delay:g} s)",
        f"1 to {lab.scaling.max_servers} servers",
    ]
    missing = [phrase for phrase in stated if phrase not in " ".join(text.split())]
    assert missing == []


def test_sigterm_during_an_experiment_run_stops_its_lab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dnslb experiments` or `dnslb calibrate` killed with SIGTERM left pdns, unbound and the
    cache servers of the run in progress running: now the lab stops as on Ctrl-C."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from lab import experiments  # noqa: PLC0415

    stopped: list[bool] = []

    class Killed:
        def __init__(self, settings: LabSettings, say: object) -> None:
            self.settings = settings

        def start(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)

        def stop(self, *, quiet: bool = False) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # a second one while it stops: ignored
            stopped.append(quiet)

    monkeypatch.setattr(experiments, "Lab", Killed)
    case = experiments.select_cases(pattern="^t1-a$")[0]
    plan = experiments.ExperimentPlan(out=tmp_path, lab=experiments.experiment_lab())
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        experiments.run_case(case, plan)
    assert stopped == [True]
    assert signal.getsignal(signal.SIGTERM) == before
