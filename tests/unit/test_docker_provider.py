"""The docker provider against a small Docker Engine on a unix socket (tests/fake_docker.py):
launches (locked down, token by archive, idempotent), boot delay, reaping exited containers,
terminate, list by label, close, errors; and the manager's lifecycle over it."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from dnslb.agent_config import AgentConfig
from dnslb.clock import FakeClock
from dnslb.config import load_config, parse_config
from dnslb.errors import ConfigError
from dnslb.model import ServerState
from dnslb.tokens import token_hash
from manager.config import load_manager_config
from manager.providers.base import InstanceStatus, LaunchRequest, ProviderContext, ProviderError
from manager.providers.docker import (
    LABEL_MANAGED_BY,
    LABEL_POOL,
    LABEL_SERVER,
    LABEL_TOKEN_HASH,
    DockerProvider,
    DockerProviderConfig,
)
from manager.service import Manager
from tests.fake_docker import FakeDockerEngine

TOKEN = "agent-token-of-www-1"


def synchronous(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """An async test run on its own event loop (pytest sees its fixtures through wraps)."""

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        asyncio.run(test(*args, **kwargs))  # type: ignore[arg-type]

    return run


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[FakeDockerEngine]:
    with FakeDockerEngine(tmp_path / "docker.sock") as running:
        yield running


def provider_config(engine: FakeDockerEngine, **changes: object) -> DockerProviderConfig:
    settings = {
        "type": "docker",
        "image": "dnslb-lab/cache:latest",
        "network": "dnslb-lab",
        "origin": "http://origin:8000",
        "socket": str(engine.socket_path),
        "capacity_rps": 20,
        "send_rate": 16384,
        "max_concurrency": 12,
        **changes,
    }
    return parse_config(json.dumps(settings), DockerProviderConfig, source="test")


def make_provider(
    engine: FakeDockerEngine, tmp_path: Path, clock: FakeClock | None = None, **changes: object
) -> DockerProvider:
    context = ProviderContext(
        pool="www",
        state_dir=tmp_path / "providers" / "www",
        manager_url="http://manager:8700",
        clock=clock or FakeClock(),
        manager_allow_plaintext=True,  # as the compose lab's manager allows
    )
    return DockerProvider(provider_config(engine, **changes), context)


def request(server_id: str = "www-1") -> LaunchRequest:
    return LaunchRequest(
        server_id=server_id, pool="www", agent_token=TOKEN, manager_url="http://manager:8700"
    )


@synchronous
async def test_launch_runs_a_locked_down_container_with_its_token_written_in(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    provider = make_provider(engine, tmp_path)
    instance = await provider.launch(request())
    await provider.engine.aclose()

    assert instance.status is InstanceStatus.RUNNING
    assert instance.server_id == "www-1"
    assert instance.pool == "www"
    assert instance.token_hash == token_hash(TOKEN)
    container = engine.containers[instance.ref]
    assert instance.address == container.address
    assert container.name == "dnslb-www-1"
    assert container.labels == {
        LABEL_POOL: "www",
        LABEL_SERVER: "www-1",
        LABEL_MANAGED_BY: "dnslb",
        LABEL_TOKEN_HASH: token_hash(TOKEN),
        "dnslb.boot-at": container.labels["dnslb.boot-at"],
    }
    spec = container.spec
    host = spec["HostConfig"]
    assert spec["User"] == "10001:10001"
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Privileged"] is False
    assert "Binds" not in host and "Mounts" not in host
    assert host["NetworkMode"] == "dnslb-lab"
    assert spec["Cmd"][:2] == ["dnslb", "cache-server"]
    assert "--capacity-rps" in spec["Cmd"] and "20" in spec["Cmd"]
    # The token is nowhere docker inspect shows: only in a file of the container.
    assert TOKEN not in json.dumps(spec)
    token = container.files["/etc/dnslb/agent.token"]
    assert token.data == f"{TOKEN}\n".encode()
    assert (token.mode, token.uid, token.gid) == (0o600, 10001, 10001)
    agent_yaml = container.files["/etc/dnslb/agent.yaml"]
    assert TOKEN not in agent_yaml.data.decode()
    # The agent's file, read back with the token file beside it, is what the agent would load.
    (tmp_path / "etc").mkdir()
    written = tmp_path / "etc" / "agent.yaml"
    written.write_bytes(agent_yaml.data.replace(b"/etc/dnslb/agent.token", b"agent.token"))
    (tmp_path / "etc" / "agent.token").write_bytes(token.data)
    agent = load_config(written, AgentConfig)
    assert agent.server_id == "www-1"
    assert agent.manager_url == "http://manager:8700"
    assert agent.token.reveal() == TOKEN
    assert agent.source.url == "http://127.0.0.1:8080/nginx_status"  # type: ignore[union-attr]
    assert agent.source.max_concurrency == 12


@synchronous
async def test_a_retried_launch_finds_the_first_container(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    provider = make_provider(engine, tmp_path)
    first = await provider.launch(request())
    again = await provider.launch(request())
    await provider.engine.aclose()
    assert again.ref == first.ref
    assert len(engine.containers) == 1
    assert engine.containers[first.ref].starts == 1


@synchronous
async def test_a_name_taken_by_someone_else_is_refused(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    engine.add_foreign("dnslb-www-1", {"owner": "someone"})
    provider = make_provider(engine, tmp_path)
    with pytest.raises(ProviderError, match="not this server's"):
        await provider.launch(request())
    await provider.engine.aclose()


@synchronous
async def test_boot_delay_starts_the_container_once_its_time_has_come(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    clock = FakeClock()
    provider = make_provider(engine, tmp_path, clock, boot_delay=10)
    instance = await provider.launch(request())
    assert instance.status is InstanceStatus.PENDING
    assert "starts in 10 s" in instance.detail
    assert engine.containers[instance.ref].state == "created"
    clock.advance(9)
    assert (await provider.describe(instance.ref)).status is InstanceStatus.PENDING
    clock.advance(1)
    # A manager restarted meanwhile would find it by label: list_owned starts it too.
    restarted = make_provider(engine, tmp_path, clock, boot_delay=10)
    [listed] = await restarted.list_owned()
    assert listed.ref == instance.ref
    assert engine.containers[instance.ref].state == "running"
    running = await provider.describe(instance.ref)
    assert running.status is InstanceStatus.RUNNING
    assert running.address is not None
    await provider.engine.aclose()
    await restarted.engine.aclose()


@synchronous
async def test_an_exited_container_is_gone_and_removed_with_its_last_words(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    provider = make_provider(engine, tmp_path)
    instance = await provider.launch(request())
    engine.exit(instance.ref, 1, "nginx exited; its log ends:\nbind() failed (98: in use)\n")
    gone = await provider.describe(instance.ref)
    await provider.engine.aclose()
    assert gone.status is InstanceStatus.GONE
    assert gone.address is None
    assert "exited with status 1" in gone.detail
    assert "bind() failed" in gone.detail
    assert instance.ref not in engine.containers


@synchronous
async def test_terminate_stops_and_removes_and_is_idempotent(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    provider = make_provider(engine, tmp_path)
    instance = await provider.launch(request())
    await provider.terminate(instance.ref)
    await provider.terminate(instance.ref)
    gone = await provider.describe(instance.ref)
    await provider.engine.aclose()
    assert engine.containers == {}
    assert gone.status is InstanceStatus.GONE
    stops = [call for call in engine.calls if call.endswith("/stop")]
    assert len(stops) == 2  # the second found nothing, and said so without failing


@synchronous
async def test_list_owned_sees_only_this_pool_of_this_deployment(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    provider = make_provider(engine, tmp_path)
    ours = await provider.launch(request("www-1"))
    engine.add_foreign("other-pool", {LABEL_POOL: "img", LABEL_MANAGED_BY: "dnslb"})
    engine.add_foreign("other-deployment", {LABEL_POOL: "www", LABEL_MANAGED_BY: "staging"})
    engine.add_foreign("unrelated", {})
    owned = await provider.list_owned()
    await provider.engine.aclose()
    assert [instance.ref for instance in owned] == [ours.ref]


@synchronous
async def test_close_removes_the_pools_containers_only_when_told(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    keeping = make_provider(engine, tmp_path, stop_on_exit=False)
    kept = await keeping.launch(request("www-1"))
    assert keeping.stops_servers_on_close is False
    await keeping.close()
    assert set(engine.containers) == {kept.ref}

    removing = make_provider(engine, tmp_path)
    await removing.launch(request("www-2"))
    foreign = engine.add_foreign("unrelated", {})
    assert removing.stops_servers_on_close is True
    await removing.close()
    assert set(engine.containers) == {foreign}


@synchronous
async def test_a_missing_image_fails_the_launch_saying_what_to_do(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    provider = make_provider(engine, tmp_path, image="dnslb-lab/cache:missing")
    with pytest.raises(
        ProviderError, match=r"No such image: dnslb-lab/cache:missing \(build"
    ) as caught:
        await provider.launch(request())
    await provider.engine.aclose()
    assert caught.value.retryable is False
    assert engine.containers == {}


@synchronous
async def test_a_missing_network_fails_the_launch_naming_it(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    provider = make_provider(engine, tmp_path, network="no-such-net")
    with pytest.raises(ProviderError, match=r"cannot create dnslb-www-1: network not found$"):
        await provider.launch(request())
    await provider.engine.aclose()


@synchronous
async def test_a_failed_token_upload_leaves_no_container(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    engine.fail_next["PUT /v1.41/containers/"] = 500
    provider = make_provider(engine, tmp_path)
    with pytest.raises(ProviderError, match="500 told to fail") as caught:
        await provider.launch(request())
    await provider.engine.aclose()
    assert caught.value.retryable is True
    assert engine.containers == {}


@synchronous
async def test_an_engine_that_cannot_be_reached_is_a_retryable_error(tmp_path: Path) -> None:
    engine = FakeDockerEngine(tmp_path / "nobody-listens.sock")  # never started
    provider = make_provider(engine, tmp_path)
    with pytest.raises(ProviderError, match=r"cannot reach the Docker Engine at .*nobody-listens"):
        await provider.list_owned()
    await provider.engine.aclose()


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        pytest.param({"user": "dnslb"}, "user: must be numeric UID:GID", id="user-name"),
        pytest.param({"user": "0:0"}, "must not run as root", id="root"),
        pytest.param({"socket": "docker.sock"}, "socket: must be an absolute path", id="socket"),
        pytest.param({"origin": "origin:8000"}, r"origin: must be an http\(s\) URL", id="origin"),
        pytest.param({"api_version": "v1.41"}, "api_version: must look like 1.41", id="version"),
        pytest.param({"name_prefix": "-x"}, "name_prefix", id="prefix"),
        pytest.param({"network": "host"}, "not a network of its own", id="host-network"),
        pytest.param({"network": "container:x"}, "not a network of its own", id="container"),
    ],
)
def test_config_problems_are_named(
    engine: FakeDockerEngine, changes: dict[str, object], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        provider_config(engine, **changes)


MANAGER = """
zones: [{{name: lab.test, ns: [ns1.lab.test]}}]
plan: {{refresh: 5, stale_after: 30}}
http:
  {{address: 127.0.0.1, port: 8700, advertise_url: "http://manager:8700", allow_plaintext: true}}
pools:
  - name: www
    zone: lab.test
    provider:
      type: docker
      image: dnslb-lab/cache:latest
      network: dnslb-lab
      origin: http://origin:8000
      socket: {socket}
    scaling: {{min_servers: 1, max_servers: 2, boot_time: 1, server_capacity: 10}}
    lifecycle: {{describe_interval: 0.5, reconcile_interval: 1000}}
"""


@synchronous
async def test_the_manager_launches_through_the_engine_and_removes_at_exit(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    path = tmp_path / "manager.yaml"
    path.write_text(MANAGER.format(socket=engine.socket_path))
    clock = FakeClock()
    manager = Manager(load_manager_config(path), clock=clock)
    lifecycle = manager.lifecycles["www"]
    manager.tick()  # the first reconcile lists the engine's containers...
    for _ in range(100):
        await lifecycle.settle()
        await asyncio.sleep(0.01)
        if lifecycle.reconciled:
            break
    manager.tick()  # ...then min_servers: one launch
    for _ in range(20):
        await lifecycle.settle()
        await asyncio.sleep(0.01)
        clock.advance(0.5)
        [server] = manager.fleet.pools["www"].servers.values()
        if server.state is ServerState.WARMING:
            break
    [container] = engine.containers.values()
    assert server.state is ServerState.WARMING
    assert server.record.address == container.address
    assert server.record.provider_ref == container.id
    assert container.labels[LABEL_SERVER] == server.id
    assert container.labels[LABEL_TOKEN_HASH] == server.record.token_hash

    # A container of the pool that the state does not know is removed by reconcile.
    stray = engine.add_foreign(
        "dnslb-www-stray",
        {LABEL_POOL: "www", LABEL_MANAGED_BY: "dnslb", LABEL_SERVER: "www-stray"},
    )
    await lifecycle.reconcile()
    for _ in range(20):
        await lifecycle.settle()
        await asyncio.sleep(0.01)
        if stray not in engine.containers:
            break
    assert stray not in engine.containers
    assert container.id in engine.containers

    await manager.close()
    assert engine.containers == {}
    assert manager.fleet.pools["www"].servers == {}


@pytest.mark.parametrize(
    ("engine_api", "engine_min", "spoken"),
    [
        pytest.param("1.41", "1.12", "1.41", id="engine-20.10"),
        pytest.param("1.47", "1.24", "1.47", id="engine-27"),
        pytest.param("1.52", "1.44", "1.47", id="engine-29-newer-than-us"),
    ],
)
@synchronous
async def test_the_api_version_is_negotiated_with_the_engine(
    engine: FakeDockerEngine, tmp_path: Path, engine_api: str, engine_min: str, spoken: str
) -> None:
    engine.api_version, engine.min_api = engine_api, engine_min
    provider = make_provider(engine, tmp_path)
    await provider.launch(request())
    await provider.list_owned()
    await provider.engine.aclose()
    assert engine.versions_used == {spoken}
    assert engine.calls.count("GET /version") == 1


@synchronous
async def test_an_engine_without_a_version_we_speak_is_refused_saying_which(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    engine.api_version, engine.min_api = "1.55", "1.50"
    provider = make_provider(engine, tmp_path)
    with pytest.raises(ProviderError, match=r"serves API 1\.50 to 1\.55; this provider speaks"):
        await provider.launch(request())
    await provider.engine.aclose()
    assert engine.containers == {}


@synchronous
async def test_a_configured_api_version_is_spoken_as_it_is(
    engine: FakeDockerEngine, tmp_path: Path
) -> None:
    provider = make_provider(engine, tmp_path, api_version="1.40")
    await provider.list_owned()
    await provider.engine.aclose()
    assert engine.versions_used == {"1.40"}
    assert "GET /version" not in engine.calls
