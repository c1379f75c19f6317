"""The manager as :class:`dnslb.control.ManagerControl`: views for the API, actions through it.

Pool specs arrive as JSON documents and are built with the same machinery as the configuration
file (:func:`dnslb.config.parse_config`), so the API and the file accept exactly the same pools
and report problems the same way.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dnslb.config import parse_config, to_document
from dnslb.control import (
    AdminAction,
    ClusterTelemetry,
    Explanation,
    History,
    ManagerControl,
    ManagerStats,
    NotFound,
    PlanView,
    PoolTelemetry,
    PoolView,
    ServerView,
    Telemetry,
)
from dnslb.dnsname import normalize
from dnslb.model import Event, ServerState
from dnslb.plan import Member, MemberState, Plan, Pool
from dnslb.policy import share_factor
from dnslb.selection import PoolAnswers, pool_answers
from manager.config import MemberConfig, PoolConfig
from manager.explain import Shares, explain_pool, rotation_shares, server_reason
from manager.fleet import PoolRuntime, ServerRuntime
from manager.lifecycle import server_cost
from manager.service import Manager
from manager.state import served_count

# The parts of a tick that fail apart, each counted from 0 so that a first failure is an increase
# Prometheus sees: Manager.tick's (what Manager._isolated is told) and ClusterController.tick's.
TICK_PARTS = (
    "server",
    "capacity",
    "pausing",
    "shares",
    "answers held",
    "lifecycle",
    "cluster load",
    "history",
    "retention",
)
CLUSTER_TICK_PARTS = ("failover", "rebuild", "push")


class Control:
    """Implements :class:`dnslb.control.ManagerControl` on a running :class:`Manager`."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        # The published plan's rotations, computed once per plan (and staleness) and name.
        self._standings: tuple[Plan | None, bool, dict[str, _Standing]] = (None, False, {})

    # -- views --------------------------------------------------------------------------------

    def _members(self) -> dict[str, tuple[float, int]]:
        plan = self.manager.plan
        if plan is None:
            return {}
        return {
            member.id: (member.weight, member.ttl)
            for pool in plan.pools
            for member in pool.members
            if member.state is MemberState.ACTIVE
        }

    def _shares(
        self, pools: Iterable[str], members: Mapping[str, tuple[float, int]]
    ) -> dict[str, tuple[float | None, float | None]]:
        """Per server of ``pools``: its intended share (its weight among the published plan's
        ``members`` over its pool's) and its delivered share (its smoothed requests in
        progress, utilization times max concurrency, over its pool's active servers'); None
        where it has none."""
        shares: dict[str, tuple[float | None, float | None]] = {}
        fleet = self.manager.fleet
        for name in pools:
            pool = fleet.pools.get(name)
            if pool is None:
                continue
            weights: dict[str, tuple[float, float]] = {}
            loads: dict[str, tuple[float, float]] = {}
            for server in pool.servers.values():
                if server.id in members:
                    weights[server.id] = (members[server.id][0], 1)
                if server.state is ServerState.ACTIVE and server.load is not None:
                    loads[server.id] = (server.load.utilization, server.max_concurrency or 1)
            intended = _fractions(weights)
            delivered = _fractions(loads)
            for server_id in pool.servers:
                shares[server_id] = (intended.get(server_id), delivered.get(server_id))
        return shares

    def _server_view(
        self,
        server: ServerRuntime,
        members: Mapping[str, tuple[float, int]],
        answers: Mapping[str, tuple[int, int]] | None = None,
        shares: Mapping[str, tuple[float | None, float | None]] | None = None,
    ) -> ServerView:
        record = server.record
        now = self.manager.clock.monotonic()
        weight_ttl = members.get(server.id)
        report = server.report
        intended, delivered = shares.get(server.id, (None, None)) if shares else (None, None)
        pool = self.manager.fleet.pools.get(record.pool)
        policy = pool.policy if pool is not None else None
        return ServerView(
            id=server.id,
            pool=record.pool,
            address=record.address,
            check_address=record.check_address,
            origin=record.origin,
            state=record.state,
            state_reason=record.state_reason,
            state_since=record.state_since,
            created_at=record.created_at,
            utilization=server.load.utilization if server.load is not None else None,
            in_progress=report.in_progress if report is not None else None,
            max_concurrency=server.max_concurrency,
            weight=weight_ttl[0] if weight_ttl else None,
            ttl=weight_ttl[1] if weight_ttl else None,
            paused=server.paused,
            admin_paused=record.admin_paused,
            report_age=now - server.report_at if server.report_at is not None else None,
            cost_seconds=server_cost(record, self.manager.clock.time()),
            served=server.served,
            answers=answers[server.id][1] if answers and server.id in answers else None,
            why=self._why(server),
            location=self._location(server),
            intended_share=intended,
            delivered_share=delivered,
            share_correction=(
                share_factor(server.share, policy)
                if policy is not None and policy.corrects_shares
                else None
            ),
        )

    def _location(self, server: ServerRuntime) -> str | None:
        pool = self.manager.fleet.pools.get(server.record.pool)
        if pool is None:
            return None
        return pool.server_location(server)

    def _standing(self, dns_name: str) -> _Standing:
        """The published plan's pool of ``dns_name``, its rotation and members' shares."""
        plan = self.manager.plan
        stale = plan.is_stale(self.manager.clock.time()) if plan is not None else False
        cached_plan, cached_stale, standings = self._standings
        if cached_plan is not plan or cached_stale != stale:
            standings = {}
            self._standings = (plan, stale, standings)
        found = standings.get(dns_name)
        if found is None:
            planned = None
            if plan is not None:
                planned = next((p for p in plan.pools if p.name == dns_name), None)
            answers = pool_answers(planned, stale=stale) if planned is not None else None
            found = standings[dns_name] = _Standing(
                pool=planned,
                answers=answers,
                members={m.id: m for m in planned.members} if planned is not None else {},
                shares=rotation_shares(answers) if answers is not None else {},
            )
        return found

    def _operator_reasons(self, servers: Sequence[ServerRuntime]) -> dict[str, str]:
        """The reason of each operator's pause among ``servers`` (from the event log)."""
        reasons = {}
        for server in servers:
            if not server.record.admin_paused:
                continue
            found = self.manager.store.events(server=server.id, kinds=("admin_pause",), limit=1)
            if found:
                reasons[server.id] = found[0].reason.removeprefix("operator").lstrip(": ")
        return reasons

    def _why(self, server: ServerRuntime) -> str:
        pool = self.manager.fleet.pools.get(server.record.pool)
        if pool is None:
            return server.record.state_reason
        standing = self._standing(pool.config.dns_name)
        return server_reason(
            server,
            standing.members.get(server.id),
            standing.shares.get(server.id),
            policy=pool.policy,
            fallback=pool.policy.fallback.value,
            now=self.manager.clock.monotonic(),
            down_after=self.manager.config.down_after,
            left_out=self.manager.members_left_out.get(server.id),
            operator_reason=self._operator_reasons([server]).get(server.id),
            pool_mean=pool.mean_utilization,
            pool_room=pool.pause_room,
        )

    def _pool_view(self, pool: PoolRuntime) -> PoolView:
        manager = self.manager
        wall = manager.clock.time()
        cost = 0.0
        served = 0
        by_state: Counter[str] = Counter()
        retired = manager.store.retired().get(pool.name)
        if retired is not None:  # its servers terminated long ago (pruned records)
            cost, served = retired.seconds, retired.served
        for record in manager.store.load_servers_of(pool.name):
            runtime = manager.fleet.servers.get(record.id)
            cost += server_cost(record, wall)
            served += runtime.served if runtime is not None else served_count(record.data)
            if record.state is not ServerState.TERMINATED:
                by_state[record.state.value] += 1
        return PoolView(
            name=pool.name,
            dns_name=pool.config.dns_name,
            zone=pool.config.zone,
            source=manager.pool_sources[pool.name],
            provider=pool.config.provider.type if pool.config.provider is not None else None,
            spec=to_document(pool.config),
            servers=dict(by_state),
            cost_seconds=cost,
            served=served,
            scale_events=manager.store.count_events(
                pool=pool.name, kinds=("scale_out", "scale_in")
            ),
            mean_ttl=self._mean_ttl(pool.config.dns_name),
            answer_k=pool.answer_k if pool.answer_k is not None else pool.policy.k,
            ttl_floor=pool.answer_policy.ttl_min,
            holders=pool.held.holders(),
        )

    def _mean_ttl(self, dns_name: str) -> float | None:
        plan = self.manager.plan
        if plan is None:
            return None
        for pool in plan.pools:
            if pool.name != dns_name:
                continue
            active = [m for m in pool.members if m.state is MemberState.ACTIVE]
            total = sum(m.weight for m in active)
            if not active or total <= 0:
                return None
            return sum(m.ttl * m.weight for m in active) / total
        return None

    def pools(self) -> Sequence[PoolView]:
        return [self._pool_view(pool) for pool in self.manager.fleet.pools.values()]

    def pool(self, name: str) -> PoolView:
        pool = self.manager.fleet.pools.get(name)
        if pool is None:
            raise NotFound(f"no pool {name!r}")
        return self._pool_view(pool)

    def servers(self, pool: str | None = None) -> Sequence[ServerView]:
        if pool is not None and pool not in self.manager.fleet.pools:
            raise NotFound(f"no pool {pool!r}")
        members = self._members()
        answers = self.manager.answer_counts()
        shares = self._shares([pool] if pool is not None else self.manager.fleet.pools, members)
        return [
            self._server_view(server, members, answers, shares)
            for server in self.manager.fleet.servers.values()
            if pool is None or server.record.pool == pool
        ]

    def server(self, server_id: str) -> ServerView:
        server = self.manager.fleet.servers.get(server_id)
        if server is None:
            raise NotFound(f"no server {server_id!r}")
        members = self._members()
        shares = self._shares([server.record.pool], members)
        return self._server_view(server, members, self.manager.answer_counts(), shares)

    def plan(self) -> PlanView | None:
        plan = self.manager.plan
        if plan is None or plan.generated_at is None:
            return None
        return PlanView(
            plan=plan,
            published_at=plan.generated_at,
            age=max(0.0, self.manager.clock.time() - plan.generated_at),
        )

    def events(
        self,
        *,
        pool: str | None = None,
        server: str | None = None,
        kinds: Sequence[str] = (),
        before_id: int | None = None,
        limit: int = 100,
    ) -> Sequence[Event]:
        return self.manager.store.events(
            pool=pool, server=server, kinds=kinds, before_id=before_id, limit=limit
        )

    def explain(self, name: str) -> Explanation:
        manager = self.manager
        wanted = normalize(name)
        pool = manager.fleet.pools.get(name) or next(
            (p for p in manager.fleet.pools.values() if p.config.dns_name == wanted), None
        )
        if pool is None:
            raise NotFound(f"no pool named {name!r} (a pool's name or its DNS name)")
        plan = manager.plan
        if plan is None:
            raise NotFound("no plan published yet (after a start the manager waits for reports)")
        standing = self._standing(pool.config.dns_name)
        return explain_pool(
            pool,
            plan,
            standing.answers,
            wall=manager.clock.time(),
            now=manager.clock.monotonic(),
            down_after=manager.config.down_after,
            left_out=manager.members_left_out,
            operator_reasons=self._operator_reasons(list(pool.servers.values())),
        )

    def history(self, *, pool: str | None = None, since: float | None = None) -> History:
        ring = self.manager.history
        if pool is not None and pool not in self.manager.fleet.pools and pool not in ring.pools():
            raise NotFound(f"no pool {pool!r}")
        return ring.view(pool=pool, since=since)

    def stats(self) -> ManagerStats:
        manager = self.manager
        plan = manager.plan
        age = None
        if plan is not None and plan.generated_at is not None:
            age = max(0.0, manager.clock.time() - plan.generated_at)
        return ManagerStats(
            plan_version=manager.version,
            plan_age=age,
            tick_seconds=manager.tick_seconds,
            tick_errors=manager.tick_errors,
            reports=dict(manager.ingest.counts),
            ready=manager.ready(),
            role="leader" if manager.acting else "standby",
            epoch=manager.epoch,
        )

    def telemetry(self) -> Telemetry:
        manager = self.manager
        plan_members: dict[str, Counter[str]] = {}
        if manager.plan is not None:
            for plan_pool in manager.plan.pools:
                plan_members[plan_pool.name] = Counter(m.state.value for m in plan_pool.members)
        left_out: Counter[str] = Counter()
        for server_id in manager.members_left_out:
            server = manager.fleet.servers.get(server_id)
            if server is not None:
                left_out[server.record.pool] += 1
        now = manager.clock.monotonic()
        pools = []
        for name, pool in manager.fleet.pools.items():
            lifecycle = manager.lifecycles.get(name)
            members = plan_members.get(pool.config.dns_name, Counter())
            pools.append(
                PoolTelemetry(
                    name=name,
                    plan_members=(
                        {state.value: members[state.value] for state in MemberState}
                        if manager.plan is not None
                        else {}
                    ),
                    left_out=left_out[name],
                    launches=lifecycle.launches if lifecycle is not None else None,
                    launch_failures=lifecycle.launch_failures if lifecycle is not None else None,
                    launch_backoff=lifecycle is not None and now < lifecycle.launch_paused_until,
                )
            )
        clusters = []
        for name, controller in manager.clusters.items():
            alive = set(controller.alive(controller.clock()))
            clusters.append(
                ClusterTelemetry(
                    name=name,
                    failovers=controller.failovers,
                    tick_errors={
                        **dict.fromkeys(CLUSTER_TICK_PARTS, 0),
                        **controller.tick_errors,
                    },
                    nodes_alive={
                        node.node_id: node.node_id in alive for node in controller.settings.nodes
                    },
                )
            )
        plan = manager.config.plan
        return Telemetry(
            plan_refresh=plan.refresh,
            plan_stale_after=plan.stale_after,
            plan_refused=manager.plan_problem is not None,
            plans_refused=manager.plans_refused,
            publish_errors=manager.publish_errors,
            store_up=manager.store_up,
            tick_part_errors={**dict.fromkeys(TICK_PARTS, 0), **manager.part_errors},
            first_answers={
                server_id: first for server_id, (first, _) in manager.answer_counts().items()
            },
            pools=tuple(pools),
            clusters=tuple(clusters),
        )

    # -- changes ------------------------------------------------------------------------------

    def _build(self, kind: type[Any], document: Mapping[str, Any], what: str) -> Any:
        # Characters as they are, not \u escapes: YAML reads an escaped surrogate pair (any
        # character beyond U+FFFF) as two lone surrogates.
        text = json.dumps(dict(document), indent=1, ensure_ascii=False)
        refuse_files = self.manager.config.runtime_pools.refuse_files
        return parse_config(text, kind, source=what, refuse_files=refuse_files)

    async def create_pool(self, spec: Mapping[str, Any]) -> PoolView:
        pool: PoolConfig = self._build(PoolConfig, spec, "pool")
        self.manager.add_pool(pool)
        return self.pool(pool.name)

    async def update_pool(self, name: str, spec: Mapping[str, Any]) -> PoolView:
        pool: PoolConfig = self._build(PoolConfig, {**spec, "name": name}, "pool")
        await self.manager.replace_pool(pool)
        return self.pool(name)

    async def delete_pool(self, name: str) -> None:
        await self.manager.remove_pool(name)

    async def add_member(self, pool: str, member: Mapping[str, Any]) -> ServerView:
        built: MemberConfig = self._build(MemberConfig, member, "member")
        server = await self.manager.add_member(pool, built)
        return self._server_view(server, self._members())

    async def remove_member(self, server_id: str) -> None:
        await self.manager.remove_member(server_id)

    async def act(self, server_id: str, action: AdminAction, reason: str) -> ServerView:
        server = self.manager.admin(server_id, action, reason)
        return self._server_view(server, self._members())


_CONFORMS: Callable[[Manager], ManagerControl] = Control  # mypy checks Control is one


@dataclass(frozen=True, slots=True)
class _Standing:
    """A name in the published plan: its pool there, its rotation, its members' shares."""

    pool: Pool | None
    answers: PoolAnswers | None
    members: Mapping[str, Member]
    shares: Mapping[str, Shares]


def _fractions(values: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Each value (the product of a pair of numbers) over their sum; values that are not
    finite numbers at least 0 are left out (a view never fails on what it holds)."""
    numbers: dict[str, float] = {}
    for key, value in values.items():
        try:
            number = float(value[0]) * float(value[1])
        except (TypeError, ValueError, OverflowError):
            continue
        if math.isfinite(number) and number >= 0:
            numbers[key] = number
    total = math.fsum(numbers.values())
    if not (total > 0 and math.isfinite(total)):
        return {}
    return {key: number / total for key, number in numbers.items()}
