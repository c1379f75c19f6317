"""The manager's cluster controller, driven by a fake clock and honest fake node agents."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from dnslb.config import checked
from dnslb.dispatch import BucketTable, moved_buckets, parse_table_json, quotas
from dnslb.errors import ConfigError, ProtocolError
from dnslb.report import Report, TableHeld
from manager.clusters import (
    MAX_ADOPTED_VERSION,
    MAX_CLAIM_STEP,
    ClusterController,
    ClusterNode,
    ClusterSettings,
    HttpTablePusher,
    PushResult,
    TablePusher,
    parse_push_answer,
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
    return checked(replace(base, **changes), "cluster")  # type: ignore[arg-type]


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
        # Two failures, said once (an agent failing every retry must not flood events and logs).
        assert [event.what for event in cluster.controller.events].count("push failed") == 1
        status = {node.node_id: node for node in cluster.controller.status()}
        assert status["n1"].push_failures == 2

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


def test_a_node_claiming_a_huge_capacity_draws_no_more_than_its_bound():
    """A node agent that claims 10^9 (its token stolen) counts for capacity_spread (4) times
    the live nodes' median, in its weight and in the cluster's load; a configured cap is the
    operator's word and is not bounded."""
    cluster = Cluster(smoothing=1.0)
    cluster.beat()
    cluster.controller.observe(Report("n1", 10**6, cluster.clock.now, 0, 10**9))
    assert cluster.controller.weights(cluster.clock.now) == pytest.approx(
        {"n1": 400.0, "n2": 100.0, "n3": 100.0}
    )
    assert cluster.controller.load() == (0, 600)
    capped = tuple(
        replace(node, max_concurrency=5000) if node.node_id == "n1" else node
        for node in settings().nodes
    )
    cluster = Cluster(smoothing=1.0, nodes=capped)
    cluster.beat()
    cluster.controller.observe(Report("n1", 10**6, cluster.clock.now, 0, 10**9))
    assert cluster.controller.weights(cluster.clock.now)["n1"] == pytest.approx(5000.0)


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


def test_the_controller_takes_only_valid_settings_and_lists_every_problem():
    bad = replace(
        settings(),
        name="vip\n1",
        failover_after=0.0,
        nodes=(ClusterNode("n\t1", "http://a", "t" * 20, max_concurrency=0),),
    )
    with pytest.raises(ConfigError) as caught:
        ClusterController(bad, FakeAgents(), FakeClock())
    assert caught.value.what == "cluster vip\n1"
    assert [problem.split(":")[0] for problem in caught.value.problems] == [
        "nodes[0].max_concurrency",
        "nodes[0]",  # node id 'n\t1'
        "failover_after",
        "name",
    ]


# --- hostile nodes (issue 14) ------------------------------------------------------------------


def test_a_claim_at_the_top_of_the_version_range_cannot_stop_failover():
    # Issue 14, item 4: table.version = 2**63-1 in one heartbeat made every tick raise, and a
    # dead node kept its buckets.
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.step()
        first = cluster.table
        cluster.controller.observe(
            Report("n1", 10_000, cluster.clock.now, 0, 100, table=TableHeld("vip-1", 2**63 - 1))
        )
        await cluster.step(0.1, "n2", "n3")
        cluster.agents.down.add("n3")
        for _ in range(4):  # n3 silent from here; n1 keeps claiming the top version
            cluster.clock.now += 0.1
            cluster.controller.observe(
                Report(
                    "n1",
                    cluster.seq + 20_000,
                    cluster.clock.now,
                    0,
                    100,
                    table=TableHeld("vip-1", 2**63 - 1),
                )
            )
            cluster.beat("n2")
            await cluster.controller.tick()
            await cluster.controller.settle()
        table = cluster.table
        assert table.shares().get("n3", 0) == 0
        assert table.shares().get("n1", 0) == 0  # n1 cannot take our tables: left out
        assert set(table.active_buckets("n2")) == set(range(256))
        assert table.version <= first.version + 3
        assert sum(cluster.controller.tick_errors.values()) == 0
        status = {node.node_id: node for node in cluster.controller.status()}
        assert "beyond the versions this manager follows" in (status["n1"].error or "")
        events = [event.what for event in cluster.controller.events]
        assert events.count("claim refused") == 1  # said once, not per heartbeat

    run(scenario)


def test_a_node_back_to_a_plausible_version_is_taken_again():
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.step()
        top = TableHeld("vip-1", 2**63 - 1)
        cluster.controller.observe(Report("n1", 10_000, cluster.clock.now, 0, 100, table=top))
        await cluster.step(0.05, "n2", "n3")
        assert "n1" not in cluster.controller.alive(cluster.clock.now)
        cluster.agents.held.pop("n1")  # its agent restarted: fenced, holds nothing
        for _ in range(15):
            await cluster.step(0.1)
        assert "n1" in cluster.controller.alive(cluster.clock.now)
        assert cluster.table.shares()["n1"] > 0
        assert cluster.agents.version("n1") == cluster.table.version

    run(scenario)


def test_a_restarted_manager_goes_above_any_version_up_to_2_62():
    async def scenario() -> None:
        cluster = Cluster()
        old = BucketTable("vip-1", MAX_ADOPTED_VERSION, 0x2A, (("n1", "n2"),) * 256)
        cluster.agents.held["n1"] = old
        await cluster.step()
        assert cluster.table.version == MAX_ADOPTED_VERSION + 1
        assert {cluster.agents.version(node) for node in NODES} == {MAX_ADOPTED_VERSION + 1}
        # From here on claims cannot move us: what is left of the range is ours alone.
        cluster.agents.down.add("n3")
        await cluster.step(0.35, "n1", "n2")
        assert "n3" not in cluster.table.nodes
        assert cluster.table.version == MAX_ADOPTED_VERSION + 2

    run(scenario)


def test_before_the_first_table_a_claim_above_2_62_is_refused():
    async def scenario() -> None:
        cluster = Cluster()
        cluster.agents.held["n1"] = BucketTable(
            "vip-1", MAX_ADOPTED_VERSION + 1, 0x2A, (("n1", "n2"),) * 256
        )
        await cluster.step()
        await cluster.step(0.35)
        assert cluster.table.version < 10
        assert "n1" not in cluster.table.nodes
        assert {cluster.agents.version(node) for node in ("n2", "n3")} == {cluster.table.version}

    run(scenario)


def test_a_claim_moves_our_version_by_at_most_the_step():
    async def scenario() -> None:
        cluster = Cluster()
        await cluster.step()
        ours = cluster.table.version
        near = TableHeld("vip-1", ours + MAX_CLAIM_STEP)
        cluster.controller.observe(Report("n1", 10_000, cluster.clock.now, 0, 100, table=near))
        await cluster.step(0.05, "n2", "n3")
        assert cluster.table.version == ours + MAX_CLAIM_STEP + 1  # followed: a reissue
        assert cluster.controller.events[-1].what == "reissue"
        ours = cluster.table.version
        far = TableHeld("vip-1", ours + MAX_CLAIM_STEP + 1)
        cluster.controller.observe(Report("n1", 10_001, cluster.clock.now, 0, 100, table=far))
        await cluster.step(0.05, "n2", "n3")
        assert cluster.table.version == ours + 1  # not followed: n1 failed over instead
        assert "n1" not in cluster.table.nodes

    run(scenario)


def test_a_node_walking_the_version_up_gets_one_reissue_per_rebuild_interval():
    async def scenario() -> None:
        cluster = Cluster(min_rebuild_interval=1.0)
        await cluster.step()
        start = cluster.table.version
        seq = 10_000
        for _ in range(100):  # 10 s of ticks, a claim one above ours in every heartbeat
            seq += 1
            claim = TableHeld("vip-1", cluster.table.version + 1)
            cluster.controller.observe(Report("n1", seq, cluster.clock.now, 0, 100, table=claim))
            await cluster.step(0.1, "n2", "n3")
        reissues = [event.what for event in cluster.controller.events].count("reissue")
        assert 1 <= reissues <= 11
        assert cluster.table.version <= start + 2 * reissues + 2
        assert sum(cluster.controller.tick_errors.values()) == 0

    run(scenario)


class HostileAgents(FakeAgents):
    """Fake agents where ``refusing`` nodes answer every push with ``answer``."""

    def __init__(self, answer: PushResult) -> None:
        super().__init__()
        self.answer = answer
        self.refusing: set[str] = set()

    async def push(self, node: ClusterNode, body: bytes) -> PushResult:
        if node.node_id in self.refusing:
            await asyncio.sleep(0)
            self.pushes.append((node.node_id, parse_table_json(body).version))
            if self.answer.held_version == -1:  # stands for "the version pushed"
                return replace(self.answer, held_version=parse_table_json(body).version)
            return self.answer
        return await super().push(node, body)


def hostile_cluster(answer: PushResult, **changes: object) -> Cluster:
    cluster = Cluster(**changes)
    cluster.agents = HostileAgents(answer)
    cluster.controller.pusher = cluster.agents
    return cluster


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(PushResult(500, None, "nft failed"), id="500"),
        pytest.param(PushResult(200, 1, None), id="200 with an old version"),
        pytest.param(PushResult(409, -1, "held with other contents"), id="409 same version"),
    ],
)
def test_a_node_that_never_takes_our_table_cannot_hold_the_others_back(answer: PushResult):
    async def scenario() -> None:
        cluster = hostile_cluster(answer, smoothing=1.0, stuck_after=2.0)
        await cluster.step()
        cluster.agents.refusing.add("n1")
        cluster.load["n2"] = 90  # a rebalance is due, and n1 never acknowledges it
        for _ in range(40):
            await cluster.step(0.1)
        assert "n1" not in cluster.controller.alive(cluster.clock.now)
        assert cluster.table.shares().get("n1", 0) == 0
        # The others took the tables and the rebalance went on without n1.
        assert cluster.agents.version("n2") == cluster.agents.version("n3") == cluster.table.version
        assert cluster.table.shares()["n2"] < cluster.table.shares()["n3"]
        status = {node.node_id: node for node in cluster.controller.status()}
        assert "has not taken our table" in (status["n1"].error or "")
        reissues = [event.what for event in cluster.controller.events].count("reissue")
        assert reissues <= 3  # conflicts ask for a reissue at most once per rebuild interval
        failed = [event for event in cluster.controller.events if event.what == "push failed"]
        assert len(failed) <= 2  # said once (per message), not per retry
        # Its agent mends: it takes the table, comes back and joins again.
        cluster.agents.refusing.clear()
        for _ in range(25):
            await cluster.step(0.1)
        assert "n1" in cluster.controller.alive(cluster.clock.now)
        assert cluster.table.shares()["n1"] > 0

    run(scenario)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        pytest.param({"seq": 2**63}, "seq", id="seq beyond int64"),
        pytest.param({"seq": -1}, "seq", id="negative seq"),
        pytest.param({"seq": True}, "seq", id="boolean seq"),
        pytest.param({"time": math.nan}, "time", id="NaN time"),
        pytest.param({"time": math.inf}, "time", id="infinite time"),
        pytest.param({"time": 10**400}, "time", id="huge integer time"),
        pytest.param({"in_progress": 10**400}, "in_progress", id="huge in_progress"),
        pytest.param({"in_progress": -1}, "in_progress", id="negative in_progress"),
        pytest.param({"in_progress": 0.5}, "in_progress", id="float in_progress"),
        pytest.param({"max_concurrency": 0}, "max_concurrency", id="zero capacity"),
        pytest.param({"max_concurrency": 10**308}, "max_concurrency", id="huge capacity"),
        pytest.param({"table": TableHeld("vip-1", 2**63)}, "table version", id="version 2^63"),
        pytest.param({"table": TableHeld("vip-1", -1)}, "table version", id="negative version"),
        pytest.param({"table": {"cluster": "vip-1"}}, "table", id="table not TableHeld"),
        pytest.param({"error": 5}, "error", id="error not text"),
        pytest.param({"server_id": ["n1"]}, "not a node", id="unhashable id"),
    ],
)
def test_numbers_out_of_range_are_refused_from_reports_built_directly(changes, problem):
    cluster = Cluster()
    report = replace(Report("n1", 1, 100.0, 10, 100), **changes)
    with pytest.raises(ProtocolError, match=problem):
        cluster.controller.observe(report)
    assert cluster.controller.alive(cluster.clock.now) == []  # it did not count as a heartbeat


def test_utilization_is_clamped_and_the_error_cut_and_cleaned():
    cluster = Cluster(smoothing=1.0)
    cluster.controller.observe(Report("n1", 1, 100.0, 10**9, 1))
    cluster.controller.observe(Report("n2", 1, 100.0, None, 100, error="x\tDATA\n" * 100))
    status = {node.node_id: node for node in cluster.controller.status()}
    assert status["n1"].utilization == 1.0
    assert cluster.controller.weights(cluster.clock.now) == pytest.approx({"n1": 0.05})
    assert cluster.controller.utilization() == 1.0  # one node counts as full at most
    error = status["n2"].error or ""
    assert len(error) == 200
    assert "\t" not in error and "\n" not in error


def test_a_failing_part_of_a_tick_is_counted_and_failover_still_happens(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    async def scenario() -> None:
        cluster = Cluster(smoothing=1.0)
        await cluster.step()

        def broken(*args: object, **kwargs: object) -> dict[str, int]:
            raise ZeroDivisionError("a bug in the rebalance maths")

        monkeypatch.setattr("manager.clusters.quotas", broken)
        cluster.load["n1"] = 90
        for _ in range(10):
            await cluster.step(0.3)
        assert cluster.controller.tick_errors["rebuild"] >= 2
        assert caplog.text.count("rebuild failed this tick") == 1
        cluster.agents.down.add("n3")
        await cluster.step(0.35, "n1", "n2")
        assert "n3" not in cluster.table.nodes  # failover runs apart from the broken part

    run(scenario)


def test_a_pusher_that_raises_is_a_failed_push(caplog: pytest.LogCaptureFixture):
    class Raising(FakeAgents):
        async def push(self, node: ClusterNode, body: bytes) -> PushResult:
            if node.node_id == "n1":
                raise RuntimeError("a bug in a pusher")
            return await super().push(node, body)

    async def scenario() -> None:
        cluster = Cluster()
        cluster.agents = Raising()
        cluster.controller.pusher = cluster.agents
        await cluster.step()
        status = {node.node_id: node for node in cluster.controller.status()}
        assert status["n1"].push_failures == 1
        assert cluster.agents.version("n2") == cluster.table.version
        assert "pushing to n1 raised" in caplog.text

    run(scenario)


@pytest.mark.parametrize(
    ("status", "data", "expected"),
    [
        pytest.param(200, b'{"version": 7}', PushResult(200, 7, None), id="plain"),
        pytest.param(200, b'{"version": 9223372036854775808}', PushResult(200, None), id="2^63"),
        pytest.param(200, b'{"version": -1}', PushResult(200, None), id="negative"),
        pytest.param(200, b'{"version": true}', PushResult(200, None), id="boolean"),
        pytest.param(200, b'{"version": 7.0}', PushResult(200, None), id="float"),
        pytest.param(200, b"9" * 5000, PushResult(200, None), id="5000 digits"),
        pytest.param(200, b"[" * 100_000, PushResult(200, None), id="deep"),
        pytest.param(502, b"<html>", PushResult(502, None, "HTTP 502"), id="not JSON"),
        pytest.param(409, b'{"error": "\\u0000x", "version": 3}', None, id="control chars"),
    ],
)
def test_push_answers_are_bounded(status: int, data: bytes, expected: PushResult | None):
    result = parse_push_answer(status, data)
    if expected is not None:
        assert result == expected
    else:
        assert result.held_version == 3
        assert result.error is not None and "\x00" not in result.error


def test_a_push_answer_that_trickles_or_floods_is_cut_off():
    async def scenario() -> None:
        handlers: list[asyncio.Task[None]] = []

        async def answer(writer: asyncio.StreamWriter, head: bytes, chunk: bytes, pause: float):
            writer.write(head)
            try:
                for _ in range(2000):
                    writer.write(chunk)
                    await writer.drain()
                    await asyncio.sleep(pause)
            except ConnectionError:
                pass
            finally:
                writer.close()

        async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n"
            handlers.append(asyncio.current_task())  # type: ignore[arg-type]
            await answer(writer, head, b"{", 0.05)

        async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n"
            handlers.append(asyncio.current_task())  # type: ignore[arg-type]
            await answer(writer, head, b"[" * 65536, 0)

        servers = [await asyncio.start_server(h, "127.0.0.1", 0) for h in (trickle, flood)]
        pusher = HttpTablePusher(timeout=0.3)
        try:
            results = [
                await pusher.push(
                    ClusterNode("n1", f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}", "t"),
                    b"{}",
                )
                for s in servers
            ]
        finally:
            await pusher.aclose()
            for server in servers:
                server.close()
                await server.wait_closed()
            for handler in handlers:
                handler.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
        assert results[0] == PushResult(0, None, "no answer within 0.3 s")
        assert results[1] == PushResult(0, None, "answer larger than 1 MiB")

    run(scenario)


def test_settings_refuse_ids_that_tables_cannot_carry():
    with pytest.raises(ConfigError, match="node id"):
        settings(nodes=(ClusterNode("n\t1", "http://a", "t" * 20),))
    with pytest.raises(ConfigError, match="name"):
        settings(name="vip\n1")


def test_a_configured_capacity_caps_what_a_node_says_it_can_take():
    async def scenario() -> None:
        nodes = tuple(
            ClusterNode(node, f"http://{node}.test:8470", "t" * 20, max_concurrency=100)
            for node in NODES
        )
        cluster = Cluster(nodes=nodes, smoothing=1.0)
        await cluster.step()
        # n1 says it takes a billion connections and has none: it weighs as its configured 100.
        cluster.controller.observe(Report("n1", 10_000, cluster.clock.now, 0, 10**9))
        assert cluster.controller.weights(cluster.clock.now) == pytest.approx(
            {"n1": 100.0, "n2": 100.0, "n3": 100.0}
        )
        cluster.controller.observe(Report("n1", 10_001, cluster.clock.now, 10**9, 10**9))
        assert cluster.controller.load() == (100, 300)  # full, not a billion in progress

    run(scenario)


def test_a_configured_capacity_must_be_in_range():
    with pytest.raises(ConfigError, match="max_concurrency"):
        settings(nodes=(ClusterNode("n1", "http://a", "t" * 20, max_concurrency=0),))


def test_the_clusters_load_stays_within_a_reports_bounds():
    cluster = Cluster(smoothing=1.0)
    for index, node in enumerate(NODES):
        cluster.controller.observe(Report(node, 1, 100.0, (index + 1) * 10**8, 10**9))
    load = cluster.controller.load()
    assert load is not None
    in_progress, capacity = load
    assert capacity == 10**9
    assert in_progress == 2 * 10**8  # 600 million of 3 billion: the ratio is kept
