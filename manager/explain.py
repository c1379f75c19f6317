"""Why a name answers as it does: each member's standing in the published plan, in words.

:func:`explain_pool` builds :class:`~dnslb.control.Explanation` for ``dnslb ctl explain`` and
``GET /v1/explain``; :func:`server_reason` is the one sentence per server that the explanation,
``/v1/servers`` and the dashboard's rows all show. The answers come from the core's own selection
(:func:`dnslb.selection.pool_answers`, what the pipe backend compiles) over the *published*
plan, so what is said is what the pipe backends serve, not what the next plan may hold.

Pure functions over the fleet and the plan; the clock is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dnslb.control import AnswerExample, Explanation, MemberExplanation
from dnslb.model import ServerState
from dnslb.plan import Member, MemberState, Plan, Pool
from dnslb.policy import PoolPolicy, pause_threshold, share_factor
from dnslb.selection import Answer, PoolAnswers, answer_shares
from manager.fleet import PoolRuntime, ServerRuntime
from manager.planner import health_of


@dataclass(frozen=True, slots=True)
class Shares:
    """A member's place in its family's rotation: shares of the answers (0 to 1)."""

    first: float = 0.0
    seen: float = 0.0
    fallback: bool = False  # answered by the pool's fallback


def rotation_shares(answers: PoolAnswers) -> dict[str, Shares]:
    """Per member id: the share of its family's answers it comes first in and is in."""
    fallback = {
        member.id
        for family in (answers.v4, answers.v6)
        for answer in family
        if answer.fallback
        for member in answer.members
    }
    return {
        member: Shares(first, seen, member in fallback)
        for member, (first, seen) in answer_shares(answers).items()
    }


def server_reason(
    server: ServerRuntime | None,
    member: Member | None,
    shares: Shares | None,
    *,
    policy: PoolPolicy | None,
    fallback: str,
    now: float,
    down_after: float,
    left_out: str | None = None,
    operator_reason: str | None = None,
    pool_mean: float | None = None,
    pool_room: bool = True,
) -> str:
    """Why a server is or is not in the published plan's answers, in one sentence.

    ``member`` is its member in the published plan (None: not in it), ``shares`` its place in
    the plan's rotation (None: in no answer), ``now`` monotonic seconds, ``left_out`` why the
    planner left it out of plans (bad data), ``operator_reason`` the reason an operator gave
    for a pause, ``pool_mean`` its pool's mean utilization (the pause threshold follows it),
    ``pool_room`` whether its pool had room to pause one more server at the last tick.
    """
    answered = shares is not None and shares.seen > 0
    if server is None:
        return "in the published plan, but no longer managed: gone from the next plan"
    record = server.record
    state = record.state
    if state is ServerState.TERMINATED:
        return f"terminated: {record.state_reason}"
    if state is ServerState.LAUNCHING:
        return f"launching: {record.state_reason}; answered once it reports healthy"
    if state is ServerState.WARMING:
        return f"warming: {record.state_reason}"
    if state is ServerState.DISABLED:
        return f"disabled: {record.state_reason}; not answered until enabled"
    if state is ServerState.DRAINING:
        return f"draining: {record.state_reason}; never answered again"
    if left_out is not None:
        return f"left out of the plan: {left_out}"
    if state is ServerState.DOWN:
        why = f"down: {record.state_reason}"
        return _fallback(why, answered, fallback)
    unanswered = _active_reason(
        server,
        policy,
        now=now,
        down_after=down_after,
        operator=operator_reason,
        pool_mean=pool_mean,
    )
    if unanswered is None:  # eligible now
        if member is None:
            return "eligible: in the next plan"
        if member.state is not MemberState.ACTIVE:
            return f"eligible again: the published plan still has it {member.state.value}"
        if not answered:
            return f"in the plan with weight {member.weight:g}, in no answer (others outweigh it)"
        assert shares is not None
        factor = share_factor(server.share, policy) if policy is not None else 1.0
        corrected = f" (x{factor:.2f} share correction)" if round(factor, 2) != 1 else ""
        if server.capacity_bounded and server.report is not None:
            corrected += (
                f" (it reports max concurrency {server.report.max_concurrency}, counted as "
                f"{server.max_concurrency}: its pool's capacity_spread times the pool's median)"
            )
        why = (
            f"answered: weight {member.weight:g}{corrected}, TTL {member.ttl} s; first in "
            f"{shares.first:.0%} and in {shares.seen:.0%} of the answers"
        )
        held = _serving_on(server, policy, pool_mean=pool_mean, room=pool_room, now=now)
        return f"{why}; {held}" if held else why
    return _fallback(unanswered, answered, fallback)


def _serving_on(
    server: ServerRuntime,
    policy: PoolPolicy | None,
    *,
    pool_mean: float | None,
    room: bool,
    now: float,
) -> str | None:
    """Why a server above the utilization at which it would pause is not paused (None when it
    is not above it, or will pause at the next tick)."""
    load = server.load
    if policy is None or load is None or server.paused or not policy.pause:
        return None
    try:
        level = float(max(load.sample, load.utilization))
    except (OverflowError, TypeError, ValueError):  # a view never fails on an odd figure
        return None
    if not math.isfinite(level):
        return None
    threshold = pause_threshold(policy, pool_mean)
    if math.isinf(threshold):
        if level <= policy.th_over or pool_mean is None:
            return None
        return (
            f"above th_over ({level:.2f}), not paused: the pool's mean utilization "
            f"{pool_mean:.2f} is at th_over, and the autoscaler carries a hot pool"
        )
    if level <= threshold:
        return None
    above = f"above its pause threshold ({level:.2f} > {threshold:.2f}), not paused"
    if not room:
        return f"{above}: the pool's other servers have no room for its clients"
    resumed = load.resumed_at
    if resumed is not None and now - resumed < policy.pause_dwell:
        return f"{above}: resumed {now - resumed:.0f} s ago (pause_dwell {policy.pause_dwell:g} s)"
    return None


def _active_reason(
    server: ServerRuntime,
    policy: PoolPolicy | None,
    *,
    now: float,
    down_after: float,
    operator: str | None,
    pool_mean: float | None,
) -> str | None:
    """Why an active server is not eligible, or None when it is."""
    load = server.load
    by_policy = None
    if server.paused and load is not None and policy is not None:
        threshold = pause_threshold(policy, pool_mean)
        went = (
            f"utilization {load.utilization:.2f} (newest sample {load.sample:.2f}) went above "
            f"its pause threshold (th_over {policy.th_over:g}, or {policy.pause_relative:g} x "
            "the pool's mean)"
        )
        if math.isinf(threshold):
            by_policy = f"{went}; resumes at its next report (the pool's mean is at th_over)"
        else:
            resume = threshold - policy.hysteresis
            by_policy = f"{went}; resumes when both are below {resume:.2f}"
    if server.record.admin_paused:
        why = f"paused by an operator ({operator or 'no reason given'}) until resumed"
        return f"{why}; the policy pauses it too: {by_policy}" if by_policy else why
    if by_policy is not None:
        return f"paused by the policy: {by_policy}"
    healthy, why = health_of(server, now=now, down_after=down_after, started_at=now, checked=False)
    if healthy is False or server.report_at is None:
        return f"not reporting: {why if server.report_at is not None else 'no report yet'}"
    return None


def _fallback(why: str, answered: bool, fallback: str) -> str:
    if answered:
        return f"{why}; answered anyway by the fallback ({fallback}: no member is eligible)"
    return why


def explain_pool(
    pool: PoolRuntime,
    plan: Plan,
    answers: PoolAnswers | None,
    *,
    wall: float,
    now: float,
    down_after: float,
    left_out: Mapping[str, str],
    operator_reasons: Mapping[str, str],
) -> Explanation:
    """The explanation of ``pool`` from the published ``plan`` and its ``answers`` (the
    rotation of the plan's pool; None when the pool is not in the plan yet)."""
    dns_name = pool.config.dns_name
    planned = next((p for p in plan.pools if p.name == dns_name), None)
    members = {m.id: m for m in planned.members} if planned is not None else {}
    shares = rotation_shares(answers) if answers is not None else {}
    policy = pool.policy
    ids = sorted(
        {s.id for s in pool.servers.values() if s.state is not ServerState.TERMINATED}
        | members.keys()
    )
    explained = []
    for server_id in ids:
        server = pool.servers.get(server_id)
        member = members.get(server_id)
        share = shares.get(server_id)
        why = server_reason(
            server,
            member,
            share,
            policy=policy,
            fallback=policy.fallback.value,
            now=now,
            down_after=down_after,
            left_out=left_out.get(server_id),
            operator_reason=operator_reasons.get(server_id),
            pool_mean=pool.mean_utilization,
            pool_room=pool.pause_room,
        )
        load = server.load if server is not None else None
        explained.append(
            MemberExplanation(
                id=server_id,
                address=member.address if member is not None else _address(server),
                state=server.state if server is not None else None,
                plan_state=member.state.value if member is not None else None,
                in_answers=share is not None and share.seen > 0,
                weight=member.weight if member is not None else None,
                ttl=member.ttl if member is not None else None,
                utilization=load.utilization if load is not None else None,
                first_share=share.first if share is not None else 0.0,
                answer_share=share.seen if share is not None else 0.0,
                paused=server.paused if server is not None else False,
                admin_paused=server.record.admin_paused if server is not None else False,
                why=why,
            )
        )
    examples: list[AnswerExample] = []
    if answers is not None and planned is not None:
        families = (("A", answers.v4), ("AAAA", answers.v6))
        for family, cycle in families:
            if _has_members(planned, family == "AAAA"):
                examples.append(_example(family, cycle))
    age = plan.age(wall)
    threshold = pause_threshold(policy, pool.mean_utilization)
    return Explanation(
        name=dns_name,
        pool=pool.name,
        plan_version=plan.version,
        plan_age=max(0.0, age) if age is not None else None,
        stale=plan.is_stale(wall),
        k=planned.k if planned is not None else policy.k,
        ttl_floor=planned.ttl_floor if planned is not None else policy.ttl_min,
        fallback=(planned.fallback if planned is not None else policy.fallback).value,
        th_over=policy.th_over,
        pause_above=None if math.isinf(threshold) else round(threshold, 9),
        resume_below=None if math.isinf(threshold) else round(threshold - policy.hysteresis, 9),
        members=tuple(explained),
        answers=tuple(examples),
    )


def _address(server: ServerRuntime | None) -> str:
    return server.record.address if server is not None else ""


def _has_members(pool: Pool, ipv6: bool) -> bool:
    return any(member.ipv6 == ipv6 for member in pool.members)


def _example(family: str, cycle: Sequence[Answer]) -> AnswerExample:
    """The first answer of the rotation: each pipe backend starts its laps at a random place,
    so this is one answer a client may get now, not the one it will."""
    answer = cycle[0]
    return AnswerExample(
        family=family,
        members=tuple(member.id for member in answer.members),
        addresses=tuple(member.address for member in answer.members),
        ttl=answer.ttl,
        fallback=answer.fallback,
        rotation=len(cycle),
    )
