"""The node agent over real HTTP on loopback, with the dry-run driver (no root needed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.dispatch_drivers import DRIVERS, NodeRules, create_driver
from agents.dispatch_drivers.dry_run import DryRunDriver
from agents.node_agent import (
    MAX_TABLE_BODY,
    AgentHttpServer,
    LeaseKeeper,
    ListenerLimits,
    ManagerLink,
    NodeAgent,
    NodeAgentConfig,
    heartbeat_loop,
    run,
    token_reference,
)
from agents.vip_connections import VipLoad
from dnslb.config import Secret, checked
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
        "token": Secret(TOKEN, "env:DNSLB_TEST_TOKEN"),
        "driver": "dry-run",
        "bucket_count": 64,
    }
    values.update(changes)
    return checked(NodeAgentConfig(**values), "node agent")


class Served:
    def __init__(
        self, agent: NodeAgent, driver: DryRunDriver, url: str, server: AgentHttpServer
    ) -> None:
        self.agent, self.driver, self.url, self.server = agent, driver, url, server
        self.port = int(url.rsplit(":", 1)[1])

    def push(self, body: bytes | str, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.post(self.url + "/v1/table", content=body, headers=headers)


@contextlib.contextmanager
def serving(limits: ListenerLimits | None = None) -> Iterator[Served]:
    driver = DryRunDriver(NodeRules(vip=VIP))
    agent = NodeAgent(config(), driver, lambda: VipLoad(3, None))
    agent.install()
    server = AgentHttpServer(("127.0.0.1", 0), agent, limits)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield Served(agent, driver, f"http://127.0.0.1:{server.server_address[1]}", server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def served() -> Iterator[Served]:
    with serving() as result:
        yield result


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


def test_too_large_a_body_is_refused_before_it_is_read(served: Served):
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/table HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
        )
        assert b" 413 " in conn.recv(200)


def test_a_body_past_the_cap_is_refused_by_the_agent_itself_too(served: Served):
    answer = served.agent.receive_table(b" " * (MAX_TABLE_BODY + 1))
    assert answer.status == 413
    assert served.agent.held is None


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
        self.received_at: list[float] = []  # time.monotonic() of each report taken
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/reports" and (
                    self.headers.get("Authorization") == f"Bearer {TOKEN}"
                )
                if ok:
                    sink.received_at.append(time.monotonic())
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


@contextlib.contextmanager
def heartbeats(
    agent: NodeAgent,
    keeper: LeaseKeeper,
    sink: ReportSink,
    *,
    token: str = TOKEN,
    backoff_max: float = 0.1,
    timer: bool = False,
) -> Iterator[None]:
    """The agent's heartbeat loop (every 20 ms) posting to ``sink`` with ``keeper``'s lease,
    and the lease's own timer when ``timer``; all stopped, and ``sink`` closed, at the end."""
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=heartbeat_loop,
            args=(agent, ManagerLink(sink.url, token), stop, 0.02, backoff_max),
            kwargs={"lease": keeper},
        )
    ]
    if timer:
        threads.append(threading.Thread(target=keeper.loop, args=(stop,)))
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        sink.close()


def test_heartbeats_carry_load_and_the_table_held():
    sink = ReportSink()
    driver = DryRunDriver(NodeRules(vip=VIP, lease=0.25))
    agent = NodeAgent(config(), driver, lambda: VipLoad(7, None))
    agent.install()
    with heartbeats(agent, LeaseKeeper(driver, 0.25, heartbeats=True), sink):
        assert wait_for(lambda: len(sink.reports) >= 2)
        agent.receive_table(table_to_json(table(4)))
        assert wait_for(lambda: sink.reports[-1].get("table") is not None)
    first = parse_report(sink.reports[0])
    assert (first.server_id, first.in_progress, first.max_concurrency) == ("n1", 7, 1000)
    assert first.table is None
    last = parse_report(sink.reports[-1])
    assert last.table is not None
    assert (last.table.cluster, last.table.version) == ("vip-1", 4)
    seqs = [report["seq"] for report in sink.reports]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert driver.renewals >= len(sink.reports) - 1  # after each heartbeat the manager took


class TimedDriver(DryRunDriver):
    """Notes when each renewal came and how long it asked the lease to last."""

    def __init__(self, rules: NodeRules) -> None:
        super().__init__(rules)
        self.timed: list[tuple[float, float]] = []

    def renew(self, seconds: float | None = None) -> None:
        super().renew(seconds)
        assert self.last_renewal is not None
        self.timed.append((time.monotonic(), self.last_renewal))


def test_the_lease_never_outlives_the_last_heartbeat_heard_by_more_than_the_lease():
    # The manager counts a node as alive for failover_after (> lease) after it last heard it.
    # Each renewal must end within `lease` of a heartbeat the manager had heard by then; an
    # agent killed anywhere (between a renewal and the post it was for, say) then stops
    # taking connections before the manager gives its buckets away.
    sink = ReportSink()
    driver = TimedDriver(NodeRules(vip=VIP, lease=0.25))
    agent = NodeAgent(config(), driver, lambda: VipLoad(1, None))
    agent.install()
    with heartbeats(agent, LeaseKeeper(driver, 0.25, heartbeats=True), sink):
        assert wait_for(lambda: len(driver.timed) >= 10)
    for renewed_at, seconds in driver.timed:
        heard = [at for at in sink.received_at if at <= renewed_at]
        assert heard, "a renewal came before the manager heard any heartbeat"
        assert renewed_at + seconds <= heard[-1] + 0.25


def test_a_manager_that_refuses_the_heartbeats_gets_no_lease_renewed():
    # It is up and does not count them: it fails the node over after failover_after, so the
    # lease must run out before (renewing on the timer, as for a manager that is down, would
    # let the node answer SYNs of buckets given away).
    sink = ReportSink()
    driver = DryRunDriver(NodeRules(vip=VIP, lease=0.25))
    agent = NodeAgent(config(), driver, lambda: VipLoad(1, None))
    keeper = LeaseKeeper(driver, 0.06, heartbeats=True)
    with heartbeats(agent, keeper, sink, token="not-the-token", backoff_max=0.02, timer=True):
        assert wait_for(lambda: sink.refused >= 5)
        time.sleep(0.1)  # five rounds of the lease's own timer
    assert driver.renewals == 0
    keeper.post_failed()  # unreachable, not refused: the timer keeps the lease
    stop = threading.Event()
    timer = threading.Thread(target=keeper.loop, args=(stop,))
    timer.start()
    try:
        assert wait_for(lambda: driver.renewals >= 2)
    finally:
        stop.set()
        timer.join(timeout=5)


def test_a_heartbeat_that_took_longer_than_the_lease_renews_nothing():
    driver = DryRunDriver(NodeRules(vip=VIP, lease=0.25))
    keeper = LeaseKeeper(driver, 0.25, heartbeats=True)
    keeper.heard(time.monotonic() - 0.3)
    assert driver.renewals == 0
    sent = time.monotonic() - 0.1
    keeper.heard(sent)
    assert driver.renewals == 1
    assert driver.last_renewal is not None
    assert 0.0 < driver.last_renewal <= 0.25 - (time.monotonic() - sent) + 0.001
    assert driver.last_renewal <= 0.15


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


# --- hostile clients (issue 14, item 7: the node agent's listener) ------------------------------


def raw(served: Served, data: bytes) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    conn.sendall(data)
    return conn


def closed_by_server(conn: socket.socket) -> bool:
    """Whether the server closed ``conn``: reads until EOF (or a reset)."""
    try:
        while conn.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("token", [None, "wrong-token-wrong-token"])
def test_the_token_is_checked_before_the_body_is_read(served: Served, token: str | None):
    head = b"POST /v1/table HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n".encode()
    with raw(served, head + b"\r\n") as conn:  # and not a byte of the 4 MB announced
        answer = conn.recv(500)
        assert answer.startswith(b"HTTP/1.1 401 ")
        assert b"Connection: close" in answer
        assert closed_by_server(conn)
    assert served.server.stats["refused 401"] == 1


def test_two_hundred_slow_connections_cost_no_threads_and_the_push_gets_through():
    limits = ListenerLimits(max_connections=64, header_timeout=30.0)
    with serving(limits) as served:
        # One manager push first, so that the apply thread exists before counting.
        assert served.push(table_to_json(table(1))).status_code == 200
        threads = threading.active_count()
        slow = [raw(served, b"POST /v1/table HTTP/1.1\r\nHost: x\r\n") for _ in range(200)]
        try:
            assert wait_for(lambda: served.server.stats["evicted"] >= 200 - 64, timeout=60)
            assert threading.active_count() <= threads + 1
            assert served.server.open_connections <= 64
            # The manager's push, while strangers keep the listener full.
            with httpx.Client(timeout=10) as manager:
                for version in (2, 3, 4):
                    answer = manager.post(
                        served.url + "/v1/table",
                        content=table_to_json(table(version)),
                        headers={"Authorization": f"Bearer {TOKEN}"},
                    )
                    assert answer.status_code == 200
                    more = [raw(served, b"GET /v1/table HTTP/1.1\r\n") for _ in range(70)]
                    slow += more  # evict every stranger before the next push on this connection
            assert served.agent.held == table(4)
            assert served.server.stats["refused"] == 0
        finally:
            for conn in slow:
                conn.close()


def test_a_slowloris_is_dropped_after_the_header_timeout():
    with serving(ListenerLimits(header_timeout=0.3)) as served:
        conn = raw(served, b"POST /v1/table HTTP/1.1\r\n")
        with conn:
            dropped = False
            for _ in range(400):  # a byte every 50 ms, for at most 20 s
                try:
                    conn.sendall(b"X")
                except OSError:
                    dropped = True
                    break
                time.sleep(0.05)
            assert dropped or closed_by_server(conn)
        assert served.server.stats["timed_out"] == 1


def test_a_body_that_never_comes_is_dropped():
    with serving(ListenerLimits(body_timeout=0.3)) as served:
        head = (
            b"POST /v1/table HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n\r\n{{".encode()
        )
        with raw(served, head) as conn:
            assert closed_by_server(conn)
        assert served.server.stats["timed_out"] == 1
        assert served.agent.held is None


def test_when_every_connection_has_authenticated_a_stranger_is_refused():
    with serving(ListenerLimits(max_connections=2)) as served, contextlib.ExitStack() as stack:
        managers = [stack.enter_context(httpx.Client(timeout=10)) for _ in range(2)]
        for manager in managers:
            answer = manager.get(
                served.url + "/v1/table", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert answer.status_code == 200
        with raw(served, b"GET /v1/table HTTP/1.1\r\n\r\n") as conn:
            assert closed_by_server(conn)
        assert served.server.stats["refused"] == 1
        # Both kept-alive connections still work.
        for manager in managers:
            answer = manager.get(
                served.url + "/v1/table", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert answer.status_code == 200


@pytest.mark.parametrize(
    ("head", "status"),
    [
        pytest.param(b"POST /v1/table HTTP/1.1\r\nX: " + b"a" * 20000, b" 431 ", id="huge head"),
        pytest.param(b"NONSENSE\r\n\r\n", b" 400 ", id="bad request line"),
        pytest.param(b"PUT /v1/table HTTP/1.1\r\n\r\n", b" 405 ", id="PUT"),
        pytest.param(b"GET /v1/table HTTP/1.1\r\nbad header\r\n\r\n", b" 400 ", id="no colon"),
        pytest.param(
            b"POST /v1/table HTTP/1.1\r\nTransfer-Encoding: chunked\r\nAUTH\r\n\r\n",
            b" 411 ",
            id="chunked",
        ),
        pytest.param(
            b"POST /v1/table HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\nAUTH\r\n\r\n",
            b" 400 ",
            id="two lengths",
        ),
        pytest.param(
            b"POST /v1/table HTTP/1.1\r\nContent-Length: -5\r\nAUTH\r\n\r\n",
            b" 411 ",
            id="negative",
        ),
        pytest.param(
            b"POST /v1/table HTTP/1.1\r\nContent-Length: \xd9\xa3\r\nAUTH\r\n\r\n",
            b" 411 ",
            id="Arabic digit",
        ),
    ],
)
def test_malformed_requests_get_a_clear_error_and_a_closed_connection(
    served: Served, head: bytes, status: bytes
):
    head = head.replace(b"AUTH", f"Authorization: Bearer {TOKEN}".encode())
    with raw(served, head) as conn:
        assert status in conn.recv(500)
        assert closed_by_server(conn)


def test_expect_100_continue_is_answered(served: Served):
    body = table_to_json(table(6))
    head = (
        f"POST /v1/table HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    )
    with raw(served, head.encode()) as conn:
        assert conn.recv(100).startswith(b"HTTP/1.1 100 Continue")
        conn.sendall(body)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 OK")
    assert served.agent.held == table(6)


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        pytest.param({"vip": "2001:db8::1"}, "vip:", id="IPv6 VIP"),
        pytest.param({"token": Secret("short", "env:SHORT")}, "token:", id="short token"),
        pytest.param({"manager_url": "ftp://x"}, "manager_url:", id="bad manager URL"),
        pytest.param({"driver": "ipvs"}, "driver:", id="unknown driver"),
        pytest.param({"bucket_count": 0}, "bucket_count:", id="no buckets"),
        pytest.param({"heartbeat_interval": 0}, "heartbeat_interval:", id="zero interval"),
        pytest.param({"service_ports": (0,)}, "service_ports:", id="port 0"),
        pytest.param({"nft_table": "x y"}, "nft_table:", id="bad table name"),
        pytest.param({"node_id": ""}, "node_id:", id="empty node id"),
        pytest.param({"node_id": "n\t1"}, "node_id:", id="tab in node id"),
        pytest.param({"max_concurrency": 10**10}, "max_concurrency:", id="capacity too large"),
        pytest.param({"cluster": "vip\n1"}, "cluster:", id="newline in cluster"),
        pytest.param(
            {"manager_url": "http://127.0.0.1:1", "heartbeat_interval": 0.2, "lease": 0.25},
            "lease:",
            id="lease shorter than two heartbeats",
        ),
    ],
)
def test_bad_settings_are_config_errors(changes, problem):
    with pytest.raises(ConfigError, match=problem):
        config(**changes)


def test_every_config_problem_is_reported_together():
    with pytest.raises(ConfigError) as caught:
        config(vip="nope", token=Secret("x", "env:X"), driver="nope")
    assert len(caught.value.problems) == 3


def test_token_is_not_in_the_repr():
    assert TOKEN not in repr(config())


def test_the_agent_takes_only_a_valid_config():
    bad = NodeAgentConfig("vip-1", "n1", "nope", Secret(TOKEN, "env:T"), driver="dry-run")
    with pytest.raises(ConfigError, match="vip:"):
        NodeAgent(bad, DryRunDriver(NodeRules(vip=VIP)), lambda: VipLoad(0, None))
    with pytest.raises(ConfigError, match="vip:"):
        run(bad, threading.Event())


def test_token_reference_from_the_flags():
    assert token_reference("/etc/dnslb/node.token", None) == "file:/etc/dnslb/node.token"
    assert token_reference(None, "NODE_TOKEN") == "env:NODE_TOKEN"
    with pytest.raises(ConfigError, match="exactly one"):
        token_reference(None, None)


def test_driver_registry():
    assert set(DRIVERS) == {"nftables", "dry-run"}
    assert isinstance(create_driver("dry-run", NodeRules(vip=VIP)), DryRunDriver)
    with pytest.raises(ConfigError, match="unknown"):
        create_driver("ipvs", NodeRules(vip=VIP))


def test_the_command_reports_every_problem_at_once(capsys: pytest.CaptureFixture[str]):
    from cli.main import main  # noqa: PLC0415

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
    for problem in (
        "--listen 'nope'",
        "--token-env: environment variable DNSLB_NO_SUCH_VARIABLE is not set",
        "not an IPv4 address",
        "'x' unknown",
    ):
        assert problem in err


def node_agent_config_from(*argv: str) -> NodeAgentConfig:
    from agents.command import node_agent_config  # noqa: PLC0415
    from cli.main import build_parser  # noqa: PLC0415

    return node_agent_config(build_parser().parse_args(["node-agent", *argv]))


CONFIG_FILE = """\
cluster: vip-1
node_id: n1
vip: 198.51.100.10
token: file:node.token  # relative to this file's directory
manager_url: http://127.0.0.1:8700
listen_host: 127.0.0.1
listen_port: 8471
driver: dry-run
bucket_count: 64
service_ports: [80, 443]
require_listener: false
"""


def test_a_config_file_and_the_same_flags_make_the_same_config(tmp_path: Path):
    (tmp_path / "node.token").write_text(TOKEN + "\n")
    (tmp_path / "node.yaml").write_text(CONFIG_FILE)
    from_file = node_agent_config_from("--config", str(tmp_path / "node.yaml"))
    from_flags = node_agent_config_from(
        *("--cluster", "vip-1", "--node-id", "n1", "--vip", VIP),
        *("--token-file", str(tmp_path / "node.token")),
        *("--manager-url", "http://127.0.0.1:8700", "--listen", "127.0.0.1:8471"),
        *("--driver", "dry-run", "--bucket-count", "64"),
        *("--service-port", "80", "--service-port", "443", "--no-listener-check"),
    )
    assert from_file.token.reveal() == from_flags.token.reveal() == TOKEN
    assert from_file.token.reference == "file:node.token"
    assert replace(from_file, token=from_flags.token) == from_flags
    assert from_file.lease == from_flags.lease == 0.25  # defaults, declared once
    assert TOKEN not in repr(from_file) and TOKEN not in repr(from_flags)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            CONFIG_FILE + "nod_id: n2\n",
            "node.yaml, line 12: nod_id: unknown key (did you mean 'node_id'?)",
            id="unknown key",
        ),
        pytest.param(
            CONFIG_FILE.replace("file:node.token", TOKEN),
            "node.yaml, line 4: token: a secret must be a reference, env:NAME or file:PATH",
            id="token given as a value",
        ),
        pytest.param(
            CONFIG_FILE.replace("file:node.token", "env:DNSLB_NO_SUCH_VARIABLE"),
            "node.yaml, line 4: token: environment variable DNSLB_NO_SUCH_VARIABLE is not set",
            id="unset variable",
        ),
        pytest.param(
            CONFIG_FILE.replace("file:node.token", "file:missing.token"),
            "node.yaml, line 4: token: cannot read",
            id="missing file",
        ),
        pytest.param(
            CONFIG_FILE.replace("dry-run", "ipvs"),
            "node.yaml, line 1: driver: 'ipvs' unknown (known: dry-run, nftables)",
            id="unknown driver",
        ),
        pytest.param(
            CONFIG_FILE.replace("8471", "70000"),
            "node.yaml, line 7: listen_port: must be at most 65535, not 70000",
            id="port out of range",
        ),
        pytest.param(
            CONFIG_FILE.replace("cluster: vip-1\n", ""),
            "node.yaml, line 1: cluster: missing",
            id="missing cluster",
        ),
    ],
)
def test_config_file_problems_name_their_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str
):
    from cli.main import main  # noqa: PLC0415

    (tmp_path / "node.token").write_text(TOKEN)
    (tmp_path / "node.yaml").write_text(text)
    assert main(["node-agent", "--config", str(tmp_path / "node.yaml")]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path}/{problem}" in err
    assert TOKEN not in err


def test_a_short_token_is_refused_without_being_shown(tmp_path: Path):
    (tmp_path / "node.token").write_text("short-secret")
    (tmp_path / "node.yaml").write_text(CONFIG_FILE)
    with pytest.raises(ConfigError) as caught:
        node_agent_config_from("--config", str(tmp_path / "node.yaml"))
    assert caught.value.problems == [
        f"{tmp_path / 'node.yaml'}, line 1: token: must be at least 16 characters"
    ]
    assert "short-secret" not in str(caught.value)


def test_a_config_file_and_setting_flags_do_not_mix(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"not both \(--lease, --node-id\)"):
        node_agent_config_from("--config", "node.yaml", "--node-id", "n2", "--lease", "0")


def test_without_a_file_the_required_flags_are_named(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DNSLB_TEST_TOKEN", TOKEN)
    with pytest.raises(ConfigError) as caught:
        node_agent_config_from("--node-id", "n1", "--bucket-count", "0")
    assert caught.value.problems == [
        "--cluster: required (or --config FILE)",
        "--vip: required (or --config FILE)",
        "give exactly one of --token-file and --token-env",
        "bucket_count: must be at least 1, not 0",
    ]
    config = node_agent_config_from(
        *("--cluster", "vip-1", "--node-id", "n1", "--vip", VIP, "--token-env", "DNSLB_TEST_TOKEN")
    )
    assert config == NodeAgentConfig("vip-1", "n1", VIP, Secret(TOKEN, "env:DNSLB_TEST_TOKEN"))


def test_the_rules_carry_the_owner_and_the_tcp_loose_choice():
    assert config().rules.owner == "vip-1"
    assert config().rules.set_tcp_loose is True
    assert config(keep_tcp_loose=True).rules.set_tcp_loose is False
