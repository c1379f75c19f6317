"""Fuzz harness for agents' reports: what a cache server holding a token may post to the manager.

Each input is a fresh manager (a pool of static members, one with a token of its own, on a fake
clock, its state and plan in a temporary directory) and a burst of report bodies: valid reports
with values over their whole ranges, reports mutated in any field (huge integers, NaN, strings,
nesting, unknown fields), bytes that are not JSON, deep JSON, for known and unknown servers,
with the right token, the shared one, or another's. Between reports the manager ticks, and
the pipe backends' stats documents beside the plan (answer counts, answers held: any writer of
the plan store's) are now and then replaced by mutated ones.

Contract checked per input: ``accept`` either records a report or raises ``Rejected`` with a 4xx
status; no tick fails (``tick_errors`` and per-part errors stay 0); every plan the manager says it
published is the plan at its location, readable by the pipe backend's parser, and each of its
pools' answers can be computed, with k from the policy's (2) to every member; a server that
sent nothing bad is in the plan.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from dnslb.clock import FakeClock
from dnslb.fuzzing import Finding, Harness, deep_json, json_text, mutate_document
from dnslb.plan import parse_plan_json
from dnslb.selection import pool_answers
from manager.config import load_manager_config
from manager.ingest import Rejected
from manager.service import Manager

# Tokens made for each run (environment variables the config refers to, as in production).
TOKEN, OWN_TOKEN, CALM_TOKEN = (secrets.token_urlsafe(18) for _ in range(3))

_CONFIG = """
zones:
  - name: example.test
    ns: [ns1.example.test]
auth:
  agent_token: env:DNSLB_FUZZ_AGENT_TOKEN
plan: {stale_after: 30, refresh: 5}
down_after: 3
pools:
  - name: www
    zone: example.test
    policy: {k: 2, slow_start: 0}
    members:
      - {id: s1, address: 10.0.0.1}
      - {id: s2, address: 10.0.0.2}
      - {id: s3, address: "2001:db8::3", token: env:DNSLB_FUZZ_OWN_TOKEN}
      - {id: calm, address: 10.0.0.4, max_concurrency: 100, token: env:DNSLB_FUZZ_CALM_TOKEN}
"""
_SERVERS = ("s1", "s2", "s3", "calm", "nobody", "")


def _report(rng: random.Random, clock: FakeClock, seq: int) -> dict[str, Any]:
    in_progress = rng.choice((0, 1, 50, 99, 10**9, None))
    return {
        "server_id": rng.choice(_SERVERS),
        "seq": seq,
        "time": clock.time(),
        "in_progress": in_progress,
        "max_concurrency": rng.choice((1, 100, 10**9)),
        "cpu": rng.choice((None, 0.0, 0.5, 1.0)),
        "mem": rng.choice((None, 0.3)),
        "served_total": rng.choice((None, 0, 12345, 2**63 - 1)),
        "error": None if in_progress is not None else rng.choice(("nginx down", "é\ud800")),
    }


class ReportHarness(Harness):
    name = "reports"
    boundary = "POST /v1/reports bodies from agents (any token holder), through ingest and ticks"
    suite_inputs = 300
    unit = "report bodies"
    deadline = 5.0

    def open(self) -> None:
        os.environ["DNSLB_FUZZ_AGENT_TOKEN"] = TOKEN
        os.environ["DNSLB_FUZZ_OWN_TOKEN"] = OWN_TOKEN
        os.environ["DNSLB_FUZZ_CALM_TOKEN"] = CALM_TOKEN
        self.directory = Path(tempfile.mkdtemp(prefix="dnslb-fuzz-reports-"))
        self.count = 0

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def one(self, rng: random.Random) -> str:
        self.count += 1
        where = self.directory / str(self.count)
        where.mkdir()
        (where / "manager.yaml").write_text(_CONFIG)
        clock = FakeClock()
        manager = Manager(load_manager_config(where / "manager.yaml"), clock=clock)
        try:
            outcome = self._burst(rng, manager, clock, where)
        finally:
            manager.store.close()
            shutil.rmtree(where, ignore_errors=True)
        return outcome

    def _burst(self, rng: random.Random, manager: Manager, clock: FakeClock, where: Path) -> str:
        seq = 10**12
        calm = 10**12
        rejected = accepted = 0
        for _ in range(rng.randint(1, 30)):
            seq += rng.choice((1, 1, 1, 0, -5, 2**40))
            document: object = _report(rng, clock, max(seq, 0))
            if rng.random() < 0.6:
                document = mutate_document(document, rng, mutations=rng.choice((1, 2, 3)))
            body = json_text(document, rng) if rng.random() > 0.02 else deep_json(50_000).encode()
            server = document.get("server_id") if isinstance(document, dict) else None
            token = rng.choice((TOKEN, TOKEN, OWN_TOKEN, "wrong", ""))
            if server == "s3" and rng.random() < 0.8:
                token = OWN_TOKEN
            self.units += 1
            try:
                manager.ingest.accept(token, body)
                accepted += 1
            except Rejected as refusal:
                if not 400 <= refusal.status < 500:
                    raise Finding(f"a refusal with status {refusal.status}") from None
                rejected += 1
            if rng.random() < 0.3:
                _write_stats(rng, where)
            # "calm" always reports sanely: whatever the others sent, it stays in the plan.
            calm += 1
            manager.ingest.accept(CALM_TOKEN, json.dumps(_calm(clock, calm)).encode())
            if rng.random() < 0.4:
                clock.advance(rng.choice((0.1, 1.0, 4.0, 25.0)))
                self._tick(manager, where)
        clock.advance(1.0)
        manager.ingest.accept(CALM_TOKEN, json.dumps(_calm(clock, calm + 1)).encode())
        self._tick(manager, where)
        plan = manager.plan
        if plan is not None and "calm" not in {m.id for m in plan.pools[0].members}:
            raise Finding("a server that sent nothing bad is not in the plan")
        return "accepted" if accepted and not rejected else "mixed" if accepted else "refused"

    def _tick(self, manager: Manager, where: Path) -> None:
        manager._safe_tick()
        if manager.tick_errors or any(manager.part_errors.values()):
            raise Finding(f"a tick failed: {manager.tick_errors}, {dict(manager.part_errors)}")
        if manager.plans_refused:
            raise Finding(f"the manager built a plan a backend refuses: {manager.plan_problem}")
        if manager.plan is None:
            return
        on_disk = parse_plan_json((where / "plan.json").read_bytes())
        if on_disk.version != manager.plan.version:
            raise Finding(f"manager says v{manager.plan.version}, v{on_disk.version} is published")
        for pool in on_disk.pools:
            pool_answers(pool)
            if not 2 <= pool.k <= max(2, len(pool.members)):
                raise Finding(f"k {pool.k} for {len(pool.members)} members (policy: 2)")
            if not 1 <= pool.ttl_floor <= 5:
                raise Finding(f"TTL floor {pool.ttl_floor} (policy: 5, at least 1)")
        manager.answer_counts()
        manager.answers_held()


def _write_stats(rng: random.Random, where: Path) -> None:
    """A pipe backend's stats document beside the plan, often mutated (once the manager has
    opened the channel, at its first publication)."""
    stats = where / ".plan.json.stats"
    if not stats.is_dir():
        return
    given = rng.choice((0, 1, 10**6, 2**63 - 1))
    document: object = {
        "process": "fuzz",
        "written_at": time.time(),
        "requests": given,
        "pools": {"www.example.test": {"calm": [given, given], "s1": [1, 2]}},
        "held": {"www.example.test": {"A": [given, rng.choice((0, 1, 60 * given))]}},
    }
    if rng.random() < 0.7:
        document = mutate_document(document, rng, mutations=rng.choice((1, 2, 3)))
    name = rng.choice(("p1", "p2", "p3"))
    (stats / f"{name}.json").write_bytes(json_text(document, rng))


def _calm(clock: FakeClock, seq: int) -> dict[str, Any]:
    return {
        "server_id": "calm",
        "seq": seq,
        "time": clock.time(),
        "in_progress": 10,
        "max_concurrency": 100,
    }


__all__ = ["ReportHarness"]
