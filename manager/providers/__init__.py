"""Cloud providers: launch and terminate a pool's servers (``local``, ``static``, ``ec2``, ...).

Each provider lives in its own module and registers itself by name; :func:`create_provider`
builds the one a pool's configuration names. See :mod:`manager.providers.base` for the interface.
"""

from __future__ import annotations

from manager.providers.base import (
    Instance,
    LaunchRequest,
    Provider,
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
    "ProviderContext",
    "ProviderError",
    "create_provider",
    "provider_class",
    "register",
]
