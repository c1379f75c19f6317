"""The load policy, table-driven: smoothing, pause with hysteresis, weights, slow start, TTLs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dnslb.config import parse_config
from dnslb.errors import ConfigError
from dnslb.policy import (
    PoolPolicy,
    ServerLoad,
    answer_ttl_cap,
    correct_shares,
    covering_k,
    covering_ttl_min,
    inferred_correction,
    is_paused,
    judge_pause,
    member_ttl,
    member_values,
    member_weight,
    pause_room,
    pause_threshold,
    share_factor,
    smooth,
    update_load,
)


def fold(
    load: ServerLoad | None,
    sample: float,
    at: float,
    policy: PoolPolicy,
    pool_mean: float | None = None,
    room: bool = True,
) -> ServerLoad:
    """A sample folded in, then judged against the pool, as a manager's tick does."""
    folded = update_load(load, sample, at, policy)
    return judge_pause(folded, policy, pause_threshold(policy, pool_mean), at, room=room)


POLICY = PoolPolicy(
    th_over=0.8,
    hysteresis=0.1,
    pause_dwell=0.0,  # the dwell time's own tests set it
    ttl_max=60,
    ttl_min=5,
    ttl_knee=0.5,
    ttl_function="linear",
    weight_function="spare",
)


@pytest.mark.parametrize(
    ("previous", "sample", "elapsed", "tau", "expected"),
    [
        pytest.param(0.0, 1.0, 1.0, 0.0, 1.0, id="no-smoothing"),
        pytest.param(0.0, 1.0, 1.0, 1.0, 1 - 0.36787944117, id="one-time-constant"),
        pytest.param(0.5, 0.5, 3.0, 2.0, 0.5, id="steady"),
        pytest.param(0.2, 1.0, 0.0, 1.0, 0.2, id="no-time-passed"),
        pytest.param(0.0, 1.0, 100.0, 1.0, 1.0, id="long-ago"),
    ],
)
def test_smooth(
    previous: float, sample: float, elapsed: float, tau: float, expected: float
) -> None:
    assert smooth(previous, sample, elapsed, tau) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("was_paused", "utilization", "paused"),
    [
        pytest.param(False, 0.79, False, id="below"),
        pytest.param(False, 0.80, False, id="at-threshold"),
        pytest.param(False, 0.81, True, id="above"),
        pytest.param(True, 0.75, True, id="inside-hysteresis-stays"),
        pytest.param(True, 0.70, True, id="at-resume-line-stays"),
        pytest.param(True, 0.69, False, id="below-resume-line"),
    ],
)
def test_pause_with_hysteresis(was_paused: bool, utilization: float, paused: bool) -> None:
    assert is_paused(was_paused, utilization, POLICY, POLICY.th_over) is paused


def test_overload_pauses_at_once_and_recovery_waits_for_the_average() -> None:
    policy = dataclasses.replace(POLICY, smoothing=2.0)
    load = fold(None, 0.3, at=0.0, policy=policy)
    assert not load.paused
    load = fold(load, 0.95, at=1.0, policy=policy)  # the sample alone pauses it
    assert load.paused
    assert load.utilization < 0.8
    for second in range(2, 7):
        load = fold(load, 0.95, at=float(second), policy=policy)
    load = fold(load, 0.60, at=7.0, policy=policy)  # sample low, average still high
    assert load.paused
    steps = 0
    while load.paused and steps < 20:
        steps += 1
        load = fold(load, 0.60, at=7.0 + steps, policy=policy)
    assert not load.paused
    assert load.utilization < 0.7
    assert steps >= 2  # came back carefully, not on the first low sample


@pytest.mark.parametrize(
    ("pool_mean", "relative", "threshold"),
    [
        pytest.param(None, 1.25, 0.8, id="no-pool-figure-th-over"),
        pytest.param(0.3, 1.25, 0.8, id="cool-pool-th-over"),
        pytest.param(0.72, 1.25, 0.9, id="warm-pool-relative"),
        pytest.param(0.8, 1.25, math.inf, id="hot-pool-nobody-pauses"),
        pytest.param(2.5, 1.25, math.inf, id="overloaded-pool-nobody-pauses"),
        pytest.param(0.72, 0.0, 0.8, id="paper-th-over-alone"),
        pytest.param(2.5, 0.0, 0.8, id="paper-pauses-a-hot-pool"),
    ],
)
def test_pause_threshold_follows_the_pool(
    pool_mean: float | None, relative: float, threshold: float
) -> None:
    policy = dataclasses.replace(POLICY, pause_relative=relative)
    assert pause_threshold(policy, pool_mean) == pytest.approx(threshold)


def test_a_hot_pool_resumes_its_paused_servers_and_pauses_none() -> None:
    load = fold(None, 0.3, at=0.0, policy=POLICY, pool_mean=0.3)
    load = fold(load, 0.95, at=1.0, policy=POLICY, pool_mean=0.3)
    assert load.paused  # it stands out from a cool pool
    load = fold(load, 0.95, at=2.0, policy=POLICY, pool_mean=0.9)
    assert not load.paused  # the others have no room to take its clients
    load = fold(load, 3.0, at=3.0, policy=POLICY, pool_mean=0.9)
    assert not load.paused
    paper = dataclasses.replace(POLICY, pause_relative=0.0)
    assert fold(load, 0.95, at=4.0, policy=paper, pool_mean=0.9).paused


def test_a_warm_pool_pauses_only_a_server_that_stands_out() -> None:
    load = fold(None, 0.85, at=0.0, policy=POLICY, pool_mean=0.75)
    assert not load.paused  # above th_over 0.8, but not above 1.25 x 0.75
    load = fold(load, 1.0, at=1.0, policy=POLICY, pool_mean=0.75)
    assert load.paused
    load = fold(load, 0.85, at=2.0, policy=POLICY, pool_mean=0.75)
    assert load.paused  # 0.85 is not below 1.25 x 0.75 - 0.1
    load = fold(load, 0.5, at=3.0, policy=POLICY, pool_mean=0.75)
    assert not load.paused  # both the sample and the average are


@pytest.mark.parametrize(
    ("pool_load", "unpaused", "relative", "room"),
    [
        pytest.param(1.0, 4, 1.25, True, id="three-take-one-third-each"),
        pytest.param(2.3, 4, 1.25, True, id="three-stay-below-th-over"),
        pytest.param(2.5, 4, 1.25, False, id="three-would-go-above-th-over"),
        pytest.param(2.5, 5, 1.25, True, id="four-take-it"),
        pytest.param(0.5, 1, 1.25, False, id="the-only-server-serving"),
        pytest.param(0.0, 0, 1.25, False, id="none-serving"),
        pytest.param(3.0, 4, 0.0, True, id="paper-always"),
    ],
)
def test_pause_room(pool_load: float, unpaused: int, relative: float, room: bool) -> None:
    policy = dataclasses.replace(POLICY, pause_relative=relative)
    assert pause_room(policy, pool_load, unpaused) is room


def test_without_room_a_server_serves_on_and_a_paused_one_resumes_as_usual() -> None:
    load = fold(None, 0.95, at=0.0, policy=POLICY, pool_mean=0.3, room=False)
    assert not load.paused
    load = fold(load, 0.95, at=1.0, policy=POLICY, pool_mean=0.3)
    assert load.paused
    load = fold(load, 0.9, at=2.0, policy=POLICY, pool_mean=0.3, room=False)
    assert load.paused  # room is about pausing one more
    load = fold(load, 0.2, at=3.0, policy=POLICY, pool_mean=0.3, room=False)
    assert not load.paused


def test_a_resumed_server_serves_the_dwell_time_before_it_pauses_again() -> None:
    policy = dataclasses.replace(POLICY, pause_dwell=30.0)
    load = fold(None, 0.95, at=0.0, policy=policy, pool_mean=0.3)
    assert load.paused  # never resumed: no dwell
    load = fold(load, 0.1, at=1.0, policy=policy, pool_mean=0.3)
    assert not load.paused  # a paused server resumes as soon as it is cool
    assert load.resumed_at == 1.0
    load = fold(load, 0.95, at=2.0, policy=policy, pool_mean=0.3)
    assert not load.paused  # hot again, but resumed 1 s ago
    load = fold(load, 0.95, at=30.0, policy=policy, pool_mean=0.3)
    assert not load.paused
    load = fold(load, 0.95, at=31.0, policy=policy, pool_mean=0.3)
    assert load.paused
    assert load.resumed_at == 1.0
    load = fold(load, 0.95, at=32.0, policy=policy, pool_mean=0.9)
    assert not load.paused  # a hot pool resumes every server at once
    assert load.resumed_at == 32.0


@pytest.mark.parametrize(
    ("serving", "cap"),
    [
        pytest.param(None, 60, id="unknown"),
        pytest.param(0, 5, id="none-serving"),
        pytest.param(1, 18, id="one-of-k"),  # 5 + 55 / 4 = 18.75, rounded down
        pytest.param(3, 46, id="three-of-k"),  # 5 + 165 / 4 = 46.25
        pytest.param(4, 60, id="k"),
        pytest.param(20, 60, id="more-than-k"),
    ],
)
def test_answer_ttl_cap_shrinks_with_fewer_servers_than_k(serving: int | None, cap: int) -> None:
    policy = dataclasses.replace(POLICY, k=4)
    assert answer_ttl_cap(policy, serving) == cap
    values = member_values(0.0, 10, 100.0, policy, answered=True, pool_serving=serving)
    assert values.ttl == cap  # an idle server's ttl_max, capped
    fixed = dataclasses.replace(policy, ttl_min=40, ttl_max=40)  # a fixed TTL stays fixed
    assert member_values(0.0, 10, 100.0, fixed, answered=True, pool_serving=serving).ttl == 40


@pytest.mark.parametrize(
    ("utilization", "ttl"),
    [
        pytest.param(0.0, 60, id="idle"),
        pytest.param(0.40, 60, id="at-knee"),
        pytest.param(0.70, 19, id="three-quarters"),  # 60 - 0.75 * 55 = 18.75
        pytest.param(0.80, 5, id="at-th-over"),
        pytest.param(1.50, 5, id="overloaded"),
    ],
)
def test_ttl_falls_from_max_to_min_as_load_rises(utilization: float, ttl: int) -> None:
    assert member_ttl(utilization, POLICY) == ttl


def test_ttl_never_rises_with_load() -> None:
    for name in ("linear", "convex"):
        policy = dataclasses.replace(POLICY, ttl_function=name)
        ttls = [member_ttl(u / 100, policy) for u in range(0, 120)]
        assert ttls == sorted(ttls, reverse=True)


@pytest.mark.parametrize(
    ("utilization", "serving_for", "weight"),
    [
        pytest.param(0.0, 100.0, 100.0, id="idle"),
        pytest.param(0.25, 100.0, 75.0, id="spare-capacity"),
        pytest.param(1.2, 100.0, 5.0, id="overloaded-keeps-the-floor"),
        pytest.param(0.0, 15.0, 50.0, id="half-way-through-slow-start"),
        pytest.param(0.0, 0.0, 5.0, id="just-started"),
    ],
)
def test_weight_is_spare_capacity_ramped_by_slow_start(
    utilization: float, serving_for: float, weight: float
) -> None:
    assert member_weight(utilization, 100, serving_for, POLICY) == pytest.approx(weight)


def test_defaults_are_the_simulators_winners() -> None:
    # docs/simulation.md: a convex TTL curve and squared spare capacity gave the same or better
    # responses with longer TTLs than linear / spare.
    policy = PoolPolicy()
    assert (policy.ttl_function, policy.weight_function) == ("convex", "spare_squared")
    assert member_ttl(0.6, policy) == 46  # 60 - 0.25 * 55 = 46.25: still long half-way up
    assert member_weight(0.5, 100, 100.0, policy) == pytest.approx(25.0)


def test_equal_weights_ignore_load() -> None:
    policy = dataclasses.replace(POLICY, weight_function="equal")
    assert member_weight(0.9, 100, 100.0, policy) == member_weight(0.0, 100, 100.0, policy)


def test_spare_squared_favours_idle_servers_more() -> None:
    policy = dataclasses.replace(POLICY, weight_function="spare_squared")
    assert member_weight(0.5, 100, 100.0, policy) == pytest.approx(25.0)


def test_server_load_is_immutable() -> None:
    load = ServerLoad(utilization=0.1, sample=0.1, paused=False, at=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        load.paused = True  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("ttl_min: 90", "ttl_min (90) must not exceed ttl_max (60)"),
        ("hysteresis: 0.9", "hysteresis (0.9) must be below th_over (0.8)"),
        ("ttl_function: cubic", "ttl_function must be one of linear, convex"),
        ("th_over: 0", "th_over: must be at least 0.01"),
    ],
)
def test_policy_config_rules(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_config(text, PoolPolicy)


SHARES = dataclasses.replace(POLICY, share_gain=0.1, share_bound=2.0)


def test_a_share_correction_takes_weight_from_a_server_above_its_pools_mean() -> None:
    corrections = correct_shares([0.0, 0.0, 0.0], [0.6, 0.4, 0.2], 1.0, SHARES)
    assert corrections == pytest.approx([-0.02, 0.0, 0.02])
    # It integrates: the same gap for 9 s more moves the weights nine times as far again.
    for _ in range(9):
        corrections = correct_shares(corrections, [0.6, 0.4, 0.2], 1.0, SHARES)
    assert corrections == pytest.approx([-0.2, 0.0, 0.2])
    assert share_factor(corrections[0], SHARES) == pytest.approx(math.exp(-0.2))
    # The weight carries the factor.
    plain = member_weight(0.6, 100, 60.0, SHARES)
    assert member_weight(0.6, 100, 60.0, SHARES, corrections[0]) == pytest.approx(
        plain * math.exp(-0.2)
    )


def test_a_share_correction_stops_at_its_bound_and_comes_back_at_once() -> None:
    corrections = [0.0, 0.0]
    for _ in range(100):
        corrections = correct_shares(corrections, [0.9, 0.1], 5.0, SHARES)
    bound = math.log(2.0)
    assert corrections == pytest.approx([-bound, bound])
    assert share_factor(corrections[0], SHARES) == pytest.approx(0.5)
    # Anti-windup: the first turn of the error moves it back (an unbounded integral would
    # have gone on to -20 and needed as long again to return).
    turned = correct_shares(corrections, [0.1, 0.9], 1.0, SHARES)
    assert turned == pytest.approx([-bound + 0.04, bound - 0.04])
    # A tick held up for a minute integrates SHARE_STEP seconds of it, not sixty.
    assert correct_shares([0.0, 0.0], [0.6, 0.4], 60.0, SHARES) == pytest.approx([-0.05, 0.05])


@pytest.mark.parametrize(
    ("corrections", "utilizations", "elapsed", "policy", "expected"),
    [
        ([0.3], [0.9], 1.0, SHARES, [0.3]),  # one server: nothing to share
        ([0.3, -0.3], [0.9, 0.1], 1.0, dataclasses.replace(SHARES, share_gain=0), [0.3, -0.3]),
        # plain round-robin's weights stay equal
        ([0.0, 0.0], [0.9, 0.1], 1.0, dataclasses.replace(SHARES, weight_function="equal"), [0, 0]),
        ([0.3, -0.3], [0.9, 0.1], 0.0, SHARES, [0.3, -0.3]),  # no time passed
        # centred: only ratios of weights matter, so the mean stays 0
        ([0.5, 0.5], [0.4, 0.4], 1.0, SHARES, [0.0, 0.0]),
        # a report may say anything: a queue counts as utilization 2 at most
        ([0.0, 0.0], [1e9, 0.0], 1.0, SHARES, [-0.1, 0.1]),
    ],
)
def test_share_corrections(
    corrections: list[float],
    utilizations: list[float],
    elapsed: float,
    policy: PoolPolicy,
    expected: list[float],
) -> None:
    assert correct_shares(corrections, utilizations, elapsed, policy) == pytest.approx(expected)


def test_a_share_factor_is_one_while_the_pool_corrects_no_shares() -> None:
    assert share_factor(0.5, dataclasses.replace(SHARES, share_gain=0)) == 1.0
    assert share_factor(0.5, dataclasses.replace(SHARES, weight_function="equal")) == 1.0
    assert share_factor(5.0, SHARES) == pytest.approx(2.0)  # bounded, whatever it was given
    assert member_weight(0.0, 10**9, 60.0, SHARES, 5.0) == pytest.approx(2e9)
    # The plan carries a weight of at most MAX_WEIGHT (a pipe backend refuses more).
    values = member_values(0.0, 10**9, 60.0, SHARES, answered=True, correction=5.0)
    assert values.weight == 1e9


@pytest.mark.parametrize("lie", [0.0, 2.0, 1e9, math.inf, math.nan])
def test_a_lying_server_moves_only_its_own_share_correction(lie: float) -> None:
    """Between two honest servers, the correction follows their own gap whatever a third
    reports: the pool's mean moves them alike, and centring takes a common move away."""
    honest = correct_shares([0.1, -0.1, 0.0], [0.6, 0.3, 0.45], 1.0, SHARES)
    lied = correct_shares([0.1, -0.1, 0.0], [0.6, 0.3, lie], 1.0, SHARES)
    assert lied[0] - lied[1] == pytest.approx(honest[0] - honest[1])
    assert all(abs(c) <= math.log(SHARES.share_bound) for c in lied)


@pytest.mark.parametrize("correction", [-0.6, -0.2, 0.0, 0.1, 0.69])
@pytest.mark.parametrize(("utilization", "max_concurrency"), [(0.0, 100), (0.37, 8), (0.99, 50)])
def test_a_published_weight_gives_back_the_correction_it_was_made_with(
    correction: float, utilization: float, max_concurrency: int
) -> None:
    policy = dataclasses.replace(SHARES, slow_start=30.0)
    values = member_values(
        utilization, max_concurrency, 60.0, policy, answered=True, correction=correction
    )
    found = inferred_correction(values.weight, values.utilization, max_concurrency, 60.0, policy)
    assert found is not None
    # the weight carries hundredths: the correction comes back within their share of it
    assert found == pytest.approx(correction, abs=0.005 / values.weight * 1.01 + 1e-9)


def test_a_weight_that_cannot_tell_its_correction_gives_none() -> None:
    ramping = dataclasses.replace(SHARES, slow_start=30.0)
    assert inferred_correction(40.0, 0.6, 100, 10.0, ramping) is None  # still ramping up
    assert inferred_correction(40.0, 0.6, 100, 60.0, ramping) is not None
    off = dataclasses.replace(SHARES, share_gain=0)
    assert inferred_correction(40.0, 0.6, 100, 60.0, off) is None
    assert inferred_correction(0.5, 0.6, 100, 60.0, SHARES) is None  # too few digits
    assert inferred_correction(1e9, 0.0, 10**9, 60.0, SHARES) is None  # cut at MAX_WEIGHT
    # a plan may say anything: the correction stays within the pool's bounds
    assert inferred_correction(1e6, 1.0, 1, 60.0, SHARES) == pytest.approx(math.log(2))
    assert inferred_correction(1.0, 0.0, 10**6, 60.0, SHARES) == pytest.approx(-math.log(2))


def test_k_covers_the_pool_when_few_resolvers_hold_its_answers() -> None:
    policy = PoolPolicy(k=4, k_coverage=3.0)
    # 4 resolvers holding answers of 4 addresses cover 10 servers 1.6 times: 8 addresses each
    # cover them 3.2 times; 2 resolvers get every address
    assert covering_k(policy, active=10, holders=4.0) == 8
    assert covering_k(policy, active=10, holders=2.0) == 10
    assert covering_k(policy, active=10, holders=8.0) == 4  # 3 x 10 / 8 = 3.75: k already
    assert covering_k(policy, active=30, holders=15.0) == 6  # ceil(3 x 30 / 15)
    assert covering_k(policy, active=100, holders=0.5) == 64  # at most the plan's MAX_K
    assert covering_k(policy, active=100, holders=0.0) == 64  # nobody holds any: all of them


def test_the_ttl_floor_falls_while_few_resolvers_hold_the_pools_answers() -> None:
    policy = PoolPolicy(ttl_min=5, k_coverage=3.0)
    # 3 resolvers a server are wanted: 30 for 10 servers
    assert covering_ttl_min(policy, active=10, holders=30.0) == 5
    assert covering_ttl_min(policy, active=10, holders=500.0) == 5
    assert covering_ttl_min(policy, active=10, holders=18.0) == 3  # 5 x 18 / 30
    assert covering_ttl_min(policy, active=6, holders=7.0) == 2  # 5 x 7 / 18 = 1.9
    assert covering_ttl_min(policy, active=10, holders=4.0) == 1  # 4 lumps: as short as it goes
    assert covering_ttl_min(policy, active=10, holders=0.0) == 1  # never 0: resolvers cache
    assert covering_ttl_min(PoolPolicy(ttl_min=30), active=10, holders=10.0) == 10
    # the queries of the floor (holders / floor) stay near those of 3 resolvers a server
    # at ttl_min: 30 / 5 = 6 a second
    for holders in (4.0, 9.0, 15.0, 29.0):
        assert holders / covering_ttl_min(policy, 10, holders) <= 6.0 * 1.5


def test_the_ttl_floor_stays_when_holders_are_unknown_or_coverage_is_off() -> None:
    assert covering_ttl_min(PoolPolicy(ttl_min=5), active=10, holders=None) == 5
    assert covering_ttl_min(PoolPolicy(ttl_min=5, k_coverage=0), active=10, holders=1.0) == 5
    assert covering_ttl_min(PoolPolicy(ttl_min=1), active=10, holders=1.0) == 1
    assert covering_ttl_min(PoolPolicy(ttl_min=0, ttl_max=0), active=10, holders=1.0) == 0
    assert covering_ttl_min(PoolPolicy(ttl_min=5), active=0, holders=1.0) == 5
    fixed = PoolPolicy(ttl_min=40, ttl_max=40)  # a fixed TTL, as plain round-robin's
    assert covering_ttl_min(fixed, active=10, holders=1.0) == 40


def test_k_stays_when_holders_are_unknown_the_pool_is_small_or_coverage_is_off() -> None:
    policy = PoolPolicy(k=4, k_coverage=3.0)
    assert covering_k(policy, active=10, holders=None) == 4
    assert covering_k(policy, active=4, holders=1.0) == 4  # every answer holds the pool
    assert covering_k(policy, active=2, holders=1.0) == 4  # (the plan answers what it has)
    assert covering_k(PoolPolicy(k=4, k_coverage=0), active=10, holders=1.0) == 4
    assert covering_k(PoolPolicy(k=8), active=10, holders=100.0) == 8
