"""Scenario files: what a simulation runs, as frozen dataclasses loaded from YAML.

A scenario file holds one :class:`Scenario`, or a base scenario plus ``cases``: each case is a
partial scenario merged key by key over the base (lists are replaced whole), so that a file can
hold one table of the paper::

    title: Table 3, addresses per answer
    name: base
    duration: 1500
    dns: {policy: {k: 4}}
    cases:
      - name: A (k=1)
        dns: {policy: {k: 1}}
      - name: C (k=4)

Files are validated with :mod:`dnslb.config`: unknown keys are rejected and every problem says
its file and line (a problem inside a case points at the case's line). Times are seconds of
simulated time from the start of the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from dnslb.config import build_config, compose_config, setting
from dnslb.errors import ConfigError
from dnslb.policy import PoolPolicy
from dnslb.scaling import ScalingPolicy

SCENARIO_DIR = Path(__file__).parent / "scenarios"
"""The scenario files shipped with the simulator."""


@dataclass(frozen=True, slots=True)
class ServiceTime:
    """How long a server works on one request once a worker slot has it."""

    distribution: Literal["exponential", "lognormal", "constant"] = setting(
        "exponential", help="exponential, lognormal (with cv) or constant"
    )
    mean: float = setting(0.5, help="mean service time, seconds", min=0.000001)
    cv: float = setting(1.0, help="coefficient of variation (lognormal only)", min=0.0)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The cache servers: identical machines unless ``speed_spread`` says otherwise."""

    initial: int = setting(1, help="servers serving at the start", min=0)
    max_concurrency: int = setting(100, help="worker slots: requests served at once", min=1)
    backlog: int | None = setting(
        None,
        help="requests that may wait beyond max_concurrency (null: unbounded); a connection "
        "arriving when it is full is dropped and the client retransmits (clients.retry_after)",
        min=0,
    )
    service: ServiceTime = setting(default_factory=ServiceTime, help="service time")
    start_rate: float | None = setting(
        None,
        help="requests a second a server starts at most, in arrival order, each then served "
        "alongside the others (the lab's nginx: limit_req, then paced sending); null: "
        "max_concurrency worker slots",
        min=0.001,
    )
    speed_spread: float = setting(
        0.0,
        help="each server's speed is drawn uniformly from 1 +/- this (0: identical servers)",
        min=0.0,
        max=0.9,
    )
    boot_delay: float = setting(60.0, help="seconds from a launch to serving", min=0.0)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Users: each one thinks, sends a request, waits for the response, thinks again."""

    think_time: float = setting(10.0, help="mean think time, seconds (exponential)", min=0.0)
    first_request: Literal["after_think", "at_once"] = setting(
        "after_think",
        help="when a user who joins sends its first request: after a think time, or at once, "
        "as locust's users do (the lab's step of 32 users is a burst of 32 requests)",
    )
    connect_to: Literal["first", "random"] = setting(
        "first", help="which address of the answer (in the resolver's order) a client connects to"
    )
    ignore_ttl: float = setting(
        0.0, help="fraction of clients that keep an address for ignore_ttl_hold", min=0.0, max=1.0
    )
    ignore_ttl_hold: float = setting(
        600.0, help="seconds a TTL-ignoring client keeps its answer", min=0.0
    )
    timeout: float = setting(60.0, help="a client gives up on a request after this", min=0.001)
    retry_after: tuple[float, ...] = setting(
        (3.0, 6.0, 12.0, 24.0),
        help="seconds between connection attempts when a server drops the connection (TCP SYN "
        "retransmissions); also the wait for a dead address before the next one is tried",
    )

    def config_problems(self) -> Iterator[str]:
        if not self.retry_after or any(wait <= 0 for wait in self.retry_after):
            yield "retry_after must list positive waits"


@dataclass(frozen=True, slots=True)
class ResolverConfig:
    """The caching resolvers between clients and the DNS (each user keeps one)."""

    count: int = setting(12, help="caching resolvers (the paper's lab had 12)", min=1)
    order: Literal["fixed", "cyclic", "random"] = setting(
        "cyclic",
        help="order a resolver hands a cached answer's addresses out in: as received, rotated "
        "one step per client query (BIND's cyclic, Unbound's rrset-roundrobin), or shuffled",
    )
    min_ttl: int = setting(0, help="resolvers cache an answer at least this long", min=0)
    skew: float = setting(
        0.0,
        help="resolver sizes: resolver r gets users in proportion to 1 / (r + 1) ** skew "
        "(0: equal; 1: Zipf, a few big public resolvers and many small ones)",
        min=0.0,
    )
    staggered: bool = setting(
        True,
        help="resolvers start with an answer cached at a random moment of the last ttl_max "
        "seconds, as resolvers in the wild are out of phase (false: all start empty together)",
    )


@dataclass(frozen=True, slots=True)
class LoadStep:
    at: float = setting(help="when, seconds", min=0.0)
    clients: int = setting(help="users active from then on", min=0)


@dataclass(frozen=True, slots=True)
class Staircase:
    """A load raised gradually: ``start`` users, ``step`` more every ``every`` seconds,
    ``count`` steps in all (the paper's step load)."""

    start: int = setting(help="users at time 0", min=0)
    step: int = setting(help="users added at each step", min=0)
    every: float = setting(help="seconds between steps", min=0.001)
    count: int = setting(help="number of steps after the first", min=0)


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """How many users are active over time: explicit ``steps``, a ``staircase``, or both
    (their users add up)."""

    steps: tuple[LoadStep, ...] = setting((), help="users from a time on (sorted by time)")
    staircase: Staircase | None = setting(None, help="a gradually raised load")

    def config_problems(self) -> Iterator[str]:
        times = [step.at for step in self.steps]
        if times != sorted(times):
            yield "steps must be sorted by time"
        if not self.steps and self.staircase is None:
            yield "give steps or a staircase"

    def clients_at(self, time: float) -> int:
        """Users active at ``time``."""
        users = 0
        for step in self.steps:
            if step.at <= time:
                users = step.clients
        stairs = self.staircase
        if stairs is not None:
            done = min(stairs.count, int(time // stairs.every))
            users += stairs.start + done * stairs.step
        return users

    def changes(self, until: float) -> list[float]:
        """Times (after 0, before ``until``) at which the number of users may change."""
        times = {step.at for step in self.steps}
        stairs = self.staircase
        if stairs is not None:
            times.update(stairs.every * (i + 1) for i in range(stairs.count))
        return sorted(time for time in times if 0 < time < until)

    def peak(self, until: float) -> int:
        """The most users at any time before ``until``."""
        return max(self.clients_at(time) for time in [0.0, *self.changes(until)])


@dataclass(frozen=True, slots=True)
class DnsConfig:
    """The answers: the product's policy and selection, or a baseline made of the same parts."""

    policy: PoolPolicy = setting(default_factory=PoolPolicy, help="the pool's load policy")
    pause: bool = setting(True, help="leave paused servers out of answers (false: never pause)")
    all_addresses: bool = setting(
        False, help="every eligible address in every answer (k = pool size), as plain DNS does"
    )


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    """The manager's timing, as ``dnslb manager`` has it."""

    tick: float = setting(1.0, help="seconds between agent reports and plan rebuilds", min=0.05)
    down_after: float = setting(
        3.0, help="a server silent this long is down (left out of answers)", min=0.1
    )
    drain_timeout: float = setting(
        600.0, help="longest drain before a server is terminated anyway", min=0.0
    )
    warmup: float | None = setting(
        None,
        help="seconds the manager runs before the users come, its pool serving (null: the "
        "policy's slow_start and five ticks, so that the run starts with the pool settled)",
        min=0.0,
    )


FAILURE_KINDS = (
    "crash",
    "silent_agent",
    "failed_launches",
    "hung_launches",
    "manager_restart",
    "store_outage",
)


@dataclass(frozen=True, slots=True)
class Failure:
    """A fault injected at a moment of the run.

    - ``crash``: servers stop serving and reporting; requests in progress fail.
    - ``silent_agent``: servers go on serving, but their agents stop reporting.
    - ``failed_launches``: the cloud refuses the next ``servers`` launches.
    - ``hung_launches``: the next ``servers`` launches never get past pending.
    - ``manager_restart``: the manager process dies and a new one starts from its state.
    - ``store_outage``: the plan store fails (publications fail; the pipe backend keeps its
      plan) for ``recover_after`` seconds.
    """

    at: float = setting(help="when, seconds", min=0.0)
    kind: str = setting("crash", help=f"what fails: {', '.join(FAILURE_KINDS)}")
    servers: int = setting(
        1,
        help="how many servers (the serving servers with the lowest ids) or launches",
        min=1,
    )
    target: Literal["serving", "draining"] = setting(
        "serving", help="which servers a crash or a silent agent strikes: serving or draining ones"
    )
    recover_after: float | None = setting(
        None,
        help="seconds until crashed servers serve again, silent agents report again or the "
        "plan store is back "
        "(null: never; the autoscaler replaces them)",
    )

    def config_problems(self) -> Iterator[str]:
        if self.kind not in FAILURE_KINDS:
            yield f"kind must be one of {', '.join(FAILURE_KINDS)}"


@dataclass(frozen=True, slots=True)
class LocationConfig:
    """One region or site: its share of the users and the servers it starts with."""

    name: str = setting(help="location name (a pool network's and its members' location)")
    users: float = setting(help="share of the users (and resolvers) there", min=0.0, max=1.0)
    servers: int = setting(help="servers there, serving at the start", min=0)


@dataclass(frozen=True, slots=True)
class TopologyConfig:
    """Users and servers in several locations (a fixed pool of static members, each with its
    location; resolvers send the ECS subnet of their location's network)."""

    locations: tuple[LocationConfig, ...] = setting(help="the locations, at least two")
    penalty: float = setting(
        0.02, help="seconds added to a response served from another location", min=0.0
    )
    aware: bool = setting(
        True, help="the pool maps client networks to locations (false: location-blind answers)"
    )

    def config_problems(self) -> Iterator[str]:
        names = [location.name for location in self.locations]
        if len(names) < 2 or len(set(names)) != len(names):
            yield "locations: give two or more, with different names"
        if abs(sum(location.users for location in self.locations) - 1.0) > 1e-6:
            yield "locations: the users' shares must add up to 1"


@dataclass(frozen=True, slots=True)
class Scenario:
    """One simulation run."""

    name: str = setting(help="short name, shown in tables")
    duration: float = setting(help="simulated seconds", min=1.0)
    load: LoadConfig = setting(help="users over time")
    description: str | None = setting(None, help="what the scenario shows")
    seed: int = setting(1, help="seed of every random choice (dnslb sim --seed overrides)")
    clients: ClientConfig = setting(default_factory=ClientConfig, help="the users")
    resolvers: ResolverConfig = setting(default_factory=ResolverConfig, help="caching resolvers")
    servers: ServerConfig = setting(default_factory=ServerConfig, help="the cache servers")
    dns: DnsConfig = setting(default_factory=DnsConfig, help="how answers are chosen")
    manager: ManagerConfig = setting(default_factory=ManagerConfig, help="manager timing")
    scaling: ScalingPolicy | None = setting(
        None, help="the autoscaler (null: a fixed pool of servers.initial servers)"
    )
    failures: tuple[Failure, ...] = setting((), help="faults: crashes, silent agents...")
    topology: TopologyConfig | None = setting(
        None, help="users and servers in several locations (null: one place)"
    )
    balance_window: float = setting(
        10.0, help="seconds over which utilization is averaged to compare servers", min=1.0
    )

    def config_problems(self) -> Iterator[str]:
        if self.servers.initial == 0 and (self.scaling is None or self.scaling.min_servers == 0):
            yield "no servers: set servers.initial or scaling.min_servers"
        if self.topology is not None:
            servers = sum(location.servers for location in self.topology.locations)
            if servers != self.servers.initial:
                yield (
                    f"topology: the locations' servers ({servers}) must be servers.initial "
                    f"({self.servers.initial})"
                )
            if self.scaling is not None:
                yield "topology: a fixed pool only (launched servers would all take one location)"
        for failure in self.failures:
            if failure.at >= self.duration:
                yield f"failure at {failure.at:g} s is after the end ({self.duration:g} s)"


@dataclass(frozen=True, slots=True)
class ScenarioFile:
    """A scenario file: its cases (one when it has no ``cases``) and the title of its table."""

    path: str
    title: str
    scenarios: tuple[Scenario, ...]


def load_scenarios(path: str | Path) -> ScenarioFile:
    """Read a scenario file; :class:`ConfigError` lists every problem of every case."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError("invalid scenario", [f"{file}: cannot read: {exc.strerror}"]) from None
    return parse_scenarios(text, source=str(file))


def parse_scenarios(text: str, *, source: str = "<scenario>") -> ScenarioFile:
    """Build the cases of a scenario file's ``text`` (see the module docstring)."""
    root = compose_config(text, source=source)
    title: str | None = None
    cases: yaml.Node | None = None
    base_pairs = []
    for key_node, value_node in root.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if key == "title" and isinstance(value_node, yaml.ScalarNode):
            title = str(value_node.value)
        elif key == "cases":
            cases = value_node
        else:
            base_pairs.append((key_node, value_node))
    base = yaml.MappingNode(root.tag, base_pairs, root.start_mark, root.end_mark)
    if cases is None:
        scenario = build_config(base, Scenario, source=source)
        return ScenarioFile(path=source, title=title or scenario.name, scenarios=(scenario,))
    if not isinstance(cases, yaml.SequenceNode) or not cases.value:
        line = cases.start_mark.line + 1
        raise ConfigError("invalid scenario", [f"{source}, line {line}: cases: must be a list"])
    problems: list[str] = []
    scenarios: list[Scenario] = []
    for case in cases.value:
        if not isinstance(case, yaml.MappingNode):
            line = case.start_mark.line + 1
            problems.append(f"{source}, line {line}: cases: each case must be a mapping")
            continue
        try:
            scenarios.append(build_config(_merge(base, case), Scenario, source=source))
        except ConfigError as exc:
            problems.extend(problem for problem in exc.problems if problem not in problems)
    if problems:
        raise ConfigError("invalid scenario", problems)
    return ScenarioFile(path=source, title=title or Path(source).stem, scenarios=tuple(scenarios))


def _merge(base: yaml.MappingNode, override: yaml.MappingNode) -> yaml.MappingNode:
    """``override`` laid over ``base``: mappings merge key by key, anything else replaces."""
    pairs = list(base.value)
    index = {
        key.value: position
        for position, (key, _) in enumerate(pairs)
        if isinstance(key, yaml.ScalarNode)
    }
    for key_node, value_node in override.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        position = index.get(key)
        if position is None:
            index[key] = len(pairs)
            pairs.append((key_node, value_node))
            continue
        old = pairs[position][1]
        merged = value_node
        if isinstance(old, yaml.MappingNode) and isinstance(value_node, yaml.MappingNode):
            merged = _merge(old, value_node)
        pairs[position] = (key_node, merged)
    return yaml.MappingNode(base.tag, pairs, override.start_mark, override.end_mark)
