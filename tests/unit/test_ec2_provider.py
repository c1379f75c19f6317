"""The EC2 provider against moto's EC2 (mock_aws) and botocore's Stubber: no network, fake keys.

moto keeps a real model of an account (instances, tags, subnets, user data, launch templates), so
launches, listings and terminations are checked against what EC2 then holds; a real Manager drives
it for the reconcile cases. The Stubber answers exactly the errors moto cannot produce on demand
(capacity, throttling, dry runs) and checks the parameters of every call.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.stub import ANY, Stubber
from moto import mock_aws

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
from manager.providers.ec2 import (
    RETRY_BASE,
    RETRY_CAP,
    VISIBILITY_GRACE,
    Ec2Provider,
    Ec2ProviderConfig,
    client_token,
)
from tests.unit.cloud_lab import CloudLab, ThreadedClock, token_in_user_data

REGION = "eu-west-1"
MANAGER_URL = "https://manager.example.test:8700"


@pytest.fixture(autouse=True)
def fake_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake keys, and none of the developer's own AWS configuration or instance role."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask an instance role


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's EC2, and a plain boto3 client to look at it (and act behind dnslb's back)."""
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")  # a second per test; ours is below
    with mock_aws():
        yield boto3.session.Session(region_name=REGION).client("ec2")


@pytest.fixture
def ami(aws: Any) -> str:
    """The image of the pool's cache servers."""
    image = aws.register_image(Name="dnslb-cache", RootDeviceName="/dev/sda1")
    return str(image["ImageId"])


class RecordingClock(ThreadedClock):
    """Sleeps pass at once (moving the clock on) and are recorded: the backoff delays."""

    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)
        await asyncio.sleep(0)


def make_provider(
    yaml: str, tmp_path: Path, *, pool: str = "www", clock: Any = None
) -> Ec2Provider:
    config = parse_config(yaml, Ec2ProviderConfig)
    context = ProviderContext(
        pool=pool, state_dir=tmp_path, manager_url=MANAGER_URL, clock=clock or RecordingClock()
    )
    return Ec2Provider(config, context)


def request(
    server_id: str = "www-0001", token: str = "agent-token-1", pool: str = "www"
) -> LaunchRequest:
    return LaunchRequest(server_id=server_id, pool=pool, agent_token=token, manager_url=MANAGER_URL)


def instances(aws: Any, **filters: str) -> list[dict[str, Any]]:
    found = aws.describe_instances(
        Filters=[{"Name": f"tag:{key}", "Values": [value]} for key, value in filters.items()]
    )
    return [i for r in found["Reservations"] for i in r["Instances"]]


def user_data_of(aws: Any, instance_id: str) -> str:
    value = aws.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(value["UserData"]["Value"]).decode()


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml", "problem"),
    [
        pytest.param(
            "{type: ec2, region: eu-west-1}", "ami: needed without a launch_template", id="no-ami"
        ),
        pytest.param(
            "{type: ec2, region: eu-west-1, ami: ami-1}",
            "instance_types: at least one is needed",
            id="no-type",
        ),
        pytest.param(
            "{type: ec2, region: eu-west-1, launch_template: {id: lt-1, name: web}}",
            "give either id or name",
            id="template-id-and-name",
        ),
        pytest.param(
            "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [t3.small],"
            " subnets: [subnet-a, subnet-a]}",
            "subnets: listed twice: subnet-a",
            id="subnet-twice",
        ),
        pytest.param(
            "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [t3.small],"
            " tags: {'dnslb:pool': other}}",
            "dnslb: and aws: tags are not yours to set",
            id="reserved-tag",
        ),
        pytest.param(
            "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [t3.small],"
            " user_data: 'token={{token}}'}",
            "unknown placeholder {{token}}",
            id="bad-placeholder",
        ),
        pytest.param(
            "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [t3.small],"
            " address: elastic}",
            "must be one of public, private",
            id="bad-address",
        ),
    ],
)
def test_bad_configurations_are_refused_with_a_clear_problem(yaml: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml, Ec2ProviderConfig)
    assert problem in str(caught.value)


def test_client_tokens_are_per_server_and_try_and_fit_ec2s_limit() -> None:
    token = client_token("www-0001", "c5.large", "subnet-a")
    assert token == client_token("www-0001", "c5.large", "subnet-a")
    assert token != client_token("www-0002", "c5.large", "subnet-a")
    assert token != client_token("www-0001", "m5.large", "subnet-a")
    assert len(client_token("x" * 200, "y" * 50, "z" * 50)) <= 64


# -- against moto -----------------------------------------------------------------------------


def test_launch_tags_the_instance_and_hands_the_token_over_in_user_data(
    aws: Any, ami: str, tmp_path: Path
) -> None:
    provider = make_provider(
        f"{{type: ec2, region: {REGION}, ami: {ami}, instance_types: [t3.micro],"
        " tags: {team: web}}",
        tmp_path,
    )
    launched = asyncio.run(provider.launch(request(token="s3cret-agent-token")))

    [raw] = instances(aws, **{"dnslb:server-id": "www-0001"})
    assert launched.ref == raw["InstanceId"]
    assert (launched.server_id, launched.pool) == ("www-0001", "www")
    assert launched.token_hash == token_hash("s3cret-agent-token")
    tags = {tag["Key"]: tag["Value"] for tag in raw["Tags"]}
    assert tags == {
        "Name": "www-0001",
        "team": "web",
        "dnslb:pool": "www",
        "dnslb:server-id": "www-0001",
        "dnslb:managed-by": "dnslb",
        "dnslb:token-sha256": token_hash("s3cret-agent-token"),
    }
    assert not any("s3cret" in value for value in tags.values())
    assert raw["InstanceType"] == "t3.micro"
    assert raw["ClientToken"] == client_token("www-0001", "t3.micro", None)
    script = user_data_of(aws, raw["InstanceId"])
    assert token_in_user_data(script) == "s3cret-agent-token"
    assert 'server_id: "www-0001"' in script
    assert f'manager_url: "{MANAGER_URL}"' in script
    volume_ids = [m["Ebs"]["VolumeId"] for m in raw["BlockDeviceMappings"]]
    for volume in aws.describe_volumes(VolumeIds=volume_ids)["Volumes"]:
        assert {"Key": "dnslb:pool", "Value": "www"} in volume["Tags"]


def test_a_retried_launch_never_starts_a_second_instance(
    aws: Any, ami: str, tmp_path: Path
) -> None:
    provider = make_provider(
        f"{{type: ec2, region: {REGION}, ami: {ami}, instance_types: [t3.micro]}}", tmp_path
    )

    async def twice() -> tuple[str, str]:
        first = await provider.launch(request())
        again = await provider.launch(request())
        return first.ref, again.ref

    first, again = asyncio.run(twice())
    assert first == again
    assert len(instances(aws, **{"dnslb:server-id": "www-0001"})) == 1


def test_describe_answers_the_configured_address_and_terminate_is_idempotent(
    aws: Any, ami: str, tmp_path: Path
) -> None:
    provider = make_provider(
        f"{{type: ec2, region: {REGION}, ami: {ami}, instance_types: [t3.micro],"
        " address: private, check_address: public}",
        tmp_path,
    )

    async def scenario() -> None:
        launched = await provider.launch(request())
        running = await provider.describe(launched.ref)
        [raw] = instances(aws, **{"dnslb:server-id": "www-0001"})
        assert running.status is InstanceStatus.RUNNING
        assert running.address == raw["PrivateIpAddress"]
        assert running.check_address == raw["PublicIpAddress"]
        assert running.address != running.check_address
        await provider.terminate(launched.ref)
        await provider.terminate(launched.ref)  # already terminated: success
        await provider.terminate("i-0123456789abcdef0")  # never existed: success
        assert (await provider.describe(launched.ref)).status is InstanceStatus.GONE
        assert (await provider.describe("i-0123456789abcdef0")).status is InstanceStatus.GONE
        await provider.close()

    asyncio.run(scenario())


def test_list_owned_finds_the_pools_live_instances_only(aws: Any, ami: str, tmp_path: Path) -> None:
    base = f"{{type: ec2, region: {REGION}, ami: {ami}, instance_types: [t3.micro]"
    ours = make_provider(base + "}", tmp_path)
    other_pool = make_provider(base + "}", tmp_path, pool="api")
    other_deployment = make_provider(base + ", managed_by: staging}", tmp_path)

    async def scenario() -> list[str]:
        kept = [await ours.launch(request(f"www-{n}")) for n in range(2)]
        gone = await ours.launch(request("www-gone"))
        await ours.terminate(gone.ref)
        await other_pool.launch(request("api-1", pool="api"))
        await other_deployment.launch(request("www-staging"))
        aws.run_instances(ImageId=ami, InstanceType="t3.micro", MinCount=1, MaxCount=1)
        listed = await ours.list_owned()
        assert {i.ref for i in listed} == {i.ref for i in kept}
        assert all(i.pool == "www" and i.token_hash for i in listed)
        return sorted(i.server_id or "" for i in listed)

    assert asyncio.run(scenario()) == ["www-0", "www-1"]


def test_launch_from_a_launch_template(aws: Any, ami: str, tmp_path: Path) -> None:
    aws.create_launch_template(
        LaunchTemplateName="web", LaunchTemplateData={"ImageId": ami, "InstanceType": "t3.small"}
    )
    provider = make_provider(
        f"{{type: ec2, region: {REGION}, launch_template: {{name: web}}}}", tmp_path
    )
    launched = asyncio.run(provider.launch(request()))
    [raw] = instances(aws, **{"dnslb:server-id": "www-0001"})
    assert raw["InstanceId"] == launched.ref
    assert (raw["ImageId"], raw["InstanceType"]) == (ami, "t3.small")


# -- a real manager on moto: reconcile --------------------------------------------------------

MANAGER_CONFIG = """
zones: [{{name: example.test, ns: [ns1.example.test]}}]
http: {{advertise_url: "{manager_url}"}}
pools:
  - name: www
    zone: example.test
    policy: {{slow_start: 0, smoothing: 0}}
    provider: {{type: ec2, region: {region}, ami: {ami}, instance_types: [t3.micro]}}
    scaling: {{min_servers: 1, max_servers: 2, th_high: 0.9, th_low: 0.05, window: 5,
              scale_in_window: 30, server_capacity: 100}}
    lifecycle: {{warming_timeout: 60, describe_interval: 1, reconcile_interval: 5,
                adopt_unknown: {adopt}}}
"""


def ec2_lab(aws: Any, ami: str, tmp_path: Path, *, adopt: bool = False) -> CloudLab:
    config = MANAGER_CONFIG.format(
        manager_url=MANAGER_URL, region=REGION, ami=ami, adopt=str(adopt).lower()
    )

    def token_of(instance_id: str) -> str | None:
        if not instance_id:
            return None
        return token_in_user_data(user_data_of(aws, instance_id))

    return CloudLab(tmp_path, config, token_of)


def live(aws: Any, **filters: str) -> list[dict[str, Any]]:
    return [i for i in instances(aws, **filters) if i["State"]["Name"] != "terminated"]


def test_a_pool_is_launched_reported_and_its_vanished_instance_forgotten(
    aws: Any, ami: str, tmp_path: Path
) -> None:
    async def scenario() -> None:
        lab = ec2_lab(aws, ami, tmp_path)
        await lab.run(4, 20)
        [server] = lab.servers(ServerState.ACTIVE)
        [raw] = live(aws, **{"dnslb:server-id": server})
        runtime = lab.manager.fleet.servers[server]
        assert runtime.record.provider_ref == raw["InstanceId"]
        assert runtime.record.address == raw["PublicIpAddress"]
        assert lab.events("unknown_instance") == []  # reconciles ran while it booted
        # Someone terminates it behind the manager's back: the next reconcile notices.
        aws.terminate_instances(InstanceIds=[raw["InstanceId"]])
        await lab.run(6, 20)
        assert any(
            e.startswith(f"{server}:") and "its instance no longer exists" in e
            for e in lab.events("state")
        )
        [replacement] = lab.servers(ServerState.ACTIVE)  # min_servers: 1
        assert replacement != server
        await lab.manager.close()

    asyncio.run(scenario())


def test_a_crash_between_launch_and_record_is_recovered_after_restart(
    aws: Any, ami: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        lab = ec2_lab(aws, ami, tmp_path)
        provider = lab.manager.lifecycles["www"].provider
        launch = provider.launch

        async def launch_then_die(req: LaunchRequest) -> Instance:
            await launch(req)  # EC2 starts the instance...
            raise asyncio.CancelledError  # ...and the manager dies before it records it

        monkeypatch.setattr(provider, "launch", launch_then_die)
        await lab.run(2, 0)  # a reconcile, then the launch
        [server] = lab.servers(ServerState.LAUNCHING)
        assert lab.manager.fleet.servers[server].record.provider_ref is None
        assert len(live(aws, **{"dnslb:server-id": server})) == 1

        await lab.restart()
        await lab.run(4, 20)
        [raw] = live(aws, **{"dnslb:pool": "www"})  # adopted, not launched again
        runtime = lab.manager.fleet.servers[server]
        assert runtime.state is ServerState.ACTIVE  # its agent's token was the recorded one
        assert runtime.record.provider_ref == raw["InstanceId"]
        await lab.manager.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("adopt", [False, True], ids=["terminate", "adopt"])
def test_an_instance_the_state_does_not_know_is_terminated_or_adopted(
    aws: Any, ami: str, tmp_path: Path, adopt: bool
) -> None:
    async def scenario() -> None:
        # A manager that lost its state database left an instance of this pool running.
        stray_launcher = make_provider(
            f"{{type: ec2, region: {REGION}, ami: {ami}, instance_types: [t3.micro]}}", tmp_path
        )
        stray = await stray_launcher.launch(request("www-lost"))
        lab = ec2_lab(aws, ami, tmp_path / "new", adopt=adopt)
        await lab.run(4, 20)
        state = aws.describe_instances(InstanceIds=[stray.ref])["Reservations"][0]
        state_name = state["Instances"][0]["State"]["Name"]
        if adopt:
            assert state_name == "running"
            assert lab.manager.fleet.servers["www-lost"].state is ServerState.ACTIVE
            assert lab.events("unknown_instance") == []
        else:
            assert state_name in ("shutting-down", "terminated")
            assert "www-lost" not in lab.manager.fleet.servers
            assert any(f"terminating {stray.ref}" in e for e in lab.events("unknown_instance"))
        # Adopted, the lost server is the pool's one (min_servers): nothing more is launched
        # (the autoscaler used to launch before the first reconcile had adopted it).
        assert len(lab.servers(ServerState.ACTIVE)) == 1
        await lab.manager.close()

    (tmp_path / "new").mkdir()
    asyncio.run(scenario())


# -- errors moto cannot make: the Stubber -----------------------------------------------------

NO_INSTANCES: dict[str, Any] = {"Reservations": []}


def stubbed(provider: Ec2Provider) -> Stubber:
    stubber = Stubber(provider.client())
    stubber.activate()
    return stubber


def launched_response(instance_id: str, instance_type: str, subnet: str) -> dict[str, Any]:
    return {
        "Instances": [
            {
                "InstanceId": instance_id,
                "InstanceType": instance_type,
                "SubnetId": subnet,
                "State": {"Code": 0, "Name": "pending"},
                "Tags": [{"Key": "dnslb:server-id", "Value": "www-0001"}],
            }
        ]
    }


def run_params(instance_type: str, subnet: str, **more: Any) -> dict[str, Any]:
    return {
        "MinCount": 1,
        "MaxCount": 1,
        "ImageId": "ami-1",
        "InstanceType": instance_type,
        "SubnetId": subnet,
        "ClientToken": client_token("www-0001", instance_type, subnet),
        "UserData": ANY,
        "TagSpecifications": ANY,
        "DryRun": False,
        **more,
    }


FALLBACK_YAML = (
    "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [c5.large, m5.large],"
    " subnets: [subnet-a, subnet-b]}"
)


def test_no_capacity_moves_on_to_the_next_subnet_then_instance_type(tmp_path: Path) -> None:
    provider = make_provider(FALLBACK_YAML, tmp_path)
    stubber = stubbed(provider)
    stubber.add_response("describe_instances", NO_INSTANCES)
    stubber.add_client_error(
        "run_instances",
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient c5.large capacity in eu-west-1a.",
        expected_params=run_params("c5.large", "subnet-a"),
    )
    stubber.add_client_error(
        "run_instances",
        "Unsupported",
        "Your requested instance type (c5.large) is not supported in eu-west-1b.",
        expected_params=run_params("c5.large", "subnet-b"),
    )
    stubber.add_response(
        "run_instances",
        launched_response("i-0aaaaaaaaaaaaaaa1", "m5.large", "subnet-a"),
        expected_params=run_params("m5.large", "subnet-a"),
    )
    instance = asyncio.run(provider.launch(request()))
    assert instance.ref == "i-0aaaaaaaaaaaaaaa1"
    assert instance.status is InstanceStatus.PENDING
    stubber.assert_no_pending_responses()


def test_when_every_subnet_and_type_fails_the_error_names_each(tmp_path: Path) -> None:
    provider = make_provider(FALLBACK_YAML, tmp_path)
    stubber = stubbed(provider)
    stubber.add_response("describe_instances", NO_INSTANCES)
    for instance_type in ("c5.large", "m5.large"):
        for subnet in ("subnet-a", "subnet-b"):
            stubber.add_client_error(
                "run_instances",
                "InsufficientInstanceCapacity",
                f"no {instance_type} capacity",
                expected_params=run_params(instance_type, subnet),
            )
    with pytest.raises(ProviderError) as caught:
        asyncio.run(provider.launch(request()))
    message = str(caught.value)
    assert message.startswith("EC2 could not launch www-0001 on any instance type and subnet")
    for pair in ("c5.large, subnet-a", "c5.large, subnet-b", "m5.large, subnet-b"):
        assert f"{pair}: InsufficientInstanceCapacity" in message
    assert caught.value.retryable
    stubber.assert_no_pending_responses()


def test_an_error_no_other_subnet_can_fix_fails_the_launch_at_once(tmp_path: Path) -> None:
    provider = make_provider(FALLBACK_YAML, tmp_path)
    stubber = stubbed(provider)
    stubber.add_response("describe_instances", NO_INSTANCES)
    stubber.add_client_error(
        "run_instances",
        "UnauthorizedOperation",
        "You are not authorized to perform this operation.",
        http_status_code=403,
    )
    with pytest.raises(ProviderError, match="UnauthorizedOperation: You are not authorized"):
        asyncio.run(provider.launch(request()))
    stubber.assert_no_pending_responses()  # and no other pair was tried (the stub would fail)


def test_throttling_is_retried_with_growing_jittered_pauses_and_the_same_client_token(
    tmp_path: Path,
) -> None:
    clock = RecordingClock()
    provider = make_provider(
        "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [c5.large],"
        " subnets: [subnet-a]}",
        tmp_path,
        clock=clock,
    )
    stubber = stubbed(provider)
    stubber.add_client_error("describe_instances", "Throttling", "Rate exceeded", 400)
    stubber.add_response("describe_instances", NO_INSTANCES)
    for _ in range(3):
        stubber.add_client_error(
            "run_instances",
            "RequestLimitExceeded",
            "Request limit exceeded.",
            http_status_code=503,
            expected_params=run_params("c5.large", "subnet-a"),
        )
    stubber.add_response(
        "run_instances",
        launched_response("i-0bbbbbbbbbbbbbbb2", "c5.large", "subnet-a"),
        expected_params=run_params("c5.large", "subnet-a"),
    )
    instance = asyncio.run(provider.launch(request()))
    assert instance.ref == "i-0bbbbbbbbbbbbbbb2"
    stubber.assert_no_pending_responses()
    # One pause for the describe, three for the launch; attempt n waits at most base * 2**n.
    assert len(clock.slept) == 4
    for attempt, pause in zip([0, 0, 1, 2], clock.slept, strict=True):
        assert 0.0 <= pause <= RETRY_BASE * 2**attempt


class HighestJitter:
    """Stands in for the provider's random source: always the longest pause allowed."""

    def uniform(self, low: float, high: float) -> float:
        return high


def test_backoff_doubles_up_to_its_cap_then_gives_up(tmp_path: Path) -> None:
    clock = RecordingClock()
    provider = make_provider(
        "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [c5.large], retries: 8}",
        tmp_path,
        clock=clock,
    )
    provider._random = HighestJitter()  # type: ignore[assignment]
    calls: list[int] = []

    def throttled(client: Any) -> None:
        calls.append(1)
        raise ClientError(
            {"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, "DescribeInstances"
        )

    with pytest.raises(ProviderError, match="still failing after 9 attempts") as caught:
        asyncio.run(provider._call("DescribeInstances", throttled))
    assert "Throttling: Rate exceeded" in str(caught.value)
    assert caught.value.retryable
    assert len(calls) == 9
    assert RETRY_CAP == 20.0
    assert clock.slept == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 20.0, 20.0]


def test_throttling_gives_up_after_the_configured_retries(tmp_path: Path) -> None:
    clock = RecordingClock()
    provider = make_provider(
        "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [c5.large], retries: 2}",
        tmp_path,
        clock=clock,
    )
    stubber = stubbed(provider)
    for _ in range(3):
        stubber.add_client_error("describe_instances", "RequestLimitExceeded", "slow down", 503)
    with pytest.raises(ProviderError, match="still failing after 3 attempts") as caught:
        asyncio.run(provider.launch(request()))
    assert caught.value.retryable
    assert len(clock.slept) == 2
    stubber.assert_no_pending_responses()


def test_lost_connections_are_retried(tmp_path: Path) -> None:
    clock = RecordingClock()
    provider = make_provider(
        "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [c5.large]}",
        tmp_path,
        clock=clock,
    )
    calls: list[int] = []

    def flaky(client: Any) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise EndpointConnectionError(endpoint_url="https://ec2.eu-west-1.amazonaws.com/")
        return "answered"

    assert asyncio.run(provider._call("DescribeInstances", flaky)) == "answered"
    assert len(calls) == 3
    assert len(clock.slept) == 2


def test_dry_run_checks_launches_and_terminations_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    provider = make_provider(
        "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [c5.large],"
        " subnets: [subnet-a], dry_run: true}",
        tmp_path,
    )
    stubber = stubbed(provider)
    stubber.add_response("describe_instances", NO_INSTANCES)
    dry_run_error = "Request would have succeeded, but DryRun flag is set."
    stubber.add_client_error(
        "run_instances",
        "DryRunOperation",
        dry_run_error,
        http_status_code=412,
        expected_params=run_params("c5.large", "subnet-a", DryRun=True),
    )
    stubber.add_client_error(
        "terminate_instances",
        "DryRunOperation",
        dry_run_error,
        http_status_code=412,
        expected_params={"InstanceIds": ["i-0ccccccccccccccc3"], "DryRun": True},
    )
    caplog.set_level(logging.INFO, logger="dnslb.manager.providers.ec2")
    with pytest.raises(ProviderError, match=r"dry run: RunInstances for www-0001 on c5\.large"):
        asyncio.run(provider.launch(request(token="never-logged")))
    with pytest.raises(ProviderError, match="dry run: TerminateInstances for i-0ccccccccccccccc3"):
        asyncio.run(provider.terminate("i-0ccccccccccccccc3"))
    stubber.assert_no_pending_responses()
    assert "dry run: would launch www-0001 for pool www on c5.large, subnet-a" in caplog.text
    assert "dry run: would terminate i-0ccccccccccccccc3" in caplog.text
    assert "never-logged" not in caplog.text


def test_a_new_instance_not_yet_visible_is_pending_then_gone(tmp_path: Path) -> None:
    clock = RecordingClock()
    provider = make_provider(
        "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [c5.large],"
        " subnets: [subnet-a]}",
        tmp_path,
        clock=clock,
    )
    stubber = stubbed(provider)
    stubber.add_response("describe_instances", NO_INSTANCES)
    stubber.add_response(
        "run_instances", launched_response("i-0ddddddddddddddd4", "c5.large", "subnet-a")
    )
    not_found = ("InvalidInstanceID.NotFound", "The instance ID does not exist")
    stubber.add_client_error("describe_instances", *not_found)
    stubber.add_client_error("describe_instances", *not_found)

    async def scenario() -> tuple[InstanceStatus, InstanceStatus]:
        launched = await provider.launch(request())
        early = await provider.describe(launched.ref)  # eventual consistency
        clock.advance(VISIBILITY_GRACE + 1)
        late = await provider.describe(launched.ref)
        return early.status, late.status

    assert asyncio.run(scenario()) == (InstanceStatus.PENDING, InstanceStatus.GONE)
    stubber.assert_no_pending_responses()


def test_missing_credentials_and_profiles_are_clear_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    base = "{type: ec2, region: eu-west-1, ami: ami-1, instance_types: [c5.large]"
    no_keys = make_provider(base + "}", tmp_path)
    with pytest.raises(ProviderError, match="EC2 DescribeInstances: Unable to locate credentials"):
        asyncio.run(no_keys.list_owned())
    no_profile = make_provider(base + ", profile: nonesuch}", tmp_path)
    with pytest.raises(ProviderError, match="nonesuch"):
        asyncio.run(no_profile.list_owned())


def test_a_manager_without_the_ec2_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The module imports without boto3 (the manager loads every provider to know its config);
    # a pool that uses it is refused at config time with the extra to install.
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "boto3" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'dnslb\[ec2\]'"):
        parse_config("{type: ec2, region: eu-west-1, ami: ami-1}", Ec2ProviderConfig)
