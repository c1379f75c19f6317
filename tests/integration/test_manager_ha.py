"""Two real manager processes in active/standby on one real PostgreSQL cluster, launching real
local servers (nginx and an agent each) into one shared provider directory.

- ``kill -9`` of the leader while it scales a pool out: the standby leads once the lease
  expires in the database, publishes, resumes the launches cut short by their server ids;
  afterwards no server was launched twice and nothing runs that the state does not know.
- The leader cut off from the database (its connections through a relay the test cuts): it
  stops acting (its role reads standby) before the standby, which still reaches the database,
  leads in a new epoch.

Figures (seconds from the kill or the cut to the new leader, and to its first plan) are
printed, not asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from daemons.process import free_port
from tests.integration.postgres import PostgresCluster, SocketProxy, postgres_cluster
from tests.integration.stack import ManagerProcess, Origin, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NETWORK = "127.0.7"
READ_TOKEN = "ha-read-token-0123456789"  # the API wants a read token configured
SERVERS = 3


def config(shared: Path, url: str, origin: str, port: int) -> str:
    return f"""
zones: [{{name: example.test, ns: [ns1.example.test]}}]
down_after: 3
tick: 0.5
auth: {{api_tokens: [{{token: "file:read.token", role: read}}]}}
plan: {{refresh: 1, stale_after: 30}}
state:
  path: {shared / "state.db"}
  url: "{url}"
  leadership: {{lease: 3, renew: 0.5, margin: 1}}
pools:
  - name: www
    zone: example.test
    policy: {{k: 2, slow_start: 0, smoothing: 0}}
    provider:
      type: local
      origin: {origin}
      network: {NETWORK}
      port: {port}
      boot_delay: 2
      max_concurrency: 4
      report_interval: 0.5
    scaling: {{min_servers: {SERVERS}, max_servers: {SERVERS}, th_high: 0.9, th_low: 0.05,
               window: 3, scale_in_window: 600, boot_time: 2, max_step: 1}}
    lifecycle: {{warming_timeout: 120, drain_timeout: 30, describe_interval: 0.2}}
"""


def role(manager: ManagerProcess) -> tuple[str, int] | None:
    """(role, epoch) from /healthz, which reads no database; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"{manager.url}/healthz", timeout=2) as response:
            document = json.load(response)
    except (OSError, ValueError):
        return None
    return document["role"], document["epoch"]


def servers(cluster: PostgresCluster) -> dict[str, tuple[str, str]]:
    """Every server in the database: id -> (state, state reason)."""
    with psycopg.connect(cluster.url) as conn:
        rows = conn.execute("SELECT id, state, state_reason FROM dnslb_servers").fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}


def server_dirs(root: Path) -> set[str]:
    if not root.is_dir():
        return set()
    return {entry.name for entry in root.iterdir() if not entry.name.startswith(".")}


def lab_processes(root: Path) -> set[int]:
    """Live processes naming the pool's directory on their command line or holding a file in it."""
    prefix = f"{root.resolve()}/"
    found = set()
    for process in psutil.process_iter():
        try:
            if process.pid == os.getpid() or process.status() == psutil.STATUS_ZOMBIE:
                continue
            if prefix in " ".join(process.cmdline()) or any(
                opened.path.startswith(prefix) for opened in process.open_files()
            ):
                found.add(process.pid)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


def recorded_pids(root: Path, server_ids: set[str]) -> set[int]:
    """The recorded nginx and agent process groups of ``server_ids`` (their members)."""
    groups = set()
    for server_id in server_ids:
        try:
            record = json.loads((root / server_id / "server.json").read_text())
        except (OSError, ValueError):
            continue
        groups |= {pid for pid in (record.get("nginx_pid"), record.get("agent_pid")) if pid}
    pids = set()
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) in groups:
                pids.add(process.pid)
        except (psutil.Error, ProcessLookupError):
            continue
    return pids


def kill_strays(root: Path) -> None:
    for pid in lab_processes(root):
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            continue


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "shared"
    directory.mkdir()
    yield directory
    kill_strays(directory / "providers" / "www")  # after a failure only: a pass leaves none


def manager_in(
    tmp_path: Path,
    name: str,
    shared: Path,
    cluster: PostgresCluster,
    origin: str,
    port: int,
    *,
    url: str | None = None,
) -> ManagerProcess:
    workdir = tmp_path / name
    workdir.mkdir()
    (workdir / "read.token").write_text(READ_TOKEN + "\n")
    return ManagerProcess(workdir, config(shared, url or cluster.url, origin, port))


def peers(*managers: ManagerProcess) -> None:
    """Each manager lists the others (``http.peer_urls``): launched agents follow the leader."""
    for manager in managers:
        others = [m.url for m in managers if m is not manager]
        manager.http = f", peer_urls: {json.dumps(others)}"


def _first(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> float:
    took = wait_until(predicate, timeout, interval=0.05)
    assert took is not None, f"not within {timeout} s: {what}"
    return took


def lead_then_stand_by(a: ManagerProcess, b: ManagerProcess) -> None:
    """``a`` (started) leads in epoch 1; then ``b`` starts and stands by."""
    _first(lambda: role(a) == ("leader", 1), "a leads")
    b.start()
    _first(lambda: role(b) == ("standby", 0), "b stands by")


def kill_the_leader(a: ManagerProcess, b: ManagerProcess) -> tuple[float, float]:
    """SIGKILL the leader ``a`` and wait until the standby ``b`` leads in epoch 2: (the
    monotonic moment of the kill, seconds from it to ``b`` leading)."""
    assert a.process is not None
    os.killpg(a.process.pid, signal.SIGKILL)
    killed = time.monotonic()
    a.process.wait()
    a.process = None
    _first(lambda: role(b) == ("leader", 2), "b leads")
    return killed, time.monotonic() - killed


@contextlib.contextmanager
def leader_and_standby(
    tmp_path: Path, shared: Path
) -> Iterator[tuple[PostgresCluster, ManagerProcess, ManagerProcess]]:
    """Managers ``a`` and ``b`` on one throwaway PostgreSQL, peers of each other: ``a`` leads
    in epoch 1, ``b`` stands by; both stopped at the end."""
    port = free_port()
    with postgres_cluster() as cluster, Origin() as origin:
        a = manager_in(tmp_path, "a", shared, cluster, origin.url, port)
        b = manager_in(tmp_path, "b", shared, cluster, origin.url, port)
        peers(a, b)
        a.start()
        try:
            lead_then_stand_by(a, b)
            yield cluster, a, b
        finally:
            b.stop()
            a.stop()


def test_kill_the_leader_during_a_scale_out(tmp_path: Path, shared: Path) -> None:

    root = shared / "providers" / "www"
    with leader_and_standby(tmp_path, shared) as (cluster, a, b):
        # a scales the pool out from nothing; kill it once a launch is under way and at
        # least one server's directory exists (the provider was called)
        _first(
            lambda: (
                bool(server_dirs(root))
                and any(state == "launching" for state, _ in servers(cluster).values())
            ),
            "a launch under way",
        )
        killed, leading = kill_the_leader(a, b)
        _first(b.plan_path.exists, "b publishes")
        published = time.monotonic() - killed
        assert json.loads(b.plan_path.read_text())["epoch"] == 2
        print(
            f"\nkill -9 -> standby leads: {leading:.2f} s (lease 3 s); "
            f"-> first plan: {published:.2f} s ({published - leading:.2f} s after leading)"
        )
        # every launch finishes under b: nothing is left launching
        _first(
            lambda: (
                sum(1 for state, _ in servers(cluster).values() if state in ("warming", "active"))
                == SERVERS
                and not any(state == "launching" for state, _ in servers(cluster).values())
            ),
            f"{SERVERS} servers launched",
        )
        found = servers(cluster)
        live = {sid for sid, (state, _) in found.items() if state != "terminated"}
        cut_short = {sid for sid, (_, why) in found.items() if "cut short" in why}
        # Launched twice: a server more than the pool needs (b not knowing a's launches),
        # other than launches that never reached the provider.
        assert len(found) - len(cut_short) == SERVERS, found
        # Orphaned: a server directory, or a process, the state does not know.
        assert server_dirs(root) == live
        assert lab_processes(root) <= recorded_pids(root, live)
        assert b.stop() == 0
        assert wait_until(lambda: not lab_processes(root), 15) is not None


def test_a_leader_cut_off_from_the_database_stops_before_another_leads(
    tmp_path: Path, shared: Path
) -> None:

    port = free_port()
    with postgres_cluster() as cluster, Origin() as origin:
        proxy = SocketProxy(cluster, tmp_path / "proxy")
        a = manager_in(tmp_path, "a", shared, cluster, origin.url, port, url=proxy.url)
        b = manager_in(tmp_path, "b", shared, cluster, origin.url, port)
        with proxy:
            a.start()
            try:
                lead_then_stand_by(a, b)
                proxy.sever()  # a alone loses its database; b keeps it
                cut = time.monotonic()
                seen: list[tuple[float, str, tuple[str, int] | None]] = []

                def watch() -> bool:
                    for name, manager in (("a", a), ("b", b)):
                        seen.append((time.monotonic(), name, role(manager)))
                    return seen[-1][2] == ("leader", 2)

                _first(watch, "b leads")
                a_last = max(
                    when for when, name, got in seen if name == "a" and got == ("leader", 1)
                )
                b_first = min(
                    when for when, name, got in seen if name == "b" and got == ("leader", 2)
                )
                print(
                    f"\ncut -> a last seen leading: {a_last - cut:.2f} s; "
                    f"-> b first seen leading: {b_first - cut:.2f} s (lease 3 s, margin 1 s)"
                )
                assert a_last < b_first
                assert role(a) == ("standby", 0)
                # b's plan, and no server launched by both
                _first(b.plan_path.exists, "b publishes")
                found = servers(cluster)
                assert len(found) - sum("cut short" in why for _, why in found.values()) <= SERVERS
            finally:
                b.stop()
                a.stop()


def test_a_leader_stopped_cleanly_leaves_its_servers_to_the_standby(
    tmp_path: Path, shared: Path
) -> None:
    """The local provider stops its servers when its manager exits (``stop_on_exit``, on by
    default): a leader stopped while a standby answers leaves them running for it (a restart
    of the leader must not take the fleet down); the last manager to stop stops them."""

    root = shared / "providers" / "www"
    with leader_and_standby(tmp_path, shared) as (cluster, a, b):

        def active() -> set[str]:
            return {sid for sid, (state, _) in servers(cluster).items() if state == "active"}

        _first(lambda: len(active()) == SERVERS, f"{SERVERS} servers active under a")
        running = active()
        pids = recorded_pids(root, running)
        assert pids
        assert a.stop() == 0
        _first(lambda: role(b) == ("leader", 2), "b leads")
        # Nothing was stopped or launched: b leads the very servers a ran.
        found = servers(cluster)
        assert {sid for sid, (state, _) in found.items() if state != "terminated"} == running
        assert all(psutil.pid_exists(pid) for pid in pids)
        assert "leaving the servers running" in a.log_path.read_text()
        _first(lambda: active() == running, "b takes a's servers as they are", timeout=10)
        # b stops last, with no standby: it stops the servers.
        assert b.stop() == 0
        assert wait_until(lambda: not lab_processes(root), 15) is not None
        assert "leaving the servers running" not in b.log_path.read_text()
