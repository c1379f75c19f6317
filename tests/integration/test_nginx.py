"""Real nginx as a cache server, and the agent's nginx source following real slow requests."""

from __future__ import annotations

import asyncio
import http.client
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from agents.sources.base import Reading
from agents.sources.nginx_status import NginxStatusSource
from daemons.nginx import NginxServer, NginxSettings
from daemons.process import free_port, live_group_members
from dnslb.agent_config import NginxSourceConfig
from dnslb.errors import ProcessError
from tests.http_servers import SlowOrigin

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
        reason="nginx is not installed (apt-get install nginx-light)",
    ),
]

# A loopback address other than 127.0.0.1, as the lab gives each cache server its own.
ADDRESS = "127.0.1.9"


@pytest.fixture
def origin() -> Iterator[SlowOrigin]:
    with SlowOrigin(hold_limit=20) as slow:
        yield slow


@pytest.fixture
def nginx(tmp_path: Path, origin: SlowOrigin) -> Iterator[NginxServer]:
    settings = NginxSettings(address=ADDRESS, port=free_port(), origin=origin.url)
    server = NginxServer(settings, tmp_path / "nginx")
    server.start()
    yield server
    server.stop()


def read(server: NginxServer) -> Reading:
    """One reading of the server's status page by the agent's nginx source."""

    async def once() -> Reading:
        source = NginxStatusSource(NginxSourceConfig(url=server.status_url, max_concurrency=50))
        try:
            return await source.read()
        finally:
            await source.aclose()

    return asyncio.run(once())


class SlowClients:
    """N clients, each in its own thread, each with one GET in flight through nginx."""

    def __init__(self, server: NginxServer, count: int) -> None:
        self.server = server
        self.results: list[tuple[int, str | None]] = []
        self.connections: list[http.client.HTTPConnection] = []
        self.threads = [
            threading.Thread(target=self._get, args=(f"/slow/{i}",)) for i in range(count)
        ]

    def _get(self, path: str) -> None:
        settings = self.server.settings
        connection = http.client.HTTPConnection(settings.address, settings.port, timeout=30)
        self.connections.append(connection)
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        self.results.append((response.status, response.getheader("X-Cache-Status")))
        connection.close()

    def __enter__(self) -> SlowClients:
        for thread in self.threads:
            thread.start()
        return self

    def join(self) -> None:
        for thread in self.threads:
            thread.join(30)

    def __exit__(self, *exc: object) -> None:
        for connection in self.connections:
            connection.close()
        self.join()


def test_in_progress_follows_real_slow_requests(nginx: NginxServer, origin: SlowOrigin) -> None:
    idle = read(nginx)
    assert (idle.in_progress, idle.max_concurrency, idle.error) == (0, 50, None)
    with SlowClients(nginx, 7) as clients:
        assert origin.wait_held(7), f"the origin holds {origin.held} of 7 requests"
        busy = read(nginx)
        assert busy.in_progress == 7
        assert busy.served_total is not None and idle.served_total is not None
        assert busy.served_total >= idle.served_total + 7  # requests counts started ones
        origin.release()
        clients.join()
    assert sorted(clients.results) == [(200, "MISS")] * 7
    # nginx finishes its bookkeeping a moment after the last byte: wait for it, boundedly.
    after = read(nginx)
    for _ in range(100):
        if after.in_progress == 0:
            break
        after = read(nginx)
    assert after.in_progress == 0


def test_the_reading_says_when_nginx_is_stopped(nginx: NginxServer) -> None:
    assert read(nginx).in_progress == 0
    nginx.stop()
    down = read(nginx)
    assert down.in_progress is None
    assert down.max_concurrency == 50
    assert down.error is not None and nginx.status_url in down.error


def test_it_caches_what_the_origin_serves(nginx: NginxServer, origin: SlowOrigin) -> None:
    origin.release()
    statuses = []
    for _ in range(2):
        connection = http.client.HTTPConnection(ADDRESS, nginx.settings.port, timeout=10)
        connection.request("GET", "/page?id=1")
        response = connection.getresponse()
        assert response.read() == b"slow answer for /page?id=1\n"
        statuses.append(response.getheader("X-Cache-Status"))
        connection.close()
    # no-store from the origin: nginx must not keep it
    assert statuses == ["MISS", "MISS"]


def test_a_cacheable_answer_is_served_from_cache(tmp_path: Path) -> None:
    from tests.http_servers import Receiver  # noqa: PLC0415

    with Receiver() as cacheable:
        cacheable.get_answer = (200, b"cached body")
        settings = NginxSettings(address=ADDRESS, port=free_port(), origin=cacheable.url)
        with NginxServer(settings, tmp_path / "nginx") as server:
            server.start()
            statuses = []
            for _ in range(3):
                connection = http.client.HTTPConnection(ADDRESS, settings.port, timeout=10)
                connection.request("GET", "/a.css")
                response = connection.getresponse()
                assert response.read() == b"cached body"
                statuses.append(response.getheader("X-Cache-Status"))
                connection.close()
        assert statuses == ["MISS", "HIT", "HIT"]
        assert [r.path for r in cacheable.requests] == ["/a.css"]
        assert any((tmp_path / "nginx" / "cache").rglob("*"))


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind((ADDRESS, 0))
        squatter.listen()
        settings = NginxSettings(address=ADDRESS, port=squatter.getsockname()[1])
        server = NginxServer(settings, tmp_path / "nginx")
        with pytest.raises(ProcessError, match="Address already in use") as caught:
            server.start()
    assert "nginx exited with status 1" in str(caught.value)
    assert server.pid is None


def test_stop_leaves_no_process_and_writes_only_in_the_work_dir(tmp_path: Path) -> None:
    workdir = tmp_path / "nginx"
    settings = NginxSettings(address=ADDRESS, port=free_port(), worker_processes=2)
    with NginxServer(settings, workdir) as server:
        server.start()
        pid = server.pid
        assert pid is not None
        assert len(live_group_members(pid)) == 3  # the master and two workers
    assert live_group_members(pid) == []
    written = {p.relative_to(workdir).parts[0] for p in workdir.rglob("*")}
    assert written <= {"nginx.conf", "error.log", "stderr.log", "temp", "cache", "nginx.pid"}


def test_the_status_page_is_for_loopback_only(tmp_path: Path) -> None:
    addresses = [
        address.address
        for interface in psutil.net_if_addrs().values()
        for address in interface
        if address.family == socket.AF_INET and not address.address.startswith("127.")
    ]
    if not addresses:
        pytest.skip("this machine has no non-loopback IPv4 address to ask from")
    settings = NginxSettings(address="0.0.0.0", port=free_port())
    with NginxServer(settings, tmp_path / "nginx") as server:
        server.start()
        connection = http.client.HTTPConnection(addresses[0], settings.port, timeout=5)
        connection.request("GET", settings.status_path)
        assert connection.getresponse().status == 403
        connection.close()


def test_workers_run_as_the_user_starting_nginx(tmp_path: Path) -> None:
    settings = NginxSettings(address=ADDRESS, port=free_port())
    with NginxServer(settings, tmp_path / "nginx") as server:
        server.start()
        assert server.pid is not None
        uids = {Path(f"/proc/{pid}").stat().st_uid for pid in live_group_members(server.pid)}
    assert uids == {os.geteuid()}


def test_a_graceful_stop_lets_the_requests_in_progress_finish(
    tmp_path: Path, origin: SlowOrigin
) -> None:
    """What a drained server's termination does (the local provider): a request that came after
    the last report said none was in progress is served to its end, not cut."""
    settings = NginxSettings(address=ADDRESS, port=free_port(), origin=origin.url)
    server = NginxServer(settings, tmp_path / "nginx")
    server.start()
    assert server.process is not None
    group = server.process.pid
    with SlowClients(server, 3) as clients:
        assert origin.wait_held(3), f"the origin holds {origin.held} of 3 requests"
        stopper = threading.Thread(target=server.stop, kwargs={"timeout": 20, "graceful": True})
        stopper.start()
        time.sleep(0.5)
        assert stopper.is_alive()  # nginx waits for its requests
        origin.release()
        clients.join()
        stopper.join(30)
    assert sorted(clients.results) == [(200, "MISS")] * 3
    assert not stopper.is_alive()
    assert not live_group_members(group)
