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
  request costs one event. With ``start_rate`` a server is instead the lab's nginx: requests
  start one every ``1 / start_rate`` seconds at most, in arrival order (``limit_req``), and are
  then served side by side (paced sending): one pacer slot, no worker slots. A dead address
  costs the user ``retry_after[0]`` before it tries the next address of its answer.
- *The cloud* boots a launched server in ``boot_delay`` seconds; cost is server-seconds from the
  launch (or the start) to termination (or the end).

**What is the product's own code** (run, never copied: :mod:`sim.product`): the manager,
with its ingest, tick, policy, lifecycle and autoscaler, on a virtual clock, launching and
terminating servers through the ``memory`` provider (the cloud, booting a server in
``boot_delay`` seconds); and a pipe backend answering each resolver's query from the plans the
manager publishes. Every manager tick, every running server's agent reports ``in progress``,
``max concurrency`` and its served counter. Drains, pauses, slow starts, warm-ups, launches and
failures are the product's.

Faults (``failures``) are injected at their moment: servers crash or their agents go silent,
the cloud fails or hangs launches, the manager restarts from its state.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dnslb.model import ServerState
from evaluation.columns import (
    HISTOGRAM_SCALE,
    ResponseStats,
    Series,
    busiest_over_mean,
    overloaded_seconds,
    paper_columns,
)
from sim.metrics import RunResult
from sim.product import BASE, POOL_NAME, WALL, Product, client_address, static_servers
from sim.scenario import Scenario

__all__ = ["POOL_NAME", "Simulation", "simulate"]


@dataclass(slots=True)
class _Server:
    """One simulated machine: its queues, and its agent (what the manager hears of it)."""

    index: int
    ref: str  # the cloud's id
    id: str  # the server id the manager gave it
    token: str  # its agent's token
    address: str
    capacity: int
    slowness: float  # service times are multiplied by this (1 / speed)
    created_at: float
    ready_at: float
    terminated_at: float | None = None
    dead: bool = False  # crashed or terminated: neither serves nor reports
    silent: bool = False  # its agent does not report (the server serves on)
    static: bool = False  # a configured member (topology scenarios), not a cloud machine
    location: int = 0  # index in the scenario's locations
    slots: list[float] = field(default_factory=list)  # when each worker slot frees
    gap: float = 0.0  # with a start rate: seconds between starts (the pacer is its one slot)
    out: list[tuple[float, int, float]] = field(default_factory=list)  # (finish, user, started)
    served: int = 0
    samples: list[tuple[float, float]] = field(default_factory=list)

    def reset_queues(self) -> None:
        self.slots = [0.0] * (1 if self.gap else self.capacity)
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
        self.by_ref: dict[str, _Server] = {}
        self.by_address: dict[str, int] = {}
        self.product: Product | None = None
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
        # Until when a user's own copy of its resolver's answer lasts (the lab's users keep one
        # for the TTL they were given): a request after that is a lookup, and what the user was
        # given then is what is left of the TTL in its resolver's cache, in whole seconds
        # (``user_ttl``). A user whose copy ran out just before its resolver's gets the last
        # second's TTL (0 or 1) and asks again soon, as the lab's users do.
        self.user_until = [0.0] * users
        self.user_lookups = 0
        self.user_ttl_total = 0.0
        # Where in its resolver's answer a user's request started: its retries go on from there
        # (they used to take a fresh turn of a rotating resolver's order, and could come back to
        # the same dead address again and again until the request timed out).
        self.first_position = [0] * users
        resolvers = scenario.resolvers.count
        self.resolver_of = _resolver_of(users, scenario, self.rng_users)
        self.resolver_location = _resolver_locations(scenario)
        self.user_location = [self.resolver_location[r] for r in self.resolver_of]
        self.res_answer: list[tuple[int, ...]] = [()] * resolvers
        self.res_expires = [-math.inf] * resolvers
        self.res_turn = [0] * resolvers
        self.events: list[tuple[float, int, int]] = []
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
        self.pause_flip_times: list[float] = []  # simulated seconds (after run())
        self.events_done = 0
        self.series_times: list[float] = []
        self.series_counts: list[tuple[int, int, int, int, int]] = []
        self.faults_done: list[str] = []
        self.struck: list[str] = []  # ids of the servers faults struck
        self._store_outages: list[int] = []
        self.failed_on_termination = 0
        self.failed_on_crash = 0  # requests in progress on crashed servers
        self.failed_nodata = 0  # requests that found no address in their resolver's answer
        self.served_local = 0  # requests served in the user's own location
        self.sent_to_terminated = 0  # connections of TTL-honouring users to terminated servers
        self.deaf_ticks = 0  # ticks whose reports do not reach the manager
        self.orphans = 0
        self.double_launches = 0

    # -- servers ------------------------------------------------------------------------------

    def _sync_machines(self, now: float) -> None:
        """Line the world up with the cloud: a machine the manager launched is a new server
        (it serves once booted); a machine the manager terminated stops, failing what it
        still had in progress."""
        assert self.product is not None
        account = self.product.account
        machines = account.machines
        if len(machines) != len(self.by_ref) or any(ref not in self.by_ref for ref in machines):
            for ref, machine in machines.items():
                if ref not in self.by_ref:
                    instance = machine.instance
                    self._add_server(
                        ref,
                        instance.server_id or ref,
                        machine.token,
                        instance.address or "",
                        created=machine.created_at - BASE,
                        ready=machine.ready_at - BASE,
                    )
        for server in self.servers:
            if server.static:
                continue
            if server.terminated_at is None and server.ref not in machines:
                if not server.dead:  # a crashed server's requests failed when it crashed
                    self.failed_on_termination += self._fail_requests(server, now)
                server.terminated_at = now
                server.dead = True

    def _add_server(
        self,
        ref: str,
        server_id: str,
        token: str,
        address: str,
        *,
        created: float,
        ready: float,
        static: bool = False,
        location: int = 0,
    ) -> None:
        """A machine of the world: ``created`` and ``ready`` in simulated seconds."""
        config = self.scenario.servers
        index = len(self.servers)
        spread = config.speed_spread
        speed = 1.0 + spread * (2.0 * self.rng_servers.random() - 1.0) if spread else 1.0
        server = _Server(
            index=index,
            ref=ref,
            id=server_id,
            token=token,
            address=address,
            capacity=config.max_concurrency,
            slowness=1.0 / speed,
            gap=1.0 / (config.start_rate * speed) if config.start_rate else 0.0,
            created_at=created,
            ready_at=ready,
            static=static,
            location=location,
        )
        server.reset_queues()
        self.servers.append(server)
        self.by_ref[ref] = server
        self.by_address[server.address] = index

    def _fail_requests(self, server: _Server, now: float) -> int:
        """``server`` stops at ``now``: requests still in progress there fail; their users
        see the error now and come back after a think time. Returns how many failed."""
        failed = 0
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
            if server.location == self.user_location[user]:
                self.served_local -= 1
            self.failed += 1
            failed += 1
            self.gen[user] += 1
            self.attempt[user] = 0
            self.retry_server[user] = -1
            wait = self.rng_users.expovariate(1.0 / think) if think > 0 else 0.0
            heapq.heappush(self.events, (now + wait, user, self.gen[user]))
        server.reset_queues()
        return failed

    # -- DNS ----------------------------------------------------------------------------------

    def _query(self, resolver: int, now: float) -> None:
        """Resolver ``resolver`` missed its cache: it asks the DNS (the pipe backend answers)
        and caches the answer for its TTL."""
        assert self.product is not None
        client = client_address(self.resolver_location[resolver], resolver)
        addresses, ttl = self.product.answer(client)
        by_address = self.by_address
        self.res_answer[resolver] = tuple(
            by_address[address] for address in addresses if address in by_address
        )
        # A resolver counts time in whole seconds, as unbound does: an answer cached during
        # second S with TTL T is served up to the end of second S + T, with the whole seconds
        # left as its TTL (0 in its last second).
        self.res_expires[resolver] = math.floor(now) + max(ttl, self.scenario.resolvers.min_ttl) + 1
        self.dns_queries += 1
        self.ttl_total += ttl
        slot = int(now / self.scenario.manager.tick)
        self.tick_ttl[slot] += ttl
        self.tick_queries[slot] += 1

    # -- users --------------------------------------------------------------------------------

    def _set_users(self, now: float) -> None:
        users = min(self.users_max, self.scenario.load.clients_at(now))
        think = self.scenario.clients.think_time
        if self.scenario.clients.first_request == "at_once":
            think = 0.0
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
        user_until = self.user_until
        res_answer = self.res_answer
        res_expires = self.res_expires
        res_turn = self.res_turn
        first_position = self.first_position
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
        topology = scenario.topology
        located = topology is not None
        penalty = topology.penalty if topology is not None else 0.0
        user_location = self.user_location
        served_local = self.served_local
        inv_tick = 1.0 / scenario.manager.tick
        user_random = self.rng_users.random
        service_random = self.rng_service.random
        lognormal = self.rng_service.lognormvariate
        heappop = heapq.heappop
        heappush = heapq.heappush
        heapreplace = heapq.heapreplace
        log = math.log
        floor = math.floor
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
                    if user_until[user] <= now:  # the user's copy expired: it looks up
                        given = res_expires[resolver] - 1 - floor(now)  # whole seconds left
                        user_until[user] = now + given
                        self.user_lookups += 1
                        self.user_ttl_total += given
                    answer = res_answer[resolver]
                    count = len(answer)
                    if not count:  # NODATA: no address at all
                        failed += 1
                        self.failed_nodata += 1
                        attempt[user] = 0
                        wait = -think * log(1.0 - user_random())
                        heappush(events, (now + retry_after[0] + wait, user, generation))
                        continue
                    tries = attempt[user]
                    if tries:  # a retry: the next address of the order the user was given
                        position = first_position[user]
                    elif shuffled:
                        position = first_position[user] = int(user_random() * count)
                    elif cyclic:
                        position = first_position[user] = res_turn[resolver]
                        res_turn[resolver] = position + 1
                    else:
                        position = first_position[user] = 0
                    target = answer[(position + tries) % count]
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
                    gap = server.gap
                    if gap:
                        slots[0] = start + gap
                    else:
                        heapreplace(slots, finish)
                    started = first_at[user]
                    origin = started  # the response is counted from here
                    if located:
                        if server.location == user_location[user]:
                            served_local += 1
                        else:
                            origin -= penalty  # the way there and back, across locations
                    heappush(out, (finish, user, origin))
                    response = finish - origin
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
                if server.terminated_at is not None and not ignores[user]:
                    self.sent_to_terminated += 1  # DNS still had it: a drain ended too early
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
        self.served_local = served_local
        self.events_done += done

    # -- the manager --------------------------------------------------------------------------

    async def _tick(self, now: float, *, measure: bool = True) -> None:
        """One manager tick at ``now``: the agents report, the manager ticks, the world follows
        what it did (launches, terminations); then the measurements."""
        product = self.product
        assert product is not None
        self._sync_machines(now)
        reports = []
        heappop = heapq.heappop
        for server in self.servers:
            if server.dead or server.ready_at > now:
                continue
            out = server.out
            while out and out[0][0] <= now:
                heappop(out)
            if not server.silent and not self.deaf_ticks:
                reports.append((server.id, server.token, len(out), server.capacity, server.served))
        self.deaf_ticks = max(0, self.deaf_ticks - 1)
        await product.tick(now, reports)
        self._sync_machines(now)
        if not measure:
            return
        tick = self.scenario.manager.tick
        states = product.states()
        serving = paused = booting = draining = 0
        for state, is_paused in states.values():
            if state is ServerState.ACTIVE:
                if is_paused:
                    paused += 1
                else:
                    serving += 1
            elif state is ServerState.LAUNCHING or state is ServerState.WARMING:
                booting += 1
            elif state is ServerState.DRAINING:
                draining += 1
        for server in self.servers:
            if server.dead or server.ready_at > now:
                continue
            known = states.get(server.id)
            if known is not None and known[0] is ServerState.ACTIVE:
                utilization = len(server.out) / server.capacity
                server.samples.append((now, utilization))
                if utilization >= 1.0:
                    self.saturated += tick
        self.series_times.append(now)
        self.series_counts.append((serving, paused, booting, draining, self.users))

    # -- failures -----------------------------------------------------------------------------

    def _targets(self, count: int, target: str) -> list[_Server]:
        """The ``count`` servers with the lowest ids that are alive and, for the manager,
        serving (``target`` ``serving``) or draining."""
        assert self.product is not None
        states = self.product.states()
        wanted = ServerState.DRAINING if target == "draining" else ServerState.ACTIVE
        found = [
            server
            for server in self.servers
            if not server.dead
            and not server.silent
            and states.get(server.id, (None, False))[0] is wanted
        ]
        return sorted(found, key=lambda server: server.id)[:count]

    async def _fault(self, number: int, now: float) -> list[_Server]:
        """Inject failure ``number`` now; the servers it struck (to recover later)."""
        failure = self.scenario.failures[number]
        product = self.product
        assert product is not None
        self.faults_done.append(f"{now:g} s: {failure.kind} x{failure.servers}")
        if failure.kind == "crash":
            victims = self._targets(failure.servers, failure.target)
            self.struck += [server.id for server in victims]
            for server in victims:
                self.failed_on_crash += self._fail_requests(server, now)
                server.dead = True
            return victims
        if failure.kind == "silent_agent":
            victims = self._targets(failure.servers, failure.target)
            self.struck += [server.id for server in victims]
            for server in victims:
                server.silent = True
            return victims
        if failure.kind == "failed_launches":
            product.provider.failures_left += failure.servers
        elif failure.kind == "hung_launches":
            product.provider.hung_left += failure.servers
        elif failure.kind == "store_outage":
            product.store.failing = True  # publications fail; pipe backends keep their plan
            self._store_outages.append(number)
        elif failure.kind == "manager_restart":
            # Agents that found no manager while it was down report again after its first tick.
            await product.restart_manager()
            self.deaf_ticks = 1
        return []

    def _recover(self, victims: list[_Server], kind: str) -> None:
        if kind == "store_outage":
            assert self.product is not None
            self.product.store.failing = False
        for server in victims:
            if server.terminated_at is not None:
                continue
            if kind == "silent_agent":
                server.silent = False
            else:
                server.dead = False
                server.reset_queues()

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Simulate the whole scenario and measure it."""
        with tempfile.TemporaryDirectory(prefix="dnslb-sim-") as workdir:
            return asyncio.run(self._run(Path(workdir)))

    async def _run(self, workdir: Path) -> RunResult:
        product = await self.start(workdir)
        try:
            return await self._main(self.scenario.duration, self.scenario.manager.tick)
        finally:
            await product.close()

    async def start(self, workdir: Path) -> Product:
        """Start the product (its state in ``workdir``) and run the warm-up: the manager runs
        before the users come, adopts the running servers, they report, the pool settles (the
        run starts with it serving, as the paper's did). Tests step on with :meth:`step`."""
        tick = self.scenario.manager.tick
        self.product = product = Product(self.scenario, self.seed, workdir)
        for member in static_servers(self.scenario):
            # A configured member of a topology scenario: serving from the start, never
            # launched or terminated by the cloud.
            start = -product.warmup
            self._add_server(
                member.id,
                member.id,
                member.token,
                member.address,
                created=start,
                ready=start,
                static=True,
                location=member.location,
            )
        ticks = math.ceil(product.warmup / tick)
        for number in range(ticks, 0, -1):
            await self._tick(-number * tick, measure=False)
        return product

    async def step(self, now: float) -> None:
        """One manager tick at ``now`` (tests: after :meth:`start`, without users)."""
        await self._tick(now)

    async def _main(self, end: float, tick: float) -> RunResult:
        scenario = self.scenario
        controls: list[tuple[float, int, str, int]] = []  # (time, order, kind, argument)
        for time in scenario.load.changes(end):
            controls.append((time, len(controls), "load", 0))
        for number, failure in enumerate(scenario.failures):
            controls.append((failure.at, len(controls), "fault", number))
        heapq.heapify(controls)
        recoveries: dict[int, list[_Server]] = {}
        await self._tick(0.0)
        if scenario.resolvers.staggered:
            ttl_max = self.policy.ttl_max
            for resolver in range(scenario.resolvers.count):
                self._query(resolver, 0.0)
                # to the end of a whole second, as every answer of _query
                self.res_expires[resolver] = math.floor(self.rng_dns.uniform(0.0, ttl_max)) + 1
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
                elif kind == "fault":
                    failure = scenario.failures[argument]
                    recoveries[argument] = await self._fault(argument, until)
                    struck = recoveries[argument] or argument in self._store_outages
                    if failure.recover_after is not None and struck:
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
                    self._recover(recoveries.pop(argument, []), scenario.failures[argument].kind)
                continue
            await self._tick(until)
            ticks += 1
            next_tick = ticks * tick
        self._audit()
        return self._result(end)

    def _audit(self) -> None:
        """What must never happen, counted at the end: servers running that the manager does
        not know (orphans), and server ids the cloud started twice."""
        assert self.product is not None
        self._sync_machines(self.now)
        known = {
            server_id
            for server_id, (state, _) in self.product.states().items()
            if state is not ServerState.TERMINATED
        }
        self.orphans = sum(
            1
            for machine in self.product.account.machines.values()
            if machine.instance.server_id not in known
        )
        launches = Counter(server.id for server in self.servers)
        self.double_launches = sum(1 for count in launches.values() if count > 1)

    def _pause_flips(self) -> int:
        """The manager's pause verdicts changed during the run (the warm-up's left out); their
        simulated times are kept in :attr:`pause_flip_times`."""
        if self.product is None:
            return 0
        events = self.product.manager.store.events(kinds=["paused", "resumed"], limit=10_000_000)
        start = WALL + BASE  # simulated second 0
        self.pause_flip_times = sorted(e.time - start for e in events if e.time >= start)
        return len(self.pause_flip_times)

    def _result(self, end: float) -> RunResult:
        scenario = self.scenario
        stats = ResponseStats.from_histogram(self.histogram, self.total_response)
        cost = sum(
            (server.terminated_at if server.terminated_at is not None else end)
            - max(0.0, server.created_at)
            for server in self.servers
            if server.terminated_at is None or server.terminated_at > 0.0
        )
        samples = {server.id: server.samples for server in self.servers if server.samples}
        return RunResult(
            name=scenario.name,
            seed=self.seed,
            **paper_columns(stats, cost=cost, ttl_total=self.ttl_total, answers=self.dns_queries),
            busiest_over_mean=busiest_over_mean(samples, scenario.balance_window, end),
            saturated_seconds=self.saturated,
            overloaded_seconds=overloaded_seconds(
                samples, end, longest_gap=2 * scenario.manager.tick
            ),
            failed=self.failed,
            peak_servers=max((sum(counts[:4]) for counts in self.series_counts), default=0),
            simulated=end,
            events=self.events_done,
            failed_on_termination=self.failed_on_termination,
            failed_on_crash=self.failed_on_crash,
            in_location=self.served_local / stats.count
            if self.scenario.topology is not None and stats.count
            else math.nan,
            sent_to_terminated=self.sent_to_terminated,
            orphans=self.orphans,
            double_launches=self.double_launches,
            pause_flips=self._pause_flips(),
            user_ttl=self.user_ttl_total / self.user_lookups if self.user_lookups else math.nan,
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


def _resolver_locations(scenario: Scenario) -> list[int]:
    """Each resolver's location (index): resolvers split by the locations' users' shares, in
    order (0 for every resolver without a topology)."""
    count = scenario.resolvers.count
    topology = scenario.topology
    if topology is None:
        return [0] * count
    bounds = []
    total = 0.0
    for location in topology.locations:
        total += location.users
        bounds.append(total)
    return [
        next((i for i, bound in enumerate(bounds) if (r + 0.5) / count < bound), len(bounds) - 1)
        for r in range(count)
    ]


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
