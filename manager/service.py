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
import logging

from dnslb.clock import Clock, SystemClock
from dnslb.model import ServerState
from dnslb.plan import Plan
from dnslb.plan_store import FilePlanStore, PlanStore
from dnslb.policy import update_load
from manager.config import LoadedConfig, MemberConfig, PoolConfig
from manager.fleet import Fleet, PoolRuntime, ServerRuntime, token_hash
from manager.health import HealthChecker
from manager.http import ASGIApp, HttpServer, ManagerApp, listen
from manager.ingest import ReportIngest
from manager.planner import build_plan, health_of, plan_zones
from manager.state import ServerRecord, StateStore

log = logging.getLogger("dnslb.manager")

_URGENT_SPACING = 0.1  # seconds: overload reports trigger ticks at most this often


class Manager:
    """The manager process's state and main loop."""

    def __init__(
        self,
        loaded: LoadedConfig,
        *,
        clock: Clock | None = None,
        publisher: PlanStore | None = None,
    ) -> None:
        self.loaded = loaded
        self.config = loaded.config
        self.clock = clock or SystemClock()
        self.zones = plan_zones(self.config.zones)
        self.store = StateStore(loaded.path(self.config.state.path))
        self.publisher = publisher or FilePlanStore(loaded.path(self.config.plan.path))
        self.fleet = Fleet(self.store, self.config.auth.agent_token)
        for pool in self.config.pools:
            self.fleet.add_pool(pool)
        self._restore()
        self.ingest = ReportIngest(self.fleet, self.clock.monotonic, on_overload=self._overload)
        self.health = HealthChecker(self.fleet)
        self.started_at = self.clock.monotonic()
        self.version = int(self.store.get_meta("plan_version") or 0)
        self.plan: Plan | None = None  # the last plan published
        self.tick_errors = 0
        self._content: Plan | None = None
        self._published_at: float | None = None
        self._urgent = asyncio.Event()
        self.api: ASGIApp | None = None

    # -- start-up -----------------------------------------------------------------------------

    def _restore(self) -> None:
        """Read servers back from the store and line static members up with the config."""
        now = self.clock.time()
        stored = {record.id: record for record in self.store.load_servers()}
        for pool in self.config.pools:
            for member in pool.members:
                record = stored.pop(member.id, None)
                wanted = _static_record(pool, member, now)
                if record is None:
                    self.fleet.add_server(
                        wanted, event="static member from the configuration", now=now
                    )
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
                del self.fleet.servers[record.id]
                if record.pool in self.fleet.pools:
                    del self.fleet.pools[record.pool].servers[record.id]
            else:
                self.fleet.adopt(record)

    # -- the tick -----------------------------------------------------------------------------

    def tick(self) -> Plan | None:
        """Assess every server, then publish the plan if it changed or is due; returns it then."""
        now = self.clock.monotonic()
        wall = self.clock.time()
        with self.store.batch():
            for pool in self.fleet.pools.values():
                for server in pool.servers.values():
                    self._assess(pool, server, now, wall)
            return self._publish(now, wall)

    def _assess(self, pool: PoolRuntime, server: ServerRuntime, now: float, wall: float) -> None:
        healthy, reason = health_of(
            server,
            now=now,
            down_after=self.config.down_after,
            started_at=self.started_at,
            checked=pool.config.health_check is not None,
        )
        state = server.state
        if healthy is True and state in (ServerState.WARMING, ServerState.DOWN):
            self.fleet.transition(server, ServerState.ACTIVE, reason, now=wall)
        elif healthy is False and state is ServerState.ACTIVE:
            self.fleet.transition(server, ServerState.DOWN, reason, now=wall)
        report = server.report
        if report is not None and report.seq != server.folded_seq and server.report_at is not None:
            utilization = report.utilization
            if utilization is not None:
                server.load = update_load(server.load, utilization, server.report_at, pool.policy)
            server.folded_seq = report.seq
        paused = server.load.paused if server.load is not None else False
        if paused != server.paused and server.state is ServerState.ACTIVE:
            assert server.load is not None
            policy = pool.policy
            if paused:
                why = f"utilization {server.load.sample:.2f} > th_over {policy.th_over:g}"
            else:
                resume = policy.th_over - policy.hysteresis
                why = f"utilization {server.load.utilization:.2f} < {resume:.2f}"
            self.fleet.log(
                wall, "paused" if paused else "resumed", why, pool=pool.name, server=server.id
            )
        server.paused = paused

    def ready(self) -> bool:
        """True once the manager publishes plans (after the start-up wait)."""
        return self.plan is not None

    def _startup_done(self, now: float) -> bool:
        if now - self.started_at >= self.config.down_after:
            return True
        live = [s for s in self.fleet.servers.values() if s.state is not ServerState.TERMINATED]
        return all(server.report_at is not None for server in live)

    def _publish(self, now: float, wall: float) -> Plan | None:
        if not self._startup_done(now):
            return None
        content = build_plan(
            self.zones,
            self.fleet.pools.values(),
            version=0,
            generated_at=None,
            stale_after=None,
            now=now,
            down_after=self.config.down_after,
        )
        changed = content != self._content
        due = self._published_at is None or now - self._published_at >= self.config.plan.refresh
        if not changed and not due:
            return None
        if changed:
            self.version += 1
            self.store.set_meta("plan_version", str(self.version))
        serial = self.version % 2**32
        plan = dataclasses.replace(
            content,
            version=self.version,
            generated_at=wall,
            stale_after=self.config.plan.stale_after,
            zones=tuple(
                dataclasses.replace(zone, soa=dataclasses.replace(zone.soa, serial=serial))
                for zone in content.zones
            ),
        )
        try:
            self.publisher.publish(plan)
        except OSError as exc:
            log.error(
                "cannot publish plan v%d to %s: %s", plan.version, self.publisher.describe(), exc
            )
            return None
        self._content = content
        self._published_at = now
        self.plan = plan
        return plan

    def _overload(self) -> None:
        self._urgent.set()

    # -- running ------------------------------------------------------------------------------

    def http_app(self) -> ManagerApp:
        return ManagerApp(self.ingest, ready=self.ready, api=self.api)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve and tick until ``stop`` is set; then shut down cleanly."""
        http = self.config.http
        sock = listen(http.address, http.port)
        server = HttpServer.for_app(self.http_app())
        serving = asyncio.create_task(server.serve(sockets=[sock]), name="http")
        self.health.start()
        log.info(
            "manager listening on %s:%d; plan %s; %d pools, %d servers",
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
            await self.health.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            sock.close()
            self.store.close()
            log.info("manager stopped")

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception:  # a bug in one tick must not stop the manager; it is logged
            self.tick_errors += 1
            log.exception("tick failed (%d so far); carrying on", self.tick_errors)


async def _wait_any(*events: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _static_record(pool: PoolConfig, member: MemberConfig, now: float) -> ServerRecord:
    return ServerRecord(
        id=member.id,
        pool=pool.name,
        address=member.address,
        check_address=member.check_address,
        origin="static",
        state=ServerState.WARMING,
        state_reason="configured; waiting for a healthy report",
        state_since=now,
        created_at=now,
        max_concurrency=member.max_concurrency,
        token_hash=token_hash(member.token.reveal()) if member.token else None,
    )
