"""Active health checks, run once centrally by the manager (every DNS server reads the plan).

Per pool with a ``health_check``, :class:`HealthChecker` probes each live server's check address
every ``interval``: a TCP connect, or an HTTP GET expecting a status (and optionally a text in the
body). :func:`count_result` applies rise/fall: a server becomes healthy after ``rise`` passes in a
row and unhealthy after ``fall`` failures in a row. The manager's tick reads the verdict.
"""

from __future__ import annotations

import asyncio
import logging

from dnslb.model import ServerState
from manager.config import HttpCheck, TcpCheck
from manager.fleet import CheckStatus, Fleet, PoolRuntime, ServerRuntime

log = logging.getLogger("dnslb.manager.health")

_CHECKED_STATES = (ServerState.WARMING, ServerState.ACTIVE, ServerState.DOWN)
_MAX_BODY = 64 * 1024


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


async def probe(check: TcpCheck | HttpCheck, address: str) -> tuple[bool, str]:
    """Run one check against ``address``: ``(True, "")`` or ``(False, why)``."""
    try:
        return await asyncio.wait_for(_probe(check, address), timeout=check.timeout)
    except TimeoutError:
        return False, f"timed out after {check.timeout:g} s"
    except OSError as exc:
        return False, exc.strerror or str(exc)


async def _probe(check: TcpCheck | HttpCheck, address: str) -> tuple[bool, str]:
    reader, writer = await asyncio.open_connection(address, check.port)
    try:
        if isinstance(check, TcpCheck):
            return True, ""
        host = check.host or (f"[{address}]" if ":" in address else address)
        request = (
            f"GET {check.path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: dnslb-health\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(request.encode("ascii"))
        await writer.drain()
        head = await reader.readline()
        parts = head.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            return False, f"not an HTTP response: {head[:60]!r}"
        status = int(parts[1])
        if status != check.expect_status:
            return False, f"HTTP {status}, expected {check.expect_status}"
        if check.expect_body is not None:
            body = await reader.read(_MAX_BODY)
            if check.expect_body.encode("utf-8") not in body:
                return False, f"body lacks {check.expect_body!r}"
        return True, ""
    finally:
        writer.close()


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
        servers = [s for s in pool.servers.values() if s.state in _CHECKED_STATES]
        results = await asyncio.gather(*(probe(check, _check_address(s)) for s in servers))
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
