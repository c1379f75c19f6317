"""The ``memory`` provider: servers that exist only in this process, for tests and dry runs.

It keeps real state (instances, their boot time on the manager's clock, termination), survives a
manager restart inside the same process (instances are kept per state directory, like a cloud
account), and can be told to fail launches. Its servers run nothing: whatever should report for
them (a test) reports with the token it was given (``agent_tokens``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from dnslb.config import setting
from dnslb.tokens import token_hash
from manager.providers.base import (
    Instance,
    InstanceStatus,
    LaunchRequest,
    Provider,
    ProviderError,
    register,
)


@dataclass(frozen=True, slots=True)
class MemoryProviderConfig:
    """Servers kept in memory (tests, dry runs)."""

    type: Literal["memory"]
    boot_time: float = setting(0.0, help="seconds a server takes to run", min=0.0)
    network: str = setting("10.99.0", help="first three octets of the servers' addresses")
    fail_launches: int = setting(0, help="the first N launches fail", min=0)
    fail_terminations: int = setting(0, help="the first N terminations fail", min=0)
    broken_launches: int = setting(
        0, help="the first N launches raise an unexpected error (a provider bug)", min=0
    )


@dataclass(frozen=True, slots=True)
class _Machine:
    instance: Instance
    ready_at: float
    token: str


@register("memory")
class MemoryProvider(Provider):
    accounts: ClassVar[dict[str, dict[str, _Machine]]] = {}
    _numbers = itertools.count(1)

    def __init__(self, config: MemoryProviderConfig, context: object) -> None:
        super().__init__(config, context)  # type: ignore[arg-type]
        self.machines = self.accounts.setdefault(str(self.context.state_dir), {})
        self.failures_left = config.fail_launches
        self.terminate_failures_left = config.fail_terminations
        self.broken_left = config.broken_launches
        self.calls: list[str] = []

    @property
    def agent_tokens(self) -> dict[str, str]:
        """Server id -> the token its agent would use (what a test reports with)."""
        return {m.instance.server_id or "": m.token for m in self.machines.values()}

    async def launch(self, request: LaunchRequest) -> Instance:
        self.calls.append(f"launch {request.server_id}")
        for machine in self.machines.values():  # idempotent by server id
            if machine.instance.server_id == request.server_id:
                return machine.instance
        if self.broken_left > 0:
            self.broken_left -= 1
            raise RuntimeError("memory provider told to break")
        if self.failures_left > 0:
            self.failures_left -= 1
            raise ProviderError("launch refused (memory provider told to fail)")
        number = next(self._numbers)
        instance = Instance(
            ref=f"mem-{number}",
            status=InstanceStatus.PENDING,
            server_id=request.server_id,
            pool=request.pool,
            address=f"{self.config.network}.{number % 250 + 1}",
            token_hash=token_hash(request.agent_token),
        )
        now = self.context.clock.monotonic()
        self.machines[instance.ref] = _Machine(
            instance, now + self.config.boot_time, request.agent_token
        )
        return instance

    async def describe(self, ref: str) -> Instance:
        machine = self.machines.get(ref)
        if machine is None:
            return Instance(ref=ref, status=InstanceStatus.GONE)
        if machine.instance.status is InstanceStatus.PENDING and (
            self.context.clock.monotonic() >= machine.ready_at
        ):
            running = replace(machine.instance, status=InstanceStatus.RUNNING)
            self.machines[ref] = replace(machine, instance=running)
        return self.machines[ref].instance

    async def terminate(self, ref: str) -> None:
        self.calls.append(f"terminate {ref}")
        if self.terminate_failures_left > 0:
            self.terminate_failures_left -= 1
            raise ProviderError("terminate refused (memory provider told to fail)")
        self.machines.pop(ref, None)

    async def list_owned(self) -> list[Instance]:
        return [await self.describe(ref) for ref in list(self.machines)]
