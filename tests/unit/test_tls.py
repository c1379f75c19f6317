"""TLS on the manager's listener and its clients, with a CA each test makes (tests/tls_support.py).

The listener's guard holds with TLS too: the handshake is within the first request's header time
and counts against the connection cap. An agent reports to a real manager over TLS and is refused
with a clear reason when it trusts another CA; plain text beyond loopback is a configuration
error unless allowed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import socket
import ssl
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.command import add_node_agent_arguments, node_agent_config
from agents.dispatch_drivers import NodeRules
from agents.dispatch_drivers.dry_run import DryRunDriver
from agents.manager_client import ManagerClient
from agents.node_agent import (
    AgentHttpServer,
    ListenerLimits,
    ManagerLink,
    NodeAgent,
    NodeAgentConfig,
)
from agents.vip_connections import VipLoad
from cli.ctl import EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE
from cli.main import main
from daemons.process import free_port
from dnslb.agent_config import AgentConfig, PortSourceConfig
from dnslb.config import Secret, load_config, problems_of, resolve_file_reference
from dnslb.dispatch import build_table, table_to_json
from dnslb.errors import ConfigError, ProtocolError
from dnslb.report import Report
from dnslb.tls import client_context, is_loopback, server_context
from manager.clusters import ClusterNode, HttpTablePusher, PushResult
from manager.config import load_manager_config
from manager.http import HttpLimits
from manager.providers.base import LaunchRequest, ProviderContext
from manager.providers.docker import DockerProvider
from manager.service import Manager
from tests.fake_docker import FakeDockerEngine
from tests.tls_support import Pki, make_pki
from tests.unit.test_docker_provider import provider_config
from tests.unit.test_http_limits import Listener, closed_by_server, wait

LIMITS = HttpLimits(
    header_timeout=0.5,
    body_timeout=0.5,
    write_timeout=0.5,
    keep_alive=1,
    max_connections=4,
    max_header_bytes=4096,
)
TOKEN = "tls-test-agent-token-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def listener(pki: Pki) -> Iterator[Listener]:
    running = Listener(LIMITS, tls=server_context(pki.certificate, pki.key))
    try:
        yield running
    finally:
        running.stop()


def https_get(port: int, ca: Path, path: str = "/") -> bytes:
    context = client_context(ca)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as client,
    ):
        client.sendall(
            f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello".encode()
        )
        answer = b""
        while not answer.endswith(b"\r\n\r\n5"):
            chunk = client.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer


# -- the listener ------------------------------------------------------------------------------


def test_a_request_over_tls_is_answered(listener: Listener, pki: Pki) -> None:
    assert https_get(listener.port, pki.ca).startswith(b"HTTP/1.1 200 ")


def test_a_client_trusting_another_ca_refuses_the_listener(listener: Listener, pki: Pki) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        https_get(listener.port, pki.other_ca)


def test_a_connection_that_never_says_hello_is_dropped_within_the_header_timeout(
    listener: Listener,
) -> None:
    client = listener.connect()
    started = time.monotonic()
    assert closed_by_server(client) == b""
    # Dropped at the header timeout (0.5 s), not asyncio's 60 s handshake default; the bound
    # is generous for a loaded machine.
    assert time.monotonic() - started < 5
    assert listener.server.counts.slow_headers == 1


def test_a_hello_trickled_is_dropped_within_the_header_timeout(listener: Listener) -> None:
    client = listener.connect()
    with contextlib.suppress(OSError):
        for byte in b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 500:
            client.send(bytes([byte]))
            time.sleep(0.01)
    assert closed_by_server(client) == b""
    assert listener.server.counts.slow_headers == 1


def test_plain_http_to_the_tls_listener_is_refused_and_counted(listener: Listener) -> None:
    client = listener.connect()
    client.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    assert not closed_by_server(client).startswith(b"HTTP/")
    wait(lambda: listener.server.counts.failed_handshakes == 1, "the handshake to be counted")


def test_connections_still_shaking_hands_count_against_the_cap(
    listener: Listener, pki: Pki
) -> None:
    held = [listener.connect() for _ in range(LIMITS.max_connections)]
    wait(
        lambda: len(listener.server.server_state.connections) == LIMITS.max_connections,
        "the listener to hold its connections",
    )
    extra = listener.connect()
    assert closed_by_server(extra) == b""
    assert listener.server.counts.over_capacity == 1
    for client in held:
        client.close()
    wait(lambda: not listener.server.server_state.connections, "the held connections to go")
    assert https_get(listener.port, pki.ca).startswith(b"HTTP/1.1 200 ")


def test_server_context_says_why_a_certificate_and_key_do_not_go_together(pki: Pki) -> None:
    with pytest.raises(ValueError, match="the key is not the certificate's"):
        server_context(pki.certificate, pki.other_key)
    with pytest.raises(ValueError, match="cannot read"):
        server_context(pki.certificate.with_name("missing.pem"), pki.key)


# -- an agent and a real manager ----------------------------------------------------------------

MANAGER = """
zones: [{name: example.test, ns: [ns1.example.test]}]
auth: {agent_token: env:DNSLB_TLS_TEST_TOKEN}
http:
  port: PORT
  tls: {certificate: file:pki/server.pem, key: file:pki/server.key}
pools:
  - name: www
    zone: example.test
    members: [{id: s1, address: 10.0.0.1}]
"""


class TlsManager:
    """``Manager.run()`` serving HTTPS on a free loopback port, in a thread of its own."""

    def __init__(self, directory: Path) -> None:
        make_pki(directory / "pki")
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.ca = directory / "pki" / "ca.pem"
        self.other_ca = directory / "pki" / "other-ca.pem"
        (directory / "manager.yaml").write_text(MANAGER.replace("PORT", str(self.port)))
        self.config = load_manager_config(directory / "manager.yaml")
        self.failure: BaseException | None = None
        self.started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="tls-manager", daemon=True)
        self._thread.start()
        wait(self._listening, "the manager to listen")

    def _main(self) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.manager = Manager(self.config)
            await self.manager.run(self._stop)

        try:
            asyncio.run(serve())
        except BaseException as exc:  # the test fails with it
            self.failure = exc

    def _listening(self) -> bool:
        if self.failure is not None:
            raise self.failure
        try:
            return httpx.get(f"{self.url}/healthz", verify=client_context(self.ca)).is_success
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)


@pytest.fixture
def manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TlsManager]:
    monkeypatch.setenv("DNSLB_TLS_TEST_TOKEN", TOKEN)
    running = TlsManager(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def report(seq: int) -> Report:
    return Report(server_id="s1", seq=seq, time=time.time(), in_progress=3, max_concurrency=10)


def test_an_agent_reports_over_tls_to_a_real_manager(manager: TlsManager) -> None:
    async def send() -> object:
        client = ManagerClient(
            f"{manager.url}/v1/reports",
            Secret(TOKEN, "env:DNSLB_TLS_TEST_TOKEN"),
            timeout=5,
            verify=client_context(manager.ca),
        )
        try:
            return await client.send(report(1))
        finally:
            await client.aclose()

    assert asyncio.run(send()) is None
    wait(lambda: manager.manager.fleet.servers["s1"].report is not None, "the report to be taken")


def test_an_agent_trusting_another_ca_says_so(manager: TlsManager) -> None:
    async def send() -> object:
        client = ManagerClient(
            f"{manager.url}/v1/reports",
            Secret(TOKEN, "env:DNSLB_TLS_TEST_TOKEN"),
            timeout=5,
            verify=client_context(manager.other_ca),
        )
        try:
            return await client.send(report(1))
        finally:
            await client.aclose()

    problem = asyncio.run(send())
    assert problem is not None
    assert "TLS certificate not trusted" in str(problem)
    assert manager.manager.fleet.servers["s1"].report is None


# -- plain text beyond loopback ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        pytest.param("127.0.0.1", True, id="IPv4 loopback"),
        pytest.param("127.8.9.10", True, id="all of 127/8"),
        pytest.param("[::1]", True, id="IPv6 loopback"),
        pytest.param("localhost", True, id="localhost"),
        pytest.param("10.0.0.1", False, id="private address"),
        pytest.param("0.0.0.0", False, id="any address"),
        pytest.param("manager", False, id="a name"),
        pytest.param("localhost.example.com", False, id="a name beginning with localhost"),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def agent_yaml(directory: Path, url: str, extra: str = "") -> Path:
    (directory / "agent.token").write_text(TOKEN)
    path = directory / "agent.yaml"
    path.write_text(
        f"server_id: s1\nmanager_url: {url}\ntoken: file:agent.token\n"
        f"source: {{type: port, port: 80, max_concurrency: 10}}\n{extra}"
    )
    return path


@pytest.mark.parametrize(
    ("url", "extra", "problem"),
    [
        pytest.param("http://127.0.0.1:8700", "", None, id="loopback in clear"),
        pytest.param("http://10.0.0.5:8700", "", "clear text", id="beyond loopback in clear"),
        pytest.param(
            "http://10.0.0.5:8700", "allow_plaintext: true\n", None, id="explicitly allowed"
        ),
        pytest.param("https://10.0.0.5:8700", "", None, id="https"),
        pytest.param(
            "https://10.0.0.5:8700", "ca_file: file:missing.pem\n", "cannot read", id="no CA"
        ),
        pytest.param(
            "https://10.0.0.5:8700", "ca_file: file:agent.token\n", "ca_file", id="CA not PEM"
        ),
    ],
)
def test_agent_config_refuses_plaintext_beyond_loopback(
    tmp_path: Path, url: str, extra: str, problem: str | None
) -> None:
    path = agent_yaml(tmp_path, url, extra)
    if problem is None:
        load_config(path, AgentConfig)
        return
    with pytest.raises(ConfigError, match=problem):
        load_config(path, AgentConfig)


def test_agent_ca_file_is_relative_to_the_config(tmp_path: Path, pki: Pki) -> None:
    (tmp_path / "ca.pem").write_bytes(pki.ca.read_bytes())
    config = load_config(
        agent_yaml(tmp_path, "https://10.0.0.5:8700", "ca_file: file:ca.pem\n"), AgentConfig
    )
    assert config.ca_file is not None
    assert config.ca_file.path == tmp_path / "ca.pem"


def test_agent_config_built_in_code_is_checked_too() -> None:
    config = AgentConfig(
        server_id="s1",
        manager_url="http://192.0.2.1:8700",
        token=Secret(TOKEN, "env:X"),
        source=PortSourceConfig(port=80, max_concurrency=1),
    )
    assert any("clear text" in problem for problem in problems_of(config))


MANAGER_HTTP = """
zones: [{name: example.test, ns: [ns1.example.test]}]
http: HTTP
"""


@pytest.mark.parametrize(
    ("http", "problem"),
    [
        pytest.param("{address: 127.0.0.1}", None, id="loopback"),
        pytest.param("{address: 0.0.0.0}", "beyond loopback", id="any address in clear"),
        pytest.param("{address: 0.0.0.0, allow_plaintext: true}", None, id="allowed"),
        pytest.param(
            "{address: 0.0.0.0, tls: {certificate: file:pki/server.pem, key: file:pki/server.key}}",
            None,
            id="TLS",
        ),
        pytest.param(
            "{tls: {certificate: file:pki/server.pem, key: file:pki/other-server.key}}",
            "the key is not the certificate's",
            id="key of another certificate",
        ),
        pytest.param(
            "{tls: {certificate: env:CERT, key: file:pki/server.key}}",
            "must be a file reference",
            id="certificate not a file",
        ),
        pytest.param(
            "{advertise_url: 'http://manager:8700'}", "advertise_url", id="advertised in clear"
        ),
    ],
)
def test_manager_listener_refuses_plaintext_beyond_loopback(
    tmp_path: Path, http: str, problem: str | None
) -> None:
    make_pki(tmp_path / "pki")
    path = tmp_path / "manager.yaml"
    path.write_text(MANAGER_HTTP.replace("HTTP", http))
    if problem is None:
        loaded = load_manager_config(path)
        if loaded.config.http.tls is not None:
            assert loaded.config.http.url.startswith("https://")
        return
    with pytest.raises(ConfigError, match=problem):
        load_manager_config(path)


CLUSTER = """
zones: [{name: example.test, ns: [ns1.example.test]}]
pools:
  - {name: www, zone: example.test, members: [{id: v, address: 192.0.2.10, cluster: c1}]}
clusters:
  - name: c1
    vip: 192.0.2.10
    seed: 1
    nodes: [{id: n1, agent_url: "URL", token: env:DNSLB_TLS_TEST_TOKEN}]
    EXTRA
"""


@pytest.mark.parametrize(
    ("url", "extra", "problem"),
    [
        pytest.param("http://127.0.0.1:8470", "", None, id="loopback"),
        pytest.param("http://10.0.0.11:8470", "", "clear text", id="beyond loopback in clear"),
        pytest.param("http://10.0.0.11:8470", "allow_plaintext: true", None, id="allowed"),
        pytest.param("https://10.0.0.11:8470", "ca_file: file:pki/ca.pem", None, id="https"),
        pytest.param("ftp://10.0.0.11", "", "not an http", id="not http"),
    ],
)
def test_cluster_refuses_plaintext_node_urls_beyond_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, extra: str, problem: str | None
) -> None:
    monkeypatch.setenv("DNSLB_TLS_TEST_TOKEN", TOKEN)
    make_pki(tmp_path / "pki")
    path = tmp_path / "manager.yaml"
    path.write_text(CLUSTER.replace("URL", url).replace("EXTRA", extra))
    if problem is None:
        load_manager_config(path)
        return
    with pytest.raises(ConfigError, match=problem):
        load_manager_config(path)


def test_a_file_reference_must_be_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        resolve_file_reference(f"file:{fifo}")
    with pytest.raises(ValueError, match="file:PATH"):
        resolve_file_reference("env:HOME")


# -- the node agent ----------------------------------------------------------------------------


@contextlib.contextmanager
def node_listener(pki: Pki, limits: ListenerLimits | None = None) -> Iterator[AgentHttpServer]:
    driver = DryRunDriver(NodeRules(vip=VIP))
    agent = NodeAgent(node_config(), driver, lambda: VipLoad(3, None))
    agent.install()
    tls = server_context(pki.certificate, pki.key)
    server = AgentHttpServer(("127.0.0.1", 0), agent, limits, tls=tls)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


VIP = "198.51.100.10"


def node_config(**changes: Any) -> NodeAgentConfig:
    values: dict[str, Any] = {
        "cluster": "vip-1",
        "node_id": "n1",
        "vip": VIP,
        "token": Secret(TOKEN, "env:DNSLB_TLS_TEST_TOKEN"),
        "driver": "dry-run",
        "bucket_count": 64,
    }
    values.update(changes)
    return NodeAgentConfig(**values)


def push(server: AgentHttpServer, ca: Path) -> PushResult:
    node = ClusterNode("n1", f"https://127.0.0.1:{server.server_address[1]}", TOKEN)
    body = table_to_json(build_table("vip-1", {"n1": 1}, version=4, seed=7, bucket_count=64))

    async def go() -> PushResult:
        pusher = HttpTablePusher(timeout=5, verify=client_context(ca))
        try:
            return await pusher.push(node, body)
        finally:
            await pusher.aclose()

    return asyncio.run(go())


def test_the_node_agent_takes_a_push_over_tls(pki: Pki) -> None:
    with node_listener(pki) as server:
        result = push(server, pki.ca)
        assert (result.status, result.held_version, result.error) == (200, 4, None)
        assert server.agent.held is not None


def test_the_manager_refuses_a_node_agent_it_cannot_verify(pki: Pki) -> None:
    with node_listener(pki) as server:
        result = push(server, pki.other_ca)
        assert result.status == 0
        assert "TLS certificate not trusted" in (result.error or "")
        assert server.agent.held is None


def test_the_node_agent_drops_a_connection_that_never_says_hello(pki: Pki) -> None:
    limits = ListenerLimits(header_timeout=0.5)
    with node_listener(pki, limits) as server:
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.server_address[1])) as client:
            assert closed_by_server(client) == b""
        assert time.monotonic() - started < 5
        wait(lambda: server.stats["timed_out"] == 1, "the drop to be counted")
        assert push(server, pki.ca).status == 200  # and it still serves


def test_the_node_agent_refuses_plain_http_on_its_tls_listener(pki: Pki) -> None:
    with node_listener(pki) as server:
        with socket.create_connection(("127.0.0.1", server.server_address[1])) as client:
            client.sendall(b"GET /v1/table HTTP/1.1\r\nHost: t\r\n\r\n")
            assert not closed_by_server(client).startswith(b"HTTP/")
        wait(lambda: server.stats["failed handshakes"] == 1, "the handshake to be counted")


def test_heartbeats_go_over_tls_and_a_wrong_ca_is_said(pki: Pki) -> None:
    manager = Listener(LIMITS, tls=server_context(pki.certificate, pki.key))
    try:
        url = f"https://127.0.0.1:{manager.port}"
        report = Report(server_id="n1", seq=1, time=time.time(), in_progress=0, max_concurrency=1)
        link = ManagerLink(url, TOKEN, context=client_context(pki.ca))
        link.post(report)  # answered 200 by the stand-in
        link.close()
        wrong = ManagerLink(url, TOKEN, context=client_context(pki.other_ca))
        with pytest.raises(ProtocolError, match="TLS certificate not trusted"):
            wrong.post(report)
    finally:
        manager.stop()


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        pytest.param({"listen_host": "0.0.0.0"}, "listen_host", id="listener beyond loopback"),
        pytest.param({"listen_host": "0.0.0.0", "allow_plaintext": True}, None, id="allowed"),
        pytest.param({"manager_url": "http://10.0.0.1:8700"}, "manager_url", id="manager in clear"),
        pytest.param({"manager_url": "https://10.0.0.1:8700"}, None, id="manager over https"),
        pytest.param({"manager_url": "http://127.0.0.1:8700"}, None, id="manager on loopback"),
    ],
)
def test_node_agent_config_refuses_plaintext_beyond_loopback(
    changes: dict[str, Any], problem: str | None
) -> None:
    problems = problems_of(node_config(**changes))
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert problems[0].startswith(f"{problem}:")
        assert "allow_plaintext" in problems[0]


def test_node_agent_tls_from_its_yaml_file(tmp_path: Path, pki: Pki) -> None:
    (tmp_path / "token").write_text(TOKEN)
    path = tmp_path / "node-agent.yaml"
    path.write_text(
        f"cluster: vip-1\nnode_id: n1\nvip: {VIP}\ntoken: file:token\nlisten_host: 0.0.0.0\n"
        f"tls: {{certificate: 'file:{pki.certificate}', key: 'file:{pki.key}'}}\n"
        f"manager_url: https://10.0.0.1:8700\nca_file: 'file:{pki.ca}'\n"
    )
    config = load_config(path, NodeAgentConfig)
    assert config.tls is not None
    assert config.ca_file is not None


def test_node_agent_flags_take_tls(pki: Pki) -> None:
    parser = argparse.ArgumentParser()
    add_node_agent_arguments(parser)
    common = ["--cluster", "c", "--node-id", "n1", "--vip", VIP, "--token-env", "DNSLB_TLS_T"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DNSLB_TLS_T", TOKEN)
        args = parser.parse_args(
            [
                *common,
                *("--listen", "0.0.0.0:8470", "--manager-url", "https://10.0.0.1:8700"),
                *("--tls-certificate", str(pki.certificate), "--tls-key", str(pki.key)),
                *("--ca-file", str(pki.ca)),
            ]
        )
        config = node_agent_config(args)
        assert config.tls is not None
        assert config.ca_file is not None
        args = parser.parse_args([*common, "--listen", "0.0.0.0:8470"])
        with pytest.raises(ConfigError, match="listen_host"):
            node_agent_config(args)
        args = parser.parse_args([*common, "--listen", "0.0.0.0:8470", "--allow-plaintext"])
        assert node_agent_config(args).allow_plaintext
        args = parser.parse_args([*common, "--tls-certificate", str(pki.certificate)])
        with pytest.raises(ConfigError, match="give both or neither"):
            node_agent_config(args)


# -- dnslb ctl ---------------------------------------------------------------------------------


def ctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["ctl", *args, "status"])
    return status, capsys.readouterr().err


def test_ctl_verifies_the_manager_with_its_ca_file(
    manager: TlsManager, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNSLB_API_TOKEN", TOKEN)
    status, err = ctl(capsys, "--url", manager.url, "--ca-file", str(manager.other_ca))
    assert status == EXIT_UNREACHABLE
    assert "TLS certificate not trusted" in err
    # Over TLS it reaches the manager, which has no API here: refused, not unreachable.
    status, err = ctl(capsys, "--url", manager.url, "--ca-file", str(manager.ca))
    assert status == EXIT_REFUSED, err
    monkeypatch.setenv("DNSLB_CA_FILE", str(manager.ca))
    assert ctl(capsys, "--url", manager.url)[0] == EXIT_REFUSED


def test_ctl_refuses_plaintext_beyond_loopback_unless_allowed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNSLB_API_TOKEN", TOKEN)
    status, err = ctl(capsys, "--url", "http://192.0.2.1:8700")
    assert status == EXIT_USAGE
    assert "--allow-plaintext" in err
    unused = f"http://127.0.0.1:{free_port()}"  # loopback in clear: allowed, nobody answers
    assert ctl(capsys, "--url", unused)[0] == EXIT_UNREACHABLE
    status, err = ctl(capsys, "--url", unused, "--ca-file", "/nonexistent/ca.pem")
    assert status == EXIT_USAGE
    assert "cannot read CA file" in err


# -- agents of launched servers ------------------------------------------------------------------


def test_docker_servers_agents_get_a_copy_of_the_managers_ca(tmp_path: Path, pki: Pki) -> None:
    engine = FakeDockerEngine(
        tmp_path / "docker.sock"
    )  # never started: agent_files needs no engine
    context = ProviderContext(
        pool="www",
        state_dir=tmp_path / "providers" / "www",
        manager_url="https://manager:8700",
        manager_ca_file=resolve_file_reference(f"file:{pki.ca}"),
    )
    provider = DockerProvider(provider_config(engine), context)
    request = LaunchRequest(
        server_id="www-1", pool="www", agent_token=TOKEN, manager_url=context.manager_url
    )
    with tarfile.open(fileobj=io.BytesIO(provider.agent_files(request))) as tar:
        files = {member.name: tar.extractfile(member).read() for member in tar}  # type: ignore[union-attr]
    assert files["manager-ca.pem"] == pki.ca.read_bytes()
    agent = files["agent.yaml"].decode()
    assert "ca_file: file:/etc/dnslb/manager-ca.pem" in agent
    assert "allow_plaintext: false" in agent


def test_an_encrypted_key_is_refused_without_a_prompt(tmp_path: Path, pki: Pki) -> None:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    key = serialization.load_pem_private_key(pki.key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    with pytest.raises(ValueError, match="is encrypted"):
        server_context(pki.certificate, encrypted)
