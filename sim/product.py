"""The product inside the simulator: the real manager and the real pipe backend, on virtual time.

:class:`Product` builds, from a :class:`~sim.scenario.Scenario`, what an operator would run: a
:class:`~manager.service.Manager` with one pool whose servers come from the ``memory`` provider
(the cloud: it boots a server in ``servers.boot_delay`` seconds of the manager's clock), its state
in SQLite in a scratch directory, publishing to a :class:`~dnslb.plan_store.MemoryPlanStore`
that a :class:`~pipe_backend.backend.PipeBackend` reads. Nothing of either is rewritten here:
agents' reports go to the manager's own ingest (the JSON body an agent sends, with the server's
token), the manager's own tick runs the policy, the lifecycle and the autoscaler, the pipe backend's
loader runs once a tick (a new plan, or the one it has gone stale), and each DNS
query is a pipe protocol line answered by the pipe backend's own compiled plan and rotation.

Time is a :class:`~dnslb.clock.FakeClock`: simulated second ``t`` is ``BASE + t`` on the
manager's monotonic clock. The manager starts ``warmup`` seconds before the users (the pool was
serving before the run): the servers of ``servers.initial`` already run in the cloud account and
the manager adopts them (``lifecycle.adopt_unknown``), as a manager started in front of a running
fleet does. Launch ids are numbered (``www-00001``...), so that a run is the same for a seed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dnslb.clock import FakeClock
from dnslb.config import Secret, checked
from dnslb.model import ServerState
from dnslb.plan_store import MemoryPlanStore
from manager.config import (
    LifecycleConfig,
    LoadedConfig,
    ManagerConfig,
    MemberConfig,
    NetworkConfig,
    PlanConfig,
    PoolConfig,
    StateConfig,
    ZoneConfig,
)
from manager.ingest import Rejected
from manager.providers.base import LaunchRequest
from manager.providers.memory import MemoryAccount, MemoryProvider, MemoryProviderConfig
from manager.service import Manager
from pipe_backend.backend import PipeBackend
from sim.scenario import Scenario

BASE = 100_000.0
"""The manager's monotonic clock at simulated second 0."""
WALL = 1_700_000_000.0
"""Wall time minus monotonic time (the plan's and the events' timestamps)."""
ZONE = "example.com"
POOL = "www"
POOL_NAME = f"{POOL}.{ZONE}."
NETWORK = "10.0.0"
"""The servers' addresses: 10.0.0.2, 10.0.0.3... on into 10.0.1.x and beyond."""
MAX_K = 64
"""Addresses per answer when a scenario gives every address (the policy's largest k)."""

_QUERY = f"Q\t{POOL_NAME[:-1]}\tIN\tA\t-1\t192.0.2.1".encode()

_LOUD = ("dnslb", "pipe_backend")


def quiet_logs() -> dict[str, int]:
    """The product logs every plan it loads and every state change: thousands of lines a run.
    A simulation keeps only errors (its events are in the manager's state, not in logs).
    Returns the levels before, which :meth:`Product.close` puts back (a simulation run inside
    another program, dnslb calibrate or a test, leaves its logging as it found it)."""
    before = {name: logging.getLogger(name).level for name in _LOUD}
    for name in _LOUD:
        logging.getLogger(name).setLevel(logging.ERROR)
    return before


@dataclass(frozen=True, slots=True)
class StaticServer:
    """A configured member of a topology scenario's pool: id, agent token, address, location."""

    id: str
    token: str
    address: str
    location: int  # index in the scenario's locations


def static_servers(scenario: Scenario) -> list[StaticServer]:
    """The members of a topology scenario, location by location (ids ``east-001``...)."""
    if scenario.topology is None:
        return []
    servers: list[StaticServer] = []
    for index, location in enumerate(scenario.topology.locations):
        for number in range(location.servers):
            at = len(servers) + 2
            server_id = f"{location.name}-{number + 1:03d}"
            address = f"{NETWORK.rsplit('.', 1)[0]}.{at >> 8 & 255}.{at & 255}"
            servers.append(StaticServer(server_id, f"sim-token-{server_id}", address, index))
    return servers


def client_network(location: int) -> str:
    """The network of a topology scenario's resolvers in ``location`` (10.100.0.0/16...)."""
    return f"10.{100 + location}.0.0/16"


def client_address(location: int, number: int) -> str:
    """The address of resolver ``number``, in its location's :func:`client_network`."""
    return f"10.{100 + location}.{number >> 8 & 255}.{number & 255}"


def manager_config(scenario: Scenario) -> ManagerConfig:
    """The manager's configuration for ``scenario``: one zone, one pool, its provider."""
    dns = scenario.dns
    policy = dataclasses.replace(dns.policy, pause=dns.pause and dns.policy.pause)
    if dns.all_addresses:
        policy = dataclasses.replace(policy, k=MAX_K)
    topology = scenario.topology
    members: tuple[MemberConfig, ...] = ()
    networks: tuple[NetworkConfig, ...] = ()
    if topology is not None:
        names = [location.name for location in topology.locations]
        members = tuple(
            MemberConfig(
                id=server.id,
                address=server.address,
                token=Secret(server.token, "sim"),
                location=names[server.location],
            )
            for server in static_servers(scenario)
        )
        if topology.aware:
            networks = tuple(
                NetworkConfig(network=client_network(index), location=name)
                for index, name in enumerate(names)
            )
    pool = PoolConfig(
        name=POOL,
        zone=ZONE,
        policy=policy,
        members=members,
        networks=networks,
        provider=MemoryProviderConfig(
            type="memory", boot_time=scenario.servers.boot_delay, network=NETWORK
        ),
        scaling=scenario.scaling,
        lifecycle=LifecycleConfig(drain_timeout=scenario.manager.drain_timeout, adopt_unknown=True),
    )
    config = ManagerConfig(
        zones=(ZoneConfig(name=ZONE, ns=(f"ns1.{ZONE}",)),),
        pools=(pool,),
        plan=PlanConfig(stale_after=max(30.0, 10 * scenario.manager.tick)),
        state=StateConfig(path="state.db"),
        tick=scenario.manager.tick,
        down_after=scenario.manager.down_after,
    )
    return checked(config, "the simulated manager's configuration")


class Product:
    """The manager and a pipe backend of one simulated run (see the module's docstring)."""

    def __init__(self, scenario: Scenario, seed: int, workdir: Path) -> None:
        self._log_levels = quiet_logs()
        self.scenario = scenario
        self.workdir = workdir
        warmup = scenario.manager.warmup
        if warmup is None:
            warmup = scenario.dns.policy.slow_start + 5 * scenario.manager.tick
        self.warmup: float = warmup
        self.clock = FakeClock(start=BASE - self.warmup, wall_offset=WALL)
        self.loaded = LoadedConfig(
            config=manager_config(scenario), base=workdir, source="the simulated manager"
        )
        self.account = MemoryAccount()
        self.store = MemoryPlanStore(clock=self.clock.time)
        self.launched = 0
        initial = 0 if scenario.topology is not None else scenario.servers.initial  # members
        for number in range(initial):
            request = LaunchRequest(
                server_id=f"{POOL}-initial-{number + 1:05d}",
                pool=POOL,
                agent_token=f"sim-token-initial-{number + 1}",
                manager_url=self.loaded.config.http.url,
            )
            now = self.clock.monotonic()
            self.account.create(request, network=NETWORK, now=now, ready_at=now)
        self.manager = self._start_manager()
        self.backend = PipeBackend(
            self.store,
            rng=random.Random(f"dnslb-sim/{seed}/dns"),
            monotonic=self.clock.monotonic,
            wall=self.clock.time,
        )
        # ABI 3 when clients have locations: its queries carry the client's ECS subnet.
        self.abi = 3 if scenario.topology is not None else 1
        self.backend.handle(f"HELO\t{self.abi}".encode())
        self._seq = 0
        self.restarts = 0
        self.refused: Counter[str] = Counter()  # reports the manager refused, by reason

    def _start_manager(self) -> Manager:
        manager = Manager(
            self.loaded, clock=self.clock, publisher=self.store, server_ids=self._server_id
        )
        provider = self.provider_of(manager)
        provider.account = self.account  # the cloud outlives a manager process
        return manager

    def _server_id(self, pool: str) -> str:
        self.launched += 1
        return f"{pool}-{self.launched:05d}"

    @staticmethod
    def provider_of(manager: Manager) -> MemoryProvider:
        provider = manager.lifecycles[POOL].provider
        assert isinstance(provider, MemoryProvider)
        return provider

    @property
    def provider(self) -> MemoryProvider:
        return self.provider_of(self.manager)

    def time(self, monotonic: float) -> float:
        """Simulated seconds of a time on the manager's monotonic clock."""
        return monotonic - BASE

    # -- every tick -----------------------------------------------------------------------------

    async def tick(self, now: float, reports: Iterable[tuple[str, str, int, int, int]]) -> None:
        """At simulated second ``now``: the clock moves on (boots in progress go on), the agents'
        ``reports`` ``(server id, token, in progress, max concurrency, served)`` reach the
        manager's ingest, the manager ticks, and the pipe backend loads a new plan if any."""
        self.clock.advance(max(0.0, BASE + now - self.clock.now))
        await self._settle()
        ingest = self.manager.ingest
        wall = self.clock.time()
        for server_id, token, in_progress, capacity, served in reports:
            self._seq += 1
            body = json.dumps(
                {
                    "server_id": server_id,
                    "seq": self._seq,
                    "time": wall,
                    "in_progress": in_progress,
                    "max_concurrency": capacity,
                    "served_total": served,
                }
            ).encode()
            try:
                ingest.accept(token, body)
            except Rejected as refused:  # an agent tries again at its next report
                self.refused[refused.reason] += 1
        self.manager.tick()
        await self._settle()
        self.backend.poll()  # a new plan, or the one it has gone stale (a loader round)

    async def _settle(self) -> None:
        """Let the manager's tasks (launches, describes, terminations, reconciles) run until
        they wait on the clock."""
        await self.manager.settle()

    async def restart_manager(self) -> None:
        """The manager process dies and a new one starts from its state (same cloud account):
        launches under way are cut short, as a crash cuts them."""
        await self.manager.close()
        self.manager = self._start_manager()
        self.restarts += 1

    async def close(self) -> None:
        try:
            await self.manager.close()
        finally:
            for name, level in self._log_levels.items():
                logging.getLogger(name).setLevel(level)

    # -- DNS ------------------------------------------------------------------------------------

    def answer(self, client: str | None = None) -> tuple[list[str], int]:
        """One query for the pool's A records, answered by the pipe backend: the addresses in
        answer order and the answer's TTL (the least of its records'). ``client``: the
        resolver's address, sent as the remote and as the ECS subnet (its /24; ABI 3)."""
        if self.abi >= 3:
            remote = client or "192.0.2.1"
            subnet = remote.rsplit(".", 1)[0] + ".0/24"
            query = f"Q\t{POOL_NAME[:-1]}\tIN\tA\t-1\t{remote}\t192.0.2.53\t{subnet}".encode()
            ttl_field, content_field = 6, 8
        else:
            query, ttl_field, content_field = _QUERY, 4, 6
        reply = self.backend.handle(query)
        self.backend.requests += 1  # as its serve loop counts them: its counts are written
        addresses: list[str] = []
        ttl = 0
        for line in reply.split(b"\n"):
            if line.startswith(b"DATA\t"):
                fields = line.split(b"\t")
                record_ttl = int(fields[ttl_field])
                ttl = record_ttl if not addresses else min(ttl, record_ttl)
                addresses.append(fields[content_field].decode())
        return addresses, ttl

    # -- what the manager thinks ----------------------------------------------------------------

    def states(self) -> dict[str, tuple[ServerState, bool]]:
        """Each server's state and whether it is paused, as the manager has them."""
        return {
            server.id: (server.state, server.paused or server.record.admin_paused)
            for server in self.manager.fleet.servers.values()
        }
