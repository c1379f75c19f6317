"""Autoscaling per location: a pool per location (``answers_for``), each with its own provider
and autoscaler, answering one name. The real manager on a fake clock, launching through the
memory provider: a hot location scales out, a cold one does not, and the plan has one pool with
the members of both, each with its location."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dnslb.clock import FakeClock
from dnslb.errors import ConfigError
from dnslb.model import ServerState
from manager.config import load_manager_config
from manager.service import Manager
from tests.api_support import report_body, reporting_tokens, write_config

SCALING = (
    "{min_servers: 1, max_servers: 4, th_high: 0.7, th_low: 0.3, window: 2, "
    "scale_in_window: 60, boot_time: 1, max_step: 1, server_capacity: 100}"
)
LOCATIONS = f"""
  - name: web
    zone: example.test
    location: east
    policy: {{slow_start: 0, smoothing: 0}}
    provider: {{type: memory, boot_time: 0, network: 10.98.0}}
    scaling: {SCALING}
    lifecycle: {{describe_interval: 0.2}}
    networks:
      - {{network: 192.0.2.0/25, location: east}}
      - {{network: 192.0.2.128/25, location: west}}
  - name: web-west
    zone: example.test
    answers_for: web
    location: west
    policy: {{slow_start: 0, smoothing: 0}}
    provider: {{type: memory, boot_time: 0, network: 10.97.0}}
    scaling: {SCALING}
    lifecycle: {{describe_interval: 0.2}}
"""


def _config(directory: Path, extra: str = LOCATIONS) -> Path:
    path = write_config(directory)
    path.write_text(path.read_text() + extra)
    return path


async def _run(manager: Manager, clock: FakeClock, seconds: int, load: dict[str, int]) -> None:
    """``seconds`` ticks, every running server reporting its pool's load (requests of 100)."""
    for _ in range(seconds):
        second = int(clock.monotonic())
        for server_id, token in reporting_tokens(manager).items():
            pool = manager.fleet.servers[server_id].record.pool
            in_progress = load.get(pool, 0)
            manager.ingest.accept(token, report_body(server_id, second, in_progress, second))
        clock.advance(1)
        manager.tick()
        await manager.settle()


def _running(manager: Manager, pool: str) -> int:
    return sum(
        1
        for server in manager.fleet.servers.values()
        if server.record.pool == pool
        and server.state in (ServerState.LAUNCHING, ServerState.WARMING, ServerState.ACTIVE)
    )


def test_each_location_scales_on_its_own_load(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        manager = Manager(load_manager_config(_config(tmp_path)), clock=clock)
        try:
            await _run(manager, clock, 40, {})  # both locations get their min_servers
            assert (_running(manager, "web"), _running(manager, "web-west")) == (1, 1)
            await _run(manager, clock, 40, {"web": 95, "web-west": 10})  # the east is hot
            assert _running(manager, "web") > 1  # the hot location scaled out
            assert _running(manager, "web-west") == 1  # the cold one did not
            plan = manager.plan
            assert plan is not None
            [pool] = [p for p in plan.pools if p.name == "web.example.test"]
            assert "web-west.example.test" not in {p.name for p in plan.pools}
            locations = {m.id: m.location for m in pool.members}
            assert sorted(set(locations.values())) == ["east", "west"]
            for server in manager.fleet.servers.values():
                if server.record.pool == "web-west" and server.id in locations:
                    assert locations[server.id] == "west"
        finally:
            await manager.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        pytest.param("answers_for: web\n", "answers_for: nope\n", "no such other pool", id="none"),
        pytest.param(
            "answers_for: web\n", "answers_for: web-west\n", "no such other pool", id="itself"
        ),
        pytest.param(
            "    location: west\n", "    location: east\n", "already one of", id="same-location"
        ),
        pytest.param(
            "    location: west\n    policy: {slow_start: 0, smoothing: 0}",
            "    location: west\n    policy: {slow_start: 0, smoothing: 0, k: 2}",
            "policy must be the same",
            id="other-policy",
        ),
        pytest.param(
            "    location: west\n",
            "    location: west\n    networks: [{network: 10.0.0.0/8, location: west}]\n",
            "networks and geoip of 'web' apply",
            id="own-networks",
        ),
        pytest.param("    location: east\n", "", "needs a location too", id="lead-unlocated"),
    ],
)
def test_location_pool_mistakes_are_config_errors(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    assert old in LOCATIONS
    with pytest.raises(ConfigError, match=message):
        load_manager_config(_config(tmp_path, LOCATIONS.replace(old, new, 1)))


def test_k_counts_the_servers_of_every_pool_answering_at_the_name(tmp_path: Path) -> None:
    """``k_coverage`` covers what the name answers with: the lead pool's servers and those of
    the pools answering for it."""
    # (pools answering one name share its policy)
    config = LOCATIONS.replace("smoothing: 0}", "smoothing: 0, k: 1}")

    async def scenario() -> None:
        clock = FakeClock()
        manager = Manager(load_manager_config(_config(tmp_path, config)), clock=clock)
        try:
            await _run(manager, clock, 40, {})  # one server in each location
            assert (_running(manager, "web"), _running(manager, "web-west")) == (1, 1)
            for second in range(30):  # one resolver holds the name's answers
                held = {"web.example.test": {"A": [second, second]}}
                manager.publisher.write_stats("p1", {"written_at": 0, "held": held})
                await _run(manager, clock, 1, {})
            plan = manager.plan
            assert plan is not None
            # 1 address for 2 servers, held by 1 resolver: both addresses (the lead alone: 1)
            [web] = [pool for pool in plan.pools if pool.name == "web.example.test"]
            assert len(web.members) == 2
            assert web.k == 2
        finally:
            await manager.close()

    asyncio.run(scenario())
