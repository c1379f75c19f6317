"""Cloud providers: launch and terminate a pool's servers (``local``, ``static``, ``ec2``, ...).

Each provider lives in its own module, its configuration class beside it, and registers both
with ``@register(ItsConfig)`` (:mod:`manager.providers.base`). The imports below are the
registry: a new provider is one module and one line here. :func:`create_provider` builds the
provider a pool's configuration names; :class:`ProviderConfig` is the type of that ``provider``
block, every registered provider's configuration told apart by ``type``.
"""

from __future__ import annotations

from manager.providers import docker as docker
from manager.providers import ec2 as ec2
from manager.providers import local as local
from manager.providers import memory as memory
from manager.providers import openstack as openstack
from manager.providers import static as static
from manager.providers.base import (
    Instance,
    LaunchRequest,
    Provider,
    ProviderConfig,
    ProviderContext,
    ProviderError,
    create_provider,
    provider_class,
    register,
)

__all__ = [
    "Instance",
    "LaunchRequest",
    "Provider",
    "ProviderConfig",
    "ProviderContext",
    "ProviderError",
    "create_provider",
    "provider_class",
    "register",
]
