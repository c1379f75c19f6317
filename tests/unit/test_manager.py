"""The manager's logic driven by a fake clock: reports in, states and events, plans out."""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path
from typing import Any

import pytest

from dnslb.clock import FakeClock
from dnslb.errors import ConfigError
from dnslb.model import ServerState
from dnslb.plan import MemberState, Plan
from manager.command import _YOUNG_THRESHOLD, tune_collector
from manager.config import load_manager_config
from manager.control import Control
from manager.fleet import HeldAnswers
from manager.ingest import Rejected
from manager.service import Manager

CONFIG = """
zones:
  - name: example.test
    ns: [ns1.example.test]
    records:
      - {name: ns1, type: A, content: 127.0.0.1}
auth:
  agent_token: env:DNSLB_TEST_AGENT_TOKEN
plan:
  stale_after: 30
  refresh: 5
down_after: 3
pools:
  - name: www
    zone: example.test
    policy:
      {k: 2, th_over: 0.8, hysteresis: 0.1, ttl_max: 60, ttl_min: 5, slow_start: 0, smoothing: 0,
       weight_function: spare, pause_dwell: 0, share_gain: 0}
    members:
      - {id: s1, address: 10.0.0.1}
      - {id: s2, address: 10.0.0.2}
      - {id: s3, address: 10.0.0.3, token: env:DNSLB_TEST_S3_TOKEN}
"""

TOKEN = "agent-secret"
S3_TOKEN = "s3-own-secret"


@pytest.fixture(autouse=True)
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DNSLB_TEST_AGENT_TOKEN", TOKEN)
    monkeypatch.setenv("DNSLB_TEST_S3_TOKEN", S3_TOKEN)


class Lab:
    """A manager on a fake clock, and agents that report to it in process."""

    def __init__(self, tmp_path: Path, config: str = CONFIG) -> None:
        self.tmp_path = tmp_path
        self.config_path = tmp_path / "manager.yaml"
        self.config_path.write_text(config)
        self.clock = FakeClock()
        self.seq: dict[str, int] = {}
        self.manager = self.start()

    def start(self) -> Manager:
        return Manager(load_manager_config(self.config_path), clock=self.clock)

    def restart(self) -> Manager:
        self.manager.store.close()
        self.manager = self.start()
        return self.manager

    def report(
        self, server: str, in_progress: int | None, max_concurrency: int = 100, **extra: Any
    ) -> None:
        self.seq[server] = self.seq.get(server, 1000) + 1
        body = {
            "server_id": server,
            "seq": self.seq[server],
            "time": self.clock.time(),
            "in_progress": in_progress,
            "max_concurrency": max_concurrency,
            **extra,
        }
        token = S3_TOKEN if server == "s3" else TOKEN
        self.manager.ingest.accept(token, json.dumps(body).encode())

    def report_all(self, in_progress: int = 10) -> None:
        for server in ("s1", "s2", "s3"):
            self.report(server, in_progress)

    def step(self, seconds: float = 1.0) -> Plan | None:
        self.clock.advance(seconds)
        return self.manager.tick()

    def members(self) -> dict[str, tuple[MemberState, float, int]]:
        plan = self.manager.plan
        assert plan is not None
        return {m.id: (m.state, m.weight, m.ttl) for m in plan.pools[0].members}

    def state(self, server: str) -> ServerState:
        return self.manager.fleet.servers[server].state

    def events(self, kind: str | None = None) -> list[str]:
        events = self.manager.store.events(kinds=[kind] if kind else None, limit=1000)
        return [f"{e.server}: {e.summary}" for e in reversed(events)]


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    return Lab(tmp_path)


def test_static_members_wait_for_a_healthy_report(lab: Lab) -> None:
    assert lab.step() is None  # nothing has reported: nothing published yet
    assert {lab.state(s) for s in ("s1", "s2", "s3")} == {ServerState.WARMING}
    lab.report_all(10)
    plan = lab.step()
    assert plan is not None
    assert lab.state("s1") is ServerState.ACTIVE
    assert lab.members() == {
        "s1": (MemberState.ACTIVE, 90.0, 60),
        "s2": (MemberState.ACTIVE, 90.0, 60),
        "s3": (MemberState.ACTIVE, 90.0, 60),
    }
    assert plan.pools[0].name == "www.example.test"
    assert plan.zones[0].soa.serial == plan.version
    assert "s1: warming -> active: reporting" in lab.events("state")
    written = json.loads((lab.tmp_path / "plan.json").read_text())
    assert written["version"] == plan.version


def test_without_reports_the_first_plan_waits_for_down_after(lab: Lab) -> None:
    lab.report("s1", 5)
    assert lab.step(1.0) is None  # s2 and s3 have not reported yet
    lab.report("s1", 5)
    plan = lab.step(2.5)  # down_after (3 s) since start has passed
    assert plan is not None
    # s2, s3 still warming: one server of k = 2 answers, with half of ttl_max's share above
    # ttl_min (5 + 55 / 2): a server added soon joins the answers soon
    assert lab.members() == {"s1": (MemberState.ACTIVE, 95.0, 32)}
    lab.report_all(5)
    lab.step()
    assert lab.members()["s1"] == (MemberState.ACTIVE, 95.0, 60)


def test_overload_pauses_a_server_and_it_comes_back(lab: Lab) -> None:
    lab.report_all(10)
    lab.step()
    lab.report("s2", 90)  # above th_over 0.8
    lab.step()
    assert lab.members()["s2"][0] is MemberState.PAUSED
    assert "s2: utilization 0.90 > 0.80 (th_over 0.8)" in lab.events("paused")
    lab.report("s2", 75)  # inside the hysteresis band: stays paused
    lab.step()
    assert lab.members()["s2"][0] is MemberState.PAUSED
    lab.report("s2", 60)
    lab.step()
    assert lab.members()["s2"][0] is MemberState.ACTIVE
    assert lab.events("resumed") == ["s2: utilization 0.60 < 0.70"]


def test_a_hot_pool_pauses_nobody_and_a_warm_one_only_who_stands_out(lab: Lab) -> None:
    lab.report_all(10)
    lab.step()
    lab.report("s2", 95)  # the others have room: it pauses
    lab.step()
    assert lab.members()["s2"][0] is MemberState.PAUSED
    lab.report_all(90)  # the whole pool is hot (mean 0.9 >= th_over): pausing moves nothing
    lab.step()
    assert {state for state, _, _ in lab.members().values()} == {MemberState.ACTIVE}
    assert lab.events("resumed") == [
        "s2: the pool's mean utilization 0.90 is at th_over 0.8: a hot pool has no room to "
        "move clients to"
    ]
    lab.report("s1", 60)
    lab.report("s2", 85)
    lab.report("s3", 100)  # mean 0.817: still hot
    lab.step()
    assert lab.members()["s3"][0] is MemberState.ACTIVE
    for _ in range(3):
        lab.report("s1", 40)
        lab.report("s2", 85)  # above th_over, not above 1.25 x the mean (0.70 -> 0.875)
        lab.report("s3", 85)
        lab.step()
    assert lab.members()["s2"][0] is MemberState.ACTIVE
    lab.report("s3", 120)  # the mean rises to 0.817 with it: hot again, nobody pauses
    lab.step()
    assert lab.members()["s3"][0] is MemberState.ACTIVE
    lab.report("s1", 10)
    lab.report("s2", 10)
    lab.report("s3", 110)  # mean 0.43: it stands out, and the others have room
    lab.step()
    lab.report("s3", 110)
    lab.step()
    assert lab.members()["s3"][0] is MemberState.PAUSED
    assert lab.events("paused")[-1] == "s3: utilization 1.10 > 0.80 (th_over 0.8)"


def test_a_pause_needs_room_and_a_resumed_server_serves_the_dwell_time(tmp_path: Path) -> None:
    lab = Lab(tmp_path, CONFIG.replace("pause_dwell: 0", "pause_dwell: 10"))

    def tick(s1: int, s2: int, s3: int, seconds: int = 1) -> None:
        for _ in range(seconds):
            lab.report("s1", s1)
            lab.report("s2", s2)
            lab.report("s3", s3)
            lab.step()

    tick(60, 95, 60)  # s2 stands out (0.95 > 1.25 x 0.72), but s1 and s3 would take 2.15
    assert lab.members()["s2"][0] is MemberState.ACTIVE
    tick(10, 95, 10)  # they could take 1.15 (0.575 each, below th_over)
    assert lab.members()["s2"][0] is MemberState.PAUSED
    tick(10, 10, 10)  # cool: it resumes at once
    assert lab.members()["s2"][0] is MemberState.ACTIVE
    tick(10, 95, 10, seconds=9)  # hot again, but resumed 9 s ago
    assert lab.members()["s2"][0] is MemberState.ACTIVE
    tick(10, 95, 10)
    assert lab.members()["s2"][0] is MemberState.PAUSED
    assert len(lab.events("paused")) == 2
    assert len(lab.events("resumed")) == 1


def test_ttl_shortens_and_weight_falls_as_load_rises(lab: Lab) -> None:
    lab.report_all(10)
    lab.step()
    seen = []
    for in_progress in (20, 50, 60, 70, 79):
        lab.report("s1", in_progress)
        lab.step()
        _, weight, ttl = lab.members()["s1"]
        seen.append((weight, ttl))
    weights = [w for w, _ in seen]
    ttls = [t for _, t in seen]
    assert weights == sorted(weights, reverse=True)
    assert ttls == sorted(ttls, reverse=True)
    assert ttls[0] == 60 and ttls[-1] < 10


def test_a_silent_agent_takes_its_server_down_and_back(lab: Lab) -> None:
    lab.report_all(10)
    lab.step()
    for _ in range(3):  # s1 and s2 keep reporting, s3 is silent
        lab.report("s1", 10)
        lab.report("s2", 10)
        lab.step(1.1)
    assert lab.state("s3") is ServerState.DOWN
    assert lab.members()["s3"][0] is MemberState.DOWN
    assert any(e.startswith("s3: active -> down: no report for") for e in lab.events("state"))
    lab.report("s3", 10)
    lab.step()
    assert lab.state("s3") is ServerState.ACTIVE


def test_a_broken_source_takes_the_server_down(lab: Lab) -> None:
    lab.report_all(10)
    lab.step()
    lab.report("s1", None, error="nginx: connection refused")
    lab.step()
    assert lab.state("s1") is ServerState.DOWN
    assert "s1: active -> down: agent reports: nginx: connection refused" in lab.events("state")


@pytest.mark.parametrize(
    ("token", "body", "status", "reason"),
    [
        pytest.param(None, {"server_id": "s1"}, 401, "bad_token", id="no-token"),
        pytest.param("wrong", {}, 401, "bad_token", id="wrong-token-unknown-server"),
        pytest.param(TOKEN, "not json", 400, "malformed", id="not-json"),
        pytest.param(TOKEN, {"server_id": "s1", "seq": -1}, 422, "invalid", id="invalid"),
        pytest.param(TOKEN, {"server_id": "nope"}, 404, "unknown_server", id="unknown"),
        pytest.param("wrong", {"server_id": "s1"}, 401, "bad_token", id="wrong-token"),
        pytest.param(TOKEN, {"server_id": "s3"}, 401, "bad_token", id="s3-needs-its-own"),
        pytest.param(TOKEN, {"server_id": "s1", "seq": 5}, 409, "stale_seq", id="stale-seq"),
        pytest.param(TOKEN, {"in_progress": -3}, 422, "invalid", id="negative-in-progress"),
        pytest.param(TOKEN, {"max_concurrency": 0}, 422, "invalid", id="zero-capacity"),
    ],
)
def test_bad_reports_are_rejected_and_counted(
    lab: Lab, token: str | None, body: Any, status: int, reason: str
) -> None:
    lab.report("s1", 10)  # seq 1001 is now the newest for s1
    good = {"server_id": "s1", "seq": 2000, "time": 1.0, "in_progress": 1, "max_concurrency": 10}
    raw = body.encode() if isinstance(body, str) else json.dumps({**good, **body}).encode()
    with pytest.raises(Rejected) as caught:
        lab.manager.ingest.accept(token, raw)
    assert (caught.value.status, caught.value.reason) == (status, reason)
    assert lab.manager.ingest.counts[reason] == 1
    assert lab.manager.fleet.servers["s1"].report.seq == 1001  # type: ignore[union-attr]


def test_restart_keeps_state_and_waits_for_fresh_reports(lab: Lab) -> None:
    lab.report_all(10)
    first = lab.step()
    assert first is not None
    manager = lab.restart()
    assert lab.state("s1") is ServerState.ACTIVE  # continued from the store
    assert manager.version == first.version
    assert lab.step(0.5) is None  # nobody has reported since the restart
    lab.report("s1", 10)
    lab.report("s2", 10)
    assert lab.step(0.5) is None  # s3 still has not
    plan = lab.step(2.5)
    assert plan is not None and plan.version == first.version + 1
    members = lab.members()
    assert members["s1"][0] is MemberState.ACTIVE
    assert members["s3"][0] is not MemberState.ACTIVE  # never answered on old news


def test_unchanged_plans_are_republished_to_refresh_their_age(lab: Lab) -> None:
    lab.report_all(10)
    first = lab.step()
    assert first is not None
    assert lab.step(1.0) is None  # same contents, not due yet (refresh 5 s)
    lab.report_all(10)
    lab.step(2.0)
    lab.report_all(10)
    again = lab.step(3.0)
    assert again is not None
    assert again.version == first.version  # same contents, same version
    assert again.generated_at is not None and first.generated_at is not None
    assert again.generated_at > first.generated_at


def test_a_pool_is_published_again_only_when_its_answers_change(lab: Lab) -> None:
    lab.report_all(10)
    first = lab.step()
    assert first is not None
    lab.report_all(11)  # every weight 90 -> 89: the same shares of the cycle, the same TTLs
    assert lab.step() is None  # no client would see a change: no new plan
    assert lab.members()["s1"] == (MemberState.ACTIVE, 90.0, 60)  # as last published
    lab.report("s1", 40)  # s1's share of the cycle falls
    plan = lab.step()
    assert plan is not None and plan.version == first.version + 1
    assert lab.members()["s1"] == (MemberState.ACTIVE, 60.0, 60)
    assert lab.members()["s2"] == (MemberState.ACTIVE, 89.0, 60)  # a new plan takes all


@pytest.mark.parametrize("hold", [0.0, 0.1])
def test_with_hold_within_answers_near_the_published_ones_are_held(
    tmp_path: Path, hold: float
) -> None:
    lab = Lab(tmp_path, CONFIG.replace("share_gain: 0}", f"share_gain: 0, hold_within: {hold}}}"))
    lab.report_all(10)
    first = lab.step()
    assert first is not None
    lab.report("s1", 18)  # weight 90 -> 82: 2 % of the answers would move; the same TTL
    plan = lab.step()
    if hold:
        assert plan is None
        assert lab.members()["s1"] == (MemberState.ACTIVE, 90.0, 60)  # as published
    else:  # its share of the cycle moved: published again
        assert plan is not None and plan.version == first.version + 1
        assert lab.members()["s1"] == (MemberState.ACTIVE, 82.0, 60)
    lab.report("s1", 70)  # 90 -> 30: its share of the cycle 1/3 -> 1/7, 19 % of the answers
    plan = lab.step()
    assert plan is not None
    assert lab.members()["s1"] == (MemberState.ACTIVE, 30.0, 29)
    lab.report("s2", None, error="nothing listens")  # s2 is down: published at once
    plan = lab.step()
    assert plan is not None
    assert lab.members()["s2"][0] is MemberState.DOWN


def test_a_member_removed_from_the_config_is_terminated(lab: Lab, tmp_path: Path) -> None:
    lab.report_all(10)
    lab.step()
    lab.config_path.write_text(CONFIG.replace("      - {id: s2, address: 10.0.0.2}\n", ""))
    manager = lab.restart()
    assert "s2" not in manager.fleet.servers
    assert "s2: active -> terminated: no longer in the configuration" in lab.events("state")


def test_a_failing_tick_is_logged_and_the_manager_goes_on(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Plan | None:
        raise RuntimeError("boom")

    lab.manager.tick = broken  # type: ignore[method-assign]
    lab.manager._safe_tick()
    assert lab.manager.tick_errors == 1
    assert "tick failed" in caplog.text


@pytest.mark.parametrize(
    ("replace", "problem"),
    [
        ("zone: example.test\n    policy", "zone: example.org\n    policy"),
        ("{id: s2, address: 10.0.0.2}", "{id: s1, address: 10.0.0.2}"),
        ("address: 10.0.0.1}", "address: ten}"),
        ("down_after: 3", "down_after: three"),
        ("content: 127.0.0.1}", "content: 127.0.0.1, tll: 5}"),
    ],
)
def test_config_problems_are_reported_with_lines(
    tmp_path: Path, replace: str, problem: str
) -> None:
    path = tmp_path / "manager.yaml"
    path.write_text(CONFIG.replace(replace, problem))
    with pytest.raises(ConfigError) as caught:
        load_manager_config(path)
    assert all(", line " in p for p in caught.value.problems), caught.value.problems


def test_bad_zone_records_are_refused_at_start(tmp_path: Path) -> None:
    lab_config = CONFIG.replace(
        "{name: ns1, type: A, content: 127.0.0.1}", "{name: ns1, type: A, content: nowhere}"
    )
    with pytest.raises(ConfigError, match=r"zones\[0\]\.records\[0\]\.content"):
        Lab(tmp_path, lab_config)


CLUSTER_CONFIG = """
zones: [{name: example.test, ns: [ns1.example.test]}]
auth: {agent_token: env:DNSLB_TEST_AGENT_TOKEN}
down_after: 3
clusters:
  - name: vip-1
    vip: 10.9.0.1
    seed: 4242
    failover_after: 0.3
    nodes:
      - {id: n1, agent_url: "http://127.0.0.1:1", token: env:DNSLB_TEST_NODE_TOKEN}
      - {id: n2, agent_url: "http://127.0.0.1:2", token: env:DNSLB_TEST_NODE_TOKEN}
pools:
  - name: www
    zone: example.test
    policy: {slow_start: 0, smoothing: 0}
    members:
      - {id: s1, address: 10.0.0.1}
      - {id: vip-1, address: 10.9.0.1, cluster: vip-1}
"""


def test_a_cluster_member_carries_its_nodes_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node_token = "node-secret-0123456789abcdef"
    monkeypatch.setenv("DNSLB_TEST_NODE_TOKEN", node_token)
    lab = Lab(tmp_path, CLUSTER_CONFIG)

    def heartbeat(node: str, in_progress: int, token: str = node_token) -> None:
        lab.seq[node] = lab.seq.get(node, 0) + 1
        body = {
            "server_id": node,
            "seq": lab.seq[node],
            "time": lab.clock.time(),
            "in_progress": in_progress,
            "max_concurrency": 100,
            "table": {"cluster": "vip-1", "version": 0},
        }
        lab.manager.ingest.accept(token, json.dumps(body).encode())

    for _ in range(3):
        lab.report("s1", 10)
        heartbeat("n1", 30)
        heartbeat("n2", 50)
        lab.step(0.1)
    members = {m.id: m for m in lab.manager.plan.pools[0].members}  # type: ignore[union-attr]
    assert members["vip-1"].state is MemberState.ACTIVE
    assert members["vip-1"].utilization == pytest.approx(0.4)  # 80 of 200 over both nodes
    with pytest.raises(Rejected) as caught:
        heartbeat("n1", 10, token=TOKEN)  # the agent token is not a node's token
    assert caught.value.status == 401
    lab.report("s1", 10)
    lab.step(1.0)  # the nodes fall silent: no node alive, so the member is down
    assert lab.state("vip-1") is ServerState.DOWN
    assert (
        "no node of cluster vip-1 is alive"
        in lab.manager.fleet.servers["vip-1"].record.state_reason
    )


def test_a_cluster_member_is_bounded_by_its_nodes_not_by_its_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster's capacity is its nodes' (each node's at most its configured max_concurrency):
    many times a single server's, which the pool's capacity_spread must not cut."""
    node_token = "node-secret-0123456789abcdef"
    monkeypatch.setenv("DNSLB_TEST_NODE_TOKEN", node_token)
    config = CLUSTER_CONFIG.replace(
        '{id: n1, agent_url: "http://127.0.0.1:1",',
        '{id: n1, max_concurrency: 500, agent_url: "http://127.0.0.1:1",',
    )
    assert "max_concurrency: 500" in config
    lab = Lab(tmp_path, config)
    for seq in range(1, 4):
        lab.report("s1", 10)
        for node in ("n1", "n2"):
            body = {
                "server_id": node,
                "seq": seq,
                "time": lab.clock.time(),
                "in_progress": 0,
                "max_concurrency": 1000,
                "table": {"cluster": "vip-1", "version": 0},
            }
            lab.manager.ingest.accept(node_token, json.dumps(body).encode())
        lab.step(0.1)
    assert lab.manager.fleet.servers["vip-1"].max_concurrency == 1500  # n1 500, n2 1000
    assert lab.manager.fleet.servers["s1"].max_concurrency == 100


def test_cluster_config_mistakes_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNSLB_TEST_NODE_TOKEN", "x" * 32)
    path = tmp_path / "manager.yaml"
    path.write_text(
        CLUSTER_CONFIG.replace("address: 10.9.0.1, cluster", "address: 10.9.0.2, cluster")
    )
    with pytest.raises(ConfigError, match=r"but cluster .vip-1. has vip 10\.9\.0\.1"):
        load_manager_config(path)


def test_a_server_that_starts_serving_later_ramps_up_over_slow_start(tmp_path: Path) -> None:
    # Found by the simulator running the real manager: plans were built with a wall time of 0,
    # so every member was "serving for" minus fifty years and stuck at the slow start's floor
    # (1/20 of its weight, alike for all): a new server got its full share at once.
    lab = Lab(tmp_path, CONFIG.replace("slow_start: 0", "slow_start: 30"))
    lab.report("s1", 10)
    lab.report("s2", 10)
    lab.step()
    for _ in range(40):
        lab.report("s1", 10)
        lab.report("s2", 10)
        lab.step()
    lab.report_all(10)
    lab.step()
    weights = {server: weight for server, (_, weight, _) in lab.members().items()}
    assert weights["s1"] == weights["s2"] == 90.0  # serving for 40 s: past the ramp
    assert 0.05 * 90.0 <= weights["s3"] <= 90.0 / 15  # serving for 0-1 s of 30
    for _ in range(15):
        lab.report_all(10)
        lab.step()
    assert lab.members()["s3"][1] == pytest.approx(45.0, abs=3.5)  # half way up the ramp


def test_the_share_correction_takes_weight_from_a_server_that_stays_busier(
    tmp_path: Path,
) -> None:
    lab = Lab(
        tmp_path,
        CONFIG.replace("share_gain: 0}", "share_gain: 0.1, share_bound: 2}"),
    )
    loads = {"s1": 60, "s2": 40, "s3": 20}  # mean 0.4: nobody pauses (th_over 0.8)

    def tick() -> None:
        for server, in_progress in loads.items():
            lab.report(server, in_progress)
        lab.step()

    for _ in range(11):  # the first tick starts the integral; ten seconds of it follow
        tick()
    shares = {server.id: server.share for server in lab.manager.fleet.servers.values()}
    assert shares == pytest.approx({"s1": -0.2, "s2": 0.0, "s3": 0.2})
    members = lab.members()
    # spare weights (100 x (1 - u)) times the corrections, rounded as plans carry them
    assert members["s1"][1] == pytest.approx(round(40 * math.exp(-0.2), 2))
    assert members["s3"][1] == pytest.approx(round(80 * math.exp(0.2), 2))

    views = {view.id: view for view in Control(lab.manager).servers()}
    assert views["s1"].share_correction == pytest.approx(math.exp(-0.2))
    assert views["s1"].delivered_share == pytest.approx(0.5)  # 60 of 120 in progress
    total = sum(members[s][1] for s in members)
    assert views["s3"].intended_share == pytest.approx(members["s3"][1] / total)

    for _ in range(60):  # bounded at share_bound
        tick()
    assert lab.manager.fleet.servers["s1"].share == pytest.approx(-math.log(2))
    assert lab.members()["s1"][1] == 20.0

    # A server that leaves the answers (down: no reports) starts again from none; the others
    # go on among themselves.
    del loads["s3"]
    for _ in range(4):
        tick()
    assert lab.state("s3") is ServerState.DOWN
    assert lab.manager.fleet.servers["s3"].share == 0.0
    s1, s2 = (lab.manager.fleet.servers[s].share for s in ("s1", "s2"))
    assert s1 + s2 == pytest.approx(0.0)  # centred again, over the two
    assert s1 < s2 < math.log(2)


def test_a_restarted_manager_reads_its_share_corrections_back_from_the_published_plan(
    tmp_path: Path,
) -> None:
    lab = Lab(tmp_path, CONFIG.replace("share_gain: 0}", "share_gain: 0.1, share_bound: 2}"))
    loads = {"s1": 60, "s2": 40, "s3": 20}

    def tick() -> None:
        for server, in_progress in loads.items():
            lab.report(server, in_progress)
        lab.step()

    for _ in range(11):
        tick()
    before = {server.id: server.share for server in lab.manager.fleet.servers.values()}
    weights = {server: weight for server, (_, weight, _) in lab.members().items()}
    assert before == pytest.approx({"s1": -0.2, "s2": 0.0, "s3": 0.2})

    lab.restart()  # the same plan file: what a standby taking over reads too
    assert all(server.share == 0.0 for server in lab.manager.fleet.servers.values())
    tick()  # the first plan of the new manager: the same loads, the same weights
    after = {server.id: server.share for server in lab.manager.fleet.servers.values()}
    assert after == pytest.approx(before, abs=1e-3)  # weights carry hundredths
    assert {server: weight for server, (_, weight, _) in lab.members().items()} == weights

    lab.restart()
    lab.manager._inherited.clear()  # a manager that found no plan starts from none
    tick()
    assert all(server.share == 0.0 for server in lab.manager.fleet.servers.values())


def test_the_manager_command_moves_its_loaded_state_out_of_the_collectors_sight() -> None:
    threshold = gc.get_threshold()
    before = gc.get_freeze_count()
    kept = [[n] for n in range(1000)]  # containers alive now: frozen with the rest
    try:
        tune_collector()
        assert gc.get_freeze_count() >= before + len(kept)
        assert gc.get_threshold() == (_YOUNG_THRESHOLD, *threshold[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_held_answers_count_the_resolvers_holding_a_pools_answers() -> None:
    held = HeldAnswers()
    assert held.holders() is None
    for second in range(0, 21):  # 3 resolvers hold A answers, 1 an AAAA answer
        held.observe(100.0 + second, {"A": 3 * second, "AAAA": second})
        assert (held.holders() is None) == (second < 20)  # known once 20 s are counted
    assert held.holders() == pytest.approx(3.0)
    for second in range(21, 200):  # then 10 hold A answers: the window forgets the 3
        held.observe(100.0 + second, {"A": 60 + 10 * (second - 20), "AAAA": second})
    assert held.holders() == pytest.approx(10.0)
    held.observe(300.0, {"A": 5})  # a pipe backend restarted: its counts start again
    assert held.holders() is None
    empty = HeldAnswers()
    for second in range(30):  # no pipe backend counted any
        empty.observe(float(second), {})
    assert empty.holders() is None


def _write_held(lab: Lab, name: str, held: object) -> None:
    stats = lab.tmp_path / ".plan.json.stats"
    (stats / f"{name}.json").write_text(json.dumps({"held": held}))


def test_k_rises_while_few_resolvers_hold_the_pools_answers(lab: Lab) -> None:
    lab.report_all()
    lab.step()
    assert lab.manager.plan is not None and lab.manager.plan.pools[0].k == 2
    # One resolver holds the answers (a second of answers given every second): k = 2 answers
    # cover 3 servers 0.67 times, under k_coverage 3: every address.
    for second in range(25):
        _write_held(lab, "p1", {"www.example.test": {"A": [second, second]}})
        lab.report_all()
        lab.step()
    plan = lab.manager.plan
    assert plan is not None and plan.pools[0].k == 3
    assert lab.manager.fleet.pools["www"].held.holders() == pytest.approx(1.0, rel=0.05)
    # and its users move with each expiry of that one answer: the TTL floor is 1 s, not 5
    assert plan.pools[0].ttl_floor == 1
    [view] = Control(lab.manager).pools()
    assert (view.answer_k, view.ttl_floor) == (3, 1)
    # Then 20 resolvers do: k is the pool's again once the window (60 s) has passed.
    for second in range(25, 100):
        total = 25 + 20 * (second - 25)
        _write_held(lab, "p1", {"www.example.test": {"A": [second, total]}})
        lab.report_all()
        lab.step()
    plan = lab.manager.plan
    assert plan is not None and (plan.pools[0].k, plan.pools[0].ttl_floor) == (2, 5)


def test_junk_answers_held_are_skipped(lab: Lab) -> None:
    lab.report_all()
    lab.step()
    junk: list[object] = [
        ["www.example.test"],
        {"www.example.test": ["A", 1, 2]},
        {"www.example.test": {"A": [1, -5], "AAAA": [1, 1e400]}},
        {"www.example.test": {"A": [True, 5], "AAAA": [1, 10**400]}},
        {"other.example.test": {"A": [1, 5]}},  # not a pool of this manager
        {"www.example.test": {"MX": [1, 5], "A": [2, 7]}},
    ]
    for index, held in enumerate(junk):
        _write_held(lab, f"p{index}", held)
    lab.step()
    assert lab.manager.answers_held() == {"www.example.test": {"A": 7}}
