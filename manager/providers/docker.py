"""The ``docker`` provider: a pool's servers as containers of a Docker Engine (the compose lab).

It speaks the Docker Engine API over the engine's unix socket (httpx), as a cloud provider speaks
its cloud's API: a launch creates a container from the cache-server image on a Docker network,
and the address answered in DNS is the container's address on that network. Every container
carries labels that mark it as the pool's (``dnslb.pool``, ``dnslb.managed-by``), name the
server (``dnslb.server-id``) and hold the SHA-256 of its agent token (``dnslb.token-sha256``:
never the token), so :meth:`DockerProvider.list_owned` finds them again by label after a manager
restart and the manager's reconcile adopts or removes them.

- **The token** never travels in the container's command, environment or labels (``docker
  inspect`` shows those): after the container is created and before it starts, the agent's
  configuration and token (mode 0600, owned by the container's user) are written into it with
  the engine's archive call.
- **Idempotent launches.** The container's name is ``PREFIX-SERVER_ID`` and the engine refuses a
  second container of one name: a retried launch finds the first one.
- **Boot delay.** Like the local provider, a server can take ``boot_delay`` seconds to start (a
  cloud's boot time): the container is created at once, labelled with the time it may start
  (``dnslb.boot-at``), and started by the first :meth:`describe` or :meth:`list_owned` after
  that time, so a manager restarted meanwhile still starts it.
- **An exited container is a terminated instance**: the provider removes it, as a cloud reaps a
  terminated instance, and reports it ``GONE`` with its exit status and last log lines (why a
  cache server died ends up in the manager's events).
- **Least privilege for the servers**: they run as a non-root user, with every capability
  dropped, ``no-new-privileges``, an init process, no restart policy, no bind mounts.

Access to the engine's socket is root on the host: see ``docs/compose.md``.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import struct
import tarfile
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from daemons.nginx import DEFAULT_STATUS_PATH
from dnslb.agent_config import AgentConfig, NginxSourceConfig
from dnslb.config import FileReference, Secret, dump_config, setting
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

log = logging.getLogger("dnslb.manager.providers.docker")

LABEL_POOL = "dnslb.pool"
LABEL_SERVER = "dnslb.server-id"
LABEL_MANAGED_BY = "dnslb.managed-by"
LABEL_TOKEN_HASH = "dnslb.token-sha256"  # noqa: S105 - a label name; its value is a hash
LABEL_BOOT_AT = "dnslb.boot-at"

CONFIG_DIR = "/etc/dnslb"
"""Where the agent's configuration and token are written in the container (the image makes it)."""
AGENT_CONFIG = f"{CONFIG_DIR}/agent.yaml"
AGENT_TOKEN = f"{CONFIG_DIR}/agent.token"
AGENT_CA = f"{CONFIG_DIR}/manager-ca.pem"  # a copy of the manager's http.agent_ca_file

LOG_LINES = 5
"""Log lines of an exited container kept in the detail of its ``GONE`` instance."""

OLDEST_API = "1.41"
NEWEST_API = "1.47"
"""The Engine API versions this provider is written for: 1.41 (Engine 20.10, Debian 12's, where
it is tested) to 1.47 (Engine 27); the calls it makes and the fields it reads are the same in
all of them."""

_USER = re.compile(r"^(\d+):(\d+)$")
_API_VERSION = re.compile(r"^1\.\d+$")


@dataclass(frozen=True, slots=True)
class DockerProviderConfig(ProviderConfig):
    """Servers as containers of a Docker Engine, made through its API (the compose lab)."""

    type: Literal["docker"]
    image: str = setting(
        help="the cache-server image, e.g. dnslb-lab/cache:latest (built by compose)"
    )
    network: str = setting(
        help="the Docker network the containers join; their address on it is answered in DNS"
    )
    origin: str = setting(
        help="the origin the caches proxy to, as the containers reach it, e.g. http://origin:8000"
    )
    socket: str = setting(
        "/var/run/docker.sock",
        help="the engine's API socket; whoever can use it is root on the host (docs/compose.md)",
    )
    api_version: str | None = setting(
        None,
        help="Docker Engine API version to speak (default: negotiated with the engine, "
        f"{OLDEST_API} to {NEWEST_API})",
    )
    port: int = setting(8080, help="port every cache server listens on", min=1, max=65535)
    user: str = setting(
        "10001:10001", help="UID:GID the servers run as (the image's dnslb user; never root)"
    )
    boot_delay: float = setting(
        0.0,
        help="seconds between a launch and the container's start (a cloud's boot time)",
        min=0.0,
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
        2048, help="bytes per paced write with send_rate", min=512, max=1048576
    )
    report_interval: float = setting(1.0, help="seconds between agent reports", min=0.05)
    memory_mb: int | None = setting(None, help="memory limit of each container, MiB", min=16)
    cpus: float | None = setting(None, help="CPU limit of each container, in cores", min=0.01)
    name_prefix: str = setting("dnslb", help="containers are named PREFIX-SERVER_ID")
    managed_by: str = setting(
        "dnslb",
        help="value of the dnslb.managed-by label; give each deployment sharing an engine its own",
    )
    stop_timeout: float = setting(
        10.0, help="seconds a terminated server has to exit before it is killed", min=0.0, max=300.0
    )
    timeout: float = setting(30.0, help="seconds an API call may take", min=1.0)
    stop_on_exit: bool = setting(
        True, help="remove every server when the manager exits cleanly (false: keep them running)"
    )

    def config_problems(self) -> Iterator[str]:
        if not self.socket.startswith("/"):
            yield f"socket: must be an absolute path, not {self.socket!r}"
        if self.api_version is not None and not _API_VERSION.match(self.api_version):
            yield f"api_version: must look like 1.41, not {self.api_version!r}"
        match = _USER.match(self.user)
        if match is None:
            yield f"user: must be numeric UID:GID, like 10001:10001, not {self.user!r}"
        elif match.group(1) == "0":
            yield "user: the servers must not run as root (UID 0)"
        parsed = urllib.parse.urlsplit(self.origin)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            yield f"origin: must be an http(s) URL, not {self.origin!r}"
        if self.network in ("host", "none") or self.network.startswith(("container:", "service:")):
            yield (
                f"network: {self.network!r} is not a network of its own; the servers need an "
                "address on a bridge network, like the compose lab's dnslb-lab"
            )
        if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", self.name_prefix):
            yield f"name_prefix: {self.name_prefix!r} is not a valid container name start"

    @property
    def uid_gid(self) -> tuple[int, int]:
        match = _USER.match(self.user)
        if match is None:
            raise ValueError(f"user {self.user!r} is not UID:GID")
        return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True, slots=True)
class _Container:
    """What the provider reads of a container, from an inspect or a list answer."""

    id: str
    name: str
    labels: Mapping[str, str]
    state: str  # created, running, paused, restarting, removing, exited, dead
    address: str | None

    @staticmethod
    def from_inspect(data: Any, network: str) -> _Container:
        try:
            networks = data["NetworkSettings"]["Networks"] or {}
            return _Container(
                id=str(data["Id"]),
                name=str(data["Name"]).lstrip("/"),
                labels=dict(data["Config"]["Labels"] or {}),
                state=str(data["State"]["Status"]),
                address=_address(networks, network),
            )
        except (KeyError, TypeError) as exc:
            raise ProviderError(
                f"the Docker Engine answered an unexpected inspect: {exc!r}"
            ) from None

    @staticmethod
    def from_summary(data: Any, network: str) -> _Container:
        try:
            names = data.get("Names") or [""]
            networks = (data.get("NetworkSettings") or {}).get("Networks") or {}
            return _Container(
                id=str(data["Id"]),
                name=str(names[0]).lstrip("/"),
                labels=dict(data.get("Labels") or {}),
                state=str(data["State"]),
                address=_address(networks, network),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ProviderError(f"the Docker Engine answered an unexpected list: {exc!r}") from None


def _address(networks: Mapping[str, Any], network: str) -> str | None:
    endpoint = networks.get(network)
    if endpoint is None and len(networks) == 1:  # the network was named by its id
        endpoint = next(iter(networks.values()))
    address = (endpoint or {}).get("IPAddress") if isinstance(endpoint, dict) else None
    return str(address) if address else None


class DockerEngine:
    """The few Engine API calls the provider makes. Errors are :class:`ProviderError`s: an
    engine that cannot be reached or fails (5xx) is ``retryable``; a refusal (4xx) is not.

    The API version is ``api_version``, or, when that is None, negotiated at the first call as
    the docker CLI does: the engine's own version, at most :data:`NEWEST_API` (engines drop old
    versions: Engine 29 serves 1.44 and later only).
    """

    def __init__(
        self,
        socket_path: str,
        api_version: str | None,
        timeout: float,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.api_version = api_version
        self._negotiating = asyncio.Lock()
        self._client = httpx.AsyncClient(
            transport=transport or httpx.AsyncHTTPTransport(uds=socket_path),
            base_url="http://docker",
            timeout=timeout,
        )

    async def version(self) -> str:
        """The API version spoken (negotiated once)."""
        async with self._negotiating:
            if self.api_version is None:
                response = await self._send("GET", "/version", accept=(200,))
                self.api_version = negotiate(response.json())
                log.info("Docker Engine API %s at %s", self.api_version, self.socket_path)
            return self.api_version

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        accept: tuple[int, ...] = (200, 201, 204, 304),
        timeout: float | None = None,
    ) -> httpx.Response:
        """One call of the versioned API; a status outside ``accept`` raises
        :class:`ProviderError`."""
        version = await self.version()
        return await self._send(
            method,
            f"/v{version}{path}",
            params=params,
            body=body,
            content=content,
            headers=headers,
            accept=accept,
            timeout=timeout,
        )

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        accept: tuple[int, ...],
        timeout: float | None = None,
    ) -> httpx.Response:
        try:
            response = await self._client.request(
                method,
                path,
                params=params,
                json=body,
                content=content,
                headers=headers,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            raise ProviderError(
                f"cannot reach the Docker Engine at {self.socket_path}: "
                f"{type(exc).__name__}: {exc or 'no answer'}",
                retryable=True,
            ) from None
        if response.status_code not in accept:
            raise ProviderError(
                f"Docker Engine: {method} {path}: {response.status_code} {_message(response)}",
                retryable=response.status_code >= 500,
            )
        return response

    async def inspect(self, ref: str) -> Any | None:
        """The container's inspect document, or None when there is no such container."""
        response = await self.request("GET", f"/containers/{_quote(ref)}/json", accept=(200, 404))
        return None if response.status_code == 404 else response.json()

    async def remove(self, ref: str) -> None:
        """Remove the container, killing it if it runs (gone already: nothing to do)."""
        await self.request(
            "DELETE",
            f"/containers/{_quote(ref)}",
            params={"force": "true", "v": "true"},
            # 409: its removal is already in progress
            accept=(204, 404, 409),
        )

    async def logs(self, ref: str, lines: int) -> str:
        """The container's last ``lines`` lines of output (empty if they cannot be read)."""
        try:
            response = await self.request(
                "GET",
                f"/containers/{_quote(ref)}/logs",
                params={"stdout": "true", "stderr": "true", "tail": str(lines)},
            )
        except ProviderError:
            return ""
        return _demultiplex(response.content).decode("utf-8", "replace").strip()

    async def aclose(self) -> None:
        await self._client.aclose()


def _api(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor)


def negotiate(answer: Any) -> str:
    """The API version to speak with an engine whose ``GET /version`` said ``answer``: its own,
    at most :data:`NEWEST_API`; a :class:`ProviderError` when the engine serves no version from
    :data:`OLDEST_API` to :data:`NEWEST_API`."""
    try:
        engine = str(answer["ApiVersion"])
        oldest = str(answer.get("MinAPIVersion") or engine)
        chosen = min(engine, NEWEST_API, key=_api)
        ok = _api(chosen) >= max(_api(oldest), _api(OLDEST_API))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ProviderError(
            f"the Docker Engine answered an unexpected version: {answer!r}"
        ) from None
    if not ok:
        raise ProviderError(
            f"the Docker Engine serves API {oldest} to {engine}; this provider speaks "
            f"{OLDEST_API} to {NEWEST_API}"
        )
    return chosen


def _quote(ref: str) -> str:
    return urllib.parse.quote(ref, safe="")


def _message(response: httpx.Response) -> str:
    try:
        document = response.json()
    except ValueError:
        return response.text.strip()[:300]
    if isinstance(document, dict) and "message" in document:
        return str(document["message"])[:300]
    return response.text.strip()[:300]


def _demultiplex(raw: bytes) -> bytes:
    """The output of a container without a TTY: frames of an 8-byte header (stream, 3 zero
    bytes, big-endian length) and their payload. Raw bytes that are not framed pass as they are."""
    out = bytearray()
    offset = 0
    while offset + 8 <= len(raw):
        stream, length = raw[offset], struct.unpack(">I", raw[offset + 4 : offset + 8])[0]
        if stream not in (0, 1, 2) or raw[offset + 1 : offset + 4] != b"\0\0\0":
            return raw
        out += raw[offset + 8 : offset + 8 + length]
        offset += 8 + length
    return bytes(out) if offset == len(raw) else raw


@register(DockerProviderConfig)
class DockerProvider(Provider):
    """See the module docstring. ``transport`` replaces the unix socket (tests)."""

    def __init__(
        self,
        config: DockerProviderConfig,
        context: ProviderContext,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(config, context)
        self.config: DockerProviderConfig = config
        self.engine = DockerEngine(
            config.socket, config.api_version, config.timeout, transport=transport
        )

    # -- the interface ------------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> Instance:
        name = self.container_name(request.server_id)
        existing = await self.engine.inspect(name)
        if existing is not None:  # a retried launch: the first one made it
            return await self._existing(name, existing, request)
        response = await self.engine.request(
            "POST",
            "/containers/create",
            params={"name": name},
            body=self.container_spec(
                request, boot_at=self.context.clock.time() + self.config.boot_delay
            ),
            accept=(201, 404, 409),
        )
        if response.status_code == 404:  # no such image, or no such network
            message = _message(response)
            hint = " (build it: docker-compose build)" if "image" in message.lower() else ""
            raise ProviderError(f"the Docker Engine cannot create {name}: {message}{hint}")
        if response.status_code == 409:  # created meanwhile by a launch retried behind our back
            existing = await self.engine.inspect(name)
            if existing is None:
                raise ProviderError(f"container {name}: {_message(response)}", retryable=True)
            return await self._existing(name, existing, request)
        ref = str(response.json()["Id"])
        try:
            await self.engine.request(
                "PUT",
                f"/containers/{ref}/archive",
                params={"path": CONFIG_DIR},
                content=self.agent_files(request),
                headers={"Content-Type": "application/x-tar"},
            )
            if self.config.boot_delay <= 0:
                await self._start(ref)
        except ProviderError:
            # A container without its token must never start: remove it; the launch failed.
            await asyncio.shield(self._remove_quietly(ref))
            raise
        log.info("docker server %s: container %s (%s)", request.server_id, name, ref[:12])
        return await self.describe(ref)

    async def describe(self, ref: str) -> Instance:
        data = await self.engine.inspect(ref)
        if data is None:
            return Instance(ref=ref, status=InstanceStatus.GONE, detail="no such container")
        return await self._instance(_Container.from_inspect(data, self.config.network))

    async def terminate(self, ref: str) -> None:
        await self.engine.request(
            "POST",
            f"/containers/{_quote(ref)}/stop",
            params={"t": str(round(self.config.stop_timeout))},
            accept=(204, 304, 404),
            timeout=self.config.timeout + self.config.stop_timeout,
        )
        await self.engine.remove(ref)

    async def list_owned(self) -> list[Instance]:
        filters = {
            "label": [
                f"{LABEL_MANAGED_BY}={self.config.managed_by}",
                f"{LABEL_POOL}={self.context.pool}",
            ]
        }
        response = await self.engine.request(
            "GET", "/containers/json", params={"all": "true", "filters": json.dumps(filters)}
        )
        summaries = response.json()
        if not isinstance(summaries, list):
            raise ProviderError("the Docker Engine answered an unexpected list")
        containers = [_Container.from_summary(item, self.config.network) for item in summaries]
        return [await self._instance(container) for container in containers]

    @property
    def stops_servers_on_close(self) -> bool:
        return self.config.stop_on_exit

    async def close(self) -> None:
        try:
            if self.config.stop_on_exit:
                running = [
                    i for i in await self.list_owned() if i.status is not InstanceStatus.GONE
                ]
                outcomes = await asyncio.gather(
                    *(self.terminate(i.ref) for i in running), return_exceptions=True
                )
                for instance, outcome in zip(running, outcomes, strict=True):
                    if isinstance(outcome, BaseException):
                        log.error(
                            "could not remove container %s at exit: %s", instance.ref[:12], outcome
                        )
        except ProviderError as exc:
            log.error("could not list the pool's containers at exit: %s", exc)
        finally:
            await self.engine.aclose()

    # -- containers ---------------------------------------------------------------------------

    def container_name(self, server_id: str) -> str:
        return f"{self.config.name_prefix}-{server_id}"

    def container_spec(self, request: LaunchRequest, *, boot_at: float) -> dict[str, Any]:
        """The body of the create call: image, command, labels, and a locked-down host config."""
        config = self.config
        command = [
            "dnslb",
            "cache-server",
            "--agent-config",
            AGENT_CONFIG,
            "--origin",
            config.origin,
            "--port",
            str(config.port),
            "--send-chunk",
            str(config.send_chunk),
        ]
        if config.capacity_rps is not None:
            command += ["--capacity-rps", f"{config.capacity_rps:g}"]
        if config.send_rate is not None:
            command += ["--send-rate", str(config.send_rate)]
        host_config: dict[str, Any] = {
            "NetworkMode": config.network,
            "Init": True,
            "RestartPolicy": {"Name": "no"},
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "Privileged": False,
        }
        if config.memory_mb is not None:
            host_config["Memory"] = config.memory_mb * 1024 * 1024
        if config.cpus is not None:
            host_config["NanoCpus"] = round(config.cpus * 1e9)
        return {
            "Image": config.image,
            "Cmd": command,
            "User": config.user,
            "Hostname": request.server_id[:63],
            "Labels": {
                LABEL_POOL: request.pool,
                LABEL_SERVER: request.server_id,
                LABEL_MANAGED_BY: config.managed_by,
                LABEL_TOKEN_HASH: token_hash(request.agent_token),
                LABEL_BOOT_AT: f"{boot_at:.3f}",
            },
            "ExposedPorts": {f"{config.port}/tcp": {}},
            "StopTimeout": round(config.stop_timeout),
            "HostConfig": host_config,
            "NetworkingConfig": {"EndpointsConfig": {config.network: {}}},
        }

    def agent_files(self, request: LaunchRequest) -> bytes:
        """A tar of the agent's configuration and token (0600), owned by the servers' user, and
        of the CA it verifies the manager with (when the manager names one)."""
        config = self.config
        files = []
        ca_file = None
        if self.context.manager_ca_file is not None:
            try:
                ca = self.context.manager_ca_file.path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ProviderError(f"cannot read http.agent_ca_file: {exc}") from None
            files.append((AGENT_CA, ca, 0o644))
            ca_file = FileReference(Path(AGENT_CA), f"file:{AGENT_CA}")
        agent = AgentConfig(
            server_id=request.server_id,
            manager_url=request.manager_url,
            manager_urls=request.manager_urls,
            token=Secret(request.agent_token, f"file:{AGENT_TOKEN}"),
            source=NginxSourceConfig(
                url=f"http://127.0.0.1:{config.port}{DEFAULT_STATUS_PATH}",
                max_concurrency=config.max_concurrency,
            ),
            interval=config.report_interval,
            ca_file=ca_file,
            allow_plaintext=self.context.manager_allow_plaintext,
        )
        uid, gid = config.uid_gid
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path, text, mode in (
                (AGENT_CONFIG, dump_config(agent), 0o644),
                (AGENT_TOKEN, request.agent_token + "\n", 0o600),
                *files,
            ):
                data = text.encode("utf-8")
                entry = tarfile.TarInfo(path.rpartition("/")[2])
                entry.size, entry.mode, entry.uid, entry.gid = len(data), mode, uid, gid
                entry.mtime = int(self.context.clock.time())
                tar.addfile(entry, io.BytesIO(data))
        return buffer.getvalue()

    async def _existing(self, name: str, data: Any, request: LaunchRequest) -> Instance:
        container = _Container.from_inspect(data, self.config.network)
        labels = container.labels
        if (
            labels.get(LABEL_SERVER) != request.server_id
            or labels.get(LABEL_POOL) != request.pool
            or labels.get(LABEL_MANAGED_BY) != self.config.managed_by
        ):
            raise ProviderError(f"a container named {name} exists and is not this server's")
        return await self._instance(container)

    async def _start(self, ref: str) -> None:
        await self.engine.request("POST", f"/containers/{_quote(ref)}/start", accept=(204, 304))

    async def _remove_quietly(self, ref: str) -> None:
        try:
            await self.engine.remove(ref)
        except ProviderError as exc:
            log.error("could not remove container %s after a failed launch: %s", ref[:12], exc)

    async def _instance(self, container: _Container) -> Instance:
        """The instance a container is; starts it when its boot time has come, and removes it
        when it has exited (a terminated instance)."""
        status, detail = InstanceStatus.PENDING, container.state
        if container.state == "created":
            boot_at = _float(container.labels.get(LABEL_BOOT_AT))
            left = boot_at - self.context.clock.time()
            if left > 0:
                detail = f"booting: starts in {left:.0f} s"
            else:
                await self._start(container.id)
                detail = "starting"
        elif container.state == "running":
            if container.address:
                status, detail = InstanceStatus.RUNNING, f"container {container.name}"
            else:
                detail = f"running without an address on network {self.config.network}"
        elif container.state == "removing":
            status = InstanceStatus.STOPPING
        elif container.state in ("exited", "dead"):
            status, detail = InstanceStatus.GONE, await self._reap(container)
        return Instance(
            ref=container.id,
            status=status,
            server_id=container.labels.get(LABEL_SERVER),
            pool=container.labels.get(LABEL_POOL),
            address=container.address if status is InstanceStatus.RUNNING else None,
            token_hash=container.labels.get(LABEL_TOKEN_HASH),
            detail=detail,
        )

    async def _reap(self, container: _Container) -> str:
        """Remove an exited container; what it said last, and how it ended, for the events."""
        data = await self.engine.inspect(container.id)
        code = None
        if isinstance(data, dict):
            code = (data.get("State") or {}).get("ExitCode")
        output = await self.engine.logs(container.id, LOG_LINES)
        await self.engine.remove(container.id)
        lines = " | ".join(line for line in output.splitlines() if line.strip())
        ended = f"exited with status {code}" if code is not None else f"{container.state}"
        log.warning("docker server container %s %s: %s", container.name, ended, lines or "-")
        return f"container {container.name} {ended}" + (f": {lines}" if lines else "")


def _float(text: str | None) -> float:
    try:
        return float(text) if text is not None else 0.0
    except ValueError:
        return 0.0
