"""Server lifecycle on a fake clock with the in-memory provider: launch, warm up, drain, cost,
reconcile after restarts and crashes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from dnslb.clock import FakeClock
from dnslb.model import ServerState
from dnslb.plan import MemberState
from manager.config import load_manager_config
from manager.lifecycle import server_cost
from manager.providers.base import LaunchRequest
from manager.providers.memory import MemoryProvider
from manager.service import Manager

CONFIG = """
zones: [{name: example.test, ns: [ns1.example.test]}]
down_after: 3
plan: {refresh: 5, stale_after: 30}
pools:
  - name: www
    zone: example.test
    policy: {k: 4, ttl_max: 20, ttl_min: 5, slow_start: 0, smoothing: 0}
    provider: {type: memory, boot_time: 5}
    scaling:
      {min_servers: 1, max_servers: 4, th_high: 0.7, th_low: 0.3, window: 5,
       scale_in_window: 20, boot_time: 5, max_step: 2, server_capacity: 100}
    lifecycle: {warming_timeout: 30, drain_timeout: 60, describe_interval: 1,
                reconcile_interval: 1000, max_failed_launches: 2, launch_backoff: 100}
"""


class Lab:
    def __init__(self, tmp_path: Path, config: str = CONFIG) -> None:
        self.path = tmp_path / "manager.yaml"
        self.path.write_text(config)
        self.clock = FakeClock()
        self.seq = 1000
        self.manager = Manager(load_manager_config(self.path), clock=self.clock)

    @property
    def provider(self) -> MemoryProvider:
        provider = self.manager.lifecycles["www"].provider
        assert isinstance(provider, MemoryProvider)
        return provider

    async def restart(self) -> None:
        """The manager process ends (its tasks with it) and a new one starts; the cloud
        account, with the servers in it, outlives it."""
        account = self.provider.account
        await self.manager.close()
        self.manager = Manager(load_manager_config(self.path), clock=self.clock)
        self.provider.account = account

    def servers(self, *states: ServerState) -> list[str]:
        return sorted(
            s.id for s in self.manager.fleet.servers.values() if not states or s.state in states
        )

    def report(self, in_progress: int, served: int | None = None, draining: int = 0) -> None:
        """Every running server's agent reports ``in_progress`` of 100 (``draining`` for the
        draining ones: their clients are leaving)."""
        self.seq += 1
        tokens = self.provider.agent_tokens
        for server in self.manager.fleet.servers.values():
            if server.state not in (ServerState.WARMING, ServerState.ACTIVE, ServerState.DRAINING):
                continue
            if server.id not in tokens:
                continue  # its machine is gone: nothing reports for it
            body: dict[str, Any] = {
                "server_id": server.id,
                "seq": self.seq,
                "time": self.clock.time(),
                "in_progress": draining if server.state is ServerState.DRAINING else in_progress,
                "max_concurrency": 100,
            }
            if served is not None:
                body["served_total"] = served
            self.manager.ingest.accept(tokens[server.id], json.dumps(body).encode())

    async def run(
        self,
        seconds: int,
        load: Callable[[float], int] | int,
        served: bool = False,
        draining: int = 0,
    ) -> None:
        for second in range(seconds):
            value = load(self.clock.now) if callable(load) else load
            self.report(value, served=second * 10 if served else None, draining=draining)
            self.clock.advance(1)
            self.manager.tick()
            await self.manager.settle()

    def events(self, kind: str) -> list[str]:
        return [
            f"{e.server}: {e.summary}"
            for e in reversed(self.manager.store.events(kinds=[kind], limit=500))
        ]


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_min_servers_are_launched_and_become_active(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path)
        await lab.run(1, 0)
        assert lab.servers() == []  # the first tick looks at what the provider runs, first
        await lab.run(1, 0)
        [server] = lab.servers()
        assert lab.manager.fleet.servers[server].state is ServerState.LAUNCHING  # boots 5 s
        assert "min_servers is 1" in lab.events("server_added")[0]
        await lab.run(5, 0)  # boots in 5 s
        assert lab.manager.fleet.servers[server].state in (ServerState.WARMING, ServerState.ACTIVE)
        await lab.run(2, 10)
        assert lab.servers(ServerState.ACTIVE) == [server]
        plan = lab.manager.plan
        assert plan is not None
        assert [m.id for m in plan.pools[0].members if m.state is MemberState.ACTIVE] == [server]
        states = [e for e in lab.events("state") if e.startswith(server)]
        assert any("launching -> warming: running at 10.99.0." in e for e in states)
        assert any("warming -> active" in e for e in states)

    run(scenario)


def test_scale_out_under_load_and_in_when_it_drops(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path)
        await lab.run(10, 10)
        assert len(lab.servers(ServerState.ACTIVE)) == 1
        await lab.run(30, 95)  # one server at 0.95: launch
        assert len(lab.servers(ServerState.ACTIVE)) >= 2
        launched = lab.events("server_added")
        assert any("mean utilization" in e for e in launched)
        peak = len(lab.servers(ServerState.ACTIVE))
        await lab.run(200, 2)
        assert len(lab.servers(ServerState.ACTIVE)) < peak
        drained = [e for e in lab.events("state") if "active -> draining: scale in" in e]
        terminated = [e for e in lab.events("state") if "draining -> terminated: drained" in e]
        assert drained and len(terminated) == len(drained)
        assert all(f"terminate {r}" for r in lab.provider.calls if r.startswith("terminate"))

    run(scenario)


def test_a_draining_server_waits_for_ttls_and_requests(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path, CONFIG.replace("min_servers: 1", "min_servers: 2"))
        await lab.run(10, 10)
        lifecycle = lab.manager.lifecycles["www"]
        victim = lab.manager.fleet.servers[lab.servers(ServerState.ACTIVE)[0]]
        ref = victim.record.provider_ref
        lifecycle.drain(victim, "test drain", lab.clock.time())
        answered_until = victim.record.data["answered_until"]
        assert answered_until > lab.clock.time()  # TTL 20 s handed out just now
        drain_started = lab.clock.time()
        await lab.run(5, 10, draining=10)  # still requests in progress, TTLs not expired
        assert victim.state is ServerState.DRAINING
        plan = lab.manager.plan
        assert plan is not None
        assert {m.id: m.state for m in plan.pools[0].members}[victim.id] is MemberState.DRAINING
        while lab.clock.time() < answered_until + 2:
            await lab.run(1, 3, draining=3)  # TTLs expire, but 3 requests still in progress
        assert victim.state is ServerState.DRAINING
        await lab.run(2, 0)
        assert victim.state is ServerState.TERMINATED
        assert f"terminate {ref}" in lab.provider.calls
        waited = victim.record.terminated_at - drain_started  # type: ignore[operator]
        assert waited >= answered_until - drain_started

    run(scenario)


def test_a_restarted_manager_does_not_take_a_draining_server_for_silent(tmp_path: Path) -> None:
    # Found by the simulator's fault suite: a manager restarted while a server drained had no
    # report of it yet at its first tick, counted its agent as silent (drained) and terminated
    # it with requests still in progress.
    async def scenario() -> None:
        lab = Lab(tmp_path, CONFIG.replace("min_servers: 1", "min_servers: 2"))
        await lab.run(10, 10)
        victim_id = lab.servers(ServerState.ACTIVE)[0]
        victim = lab.manager.fleet.servers[victim_id]
        lab.manager.lifecycles["www"].drain(victim, "test drain", lab.clock.time())
        answered_until = victim.record.data["answered_until"]
        while lab.clock.time() < answered_until + 1:
            await lab.run(1, 3, draining=3)  # TTLs expire; 3 requests still in progress
        await lab.restart()
        for _ in range(2):  # ticks before the agents find the new manager
            lab.clock.advance(1)
            lab.manager.tick()
            await lab.manager.settle()
        assert lab.manager.fleet.servers[victim_id].state is ServerState.DRAINING
        await lab.run(2, 3, draining=3)  # it reports: still busy
        assert lab.manager.fleet.servers[victim_id].state is ServerState.DRAINING
        await lab.run(2, 3, draining=0)
        assert victim_id not in lab.manager.fleet.servers  # drained now: terminated

    run(scenario)


def test_a_drain_times_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path, CONFIG.replace("drain_timeout: 60", "drain_timeout: 25"))
        await lab.run(8, 10)
        victim = lab.manager.fleet.servers[lab.servers(ServerState.ACTIVE)[0]]
        lab.manager.lifecycles["www"].drain(victim, "test drain", lab.clock.time())
        await lab.run(30, 50, draining=50)  # requests never reach 0
        assert victim.state is ServerState.TERMINATED
        assert "drain timeout after" in victim.record.state_reason

    run(scenario)


def test_failed_launches_are_events_and_pause_launching(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path, CONFIG.replace("boot_time: 5}", "boot_time: 5, fail_launches: 5}"))
        await lab.run(5, 0)
        failures = lab.events("launch_failed")
        assert len(failures) == 2
        assert "memory provider told to fail" in failures[0]
        assert lab.events("scaling_paused")
        assert lab.servers(ServerState.LAUNCHING, ServerState.WARMING, ServerState.ACTIVE) == []

    run(scenario)


def test_failing_launches_pause_even_while_an_older_server_runs(tmp_path: Path) -> None:
    # The running server became active before the failures: it is no evidence that launches
    # work, so it must not reset the count of failures in a row (it used to, every tick).
    async def scenario() -> None:
        lab = Lab(tmp_path, CONFIG.replace("max_step: 2", "max_step: 1"))  # one launch a tick
        await lab.run(8, 10)
        assert len(lab.servers(ServerState.ACTIVE)) == 1
        lab.provider.failures_left = 10
        await lab.run(30, 95)  # overloaded: it keeps trying to scale out
        # max_failed_launches (2), a pause of 15 s, 2 more, a pause of 30 s (still on at 30 s)
        assert len(lab.events("launch_failed")) == 4
        paused = lab.events("scaling_paused")
        assert [event.split("no launches for ")[1] for event in paused] == ["15 s", "30 s"]
        assert len(lab.servers(ServerState.ACTIVE)) == 1

    run(scenario)


def test_a_server_that_never_reports_is_replaced(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path)
        await lab.run(2, 0)  # a reconcile, then a launch
        [first] = lab.servers()
        for _ in range(40):  # it boots but its agent never reports
            lab.clock.advance(1)
            lab.manager.tick()
            await lab.manager.settle()
        assert any(
            e.startswith(f"{first}: no healthy report within 30 s")
            for e in lab.events("launch_failed")
        )
        assert first not in lab.manager.fleet.servers
        assert len(lab.servers(ServerState.LAUNCHING, ServerState.WARMING)) == 1  # a replacement

    run(scenario)


def test_cost_is_server_seconds_and_requests_served(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path)
        started = lab.clock.time()
        await lab.run(20, 10, served=True)
        [server] = lab.servers(ServerState.ACTIVE)
        runtime = lab.manager.fleet.servers[server]
        assert server_cost(runtime.record, lab.clock.time()) == pytest.approx(
            lab.clock.time() - started - 1, abs=1.5
        )
        assert runtime.served > 100  # the agent's counter rose by 10 per second

    run(scenario)


def test_restart_resumes_a_cut_launch_and_forgets_a_vanished_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path)
        await lab.run(2, 0)  # a reconcile, then a launch
        [booting] = lab.servers(ServerState.LAUNCHING)
        # The manager dies while the server boots; meanwhile someone deletes nothing.
        await lab.restart()
        await lab.run(8, 0)
        assert lab.manager.fleet.servers[booting].state in (ServerState.WARMING, ServerState.ACTIVE)
        # Now the instance vanishes behind the manager's back, and it restarts again.
        lab.provider.machines.clear()
        await lab.restart()
        await lab.run(1, 0)
        assert any(
            e.startswith(f"{booting}:") and "its instance no longer exists" in e
            for e in lab.events("state")
        )

    run(scenario)


def test_reconcile_terminates_unknown_instances_and_recovers_unrecorded_launches(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path)
        await lab.run(8, 10)
        # An instance of this pool that the state does not know (say, from a crashed manager
        # whose database was lost), and a recorded launch whose provider call never happened.
        stray = await lab.provider.launch(
            LaunchRequest(server_id="www-stray", pool="www", agent_token="t", manager_url="")
        )
        lifecycle = lab.manager.lifecycles["www"]
        await lifecycle.reconcile()
        await lab.manager.settle()
        assert stray.ref not in lab.provider.machines
        assert any(f"terminating {stray.ref}" in e for e in lab.events("unknown_instance"))

    run(scenario)


def test_reconcile_can_adopt_unknown_instances(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(
            tmp_path,
            CONFIG.replace("launch_backoff: 100}", "launch_backoff: 100, adopt_unknown: true}"),
        )
        await lab.run(8, 10)
        stray = await lab.provider.launch(
            LaunchRequest(server_id="www-stray", pool="www", agent_token="t", manager_url="")
        )
        lab.clock.advance(10)
        await lab.manager.lifecycles["www"].reconcile()
        assert lab.manager.fleet.servers["www-stray"].state is ServerState.WARMING
        assert stray.ref in lab.provider.machines

    run(scenario)


def test_reconcile_leaves_a_booting_server_alone(tmp_path: Path) -> None:
    """A reconcile while a server boots sees its instance: it is the server's, not unknown."""

    async def scenario() -> None:
        lab = Lab(tmp_path, CONFIG.replace("reconcile_interval: 1000", "reconcile_interval: 1"))
        await lab.run(12, 10)  # boots in 5 s, with a reconcile every second meanwhile
        [server] = lab.servers(ServerState.ACTIVE)
        assert lab.events("unknown_instance") == []
        assert not [call for call in lab.provider.calls if call.startswith("terminate")]
        assert lab.manager.fleet.servers[server].record.provider_ref in lab.provider.machines

    run(scenario)


def test_reconcile_does_not_judge_a_server_on_a_listing_older_than_its_launch(
    tmp_path: Path,
) -> None:
    """A listing taken before a launch finished must not make the launched server vanish."""

    async def scenario() -> None:
        lab = Lab(tmp_path)
        await lab.run(1, 10)  # the first reconcile: nothing runs yet
        provider = lab.provider

        async def stale_list_owned() -> list[Any]:
            await lab.clock.sleep(7)  # a slow, paginated, throttled listing...
            return []  # ...taken before the launch below

        provider.list_owned = stale_list_owned  # type: ignore[method-assign]
        lab.manager.lifecycles["www"].next_reconcile = float("-inf")  # reconcile again now
        await lab.run(10, 10)  # launched now, runs at 5 s; the stale listing returns at 7 s
        [server] = lab.servers(ServerState.WARMING, ServerState.ACTIVE)
        assert lab.manager.fleet.servers[server].record.provider_ref in provider.machines
        assert not [e for e in lab.events("state") if "no longer exists" in e]

    run(scenario)


def test_a_failing_termination_is_retried_with_backoff(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path, CONFIG.replace("boot_time: 5}", "boot_time: 5, fail_terminations: 3}"))
        await lab.run(8, 10)
        [victim_id] = lab.servers(ServerState.ACTIVE)
        victim = lab.manager.fleet.servers[victim_id]
        lab.manager.lifecycles["www"].drain(victim, "test", lab.clock.time())
        await lab.run(60, 0)
        failures = lab.events("terminate_failed")
        assert len(failures) == 3  # once per attempt, not once per tick
        assert "trying again in" in failures[0]
        assert victim.state is ServerState.TERMINATED
        attempts = [c for c in lab.provider.calls if c.startswith("terminate")]
        assert len(attempts) == 4  # three refusals, then done: 5 s, 10 s, 20 s apart

    run(scenario)


def test_a_launched_server_down_too_long_is_replaced(tmp_path: Path) -> None:
    async def scenario() -> None:
        lab = Lab(
            tmp_path,
            CONFIG.replace(
                "reconcile_interval: 1000", "reconcile_interval: 1000, replace_after: 10"
            ),
        )
        await lab.run(8, 10)
        [first] = lab.servers(ServerState.ACTIVE)
        # Its agent falls silent: down after 3 s, replaced 10 s later; a new one takes over.
        for _ in range(25):
            lab.clock.advance(1)
            lab.manager.tick()
            await lab.manager.settle()
        assert first not in lab.manager.fleet.servers
        assert any(
            e.startswith(f"{first}: down -> terminated: down for more than 10 s")
            for e in lab.events("state")
        )
        assert lab.servers(ServerState.LAUNCHING, ServerState.WARMING, ServerState.ACTIVE)

    run(scenario)


def test_a_provider_bug_fails_one_launch_and_nothing_is_stuck(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path, CONFIG.replace("boot_time: 5}", "boot_time: 5, broken_launches: 1}"))
        await lab.run(10, 10)
        [failure] = lab.events("launch_failed")
        assert "unexpected RuntimeError from the provider's launch" in failure
        assert len(lab.servers(ServerState.ACTIVE)) == 1  # the next launch worked

    run(scenario)
    assert "provider launch raised an unexpected error" in caplog.text


def test_reconcile_adopts_an_unknown_instance_that_is_still_booting(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = CONFIG.replace("launch_backoff: 100}", "launch_backoff: 100, adopt_unknown: true}")
        lab = Lab(tmp_path, config)
        await lab.run(8, 10)
        stray = await lab.provider.launch(
            LaunchRequest(server_id="www-booting", pool="www", agent_token="t", manager_url="")
        )
        await lab.manager.lifecycles["www"].reconcile()
        assert lab.manager.fleet.servers["www-booting"].state is ServerState.LAUNCHING
        for _ in range(8):  # boot_time 5 s
            lab.clock.advance(1)
            lab.manager.tick()
            await lab.manager.settle()
        assert lab.manager.fleet.servers["www-booting"].state is ServerState.WARMING
        assert stray.ref in lab.provider.machines

    run(scenario)


def test_a_manager_started_in_front_of_running_servers_adopts_them_and_launches_none(
    tmp_path: Path,
) -> None:
    # Found by the simulator: the autoscaler ran in the first tick, before the first reconcile
    # had listed the provider's servers, and launched for a pool it thought empty.
    async def scenario() -> None:
        lab = Lab(tmp_path, CONFIG.replace("reconcile_interval: 1000", "adopt_unknown: true"))
        running = await lab.provider.launch(
            LaunchRequest(server_id="www-running", pool="www", agent_token="t", manager_url="")
        )
        lab.clock.advance(5)  # it has booted
        await lab.run(3, 10)
        assert lab.servers() == ["www-running"]
        assert list(lab.provider.machines) == [running.ref]
        assert lab.events("scale_out") == []

    run(scenario)


def test_servers_that_never_become_healthy_pause_launching_too(tmp_path: Path) -> None:
    # A broken image: the cloud runs every server, none ever reports. Each warm-up timeout is a
    # failed launch, and max_failed_launches of them pause launching (they used to be counted
    # but never paused it, so a broken image was relaunched every warming_timeout for ever).
    async def scenario() -> None:
        config = CONFIG.replace("boot_time: 5}", "boot_time: 5, hung_launches: 100}")
        lab = Lab(tmp_path, config.replace("max_step: 2", "max_step: 1"))
        await lab.run(75, 10)
        assert len(lab.events("launch_failed")) == 2
        assert [e.split("no launches for ")[1] for e in lab.events("scaling_paused")] == ["15 s"]

    run(scenario)


def test_a_first_reconcile_that_hangs_holds_the_autoscaler_back_only_so_long(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        lab = Lab(tmp_path)
        hung: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()

        async def never() -> list[Any]:
            return await hung  # a cloud API that never answers

        lab.provider.list_owned = never  # type: ignore[method-assign]
        await lab.run(20, 0)
        assert lab.servers() == []  # it waits for its first look at the provider...
        await lab.run(12, 0)
        assert len(lab.servers()) == 1  # ...30 s at most: min_servers launched
        hung.cancel()

    run(scenario)
