"""The ``openstack`` provider: a pool's servers as Nova servers (openstacksdk).

The connection is made as openstacksdk users expect: a ``cloud`` entry of ``clouds.yaml``
(``./clouds.yaml``, ``~/.config/openstack/clouds.yaml``, ``/etc/openstack/clouds.yaml`` or
``OS_CLIENT_CONFIG_FILE``), or, without one, ``OS_CLOUD`` or the ``OS_*`` environment variables.
Nothing secret is in dnslb's configuration.

Servers are created from an image, a flavor and networks (names or ids, looked up once), with
metadata marking the pool and owner (``dnslb:pool``, ``dnslb:managed-by``), the server id
(``dnslb:server-id``) and the SHA-256 of the agent token (``dnslb:token-sha256``: never the
token); the token and manager URL reach the server in its user data
(:mod:`manager.providers.userdata`). Nova has no idempotency token: a launch first looks for a
server already carrying its server id, and a duplicate left by a create retried behind our back
is found by reconcile and terminated (two servers cannot share a server id in the state).

Waiting for ``ACTIVE`` is the lifecycle's job: :meth:`OpenStackProvider.describe` answers
``PENDING`` until the server is active with an address on ``address_network``, and raises
:class:`ProviderError` for a server in ``ERROR`` (Nova's fault, such as "No valid host was
found", is the message), so the launch becomes a ``launch_failed`` event and the server is
deleted. Quota refusals become the same kind of event.

Every SDK call runs in a worker thread, one at a time per provider (a Connection is not meant to be
shared between threads at once).
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
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
    from openstack.compute.v2.server import Server
    from openstack.connection import Connection

_T = TypeVar("_T")

META_POOL = "dnslb:pool"
META_SERVER = "dnslb:server-id"
META_MANAGED_BY = "dnslb:managed-by"
META_TOKEN_HASH = "dnslb:token-sha256"  # noqa: S105 - a key name; its value is a hash

USER_DATA_LIMIT = 49_152
"""Nova takes 65,535 bytes of base64, which holds 49,152 bytes of user data."""

METADATA_LIMIT = 128
"""Nova's default ``metadata_items`` quota; dnslb uses four of them."""

_STOPPED = frozenset(
    {"SHUTOFF", "STOPPED", "PAUSED", "SUSPENDED", "SHELVED", "SHELVED_OFFLOADED", "RESCUE"}
)
_GONE = frozenset({"DELETED", "SOFT_DELETED"})


@dataclass(frozen=True, slots=True)
class OpenStackProviderConfig(ProviderConfig):
    """Servers as OpenStack Nova servers (openstacksdk; credentials from clouds.yaml or OS_*)."""

    type: Literal["openstack"]
    image: str = setting(help="image name or id")
    flavor: str = setting(help="flavor name or id")
    networks: tuple[str, ...] = setting(help="networks to attach, names or ids")
    cloud: str | None = setting(
        None, help="cloud name in clouds.yaml (default: OS_CLOUD, or the OS_* variables)"
    )
    region: str | None = setting(None, help="region (default: the cloud's)")
    address_network: str | None = setting(
        None,
        help="network whose address is answered, by the name Nova shows in the server's "
        "addresses (default: the first of networks)",
    )
    address_type: Literal["fixed", "floating"] = setting(
        "fixed", help="answer the fixed address or a floating one (attached by someone else)"
    )
    ip_version: Literal[4, 6] = setting(4, help="answer the IPv4 or the IPv6 address")
    key_name: str | None = setting(None, help="key pair name")
    security_groups: tuple[str, ...] = setting(
        default_factory=tuple, help="security group names (default: the project's default)"
    )
    availability_zone: str | None = setting(None, help="availability zone (default: Nova's)")
    user_data: str | None = setting(
        None,
        help="user-data template with {{server_id}}, {{pool}}, {{manager_url}}, {{manager_urls}}, "
        "{{agent_token}} (default: the script in docs/cloud.md)",
    )
    metadata: Mapping[str, str] = setting(
        default_factory=lambda: MappingProxyType({}),
        help="more server metadata (dnslb:* keys are set by dnslb)",
    )
    managed_by: str = setting(
        "dnslb",
        help="value of the dnslb:managed-by metadata; give each deployment sharing a project "
        "its own",
    )

    def config_problems(self) -> Iterator[str]:
        if importlib.util.find_spec("openstack") is None:
            yield "the openstack provider needs openstacksdk: pip install 'dnslb[openstack]'"
        if not self.networks:
            yield "networks: at least one network is needed"
        for key in self.metadata:
            if key.startswith("dnslb:"):
                yield f"metadata: {key!r}: dnslb: keys are not yours to set"
        if len(self.metadata) > METADATA_LIMIT - 4:
            yield f"metadata: at most {METADATA_LIMIT - 4} items, not {len(self.metadata)}"
        if self.user_data is not None:
            yield from template_problems(self.user_data)

    @property
    def answered_network(self) -> str:
        return self.address_network or self.networks[0]


class _NotFound(Exception):
    """The SDK said 404 (raised in the worker thread, caught on the loop)."""


@dataclass(frozen=True, slots=True)
class _Resolved:
    image_id: str
    flavor_id: str
    network_ids: tuple[str, ...]


@register(OpenStackProviderConfig)
class OpenStackProvider(Provider):
    config: OpenStackProviderConfig

    def __init__(self, config: OpenStackProviderConfig, context: ProviderContext) -> None:
        super().__init__(config, context)
        self._connection: Connection | None = None
        self._lock = threading.Lock()
        self._resolved: _Resolved | None = None

    # -- the connection -----------------------------------------------------------------------

    def connection(self) -> Connection:
        """The SDK connection, made on first use (blocking: call it under ``self._lock``)."""
        if self._connection is None:
            # openstacksdk takes over half a second to import: only OpenStack pools pay for it.
            import openstack  # noqa: PLC0415

            options: dict[str, Any] = {"app_name": "dnslb"}
            if self.config.region:
                options["region_name"] = self.config.region
            self._connection = openstack.connect(cloud=self.config.cloud, **options)
        return self._connection

    async def _sdk(self, what: str, call: Callable[[Connection], _T]) -> _T:
        """``call(connection)`` in a worker thread; SDK errors become :class:`ProviderError`.

        A 404 is raised as :class:`_NotFound` for the caller to decide what it means.
        """
        return await asyncio.to_thread(self._blocking, what, call)

    def _blocking(self, what: str, call: Callable[[Connection], _T]) -> _T:
        import keystoneauth1.exceptions  # noqa: PLC0415 - see connection()
        import openstack.exceptions  # noqa: PLC0415

        with self._lock:
            try:
                return call(self.connection())
            except openstack.exceptions.NotFoundException as exc:
                raise _NotFound(_details(exc)) from None
            except openstack.exceptions.HttpException as exc:
                details = _details(exc)
                if exc.status_code in (403, 413) and "quota" in details.lower():
                    raise ProviderError(f"OpenStack quota exceeded ({what}): {details}") from None
                raise ProviderError(
                    f"OpenStack {what}: HTTP {exc.status_code}: {details}",
                    retryable=(exc.status_code or 0) >= 500,
                ) from None
            except openstack.exceptions.SDKException as exc:  # no such cloud, bad config...
                raise ProviderError(f"OpenStack {what}: {exc}") from None
            except keystoneauth1.exceptions.ClientException as exc:  # auth, connection, catalog
                raise ProviderError(
                    f"OpenStack {what}: {type(exc).__name__}: {exc}", retryable=True
                ) from None

    async def _resolve(self) -> _Resolved:
        """Image, flavor and network ids from their names (looked up once)."""
        if self._resolved is not None:
            return self._resolved
        config = self.config

        def look_up(connection: Connection) -> _Resolved:
            image = connection.image.find_image(config.image)
            if image is None:
                raise ProviderError(f"OpenStack: no image {config.image!r}")
            flavor = connection.compute.find_flavor(config.flavor)
            if flavor is None:
                raise ProviderError(f"OpenStack: no flavor {config.flavor!r}")
            networks = []
            for name in config.networks:
                network = connection.network.find_network(name)
                if network is None:
                    raise ProviderError(f"OpenStack: no network {name!r}")
                networks.append(str(network.id))
            return _Resolved(str(image.id), str(flavor.id), tuple(networks))

        try:
            self._resolved = await self._sdk("looking up image, flavor and networks", look_up)
        except _NotFound as exc:
            raise ProviderError(
                f"OpenStack: looking up image, flavor and networks: {exc}"
            ) from None
        return self._resolved

    # -- the interface ------------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> Instance:
        existing = [i for i in await self.list_owned() if i.server_id == request.server_id]
        if existing:
            return existing[0]
        user_data = render_user_data(self.config.user_data, request, limit=USER_DATA_LIMIT)
        resolved = await self._resolve()
        metadata = {
            **self.config.metadata,
            META_POOL: request.pool,
            META_SERVER: request.server_id,
            META_MANAGED_BY: self.config.managed_by,
            META_TOKEN_HASH: token_hash(request.agent_token),
        }
        attrs: dict[str, Any] = {
            "name": request.server_id,
            "image_id": resolved.image_id,
            "flavor_id": resolved.flavor_id,
            "networks": [{"uuid": network} for network in resolved.network_ids],
            "metadata": metadata,
            "user_data": base64.b64encode(user_data.encode("utf-8")).decode("ascii"),
        }
        if self.config.key_name:
            attrs["key_name"] = self.config.key_name
        if self.config.security_groups:
            attrs["security_groups"] = [{"name": name} for name in self.config.security_groups]
        if self.config.availability_zone:
            attrs["availability_zone"] = self.config.availability_zone
        try:
            server = await self._sdk(
                f"creating server {request.server_id}",
                lambda connection: connection.compute.create_server(**attrs),
            )
        except _NotFound as exc:
            raise ProviderError(f"OpenStack: creating server {request.server_id}: {exc}") from None
        return Instance(
            ref=str(server.id),
            status=InstanceStatus.PENDING,
            server_id=request.server_id,
            pool=request.pool,
            token_hash=metadata[META_TOKEN_HASH],
            detail="BUILD",
        )

    async def describe(self, ref: str) -> Instance:
        try:
            server = await self._sdk(
                f"showing server {ref}", lambda connection: connection.compute.get_server(ref)
            )
        except _NotFound:
            return Instance(ref=ref, status=InstanceStatus.GONE, detail="not found")
        if (server.status or "").upper() == "ERROR":
            raise ProviderError(f"OpenStack server {ref} failed: {_fault(server)}", retryable=True)
        return self._instance(server)

    async def terminate(self, ref: str) -> None:
        try:
            await self._sdk(
                f"deleting server {ref}",
                lambda connection: connection.compute.delete_server(ref, ignore_missing=True),
            )
        except _NotFound:
            return

    async def list_owned(self) -> list[Instance]:
        def owned(connection: Connection) -> list[Server]:
            return [
                server
                for server in connection.compute.servers(details=True)
                if (server.metadata or {}).get(META_POOL) == self.context.pool
                and (server.metadata or {}).get(META_MANAGED_BY) == self.config.managed_by
                and (server.status or "").upper() not in _GONE
            ]

        try:
            servers = await self._sdk(f"listing servers of pool {self.context.pool}", owned)
        except _NotFound as exc:
            raise ProviderError(f"OpenStack: listing servers: {exc}") from None
        return [self._instance(server) for server in servers]

    async def close(self) -> None:
        def close() -> None:
            with self._lock:
                connection, self._connection = self._connection, None
            if connection is not None:
                connection.close()

        await asyncio.to_thread(close)

    # -- helpers ------------------------------------------------------------------------------

    def _address(self, server: Server) -> tuple[str | None, str]:
        """The configured address of ``server``, or None and what it has instead."""
        network = self.config.answered_network
        addresses: dict[str, list[dict[str, Any]]] = server.addresses or {}
        for entry in addresses.get(network, []):
            if entry.get("version") == self.config.ip_version and (
                entry.get("OS-EXT-IPS:type", "fixed") == self.config.address_type
            ):
                return str(entry["addr"]), ""
        have = ", ".join(sorted(addresses)) or "none"
        return None, (
            f"no {self.config.address_type} IPv{self.config.ip_version} address on network "
            f"{network!r} (networks: {have})"
        )

    def _instance(self, server: Server) -> Instance:
        metadata: dict[str, str] = server.metadata or {}
        status_text = (server.status or "UNKNOWN").upper()
        address, missing = self._address(server)
        detail = status_text
        if status_text == "ACTIVE" and address:
            status = InstanceStatus.RUNNING
        elif status_text in _GONE:
            status = InstanceStatus.GONE
        elif status_text in _STOPPED:
            status = InstanceStatus.STOPPING
        elif status_text == "ERROR":
            status = InstanceStatus.STOPPING  # it exists and must be deleted, but never runs
            detail = f"ERROR: {_fault(server)}"
        else:
            status = InstanceStatus.PENDING
            if status_text == "ACTIVE":
                detail = f"ACTIVE, {missing}"
        return Instance(
            ref=str(server.id),
            status=status,
            server_id=metadata.get(META_SERVER),
            pool=metadata.get(META_POOL),
            address=address,
            token_hash=metadata.get(META_TOKEN_HASH),
            detail=detail,
        )


def _fault(server: Server) -> str:
    fault: dict[str, Any] = server.fault or {}
    message = str(fault.get("message") or "no fault recorded")
    if "No valid host" in message:
        return f"{message} (no compute host can take the flavor now: capacity or scheduler hints)"
    return message


def _details(exc: Exception) -> str:
    details = getattr(exc, "details", None)
    return str(details).strip() if details else str(exc)
