"""The manager against hostile reports and bad data (issue 14): one server's input affects only
that server's membership; every plan published is one a pipe backend serves."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dnslb.plan import parse_plan_json
from manager.control import Control
from manager.ingest import Rejected
from manager.service import Manager
from tests.unit.test_manager import CONFIG, S3_TOKEN, TOKEN, Lab


@pytest.fixture(autouse=True)
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DNSLB_TEST_AGENT_TOKEN", TOKEN)
    monkeypatch.setenv("DNSLB_TEST_S3_TOKEN", S3_TOKEN)


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    lab = Lab(tmp_path)
    lab.report_all()
    assert lab.step() is not None
    return lab


def published(lab: Lab) -> int:
    plan = parse_plan_json((lab.tmp_path / "plan.json").read_bytes())
    return plan.version


def post(manager: Manager, body: object, token: str = TOKEN) -> Rejected | None:
    try:
        manager.ingest.accept(token, json.dumps(body).encode())
    except Rejected as rejected:
        return rejected
    return None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("in_progress", 10**400, id="huge-in-progress"),
        pytest.param("max_concurrency", 10**308, id="huge-max"),
        pytest.param("seq", 2**64, id="seq-past-int64"),
        pytest.param("served_total", 10**400, id="huge-served"),
        pytest.param("time", 1e300, id="far-future"),
        pytest.param("server_id", "s1\t", id="tab-in-id"),
    ],
)
def test_out_of_range_reports_are_refused_and_store_nothing(
    lab: Lab, field: str, value: object
) -> None:
    body = {
        "server_id": "s1",
        "seq": 2**62,
        "time": lab.clock.time(),
        "in_progress": 1,
        "max_concurrency": 1,
        field: value,
    }
    rejected = post(lab.manager, body)
    assert rejected is not None and rejected.status == 422, rejected
    # Not stored: the real agent's next report (a lower seq) is still accepted.
    lab.report("s1", 10)
    before = lab.manager.version
    lab.report_all(95)  # a real change: every server overloaded
    lab.step()
    assert lab.manager.tick_errors == 0
    assert lab.manager.version > before
    assert published(lab) == lab.manager.version


def test_the_largest_bounded_report_still_gives_a_servable_plan(tmp_path: Path) -> None:
    """max_concurrency up to 10^9 for a member without a configured max, in a pool that lets
    reports claim anything (capacity_spread at its maximum): its weight is at most 10^9, which
    every pipe backend compiles."""
    spread = "    capacity_spread: 1000000000\n    members:"
    lab = Lab(tmp_path, CONFIG.replace("    members:", spread))
    lab.report_all()
    lab.step()
    lab.report("s1", 0, max_concurrency=10**9)
    lab.report("s2", 10**9, max_concurrency=1)
    lab.report("s3", 10, max_concurrency=10**9)
    lab.step()
    plan = parse_plan_json((lab.tmp_path / "plan.json").read_bytes())
    weights = {m.id: m.weight for m in plan.pools[0].members}
    assert weights["s1"] == pytest.approx(1e9, rel=0.01)
    assert lab.manager.plans_refused == 0


def test_a_server_claiming_a_huge_capacity_draws_no_more_than_its_bound(lab: Lab) -> None:
    """A weight is max concurrency times spare capacity: an agent (its token stolen, or its
    server compromised) that claims 10^9 must not draw every answer of its pool. It counts for
    capacity_spread (4) times the pool's median, in its weight and in the autoscaler's view."""
    lab.report("s1", 0, max_concurrency=10**9)
    lab.report("s2", 10)
    lab.report("s3", 10)
    lab.step()
    weights = {server: weight for server, (_, weight, _) in lab.members().items()}
    assert weights == {"s1": 400.0, "s2": 90.0, "s3": 90.0}
    server = lab.manager.fleet.servers["s1"]
    assert server.max_concurrency == 400 and server.capacity_bounded
    assert not lab.manager.fleet.servers["s2"].capacity_bounded
    assert lab.manager.plans_refused == 0
    why = Control(lab.manager).server("s1").why
    assert "it reports max concurrency 1000000000, counted as 400" in why, why
    # Two liars of three are a majority: the median is theirs (nothing tells them apart).
    lab.report("s2", 0, max_concurrency=10**9)
    lab.step()
    assert lab.members()["s1"][1] == pytest.approx(1e9, rel=0.01)
    # A server claiming less than the others lowers nobody's bound but its own weight.
    lab.report_all()
    lab.report("s1", 0, max_concurrency=1)
    lab.step()
    weights = {server: weight for server, (_, weight, _) in lab.members().items()}
    assert weights == {"s1": 1.0, "s2": 90.0, "s3": 90.0}


def test_a_configured_max_concurrency_is_not_bounded(tmp_path: Path) -> None:
    """The operator's word is trusted: a member configured far above its pool keeps it."""
    config = CONFIG.replace(
        "{id: s1, address: 10.0.0.1}", "{id: s1, address: 10.0.0.1, max_concurrency: 5000}"
    )
    lab = Lab(tmp_path, config)
    lab.report_all()
    lab.step()
    assert lab.members()["s1"][1] == 4500.0  # 5000 x (1 - 0.1)
    assert not lab.manager.fleet.servers["s1"].capacity_bounded


def test_a_lone_surrogate_in_an_error_is_kept_readable(lab: Lab) -> None:
    lab.report("s2", None, error="nginx \ud800 down")
    lab.step()
    assert lab.manager.tick_errors == 0
    assert any("nginx \ufffd down" in event for event in lab.events("state"))


def test_one_server_failing_its_assessment_costs_only_itself(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = lab.manager._assess

    def assess(pool, server, now, wall):  # type: ignore[no-untyped-def]
        if server.id == "s2":
            raise OverflowError("int too large to convert to float")
        real(pool, server, now, wall)

    monkeypatch.setattr(lab.manager, "_assess", assess)
    before = lab.manager.version
    for _ in range(3):
        lab.report_all(95)
        lab.step()
    assert lab.manager.tick_errors == 0
    assert lab.manager.part_errors["server"] == 3
    assert lab.manager.version > before  # the other servers' changes are published
    assert lab.members()["s1"][2] == 5  # the TTL floor: s1 is above th_over
    assert lab.members()["s2"][2] == 60  # its last assessed load (10 %)


def test_a_member_a_backend_would_refuse_is_left_out_alone(lab: Lab) -> None:
    """A member id with a tab became active, and the plan holding it was refused by every pipe
    backend while the manager reported it published."""
    server = lab.manager.fleet.servers["s2"]
    lab.manager.fleet.update(server, id="s2\tDATA")
    lab.report("s1", 10)
    lab.report("s3", 10)
    lab.step()
    assert set(lab.members()) == {"s1", "s3"}
    assert published(lab) == lab.manager.version
    assert any("left out of the plan" in event for event in lab.events("left_out"))


def test_a_refused_plan_is_not_published_nor_claimed(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    import manager.service as service  # noqa: PLC0415

    version = lab.manager.version
    plan = lab.manager.plan
    assert plan is not None

    def broken(text: str | bytes, **_: object) -> object:
        raise service.PlanError("invalid plan", ["pools[0].members[0].weight: refused"])

    monkeypatch.setattr(service, "parse_plan_json", broken)
    lab.report_all(95)
    lab.step()
    lab.step()
    assert lab.manager.version == version
    assert lab.manager.plan is plan
    assert lab.manager.plans_refused == 2
    assert published(lab) == version
    assert len([e for e in lab.events("plan_refused") if "not published" in e]) == 1
    monkeypatch.undo()
    lab.report_all(95)
    lab.step()
    assert lab.manager.version == version + 1
    assert published(lab) == version + 1
    assert lab.manager.plan_problem is None


def test_junk_stats_documents_are_skipped(lab: Lab) -> None:
    stats = lab.tmp_path / ".plan.json.stats"
    assert stats.is_dir()  # the manager opened the channel when it published
    documents = [
        {"pools": {"www.example.test": {"s1": ["x", 1]}}},
        {"pools": {"www.example.test": {"s1": [1e400, 1]}}},
        {"pools": {"www.example.test": {"s1": [10**400, 1]}}},
        {"pools": {"www.example.test": {"s1": [True, 1], "s2": [-5, 3]}}},
        {"pools": {"www.example.test": {"s3": [2, 3]}}},
    ]
    for index, document in enumerate(documents):
        (stats / f"p{index}.json").write_text(json.dumps(document))
    lab.clock.advance(1.0)  # read at most once a second (the last tick read them)
    assert lab.manager.answer_counts() == {"s3": (2, 3)}


def test_static_member_addresses_are_kept_in_normal_form(tmp_path: Path) -> None:
    from tests.unit.test_manager import CONFIG  # noqa: PLC0415

    lab = Lab(tmp_path, CONFIG.replace("10.0.0.3", "2001:DB8::3"))
    lab.report_all()
    lab.step()
    assert {m.address for m in lab.manager.plan.pools[0].members} >= {"2001:db8::3"}  # type: ignore[union-attr]


def test_dataclass_replace_keeps_check_cache_honest(lab: Lab) -> None:
    server = lab.manager.fleet.servers["s1"]
    lab.manager.fleet.update(server, address="fe80::1%eth0")
    lab.report_all()
    lab.step()
    assert "s1" not in lab.members()
    lab.manager.fleet.update(server, address="10.0.0.1")
    lab.report_all()
    lab.step()
    assert "s1" in lab.members()
    assert dataclasses.is_dataclass(server.record)


# -- what an admin API token may do with pools (runtime_pools) -------------------------------


def api_pool(text: str) -> object:
    from dnslb.config import parse_config  # noqa: PLC0415
    from manager.config import PoolConfig  # noqa: PLC0415

    return parse_config(text, PoolConfig, source="API body")


def create_through_api(manager: Manager, body: str) -> None:
    """``POST /v1/pools`` as the API does it: the document read by the manager's control."""
    import asyncio  # noqa: PLC0415

    from manager.control import Control  # noqa: PLC0415

    asyncio.run(Control(manager).create_pool(json.loads(body)))


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        pytest.param(
            '{"name": "api", "zone": "example.test", "provider": '
            '{"type": "local", "origin": "http://127.0.0.1:8000"}}',
            "'local' pools cannot be made through the API",
            id="local-provider",
        ),
        pytest.param(
            '{"name": "api", "zone": "example.test", "members": '
            '[{"id": "m1", "address": "10.1.0.1", "token": "file:/etc/hostname"}]}',
            "members[0].token: pools made through the API name secrets as env:NAME",
            id="file-secret",
        ),
        pytest.param(
            '{"name": "api", "zone": "example.test", "members": '
            '[{"id": "m1", "address": "10.1.0.1", "token": "file:/dev/zero"}]}',
            "members[0].token: pools made through the API name secrets as env:NAME",
            id="file-dev-zero-never-read",
        ),
        pytest.param(
            '{"name": "api", "zone": "example.test", "health_check": {"type": "tcp", "port": 80},'
            ' "members": [{"id": "m1", "address": "10.1.0.1",'
            ' "check_address": "169.254.169.254"}]}',
            "health checks of the link-local address 169.254.169.254",
            id="metadata-check",
        ),
    ],
)
def test_api_pools_cannot_reach_the_managers_host(lab: Lab, body: str, problem: str) -> None:
    from dnslb.errors import ConfigError  # noqa: PLC0415

    with pytest.raises(ConfigError) as caught:
        create_through_api(lab.manager, body)
    assert any(problem in p for p in caught.value.problems), caught.value.problems
    assert "api" not in lab.manager.fleet.pools


def test_the_operator_may_open_runtime_pools_up(tmp_path: Path) -> None:
    from tests.unit.test_manager import CONFIG  # noqa: PLC0415

    opened = CONFIG + (
        "runtime_pools: {providers: [static, local], file_secrets: true, link_local_checks: true}\n"
    )
    token = tmp_path / "m1.token"
    token.write_text("a-token-of-m1-000000")
    lab = Lab(tmp_path, opened)
    create_through_api(
        lab.manager,
        '{"name": "api", "zone": "example.test", "health_check": {"type": "tcp", "port": 80},'
        f' "members": [{{"id": "m1", "address": "10.1.0.1", "token": "file:{token}",'
        ' "check_address": "169.254.169.254"}]}',
    )
    assert "api" in lab.manager.fleet.pools


@pytest.mark.parametrize(
    ("member", "problem"),
    [
        pytest.param('{"id": "a\\tb", "address": "10.0.0.9"}', "id: holds the control", id="tab"),
        pytest.param(
            '{"id": "m", "address": "fe80::1%\\nDATA"}', "not an IP address", id="scope-newline"
        ),
        pytest.param('{"id": "m", "address": "fe80::1%eth0"}', "carry no %scope", id="scoped"),
        pytest.param(
            '{"id": "m", "address": "10.0.0.9", "check_address": "fe80::1%\\u00e9"}',
            "check_address: holds the non-ASCII",
            id="check-scope-utf8",
        ),
    ],
)
def test_members_a_backend_would_refuse_never_enter(lab: Lab, member: str, problem: str) -> None:
    from dnslb.errors import ConfigError  # noqa: PLC0415

    with pytest.raises(ConfigError) as caught:
        api_pool(f'{{"name": "api", "zone": "example.test", "members": [{member}]}}')
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_a_poisoned_seq_shuts_the_real_agent_out_only_until_down_after(lab: Lab) -> None:
    """A report with seq 2^63-1 (its token holder may send one) made every later report of the
    real agent a 409 for as long as the manager ran."""
    body = {
        "server_id": "s1",
        "seq": 2**63 - 1,
        "time": lab.clock.time(),
        "in_progress": 1,
        "max_concurrency": 100,
    }
    assert post(lab.manager, body) is None
    lab.clock.advance(1.0)
    with pytest.raises(Rejected) as refused:
        lab.report("s1", 10)
    assert refused.value.status == 409
    lab.clock.advance(3.0)  # down_after: the server is down by now anyway
    lab.report("s1", 10)  # taken again
    assert lab.manager.fleet.servers["s1"].report.seq < 2**63 - 1  # type: ignore[union-attr]
