"""The ``ec2`` provider: a pool's servers as Amazon EC2 instances (boto3).

Instances start from a launch template, or from an AMI with instance types, subnets, security
groups and a key pair. Each carries tags that mark it as the pool's (``dnslb:pool``,
``dnslb:managed-by``), name the server (``dnslb:server-id``) and hold the SHA-256 of its agent
token (``dnslb:token-sha256``: never the token). The token and the manager's URL reach the
instance in its user data (:mod:`manager.providers.userdata`).

- **Idempotent launches.** ``RunInstances`` gets a ``ClientToken`` derived from the server id (and
  the instance type and subnet tried), so a call retried after a timeout never starts a second
  instance; before launching, an instance already tagged with the server id is returned instead.
- **Fallbacks.** ``instance_types`` and ``subnets`` are tried in order, every subnet for the first
  type, then every subnet for the next; capacity, limit and subnet errors move on to the next
  pair, and when every pair failed the launch fails with each reason.
- **Throttling** (``RequestLimitExceeded``...), AWS's internal errors and lost connections are
  retried with exponential backoff and full jitter, ``retries`` times at most; botocore's own
  retries are off, so this is the one policy.
- **Dry run** (``dry_run: true``): launches and terminations go to EC2 with ``DryRun`` set, which
  checks permissions and parameters and changes nothing; reads are real. Each would-be call is
  logged, and fails with a message saying it would have succeeded.
- **Credentials** come only from boto3's standard chain (environment, ``profile``, instance
  role); nothing secret is in the configuration.

Every boto3 call runs in a worker thread (``asyncio.to_thread``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from dnslb.config import setting
from dnslb.tokens import token_hash
from manager.providers.base import (
    Instance,
    InstanceStatus,
    LaunchRequest,
    Provider,
    ProviderConfig,
    ProviderContext,
    ProviderError,
    register,
)
from manager.providers.userdata import render_user_data, template_problems

if TYPE_CHECKING:
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )
else:
    try:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            ReadTimeoutError,
        )
    except ModuleNotFoundError:  # the ec2 extra is not installed: a pool of ours says so (below)

        class _BotocoreAbsent(Exception):
            """Never raised: stands in for botocore's errors in except clauses."""

        BotoCoreError = ClientError = ConnectionClosedError = _BotocoreAbsent
        ConnectTimeoutError = EndpointConnectionError = ReadTimeoutError = _BotocoreAbsent

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.type_defs import (
        FilterTypeDef,
        InstanceTypeDef,
        ReservationResponseTypeDef,
    )

    RunInstancesResult = ReservationResponseTypeDef

log = logging.getLogger("dnslb.manager.providers.ec2")

_T = TypeVar("_T")

TAG_POOL = "dnslb:pool"
TAG_SERVER = "dnslb:server-id"
TAG_MANAGED_BY = "dnslb:managed-by"
TAG_TOKEN_HASH = "dnslb:token-sha256"  # noqa: S105 - a tag name; its value is a hash

USER_DATA_LIMIT = 16 * 1024
"""EC2 takes at most 16 KiB of user data (before base64)."""

RETRY_BASE = 0.5
RETRY_CAP = 20.0
"""Backoff: attempt n waits a random time up to min(RETRY_CAP, RETRY_BASE * 2**n) seconds."""

VISIBILITY_GRACE = 120.0
"""Seconds after a launch during which "no such instance" means "not visible yet": EC2's reads
are eventually consistent, and a new instance may be unknown to DescribeInstances for a while."""

RETRIED_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
    }
)
"""Error codes worth the same call again after a pause (launches are safe: ClientToken)."""

FALLBACK_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "Unsupported",
        "InsufficientFreeAddressesInSubnet",
        "InvalidSubnetID.NotFound",
        "InvalidSubnet",
    }
)
"""Error codes after which the next instance type or subnet may well succeed."""

_CONNECTION_ERRORS = (
    EndpointConnectionError,
    ConnectTimeoutError,
    ReadTimeoutError,
    ConnectionClosedError,
)

_LISTED_STATES = ["pending", "running", "stopping", "stopped"]


@dataclass(frozen=True, slots=True)
class LaunchTemplateRef:
    """An EC2 launch template, by id or by name, and its version."""

    id: str | None = setting(None, help="launch template id (lt-...)")
    name: str | None = setting(None, help="launch template name")
    version: str = setting("$Default", help="version: a number, $Default or $Latest")

    def config_problems(self) -> Iterator[str]:
        if (self.id is None) == (self.name is None):
            yield "give either id or name"


@dataclass(frozen=True, slots=True)
class Ec2ProviderConfig(ProviderConfig):
    """Servers as EC2 instances (boto3; credentials from its standard chain)."""

    type: Literal["ec2"]
    region: str = setting(help="AWS region, e.g. eu-west-1")
    profile: str | None = setting(
        None, help="named profile from ~/.aws/config (default: boto3's chain: env, instance role)"
    )
    endpoint_url: str | None = setting(
        None, help="EC2 endpoint (a VPC endpoint, a test server); default: the region's"
    )
    launch_template: LaunchTemplateRef | None = setting(
        None, help="launch from this template; the settings below override its values"
    )
    ami: str | None = setting(None, help="image id (ami-...); needed without a launch template")
    instance_types: tuple[str, ...] = setting(
        default_factory=tuple,
        help="instance types, tried in order when one has no capacity (default: the template's)",
    )
    subnets: tuple[str, ...] = setting(
        default_factory=tuple,
        help="subnet ids, tried in order for each type (default: the template's or default VPC)",
    )
    security_groups: tuple[str, ...] = setting(default_factory=tuple, help="security group ids")
    key_name: str | None = setting(None, help="key pair name")
    instance_profile: str | None = setting(
        None, help="IAM instance profile, name or ARN (needs iam:PassRole)"
    )
    user_data: str | None = setting(
        None,
        help="user-data template with {{server_id}}, {{pool}}, {{manager_url}}, {{manager_urls}}, "
        "{{agent_token}} (default: the script in docs/cloud.md)",
    )
    address: Literal["public", "private"] = setting(
        "public", help="which address is answered in DNS"
    )
    check_address: Literal["public", "private"] | None = setting(
        None, help="which address health checks connect to (default: the answered one)"
    )
    tags: Mapping[str, str] = setting(
        default_factory=lambda: MappingProxyType({}),
        help="more tags for instances and volumes (dnslb:* are set by dnslb)",
    )
    managed_by: str = setting(
        "dnslb",
        help="value of the dnslb:managed-by tag; give each deployment sharing an account its own",
    )
    dry_run: bool = setting(
        False, help="launch and terminate with EC2's DryRun flag: check and log, change nothing"
    )
    retries: int = setting(
        5, help="retries of a throttled or failed call (exponential backoff, jitter)", min=0, max=10
    )

    def config_problems(self) -> Iterator[str]:
        if importlib.util.find_spec("boto3") is None:
            yield "the ec2 provider needs boto3: pip install 'dnslb[ec2]'"
        if self.launch_template is None:
            if self.ami is None:
                yield "ami: needed without a launch_template"
            if not self.instance_types:
                yield "instance_types: at least one is needed without a launch_template"
        for key in ("instance_types", "subnets", "security_groups"):
            values: tuple[str, ...] = getattr(self, key)
            if len(set(values)) != len(values):
                yield f"{key}: listed twice: {', '.join(sorted(_twice(values)))}"
        for key in self.tags:
            if key.startswith(("dnslb:", "aws:")):
                yield f"tags: {key!r}: dnslb: and aws: tags are not yours to set"
        if len(self.tags) > 44:  # EC2 takes 50 tags per resource; dnslb sets 5 and Name
            yield f"tags: at most 44, not {len(self.tags)}"
        if self.user_data is not None:
            yield from template_problems(self.user_data)


def _twice(values: tuple[str, ...]) -> set[str]:
    return {value for value in values if values.count(value) > 1}


def client_token(server_id: str, instance_type: str | None, subnet: str | None) -> str:
    """RunInstances' idempotency token for one server and one (type, subnet) try (<= 64 chars).

    The same server tried on the same pair always sends the same token, so EC2 answers a retry
    with the instance the first call started; another pair is another request, with its own.
    """
    key = f"{server_id}|{instance_type or ''}|{subnet or ''}"
    return "dnslb-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:48]


@register(Ec2ProviderConfig)
class Ec2Provider(Provider):
    config: Ec2ProviderConfig

    def __init__(self, config: Ec2ProviderConfig, context: ProviderContext) -> None:
        super().__init__(config, context)
        self._client: EC2Client | None = None
        self._client_lock = threading.Lock()
        self._launched: dict[str, float] = {}  # instance id -> when (monotonic) it was launched
        self._random = random.Random()

    # -- the client ---------------------------------------------------------------------------

    def client(self) -> EC2Client:
        """The boto3 EC2 client, made on first use (blocking: call it off the event loop)."""
        with self._client_lock:
            if self._client is None:
                # boto3 takes a third of a second to import: only pools that use EC2 pay for it.
                import boto3  # noqa: PLC0415
                from botocore.config import Config  # noqa: PLC0415

                session = boto3.session.Session(
                    profile_name=self.config.profile, region_name=self.config.region
                )
                self._client = session.client(
                    "ec2",
                    endpoint_url=self.config.endpoint_url,
                    config=Config(retries={"total_max_attempts": 1}, user_agent_extra="dnslb"),
                )
            return self._client

    async def _call(self, what: str, call: Callable[[EC2Client], _T]) -> _T:
        """``call(client)`` in a worker thread, retried with backoff while AWS throttles.

        Errors AWS answered with (other than throttling) are raised as ``ClientError`` for the
        caller to read their code; everything else becomes a :class:`ProviderError`.
        """
        attempt = 0
        while True:
            try:
                return await asyncio.to_thread(lambda: call(self.client()))
            except ClientError as exc:
                code = _code(exc)
                if code not in RETRIED_CODES:
                    raise
                problem = f"{code}: {_message(exc)}"
            except _CONNECTION_ERRORS as exc:
                problem = str(exc)
            except BotoCoreError as exc:  # no credentials, unknown profile, bad parameters...
                raise ProviderError(f"EC2 {what}: {exc}") from None
            if attempt >= self.config.retries:
                raise ProviderError(
                    f"EC2 {what}: still failing after {attempt + 1} attempts ({problem})",
                    retryable=True,
                )
            delay = self._random.uniform(0.0, min(RETRY_CAP, RETRY_BASE * 2**attempt))
            attempt += 1
            log.info("EC2 %s: %s; try %d in %.1f s", what, problem, attempt + 1, delay)
            await self.context.clock.sleep(delay)

    # -- the interface ------------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> Instance:
        existing = await self._find_server(request.server_id)
        if existing is not None:
            return existing
        user_data = render_user_data(self.config.user_data, request, limit=USER_DATA_LIMIT)
        failures: list[str] = []
        for instance_type, subnet in self._candidates():
            where = (
                ", ".join(part for part in (instance_type, subnet) if part)
                or "the launch template's type and subnet"
            )
            params = self._run_params(request, user_data, instance_type, subnet)
            try:
                response = await self._call("RunInstances", _run_instances(params))
            except ClientError as exc:
                code = _code(exc)
                if code == "DryRunOperation":
                    log.info(
                        "dry run: would launch %s for pool %s on %s (tags %s)",
                        request.server_id,
                        request.pool,
                        where,
                        {tag["Key"]: tag["Value"] for tag in self._tags(request)},
                    )
                    raise ProviderError(
                        f"dry run: RunInstances for {request.server_id} on {where} would have "
                        "succeeded; nothing launched"
                    ) from None
                if code in FALLBACK_CODES:
                    failures.append(f"{where}: {code}: {_message(exc)}")
                    continue
                raise ProviderError(
                    f"EC2 RunInstances for {request.server_id} on {where} failed: "
                    f"{code}: {_message(exc)}"
                ) from None
            raw = response["Instances"][0]
            now = self.context.clock.monotonic()
            self._launched = {
                ref: at for ref, at in self._launched.items() if now - at < VISIBILITY_GRACE
            }
            self._launched[raw["InstanceId"]] = now
            return self._instance(raw)
        raise ProviderError(
            f"EC2 could not launch {request.server_id} on any instance type and subnet: "
            + "; ".join(failures),
            retryable=True,
        )

    async def describe(self, ref: str) -> Instance:
        try:
            response = await self._call(
                "DescribeInstances", lambda client: client.describe_instances(InstanceIds=[ref])
            )
        except ClientError as exc:
            code = _code(exc)
            if code not in ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"):
                raise ProviderError(
                    f"EC2 DescribeInstances {ref}: {code}: {_message(exc)}"
                ) from None
            launched = self._launched.get(ref)
            if launched is not None and (
                self.context.clock.monotonic() - launched < VISIBILITY_GRACE
            ):
                return Instance(ref=ref, status=InstanceStatus.PENDING, detail="not visible yet")
            return Instance(ref=ref, status=InstanceStatus.GONE, detail=code)
        for reservation in response["Reservations"]:
            for raw in reservation["Instances"]:
                return self._instance(raw)
        return Instance(ref=ref, status=InstanceStatus.GONE, detail="not listed")

    async def terminate(self, ref: str) -> None:
        try:
            await self._call(
                "TerminateInstances",
                lambda client: client.terminate_instances(
                    InstanceIds=[ref], DryRun=self.config.dry_run
                ),
            )
        except ClientError as exc:
            code = _code(exc)
            if code == "DryRunOperation":
                log.info("dry run: would terminate %s (pool %s)", ref, self.context.pool)
                raise ProviderError(
                    f"dry run: TerminateInstances for {ref} would have succeeded; "
                    "nothing terminated"
                ) from None
            if code != "InvalidInstanceID.NotFound":
                raise ProviderError(
                    f"EC2 TerminateInstances {ref}: {code}: {_message(exc)}"
                ) from None
        self._launched.pop(ref, None)

    async def list_owned(self) -> list[Instance]:
        return await self._list(self._owner_filters())

    async def close(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    # -- helpers ------------------------------------------------------------------------------

    def _owner_filters(self) -> list[FilterTypeDef]:
        return [
            {"Name": f"tag:{TAG_POOL}", "Values": [self.context.pool]},
            {"Name": f"tag:{TAG_MANAGED_BY}", "Values": [self.config.managed_by]},
            {"Name": "instance-state-name", "Values": _LISTED_STATES},
        ]

    async def _list(self, filters: list[FilterTypeDef]) -> list[Instance]:
        def every_page(client: EC2Client) -> list[InstanceTypeDef]:
            found: list[InstanceTypeDef] = []
            for page in client.get_paginator("describe_instances").paginate(Filters=filters):
                for reservation in page["Reservations"]:
                    found.extend(reservation["Instances"])
            return found

        try:
            raws = await self._call("DescribeInstances", every_page)
        except ClientError as exc:
            raise ProviderError(
                f"EC2 DescribeInstances (pool {self.context.pool}): {_code(exc)}: {_message(exc)}"
            ) from None
        return [self._instance(raw) for raw in raws]

    async def _find_server(self, server_id: str) -> Instance | None:
        """The instance already launched for ``server_id``, if there is one."""
        mine: FilterTypeDef = {"Name": f"tag:{TAG_SERVER}", "Values": [server_id]}
        filters = [*self._owner_filters(), mine]
        found = await self._list(filters)
        return found[0] if found else None

    def _candidates(self) -> list[tuple[str | None, str | None]]:
        types: tuple[str | None, ...] = self.config.instance_types or (None,)
        subnets: tuple[str | None, ...] = self.config.subnets or (None,)
        return [(instance_type, subnet) for instance_type in types for subnet in subnets]

    def _tags(self, request: LaunchRequest) -> list[dict[str, str]]:
        tags = {
            "Name": request.server_id,
            **self.config.tags,
            TAG_POOL: request.pool,
            TAG_SERVER: request.server_id,
            TAG_MANAGED_BY: self.config.managed_by,
            TAG_TOKEN_HASH: token_hash(request.agent_token),
        }
        return [{"Key": key, "Value": value} for key, value in tags.items()]

    def _run_params(
        self,
        request: LaunchRequest,
        user_data: str,
        instance_type: str | None,
        subnet: str | None,
    ) -> dict[str, Any]:
        config = self.config
        tags = self._tags(request)
        params: dict[str, Any] = {
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": client_token(request.server_id, instance_type, subnet),
            "UserData": user_data,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
            "DryRun": config.dry_run,
        }
        template = config.launch_template
        if template is not None:
            key = "LaunchTemplateId" if template.id else "LaunchTemplateName"
            params["LaunchTemplate"] = {
                key: template.id or template.name,
                "Version": template.version,
            }
        optional: dict[str, Any] = {
            "ImageId": config.ami,
            "InstanceType": instance_type,
            "SubnetId": subnet,
            "SecurityGroupIds": list(config.security_groups) or None,
            "KeyName": config.key_name,
        }
        params.update({key: value for key, value in optional.items() if value is not None})
        if config.instance_profile:
            kind = "Arn" if config.instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {kind: config.instance_profile}
        return params

    def _instance(self, raw: InstanceTypeDef) -> Instance:
        tags = {tag.get("Key", ""): tag.get("Value", "") for tag in raw.get("Tags", [])}
        addresses = {
            "public": raw.get("PublicIpAddress"),
            "private": raw.get("PrivateIpAddress"),
        }
        address = addresses[self.config.address]
        check = addresses[self.config.check_address] if self.config.check_address else None
        state = raw.get("State", {}).get("Name", "unknown")
        reason = raw.get("StateReason", {}).get("Message", "")
        detail = f"{state}: {reason}" if reason else state
        if state == "running":
            if address:
                status = InstanceStatus.RUNNING
            else:
                status = InstanceStatus.PENDING
                detail = f"running without a {self.config.address} address"
        elif state == "pending":
            status = InstanceStatus.PENDING
        elif state in ("stopping", "stopped"):
            status = InstanceStatus.STOPPING
        else:  # shutting-down, terminated
            status = InstanceStatus.GONE
        return Instance(
            ref=raw["InstanceId"],
            status=status,
            server_id=tags.get(TAG_SERVER),
            pool=tags.get(TAG_POOL),
            address=address,
            check_address=check,
            token_hash=tags.get(TAG_TOKEN_HASH),
            detail=detail,
        )


def _run_instances(params: dict[str, Any]) -> Callable[[EC2Client], RunInstancesResult]:
    return lambda client: client.run_instances(**params)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "Unknown"))


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", "")).strip() or str(exc)
