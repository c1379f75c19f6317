"""Several DNS hosts: two real pdns_server, each with its pipe backends, read the plan one real
manager publishes to one real Redis; both answer from it, and the manager sums the answer counts
of every pipe backend of both (the ``dnslb_server_answers`` metric, the intended shares of
issue 17's loop)."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from daemons.pdns import PdnsServer, PdnsSettings
from daemons.process import free_port
from tests.integration.stack import AGENT_TOKEN, ManagerProcess, Resolver, wait_until
from tests.integration.test_redis_store import Redis

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("redis-server") is None, reason="redis-server is not installed"
    ),
]

ADDRESSES = {"s1": "127.0.1.21", "s2": "127.0.1.22"}


def config(redis_url: str) -> str:
    members = "\n".join(f"      - {{id: {sid}, address: {a}}}" for sid, a in ADDRESSES.items())
    return f"""
zones:
  - name: example.test
    ns: [ns1.example.test]
    records: [{{name: ns1, type: A, content: 127.0.0.1}}]
auth: {{agent_token: env:DNSLB_AGENT_TOKEN, metrics_public: true}}
down_after: 30
tick: 0.5
plan: {{store: "{redis_url}", refresh: 2, stale_after: 30}}
pools:
  - name: www
    zone: example.test
    policy: {{k: 2, slow_start: 0}}
    members:
{members}
"""


def report(manager: ManagerProcess, server: str, seq: int) -> None:
    body = {
        "server_id": server,
        "seq": seq,
        "time": time.time(),
        "in_progress": 1,
        "max_concurrency": 100,
    }
    assert manager.post_report(AGENT_TOKEN, json.dumps(body).encode()) in (200, 202, 204)


def answers_counted(manager: ManagerProcess) -> dict[str, float]:
    with urllib.request.urlopen(f"{manager.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    counted = {}
    for line in text.splitlines():
        if line.startswith("dnslb_server_answers_total{"):
            server = line.split('server="')[1].split('"')[0]
            counted[server] = float(line.rsplit(" ", 1)[1])
    return counted


def test_two_dns_hosts_answer_from_one_plan_and_the_manager_sums_their_counts(
    tmp_path: Path,
) -> None:
    redis = Redis(free_port(), tmp_path / "redis", None)
    (tmp_path / "redis").mkdir()
    redis.start()
    hosts: list[PdnsServer] = []
    try:
        with ManagerProcess(tmp_path / "manager", config(redis.url())) as manager:
            for seq in (1, 2):
                for server in ADDRESSES:
                    report(manager, server, seq)
                time.sleep(0.6)
            for name in ("dns-a", "dns-b"):
                settings = PdnsSettings(plan=redis.url(), port=free_port())
                host = PdnsServer(settings, tmp_path / name)
                host.start(probe_name="example.test")
                hosts.append(host)
            asked = {0: 30, 1: 20}
            for index, count in asked.items():
                resolver = Resolver(hosts[index].settings.port)
                for _ in range(count):
                    addresses, _ = resolver.ask("www.example.test")
                    assert sorted(addresses) == sorted(ADDRESSES.values())  # k = 2 of 2
            # Each pipe backend writes its counts every 5 s (and when it stops): the manager
            # sums the documents of all four coprocesses of both hosts.
            total = sum(asked.values())
            assert wait_until(
                lambda: answers_counted(manager) == dict.fromkeys(ADDRESSES, float(total)),
                timeout=20,
                interval=0.5,
            ), answers_counted(manager)
    finally:
        for host in hosts:
            host.stop()
        redis.stop()
