"""A manager killed at any point of a local launch leaves nothing running unknown, with real nginx
and agents: after a restart and its reconcile, every process of the pool's servers is one the
manager knows (the recorded nginx, with its workers, and agent of a server in its state), the
address is held by nothing else, and a clean stop leaves no process at all.

The processes are found here with psutil, on their own terms (anything naming the pool's
directory on its command line or holding a file under it open), not with the provider's search.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import manager.providers.local as local
from daemons.process import free_port, port_free
from manager.providers.base import InstanceStatus, LaunchRequest, ProviderContext
from manager.providers.local import LocalProvider, LocalProviderConfig
from tests.integration.stack import ManagerProcess, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NETWORK = "127.0.6"


def lab_processes(root: Path) -> dict[int, int]:
    """pid -> process group of every live process (zombies excluded) of the servers in ``root``."""
    prefix = f"{root.resolve()}/"
    found = {}
    for process in psutil.process_iter():
        try:
            if process.pid == os.getpid() or process.status() == psutil.STATUS_ZOMBIE:
                continue
            named = prefix in " ".join(process.cmdline()) or any(
                opened.path.startswith(prefix) for opened in process.open_files()
            )
            if named:
                found[process.pid] = os.getpgid(process.pid)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


def listeners(port: int) -> set[int]:
    """The processes listening on ``port`` at one of the lab's addresses."""
    found = set()
    for connection in psutil.net_connections("tcp"):
        if connection.status != psutil.CONN_LISTEN or not connection.laddr:
            continue
        ip, listening = connection.laddr[0], connection.laddr[1]
        if listening == port and ip.startswith(f"{NETWORK}.") and connection.pid is not None:
            found.add(connection.pid)
    return found


def recorded_groups(root: Path, refs: list[str]) -> set[int]:
    """The process groups of the recorded nginx (master and workers) and agent of ``refs``."""
    groups = set()
    for ref in refs:
        try:
            record = json.loads((root / ref / "server.json").read_text())
        except (OSError, ValueError):
            continue
        groups |= {pid for pid in (record["nginx_pid"], record["agent_pid"]) if pid is not None}
    return groups


def strays(root: Path, port: int, known: set[int]) -> dict[str, object]:
    """Processes of the lab, and holders of its address, outside the groups in ``known``."""
    found: dict[str, object] = {}
    processes = {pid: group for pid, group in lab_processes(root).items() if group not in known}
    if processes:
        found["processes"] = processes
    holders = {pid for pid in listeners(port) if os.getpgid(pid) not in known}
    if holders:
        found["address held by"] = holders
    return found


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """The pool's directory; whatever a failed test leaves running there is killed after it."""
    directory = tmp_path / "manager" / "providers" / "www"
    yield directory
    for group in set(lab_processes(directory).values()):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


# -- the provider, crashing between two steps (injected) ---------------------------------------


class Crash(BaseException):
    """The manager dies here: nothing after this point runs, no handler sees it."""


def provider(root: Path, port: int) -> LocalProvider:
    config = LocalProviderConfig(
        type="local",
        origin="http://127.0.0.1:9",
        network=NETWORK,
        port=port,
        boot_delay=0,
        report_interval=0.5,
    )
    context = ProviderContext(pool="www", state_dir=root, manager_url="http://127.0.0.1:1")
    return LocalProvider(config, context)


def request(server_id: str) -> LaunchRequest:
    return LaunchRequest(
        server_id=server_id,
        pool="www",
        agent_token="token-0123456789abcdef",
        manager_url="http://127.0.0.1:1",
    )


async def running(local_provider: LocalProvider, ref: str, timeout: float = 30) -> InstanceStatus:
    deadline = time.monotonic() + timeout
    instance = await local_provider.describe(ref)
    while instance.status is InstanceStatus.PENDING and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        instance = await local_provider.describe(ref)
    return instance.status


def crash_before_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(config_path: object) -> list[str]:
        raise Crash

    monkeypatch.setattr(local, "agent_command", crash)


def crash_before_the_pids_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    write = LocalProvider._write

    def crash_or_write(self: LocalProvider, record: local._Record) -> None:
        if record.started:
            raise Crash
        write(self, record)

    monkeypatch.setattr(LocalProvider, "_write", crash_or_write)


# The crashed provider's Popen objects are dropped with their processes running, as a killed
# manager's are: Python says so with a ResourceWarning.
@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")
@pytest.mark.parametrize(
    "crash_point",
    [
        pytest.param(crash_before_the_agent, id="nginx started, not the agent"),
        pytest.param(crash_before_the_pids_are_recorded, id="both started, pids not recorded"),
    ],
)
def test_a_start_cut_short_is_cleaned_up_and_started_again(
    root: Path, monkeypatch: pytest.MonkeyPatch, crash_point: object
) -> None:
    port = free_port()

    async def scenario() -> None:
        crash_point(monkeypatch)  # type: ignore[operator]
        crashed = provider(root, port)
        address = (await crashed.launch(request("www-1"))).address
        assert address is not None
        boots = list(crashed._boots.values())  # the start, in its thread, dies at the crash
        assert [type(e) for e in await asyncio.gather(*boots, return_exceptions=True)] == [Crash]
        monkeypatch.undo()
        orphans = lab_processes(root)
        assert orphans, "the crash left no process: nothing was tested"
        assert listeners(port)  # they hold the server's address
        assert not port_free(address, port)

        restarted = provider(root, port)
        try:
            [instance] = await restarted.list_owned()
            assert instance.status is InstanceStatus.PENDING  # its start begins again
            assert await running(restarted, "www-1") is InstanceStatus.RUNNING
            known = recorded_groups(root, ["www-1"])
            assert len(known) == 2
            assert strays(root, port, known) == {}
            assert not set(orphans) & set(lab_processes(root))
        finally:
            await restarted.close()
        assert lab_processes(root) == {}
        assert listeners(port) == set()
        assert port_free(address, port)

    asyncio.run(scenario())


def test_a_terminate_during_a_start_stops_what_it_started(root: Path) -> None:
    port = free_port()

    async def scenario() -> None:
        local_provider = provider(root, port)
        try:
            for number in range(5):  # the terminate lands before, during or after the start
                ref = f"www-{number}"
                await local_provider.launch(request(ref))
                await asyncio.sleep(number * 0.05)
                await local_provider.terminate(ref)
                assert lab_processes(root) == {}
                assert not (root / ref).exists()
            await asyncio.sleep(0.5)  # a start still in its thread would have started by now
            assert lab_processes(root) == {}
        finally:
            await local_provider.close()

    asyncio.run(scenario())


# -- a manager process killed with SIGKILL ----------------------------------------------------


def manager_config(port: int, boot_delay: float) -> str:
    return f"""
zones: [{{name: example.test, ns: [ns1.example.test]}}]
down_after: 3
tick: 0.5
plan: {{refresh: 1, stale_after: 30}}
pools:
  - name: www
    zone: example.test
    policy: {{k: 2, ttl_max: 4, ttl_min: 1, slow_start: 0, smoothing: 0}}
    provider:
      type: local
      origin: http://127.0.0.1:9
      network: {NETWORK}
      port: {port}
      boot_delay: {boot_delay}
      report_interval: 0.5
    scaling: {{min_servers: 1, max_servers: 1}}
    lifecycle: {{warming_timeout: 60, describe_interval: 0.2}}
"""


def servers(workdir: Path, state: str | None = None) -> list[str]:
    """The provider refs of the servers the manager's state knows (not terminated)."""
    query = "SELECT provider_ref FROM servers WHERE state != 'terminated' AND provider_ref != ''"
    if state is not None:
        query += f" AND state = '{state}'"
    with sqlite3.connect(workdir / "state.db") as db:
        return [row[0] for row in db.execute(query) if row[0]]


def records(root: Path) -> list[dict[str, object]]:
    found = []
    for path in sorted(root.glob("*/server.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # being replaced
    return found


def fast_scan(root: Path) -> bool:
    """Whether a process names ``root`` on its command line (quick: only /proc/*/cmdline)."""
    needle = f"{root.resolve()}/".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes().replace(b"\0", b" "):
                    return True
            except OSError:
                continue
    return False


def kill_manager(manager: ManagerProcess) -> None:
    process, manager.process = manager.process, None
    assert process is not None
    process.send_signal(signal.SIGKILL)
    process.wait()


@pytest.mark.parametrize(
    ("phase", "boot_delay"),
    [
        pytest.param("booting", 3.0, id="killed during the boot delay"),
        pytest.param("starting", 0.5, id="killed as nginx starts"),
        pytest.param("running", 0.5, id="killed once both run"),
    ],
)
def test_a_manager_killed_mid_launch_leaves_nothing_unknown(
    root: Path, phase: str, boot_delay: float
) -> None:
    port = free_port()
    workdir = root.parent.parent
    manager = ManagerProcess(workdir, manager_config(port, boot_delay))
    manager.start()
    try:
        if phase == "booting":
            assert wait_until(lambda: records(root), 20)
            kill_manager(manager)
            assert lab_processes(root) == {}
        elif phase == "starting":
            # Frozen the moment nginx's master exists (its pids are recorded only once nginx
            # answers and the agent runs), then killed.
            assert wait_until(lambda: fast_scan(root), 20, interval=0.002)
            assert manager.process is not None
            manager.process.send_signal(signal.SIGSTOP)
            recorded = [r for r in records(root) if r["nginx_pid"] is not None]
            print(f"frozen with {len(recorded)} of {len(records(root))} servers' pids recorded")
            kill_manager(manager)
            assert lab_processes(root), "nothing was started: nothing was tested"
        else:
            assert wait_until(lambda: any(r["agent_pid"] for r in records(root)), 20)
            kill_manager(manager)
            assert lab_processes(root), "nothing was started: nothing was tested"

        manager.start()  # the same port: the agents' configurations name it

        def recovered() -> bool:
            active = servers(workdir, "active")
            return bool(active) and not strays(root, port, recorded_groups(root, active))

        assert wait_until(recovered, 60, interval=0.25), (
            f"strays: {strays(root, port, recorded_groups(root, servers(workdir)))}; "
            f"servers: {servers(workdir)}"
        )
        known = recorded_groups(root, servers(workdir))
        assert strays(root, port, known) == {}
        assert listeners(port)  # the server the manager knows serves
    finally:
        if manager.process is not None:
            assert manager.stop() == 0
    assert lab_processes(root) == {}
    assert listeners(port) == set()
