"""``dnslb manager`` as a process, with the API it serves: the command's wiring, the listener on
loopback, tokens by reference, and ``dnslb ctl`` as a process against it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from daemons.process import free_port
from tests.api_support import ADMIN, AGENT, READ, bearer, report_body, wait_for, write_config

pytestmark = pytest.mark.integration

DNSLB = [sys.executable, "-m", "cli"]


class Process:
    def __init__(self, tmp_path: Path, *, default_address: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = write_config(tmp_path, port=self.port, tick=0.2)
        if default_address:
            text = self.config.read_text().replace("http: {address: 127.0.0.1, ", "http: {")
            self.config.write_text(text)
        self.log = tmp_path / "manager.log"
        self.seq = 0
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [*DNSLB, "manager", "--config", str(self.config), "--log-level", "debug"],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the manager exited:\n{self.log.read_text()}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def report(self, load: int) -> None:
        """The static servers' agents report once."""
        self.seq += 1
        for server in ("s1", "s2", "s3"):
            body = report_body(server, self.seq, load, self.seq * 3)
            answer = httpx.post(
                f"{self.url}/v1/reports", content=body, headers=bearer(AGENT), timeout=5
            )
            assert answer.status_code in (204, 404), answer.text

    def ctl(self, *args: str, token: str = ADMIN) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DNSLB_API_TOKEN": token}
        return subprocess.run(
            [*DNSLB, "ctl", "--url", self.url, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Process]:
    process = Process(tmp_path)
    try:
        wait_for(process.alive, what="the manager to listen", timeout=30)
        yield process
    finally:
        process.stop()


def test_the_manager_serves_the_api_and_ctl_drives_it(manager: Process) -> None:
    def published() -> bool:
        manager.report(20)
        time.sleep(0.2)
        return httpx.get(f"{manager.url}/readyz", timeout=2).status_code == 200

    wait_for(published, what="the first plan", timeout=30)

    with httpx.Client(base_url=manager.url, headers=bearer(READ), timeout=5) as read:
        servers = read.get("/v1/servers", params={"pool": "www"}).json()
        assert {server["id"] for server in servers} == {"s1", "s2", "s3"}
        assert read.get("/v1/plan").json()["version"] >= 1
        assert "dnslb_server_utilization" in read.get("/metrics").text
        assert httpx.get(f"{manager.url}/v1/servers", timeout=5).status_code == 401
        denied = read.post("/v1/servers/s1/actions", json={"action": "pause"})
        assert denied.status_code == 403

        done = manager.ctl("pause", "s2", "--reason", "integration test")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("s2: ")
        listed = manager.ctl("--json", "servers", "www", token=READ)
        assert listed.returncode == 0, listed.stderr
        [s2] = [server for server in json.loads(listed.stdout) if server["id"] == "s2"]
        assert s2["admin_paused"] is True

        def s2_left_the_plan() -> bool:
            manager.report(20)
            plan = read.get("/v1/plan").json()["plan"]
            [www] = [pool for pool in plan["pools"] if pool["name"] == "www.example.test"]
            return {m["id"]: m.get("state", "active") for m in www["members"]}["s2"] == "paused"

        wait_for(s2_left_the_plan, what="s2 to be paused in the published plan", timeout=30)

        refused = manager.ctl("drain", "s3", token=READ)
        assert refused.returncode == 3
        assert "admin role" in refused.stderr

        events = manager.ctl("events", "--server", "s2", "--kind", "admin_pause")
        assert events.returncode == 0 and "integration test" in events.stdout

    log = manager.log.read_text()
    for token in (ADMIN, READ, AGENT):
        assert token not in log


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_nothing_listens_beyond_loopback_unless_configured(tmp_path: Path) -> None:
    process = Process(tmp_path, default_address=True)
    try:
        wait_for(process.alive, what="the manager to listen", timeout=30)
        assert listening_addresses(process.port) == {"0100007F"}  # 127.0.0.1, little-endian
    finally:
        process.stop()
