"""From the fleet to a plan: health verdicts and the plan builder. Pure functions over snapshots.

:func:`health_of` says whether a server is healthy now (fresh report, readable source, passing
check), unhealthy (and why), or not known yet (the manager has just started). :func:`build_plan`
turns pools and servers into the :class:`~dnslb.plan.Plan` the pipe backends answer from: active,
healthy, unpaused servers with their weight and TTL; paused, down, draining and disabled ones with
that state (never answered, but the fallback and operators see them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from dnslb.dnsname import is_within, normalize
from dnslb.errors import ConfigError, PlanError
from dnslb.model import ServerState
from dnslb.plan import (
    MAX_TTL,
    MAX_UTILIZATION,
    MAX_WEIGHT,
    Member,
    MemberState,
    Plan,
    Pool,
    Record,
    Soa,
    Zone,
    member_problems,
    parse_plan,
    plan_to_dict,
)
from dnslb.policy import member_values
from manager.config import PoolConfig, RecordConfig, ZoneConfig
from manager.fleet import PoolRuntime, ServerRuntime

_PLAN_STATES = {
    ServerState.DOWN: MemberState.DOWN,
    ServerState.DRAINING: MemberState.DRAINING,
    ServerState.DISABLED: MemberState.DISABLED,
}


def health_of(
    server: ServerRuntime,
    *,
    now: float,
    down_after: float,
    started_at: float,
    checked: bool,
) -> tuple[bool | None, str]:
    """``(True, why)`` healthy, ``(False, why)`` unhealthy, ``(None, why)`` not known yet.

    ``now`` and ``started_at`` (when the manager started) are monotonic seconds; ``checked``
    says whether the pool has an active health check.
    """
    if server.report_at is None or server.report is None:
        if now - started_at < down_after:
            return None, "no report yet"
        return False, f"no report for {down_after:g} s"
    age = now - server.report_at
    if age > down_after:
        return False, f"no report for {age:.1f} s"
    if server.report.error:
        return False, f"agent reports: {server.report.error}"
    if checked and server.check.healthy is False:
        return False, f"health check failing: {server.check.last_error}"
    if checked and server.check.healthy is None:
        return None, "health check pending"
    return True, "reporting" + (" and passing its health check" if checked else "")


def eligible(server: ServerRuntime, *, now: float, down_after: float) -> bool:
    """Whether ``server`` may be answered: active, with a fresh report, unpaused."""
    record = server.record
    report = server.report
    report_at = server.report_at
    return (
        record.state is ServerState.ACTIVE
        and report_at is not None
        and now - report_at <= down_after
        and report is not None
        and not report.error
        and not server.paused
        and not record.admin_paused
    )


def plan_member(
    pool: PoolRuntime, server: ServerRuntime, *, now: float, wall: float, down_after: float
) -> Member | None:
    """The server as a plan member, or None when it has no place in the plan yet (or any more)."""
    record = server.record
    state = record.state
    load = server.load
    if state is ServerState.ACTIVE:
        if eligible(server, now=now, down_after=down_after):
            member_state = MemberState.ACTIVE
        elif server.paused or record.admin_paused:
            member_state = MemberState.PAUSED
        else:
            member_state = MemberState.DOWN  # not heard from since the manager started
    elif state in _PLAN_STATES:
        member_state = _PLAN_STATES[state]
    else:
        return None
    serving_for = wall - (record.serving_since or wall)
    values = member_values(
        load.utilization if load is not None else None,
        server.max_concurrency,
        serving_for,
        pool.answer_policy,
        answered=member_state is MemberState.ACTIVE,
        pool_serving=pool.serving,
        correction=server.share,
    )
    return Member(  # positional, in the order of Member's fields: built for every server
        record.id,
        record.address,
        values.weight,
        values.ttl,
        member_state,
        values.utilization,
        pool.server_location(server),
    )


def build_plan(
    zones: Iterable[Zone],
    pools: Iterable[PoolRuntime],
    *,
    version: int,
    generated_at: float | None,
    stale_after: float | None,
    now: float,
    wall: float,
    down_after: float,
    left_out: dict[str, str] | None = None,
) -> Plan:
    """The plan for this moment. ``now`` is monotonic, ``wall`` the same moment in wall time
    (slow starts are measured in it), ``generated_at`` the plan's stamp.

    Build it with ``version=0`` and ``generated_at=None`` to compare contents between ticks.
    A server whose member a pipe backend would refuse (by :func:`~dnslb.plan.member_problems`:
    an id with a tab, a scoped address...) is left out, and why goes into ``left_out``: one bad
    server never costs the other members their plan.
    """
    # Pools answering for another (``answers_for``: one location each) add their members to
    # its answers; the plan has one pool per name, with the policy of the pool named.
    leads: dict[str, PoolRuntime] = {}
    gathered: dict[str, tuple[list[Member], set[str]]] = {}
    for pool in pools:
        name = pool.config.dns_name
        if pool.config.answers_for is None:
            leads[name] = pool
        members, addresses = gathered.setdefault(name, ([], set()))
        for server in pool.servers.values():
            member = plan_member(pool, server, now=now, wall=wall, down_after=down_after)
            if member is None:
                continue
            problems = _member_problems(server, member)
            if member.address in addresses:
                problems.append(f"address {member.address} is another member's")
            if problems:
                if left_out is not None:
                    left_out[server.id] = "; ".join(problems)
                continue
            addresses.add(member.address)
            members.append(member)
    plan_pools = [
        plan_pool(
            leads[name].config,
            members,
            k=leads[name].answer_k,
            ttl_floor=leads[name].answer_policy.ttl_min,
        )
        for name, (members, _) in gathered.items()
        if name in leads
    ]
    return Plan(
        version=version,
        zones=tuple(
            dataclasses.replace(zone, soa=dataclasses.replace(zone.soa, serial=version % 2**32))
            for zone in zones
        ),
        pools=tuple(plan_pools),
        generated_at=generated_at,
        stale_after=stale_after,
    )


def _member_problems(server: ServerRuntime, member: Member) -> list[str]:
    """:func:`~dnslb.plan.member_problems`, with the costly part (id and address, which rarely
    change) remembered on the server, and the numbers (which change every tick) checked here."""
    cached = server.member_check
    if cached is None or cached[0] != (member.id, member.address):
        fixed = dataclasses.replace(member, weight=0.0, ttl=0, utilization=0.0)
        cached = server.member_check = ((member.id, member.address), tuple(member_problems(fixed)))
    problems = list(cached[1])
    weight, utilization, ttl = member.weight, member.utilization, member.ttl
    if 0 <= weight <= MAX_WEIGHT and 0 <= utilization <= MAX_UTILIZATION and 0 <= ttl <= MAX_TTL:
        return problems  # the common case, kept cheap: it runs for every server at every tick
    for name, value, high in (
        ("weight", weight, MAX_WEIGHT),
        ("utilization", utilization, MAX_UTILIZATION),
        ("ttl", ttl, MAX_TTL),
    ):
        if not 0 <= value <= high:  # NaN fails both comparisons
            problems.append(f"{name} {value!r} is out of range")
    return problems


def plan_pool(
    config: PoolConfig,
    members: list[Member],
    *,
    k: int | None = None,
    ttl_floor: int | None = None,
) -> Pool:
    """The pool's part of the plan; ``k`` and ``ttl_floor``: addresses per answer and the TTL
    floor if not the policy's (as :func:`~dnslb.policy.covering_k` and
    :func:`~dnslb.policy.covering_ttl_min` set them)."""
    policy = config.policy
    return Pool(
        name=config.dns_name,
        members=tuple(sorted(members, key=lambda member: member.id)),
        k=k if k is not None else policy.k,
        ttl_floor=ttl_floor if ttl_floor is not None else policy.ttl_min,
        fallback=policy.fallback,
        networks=config.plan_networks(),
        geoip=config.geoip.plan_geoip() if config.geoip is not None else None,
    )


def plan_zones(zones: Iterable[ZoneConfig]) -> tuple[Zone, ...]:
    """The configured zones, checked by the plan's own validator so that every plan published
    is valid; a :class:`~dnslb.errors.ConfigError` names each bad record."""
    built = tuple(plan_zone(zone, serial=0) for zone in zones)
    try:
        return parse_plan(plan_to_dict(Plan(version=0, zones=built))).zones
    except PlanError as exc:
        raise ConfigError("invalid zones", exc.problems) from None


def plan_zone(zone: ZoneConfig, *, serial: int) -> Zone:
    name = normalize(zone.name)
    ns = tuple(normalize(server) for server in zone.ns)
    soa = zone.soa
    return Zone(
        name=name,
        soa=Soa(
            mname=normalize(soa.mname) if soa.mname else ns[0],
            rname=normalize(soa.rname) if soa.rname else f"hostmaster.{name}",
            serial=serial,
            refresh=soa.refresh,
            retry=soa.retry,
            expire=soa.expire,
            minimum=soa.minimum,
            ttl=soa.ttl,
        ),
        ns=ns,
        ns_ttl=zone.ns_ttl,
        records=tuple(_record(record, name) for record in zone.records),
    )


def _record(record: RecordConfig, zone: str) -> Record:
    """A record with its owner made absolute: ``@`` is the apex, and a name that does not already
    end with the zone (or a dot) is relative to it."""
    name = normalize(record.name)
    if record.name == "@":
        owner = zone
    elif record.name.endswith(".") or is_within(name, zone):
        owner = name
    else:
        owner = f"{name}.{zone}"
    return Record(name=owner, type=record.type, ttl=record.ttl, content=record.content)
