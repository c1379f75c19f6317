"""The local provider's files and its hunt for processes, with stand-in processes (no nginx):
a launch writes its directory in one step, a crash while writing leaves nothing after a restart,
and a listing stops every process of the pool's directory that no running server records.

(The same with real nginx and a manager killed with SIGKILL: tests/integration/
test_local_provider_crash.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import manager.providers.local as local
from dnslb.clock import FakeClock
from manager.providers.base import InstanceStatus, LaunchRequest, ProviderContext
from manager.providers.local import LocalProvider, LocalProviderConfig, processes_under

# A stand-in process: sets its name (what /proc/PID/comm shows: "nginx" makes it one), opens
# the files it is given (as nginx's workers hold their log open), says it is ready, and sleeps
# (bounded, should a test fail to stop it). Its other arguments make up its command line.
STAND_IN = """
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
held = [open(path, "ab") for path in sys.argv[2].split(",") if path]
print("ready", flush=True)
time.sleep(120)
"""


class StandIns:
    """Stand-in processes started by a test, each in a session of its own; all stopped after."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(
        self, name: str, *args: str, holding: Sequence[Path] = (), user: str | None = None
    ) -> int:
        process = subprocess.Popen(
            [sys.executable, "-c", STAND_IN, name, ",".join(map(str, holding)), *args],
            stdout=subprocess.PIPE,
            start_new_session=True,
            user=user,
        )
        assert process.stdout is not None
        assert process.stdout.readline() == b"ready\n"
        self.started.append(process)
        return process.pid

    def agent(self, config: Path) -> int:
        return self.start("python3", "agent", "--config", str(config))

    def nginx_master(self, directory: Path) -> int:
        return self.start("nginx", "-p", f"{directory}/nginx/", "-c", f"{directory}/nginx.conf")

    def nginx_worker(self, directory: Path) -> int:
        (directory / "nginx").mkdir(parents=True, exist_ok=True)
        return self.start("nginx", holding=[directory / "nginx" / "error.log"])

    def running(self) -> set[int]:
        return {p.pid for p in self.started if p.poll() is None}

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait()
            assert process.stdout is not None
            process.stdout.close()


@pytest.fixture
def stand_ins() -> Iterator[StandIns]:
    processes = StandIns()
    try:
        yield processes
    finally:
        processes.stop()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return (tmp_path / "providers" / "www").resolve()


def provider(root: Path, boot_delay: float = 5.0) -> LocalProvider:
    config = LocalProviderConfig(
        type="local",
        origin="http://127.0.0.1:9",
        network="127.0.5",
        port=18080,
        boot_delay=boot_delay,
    )
    context = ProviderContext(
        pool="www", state_dir=root, manager_url="http://127.0.0.1:1", clock=FakeClock()
    )
    return LocalProvider(config, context)


def request(server_id: str) -> LaunchRequest:
    return LaunchRequest(
        server_id=server_id,
        pool="www",
        agent_token=f"token-of-{server_id}-0123456789",
        manager_url="http://127.0.0.1:1",
    )


def write_record(root: Path, name: str, **fields: object) -> Path:
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "server_id": name,
        "pool": "www",
        "address": "127.0.5.9",
        "token_hash": "0" * 64,
        "boot_at": 2e9,  # far ahead of the fake clock: a listing never starts anything
        **fields,
    }
    (directory / "server.json").write_text(json.dumps(record))
    return directory


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coroutine)


# -- files ------------------------------------------------------------------------------------


def test_a_launch_writes_a_private_directory_in_one_step(root: Path) -> None:
    async def scenario() -> None:
        local_provider = provider(root, boot_delay=1000)
        instance = await local_provider.launch(request("www-1"))
        assert instance.status is InstanceStatus.PENDING
        assert instance.address == "127.0.5.1"
        directory = root / "www-1"
        assert sorted(p.name for p in root.iterdir()) == ["www-1"]  # no temporary directory
        assert mode(root) == 0o700
        assert mode(directory) == 0o700
        assert mode(directory / "agent.token") == 0o600
        assert (directory / "agent.token").read_text() == "token-of-www-1-0123456789\n"
        agent = (directory / "agent.yaml").read_text()
        assert f"file:{directory}/agent.token" in agent
        assert "token-of" not in agent
        assert json.loads((directory / "server.json").read_text())["address"] == "127.0.5.1"
        await local_provider.close()
        assert list(root.iterdir()) == []

    run(scenario())


class Crash(BaseException):
    """The manager dies here (nothing after this point runs, no handler sees it)."""


def test_a_launch_cut_short_while_writing_leaves_nothing_after_a_restart(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(instance: object) -> str:
        raise Crash

    async def scenario() -> None:
        monkeypatch.setattr(local, "dump_config", crash)
        with pytest.raises(Crash):
            await provider(root, boot_delay=1000).launch(request("www-1"))
        assert [p.name for p in root.iterdir()] == [".www-1.new"]  # with the token in it
        monkeypatch.undo()
        restarted = provider(root, boot_delay=1000)
        assert await restarted.list_owned() == []
        assert list(root.iterdir()) == []
        retried = await restarted.launch(request("www-1"))  # the same server, launched again
        assert retried.status is InstanceStatus.PENDING
        assert [p.name for p in root.iterdir()] == ["www-1"]
        await restarted.close()

    run(scenario())


def test_a_directory_without_its_record_is_listed_for_termination(root: Path) -> None:
    """An older version wrote the token before server.json: such debris is listed without a
    server id (the manager terminates it) and a terminate removes it."""

    async def scenario() -> None:
        debris = root / "www-7"
        debris.mkdir(parents=True)
        (debris / "agent.token").write_text("secret\n")
        local_provider = provider(root)
        [instance] = await local_provider.list_owned()
        assert (instance.ref, instance.server_id, instance.status) == (
            "www-7",
            None,
            InstanceStatus.PENDING,
        )
        await local_provider.terminate("www-7")
        assert not debris.exists()

    run(scenario())


# -- processes --------------------------------------------------------------------------------


def test_processes_are_found_by_what_they_name(
    root: Path, tmp_path: Path, stand_ins: StandIns
) -> None:
    server = root / "www-1"
    (server / "nginx").mkdir(parents=True)
    ours = {
        stand_ins.agent(server / "agent.yaml"),
        stand_ins.nginx_master(server),
        stand_ins.nginx_worker(server),
    }
    # Not ours: an editor on the agent's file, a tail of nginx's log, another pool's nginx.
    stand_ins.start("vi", str(server / "agent.yaml"))
    stand_ins.start("tail", holding=[server / "nginx" / "error.log"])
    stand_ins.nginx_master(tmp_path / "providers" / "www2" / "www2-1")
    stand_ins.start("nginx", "-p", f"{root}/../elsewhere/")
    if os.geteuid() == 0:  # another user's process, whatever its command line says
        stand_ins.start("nginx", "-p", f"{server}/nginx/", user="nobody")
    found = processes_under(root)
    assert {(p.pid, p.server) for p in found} == {(pid, "www-1") for pid in ours}
    assert all(p.group == p.pid for p in found)  # each leads its own group (its own session)


def test_a_listing_stops_every_process_no_running_server_records(
    root: Path, stand_ins: StandIns
) -> None:
    running = write_record(root, "www-1")  # complete: its recorded processes run
    master = stand_ins.nginx_master(running)
    agent = stand_ins.agent(running / "agent.yaml")
    write_record(root, "www-1", nginx_pid=master, agent_pid=agent)
    second_agent = stand_ins.agent(running / "agent.yaml")  # not recorded
    cut_short = write_record(root, "www-2")  # a start cut short: pids never recorded
    leftovers = {stand_ins.nginx_master(cut_short), stand_ins.agent(cut_short / "agent.yaml")}
    gone = root / "www-3"  # its directory is gone, its processes are not
    orphans = {stand_ins.nginx_worker(gone), stand_ins.agent(gone / "agent.yaml")}
    shutil.rmtree(gone)

    async def scenario() -> None:
        local_provider = provider(root)
        instances = {i.ref: i for i in await local_provider.list_owned()}
        assert instances["www-1"].status is InstanceStatus.RUNNING
        assert instances["www-2"].status is InstanceStatus.PENDING  # it boots again
        assert set(instances) == {"www-1", "www-2"}
        assert stand_ins.running() == {master, agent}
        assert second_agent not in stand_ins.running()
        assert not leftovers & stand_ins.running()
        assert not orphans & stand_ins.running()
        await local_provider.close()  # stop_on_exit: everything goes, recorded or not
        assert stand_ins.running() == set()
        assert list(root.iterdir()) == []

    run(scenario())


def test_a_server_whose_nginx_died_is_reaped_with_its_agent(
    root: Path, stand_ins: StandIns
) -> None:
    directory = write_record(root, "www-1")
    dead = stand_ins.nginx_master(directory)
    agent = stand_ins.agent(directory / "agent.yaml")
    write_record(root, "www-1", nginx_pid=dead, agent_pid=agent)
    os.kill(dead, signal.SIGKILL)
    stand_ins.started[0].wait()

    async def scenario() -> None:
        [instance] = await provider(root).list_owned()
        assert instance.status is InstanceStatus.GONE
        assert instance.detail == "nginx is not running"
        assert stand_ins.running() == set()  # its agent too
        assert not directory.exists()  # and its address is free again

    run(scenario())


def test_a_failed_start_is_reaped(root: Path) -> None:
    directory = write_record(root, "www-1", error="nginx did not start: port in use")

    async def scenario() -> None:
        [instance] = await provider(root).list_owned()
        assert instance.status is InstanceStatus.GONE
        assert instance.detail == "nginx did not start: port in use"
        assert not directory.exists()

    run(scenario())
