"""Agents and node agents follow the leading manager among several (active/standby): real HTTP
servers on loopback play a standby that redirects, one that knows no leader, a dead manager,
a stranger a redirect must never reach, and the leader that takes reports."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agents.command import node_agent_config
from agents.dispatch_drivers import NodeRules
from agents.dispatch_drivers.dry_run import DryRunDriver
from agents.manager_client import DeliveryProblem, ManagerClient
from agents.managers import ManagerUrls, origin
from agents.node_agent import LeaseKeeper, ManagerLink, NodeAgent, heartbeat_loop
from agents.vip_connections import VipLoad
from dnslb.agent_config import AgentConfig, JsonSourceConfig
from dnslb.clock import FakeClock
from dnslb.config import Secret, load_config, problems_of
from dnslb.report import Report
from manager.config import HttpConfig
from manager.providers.base import LaunchRequest, ProviderContext
from manager.providers.local import LocalProvider, LocalProviderConfig
from manager.providers.userdata import render_user_data
from tests.http_servers import Receiver
from tests.unit.test_node_agent import TOKEN, VIP, config

REPORT = Report(server_id="cache-1", seq=1, time=1.0, in_progress=3, max_concurrency=10)
NO_LEADER = (503, json.dumps({"error": "no leader"}).encode())


def dead_url() -> str:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def managers() -> Iterator[tuple[Receiver, Receiver, Receiver]]:
    """A standby, the leader and a stranger (not a configured manager)."""
    with Receiver() as standby, Receiver() as leader, Receiver() as stranger:
        standby.answer = (307, b"")
        standby.answer_headers = {"Location": f"{leader.url}/v1/reports"}
        yield standby, leader, stranger


def send(client: ManagerClient, report: Report = REPORT) -> DeliveryProblem | None:
    async def scenario() -> DeliveryProblem | None:
        try:
            return await client.send(report)
        finally:
            await client.aclose()

    return asyncio.run(scenario())


def client(*urls: str) -> ManagerClient:
    return ManagerClient(
        [f"{url}/v1/reports" for url in urls], Secret("agent-secret", "env:T"), timeout=2.0
    )


# -- which redirects are followed ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("http://10.0.0.2:8000/v1/reports", 1),
        ("HTTP://10.0.0.2:8000/other/path", 1),  # the path does not matter, the origin does
        ("https://mgr.example.test/v1/reports", 2),  # port 443 is https's own
        ("https://MGR.example.test:443/v1/reports", 2),
        ("/v1/reports", 0),  # relative: the manager that answered
        ("http://10.0.0.2:8001/v1/reports", None),  # another port
        ("https://10.0.0.2:8000/v1/reports", None),  # another scheme
        ("http://mgr.example.test/v1/reports", None),  # http is not the configured https
        ("http://evil.example.test:8000/v1/reports", None),
        ("http://10.0.0.2:99999/v1/reports", None),  # not a port
        ("ftp://10.0.0.2:8000/", None),
        ("http://10.0.0.2:8000/" + "a" * 3000, None),  # too long to look at
    ],
    ids=[
        "same-origin",
        "other-path",
        "default-port",
        "explicit-default-port",
        "relative",
        "other-port",
        "other-scheme",
        "downgrade",
        "stranger",
        "bad-port",
        "not-http",
        "too-long",
    ],
)
def test_a_redirect_is_followed_only_to_a_configured_manager(
    location: str, expected: int | None
) -> None:
    managers = ManagerUrls(
        ["http://10.0.0.1:8000", "http://10.0.0.2:8000/", "https://mgr.example.test"]
    )
    assert managers.configured(location, "http://10.0.0.1:8000/v1/reports") == expected


def test_a_round_tries_each_manager_once_whatever_the_redirects() -> None:
    managers = ManagerUrls(["http://a:1", "http://b:1", "http://c:1"])
    managers.current = 1
    attempts = managers.round()
    assert next(attempts) == 1
    assert attempts.redirect("http://c:1/v1/reports", "http://b:1") is None
    assert next(attempts) == 2  # the leader the standby named, before a
    assert attempts.redirect("http://b:1/v1/reports", "http://c:1") is not None  # a loop
    assert list(attempts) == [0]
    attempts.took(0)
    assert managers.url == "http://a:1"
    assert origin("http://[::1]/x") == ("http", "::1", 80)


# -- the cache server's agent -------------------------------------------------------------------


def test_a_standby_redirects_the_agent_to_the_leader_which_it_then_keeps(managers) -> None:
    standby, leader, _ = managers
    agent_client = client(standby.url, leader.url)
    assert send(agent_client) is None
    assert len(standby.posts()) == 1
    (taken,) = leader.posts()
    assert taken.path == "/v1/reports"
    assert taken.headers["Authorization"] == "Bearer agent-secret"
    assert json.loads(taken.body)["seq"] == 1
    assert agent_client.url == f"{leader.url}/v1/reports"
    again = client(standby.url, leader.url)
    again.managers.current = agent_client.managers.current
    assert send(again) is None
    assert len(standby.posts()) == 1  # straight to the leader now
    assert len(leader.posts()) == 2


def test_a_redirect_to_a_stranger_is_not_followed_and_the_token_never_reaches_it(
    managers,
) -> None:
    standby, _, stranger = managers
    standby.answer_headers = {"Location": f"{stranger.url}/v1/reports"}
    problem = send(client(standby.url))
    assert problem is not None and not problem.refused
    assert "not a configured manager: not followed" in problem.message
    assert stranger.requests == []


def test_no_leader_a_dead_manager_and_a_loop_each_move_on_to_the_next(managers) -> None:
    standby, leader, other = managers
    other.answer = NO_LEADER
    assert send(client(dead_url(), other.url, leader.url)) is None
    assert len(other.posts()) == 1 and len(leader.posts()) == 1
    # Two standbys naming each other: each is tried once, then the report waits for the next.
    other.answer = (307, b"")
    other.answer_headers = {"Location": f"{standby.url}/v1/reports"}
    standby.answer_headers = {"Location": f"{other.url}/v1/reports"}
    problem = send(client(standby.url, other.url))
    assert problem is not None
    assert "tried already for this report" in problem.message
    assert len(standby.posts()) == 1 and len(other.posts()) == 2


def test_the_agent_config_takes_a_list_of_managers() -> None:
    config_ = AgentConfig(
        server_id="cache-1",
        manager_url="http://10.0.0.1:8000",
        manager_urls=("http://10.0.0.2:8000/", "http://10.0.0.1:8000", "ftp://x"),
        token=Secret("t", "env:T"),
        source=JsonSourceConfig(url="http://127.0.0.1/status"),
        allow_plaintext=True,
    )
    assert config_.reports_urls[:2] == (
        "http://10.0.0.1:8000/v1/reports",
        "http://10.0.0.2:8000/v1/reports",
    )
    assert problems_of(config_) == [
        "manager_urls[2]: must be an http:// or https:// URL, not 'ftp://x'"
    ]


# -- the node agent -----------------------------------------------------------------------------


def test_the_node_agent_follows_the_leader_and_says_when_the_post_it_took_was_sent(
    managers,
) -> None:
    standby, leader, _ = managers
    link = ManagerLink([standby.url, leader.url], TOKEN)
    try:
        sent = link.post(REPORT)
        # The standby redirected the first attempt: the time is that of the attempt the leader
        # took, which the lease is counted from (it began after the standby's answer).
        assert len(standby.posts()) == 1 and len(leader.posts()) == 1
        assert standby.posts()[0].at < sent <= leader.posts()[0].at
        assert link.managers.url == leader.url
        again = link.post(REPORT)
        assert leader.posts()[0].at < again <= leader.posts()[1].at
        assert len(standby.posts()) == 1 and len(leader.posts()) == 2
    finally:
        link.close()


def test_node_agent_heartbeats_reach_the_leader_through_a_standby(managers) -> None:
    standby, leader, stranger = managers
    driver = DryRunDriver(NodeRules(vip=VIP, lease=0.25))
    node_config = config(manager_url=standby.url, manager_urls=(leader.url,))
    agent = NodeAgent(node_config, driver, lambda: VipLoad(2, None))
    stop = threading.Event()
    keeper = LeaseKeeper(driver, 0.25, heartbeats=True)
    link = ManagerLink(node_config.managers, TOKEN)
    beat = threading.Thread(
        target=heartbeat_loop, args=(agent, link, stop, 0.02, 0.1), kwargs={"lease": keeper}
    )
    beat.start()
    try:
        assert leader.wait_for(lambda: len(leader.posts()) >= 3)
        # The leader dies and the standby takes over: heartbeats come back to it.
        leader.stop()
        standby.answer, standby.answer_headers = (204, b""), {}
        before = len(standby.posts())
        assert standby.wait_for(lambda: len(standby.posts()) >= before + 3)
    finally:
        stop.set()
        beat.join(timeout=10)
    assert not beat.is_alive()
    assert len(standby.posts()) >= 4
    assert stranger.requests == []
    # One renewal per post a manager took: not for the standby's first answer (a redirect), nor
    # perhaps for the post the leader recorded as it stopped (it may have died unanswered).
    posts = len(leader.posts()) + len(standby.posts())
    assert posts - 2 <= driver.renewals <= posts - 1


def test_the_node_agent_flag_is_repeated_for_several_managers(tmp_path) -> None:
    import argparse  # noqa: PLC0415

    from agents.command import add_node_agent_arguments  # noqa: PLC0415

    token = tmp_path / "token"
    token.write_text(TOKEN)
    parser = argparse.ArgumentParser()
    add_node_agent_arguments(parser)
    args = parser.parse_args(
        [
            *("--cluster", "vip-1", "--node-id", "n1", "--vip", VIP),
            *("--manager-url", "http://127.0.0.1:8000", "--manager-url", "http://127.0.0.2:8000"),
            *("--token-file", str(token), "--driver", "dry-run"),
        ]
    )
    node_config = node_agent_config(args)
    assert node_config.managers == ("http://127.0.0.1:8000", "http://127.0.0.2:8000")


def test_more_managers_without_the_first_is_a_mistake() -> None:
    with pytest.raises(Exception, match="manager_urls: needs manager_url"):
        config(manager_urls=("http://127.0.0.1:8000",))


# -- what the manager gives the servers it launches ----------------------------------------------


PEERS = ("http://127.0.0.2:8700", "http://127.0.0.3:8700")


def launch_request(**changes: object) -> LaunchRequest:
    values: dict[str, object] = {
        "server_id": "www-1",
        "pool": "www",
        "agent_token": "token-of-www-1-0123456789",
        "manager_url": "http://127.0.0.1:8700",
        "manager_urls": PEERS,
    }
    values.update(changes)
    return LaunchRequest(**values)  # type: ignore[arg-type]


def test_the_default_user_data_gives_the_agent_every_manager() -> None:
    text = render_user_data(None, launch_request(), limit=16384)
    (line,) = [line for line in text.splitlines() if "manager_urls" in line]
    assert yaml.safe_load(line.strip().removeprefix("echo '").removesuffix("'")) == {
        "manager_urls": list(PEERS)
    }
    alone = render_user_data("{{manager_urls}}", launch_request(manager_urls=()), limit=100)
    assert alone == "[]"


def test_a_locally_launched_agent_gets_every_manager(tmp_path: Path) -> None:
    config_ = LocalProviderConfig(
        type="local", origin="http://127.0.0.1:9", network="127.0.5", port=18080, boot_delay=1000
    )
    context = ProviderContext(
        pool="www",
        state_dir=tmp_path,
        manager_url="http://127.0.0.1:8700",
        manager_urls=PEERS,
        clock=FakeClock(),
    )

    async def scenario() -> None:
        local = LocalProvider(config_, context)
        try:
            await local.launch(launch_request())
            agent = load_config(tmp_path / "www-1" / "agent.yaml", AgentConfig)
        finally:
            await local.close()
        assert agent.reports_urls == tuple(
            f"{url}/v1/reports" for url in ("http://127.0.0.1:8700", *PEERS)
        )

    asyncio.run(scenario())


def test_the_managers_peer_urls_are_checked() -> None:
    assert problems_of(HttpConfig(peer_urls=PEERS)) == []
    assert problems_of(HttpConfig(peer_urls=("127.0.0.2:8700", "http://10.1.2.3:8700"))) == [
        "peer_urls[0]: '127.0.0.2:8700' is not an http(s) URL",
        "peer_urls[1]: 'http://10.1.2.3:8700' would send tokens in clear text beyond this "
        "host: use https:// or set allow_plaintext: true to send tokens in clear text anyway",
    ]
