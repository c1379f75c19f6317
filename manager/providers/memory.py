"""The ``memory`` provider: servers that exist only in this process, for tests and dry runs.

It keeps real state (instances, their boot time on the manager's clock, termination) in its
:class:`MemoryAccount`, and can be told to fail launches. Its servers run nothing: whatever should
report for them (a test) reports with the token it was given (``agent_tokens``).

Each provider starts with an account of its own: nothing is shared between providers, managers
or tests. A cloud account outlives a manager process; a test that restarts the manager hands the
old provider's ``account`` to the new one, and the new manager finds its servers again.
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

from dnslb.config import setting
from dnslb.tokens import token_hash
from manager.providers.base import (
    Instance,
    InstanceStatus,
    LaunchRequest,
    Provider,
    ProviderConfig,
    ProviderContext,
    ProviderError,
    register,
)


@dataclass(frozen=True, slots=True)
class MemoryProviderConfig(ProviderConfig):
    """Servers kept in memory (tests, dry runs)."""

    type: Literal["memory"]
    boot_time: float = setting(0.0, help="seconds a server takes to run", min=0.0)
    network: str = setting(
        "10.99.0",
        help="first three octets of the servers' addresses (server N gets network.0 + N + 1, "
        "on into the next octets past 254)",
    )
    fail_launches: int = setting(0, help="the first N launches fail", min=0)
    fail_terminations: int = setting(0, help="the first N terminations fail", min=0)
    broken_launches: int = setting(
        0, help="the first N launches raise an unexpected error (a provider bug)", min=0
    )
    hung_launches: int = setting(
        0, help="the first N launches never get past pending (a stuck cloud)", min=0
    )

    def config_problems(self) -> Iterator[str]:
        try:
            ipaddress.IPv4Address(f"{self.network}.0")
        except ValueError:
            yield f"network: {self.network!r} is not three octets of an IPv4 address"


@dataclass(frozen=True, slots=True)
class _Machine:
    instance: Instance
    ready_at: float  # inf: it never runs (hung)
    token: str
    created_at: float


@dataclass
class MemoryAccount:
    """The servers of a memory provider (by ref), the numbers its next ones take, and the bill:
    when each server was created and terminated (the provider's monotonic clock)."""

    machines: dict[str, _Machine] = field(default_factory=dict)
    numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    bill: dict[str, tuple[float, float | None]] = field(default_factory=dict)

    def create(
        self, request: LaunchRequest, *, network: str, now: float, ready_at: float
    ) -> Instance:
        """A new server for ``request``, pending until ``ready_at``."""
        number = next(self.numbers)
        instance = Instance(
            ref=f"mem-{number}",
            status=InstanceStatus.PENDING,
            server_id=request.server_id,
            pool=request.pool,
            address=_address(network, number),
            token_hash=token_hash(request.agent_token),
        )
        self.machines[instance.ref] = _Machine(instance, ready_at, request.agent_token, now)
        self.bill[instance.ref] = (now, None)
        return instance

    def remove(self, ref: str, now: float) -> None:
        """Terminate ``ref`` (nothing if it is gone)."""
        if self.machines.pop(ref, None) is not None:
            self.bill[ref] = (self.bill[ref][0], now)


def _address(network: str, number: int) -> str:
    base = int(ipaddress.IPv4Address(f"{network}.0"))
    return str(ipaddress.IPv4Address((base + number + 1) % 2**32))


@register(MemoryProviderConfig)
class MemoryProvider(Provider):
    def __init__(self, config: MemoryProviderConfig, context: ProviderContext) -> None:
        super().__init__(config, context)
        self.account = MemoryAccount()
        self.failures_left = config.fail_launches
        self.terminate_failures_left = config.fail_terminations
        self.broken_left = config.broken_launches
        self.hung_left = config.hung_launches
        self.calls: list[str] = []

    @property
    def machines(self) -> dict[str, _Machine]:
        """The account's servers by ref (a test may remove one behind the manager's back)."""
        return self.account.machines

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
        now = self.context.clock.monotonic()
        ready_at = now + self.config.boot_time
        if self.hung_left > 0:
            self.hung_left -= 1
            ready_at = float("inf")
        return self.account.create(request, network=self.config.network, now=now, ready_at=ready_at)

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
        self.account.remove(ref, self.context.clock.monotonic())

    async def list_owned(self) -> list[Instance]:
        return [await self.describe(ref) for ref in list(self.machines)]
