"""The metrics the shipped alerting rules read (``deploy/prometheus/dnslb.rules.yml``): each
follows what the manager does (publishes, refuses, fails, launches, fails over)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from api.app import create_app
from api.auth import ApiAuth, Role
from dnslb.control import AdminAction, ClusterTelemetry, Telemetry
from dnslb.plan import Plan
from manager.control import TICK_PARTS, Control
from manager.providers.base import Instance, LaunchRequest, ProviderError
from tests.api_support import READ, ApiLab, bearer
from tests.unit.test_api_metrics import Samples, parse, scrape, value
from tests.unit.test_clusters import Cluster


def run(tmp_path: Path, scenario: Callable[[ApiLab], Awaitable[None]]) -> None:
    async def main() -> None:
        lab = ApiLab(tmp_path)
        try:
            await scenario(lab)
        finally:
            await lab.close()

    asyncio.run(main())


def test_plan_members_by_state_and_the_plan_figures(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        before = await scrape(lab)
        assert "dnslb_pool_plan_members" not in before  # no plan yet: nothing to count
        assert "dnslb_plan_store_up" not in before  # nothing tried yet
        await lab.ready()
        await lab.step(seconds=3)  # the auto pool's first server launches and reports
        await lab.control.act("s2", AdminAction.PAUSE, "alerting test")
        await lab.step(load=lambda server: 95 if server == "s3" else 30)
        samples = await scrape(lab)

        www = {s: value(samples, "dnslb_pool_plan_members", pool="www", state=s) for s in STATES}
        assert www == {"active": 1, "paused": 2, "down": 0, "draining": 0, "disabled": 0}
        assert value(samples, "dnslb_pool_plan_members", pool="auto", state="active") >= 1
        assert value(samples, "dnslb_pool_left_out_servers", pool="www") == 0
        assert value(samples, "dnslb_plan_refresh_seconds") == 5
        assert value(samples, "dnslb_plan_stale_after_seconds") == 30
        assert value(samples, "dnslb_plan_store_up") == 1
        assert value(samples, "dnslb_plan_publish_errors_total") == 0
        assert value(samples, "dnslb_plan_refused") == 0
        assert value(samples, "dnslb_plans_refused_total") == 0
        parts = {labels["part"]: n for labels, n in samples["dnslb_manager_tick_part_errors_total"]}
        assert parts == dict.fromkeys(TICK_PARTS, 0)  # from 0: increase() sees
        # Only pools with a provider launch.
        assert value(samples, "dnslb_pool_launches_total", pool="auto") >= 1
        assert value(samples, "dnslb_pool_launch_failures_total", pool="auto") == 0
        assert value(samples, "dnslb_pool_launch_backoff", pool="auto") == 0
        assert not [
            labels
            for labels, _ in samples["dnslb_pool_launches_total"]
            if labels == {"pool": "www"}
        ]

        # Every server down: none in the plan is active.
        lab.clock.advance(10)
        lab.manager.tick()
        samples = await scrape(lab)
        assert value(samples, "dnslb_pool_plan_members", pool="www", state="active") == 0
        assert value(samples, "dnslb_pool_plan_members", pool="www", state="down") == 3

    run(tmp_path, scenario)


STATES = ("active", "paused", "down", "draining", "disabled")


def test_a_failing_plan_store_is_counted_and_shown_down_until_it_answers(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()
        publisher = lab.manager.publisher
        works = publisher.publish

        def unreachable(plan: Plan, *, durable: bool = True) -> None:
            raise ConnectionRefusedError(111, "Connection refused")

        publisher.publish = unreachable  # type: ignore[method-assign]
        await lab.step(seconds=6)  # past plan.refresh: the manager tries every tick
        samples = await scrape(lab)
        assert value(samples, "dnslb_plan_store_up") == 0
        errors = value(samples, "dnslb_plan_publish_errors_total")
        assert errors >= 2
        assert value(samples, "dnslb_plan_age_seconds") > value(
            samples, "dnslb_plan_refresh_seconds"
        )

        publisher.publish = works  # type: ignore[method-assign]
        await lab.step()
        samples = await scrape(lab)
        assert value(samples, "dnslb_plan_store_up") == 1
        assert value(samples, "dnslb_plan_publish_errors_total") == errors  # a counter

    run(tmp_path, scenario)


def test_a_refused_plan_and_failing_tick_parts_are_counted(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()
        manager = lab.manager
        manager._plan_problem = lambda plan: "a member the pipe backend would refuse"  # type: ignore[method-assign]
        assess = manager._assess

        def broken(pool: object, server: object, now: float, wall: float) -> None:
            if getattr(server, "id", None) == "s1":
                raise RuntimeError("bad data")
            assess(pool, server, now, wall)  # type: ignore[arg-type]

        manager._assess = broken  # type: ignore[method-assign]
        await lab.step(load=lambda server: 95 if server == "s3" else 30, seconds=2)
        samples = await scrape(lab)
        assert value(samples, "dnslb_plan_refused") == 1
        assert value(samples, "dnslb_plans_refused_total") >= 1
        assert value(samples, "dnslb_manager_tick_part_errors_total", part="server") == 2
        assert value(samples, "dnslb_manager_tick_errors_total") == 0  # the rest of the tick ran

        manager.members_left_out = {"s2": "address 10.0.0.1 is another member's"}
        samples = await scrape(lab)
        assert value(samples, "dnslb_pool_left_out_servers", pool="www") == 1

    run(tmp_path, scenario)


def test_launches_and_their_failures_are_counted_and_backoff_shown(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        lifecycle = lab.manager.lifecycles["auto"]
        works = lifecycle.provider.launch

        async def refused(request: LaunchRequest) -> Instance:
            raise ProviderError("quota exceeded")

        # No launched server gets to run (one that is active resets the failures in a row).
        lifecycle.provider.launch = refused  # type: ignore[method-assign]
        for _ in range(20):
            await lab.step()
            if lifecycle.launch_failures >= 3:
                break
        samples = await scrape(lab)
        failures = value(samples, "dnslb_pool_launch_failures_total", pool="auto")
        assert failures == lifecycle.launch_failures == 3
        assert value(samples, "dnslb_pool_launches_total", pool="auto") == 3
        assert value(samples, "dnslb_pool_launch_backoff", pool="auto") == 1  # 3 in a row

        lifecycle.provider.launch = works  # type: ignore[method-assign]
        lab.clock.advance(lab.manager.config.pools[1].lifecycle.launch_backoff)
        await lab.step()
        samples = await scrape(lab)
        assert value(samples, "dnslb_pool_launch_backoff", pool="auto") == 0
        assert value(samples, "dnslb_pool_launches_total", pool="auto") == 4

    run(tmp_path, scenario)


def test_first_answers_come_from_the_pipe_backends_counts(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()
        document = {
            "written_at": time.time(),
            "pools": {"www.example.test.": {"s1": [40, 60], "s2": [7, 30]}},
        }
        lab.manager.publisher.write_stats("pdns-1", document)
        lab.manager.publisher.write_stats("pdns-2", document)
        lab.clock.advance(1.0)  # read at most once a second (the last tick read them)
        samples = await scrape(lab)
        first = {
            labels["server"]: found for labels, found in samples["dnslb_server_first_answers_total"]
        }
        assert first == {"s1": 80, "s2": 14}
        assert value(samples, "dnslb_server_answers_total", pool="www", server="s1") == 120

    run(tmp_path, scenario)


def test_cluster_failovers_are_counted_by_the_controller() -> None:
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.step()
        assert cluster.controller.failovers == 0
        cluster.agents.down.add("n3")
        await cluster.step(0.35, "n1", "n2")
        assert cluster.controller.events[-1].what == "failover"
        assert cluster.controller.failovers == 1
        assert cluster.controller.alive(cluster.clock.now) == ["n1", "n2"]

    asyncio.run(scenario())


class ClusterControl(Control):
    """The manager's control with one cluster in its telemetry (the ApiLab has none)."""

    def telemetry(self) -> Telemetry:
        cluster = ClusterTelemetry(
            name="edge",
            failovers=2,
            tick_errors={"push": 1},
            nodes_alive={"n1": True, "n2": False},
        )
        return dataclasses.replace(super().telemetry(), clusters=(cluster,))


def test_clusters_are_exported(tmp_path: Path) -> None:
    async def scenario(lab: ApiLab) -> None:
        await lab.ready()
        app = create_app(ClusterControl(lab.manager), auth=ApiAuth.from_tokens([(READ, Role.READ)]))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as api:
            answer = await api.get("/metrics", headers=bearer(READ))
        samples: Samples = parse(answer.text)
        assert value(samples, "dnslb_cluster_failovers_total", cluster="edge") == 2
        assert value(samples, "dnslb_cluster_tick_errors_total", cluster="edge", part="push") == 1
        assert value(samples, "dnslb_cluster_node_alive", cluster="edge", node="n1") == 1
        assert value(samples, "dnslb_cluster_node_alive", cluster="edge", node="n2") == 0

    run(tmp_path, scenario)


def test_every_part_a_tick_isolates_is_counted_from_zero() -> None:
    """The parts named where the manager's tick isolates them (``_isolated`` and
    ``_part_failed``) are the parts the metric lists from 0: a new part left out would raise
    its alert only from its second failure (``increase()`` needs a series to grow)."""
    source = Path(__file__).parents[2] / "manager" / "service.py"
    named = {
        call.args[1].value
        for call in ast.walk(ast.parse(source.read_text()))
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("_isolated", "_part_failed")
        and len(call.args) > 1
        and isinstance(call.args[1], ast.Constant)
    }
    assert named == set(TICK_PARTS)
