"""The manager as the API sees it: views, runtime pools, admin actions (fake clock, in process)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dnslb.clock import FakeClock
from dnslb.control import AdminAction, Conflict, NotFound
from dnslb.errors import ConfigError
from dnslb.model import ServerState
from dnslb.plan import MemberState
from manager.config import load_manager_config
from manager.control import Control
from manager.service import Manager
from manager.state import Retired, ServerRecord

CONFIG = """
zones: [{name: example.test, ns: [ns1.example.test]}]
auth: {agent_token: env:DNSLB_TEST_AGENT_TOKEN}
down_after: 3
pools:
  - name: www
    zone: example.test
    policy: {k: 2, slow_start: 0, smoothing: 0}  # k = its servers: no TTL cap (a smaller pool)
    members:
      - {id: s1, address: 10.0.0.1}
      - {id: s2, address: 10.0.0.2}
"""
TOKEN = "agent-secret"


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DNSLB_TEST_AGENT_TOKEN", TOKEN)


class Lab:
    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "manager.yaml"
        self.path.write_text(CONFIG)
        self.clock = FakeClock()
        self.seq = 1000
        self.manager = Manager(load_manager_config(self.path), clock=self.clock)
        self.control = Control(self.manager)

    def restart(self) -> None:
        self.manager.store.close()
        self.manager = Manager(load_manager_config(self.path), clock=self.clock)
        self.control = Control(self.manager)

    def step(self, in_progress: int = 10) -> None:
        self.seq += 1
        for server in list(self.manager.fleet.servers.values()):
            body = {
                "server_id": server.id,
                "seq": self.seq,
                "time": 1.0,
                "in_progress": in_progress,
                "max_concurrency": 100,
                "served_total": self.seq,
            }
            self.manager.ingest.accept(TOKEN, json.dumps(body).encode())
        self.clock.advance(1)
        self.manager.tick()

    def answered(self, pool: str = "www") -> dict[str, MemberState]:
        plan = self.manager.plan
        assert plan is not None
        dns_name = self.manager.fleet.pools[pool].config.dns_name
        [found] = [p for p in plan.pools if p.name == dns_name]
        return {m.id: m.state for m in found.members}


def test_views_describe_pools_servers_and_the_plan(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    for _ in range(3):
        lab.step()
    [pool] = lab.control.pools()
    assert (pool.name, pool.dns_name, pool.source) == ("www", "www.example.test", "config")
    assert pool.servers == {"active": 2}
    assert pool.cost_seconds > 0
    assert pool.served >= 2
    assert pool.mean_ttl == 60
    server = lab.control.server("s1")
    assert server.state is ServerState.ACTIVE
    assert server.weight == 81.0 and server.ttl == 60  # spare_squared: 100 x (1 - 0.1)^2
    assert server.utilization == pytest.approx(0.1)
    plan = lab.control.plan()
    assert plan is not None and plan.plan.version >= 1
    assert lab.control.stats().reports["accepted"] == 6
    with pytest.raises(NotFound):
        lab.control.server("nope")


def test_servers_terminated_long_ago_are_pruned_and_their_pool_keeps_its_cost(
    tmp_path: Path,
) -> None:
    lab = Lab(tmp_path)
    lab.step()
    wall = lab.clock.time()
    store = lab.manager.store
    month = lab.manager.config.state.servers_max_age
    assert month == 30 * 86400  # the default
    for server_id, terminated_at in (("gone", wall - month - 60), ("recent", wall - 60)):
        store.save_server(
            ServerRecord(
                id=server_id,
                pool="www",
                address="10.0.0.9",
                origin="memory",
                state=ServerState.TERMINATED,
                state_reason="scale in",
                state_since=terminated_at,
                created_at=terminated_at - 3600,
                terminated_at=terminated_at,
                data={"served": 40},
            )
        )
    servers = lab.manager.fleet.servers
    [before] = lab.control.pools()
    assert before.served == 40 + 40 + servers["s1"].served + servers["s2"].served
    lab.clock.advance(61)  # a prune at most once a minute
    lab.step()
    assert sorted(r.id for r in store.load_servers_of("www")) == ["recent", "s1", "s2"]
    assert store.retired() == {"www": Retired(3600.0, 40)}
    [after] = lab.control.pools()
    assert after.cost_seconds == pytest.approx(before.cost_seconds + 2 * 62)  # s1, s2 ran on
    assert after.served == 40 + 40 + servers["s1"].served + servers["s2"].served


def test_admin_actions_win_over_the_policy_until_cleared(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path)
        lab.step()
        await lab.control.act("s1", AdminAction.PAUSE, "maintenance")
        lab.step()
        assert lab.answered()["s1"] is MemberState.PAUSED
        await lab.control.act("s1", AdminAction.RESUME, "")
        lab.step()
        assert lab.answered()["s1"] is MemberState.ACTIVE
        await lab.control.act("s2", AdminAction.DISABLE, "bad disk")
        lab.step()
        assert lab.answered()["s2"] is MemberState.DISABLED  # healthy reports do not bring it back
        with pytest.raises(Conflict):
            await lab.control.act("s1", AdminAction.ENABLE, "")  # not disabled
        await lab.control.act("s2", AdminAction.ENABLE, "disk replaced")
        lab.step()
        assert lab.answered()["s2"] is MemberState.ACTIVE
        await lab.control.act("s2", AdminAction.DRAIN, "retire")
        lab.step()
        assert lab.answered()["s2"] is MemberState.DRAINING
        reasons = [e.reason for e in lab.control.events(server="s2")]
        assert any("operator: bad disk" in r for r in reasons)
        lab.restart()  # admin flags and states survive
        assert lab.manager.fleet.servers["s2"].state is ServerState.DRAINING

    asyncio.run(scenario())


def test_pools_created_at_runtime_are_persisted_and_answered(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path)
        view = await lab.control.create_pool(
            {
                "name": "api",
                "zone": "example.test",
                "policy": {"k": 1, "slow_start": 0},
                "members": [{"id": "a1", "address": "10.1.0.1"}],
            }
        )
        assert (view.dns_name, view.source) == ("api.example.test", "api")
        for _ in range(2):
            lab.step()
        assert lab.answered("api") == {"a1": MemberState.ACTIVE}
        await lab.control.add_member("api", {"id": "a2", "address": "10.1.0.2"})
        lab.step()
        lab.step()
        assert set(lab.answered("api")) == {"a1", "a2"}
        await lab.control.update_pool(
            "api",
            {
                "zone": "example.test",
                "policy": {"k": 2},
                "members": [{"id": "a2", "address": "10.1.0.2"}],
            },
        )
        lab.step()
        assert set(lab.answered("api")) == {"a2"}
        lab.restart()
        assert lab.control.pool("api").spec["policy"]["k"] == 2
        await lab.control.delete_pool("api")
        lab.step()
        assert "api" not in {p.name for p in lab.control.pools()}
        lab.restart()
        assert "api" not in {p.name for p in lab.control.pools()}

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"name": "x", "zone": "example.org", "members": [{"id": "x1", "address": "10.2.0.1"}]},
            "zone",
        ),
        (
            {"name": "x", "zone": "example.test", "members": [{"id": "s1", "address": "10.2.0.1"}]},
            "members[0].id",
        ),
        (
            {"name": "x", "zone": "example.test", "members": [{"id": "x1", "address": "ten"}]},
            "address",
        ),
        ({"name": "x", "zone": "example.test", "policy": {"k": 0}, "members": []}, "policy.k"),
        ({"name": "x", "zone": "example.test", "colour": "red"}, "colour: unknown key"),
    ],
)
def test_invalid_pools_are_refused_with_the_field_named(
    tmp_path: Path, spec: dict[str, object], problem: str
) -> None:
    lab = Lab(tmp_path)
    with pytest.raises(ConfigError) as caught:
        asyncio.run(lab.control.create_pool(spec))
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_pools_from_the_file_are_changed_in_the_file(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    with pytest.raises(Conflict, match="change it there"):
        asyncio.run(lab.control.delete_pool("www"))
    with pytest.raises(Conflict):
        asyncio.run(lab.control.create_pool({"name": "www", "zone": "example.test", "members": []}))
