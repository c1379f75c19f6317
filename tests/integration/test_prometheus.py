"""The shipped alerting rules in Debian's Prometheus, scraping a running manager.

promtool checks the rules and runs their unit tests (``deploy/prometheus/dnslb.rules.test.yml``).
Then a real ``prometheus`` on loopback (its own configuration, storage and port in the test's
directory: never the system's service) scrapes a manager process with a read token, every
second, with the shipped rules loaded (only their ``for:`` durations cut to 1 s). Every rule must
evaluate without error against the real metrics, and every metric the rules read must be
exported (but those of clusters and pipe backends' counts, which this stack has none of). A
memory-provider pool whose launches all fail puts launching on hold: DnslbLaunchesPaused fires.
Then the agents are stopped, and DnslbPoolNoEligibleServer and DnslbServerDown must fire.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from daemons.process import free_port, http_answers, spawn, stop_group
from tests.integration.stack import AGENT_TOKEN, LoadBoard, ManagerProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "dnslb.rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "dnslb.rules.test.yml"
READ_TOKEN = "prometheus-read-token-0123456789"
SERVERS = {"s1": "127.0.1.31", "s2": "127.0.1.32"}

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("prometheus") is None or shutil.which("promtool") is None,
        reason="Debian's prometheus package (prometheus, promtool) is not installed: "
        "scripts/install installs it",
    ),
]

CONFIG = """
zones:
  - name: example.test
    ns: [ns1.example.test]
    records: [{{name: ns1, type: A, content: 127.0.0.1}}]
auth:
  agent_token: env:DNSLB_AGENT_TOKEN
  api_tokens: [{{token: "file:{token}", role: read}}]
down_after: 2
tick: 0.5
plan: {{refresh: 2, stale_after: 30}}
pools:
  - name: www
    zone: example.test
    policy: {{k: 2, slow_start: 0, smoothing: 1}}
    members:
{members}
  - name: auto
    zone: example.test
    provider: {{type: memory, fail_launches: 1000}}
    scaling: {{min_servers: 1, max_servers: 2}}
    lifecycle: {{max_failed_launches: 2, launch_backoff: 600, launch_backoff_start: 600}}
"""

# Exported only with a single-IP cluster or pipe backends' answer counts, neither here.
ABSENT_HERE = {
    "dnslb_cluster_failovers_total",
    "dnslb_cluster_tick_errors_total",
    "dnslb_cluster_node_alive",
    "dnslb_server_first_answers_total",
}


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert "SUCCESS" in checked
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert "SUCCESS" in tested


def promtool(*args: str) -> str:
    done = subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=60, check=False
    )
    output = done.stdout + done.stderr
    print(output)
    assert done.returncode == 0, output
    return output


class Prometheus:
    """``prometheus`` on a free loopback port, its configuration and storage in ``workdir``."""

    def __init__(self, workdir: Path, target: str, rules: Path, token_file: Path) -> None:
        self.workdir = workdir
        self.port = free_port(kinds=("tcp",))
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": "dnslb",
                    "authorization": {"credentials_file": str(token_file)},
                    "static_configs": [{"targets": [target]}],
                }
            ],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        self.process = spawn(
            [
                "prometheus",
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            name="prometheus",
            ready=lambda _: http_answers(f"{self.url}/-/ready"),
            log=self.workdir / "prometheus.log",
            timeout=30,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            stop_group(self.process, timeout=10)

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=5) as answer:
            document = json.load(answer)
        assert document["status"] == "success", document
        return document["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def firing(self, alertname: str) -> list[dict[str, str]]:
        return [
            alert["labels"]
            for alert in self.api("alerts")["alerts"]
            if alert["labels"]["alertname"] == alertname and alert["state"] == "firing"
        ]


def fast_rules(directory: Path) -> Path:
    """The shipped rules with every ``for:`` cut to 1 s, and nothing else changed."""
    text = RULES.read_text()
    fast, count = re.subn(r"(?m)^(\s+for: )\S+$", r"\g<1>1s", text)
    assert count == text.count("- alert: ")
    path = directory / "dnslb.rules.yml"
    path.write_text(fast)
    return path


def start_agent(workdir: Path, manager: ManagerProcess, board: LoadBoard, server: str) -> Any:
    token_file = workdir / "agent.token"
    token_file.write_text(AGENT_TOKEN + "\n")
    config = workdir / f"agent-{server}.yaml"
    config.write_text(
        f"server_id: {server}\n"
        f"manager_url: {manager.url}\n"
        f"token: file:{token_file}\n"
        "interval: 0.5\n"
        f"source: {{type: json, url: '{board.url(server)}'}}\n"
    )
    with open(workdir / f"agent-{server}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "cli", "agent", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ManagerProcess]:
    token_file = tmp_path / "read.token"
    token_file.write_text(READ_TOKEN + "\n")
    members = "\n".join(
        f"      - {{id: {server}, address: {address}}}" for server, address in SERVERS.items()
    )
    config = CONFIG.format(token=token_file, members=members)
    with ManagerProcess(tmp_path / "manager", config) as running:
        yield running


def test_alerts_fire_in_prometheus_when_the_agents_stop(
    tmp_path: Path, manager: ManagerProcess
) -> None:
    started = time.monotonic()
    rules = fast_rules(tmp_path)
    promtool("check", "rules", str(rules))
    agents: dict[str, subprocess.Popen[bytes]] = {}
    with (
        LoadBoard() as board,
        Prometheus(
            tmp_path / "prometheus", f"127.0.0.1:{manager.port}", rules, tmp_path / "read.token"
        ) as prometheus,
    ):
        board.load.update(dict.fromkeys(SERVERS, 20))
        try:
            for server in SERVERS:
                agents[server] = start_agent(tmp_path, manager, board, server)

            # Scraped with the read token, the manager publishing: both servers answered.
            def answered() -> bool:
                found = prometheus.query('dnslb_pool_plan_members{pool="www", state="active"}')
                return bool(found) and found[0]["value"][1] == "2"

            assert wait_until(answered, 20, 0.2) is not None, prometheus.api("targets")
            [target] = prometheus.api("targets")["activeTargets"]
            assert target["health"] == "up", target

            # Every rule evaluates without error on the real metrics.
            shipped = sum(
                len(group["rules"]) for group in yaml.safe_load(RULES.read_text())["groups"]
            )

            def rule_health() -> dict[str, tuple[str, str | None]]:
                groups = prometheus.api("rules")["groups"]
                found = [rule for group in groups for rule in group["rules"]]
                return {rule["name"]: (rule["health"], rule.get("lastError")) for rule in found}

            assert wait_until(
                lambda: all(state != "unknown" for state, _ in rule_health().values()), 10, 0.2
            )
            health = rule_health()
            assert len(health) == shipped
            assert all(state == "ok" for state, _ in health.values()), health

            # Every metric the rules read is exported (but for clusters and answer counts).
            exported = set(prometheus.api("label/__name__/values"))
            used = set(re.findall(r"(?<![:\w])(dnslb_[a-z_]+)", rules.read_text()))
            assert used - exported == ABSENT_HERE

            # The memory pool's launches all fail: after two in a row, launching is on hold.
            assert wait_until(lambda: prometheus.firing("DnslbLaunchesPaused"), 15, 0.2)
            assert [a["pool"] for a in prometheus.firing("DnslbLaunchesPaused")] == ["auto"]
            assert not prometheus.firing("DnslbPoolNoEligibleServer")

            stopped = time.monotonic()
            for agent in agents.values():
                stop_group(agent)

            def fired() -> bool:
                pools = {a["pool"] for a in prometheus.firing("DnslbPoolNoEligibleServer")}
                down = {a["server"] for a in prometheus.firing("DnslbServerDown")}
                return pools == {"www"} and down == set(SERVERS)

            took = wait_until(fired, 30, 0.2)
            print(
                f"DnslbPoolNoEligibleServer and DnslbServerDown firing {took} s after the agents "
                f"stopped (down_after 2 s, scrape and evaluation every 1 s, for: 1 s)"
            )
            assert took is not None, prometheus.api("alerts")
            alert = next(
                a
                for a in prometheus.api("alerts")["alerts"]
                if a["labels"]["alertname"] == "DnslbPoolNoEligibleServer"
            )
            assert alert["labels"]["severity"] == "critical"
            assert alert["annotations"]["summary"] == "pool www: no server can be answered"
            assert alert["annotations"]["runbook_url"] == "docs/alerts.md#dnslbpoolnoeligibleserver"
            assert time.monotonic() - stopped < 30
        finally:
            for agent in agents.values():
                stop_group(agent)
    print(f"whole test: {time.monotonic() - started:.1f} s")
