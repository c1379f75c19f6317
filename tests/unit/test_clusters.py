"""The manager's cluster controller, driven by a fake clock and honest fake node agents."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from dnslb.dispatch import BucketTable, moved_buckets, parse_table_json, quotas
from dnslb.errors import ConfigError, ProtocolError
from dnslb.report import Report, TableHeld
from manager.clusters import (
    ClusterController,
    ClusterNode,
    ClusterSettings,
    PushResult,
    TablePusher,
)

NODES = ("n1", "n2", "n3")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeAgents(TablePusher):
    """Node agents in memory: they keep the table they hold and refuse older versions, as the
    real agent does; ``down`` nodes do not answer."""

    def __init__(self) -> None:
        self.held: dict[str, BucketTable] = {}
        self.down: set[str] = set()
        self.pushes: list[tuple[str, int]] = []

    async def push(self, node: ClusterNode, body: bytes) -> PushResult:
        await asyncio.sleep(0)
        table = parse_table_json(body)
        self.pushes.append((node.node_id, table.version))
        if node.node_id in self.down:
            return PushResult(0, None, "ConnectError: refused")
        held = self.held.get(node.node_id)
        if held is not None and (
            table.version < held.version or (table.version == held.version and table != held)
        ):
            return PushResult(409, held.version, "older")
        self.held[node.node_id] = table
        return PushResult(200, table.version)

    def version(self, node_id: str) -> int | None:
        held = self.held.get(node_id)
        return held.version if held else None


def settings(**changes: object) -> ClusterSettings:
    base = ClusterSettings(
        name="vip-1",
        vip="198.51.100.10",
        nodes=tuple(ClusterNode(node, f"http://{node}.test:8470", "t" * 20) for node in NODES),
        seed=0x2A,
        bucket_count=256,
        min_rebuild_interval=1.0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


class Cluster:
    """A controller, its fake agents and a clock; ``beat`` sends heartbeats like the agents."""

    def __init__(self, **changes: object) -> None:
        self.clock = FakeClock()
        self.agents = FakeAgents()
        self.controller = ClusterController(settings(**changes), self.agents, self.clock)
        self.seq = 0
        self.load = dict.fromkeys(NODES, 0)

    def beat(self, *nodes: str, error: str | None = None) -> None:
        for node in nodes or NODES:
            self.seq += 1
            held = self.agents.version(node)
            self.controller.observe(
                Report(
                    server_id=node,
                    seq=self.seq,
                    time=self.clock.now,
                    in_progress=None if error else self.load[node],
                    max_concurrency=100,
                    error=error,
                    table=TableHeld("vip-1", held) if held is not None else None,
                )
            )

    async def step(self, seconds: float = 0.0, *beating: str) -> None:
        self.clock.now += seconds
        if beating != ("none",):
            self.beat(*beating)
        await self.controller.tick()
        await self.controller.settle()

    @property
    def table(self) -> BucketTable:
        assert self.controller.table is not None
        return self.controller.table


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def test_no_heartbeat_no_table():
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.controller.tick()
        assert cluster.controller.table is None
        assert cluster.agents.pushes == []
        assert cluster.controller.utilization() is None

    run(scenario)


def test_first_table_goes_to_every_node_and_follows_equal_weights():
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.step()
        assert cluster.table.version == 1
        assert cluster.table.shares() == quotas(dict.fromkeys(NODES, 1.0), 256)
        assert {node: cluster.agents.version(node) for node in NODES} == dict.fromkeys(NODES, 1)
        assert [event.what for event in cluster.controller.events] == ["first table"]

    run(scenario)


def test_first_table_waits_briefly_for_the_other_nodes():
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.step(0.0, "n1")
        assert cluster.controller.table is None
        await cluster.step(0.1, "n1", "n2")
        assert cluster.controller.table is None
        await cluster.step(0.25, "n1", "n2")  # failover_after (0.3 s) since the first heartbeat
        assert set(cluster.table.nodes) == {"n1", "n2"}

    run(scenario)


def test_silent_node_fails_over_to_its_backups_and_nothing_else_moves():
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.step()
        before = cluster.table
        await cluster.step(0.2, "n1", "n2")
        assert cluster.table == before  # 0.2 s of silence is not yet a failure
        cluster.agents.down.add("n3")
        await cluster.step(0.15, "n1", "n2")  # n3 last heard 0.35 s ago
        after = cluster.table
        assert after.version == before.version + 1
        assert "n3" not in after.nodes
        for index in moved_buckets(before, after):
            active, backup = before.buckets[index]
            assert active == "n3"
            assert after.buckets[index][0] == backup
        assert cluster.agents.version("n1") == cluster.agents.version("n2") == after.version
        assert ("n3", after.version) not in cluster.agents.pushes
        assert cluster.controller.events[-1].what == "failover"

    run(scenario)


def test_a_node_that_reports_an_error_is_failed_over():
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.step()
        cluster.beat("n2", error="nothing listens on 198.51.100.10 port 80")
        await cluster.step(0.05, "n1", "n3")
        assert "n2" not in cluster.table.nodes
        status = {node.node_id: node for node in cluster.controller.status()}
        assert not status["n2"].alive
        assert status["n2"].error == "nothing listens on 198.51.100.10 port 80"

    run(scenario)


def test_small_weight_changes_move_nothing():
    async def scenario() -> None:
        cluster = Cluster(rebalance_threshold=0.05)
        await cluster.step()
        before = cluster.table
        cluster.load["n1"] = 5  # u = 0.05 -> about 2 % of buckets would move
        for _ in range(30):
            await cluster.step(0.1)
        assert cluster.table == before

    run(scenario)


def test_a_loaded_node_loses_buckets_and_losers_release_before_gainers_accept():
    async def scenario() -> None:
        cluster = Cluster(smoothing=1.0)
        await cluster.step()
        before = cluster.table
        cluster.load["n1"] = 80
        cluster.agents.pushes.clear()
        await cluster.step(1.0)
        after = cluster.table
        assert after.version == before.version + 1
        weights = cluster.controller.weights(cluster.clock.now)
        assert weights == pytest.approx({"n1": 20.0, "n2": 100.0, "n3": 100.0})
        assert after.shares() == quotas(weights, 256)
        # Only n1 lost buckets: it alone was pushed in the first round...
        assert cluster.agents.pushes == [("n1", after.version)]
        await cluster.step(0.05)
        # ...and the gainers only once n1 had released them.
        assert sorted(cluster.agents.pushes[1:]) == [("n2", after.version), ("n3", after.version)]

    run(scenario)


def test_gainers_wait_while_the_loser_does_not_answer():
    async def scenario() -> None:
        cluster = Cluster(smoothing=1.0, retry_after=0.2)
        await cluster.step()
        cluster.load["n1"] = 90
        cluster.agents.down.add("n1")  # its push endpoint fails, its heartbeats still arrive
        cluster.agents.pushes.clear()
        await cluster.step(1.0)
        version = cluster.table.version
        await cluster.step(0.1)  # retry not due yet
        assert cluster.agents.pushes == [("n1", version)]
        await cluster.step(0.15)  # retry due; n2 and n3 still wait
        assert cluster.agents.pushes == [("n1", version), ("n1", version)]
        cluster.agents.down.clear()
        await cluster.step(0.25)
        await cluster.step(0.05)
        assert {node: cluster.agents.version(node) for node in NODES} == dict.fromkeys(
            NODES, version
        )
        assert [event.what for event in cluster.controller.events].count("push failed") == 2

    run(scenario)


def test_rebuilds_wait_for_the_minimum_interval():
    async def scenario() -> None:
        cluster = Cluster(smoothing=1.0, min_rebuild_interval=1.0)
        await cluster.step()
        first = cluster.table.version
        cluster.load["n2"] = 90
        await cluster.step(0.5)
        assert cluster.table.version == first
        await cluster.step(0.5)
        assert cluster.table.version == first + 1

    run(scenario)


def test_a_returning_node_joins_with_the_fewest_moves():
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.step()
        await cluster.step(0.4, "n1", "n2")  # n3 failed over
        without = cluster.table
        assert "n3" not in without.nodes
        cluster.agents.held.pop("n3")  # its agent restarted: fenced, holds nothing
        await cluster.step(0.5)  # back: alive from now on
        await cluster.step(0.9)
        assert cluster.table == without  # join_after (1 s) has not passed: no join, no rebalance
        await cluster.step(0.1)
        joined = cluster.table
        assert joined.shares()["n3"] == quotas(dict.fromkeys(NODES, 100.0), 256)["n3"]
        assert len(moved_buckets(without, joined)) == joined.shares()["n3"]
        assert cluster.controller.events[-1].what == "join"

    run(scenario)


def test_a_newer_version_on_a_node_makes_the_controller_issue_above_it():
    async def scenario() -> None:
        cluster = Cluster()
        old = BucketTable("vip-1", 41, 0x2A, (("n1", "n2"),) * 256)
        cluster.agents.held["n1"] = old  # left by a manager that ran before this one
        await cluster.step()
        assert cluster.table.version == 42
        assert {cluster.agents.version(node) for node in NODES} == {42}

    run(scenario)


def test_a_conflicting_table_of_the_same_version_is_reissued():
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.step()
        # Another manager pushed different contents under the next version.
        clash = BucketTable("vip-1", 2, 0x2A, (("n2", "n1"),) * 256)
        cluster.agents.held["n1"] = clash
        cluster.load["n1"] = 90
        await cluster.step(1.0)
        await cluster.step(0.05)
        await cluster.step(0.05)
        assert cluster.table.version >= 3
        assert "reissue" in [event.what for event in cluster.controller.events]
        assert {cluster.agents.version(node) for node in NODES} == {cluster.table.version}

    run(scenario)


def test_utilization_is_over_live_nodes():
    async def scenario() -> None:
        cluster = Cluster(smoothing=1.0)
        cluster.load.update(n1=10, n2=20, n3=60)
        await cluster.step()
        assert cluster.controller.utilization() == pytest.approx(90 / 300)
        await cluster.step(0.4, "n1", "n2")
        assert cluster.controller.utilization() == pytest.approx(30 / 200)

    run(scenario)


def test_utilization_is_smoothed():
    cluster = Cluster(smoothing=0.5)
    cluster.beat("n1")
    cluster.load["n1"] = 100
    cluster.beat("n1")
    state = {node.node_id: node for node in cluster.controller.status()}["n1"]
    assert state.utilization == pytest.approx(0.5)


def test_a_fully_loaded_node_keeps_the_floor_weight():
    cluster = Cluster(smoothing=1.0, weight_floor=0.05)
    cluster.load.update(n1=100, n2=0, n3=50)
    cluster.beat()
    assert cluster.controller.weights(cluster.clock.now) == pytest.approx(
        {"n1": 5.0, "n2": 100.0, "n3": 50.0}
    )


def test_reports_from_strangers_are_refused():
    cluster = Cluster()
    with pytest.raises(ProtocolError, match="not a node of vip-1"):
        cluster.controller.observe(Report("intruder", 1, 1.0, 0, 10))
    with pytest.raises(ProtocolError, match="holds a table of cluster 'vip-2'"):
        cluster.controller.observe(Report("n1", 1, 1.0, 0, 10, table=TableHeld("vip-2", 3)))


def test_a_replayed_report_is_ignored():
    cluster = Cluster()
    cluster.controller.observe(Report("n1", 5, 10.0, 50, 100), now=1.0)
    cluster.controller.observe(Report("n1", 4, 9.0, 0, 100), now=2.0)
    assert cluster.controller.alive(1.2) == ["n1"]
    assert cluster.controller.alive(2.2) == []  # the replay did not count as a heartbeat
    assert cluster.controller.utilization(1.1) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        pytest.param({"nodes": ()}, "nodes: at least one", id="no nodes"),
        pytest.param(
            {"nodes": (ClusterNode("a", "http://a", "t"), ClusterNode("a", "http://b", "t"))},
            "unique",
            id="duplicate ids",
        ),
        pytest.param({"seed": -1}, "seed", id="negative seed"),
        pytest.param({"bucket_count": 0}, "bucket_count", id="no buckets"),
        pytest.param({"failover_after": 0}, "failover_after", id="zero failover"),
        pytest.param({"weight_floor": 0}, "weight_floor", id="zero floor"),
        pytest.param({"smoothing": 1.5}, "smoothing", id="smoothing above 1"),
        pytest.param({"retry_after": -1}, "retry_after", id="negative retry"),
    ],
)
def test_bad_settings_are_config_errors(changes, problem):
    with pytest.raises(ConfigError, match=problem):
        settings(**changes)
