"""The discrete-event simulation: users, resolvers, servers, and the product's manager on them.

:func:`simulate` runs one :class:`~sim.scenario.Scenario` with a seed and returns what it
measured. It is deterministic: every random choice comes from generators seeded from the seed,
and nothing depends on wall time or hash order.

**What is modelled here** (the world around the product):

- *Users* are closed loops: think (exponential), send a request, wait for its response (or
  give up after ``timeout``), think again. The load is the number of active users over time.
- *Resolvers* cache the DNS answer for its TTL (at least ``min_ttl``) and hand its addresses to
  their users in their ``order``; a user connects to the first address (or a random one). A
  fraction of users ignore TTLs and keep their server for ``ignore_ttl_hold`` seconds.
- *Servers* are FIFO multi-server queues: ``max_concurrency`` worker slots, then a wait of
  unbounded or ``backlog`` length. A request that finds the backlog full is dropped and the user
  retransmits after ``retry_after`` (TCP SYN retransmissions: 3, 9, 21 s... the paper's response
  bands). A request's response time is known when it is accepted: its start is the moment the
  earliest of the ``max_concurrency`` slots frees (the Kiefer-Wolfowitz workload vector), so each
  request costs one event. A dead address costs the user ``retry_after[0]`` before it tries the
  next address of its answer.
- *The cloud* boots a launched server in ``boot_delay`` seconds; cost is server-seconds from the
  launch (or the start) to termination (or the end).

**What is the product's own code** (called, never copied), each manager tick: every serving
server's agent reports ``in progress / max concurrency``; :func:`dnslb.policy.update_load` folds
it in (smoothing, pause with hysteresis); :func:`dnslb.policy.member_values` gives each member
its weight and TTL; :func:`dnslb.scaling.decide` decides launches and drains on
:func:`dnslb.scaling.sample_pool`; the plan's pool goes through
:func:`dnslb.selection.pool_answers`, and resolvers that miss their cache take the next answer
of :func:`dnslb.selection.rotation`, as the pipe backend does. Drains wait until the longest TTL
handed out for the server has passed and its requests are done, as the manager's lifecycle does.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from dnslb.model import ServerState
from dnslb.plan import Member, MemberState, Pool
from dnslb.policy import ServerLoad, member_values, update_load
from dnslb.scaling import ScalingHistory, ServerLoadView, decide, record, sample_pool
from dnslb.selection import pool_answers, rotation
from evaluation.columns import (
    HISTOGRAM_SCALE,
    ResponseStats,
    Series,
    busiest_over_mean,
    paper_columns,
)
from sim.metrics import RunResult
from sim.scenario import Scenario

PROPAGATION = 1.5
"""Seconds the manager adds to a TTL before a drained server may stop (as manager.lifecycle)."""

POOL_NAME = "www.example.com."

_Answer = tuple[tuple[int, ...], int]  # server indices in answer order, TTL


@dataclass(slots=True)
class _Server:
    """One simulated server: the machine (queues) and what the manager knows of it."""

    index: int
    id: str
    address: str
    capacity: int
    slowness: float  # service times are multiplied by this (1 / speed)
    created_at: float
    ready_at: float
    state: ServerState
    serving_since: float = -math.inf
    terminated_at: float | None = None
    dead: bool = False  # crashed or terminated: neither serves nor reports
    slots: list[float] = field(default_factory=list)  # when each worker slot frees
    out: list[tuple[float, int, float]] = field(default_factory=list)  # (finish, user, started)
    load: ServerLoad | None = None
    in_progress: int = 0  # as last reported
    report_at: float = -math.inf
    paused: bool = False
    answered_until: float | None = None
    drain_since: float = 0.0
    drain_until: float = 0.0
    served: int = 0
    samples: list[tuple[float, float]] = field(default_factory=list)

    def reset_queues(self) -> None:
        self.slots = [0.0] * self.capacity
        self.out = []


class Simulation:
    """One run of a scenario; :meth:`run` once."""

    def __init__(self, scenario: Scenario, seed: int | None = None) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        base = f"dnslb-sim/{self.seed}"
        self.rng_users = random.Random(f"{base}/users")
        self.rng_service = random.Random(f"{base}/service")
        self.rng_dns = random.Random(f"{base}/dns")
        self.rng_servers = random.Random(f"{base}/servers")
        self.policy = scenario.dns.policy
        self.servers: list[_Server] = []
        self.history = ScalingHistory()
        self.now = 0.0
        users = max(1, scenario.load.peak(scenario.duration))
        self.users_max = users
        self.users = 0
        # Per user: event generation (an event of an older generation is void), idle (no event
        # pending), connection attempts of the current request, its start, the server it
        # retransmits to, the pinned server of a TTL-ignoring user and until when.
        self.gen = [0] * users
        self.idle = [True] * users
        self.attempt = [0] * users
        self.first_at = [0.0] * users
        self.retry_server = [-1] * users
        self.ignores = [self.rng_users.random() < scenario.clients.ignore_ttl for _ in range(users)]
        self.pin_server = [-1] * users
        self.pin_until = [0.0] * users
        resolvers = scenario.resolvers.count
        self.resolver_of = _resolver_of(users, scenario, self.rng_users)
        self.res_answer: list[tuple[int, ...]] = [()] * resolvers
        self.res_expires = [-math.inf] * resolvers
        self.res_turn = [0] * resolvers
        self.events: list[tuple[float, int, int]] = []
        self.answers: list[_Answer] = [((), 0)]
        self.cycle: Iterator[_Answer] = iter(())
        self.pool: Pool | None = None
        # Measurements.
        self.histogram = [0] * (int(scenario.clients.timeout * HISTOGRAM_SCALE) + 2)
        self.total_response = 0.0
        self.failed = 0
        self.dns_queries = 0
        ticks = int(scenario.duration / scenario.manager.tick) + 2
        self.tick_response = [0.0] * ticks
        self.tick_requests = [0] * ticks
        self.tick_ttl = [0.0] * ticks
        self.tick_queries = [0] * ticks
        self.ttl_total = 0.0
        self.saturated = 0.0
        self.events_done = 0
        self.series_times: list[float] = []
        self.series_counts: list[tuple[int, int, int, int, int]] = []
        for _ in range(scenario.servers.initial):
            self._add_server(0.0, ready_at=0.0, state=ServerState.ACTIVE)

    # -- servers ------------------------------------------------------------------------------

    def _add_server(self, now: float, *, ready_at: float, state: ServerState) -> _Server:
        config = self.scenario.servers
        index = len(self.servers)
        spread = config.speed_spread
        speed = 1.0 + spread * (2.0 * self.rng_servers.random() - 1.0) if spread else 1.0
        server = _Server(
            index=index,
            id=f"s{index + 1:05d}",
            address=f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}",
            capacity=config.max_concurrency,
            slowness=1.0 / speed,
            created_at=now,
            ready_at=ready_at,
            state=state,
        )
        server.reset_queues()
        self.servers.append(server)
        return server

    def _fail_requests(self, server: _Server, now: float) -> None:
        """``server`` stops at ``now``: requests still in progress there fail; their users
        see the error now and come back after a think time."""
        timeout = self.scenario.clients.timeout
        think = self.scenario.clients.think_time
        inv_tick = 1.0 / self.scenario.manager.tick
        for finish, user, started in server.out:
            if finish <= now:
                continue
            response = min(finish - started, timeout)
            if started + response <= now:
                continue  # the user gave up on it already; nothing changes for them
            self.histogram[int(response * HISTOGRAM_SCALE)] -= 1
            self.total_response -= response
            slot = int(started * inv_tick)
            self.tick_response[slot] -= response
            self.tick_requests[slot] -= 1
            server.served -= 1
            self.failed += 1
            self.gen[user] += 1
            self.attempt[user] = 0
            self.retry_server[user] = -1
            wait = self.rng_users.expovariate(1.0 / think) if think > 0 else 0.0
            heapq.heappush(self.events, (now + wait, user, self.gen[user]))
        server.out = []
        server.slots = [0.0] * server.capacity

    # -- DNS ----------------------------------------------------------------------------------

    def _query(self, resolver: int, now: float) -> None:
        """Resolver ``resolver`` missed its cache: it asks the DNS (the pipe backend's next
        answer) and caches the answer for its TTL."""
        servers, ttl = next(self.cycle)
        self.res_answer[resolver] = servers
        self.res_expires[resolver] = now + max(ttl, self.scenario.resolvers.min_ttl)
        self.dns_queries += 1
        self.ttl_total += ttl
        slot = int(now / self.scenario.manager.tick)
        self.tick_ttl[slot] += ttl
        self.tick_queries[slot] += 1

    # -- users --------------------------------------------------------------------------------

    def _set_users(self, now: float) -> None:
        users = min(self.users_max, self.scenario.load.clients_at(now))
        think = self.scenario.clients.think_time
        for user in range(self.users, users):
            if self.idle[user]:
                self.idle[user] = False
                self.attempt[user] = 0
                self.retry_server[user] = -1
                wait = self.rng_users.expovariate(1.0 / think) if think > 0 else 0.0
                heapq.heappush(self.events, (now + wait, user, self.gen[user]))
        self.users = users

    def _run_users(self, until: float) -> None:
        """Process every user event before ``until`` (the hot loop: locals on purpose)."""
        scenario = self.scenario
        clients = scenario.clients
        events = self.events
        servers = self.servers
        gen = self.gen
        idle = self.idle
        attempt = self.attempt
        first_at = self.first_at
        retry_server = self.retry_server
        ignores = self.ignores
        pin_server = self.pin_server
        pin_until = self.pin_until
        res_answer = self.res_answer
        res_expires = self.res_expires
        res_turn = self.res_turn
        histogram = self.histogram
        tick_response = self.tick_response
        tick_requests = self.tick_requests
        resolver_of = self.resolver_of
        order = scenario.resolvers.order
        cyclic = order == "cyclic"
        shuffled = order == "random" or clients.connect_to == "random"
        hold = clients.ignore_ttl_hold
        timeout = clients.timeout
        retry_after = clients.retry_after
        last_retry = len(retry_after) - 1
        think = clients.think_time
        backlog = scenario.servers.backlog
        service = scenario.servers.service
        distribution = service.distribution
        mean = service.mean
        sigma = math.sqrt(math.log(1.0 + service.cv**2))
        mu = math.log(mean) - sigma * sigma / 2.0
        inv_step = HISTOGRAM_SCALE
        inv_tick = 1.0 / scenario.manager.tick
        user_random = self.rng_users.random
        service_random = self.rng_service.random
        lognormal = self.rng_service.lognormvariate
        heappop = heapq.heappop
        heappush = heapq.heappush
        heapreplace = heapq.heapreplace
        log = math.log
        total = self.total_response
        failed = self.failed
        done = 0
        users = self.users
        while events and events[0][0] < until:
            now, user, generation = heappop(events)
            if generation != gen[user]:
                continue
            done += 1
            if user >= users and not attempt[user]:
                idle[user] = True  # the load went down: this user leaves
                continue
            if not attempt[user]:
                first_at[user] = now
            target = retry_server[user]
            if target < 0:
                if ignores[user] and pin_until[user] > now:
                    target = pin_server[user]
                else:
                    resolver = resolver_of[user]
                    if res_expires[resolver] <= now:
                        self.now = now
                        self._query(resolver, now)
                    answer = res_answer[resolver]
                    count = len(answer)
                    if not count:  # NODATA: no address at all
                        failed += 1
                        attempt[user] = 0
                        wait = -think * log(1.0 - user_random())
                        heappush(events, (now + retry_after[0] + wait, user, generation))
                        continue
                    if shuffled:
                        position = int(user_random() * count)
                    elif cyclic:
                        position = res_turn[resolver]
                        res_turn[resolver] = position + 1
                    else:
                        position = 0
                    target = answer[(position + attempt[user]) % count]
                    if ignores[user]:
                        pin_server[user] = target
                        pin_until[user] = now + hold
            server = servers[target]
            if not server.dead:
                out = server.out
                while out and out[0][0] <= now:
                    heappop(out)
                if backlog is not None and len(out) >= server.capacity + backlog:
                    target_next = target  # dropped: the user retransmits to the same server
                else:
                    slots = server.slots
                    start = slots[0]
                    if start < now:  # noqa: PLR1730  (max() costs a call in the hot loop)
                        start = now
                    if distribution == "exponential":
                        work = -mean * log(1.0 - service_random())
                    elif distribution == "lognormal":
                        work = lognormal(mu, sigma)
                    else:
                        work = mean
                    finish = start + work * server.slowness
                    heapreplace(slots, finish)
                    started = first_at[user]
                    heappush(out, (finish, user, started))
                    response = finish - started
                    if response > timeout:  # noqa: PLR1730  (as above)
                        response = timeout
                    histogram[int(response * inv_step)] += 1
                    total += response
                    slot = int(started * inv_tick)
                    tick_response[slot] += response
                    tick_requests[slot] += 1
                    server.served += 1
                    attempt[user] = 0
                    retry_server[user] = -1
                    wait = -think * log(1.0 - user_random()) if think > 0 else 0.0
                    heappush(events, (started + response + wait, user, generation))
                    continue
            else:
                target_next = -1  # a dead address: the next one of the answer
                pin_until[user] = 0.0
            tries = attempt[user]
            wait = retry_after[tries if tries < last_retry else last_retry]
            if now + wait - first_at[user] >= timeout:
                failed += 1  # the user gives up; after a think time it starts a new request
                attempt[user] = 0
                retry_server[user] = -1
                pause = -think * log(1.0 - user_random()) if think > 0 else 0.0
                heappush(events, (first_at[user] + timeout + pause, user, generation))
                continue
            attempt[user] = tries + 1
            retry_server[user] = target_next
            heappush(events, (now + wait, user, generation))
        self.total_response = total
        self.failed = failed
        self.events_done += done

    # -- the manager --------------------------------------------------------------------------

    def _tick(self, now: float) -> None:
        """One manager tick at ``now``: reports, policy, lifecycle and autoscaler, plan."""
        scenario = self.scenario
        policy = self.policy
        manager = scenario.manager
        tick = manager.tick
        for server in self.servers:
            if server.state is ServerState.LAUNCHING and server.ready_at <= now:
                server.state = ServerState.ACTIVE  # its agent's first report: in it goes
                server.serving_since = now
                server.reset_queues()
        for server in self.servers:
            state = server.state
            if state is ServerState.TERMINATED or state is ServerState.LAUNCHING:
                continue
            if server.dead:
                if state is ServerState.ACTIVE and now - server.report_at > manager.down_after:
                    server.state = ServerState.DOWN
                continue
            out = server.out
            while out and out[0][0] <= now:
                heapq.heappop(out)
            server.in_progress = len(out)
            server.report_at = now
            utilization = server.in_progress / server.capacity
            if state is ServerState.DOWN:
                server.state = ServerState.ACTIVE  # reporting again: back in, with slow start
                server.serving_since = now
            server.load = update_load(server.load, utilization, now, policy)
            server.paused = scenario.dns.pause and server.load.paused
            if server.state is ServerState.ACTIVE:
                server.samples.append((now, utilization))
                if utilization >= 1.0:
                    self.saturated += tick
        self._lifecycle(now)
        self._plan(now)
        self._record_series(now)

    def _lifecycle(self, now: float) -> None:
        manager = self.scenario.manager
        for server in self.servers:
            if server.state is not ServerState.DRAINING:
                continue
            done = now >= server.drain_until and server.in_progress == 0
            if done or now - server.drain_since >= manager.drain_timeout:
                self._fail_requests(server, now)
                server.state = ServerState.TERMINATED
                server.terminated_at = now
                server.dead = True
        scaling = self.scenario.scaling
        if scaling is None:
            return
        views = [
            ServerLoadView(
                id=server.id,
                active=server.state is ServerState.ACTIVE,
                in_progress=server.in_progress if server.state is ServerState.ACTIVE else 0,
                max_concurrency=server.capacity,
                started_at=server.created_at,
            )
            for server in self.servers
            if server.state.counts_as_capacity
        ]
        self.history.add(sample_pool(views, now), keep=max(scaling.window, scaling.scale_in_window))
        decision = decide(self.history, views, scaling, now)
        record(self.history, decision, now)
        for _ in range(decision.launch):
            boot = self.scenario.servers.boot_delay
            self._add_server(now, ready_at=now + boot, state=ServerState.LAUNCHING)
        if decision.drain is not None:
            victim = next(server for server in self.servers if server.id == decision.drain)
            victim.state = ServerState.DRAINING
            victim.drain_since = now
            victim.drain_until = victim.answered_until or now

    def _plan(self, now: float) -> None:
        """Build the plan's pool as the manager's planner does, and re-derive the answers when
        it changed (as a pipe backend does on a new plan version)."""
        policy = self.policy
        down_after = self.scenario.manager.down_after
        members = []
        eligible = 0
        for server in self.servers:
            state = server.state
            if state is ServerState.ACTIVE:
                fresh = now - server.report_at <= down_after
                if fresh and not server.paused:
                    member_state = MemberState.ACTIVE
                    eligible += 1
                elif server.paused:
                    member_state = MemberState.PAUSED
                else:
                    member_state = MemberState.DOWN
            elif state is ServerState.DOWN:
                member_state = MemberState.DOWN
            elif state is ServerState.DRAINING:
                member_state = MemberState.DRAINING
            else:
                continue
            load = server.load
            values = member_values(
                load.utilization if load is not None else None,
                server.capacity,
                now - server.serving_since,
                policy,
                answered=member_state is MemberState.ACTIVE,
            )
            members.append(
                Member(
                    id=server.id,
                    address=server.address,
                    weight=values.weight,
                    ttl=values.ttl,
                    state=member_state,
                    utilization=values.utilization,
                )
            )
        k = max(1, len(members)) if self.scenario.dns.all_addresses else policy.k
        pool = Pool(
            name=POOL_NAME,
            members=tuple(members),
            k=k,
            ttl_floor=policy.ttl_min,
            fallback=policy.fallback,
        )
        for member in members:
            if member.state is MemberState.DRAINING:
                continue
            server = self.servers[int(member.id[1:]) - 1]
            until = now + max(member.ttl, policy.ttl_min) + PROPAGATION
            if server.answered_until is None or until > server.answered_until:
                server.answered_until = until
        if pool == self.pool:
            return
        self.pool = pool
        index = {server.id: server.index for server in self.servers}
        self.answers = [
            (tuple(index[member.id] for member in answer.members), answer.ttl)
            for answer in pool_answers(pool).v4
        ]
        self.cycle = rotation(self.answers, self.rng_dns)

    def _record_series(self, now: float) -> None:
        serving = paused = booting = draining = 0
        for server in self.servers:
            state = server.state
            if state is ServerState.ACTIVE:
                if server.paused:
                    paused += 1
                else:
                    serving += 1
            elif state is ServerState.LAUNCHING:
                booting += 1
            elif state is ServerState.DRAINING:
                draining += 1
        self.series_times.append(now)
        self.series_counts.append((serving, paused, booting, draining, self.users))

    # -- failures -----------------------------------------------------------------------------

    def _crash(self, count: int, now: float) -> list[_Server]:
        victims = [
            server
            for server in self.servers
            if server.state is ServerState.ACTIVE and not server.dead
        ][:count]
        for server in victims:
            self._fail_requests(server, now)
            server.dead = True
        return victims

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Simulate the whole scenario and measure it."""
        scenario = self.scenario
        end = scenario.duration
        tick = scenario.manager.tick
        controls: list[tuple[float, int, str, int]] = []  # (time, order, kind, argument)
        for time in scenario.load.changes(end):
            controls.append((time, len(controls), "load", 0))
        for number, failure in enumerate(scenario.failures):
            controls.append((failure.at, len(controls), "crash", number))
        heapq.heapify(controls)
        recoveries: dict[int, list[_Server]] = {}
        self._tick(0.0)
        if scenario.resolvers.staggered:
            ttl_max = self.policy.ttl_max
            for resolver in range(scenario.resolvers.count):
                self._query(resolver, 0.0)
                self.res_expires[resolver] = self.rng_dns.uniform(0.0, ttl_max)
        self._set_users(0.0)
        ticks = 1
        next_tick = tick
        while True:
            next_control = controls[0][0] if controls else math.inf
            until = min(next_tick, next_control, end)
            self._run_users(until)
            self.now = until
            if until >= end:
                break
            if next_control <= until:
                _, _, kind, argument = heapq.heappop(controls)
                if kind == "load":
                    self._set_users(until)
                elif kind == "crash":
                    failure = scenario.failures[argument]
                    recoveries[argument] = self._crash(failure.servers, until)
                    if failure.recover_after is not None:
                        heapq.heappush(
                            controls,
                            (
                                until + failure.recover_after,
                                len(controls) + 1000,
                                "recover",
                                argument,
                            ),
                        )
                else:
                    for server in recoveries.pop(argument, []):
                        if server.state is not ServerState.TERMINATED:
                            server.dead = False
                            server.reset_queues()
                continue
            self._tick(until)
            ticks += 1
            next_tick = ticks * tick
        return self._result(end)

    def _result(self, end: float) -> RunResult:
        scenario = self.scenario
        stats = ResponseStats.from_histogram(self.histogram, self.total_response)
        cost = sum(
            (server.terminated_at if server.terminated_at is not None else end) - server.created_at
            for server in self.servers
        )
        samples = {server.id: server.samples for server in self.servers if server.samples}
        return RunResult(
            name=scenario.name,
            seed=self.seed,
            **paper_columns(stats, cost=cost, ttl_total=self.ttl_total, answers=self.dns_queries),
            busiest_over_mean=busiest_over_mean(samples, scenario.balance_window, end),
            saturated_seconds=self.saturated,
            failed=self.failed,
            peak_servers=max((sum(counts[:4]) for counts in self.series_counts), default=0),
            simulated=end,
            events=self.events_done,
        )

    def series(self) -> Series:
        """What the plots show (after :meth:`run`)."""
        count = len(self.series_times)
        return Series(
            times=tuple(self.series_times),
            utilization={
                server.id: tuple(server.samples) for server in self.servers if server.samples
            },
            serving=tuple(counts[0] for counts in self.series_counts),
            paused=tuple(counts[1] for counts in self.series_counts),
            booting=tuple(counts[2] for counts in self.series_counts),
            draining=tuple(counts[3] for counts in self.series_counts),
            users=tuple(counts[4] for counts in self.series_counts),
            answer_ttl=tuple(
                self.tick_ttl[i] / self.tick_queries[i] if self.tick_queries[i] else math.nan
                for i in range(count)
            ),
            mean_response=tuple(
                self.tick_response[i] / self.tick_requests[i] if self.tick_requests[i] else math.nan
                for i in range(count)
            ),
        )


def _resolver_of(users: int, scenario: Scenario, rng: random.Random) -> list[int]:
    """Each user's resolver: round-robin for equal resolvers, else drawn by size."""
    count = scenario.resolvers.count
    skew = scenario.resolvers.skew
    if skew == 0:
        return [user % count for user in range(users)]
    sizes = [1.0 / (resolver + 1) ** skew for resolver in range(count)]
    return rng.choices(range(count), weights=sizes, k=users)


def simulate(scenario: Scenario, seed: int | None = None) -> RunResult:
    """Run ``scenario`` (with ``seed``, else the scenario's own) and return its figures."""
    return Simulation(scenario, seed).run()
