"""The manager, three real agents and a real pdns_server with the pipe backend, end to end.

Each agent reads its server's load from a status endpoint the test controls (the agent's ``json``
source), so the test decides utilization; everything else is the product: agents post reports
over HTTP, the manager decides and publishes, PowerDNS answers through the pipe backend.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from daemons.pdns import PdnsServer
from daemons.process import stop_group
from tests.integration.stack import (
    AGENT_TOKEN,
    LoadBoard,
    ManagerProcess,
    Resolver,
    events,
    start_pdns,
    wait_until,
)

pytestmark = pytest.mark.integration

ADDRESSES = {"s1": "127.0.1.11", "s2": "127.0.1.12", "s3": "127.0.1.13"}
CONFIG = f"""
zones:
  - name: example.test
    ns: [ns1.example.test]
    records: [{{name: ns1, type: A, content: 127.0.0.1}}]
auth: {{agent_token: env:DNSLB_AGENT_TOKEN}}
down_after: 3
tick: 0.5
plan: {{refresh: 2, stale_after: 30}}
pools:
  - name: www
    zone: example.test
    policy: {{k: 3, ttl_max: 60, ttl_min: 5, th_over: 0.8, hysteresis: 0.1, smoothing: 1,
              slow_start: 0}}
    members:
{chr(10).join(f"      - {{id: {sid}, address: {addr}}}" for sid, addr in ADDRESSES.items())}
"""


@dataclass
class Stack:
    manager: ManagerProcess
    pdns: PdnsServer
    board: LoadBoard
    agents: dict[str, subprocess.Popen[bytes]]
    workdir: Path

    def answers(self) -> tuple[set[str], int]:
        addresses, ttl = Resolver(self.pdns.settings.port).ask("www.example.test")
        return set(addresses), ttl

    def answered_in_a_row(self, present: set[str] | None = None, absent: str | None = None) -> bool:
        """Ten fresh answers (through every pipe coprocess) agree."""
        for _ in range(10):
            addresses, _ = self.answers()
            if absent is not None and absent in addresses:
                return False
            if present is not None and not present <= addresses:
                return False
        return True

    def start_agent(self, server: str) -> None:
        token_file = self.workdir / "agent.token"
        config = self.workdir / f"agent-{server}.yaml"
        config.write_text(
            f"server_id: {server}\n"
            f"manager_url: {self.manager.url}\n"
            f"token: file:{token_file}\n"
            "interval: 0.5\n"
            f"source: {{type: json, url: '{self.board.url(server)}'}}\n"
        )
        with open(self.workdir / f"agent-{server}.log", "ab") as log:
            self.agents[server] = subprocess.Popen(
                [sys.executable, "-m", "cli", "agent", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    (tmp_path / "agent.token").write_text(AGENT_TOKEN + "\n")
    with LoadBoard() as board, ManagerProcess(tmp_path / "manager", CONFIG) as manager:
        board.load.update(dict.fromkeys(ADDRESSES, 10))
        built = Stack(manager, None, board, {}, tmp_path)  # type: ignore[arg-type]
        for server in ADDRESSES:
            built.start_agent(server)
        try:
            built.pdns = start_pdns(tmp_path, manager.plan_path)
            yield built
        finally:
            if built.pdns is not None:
                built.pdns.stop()
            for agent in built.agents.values():
                stop_group(agent)


def test_overload_ttl_silence_restart_and_bad_reports(stack: Stack) -> None:
    everyone = set(ADDRESSES.values())
    assert wait_until(lambda: stack.answered_in_a_row(present=everyone), 20) is not None
    _, calm_ttl = stack.answers()
    assert calm_ttl == 60  # every server at 0.1: the TTL maximum

    # One server above th_over leaves the answers within 2 s, and comes back after it recovers.
    stack.board.load["s2"] = 95
    left_after = wait_until(lambda: stack.answered_in_a_row(absent=ADDRESSES["s2"]), 10, 0.05)
    print(f"overloaded s2 left the answers after {left_after} s")
    assert left_after is not None and left_after <= 2.0
    stack.board.load["s2"] = 10
    back_after = wait_until(lambda: stack.answered_in_a_row(present=everyone), 15)
    print(f"recovered s2 was back after {back_after} s")
    assert back_after is not None

    # TTLs shorten as load rises.
    for server in ADDRESSES:
        stack.board.load[server] = 70
    assert wait_until(lambda: all(stack.answers()[1] < calm_ttl for _ in range(10)), 10)
    _, busy_ttl = stack.answers()
    print(f"TTL at utilization 0.1: {calm_ttl} s; at 0.7: {busy_ttl} s")
    assert 5 <= busy_ttl < calm_ttl
    for server in ADDRESSES:
        stack.board.load[server] = 10

    # A killed agent takes its server out after down_after (3 s).
    stack.agents["s3"].send_signal(signal.SIGKILL)
    stack.agents["s3"].wait()
    gone_after = wait_until(lambda: stack.answered_in_a_row(absent=ADDRESSES["s3"]), 15)
    print(f"silent s3 left the answers after {gone_after} s (down_after 3 s)")
    assert gone_after is not None and gone_after >= 1.5
    assert any(
        e["server"] == "s3" and "active -> down: no report for" in change(e)
        for e in events(stack.manager)
    )

    # Bad reports get a clear 4xx.
    good = {
        "server_id": "s1",
        "seq": 1,
        "time": time.time(),
        "in_progress": 1,
        "max_concurrency": 10,
    }
    cases = {
        "no token": (None, json.dumps(good).encode(), 401),
        "wrong token": ("nope", json.dumps(good).encode(), 401),
        "not json": (AGENT_TOKEN, b"{{{", 400),
        "bad values": (AGENT_TOKEN, json.dumps({**good, "in_progress": -1}).encode(), 422),
        "unknown server": (AGENT_TOKEN, json.dumps({**good, "server_id": "s9"}).encode(), 404),
        "stale seq": (AGENT_TOKEN, json.dumps(good).encode(), 409),
    }
    statuses = {
        name: stack.manager.post_report(token, body) for name, (token, body, _) in cases.items()
    }
    print(f"bad reports: {statuses}")
    assert statuses == {name: status for name, (_, _, status) in cases.items()}

    # A restart keeps the state; DNS keeps answering meanwhile from the last plan.
    before = events(stack.manager)
    version_before = json.loads(stack.manager.plan_path.read_text())["version"]
    assert stack.manager.stop() == 0
    addresses, _ = stack.answers()
    assert addresses  # the pipe backends serve the last plan while the manager is away
    stack.manager.start()
    assert events(stack.manager)[: len(before)] == before

    def version() -> int:
        return int(json.loads(stack.manager.plan_path.read_text())["version"])

    # s3 stays silent, so the restarted manager publishes only after down_after (3 s): never
    # an all-healthy plan on old news; then its versions go on from where they were.
    published_after = wait_until(lambda: version() > version_before, 20)
    print(f"restarted manager published v{version()} after {published_after} s")
    assert published_after is not None and published_after >= 2.0
    assert wait_until(
        lambda: stack.answered_in_a_row(present={ADDRESSES["s1"], ADDRESSES["s2"]}), 20
    )
    assert ADDRESSES["s3"] not in stack.answers()[0]  # still silent: still down


def change(event: dict[str, Any]) -> str:
    """An event as ``from -> to: reason`` (a state change) or its reason."""
    if event.get("to_state") is None:
        return str(event["reason"])
    return f"{event['from_state']} -> {event['to_state']}: {event['reason']}"
