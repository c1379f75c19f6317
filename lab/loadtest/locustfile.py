"""The lab's locust load test: users that resolve the load-balanced name themselves.

Each user keeps its own resolver cache (:class:`~lab.loadtest.resolver.CachingResolver`): it asks
its DNS server (user N the N-th of ``--dns-server``'s list, modulo: one of the lab's caching
resolvers) when its cached answer has expired (``--no-user-cache``: before every request; a
fraction of users, ``--ignore-ttl``, keep their answer for ``--ignore-ttl-hold`` seconds whatever
its TTL), connects to the first address of the answer (or a random one, ``--connect random``),
fetches a random object, thinks for an exponentially distributed time (mean ``--think-time``) and
starts again. DNS lookups are locust requests of their own type (``DNS``); HTTP requests are ``GET
/objects/[n]``. Every request is also written to ``--records`` (:mod:`lab.records`) for the report.

The load follows :class:`~lab.loadtest.shape.StepLoad` (``--start-users``, ``--step-users``,
``--step-time``, ``--steps``, ``--hold``). ``dnslb loadtest`` runs this file headless; by hand::

    locust -f lab/loadtest/locustfile.py --headless --dns-server 127.0.0.1:5300 \\
        --lb-name www.lab.test --http-port 8080 --csv out/locust --records out/requests.csv
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from typing import Any

import gevent
from locust import FastHttpUser, LoadTestShape, events, task
from locust.env import Environment
from locust.exception import StopUser

from dnslb.config import default_of, problems_of
from lab.loadtest.resolver import CachingResolver, LookupFailed, choose, dns_lookup, server_address
from lab.loadtest.run import LoadTest
from lab.loadtest.shape import StepLoad
from lab.records import DNS, Record, RecordWriter

_recorder: RecordWriter | None = None


def _options(parser: Any) -> None:
    """The lab's options, added to locust's parser; each default is the field's it fills
    (:class:`~lab.loadtest.run.LoadTest`, :class:`~lab.loadtest.shape.StepLoad`)."""

    def test(name: str) -> Any:
        return default_of(LoadTest, name)

    def load(name: str) -> Any:
        return default_of(StepLoad, name)

    group = parser.add_argument_group("dnslb lab")
    group.add_argument(
        "--dns-server",
        default=test("dns_server"),
        help="ADDRESS:PORT (or NAME:PORT) of the DNS server users ask; several, "
        "comma-separated: user N asks the N-th, modulo their number (%(default)s)",
    )
    group.add_argument(
        "--user-cache",
        action=argparse.BooleanOptionalAction,
        default=test("user_cache"),
        help="each user keeps an answer for its TTL (--no-user-cache: asks before each request)",
    )
    group.add_argument(
        "--lb-name", default=test("lb_name"), help="the load-balanced name (%(default)s)"
    )
    group.add_argument(
        "--http-port", type=int, default=test("http_port"), help="cache servers' port"
    )
    group.add_argument(
        "--objects", type=int, default=test("objects"), help="objects /objects/0..N-1"
    )
    group.add_argument(
        "--think-time", type=float, default=test("think_time"), help="mean think time, seconds"
    )
    group.add_argument(
        "--ignore-ttl",
        type=float,
        default=test("ignore_ttl"),
        help="fraction of users ignoring TTLs, as some real clients do (0..1; %(default)s)",
    )
    group.add_argument(
        "--ignore-ttl-hold",
        type=float,
        default=test("ignore_ttl_hold"),
        help="seconds a TTL-ignoring user keeps an answer",
    )
    group.add_argument(
        "--connect",
        choices=["first", "random"],
        default=test("connect"),
        help="address to connect to",
    )
    group.add_argument(
        "--request-timeout",
        type=float,
        default=test("request_timeout"),
        help="seconds (%(default)s)",
    )
    group.add_argument("--records", help="CSV file of every request (lab.records)")
    group.add_argument("--start-users", type=int, default=load("start"), help="users at the start")
    group.add_argument("--step-users", type=int, default=load("step"), help="users added each step")
    group.add_argument(
        "--step-time", type=float, default=load("every"), help="seconds between steps"
    )
    group.add_argument("--steps", type=int, default=load("count"), help="steps after the start")
    group.add_argument("--hold", type=float, default=load("hold"), help="seconds at the peak")
    group.add_argument("--seed", type=int, help="seed of the users' random choices")
    group.add_argument(
        "--progress",
        type=float,
        default=test("progress"),
        help="seconds between progress lines (0: none)",
    )


def _start(environment: Environment, **kwargs: Any) -> None:
    global _recorder  # noqa: PLW0603 (one recorder per locust process)
    options = environment.parsed_options
    if options is None:
        return
    if options.seed is not None:
        random.seed(options.seed)
    if options.records:
        _recorder = RecordWriter(options.records)
    # A client gives up on a request after this (the paper's clients: 60 s).
    LabUser.network_timeout = LabUser.connection_timeout = options.request_timeout
    if options.progress > 0:
        gevent.spawn(_progress, environment, options.progress)


def _record(
    *,
    request_type: str,
    name: str,
    response_time: float,
    response_length: int,
    exception: BaseException | None = None,
    context: dict[str, Any] | None = None,
    start_time: float | None = None,
    **kwargs: Any,
) -> None:
    if _recorder is None:
        return
    context = context or {}
    seconds = response_time / 1000.0
    _recorder.write(
        Record(
            start=start_time if start_time is not None else time.time() - seconds,
            kind=request_type,
            name=name,
            seconds=seconds,
            ok=exception is None,
            address=str(context.get("address", "")),
            ttl=context.get("ttl"),
            length=response_length or 0,
            error="" if exception is None else f"{type(exception).__name__}: {exception}",
        )
    )


def _quit(environment: Environment, **kwargs: Any) -> None:
    if _recorder is not None:
        _recorder.close()


def _progress(environment: Environment, every: float) -> None:
    started = time.monotonic()
    previous = 0
    while True:
        gevent.sleep(every)
        runner = environment.runner
        total = environment.stats.total
        done = total.num_requests - previous
        previous = total.num_requests
        options = environment.parsed_options
        dns = environment.stats.entries.get((options.lb_name, DNS)) if options else None
        users = runner.user_count if runner is not None else 0
        print(
            f"[{time.monotonic() - started:6.0f} s] users {users:4d}  "
            f"{done / every:6.1f} req/s  mean {total.avg_response_time / 1000:.3f} s  "
            f"failures {total.num_failures}  dns lookups {dns.num_requests if dns else 0}",
            flush=True,
        )
        if _recorder is not None:
            _recorder.flush()


# (add_listener is untyped: called, not used as a decorator, so the listeners stay typed)
events.init_command_line_parser.add_listener(_options)  # type: ignore[no-untyped-call]
events.init.add_listener(_start)  # type: ignore[no-untyped-call]
events.request.add_listener(_record)  # type: ignore[no-untyped-call]
events.quitting.add_listener(_quit)  # type: ignore[no-untyped-call]


_addresses: dict[str, str] = {}
_user_numbers = itertools.count()


def _dns_address(server: str) -> str:
    """The DNS server's address, its name resolved once per process (every user shares it)."""
    if server not in _addresses:
        _addresses[server] = server_address(server)
    return _addresses[server]


class LabUser(FastHttpUser):
    """A client of the lab's web service (see the module docstring)."""

    host = "http://www.lab.test"  # the Host header the service is asked for; set from options
    network_timeout = 60.0
    connection_timeout = 60.0
    max_retries = 0

    def on_start(self) -> None:
        options = self.environment.parsed_options
        assert options is not None
        # User N asks the N-th DNS server (modulo): bound to one resolver for its life.
        self.number = next(_user_numbers)
        servers = options.dns_server.split(",")
        self.dns_server = servers[self.number % len(servers)]
        server, _, port = self.dns_server.rpartition(":")
        self.lb_name = options.lb_name
        self.port = options.http_port
        self.objects = options.objects
        self.think = options.think_time
        self.connect = options.connect
        self.rng = random.Random(random.getrandbits(64))
        hold = options.ignore_ttl_hold if self.rng.random() < options.ignore_ttl else None
        if hold is None and not options.user_cache:
            hold = 0.0  # no cache of its own: every request asks its resolver
        self.resolver = CachingResolver(
            dns_lookup(_dns_address(server), int(port)), time.monotonic, hold=hold
        )

    def wait_time(self) -> float:
        return self.rng.expovariate(1.0 / self.think) if self.think > 0 else 0.0

    @task
    def fetch(self) -> None:
        address = self._address()
        if address is None:
            gevent.sleep(1.0)  # no answer: a client retries after a moment
            return
        index = self.rng.randrange(self.objects)
        with self.client.get(
            f"http://{address}:{self.port}/objects/{index}",
            name="/objects/[n]",
            headers={"Host": self.lb_name},
            context={"address": address},
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")
                # A client whose server refused or vanished asks DNS again.
                self.resolver.forget(self.lb_name)

    def _address(self) -> str | None:
        started = time.perf_counter()
        start_time = time.time()
        try:
            answer, looked_up = self.resolver.resolve(self.lb_name)
        except LookupFailed as exc:
            self._dns_event(started, start_time, 0, exc, None)
            return None
        if looked_up:
            self._dns_event(started, start_time, len(answer.addresses), None, answer.ttl)
        return choose(answer.addresses, self.connect, self.rng)

    def _dns_event(
        self,
        started: float,
        start_time: float,
        length: int,
        exception: BaseException | None,
        ttl: int | None,
    ) -> None:
        self.environment.events.request.fire(
            request_type=DNS,
            name=self.lb_name,
            response_time=(time.perf_counter() - started) * 1000.0,
            response_length=length,
            exception=exception,
            context={"ttl": ttl, "address": self.dns_server},
            start_time=start_time,
        )


class StepShape(LoadTestShape):
    """The step load of the ``--start-users`` ... ``--hold`` options."""

    def tick(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options if self.runner else None
        if options is None:
            return None
        load = StepLoad(
            start=options.start_users,
            step=options.step_users,
            every=options.step_time,
            count=options.steps,
            hold=options.hold,
        )
        problems = problems_of(load)
        if problems:
            print(f"loadtest: {'; '.join(problems)}", file=sys.stderr)
            raise StopUser
        users = load.users_at(self.get_run_time())  # type: ignore[no-untyped-call]
        if users is None:
            return None
        return users, load.spawn_rate
