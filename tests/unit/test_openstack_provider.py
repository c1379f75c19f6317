"""The OpenStack provider: a real openstacksdk Connection talking HTTP to a fake cloud.

requests-mock answers Keystone (version discovery, a token with a service catalog), Nova
(servers, flavors), Glance (images) and Neutron (networks) from a small in-memory model of a
project, so the SDK does everything it does against a real cloud (auth, discovery, microversions,
lookups by name) with no network and made-up credentials. Servers build for ``boot_time``
seconds of a fake clock, and the model can run out of quota or of hosts.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import requests_mock

from dnslb.clock import FakeClock
from dnslb.config import parse_config
from dnslb.errors import ConfigError
from dnslb.model import ServerState
from dnslb.tokens import token_hash
from manager.providers.base import (
    Instance,
    InstanceStatus,
    LaunchRequest,
    ProviderContext,
    ProviderError,
)
from manager.providers.openstack import OpenStackProvider, OpenStackProviderConfig
from tests.unit.cloud_lab import CloudLab, token_in_user_data

KEYSTONE = "https://keystone.example.test"
NOVA = "https://compute.example.test/v2.1"
GLANCE = "https://image.example.test"
NEUTRON = "https://network.example.test"
MANAGER_URL = "https://manager.example.test:8700"

CLOUDS_YAML = f"""
clouds:
  lab:
    auth:
      auth_url: {KEYSTONE}/v3
      username: demo
      password: not-a-real-password
      project_name: web
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
    identity_api_version: 3
"""

NO_VALID_HOST = "No valid host was found. There are not enough hosts available."


def _endpoint(kind: str, url: str) -> dict[str, Any]:
    return {
        "type": kind,
        "name": kind,
        "id": f"svc-{kind}",
        "endpoints": [
            {
                "id": f"ep-{kind}",
                "interface": "public",
                "region": "RegionOne",
                "region_id": "RegionOne",
                "url": url,
            }
        ],
    }


class FakeOpenStack:
    """One project of a cloud, answering over requests-mock."""

    def __init__(self, mocker: requests_mock.Mocker, clock: FakeClock) -> None:
        self.clock = clock
        self.boot_time = 10.0
        self.instance_quota = 10
        self.no_valid_host = False
        self.floating = False
        self.images = {"img-1": "debian-12"}
        self.flavors = {"flv-1": "m1.small"}
        self.networks = {"net-web": "web", "net-admin": "admin"}
        self.servers: dict[str, dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []  # request bodies of every create
        self._numbers = itertools.count(1)
        self.passwords: list[str] = []
        mocker.register_uri(requests_mock.ANY, re.compile(f"^{KEYSTONE}/"), text=self._keystone)
        mocker.register_uri(requests_mock.ANY, re.compile(f"^{NOVA}"), text=self._nova)
        mocker.register_uri(requests_mock.ANY, re.compile(f"^{GLANCE}/"), text=self._glance)
        mocker.register_uri(requests_mock.ANY, re.compile(f"^{NEUTRON}/"), text=self._neutron)

    # -- what a test sets up or looks at --------------------------------------------------

    def add_server(self, name: str, metadata: dict[str, str]) -> str:
        """A server someone else created in the project."""
        server_id = f"srv-{next(self._numbers)}"
        self.servers[server_id] = {
            "id": server_id,
            "name": name,
            "metadata": metadata,
            "created_at": self.clock.now - self.boot_time,
            "number": next(self._numbers),
            "error": None,
        }
        return server_id

    def view(self, server: dict[str, Any]) -> dict[str, Any]:
        number = server["number"]
        status = "ACTIVE"
        if server["error"]:
            status = "ERROR"
        elif self.clock.now < server["created_at"] + self.boot_time:
            status = "BUILD"
        addresses: dict[str, list[dict[str, Any]]] = {}
        if status == "ACTIVE":
            web = [
                {"version": 4, "addr": f"10.20.0.{number}", "OS-EXT-IPS:type": "fixed"},
                {"version": 6, "addr": f"2001:db8::{number}", "OS-EXT-IPS:type": "fixed"},
            ]
            if self.floating:
                web.append(
                    {"version": 4, "addr": f"203.0.113.{number}", "OS-EXT-IPS:type": "floating"}
                )
            addresses = {"web": web, "admin": [{"version": 4, "addr": f"10.99.0.{number}"}]}
        view: dict[str, Any] = {
            "id": server["id"],
            "name": server["name"],
            "status": status,
            "metadata": server["metadata"],
            "addresses": addresses,
            "flavor": {"id": "flv-1"},
            "image": {"id": "img-1"},
            "tenant_id": "project-web",
            "user_id": "user-demo",
            "links": [],
        }
        if server["error"]:
            view["fault"] = {"code": 500, "message": server["error"], "created": "2026-01-01"}
        return view

    # -- the services ---------------------------------------------------------------------

    @staticmethod
    def _json(context: Any, status: int, body: Any) -> str:
        context.status_code = status
        context.headers["Content-Type"] = "application/json"
        return "" if body is None else json.dumps(body)

    def _keystone(self, request: Any, context: Any) -> str:
        path = urlparse(request.url).path.rstrip("/")
        if request.method == "GET" and path == "/v3":
            link = {"rel": "self", "href": f"{KEYSTONE}/v3/"}
            version = {"id": "v3.14", "status": "stable", "links": [link], "media-types": []}
            return self._json(context, 200, {"version": version})
        if request.method == "POST" and path == "/v3/auth/tokens":
            self.passwords.append(
                request.json()["auth"]["identity"]["password"]["user"]["password"]
            )
            context.headers["X-Subject-Token"] = "fake-keystone-token"
            domain = {"id": "default", "name": "Default"}
            token = {
                "methods": ["password"],
                "expires_at": "2099-01-01T00:00:00.000000Z",
                "issued_at": "2026-01-01T00:00:00.000000Z",
                "user": {"id": "user-demo", "name": "demo", "domain": domain},
                "project": {"id": "project-web", "name": "web", "domain": domain},
                "roles": [{"id": "role-member", "name": "member"}],
                "catalog": [
                    _endpoint("compute", NOVA),
                    _endpoint("image", GLANCE),
                    _endpoint("network", NEUTRON),
                ],
            }
            return self._json(context, 201, {"token": token})
        return self._json(context, 404, {"error": {"message": f"no {path}"}})

    def _nova(self, request: Any, context: Any) -> str:
        url = urlparse(request.url)
        path = url.path.removeprefix("/v2.1").rstrip("/")
        method = request.method
        if method == "GET" and path == "":
            link = {"rel": "self", "href": f"{NOVA}/"}
            version = {"id": "v2.1", "status": "CURRENT", "version": "2.96", "min_version": "2.1"}
            return self._json(context, 200, {"version": {**version, "links": [link]}})
        if method == "GET" and path == "/flavors/detail":
            flavors = [
                {"id": i, "name": n, "vcpus": 1, "ram": 2048, "disk": 20}
                for i, n in self.flavors.items()
            ]
            return self._json(context, 200, {"flavors": flavors})
        if method == "GET" and path.startswith("/flavors/"):
            flavor_id = path.removeprefix("/flavors/")
            if flavor_id in self.flavors:
                flavor = {"id": flavor_id, "name": self.flavors[flavor_id], "vcpus": 1, "ram": 2048}
                return self._json(context, 200, {"flavor": flavor})
            return self._not_found(context, f"Flavor {flavor_id} could not be found.")
        if method == "GET" and path == "/servers/detail":
            servers = [self.view(s) for s in self.servers.values()]
            return self._json(context, 200, {"servers": servers})
        if method == "POST" and path == "/servers":
            return self._create(request.json()["server"], context)
        if path.startswith("/servers/"):
            server_id = path.removeprefix("/servers/")
            server = self.servers.get(server_id)
            if server is None:
                return self._not_found(context, f"Instance {server_id} could not be found.")
            if method == "GET":
                return self._json(context, 200, {"server": self.view(server)})
            if method == "DELETE":
                del self.servers[server_id]
                return self._json(context, 204, None)
        return self._json(context, 404, {"itemNotFound": {"code": 404, "message": path}})

    def _create(self, body: dict[str, Any], context: Any) -> str:
        self.created.append(body)
        if len(self.servers) >= self.instance_quota:
            used = len(self.servers)
            message = (
                f"Quota exceeded for instances: Requested 1, but already used {used} of "
                f"{self.instance_quota} instances"
            )
            return self._json(context, 403, {"forbidden": {"code": 403, "message": message}})
        if body["imageRef"] not in self.images or body["flavorRef"] not in self.flavors:
            return self._json(context, 400, {"badRequest": {"code": 400, "message": "bad ref"}})
        server_id = self.add_server(body["name"], dict(body.get("metadata", {})))
        self.servers[server_id]["created_at"] = self.clock.now
        self.servers[server_id]["error"] = NO_VALID_HOST if self.no_valid_host else None
        self.servers[server_id]["user_data"] = base64.b64decode(body.get("user_data", "")).decode()
        link = {"rel": "self", "href": f"{NOVA}/servers/{server_id}"}
        return self._json(
            context, 202, {"server": {"id": server_id, "links": [link], "adminPass": "x"}}
        )

    def _not_found(self, context: Any, message: str) -> str:
        return self._json(context, 404, {"itemNotFound": {"code": 404, "message": message}})

    def _glance(self, request: Any, context: Any) -> str:
        url = urlparse(request.url)
        path = url.path.rstrip("/")
        if path == "":
            link = {"rel": "self", "href": f"{GLANCE}/v2/"}
            return self._json(
                context, 200, {"versions": [{"id": "v2.16", "status": "CURRENT", "links": [link]}]}
            )
        if path == "/v2/images":
            wanted = parse_qs(url.query).get("name", [None])[0]
            images = [
                {"id": i, "name": n, "status": "active"}
                for i, n in self.images.items()
                if wanted is None or n == wanted
            ]
            return self._json(context, 200, {"images": images})
        if path.startswith("/v2/images/"):
            image_id = path.removeprefix("/v2/images/")
            if image_id in self.images:
                return self._json(context, 200, {"id": image_id, "name": self.images[image_id]})
            return self._json(context, 404, {"message": f"No image found with ID {image_id}"})
        return self._json(context, 404, {"message": path})

    def _neutron(self, request: Any, context: Any) -> str:
        url = urlparse(request.url)
        path = url.path.rstrip("/")
        if path == "/v2.0/networks":
            wanted = parse_qs(url.query).get("name", [None])[0]
            networks = [
                {"id": i, "name": n, "status": "ACTIVE"}
                for i, n in self.networks.items()
                if wanted is None or n == wanted
            ]
            return self._json(context, 200, {"networks": networks})
        if path.startswith("/v2.0/networks/"):
            network_id = path.removeprefix("/v2.0/networks/")
            if network_id in self.networks:
                network = {"id": network_id, "name": self.networks[network_id]}
                return self._json(context, 200, {"network": network})
            message = f"Network {network_id} could not be found."
            return self._json(context, 404, {"NeutronError": {"message": message}})
        return self._json(context, 404, {"NeutronError": {"message": path}})


@pytest.fixture(autouse=True)
def clean_openstack_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No OS_* variable of the developer's, and a clouds.yaml of our own (fake password)."""
    for name in list(os.environ):
        if name.startswith("OS_"):
            monkeypatch.delenv(name)
    clouds = tmp_path / "clouds.yaml"
    clouds.write_text(CLOUDS_YAML)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
    return clouds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def cloud(clock: FakeClock) -> Iterator[FakeOpenStack]:
    with requests_mock.Mocker() as mocker:
        yield FakeOpenStack(mocker, clock)


BASE = "{type: openstack, cloud: lab, image: debian-12, flavor: m1.small, networks: [web]"


def make_provider(
    yaml: str, tmp_path: Path, clock: FakeClock, *, pool: str = "www"
) -> OpenStackProvider:
    config = parse_config(yaml, OpenStackProviderConfig)
    context = ProviderContext(pool=pool, state_dir=tmp_path, manager_url=MANAGER_URL, clock=clock)
    return OpenStackProvider(config, context)


def request(
    server_id: str = "www-0001", token: str = "agent-token-1", pool: str = "www"
) -> LaunchRequest:
    return LaunchRequest(server_id=server_id, pool=pool, agent_token=token, manager_url=MANAGER_URL)


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml", "problem"),
    [
        pytest.param(
            "{type: openstack, flavor: f, networks: [n]}", "image: missing", id="no-image"
        ),
        pytest.param(
            "{type: openstack, image: i, flavor: f, networks: []}",
            "networks: at least one network is needed",
            id="no-network",
        ),
        pytest.param(
            BASE + ", metadata: {'dnslb:pool': other}}",
            "dnslb: keys are not yours to set",
            id="reserved-metadata",
        ),
        pytest.param(BASE + ", ip_version: 5}", "must be one of 4, 6", id="bad-ip-version"),
        pytest.param(
            BASE + ", user_data: '{{secret}}'}", "unknown placeholder {{secret}}", id="placeholder"
        ),
    ],
)
def test_bad_configurations_are_refused_with_a_clear_problem(yaml: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml, OpenStackProviderConfig)
    assert problem in str(caught.value)


# -- the provider ---------------------------------------------------------------------------


def test_launch_creates_a_marked_server_and_hands_the_token_over_in_user_data(
    cloud: FakeOpenStack, clock: FakeClock, tmp_path: Path
) -> None:
    provider = make_provider(
        BASE + ", key_name: ops, security_groups: [web, ssh], metadata: {team: web}}",
        tmp_path,
        clock,
    )
    launched = asyncio.run(provider.launch(request(token="s3cret-agent-token")))
    assert launched.status is InstanceStatus.PENDING
    assert (launched.server_id, launched.pool) == ("www-0001", "www")
    assert launched.token_hash == token_hash("s3cret-agent-token")
    [body] = cloud.created
    assert (body["name"], body["imageRef"], body["flavorRef"]) == ("www-0001", "img-1", "flv-1")
    assert body["networks"] == [{"uuid": "net-web"}]
    assert body["key_name"] == "ops"
    assert body["security_groups"] == [{"name": "web"}, {"name": "ssh"}]
    assert body["metadata"] == {
        "team": "web",
        "dnslb:pool": "www",
        "dnslb:server-id": "www-0001",
        "dnslb:managed-by": "dnslb",
        "dnslb:token-sha256": token_hash("s3cret-agent-token"),
    }
    script = cloud.servers[launched.ref]["user_data"]
    assert token_in_user_data(script) == "s3cret-agent-token"
    assert f'manager_url: "{MANAGER_URL}"' in script
    assert cloud.passwords == ["not-a-real-password"]  # from clouds.yaml, not from dnslb


def test_describe_is_pending_while_building_then_answers_the_chosen_address(
    cloud: FakeOpenStack, clock: FakeClock, tmp_path: Path
) -> None:
    cloud.floating = True
    v4 = make_provider(BASE + "}", tmp_path, clock)
    v6 = make_provider(BASE + ", ip_version: 6}", tmp_path, clock)
    admin = make_provider(BASE + ", address_network: admin}", tmp_path, clock)
    floating = make_provider(BASE + ", address_type: floating}", tmp_path, clock)
    missing = make_provider(BASE + ", address_network: storage}", tmp_path, clock)

    async def scenario() -> None:
        launched = await v4.launch(request())
        building = await v4.describe(launched.ref)
        assert (building.status, building.address) == (InstanceStatus.PENDING, None)
        clock.advance(cloud.boot_time)
        number = cloud.servers[launched.ref]["number"]
        for provider, address in [
            (v4, f"10.20.0.{number}"),
            (v6, f"2001:db8::{number}"),
            (admin, f"10.99.0.{number}"),
            (floating, f"203.0.113.{number}"),
        ]:
            running = await provider.describe(launched.ref)
            assert (running.status, running.address) == (InstanceStatus.RUNNING, address)
        wrong = await missing.describe(launched.ref)
        assert wrong.status is InstanceStatus.PENDING
        assert "no fixed IPv4 address on network 'storage' (networks: admin, web)" in wrong.detail

    asyncio.run(scenario())


def test_a_retried_launch_never_creates_a_second_server(
    cloud: FakeOpenStack, clock: FakeClock, tmp_path: Path
) -> None:
    provider = make_provider(BASE + "}", tmp_path, clock)

    async def twice() -> tuple[Instance, Instance]:
        return await provider.launch(request()), await provider.launch(request())

    first, again = asyncio.run(twice())
    assert first.ref == again.ref
    assert len(cloud.created) == 1


def test_delete_is_idempotent_and_a_deleted_server_is_gone(
    cloud: FakeOpenStack, clock: FakeClock, tmp_path: Path
) -> None:
    provider = make_provider(BASE + "}", tmp_path, clock)

    async def scenario() -> None:
        launched = await provider.launch(request())
        await provider.terminate(launched.ref)
        assert launched.ref not in cloud.servers
        await provider.terminate(launched.ref)  # already gone: success
        assert (await provider.describe(launched.ref)).status is InstanceStatus.GONE
        await provider.close()

    asyncio.run(scenario())


def test_list_owned_finds_the_pools_servers_by_metadata(
    cloud: FakeOpenStack, clock: FakeClock, tmp_path: Path
) -> None:
    ours = make_provider(BASE + "}", tmp_path, clock)
    other_pool = make_provider(BASE + "}", tmp_path, clock, pool="api")
    other_deployment = make_provider(BASE + ", managed_by: staging}", tmp_path, clock)
    cloud.add_server("hand-made", {"dnslb:pool": "www"})  # someone's, not managed by dnslb

    async def scenario() -> list[Instance]:
        kept = [await ours.launch(request(f"www-{n}", token=f"t{n}")) for n in range(2)]
        await other_pool.launch(request("api-1", pool="api"))
        await other_deployment.launch(request("www-staging"))
        clock.advance(cloud.boot_time)
        listed = await ours.list_owned()
        assert {i.ref for i in listed} == {i.ref for i in kept}
        return listed

    listed = sorted(asyncio.run(scenario()), key=lambda i: i.server_id or "")
    assert [i.server_id for i in listed] == ["www-0", "www-1"]
    assert [i.token_hash for i in listed] == [token_hash("t0"), token_hash("t1")]
    assert all(i.status is InstanceStatus.RUNNING and i.address for i in listed)


def test_a_quota_refusal_is_a_clear_error(
    cloud: FakeOpenStack, clock: FakeClock, tmp_path: Path
) -> None:
    cloud.instance_quota = 1
    provider = make_provider(BASE + "}", tmp_path, clock)

    async def scenario() -> None:
        await provider.launch(request("www-1"))
        await provider.launch(request("www-2"))

    with pytest.raises(ProviderError) as caught:
        asyncio.run(scenario())
    message = str(caught.value)
    assert message.startswith("OpenStack quota exceeded (creating server www-2)")
    assert "Quota exceeded for instances: Requested 1, but already used 1 of 1" in message


def test_no_valid_host_fails_the_server_with_novas_fault(
    cloud: FakeOpenStack, clock: FakeClock, tmp_path: Path
) -> None:
    cloud.no_valid_host = True
    provider = make_provider(BASE + "}", tmp_path, clock)

    async def scenario() -> tuple[Instance, list[Instance]]:
        launched = await provider.launch(request())  # Nova accepts, then the scheduler fails
        with pytest.raises(ProviderError) as caught:
            await provider.describe(launched.ref)
        assert "No valid host was found" in str(caught.value)
        assert caught.value.retryable
        return launched, await provider.list_owned()

    launched, [listed] = asyncio.run(scenario())
    assert listed.ref == launched.ref
    assert listed.status is InstanceStatus.STOPPING  # still there, to be deleted
    assert listed.detail.startswith("ERROR: No valid host was found")


@pytest.mark.parametrize(
    ("yaml", "problem"),
    [
        pytest.param(
            "{type: openstack, cloud: lab, image: ubuntu-99, flavor: m1.small, networks: [web]}",
            "no image 'ubuntu-99'",
            id="image",
        ),
        pytest.param(
            "{type: openstack, cloud: lab, image: debian-12, flavor: m9.huge, networks: [web]}",
            "no flavor 'm9.huge'",
            id="flavor",
        ),
        pytest.param(
            "{type: openstack, cloud: lab, image: img-1, flavor: flv-1, networks: [web, nowhere]}",
            "no network 'nowhere'",
            id="network",
        ),
    ],
)
def test_unknown_images_flavors_and_networks_are_clear_errors(
    cloud: FakeOpenStack, clock: FakeClock, tmp_path: Path, yaml: str, problem: str
) -> None:
    provider = make_provider(yaml, tmp_path, clock)
    with pytest.raises(ProviderError, match=re.escape(problem)):
        asyncio.run(provider.launch(request()))
    assert cloud.created == []


def test_the_os_environment_works_without_clouds_yaml(
    cloud: FakeOpenStack, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(tmp_path / "none.yaml"))
    for name, value in {
        "OS_AUTH_URL": f"{KEYSTONE}/v3",
        "OS_USERNAME": "demo",
        "OS_PASSWORD": "env-password",
        "OS_PROJECT_NAME": "web",
        "OS_USER_DOMAIN_NAME": "Default",
        "OS_PROJECT_DOMAIN_NAME": "Default",
        "OS_REGION_NAME": "RegionOne",
    }.items():
        monkeypatch.setenv(name, value)
    provider = make_provider(
        "{type: openstack, image: debian-12, flavor: m1.small, networks: [web]}", tmp_path, clock
    )
    asyncio.run(provider.launch(request()))
    assert cloud.passwords == ["env-password"]


def test_an_unknown_cloud_is_a_clear_error(
    cloud: FakeOpenStack, clock: FakeClock, tmp_path: Path
) -> None:
    provider = make_provider(BASE.replace("cloud: lab", "cloud: nonesuch") + "}", tmp_path, clock)
    with pytest.raises(ProviderError, match="nonesuch"):
        asyncio.run(provider.list_owned())


# -- a real manager on the fake cloud ---------------------------------------------------------

MANAGER_CONFIG = f"""
zones: [{{name: example.test, ns: [ns1.example.test]}}]
http: {{advertise_url: "{MANAGER_URL}"}}
pools:
  - name: www
    zone: example.test
    policy: {{slow_start: 0, smoothing: 0}}
    provider: {{type: openstack, cloud: lab, image: debian-12, flavor: m1.small, networks: [web]}}
    scaling: {{min_servers: 1, max_servers: 2, th_high: 0.9, th_low: 0.05, window: 5,
              scale_in_window: 30, server_capacity: 100}}
    lifecycle: {{warming_timeout: 60, describe_interval: 1, reconcile_interval: 5,
                max_failed_launches: 2, launch_backoff: 600}}
"""


def openstack_lab(cloud: FakeOpenStack, tmp_path: Path) -> CloudLab:
    def token_of(ref: str) -> str | None:
        server = cloud.servers.get(ref)
        return token_in_user_data(server["user_data"]) if server else None

    lab = CloudLab(tmp_path, MANAGER_CONFIG, token_of)
    cloud.clock = lab.clock
    return lab


def test_a_crash_between_create_and_record_is_recovered_after_restart(
    cloud: FakeOpenStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        lab = openstack_lab(cloud, tmp_path)
        provider = lab.manager.lifecycles["www"].provider
        launch = provider.launch

        async def launch_then_die(req: LaunchRequest) -> Instance:
            await launch(req)
            raise asyncio.CancelledError

        monkeypatch.setattr(provider, "launch", launch_then_die)
        await lab.run(2, 0)  # a reconcile, then the launch
        [server] = lab.servers(ServerState.LAUNCHING)
        await lab.restart()
        await lab.run(int(cloud.boot_time) + 3, 20)
        [ref] = cloud.servers
        runtime = lab.manager.fleet.servers[server]
        assert runtime.state is ServerState.ACTIVE
        assert runtime.record.provider_ref == ref
        assert runtime.record.address == f"10.20.0.{cloud.servers[ref]['number']}"
        await lab.manager.close()

    asyncio.run(scenario())


def test_no_valid_host_becomes_an_event_and_the_failed_server_is_deleted(
    cloud: FakeOpenStack, tmp_path: Path
) -> None:
    async def scenario() -> None:
        cloud.no_valid_host = True
        lab = openstack_lab(cloud, tmp_path)
        await lab.run(5, 0)
        failures = lab.events("launch_failed")
        assert len(failures) == 2  # max_failed_launches, then launching pauses
        assert all("No valid host was found" in failure for failure in failures)
        assert lab.events("scaling_paused")
        assert cloud.servers == {}  # each failed server was deleted
        assert lab.servers(ServerState.LAUNCHING, ServerState.WARMING) == []
        await lab.manager.close()

    asyncio.run(scenario())
