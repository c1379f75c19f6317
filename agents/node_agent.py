"""The node agent of a single-IP cluster (``dnslb node-agent``).

One runs on each node that shares the cluster's VIP. It

* installs the base ruleset through its dispatch driver once, **fenced** (no new connection is
  accepted) until the manager pushes a table;
* serves ``POST /v1/table`` (bearer token): validates the table, refuses one older than the table
  it holds (409), applies this node's active buckets in one transaction, and answers with what it
  now holds; ``GET /v1/table`` tells what it holds. The listener (:class:`AgentHttpServer`)
  checks the token and the body's length before reading the body, drops connections that are
  slow to send (:data:`HEADER_TIMEOUT`, :data:`BODY_TIMEOUT`) and caps how many are open
  (:data:`MAX_CONNECTIONS`, strangers evicted first), all in one event loop: hostile clients
  cost sockets for seconds, never threads, and never keep the manager's push out. With ``tls``
  it serves HTTPS only, the handshake within the request head's time;
* posts a heartbeat to ``{manager_url}/v1/reports`` every ``heartbeat_interval`` seconds: a
  :class:`~dnslb.report.Report` with its connections to the VIP, its capacity and the table it
  holds. When the manager is unreachable it backs off (up to ``backoff_max``) and keeps going;
  with several managers (``manager_urls``) it follows the leader (:mod:`agents.managers`);
* renews a short lease in the kernel after each heartbeat the manager took, counted from when it
  was sent (:class:`LeaseKeeper`): if the agent dies, the node stops taking new connections by
  itself at most ``lease`` after the manager last heard it, so before the manager gives its
  buckets away;
* fences itself when stopped, so that it never accepts buckets the manager has given away.

Everything it reads comes from one :class:`NodeAgentConfig`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import http.client
import json
import logging
import math
import signal
import socket
import ssl
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from types import FrameType
from typing import Any

from agents.dispatch_drivers import DRIVERS, DispatchDriver, NodeRules, create_driver
from agents.dispatch_drivers.nft_ruleset import check_table_name, check_vip
from agents.managers import ManagerUrls
from agents.vip_connections import VipConnections, VipLoad
from dnslb.config import FileReference, Secret, checked, setting
from dnslb.dispatch import MAX_BUCKETS, BucketTable, parse_table_json
from dnslb.errors import ConfigError, DnslbError, ProcessError, ProtocolError
from dnslb.report import MAX_COUNT, Report, TableHeld, id_problem, report_to_dict
from dnslb.tls import (
    TlsListenerConfig,
    ca_file_problem,
    client_context,
    plaintext_listener_problem,
    plaintext_url_problem,
    server_context,
    verification_failure,
)

log = logging.getLogger(__name__)

MIN_TOKEN_LENGTH = 16
MIN_LEASE = 0.05
MAX_TABLE_BODY = 4 * 1024 * 1024  # a 65,536-bucket table with long node ids fits
MANAGER_TIMEOUT = 2.0
MAX_MANAGERS = 16
"""Most manager URLs a node agent is given (each is tried at most once per heartbeat)."""
MAX_CONNECTIONS = 64
"""Connections the push listener keeps open (the manager needs one or two)."""
HEADER_TIMEOUT = 5.0
"""Seconds a connection has to send a request's head (line and headers) in full."""
BODY_TIMEOUT = 10.0
"""Seconds an authenticated request has to send its body, and a client to read the answer."""
IDLE_TIMEOUT = 30.0
"""Seconds an authenticated keep-alive connection may wait for its next request."""
MAX_HEADER_BYTES = 16 * 1024
LINGER = 1.0
"""Seconds a refused request's unread body is read and dropped before the connection closes."""
LINGER_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class NodeAgentConfig:
    """A node agent: its cluster and node, the manager it reports to, where it takes pushes.

    Read from YAML by ``dnslb node-agent --config FILE`` (:func:`load_config`), or built from
    the command's flags; built in code, it is checked by :func:`~dnslb.config.checked` (the
    agent checks it again when it starts). The token is a :class:`~dnslb.config.Secret`: its
    value appears in no repr, log or error.
    """

    cluster: str = setting(help="cluster name, as the manager knows it")
    node_id: str = setting(help="this node's id in dispatch tables (the manager's nodes[].id)")
    vip: str = setting(help="the cluster's shared IPv4 address")
    token: Secret = setting(
        help="bearer token, at least 16 characters: authenticates the manager's pushes to this "
        "agent and this agent's reports to the manager"
    )
    manager_url: str | None = setting(
        None,
        help="manager base URL for heartbeats (null: no heartbeats, the agent only takes pushes)",
    )
    manager_urls: tuple[str, ...] = setting(
        default_factory=tuple,
        help="more managers' base URLs (standbys): heartbeats go to the leader among these and "
        "manager_url, following a standby's redirect only to one of them",
    )
    listen_host: str = setting("127.0.0.1", help="address the table push listener binds")
    listen_port: int = setting(8470, help="port of the push listener (0: any)", min=0, max=65535)
    tls: TlsListenerConfig | None = setting(
        None, help="the push listener serves HTTPS with this certificate and key (null: HTTP)"
    )
    ca_file: FileReference | None = setting(
        None,
        help="CA certificate(s) an https:// manager_url is verified with (null: the system's "
        "trust store)",
    )
    allow_plaintext: bool = setting(
        False,
        help="let the token cross the network in clear text: an http:// manager_url beyond this "
        "host, a push listener without tls beyond loopback (only on a network you trust)",
    )
    driver: str = setting(
        "nftables", help="dispatch driver: nftables, or dry-run (logs the nft scripts instead)"
    )
    bucket_count: int = setting(
        1024,
        help="buckets per table (the manager's clusters[].bucket_count)",
        min=1,
        max=MAX_BUCKETS,
    )
    heartbeat_interval: float = setting(0.1, help="seconds between heartbeats", min=0.01, max=60.0)
    backoff_max: float = setting(
        2.0,
        help="longest wait between heartbeats while the manager is unreachable (at least "
        "heartbeat_interval)",
    )
    max_concurrency: int = setting(
        1000, help="connections to the VIP at full load", min=1, max=MAX_COUNT
    )
    service_ports: tuple[int, ...] = setting(
        default_factory=tuple,
        help="ports the service listens on: connections to them count, and none listening means "
        "not serving (empty: every port counts, nothing is checked)",
    )
    nft_table: str = setting(
        "dnslb",
        help="nftables table the agent creates and marks as its own (an unmarked one is refused)",
    )
    require_listener: bool = setting(
        True,
        help="accept a SYN of our buckets only when a socket listens (false: the stack resets it)",
    )
    # net.netfilter.nf_conntrack_tcp_loose is host-wide in the network namespace; docs/clusters.md
    # says what setting it to 0 buys and costs.
    keep_tcp_loose: bool = setting(
        False, help="leave net.netfilter.nf_conntrack_tcp_loose as it is (default: set it to 0)"
    )
    lease: float = setting(
        0.25,
        help="seconds the node takes new connections without its agent, counted from each "
        "heartbeat the manager took: 0 (never stops) or 0.05 to 60, at least twice "
        "heartbeat_interval; keep it below the manager's failover_after",
        min=0.0,
        max=60.0,
    )

    def config_problems(self) -> Iterator[str]:
        for name in ("cluster", "node_id"):
            if problem := id_problem(getattr(self, name)):
                yield f"{name}: {problem}"
        try:
            check_vip(self.vip)
        except ValueError:
            yield f"vip: {self.vip!r} is not an IPv4 address"
        if len(self.token.reveal()) < MIN_TOKEN_LENGTH:
            yield f"token: must be at least {MIN_TOKEN_LENGTH} characters"
        if self.manager_url is not None:
            parts = urllib.parse.urlsplit(self.manager_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                yield f"manager_url: {self.manager_url!r} is not an http(s) URL"
            elif problem := plaintext_url_problem(
                "manager_url", self.manager_url, self.allow_plaintext
            ):
                yield problem
        elif self.manager_urls:
            yield "manager_urls: needs manager_url (the first manager to try)"
        if len(self.manager_urls) > MAX_MANAGERS:
            yield f"manager_urls: at most {MAX_MANAGERS} managers"
        for index, url in enumerate(self.manager_urls[:MAX_MANAGERS]):
            name = f"manager_urls[{index}]"
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                yield f"{name}: {url!r} is not an http(s) URL"
            elif problem := plaintext_url_problem(name, url, self.allow_plaintext):
                yield problem
        if problem := plaintext_listener_problem(
            "listen_host", self.listen_host, self.tls is not None, self.allow_plaintext
        ):
            yield problem
        if problem := ca_file_problem(self.ca_file):
            yield problem
        if self.driver not in DRIVERS:
            yield f"driver: {self.driver!r} unknown (known: {', '.join(sorted(DRIVERS))})"
        if self.backoff_max < self.heartbeat_interval:
            yield "backoff_max: must be at least heartbeat_interval"
        if 0 < self.lease < MIN_LEASE:
            yield f"lease: must be 0 (off) or {MIN_LEASE} to 60 seconds"
        elif self.lease != 0 and self.manager_url and self.lease < 2 * self.heartbeat_interval:
            yield (
                "lease: must be at least twice heartbeat_interval (it is renewed from each "
                "heartbeat the manager took)"
            )
        if any(not 1 <= port <= 65535 for port in self.service_ports):
            yield "service_ports: each must be 1..65535"
        try:
            check_table_name(self.nft_table)
        except ValueError as exc:
            yield f"nft_table: {exc}"

    @property
    def managers(self) -> tuple[str, ...]:
        """Every manager's base URL, ``manager_url``'s first (empty: no heartbeats)."""
        if self.manager_url is None:
            return ()
        return (self.manager_url, *self.manager_urls)

    @property
    def rules(self) -> NodeRules:
        """What the dispatch driver needs."""
        return NodeRules(
            vip=check_vip(self.vip),
            table_name=self.nft_table,
            require_listener=self.require_listener,
            lease=self.lease,
            owner=self.cluster,
            set_tcp_loose=not self.keep_tcp_loose,
        )


def token_reference(token_file: str | None, token_env: str | None) -> str:
    """The :class:`~dnslb.config.Secret` reference ``--token-file`` or ``--token-env`` names
    (the token itself never comes from the command line)."""
    if (token_file is None) == (token_env is None):
        raise ConfigError("node agent", ["give exactly one of --token-file and --token-env"])
    return f"file:{token_file}" if token_file is not None else f"env:{token_env}"


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
        self.config = checked(config, "node agent")
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
        expected = f"Bearer {self.config.token.reveal()}".encode()
        return hmac.compare_digest((header or "").encode(), expected)

    def receive_table(self, body: bytes) -> Reply:
        """Validate and apply a pushed table; the reply says what the node holds afterwards.
        Never raises: a table is refused with a 4xx reply (a 500 when the driver failed) and
        changes nothing, or is applied whole."""
        if len(body) > MAX_TABLE_BODY:  # the listener refuses these before reading them
            return Reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "table too large"})
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
    """Posts reports to the manager over one kept-alive HTTP connection per manager,
    reconnecting as needed; an ``https://`` manager is verified with ``context`` (default: the
    system's trust store). With several managers it follows the leader (:mod:`agents.managers`):
    the next one on a network failure or a ``503``, a ``307`` only to a configured manager."""

    def __init__(
        self,
        manager_url: str | Sequence[str],
        token: str,
        timeout: float = MANAGER_TIMEOUT,
        *,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.managers = ManagerUrls([manager_url] if isinstance(manager_url, str) else manager_url)
        self._context = context
        self._token = token
        self._timeout = timeout
        self._connections: dict[int, http.client.HTTPConnection] = {}

    def _connect(self, index: int) -> tuple[http.client.HTTPConnection, str]:
        """The connection to manager ``index`` and the path reports are posted to there."""
        parts = urllib.parse.urlsplit(self.managers.urls[index])
        path = parts.path.rstrip("/") + "/v1/reports"
        connection = self._connections.get(index)
        if connection is None:
            if parts.scheme == "https":
                connection = http.client.HTTPSConnection(
                    parts.hostname or "",
                    parts.port,
                    timeout=self._timeout,
                    context=self._context or client_context(),
                )
            else:
                connection = http.client.HTTPConnection(
                    parts.hostname or "", parts.port, timeout=self._timeout
                )
            self._connections[index] = connection
        return connection, path

    def post(self, report: Report) -> float:
        """Send one report to the leading manager and return when (``time.monotonic()``) the
        attempt it took began: the manager heard this agent at that time or later. Raises
        :class:`ProtocolError` on any failure, saying why."""
        body = json.dumps(report_to_dict(report)).encode()
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Content-Type": "application/json",
        }
        attempts = self.managers.round()
        for index in attempts:
            url = self.managers.urls[index]
            sent = time.monotonic()
            try:
                connection, path = self._connect(index)
                connection.request("POST", path, body=body, headers=headers)
                response = connection.getresponse()
                detail = response.read(500)
                location = response.getheader("Location")
            except (OSError, http.client.HTTPException) as exc:
                self._drop(index)
                reason = verification_failure(exc) or exc or type(exc).__name__
                attempts.problems.append(f"manager unreachable: {reason}")
                continue
            if response.status == HTTPStatus.TEMPORARY_REDIRECT:
                why = attempts.redirect(location, url) if location else "gave no Location"
                if why is not None:
                    attempts.problems.append(f"manager at {url} redirected: {why}")
                continue
            if response.status == HTTPStatus.SERVICE_UNAVAILABLE:
                attempts.problems.append(f"manager at {url} is not taking reports: {detail!r}")
                continue
            attempts.took(index)
            if response.status >= 300:
                raise ReportRefused(f"manager refused the report: {response.status} {detail!r}")
            return sent
        raise ProtocolError("; ".join(attempts.problems))

    def _drop(self, index: int) -> None:
        connection = self._connections.pop(index, None)
        if connection is not None:
            connection.close()

    def close(self) -> None:
        """Drop the connections (the next post opens new ones)."""
        for index in list(self._connections):
            self._drop(index)


class ReportRefused(ProtocolError):
    """The leading manager answered a report with a refusal: it is up, and did not count it."""


class LeaseKeeper:
    """Renews the node's lease so that it never outlives the last heartbeat the manager heard by
    more than ``lease`` seconds.

    After each heartbeat the manager took, the heartbeat loop calls :meth:`heard` with the time
    that heartbeat was sent, and the lease is renewed to end ``lease`` after *that*: the manager
    heard it then or later, so its clock for the node (when it last heard it) never starts before
    the lease's. A node whose agent dies therefore stops taking new connections at most ``lease``
    after the manager last heard it, before the manager (``failover_after`` > ``lease``) gives its
    buckets to other nodes, however the agent's threads were scheduled and wherever it died. A
    heartbeat that took longer than ``lease`` renews nothing, and the lease runs out.

    Two earlier ways let the lease outlive the manager's clock, and then the dead node and the
    bucket's new owner both answered the same SYN, and the client got a reset: renewing on a
    timer of its own (the last renewal came up to a heartbeat interval after the last heartbeat
    heard), and renewing just *before* each post (an agent killed after the renewal and before
    its post arrived had renewed for a heartbeat the manager never heard).

    While posts fail (the manager is down or unreachable) or no manager is configured,
    :meth:`loop` renews the lease on its own every third of ``lease``, so that an outage of the
    manager does not fence the whole cluster. Then the lease protects nothing: a manager that
    cannot hear a live agent fails its node over anyway (docs/clusters.md). A manager that
    *refuses* a heartbeat (a wrong token, a report it will not take) is up and did not count
    it: it fails the node over like one that heard nothing, so the lease is left to run out.
    """

    def __init__(self, driver: DispatchDriver, lease: float, *, heartbeats: bool) -> None:
        self._driver = driver
        self.lease = lease
        self._lock = threading.Lock()
        self._on_own = not heartbeats
        self._failing = False

    def _renew(self, seconds: float) -> None:
        try:
            self._driver.renew(seconds)
        except ProcessError as exc:
            if not self._failing:
                log.warning("lease not renewed (the node stops taking new connections): %s", exc)
            self._failing = True
            return
        if self._failing:
            log.info("lease renewed again")
        self._failing = False

    def heard(self, sent: float) -> None:
        """The manager took the heartbeat sent at ``sent`` (``time.monotonic()``): renew the lease
        to end ``lease`` after it. The timer stays off until a post fails."""
        with self._lock:
            self._on_own = False
            left = self.lease - (time.monotonic() - sent)
            if left >= 0.001:  # nft counts in milliseconds; less would round up
                self._renew(left)

    def post_failed(self, *, refused: bool = False) -> None:
        """The heartbeat did not reach the manager: renew on the timer until one does; or the
        manager ``refused`` it: renew nothing until one is taken."""
        with self._lock:
            self._on_own = not refused

    def loop(self, stop: threading.Event) -> None:
        """Renew every third of ``lease`` while the lease is on its own, until ``stop``."""
        while not stop.wait(self.lease / 3):
            with self._lock:
                if self._on_own:
                    self._renew(self.lease)


def heartbeat_loop(
    agent: NodeAgent,
    link: ManagerLink,
    stop: threading.Event,
    interval: float,
    backoff_max: float,
    *,
    lease: LeaseKeeper | None = None,
) -> None:
    """Post a report every ``interval`` until ``stop``; back off while the manager fails. With a
    ``lease``, renew it after each post a manager took, counted from when that post was sent."""
    delay = 0.0
    failing = False
    while not stop.wait(delay):
        try:
            sent = link.post(agent.report())
        except ProtocolError as exc:
            if lease is not None:
                lease.post_failed(refused=isinstance(exc, ReportRefused))
            if not failing:
                log.warning("%s; retrying with backoff up to %.1f s", exc, backoff_max)
            failing = True
            delay = min(backoff_max, max(interval, delay * 2))
            continue
        if lease is not None:
            lease.heard(sent)
        if failing:
            log.info("manager reachable again")
        failing = False
        delay = interval
    link.close()


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """How much the push listener gives a connection before it is dropped."""

    max_connections: int = MAX_CONNECTIONS
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    max_header_bytes: int = MAX_HEADER_BYTES


@dataclass(eq=False)
class _Connection:
    writer: asyncio.StreamWriter
    task: asyncio.Task[None] | None
    trusted: bool = False  # it sent this agent's token: never evicted for a stranger


class _Refused(Exception):
    """A request answered with an error before its body was read; the connection closes."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class AgentHttpServer:
    """The table push endpoint (``GET``/``POST /v1/table``), hardened against slow and hostile
    clients. One event loop in the thread that calls :meth:`serve_forever` serves every
    connection; tables are applied in one worker thread. So:

    * the bearer token and ``Content-Length`` (at most :data:`MAX_TABLE_BODY`) are checked from
      the headers before a byte of the body is read; any refusal closes the connection;
    * the request head must arrive within ``header_timeout`` (a keep-alive connection that has
      authenticated may wait ``idle_timeout`` for its next request) and the body within
      ``body_timeout``, else the connection is dropped: a slowloris holds a socket for seconds,
      never a thread;
    * at most ``max_connections`` are open: a new one evicts the oldest connection that has not
      authenticated (the manager's connections, once authenticated, are never evicted), or is
      closed at once when every open connection has authenticated.

    With ``tls`` (a server context), a connection's TLS handshake is done once it is counted
    (a connection still shaking hands may be evicted) and within its first request head's
    ``header_timeout``: a client that never says hello is dropped like one that never sends a
    request.

    The interface follows ``socketserver``: bound on construction (``OSError`` then), then
    :meth:`serve_forever`, :meth:`shutdown` from another thread, :meth:`server_close`.
    ``stats`` counts what was refused or dropped.
    """

    def __init__(
        self,
        address: tuple[str, int],
        agent: NodeAgent,
        limits: ListenerLimits | None = None,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.agent = agent
        self.limits = limits or ListenerLimits()
        self.tls = tls
        host = address[0]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server(address, family=family, backlog=128)
        self.server_address: tuple[Any, ...] = self.socket.getsockname()
        self.stats: Counter[str] = Counter()
        self._connections: dict[int, _Connection] = {}  # in the order they came: oldest first
        self._state = threading.Lock()
        self._closing = False
        self._wake: Callable[[], object] | None = None
        self._done = threading.Event()
        self._last_warned = -math.inf

    @property
    def open_connections(self) -> int:
        """Connections open now (read from any thread; approximate while it changes)."""
        return len(self._connections)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until :meth:`shutdown` (``poll_interval`` is accepted for compatibility)."""
        self._done.clear()
        try:
            asyncio.run(self._serve())
        finally:
            self._done.set()

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` and wait for it to return."""
        with self._state:
            self._closing = True
            wake = self._wake
        if wake is not None:
            wake()
            self._done.wait()

    def server_close(self) -> None:
        """Close the listening socket."""
        self.socket.close()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        with self._state:
            if self._closing:
                return
            self._wake = functools.partial(loop.call_soon_threadsafe, stop.set)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="table-apply")
        server = await asyncio.start_server(
            self._accept, sock=self.socket, limit=self.limits.max_header_bytes
        )
        try:
            await stop.wait()
        finally:
            server.close()
            for connection in list(self._connections.values()):
                connection.writer.transport.abort()
                if connection.task is not None:
                    connection.task.cancel()
            tasks = [c.task for c in self._connections.values() if c.task is not None]
            await asyncio.gather(*tasks, return_exceptions=True)
            self._executor.shutdown(wait=True, cancel_futures=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer, asyncio.current_task())
        key = id(connection)
        if len(self._connections) >= self.limits.max_connections:
            victim = next((c for c in self._connections.values() if not c.trusted), None)
            if victim is None:
                self.stats["refused"] += 1
                writer.transport.abort()
                return
            self.stats["evicted"] += 1
            self._connections.pop(id(victim), None)
            victim.writer.transport.abort()
            self._warn_full()
        self._connections[key] = connection
        transport = writer.transport
        try:
            # The first request's head is due within header_timeout, the handshake included.
            first = asyncio.get_running_loop().time() + self.limits.header_timeout
            if self.tls is not None:
                async with asyncio.timeout_at(first):
                    await writer.start_tls(self.tls)
                if writer.transport is None or writer.transport.is_closing():
                    return  # gone during the handshake
                transport = writer.transport
            await self._converse(reader, writer, connection, first)
        except TimeoutError:
            self.stats["timed_out"] += 1
        except ssl.SSLError:
            self.stats["failed handshakes"] += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a bug of ours; the listener goes on
            log.exception("push connection failed")
        finally:
            self._connections.pop(key, None)
            transport.abort()  # closed already, or dropped: slow, gone or evicted

    def _warn_full(self) -> None:
        now = time.monotonic()
        if now - self._last_warned >= 60:
            self._last_warned = now
            log.warning(
                "push listener full (%d connections): dropping the oldest unauthenticated ones "
                "(%d so far)",
                self.limits.max_connections,
                self.stats["evicted"],
            )

    async def _converse(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        connection: _Connection,
        first: float,
    ) -> None:
        """Serve requests until the connection ends; the first head is due by ``first``
        (loop time)."""
        limits = self.limits
        loop = asyncio.get_running_loop()
        due: float | None = first
        while True:
            if due is None:
                wait = limits.idle_timeout if connection.trusted else limits.header_timeout
                due = loop.time() + wait
            try:
                async with asyncio.timeout_at(due):
                    head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                refused = _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "head too large")
                await self._refuse(reader, writer, refused)
                return
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    self.stats["incomplete"] += 1
                return
            try:
                keep_alive, body_length, handler = self._admit(head, connection)
            except _Refused as refused:
                await self._refuse(reader, writer, refused)
                return
            due = None
            body = b""
            if body_length:
                async with asyncio.timeout(limits.body_timeout):
                    body = await reader.readexactly(body_length)
            try:
                reply = await loop.run_in_executor(self._executor, handler, body)
            except Exception:  # a bug of ours: answer 500, keep serving, say it
                log.exception("table request failed")
                reply = Reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})
            await self._answer(writer, reply, keep_alive=keep_alive)
            if not keep_alive:
                await self._close(reader, writer, linger=False)
                return

    async def _refuse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refused: _Refused
    ) -> None:
        self.stats[f"refused {refused.status.value}"] += 1
        reply = Reply(refused.status, {"error": refused.message})
        await self._answer(writer, reply, keep_alive=False)
        await self._close(reader, writer, linger=True)

    async def _close(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, linger: bool
    ) -> None:
        """Close after the last answer: all of it sent, then FIN. With ``linger`` (the request's
        body was not read), what the client still sends is read and dropped for a moment
        (:data:`LINGER` seconds, :data:`LINGER_BYTES` at most): closing with unread data would
        reset the connection, and the client might lose the answer before reading it."""
        if writer.can_write_eof():
            writer.write_eof()
        if linger:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LINGER):
                    dropped = 0
                    while dropped < LINGER_BYTES and (chunk := await reader.read(65536)):
                        dropped += len(chunk)
        writer.close()
        async with asyncio.timeout(self.limits.body_timeout):
            await writer.wait_closed()

    def _admit(
        self, head: bytes, connection: _Connection
    ) -> tuple[bool, int, Callable[[bytes], Reply]]:
        """Check a request head (before any body is read): the request line, the token, the
        length. Returns (keep-alive, body length, what answers it); raises :class:`_Refused`."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
            raise _Refused(HTTPStatus.BAD_REQUEST, "malformed request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, colon, value = line.partition(":")
            name = name.lower()
            if not colon or not name or name != name.strip():
                raise _Refused(HTTPStatus.BAD_REQUEST, "malformed header line")
            if name in headers and name in ("content-length", "authorization", "transfer-encoding"):
                raise _Refused(HTTPStatus.BAD_REQUEST, f"{name} given twice")
            headers[name] = value.strip()
        if target != "/v1/table":
            raise _Refused(HTTPStatus.NOT_FOUND, "no such resource")
        if method not in ("GET", "POST"):
            raise _Refused(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} not allowed")
        if not self.agent.authorized(headers.get("authorization")):
            raise _Refused(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token")
        connection.trusted = True
        if "transfer-encoding" in headers:
            raise _Refused(HTTPStatus.LENGTH_REQUIRED, "send the table with a Content-Length")
        text = headers.get("content-length", "0" if method == "GET" else "")
        if not text.isdigit() or not text.isascii():
            raise _Refused(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
        if len(text) > 12 or int(text) > MAX_TABLE_BODY:
            raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "table too large")
        length = int(text)
        keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if method == "GET":
            if length:
                raise _Refused(HTTPStatus.BAD_REQUEST, "GET takes no body")
            return keep_alive, 0, lambda body: self.agent.holding()
        if headers.get("expect", "").lower() == "100-continue":
            connection.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return keep_alive, length, self.agent.receive_table

    async def _answer(
        self, writer: asyncio.StreamWriter, reply: Reply, *, keep_alive: bool
    ) -> None:
        data = json.dumps(reply.body).encode()
        status = HTTPStatus(reply.status)
        lines = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            "Content-Type: application/json",
            f"Content-Length: {len(data)}",
        ]
        if status == HTTPStatus.UNAUTHORIZED:
            lines.append('WWW-Authenticate: Bearer realm="dnslb node agent"')
        if not keep_alive:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
        async with asyncio.timeout(self.limits.body_timeout):  # a client that reads nothing
            await writer.drain()


def run(config: NodeAgentConfig, stop: threading.Event | None = None) -> int:
    """Run the node agent until SIGTERM/SIGINT (or ``stop`` is set); returns the exit status."""
    stop = stop or threading.Event()
    config = checked(config, "node agent")
    driver = create_driver(config.driver, config.rules)
    load = VipConnections(check_vip(config.vip), config.service_ports)
    agent = NodeAgent(config, driver, load)
    agent.install()
    try:
        tls = server_context(config.tls.certificate, config.tls.key) if config.tls else None
    except ValueError as exc:  # checked when loaded; changed since
        raise ConfigError("node agent", [f"tls: {exc}"]) from None
    try:
        server = AgentHttpServer((config.listen_host, config.listen_port), agent, tls=tls)
    except OSError as exc:
        where = f"{config.listen_host}:{config.listen_port}"
        raise ConfigError("node agent", [f"listen {where}: {exc.strerror}"]) from None
    host, port = server.server_address[:2]
    log.info(
        "node %s of cluster %s: fenced, taking tables on %s://%s:%s",
        config.node_id,
        config.cluster,
        "https" if tls else "http",
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
    keeper: LeaseKeeper | None = None
    if config.lease > 0:
        keeper = LeaseKeeper(driver, config.lease, heartbeats=bool(config.managers))
        renewing = threading.Thread(target=keeper.loop, args=(stop,), name="lease", daemon=True)
        renewing.start()
    beating: threading.Thread | None = None
    if config.managers:
        link = ManagerLink(
            config.managers, config.token.reveal(), context=client_context(config.ca_file)
        )
        beating = threading.Thread(
            target=heartbeat_loop,
            args=(agent, link, stop, config.heartbeat_interval, config.backoff_max),
            kwargs={"lease": keeper},
            name="heartbeat",
            daemon=True,
        )
        beating.start()
    try:
        stop.wait()
    finally:
        stop.set()
        if beating is not None:
            beating.join(timeout=MANAGER_TIMEOUT * (len(config.managers) + 1) + 1)
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
