"""The manager: one asyncio process that turns agent reports into published plans.

:class:`Manager` wires the parts together: the durable :class:`~manager.state.StateStore`, the
in-memory :class:`~manager.fleet.Fleet`, report ingest over HTTP, central health checks, and the
tick. Each tick (1 s by default, at once when a report shows a new overload) it

1. moves servers between states on what reports and checks say (each change an event),
2. runs the load policy (smoothed utilization, pause with hysteresis),
3. builds the plan and publishes it when its contents changed, or when it is due for a refresh
   of its age.

:meth:`Manager.tick` is synchronous and reads time only from the injected clock, so tests drive it
without sleeping. After a restart the manager does not publish until every server has reported
again or ``down_after`` has passed: it never publishes an all-healthy plan on old news.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeGuard

import httpx

from dnslb.asgi import ASGIApp
from dnslb.clock import Clock, SystemClock
from dnslb.config import parse_config, to_document
from dnslb.control import AdminAction, Conflict, NotFound
from dnslb.dnsname import normalize
from dnslb.errors import ConfigError, PlanError
from dnslb.model import ServerState
from dnslb.plan import Member, MemberState, Plan, Pool, PoolCache, normal_address, parse_plan_json
from dnslb.plan_store import FilePlanStore, PlanStore, open_store
from dnslb.policy import (
    ServerLoad,
    correct_shares,
    covering_k,
    covering_ttl_min,
    inferred_correction,
    judge_pause,
    pause_room,
    pause_threshold,
    update_load,
)
from dnslb.report import MAX_SERVED, Report
from dnslb.selection import FamilyKey, answers_key, answers_near
from dnslb.tls import client_context, server_context
from dnslb.tokens import token_hash
from manager.clusters import ClusterController, HttpTablePusher
from manager.config import LoadedConfig, MemberConfig, PoolConfig
from manager.fleet import Fleet, PoolRuntime, ServerRuntime
from manager.health import HealthChecker
from manager.history import HistoryRing, stored_cost
from manager.http import HttpLimits, HttpServer, ManagerApp, listen
from manager.ingest import ReportIngest
from manager.leadership import Leadership
from manager.lifecycle import PROPAGATION, PoolLifecycle
from manager.planner import build_plan, eligible, health_of, plan_zones
from manager.providers import ProviderContext, create_provider
from manager.state import PRUNE_CHUNK, PRUNE_INTERVAL, ServerRecord, StateStore, Store

log = logging.getLogger("dnslb.manager")

MAX_PLAN_VERSION = 2**62
"""Largest published version a manager numbers its plans from (plans carry up to 2^63-1)."""

_URGENT_SPACING = 0.1  # seconds: overload reports trigger ticks at most this often

_Mirrored = tuple[list[dict[str, Any]], list[ServerRecord], int]
"""What a standby reads back: pools made through the API, servers, the plan version."""


class Manager:
    """The manager process's state and main loop."""

    def __init__(
        self,
        loaded: LoadedConfig,
        *,
        clock: Clock | None = None,
        publisher: PlanStore | None = None,
        server_ids: Callable[[str], str] | None = None,
    ) -> None:
        """``server_ids`` names launched servers (pool name -> a new id; random by default)."""
        self.loaded = loaded
        self._server_ids = server_ids
        self.config = loaded.config
        self.clock = clock or SystemClock()
        self.zones = plan_zones(self.config.zones)
        self.leadership: Leadership | None = None  # None: alone on a SQLite file
        self.store: Store = self._open_store()
        # True once this manager has taken the lead over (its fleet rebuilt from the database);
        # acting (below) also needs the lease still valid.
        self._acting = self._first_round()
        self.publisher = publisher or _plan_store(loaded)
        self._checked_pools = PoolCache()  # the pools of the last plan checked (_plan_problem)
        self._answers_keys: dict[str, tuple[Pool, FamilyKey | None]] = {}  # see _hold_unmoved
        self.fleet = Fleet(self.store, self.config.auth.agent_token)
        self.health = HealthChecker(self.fleet)
        self.lifecycles: dict[str, PoolLifecycle] = {}
        self.pool_sources: dict[str, str] = {}  # pool -> "config" or "api"
        self._providers_dir = loaded.path(self.config.state.path).parent / "providers"
        for pool in self.config.pools:
            self._install_pool(pool, source="config")
        for document in self.store.load_pools():
            self._install_stored_pool(document)
        if self._acting:
            with self.store.batch():  # one transaction (PostgreSQL: one fence, not one a row)
                self._restore()
        else:
            self._mirror()
        self.clusters: dict[str, ClusterController] = {}
        cluster_nodes: dict[str, tuple[ClusterController, str]] = {}
        for cluster in self.config.clusters:
            controller = ClusterController(
                cluster.settings(),
                HttpTablePusher(
                    timeout=cluster.push_timeout, verify=client_context(cluster.ca_file)
                ),
                clock=self.clock.monotonic,
            )
            self.clusters[cluster.name] = controller
            for node in cluster.nodes:
                cluster_nodes[node.id] = (controller, token_hash(node.token.reveal()))
        self.cluster_members = {
            member.id: member.cluster
            for pool in self.config.pools
            for member in pool.members
            if member.cluster is not None
        }
        self._cluster_seq = int(self.clock.time() * 1000)
        self._cluster_events_logged: dict[str, float] = {}
        self.ingest = ReportIngest(
            self.fleet,
            self.clock.monotonic,
            on_overload=self._overload,
            cluster_nodes=cluster_nodes,
            seq_reset_after=self.config.down_after,
        )
        self.started_at = self.clock.monotonic()
        # The plan out there when this manager started or took over, by member: its weights
        # give back the share corrections it was made with (_inherit).
        self._inherited: dict[str, tuple[Member, float]] = {}
        # A manager whose state was lost restarts at the published plan's version, not at 1:
        # pipe backends refuse a version lower than the one they serve (within one epoch).
        self.version = max(int(self.store.get_meta("plan_version") or 0), self._published_version())
        self.plan: Plan | None = None  # the last plan published
        self.tick_errors = 0
        self.tick_seconds = 0.0
        self.part_errors: Counter[str] = Counter()  # parts of ticks that failed, by kind
        self._part_error_logged: dict[str, str] = {}
        self.plans_refused = 0  # plans the pipe backend's rules refused (none published)
        self.publish_errors = 0  # publications the plan store refused or did not answer
        self.store_up: bool | None = None  # the last publication succeeded; None: none tried
        self.plan_problem: str | None = None  # why the newest plan was not published
        self.members_left_out: dict[str, str] = {}  # server id -> why the plan left it out
        # The pipe backends' statistics as last read: (when, answer counts, answers held)
        self._stats: tuple[float, dict[str, tuple[int, int]], dict[str, dict[str, int]]] | None
        self._stats = None
        self._served: dict[str, float] = {}  # server id -> TTL + propagation in the plan served
        self._content: Plan | None = None
        self._published_at: float | None = None
        self._servers_pruned_at = -math.inf  # wall time of the last prune of old servers
        self._urgent = asyncio.Event()
        self.api: ASGIApp | None = None
        self.history = HistoryRing()  # the last hour, for the dashboard

    # -- pools ----------------------------------------------------------------------------------

    def _install_pool(self, pool: PoolConfig, *, source: str) -> None:
        """Start managing ``pool`` (its servers come from the store or are added after)."""
        self.fleet.add_pool(pool)
        self.pool_sources[pool.name] = source
        if pool.provider is not None:
            context = ProviderContext(
                pool=pool.name,
                state_dir=self._providers_dir / pool.name,
                manager_url=self.config.http.url,
                manager_urls=self.config.http.peer_urls,
                clock=self.clock,
                manager_ca_file=self.config.http.agent_ca_file,
                manager_allow_plaintext=self.config.http.allow_plaintext,
            )
            self.lifecycles[pool.name] = PoolLifecycle(
                pool=self.fleet.pools[pool.name],
                fleet=self.fleet,
                provider=create_provider(pool.provider, context),
                scaling=pool.scaling,
                config=pool.lifecycle,
                clock=self.clock,
                server_ids=self._server_ids,
                silent_after=self.config.down_after,
            )

    def _install_stored_pool(self, document: dict[str, object]) -> None:
        name = document.get("name")
        try:
            text = json.dumps(document, ensure_ascii=False)  # see Control._build
            pool = parse_config(
                text,
                PoolConfig,
                source=f"stored pool {name!r}",
                refuse_files=self.config.runtime_pools.refuse_files,
            )
        except ConfigError as exc:
            log.error("pool %r from the state database is invalid, skipped: %s", name, exc)
            return
        if pool.name in self.fleet.pools:
            log.error(
                "pool %r is in both the configuration file and the state database; the file's wins",
                pool.name,
            )
            return
        self._install_pool(pool, source="api")

    def check_new_pool(self, pool: PoolConfig, *, replacing: str | None = None) -> None:
        """Refuse a pool that does not fit beside the others (zone, name, server ids) or does
        what pools made through the API may not (``runtime_pools`` in the configuration)."""
        problems = []
        zones = {zone.name for zone in self.zones}
        if normalize(pool.zone) not in zones:
            problems.append(f"zone: {pool.zone!r} is not one of the configured zones")
        if pool.name in self.fleet.pools and pool.name != replacing:
            raise Conflict(f"pool {pool.name!r} exists")
        dns_names = {p.config.dns_name: n for n, p in self.fleet.pools.items() if n != replacing}
        if pool.dns_name in dns_names:
            problems.append(f"name: {pool.dns_name} is already pool {dns_names[pool.dns_name]!r}")
        for index, member in enumerate(pool.members):
            owner = self.fleet.servers.get(member.id)
            if owner is not None and owner.record.pool != replacing:
                problems.append(
                    f"members[{index}].id: {member.id!r} is a server of pool {owner.record.pool!r}"
                )
        problems += self.config.runtime_pools.pool_problems(pool)
        if problems:
            raise ConfigError("invalid pool", problems)

    def add_pool(self, pool: PoolConfig) -> None:
        """Create a pool at runtime (persisted; in the next plan)."""
        self.check_new_pool(pool)
        now = self.clock.time()
        with self.store.batch():
            self.store.save_pool(pool.name, to_document(pool), now)
            self._install_pool(pool, source="api")
            for member in pool.members:
                self.fleet.add_server(
                    _static_record(pool, member, now), event="static member added", now=now
                )
            self.fleet.log(now, "pool_created", f"pool {pool.dns_name} created", pool=pool.name)
        self.health.start_pool(self.fleet.pools[pool.name])

    async def replace_pool(self, pool: PoolConfig) -> None:
        """Change a runtime pool: policy, scaling and checks apply at once; members are diffed."""
        old = self._runtime_pool(pool.name)
        if (old.config.provider is None) != (pool.provider is None) or (
            old.config.provider is not None
            and pool.provider is not None
            and old.config.provider.type != pool.provider.type
        ):
            raise Conflict("a pool's provider cannot change; create a new pool")
        self.check_new_pool(pool, replacing=pool.name)
        now = self.clock.time()
        with self.store.batch():
            self.store.save_pool(pool.name, to_document(pool), now)
            old.config = pool
            lifecycle = self.lifecycles.get(pool.name)
            if lifecycle is not None:
                lifecycle.scaling = pool.scaling
                lifecycle.config = pool.lifecycle
            wanted = {member.id: member for member in pool.members}
            for server in list(old.servers.values()):
                if server.record.origin == "static" and server.id not in wanted:
                    self._retire(server, "removed from the pool", now)
            for member in pool.members:
                record = _static_record(pool, member, now)
                existing = self.fleet.servers.get(member.id)
                if existing is None:
                    self.fleet.add_server(record, event="static member added", now=now)
                    continue
                changes = {
                    key: getattr(record, key)
                    for key in ("address", "check_address", "max_concurrency", "token_hash")
                    if getattr(record, key) != getattr(existing.record, key)
                }
                if changes:
                    self.fleet.update(existing, **changes)
            self.fleet.log(now, "pool_updated", "pool configuration changed", pool=pool.name)
        await self.health.stop_pool(pool.name)
        self.health.start_pool(old)

    async def remove_pool(self, name: str) -> None:
        """Delete a runtime pool: out of the plan now; launched servers are terminated."""
        pool = self._runtime_pool(name)
        now = self.clock.time()
        await self.health.stop_pool(name)
        lifecycle = self.lifecycles.pop(name, None)
        with self.store.batch():
            for server in list(pool.servers.values()):
                self._retire(server, "pool deleted", now)
        if lifecycle is not None:
            await lifecycle.terminate_all("pool deleted")
            await lifecycle.close()
        with self.store.batch():
            del self.fleet.pools[name]
            del self.pool_sources[name]
            self.store.delete_pool(name)
            self.fleet.log(now, "pool_deleted", "pool deleted", pool=name)

    def _runtime_pool(self, name: str) -> PoolRuntime:
        pool = self.fleet.pools.get(name)
        if pool is None:
            raise NotFound(f"no pool {name!r}")
        if self.pool_sources[name] == "config":
            raise Conflict(f"pool {name!r} is defined in {self.loaded.source}; change it there")
        return pool

    def _retire(self, server: ServerRuntime, why: str, now: float) -> None:
        """A static server leaves for good (a launched one is left to its lifecycle)."""
        if server.record.origin != "static":
            return
        self.fleet.transition(server, ServerState.TERMINATED, why, now=now)
        self.fleet.forget(server)

    # -- operators ------------------------------------------------------------------------------

    def admin(self, server_id: str, action: AdminAction, reason: str) -> ServerRuntime:
        """Carry out an operator's action on a server; it wins over the policy until cleared."""
        server = self.fleet.servers.get(server_id)
        if server is None:
            raise NotFound(f"no server {server_id!r}")
        now = self.clock.time()
        why = f"operator: {reason}" if reason else "operator"
        state = server.state
        if action in (AdminAction.PAUSE, AdminAction.RESUME):
            paused = action is AdminAction.PAUSE
            if server.record.admin_paused != paused:
                self.fleet.update(server, admin_paused=paused)
                self.fleet.log(
                    now, f"admin_{action.value}", why, pool=server.record.pool, server=server.id
                )
        elif action is AdminAction.DISABLE:
            if state is ServerState.LAUNCHING:
                raise Conflict(f"{server_id} is still launching; drain it once it runs")
            self.fleet.transition(server, ServerState.DISABLED, why, now=now)
        elif action is AdminAction.ENABLE:
            if state not in (ServerState.DISABLED, ServerState.DRAINING):
                raise Conflict(f"{server_id} is {state.value}, not disabled or drained")
            lifecycle = self.lifecycles.get(server.record.pool)
            if (
                state is ServerState.DRAINING
                and lifecycle is not None
                and server.record.origin != "static"
            ):
                raise Conflict(f"{server_id} is draining to be terminated; launch another instead")
            self.fleet.transition(
                server, ServerState.WARMING, f"{why}; waiting for a healthy report", now=now
            )
        elif action is AdminAction.DRAIN:
            if state in (ServerState.DRAINING, ServerState.LAUNCHING):
                raise Conflict(f"{server_id} is {state.value}")
            lifecycle = self.lifecycles.get(server.record.pool)
            if lifecycle is not None and server.record.origin != "static":
                lifecycle.drain(server, why, now)
            else:
                self.fleet.transition(server, ServerState.DRAINING, why, now=now)
        return server

    async def add_member(self, pool_name: str, member: MemberConfig) -> ServerRuntime:
        pool = self._runtime_pool(pool_name)
        await self.replace_pool(
            dataclasses.replace(pool.config, members=(*pool.config.members, member))
        )
        return self.fleet.servers[member.id]

    async def remove_member(self, server_id: str) -> None:
        server = self.fleet.servers.get(server_id)
        if server is None:
            raise NotFound(f"no server {server_id!r}")
        pool = self._runtime_pool(server.record.pool)
        if server.record.origin != "static":
            raise Conflict(f"{server_id} was launched by the provider; drain it instead")
        members = tuple(m for m in pool.config.members if m.id != server_id)
        await self.replace_pool(dataclasses.replace(pool.config, members=members))

    # -- start-up -----------------------------------------------------------------------------

    def _restore(self) -> None:
        """Read servers back from the store and line static members up with the pools."""
        now = self.clock.time()
        stored = {record.id: record for record in self.store.load_servers()}
        for pool in [runtime.config for runtime in self.fleet.pools.values()]:
            for member in pool.members:
                record = stored.pop(member.id, None)
                wanted = _static_record(pool, member, now)
                if record is None:
                    self.fleet.add_server(wanted, event="static member configured", now=now)
                    continue
                if record.state is ServerState.TERMINATED or record.pool != pool.name:
                    record = dataclasses.replace(wanted, created_at=record.created_at)
                    self.fleet.add_server(record, event="static member (re)configured", now=now)
                    continue
                runtime = self.fleet.adopt(record)
                changes = {
                    key: getattr(wanted, key)
                    for key in ("address", "check_address", "max_concurrency", "token_hash")
                    if getattr(wanted, key) != getattr(record, key)
                }
                if changes:
                    self.fleet.update(runtime, **changes)
        for record in stored.values():
            if record.state is ServerState.TERMINATED:
                continue
            if record.origin == "static" or record.pool not in self.fleet.pools:
                runtime = self.fleet.adopt(record)
                self.fleet.transition(
                    runtime, ServerState.TERMINATED, "no longer in the configuration", now=now
                )
                self.fleet.forget(runtime)
            else:
                self.fleet.adopt(record)

    def _published_version(self) -> int:
        """The version of the plan in the plan store now, 0 when there is none readable (a
        version too close to the largest a plan may carry is not taken: it cannot grow). Its
        members' weights are kept to read share corrections back from (:meth:`_inherit`)."""
        self._inherited = {}
        try:
            if self.publisher.stamp() is None:
                return 0
            published = self.publisher.read()
        except (PlanError, OSError) as exc:
            log.warning("cannot read the published plan at %s: %s", self.publisher.describe(), exc)
            return 0
        version = published.version
        generated_at = published.generated_at
        if generated_at is not None:
            self._inherited = {
                member.id: (member, generated_at)
                for pool in published.pools
                for member in pool.members
                if member.state is MemberState.ACTIVE
            }
        if version > MAX_PLAN_VERSION:
            log.warning(
                "the published plan's version %d is beyond %d: numbering plans from the stored one",
                version,
                MAX_PLAN_VERSION,
            )
            return 0
        return version

    # -- leadership (state in PostgreSQL) -------------------------------------------------------

    def _open_store(self) -> Store:
        """SQLite at ``state.path``; or, with ``state.url``, PostgreSQL and the leadership lease
        (every write of this manager fenced by its epoch: docs/high-availability.md)."""
        state = self.config.state
        if state.url is None:
            return StateStore(
                self.loaded.path(state.path),
                events_max_age=state.events_max_age,
                events_max_rows=state.events_max_rows,
            )
        try:
            from manager import postgres  # noqa: PLC0415 (psycopg: only with the postgres extra)
        except ModuleNotFoundError as exc:
            if exc.name != "psycopg":
                raise
            raise ConfigError(
                self.loaded.source,
                ["state.url: PostgreSQL needs the postgres extra: pip install 'dnslb[postgres]'"],
            ) from None

        url = state.url
        password = state.password.reveal() if state.password is not None else None
        ca_file = str(self.loaded.path(state.ssl_ca_file)) if state.ssl_ca_file else None

        def connect() -> Any:
            return postgres.connect(
                url, password=password, sslmode=state.sslmode, sslrootcert=ca_file
            )

        self.leadership = Leadership(connect, url=self.config.http.url, settings=state.leadership)
        try:
            return postgres.PostgresStateStore(
                connect,
                fence=self.leadership.fence,
                events_max_age=state.events_max_age,
                events_max_rows=state.events_max_rows,
            )
        except postgres.DatabaseError as exc:  # one clear line (systemd starts it again)
            detail = " ".join(str(exc).split())[:300]
            raise ConfigError(self.loaded.source, [f"state.url: PostgreSQL: {detail}"]) from None

    def _first_round(self) -> bool:
        """Whether this manager leads as it starts (alone on SQLite: it does)."""
        return self.leadership is None or self.leadership.step()

    @property
    def acting(self) -> bool:
        """True while this manager may publish, launch, drain and push: it is alone (SQLite), or
        it has taken the lead over and its lease is still valid on its own clock."""
        return self._acting and (self.leadership is None or self.leadership.leading())

    @property
    def epoch(self) -> int:
        """The leadership epoch this manager acts in (0: none)."""
        if self.leadership is None or not self.acting:
            return 0
        return self.leadership.epoch or 0

    def leader_url(self) -> tuple[bool, str | None]:
        """(True while a standby, the leader's advertised URL when known): where the HTTP layer
        redirects reports and API writes."""
        if self.leadership is None or self.acting:
            return False, None
        leader = self.leadership.leader
        if leader is None or leader.holder == self.leadership.holder:
            return True, None
        return True, leader.url

    def _mirror(self, found: _Mirrored | None = None) -> None:
        """A standby's warm state: pools made through the API and every server, as the
        database has them now (``found``: read already, in a thread). Reads only: a standby
        writes nothing."""
        documents, records, version = found if found is not None else self._read_mirror()
        for document in documents:
            name = document.get("name")
            if isinstance(name, str) and name not in self.fleet.pools:
                self._install_stored_pool(document)
        self.fleet.servers.clear()
        for pool in self.fleet.pools.values():
            pool.servers.clear()
        for record in records:
            if record.state is not ServerState.TERMINATED:
                self.fleet.adopt(record)
        self.version = version

    def _read_mirror(self) -> _Mirrored:
        version = self.store.get_meta("plan_version") or "0"
        return self.store.load_pools(), self.store.load_servers(), int(version)

    async def _lead(self, stop: asyncio.Event) -> None:
        """Renew or acquire the lease every ``renew`` seconds (in a thread: a slow database
        must not stall the loop); take the lead over or step down when the role changes; keep
        a standby's state warm."""
        assert self.leadership is not None
        leadership = self.leadership
        while not stop.is_set():
            leading = await asyncio.to_thread(leadership.step)
            try:
                if leading and not self._acting:
                    await self._take_over()
                elif not leading and self._acting:
                    await self._step_down()
                elif not self._acting:  # read in a thread: a slow database must not stall HTTP
                    self._mirror(await asyncio.to_thread(self._read_mirror))
            except Exception:  # the database went away in the middle: next round
                log.exception("leadership round failed; carrying on")
            await _wait_any(stop, timeout=leadership.settings.renew)

    async def _take_over(self) -> None:
        """Lead: rebuild the fleet from the database as a restarted manager does (so the
        start-up wait for reports applies again), and reconcile providers at once (a launch
        cut short by the old leader is resumed by its server id, never launched twice)."""
        assert self.leadership is not None
        log.warning("taking the lead over (epoch %s)", self.leadership.epoch)
        await self._drop_fleet()
        with self.store.batch():
            for pool in self.config.pools:
                self._install_pool(pool, source="config")
            for document in self.store.load_pools():
                self._install_stored_pool(document)
            self._restore()
            stored = int(self.store.get_meta("plan_version") or 0)
        # numbered on from the plan out there too (a deposed leader may have published one
        # whose version its fenced write could not store)
        self.version = max(stored, self._published_version())
        self.started_at = self.clock.monotonic()
        self.plan = None
        self._content = None
        self._published_at = None
        self._acting = True
        self.health.start()

    async def _step_down(self) -> None:
        """Stop acting at once: no more ticks, launches or pushes; the fleet becomes a mirror
        of the database. Servers keep running (the new leader owns them now)."""
        log.warning("stepping down: another manager leads, or the database is unreachable")
        self._acting = False
        await self._drop_fleet()
        for pool in self.config.pools:
            self._install_pool(pool, source="config")
        with contextlib.suppress(Exception):  # the database may be the reason: mirrored later
            self._mirror(await asyncio.to_thread(self._read_mirror))

    async def _drop_fleet(self) -> None:
        """Forget the in-memory fleet and stop its background work, leaving servers running."""
        await self.health.stop()
        for lifecycle in self.lifecycles.values():
            await _quiesce(lifecycle)
        self.lifecycles.clear()
        self.pool_sources.clear()
        self.fleet.pools.clear()
        self.fleet.servers.clear()

    # -- the tick -----------------------------------------------------------------------------

    def tick(self) -> Plan | None:
        """Assess every server, then publish the plan if it changed or is due; returns it then.
        A standby does nothing (see :attr:`acting`)."""
        if not self.acting:
            return None
        now = self.clock.monotonic()
        wall = self.clock.time()
        with self.store.batch():
            self._isolated("clusters", "cluster load", self._feed_clusters, now, wall)
            for pool in self.fleet.pools.values():
                self._isolated(f"pool {pool.name}", "capacity", pool.bound_capacities)
                self._assess_each(pool, now, wall)
                pool.mean_utilization, pool.serving, unpaused = _pool_load(
                    pool, now, self.config.down_after
                )
                self._isolated(
                    f"pool {pool.name}", "pausing", self._judge, pool, unpaused, now, wall
                )
                if pool.policy.corrects_shares:
                    self._isolated(
                        f"pool {pool.name}", "shares", self._correct_shares, pool, now, wall
                    )
            self._isolated("pools", "answers held", self._count_holders, now)
            for name, lifecycle in self.lifecycles.items():
                self._isolated(f"pool {name}", "lifecycle", lifecycle.tick, now, wall)
            plan = self._publish(now, wall)
            self._isolated(
                "history",
                "history",
                self.history.observe,
                wall,
                self.fleet.pools.values(),
                self.plan,
                stored_cost(self.store, wall),
            )
        if not wall - PRUNE_INTERVAL < self._servers_pruned_at <= wall:
            self._servers_pruned_at = wall
            self._isolated("state", "retention", self._prune_servers, wall)
        return plan

    def _prune_servers(self, wall: float) -> None:
        """Delete the records of servers terminated over ``servers_max_age`` ago, a chunk at a
        time (:meth:`~manager.state.Store.prune_servers`); a store far behind catches up at the
        next ticks."""
        before = wall - self.config.state.servers_max_age
        if self.store.prune_servers(before) >= PRUNE_CHUNK:
            self._servers_pruned_at = -math.inf  # more to go: again at the next tick

    def _isolated(self, key: str, what: str, step: Callable[..., object], *args: object) -> None:
        """Run one part of a tick; a failure is counted and logged once per part and message,
        and the rest of the tick goes on: one server's bad data fails only that server."""
        try:
            step(*args)
        except Exception as exc:
            self._part_failed(key, what, exc)
        else:
            self._part_error_logged.pop(key, None)

    def _part_failed(self, key: str, what: str, exc: Exception) -> None:
        """Count a part's failure and log it, once per part and message (in the ``except``)."""
        self.part_errors[what] += 1
        message = f"{type(exc).__name__}: {exc}"[:300]
        if self._part_error_logged.get(key) != message:
            self._part_error_logged[key] = message
            log.exception("%s %s failed this tick (logged once); carrying on", what, key)

    def _assess_each(self, pool: PoolRuntime, now: float, wall: float) -> None:
        """:meth:`_assess` every server of ``pool``, each isolated as :meth:`_isolated` does
        (written out here: it runs for every server at every tick)."""
        logged = self._part_error_logged
        for server in list(pool.servers.values()):
            try:
                self._assess(pool, server, now, wall)
            except Exception as exc:
                self._part_failed(server.id, "server", exc)
            else:
                if logged:
                    logged.pop(server.id, None)

    def _feed_clusters(self, now: float, wall: float) -> None:
        """A cluster member's load is its live nodes' load: reported for it, as its agent would."""
        self._cluster_seq += 1
        for member_id, cluster_name in self.cluster_members.items():
            server = self.fleet.servers.get(member_id)
            controller = self.clusters[cluster_name]
            if server is None:
                continue
            load = controller.load(now)
            server.report = Report(
                server_id=member_id,
                seq=self._cluster_seq,
                time=wall,
                in_progress=load[0] if load else None,
                max_concurrency=load[1] if load else None,
                error=None if load else f"no node of cluster {cluster_name} is alive",
            )
            server.report_at = now
        for name, controller in self.clusters.items():
            logged = self._cluster_events_logged.get(name, float("-inf"))
            for event in controller.events:
                if event.at > logged:
                    self.fleet.log(wall, "cluster", f"{name}: {event.what}: {event.why}")
                    self._cluster_events_logged[name] = event.at

    async def _run_clusters(self, stop: asyncio.Event) -> None:
        """Cluster controllers decide every ``tick`` of theirs (tens of ms: failover speed)."""
        interval = min(cluster.tick for cluster in self.config.clusters)
        while not stop.is_set():
            for controller in self.clusters.values() if self.acting else ():
                try:
                    await controller.tick()
                except Exception:  # one bad tick must not stop failover for good; logged
                    log.exception("cluster %s tick failed", controller.settings.name)
            await _wait_any(stop, timeout=interval)

    def _assess(self, pool: PoolRuntime, server: ServerRuntime, now: float, wall: float) -> None:
        report = server.report
        report_at = server.report_at
        state = server.record.state
        checked = pool.config.health_check is not None
        steady = (  # the common case, kept cheap: an active server reporting fine
            state is ServerState.ACTIVE
            and report is not None
            and report_at is not None
            and now - report_at <= self.config.down_after
            and not report.error
            and not checked
        )
        if not steady:
            healthy, reason = health_of(
                server,
                now=now,
                down_after=self.config.down_after,
                started_at=self.started_at,
                checked=checked,
            )
            if healthy is True and state in (ServerState.WARMING, ServerState.DOWN):
                self.fleet.transition(server, ServerState.ACTIVE, reason, now=wall)
            elif healthy is False and state is ServerState.ACTIVE:
                self.fleet.transition(server, ServerState.DOWN, reason, now=wall)
        if report is not None and report_at is not None and report.seq != server.folded_seq:
            if report.in_progress is not None and report.max_concurrency:
                utilization = report.in_progress / report.max_concurrency
                server.load = update_load(server.load, utilization, report_at, pool.policy)
            server.folded_seq = report.seq

    def _judge(self, pool: PoolRuntime, unpaused: int, now: float, wall: float) -> None:
        """Pause or resume the pool's servers for their loads against the pool's (after every
        one's :meth:`_assess`): one threshold for the pool, a comparison per server; each
        pause leaves one server fewer to take the pool's load (``unpaused``)."""
        policy = pool.policy
        threshold = pause_threshold(policy, pool.mean_utilization)
        pool_load = (pool.mean_utilization or 0.0) * pool.serving
        for server in pool.servers.values():
            load = server.load
            if load is not None and (
                load.paused or load.sample > threshold or load.utilization > threshold
            ):  # the verdict can change (the common case, below and unpaused, cannot)
                was_paused = load.paused
                room = pause_room(policy, pool_load, unpaused)
                server.load = load = judge_pause(load, policy, threshold, now, room=room)
                if load.paused and not was_paused:
                    unpaused -= 1
            paused = load.paused if load is not None else False
            if paused != server.paused:
                if server.state is ServerState.ACTIVE and load is not None:
                    self._log_pause(pool, server, load, threshold, wall)
                server.paused = paused
        pool.pause_room = pause_room(policy, pool_load, unpaused)

    def _correct_shares(self, pool: PoolRuntime, now: float, wall: float) -> None:
        """Move the share corrections of the pool's answered servers (those past their slow
        start: a server ramping up is meant to be below the mean) by how far each one's load is
        from the others' (:func:`~dnslb.policy.correct_shares`). A paused server keeps its
        correction (it comes back with it); one that leaves the answers otherwise (down,
        draining) starts again from none."""
        elapsed = now - pool.shares_at if pool.shares_at is not None else 0.0
        pool.shares_at = now
        slow_start = pool.policy.slow_start
        answered: list[ServerRuntime] = []
        for server in pool.servers.values():
            load = server.load
            if load is None or server.state is not ServerState.ACTIVE:
                server.share = 0.0
            elif eligible(server, now=now, down_after=self.config.down_after):
                serving_since = server.record.serving_since
                if serving_since is None or wall - serving_since < slow_start:
                    server.share = 0.0
                else:
                    answered.append(server)
        if self._inherited:
            self._inherit(pool, answered)
        corrections = correct_shares(
            [server.share for server in answered],
            [server.load.utilization if server.load else 0.0 for server in answered],
            elapsed,
            pool.policy,
        )
        for server, correction in zip(answered, corrections, strict=True):
            server.share = correction

    def _inherit(self, pool: PoolRuntime, answered: list[ServerRuntime]) -> None:
        """Read the share corrections of ``pool``'s answered servers back from the plan
        published before this manager started or took over
        (:func:`~dnslb.policy.inferred_correction`): the pool keeps
        its balance through a failover or a restart instead of learning it again. Each server's
        is taken when it is first answered, until this manager publishes its own first plan."""
        for server in answered:
            found = self._inherited.pop(server.id, None)
            serving_since = server.record.serving_since
            if found is None or serving_since is None:
                continue
            member, generated_at = found
            correction = inferred_correction(
                member.weight,
                member.utilization,
                server.max_concurrency or 1,
                generated_at - serving_since,
                pool.policy,
            )
            if correction is not None:
                server.share = correction

    def _log_pause(
        self,
        pool: PoolRuntime,
        server: ServerRuntime,
        load: ServerLoad,
        threshold: float,
        wall: float,
    ) -> None:
        policy = pool.policy
        if load.paused:
            why = f"utilization {max(load.sample, load.utilization):.2f} > {threshold:.2f}" + (
                f" (th_over {policy.th_over:g})"
                if threshold == policy.th_over
                else f" ({policy.pause_relative:g} x the pool's mean)"
            )
        elif math.isinf(threshold):
            why = (
                f"the pool's mean utilization {pool.mean_utilization:.2f} is at th_over "
                f"{policy.th_over:g}: a hot pool has no room to move clients to"
            )
        else:
            why = f"utilization {load.utilization:.2f} < {threshold - policy.hysteresis:.2f}"
        self.fleet.log(
            wall, "paused" if load.paused else "resumed", why, pool=pool.name, server=server.id
        )

    def ready(self) -> bool:
        """True once the manager publishes plans (after the start-up wait)."""
        return self.plan is not None

    def _startup_done(self, now: float) -> bool:
        """Every server that can report has reported since the start, or ``down_after`` has
        passed; once a plan is out, for good (a launch made since must not stop publishing)."""
        if self.plan is not None or now - self.started_at >= self.config.down_after:
            return True
        return all(
            server.report_at is not None
            for server in self.fleet.servers.values()
            if server.state not in (ServerState.TERMINATED, ServerState.LAUNCHING)
        )

    def _publish(self, now: float, wall: float) -> Plan | None:
        if not self._startup_done(now):
            return None
        self._note_draining(wall)
        left_out: dict[str, str] = {}
        content = build_plan(
            self.zones,
            self.fleet.pools.values(),
            version=0,
            generated_at=None,
            stale_after=None,
            now=now,
            wall=wall,
            down_after=self.config.down_after,
            left_out=left_out,
        )
        self._note_left_out(left_out, wall)
        content = self._hold_unmoved(content)
        changed = content != self._content
        due = self._published_at is None or now - self._published_at >= self.config.plan.refresh
        if not changed and not due:
            return None
        version = self.version + 1 if changed else self.version
        serial = version % 2**32
        plan = dataclasses.replace(
            content,
            version=version,
            epoch=self.epoch,  # pipe backends refuse plans of an older epoch
            generated_at=wall,
            stale_after=self.config.plan.stale_after,
            zones=tuple(
                dataclasses.replace(zone, soa=dataclasses.replace(zone.soa, serial=serial))
                for zone in content.zones
            ),
        )
        problem = self._plan_problem(plan)
        if problem is not None:
            self.plans_refused += 1
            if problem != self.plan_problem:
                log.error(
                    "plan v%d not published, the pipe backend would refuse it: %s", version, problem
                )
                self.fleet.log(wall, "plan_refused", f"plan v{version} not published: {problem}")
            self.plan_problem = problem
            return None
        try:
            self.publisher.open_stats()  # where the pipe backends write their answer counts
            self.publisher.publish(plan)
        except OSError as exc:
            self.publish_errors += 1
            if self.store_up is not False:  # once per outage, not every tick of it
                log.error(
                    "cannot publish plan v%d to %s: %s (logged once until it works again; "
                    "DNS answers from the last plan it loaded)",
                    plan.version,
                    self.publisher.describe(),
                    exc,
                )
            self.store_up = False
            return None
        if self.store_up is False:
            log.warning(
                "plan v%d published to %s again (%d failed publications since the start)",
                plan.version,
                self.publisher.describe(),
                self.publish_errors,
            )
        self.store_up = True
        if self.plan_problem is not None:
            self.fleet.log(wall, "plan_refused", f"plan v{version} published again")
            self.plan_problem = None
        if changed:
            self.version = version
            self.store.set_meta("plan_version", str(version))
        self._content = content
        self._published_at = now
        self.plan = plan
        self._inherited = {}  # its own plan is out: what the last one said is past
        self._note_answers(plan, wall)
        return plan

    def _hold_unmoved(self, content: Plan) -> Plan:
        """``content`` with each pool that answers as the last published one does
        (:func:`~dnslb.selection.answers_key`: the published pools' keys are kept) replaced
        by that one.

        Weights and utilizations follow every report, so at fleet scale every member moved a
        little at every tick, while the answers, which follow a weight only as its slots in the
        cycle, mostly did not: a pool is published again only when its answers change, and the
        pipe backends then neither read nor compile it again (nor does the check below). The
        plan holds that pool's weights and utilizations as last published. With the pool's
        ``hold_within`` above 0, a pool whose members kept their states and whose weights and
        TTLs stayed that near the published ones is held too
        (:func:`~dnslb.selection.answers_near`)."""
        if self._content is None:
            return content
        published = {pool.name: pool for pool in self._content.pools}
        holds = {
            runtime.config.dns_name: runtime.policy.hold_within
            for runtime in self.fleet.pools.values()
            if runtime.config.answers_for is None
        }
        keys: dict[str, tuple[Pool, FamilyKey | None]] = {}
        pools = []
        for pool in content.pools:
            old = published.get(pool.name)
            chosen = pool
            if old is not None and old == pool:
                chosen = old  # the published object: its text is known downstream
            elif old is not None and answers_near(pool, old, holds.get(pool.name, 0.0)):
                chosen = old  # near enough to the published answers (hold_within): held
            elif old is not None:
                key = answers_key(pool)
                if key is not None and key == self._published_key(old):
                    chosen = old  # answers as published: held
                else:
                    keys[pool.name] = (pool, key)
            if chosen is old and pool.name in self._answers_keys:
                keys[pool.name] = self._answers_keys[pool.name]
            pools.append(chosen)
        self._answers_keys = keys  # the keys of the pools just planned, where known
        return dataclasses.replace(content, pools=tuple(pools))

    def _published_key(self, published: Pool) -> FamilyKey | None:
        """:func:`~dnslb.selection.answers_key` of a pool of the last published plan, computed
        once per pool object."""
        cached = self._answers_keys.get(published.name)
        if cached is not None and cached[0] is published:
            return cached[1]
        key = answers_key(published)
        self._answers_keys[published.name] = (published, key)
        return key

    def _plan_problem(self, plan: Plan) -> str | None:
        """Why a pipe backend would refuse ``plan``, checked with its own reader: the JSON text
        parsed by :func:`~dnslb.plan.parse_plan_json` and read back equal. None when it would
        serve it. (Computing the answers of a plan the parser accepts cannot fail: the
        ``plan`` and ``pipe-protocol`` fuzz harnesses hold that, and a pipe backend that met
        such a plan would keep its last good one.)"""
        text = self.publisher.encode(plan)  # kept: published as checked, serialized once
        limit = self.publisher.max_plan_bytes
        if len(text) > limit:
            return f"the plan is larger than the store's limit of {limit} bytes"
        try:
            # Pools whose text the last good plan had were checked then (as a pipe backend
            # reads them: PoolCache compares the text itself, trusting nothing).
            parsed = parse_plan_json(text, cache=self._checked_pools)
        except PlanError as exc:
            return "; ".join(exc.problems[:5])
        except ValueError as exc:  # not even JSON (a NaN would be caught here)
            return str(exc)
        if parsed != plan:
            return "the plan does not read back as it was written"
        return None

    def _note_left_out(self, left_out: dict[str, str], wall: float) -> None:
        """An event when a server is left out of plans for bad data, and when it is back."""
        for server_id, why in left_out.items():
            if self.members_left_out.get(server_id) != why:
                server = self.fleet.servers.get(server_id)
                self.fleet.log(
                    wall,
                    "left_out",
                    f"left out of the plan: {why}",
                    pool=server.record.pool if server else None,
                    server=server_id if server else None,
                )
        for server_id in self.members_left_out.keys() - left_out.keys():
            server = self.fleet.servers.get(server_id)
            if server is not None:
                self.fleet.log(
                    wall, "left_out", "back in the plan", pool=server.record.pool, server=server_id
                )
        self.members_left_out = left_out

    def _note_answers(self, plan: Plan, wall: float) -> None:
        """Remember until when each server may be in resolvers' caches (drains wait for it)."""
        served: dict[str, float] = {}
        for pool in plan.pools:
            for member in pool.members:
                if member.state in (MemberState.DRAINING, MemberState.DISABLED):
                    continue
                server = self.fleet.servers.get(member.id)
                if server is None:
                    continue
                ttl = max(member.ttl, pool.ttl_floor) + PROPAGATION
                served[member.id] = ttl
                until = wall + ttl
                if server.answered_until is None or until > server.answered_until:
                    server.answered_until = until
        self._served = served

    def _note_draining(self, wall: float) -> None:
        """The plan in service is handed out until a newer one replaces it: unchanged for a
        while, refused, or with the plan store down (the pipe backends keep it). A draining
        server it still answers may be in caches until then plus its TTL. (Found by the
        simulator's fault suite: drains ended on the last publication's TTLs while the store was
        down and DNS still answered the drained server.)"""
        if not self._served:
            return
        for server in self.fleet.servers.values():
            if server.state is ServerState.DRAINING:
                ttl = self._served.get(server.id)
                if ttl is not None:
                    until = wall + ttl
                    if server.answered_until is None or until > server.answered_until:
                        server.answered_until = until

    def answer_counts(self) -> dict[str, tuple[int, int]]:
        """Per server id: (answers it came first in, answers it was in), summed over every pipe
        backend that reported counts (read at most once a second)."""
        return self._read_stats()[1]

    def answers_held(self) -> dict[str, dict[str, int]]:
        """Per pool DNS name and address family (``A``, ``AAAA``): the seconds of answers
        given, their TTLs added up, summed over every pipe backend (read at most once a
        second)."""
        return self._read_stats()[2]

    def _read_stats(
        self,
    ) -> tuple[float, dict[str, tuple[int, int]], dict[str, dict[str, int]]]:
        now = self.clock.monotonic()
        if self._stats is not None and now - self._stats[0] < 1.0:
            return self._stats
        totals: dict[str, tuple[int, int]] = {}
        held: dict[str, dict[str, int]] = {}
        names = self._dns_names
        for document in self.publisher.read_stats():
            # Stats documents are written by pipe backends beside the plan: anything that is
            # not a pair of sane counts is skipped, never summed.
            pools = document.get("pools")
            if isinstance(pools, dict):
                for members in pools.values():
                    if isinstance(members, dict):
                        for member, pair in members.items():
                            if _counts(pair):
                                first, seen = totals.get(member, (0, 0))
                                totals[member] = (
                                    min(first + pair[0], MAX_SERVED),
                                    min(seen + pair[1], MAX_SERVED),
                                )
            by_pool = document.get("held")
            if isinstance(by_pool, dict):
                for pool, families in by_pool.items():
                    if isinstance(families, dict) and pool in names:
                        pool_held = held.setdefault(pool, {})
                        for family in ("A", "AAAA"):
                            pair = families.get(family)
                            if _counts(pair):
                                pool_held[family] = min(
                                    pool_held.get(family, 0) + pair[1], MAX_SERVED
                                )
        self._stats = (now, totals, held)
        return self._stats

    @property
    def _dns_names(self) -> set[str]:
        """The DNS names of the pools managed (what stats documents are keyed by)."""
        return {pool.config.dns_name for pool in self.fleet.pools.values()}

    def _count_holders(self, now: float) -> None:
        """How many resolvers hold each pool's answers, and the k and TTL floor of its answers
        for that: the servers of every pool answering at its name count (``answers_for``)."""
        held = self.answers_held()
        serving: Counter[str] = Counter()
        for pool in self.fleet.pools.values():
            serving[pool.config.dns_name] += pool.serving
        for pool in self.fleet.pools.values():
            name = pool.config.dns_name
            pool.held.observe(now, held.get(name, {}))
            holders = pool.held.holders()
            pool.answer_k = covering_k(pool.policy, serving[name], holders)
            pool.answer_ttl_min = covering_ttl_min(pool.policy, serving[name], holders)

    async def close(self) -> None:
        """Stop background work and close the state database (what shutdown does). A standby
        leaves the servers to the leader; a leader gives its lease up. A leader whose provider
        stops its servers on exit (``stop_on_exit``) leaves them running instead when another
        manager stands by to lead them (:meth:`_standby_alive`): a restart of the leader must
        not take the fleet down with it; the last manager to stop stops them."""
        successor = None
        if self.acting and any(
            lifecycle.provider.stops_servers_on_close for lifecycle in self.lifecycles.values()
        ):
            successor = await self._standby_alive()
        if successor is not None:
            log.info(
                "leaving the servers running: the manager at %s stands by to lead them", successor
            )
        for lifecycle in self.lifecycles.values():
            if self.acting and successor is None:
                await lifecycle.close()
            else:
                await _quiesce(lifecycle)
        self.publisher.close()
        if self.leadership is not None:
            await asyncio.to_thread(self.leadership.release)
            self.leadership.close()
        self.store.close()

    async def _standby_alive(self, timeout: float = 2.0) -> str | None:
        """The URL of another manager (``http.peer_urls``) that answers ``/healthz`` as a
        standby, or None. It takes the lease this one gives up at its next renewal, and the
        servers with it; one that does not answer in ``timeout`` seconds (stopping too, or
        gone) does not count."""
        if self.leadership is None:
            return None
        own = self.config.http.url.rstrip("/")
        peers = [url.rstrip("/") for url in self.config.http.peer_urls]
        peers = [url for url in dict.fromkeys(peers) if url != own]
        if not peers:
            return None
        try:
            verify = client_context(self.config.http.agent_ca_file)
        except ValueError:
            verify = client_context()
        limits = httpx.Limits(max_connections=len(peers))
        async with httpx.AsyncClient(timeout=timeout, verify=verify, limits=limits) as client:

            async def standby(url: str) -> bool:
                try:
                    response = await client.get(f"{url}/healthz")
                    document = response.json() if response.status_code == 200 else None
                except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError):
                    return False
                return isinstance(document, dict) and document.get("role") == "standby"

            answers = await asyncio.gather(*(standby(url) for url in peers))
        return next((url for url, alive in zip(peers, answers, strict=True) if alive), None)

    async def settle(self) -> None:
        """Wait for the launches and terminations under way (tests)."""
        for lifecycle in self.lifecycles.values():
            await lifecycle.settle()

    def _overload(self) -> None:
        self._urgent.set()

    # -- running ------------------------------------------------------------------------------

    def http_app(self) -> ManagerApp:
        return ManagerApp(
            self.ingest,
            ready=self.ready,
            api=self.api,
            leader=self.leader_url if self.leadership is not None else None,
            role=self._role if self.leadership is not None else None,
        )

    def _role(self) -> tuple[str, int]:
        return ("leader" if self.acting else "standby", self.epoch)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve and tick until ``stop`` is set; then shut down cleanly."""
        http = self.config.http
        sock = listen(http.address, http.port)
        limits = HttpLimits(header_timeout=http.header_timeout, body_timeout=http.body_timeout)
        if http.max_connections is not None:
            limits = dataclasses.replace(limits, max_connections=http.max_connections)
        try:
            tls = server_context(http.tls.certificate, http.tls.key) if http.tls else None
        except ValueError as exc:  # checked when loaded; changed since
            sock.close()
            raise ConfigError("manager", [f"http.tls: {exc}"]) from None
        server = HttpServer.for_app(self.http_app(), limits, tls=tls)
        serving = asyncio.create_task(server.serve(sockets=[sock]), name="http")
        if self.acting:
            self.health.start()
        leading = (
            asyncio.create_task(self._lead(stop), name="leadership")
            if self.leadership is not None
            else None
        )
        clusters = (
            asyncio.create_task(self._run_clusters(stop), name="clusters")
            if self.clusters
            else None
        )
        log.info(
            "manager listening on %s://%s:%d; plan %s; %d pools, %d servers",
            "https" if tls else "http",
            http.address,
            http.port,
            self.publisher.describe(),
            len(self.fleet.pools),
            len(self.fleet.servers),
        )
        try:
            last_tick = float("-inf")
            while not stop.is_set():
                self._urgent.clear()
                self._safe_tick()
                last_tick = self.clock.monotonic()
                await _wait_any(stop, self._urgent, timeout=self.config.tick)
                spacing = _URGENT_SPACING - (self.clock.monotonic() - last_tick)
                if not stop.is_set() and spacing > 0:
                    await asyncio.sleep(spacing)
        finally:
            server.should_exit = True
            if leading is not None:
                await leading
            await self.health.stop()
            if clusters is not None:
                await clusters
            for controller in self.clusters.values():
                await controller.aclose()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            sock.close()
            await self.close()
            log.info("manager stopped")

    def _safe_tick(self) -> None:
        started = time.perf_counter()
        try:
            self.tick()
        except Exception:  # a bug in one tick must not stop the manager; it is logged
            self.tick_errors += 1
            log.exception("tick failed (%d so far); carrying on", self.tick_errors)
        self.tick_seconds = time.perf_counter() - started


async def _quiesce(lifecycle: PoolLifecycle) -> None:
    """Stop a pool's background work without stopping its servers (another manager leads)."""
    for task in list(lifecycle.tasks):
        task.cancel()
    await asyncio.gather(*list(lifecycle.tasks), return_exceptions=True)
    if not lifecycle.provider.stops_servers_on_close:
        await lifecycle.provider.close()


async def _wait_any(*events: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _plan_store(loaded: LoadedConfig) -> PlanStore:
    plan = loaded.config.plan
    if plan.store is None:
        return FilePlanStore(loaded.path(plan.path))
    password = plan.redis_password.reveal() if plan.redis_password else None
    return open_store(plan.store, password=password)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SERVED


def _counts(pair: object) -> TypeGuard[list[int]]:
    """A pair of sane counts, as pipe backends write them."""
    return isinstance(pair, list) and len(pair) == 2 and all(_count(value) for value in pair)


def _static_record(pool: PoolConfig, member: MemberConfig, now: float) -> ServerRecord:
    return ServerRecord(
        id=member.id,
        pool=pool.name,
        address=normal_address(member.address),
        check_address=member.check_address,
        origin="static",
        state=ServerState.WARMING,
        state_reason="configured; waiting for a healthy report",
        state_since=now,
        created_at=now,
        max_concurrency=member.max_concurrency,
        token_hash=token_hash(member.token.reveal()) if member.token else None,
    )


def _pool_load(pool: PoolRuntime, now: float, down_after: float) -> tuple[float | None, int, int]:
    """The mean smoothed utilization of the pool's active servers with a fresh report, paused
    ones included (None when there are none): what a server's load is judged against
    (:func:`~dnslb.policy.pause_threshold`); how many they are, and how many of them are not
    paused (:func:`~dnslb.policy.pause_room`). A queue counts (a utilization above 1): the
    pool's requests in progress over its worker slots."""
    total = 0.0
    count = 0
    unpaused = 0
    for server in pool.servers.values():
        load = server.load
        report_at = server.report_at
        if (
            load is not None
            and report_at is not None
            and server.state is ServerState.ACTIVE
            and now - report_at <= down_after
        ):
            total += load.utilization
            count += 1
            if not load.paused:
                unpaused += 1
    return (total / count if count else None), count, unpaused
