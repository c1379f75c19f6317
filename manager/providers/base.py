"""The provider interface: a small base class, and a registry of implementations by name.

A provider launches, describes, lists and terminates the servers of one pool. Calls are
``async``; an implementation whose SDK blocks (boto3, openstacksdk) runs it off the event loop
(``asyncio.to_thread``). Launches are idempotent by ``LaunchRequest.server_id`` (a retried launch
never starts two servers) and every server a provider starts carries the pool and server id
(tags, metadata, a directory name), so that :meth:`Provider.list_owned` finds it again after a
manager restart or crash.

A provider is one module: its configuration, a frozen dataclass deriving from
:class:`ProviderConfig` with ``type: Literal["name"]``, and its class, decorated with
``@register(ItsConfig)``, which makes the name known both to :func:`create_provider` and to the
configuration loader (a pool's ``provider`` block). The registry line is the module's import in
:mod:`manager.providers`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from dnslb.clock import Clock, SystemClock
from dnslb.config import FileReference, PluginConfig, plugin_name
from dnslb.errors import DnslbError


class ProviderError(DnslbError):
    """A provider call failed; ``retryable`` says whether trying again (elsewhere) may help."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class ProviderConfig(PluginConfig):
    """A pool's ``provider`` block: the configuration of one registered provider."""

    __slots__ = ()


class InstanceStatus(StrEnum):
    PENDING = "pending"  # exists, not yet running or without an address
    RUNNING = "running"  # running with an address
    STOPPING = "stopping"
    GONE = "gone"  # terminated or never existed


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """What a provider needs to start one server."""

    server_id: str  # also the idempotency key
    pool: str
    agent_token: str  # the server's own token, for its agent's reports
    manager_url: str  # where its agent reports
    manager_urls: tuple[str, ...] = ()  # the other managers (active/standby) it may report to


@dataclass(frozen=True, slots=True)
class Instance:
    """A server as its provider sees it."""

    ref: str  # the provider's own id: instance id, directory name...
    status: InstanceStatus
    server_id: str | None = None  # read back from tags/metadata
    pool: str | None = None
    address: str | None = None  # the address answered in DNS, once known
    check_address: str | None = None
    token_hash: str | None = None  # the hash of its agent's token, where the provider keeps it
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ProviderContext:
    """What the manager gives every provider."""

    pool: str
    state_dir: Path  # for providers that keep files (the local provider's processes)
    manager_url: str
    clock: Clock = field(default_factory=SystemClock)
    manager_urls: tuple[str, ...] = ()  # the other managers' URLs (http.peer_urls)
    # What launched agents verify an https:// manager_url with (None: the system's trust store),
    # and whether the manager's operator let tokens travel in clear text (http.allow_plaintext).
    manager_ca_file: FileReference | None = None
    manager_allow_plaintext: bool = False


class Provider(ABC):
    """Launches and terminates the servers of one pool."""

    kind: ClassVar[str]
    can_launch: ClassVar[bool] = True

    def __init__(self, config: Any, context: ProviderContext) -> None:
        self.config = config
        self.context = context

    @abstractmethod
    async def launch(self, request: LaunchRequest) -> Instance:
        """Start a server (returning once it exists, possibly still pending)."""

    @abstractmethod
    async def describe(self, ref: str) -> Instance:
        """The server now (``InstanceStatus.GONE`` when it no longer exists)."""

    @abstractmethod
    async def terminate(self, ref: str) -> None:
        """Stop and remove the server; succeeds when it is already gone."""

    @abstractmethod
    async def list_owned(self) -> list[Instance]:
        """Every server this provider runs for its pool, found from its own records (tags...)."""

    @property
    def stops_servers_on_close(self) -> bool:
        """True when :meth:`close` stops every server (local processes die with the manager)."""
        return False

    async def close(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Release connections; by default nothing to do."""


_REGISTRY: dict[str, type[Provider]] = {}
_ProviderT = TypeVar("_ProviderT", bound=type[Provider])


def register(config: type[ProviderConfig]) -> Callable[[_ProviderT], _ProviderT]:
    """Class decorator: make a provider available under its configuration's ``type``.

    ``config`` is registered in :class:`ProviderConfig` too, so that a pool's ``provider`` block
    accepts it: the provider's one registration.
    """

    def decorate(cls: _ProviderT) -> _ProviderT:
        kind = plugin_name(config)
        known = _REGISTRY.get(kind)
        if known is not None and known is not cls:
            raise TypeError(f"{cls.__name__}: provider {kind!r} is already {known.__qualname__}")
        ProviderConfig.register(config)
        cls.kind = kind
        _REGISTRY[kind] = cls
        return cls

    return decorate


def provider_class(kind: str) -> type[Provider]:
    """The provider registered as ``kind``; :class:`ProviderError` lists the known ones."""
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise ProviderError(
            f"no provider named {kind!r} (known: {', '.join(sorted(_REGISTRY))})"
        ) from None


def create_provider(config: ProviderConfig, context: ProviderContext) -> Provider:
    """The provider a pool's ``provider`` block names (its ``type``)."""
    return provider_class(config.type)(config, context)
