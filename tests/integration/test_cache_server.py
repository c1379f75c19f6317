"""``dnslb cache-server`` (a container's command) as a real process: real nginx caching a real
origin, real reports to a manager stand-in, SIGTERM to stop, and an exit when nginx dies."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from daemons.process import free_port, live_group_members, spawn, stop_group
from dnslb.agent_config import AgentConfig, NginxSourceConfig
from dnslb.config import Secret, dump_config
from dnslb.report import parse_report
from tests.http_servers import Receiver

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
        reason="nginx is not installed (apt-get install nginx-light)",
    ),
]

TOKEN = "cache-server-test-token-1234"


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    process = spawn(
        [sys.executable, "-m", "cli", "origin", "--port", str(port), "--objects", "5"],
        name="origin",
        ready=lambda _: get("127.0.0.1", port, "/healthz")[0] == 200,
        log=tmp_path / "origin.log",
        timeout=10,
    )
    yield port
    stop_group(process)


def get(address: str, port: int, path: str) -> tuple[int, dict[str, str]]:
    connection = http.client.HTTPConnection(address, port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    except OSError:
        return 0, {}
    finally:
        connection.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture
def cache_server(
    tmp_path: Path, origin: int, receiver: Receiver
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A cache server as the docker provider starts one: agent config and token in files."""
    process, port = start_cache_server(tmp_path, origin, receiver)
    yield process, port
    stop_group(process)


def start_cache_server(
    tmp_path: Path, origin: int, receiver: Receiver, *options: str
) -> tuple[subprocess.Popen[bytes], int]:
    """``dnslb cache-server`` with the fixture's settings and ``options`` added."""
    port = free_port()
    (tmp_path / "agent.token").write_text(TOKEN + "\n")
    config = AgentConfig(
        server_id="www-1",
        manager_url=receiver.url,
        token=Secret(TOKEN, f"file:{tmp_path / 'agent.token'}"),
        source=NginxSourceConfig(url=f"http://127.0.0.1:{port}/nginx_status", max_concurrency=12),
        interval=0.1,
    )
    (tmp_path / "agent.yaml").write_text(dump_config(config))
    command = [
        sys.executable,
        "-m",
        "cli",
        "cache-server",
        "--agent-config",
        str(tmp_path / "agent.yaml"),
        "--origin",
        f"http://127.0.0.1:{origin}",
        "--address",
        "127.0.0.1",
        "--port",
        str(port),
        "--workdir",
        str(tmp_path / "cache"),
        "--capacity-rps",
        "50",
        *options,
    ]
    with open(tmp_path / "cache-server.log", "wb") as log:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ), port


def wait(predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_it_caches_reports_and_stops_cleanly_on_sigterm(
    cache_server: tuple[subprocess.Popen[bytes], int], receiver: Receiver, tmp_path: Path
) -> None:
    process, port = cache_server
    assert wait(lambda: get("127.0.0.1", port, "/objects/1")[0] == 200)
    status, headers = get("127.0.0.1", port, "/objects/1")
    assert status == 200
    assert headers["X-Cache-Status"] == "HIT"
    assert receiver.wait_for(lambda: len(receiver.posts()) >= 3)
    post = receiver.posts()[-1]
    assert post.headers["Authorization"] == f"Bearer {TOKEN}"
    report = parse_report(post.json())
    assert report.server_id == "www-1"
    assert report.max_concurrency == 12
    assert report.in_progress == 0

    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(10) == 0
    assert live_group_members(process.pid) == []  # nginx and its workers went with it
    assert get("127.0.0.1", port, "/objects/1")[0] == 0
    assert "stopped by SIGTERM" in (tmp_path / "cache-server.log").read_text()


def test_it_exits_when_nginx_dies_and_says_why(
    cache_server: tuple[subprocess.Popen[bytes], int], receiver: Receiver, tmp_path: Path
) -> None:
    process, _ = cache_server
    pid_file = tmp_path / "cache" / "nginx.pid"
    assert wait(lambda: pid_file.exists() and receiver.posts() != [])
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert process.wait(10) == 1
    assert "nginx exited; its log ends" in (tmp_path / "cache-server.log").read_text()


def test_a_port_in_use_is_one_clear_line_and_status_1(tmp_path: Path, receiver: Receiver) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = AgentConfig(
            server_id="www-1",
            manager_url=receiver.url,
            token=Secret(TOKEN, f"file:{tmp_path / 'agent.token'}"),
            source=NginxSourceConfig(
                url=f"http://127.0.0.1:{port}/nginx_status", max_concurrency=12
            ),
        )
        (tmp_path / "agent.token").write_text(TOKEN)
        (tmp_path / "agent.yaml").write_text(dump_config(config))
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "cli",
                "cache-server",
                "--agent-config",
                str(tmp_path / "agent.yaml"),
                "--origin",
                "http://127.0.0.1:9",
                "--address",
                "127.0.0.1",
                "--port",
                str(port),
                "--workdir",
                str(tmp_path / "cache"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert result.stderr.startswith("dnslb cache-server: nginx exited with status 1")
    assert "Address already in use" in result.stderr
    assert receiver.posts() == []  # no report for a server that never answered


def test_sigterm_lets_the_requests_in_progress_finish(
    tmp_path: Path, origin: int, receiver: Receiver
) -> None:
    """``docker stop`` of a drained server: a request still in progress gets its whole answer."""
    process, port = start_cache_server(tmp_path, origin, receiver, "--send-rate", "4096")
    try:
        assert wait(lambda: get("127.0.0.1", port, "/healthz")[0] != 0)
        sizes = {}
        for index in range(5):  # cached, and sized: the largest is seconds of paced sending
            sizes[index] = len(fetch("127.0.0.1", port, f"/objects/{index}"))
        largest = max(sizes, key=lambda index: sizes[index])
        assert sizes[largest] > 8192
        got: list[bytes] = []
        slow = threading.Thread(
            target=lambda: got.append(fetch("127.0.0.1", port, f"/objects/{largest}"))
        )
        slow.start()
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGTERM)
        slow.join(30)
        assert [len(body) for body in got] == [sizes[largest]]  # whole, after the signal
        assert process.wait(10) == 0
    finally:
        stop_group(process)


def fetch(address: str, port: int, path: str) -> bytes:
    """The body of a 200 answer on a connection of its own."""
    connection = http.client.HTTPConnection(address, port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200
        return body
    finally:
        connection.close()
