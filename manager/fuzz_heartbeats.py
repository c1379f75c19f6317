"""Fuzz harness for cluster heartbeats: what a node agent holding its node's token may send to
the manager (heartbeats, and answers to the controller's pushes).

Each input is a fresh :class:`~manager.clusters.ClusterController` (3 to 5 nodes, a random bucket
count, a fake clock and fake node agents) driven for a few seconds of ticks. One or two nodes are
hostile: their heartbeats are mutated documents (huge and negative numbers, NaN, wrong types,
table versions at the top of the range or just above ours, deep nesting, bytes that are not
JSON) that go through the real parse (:func:`~dnslb.report.parse_report`) into
:meth:`~manager.clusters.ClusterController.observe`, plus :class:`~dnslb.report.Report` objects
built directly with any values; they answer pushes with any status, version and error. The other
nodes are honest agents (they keep the table they took and refuse older ones), and one of them
dies part way through.

Contract checked per input, after every tick: ``tick`` never raises and no part of it fails
(``tick_errors`` stays 0); ``observe`` raises nothing but :class:`ProtocolError`; the table the
controller wants is valid (it reads back through the agents' parser), names only the cluster's
nodes, and its version never goes back nor leaves the range a claim may reach plus one per
table; every push body parses as a node agent would parse it; honest nodes that still beat stay
alive; the dead node has no bucket left once ``failover_after`` has passed since its last
heartbeat (one tick after at most), whatever the others sent, as long as a node is alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from typing import Any

from dnslb.dispatch import BucketTable, parse_table, parse_table_json, table_to_dict
from dnslb.errors import ProtocolError
from dnslb.fuzzing import (
    Finding,
    Harness,
    deep_json,
    hostile_number,
    hostile_text,
    json_text,
    mutate_document,
)
from dnslb.report import Report, TableHeld, parse_report, report_to_dict
from manager.clusters import (
    MAX_ADOPTED_VERSION,
    MAX_CLAIM_STEP,
    ClusterController,
    ClusterNode,
    ClusterSettings,
    PushResult,
    TablePusher,
)

CLUSTER = "vip-1"
FAILOVER_AFTER = 0.3


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Agents(TablePusher):
    """Honest node agents in memory, hostile ones answering anything, dead ones not at all."""

    def __init__(self, rng: random.Random, hostile: set[str]) -> None:
        self.rng = rng
        self.hostile = hostile
        self.dead: set[str] = set()
        self.held: dict[str, BucketTable] = {}
        self.malformed: str | None = None
        self._parsed: dict[bytes, BucketTable] = {}

    async def push(self, node: ClusterNode, body: bytes) -> PushResult:
        await asyncio.sleep(0)
        table = self._parsed.get(body)
        if table is None:
            try:
                table = parse_table_json(body)  # what the controller writes, as agents read it
            except ProtocolError as exc:
                self.malformed = f"a push body the node agent refuses: {exc}"
                return PushResult(400, None, "malformed")
            self._parsed = {body: table}  # one table is pushed to every node: parse it once
        node_id = node.node_id
        if node_id in self.dead:
            return PushResult(0, None, "ConnectError: connection refused")
        if node_id in self.hostile:
            return self._hostile_answer(table)
        held = self.held.get(node_id)
        if held is not None and (
            table.version < held.version or (table.version == held.version and table != held)
        ):
            return PushResult(409, held.version, "older")
        self.held[node_id] = table
        return PushResult(200, table.version)

    def _hostile_answer(self, table: BucketTable) -> PushResult:
        rng = self.rng
        status: Any = rng.choice((0, 200, 200, 204, 400, 401, 409, 409, 500, 999, -1, True))
        held: Any = rng.choice(
            (
                None,
                table.version,
                table.version,
                table.version - 1,
                table.version + 1,
                table.version + MAX_CLAIM_STEP,
                MAX_ADOPTED_VERSION,
                2**63 - 1,
                2**63,
                -1,
                hostile_number(rng),
            )
        )
        error: Any = rng.choice((None, "", hostile_text(rng), hostile_number(rng)))
        return PushResult(status, held, error)

    def version(self, node_id: str) -> int | None:
        held = self.held.get(node_id)
        return held.version if held is not None else None


def _claim(rng: random.Random, ours: int) -> object:
    """A table version a hostile node claims to hold, relative to the controller's."""
    return rng.choice(
        (
            ours,
            ours + 1,
            ours + 2,
            ours + MAX_CLAIM_STEP,
            ours + MAX_CLAIM_STEP + 1,
            MAX_ADOPTED_VERSION,
            MAX_ADOPTED_VERSION + 1,
            2**63 - 1,
            2**63,
            0,
            -1,
            hostile_number(rng),
        )
    )


class HeartbeatHarness(Harness):
    name = "heartbeats"
    boundary = "cluster node heartbeats and push answers (a node's token) into the controller"
    suite_inputs = 400
    deadline = 5.0
    unit = "heartbeats"  # each input is a scenario of a few seconds of them

    def open(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._checked: BucketTable | None = None

    def close(self) -> None:
        self._loop.close()

    def one(self, rng: random.Random) -> str:
        return self._loop.run_until_complete(self._scenario(rng))

    async def _scenario(self, rng: random.Random) -> str:
        count = rng.randint(3, 5)
        ids = [f"n{index}" for index in range(1, count + 1)]
        hostile = set(rng.sample(ids, rng.randint(1, count - 2)))
        honest = [node for node in ids if node not in hostile]
        dying = rng.choice(honest)
        settings = ClusterSettings(
            name=CLUSTER,
            vip="198.51.100.10",
            nodes=tuple(
                ClusterNode(
                    node,
                    f"http://{node}.test:8470",
                    "t" * 20,
                    max_concurrency=rng.choice((None, None, 1, 100, 10**9)),
                )
                for node in ids
            ),
            seed=rng.randrange(2**32),
            bucket_count=rng.choice((1, 4, 16, 16, 64, 64, 256)),
            failover_after=FAILOVER_AFTER,
            smoothing=rng.choice((0.3, 1.0)),
            min_rebuild_interval=rng.choice((0.0, 0.2, 1.0)),
            join_after=rng.choice((0.0, 0.5)),
            retry_after=rng.choice((0.0, 0.2)),
            stuck_after=rng.choice((0.5, 2.0)),
        )
        clock = _Clock()
        agents = _Agents(rng, hostile)
        controller = ClusterController(settings, agents, clock)
        dt = rng.choice((0.02, 0.05, 0.1))
        before = rng.randint(5, 30)  # steps before the honest node dies
        dies_at = before
        steps = before + round(FAILOVER_AFTER / dt) + rng.randint(2, 10)
        last_beat: dict[str, float] = {}
        seq = 0
        newest = 0
        outcome = "failed over"  # checked after every tick: reaching the end means it held
        for step in range(steps):
            clock.now += dt
            if step == dies_at:
                agents.dead.add(dying)
            for node in ids:
                seq += 1
                if node in hostile:
                    for _ in range(rng.choice((0, 1, 1, 2, 3))):
                        self._hostile_beat(rng, controller, node, seq, clock.now)
                elif node not in agents.dead:
                    self._honest_beat(
                        rng, controller=controller, agents=agents, node=node, seq=seq, now=clock.now
                    )
                    last_beat[node] = clock.now
            await controller.tick()
            await controller.settle()
            newest = self._check(controller, agents, ids, newest, clock.now)
            if agents.malformed:
                raise Finding(agents.malformed)
            if errors := dict(controller.tick_errors):
                raise Finding(f"a tick part failed: {errors}")
            alive = controller.alive(clock.now)
            for node in honest:
                beat = last_beat.get(node)
                if (
                    node not in agents.dead
                    and beat is not None
                    and controller.table is not None
                    and node not in alive
                ):
                    why = {s.node_id: s.error for s in controller.status()}[node]
                    raise Finding(f"honest node {node} is not alive: {why}")
            table = controller.table
            since = last_beat.get(dying)
            if (
                dying in agents.dead
                and since is not None
                and clock.now - since >= FAILOVER_AFTER
                and alive
                and table is not None
                and table.shares().get(dying, 0)
            ):
                raise Finding(
                    f"{dying} silent for {clock.now - since:.2f} s still has "
                    f"{table.shares()[dying]} buckets (v{table.version}, alive {alive})"
                )
        if controller.table is None:
            return "no table"
        events = {event.what for event in controller.events}
        left_out = [status for status in controller.status() if status.node_id in hostile]
        if any(status.alive for status in left_out):
            outcome += ", hostile alive"
        if "claim refused" in events:
            outcome += ", claim refused"
        if any("has not taken" in (status.error or "") for status in left_out):
            outcome += ", stuck"
        return outcome

    def _honest_beat(
        self,
        rng: random.Random,
        *,
        controller: ClusterController,
        agents: _Agents,
        node: str,
        seq: int,
        now: float,
    ) -> None:
        version = agents.version(node)
        report = Report(
            server_id=node,
            seq=seq,
            time=now,
            in_progress=rng.choice((0, 10, 50, 99)),
            max_concurrency=100,
            table=TableHeld(CLUSTER, version) if version is not None else None,
        )
        self.units += 1
        # The real path: parse_report, observe (its JSON is json.dumps's). Always taken.
        parsed = parse_report(report_to_dict(report))
        controller.observe(parsed, now)

    def _hostile_beat(
        self, rng: random.Random, controller: ClusterController, node: str, seq: int, now: float
    ) -> None:
        self.units += 1
        table = controller.table
        ours = table.version if table is not None else 0
        if rng.random() < 0.25:
            # A Report built without parse_report: the controller must bound it by itself.
            claim = _claim(rng, ours)
            fields: dict[str, Any] = {
                "server_id": node,
                "seq": rng.choice((seq, seq, hostile_number(rng))),
                "time": rng.choice((now, now, hostile_number(rng))),
                "in_progress": rng.choice((0, 100, None, hostile_number(rng))),
                "max_concurrency": rng.choice((100, 1, hostile_number(rng))),
                "error": rng.choice((None, None, hostile_text(rng), hostile_number(rng))),
                "table": rng.choice(
                    (None, TableHeld(CLUSTER, claim), TableHeld(hostile_text(rng), claim))  # type: ignore[arg-type]
                ),
            }
            report = Report(**fields)
        else:
            document: dict[str, Any] = {
                "server_id": node,
                "seq": seq,
                "time": now,
                "in_progress": rng.choice((0, 10, 100, 10**9)),
                "max_concurrency": rng.choice((1, 100, 10**9)),
                "table": rng.choice((None, {"cluster": CLUSTER, "version": _claim(rng, ours)})),
            }
            try:
                if rng.random() < 0.6:
                    document = mutate_document(document, rng, mutations=rng.choice((1, 2, 3)))
                data = json_text(document, rng) if rng.random() < 0.97 else b""
            except (RecursionError, ValueError):
                # Repeated mutations can nest deeper than copy or json can walk: send what the
                # document stands for, deep JSON.
                data = b""
            data = data or deep_json(5000).encode()
            try:
                report = parse_report(json.loads(data))
            except (ValueError, RecursionError, ProtocolError):
                return  # the ingest answers 400/422; nothing reaches the controller
            if report.server_id != node:
                return  # another node's id: the ingest refuses this node's token for it
        with contextlib.suppress(ProtocolError):  # a 400 from the ingest
            controller.observe(report, now)

    def _check(
        self,
        controller: ClusterController,
        agents: _Agents,
        ids: list[str],
        newest: int,
        now: float,
    ) -> int:
        table = controller.table
        if table is None or (table.version == newest and table is self._checked):
            return newest
        self._checked = table
        again = parse_table(table_to_dict(table))
        if again != table:
            raise Finding("the controller's table does not read back equal")
        if table.cluster != CLUSTER or not set(table.nodes) <= set(ids):
            raise Finding(f"the table names {table.cluster!r} / nodes {table.nodes}")
        if table.version < newest:
            raise Finding(f"the table went back from v{newest} to v{table.version}")
        if table.version > MAX_ADOPTED_VERSION + 1000:
            raise Finding(f"the table's version ran up to v{table.version}")
        return table.version


__all__ = ["HeartbeatHarness"]
