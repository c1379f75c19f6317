"""The ``tcp`` health check: a server passes when a TCP connection to its check address opens."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from dnslb.config import setting
from manager.checks.base import HealthCheck, HealthCheckConfig, register


@dataclass(frozen=True, slots=True)
class TcpCheck(HealthCheckConfig):
    """Healthy when a TCP connection to the check address opens."""

    type: Literal["tcp"]
    port: int = setting(help="port to connect to", min=1, max=65535)
    interval: float = setting(2.0, help="seconds between checks", min=0.1)
    timeout: float = setting(1.0, help="seconds before a check fails", min=0.05)
    rise: int = setting(2, help="passes in a row to become healthy", min=1)
    fall: int = setting(2, help="failures in a row to become unhealthy", min=1)


@register(TcpCheck)
class TcpHealthCheck(HealthCheck):
    """Opens a connection and closes it at once."""

    config: TcpCheck

    async def attempt(self, address: str) -> tuple[bool, str]:
        _, writer = await asyncio.open_connection(address, self.config.port)
        writer.close()
        return True, ""
