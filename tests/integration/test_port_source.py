"""The port source against a real listening socket with real established connections."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from agents.sources.base import Reading
from agents.sources.port_connections import Method, PortConnectionsSource
from dnslb.agent_config import PortSourceConfig

pytestmark = pytest.mark.integration

METHODS = ["netlink", "psutil"]


class Listener:
    """A listening socket and the connections made to it (both ends), closed at exit."""

    def __init__(self, family: int = socket.AF_INET, address: str = "127.0.0.1") -> None:
        self.family = family
        self.address = address
        self.server = socket.socket(family, socket.SOCK_STREAM)
        self.server.bind((address, 0))
        self.server.listen(128)
        self.port: int = self.server.getsockname()[1]
        self.clients: list[socket.socket] = []
        self.accepted: list[socket.socket] = []

    def connect(self, count: int) -> None:
        for _ in range(count):
            self.clients.append(socket.create_connection((self.address, self.port), timeout=5))
            self.accepted.append(self.server.accept()[0])

    def hang_up(self, count: int) -> None:
        for _ in range(count):
            self.clients.pop().close()
            self.accepted.pop().close()

    def close(self) -> None:
        for sock in self.clients + self.accepted + [self.server]:
            sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    opened = Listener()
    yield opened
    opened.close()


def read(port: int, method: Method) -> Reading:
    source = PortConnectionsSource(PortSourceConfig(port=port, max_concurrency=64), method)
    return asyncio.run(source.read())


@pytest.mark.parametrize("method", METHODS)
def test_in_progress_is_the_established_connections(listener: Listener, method: Method) -> None:
    assert read(listener.port, method) == Reading(in_progress=0, max_concurrency=64)
    listener.connect(12)
    assert read(listener.port, method).in_progress == 12
    listener.hang_up(5)
    assert read(listener.port, method).in_progress == 7


@pytest.mark.parametrize("method", METHODS)
def test_outgoing_connections_from_the_port_range_do_not_count(
    listener: Listener, method: Method
) -> None:
    # Connections *to* another server on the same port number are not ours: only sockets whose
    # local port is the service port count (the clients' local ports are ephemeral).
    listener.connect(3)
    client_port = listener.clients[0].getsockname()[1]
    other = read(client_port, method)
    assert other.in_progress is None  # nothing listens on a client's ephemeral port
    assert read(listener.port, method).in_progress == 3


@pytest.mark.parametrize("method", METHODS)
def test_ipv6_connections_count_too(method: Method) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        listener = Listener(socket.AF_INET6, "::1")
    except OSError as exc:
        pytest.skip(f"cannot listen on ::1: {exc}")
    try:
        listener.connect(4)
        assert read(listener.port, method).in_progress == 4
    finally:
        listener.close()


@pytest.mark.parametrize("method", METHODS)
def test_a_closed_port_gives_a_reading_that_says_so(method: Method) -> None:
    closed = Listener()
    port = closed.port
    closed.close()
    reading = read(port, method)
    assert reading.in_progress is None
    assert reading.max_concurrency == 64
    assert reading.error == f"nothing listens on TCP port {port}"


def test_netlink_is_chosen_where_the_kernel_allows_it(listener: Listener) -> None:
    source = PortConnectionsSource(PortSourceConfig(port=listener.port, max_concurrency=1))
    asyncio.run(source.read())
    assert source.method == "netlink"
