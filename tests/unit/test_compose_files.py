"""The compose lab's files agree with each other and with the local lab: docker-compose.yml, the
manager's docker/lab/manager.yaml and docker/Dockerfile (scripts/compose-lab-test runs them)."""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.settings import LabSettings, default_policy, default_scaling, manager_config
from manager.config import LoadedConfig, load_manager_config
from manager.providers.docker import DockerProviderConfig

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
MANAGER = ROOT / "docker" / "lab" / "manager.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
SECRETS = "/var/lib/dnslb/secrets"
MANAGERS = ("manager-1", "manager-2")  # active/standby on the postgres service


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


@pytest.fixture
def manager(tmp_path: Path) -> LoadedConfig:
    """docker/lab/manager.yaml as the manager loads it, its secrets files made here."""
    for name in ("api.token", "redis.password", "postgres.password"):
        (tmp_path / name).write_text(f"test-{name}-value\n")
    path = tmp_path / "manager.yaml"
    path.write_text(MANAGER.read_text().replace(SECRETS, str(tmp_path)))
    return load_manager_config(path)


def test_the_compose_file_is_the_spec_format_both_compose_versions_read(
    compose: dict[str, Any],
) -> None:
    # No `version`: docker-compose 1.29 then reads the Compose Specification, as v2 does;
    # v2 warns that the key is obsolete, v1 would switch to its 2.x/3.x formats with it.
    assert "version" not in compose
    assert "name" not in compose  # a top-level project name is v2 only
    for name, service in compose["services"].items():
        assert "profiles" not in service, name
        assert not ("network_mode" in service and "networks" in service), name


def test_published_ports_are_on_loopback_unless_configured(compose: dict[str, Any]) -> None:
    published = [
        (name, port)
        for name, service in compose["services"].items()
        for port in service.get("ports", [])
    ]
    assert {name for name, _ in published} == {*MANAGERS, "dns", "locust-master"}
    for name, port in published:
        assert port.startswith("${DNSLB_LAB_BIND:-127.0.0.1}:"), (name, port)


def test_only_the_managers_get_the_docker_socket(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        sockets = [v for v in service.get("volumes", []) if "docker.sock" in v]
        assert sockets == (
            ["${DNSLB_DOCKER_SOCKET:-/var/run/docker.sock}:/var/run/docker.sock"]
            if name in MANAGERS
            else []
        ), name
        assert not service.get("privileged"), name
        if name not in (*MANAGERS, "secrets", "cache"):
            assert service.get("user") is None, name  # the image's user, 10001
            assert service["cap_drop"] == ["ALL"], name


def test_secrets_are_made_at_start_never_in_images_or_the_repository(
    compose: dict[str, Any],
) -> None:
    instructions = "\n".join(
        line for line in DOCKERFILE.read_text().splitlines() if not line.startswith("#")
    ).lower()
    assert "token" not in instructions and "password" not in instructions
    assert "secrets" in compose["volumes"]
    for name in (*MANAGERS, "postgres"):
        depends = compose["services"][name]["depends_on"]
        assert depends["secrets"] == {"condition": "service_completed_successfully"}, name
    for service in compose["services"].values():
        assert "environment" not in service  # nothing secret (or not) passed that way
    script = ROOT / "docker" / "lab" / "secrets-init"
    assert os.access(script, os.X_OK)


def test_the_manager_config_names_what_the_compose_file_defines(
    compose: dict[str, Any], manager: LoadedConfig
) -> None:
    services = compose["services"]
    [pool] = manager.config.pools
    provider = pool.provider
    assert isinstance(provider, DockerProviderConfig)
    assert provider.network == compose["networks"]["lab"]["name"]
    assert provider.image == services["cache"]["image"]
    assert services["cache"]["build"]["target"] == "cache"
    origin = urllib.parse.urlsplit(provider.origin)
    assert origin.hostname in services and origin.port == 8000
    plan = urllib.parse.urlsplit(manager.config.plan.store or "")
    assert plan.hostname in services
    state = urllib.parse.urlsplit(manager.config.state.url or "")
    assert state.hostname == "postgres" and state.port == 5432
    assert services["postgres"]["build"]["target"] == "postgres"
    assert "postgres" in compose["volumes"]
    # One file, each manager its own URL, the agents given both (they follow the leader).
    peers = []
    for name in MANAGERS:
        service = services[name]
        assert "./docker/lab/manager.yaml:/etc/dnslb/manager.yaml:ro" in service["volumes"]
        command = service["command"]
        advertised = urllib.parse.urlsplit(command[command.index("--advertise-url") + 1])
        assert (advertised.hostname, advertised.port) == (name, manager.config.http.port)
        assert service["depends_on"]["postgres"] == {"condition": "service_healthy"}
        peers.append(advertised.geturl())
    assert list(manager.config.http.peer_urls) == peers
    # manager-2 starts after manager-1 and compose stops it first: the leader stops last
    # and removes the cache servers (a leader stopped before a standby leaves them to it).
    assert services["manager-2"]["depends_on"]["manager-1"] == {"condition": "service_healthy"}
    assert provider.stop_on_exit is True


def test_it_is_the_same_lab_as_the_local_one(manager: LoadedConfig) -> None:
    lab = LabSettings(workdir=Path("/unused"))
    [pool] = manager.config.pools
    provider = pool.provider
    assert isinstance(provider, DockerProviderConfig)
    assert pool.policy == default_policy()
    assert pool.scaling == default_scaling()
    assert (provider.boot_delay, provider.port) == (lab.boot_delay, lab.http_port)
    assert provider.max_concurrency == lab.max_concurrency
    assert provider.capacity_rps == lab.capacity_rps
    assert (provider.send_rate, provider.send_chunk) == (lab.send_rate, lab.send_chunk)
    local: dict[str, Any] = yaml.safe_load(manager_config(lab, api_token_file=None))
    [local_pool] = local["pools"]
    lifecycle = manager.config.pools[0].lifecycle
    for key, value in local_pool["lifecycle"].items():
        assert getattr(lifecycle, key) == value, key
    assert local["zones"][0]["name"] == manager.config.zones[0].name
    assert f"{pool.name}.{pool.zone}" == lab.dns_name


def test_the_dockerfile_builds_every_target_from_a_base_image_argument(
    compose: dict[str, Any],
) -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=debian:bookworm-slim$", text, re.MULTILINE)
    assert re.search(r"^FROM \$\{BASE_IMAGE\} AS base$", text, re.MULTILINE)
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", text, re.MULTILINE))
    for name, service in compose["services"].items():
        build = service["build"]
        assert build["dockerfile"] == "docker/Dockerfile", name
        assert build["target"] in stages, name
        assert build["args"]["BASE_IMAGE"] == "${DNSLB_BASE_IMAGE:-debian:bookworm-slim}", name
    for script in re.findall(r"/opt/dnslb/src/(docker/lab/[\w-]+)", COMPOSE.read_text() + text):
        assert os.access(ROOT / script, os.X_OK), script
