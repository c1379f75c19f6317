"""Server lifecycle for pools with a provider: launch, warm up, drain, terminate, and cost.

``launching -> warming -> active -> draining -> terminated`` (DESIGN section 5). For each such
pool a :class:`PoolLifecycle` runs, every tick:

1. the autoscaler (:func:`dnslb.scaling.decide`) on a sample of the pool;
2. **launches**: the intent is recorded first (a ``launching`` server in the state database),
   then the provider is called in a task of its own; when the instance runs with an address the
   server is ``warming``, and it enters the answers (slow start) after its agent's first healthy
   report;
3. **warm-up timeouts**: a server that never becomes healthy is terminated (the autoscaler then
   launches another; after ``max_failed_launches`` failures in a row, launching pauses for
   ``launch_backoff`` seconds so a broken image does not burn money);
4. **drains**: a draining server is out of the plan; it is terminated only when the longest TTL
   handed out for it has expired and its requests in progress reach 0, or after
   ``drain_timeout``. No client that honours TTLs is sent to a stopped server.

Costs: server-seconds from the launch request (or configuration) to termination, requests served
(from the agents' counters, counting restarts of the counter), requests per server-second.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from dnslb.clock import Clock
from dnslb.model import ServerState
from dnslb.scaling import (
    Decision,
    ScalingHistory,
    ScalingPolicy,
    ServerLoadView,
    decide,
    record,
    sample_pool,
)
from dnslb.tokens import new_token, token_hash
from manager.config import LifecycleConfig
from manager.fleet import Fleet, PoolRuntime, ServerRuntime
from manager.providers.base import (
    Instance,
    InstanceStatus,
    LaunchRequest,
    Provider,
    ProviderError,
)
from manager.state import ServerRecord, server_seconds

log = logging.getLogger("dnslb.manager.lifecycle")

FIRST_LOOK_WAIT = 30.0
"""Seconds the autoscaler waits at most for the first reconcile to list the provider's servers."""

PROPAGATION = 1.5
"""Seconds a plan takes to reach every pipe backend (stat interval, compile), with a margin."""


@dataclass(slots=True)
class Costs:
    """Cost and work of some servers."""

    server_seconds: float = 0.0
    served: int = 0

    @property
    def served_per_cost(self) -> float:
        return self.served / self.server_seconds if self.server_seconds else 0.0


def _failure(exc: Exception, call: str) -> str:
    """What a failed provider call says; an exception that is not a ProviderError is a bug in
    the provider: logged with its traceback, and still only fails this one server."""
    if isinstance(exc, ProviderError):
        return str(exc)
    log.error("provider %s raised an unexpected error", call, exc_info=exc)
    return f"unexpected {type(exc).__name__} from the provider's {call}: {exc}"


def server_cost(server: ServerRecord, now: float) -> float:
    """Server-seconds from the launch request (or configuration) to termination (or ``now``)."""
    return server_seconds(server.created_at, server.terminated_at, now)


@dataclass(slots=True)
class _Retirement:
    """A server to terminate, and when to try (again): a failing terminate backs off."""

    why: str
    next_try: float = float("-inf")
    attempts: int = 0


@dataclass(slots=True)
class PoolLifecycle:
    """The lifecycle of one provider-backed pool."""

    pool: PoolRuntime
    fleet: Fleet
    provider: Provider
    scaling: ScalingPolicy | None
    config: LifecycleConfig
    clock: Clock
    history: ScalingHistory = field(default_factory=ScalingHistory)
    failed_launches: int = 0  # in a row: launching pauses after max_failed_launches
    last_launch_failure: float = float("-inf")  # wall clock of the last one
    launches: int = 0  # asked of the provider since the manager started (for the metrics)
    launch_failures: int = 0
    launch_paused_until: float = float("-inf")
    launch_pauses: int = 0  # pauses since a launch last worked (each one twice as long)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    terminating: set[str] = field(default_factory=set)
    launching: set[str] = field(default_factory=set)
    retiring: dict[str, _Retirement] = field(default_factory=dict)
    next_reconcile: float = float("-inf")
    # The first reconcile has listed the provider's servers (or failed to): until then the
    # autoscaler waits, or a manager started in front of running servers it adopts would launch
    # for a pool it thinks empty (found by the simulator).
    reconciled: bool = False
    # A draining server not heard from is taken for drained (its agent is silent) only once
    # the manager has listened this long (its down_after) since it started: after a restart,
    # no report yet means not heard yet (found by the simulator's fault suite).
    silent_after: float = 3.0
    started_at: float | None = None

    def __post_init__(self) -> None:
        if self.started_at is None:
            self.started_at = self.clock.monotonic()

    # The id of the next server launched for a pool (random by default; the simulator numbers
    # them, so that a run is the same for the same seed).
    server_ids: Callable[[str], str] | None = None

    # -- every tick ---------------------------------------------------------------------------

    def tick(self, now: float, wall: float) -> Decision:
        """Run the autoscaler and move launches, warm-ups and drains along."""
        self._check_warming(wall)
        self._check_down(wall)
        self._check_draining(wall)
        self._run_retirements(now)
        if self.provider.can_launch and now >= self.next_reconcile:
            self.next_reconcile = now + self.config.reconcile_interval
            self._spawn(self.reconcile(), f"reconcile {self.pool.name}")
        if self.scaling is None or not self.provider.can_launch or not self._looked(now):
            return Decision()
        views = list(self._views())
        previous = self.history.samples[-1] if self.history.samples else None
        self.history.add(
            sample_pool(views, now, previous, count_served=self.scaling.target_wait is not None),
            keep=max(self.scaling.window, self.scaling.scale_in_window),
        )
        decision = decide(self.history, views, self.scaling, now)
        if decision.launch and now < self.launch_paused_until:
            return Decision()
        if decision.launch or decision.drain:
            record(self.history, decision, now)
            kind = "scale_out" if decision.launch else "scale_in"
            amount = (
                f"launching {decision.launch}" if decision.launch else f"draining {decision.drain}"
            )
            self.fleet.log(wall, kind, f"{amount}: {decision.reason}", pool=self.pool.name)
        for _ in range(decision.launch):
            self.launch(decision.reason, wall)
        if decision.drain:
            self.drain(self.fleet.servers[decision.drain], f"scale in: {decision.reason}", wall)
        return decision

    def _views(self) -> Iterator[ServerLoadView]:
        for server in self.pool.servers.values():
            state = server.state
            if not state.counts_as_capacity or server.id in self.retiring:
                continue
            report = server.report
            capacity = server.max_concurrency or self.scaling_capacity()
            yield ServerLoadView(
                id=server.id,
                active=state is ServerState.ACTIVE,
                in_progress=(report.in_progress or 0) if report is not None else 0,
                max_concurrency=capacity,
                started_at=server.record.created_at,
                served=server.served,
            )

    def scaling_capacity(self) -> int:
        """Capacity assumed for a server that has not reported yet."""
        if self.scaling is not None and self.scaling.server_capacity:
            return self.scaling.server_capacity
        known = [s.max_concurrency for s in self.pool.servers.values() if s.max_concurrency]
        return round(sum(known) / len(known)) if known else 100

    # -- launching ----------------------------------------------------------------------------

    def launch(self, reason: str, wall: float) -> ServerRuntime:
        """Record the intent to launch a server, then ask the provider in a task."""
        if self.server_ids is not None:
            server_id = self.server_ids(self.pool.name)
        else:
            server_id = f"{self.pool.name}-{secrets.token_hex(4)}"
        token = new_token()
        record_ = ServerRecord(
            id=server_id,
            pool=self.pool.name,
            address="",
            origin=self.provider.kind,
            state=ServerState.LAUNCHING,
            state_reason=reason,
            state_since=wall,
            created_at=wall,
            token_hash=token_hash(token),
        )
        server = self.fleet.add_server(record_, event=f"launching: {reason}", now=wall)
        request = LaunchRequest(
            server_id=server_id,
            pool=self.pool.name,
            agent_token=token,
            manager_url=self.provider.context.manager_url,
            manager_urls=self.provider.context.manager_urls,
        )
        self.launching.add(server_id)  # before the task starts: reconcile must not touch it
        self.launches += 1
        self._spawn(self._launch(server, request), f"launch {server_id}")
        return server

    async def _launch(self, server: ServerRuntime, request: LaunchRequest) -> None:
        try:
            instance = await self.provider.launch(request)
        except Exception as exc:  # any failure fails this launch, nothing more
            self.launching.discard(server.id)
            self._launch_failed(server, _failure(exc, "launch"))
            return
        self.fleet.update(server, provider_ref=instance.ref)
        await self._await_running(server, instance)

    async def _await_running(self, server: ServerRuntime, instance: Instance) -> None:
        """Wait until the instance runs with an address; then the server is warming."""
        self.launching.add(server.id)
        started = self.clock.monotonic()
        try:
            while instance.status is not InstanceStatus.RUNNING or not instance.address:
                if instance.status is InstanceStatus.GONE:
                    why = f" ({instance.detail})" if instance.detail else ""
                    raise ProviderError(f"instance {instance.ref} disappeared while booting{why}")
                if self.clock.monotonic() - started > self.config.warming_timeout:
                    raise ProviderError(
                        f"not running after {self.config.warming_timeout:g} s ({instance.detail})"
                    )
                await self.clock.sleep(self.config.describe_interval)
                instance = await self.provider.describe(instance.ref)
        except Exception as exc:  # any failure fails this launch, nothing more
            self._launch_failed(server, _failure(exc, "describe"))
            return
        finally:
            self.launching.discard(server.id)
        if server.state is not ServerState.LAUNCHING:
            return  # drained or disabled meanwhile
        wall = self.clock.time()
        self.fleet.update(server, address=instance.address, check_address=instance.check_address)
        self.fleet.transition(
            server,
            ServerState.WARMING,
            f"running at {instance.address} ({instance.ref}); waiting for its agent",
            now=wall,
        )

    def _launch_failed(self, server: ServerRuntime, why: str) -> None:
        wall = self.clock.time()
        self.fleet.log(wall, "launch_failed", why, pool=self.pool.name, server=server.id)
        if server.record.provider_ref:
            self.retire(server, f"launch failed: {why}")
        else:
            self._terminated(server, f"launch failed: {why}")
        self._count_failure(wall)

    def _count_failure(self, wall: float) -> None:
        """One more launch failed: after ``max_failed_launches`` in a row, launching pauses,
        ``launch_backoff_start`` seconds the first time, twice as long each time after until a
        launch works, at most ``launch_backoff``. (A fixed 300 s pause after three refusals by
        a cloud API in a surge stopped a pool from scaling out for five minutes: the
        simulator's fault suite.)"""
        self.last_launch_failure = wall
        self.failed_launches += 1
        self.launch_failures += 1
        if self.failed_launches < self.config.max_failed_launches:
            return
        self.launch_pauses += 1
        pause = min(
            self.config.launch_backoff,
            self.config.launch_backoff_start * 2.0 ** min(self.launch_pauses - 1, 60),
        )
        self.launch_paused_until = self.clock.monotonic() + pause
        self.fleet.log(
            wall,
            "scaling_paused",
            f"{self.failed_launches} launches failed in a row; no launches for {pause:g} s",
            pool=self.pool.name,
        )
        self.failed_launches = 0

    def _check_warming(self, wall: float) -> None:
        for server in list(self.pool.servers.values()):
            if (
                server.state is ServerState.ACTIVE
                and server.record.origin == self.provider.kind
                and server.record.state_since > self.last_launch_failure
            ):
                # A launch worked since the last failure. (A server active since before the
                # failures proves nothing: it used to reset the count every tick, so a pool with
                # one running server never paused its failing launches.)
                self.failed_launches = 0
                self.launch_pauses = 0
            if server.state is not ServerState.WARMING or server.id in self.retiring:
                continue
            waited = wall - server.record.created_at
            if waited > self.config.warming_timeout:
                self.fleet.log(
                    wall,
                    "launch_failed",
                    f"no healthy report within {self.config.warming_timeout:g} s of launch",
                    pool=self.pool.name,
                    server=server.id,
                )
                self.retire(server, "never became healthy; replaced")
                self._count_failure(wall)  # a broken image: the pause saves its cost

    def _check_down(self, wall: float) -> None:
        """A launched server down for ``replace_after`` costs and serves nobody: replace it."""
        limit = self.config.replace_after
        if limit <= 0 or not self.provider.can_launch:
            return
        for server in list(self.pool.servers.values()):
            if (
                server.state is ServerState.DOWN
                and server.record.origin == self.provider.kind
                and server.id not in self.retiring
                and wall - server.record.state_since > limit
            ):
                self.retire(
                    server,
                    f"down for more than {limit:g} s ({server.record.state_reason}); replaced",
                )

    def retire(self, server: ServerRuntime, why: str) -> None:
        """Terminate ``server`` now, and again with backoff while the provider call fails. A
        server being retired no longer counts as capacity."""
        if server.id not in self.retiring:
            self.retiring[server.id] = _Retirement(why)
            self._run_retirements(self.clock.monotonic(), only=server.id)

    def _run_retirements(self, now: float, only: str | None = None) -> None:
        for server_id, retirement in list(self.retiring.items()):
            if only is not None and server_id != only:
                continue
            server = self.fleet.servers.get(server_id)
            if server is None:
                del self.retiring[server_id]
                continue
            if server_id in self.terminating or now < retirement.next_try:
                continue
            retirement.attempts += 1
            retirement.next_try = now + min(300.0, 5.0 * 2 ** (retirement.attempts - 1))
            self._spawn(self._terminate(server, retirement.why), f"terminate {server_id}")

    # -- reconcile ----------------------------------------------------------------------------

    async def reconcile(self) -> None:
        """Line the state up with what the provider really runs (at start and periodically).

        Servers whose instance vanished are terminated in the state; a launch cut short by a
        manager restart is resumed if its instance exists (launches are tagged with the server
        id before they are recorded as done) or recorded as failed if not; instances the state
        does not know are adopted or terminated, as configured. Nothing is left running unknown.
        """
        try:
            await self._reconcile()
        finally:  # done or failed, the autoscaler goes by what is known now
            self.reconciled = True

    async def _reconcile(self) -> None:
        listed_at = self.clock.time()
        try:
            owned = await self.provider.list_owned()
        except ProviderError as exc:
            self.fleet.log(listed_at, "reconcile_failed", str(exc), pool=self.pool.name)
            return
        wall = self.clock.time()
        by_ref = {instance.ref: instance for instance in owned}
        by_server = {instance.server_id: instance for instance in owned if instance.server_id}
        matched: set[str] = set()
        for server in list(self.pool.servers.values()):
            if server.record.origin != self.provider.kind:
                continue
            found = by_ref.get(server.record.provider_ref or "") or by_server.get(server.id)
            if (
                server.id in self.launching
                or server.id in self.terminating
                or server.record.state_since >= listed_at
            ):
                # A task of ours is on it, or it changed while the (slow) listing ran: the
                # listing may predate its instance. Its instance is its own, not unknown.
                if found is not None:
                    matched.add(found.ref)
                continue
            if found is None or found.status is InstanceStatus.GONE:
                if server.state is ServerState.LAUNCHING and not server.record.provider_ref:
                    self._terminated(server, "its launch was cut short by a manager restart")
                else:
                    self._terminated(server, "its instance no longer exists")
                continue
            matched.add(found.ref)
            if server.record.provider_ref != found.ref:
                self.fleet.update(server, provider_ref=found.ref)
            if server.state is ServerState.LAUNCHING:
                self._spawn(self._await_running(server, found), f"resume launch {server.id}")
        for instance in owned:
            if instance.ref in matched or instance.status is InstanceStatus.GONE:
                continue
            self._unknown(instance, wall)

    def _unknown(self, instance: Instance, wall: float) -> None:
        server_id = instance.server_id
        if (
            self.config.adopt_unknown
            and instance.token_hash
            and server_id is not None
            and server_id not in self.fleet.servers
        ):
            running = instance.status is InstanceStatus.RUNNING and instance.address
            server = self.fleet.add_server(
                ServerRecord(
                    id=server_id,
                    pool=self.pool.name,
                    address=instance.address or "",
                    check_address=instance.check_address,
                    origin=self.provider.kind,
                    state=ServerState.WARMING if running else ServerState.LAUNCHING,
                    state_reason="adopted: runs for this pool but the state did not know it",
                    state_since=wall,
                    created_at=wall,
                    token_hash=instance.token_hash,
                    provider_ref=instance.ref,
                ),
                event=f"adopted unknown instance {instance.ref}",
                now=wall,
            )
            if not running:  # still booting: wait for it like any launch
                self.launching.add(server_id)
                self._spawn(self._await_running(server, instance), f"adopt {server_id}")
            return
        self.fleet.log(
            wall,
            "unknown_instance",
            f"terminating {instance.ref} ({instance.server_id or 'no server id'}): "
            "runs for this pool but the state does not know it",
            pool=self.pool.name,
        )
        self._spawn(self._terminate_unknown(instance.ref), f"terminate unknown {instance.ref}")

    async def _terminate_unknown(self, ref: str) -> None:
        try:
            await self.provider.terminate(ref)
        except ProviderError as exc:
            self.fleet.log(
                self.clock.time(), "terminate_failed", f"{ref}: {exc}", pool=self.pool.name
            )

    # -- draining -----------------------------------------------------------------------------

    def drain(self, server: ServerRuntime, reason: str, wall: float) -> None:
        """Take ``server`` out of the answers; it is terminated once clients have left it."""
        data = {**server.record.data, "answered_until": server.answered_until or wall}
        self.fleet.update(server, data=data)
        self.fleet.transition(server, ServerState.DRAINING, reason, now=wall)

    def _check_draining(self, wall: float) -> None:
        for server in list(self.pool.servers.values()):
            if server.state is not ServerState.DRAINING or server.id in self.retiring:
                continue
            if not self.provider.can_launch:
                continue  # a static server stays drained until an operator brings it back
            answered_until = max(  # when it was drained, or later if DNS still answered it
                float(server.record.data.get("answered_until", 0.0)), server.answered_until or 0.0
            )
            if server.report is None and not self._listened():
                continue  # not heard from yet since the manager started
            in_progress = server.report.in_progress if server.report is not None else None
            drained_for = wall - server.record.state_since
            if wall >= answered_until and not in_progress:
                left = "no requests in progress" if in_progress == 0 else "its agent is silent"
                why = f"drained: TTLs handed out expired and {left}"
            elif drained_for >= self.config.drain_timeout:
                why = (
                    f"drain timeout after {drained_for:.0f} s with {in_progress} requests "
                    "still in progress"
                )
            else:
                continue
            self.retire(server, why)

    def _looked(self, now: float) -> bool:
        """True once the first reconcile is done (or has hung for :data:`FIRST_LOOK_WAIT`
        seconds: a cloud API that never answers must not stop scale-out for good)."""
        assert self.started_at is not None
        return self.reconciled or now - self.started_at >= FIRST_LOOK_WAIT

    def _listened(self) -> bool:
        """True once the manager has run ``silent_after`` seconds: a silent agent is silent."""
        assert self.started_at is not None
        return self.clock.monotonic() - self.started_at >= self.silent_after

    async def _terminate(self, server: ServerRuntime, why: str) -> None:
        self.terminating.add(server.id)
        try:
            if server.record.provider_ref:
                await self.provider.terminate(server.record.provider_ref)
        except Exception as exc:  # logged as an event; retried with backoff
            retirement = self.retiring.get(server.id)
            retry = ""
            if retirement is not None:
                retry = f"; trying again in {retirement.next_try - self.clock.monotonic():.0f} s"
            self.fleet.log(
                self.clock.time(),
                "terminate_failed",
                f"{_failure(exc, 'terminate')}{retry}",
                pool=self.pool.name,
                server=server.id,
            )
            return
        finally:
            self.terminating.discard(server.id)
        self.retiring.pop(server.id, None)
        self._terminated(server, why)

    def _terminated(self, server: ServerRuntime, why: str) -> None:
        wall = self.clock.time()
        self.fleet.update(server, data={**server.record.data, "served": server.served})
        self.fleet.transition(server, ServerState.TERMINATED, why, now=wall)
        self.fleet.forget(server)

    # -- tasks --------------------------------------------------------------------------------

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    async def settle(self, rounds: int = 50) -> None:
        """Let launches, terminations and reconciles under way run until they wait (tests).

        Tasks that wait on the clock stay waiting: with a fake clock they go on when the test
        advances it.
        """
        for _ in range(rounds):
            if not self.tasks:
                return
            await asyncio.sleep(0)

    async def terminate_all(self, why: str) -> None:
        """Terminate every server of the pool (the pool is being deleted)."""
        for server in list(self.pool.servers.values()):
            if server.record.origin == self.provider.kind:
                await self._terminate(server, why)

    async def close(self) -> None:
        """Stop background work and close the provider; servers it stops with it are recorded
        as terminated, so that the state never shows a server that is not there."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*list(self.tasks), return_exceptions=True)
        stopping = self.provider.stops_servers_on_close
        await self.provider.close()
        if not stopping:
            return
        for server in list(self.pool.servers.values()):
            if server.record.origin == self.provider.kind:
                self._terminated(server, "stopped with the manager")
