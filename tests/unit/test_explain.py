"""Why a name answers as it does: the explanation from the published plan, server by server."""

from __future__ import annotations

from pathlib import Path

import pytest

from dnslb.control import AdminAction, NotFound
from dnslb.selection import pool_answers
from tests.unit.test_history import Lab, token

__all__ = ["token"]  # the agent token's environment variable, for every test here


def reasons(lab: Lab) -> dict[str, str]:
    return {member.id: member.why for member in lab.control.explain("www").members}


def test_no_plan_and_unknown_names_are_not_found(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    with pytest.raises(NotFound, match="no plan published yet"):
        lab.control.explain("www")
    lab.step(seconds=2)
    with pytest.raises(NotFound, match="no pool named 'nope'"):
        lab.control.explain("nope")
    for name in ("www", "www.example.test", "WWW.Example.Test.", " www.example.test"):
        assert lab.control.explain(name).pool == "www"


def test_every_member_answered_with_its_share_and_an_answer_of_now(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    lab.step(seconds=2)
    found = lab.control.explain("www.example.test")
    plan = lab.manager.plan
    assert plan is not None
    assert (found.name, found.plan_version, found.stale) == (
        "www.example.test",
        plan.version,
        False,
    )
    assert (found.k, found.ttl_floor, found.fallback) == (4, 5, "fail_open")
    assert (found.th_over, found.pause_above, found.resume_below) == (0.8, 0.8, 0.7)
    assert [m.id for m in found.members] == ["s1", "s2", "s3"]
    for member in found.members:
        assert member.in_answers and member.plan_state == "active"
        assert member.first_share == pytest.approx(1 / 3) and member.answer_share == 1.0
        assert member.why.startswith(f"answered: weight {member.weight:g}, TTL {member.ttl} s")
    # The answer is the core's own first answer of the published plan's rotation.
    [answer] = found.answers
    [pool] = plan.pools
    first = pool_answers(pool).v4[0]
    assert answer.family == "A" and answer.rotation == len(pool_answers(pool).v4)
    assert answer.members == tuple(m.id for m in first.members)
    assert answer.addresses == tuple(m.address for m in first.members)
    assert answer.ttl == first.ttl and not answer.fallback


def test_each_reason_for_being_out_of_the_answers(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    lab.step(seconds=2)
    lab.step(lambda s: 95 if s == "s3" else 20)
    why = reasons(lab)
    assert why["s3"] == (
        "paused by the policy: utilization 0.95 (newest sample 0.95) went above its pause "
        "threshold (th_over 0.8, or 1.25 x the pool's mean); "
        "resumes when both are below 0.70"
    )
    s3 = lab.control.explain("www").members[2]
    assert (s3.paused, s3.in_answers, s3.plan_state, s3.answer_share) == (True, False, "paused", 0)
    assert lab.control.server("s3").why == why["s3"]  # the servers' view says the same

    lab.manager.admin("s1", AdminAction.PAUSE, "kernel update")
    lab.step()
    assert reasons(lab)["s1"] == "paused by an operator (kernel update) until resumed"
    lab.manager.admin("s1", AdminAction.RESUME, "")
    lab.manager.admin("s1", AdminAction.DRAIN, "retire it")
    lab.step()
    assert reasons(lab)["s1"] == "draining: operator: retire it; never answered again"
    lab.manager.admin("s1", AdminAction.ENABLE, "")
    lab.manager.admin("s1", AdminAction.DISABLE, "")
    lab.step()
    assert reasons(lab)["s1"] == "disabled: operator; not answered until enabled"


def test_a_silent_server_and_the_fallback(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    lab.step(seconds=2)
    lab.manager.admin("s1", AdminAction.PAUSE, "kernel update")
    lab.step({"s1": 10, "s3": 95}.get, seconds=5)
    why = reasons(lab)
    assert why["s2"].startswith("down: no report for ")
    # s1 is paused by an operator, s3 by the policy (the pool's mean, 0.53, leaves room), and
    # s2 is down: fail_open answers the paused ones.
    assert why["s1"].startswith("paused by an operator (kernel update)")
    assert why["s3"].startswith("paused by the policy")
    for server in ("s1", "s3"):
        assert why[server].endswith(
            "; answered anyway by the fallback (fail_open: no member is eligible)"
        )
    [answer] = lab.control.explain("www").answers
    assert answer.fallback and set(answer.members) == {"s1", "s3"} and answer.ttl == 5


def test_a_stale_plan_answers_with_the_ttl_floor(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    lab.step(seconds=2)
    plan = lab.manager.plan
    assert plan is not None and plan.stale_after is not None
    lab.clock.advance(plan.stale_after + 1)  # no tick: the manager is stuck
    found = lab.control.explain("www")
    assert found.stale and found.plan_age == plan.age(lab.clock.time()) > plan.stale_after
    assert [answer.ttl for answer in found.answers] == [5]


def test_a_hot_server_that_serves_on_says_why(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    lab.step(seconds=2)
    lab.step(lambda s: 95 if s == "s3" else 60)  # s1 and s2 would have to take 2.15
    assert reasons(lab)["s3"].endswith(
        "; above its pause threshold (0.95 > 0.90), not paused: the pool's other servers have "
        "no room for its clients"
    )
    lab.step(lambda s: 95 if s == "s3" else 10)  # they could take 1.15: it pauses
    lab.step(10)  # and resumes
    lab.step(lambda s: 95 if s == "s3" else 10)
    assert reasons(lab)["s3"].endswith(
        "; above its pause threshold (0.95 > 0.80), not paused: resumed 1 s ago (pause_dwell 30 s)"
    )
    lab.step(90)
    assert reasons(lab)["s1"].endswith(
        "; above th_over (0.90), not paused: the pool's mean utilization 0.90 is at th_over, and "
        "the autoscaler carries a hot pool"
    )
    lab.step(10)
    assert all(why.startswith("answered") and "paused" not in why for why in reasons(lab).values())


def test_an_answered_server_says_what_its_share_correction_does(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    lab.step(seconds=2)
    for _ in range(20):  # s1 stays busier than the others: its weight loses, theirs gain
        lab.step(lambda s: 60 if s == "s1" else 20)
    why = reasons(lab)
    factor = lab.control.server("s1").share_correction
    assert factor is not None and factor < 0.99
    assert f"(x{factor:.2f} share correction)" in why["s1"]
    assert "(x1." in why["s2"] and "share correction" in why["s3"]
