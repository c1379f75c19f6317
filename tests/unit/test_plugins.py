"""Plugins: a new provider, source, health check, dispatch driver or plan store is one module and
one registry line, and a configuration naming an unknown one is refused with the known ones.

The fakes here are small and honest (the provider keeps its servers in a dict, the check passes
for the addresses it lists); each test registers them in registries restored afterwards, so the
reference docs and the other tests never see them.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

import agents.dispatch_drivers
import agents.sources
import manager.checks
import manager.checks.base as checks_base
import manager.providers
import manager.providers.base as providers_base
from agents.dispatch_drivers import DRIVERS, DispatchDriver, NodeRules, create_driver
from agents.sources import SOURCES, Reading, Source, create_source
from dnslb.agent_config import AgentConfig, SourceConfig
from dnslb.config import PluginConfig, json_schema, parse_config, plugin_name, reference, setting
from dnslb.errors import ConfigError
from dnslb.plan_store import STORES, FilePlanStore, PlanStore, StoreOptions, open_store
from manager.checks import HealthCheck, HealthCheckConfig, create_check
from manager.config import ManagerConfig, PoolConfig, RuntimePoolsConfig
from manager.providers import (
    Instance,
    LaunchRequest,
    Provider,
    ProviderConfig,
    ProviderContext,
    ProviderError,
    create_provider,
    provider_class,
)
from manager.providers.base import InstanceStatus

FAMILIES = (ProviderConfig, HealthCheckConfig, SourceConfig)


@pytest.fixture
def registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every registry as it is now, restored after the test (registering in it is then safe)."""
    for family in FAMILIES:
        monkeypatch.setattr(family, "_plugins", dict(family._plugins))
    monkeypatch.setattr(providers_base, "_REGISTRY", dict(providers_base._REGISTRY))
    monkeypatch.setattr(checks_base, "_REGISTRY", dict(checks_base._REGISTRY))


def plugin_modules(package: object) -> set[str]:
    """The modules of a plugin package, less its base."""
    path = Path(typing.cast(typing.Any, package).__file__).parent
    return {info.name for info in pkgutil.iter_modules([str(path)])} - {"base"}


# -- the mechanism, on a family of the test's own ---------------------------------------------


class WidgetConfig(PluginConfig):
    """A widget."""

    __slots__ = ()
    size: int


@WidgetConfig.register
@dataclass(frozen=True, slots=True)
class RoundWidget(WidgetConfig):
    """A round widget."""

    type: Literal["round"]
    size: int = setting(1, help="size", min=1)
    radius: float = setting(1.0, help="radius")


@WidgetConfig.register
@dataclass(frozen=True, slots=True)
class SquareWidget(WidgetConfig):
    """A square widget."""

    type: Literal["square"]
    size: int = setting(2, help="size", min=1)


@dataclass(frozen=True, slots=True)
class Shelf:
    """A shelf."""

    widget: WidgetConfig = setting(help="the widget")
    spare: WidgetConfig | None = setting(None, help="a spare widget")


def test_a_family_field_builds_the_plugin_its_type_names() -> None:
    shelf = parse_config(
        "widget: {type: round, radius: 2.5}\nspare: {type: square}\n", Shelf, source="shelf"
    )
    assert shelf == Shelf(
        widget=RoundWidget(type="round", radius=2.5), spare=SquareWidget("square")
    )
    assert parse_config("widget: {type: square, size: 3}\n", Shelf).spare is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            "widget: {type: hexagon}",
            "shelf, line 1: widget.type: must be one of round, square, not 'hexagon'",
            id="unknown-type",
        ),
        pytest.param(
            "widget: {size: 3}",
            "shelf, line 1: widget.type: must be one of round, square, not None",
            id="no-type",
        ),
        pytest.param(
            "widget: {type: square, radius: 1}",
            "shelf, line 1: widget.radius: unknown key",
            id="another-plugin's-key",
        ),
        pytest.param(
            "widget:\n  type: round\n  size: 0\n",
            "shelf, line 3: widget.size: must be at least 1, not 0",
            id="bounds",
        ),
        pytest.param(
            "widget: round", "shelf, line 1: widget: must be a mapping with a type", id="scalar"
        ),
    ],
)
def test_a_bad_plugin_block_is_refused_with_its_line(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, Shelf, source="shelf")
    assert caught.value.problems == [problem]


def test_the_reference_and_the_json_schema_list_every_plugin() -> None:
    text = reference(Shelf)
    assert "| `widget` | RoundWidget or SquareWidget | required | the widget |" in text
    assert "### `widget`: RoundWidget" in text and "### `widget`: SquareWidget" in text
    schema = json_schema(Shelf)
    options = schema["properties"]["widget"]["oneOf"]
    assert [option["title"] for option in options] == ["RoundWidget", "SquareWidget"]
    assert all(option["required"][0] == "type" for option in options)
    spare = schema["properties"]["spare"]["anyOf"]
    assert spare[1] == {"type": "null"} and len(spare[0]["oneOf"]) == 2


@dataclass(frozen=True, slots=True)
class Loose:
    type: Literal["loose"]
    size: int = 1


@dataclass(frozen=True, slots=True)
class Sizeless(WidgetConfig):
    type: Literal["sizeless"]


@dataclass(frozen=True, slots=True)
class Unnamed(WidgetConfig):
    type: str
    size: int = 1


@dataclass(frozen=True, slots=True)
class OtherRound(WidgetConfig):
    type: Literal["round"]
    size: int = 1


class NotADataclass(WidgetConfig):
    __slots__ = ()
    type = "plain"


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        pytest.param(Loose, "Loose must derive from WidgetConfig", id="not-in-family"),
        pytest.param(NotADataclass, "must be a dataclass", id="not-a-dataclass"),
        pytest.param(Sizeless, "Sizeless lacks the fields size", id="declared-field-missing"),
        pytest.param(Unnamed, "must declare its name as type: Literal['name']", id="no-literal"),
        pytest.param(OtherRound, "WidgetConfig 'round' is already RoundWidget", id="duplicate"),
    ],
)
def test_a_plugin_that_breaks_the_family_contract_is_refused(plugin: type, message: str) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        WidgetConfig.register(plugin)
    assert set(WidgetConfig.plugins()) == {"round", "square"}


def test_only_a_family_takes_registrations() -> None:
    with pytest.raises(TypeError, match="not a family"):
        RoundWidget.register(SquareWidget)
    assert WidgetConfig.register(RoundWidget) is RoundWidget  # registering again: no change
    assert plugin_name(RoundWidget) == "round"


# -- providers --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShelfProviderConfig(ProviderConfig):
    """Servers on a shelf (the test's own provider)."""

    type: Literal["shelf"]
    network: str = setting("10.77.0", help="first three octets of the servers' addresses")


class ShelfProvider(Provider):
    """Keeps its servers in a dict: launched, described, listed and terminated for real."""

    def __init__(self, config: ShelfProviderConfig, context: ProviderContext) -> None:
        super().__init__(config, context)
        self.servers: dict[str, Instance] = {}

    async def launch(self, request: LaunchRequest) -> Instance:
        address = f"{self.config.network}.{len(self.servers) + 1}"
        instance = Instance(
            request.server_id, InstanceStatus.RUNNING, request.server_id, request.pool, address
        )
        return self.servers.setdefault(request.server_id, instance)

    async def describe(self, ref: str) -> Instance:
        return self.servers.get(ref) or Instance(ref, InstanceStatus.GONE)

    async def terminate(self, ref: str) -> None:
        self.servers.pop(ref, None)

    async def list_owned(self) -> list[Instance]:
        return list(self.servers.values())


MANAGER_YAML = """\
zones: [{name: example.test, ns: [ns1.example.test]}]
pools:
  - name: www
    zone: example.test
    provider: {type: %s}
    health_check: {type: %s}
"""


def test_a_new_provider_is_one_module_and_one_registration(
    registries: None, tmp_path: Path
) -> None:
    providers_base.register(ShelfProviderConfig)(ShelfProvider)  # its module's decorator line
    config = parse_config(MANAGER_YAML % ("shelf", "tcp, port: 80"), ManagerConfig)
    block = config.pools[0].provider
    assert block == ShelfProviderConfig(type="shelf")
    context = ProviderContext(pool="www", state_dir=tmp_path, manager_url="http://127.0.0.1:1")
    provider = create_provider(block, context)
    assert isinstance(provider, ShelfProvider) and provider.kind == "shelf"
    assert list(RuntimePoolsConfig(providers=("shelf",)).config_problems()) == []
    assert "### `provider`: ShelfProviderConfig" in reference(ManagerConfig)


def test_an_unknown_provider_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(MANAGER_YAML % ("gce", "tcp, port: 80"), ManagerConfig, source="m.yaml")
    known = "docker, ec2, local, memory, openstack, static"
    assert caught.value.problems == [
        f"m.yaml, line 5: pools[0].provider.type: must be one of {known}, not 'gce'"
    ]
    with pytest.raises(ProviderError, match=f"no provider named 'gce' \\(known: {known}\\)"):
        provider_class("gce")
    problems = list(RuntimePoolsConfig(providers=("gce",)).config_problems())
    assert problems == [f"providers: 'gce' is not one of {known}"]


def test_every_provider_module_is_registered_with_its_config_beside_it() -> None:
    registered = providers_base._REGISTRY
    modules = plugin_modules(manager.providers) - {"userdata"}
    assert {cls.__module__.rsplit(".", 1)[1] for cls in registered.values()} == modules
    assert set(registered) == set(ProviderConfig.plugins())
    for kind, config in ProviderConfig.plugins().items():
        assert config.__module__ == registered[kind].__module__, kind


# -- health checks ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListedCheck(HealthCheckConfig):
    """Healthy when the address is listed (the test's own check)."""

    type: Literal["listed"]
    addresses: tuple[str, ...] = setting(default_factory=tuple, help="healthy addresses")
    interval: float = setting(2.0, help="seconds between checks", min=0.1)
    timeout: float = setting(1.0, help="seconds before a check fails", min=0.05)
    rise: int = setting(2, help="passes in a row to become healthy", min=1)
    fall: int = setting(2, help="failures in a row to become unhealthy", min=1)


class ListedHealthCheck(HealthCheck):
    config: ListedCheck

    async def attempt(self, address: str) -> tuple[bool, str]:
        listed = address in self.config.addresses
        return listed, "" if listed else f"{address} is not listed"


def test_a_new_health_check_is_one_module_and_one_registration(registries: None) -> None:
    import asyncio  # noqa: PLC0415

    checks_base.register(ListedCheck)(ListedHealthCheck)
    text = MANAGER_YAML % ("memory", "listed, addresses: [10.0.0.1], rise: 3")
    block = parse_config(text, ManagerConfig).pools[0].health_check
    assert block == ListedCheck(type="listed", addresses=("10.0.0.1",), rise=3)
    check = create_check(block)
    assert asyncio.run(check.probe("10.0.0.1")) == (True, "")
    assert asyncio.run(check.probe("10.0.0.2")) == (False, "10.0.0.2 is not listed")
    assert "### `health_check`: ListedCheck" in reference(PoolConfig)


def test_an_unknown_health_check_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(MANAGER_YAML % ("memory", "icmp"), ManagerConfig, source="m.yaml")
    assert caught.value.problems == [
        "m.yaml, line 6: pools[0].health_check.type: must be one of http, tcp, not 'icmp'"
    ]


def test_a_check_without_the_fields_the_checker_needs_is_refused(registries: None) -> None:
    @dataclass(frozen=True, slots=True)
    class Paceless(HealthCheckConfig):
        type: Literal["paceless"]
        interval: float = 1.0

    with pytest.raises(TypeError, match="lacks the fields timeout, rise, fall"):
        checks_base.register(Paceless)(ListedHealthCheck)


def test_every_health_check_module_is_registered_with_its_config_beside_it() -> None:
    registered = checks_base._REGISTRY
    assert {cls.__module__.rsplit(".", 1)[1] for cls in registered.values()} == plugin_modules(
        manager.checks
    )
    assert set(registered) == set(HealthCheckConfig.plugins()) == {"http", "tcp"}
    for kind, config in HealthCheckConfig.plugins().items():
        assert config.__module__ == registered[kind].__module__, kind


# -- utilization sources ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FixedSourceConfig(SourceConfig):
    """Always the same load (the test's own source)."""

    type: Literal["fixed"] = setting("fixed", help="selects this source")
    in_progress: int = setting(help="requests in progress", min=0)
    max_concurrency: int = setting(help="capacity", min=1)


class FixedSource(Source):
    name = "fixed"

    def __init__(self, config: FixedSourceConfig) -> None:
        super().__init__(config.max_concurrency)
        self.config = config

    async def measure(self) -> Reading:
        return Reading(self.config.in_progress, self.config.max_concurrency)


AGENT_YAML = """\
server_id: cache-1
manager_url: http://127.0.0.1:8700
token: env:DNSLB_TEST_AGENT_TOKEN
source: {type: %s}
"""


def test_a_new_source_is_one_module_one_config_and_one_registry_line(
    registries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio  # noqa: PLC0415

    monkeypatch.setenv("DNSLB_TEST_AGENT_TOKEN", "t" * 32)
    SourceConfig.register(FixedSourceConfig)  # in dnslb/agent_config.py: its decorator
    monkeypatch.setitem(typing.cast(dict[str, object], SOURCES), "fixed", FixedSource)
    config = parse_config(AGENT_YAML % "fixed, in_progress: 3, max_concurrency: 9", AgentConfig)
    source = create_source(config.source)
    assert isinstance(source, FixedSource)
    assert asyncio.run(source.read()) == Reading(in_progress=3, max_concurrency=9)


def test_an_unknown_source_is_refused_with_the_known_ones(
    registries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DNSLB_TEST_AGENT_TOKEN", "t" * 32)
    with pytest.raises(ConfigError) as caught:
        parse_config(AGENT_YAML % "statsd", AgentConfig, source="agent.yaml")
    assert caught.value.problems == [
        "agent.yaml, line 4: source.type: must be one of json, nginx, port, not 'statsd'"
    ]
    # A configuration the core knows but this agent cannot read (an older agent).
    SourceConfig.register(FixedSourceConfig)
    with pytest.raises(ConfigError, match=r"'fixed': unknown \(known: json, nginx, port\)"):
        create_source(FixedSourceConfig(in_progress=0, max_concurrency=1))


def test_every_source_config_has_an_implementation_and_every_implementation_a_config() -> None:
    configs = SourceConfig.plugins()
    assert set(SOURCES) == set(configs) == {"json", "nginx", "port"}
    for name, implementation in SOURCES.items():
        reads = typing.get_type_hints(implementation.__init__)["config"]
        assert reads is configs[name], name
        assert typing.cast(type[Source], implementation).name == name
    assert plugin_modules(agents.sources) == {
        typing.cast(type, implementation).__module__.rsplit(".", 1)[1]
        for implementation in SOURCES.values()
    }


# -- dispatch drivers -------------------------------------------------------------------------


class CountingDriver(DispatchDriver):
    """Counts what it is asked to do (the test's own driver)."""

    name = "counting"

    def __init__(self, rules: NodeRules) -> None:
        super().__init__(rules)
        self.calls: list[str] = []

    def install(self) -> None:
        self.calls.append("install")

    def apply(self, buckets: Sequence[int], bucket_count: int, seed: int) -> None:
        self.calls.append(f"apply {len(buckets)}/{bucket_count}")

    def fence(self) -> None:
        self.calls.append("fence")

    def renew(self, seconds: float | None = None) -> None:
        self.calls.append("renew")


def test_a_new_driver_is_one_module_and_one_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DRIVERS, CountingDriver.name, CountingDriver)
    driver = create_driver("counting", NodeRules(vip="10.0.0.10"))
    assert isinstance(driver, CountingDriver)
    driver.install()
    assert driver.calls == ["install"]


def test_an_unknown_driver_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        create_driver("ebpf", NodeRules(vip="10.0.0.10"))
    assert caught.value.problems == ["'ebpf': unknown (known: dry-run, nftables)"]


NODE_AGENT_YAML = """\
cluster: edge
node_id: n1
vip: 10.0.0.10
token: env:DNSLB_TEST_NODE_TOKEN
driver: %s
"""


def test_the_node_agent_takes_the_driver_names_the_registry_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agents.node_agent import NodeAgentConfig  # noqa: PLC0415

    monkeypatch.setenv("DNSLB_TEST_NODE_TOKEN", "n" * 32)
    with pytest.raises(ConfigError) as caught:
        parse_config(NODE_AGENT_YAML % "counting", NodeAgentConfig, source="node.yaml")
    assert caught.value.problems == [
        "node.yaml, line 1: driver: 'counting' unknown (known: dry-run, nftables)"
    ]
    monkeypatch.setitem(DRIVERS, CountingDriver.name, CountingDriver)
    assert parse_config(NODE_AGENT_YAML % "counting", NodeAgentConfig).driver == "counting"


def test_every_driver_module_is_registered() -> None:
    package = agents.dispatch_drivers
    for name in plugin_modules(package):
        importlib.import_module(f"{package.__name__}.{name}")
    drivers = {
        cls
        for cls in DispatchDriver.__subclasses__()
        if cls.__module__.startswith(package.__name__)
    }
    assert set(DRIVERS.values()) == drivers
    assert all(DRIVERS[cls.name] is cls for cls in drivers)


# -- plan stores ------------------------------------------------------------------------------


def test_a_new_plan_store_is_one_registry_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    opened: list[tuple[str, StoreOptions]] = []

    def open_shelf(location: str, options: StoreOptions) -> PlanStore:
        opened.append((location, options))
        return FilePlanStore(tmp_path / location.removeprefix("shelf://"))

    monkeypatch.setitem(STORES, "shelf", open_shelf)
    store = open_store("shelf://plan.json", password="pw", max_plan_bytes=99)
    assert isinstance(store, FilePlanStore) and store.path == tmp_path / "plan.json"
    assert opened == [("shelf://plan.json", StoreOptions(password="pw", max_plan_bytes=99))]


@pytest.mark.parametrize(
    ("location", "path"),
    [("/srv/plan.json", "/srv/plan.json"), ("file:///srv/plan.json", "/srv/plan.json")],
    ids=["path", "file-url"],
)
def test_a_path_or_a_file_url_is_a_file_store(location: str, path: str) -> None:
    store = open_store(location)
    assert isinstance(store, FilePlanStore) and store.path == Path(path)


def test_an_unknown_plan_store_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        open_store("etcd://:s3cret@db:2379/plan")
    (problem,) = caught.value.problems
    assert "unsupported plan store 'etcd' (known: file, redis)" in problem
    assert "s3cret" not in problem


def test_the_families_hold_only_frozen_dataclasses() -> None:
    for family in FAMILIES:
        plugin: typing.Any
        for plugin in family.plugins().values():
            assert dataclasses.is_dataclass(plugin), plugin
            assert vars(plugin)["__dataclass_params__"].frozen, plugin
