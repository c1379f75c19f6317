"""A single-IP cluster in network namespaces, with real nftables, agents and HTTP (root only).

Layout (one lab; names carry a per-process prefix so that labs never collide)::

    <p>br   bridge br0 (multicast snooping off), one port per namespace below
    <p>c    client   198.18.0.1/24   neighbour entry: VIP -> 01:00:5e:12:00:64 (permanent)
    <p>m    manager  198.18.0.2/24   (the test process enters it from one thread)
    <p>n1.. nodes    198.18.0.11../24, VIP 198.18.0.100/32 on lo, arp_ignore=1, arp_announce=2,
                     an owner server on VIP:8080 and a node agent on <address>:8470

Every node receives every frame the client sends to the VIP, because the client addresses the
VIP to a multicast MAC and the bridge floods it. The manager side runs in this process: a
:class:`~manager.clusters.ClusterController` with the real HTTP pusher, fed by a minimal asyncio
HTTP endpoint for ``POST /v1/reports``, ticking every ``tick_interval`` seconds, all in one
thread that entered the manager namespace (``setns`` is per thread).

Addresses are from 198.18.0.0/15 (reserved for benchmarking networks); they exist only inside
the lab's namespaces. :meth:`ClusterLab.close` kills every process the lab started (by pid) and
deletes every namespace (and with them the bridge and veths), also after a failure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import hmac
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dnslb.errors import ProtocolError
from dnslb.report import parse_report
from manager.clusters import ClusterController, ClusterNode, ClusterSettings, HttpTablePusher

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PYTHON = sys.executable
SUBNET_PREFIX = "198.18.0."
CLIENT = SUBNET_PREFIX + "1"
MANAGER = SUBNET_PREFIX + "2"
VIP = SUBNET_PREFIX + "100"
VIP_MAC = "01:00:5e:12:00:64"
SERVICE_PORT = 8080
AGENT_PORT = 8470
REPORT_PORT = 8480
CLONE_NEWNET = 0x40000000


def why_not_runnable() -> str | None:
    """Why this machine cannot run the lab (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and nftables)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30, **kwargs)


def enter_netns(name: str) -> None:
    """Move the calling thread (only) into network namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns {name}: {os.strerror(error)}")
    finally:
        os.close(fd)


@dataclass
class LabNode:
    node_id: str
    ns: str
    address: str
    token: str = field(repr=False)
    token_file: Path
    max_concurrency: int
    agent: subprocess.Popen[bytes] | None = None
    server: subprocess.Popen[bytes] | None = None

    @property
    def agent_url(self) -> str:
        return f"http://{self.address}:{AGENT_PORT}"


class ManagerHarness:
    """The manager side of the lab: report endpoint + controller + tick loop, in one thread."""

    def __init__(
        self, ns: str, settings: ClusterSettings, tokens: dict[str, str], tick_interval: float
    ) -> None:
        self.ns = ns
        self.settings = settings
        self.tokens = tokens
        self.tick_interval = tick_interval
        self.controller: ClusterController | None = None
        self.refused = 0
        self.accepted = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="lab-manager", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError(f"lab manager did not start: {self._error!r}")

    def _main(self) -> None:
        try:
            enter_netns(self.ns)
            asyncio.run(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        pusher = HttpTablePusher(timeout=self.settings.push_timeout)
        self.controller = ClusterController(self.settings, pusher, time.monotonic)
        server = await asyncio.start_server(self._connection, MANAGER, REPORT_PORT)
        self._ready.set()
        try:
            while not self._stopping.is_set():
                await self.controller.tick()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.tick_interval)
        finally:
            server.close()
            await server.wait_closed()
            await self.controller.aclose()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {
                    key.strip().lower(): value.strip()
                    for key, _, value in (line.partition(":") for line in lines[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status = self._ingest(method, path, headers.get("authorization", ""), body)
                writer.write(f"HTTP/1.1 {status} -\r\nContent-Length: 0\r\n\r\n".encode())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    def _ingest(self, method: str, path: str, authorization: str, body: bytes) -> int:
        if method != "POST" or path != "/v1/reports":
            return 404
        try:
            report = parse_report(json.loads(body))
        except (ValueError, ProtocolError):
            self.refused += 1
            return 400
        token = self.tokens.get(report.server_id, "")
        if not token or not hmac.compare_digest(authorization, f"Bearer {token}"):
            self.refused += 1
            return 401
        assert self.controller is not None
        try:
            self.controller.observe(report)
        except ProtocolError:
            self.refused += 1
            return 400
        self.accepted += 1
        return 204

    def call(self, make: Callable[[ClusterController], T]) -> T:
        """Run ``make(controller)`` on the manager's loop (controller state is not thread-safe)."""
        assert self._loop is not None

        async def inside() -> T:
            assert self.controller is not None
            return make(self.controller)

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            inside(), self._loop
        )
        return future.result(timeout=10)

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=10)


class ClusterLab:
    """Builds the lab on enter and tears every piece down on exit (see the module docstring)."""

    def __init__(
        self,
        workdir: Path,
        *,
        capacities: tuple[int, ...] = (100, 100, 100),
        bucket_count: int = 256,
        seed: int = 0x5EED,
        failover_after: float = 0.3,
        heartbeat_interval: float = 0.1,
        tick_interval: float = 0.02,
        min_rebuild_interval: float = 0.5,
        smoothing: float = 0.5,
        lease: float = 0.25,
    ) -> None:
        self.workdir = workdir
        self.lease = lease
        self.prefix = f"dl{os.getpid() % 100000}{secrets.token_hex(1)}"
        self.bucket_count = bucket_count
        self.heartbeat_interval = heartbeat_interval
        self.namespaces: list[str] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.nodes: list[LabNode] = []
        for index, capacity in enumerate(capacities, start=1):
            token = secrets.token_urlsafe(24)
            token_file = workdir / f"n{index}.token"
            token_file.write_text(token)
            token_file.chmod(0o600)
            self.nodes.append(
                LabNode(
                    node_id=f"n{index}",
                    ns=f"{self.prefix}n{index}",
                    address=f"{SUBNET_PREFIX}{10 + index}",
                    token=token,
                    token_file=token_file,
                    max_concurrency=capacity,
                )
            )
        self.settings = ClusterSettings(
            name="lab",
            vip=VIP,
            nodes=tuple(ClusterNode(n.node_id, n.agent_url, n.token) for n in self.nodes),
            seed=seed,
            bucket_count=bucket_count,
            failover_after=failover_after,
            min_rebuild_interval=min_rebuild_interval,
            smoothing=smoothing,
            push_timeout=1.0,
        )
        self.manager = ManagerHarness(
            f"{self.prefix}m",
            self.settings,
            {node.node_id: node.token for node in self.nodes},
            tick_interval,
        )

    # --- building ----------------------------------------------------------------------------

    def __enter__(self) -> ClusterLab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _netns(self, name: str) -> str:
        run(["ip", "netns", "add", name])
        self.namespaces.append(name)
        run(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def _attach(self, ns: str, port: str, address: str) -> None:
        bridge = f"{self.prefix}br"
        temp = f"{self.prefix}{port}x"
        run(
            [
                "ip",
                "link",
                "add",
                temp,
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                bridge,
            ]
        )
        run(["ip", "-n", bridge, "link", "set", port, "master", "br0", "up"])
        run(["ip", "-n", ns, "link", "set", temp, "name", "eth0"])
        run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def _build(self) -> None:
        bridge = self._netns(f"{self.prefix}br")
        run(["ip", "-n", bridge, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"])
        run(["ip", "-n", bridge, "link", "set", "br0", "up"])
        client = self._netns(f"{self.prefix}c")
        self._attach(client, "pc", CLIENT)
        # The client sends frames for the VIP to a multicast MAC, which the bridge floods to
        # every node: the lab's stand-in for a switch port mirror or NLB's multicast mode.
        run(
            [
                "ip",
                "-n",
                client,
                "neigh",
                "replace",
                VIP,
                "lladdr",
                VIP_MAC,
                "dev",
                "eth0",
                "nud",
                "permanent",
            ]
        )
        self._attach(self._netns(self.manager.ns), "pm", MANAGER)
        for index, node in enumerate(self.nodes, start=1):
            self._netns(node.ns)
            self._attach(node.ns, f"p{index}", node.address)
            run(["ip", "-n", node.ns, "addr", "add", f"{VIP}/32", "dev", "lo"])
            run(
                [
                    "ip",
                    "netns",
                    "exec",
                    node.ns,
                    "sysctl",
                    "-qw",
                    "net.ipv4.conf.all.arp_ignore=1",
                    "net.ipv4.conf.all.arp_announce=2",
                    "net.ipv4.conf.eth0.arp_ignore=1",
                    "net.ipv4.conf.eth0.arp_announce=2",
                ]
            )
        self.manager.start()
        for node in self.nodes:
            self.start_server(node)
            self.start_agent(node)

    def spawn(self, ns: str, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        """Start ``argv`` in namespace ``ns``, its output in ``workdir/log_name``."""
        with (self.workdir / log_name).open("ab") as log:
            process = subprocess.Popen(
                ["ip", "netns", "exec", ns, *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def start_server(self, node: LabNode) -> None:
        node.server = self.spawn(
            node.ns,
            [PYTHON, str(HERE / "owner_server.py"), node.node_id, VIP, str(SERVICE_PORT)],
            f"{node.node_id}-server.log",
        )

    def start_agent(self, node: LabNode) -> None:
        node.agent = self.spawn(
            node.ns,
            [
                PYTHON,
                "-m",
                "cli",
                "node-agent",
                "--cluster",
                "lab",
                "--node-id",
                node.node_id,
                "--vip",
                VIP,
                "--listen",
                f"{node.address}:{AGENT_PORT}",
                "--manager-url",
                f"http://{MANAGER}:{REPORT_PORT}",
                "--allow-plaintext",  # a private bridge between network namespaces
                "--token-file",
                str(node.token_file),
                "--bucket-count",
                str(self.bucket_count),
                "--heartbeat-interval",
                str(self.heartbeat_interval),
                "--max-concurrency",
                str(node.max_concurrency),
                "--service-port",
                str(SERVICE_PORT),
            ],
            f"{node.node_id}-agent.log",
        )

    # --- using -------------------------------------------------------------------------------

    def node(self, node_id: str) -> LabNode:
        return next(node for node in self.nodes if node.node_id == node_id)

    def settled(self, nodes: list[str] | None = None) -> bool:
        """Whether the controller has a table and every listed (default: all) node holds it."""
        wanted = nodes or [node.node_id for node in self.nodes]

        def check(controller: ClusterController) -> bool:
            table = controller.table
            if table is None:
                return False
            held = {status.node_id: status.held_version for status in controller.status()}
            return all(held.get(node) == table.version for node in wanted)

        return self.manager.call(check)

    def table(self) -> Any:
        return self.manager.call(lambda controller: controller.table)

    def events(self) -> list[Any]:
        return self.manager.call(lambda controller: list(controller.events))

    def client(self, *args: str, stdin: str = "", timeout: float = 120) -> dict[str, Any]:
        """Run the lab client in the client namespace to completion; its JSON output."""
        done = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                f"{self.prefix}c",
                PYTHON,
                str(HERE / "cluster_client.py"),
                args[0],
                VIP,
                str(SERVICE_PORT),
                *args[1:],
            ],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def client_process(self, *args: str) -> subprocess.Popen[str]:
        """The lab client as a process to talk to over stdin/stdout (``hold`` mode)."""
        process = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                f"{self.prefix}c",
                PYTHON,
                str(HERE / "cluster_client.py"),
                args[0],
                VIP,
                str(SERVICE_PORT),
                *args[1:],
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.processes.append(process)  # type: ignore[arg-type]
        return process

    def nft(self, node: LabNode, *args: str) -> str:
        return run(["ip", "netns", "exec", node.ns, "nft", *args]).stdout

    def kill(self, process: subprocess.Popen[Any] | None, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one process the lab started, and reap it."""
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    # --- tearing down ------------------------------------------------------------------------

    def close(self) -> None:
        self.manager.stop()
        for process in self.processes:
            self.kill(process, signal.SIGTERM)
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        for name in reversed(self.namespaces):
            subprocess.run(
                ["ip", "netns", "del", name], check=False, capture_output=True, timeout=30
            )
        self.namespaces.clear()

    def leftovers(self) -> list[str]:
        """Namespaces of this lab still present (should be none after close)."""
        listed = run(["ip", "netns", "list"]).stdout.split()
        return [name for name in listed if name.startswith(self.prefix)]


@contextlib.contextmanager
def cluster_lab(workdir: Path, **options: Any) -> Iterator[ClusterLab]:
    """A started lab whose nodes all hold the first table."""
    with ClusterLab(workdir, **options) as lab:
        if not wait_until(lab.settled, timeout=15, interval=0.05):
            logs = {path.name: path.read_text()[-2000:] for path in workdir.glob("*.log")}
            raise RuntimeError(f"lab did not settle; logs: {logs}")
        yield lab
