"""The health check interface: a small base class, and a registry of implementations by name.

A check probes one server's check address and says whether it passed and, when not, why. The
base fixes the workflow: :meth:`HealthCheck.probe` never raises and never takes longer than the
configured ``timeout`` (a refused or reset connection, or no answer in time, is a failure); a
subclass implements :meth:`HealthCheck.attempt`. Rise and fall (how many results in a row turn
the verdict) and the pace are the checker's (:mod:`manager.health`), the same for every check.

A check is one module: its configuration, a frozen dataclass deriving from
:class:`HealthCheckConfig` with ``type: Literal["name"]`` and the fields the family declares,
and its class, decorated with ``@register(ItsConfig)``, which makes the name known both to
:func:`create_check` and to the configuration loader (a pool's ``health_check`` block). The
registry line is the module's import in :mod:`manager.checks`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, TypeVar

from dnslb.config import PluginConfig, plugin_name
from dnslb.errors import ConfigError


class HealthCheckConfig(PluginConfig):
    """A pool's ``health_check`` block: the configuration of one registered check.

    Every check's configuration has these fields, which the checker paces and counts with.
    """

    __slots__ = ()
    interval: float
    timeout: float
    rise: int
    fall: int


class HealthCheck(ABC):
    """Probes servers' check addresses: the checker makes one for each round of a pool's
    probes, from the pool's configuration as it is then."""

    kind: ClassVar[str]

    def __init__(self, config: HealthCheckConfig) -> None:
        self.config = config

    async def probe(self, address: str) -> tuple[bool, str]:
        """Run the check against ``address`` once: ``(True, "")`` or ``(False, why)``."""
        try:
            return await asyncio.wait_for(self.attempt(address), timeout=self.config.timeout)
        except TimeoutError:
            return False, f"timed out after {self.config.timeout:g} s"
        except OSError as exc:
            return False, exc.strerror or str(exc)

    @abstractmethod
    async def attempt(self, address: str) -> tuple[bool, str]:
        """Check ``address``: ``(True, "")`` or ``(False, why)``; may raise :class:`OSError`
        (a failure saying why) and is cancelled at the timeout."""


_REGISTRY: dict[str, type[HealthCheck]] = {}
_CheckT = TypeVar("_CheckT", bound=type[HealthCheck])


def register(config: type[HealthCheckConfig]) -> Callable[[_CheckT], _CheckT]:
    """Class decorator: make a check available under its configuration's ``type``.

    ``config`` is registered in :class:`HealthCheckConfig` too, so that a pool's
    ``health_check`` block accepts it: the check's one registration.
    """

    def decorate(cls: _CheckT) -> _CheckT:
        kind = plugin_name(config)
        known = _REGISTRY.get(kind)
        if known is not None and known is not cls:
            raise TypeError(f"{cls.__name__}: check {kind!r} is already {known.__qualname__}")
        HealthCheckConfig.register(config)
        cls.kind = kind
        _REGISTRY[kind] = cls
        return cls

    return decorate


def create_check(config: HealthCheckConfig) -> HealthCheck:
    """The check a pool's ``health_check`` block names (its ``type``)."""
    try:
        check = _REGISTRY[config.type]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ConfigError("health check", [f"{config.type!r}: unknown (known: {known})"]) from None
    return check(config)
