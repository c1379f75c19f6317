"""The node agent over real HTTP on loopback, with the dry-run driver (no root needed)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.dispatch_drivers import DRIVERS, NodeRules, create_driver
from agents.dispatch_drivers.dry_run import DryRunDriver
from agents.node_agent import (
    AgentHttpServer,
    ManagerLink,
    NodeAgent,
    NodeAgentConfig,
    heartbeat_loop,
    read_token,
    run,
)
from agents.vip_connections import VipLoad
from dnslb.dispatch import build_table, table_to_dict, table_to_json
from dnslb.errors import ConfigError, ProcessError
from dnslb.report import parse_report
from manager.clusters import ClusterNode, HttpTablePusher

TOKEN = "s3cret-token-for-tests"
VIP = "198.51.100.10"


def config(**changes: Any) -> NodeAgentConfig:
    values: dict[str, Any] = {
        "cluster": "vip-1",
        "node_id": "n1",
        "vip": VIP,
        "token": TOKEN,
        "driver": "dry-run",
        "bucket_count": 64,
    }
    values.update(changes)
    return NodeAgentConfig(**values)


class Served:
    def __init__(self, agent: NodeAgent, driver: DryRunDriver, url: str) -> None:
        self.agent, self.driver, self.url = agent, driver, url

    def push(self, body: bytes | str, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.post(self.url + "/v1/table", content=body, headers=headers)


@pytest.fixture
def served() -> Iterator[Served]:
    driver = DryRunDriver(NodeRules(vip=VIP))
    agent = NodeAgent(config(), driver, lambda: VipLoad(3, None))
    agent.install()
    server = AgentHttpServer(("127.0.0.1", 0), agent)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield Served(agent, driver, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def table(version: int, **weights: float):
    return build_table(
        "vip-1", weights or {"n1": 1, "n2": 1}, version=version, seed=7, bucket_count=64
    )


def test_starts_fenced(served: Served):
    assert served.agent.held is None
    assert served.driver.accepted == frozenset()
    assert "table ip dnslb" in served.driver.scripts[0]
    answer = httpx.get(served.url + "/v1/table", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.json() == {"cluster": "vip-1", "node_id": "n1", "version": None, "buckets": []}


def test_applies_a_pushed_table_and_says_what_it_holds(served: Served):
    pushed = table(3)
    answer = served.push(table_to_json(pushed))
    assert answer.status_code == 200
    body = answer.json()
    assert body["version"] == 3
    assert body["buckets"] == list(pushed.active_buckets("n1"))
    assert served.driver.accepted == frozenset(pushed.active_buckets("n1"))
    assert "mod 64 seed 0x7" in served.driver.scripts[-1]
    assert served.agent.report().table is not None


def test_refuses_an_older_version_with_409_and_keeps_its_table(served: Served):
    assert served.push(table_to_json(table(5))).status_code == 200
    answer = served.push(table_to_json(table(4, n1=3, n2=1)))
    assert answer.status_code == 409
    assert "older than the held version 5" in answer.json()["error"]
    assert answer.json()["version"] == 5
    assert served.agent.held == table(5)


def test_same_version_is_idempotent_but_other_contents_conflict(served: Served):
    assert served.push(table_to_json(table(5))).status_code == 200
    scripts = len(served.driver.scripts)
    again = served.push(table_to_json(table(5)))
    assert again.status_code == 200
    assert again.json()["unchanged"] is True
    assert len(served.driver.scripts) == scripts  # nothing re-applied
    clash = served.push(table_to_json(table(5, n1=3, n2=1)))
    assert clash.status_code == 409


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param(b"{", 400, "not JSON", id="truncated"),
        pytest.param(b'{"cluster": "vip-1"}', 400, "missing", id="incomplete"),
        pytest.param(
            json.dumps({**table_to_dict(table(1)), "cluster": "vip-2"}),
            400,
            "cluster 'vip-2'",
            id="other cluster",
        ),
        pytest.param(
            table_to_json(build_table("vip-1", {"n1": 1}, version=1, seed=0, bucket_count=32)),
            400,
            "32 buckets",
            id="other bucket count",
        ),
    ],
)
def test_bad_tables_get_a_clear_400(served: Served, body, status, message):
    answer = served.push(body)
    assert answer.status_code == status
    assert message in answer.json()["error"]
    assert served.agent.held is None


@pytest.mark.parametrize("token", [None, "wrong-token-wrong-token", TOKEN + "x", TOKEN[:-1]])
def test_wrong_token_is_401(served: Served, token: str | None):
    answer = served.push(table_to_json(table(1)), token=token)
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert served.agent.held is None


def test_unknown_paths_are_404(served: Served):
    assert httpx.post(served.url + "/v1/other", content=b"{}").status_code == 404
    assert httpx.get(served.url + "/").status_code == 404


def test_too_large_a_body_is_refused(served: Served):
    with socket.create_connection(("127.0.0.1", int(served.url.rsplit(":", 1)[1]))) as conn:
        conn.sendall(b"POST /v1/table HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n")
        assert b" 413 " in conn.recv(200)


def test_a_failed_apply_is_a_500_and_changes_nothing(served: Served):
    def broken(*args: object) -> None:
        raise ProcessError("nft failed (1): Error: Could not process rule")

    served.driver.apply = broken  # type: ignore[method-assign]
    answer = served.push(table_to_json(table(2)))
    assert answer.status_code == 500
    assert "Could not process rule" in answer.json()["error"]
    assert served.agent.held is None


def test_the_controllers_pusher_speaks_the_agents_protocol(served: Served):
    async def scenario() -> None:
        pusher = HttpTablePusher(timeout=2.0)
        node = ClusterNode("n1", served.url, TOKEN)
        try:
            good = await pusher.push(node, table_to_json(table(8)))
            old = await pusher.push(node, table_to_json(table(7)))
            wrong = await pusher.push(ClusterNode("n1", served.url, "x" * 20), b"{}")
            dead = await pusher.push(ClusterNode("n1", "http://127.0.0.1:9", TOKEN), b"{}")
        finally:
            await pusher.aclose()
        assert (good.status, good.held_version) == (200, 8)
        assert (old.status, old.held_version) == (409, 8)
        assert wrong.status == 401
        assert dead.status == 0
        assert dead.error

    asyncio.run(scenario())


class ReportSink:
    """A stand-in manager endpoint that checks the token and keeps every report."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.refused = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/reports" and (
                    self.headers.get("Authorization") == f"Bearer {TOKEN}"
                )
                if ok:
                    sink.reports.append(json.loads(body))
                else:
                    sink.refused += 1
                self.send_response(204 if ok else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_heartbeats_carry_load_and_the_table_held():
    sink = ReportSink()
    driver = DryRunDriver(NodeRules(vip=VIP))
    agent = NodeAgent(config(), driver, lambda: VipLoad(7, None))
    agent.install()
    stop = threading.Event()
    beat = threading.Thread(
        target=heartbeat_loop, args=(agent, ManagerLink(sink.url, TOKEN), stop, 0.02, 0.1)
    )
    beat.start()
    try:
        assert wait_for(lambda: len(sink.reports) >= 2)
        agent.receive_table(table_to_json(table(4)))
        assert wait_for(lambda: sink.reports[-1].get("table") is not None)
    finally:
        stop.set()
        beat.join(timeout=5)
        sink.close()
    first = parse_report(sink.reports[0])
    assert (first.server_id, first.in_progress, first.max_concurrency) == ("n1", 7, 1000)
    assert first.table is None
    last = parse_report(sink.reports[-1])
    assert last.table is not None
    assert (last.table.cluster, last.table.version) == ("vip-1", 4)
    seqs = [report["seq"] for report in sink.reports]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)


def test_an_unserving_node_says_why():
    agent = NodeAgent(config(), DryRunDriver(NodeRules(vip=VIP)), lambda: VipLoad(0, "no listener"))
    report = agent.report()
    assert report.in_progress is None
    assert report.error == "no listener"
    parse_report(  # the manager accepts it
        {
            **json.loads(json.dumps({"server_id": "n1", "seq": 1, "time": 1.0})),
            "in_progress": None,
            "max_concurrency": 1000,
            "error": "no listener",
        }
    )


def test_a_dead_manager_means_backoff_not_a_crash(caplog: pytest.LogCaptureFixture):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    agent = NodeAgent(config(), DryRunDriver(NodeRules(vip=VIP)), lambda: VipLoad(0, None))
    stop = threading.Event()
    beat = threading.Thread(
        target=heartbeat_loop, args=(agent, ManagerLink(dead_url, TOKEN), stop, 0.01, 0.08)
    )
    beat.start()
    time.sleep(0.5)
    stop.set()
    beat.join(timeout=5)
    assert not beat.is_alive()
    # Backoff: at most about 0.5 / 0.08 + a few doubling steps, far fewer than 0.5 / 0.01.
    assert agent.report().seq < 20
    unreachable = [record for record in caplog.records if "manager unreachable" in record.message]
    assert len(unreachable) == 1  # said once, not on every failure


def test_a_manager_refusing_the_token_is_survived():
    sink = ReportSink()
    agent = NodeAgent(config(), DryRunDriver(NodeRules(vip=VIP)), lambda: VipLoad(0, None))
    stop = threading.Event()
    link = ManagerLink(sink.url, "not-the-token-at-all")
    beat = threading.Thread(target=heartbeat_loop, args=(agent, link, stop, 0.01, 0.05))
    beat.start()
    try:
        assert wait_for(lambda: sink.refused >= 2)
    finally:
        stop.set()
        beat.join(timeout=5)
        sink.close()
    assert sink.reports == []


def test_run_serves_until_stopped_and_fences_on_the_way_out():
    sink = ReportSink()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(
            run(config(listen_port=port, manager_url=sink.url, heartbeat_interval=0.02), stop)
        )
    )
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}/v1/table"
        assert wait_for(lambda: len(sink.reports) >= 1)
        answer = httpx.post(
            url, content=table_to_json(table(1)), headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert answer.status_code == 200
    finally:
        stop.set()
        thread.join(timeout=10)
        sink.close()
    assert result == [0]


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        pytest.param({"vip": "2001:db8::1"}, "vip:", id="IPv6 VIP"),
        pytest.param({"token": "short"}, "token:", id="short token"),
        pytest.param({"manager_url": "ftp://x"}, "manager_url:", id="bad manager URL"),
        pytest.param({"driver": "ipvs"}, "driver:", id="unknown driver"),
        pytest.param({"bucket_count": 0}, "bucket_count:", id="no buckets"),
        pytest.param({"heartbeat_interval": 0}, "heartbeat_interval:", id="zero interval"),
        pytest.param({"service_ports": (0,)}, "service_ports:", id="port 0"),
        pytest.param({"nft_table": "x y"}, "nft_table:", id="bad table name"),
        pytest.param({"node_id": ""}, "node_id:", id="empty node id"),
    ],
)
def test_bad_settings_are_config_errors(changes, problem):
    with pytest.raises(ConfigError, match=problem):
        config(**changes)


def test_every_config_problem_is_reported_together():
    with pytest.raises(ConfigError) as caught:
        config(vip="nope", token="x", driver="nope")
    assert len(caught.value.problems) == 3


def test_token_is_not_in_the_repr():
    assert TOKEN not in repr(config())


def test_token_from_a_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    assert read_token(str(path), None) == TOKEN
    monkeypatch.setenv("DNSLB_TEST_TOKEN", TOKEN)
    assert read_token(None, "DNSLB_TEST_TOKEN") == TOKEN
    monkeypatch.setenv("DNSLB_EMPTY", " ")
    with pytest.raises(ConfigError, match="empty"):
        read_token(None, "DNSLB_EMPTY")
    with pytest.raises(ConfigError, match="No such file"):
        read_token(str(tmp_path / "missing"), None)
    with pytest.raises(ConfigError, match="exactly one"):
        read_token(None, None)


def test_driver_registry():
    assert set(DRIVERS) == {"nftables", "dry-run"}
    assert isinstance(create_driver("dry-run", NodeRules(vip=VIP)), DryRunDriver)
    with pytest.raises(ConfigError, match="unknown"):
        create_driver("ipvs", NodeRules(vip=VIP))


def test_the_command_reports_every_problem_at_once(capsys: pytest.CaptureFixture[str]):
    from dnslb.cli import main  # noqa: PLC0415

    status = main(
        [
            "node-agent",
            "--cluster",
            "c",
            "--node-id",
            "n1",
            "--vip",
            "::1",
            "--token-env",
            "DNSLB_NO_SUCH_VARIABLE",
            "--driver",
            "x",
            "--listen",
            "nope",
        ]
    )
    err = capsys.readouterr().err
    assert status == 1
    assert "4 problems" in err
    for problem in ("--listen 'nope'", "the token is empty", "not an IPv4 address", "'x' unknown"):
        assert problem in err
