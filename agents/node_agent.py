"""The node agent of a single-IP cluster (``dnslb node-agent``).

One runs on each node that shares the cluster's VIP. It

* installs the base ruleset through its dispatch driver once, **fenced** (no new connection is
  accepted) until the manager pushes a table;
* serves ``POST /v1/table`` (bearer token): validates the table, refuses one older than the table
  it holds (409), applies this node's active buckets in one transaction, and answers with what it
  now holds; ``GET /v1/table`` tells what it holds;
* posts a heartbeat to ``{manager_url}/v1/reports`` every ``heartbeat_interval`` seconds: a
  :class:`~dnslb.report.Report` with its connections to the VIP, its capacity and the table it
  holds. When the manager is unreachable it backs off (up to ``backoff_max``) and keeps going;
* renews a short lease in the kernel every third of ``lease``: if the agent dies, the node stops
  taking new connections by itself before the manager gives its buckets away;
* fences itself when stopped, so that it never accepts buckets the manager has given away.

Everything it reads comes from one :class:`NodeAgentConfig`.
"""

from __future__ import annotations

import hmac
import http.client
import json
import logging
import os
import signal
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from agents.dispatch_drivers import DRIVERS, DispatchDriver, NodeRules, create_driver
from agents.dispatch_drivers.nft_ruleset import check_table_name, check_vip
from agents.vip_connections import VipConnections, VipLoad
from dnslb.dispatch import MAX_BUCKETS, MAX_ID_LENGTH, BucketTable, parse_table_json
from dnslb.errors import ConfigError, DnslbError, ProcessError, ProtocolError
from dnslb.report import Report, TableHeld, report_to_dict

log = logging.getLogger(__name__)

MIN_TOKEN_LENGTH = 16
MAX_TABLE_BODY = 4 * 1024 * 1024  # a 65,536-bucket table with long node ids fits
MANAGER_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class NodeAgentConfig:
    """Every setting of a node agent; checked on construction (:class:`ConfigError`)."""

    cluster: str
    node_id: str
    vip: str
    token: str = field(repr=False)  # authenticates pushes to us and our reports to the manager
    manager_url: str | None = None  # None: no heartbeats (the agent only takes pushes)
    listen_host: str = "127.0.0.1"
    listen_port: int = 8470
    driver: str = "nftables"
    bucket_count: int = 1024
    heartbeat_interval: float = 0.1
    backoff_max: float = 2.0
    max_concurrency: int = 1000
    service_ports: tuple[int, ...] = ()
    nft_table: str = "dnslb"
    require_listener: bool = True
    # Without a renewal for this long the node stops taking new connections (0: never). Keep it
    # below the manager's failover_after (0.3 s by default).
    lease: float = 0.25

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in ("cluster", "node_id"):
            value = getattr(self, name)
            if not 0 < len(value) <= MAX_ID_LENGTH:
                problems.append(f"{name}: must be 1 to {MAX_ID_LENGTH} characters")
        try:
            check_vip(self.vip)
        except ValueError:
            problems.append(f"vip: {self.vip!r} is not an IPv4 address")
        if len(self.token) < MIN_TOKEN_LENGTH:
            problems.append(f"token: must be at least {MIN_TOKEN_LENGTH} characters")
        if self.manager_url is not None:
            parts = urllib.parse.urlsplit(self.manager_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                problems.append(f"manager_url: {self.manager_url!r} is not an http(s) URL")
        if not 0 <= self.listen_port <= 65535:
            problems.append(f"listen_port: {self.listen_port} is not a port")
        if self.driver not in DRIVERS:
            problems.append(f"driver: {self.driver!r} unknown (known: {', '.join(DRIVERS)})")
        if not 1 <= self.bucket_count <= MAX_BUCKETS:
            problems.append(f"bucket_count: must be 1..{MAX_BUCKETS}")
        if not 0.01 <= self.heartbeat_interval <= 60:
            problems.append("heartbeat_interval: must be 0.01 to 60 seconds")
        if self.backoff_max < self.heartbeat_interval:
            problems.append("backoff_max: must be at least heartbeat_interval")
        if self.lease != 0 and not 0.05 <= self.lease <= 60:
            problems.append("lease: must be 0 (off) or 0.05 to 60 seconds")
        if self.max_concurrency < 1:
            problems.append("max_concurrency: must be >= 1")
        if any(not 1 <= port <= 65535 for port in self.service_ports):
            problems.append("service_ports: each must be 1..65535")
        try:
            check_table_name(self.nft_table)
        except ValueError as exc:
            problems.append(f"nft_table: {exc}")
        if problems:
            raise ConfigError("node agent", problems)

    @property
    def rules(self) -> NodeRules:
        """What the dispatch driver needs."""
        return NodeRules(
            vip=check_vip(self.vip),
            table_name=self.nft_table,
            require_listener=self.require_listener,
            lease=self.lease,
        )


def read_token(token_file: str | None, token_env: str | None) -> str:
    """The bearer token from a file or an environment variable (never from the command line)."""
    if (token_file is None) == (token_env is None):
        raise ConfigError("node agent", ["give exactly one of --token-file and --token-env"])
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError("node agent", [f"{token_file}: {exc.strerror}"]) from None
        where = token_file
    else:
        assert token_env is not None
        token = os.environ.get(token_env, "").strip()
        where = f"${token_env}"
    if not token:
        raise ConfigError("node agent", [f"{where}: the token is empty"])
    return token


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP status and a JSON body."""

    status: int
    body: dict[str, Any]


class NodeAgent:
    """The agent's state and behaviour, apart from sockets and threads (see :func:`run`)."""

    def __init__(
        self,
        config: NodeAgentConfig,
        driver: DispatchDriver,
        load: Callable[[], VipLoad],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.driver = driver
        self.load = load
        self.wall_clock = wall_clock
        self._lock = threading.Lock()
        self._held: BucketTable | None = None
        self._seq = 0

    @property
    def held(self) -> BucketTable | None:
        """The table installed now (None while fenced at start)."""
        return self._held

    def install(self) -> None:
        """Install the base ruleset, fenced. Raises :class:`ProcessError` when it cannot."""
        with self._lock:
            self.driver.install()
            self._held = None

    def fence(self) -> None:
        """Stop accepting new connections (on shutdown)."""
        with self._lock:
            self.driver.fence()
            self._held = None

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries this agent's token (constant time)."""
        expected = f"Bearer {self.config.token}".encode()
        return hmac.compare_digest((header or "").encode(), expected)

    def receive_table(self, body: bytes) -> Reply:
        """Validate and apply a pushed table; the reply says what the node holds afterwards."""
        try:
            table = parse_table_json(body)
        except ProtocolError as exc:
            return Reply(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        if table.cluster != self.config.cluster:
            message = (
                f"table is for cluster {table.cluster!r}, this node is in {self.config.cluster!r}"
            )
            return Reply(HTTPStatus.BAD_REQUEST, {"error": message})
        if table.bucket_count != self.config.bucket_count:
            message = (
                f"table has {table.bucket_count} buckets, this node is configured for "
                f"{self.config.bucket_count}"
            )
            return Reply(HTTPStatus.BAD_REQUEST, {"error": message})
        with self._lock:
            held = self._held
            if held is not None and table.version < held.version:
                message = f"version {table.version} is older than the held version {held.version}"
                return Reply(HTTPStatus.CONFLICT, {"error": message, **self._holding(held)})
            if held is not None and table.version == held.version:
                if table == held:
                    return Reply(HTTPStatus.OK, {"unchanged": True, **self._holding(held)})
                message = f"version {table.version} is held already, with other contents"
                return Reply(HTTPStatus.CONFLICT, {"error": message, **self._holding(held)})
            mine = table.active_buckets(self.config.node_id)
            started = time.perf_counter()
            try:
                self.driver.apply(mine, table.bucket_count, table.seed)
            except ProcessError as exc:
                # The transaction failed whole: the rules, and so what we hold, are unchanged.
                log.warning("table v%d not applied: %s", table.version, exc)
                return Reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": str(exc)})
            applied_ms = (time.perf_counter() - started) * 1000
            self._held = table
        log.info("table v%d applied: %d buckets in %.1f ms", table.version, len(mine), applied_ms)
        return Reply(HTTPStatus.OK, {"applied_ms": round(applied_ms, 3), **self._holding(table)})

    def holding(self) -> Reply:
        """What ``GET /v1/table`` answers."""
        with self._lock:
            return Reply(HTTPStatus.OK, self._holding(self._held))

    def _holding(self, table: BucketTable | None) -> dict[str, Any]:
        mine = table.active_buckets(self.config.node_id) if table is not None else ()
        return {
            "cluster": self.config.cluster,
            "node_id": self.config.node_id,
            "version": table.version if table is not None else None,
            "buckets": list(mine),
        }

    def report(self) -> Report:
        """The next heartbeat: load, capacity and the table held."""
        load = self.load()
        held = self._held
        self._seq += 1
        return Report(
            server_id=self.config.node_id,
            seq=self._seq,
            time=self.wall_clock(),
            in_progress=None if load.error else load.in_progress,
            max_concurrency=self.config.max_concurrency,
            error=load.error,
            table=TableHeld(held.cluster, held.version) if held is not None else None,
        )


class ManagerLink:
    """Posts reports to the manager over one kept-alive HTTP connection, reconnecting as needed."""

    def __init__(self, manager_url: str, token: str, timeout: float = MANAGER_TIMEOUT) -> None:
        parts = urllib.parse.urlsplit(manager_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._path = parts.path.rstrip("/") + "/v1/reports"
        self._token = token
        self._timeout = timeout
        self._connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._connection = kind(self._host, self._port, timeout=self._timeout)
        return self._connection

    def post(self, report: Report) -> None:
        """Send one report; raises :class:`ProtocolError` on any failure, saying why."""
        body = json.dumps(report_to_dict(report)).encode()
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Content-Type": "application/json",
        }
        try:
            connection = self._connect()
            connection.request("POST", self._path, body=body, headers=headers)
            response = connection.getresponse()
            detail = response.read(500)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise ProtocolError(f"manager unreachable: {exc or type(exc).__name__}") from None
        if response.status >= 300:
            raise ProtocolError(f"manager refused the report: {response.status} {detail!r}")

    def close(self) -> None:
        """Drop the connection (the next post opens a new one)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def heartbeat_loop(
    agent: NodeAgent, link: ManagerLink, stop: threading.Event, interval: float, backoff_max: float
) -> None:
    """Post a report every ``interval`` until ``stop``; back off while the manager fails."""
    delay = 0.0
    failing = False
    while not stop.wait(delay):
        try:
            link.post(agent.report())
        except ProtocolError as exc:
            if not failing:
                log.warning("%s; retrying with backoff up to %.1f s", exc, backoff_max)
            failing = True
            delay = min(backoff_max, max(interval, delay * 2))
            continue
        if failing:
            log.info("manager reachable again")
        failing = False
        delay = interval
    link.close()


def lease_loop(driver: DispatchDriver, stop: threading.Event, interval: float) -> None:
    """Renew the driver's lease every ``interval`` until ``stop``; a failure is said once."""
    failing = False
    while not stop.wait(interval):
        try:
            driver.renew()
        except ProcessError as exc:
            if not failing:
                log.warning("lease not renewed (the node stops taking new connections): %s", exc)
            failing = True
            continue
        if failing:
            log.info("lease renewed again")
        failing = False


class _TableHandler(BaseHTTPRequestHandler):
    server: AgentHttpServer
    protocol_version = "HTTP/1.1"  # keep-alive, so the manager's pushes reuse a connection

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in two writes; with Nagle on, the body waits for the
        # manager's delayed ACK (40 ms on Linux), longer than applying the table takes.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, reply: Reply) -> None:
        data = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if reply.status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", 'Bearer realm="dnslb node agent"')
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.server.agent.authorized(self.headers.get("Authorization")):
            return True
        self._send(Reply(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"}))
        return False

    def do_GET(self) -> None:
        if self.path != "/v1/table":
            self._send(Reply(HTTPStatus.NOT_FOUND, {"error": f"no such resource {self.path}"}))
        elif self._authorized():
            self._send(self.server.agent.holding())

    def do_POST(self) -> None:
        if self.path != "/v1/table":
            self._send(Reply(HTTPStatus.NOT_FOUND, {"error": f"no such resource {self.path}"}))
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            self._send(Reply(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length required"}))
            return
        if not 0 <= length <= MAX_TABLE_BODY:
            self.close_connection = True
            self._send(Reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "table too large"}))
            return
        body = self.rfile.read(length)
        if self._authorized():
            self._send(self.server.agent.receive_table(body))

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s: " + format, self.address_string(), *args)


class AgentHttpServer(ThreadingHTTPServer):
    """The table push endpoint; one thread per connection."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], agent: NodeAgent) -> None:
        self.agent = agent
        super().__init__(address, _TableHandler)


def run(config: NodeAgentConfig, stop: threading.Event | None = None) -> int:
    """Run the node agent until SIGTERM/SIGINT (or ``stop`` is set); returns the exit status."""
    stop = stop or threading.Event()
    driver = create_driver(config.driver, config.rules)
    load = VipConnections(check_vip(config.vip), config.service_ports)
    agent = NodeAgent(config, driver, load)
    agent.install()
    try:
        server = AgentHttpServer((config.listen_host, config.listen_port), agent)
    except OSError as exc:
        where = f"{config.listen_host}:{config.listen_port}"
        raise ConfigError("node agent", [f"listen {where}: {exc.strerror}"]) from None
    host, port = server.server_address[:2]
    log.info(
        "node %s of cluster %s: fenced, taking tables on %s:%s",
        config.node_id,
        config.cluster,
        host,
        port,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    serving = threading.Thread(
        target=server.serve_forever, args=(0.1,), name="table-push", daemon=True
    )
    serving.start()
    renewing: threading.Thread | None = None
    if config.lease > 0:
        renewing = threading.Thread(
            target=lease_loop, args=(driver, stop, config.lease / 3), name="lease", daemon=True
        )
        renewing.start()
    beating: threading.Thread | None = None
    if config.manager_url is not None:
        link = ManagerLink(config.manager_url, config.token)
        beating = threading.Thread(
            target=heartbeat_loop,
            args=(agent, link, stop, config.heartbeat_interval, config.backoff_max),
            name="heartbeat",
            daemon=True,
        )
        beating.start()
    try:
        stop.wait()
    finally:
        stop.set()
        if beating is not None:
            beating.join(timeout=MANAGER_TIMEOUT + 1)
        if renewing is not None:
            renewing.join(timeout=5)
        server.shutdown()
        server.server_close()
        try:
            agent.fence()
        except DnslbError as exc:
            log.error("stopped, but could not fence: %s", exc)
            return 1
    log.info("node %s stopped, fenced", config.node_id)
    return 0
