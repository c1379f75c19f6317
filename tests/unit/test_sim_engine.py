"""The simulator on small scenarios: determinism, queueing maths, DNS caching, pause, baselines,
failures, autoscaling and drains."""

from __future__ import annotations

import math

import pytest

from dnslb.model import ServerState
from dnslb.policy import ServerLoad
from sim.engine import Simulation, simulate
from sim.scenario import Scenario, parse_scenarios

SMALL = """
name: small
duration: 300
load:
  staircase: {start: 200, step: 200, every: 60, count: 3}
clients: {think_time: 2.0}
resolvers: {count: 20}
servers: {initial: 2, max_concurrency: 20, backlog: 20, boot_delay: 20,
          service: {mean: 0.1}}
scaling: {min_servers: 2, max_servers: 8, window: 5, scale_in_window: 30}
"""


def scenario(text: str = SMALL, extra: str = "") -> Scenario:
    return parse_scenarios(text + extra).scenarios[0]


def test_same_seed_same_results_different_seed_different() -> None:
    first = simulate(scenario(), seed=7)
    again = simulate(scenario(), seed=7)
    other = simulate(scenario(), seed=8)
    assert first == again
    assert first.requests > 1000
    assert other != first
    assert other.requests != first.requests


def _machine_repairman(users: int, slots: int, think: float, service: float) -> float:
    """Exact mean response time of the closed M/M/c//N queue (finite source): ``users`` each
    think for an exponential time of mean ``think``, then queue FIFO for ``slots`` servers of
    exponential service time ``service``."""
    ratio = service / think
    weights = []
    for n in range(users + 1):
        combinations = math.comb(users, n)
        if n <= slots:
            weights.append(combinations * ratio**n)
        else:
            weights.append(
                combinations
                * math.factorial(n)
                / (math.factorial(slots) * slots ** (n - slots))
                * ratio**n
            )
    total = sum(weights)
    in_system = sum(n * weight for n, weight in enumerate(weights)) / total
    throughput = (users - in_system) / think
    return in_system / throughput


@pytest.mark.parametrize(
    ("users", "slots"),
    [
        pytest.param(30, 4, id="light"),
        pytest.param(40, 4, id="busy"),
        pytest.param(48, 4, id="saturated"),
    ],
)
def test_single_server_matches_the_closed_queue_formula(users: int, slots: int) -> None:
    text = f"""
name: mmc
duration: 4000
load: {{steps: [{{at: 0, clients: {users}}}]}}
clients: {{think_time: 1.0, timeout: 10000}}
resolvers: {{count: 1}}
servers: {{initial: 1, max_concurrency: {slots}, service: {{mean: 0.1}}}}
"""
    expected = _machine_repairman(users, slots, think=1.0, service=0.1)
    result = simulate(scenario(text), seed=3)
    # The first seconds start from an empty queue; over 4000 s of about 35 requests a second
    # the mean lies within 4 % of the steady state.
    assert result.mean_response == pytest.approx(expected, rel=0.04)
    assert result.failed == 0


def test_resolvers_honour_the_ttl() -> None:
    text = """
name: ttl
duration: 600
load: {steps: [{at: 0, clients: 500}]}
clients: {think_time: 1.0}
resolvers: {count: 10}
servers: {initial: 3, max_concurrency: 100, service: {mean: 0.05}}
dns:
  all_addresses: true
  policy: {weight_function: equal, ttl_min: 30, ttl_max: 30}
"""
    result = simulate(scenario(text), seed=1)
    # Busy resolvers ask again right after each expiry: 600 / 30 = 20 queries each, plus the
    # staggered first answer; never more.
    assert 10 * 20 <= result.dns_queries <= 10 * 22
    assert result.mean_ttl == 30


def test_users_that_ignore_ttls_rarely_resolve() -> None:
    text = """
name: sticky
duration: 600
load: {steps: [{at: 0, clients: 400}]}
clients: {think_time: 1.0, ignore_ttl_hold: 10000}
resolvers: {count: 10}
servers: {initial: 3, max_concurrency: 100, service: {mean: 0.05}}
dns: {policy: {ttl_min: 5, ttl_max: 5}}
"""
    honouring = simulate(scenario(text, "\n"), seed=1)
    ignoring = simulate(
        scenario(text.replace("ignore_ttl_hold", "ignore_ttl: 1.0, ignore_ttl_hold"))
    )
    assert honouring.dns_queries >= 10 * 600 / 5
    # Users pin their server at their first request; resolvers then see no more lookups.
    assert ignoring.dns_queries < 10 * 10


def _plan_at(simulation: Simulation, loads: list[float], paused: list[bool]) -> None:
    for server, utilization, pause in zip(simulation.servers, loads, paused, strict=True):
        server.load = ServerLoad(utilization=utilization, sample=utilization, paused=pause, at=0)
        server.paused = pause
        server.report_at = 10.0
    simulation._plan(10.0)


def test_paused_servers_are_left_out_of_answers() -> None:
    simulation = Simulation(scenario(SMALL.replace("initial: 2", "initial: 5")))
    _plan_at(simulation, [0.9, 0.2, 0.95, 0.3, 0.1], [True, False, True, False, False])
    answered = {index for servers, _ in simulation.answers for index in servers}
    assert answered == {1, 3, 4}
    assert all(len(servers) == 3 for servers, _ in simulation.answers)  # k=4, 3 eligible


def test_weights_follow_spare_capacity() -> None:
    extra = "dns: {policy: {k: 1, weight_function: spare}}\n"
    simulation = Simulation(scenario(SMALL, extra))
    _plan_at(simulation, [0.75, 0.0], [False, False])
    firsts = [servers[0] for servers, _ in simulation.answers]
    # spare capacity 0.25 against 1.0: the idle server is first in four answers out of five
    assert firsts.count(1) == 4 * firsts.count(0)


def test_plain_round_robin_answers_every_address_with_a_fixed_ttl() -> None:
    extra = """dns:
  pause: false
  all_addresses: true
  policy: {weight_function: equal, ttl_min: 60, ttl_max: 60, slow_start: 0}
"""
    simulation = Simulation(scenario(SMALL.replace("initial: 2", "initial: 4"), extra))
    _plan_at(simulation, [1.5, 0.1, 0.9, 0.0], [False, False, False, False])
    assert sorted(simulation.answers) == [
        ((0, 1, 2, 3), 60),
        ((1, 2, 3, 0), 60),
        ((2, 3, 0, 1), 60),
        ((3, 0, 1, 2), 60),
    ]


def test_without_pause_an_overloaded_server_stays_in_answers() -> None:
    extra = "dns: {pause: false}\n"
    simulation = Simulation(scenario(SMALL, extra))
    simulation._tick(0.0)
    server = simulation.servers[0]
    server.out = [(1000.0 + i, 0, 0.0) for i in range(40)]  # 40 of 20 slots: utilization 2
    simulation._tick(1.0)
    assert server.load is not None and server.load.paused  # the policy's verdict...
    assert not server.paused  # ...which this baseline ignores
    assert any(0 in servers for servers, _ in simulation.answers)


def test_the_product_pauses_an_overloaded_server() -> None:
    simulation = Simulation(scenario())
    simulation._tick(0.0)
    simulation.servers[0].out = [(1000.0 + i, 0, 0.0) for i in range(40)]
    simulation._tick(1.0)
    assert simulation.servers[0].paused
    assert all(0 not in servers for servers, _ in simulation.answers)


def test_a_crashed_server_fails_its_requests_and_leaves_the_answers() -> None:
    text = SMALL + "failures: [{at: 100, servers: 1}]\n"
    simulation = Simulation(scenario(text), seed=2)
    result = simulation.run()
    crashed = simulation.servers[0]
    assert crashed.dead
    assert crashed.state is ServerState.DOWN
    assert result.failed > 0
    assert all(0 not in servers for servers, _ in simulation.answers)


def test_autoscaler_launches_after_the_boot_delay_and_drains_wait_for_ttls() -> None:
    text = SMALL.replace(
        "staircase: {start: 200, step: 200, every: 60, count: 3}",
        "steps: [{at: 0, clients: 200}, {at: 60, clients: 1200}, {at: 200, clients: 100}]",
    ).replace("duration: 300", "duration: 500")
    simulation = Simulation(scenario(text), seed=4)
    result = simulation.run()
    launched = [server for server in simulation.servers if server.created_at > 0]
    assert launched
    assert all(server.ready_at - server.created_at == 20 for server in launched)
    assert result.peak_servers > 2
    terminated = [s for s in simulation.servers if s.state is ServerState.TERMINATED]
    assert terminated  # the load fell: the pool shrank
    for server in terminated:
        assert server.terminated_at is not None
        assert server.terminated_at >= server.drain_until
    cost = sum(
        (s.terminated_at if s.terminated_at is not None else 500.0) - s.created_at
        for s in simulation.servers
    )
    assert result.cost == pytest.approx(cost)


def test_a_full_backlog_drops_connections_and_users_retransmit() -> None:
    text = """
name: overload
duration: 200
load: {steps: [{at: 0, clients: 400}]}
clients: {think_time: 1.0}
resolvers: {count: 1}
servers: {initial: 1, max_concurrency: 10, backlog: 5, service: {mean: 0.2}}
"""
    result = simulate(scenario(text), seed=1)
    # capacity 50 requests a second for 400 users: most requests wait 3 s or more for a slot
    assert result.from_3_to_9 + result.from_9_to_60 > 0.3
    assert result.requests < 200 * 50 * 1.01
