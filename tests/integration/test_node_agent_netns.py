"""The real ``dnslb node-agent`` process with the nftables driver, in a fresh network namespace:
what it does with a table it did not create, and its push listener under 200 slow connections.

The figures (push latency idle and while the listener is full of strangers, the agent's threads)
are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dnslb.dispatch import build_table, table_to_json
from tests.integration.cluster_lab import wait_until, why_not_runnable
from tests.integration.test_nftables_driver import elements, in_netns

pytestmark = pytest.mark.integration

VIP = "198.18.0.100"
TOKEN = "integration-token-0123456789"
PORT = 8470
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def netns() -> Iterator[str]:
    reason = why_not_runnable()
    if reason:
        pytest.skip(reason)
    name = f"dlagt{random.randrange(1 << 30):x}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def agent_argv(*extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cli",
        "node-agent",
        "--cluster",
        "lab",
        "--node-id",
        "n1",
        "--vip",
        VIP,
        "--listen",
        f"127.0.0.1:{PORT}",
        "--token-env",
        "DNSLB_TEST_NODE_TOKEN",
        "--bucket-count",
        "256",
        *extra,
    ]


def start_agent(ns: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, *agent_argv(*extra)],
        cwd=REPO,
        env={**os.environ, "DNSLB_TEST_NODE_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_agent_refuses_a_table_it_did_not_create_and_leaves_it(netns: str):
    firewall = "table ip filter {\n chain input {\n  type filter hook input priority filter;\n"
    firewall += "  tcp dport 22 accept\n }\n}\n"
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=firewall, text=True, check=True
    )
    before = subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "list", "ruleset"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    agent = start_agent(netns, "--nft-table", "filter")
    output, _ = agent.communicate(timeout=60)
    assert agent.returncode == 1
    assert "not created by a dnslb node agent" in output
    assert "Traceback" not in output
    after = subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "list", "ruleset"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert after == before


def push(client: httpx.Client, version: int) -> tuple[int, float]:
    table = build_table("lab", {"n1": 1.0, "n2": 1.0}, version=version, seed=9, bucket_count=256)
    started = time.perf_counter()
    answer = client.post(
        f"http://127.0.0.1:{PORT}/v1/table",
        content=table_to_json(table),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    return answer.status_code, (time.perf_counter() - started) * 1000


def test_the_managers_push_gets_through_200_slow_connections(netns: str):
    agent = start_agent(netns)
    slow: list[socket.socket] = []
    try:

        def ready() -> bool:
            def probe() -> bool:
                try:
                    with socket.create_connection(("127.0.0.1", PORT), timeout=1):
                        return True
                except OSError:
                    return False

            return bool(in_netns(netns, probe))

        assert wait_until(ready, timeout=30, interval=0.1), "the agent did not listen"

        def idle_pushes() -> list[tuple[int, float]]:
            with httpx.Client(timeout=10) as client:
                return [push(client, version) for version in range(1, 21)]

        idle = in_netns(netns, idle_pushes)

        def open_slow() -> list[socket.socket]:
            sockets = []
            for _ in range(200):
                conn = socket.create_connection(("127.0.0.1", PORT), timeout=10)
                conn.sendall(b"POST /v1/table HTTP/1.1\r\nHost: x\r\nContent-Length: 999\r\n")
                sockets.append(conn)
            return sockets

        slow = in_netns(netns, open_slow)  # type: ignore[assignment]
        threads = len(os.listdir(f"/proc/{agent.pid}/task"))

        def loaded_pushes() -> list[tuple[int, float]]:
            with httpx.Client(timeout=10) as client:
                return [push(client, version) for version in range(21, 41)]

        loaded = in_netns(netns, loaded_pushes)
        assert [status for status, _ in idle + loaded] == [200] * 40  # type: ignore[operator]
        held = build_table("lab", {"n1": 1.0, "n2": 1.0}, version=40, seed=9, bucket_count=256)
        active = set(elements(netns, "active"))
        assert active == set(held.active_buckets("n1"))
        # One thread per connection would be 200 more; the agent runs a fixed handful.
        assert threads <= 8
        idle_ms = [ms for _, ms in idle]  # type: ignore[union-attr]
        loaded_ms = [ms for _, ms in loaded]  # type: ignore[union-attr]
        print(
            f"\npush + apply (256 buckets, libnftables), median / max: idle "
            f"{statistics.median(idle_ms):.1f} / {max(idle_ms):.1f} ms; with 200 slow "
            f"connections held {statistics.median(loaded_ms):.1f} / {max(loaded_ms):.1f} ms; "
            f"agent threads {threads}"
        )
    finally:
        for conn in slow:
            conn.close()
        agent.terminate()
        output, _ = agent.communicate(timeout=30)
    assert agent.returncode == 0, output[-2000:]
    assert "stopped, fenced" in output
