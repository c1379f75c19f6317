"""A small Docker Engine for tests: the API calls the docker provider makes, on a unix socket.

It keeps real state (containers with their names, labels, files, state and address on their
network) and answers as the Engine does (status codes, ``{"message": ...}`` errors,
list filters by label, multiplexed logs), so the provider runs its real httpx transport against
it. ``exit(ref, code, output)`` makes a container exit as a crashed server would;
``containers`` is what a test inspects. Served by ``http.server`` in a thread; a context manager.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import struct
import tarfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class FakeFile:
    data: bytes
    mode: int
    uid: int
    gid: int


@dataclass
class FakeContainer:
    id: str
    name: str
    spec: dict[str, Any]
    state: str = "created"
    exit_code: int = 0
    address: str | None = None
    files: dict[str, FakeFile] = field(default_factory=dict)
    output: bytes = b""
    starts: int = 0

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.spec.get("Labels") or {})

    @property
    def network(self) -> str:
        return str(self.spec["HostConfig"]["NetworkMode"])


class _Server(ThreadingHTTPServer):
    address_family = socket.AF_UNIX
    daemon_threads = True

    def server_bind(self) -> None:
        self.socket.bind(self.server_address)
        self.server_name, self.server_port = "docker", 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class FakeDockerEngine:
    """See the module docstring. ``images`` are the images it has; ``networks`` its networks."""

    def __init__(self, socket_path: Path, *, images: tuple[str, ...] = ("dnslb-lab/cache:latest",)):
        self.socket_path = socket_path
        self.images = set(images)
        self.api_version = "1.41"  # what GET /version says: Engine 20.10's
        self.min_api = "1.12"
        self.versions_used: set[str] = set()
        self.networks = {"dnslb-lab"}
        self.containers: dict[str, FakeContainer] = {}
        self.calls: list[str] = []
        self.fail_next: dict[str, int] = {}  # "METHOD /path-prefix" -> status to answer once
        self.lock = threading.Lock()
        self._numbers = 0
        self._server: _Server | None = None

    def serves(self, version: tuple[int, int] | None) -> bool:
        def parse(text: str) -> tuple[int, int]:
            major, _, minor = text.partition(".")
            return int(major), int(minor)

        return version is not None and parse(self.min_api) <= version <= parse(self.api_version)

    # -- state --------------------------------------------------------------------------------

    def find(self, ref: str) -> FakeContainer | None:
        with self.lock:
            if ref in self.containers:
                return self.containers[ref]
            for container in self.containers.values():
                if container.name == ref or (len(ref) >= 12 and container.id.startswith(ref)):
                    return container
        return None

    def exit(self, ref: str, code: int, output: str = "") -> None:
        container = self.find(ref)
        assert container is not None
        container.state, container.exit_code, container.address = "exited", code, None
        container.output += output.encode()

    def add_foreign(self, name: str, labels: dict[str, str], state: str = "running") -> str:
        """A container the provider did not make (another pool's, or anyone's)."""
        container = self._create(
            name, {"Image": "other", "Labels": labels, "HostConfig": {"NetworkMode": "dnslb-lab"}}
        )
        container.state = state
        return container.id

    def _create(self, name: str, spec: dict[str, Any]) -> FakeContainer:
        with self.lock:
            self._numbers += 1
            ident = f"{self._numbers:04d}" + "c0ffee" * 10
            container = FakeContainer(id=ident[:64], name=name, spec=spec)
            self.containers[container.id] = container
            return container

    # -- serving ------------------------------------------------------------------------------

    def start(self) -> FakeDockerEngine:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def address_string(self) -> str:
                return "unix"

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length", "0"))
                return self.rfile.read(length) if length else b""

            def _reply(self, status: int, body: Any = None, *, raw: bytes | None = None) -> None:
                data = (
                    raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
                )
                self.send_response(status)
                content_type = "application/octet-stream" if raw is not None else "application/json"
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                parsed = urllib.parse.urlsplit(self.path)
                query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query).items()}
                body = self._body()
                path = parsed.path
                with owner.lock:
                    owner.calls.append(f"{self.command} {path}")
                    for prefix, status in list(owner.fail_next.items()):
                        method, _, start = prefix.partition(" ")
                        if method == self.command and path.startswith(start):
                            del owner.fail_next[prefix]
                            self._reply(status, {"message": "told to fail"})
                            return
                if path == "/version" and self.command == "GET":
                    self._reply(
                        200, {"ApiVersion": owner.api_version, "MinAPIVersion": owner.min_api}
                    )
                    return
                match = re.match(r"^/v(\d+)\.(\d+)(/.*)$", path)
                version = (int(match.group(1)), int(match.group(2))) if match else None
                if match is None or not owner.serves(version):
                    self._reply(400, {"message": f"client version not supported: {path}"})
                    return
                owner.versions_used.add(f"{match.group(1)}.{match.group(2)}")
                status, answer, raw = owner.answer(self.command, match.group(3), query, body)
                self._reply(status, answer, raw=raw)

            def do_GET(self) -> None:
                self._handle()

            def do_POST(self) -> None:
                self._handle()

            def do_PUT(self) -> None:
                self._handle()

            def do_DELETE(self) -> None:
                self._handle()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self._server = _Server(str(self.socket_path), Handler)
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeDockerEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API ------------------------------------------------------------------------------

    def answer(
        self, method: str, path: str, query: dict[str, str], body: bytes
    ) -> tuple[int, Any, bytes | None]:
        parts = path.strip("/").split("/")
        if parts == ["containers", "create"] and method == "POST":
            return self._create_call(query.get("name", ""), json.loads(body))
        if parts == ["containers", "json"] and method == "GET":
            return 200, self._list(query), None
        if len(parts) < 2 or parts[0] != "containers":
            return 404, {"message": "page not found"}, None
        container = self.find(urllib.parse.unquote(parts[1]))
        if container is None:
            return 404, {"message": f"No such container: {parts[1]}"}, None
        action = parts[2] if len(parts) > 2 else ""
        if method == "GET" and action == "json":
            return 200, self._inspect(container), None
        if method == "DELETE" and action == "":
            if container.state == "running" and query.get("force") != "true":
                return 409, {"message": "cannot remove a running container"}, None
            with self.lock:
                del self.containers[container.id]
            return 204, None, None
        if method == "PUT" and action == "archive":
            return self._archive(container, query.get("path", ""), body)
        if method == "POST" and action == "start":
            if container.state == "running":
                return 304, None, None
            if container.state != "created":
                return 409, {"message": "container has exited"}, None
            container.state, container.starts = "running", container.starts + 1
            number = int(container.id[:4])
            container.address = f"172.30.5.{number % 250 + 2}"
            return 204, None, None
        if method == "POST" and action == "stop":
            if container.state != "running":
                return 304, None, None
            container.state, container.exit_code, container.address = "exited", 143, None
            return 204, None, None
        if method == "GET" and action == "logs":
            frames = b"".join(
                struct.pack(">BxxxI", 1, len(line) + 1) + line + b"\n"
                for line in container.output.splitlines()[-int(query.get("tail", "100")) :]
            )
            return 200, None, frames
        return 404, {"message": f"page not found: {method} {path}"}, None

    def _create_call(self, name: str, spec: dict[str, Any]) -> tuple[int, Any, bytes | None]:
        if spec.get("Image") not in self.images:
            return 404, {"message": f"No such image: {spec.get('Image')}"}, None
        if spec["HostConfig"]["NetworkMode"] not in self.networks:
            return 404, {"message": "network not found"}, None
        if name and self.find(name) is not None:
            return (
                409,
                {"message": f'Conflict. The container name "/{name}" is already in use'},
                None,
            )
        container = self._create(name, spec)
        return 201, {"Id": container.id, "Warnings": []}, None

    def _archive(self, container: FakeContainer, path: str, body: bytes) -> tuple[int, Any, None]:
        if path != "/etc/dnslb":
            return 404, {"message": f"Could not find the file {path} in container"}, None
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            for member in tar.getmembers():
                extracted = tar.extractfile(member)
                assert extracted is not None
                container.files[f"{path}/{member.name}"] = FakeFile(
                    extracted.read(), member.mode, member.uid, member.gid
                )
        return 200, None, None

    def _inspect(self, container: FakeContainer) -> dict[str, Any]:
        networks = (
            {container.network: {"IPAddress": container.address or ""}}
            if container.state in ("running", "created", "exited")
            else {}
        )
        return {
            "Id": container.id,
            "Name": f"/{container.name}",
            "Config": {"Labels": container.labels, "Image": container.spec.get("Image")},
            "State": {"Status": container.state, "ExitCode": container.exit_code},
            "NetworkSettings": {"Networks": networks},
        }

    def _list(self, query: dict[str, str]) -> list[dict[str, Any]]:
        filters = json.loads(query.get("filters", "{}"))
        wanted = [item.partition("=") for item in filters.get("label", [])]
        found = []
        with self.lock:
            containers = list(self.containers.values())
        for container in containers:
            if query.get("all") != "true" and container.state != "running":
                continue
            labels = container.labels
            if all(labels.get(key) == value for key, _, value in wanted):
                found.append(
                    {
                        "Id": container.id,
                        "Names": [f"/{container.name}"],
                        "Labels": labels,
                        "State": container.state,
                        "NetworkSettings": {
                            "Networks": {container.network: {"IPAddress": container.address or ""}}
                        },
                    }
                )
        return found
