"""The ``static`` provider: a fixed list of servers that already exist; never scaled.

Its servers are the pool's ``members``; the manager tracks them like any other, but the
autoscaler never launches or terminates one (``can_launch`` is False).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dnslb.config import setting
from manager.providers.base import (
    Instance,
    InstanceStatus,
    LaunchRequest,
    Provider,
    ProviderConfig,
    ProviderError,
    register,
)


@dataclass(frozen=True, slots=True)
class StaticProviderConfig(ProviderConfig):
    """A fixed set of servers: the pool's ``members``."""

    type: Literal["static"] = setting("static", help="static")


@register(StaticProviderConfig)
class StaticProvider(Provider):
    can_launch = False

    async def launch(self, request: LaunchRequest) -> Instance:
        raise ProviderError(f"pool {self.context.pool} is static: servers are not launched")

    async def describe(self, ref: str) -> Instance:
        return Instance(
            ref=ref, status=InstanceStatus.RUNNING, server_id=ref, pool=self.context.pool
        )

    async def terminate(self, ref: str) -> None:
        raise ProviderError(f"pool {self.context.pool} is static: servers are not terminated")

    async def list_owned(self) -> list[Instance]:
        return []
