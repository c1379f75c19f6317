"""The ``local`` provider: cache servers as real processes on this machine (the lab's default).

Launching a server, after a configurable boot delay (a cloud takes minutes), starts a real nginx
caching an origin on the next free loopback address (``127.0.1.1``, ``127.0.1.2``...) and an agent
reporting its load with the server's own token. Terminating stops both.

Every server has a directory under the provider's state directory holding ``server.json`` (its
address and process ids), nginx's files and the agent's configuration and token (mode 0600).
That directory is how the provider finds its servers again: after the manager is killed or
restarted, :meth:`LocalProvider.list_owned` reads them, checks each process is still ours (its
command line names the directory, so a recycled pid is not mistaken for it), resumes a boot that
was cut short, and the manager's reconcile adopts or terminates them. On a clean exit
(``stop_on_exit``, the default) every server is stopped with the manager: nothing is orphaned.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dnslb.agent_config import AgentConfig, NginxSourceConfig, agent_command
from dnslb.config import dump_config, resolve_secret, setting
from dnslb.errors import DnslbError
from dnslb.nginx import NginxServer, NginxSettings
from dnslb.process import port_free, process_runs, stop_pgid
from dnslb.tokens import token_hash
from manager.providers.base import (
    Instance,
    InstanceStatus,
    LaunchRequest,
    Provider,
    ProviderContext,
    ProviderError,
    register,
)

log = logging.getLogger("dnslb.manager.local")


@dataclass(frozen=True, slots=True)
class LocalProviderConfig:
    """Cache servers run as local nginx + agent processes on loopback addresses."""

    type: Literal["local"]
    origin: str = setting(help="the origin the caches proxy to, e.g. http://127.0.0.1:8000")
    network: str = setting("127.0.1", help="first three octets of the servers' loopback addresses")
    port: int = setting(8080, help="port every cache server listens on", min=1, max=65535)
    boot_delay: float = setting(
        5.0, help="seconds before a launched server starts (a cloud's boot time)", min=0.0
    )
    max_concurrency: int = setting(
        100, help="requests a server can work on at once (what its agent reports)", min=1
    )
    capacity_rps: float | None = setting(
        None, help="emulated capacity: requests a second a server starts; the rest queue", min=0.02
    )
    send_rate: int | None = setting(
        None, help="emulated bandwidth: bytes a second per response", min=1
    )
    send_chunk: int = setting(
        2048,
        help="bytes per paced write with send_rate: a response of S bytes takes about "
        "(S - send_chunk) / send_rate seconds",
        min=512,
        max=1048576,
    )
    report_interval: float = setting(1.0, help="seconds between agent reports", min=0.05)
    stop_on_exit: bool = setting(True, help="stop every server when the manager exits cleanly")

    def config_problems(self) -> Iterator[str]:
        try:
            network = ipaddress.IPv4Address(f"{self.network}.1")
        except ValueError:
            yield f"network: {self.network!r} must be three octets, like 127.0.1"
            return
        if not network.is_loopback:
            yield f"network: {self.network} is not loopback (this provider runs on one machine)"
        parsed = urllib.parse.urlsplit(self.origin)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            yield f"origin: must be an http(s) URL, not {self.origin!r}"


@dataclass(frozen=True, slots=True)
class _Record:
    """``server.json``: what the provider remembers about one server."""

    server_id: str
    pool: str
    address: str
    token_hash: str
    boot_at: float  # wall time the processes may start
    nginx_pid: int | None = None
    agent_pid: int | None = None
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps({key: getattr(self, key) for key in self.__dataclass_fields__})


@register("local")
class LocalProvider(Provider):
    def __init__(self, config: LocalProviderConfig, context: ProviderContext) -> None:
        super().__init__(config, context)
        self.config: LocalProviderConfig = config
        self.root = context.state_dir
        self._boots: dict[str, asyncio.Task[None]] = {}
        self._nginx: dict[str, NginxServer] = {}
        self._agents: dict[str, subprocess.Popen[bytes]] = {}

    # -- files --------------------------------------------------------------------------------

    def _dir(self, ref: str) -> Path:
        if "/" in ref or ref in ("", ".", ".."):
            raise ProviderError(f"not a local server: {ref!r}")
        return self.root / ref

    def _read(self, ref: str) -> _Record | None:
        try:
            raw: dict[str, Any] = json.loads((self._dir(ref) / "server.json").read_text())
            return _Record(**raw)
        except (OSError, ValueError, TypeError):
            return None

    def _write(self, record: _Record) -> None:
        path = self._dir(record.server_id) / "server.json"
        temp = path.with_name(".server.json.tmp")
        temp.write_text(record.to_json())
        os.replace(temp, path)

    # -- the interface ------------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> Instance:
        ref = request.server_id
        if self._read(ref) is not None:  # idempotent: a retried launch finds the first one
            return await self.describe(ref)
        address = self._free_address()
        directory = self._dir(ref)
        directory.mkdir(parents=True, exist_ok=False)
        token_path = directory / "agent.token"
        token_path.touch(mode=0o600)
        token_path.write_text(request.agent_token + "\n")
        agent = AgentConfig(
            server_id=ref,
            manager_url=request.manager_url,
            token=resolve_secret(f"file:{token_path}"),
            source=NginxSourceConfig(
                url=self._nginx_settings(address).status_url,
                max_concurrency=self.config.max_concurrency,
            ),
            interval=self.config.report_interval,
        )
        (directory / "agent.yaml").write_text(dump_config(agent))
        record = _Record(
            server_id=ref,
            pool=request.pool,
            address=address,
            token_hash=token_hash(request.agent_token),
            boot_at=self.context.clock.time() + self.config.boot_delay,
        )
        self._write(record)
        self._boot(record)
        return self._instance(record)

    async def describe(self, ref: str) -> Instance:
        record = self._read(ref)
        if record is None:
            return Instance(ref=ref, status=InstanceStatus.GONE)
        if record.error:
            return self._instance(record)
        if record.nginx_pid is None and ref not in self._boots:
            self._boot(record)  # a boot cut short by a manager restart goes on
        return self._instance(record)

    async def terminate(self, ref: str) -> None:
        task = self._boots.pop(ref, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(self._stop, ref)

    async def list_owned(self) -> list[Instance]:
        if not self.root.is_dir():
            return []
        found = []
        for directory in sorted(self.root.iterdir()):
            record = self._read(directory.name)
            if record is not None and record.pool == self.context.pool:
                found.append(await self.describe(directory.name))
        return found

    @property
    def stops_servers_on_close(self) -> bool:
        return self.config.stop_on_exit

    async def close(self) -> None:
        for task in list(self._boots.values()):
            task.cancel()
        await asyncio.gather(*self._boots.values(), return_exceptions=True)
        self._boots.clear()
        if self.config.stop_on_exit and self.root.is_dir():
            for directory in sorted(self.root.iterdir()):
                await asyncio.to_thread(self._stop, directory.name)

    # -- processes ----------------------------------------------------------------------------

    def _instance(self, record: _Record) -> Instance:
        directory = str(self._dir(record.server_id))
        if record.error:
            status, detail = InstanceStatus.GONE, record.error
        elif record.nginx_pid is None:
            status, detail = InstanceStatus.PENDING, "booting"
        elif process_runs(record.nginx_pid, directory):
            status, detail = InstanceStatus.RUNNING, f"nginx pid {record.nginx_pid}"
        else:
            status, detail = InstanceStatus.GONE, "nginx is not running"
        return Instance(
            ref=record.server_id,
            status=status,
            server_id=record.server_id,
            pool=record.pool,
            address=record.address,
            token_hash=record.token_hash,
            detail=detail,
        )

    def _nginx_settings(self, address: str) -> NginxSettings:
        return NginxSettings(
            address=address,
            port=self.config.port,
            origin=self.config.origin,
            capacity_rps=self.config.capacity_rps,
            send_rate=self.config.send_rate,
            send_chunk=self.config.send_chunk,
        )

    def _free_address(self) -> str:
        used = set()
        if self.root.is_dir():
            for directory in self.root.iterdir():
                record = self._read(directory.name)
                if record is not None:
                    used.add(record.address)
        for host in range(1, 255):
            address = f"{self.config.network}.{host}"
            if address not in used and port_free(address, self.config.port):
                return address
        raise ProviderError(f"no free address left in {self.config.network}.1-254")

    def _boot(self, record: _Record) -> None:
        task = asyncio.create_task(self._boot_after_delay(record), name=f"boot {record.server_id}")
        self._boots[record.server_id] = task

    async def _boot_after_delay(self, record: _Record) -> None:
        try:
            delay = record.boot_at - self.context.clock.time()
            if delay > 0:
                await self.context.clock.sleep(delay)
            await asyncio.to_thread(self._start, record)
        finally:
            self._boots.pop(record.server_id, None)

    def _start(self, record: _Record) -> None:
        """Start nginx and the agent (in a thread: nginx takes a moment to answer)."""
        directory = self._dir(record.server_id)
        if not directory.is_dir():
            return  # terminated while booting
        nginx = NginxServer(self._nginx_settings(record.address), directory / "nginx")
        try:
            nginx.start()
        except DnslbError as exc:
            log.error("local server %s did not start: %s", record.server_id, exc)
            self._write(_with(record, error=f"nginx did not start: {str(exc)[:300]}"))
            return
        with open(directory / "agent.log", "ab") as agent_log:
            agent = subprocess.Popen(
                agent_command(directory / "agent.yaml"),
                stdin=subprocess.DEVNULL,
                stdout=agent_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=directory,
            )
        self._nginx[record.server_id] = nginx
        self._agents[record.server_id] = agent
        self._write(_with(record, nginx_pid=nginx.pid, agent_pid=agent.pid))
        log.info(
            "local server %s runs at %s:%d", record.server_id, record.address, self.config.port
        )

    def _stop(self, ref: str) -> None:
        """Stop a server's agent and nginx, and remove its directory (idempotent)."""
        record = self._read(ref)
        directory = self._dir(ref)
        agent = self._agents.pop(ref, None)
        nginx = self._nginx.pop(ref, None)
        if agent is not None:
            if agent.poll() is None:
                stop_pgid(agent.pid)
            agent.wait()
        elif (
            record is not None
            and record.agent_pid
            and process_runs(record.agent_pid, str(directory))
        ):
            stop_pgid(record.agent_pid)
        if nginx is not None:
            nginx.stop()
        elif (
            record is not None
            and record.nginx_pid
            and process_runs(record.nginx_pid, str(directory))
        ):
            stop_pgid(record.nginx_pid)
        shutil.rmtree(directory, ignore_errors=True)


def _with(record: _Record, **changes: Any) -> _Record:
    values = {key: getattr(record, key) for key in record.__dataclass_fields__}
    values.update(changes)
    return _Record(**values)
