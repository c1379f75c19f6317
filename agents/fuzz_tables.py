"""Fuzz harness for dispatch tables: what the manager (or anyone holding a node's token) may push
to a node agent (``POST /v1/table``).

Each input is a fresh :class:`~agents.node_agent.NodeAgent` (a random node id and bucket count)
with a driver that renders the real nftables scripts and keeps them (the ``dry-run`` driver),
failing now and then as ``nft`` may, and a burst of table bodies through
:meth:`~agents.node_agent.NodeAgent.receive_table`, the agent's whole apply path after the
listener: valid tables of this cluster and others, of older, equal and newer versions, mutated
documents (huge and negative numbers, NaN, wrong types, ids with tabs, newlines and lone
surrogates, lists repeated or emptied, deep nesting), bytes that are not JSON or not UTF-8.

Contract checked per body: ``receive_table`` never raises; its answer is JSON-able; a table is
either refused with a 4xx answer carrying an error message (or a 500 when the driver failed) and
changes nothing, or installed exactly: the agent holds what the body says, bucket for bucket,
and the driver accepts exactly this node's active buckets of it, with the table's seed and
count in the rule; the held version never goes back.
"""

from __future__ import annotations

import json
import math
import random
import secrets
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from agents.dispatch_drivers.base import NodeRules
from agents.dispatch_drivers.dry_run import DryRunDriver
from agents.node_agent import NodeAgent, NodeAgentConfig
from agents.vip_connections import VipLoad
from dnslb.config import Secret
from dnslb.dispatch import MAX_BUCKETS, BucketTable, build_table, table_to_dict
from dnslb.errors import ProcessError
from dnslb.fuzzing import (
    Finding,
    Harness,
    deep_json,
    hostile_number,
    hostile_text,
    json_text,
    mutate_bytes,
    mutate_document,
)
from dnslb.report import id_problem

CLUSTER = "vip-1"
VIP = "198.51.100.10"
TOKEN = secrets.token_urlsafe(18)
_NODES = ("n1", "n2", "n3", "n4")
_BUCKET_COUNTS = (1, 4, 64, 256, 1024)


class _FlakyDriver(DryRunDriver):
    """The dry-run driver (real scripts, kept in memory), failing when told to, as nft may:
    then nothing changes, as the real drivers promise."""

    def __init__(self, rules: NodeRules) -> None:
        super().__init__(rules)
        self.fail = False
        self.applied: tuple[int, int, frozenset[int]] | None = None

    def apply(self, buckets: Sequence[int], bucket_count: int, seed: int) -> None:
        if self.fail:
            raise ProcessError("nftables refused the script: Could not process rule: Busy")
        super().apply(buckets, bucket_count, seed)
        self.applied = (bucket_count, seed, frozenset(buckets))


class TableHarness(Harness):
    name = "tables"
    boundary = "dispatch tables pushed to a node agent (the manager, or any holder of its token)"
    suite_inputs = 1500
    unit = "table pushes"  # each input is a fresh agent and a burst of them

    def open(self) -> None:
        # Building tables is the slow part; a few per bucket count serve as bases to vary.
        rng = random.Random(20261123)
        self._bases: dict[int, list[BucketTable]] = {}
        for count in _BUCKET_COUNTS:
            bases = []
            for size in (1, 2, 3, 4):
                nodes = rng.sample(_NODES, size)
                weights = {node: rng.choice((0.0, 1.0, 3.0, 100.0)) for node in nodes}
                bases.append(build_table(CLUSTER, weights, version=1, seed=7, bucket_count=count))
            self._bases[count] = bases

    def one(self, rng: random.Random) -> str:
        count = rng.choice(_BUCKET_COUNTS)
        node_id = rng.choice(_NODES)
        config = NodeAgentConfig(
            cluster=CLUSTER,
            node_id=node_id,
            vip=VIP,
            token=Secret(TOKEN, "env:DNSLB_FUZZ_TOKEN"),
            driver="dry-run",
            bucket_count=count,
        )
        driver = _FlakyDriver(config.rules)
        agent = NodeAgent(config, driver, lambda: VipLoad(0, None), wall_clock=lambda: 1.7e9)
        agent.install()
        outcomes: list[str] = []
        for _ in range(rng.randint(1, 6)):
            body = self._body(rng, count, agent.held)
            driver.fail = rng.random() < 0.05
            outcomes.append(self._push(agent, driver, node_id, body))
        return "+".join(sorted(set(outcomes)))

    def _body(self, rng: random.Random, count: int, held: BucketTable | None) -> bytes:
        choice = rng.random()
        if choice < 0.02:
            return deep_json(rng.choice((100, 5000, 100_000)), opener='{"a":', closer="}").encode()
        if choice < 0.04:
            return rng.choice((b"", b"\xff\xfe", b"9" * 5000, b"[" * 50_000, b"null", b"{}"))
        base = rng.choice(
            self._bases[rng.choice((count, count, count, rng.choice(_BUCKET_COUNTS)))]
        )
        ours = held.version if held is not None else 0
        document: dict[str, Any] = table_to_dict(base)
        document["version"] = rng.choice(
            (ours, ours + 1, ours + 1, ours + 5, max(0, ours - 1), 0, 2**63 - 1, 2**63)
        )
        document["seed"] = rng.choice((7, 0, 2**32 - 1, rng.randrange(2**32)))
        if rng.random() < 0.05:
            document["cluster"] = rng.choice(("vip-2", hostile_text(rng)))
        if held is not None and rng.random() < 0.1:
            document = table_to_dict(held)  # the same again, or the same version changed
            if rng.random() < 0.5:
                document["seed"] = (held.seed + 1) % 2**32
        try:
            if rng.random() < 0.5:
                document = mutate_document(document, rng, mutations=rng.choice((1, 1, 2, 5)))
            buckets = document.get("buckets") if isinstance(document, dict) else None
            if isinstance(buckets, list) and len(buckets) > 2 * MAX_BUCKETS:
                # Repeated repeats make millions of pairs: a few more than allowed say as much
                # and keep the input fast to build (bodies past 4 MiB are refused unread).
                document = {**document, "buckets": buckets[: 2 * MAX_BUCKETS]}
            if rng.random() < 0.05 and isinstance(document, dict):
                # A new dict: mutate_document may hand back the engine's own hostile values.
                document = {**document, rng.choice(("version", "seed")): hostile_number(rng)}
            data = json_text(document, rng)
        except (RecursionError, ValueError):
            # Repeated mutations can nest a document deeper than copy or json can walk (or
            # share a value into itself): what it stands for is deep JSON, so send that.
            data = deep_json(rng.choice((1000, 5000))).encode()
        if rng.random() < 0.05:
            data = mutate_bytes(data, rng, mutations=rng.choice((1, 4)))
        return data

    def _push(self, agent: NodeAgent, driver: _FlakyDriver, node_id: str, body: bytes) -> str:
        self.units += 1
        before = agent.held
        applied_before = driver.applied
        reply = agent.receive_table(body)
        try:
            json.dumps(reply.body)
        except (TypeError, ValueError) as exc:
            raise Finding(f"the answer is not JSON-able: {exc}") from None
        status = int(reply.status)
        if status != HTTPStatus.OK:
            error = reply.body.get("error")
            if not isinstance(error, str) or not error:
                raise Finding(f"a {status} without an error message: {reply.body!r}")
            if agent.held is not before or driver.applied != applied_before:
                raise Finding(f"a {status} ({error[:200]}) changed what the node holds")
            if status == HTTPStatus.INTERNAL_SERVER_ERROR:
                if not driver.fail:
                    raise Finding(f"a 500 without a driver failure: {error[:200]}")
                return "driver failed"
            if not 400 <= status < 500:
                raise Finding(f"status {status}: {error[:200]}")
            return "conflict" if status == HTTPStatus.CONFLICT else "refused"
        held = agent.held
        if held is None:
            raise Finding("200, and the node holds nothing")
        document = json.loads(body)  # it was accepted, so it is JSON
        expected = (
            document["cluster"],
            document["version"],
            document["seed"],
            tuple((active, backup) for active, backup in document["buckets"]),
        )
        if (held.cluster, held.version, held.seed, held.buckets) != expected:
            raise Finding("the table held is not the table pushed")
        if any(id_problem(node) for node in held.nodes):
            raise Finding(f"installed a table naming {held.nodes!r}")
        if held.cluster != CLUSTER or held.bucket_count != agent.config.bucket_count:
            raise Finding(f"installed a table of {held.cluster!r} with {held.bucket_count} buckets")
        if before is not None and held.version < before.version:
            raise Finding(f"went back from v{before.version} to v{held.version}")
        if reply.body.get("unchanged"):
            if held != before:
                raise Finding("'unchanged' but the table changed")
            return "unchanged"
        mine = frozenset(held.active_buckets(node_id))
        if driver.applied != (held.bucket_count, held.seed, mine):
            raise Finding(f"the driver accepts {driver.applied}, not this node's buckets")
        if reply.body.get("buckets") != sorted(mine) or reply.body.get("version") != held.version:
            raise Finding("the answer does not say what the node holds")
        script = driver.scripts[-1]
        if f"mod {held.bucket_count} seed {held.seed:#x}" not in script:
            raise Finding("the rule does not carry the table's count and seed")
        if not math.isfinite(float(reply.body.get("applied_ms", 0))):
            raise Finding("applied_ms is not a number")
        return "applied"


__all__ = ["TableHarness"]
