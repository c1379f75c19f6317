"""The ``local`` provider: cache servers as real processes on this machine (the lab's default).

Launching a server, after a configurable boot delay (a cloud takes minutes), starts a real nginx
caching an origin on the next free loopback address (``127.0.1.1``, ``127.0.1.2``...) and an agent
reporting its load with the server's own token. Terminating stops both.

Every server has a directory under the provider's state directory (mode 0700) holding
``server.json`` (its address and process ids), nginx's files and the agent's configuration and
token (mode 0600). That directory is how the provider finds its servers again: after the manager
is killed or restarted, :meth:`LocalProvider.list_owned` reads them, resumes a boot that was cut
short, and the manager's reconcile adopts or terminates them. On a clean exit (``stop_on_exit``,
the default) every server is stopped with the manager: nothing is orphaned.

**A manager killed at any point of a launch leaves nothing running unknown.**

- *Intent first.* A launch writes the whole directory (``server.json`` with the address, the
  agent's configuration and token) under a temporary name and renames it into place before
  anything starts: a server's directory is complete or absent, and a temporary one left by a
  crash is removed by the next listing.
- *Processes are found by what they name, not by recorded pids* (pids are written only after the
  processes start, so a crash in between loses them). Every process of a server names its
  directory: nginx's master on its command line (``-p DIR/nginx/``), its workers through the log
  files they hold open (they survive their master), the agent on its command line (``--config
  DIR/agent.yaml``). :func:`processes_under` reads them from ``/proc``.
- *Anything not recorded is stopped.* Each listing (the manager's reconcile, at start and
  periodically) stops every process under the pool's directory that is not the recorded nginx
  (with its workers) or agent of a complete server: a start cut short, a server whose directory
  is gone, workers whose master died. A start that was cut short begins again from scratch, its
  leftovers stopped first, so the address is free for it. A terminate and the manager's exit
  stop every process naming the server's directory, recorded or not.
- *No races with ourselves.* The start and the stop of one server hold the same lock, so a
  terminate or an exit during a start waits for it and then stops what it started.

Processes left by an earlier manager are not this manager's children: it stops them but cannot
reap them (whoever inherited them does). "Gone" means no live process (a zombie holds no
address, memory or file).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from daemons.nginx import NginxServer, NginxSettings
from daemons.process import port_free, process_runs, stop_group
from dnslb.agent_config import AgentConfig, NginxSourceConfig, agent_command
from dnslb.config import FileReference, Secret, dump_config, setting
from dnslb.errors import DnslbError
from dnslb.tokens import token_hash
from manager.providers.base import (
    Instance,
    InstanceStatus,
    LaunchRequest,
    Provider,
    ProviderConfig,
    ProviderContext,
    ProviderError,
    register,
)

log = logging.getLogger("dnslb.manager.local")

STOP_TIMEOUT = 5.0
"""Seconds a server's processes get to exit after SIGTERM before SIGKILL."""

_PROC = Path("/proc")
_STAGING_SUFFIX = ".new"


@dataclass(frozen=True, slots=True)
class LocalProviderConfig(ProviderConfig):
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

    @property
    def started(self) -> bool:
        """Both processes started and recorded (until then the server is booting)."""
        return self.nginx_pid is not None and self.agent_pid is not None

    def to_json(self) -> str:
        return json.dumps({key: getattr(self, key) for key in self.__dataclass_fields__})


# -- the processes of a pool's servers ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerProcess:
    """A live process of a local server, as found in ``/proc``."""

    pid: int
    group: int  # its process group: its own (nginx's master, the agent), or its master's
    server: str  # the name of its server's directory


def processes_under(root: Path) -> list[ServerProcess]:
    """The live processes (zombies excluded) of the servers whose directories are in ``root``.

    ``root`` is absolute and resolved, as the kernel shows paths. A process is a server's when
    its command line is an agent's on ``ROOT/NAME/agent.yaml``, or it is an nginx whose command
    line names ``-p ROOT/NAME/`` (a master) or that holds a file under ``ROOT/NAME/`` open (a
    worker: its title names nothing, and it outlives a master killed with SIGKILL). An editor or
    ``tail`` on those files is not an agent or an nginx, so it is never taken for one, nor is a
    process of another user. Empty where there is no ``/proc``.
    """
    prefix = os.fsencode(f"{root}/")
    own, user = os.getpid(), os.geteuid()
    found = []
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            if entry.stat().st_uid != user:
                continue  # ours run as this process's user; a command line is easy to fake
            stat = (entry / "stat").read_bytes()
            argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:  # it exited while we looked
            continue
        comm = stat.partition(b"(")[2].rpartition(b")")[0]
        fields = stat.rpartition(b")")[2].split()
        if len(fields) < 3 or fields[0] in (b"Z", b"X"):
            continue
        server = _agent_of(argv, prefix)
        if server is None and comm == b"nginx":
            server = _nginx_of(entry, argv, prefix)
        if server and server not in (b".", b".."):
            found.append(ServerProcess(int(entry.name), int(fields[2]), os.fsdecode(server)))
    return found


def _agent_of(argv: list[bytes], prefix: bytes) -> bytes | None:
    """The server an agent's command line (``... agent --config ROOT/NAME/agent.yaml``) names."""
    for index in range(1, len(argv) - 1):
        if argv[index] != b"--config" or b"agent" not in argv[:index]:
            continue
        path = argv[index + 1]
        if path.startswith(prefix) and path.endswith(b"/agent.yaml"):
            name = path[len(prefix) : -len(b"/agent.yaml")]
            if name and b"/" not in name:
                return name
    return None


def _nginx_of(entry: Path, argv: list[bytes], prefix: bytes) -> bytes | None:
    """The server an nginx process belongs to: ``-p ROOT/NAME/...`` on its command line (the
    master, whose title repeats it), else a file under ``ROOT/NAME/`` it holds open."""
    line = b" ".join(argv)
    at = line.find(b"-p " + prefix)
    if at >= 0:
        return line[at + 3 + len(prefix) :].partition(b"/")[0] or None
    try:
        descriptors = list((entry / "fd").iterdir())
    except OSError:
        return None
    for descriptor in descriptors:
        try:
            target = os.fsencode(os.readlink(descriptor))
        except OSError:
            continue
        if target.startswith(prefix):
            return target[len(prefix) :].partition(b"/")[0] or None
    return None


def stop_processes(processes: Iterable[ServerProcess], timeout: float = STOP_TIMEOUT) -> None:
    """Stop ``processes`` with their process groups (nginx's workers are in their master's):
    SIGTERM, SIGKILL after ``timeout`` seconds, and wait until none of them is alive.

    A process in this process's own group is signalled alone, never the group. Raises
    :class:`ProviderError` (retryable) if something survives SIGKILL for ``timeout`` seconds.
    """
    own = os.getpgrp()
    groups: set[int] = set()
    singles: set[int] = set()
    for process in processes:
        if process.group > 1 and process.group != own:
            groups.add(process.group)
        else:
            singles.add(process.pid)
    if not groups and not singles:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        for pid in singles:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while (left := _alive(groups, singles)) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not left:
            return
    raise ProviderError(f"processes {sorted(left)} survive SIGKILL", retryable=True)


def _alive(groups: set[int], pids: set[int]) -> list[int]:
    """The live (not zombie) processes that are in ``groups`` or are ``pids`` (one /proc pass)."""
    alive = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_bytes().rpartition(b")")[2].split()
        except OSError:
            continue
        pid = int(entry.name)
        if fields[0] not in (b"Z", b"X") and (pid in pids or int(fields[2]) in groups):
            alive.append(pid)
    return alive


# -- the provider ------------------------------------------------------------------------------


@register(LocalProviderConfig)
class LocalProvider(Provider):
    def __init__(self, config: LocalProviderConfig, context: ProviderContext) -> None:
        super().__init__(config, context)
        self.config: LocalProviderConfig = config
        # Resolved: processes are found by the paths the kernel shows, which are resolved.
        self.root = context.state_dir.resolve()
        self._boots: dict[str, asyncio.Task[None]] = {}
        self._nginx: dict[str, NginxServer] = {}
        self._agents: dict[str, subprocess.Popen[bytes]] = {}
        self._locks: dict[str, threading.Lock] = {}

    # -- files --------------------------------------------------------------------------------

    def _dir(self, ref: str) -> Path:
        if "/" in ref or "\0" in ref or ref.startswith(".") or not ref:
            raise ProviderError(f"not a local server: {ref!r}")
        return self.root / ref

    def _staging(self, ref: str) -> Path:
        """Where a launch writes the server's directory before renaming it into place."""
        return self.root / f".{ref}{_STAGING_SUFFIX}"

    def _names(self) -> list[str]:
        """The names of the servers' directories (temporary ones excluded)."""
        if not self.root.is_dir():
            return []
        return sorted(
            entry.name
            for entry in self.root.iterdir()
            if not entry.name.startswith(".") and entry.is_dir()
        )

    def _read(self, ref: str) -> _Record | None:
        try:
            raw: dict[str, Any] = json.loads((self._dir(ref) / "server.json").read_text())
            return _Record(**raw)
        except (OSError, ValueError, TypeError, ProviderError):
            return None

    def _write(self, record: _Record) -> None:
        path = self._dir(record.server_id) / "server.json"
        temp = path.with_name(".server.json.tmp")
        temp.write_text(record.to_json())
        os.replace(temp, path)

    def _lock(self, ref: str) -> threading.Lock:
        """The lock a server's start and stop hold (they run in threads)."""
        return self._locks.setdefault(ref, threading.Lock())

    # -- the interface ------------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> Instance:
        ref = request.server_id
        directory = self._dir(ref)
        if self._read(ref) is not None:  # idempotent: a retried launch finds the first one
            return await self.describe(ref)
        if directory.exists() or self._staging(ref).exists():
            # The debris of a launch of this very server cut short (no server.json): clear it.
            await asyncio.to_thread(self._stop, ref)
        # From here to the rename nothing awaits: no other launch can take the same address.
        address = self._free_address()
        record = _Record(
            server_id=ref,
            pool=request.pool,
            address=address,
            token_hash=token_hash(request.agent_token),
            boot_at=self.context.clock.time() + self.config.boot_delay,
        )
        try:
            self._create(record, request)
        except OSError as exc:
            shutil.rmtree(self._staging(ref), ignore_errors=True)
            raise ProviderError(f"cannot write {directory}: {exc}", retryable=True) from exc
        self._boot(record)
        return self._instance(record)

    async def describe(self, ref: str) -> Instance:
        record = self._read(ref)
        if record is None:
            return Instance(ref=ref, status=InstanceStatus.GONE)
        if record.error:
            return self._instance(record)
        if not record.started and ref not in self._boots:
            self._boot(record)  # a boot cut short by a manager restart goes on
        return self._instance(record)

    async def terminate(self, ref: str) -> None:
        task = self._boots.pop(ref, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # Gracefully: a drained server may still have a request that came after the report
        # that said none was in progress (or from a client that ignores TTLs); nginx ends it.
        await asyncio.to_thread(self._stop, ref, graceful=True)

    async def list_owned(self) -> list[Instance]:
        """The pool's servers, after stopping every process of its directory that no complete
        server records (see the module docstring). A directory without a readable
        ``server.json`` is listed without a server id: the manager terminates it."""
        if not self.root.is_dir():
            return []
        await asyncio.to_thread(self._sweep)
        # Here, not in the sweep's thread: a launch writes its temporary directory on the loop.
        for entry in self.root.iterdir():
            if entry.name.startswith(".") and entry.name.endswith(_STAGING_SUFFIX):
                shutil.rmtree(entry, ignore_errors=True)
        found = []
        for name in self._names():
            record = self._read(name)
            if record is None:
                found.append(
                    Instance(
                        ref=name,
                        status=InstanceStatus.PENDING,
                        detail="no readable server.json (a launch of an older version cut short?)",
                    )
                )
            elif record.pool == self.context.pool:
                instance = await self.describe(name)
                if instance.status is InstanceStatus.GONE:
                    # A failed start or a dead nginx is a terminated instance: the manager
                    # forgets it without calling terminate, so the provider reaps it (what is
                    # left of it, and its directory and address).
                    try:
                        await asyncio.to_thread(self._stop, name)
                    except ProviderError as exc:
                        log.error("%s (the next listing tries again)", exc)
                found.append(instance)
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
            await asyncio.to_thread(self._stop_all)

    # -- directories --------------------------------------------------------------------------

    def _create(self, record: _Record, request: LaunchRequest) -> None:
        """Write the server's directory under a temporary name, then rename it into place: a
        crash leaves either a complete server or a temporary directory, never half of one."""
        ref = record.server_id
        directory = self._dir(ref)
        staging = self._staging(ref)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # it holds the agents' tokens
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o700)
        token = os.open(staging / "agent.token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(token, "w") as token_file:
            token_file.write(request.agent_token + "\n")
        agent = AgentConfig(
            server_id=ref,
            manager_url=request.manager_url,
            manager_urls=request.manager_urls,
            # The reference names the final place: the agent reads it once renamed.
            token=Secret(request.agent_token, f"file:{directory / 'agent.token'}"),
            source=NginxSourceConfig(
                url=self._nginx_settings(record.address).status_url,
                max_concurrency=self.config.max_concurrency,
            ),
            interval=self.config.report_interval,
            ca_file=_absolute(self.context.manager_ca_file),
            allow_plaintext=self.context.manager_allow_plaintext,
        )
        (staging / "agent.yaml").write_text(dump_config(agent))
        (staging / "server.json").write_text(record.to_json())
        os.rename(staging, directory)

    # -- processes ----------------------------------------------------------------------------

    def _instance(self, record: _Record) -> Instance:
        directory = str(self._dir(record.server_id))
        if record.error:
            status, detail = InstanceStatus.GONE, record.error
        elif record.nginx_pid is None or not record.started:
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
        for name in self._names():
            record = self._read(name)
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
            await asyncio.to_thread(self._start, record.server_id)
        except OSError as exc:  # its directory cannot be written: the server failed
            log.error("local server %s did not start: %s", record.server_id, exc)
            with contextlib.suppress(OSError, ProviderError):
                self._write(_with(record, error=f"did not start: {exc}"[:300]))
        finally:
            self._boots.pop(record.server_id, None)

    def _start(self, ref: str) -> None:
        """Start nginx and the agent (in a thread: nginx takes a moment to answer).

        Under the server's lock, so that a terminate or the manager's exit meanwhile waits and
        then stops what was started. Processes of this server left by a start cut short (their
        pids never recorded) are stopped first: they would hold its address.
        """
        with self._lock(ref):
            record = self._read(ref)
            if record is None or record.error or record.started:
                return  # terminated while booting, failed, or started already
            directory = self._dir(ref)
            leftovers = [p for p in processes_under(self.root) if p.server == ref]
            try:
                if leftovers:
                    log.warning(
                        "local server %s: stopping processes %s left by a start cut short",
                        ref,
                        sorted(p.pid for p in leftovers),
                    )
                    stop_processes(leftovers)
                nginx = NginxServer(self._nginx_settings(record.address), directory / "nginx")
                nginx.start()
            except DnslbError as exc:  # ProviderError, ProcessError, ConfigError
                log.error("local server %s did not start: %s", ref, exc)
                self._write(_with(record, error=f"nginx did not start: {str(exc)[:300]}"))
                return
            try:
                with open(directory / "agent.log", "ab") as agent_log:
                    agent = subprocess.Popen(
                        agent_command(directory / "agent.yaml"),
                        stdin=subprocess.DEVNULL,
                        stdout=agent_log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        cwd=directory,
                    )
            except OSError as exc:
                nginx.stop()
                log.error("local server %s: its agent did not start: %s", ref, exc)
                self._write(_with(record, error=f"the agent did not start: {exc}"[:300]))
                return
            self._nginx[ref] = nginx
            self._agents[ref] = agent
            self._write(_with(record, nginx_pid=nginx.pid, agent_pid=agent.pid))
        log.info("local server %s runs at %s:%d", ref, record.address, self.config.port)

    def _stop(self, ref: str, *, graceful: bool = False) -> None:
        """Stop every process of a server, recorded or not, and remove its directory
        (idempotent); ``graceful``: nginx ends the requests in progress first (at most
        :data:`STOP_TIMEOUT` seconds). Raises :class:`ProviderError` when a process survives:
        the directory stays, so that the next try finds the processes again."""
        directory = self._dir(ref)
        with self._lock(ref):
            agent = self._agents.pop(ref, None)
            nginx = self._nginx.pop(ref, None)
            try:
                if agent is not None:
                    stop_group(agent, timeout=STOP_TIMEOUT)  # our child: reaped
                if nginx is not None:
                    nginx.stop(STOP_TIMEOUT, graceful=graceful)
            except DnslbError as exc:
                raise ProviderError(f"local server {ref}: {exc}", retryable=True) from exc
            stop_processes(p for p in processes_under(self.root) if p.server == ref)
            shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(self._staging(ref), ignore_errors=True)
        self._locks.pop(ref, None)

    def _sweep(self) -> None:
        """Stop the processes of the pool's directory that no running server records: a start
        cut short, a server whose directory is gone, workers whose master died, the agent of a
        server whose nginx died.

        A server whose start or stop is under way (its lock is held) or whose boot task runs is
        left to it. A failure to stop is logged; the next listing tries again.
        """
        by_server: dict[str, list[ServerProcess]] = {}
        for process in processes_under(self.root):
            by_server.setdefault(process.server, []).append(process)
        for name, processes in sorted(by_server.items()):
            lock = self._lock(name)
            if not lock.acquire(blocking=False):
                continue
            try:
                if name not in self._boots:
                    self._stop_strays(name, processes)
            finally:
                lock.release()
            if not (self.root / name).exists():
                self._locks.pop(name, None)  # no server of that name: nothing will start

    def _stop_strays(self, name: str, processes: list[ServerProcess]) -> None:
        """Stop those of a server's ``processes`` that are not its recorded, running nginx
        (master and workers) and agent."""
        record = self._read(name)
        if record is not None and record.pool != self.context.pool:
            return  # not this pool's (cannot happen with one directory per pool)
        keep: set[int | None] = set()
        if (
            record is not None
            and record.started
            and not record.error
            and record.nginx_pid in {process.pid for process in processes}
        ):
            keep = {record.nginx_pid, record.agent_pid}
        strays = [p for p in processes if p.group not in keep and p.pid not in keep]
        if not strays:
            return
        log.warning(
            "local server %s: stopping processes %s that no running server records "
            "(left by a manager that was killed?)",
            name,
            sorted(p.pid for p in strays),
        )
        try:
            stop_processes(strays)
        except ProviderError as exc:
            log.error("local server %s: %s", name, exc)

    def _stop_all(self) -> None:
        """Stop every server and every process of the pool's directory (the manager exits)."""
        for name in self._names():
            try:
                self._stop(name)
            except ProviderError as exc:
                log.error("%s", exc)
        try:
            stop_processes(processes_under(self.root))
        except ProviderError as exc:
            log.error("processes of %s survive the manager's exit: %s", self.root, exc)
        for entry in self.root.iterdir():
            if entry.name.startswith(".") and entry.name.endswith(_STAGING_SUFFIX):
                shutil.rmtree(entry, ignore_errors=True)


def _with(record: _Record, **changes: Any) -> _Record:
    values = {key: getattr(record, key) for key in record.__dataclass_fields__}
    values.update(changes)
    return _Record(**values)


def _absolute(reference: FileReference | None) -> FileReference | None:
    """``reference`` by its absolute path: the agent's configuration lives in another directory
    than the manager's, which a relative reference is relative to."""
    if reference is None:
        return None
    return FileReference(reference.path.absolute(), f"file:{reference.path.absolute()}")
