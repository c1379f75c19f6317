"""``dnslb agent`` as a real process: real nginx in, real HTTP out, signals to stop it."""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemons.nginx import NginxServer, NginxSettings
from daemons.process import free_port, stop_group
from dnslb.agent_config import AgentConfig, NginxSourceConfig, agent_command
from dnslb.config import dump_config, resolve_secret
from dnslb.report import parse_report
from tests.http_servers import Receiver

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
        reason="nginx is not installed (apt-get install nginx-light)",
    ),
]

TOKEN = "process-test-token-1234"


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[NginxServer]:
    with NginxServer(
        NginxSettings(address="127.0.1.10", port=free_port()), tmp_path / "nginx"
    ) as n:
        n.start()
        yield n


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def write_config(tmp_path: Path, receiver: Receiver, nginx: NginxServer) -> Path:
    """An agent config as the local provider writes one: token in a file, config dumped."""
    token_path = tmp_path / "agent.token"
    token_path.write_text(TOKEN)
    config = AgentConfig(
        server_id="cache-10",
        manager_url=receiver.url,
        token=resolve_secret(f"file:{token_path}"),
        source=NginxSourceConfig(url=nginx.status_url, max_concurrency=40),
        interval=0.1,
        backoff_cap=0.5,
    )
    path = tmp_path / "agent.yaml"
    path.write_text(dump_config(config))
    return path


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator:
    started: list[subprocess.Popen[bytes]] = []

    def start(config: Path) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            agent_command(config),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        stop_group(process, sig=signal.SIGKILL)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_the_agent_reports_nginx_and_stops_cleanly_on_a_signal(
    tmp_path: Path, receiver: Receiver, nginx: NginxServer, start_agent, signum: int
) -> None:
    agent = start_agent(write_config(tmp_path, receiver, nginx))
    assert receiver.wait_for(lambda: len(receiver.posts()) >= 5, timeout=20), "no reports"
    agent.send_signal(signum)
    _, stderr = agent.communicate(timeout=10)
    assert agent.returncode == 0
    log = stderr.decode()
    assert f"stopped by {signal.Signals(signum).name}" in log
    assert TOKEN not in log
    reports = [parse_report(post.json()) for post in receiver.posts()]
    assert {post.headers["Authorization"] for post in receiver.posts()} == {f"Bearer {TOKEN}"}
    assert all(r.server_id == "cache-10" for r in reports)
    assert all((r.in_progress, r.max_concurrency, r.error) == (0, 40, None) for r in reports)
    seqs = [r.seq for r in reports]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert abs(seqs[0] - reports[0].time * 1000) < 60_000  # unix ms at start


def test_a_restarted_agent_continues_above_the_last_seq(
    tmp_path: Path, receiver: Receiver, nginx: NginxServer, start_agent
) -> None:
    config = write_config(tmp_path, receiver, nginx)
    first = start_agent(config)
    assert receiver.wait_for(lambda: len(receiver.posts()) >= 3, timeout=20)
    first.terminate()
    first.communicate(timeout=10)
    count = len(receiver.posts())
    last = parse_report(receiver.posts()[-1].json()).seq
    start_agent(config)
    assert receiver.wait_for(lambda: len(receiver.posts()) >= count + 2, timeout=20)
    assert parse_report(receiver.posts()[count].json()).seq > last


def test_nginx_going_away_is_reported_and_the_agent_keeps_going(
    tmp_path: Path, receiver: Receiver, nginx: NginxServer, start_agent
) -> None:
    agent = start_agent(write_config(tmp_path, receiver, nginx))
    assert receiver.wait_for(lambda: len(receiver.posts()) >= 2, timeout=20)
    nginx.stop()
    count = len(receiver.posts())
    assert receiver.wait_for(lambda: len(receiver.posts()) >= count + 3, timeout=20)
    latest = parse_report(receiver.posts()[-1].json())
    assert latest.in_progress is None
    assert latest.error is not None and nginx.status_url in latest.error
    assert agent.poll() is None


def test_a_bad_config_is_one_clear_error(tmp_path: Path, start_agent) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("server_id: a\nmanager_url: https://m\ntoken: hunter2\nsource: {type: x}\n")
    agent = start_agent(config)
    _, stderr = agent.communicate(timeout=20)
    assert agent.returncode == 1
    text = stderr.decode()
    assert f"{config}, line 3: token:" in text
    assert f"{config}, line 4: source.type: must be one of json, nginx, port" in text
    assert "hunter2" not in text
    assert "Traceback" not in text


def test_the_agent_follows_the_leader_when_managers_swap_roles(
    tmp_path: Path, nginx: NginxServer, start_agent
) -> None:
    """Two managers in active/standby: reports reach the leader through the standby's redirect,
    and the other one after they swap roles (the leader died, the standby took over)."""
    with Receiver() as first, Receiver() as second:
        first.answer, first.answer_headers = (307, b""), {"Location": f"{second.url}/v1/reports"}
        token_path = tmp_path / "agent.token"
        token_path.write_text(TOKEN)
        config = AgentConfig(
            server_id="cache-10",
            manager_url=first.url,
            manager_urls=(second.url,),
            token=resolve_secret(f"file:{token_path}"),
            source=NginxSourceConfig(url=nginx.status_url, max_concurrency=40),
            interval=0.1,
            backoff_cap=0.5,
        )
        path = tmp_path / "agent.yaml"
        path.write_text(dump_config(config))
        agent = start_agent(path)
        assert second.wait_for(lambda: len(second.posts()) >= 5, timeout=20), "no reports"
        assert len(first.posts()) == 1  # redirected once, then straight to the leader
        second.stop()  # the leader dies; the standby takes over
        first.answer, first.answer_headers = (204, b""), {}
        assert first.wait_for(lambda: len(first.posts()) >= 5, timeout=20), "no failover"
        assert agent.poll() is None
        seqs = [parse_report(post.json()).seq for post in second.posts() + first.posts()[1:]]
        assert seqs == sorted(seqs)
