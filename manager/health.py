"""Active health checks, run once centrally by the manager (every DNS server reads the plan).

Per pool with a ``health_check``, :class:`HealthChecker` probes each live server's check address
every ``interval`` with the check the pool names (:mod:`manager.checks`: a TCP connect, an HTTP
GET expecting a status...). :func:`count_result` applies rise/fall: a server becomes healthy
after ``rise`` passes in a row and unhealthy after ``fall`` failures in a row. The manager's tick
reads the verdict.
"""

from __future__ import annotations

import asyncio
import logging

from dnslb.model import ServerState
from manager.checks import create_check
from manager.fleet import CheckStatus, Fleet, PoolRuntime, ServerRuntime

log = logging.getLogger("dnslb.manager.health")

_CHECKED_STATES = (ServerState.WARMING, ServerState.ACTIVE, ServerState.DOWN)


def count_result(status: CheckStatus, ok: bool, error: str, *, rise: int, fall: int) -> bool:
    """Fold one check result into ``status``; True when the verdict changed."""
    before = status.healthy
    if ok:
        status.passes += 1
        status.failures = 0
        if status.passes >= rise:
            status.healthy = True
    else:
        status.failures += 1
        status.passes = 0
        status.last_error = error
        if status.failures >= fall:
            status.healthy = False
    return status.healthy is not before


class HealthChecker:
    """Runs the active checks of every pool that has one."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = False

    def start(self) -> None:
        """Start checking every pool that has a check (and pools added later)."""
        self._running = True
        for pool in self.fleet.pools.values():
            self.start_pool(pool)

    def start_pool(self, pool: PoolRuntime) -> None:
        if self._running and pool.config.health_check is not None and pool.name not in self._tasks:
            self._tasks[pool.name] = asyncio.create_task(self._run(pool), name=f"check {pool.name}")

    async def stop_pool(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def stop(self) -> None:
        self._running = False
        for name in list(self._tasks):
            await self.stop_pool(name)

    async def check_pool(self, pool: PoolRuntime) -> None:
        """Probe every live server of ``pool`` once, concurrently."""
        check = pool.config.health_check
        if check is None:
            return
        probe = create_check(check).probe
        servers = [s for s in pool.servers.values() if s.state in _CHECKED_STATES]
        results = await asyncio.gather(*(probe(_check_address(s)) for s in servers))
        for server, (ok, error) in zip(servers, results, strict=True):
            if count_result(server.check, ok, error, rise=check.rise, fall=check.fall):
                verdict = "passing" if server.check.healthy else f"failing ({error})"
                log.info("health check of %s is %s", server.id, verdict)

    async def _run(self, pool: PoolRuntime) -> None:
        check = pool.config.health_check
        assert check is not None
        while True:
            await self.check_pool(pool)
            await asyncio.sleep(check.interval)


def _check_address(server: ServerRuntime) -> str:
    return server.record.check_address or server.record.address
